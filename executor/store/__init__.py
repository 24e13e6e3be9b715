"""The operation store: tables, the clock, every CAS and the reads around them.

One home per concern, one import for callers (`from executor import store`):

- `operations`: every transition of the fencing argument (register, reserve,
  take_over, renew, still_owner, complete, release_to_retry, mark_unknown,
  mark_scope_exceeded, the
  reconciler's expired-lease CASes requeue_stale, mark_unknown_expired and
  record_lookup_result, resolve), each one named CAS;
- `ordering`: proposal order, and the one "runnable" predicate (`runnable_queued`)
  the store and the exporter share;
- `approvals`, `receipts`, `intake` (call, outbox and hosted-call rows), `reads`, `audit`;
- `schema` (tables), `engine`, `clock`, `migrate` and `migrations/`.
"""

from __future__ import annotations

from executor.store.approvals import (
    approval_for_operation,
    approve,
    deny,
    expire_approval,
    expired_approvals,
    get_approval,
    refuse_approver,
)
from executor.store.audit import (
    audit_trail,
)
from executor.store.clock import DATABASE_CLOCK, Clock, ManualClock, read_now
from executor.store.intake import (
    add_outbox_row,
    hosted_calls_of_request,
    lock_scopes,
    record_call,
    record_hosted_call,
)
from executor.store.operations import (
    complete,
    due_retries,
    fail_unstarted,
    mark_scope_exceeded,
    mark_unknown,
    mark_unknown_expired,
    new_owner_token,
    promote_due_retry,
    record_lookup_result,
    register,
    release_to_retry,
    renew,
    republish_queued,
    requeue_stale,
    reserve,
    resolve,
    stale_queued,
    stale_started,
    still_owner,
    take_over,
)
from executor.store.ordering import (
    predecessor_failed,
    release_successors,
    runnable_queued,
    waiting_on_earlier,
)
from executor.store.reads import (
    calls_of_request,
    earlier_write,
    get_operation,
    lease_remaining,
    operations_in,
    scope_usage,
)
from executor.store.receipts import (
    distinct_accepted_receipts,
    record_receipt,
)
from executor.store.records import (
    ApprovalRecord,
    Conflict,
    Created,
    Decision,
    DecisionOutcome,
    InProgress,
    NewOperation,
    OperationRow,
    RegisterOutcome,
    Reservation,
    Reused,
    StaleOperation,
    StoreError,
)

__all__ = [
    "DATABASE_CLOCK",
    "Clock",
    "ManualClock",
    "ApprovalRecord",
    "Conflict",
    "Created",
    "Decision",
    "DecisionOutcome",
    "InProgress",
    "NewOperation",
    "OperationRow",
    "RegisterOutcome",
    "Reservation",
    "Reused",
    "StaleOperation",
    "StoreError",
    "add_outbox_row",
    "hosted_calls_of_request",
    "approval_for_operation",
    "approve",
    "audit_trail",
    "calls_of_request",
    "complete",
    "deny",
    "distinct_accepted_receipts",
    "expire_approval",
    "due_retries",
    "earlier_write",
    "expired_approvals",
    "fail_unstarted",
    "get_approval",
    "get_operation",
    "lease_remaining",
    "mark_scope_exceeded",
    "lock_scopes",
    "mark_unknown",
    "mark_unknown_expired",
    "new_owner_token",
    "operations_in",
    "predecessor_failed",
    "promote_due_retry",
    "read_now",
    "record_call",
    "record_hosted_call",
    "record_lookup_result",
    "record_receipt",
    "refuse_approver",
    "register",
    "release_successors",
    "release_to_retry",
    "renew",
    "republish_queued",
    "requeue_stale",
    "reserve",
    "resolve",
    "runnable_queued",
    "scope_usage",
    "stale_queued",
    "stale_started",
    "still_owner",
    "take_over",
    "waiting_on_earlier",
]
