"""Lease renewal for the operations a worker process owns (docs/design.md §Worker).

Every TTL/3 the process's one `LeaseKeeper` thread renews every lease it holds in
one statement (chunks of `RENEW_CHUNK`), each row under the same CAS as a single
renewal: (operation, generation, owner), still `started`, lease not yet expired.
So renewals cost O(workers) statements, not O(operations in flight), and an
operation costs no thread of its own; its fencing token stays its own generation.

The lease lives on the database clock; the worker cannot read that clock for
free, so each `Heartbeat` keeps a conservative local deadline on its own
monotonic clock: 90% of the lease, counted from *before* the statement that set
the lease was sent (the reserve, then each renewal that included it). Any time
spent after that moment (waiting for the reply, recovering from an ambiguous
commit, waiting for the next tick) only makes the local deadline earlier than
the database's, never later, so `owned()` turns False before the lease can
expire on the database.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from sqlalchemy import Engine

from executor import store
from executor.core.sanitize import exception_summary
from executor.telemetry import metrics

log = logging.getLogger("toolfence.worker")

# The share of the lease the worker trusts by its own clock. The rest is margin for
# the time between a check of `owned()` and the write it guards, and for the two
# clocks' rates differing.
LOCAL_SHARE_OF_LEASE = 0.9
# Leases per renewal statement: bounded so one statement's parameters stay modest.
RENEW_CHUNK = 500
# A keeper with nothing to renew for this many ticks ends its thread; the next
# lease starts a new one.
IDLE_TICKS_BEFORE_CLOSING = 30


class Heartbeat:
    """One owned operation's lease, kept by its process's `LeaseKeeper`.

    `reserve_sent_at` is `time.monotonic()` taken before the reserve (or take_over)
    statement that granted `reservation` was sent. `owned()` is False as soon as a
    renewal fails or the lease, as last renewed, would have expired by the local
    clock: the worker must then stop before its next downstream write.
    """

    def __init__(
        self,
        engine: Engine,
        reservation: store.Reservation,
        lease_seconds: float,
        *,
        reserve_sent_at: float,
    ) -> None:
        self._engine = engine
        self.reservation = reservation
        self._lease = lease_seconds
        self._lost = threading.Event()
        self._local_deadline = reserve_sent_at + lease_seconds * LOCAL_SHARE_OF_LEASE
        self._keeper: LeaseKeeper | None = None

    @property
    def key(self) -> tuple[str, int, str]:
        r = self.reservation
        return (r.operation_id, r.generation, r.owner_token)

    def owned(self) -> bool:
        return not self._lost.is_set() and time.monotonic() < self._local_deadline

    def start(self) -> None:
        while True:
            keeper = keeper_for(self._engine, self._lease)
            if keeper.hold(self):
                self._keeper = keeper
                return

    def stop(self) -> None:
        if self._keeper is not None:
            self._keeper.release(self)

    # ------------------------------------------------------------ the keeper's side

    def renewed(self, sent_at: float) -> None:
        """Measured from before the renewal was sent, as the first deadline is."""
        self._local_deadline = sent_at + self._lease * LOCAL_SHARE_OF_LEASE

    def lose(self) -> None:
        self._lost.set()

    def past_local_deadline(self) -> bool:
        return time.monotonic() >= self._local_deadline


class LeaseKeeper(threading.Thread):
    """The renewal loop of every lease of one (process, engine, lease length)."""

    def __init__(self, engine: Engine, lease_seconds: float) -> None:
        super().__init__(name="lease-keeper", daemon=True)
        self._engine = engine
        self._lease = lease_seconds
        self._held: dict[tuple[str, int, str], Heartbeat] = {}
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self.closed = False

    def hold(self, heartbeat: Heartbeat) -> bool:
        """False when this keeper has closed (idle too long): ask `keeper_for` again."""
        with self._lock:
            if self.closed:
                return False
            self._held[heartbeat.key] = heartbeat
            return True

    def release(self, heartbeat: Heartbeat) -> None:
        with self._lock:
            self._held.pop(heartbeat.key, None)

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def run(self) -> None:
        interval = self._lease / 3.0
        idle_ticks = 0
        while not self._stop_event.wait(interval):
            with self._lock:
                batch = list(self._held.values())
                idle_ticks = 0 if batch else idle_ticks + 1
                if idle_ticks >= IDLE_TICKS_BEFORE_CLOSING:
                    # Nothing held for a while (an engine no longer used): end the thread.
                    # Under the lock, so no lease can be held by a keeper that has gone.
                    self.closed = True
                    return
            for start in range(0, len(batch), RENEW_CHUNK):
                self._renew(batch[start:start + RENEW_CHUNK])

    def _renew(self, batch: list[Heartbeat]) -> None:
        sent_at = time.monotonic()
        try:
            with self._engine.begin() as conn:
                renewed = store.renew_many(conn, [h.key for h in batch], self._lease)
            metrics.LEASE_RENEWAL_STATEMENTS.inc()
        except Exception as exc:
            # Cannot reach the database: keep trying each tick until a local deadline passes.
            log.warning("lease renewal failed to reach the database: %s", exception_summary(exc))
            for heartbeat in batch:
                if heartbeat.past_local_deadline():
                    heartbeat.lose()
                    self.release(heartbeat)
            return
        with self._lock:
            still_held = set(self._held)
        for heartbeat in batch:
            if heartbeat.reservation.operation_id in renewed:
                heartbeat.renewed(sent_at)
            elif heartbeat.key in still_held:
                # Not renewed and not released meanwhile (a finished operation is no
                # longer `started`): ownership is lost.
                metrics.STALE_WRITES_FENCED.labels("renew").inc()
                heartbeat.lose()
                self.release(heartbeat)

    def stop(self) -> None:
        self._stop_event.set()


_keepers: dict[tuple[int, int, float], LeaseKeeper] = {}
_keepers_lock = threading.Lock()


def keeper_for(engine: Engine, lease_seconds: float) -> LeaseKeeper:
    """This process's keeper for the engine and lease length, started on first use.

    Keyed by pid too: a prefork pool child inherits the parent's dict but not its
    threads, so it starts its own.
    """
    key = (os.getpid(), id(engine), lease_seconds)
    with _keepers_lock:
        keeper = _keepers.get(key)
        if keeper is None or keeper.closed or not keeper.is_alive():
            keeper = LeaseKeeper(engine, lease_seconds)
            keeper.start()
            _keepers[key] = keeper
        return keeper
