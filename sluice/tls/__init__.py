"""TLS at Sluice's public address: the certificate the proxy serves (`served`), and a CA with a
certificate made for trying it out (`self_signed`)."""
