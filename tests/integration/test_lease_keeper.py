"""One lease keeper per worker process renews every lease it holds in one statement.

Each test runs on SQLite and PostgreSQL with the real database clock.
"""

from __future__ import annotations

import time
import uuid

from prometheus_client import REGISTRY
from sqlalchemy import Engine, update

from executor import store
from executor.core.tools import Mode
from executor.core.types import ServerContext
from executor.store.schema import operations
from executor.worker.heartbeat import Heartbeat, keeper_for

CONTEXT = ServerContext(principal="alice", tenant="acme", request_id="req-keeper")


def reserved(engine: Engine, n: int, lease: float) -> list[tuple[store.Reservation, float]]:
    # Every operation registered first, so that the leases start together, just
    # before the caller starts their heartbeats (a slow machine's registrations
    # must not eat the first leases).
    operation_ids = [f"op-{uuid.uuid4().hex[:12]}" for _ in range(n)]
    for operation_id in operation_ids:
        with engine.begin() as conn:
            store.register(conn, store.NewOperation(
                operation_id=operation_id, request_id=f"r-{operation_id}", call_id="c", position=0,
                tool_name="probe.read", schema_version=1, mode=Mode.READ.value,
                intent_hash=uuid.uuid4().hex, arguments={}, context=CONTEXT.to_json(),
                needs_approval=False, impact=None,
            ))
    out = []
    for operation_id in operation_ids:
        sent_at = time.monotonic()
        with engine.begin() as conn:
            reservation = store.reserve(conn, operation_id, store.new_owner_token(), lease)
        assert reservation is not None
        out.append((reservation, sent_at))
    return out


def renewal_statements() -> float:
    return REGISTRY.get_sample_value("toolfence_lease_renewal_statements_total") or 0.0


def test_renew_many__mixed_owners__renews_exactly_the_live_owners_rows(engine: Engine) -> None:
    # Given three leases: one live, one whose owner token changed (taken over), one expired
    live, stolen, expired = (r for r, _ in reserved(engine, 3, 30.0))
    with engine.begin() as conn:
        conn.execute(update(operations).where(operations.c.operation_id == stolen.operation_id)
                     .values(owner_token="someone-else"))
        conn.execute(update(operations).where(operations.c.operation_id == expired.operation_id)
                     .values(lease_expires_at=1.0))
    held = [(r.operation_id, r.generation, r.owner_token) for r in (live, stolen, expired)]

    # When they are renewed together
    with engine.begin() as conn:
        renewed = store.renew_many(conn, held, 30.0)

    # Then only the live owner's row is renewed, under the single renewal's own condition
    assert renewed == {live.operation_id}
    with engine.connect() as conn:
        assert store.renew(conn, expired.operation_id, expired.generation, expired.owner_token, 30.0) is None


def test_keeper__forty_leases_held__one_statement_per_tick_and_every_lease_kept(engine: Engine) -> None:
    # Given forty operations owned by this process, with a 3 s lease (renewed every 1 s;
    # room for a busy machine's scheduling, as a fleet's 10 s lease has)
    lease = 3.0
    beats = [Heartbeat(engine, r, lease, reserve_sent_at=t) for r, t in reserved(engine, 40, lease)]
    before = renewal_statements()

    # When they are held for three lease lengths
    for beat in beats:
        beat.start()
    time.sleep(3 * lease)

    # Then every lease is still owned, locally and on the database clock, and the
    # renewals took about one statement per tick (TTL/3), not one per operation per tick
    try:
        assert all(beat.owned() for beat in beats)
        with engine.connect() as conn:
            remaining = [store.lease_remaining(conn, b.reservation.operation_id) for b in beats]
        assert all(r is not None and r > 0 for r in remaining)
        statements = renewal_statements() - before
        assert 6 <= statements <= 12, statements  # ~9 ticks in 9 s; 360 if it were per operation
    finally:
        for beat in beats:
            beat.stop()


def test_keeper__one_lease_taken_over__only_that_one_lost(engine: Engine) -> None:
    lease = 3.0  # renewed every 1 s: room for a busy machine (see the forty-lease test)
    beats = [Heartbeat(engine, r, lease, reserve_sent_at=t) for r, t in reserved(engine, 3, lease)]
    for beat in beats:
        beat.start()
    try:
        # Given a lease whose row a newer generation took over
        taken = beats[1].reservation
        with engine.begin() as conn:
            conn.execute(update(operations).where(operations.c.operation_id == taken.operation_id)
                         .values(generation=taken.generation + 1, owner_token="new-owner"))
        # When the next renewals run
        time.sleep(lease)
        # Then that heartbeat says ownership is lost, and the others keep theirs
        assert [beat.owned() for beat in beats] == [True, False, True]
        assert keeper_for(engine, lease).held() == 2
    finally:
        for beat in beats:
            beat.stop()


def test_keeper__released_leases__no_statement_while_nothing_is_held(engine: Engine) -> None:
    lease = 1.2
    [(reservation, sent_at)] = reserved(engine, 1, lease)
    beat = Heartbeat(engine, reservation, lease, reserve_sent_at=sent_at)
    beat.start()
    beat.stop()
    before = renewal_statements()
    time.sleep(lease)
    assert renewal_statements() == before
