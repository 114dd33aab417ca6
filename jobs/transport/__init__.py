"""How work travels: the broker's connection and its Redis options (`broker.py`), the hardware
and per-job queues (`queues.py`), the task messages Sluice sends (`task_messages.py`), which node
holds which delivery (`delivery.py`), and giving a dead node's deliveries back (`settle.py`)."""
