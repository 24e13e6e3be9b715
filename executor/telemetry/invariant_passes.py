"""The exporter's invariant passes: `InvariantWatch` run on a thread of its own, every
`TOOLFENCE_EXPORTER_INVARIANT_INTERVAL_SECONDS`, never inside a scrape.

A pass after the first reads what was touched since the previous one, a few
seconds of work on a busy fleet; but the first (after every start of the
exporter) judges the whole window, minutes of work at 100 operations a second,
and any pass waits on a slow database. A scrape must answer within Prometheus's
timeout whatever the fleet's rate, so scrapes serve the last completed pass, and
say how old it is (`toolfence_exporter_invariant_pass_age_seconds`; the alert
`ToolfenceInvariantPassesStale` fires when passes stop completing). Decision 0210
has the reasons.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from sqlalchemy import Connection

from executor.store.invariant_watch import InvariantWatch, PassResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completed:
    """The last pass that completed: what it found, when it ended, how long it took."""

    result: PassResult
    finished: float
    """`time.monotonic()` when it ended."""
    duration: float


@dataclass(frozen=True)
class PassStatus:
    """What a scrape serves: the last completed pass (None before the first), the
    seconds since it ended (since the passes started when none has), passes completed
    and failed."""

    last: Completed | None
    age_seconds: float
    completed: int
    errors: int


class InvariantPasses:
    """Runs passes of one `InvariantWatch` on a daemon thread, `interval_seconds` apart
    (from the end of one to the start of the next, so a slow pass never piles up),
    and holds the last completed one. `transaction` opens the read-only transaction
    each pass runs in."""

    def __init__(
        self,
        transaction: Callable[[], AbstractContextManager[Connection]],
        window_seconds: float,
        interval_seconds: float,
    ) -> None:
        self._transaction = transaction
        self._interval = interval_seconds
        self._watch = InvariantWatch(window_seconds)
        self._running = threading.Lock()  # one pass at a time: the watch is not shared
        self._state = threading.Condition()
        self._last: Completed | None = None
        self._completed = 0
        self._errors = 0
        self._since = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def watch(self) -> InvariantWatch:
        return self._watch

    def start(self) -> None:
        """Start the thread: its first pass begins now."""
        with self._state:
            self._since = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="toolfence-invariant-passes", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to stop after its pass in progress, and wait for it up to `timeout`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run_once(self) -> PassResult:
        """One pass now, on the caller's thread; raises what reading the database raises."""
        with self._running:
            began = time.monotonic()
            try:
                with self._transaction() as conn:
                    result = self._watch.run(conn)
            except Exception:
                with self._state:
                    self._errors += 1
                raise
            finished = time.monotonic()
        with self._state:
            self._last = Completed(result, finished, finished - began)
            self._completed += 1
            self._state.notify_all()
        return result

    def status(self) -> PassStatus:
        with self._state:
            last, completed, errors = self._last, self._completed, self._errors
            since = last.finished if last is not None else self._since
        return PassStatus(last, max(0.0, time.monotonic() - since), completed, errors)

    def wait_for(self, passes: int, timeout: float) -> bool:
        """Wait until `passes` passes have completed (False if `timeout` ran out first)."""
        with self._state:
            return self._state.wait_for(lambda: self._completed >= passes, timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception as exc:  # a failed pass is retried at the next interval
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                log.warning("invariant pass failed: %s: %s", type(exc).__name__, first_line)
            self._stop.wait(self._interval)
