"""The lease renewal loop of one owned operation (DESIGN.md "Worker").

Every TTL/3 the heartbeat renews the lease with a CAS on (operation, generation,
owner). The lease lives on the database clock; the worker cannot read that clock
for free, so it keeps a conservative local deadline on its own monotonic clock:
90% of the lease, counted from *before* the statement that set the lease was
sent. Any time spent after that moment (waiting for the reply, recovering from an
ambiguous commit, starting this thread) only makes the local deadline earlier
than the database's, never later, so `owned()` turns False before the lease can
expire on the database.
"""

from __future__ import annotations

import logging
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


class Heartbeat(threading.Thread):
    """Renews the lease every TTL/3 with a CAS on (operation, generation, owner).

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
        super().__init__(name=f"heartbeat-{reservation.operation_id}", daemon=True)
        self._engine = engine
        self._reservation = reservation
        self._lease = lease_seconds
        self._stop_event = threading.Event()
        self._lost = threading.Event()
        self._local_deadline = reserve_sent_at + lease_seconds * LOCAL_SHARE_OF_LEASE

    def owned(self) -> bool:
        return not self._lost.is_set() and time.monotonic() < self._local_deadline

    def run(self) -> None:
        interval = self._lease / 3.0
        while not self._stop_event.wait(interval):
            sent_at = time.monotonic()
            try:
                with self._engine.begin() as conn:
                    expiry = store.renew(
                        conn,
                        self._reservation.operation_id,
                        self._reservation.generation,
                        self._reservation.owner_token,
                        self._lease,
                    )
            except Exception as exc:
                # Cannot reach the database: keep trying until the local deadline passes.
                log.warning("lease renewal failed to reach the database: %s", exception_summary(exc))
                if time.monotonic() >= self._local_deadline:
                    self._lost.set()
                    return
                continue
            if expiry is None:
                metrics.STALE_WRITES_FENCED.labels("renew").inc()
                self._lost.set()
                return
            # Measured from before the renewal was sent, as the first deadline is.
            self._local_deadline = sent_at + self._lease * LOCAL_SHARE_OF_LEASE

    def stop(self) -> None:
        self._stop_event.set()
