"""Publishing task messages: `toolfence.execute(operation_id)` and
`toolfence.run_turn(turn_id)`, on one app with the worker's configuration
(`executor.broker.app`).

A message is only an id: publishing one twice is harmless (the worker's
reservation CAS runs it at most once), so the relay may republish a batch whose
marking it lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

from executor.broker.app import TASK_NAME, TURN_TASK_NAME, make_celery
from executor.core.sanitize import exception_summary
from executor.settings import Settings

log = logging.getLogger("toolfence.relay")

Publisher = Callable[[str], None]


class CeleryPublishers(NamedTuple):
    """Publishers of `toolfence.execute(operation_id)` and `toolfence.run_turn(turn_id)`
    (outbox rows of kind `turn`) on one app with the worker's configuration; `connect`
    opens the broker connection ahead of the first publish, `close` ends it."""

    publish: Publisher
    publish_turn: Publisher
    connect: Callable[[float], bool]
    close: Callable[[], None]


def celery_publisher(settings: Settings) -> tuple[Publisher, Callable[[], None]]:
    """Publish `toolfence.execute(operation_id)` with the worker's app configuration."""
    publishers = celery_publishers(settings)
    return publishers.publish, publishers.close


def celery_publishers(settings: Settings) -> CeleryPublishers:
    app = make_celery(settings)

    def sender(task_name: str) -> Publisher:
        def publish(message_id: str) -> None:
            app.send_task(
                task_name,
                args=[message_id],
                queue=settings.queue_name,
                retry=True,
                retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2},
            )

        return publish

    def connect(timeout: float) -> bool:
        """Connect the producer the first publish will use and declare the queue: a
        cold first publish pays for both (160 ms on Redis here), inside the relay's
        first batch transaction. False, logged, when the broker does not answer in
        `timeout`; publishing then connects when it does, as it always did."""
        try:
            with app.producer_pool.acquire(block=True, timeout=timeout) as producer:
                producer.connection.ensure_connection(
                    max_retries=3, interval_start=0.2, interval_step=0.2, interval_max=0.5,
                    timeout=timeout,
                )
                producer.maybe_declare(app.amqp.queues[settings.queue_name])
        except Exception as exc:
            log.warning("broker not reachable yet; publishing when it answers: %s",
                        exception_summary(exc))
            return False
        return True

    def close() -> None:
        app.close()

    return CeleryPublishers(sender(TASK_NAME), sender(TURN_TASK_NAME), connect, close)
