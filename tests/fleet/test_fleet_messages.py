"""Bad messages on the queue: acknowledged, counted, and the worker carries on.

The message carries only an operation id; anything else on the queue (a stale id,
a message from another producer, bytes that are not a task at all) must neither
crash a worker nor loop forever between broker and worker.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetkit import (
    call,
    context,
    enqueue_committed,
    metric,
    metric_by_label,
    on_both_brokers,
    outcome,
    queue_length,
    table_count,
    wait_until,
)
from kombu import Connection, Exchange, Producer

from executor.broker.app import TASK_NAME, make_celery
from executor.cli.fleet import Fleet, children_of
from executor.settings import Settings
from executor.store.engine import make_engine
from executor.store.schema import operations
from ledger.service import Ledger
from outbox.results import wait_for_results

MESSAGES = "toolfence_worker_messages_total"


def _publish_raw(settings: Settings) -> int:
    """Messages that are not Celery tasks, published with kombu to the worker's queue."""
    raw = [
        # Not JSON, though it says so.
        (b"\xff\xfe{not json", "application/json"),
        # JSON, but no task: no Celery headers, no task name in the body.
        (b'{"hello": "world"}', "application/json"),
        # A serializer the worker does not accept.
        (b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00K\x01.", "application/x-python-serialize"),
    ]
    with Connection(settings.broker_url, connect_timeout=5) as conn:
        producer = Producer(conn.default_channel, exchange=Exchange(""))
        for body, content_type in raw:
            producer.publish(
                body, routing_key=settings.queue_name, content_type=content_type,
                content_encoding="binary" if content_type.endswith("serialize") else "utf-8",
            )
    return len(raw)


def _publish_bad_tasks(settings: Settings) -> tuple[int, int]:
    """Well-formed Celery messages carrying a bad argument. Returns (bad, unknown)."""
    app = make_celery(settings)
    try:
        send = lambda *args: app.send_task(TASK_NAME, args=list(args), queue=settings.queue_name)  # noqa: E731
        send("op_that_was_never_admitted")  # an id the database does not know
        send(12345)  # not a string
        send({"operation_id": "op_x"})  # not a string either
        send("x" * 201)  # longer than any operation id
        send()  # no operation id at all
        send("op_a", "op_b")  # two of them
        app.send_task("toolfence.no_such_task", args=["op_x"], queue=settings.queue_name)
    finally:
        app.close()
    return 6, 1


@on_both_brokers
def test_bad_messages__acknowledged_and_counted__worker_stays_alive_and_runs_good_operation(
    settings: Settings, ledger: Ledger, make_fleet: Callable[..., Fleet]
) -> None:
    # Given a single worker with a single pool process
    fleet = make_fleet(workers=1, concurrency=1, reconcile_every=None).start()
    worker = fleet.by_role("worker")[0]
    pool_before = children_of(worker.pid)
    engine = make_engine(settings.database_url)

    # When raw garbage and bad task messages are put on its queue
    raw_count = _publish_raw(settings)
    bad_tasks, unknown = _publish_bad_tasks(settings)
    expected_bad = raw_count + bad_tasks

    # Then each is acknowledged and counted by outcome
    wait_until(
        lambda: metric(settings.metrics_dir, MESSAGES) == expected_bad + unknown, timeout=30,
        what="every bad message to be counted",
        show=lambda: metric_by_label(settings.metrics_dir, MESSAGES, "outcome"),
    )
    assert metric_by_label(settings.metrics_dir, MESSAGES, "outcome") == {
        "bad_message": expected_bad, "unknown_operation": unknown,
    }
    assert queue_length(settings.broker_url, settings.queue_name) == 0
    # ... no operation appeared from them
    assert table_count(engine, operations) == 0

    # When a good operation is enqueued after them
    enqueue_committed(engine, [call("ok", "ledger.credit", account_id="acme-2", amount_cents=42)],
                      context("req-after-garbage"))

    # Then the same worker runs it, still alive with the same pool process
    statuses = wait_for_results(engine, "acme", "req-after-garbage", timeout=60)
    assert [outcome(s) for s in statuses] == [("succeeded", None)]
    assert worker.alive() and children_of(worker.pid) == pool_before
    assert ledger.balance("acme-2") == 42
    # ... and the bad messages were not redelivered meanwhile
    assert metric_by_label(settings.metrics_dir, MESSAGES, "outcome") == {
        "bad_message": expected_bad, "unknown_operation": unknown, "succeeded": 1,
    }
