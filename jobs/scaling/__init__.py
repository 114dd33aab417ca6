"""How many: Cortex's autoscaling arithmetic, pure (`algorithm.py`: samples and history in, a
count out, no Redis), the scaler that feeds it (`scaler.py`), and its RealtimeAPI and AsyncAPI
sides (`realtime.py`, `asyncapi.py`); an API's `autoscaling` section is read by `config.py`."""
