"""The worker: reserve, heartbeat, run the tool, complete; and its Celery app."""
