"""Periodic work of Sluice, run by `celery -A jobs beat` and executed by any worker node."""
