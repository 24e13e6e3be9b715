"""The relay: publish outbox rows to the broker, then mark them published.

Claims a batch with `FOR UPDATE SKIP LOCKED` (PostgreSQL; SQLite serialises
writers), so two relays never publish the same row at once. A crash between
publish and mark republishes the batch: the message is only an operation id and
the worker's reservation CAS makes a duplicate harmless. LISTEN/NOTIFY wakes the
relay early on PostgreSQL; polling remains the truth. The messages themselves are
`executor.broker.publish`'s: the relay never loads the worker.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Engine,
    Integer,
    Select,
    Update,
    any_,
    bindparam,
    delete,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from executor import store
from executor.broker.publish import Publisher
from executor.core.sanitize import exception_summary
from executor.faults import Faults
from executor.settings import Settings
from executor.store import driver
from executor.store.clock import db_now
from executor.store.schema import outbox
from executor.store.turns import TURN_OUTBOX_KIND
from executor.telemetry import logcontext, metrics, tracing
from outbox.producer import NOTIFY_CHANNEL

log = logging.getLogger("toolfence.relay")

MAX_PUBLISH_BACKOFF_SECONDS = 60.0
PUBLISHED_RETENTION_SECONDS = 3600.0


class Relay:
    """`publish` sends operation ids; `publish_turn` turn ids (outbox rows of kind
    `turn`). A relay without `publish_turn` leaves turn rows for one that has it."""

    def __init__(
        self, settings: Settings, engine: Engine, publish: Publisher, publish_turn: Publisher | None = None
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.publish = publish
        self.publish_turn = publish_turn
        self.faults = Faults(settings)
        self._cycles = 0
        self.on_driver = driver.supported(engine)

    def run_once(self, *, promote: bool = True) -> int:
        """One pass: publish a batch, promote due retries and, if that queued any, publish
        again. Returns rows published.

        The batch comes first: a pass is usually woken by a producer's NOTIFY, and its
        rows are then published without waiting for the due-retry query (on the
        enqueue-to-result path of every call; docs/decisions/0178, measured in bench/PROFILING.md). A
        promoted retry is still published in the same pass. `promote=False` skips the
        due-retry query (`run_forever` runs it once per poll interval, docs/decisions/0230)."""
        published = self._publish_batch()
        if promote and self._promote_due_retries():
            published += self._publish_batch()
        self._cycles += 1
        if self._cycles % 500 == 0:
            self._forget_old_rows()
        return published

    def _batch_transaction(self, traced: bool) -> AbstractContextManager[Any]:
        """The pass's transaction: on PostgreSQL the pooled driver connection, where the
        claim and the mark, built once, cost a fraction of SQLAlchemy's execution path
        (decision 0177's measurement; 0231). With tracing on, `Connection` (the trace
        read takes a list parameter the driver path does not)."""
        if self.on_driver and not traced:
            return driver.transaction(self.engine)
        return self.engine.begin()

    def _publish_batch(self) -> int:
        traced_on = tracing.enabled()
        with self._batch_transaction(traced_on) as conn:
            rows = conn.execute(
                _claim_statement(self.publish_turn is not None),
                {"batch_limit": self.settings.relay_batch_size},
            ).all()
            if not rows:
                return 0
            published: list[int] = []
            seen: set[tuple[str | None, str]] = set()
            # Each publish joins its request's trace (tracing on only: one more read).
            traced = store.trace_contexts(
                conn, [row.operation_id for row in rows if row.kind is None]
            ) if traced_on else {}
            for row in rows:
                if (row.kind, row.operation_id) in seen:
                    # Two rows for one operation in a batch: one message is enough.
                    published.append(row.outbox_id)
                    continue
                publish = self.publish if row.kind is None else self.publish_turn
                assert publish is not None  # the query selects turn rows only with publish_turn
                # The row's id as the log field it is (a turn row's holds a turn id).
                ids = {"operation_id" if row.kind is None else "turn_id": row.operation_id}
                try:
                    with logcontext.log_context(**ids), tracing.publish_span(
                        row.operation_id, traced.get(row.operation_id)
                    ):
                        with metrics.RELAY_PUBLISH_SECONDS.time():
                            publish(row.operation_id)
                        log.info("published %s", row.operation_id)
                except Exception as exc:
                    metrics.RELAY_PUBLISH_FAILURES.inc()
                    with logcontext.log_context(**ids):
                        log.warning("publish of %s failed: %s", row.operation_id, type(exc).__name__)
                    backoff = min(MAX_PUBLISH_BACKOFF_SECONDS, 0.5 * 2 ** min(row.attempts, 10))
                    conn.execute(
                        update(outbox)
                        .where(outbox.c.outbox_id == row.outbox_id)
                        .values(
                            attempts=outbox.c.attempts + 1,
                            next_attempt_at=db_now() + backoff,
                            last_error=type(exc).__name__,
                        )
                    )
                    continue
                seen.add((row.kind, row.operation_id))
                published.append(row.outbox_id)
            self.faults.fire("relay_after_publish")
            if published and conn.dialect.name == "postgresql":
                conn.execute(_mark_statement(), {"outbox_ids": published})
            elif published:
                conn.execute(
                    update(outbox)
                    .where(outbox.c.outbox_id.in_(published))
                    .values(published_at=db_now(), attempts=outbox.c.attempts + 1)
                )
        metrics.RELAY_PUBLISHED.inc(len(published))
        return len(published)

    def _promote_due_retries(self) -> int:
        """retry_wait → queued for each operation now due (with its outbox row); how many."""
        with self.engine.connect() as conn:
            due = store.due_retries(conn, self.settings.relay_batch_size)
        promoted = 0
        for operation_id in due:
            with self.engine.begin() as conn:
                promoted += store.promote_due_retry(conn, operation_id)
        return promoted

    def _forget_old_rows(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                delete(outbox).where(
                    outbox.c.published_at.is_not(None),
                    outbox.c.published_at < db_now() - PUBLISHED_RETENTION_SECONDS,
                )
            )

    def run_forever(self, stop: threading.Event) -> None:
        """Pass after pass until `stop`. Due retries are looked for once per poll
        interval, not on every pass: a pass woken by each producer's NOTIFY would
        otherwise run the due-retry query once per message published. A retry is due by
        the database clock and was never promoted sooner than the next poll (an idle
        relay sleeps that long), so this bound is unchanged (docs/decisions/0230)."""
        waiter = _Waiter(self.settings)
        next_promotion = 0.0
        try:
            while not stop.is_set():
                try:
                    promote = time.monotonic() >= next_promotion
                    if promote:
                        next_promotion = time.monotonic() + self.settings.relay_poll_seconds
                    busy = self.run_once(promote=promote) >= self.settings.relay_batch_size
                except Exception as exc:
                    # Database or broker trouble: log, wait, try again. Rows stay unpublished.
                    log.error("relay pass failed: %s", exception_summary(exc))
                    busy = False
                    stop.wait(1.0)
                if not busy:
                    waiter.wait(stop)
        finally:
            waiter.close()


@functools.cache
def _claim_statement(with_turns: bool) -> Select[Any]:
    """Up to `:batch_limit` unpublished, due rows, oldest first, locked (SKIP LOCKED)
    until the pass's transaction ends; built once per kind set."""
    kinds: ColumnElement[bool] = outbox.c.kind.is_(None)
    if with_turns:
        kinds = or_(kinds, outbox.c.kind == TURN_OUTBOX_KIND)
    return (
        select(outbox.c.outbox_id, outbox.c.operation_id, outbox.c.attempts, outbox.c.kind)
        .where(outbox.c.published_at.is_(None), outbox.c.next_attempt_at <= db_now(), kinds)
        .order_by(outbox.c.next_attempt_at, outbox.c.outbox_id)
        .limit(bindparam("batch_limit", type_=Integer()))
        .with_for_update(skip_locked=True)
    )


@functools.cache
def _mark_statement() -> Update:
    """The rows `:outbox_ids` published (PostgreSQL: one array parameter, built once)."""
    return (
        update(outbox)
        .where(outbox.c.outbox_id == any_(bindparam("outbox_ids", type_=ARRAY(BigInteger()))))
        .values(published_at=db_now(), attempts=outbox.c.attempts + 1)
    )


class _Waiter:
    """Sleeps until the poll interval passes or, on PostgreSQL, a NOTIFY arrives."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._conn: Any = None
        if settings.database_url.startswith("postgres"):
            self._connect()

    def _connect(self) -> None:
        import psycopg

        url = self.settings.database_url.replace("postgresql+psycopg://", "postgresql://", 1)
        try:
            self._conn = psycopg.connect(url, autocommit=True, connect_timeout=5)
            self._conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        except Exception as exc:
            log.warning("LISTEN unavailable; polling only: %s", exception_summary(exc))
            self._conn = None

    def wait(self, stop: threading.Event) -> None:
        timeout = self.settings.relay_poll_seconds
        if self._conn is None:
            stop.wait(timeout)
            return
        try:
            for _ in self._conn.notifies(timeout=timeout, stop_after=1):
                pass
            # The NOTIFYs that came with it, or while the last pass ran: one pass
            # publishes all their rows, so they wake none of their own (each such
            # pass would find nothing).
            for _ in self._conn.notifies(timeout=0):
                pass
        except Exception:
            self.close()
            stop.wait(timeout)
            self._connect()

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None
