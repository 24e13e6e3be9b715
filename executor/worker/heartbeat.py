"""The lease renewal loop of one owned operation (DESIGN.md "Worker")."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import Engine

from executor import store
from executor.telemetry import metrics

log = logging.getLogger("toolfence.worker")


class Heartbeat(threading.Thread):
    """Renews the lease every TTL/3 with a CAS on (operation, generation, owner).

    `owned()` is False as soon as a renewal fails or the lease, as last renewed,
    would have expired by the local clock: the worker must then stop before its
    next downstream write.
    """

    def __init__(
        self,
        engine: Engine,
        reservation: store.Reservation,
        lease_seconds: float,
    ) -> None:
        super().__init__(name=f"heartbeat-{reservation.operation_id}", daemon=True)
        self._engine = engine
        self._reservation = reservation
        self._lease = lease_seconds
        self._stop_event = threading.Event()
        self._lost = threading.Event()
        # Local deadline, measured from *before* the reserve statement returned: conservative.
        self._local_deadline = time.monotonic() + lease_seconds * 0.9

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
            except Exception:
                # Cannot reach the database: keep trying until the local deadline passes.
                log.warning("lease renewal failed to reach the database", exc_info=True)
                if time.monotonic() >= self._local_deadline:
                    self._lost.set()
                    return
                continue
            if expiry is None:
                metrics.STALE_WRITES_FENCED.labels("renew").inc()
                self._lost.set()
                return
            self._local_deadline = sent_at + self._lease * 0.9

    def stop(self) -> None:
        self._stop_event.set()
