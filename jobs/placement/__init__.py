"""Where work runs: a batch job's nodes (`batch.py`), an AsyncAPI's nodes (`asyncapi.py`), a
RealtimeAPI's replicas on hosts (`realtime.py`), and how many worker nodes each host should run
(`node_plan.py`)."""
