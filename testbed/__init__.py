"""What the tests and the benchmarks both stand up, and neither owns: a Redis Sentinel deployment
on loopback (`sentinel_cluster.py`), wheels made on the spot for a package index of their own
(`wheels.py`), and polling until a condition holds (`waiting.py`). Not part of the distribution;
`bench/` imports nothing from `tests/`."""
