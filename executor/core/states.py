"""Operation states and the legal transitions between them (pure; docs/design.md §States)."""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    PENDING_APPROVAL = "pending_approval"
    QUEUED = "queued"
    STARTED = "started"
    RETRY_WAIT = "retry_wait"
    SUCCEEDED = "succeeded"
    FAILED_TERMINAL = "failed_terminal"
    RECONCILIATION_PENDING = "reconciliation_pending"


TERMINAL = frozenset({State.SUCCEEDED, State.FAILED_TERMINAL})
# Everything else: the operation may still move (the small part of the table the
# partial indexes and the exporter's gauges read).
ACTIVE = frozenset(State) - TERMINAL
# "Quiet" end states for invariant I2: nothing will move these without a person.
SETTLED = TERMINAL | {State.RECONCILIATION_PENDING}


class ApprovalState(StrEnum):
    """An approval row's state. Single use: it leaves `pending` exactly once."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"


class TurnState(StrEnum):
    """A turn's state (docs/design.md §Turns): `running` until it ends, with
    `waiting_approval` on the way (no owner then: nothing runs until a person
    decides), and `queued` before it when it waits behind the user's running
    turn. The partial unique index counts only `running` turns."""

    QUEUED = "queued"  # behind the user's running turn (TOOLFENCE_TURN_WHEN_BUSY=queue)
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    FALLBACK = "fallback"


TURN_ENDED = frozenset({TurnState.SUCCEEDED, TurnState.FAILED, TurnState.FALLBACK})

# (from, to). `None` is "no row yet". Each pair is produced by exactly the store
# statements named beside it, so a reader can check the table against
# executor/store/operations.py and approvals.py.
LEGAL_TRANSITIONS: frozenset[tuple[State | None, State]] = frozenset(
    {
        (None, State.PENDING_APPROVAL),  # register (approval needed)
        (None, State.QUEUED),  # register
        (State.PENDING_APPROVAL, State.QUEUED),  # approve
        # Not a change of state: an approver the policy refused, audited in the
        # trail; the approval stays pending.
        (State.PENDING_APPROVAL, State.PENDING_APPROVAL),  # refuse_approver
        (State.PENDING_APPROVAL, State.FAILED_TERMINAL),  # deny, expire_approval
        (State.QUEUED, State.STARTED),  # reserve
        # Never ran: its predecessor failed.
        (State.QUEUED, State.FAILED_TERMINAL),  # fail_unstarted
        (State.STARTED, State.STARTED),  # take_over (lease expired, new generation)
        (State.STARTED, State.SUCCEEDED),  # complete, record_lookup_result
        (State.STARTED, State.FAILED_TERMINAL),  # complete
        (State.STARTED, State.RETRY_WAIT),  # release_to_retry
        (State.STARTED, State.QUEUED),  # requeue_stale (reconciler)
        (State.STARTED, State.RECONCILIATION_PENDING),  # mark_unknown(_expired), mark_scope_exceeded
        (State.RETRY_WAIT, State.QUEUED),  # promote_due_retry
        (State.RECONCILIATION_PENDING, State.SUCCEEDED),  # resolve (operator)
        (State.RECONCILIATION_PENDING, State.FAILED_TERMINAL),  # resolve (operator)
        (State.RECONCILIATION_PENDING, State.QUEUED),  # resolve (operator requeue)
    }
)


def is_legal(from_state: State | str | None, to_state: State | str) -> bool:
    source = None if from_state is None else State(from_state)
    return (source, State(to_state)) in LEGAL_TRANSITIONS
