"""Publishing to the broker: its own home, below both the relay and the worker.

- `app`: the task names and the Celery app's configuration (`make_celery`);
- `publish`: the publishers the relay sends operation and turn ids with;
- `fs_transport`: the filesystem transport of the embedded default broker.

Nothing here loads the worker or the store.
"""
