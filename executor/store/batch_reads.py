"""The reads of many requests' admissions (`enqueue_many`) in one round trip.

`read_for_admission` reads one request's scopes; a producer draining its own queue
admits many requests in one transaction, and asking each request's questions
apart would cost a lock and five reads per request. Here every scope of every
request is locked first, in one total order (every conversation lock before every
request lock, each class by lock id: the one-request admission's "conversation,
then request" is an increasing run of the same order, so no two producers ever
wait on each other in opposite orders), and then each question is asked once for
the whole batch (`= ANY` of the batch's tenants, requests, conversations, intent
hashes and operation ids), its rows sorted out per request here. On PostgreSQL
the locks and the reads are one pipeline; on SQLite (`BEGIN IMMEDIATE` holds the
one write lock) each request's reads run one after the other.

Requests of one conversation in the batch share that conversation's `ScopeUsage`,
so a budget counts what an earlier request of the batch decided, as it would
have had they been enqueued one after the other.
docs/decisions/0233-enqueue-many-admits-many-requests-in-one-transaction.md has
the argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, func, select, text

from executor.core.admission import Gate
from executor.core.tools import Mode
from executor.store.batch import (
    AdmissionReads,
    ScopeUsage,
    _read_one_by_one,
    locks_then_clock,
    pipelined,
    read_for_admission,
    usage_of_calls,
)
from executor.store.intake import scope_lock_ids
from executor.store.records import OperationRow
from executor.store.schema import calls, operations


@dataclass(frozen=True)
class AdmissionScope:
    """One request of a batch: its scopes and what its admission will ask about."""

    tenant: str
    request_id: str
    conversation_id: str | None
    hashes: frozenset[str]
    operation_ids: frozenset[str]


def lock_order(scopes: Sequence[AdmissionScope]) -> list[int]:
    """Every scope's advisory lock id once: conversations first, then requests, each
    class in ascending id order (see the module's docstring)."""
    conversations: set[int] = set()
    requests: set[int] = set()
    for scope in scopes:
        ids = scope_lock_ids(scope.tenant, scope.request_id, scope.conversation_id)
        requests.add(ids[-1])
        conversations.update(ids[:-1])
    return sorted(conversations) + sorted(requests - conversations)


def _pairs(name: str) -> str:
    """A batch's (tenant, scope) pairs as rows `k(tenant, scope)`: joined to a table on
    both, each pair is one index lookup whatever plan the statement is given (`= ANY`
    of each column apart lets a generic plan scan every row of the tenant)."""
    return (
        f"unnest(CAST(:{name}_tenants AS VARCHAR[]), CAST(:{name}_scopes AS VARCHAR[])) "
        "AS k(tenant, scope)"
    )


_CALL_COLUMNS = ", ".join(f"c.{column.name}" for column in calls.c)
_OPERATION_COLUMNS = ", ".join(f"o.{column.name}" for column in operations.c)
_NOT_COUNTED = f"('{Gate.BUDGET.value}', '{Gate.HOSTED.value}')"
_CALLS_OF_REQUESTS = text(
    f"SELECT {_CALL_COLUMNS} FROM {_pairs('r')} "
    f"JOIN {calls.name} AS c ON c.tenant = k.tenant AND c.request_id = k.scope"
)
_USAGE_OF_CONVERSATIONS = text(
    f"SELECT c.tenant, c.conversation_id AS scope, c.tool_name, count(*) AS calls, "
    f"coalesce(sum(CASE WHEN c.gate = '{Gate.REPEAT.value}' AND c.result IS NOT NULL THEN 1 ELSE 0 END), 0) "
    f"AS failures FROM {_pairs('c')} "
    f"JOIN {calls.name} AS c ON c.tenant = k.tenant AND c.conversation_id = k.scope "
    f"WHERE c.gate IS NULL OR c.gate NOT IN {_NOT_COUNTED} "
    "GROUP BY c.tenant, c.conversation_id, c.tool_name"
)
_WRITES_WITH_HASHES_IN_REQUESTS = text(
    f"SELECT {_OPERATION_COLUMNS} FROM {_pairs('r')} "
    f"JOIN {operations.name} AS o ON o.tenant = k.tenant AND o.request_id = k.scope "
    f"WHERE o.mode = '{Mode.WRITE.value}' AND o.intent_hash = ANY(CAST(:hashes AS VARCHAR[]))"
)
_WRITES_WITH_HASHES_IN_CONVERSATIONS = text(
    f"SELECT {_OPERATION_COLUMNS} FROM {_pairs('c')} "
    f"JOIN {operations.name} AS o ON o.tenant = k.tenant AND o.conversation_id = k.scope "
    f"WHERE o.mode = '{Mode.WRITE.value}' AND o.intent_hash = ANY(CAST(:hashes AS VARCHAR[]))"
)
_OPERATIONS_BY_ID = select(operations).where(operations.c.operation_id == func.any(bindparam("ids")))


def read_for_admissions(conn: Connection, scopes: Sequence[AdmissionScope]) -> list[AdmissionReads]:
    """Lock every scope of `scopes`, then read what each request's admission needs
    (as `read_for_admission` does for one): one `AdmissionReads` per scope, in order."""
    if len(scopes) == 1:  # one request: its own reads, by its scope's keys
        [s] = scopes
        return [read_for_admission(
            conn, s.tenant, s.request_id, s.conversation_id, hashes=s.hashes, operation_ids=s.operation_ids
        )]
    if conn.dialect.name != "postgresql":
        return _share_conversations(scopes, [
            _read_one_by_one(
                conn, s.tenant, s.request_id, s.conversation_id, s.hashes, sorted(s.operation_ids)
            )
            for s in scopes
        ])
    request_pairs = sorted({(s.tenant, s.request_id) for s in scopes})
    conversation_pairs = sorted(
        {(s.tenant, s.conversation_id) for s in scopes if s.conversation_id is not None}
    )
    pairs = {
        "r_tenants": [t for t, _ in request_pairs], "r_scopes": [r for _, r in request_pairs],
        "c_tenants": [t for t, _ in conversation_pairs], "c_scopes": [c for _, c in conversation_pairs],
    }
    hashes = sorted(set().union(*(s.hashes for s in scopes)))
    ids = sorted(set().union(*(s.operation_ids for s in scopes)))
    statements = locks_then_clock(lock_order(scopes))
    first_read = len(statements) - 1  # the last lock's statement reads the clock
    statements.append((_CALLS_OF_REQUESTS, pairs))
    if conversation_pairs:
        statements.append((_USAGE_OF_CONVERSATIONS, pairs))
    if hashes:
        statements.append((_WRITES_WITH_HASHES_IN_REQUESTS, {**pairs, "hashes": hashes}))
        if conversation_pairs:
            statements.append((_WRITES_WITH_HASHES_IN_CONVERSATIONS, {**pairs, "hashes": hashes}))
    if ids:
        statements.append((_OPERATIONS_BY_ID, {"ids": ids}))
    results = iter(pipelined(conn, statements)[first_read:])
    now = float(next(results).scalar_one())
    calls_by_request: dict[tuple[str, str], dict[str, Any]] = {}
    for row in next(results).all():
        calls_by_request.setdefault((row.tenant, row.request_id), {})[row.call_id] = row
    usage: dict[tuple[str, str, str], ScopeUsage] = {
        ("request", tenant, request_id): usage_of_calls(rows.values())
        for (tenant, request_id), rows in calls_by_request.items()
    }
    if conversation_pairs:
        for row in next(results).all():
            counted = usage.setdefault(("conversation", row.tenant, row.scope), ScopeUsage())
            counted.by_tool[row.tool_name] += int(row.calls)
            counted.failures += int(row.failures)
    with_hashes: dict[str, OperationRow] = {}
    for _ in range((1 + bool(conversation_pairs)) if hashes else 0):
        for row in next(results).all():
            with_hashes.setdefault(row.operation_id, OperationRow.from_row(row))
    writes = sorted(with_hashes.values(), key=lambda op: (op.created_at, op.position))
    found = {row.operation_id: OperationRow.from_row(row) for row in next(results).all()} if ids else {}
    answers: list[AdmissionReads] = []
    for scope in scopes:
        earlier: dict[str, OperationRow] = {}
        for op in writes:  # the first write of each hash in the request or its conversation
            in_scope = op.request_id == scope.request_id or (
                scope.conversation_id is not None and op.conversation_id == scope.conversation_id
            )
            wanted = op.intent_hash in scope.hashes and op.intent_hash not in earlier
            if op.tenant == scope.tenant and in_scope and wanted:
                earlier[op.intent_hash] = op
        conversation = None
        if scope.conversation_id is not None:
            key = ("conversation", scope.tenant, scope.conversation_id)
            conversation = usage.setdefault(key, ScopeUsage())
        answers.append(AdmissionReads(
            now, calls_by_request.get((scope.tenant, scope.request_id), {}),
            usage.get(("request", scope.tenant, scope.request_id), ScopeUsage()), conversation, earlier,
            {i: found[i] for i in scope.operation_ids if i in found},
            scope.hashes, scope.operation_ids,
        ))
    return answers


def _share_conversations(
    scopes: Sequence[AdmissionScope], reads: list[AdmissionReads]
) -> list[AdmissionReads]:
    """Requests of one conversation count it in one `ScopeUsage` (the first one read:
    all were read before any was decided)."""
    shared: dict[tuple[str, str], ScopeUsage] = {}
    for scope, read in zip(scopes, reads, strict=True):
        if scope.conversation_id is not None and read.conversation is not None:
            read.conversation = shared.setdefault((scope.tenant, scope.conversation_id), read.conversation)
    return reads
