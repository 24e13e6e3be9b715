"""The Celery application's configuration, shared by whoever publishes and the worker.

The task names (`toolfence.execute(operation_id)`, `toolfence.run_turn(turn_id)`)
and `make_celery`: late acks, reject on worker lost, prefetch 1, JSON only,
visibility timeout well above the hard time limit. Correctness never depends on
the broker delivering exactly once: the store's CAS does. The relay publishes with
this app (`executor.broker.publish`); the worker binds its tasks to it
(`executor.worker.celery_app`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery import Celery
from kombu.entity import Exchange, Queue

from executor.settings import Settings, SettingsError

TASK_NAME = "toolfence.execute"
TURN_TASK_NAME = "toolfence.run_turn"


def broker_options(settings: Settings) -> dict[str, Any]:
    if settings.broker_url.startswith("filesystem://"):
        folder = Path(settings.broker_url[len("filesystem://") :])
        (folder / "queue").mkdir(parents=True, exist_ok=True)
        (folder / "processed").mkdir(parents=True, exist_ok=True)
        (folder / "control").mkdir(parents=True, exist_ok=True)
        return {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            # Broadcast/pidbox files: without this kombu writes ./control in the cwd.
            "control_folder": str(folder / "control"),
            "store_processed": False,
            "polling_interval": 0.02,
        }
    return {"visibility_timeout": settings.visibility_timeout_seconds}


def broker_url(settings: Settings) -> str:
    return "filesystem://" if settings.broker_url.startswith("filesystem://") else settings.broker_url


def task_queue(settings: Settings) -> Queue | None:
    """The queue declared with its arguments, or None for the broker's default.

    TOOLFENCE_BROKER_QUEUE_TYPE=quorum declares a RabbitMQ quorum queue (durable,
    replicated by Raft across the cluster's nodes): the publisher (the relay) and
    the worker declare it alike, so neither meets a classic queue of that name. A
    queue already declared classic on the broker cannot become quorum in place
    (RabbitMQ answers PRECONDITION_FAILED): delete it, or name a new TOOLFENCE_QUEUE.
    """
    if settings.broker_queue_type == "classic":
        return None
    if not settings.broker_url.startswith(("amqp://", "amqps://", "pyamqp://")):
        raise SettingsError(
            f"TOOLFENCE_BROKER_QUEUE_TYPE={settings.broker_queue_type} needs a RabbitMQ broker "
            f"(amqp://…); TOOLFENCE_BROKER_URL is not one"
        )
    name = settings.queue_name
    exchange = Exchange(name)  # type: ignore[no-untyped-call]
    return Queue(name, exchange, routing_key=name, durable=True,  # type: ignore[no-untyped-call]
                 queue_arguments={"x-queue-type": settings.broker_queue_type})


def make_celery(settings: Settings) -> Celery:
    queue = task_queue(settings)
    app = Celery("toolfence", broker=broker_url(settings), set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        result_backend=None,
        task_default_queue=settings.queue_name,
        task_time_limit=settings.hard_time_limit_seconds,
        broker_transport_options=broker_options(settings),
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        # Loaded by name only when a worker starts from this app; publishing never does.
        worker_consumer="executor.worker.celery_app:CountingConsumer",
        worker_cancel_long_running_tasks_on_connection_loss=True,
    )
    if queue is not None:
        # Quorum queues refuse a global QoS: Celery 5.5+ sees the x-queue-type and
        # applies the prefetch per consumer (worker_detect_quorum_queues, on by default).
        app.conf.task_queues = [queue]
        app.conf.worker_detect_quorum_queues = True
    if settings.broker_url.startswith("filesystem://"):
        # Atomic message files: the stock transport lets a consumer read a half-written one.
        app.conf.broker_transport = "executor.broker.fs_transport:Transport"
        # No broadcast mailbox on files: nothing would read it, and it is one more table.
        app.conf.worker_enable_remote_control = False
    return app
