"""TOOLFENCE_BROKER_QUEUE_TYPE=quorum: a real relay and worker on a RabbitMQ quorum queue.

One RabbitMQ node (127.0.0.1:5672, as CI runs it): a quorum queue of one member
still goes through Raft, and the publisher and the worker must both declare it so
(a classic declaration of the same name is refused), and the worker must not ask
for the global QoS quorum queues refuse.
"""

from __future__ import annotations

import amqp
import pytest
from kombu import Connection, Exchange, Queue

from executor.broker.app import make_celery, task_queue
from executor.settings import Settings, SettingsError
from ledger.tools import registry
from outbox.producer import enqueue
from outbox.results import wait_for_results
from tests.fleet.fleetkit import call, context


@pytest.mark.parametrize("broker_url", ["rabbitmq"], indirect=True)
def test_quorum_queue__calls_settle_through_a_real_worker__queue_is_quorum(
    settings: Settings, ledger: object, make_fleet: object, broker_url: str,
) -> None:
    # Given a relay and a worker whose queue is a quorum queue
    fleet = make_fleet(workers=1, concurrency=2, env={"TOOLFENCE_BROKER_QUEUE_TYPE": "quorum"})  # type: ignore[operator]
    fleet.start()
    from executor.store.engine import make_engine

    engine = make_engine(settings.database_url)
    calls = [call("w1", "ledger.credit", account_id="acme-2", amount_cents=300),
             call("r1", "ledger.get_balance", account_id="acme-2"),
             call("w2", "ledger.transfer", source_account="acme-1", target_account="acme-2",
                  amount_cents=200)]
    # When a request is enqueued
    with engine.begin() as conn:
        enqueue(conn, calls, context("req-quorum", tenant="acme"), registry)
    statuses = wait_for_results(engine, "acme", "req-quorum", timeout=60)
    # Then every call succeeded through the broker
    assert [s.status for s in statuses] == ["succeeded"] * 3, fleet.logs()
    # And the broker holds the queue as a quorum queue: declaring it classic is refused
    with Connection(broker_url, connect_timeout=5) as conn:
        classic = Queue(settings.queue_name, Exchange(settings.queue_name),
                        routing_key=settings.queue_name, durable=True)
        with pytest.raises(amqp.exceptions.PreconditionFailed, match="x-queue-type"):
            classic.bind(conn.channel()).declare()
    engine.dispose()


def test_quorum_queue__not_rabbitmq__a_clear_error() -> None:
    # Given quorum asked of a Redis broker
    settings = Settings(database_url="sqlite://", broker_url="redis://127.0.0.1:6379/0",
                        broker_queue_type="quorum")
    # Then the app is not made, and the message names the setting and what it needs
    with pytest.raises(SettingsError, match="TOOLFENCE_BROKER_QUEUE_TYPE=quorum needs a RabbitMQ"):
        make_celery(settings)


def test_classic__the_broker_default_queue_unchanged() -> None:
    settings = Settings(database_url="sqlite://", broker_url="amqp://guest:guest@127.0.0.1:5672//")
    assert task_queue(settings) is None
    assert make_celery(settings).conf.task_queues is None
