"""What every Sluice process stands on, and nothing above it: settings, Redis key names and
clients, the error tree, figures (metrics), JSON logs and log streams, API keys, and the
registries of deployed APIs and of realtime replicas.

It knows neither Flask nor Celery (`layers.ini` holds it to that), so a worker node, beat, the
proxy controller and a replica launcher load only what they use.
"""
