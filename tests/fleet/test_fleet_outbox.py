"""The transactional outbox on a real fleet: nothing escapes a rolled-back
transaction, and a relay that crashes or runs twice never makes an operation run
twice (docs/design.md §Outbox, §Relay).
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
from fleet_tools import registry
from fleetkit import (
    accepted_receipts,
    all_in,
    audit,
    call,
    context,
    enqueue_committed,
    handler_invocations,
    metric,
    metric_by_label,
    metric_of_process,
    on_both_brokers,
    outcome,
    queue_length,
    states,
    table_count,
    terminal_events,
    wait_until,
)
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from executor.cli.fleet import Fleet
from executor.settings import Settings
from executor.store.engine import make_engine
from executor.store.schema import calls as calls_table
from executor.store.schema import operations, outbox
from ledger.service import Ledger
from outbox.producer import enqueue
from outbox.results import wait_for_results

MESSAGES = "toolfence_worker_messages_total"
PUBLISHED = "toolfence_relay_published_total"


def _writes_of_every_contract(prefix: str, count: int) -> list[tuple[str, list]]:
    """`count` one-call requests cycling through the four effect contracts."""
    kinds = [
        ("ledger.credit", {"account_id": "acme-2", "amount_cents": 100}),
        ("ledger.transfer", {"source_account": "acme-1", "target_account": "acme-2", "amount_cents": 10}),
        ("ledger.create_invoice", {"account_id": "acme-2", "amount_cents": 250}),
        ("ledger.send_notice", {"account_id": "acme-2", "text": "hello"}),
    ]
    requests = []
    for i in range(count):
        tool, arguments = kinds[i % len(kinds)]
        requests.append((f"{prefix}-{i}", [call(f"c{i}", tool, **arguments)]))
    return requests


def _enqueue_requests(engine: Engine, requests: list[tuple[str, list]]) -> list[str]:
    """All requests in one producer transaction; returns their operation ids."""
    operation_ids = []
    with engine.begin() as conn:
        for request_id, calls in requests:
            handle = enqueue(conn, calls, context(request_id), registry)
            operation_ids.extend(handle.operation_ids.values())
    return operation_ids


def _assert_each_ran_once(engine: Engine, ledger: Ledger, operation_ids: list[str]) -> None:
    effects = ledger.effect_rows_per_operation()
    assert {op: effects.get(op) for op in operation_ids} == {op: 1 for op in operation_ids}
    assert accepted_receipts(engine) == {op: 1 for op in operation_ids}
    invoked = handler_invocations(engine)
    assert {op: invoked.get(op) for op in operation_ids} == {op: 1 for op in operation_ids}
    for op in operation_ids:
        trail = audit(engine, op)
        assert [e.decision_code for e in trail if e.to_state == "started"] == ["reserved"], trail
        assert [(e.to_state, e.generation) for e in terminal_events(trail)] == [("succeeded", 1)]


def test_rolled_back_producer_transaction__enqueues_nothing__nothing_runs(
    settings: Settings, ledger: Ledger, make_fleet: Callable[..., Fleet]
) -> None:
    # Given a running fleet
    make_fleet(workers=1, concurrency=1, reconcile_every=None).start()
    engine = make_engine(settings.database_url)
    doomed = [
        call("w", "ledger.credit", account_id="acme-2", amount_cents=5_000),
        call("r", "ledger.get_balance", account_id="acme-2"),
    ]

    # When one producer rolls back its ORM session after enqueueing, and another's
    # business transaction raises after enqueueing
    with Session(engine) as session:
        enqueue(session, doomed, context("req-session-rolled-back"), registry)
        session.rollback()
    with pytest.raises(RuntimeError), engine.begin() as conn:
        enqueue(conn, doomed, context("req-raised"), registry)
        raise RuntimeError("the business transaction failed after enqueue")
    # ... and then a third producer commits one call: the fleet has had its chance
    committed = enqueue_committed(
        engine, [call("ok", "ledger.credit", account_id="acme-2", amount_cents=7)], context("req-ok")
    )
    statuses = wait_for_results(engine, "acme", "req-ok", timeout=60)
    assert [outcome(s) for s in statuses] == [("succeeded", None)]

    # Then the rolled-back requests left no operation, call or outbox row
    assert table_count(engine, operations) == 1
    assert table_count(engine, calls_table) == 1
    assert table_count(engine, outbox) == 1
    # ... nothing of theirs was published or delivered: one row, one message
    wait_until(lambda: metric(settings.metrics_dir, MESSAGES) >= 1, timeout=10, what="the message count")
    assert metric(settings.metrics_dir, PUBLISHED) == 1
    assert metric_by_label(settings.metrics_dir, MESSAGES, "outcome") == {"succeeded": 1}
    # ... and nothing of theirs ran: one handler invocation, one effect, the committed one
    assert handler_invocations(engine) == {committed.operation_ids["ok"]: 1}
    assert ledger.effect_rows_per_operation() == {committed.operation_ids["ok"]: 1}
    assert ledger.balance("acme-2") == 7


def test_relay_killed_between_publish_and_mark__republished__each_operation_completes_once(
    settings: Settings, ledger: Ledger, make_fleet: Callable[..., Fleet]
) -> None:
    # Given committed writes of every effect contract
    engine = make_engine(settings.database_url)
    operation_ids = _enqueue_requests(engine, _writes_of_every_contract("req-relay-crash", 8))
    # ... and a relay that is killed right after publishing its batch, before marking it
    crashing = make_fleet(
        workers=0, relays=1, reconcile_every=None,
        env={"TOOLFENCE_FAULT_POINTS": "relay_after_publish=kill"},
    ).start()
    relay = crashing.members[0]
    wait_until(lambda: not relay.alive(), timeout=60, what="the relay to be killed")
    assert relay.process.returncode == -9
    # ... so every operation's message is on the broker, and every row still unpublished
    assert queue_length(settings.broker_url, settings.queue_name) == len(operation_ids)
    assert table_count(engine, outbox, outbox.c.published_at.is_(None)) == len(operation_ids)

    # When a clean relay and two workers start
    make_fleet(workers=2, concurrency=2, reconcile_every=None).start()

    # Then each operation is published again, delivered twice, and completes once
    wait_until(
        lambda: all_in(engine, operation_ids, {"succeeded"}), timeout=60,
        what="every operation to succeed", show=lambda: states(engine, operation_ids),
    )
    # ... every row marked published (the workers may finish on the first copies before
    # the clean relay's pass that republishes them has marked its batch)
    wait_until(
        lambda: table_count(engine, outbox, outbox.c.published_at.is_(None)) == 0, timeout=30,
        what="every outbox row to be marked published",
    )
    wait_until(
        lambda: metric(settings.metrics_dir, MESSAGES) == 2 * len(operation_ids), timeout=15,
        what="both deliveries of every operation to be handled",
        show=lambda: metric_by_label(settings.metrics_dir, MESSAGES, "outcome"),
    )
    assert metric(settings.metrics_dir, MESSAGES, outcome="succeeded") == len(operation_ids)
    _assert_each_ran_once(engine, ledger, operation_ids)


def test_two_relays_at_once__each_row_published_once__each_operation_completes_once(
    settings: Settings, ledger: Ledger, make_fleet: Callable[..., Fleet]
) -> None:
    # Given two relays claiming small batches (each batch held a little longer than
    # publishing takes, so that both are busy at the same time) and four slots
    fleet = make_fleet(
        workers=2, concurrency=2, relays=2, reconcile_every=None,
        env={
            "TOOLFENCE_RELAY_BATCH_SIZE": "10",
            "TOOLFENCE_FAULT_POINTS": "relay_after_publish=sleep0.1",
        },
    ).start()
    engine = make_engine(settings.database_url)

    # When 200 one-call requests are committed at once
    operation_ids = _enqueue_requests(engine, _writes_of_every_contract("req-two-relays", 200))

    # Then every operation completes once
    wait_until(
        lambda: all_in(engine, operation_ids, {"succeeded"}), timeout=120,
        what="every operation to succeed", show=lambda: states(engine, operation_ids),
    )
    _assert_each_ran_once(engine, ledger, operation_ids)
    # ... every row was published exactly once, and both relays took a share
    assert table_count(engine, outbox, outbox.c.published_at.is_(None)) == 0
    assert metric(settings.metrics_dir, PUBLISHED) == len(operation_ids)
    shares = [
        metric_of_process(settings.metrics_dir, relay.pid, PUBLISHED) for relay in fleet.by_role("relay")
    ]
    assert len(shares) == 2 and all(share > 0 for share in shares), shares
    # ... and the workers got exactly one message per operation
    wait_until(
        lambda: metric(settings.metrics_dir, MESSAGES) >= len(operation_ids), timeout=15,
        what="every message to be handled",
        show=lambda: metric_by_label(settings.metrics_dir, MESSAGES, "outcome"),
    )
    assert metric(settings.metrics_dir, MESSAGES) == len(operation_ids)


def _queue_declared(broker_url: str, queue: str) -> bool:
    """Whether `queue` is declared on the broker, messages or none.

    RabbitMQ answers a passive declare. Redis keeps no key for an empty queue;
    kombu records the declaration as the queue's binding to its exchange (Celery's
    exchange of the queue's name), in the set `_kombu.binding.<exchange>`."""
    if broker_url.startswith("redis"):
        import redis

        client = redis.Redis.from_url(broker_url)
        try:
            return any(queue.encode() in member for member in client.smembers(f"_kombu.binding.{queue}"))
        finally:
            client.close()
    from kombu import Connection
    from kombu.exceptions import ChannelError

    with Connection(broker_url, connect_timeout=5) as conn:
        try:
            conn.default_channel.queue_declare(queue=queue, passive=True)
        except ChannelError:
            return False
    return True


@on_both_brokers
def test_relay_ready__connected_and_queue_declared_before_its_first_publish(
    settings: Settings, make_fleet: Callable[..., Fleet]
) -> None:
    # Given no worker (none declares the queue) and nothing in the outbox
    assert not _queue_declared(settings.broker_url, settings.queue_name)

    # When a relay is started and the fleet says it is ready
    fleet = make_fleet(workers=0, relays=1, reconcile_every=None).start()

    # Then the relay has connected to the broker and declared the queue before it
    # published anything: the first call is not the one that waits for the broker
    [relay] = fleet.by_role("relay")
    assert "toolfence relay ready" in relay.log_path.read_text()
    assert _queue_declared(settings.broker_url, settings.queue_name)
    assert metric(settings.metrics_dir, PUBLISHED) == 0


def test_relay_broker_unreachable_at_start__says_so_is_ready_and_keeps_the_rows(
    settings: Settings, ledger: Ledger, make_fleet: Callable[..., Fleet]
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    # Given a relay whose broker does not answer (a closed port)
    fleet = make_fleet(
        workers=0, relays=1, reconcile_every=None,
        env={"TOOLFENCE_BROKER_URL": f"redis://127.0.0.1:{closed_port}/0"},
    ).start()
    [relay] = fleet.by_role("relay")
    log = relay.log_path.read_text()

    # Then it said so, said it is ready, and runs its loop
    assert "broker not reachable yet" in log and "toolfence relay ready" in log
    engine = make_engine(settings.database_url)
    [operation_id] = _enqueue_requests(engine, _writes_of_every_contract("req-no-broker", 1))
    wait_until(
        lambda: table_count(engine, outbox, outbox.c.attempts > 0) > 0, timeout=30,
        what="the relay to try publishing",
    )
    # ... and the row stays for a later pass, the operation queued
    assert relay.alive()
    assert table_count(engine, outbox, outbox.c.published_at.is_(None)) == 1
    assert states(engine, [operation_id]) == {operation_id: "queued"}
