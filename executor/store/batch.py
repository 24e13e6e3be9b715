"""An admission's reads in one round trip and its writes in another.

`enqueue` used to ask the database as it went: the scope locks, the request's
calls, a budget count per call and scope, an earlier write per write, the clock,
the registering INSERT, the call row, the outbox row, NOTIFY: nine statements and
nine round trips for a one-call request. Everything it asks can be asked up front
(`read_for_admission`: the locks first, then what the locked scopes hold), and
everything it writes can wait until every call is decided (`Writes`): the gates
between them are CPU, and a tool's hooks read through their own connections (they
never saw this transaction's rows). On PostgreSQL each half is one pipeline
(psycopg's pipeline mode: the statements go out together and one Sync ends them),
so a request of any number of calls costs two round trips;
docs/decisions/0212-an-admission-reads-in-one-round-trip-and-writes-in-one.md has
the safety argument. On SQLite the same statements run one after the other: the
database is in the process, a round trip costs nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import psycopg
from psycopg.pq import ExecStatus
from psycopg.rows import dict_row
from sqlalchemy import (
    BigInteger,
    Connection,
    Executable,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal,
    or_,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, distinct_on
from sqlalchemy.exc import DBAPIError

from executor.core.admission import AdmissionUnavailable, Gate
from executor.core.budgets import Scope, Usage
from executor.core.states import State
from executor.core.tools import Mode
from executor.core.types import ServerContext
from executor.errors import AdmissionError
from executor.store import wire
from executor.store.clock import DATABASE_CLOCK, Clock, built_once
from executor.store.driver import compiled_for
from executor.store.intake import (
    _CALL_COLUMNS,
    _insert_call,
    _insert_outbox_row,
    call_row_parameters,
    scope_lock_ids,
)
from executor.store.reads import earlier_write
from executor.store.records import NewOperation, OperationRow
from executor.store.registration import (
    approval_values,
    register_many_statement,
    register_statement,
    registration_parameters,
)
from executor.store.results import DriverResult, DriverRow
from executor.store.schema import approvals, calls, operations, outbox

NOTIFY_CHANNEL = "toolfence_outbox"
NOTIFY_SQL = f"NOTIFY {NOTIFY_CHANNEL}"


class AdmissionRaced(AdmissionUnavailable):
    """An operation id admission found free was taken before its INSERT ran.

    Only an id the caller chose can be taken so (a default id names the request,
    whose lock this transaction holds): another request registered it in between.
    Nothing this admission wrote may stand: as for any `AdmissionUnavailable`, roll
    back and enqueue the request again, which then answers from what that request
    registered (`idempotency_conflict`, or its result)."""

    def __init__(self, operation_id: str) -> None:
        AdmissionError.__init__(
            self,
            "an operation id was registered by another request while this one was admitted; "
            "roll back and enqueue the request again",
        )
        self.tool_name = ""
        self.gate = Gate.REGISTRATION
        self.kind = "operation_id_taken"
        self.operation_id = operation_id


# ------------------------------------------------------------------ the reads

_LOCK = text("SELECT pg_advisory_xact_lock(:lock_id)")
_NOW = select(DATABASE_CLOCK.now().label("now"))
# The last lock and the clock in one statement: the clock is read per row of the
# materialized lock, so only once the lock is held (decision 0234).
_locked = select(func.pg_advisory_xact_lock(bindparam("lock_id", type_=BigInteger())).label("locked"))
_LOCK_THEN_NOW = select(DATABASE_CLOCK.now().label("now")).select_from(
    _locked.cte("locked").prefix_with("MATERIALIZED")
)


def locks_then_clock(lock_ids: Sequence[int]) -> list[tuple[Executable, Mapping[str, Any]]]:
    """Take the advisory locks in the order given, the last one with the database clock
    read after it is held: its result is the clock (one statement fewer than apart)."""
    *first, last = lock_ids
    return [*((_LOCK, {"lock_id": lock_id}) for lock_id in first), (_LOCK_THEN_NOW, {"lock_id": last})]
_CALLS_OF_REQUEST = select(calls).where(
    calls.c.tenant == bindparam("tenant"), calls.c.request_id == bindparam("request_id")
)
# As `scope_usage` counts, spelled without an expanding IN (compiled once, as is).
_COUNTED = or_(
    calls.c.gate.is_(None), and_(calls.c.gate != Gate.BUDGET.value, calls.c.gate != Gate.HOSTED.value)
)
_FAILED_REPEAT = and_(calls.c.gate == Gate.REPEAT.value, calls.c.result.is_not(None))


def _usage_by_tool(by_conversation: bool) -> Executable:
    scope = (calls.c.conversation_id if by_conversation else calls.c.request_id) == bindparam("scope")
    return (
        select(
            calls.c.tool_name,
            func.count().label("calls"),
            func.coalesce(func.sum(case((_FAILED_REPEAT, 1), else_=0)), 0).label("failures"),
        )
        .where(calls.c.tenant == bindparam("tenant"), scope, _COUNTED)
        .group_by(calls.c.tool_name)
    )


_USAGE_OF_REQUEST = _usage_by_tool(False)
_USAGE_OF_CONVERSATION = _usage_by_tool(True)
_OPERATIONS_BY_ID = select(operations).where(operations.c.operation_id == func.any(bindparam("ids")))


def _earlier_writes(by_conversation: bool) -> Executable:
    scope = operations.c.request_id == bindparam("request_id")
    if by_conversation:
        scope = or_(scope, operations.c.conversation_id == bindparam("conversation_id"))
    return (
        select(operations)
        .ext(distinct_on(operations.c.intent_hash))
        .where(
            operations.c.tenant == bindparam("tenant"),
            operations.c.mode == Mode.WRITE.value,
            operations.c.intent_hash == func.any(bindparam("hashes")),
            scope,
        )
        .order_by(operations.c.intent_hash, operations.c.created_at, operations.c.position)
    )


_EARLIER_IN_REQUEST = _earlier_writes(False)
_EARLIER_IN_CONVERSATION = _earlier_writes(True)


@dataclass
class ScopeUsage:
    """A scope's counted calls by stored tool name, and its failed repeats: `Usage`
    for any call, kept current as the batch records its own calls."""

    by_tool: Counter[str] = field(default_factory=Counter)
    failures: int = 0

    def usage(self, tool_name: str, write_tools: Iterable[str]) -> Usage:
        # As `scope_usage` counts: a stored name is compared with the name as proposed.
        writes = sum(self.by_tool[name] for name in set(write_tools))
        return Usage(
            calls=sum(self.by_tool.values()), writes=writes,
            tool_calls=self.by_tool[tool_name], repeated_failures=self.failures,
        )

    def count(self, stored_tool_name: str, gate: Gate | None, has_result: bool) -> None:
        if gate in (Gate.BUDGET, Gate.HOSTED):
            return
        self.by_tool[stored_tool_name] += 1
        if gate is Gate.REPEAT and has_result:
            self.failures += 1


@dataclass
class AdmissionReads:
    """What the locked scopes held when admission began."""

    now: float
    calls: dict[str, Any]
    request: ScopeUsage
    conversation: ScopeUsage | None
    earlier: dict[str, OperationRow]
    """intent hash → the first write of the request or conversation with it (of the
    hashes asked for)."""
    operations: dict[str, OperationRow]
    """operation id → its row (of the ids asked for)."""
    hashes: frozenset[str]
    """The intent hashes asked for: one of them not in `earlier` has no earlier write."""
    asked_ids: frozenset[str]
    """The operation ids asked for: one of them not in `operations` was free."""

    def usages(self) -> list[ScopeUsage]:
        return [self.request] if self.conversation is None else [self.request, self.conversation]


def _rows_by(rows: Sequence[Any], key: str) -> dict[str, OperationRow]:
    return {getattr(row, key): OperationRow.from_row(row) for row in rows}


def _outbox_params(operation_id: str) -> dict[str, Any]:
    return {"operation_id": operation_id, "delay_seconds": 0.0}


def usage_of_calls(rows: Iterable[Any]) -> ScopeUsage:
    """A request's usage counted from its call rows, as `_USAGE_OF_REQUEST` counts it
    (the request's rows are read anyway: one statement fewer)."""
    usage = ScopeUsage()
    for row in rows:
        if row.gate not in _NOT_COUNTED:
            usage.by_tool[row.tool_name] += 1
            if row.gate == Gate.REPEAT.value and row.result is not None:
                usage.failures += 1
    return usage


_NOT_COUNTED = frozenset({Gate.BUDGET.value, Gate.HOSTED.value})


def _usage_of(rows: Sequence[Any]) -> ScopeUsage:
    usage = ScopeUsage()
    for row in rows:
        usage.by_tool[row.tool_name] += int(row.calls)
        usage.failures += int(row.failures)
    return usage


def read_for_admission(
    conn: Connection,
    tenant: str,
    request_id: str,
    conversation_id: str | None,
    *,
    hashes: Iterable[str],
    operation_ids: Iterable[str],
) -> AdmissionReads:
    """Lock the request's scopes, then read what admission needs of them: the
    request's calls, each scope's counted calls by tool, the first earlier write of
    each of `hashes`, the rows of `operation_ids`, and the database clock.

    On PostgreSQL, one pipeline: the lock statements run first and each read takes
    its snapshot when it starts, after the locks are held (READ COMMITTED), so it
    sees every producer of these scopes that committed before."""
    hashes, ids = frozenset(hashes), sorted(set(operation_ids))
    if conn.dialect.name != "postgresql":
        return _read_one_by_one(conn, tenant, request_id, conversation_id, hashes, ids)
    scope_params = {"tenant": tenant, "request_id": request_id, "conversation_id": conversation_id}
    statements = locks_then_clock(scope_lock_ids(tenant, request_id, conversation_id))
    first_read = len(statements) - 1  # the last lock's statement reads the clock
    statements.append((_CALLS_OF_REQUEST, {"tenant": tenant, "request_id": request_id}))
    if conversation_id is not None:
        statements.append((_USAGE_OF_CONVERSATION, {"tenant": tenant, "scope": conversation_id}))
    if hashes:
        earlier = _EARLIER_IN_CONVERSATION if conversation_id is not None else _EARLIER_IN_REQUEST
        statements.append((earlier, {**scope_params, "hashes": sorted(hashes)}))
    if ids:
        statements.append((_OPERATIONS_BY_ID, {"ids": ids}))
    results = iter(pipelined(conn, statements)[first_read:])
    now = float(next(results).scalar_one())
    calls_of_request = {row.call_id: row for row in next(results).all()}
    request_usage = usage_of_calls(calls_of_request.values())
    conversation_usage = _usage_of(next(results).all()) if conversation_id is not None else None
    earlier_rows = _rows_by(next(results).all(), "intent_hash") if hashes else {}
    operation_rows = _rows_by(next(results).all(), "operation_id") if ids else {}
    return AdmissionReads(
        now, calls_of_request, request_usage, conversation_usage, earlier_rows, operation_rows,
        hashes, frozenset(ids),
    )


def _read_one_by_one(
    conn: Connection, tenant: str, request_id: str, conversation_id: str | None,
    hashes: frozenset[str], ids: list[str],
) -> AdmissionReads:
    """SQLite: `BEGIN IMMEDIATE` holds the one write lock already; no DISTINCT ON, no ANY."""
    now = float(conn.execute(_NOW).scalar_one())
    calls_of_request = {
        row.call_id: row
        for row in conn.execute(_CALLS_OF_REQUEST, {"tenant": tenant, "request_id": request_id}).all()
    }
    request_usage = _usage_of(conn.execute(_USAGE_OF_REQUEST, {"tenant": tenant, "scope": request_id}).all())
    conversation_usage = None
    if conversation_id is not None:
        conversation_usage = _usage_of(
            conn.execute(_USAGE_OF_CONVERSATION, {"tenant": tenant, "scope": conversation_id}).all()
        )
    earlier_rows: dict[str, OperationRow] = {}
    for intent in sorted(hashes):
        row = earlier_write(conn, tenant, request_id, conversation_id, intent)
        if row is not None:
            earlier_rows[intent] = row
    operation_rows: dict[str, OperationRow] = {}
    if ids:
        found = conn.execute(select(operations).where(operations.c.operation_id.in_(ids))).all()
        operation_rows = {row.operation_id: OperationRow.from_row(row) for row in found}
    return AdmissionReads(
        now, calls_of_request, request_usage, conversation_usage, earlier_rows, operation_rows,
        hashes, frozenset(ids),
    )


# ------------------------------------------------------------------ the writes


@dataclass
class _Registration:
    new: NewOperation
    state: State
    params: dict[str, Any]
    approval: dict[str, Any] | None


@dataclass
class Writes:
    """An admission's rows, in the order they were decided, written by `flush`."""

    now: float
    clock: Clock = DATABASE_CLOCK
    _items: list[tuple[str, Any]] = field(default_factory=list)
    _registered: int = 0

    def register(self, new: NewOperation, postgresql: bool) -> tuple[State, str | None]:
        """Register a new operation (its id checked free by `read_for_admission`): its
        state and, when it waits for an approval, its approval id."""
        # The clock read with the reads, a microsecond more for each operation decided
        # before it in the batch: created in the order the calls were decided, as when
        # each registration read the clock itself.
        now = self.now + self._registered * 1e-6
        self._registered += 1
        state, params = registration_parameters(new, now, postgresql)
        approval = approval_values(new, now) if state is State.PENDING_APPROVAL else None
        self._items.append(("register", _Registration(new, state, params, approval)))
        return state, None if approval is None else approval["approval_id"]

    def record_call(self, **values: Any) -> None:
        self._items.append(("call", values))

    def add_outbox_row(self, operation_id: str) -> None:
        self._items.append(("outbox", operation_id))

    def notify(self) -> None:
        self._items.append(("notify", None))

    def __bool__(self) -> bool:
        return bool(self._items)

    def flush(self, conn: Connection) -> None:
        """Write everything decided so far, in order; then nothing is pending."""
        items, self._items = self._items, []
        if not items:
            return
        if conn.dialect.name != "postgresql":
            self._flush_one_by_one(conn, items)
            return
        statements: list[tuple[Executable, Mapping[str, Any]]] = []
        registering: list[tuple[int, list[str]]] = []
        call_rows: list[dict[str, Any]] = []
        outbox_ids: list[str] = []
        notify = False
        by_state: dict[State, list[_Registration]] = {}
        for kind, item in items:
            if kind == "register":
                by_state.setdefault(item.state, []).append(item)
            elif kind == "call":
                call_rows.append(call_row_parameters(**item))
            elif kind == "outbox":
                outbox_ids.append(item)
            else:
                notify = True
        # The registrations of each starting state as one statement (decision 0233),
        # then the approval rows of those waiting for one.
        for state, group in by_state.items():
            if len(group) == 1:
                registering.append((len(statements), [group[0].new.operation_id]))
                statements.append((register_statement(self.clock, True, state), group[0].params))
            else:
                registering.append((len(statements), [item.new.operation_id for item in group]))
                statements.append((register_many_statement(self.clock, state), {
                    **{name: value for name, value in group[0].params.items() if not name.startswith("new_")},
                    **{name: [item.params[name] for item in group]
                       for name in group[0].params if name.startswith("new_")},
                }))
        statements += [
            (_INSERT_APPROVAL, item.approval)
            for group in by_state.values() for item in group if item.approval is not None
        ]
        # After every registration (the rows they name exist by then), the call rows
        # and the outbox rows each as one statement however many there are, in the
        # order they were decided (decision 0233).
        if len(call_rows) == 1:
            statements.append((_insert_call(self.clock), call_rows[0]))
        elif call_rows:
            statements.append((_insert_calls(self.clock), {
                column: [row[column] for row in call_rows] for column in _CALL_COLUMNS
            }))
        # NOTIFY rides on the outbox rows' statement when there are any (a CTE's
        # INSERT runs to completion whatever the statement reads of it).
        if outbox_ids:
            statements.append((_queue_rows(self.clock, notify), {"operation_ids": outbox_ids}))
        elif notify:
            statements.append((_NOTIFY, {}))
        results = pipelined(conn, statements)
        for index, operation_ids in registering:
            inserted = {row.operation_id for row in results[index].all()}
            for operation_id in operation_ids:
                if operation_id not in inserted:
                    raise AdmissionRaced(operation_id)

    def _flush_one_by_one(self, conn: Connection, items: list[tuple[str, Any]]) -> None:
        from executor.store.audit import append_event

        for kind, item in items:
            if kind == "register":
                statement = register_statement(self.clock, False, item.state)
                row = conn.execute(statement, item.params).one_or_none()
                if row is None:
                    raise AdmissionRaced(item.new.operation_id)
                append_event(conn, row, None, item.state, "admitted", self.clock)
                if item.approval is not None:
                    conn.execute(_INSERT_APPROVAL, item.approval)
            elif kind == "call":
                conn.execute(_insert_call(self.clock), call_row_parameters(**item))
            elif kind == "outbox":
                conn.execute(_insert_outbox_row(self.clock, False), _outbox_params(item))


@built_once
def _insert_calls(clock: Clock) -> Executable:
    """Many call rows in one statement: each column's values as one array, unnested
    in step (PostgreSQL zips set-returning functions of one select list)."""
    rows = select(*(
        func.unnest(bindparam(column, type_=ARRAY(calls.c[column].type))).label(column)
        for column in _CALL_COLUMNS
    ), clock.now().label("created_at"))
    return insert(calls).from_select([*_CALL_COLUMNS, "created_at"], rows)


@built_once
def _queue_rows(clock: Clock, notify: bool) -> Executable:
    """The outbox rows of `:operation_ids`, in order, and with `notify` the NOTIFY of
    `NOTIFY_SQL` (`pg_notify` with an empty payload is the same notification)."""
    now = clock.now()
    ids = bindparam("operation_ids", type_=ARRAY(outbox.c.operation_id.type))
    rows = select(
        func.unnest(ids).label("operation_id"),
        now.label("created_at"), now.label("next_attempt_at"), literal(0).label("attempts"),
    )
    queued = insert(outbox).from_select(["operation_id", "created_at", "next_attempt_at", "attempts"], rows)
    if not notify:
        return queued
    return select(func.pg_notify(literal(NOTIFY_CHANNEL), literal("")).label("notified")).add_cte(
        queued.returning(outbox.c.outbox_id).cte("queued")
    )


_INSERT_APPROVAL = insert(approvals).values(
    **{name: bindparam(name, type_=approvals.c[name].type) for name in (
        "approval_id", "operation_id", "intent_hash", "impact", "state", "requested_at", "expires_at",
    )}
)
_NOTIFY = text(NOTIFY_SQL)


# ------------------------------------------------------------------ the loop's view


class Intake:
    """One admission's connection, what it read up front (`store.read_for_admission`)
    and what it will write (`store.Writes`): the loop decides from the reads and the
    rows it has decided, and asks the database again only where those cannot answer
    (then it writes what it decided first, so the database sees it)."""

    def __init__(self, conn: Connection, reads: AdmissionReads, writes: Writes,
                 write_tools: list[str]) -> None:
        self.conn, self.reads, self.writes, self.write_tools = conn, reads, writes, write_tools
        self.registered: dict[str, str] = {}  # operation id → intent hash, of this batch
        # (intent hash, tenant, request or conversation) of each operation this batch
        # registered (`enqueue_many` shares them, and `registered`, among its requests).
        self.intents: set[tuple[str, str, str, bool]] = set()
        self.postgresql = conn.dialect.name == "postgresql"

    def share(self, other: Intake) -> None:
        """Count `other`'s registrations as this one's (requests of one batch)."""
        self.registered, self.intents = other.registered, other.intents

    def note_registered(self, new: NewOperation) -> None:
        self.registered[new.operation_id] = new.intent_hash
        self.intents.add((new.intent_hash, new.tenant, new.request_id, False))
        if new.conversation_id is not None:
            self.intents.add((new.intent_hash, new.tenant, new.conversation_id, True))

    def _registered_in_scope(self, context: ServerContext, intent: str) -> bool:
        """Did this batch register a write with `intent` in the request's scopes?"""
        return (intent, context.tenant, context.request_id, False) in self.intents or (
            context.conversation_id is not None
            and (intent, context.tenant, context.conversation_id, True) in self.intents
        )

    def usage(self, scope: Scope, tool_name: str) -> Usage:
        counted = self.reads.request if scope is Scope.REQUEST else self.reads.conversation
        assert counted is not None
        return counted.usage(tool_name, self.write_tools)

    def counted(self, stored_tool_name: str, gate: Gate | None, has_result: bool) -> None:
        for usage in self.reads.usages():
            usage.count(stored_tool_name, gate, has_result)

    def earlier_write(self, context: ServerContext, intent: str) -> OperationRow | None:
        """The first write of the request or conversation with this intent: one from
        before the batch if the reads found it, else one of this batch (asked of the
        database once this batch's rows are written), else none."""
        found = self.reads.earlier.get(intent)
        if found is not None:
            return found
        if intent in self.reads.hashes and not self._registered_in_scope(context, intent):
            return None
        self.writes.flush(self.conn)
        return earlier_write(
            self.conn, context.tenant, context.request_id, context.conversation_id, intent
        )

    def existing(self, operation_id: str) -> OperationRow | None | bool:
        """The operation's row if the reads found it, None if they found it free, True if
        only the database can tell (this batch's writes are then written first)."""
        if operation_id in self.reads.operations:
            return self.reads.operations[operation_id]
        if operation_id in self.registered or operation_id not in self._asked:
            self.writes.flush(self.conn)
            return True
        return None

    @property
    def _asked(self) -> frozenset[str]:
        return self.reads.asked_ids


# ------------------------------------------------------------------ the pipeline


def pipelined(
    conn: Connection, statements: Sequence[tuple[Executable, Mapping[str, Any]]]
) -> list[DriverResult]:
    """Run `statements` in order on the connection's own transaction, as one
    pipeline: sent together, ended by one Sync, so one round trip. Each statement's
    rows are fetched in full (admission's reads return a handful). An error is raised
    as SQLAlchemy's `DBAPIError` would be, without the parameters; the transaction is
    then aborted and the caller rolls back, as after any failed statement.

    On libpq's pipeline with prepared statements (`wire`, decision 0235) when the
    connection allows it, else on psycopg's."""
    if not conn.in_transaction():
        conn.begin()  # as the first `execute` would: the caller's commit must commit these
    fairy = conn.connection
    driver = cast(psycopg.Connection[Any], fairy.driver_connection)
    compiled = [compiled_for(statement, conn.dialect) for statement, _ in statements]
    if wire.supported(driver):
        try:
            return wire.run(driver, [
                (entry.sql, entry.parameters(params))
                for entry, (_, params) in zip(compiled, statements, strict=True)
            ])
        except wire.PipelineBroken as broken:
            conn.engine.pool._invalidate(fairy, broken.error)  # noqa: SLF001 - as on a disconnect
            conn.invalidate(broken.error)
            raise DBAPIError.instance(
                None, None, broken.error, psycopg.Error, hide_parameters=True,
                connection_invalidated=True, dialect=conn.dialect,
            ) from broken.error
        except wire.StatementFailed as failed:
            raise _as_dbapi_error(conn, fairy, failed.error, compiled[failed.index].sql) from failed.error
        except psycopg.Error as exc:  # a value psycopg cannot adapt: nothing was sent
            raise _as_dbapi_error(conn, fairy, exc, "") from exc
        except BaseException as exc:
            if driver.closed:  # an interrupt half-way: `wire` closed the connection
                conn.engine.pool._invalidate(fairy, exc if isinstance(exc, Exception) else None)  # noqa: SLF001
                conn.invalidate()
            raise
    return _pipelined_by_cursors(conn, fairy, driver, compiled, statements)


def _as_dbapi_error(conn: Connection, fairy: Any, exc: psycopg.Error, sql: str) -> Exception:
    disconnect = conn.dialect.is_disconnect(cast(Any, exc), fairy, None)
    if disconnect:
        # As `Connection` does on a disconnect: the pool's older connections are
        # replaced at their next checkout, and this one is invalid until rolled back.
        conn.engine.pool._invalidate(fairy, exc)  # noqa: SLF001
        conn.invalidate(exc)
    return DBAPIError.instance(
        sql, None, exc, psycopg.Error, hide_parameters=True,
        connection_invalidated=disconnect, dialect=conn.dialect,
    )


def _pipelined_by_cursors(
    conn: Connection, fairy: Any, driver: psycopg.Connection[Any], compiled: list[Any],
    statements: Sequence[tuple[Executable, Mapping[str, Any]]],
) -> list[DriverResult]:
    """psycopg's pipeline: a cursor per statement."""
    cursors: list[psycopg.Cursor[dict[str, Any]]] = []
    sql = ""
    try:
        with driver.pipeline():
            for entry, (_, params) in zip(compiled, statements, strict=True):
                sql = entry.sql
                cursor = driver.cursor(row_factory=dict_row)
                cursors.append(cursor)
                cursor.execute(entry.sql, entry.parameters(params))
        # The block's end sent the one Sync and read every result (the first error,
        # if any, is raised there and the statements after it were skipped).
        results = []
        for cursor, entry in zip(cursors, compiled, strict=True):
            sql = entry.sql
            result = cursor.pgresult
            if result is None or result.status != ExecStatus.TUPLES_OK:
                results.append(DriverResult([], cursor.rowcount))
            else:
                rows = [DriverRow(row) for row in cursor.fetchall()]
                results.append(DriverResult(rows, cursor.rowcount))
        return results
    except psycopg.Error as exc:
        raise _as_dbapi_error(conn, fairy, exc, sql) from exc
    finally:
        for cursor in cursors:
            cursor.close()
