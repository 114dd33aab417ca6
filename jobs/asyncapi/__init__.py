"""AsyncAPI requests: the request (`request.py`), its store with its counts (`store.py`,
`counts.py`), payloads and results kept as objects (`objects.py`), taking a submission
(`submit.py`) and running it on a node (`runner.py`)."""
