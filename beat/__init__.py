"""Periodic work of Sluice, run inside `celery -A jobs beat`'s own process (never on a worker node)."""
