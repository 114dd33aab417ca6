"""A Redis Sentinel deployment of a test's own, on loopback: a primary, a replica and three
sentinels, each a real redis-server process on a free port, whose primary the test kills.

Sentinels judge a server down after 2 s without an answer (`down-after-milliseconds 2000`: with
less, a loaded 2-core machine can see a primary that is only slow as down, and fail over twice) and
two of them must agree (quorum 2) before one is elected to promote the replica. A killed primary
started again on its own data is turned into a replica of the promoted one by the sentinels; they
are told to look (INFO) every second and to wait 2 s before doing so, rather than 10 s and 8 s
(`SENTINEL DEBUG`, Redis 7; older sentinels keep their defaults, and such a test takes longer).
The servers start a replica's full copy at once (`repl-diskless-sync-delay 0`, not after 5 s).
"""

from __future__ import annotations

import subprocess
from contextlib import suppress
from pathlib import Path
from typing import Any

import redis

from foundation.settings import RedisAddress, RedisTls
from sluice.embedded import free_port
from sluice.tls.self_signed import SelfSigned
from testbed.stream_relay import StreamRelay
from testbed.waiting import wait_for

MASTER = "sluice"


class SentinelCluster:
    """Two data servers (one primary, one replica) and three sentinels watching them."""

    def __init__(self, folder: Path, relayed: bool = False, tls: SelfSigned | None = None) -> None:
        """`relayed`: the replica reaches the primary through a `StreamRelay` (`self.relay`), which a
        test can make drop the replication stream. `tls`: every server and sentinel speaks only TLS
        with this certificate (replication too), and so do the test's own clients (`client_of`)."""
        self.folder = folder
        self.tls = tls
        self.servers: dict[int, subprocess.Popen[bytes]] = {}
        self.sentinels: dict[int, subprocess.Popen[bytes]] = {}
        self.relayed = relayed
        self.relay: StreamRelay | None = None

    # -- processes --------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        folder = self.folder / name
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "log", "ab") as log:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=folder)

    def client_of(self, port: int, **options: Any) -> redis.Redis:
        """A client of one server or sentinel of this deployment (over TLS when it speaks TLS)."""
        if self.tls is not None:
            options.update(ssl=True, ssl_ca_certs=str(self.tls.ca), ssl_cert_reqs="required")
        return redis.Redis(port=port, **options)

    def _listen(self, port: int) -> list[str]:
        """The arguments (`--name value`) of a server listening on `port`: plain TCP, or TLS only."""
        if self.tls is None:
            return ["--port", str(port)]
        return ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(self.tls.cert),
                "--tls-key-file", str(self.tls.key), "--tls-ca-cert-file", str(self.tls.ca),
                "--tls-auth-clients", "no", "--tls-replication", "yes"]

    def start_server(self, port: int, replica_of: int | None = None) -> None:
        argv = ["redis-server", *self._listen(port), "--bind", "127.0.0.1", "--dir", str(self.folder / f"redis-{port}"),
                "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--repl-diskless-sync-delay", "0"]
        if replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(replica_of)]
        (self.folder / f"redis-{port}").mkdir(parents=True, exist_ok=True)
        self.servers[port] = self._spawn(f"redis-{port}", argv)
        wait_for(lambda: self._answers(port), 15, f"redis-server on {port}")

    def start(self) -> SentinelCluster:
        primary, replica = free_port(), free_port()
        self.start_server(primary)
        if self.relayed:
            self.relay = StreamRelay(primary)
            primary = self.relay.port  # where the replica and the sentinels reach it
        self.start_server(replica, replica_of=primary)
        for _ in range(3):
            port = free_port()
            conf = self.folder / f"sentinel-{port}.conf"
            listen = self._listen(port)
            conf.write_text(
                "".join(f"{listen[i][2:]} {listen[i + 1]}\n" for i in range(0, len(listen), 2))
                + f"bind 127.0.0.1\ndir {self.folder}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n"
                f"sentinel down-after-milliseconds {MASTER} 2000\n"
                f"sentinel failover-timeout {MASTER} 5000\n"
            )
            self.sentinels[port] = self._spawn(f"sentinel-{port}", ["redis-server", str(conf), "--sentinel"])
        self.wait_ready()
        for port in self.sentinels:
            with suppress(redis.ResponseError):
                self.client_of(port).execute_command(  # type: ignore[no-untyped-call]
                    "SENTINEL", "DEBUG", "INFO-PERIOD", 1000, "PUBLISH-PERIOD", 500)
        return self

    def wait_ready(self) -> None:
        """Each sentinel knows the other two and a connected replica: a failover can then happen."""

        def ready() -> bool:
            for port in self.sentinels:
                try:
                    master = self.client_of(port, socket_timeout=1, decode_responses=True).sentinel_master(MASTER)
                    replicas = self.client_of(port, socket_timeout=1, decode_responses=True).sentinel_slaves(MASTER)
                except redis.RedisError:
                    return False
                if not isinstance(master, dict) or master["num-other-sentinels"] < 2 or not any(
                        r["master-link-status"] == "ok" for r in replicas):
                    return False
            return True

        wait_for(ready, 30, "sentinels that know each other and the replica", interval=0.1)

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
        for process in [*self.sentinels.values(), *self.servers.values()]:
            if process.poll() is None:
                process.terminate()
        for process in [*self.sentinels.values(), *self.servers.values()]:
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            if process.poll() is None:
                process.kill()
                process.wait()

    # -- what a test sees and does --------------------------------------------------------------------
    def _answers(self, port: int) -> bool:
        try:
            return bool(self.client_of(port, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def address(self) -> RedisAddress:
        return RedisAddress(sentinels=tuple(("127.0.0.1", port) for port in self.sentinels), master=MASTER,
                            tls=RedisTls(ca=str(self.tls.ca)) if self.tls is not None else None)

    def env(self) -> dict[str, str]:
        """The settings of a Sluice process of this deployment."""
        tls = {"SLUICE_REDIS_TLS": "1", "SLUICE_REDIS_CA": str(self.tls.ca)} if self.tls is not None else {}
        return {"SLUICE_REDIS_SENTINELS": ",".join(f"127.0.0.1:{port}" for port in self.sentinels),
                "SLUICE_REDIS_MASTER": MASTER, **tls}

    def primary_port(self) -> int:
        """The primary as a majority of sentinels names it."""
        named = [found for port in self.sentinels if (found := self._named_by(port)) is not None]
        return max(set(named), key=named.count)

    def _named_by(self, sentinel_port: int) -> int | None:
        """The primary's port as one sentinel names it; None when it cannot say."""
        with suppress(redis.RedisError):
            address = self.client_of(sentinel_port, socket_timeout=1).sentinel_get_master_addr_by_name(MASTER)
            if isinstance(address, tuple):
                return int(address[1])
        return None

    def kill_primary(self) -> int:
        """SIGKILL the primary (no shutdown, no goodbye to its replica); its port."""
        port = self.primary_port()
        server = self.relay.target_port if self.relay is not None and port == self.relay.port else port
        self.servers[server].kill()
        self.servers[server].wait()
        return port

    def wait_failover(self, old: int, timeout: float = 30) -> int:
        """Every sentinel names another primary, which answers as one; its port."""

        def promoted() -> int | None:
            ports = {found for port in self.sentinels if (found := self._named_by(port)) is not None}
            if len(ports) != 1 or old in ports:
                return None
            [new] = ports
            with suppress(redis.RedisError):
                if self.client_of(new, socket_timeout=1).info("replication")["role"] == "master":
                    return new
            return None

        return int(wait_for(promoted, timeout, "the sentinels' failover", interval=0.1))

    def restart(self, old: int) -> None:
        """The killed server started again as it was (a primary, on its own append-only file), until
        the sentinels have made it a replica of the promoted server and it holds a full copy."""
        self.start_server(old)
        primary = self.primary_port()

        def copied() -> bool:
            try:
                info = self.client_of(old, socket_timeout=1).info("replication")
            except redis.RedisError:  # still loading its file
                return False
            return (info["role"] == "slave" and info.get("master_port") == primary
                    and info.get("master_link_status") == "up" and not info.get("master_sync_in_progress"))

        wait_for(copied, 60, f"the old primary ({old}) to become a replica of {primary}", interval=0.1)
        self.wait_ready()

    def rejoin(self, old: int) -> None:
        """The killed server back, as a replica of the new primary, and sentinels that know it again."""
        self.start_server(old, replica_of=self.primary_port())
        self.wait_ready()



