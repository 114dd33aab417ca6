"""Worker nodes: the registry of live nodes and their in-flight deliveries (`registry.py`), the
hooks of a node's own process (`worker_node.py`), a node that stopped consuming ending itself
(`stall_watch.py`), and worker hosts' reports of the room they have (`worker_hosts.py`)."""
