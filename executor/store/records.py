"""Typed values the store's statements take and return (frozen dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from executor.core.states import State


class StoreError(Exception):
    pass


@dataclass(frozen=True)
class NewOperation:
    operation_id: str
    request_id: str
    call_id: str
    position: int
    tool_name: str
    schema_version: int
    mode: str
    intent_hash: str
    arguments: dict[str, Any]
    context: dict[str, Any]
    needs_approval: bool
    impact: dict[str, Any] | None
    approval_ttl_seconds: float = 24 * 3600.0


@dataclass(frozen=True)
class Created:
    operation_id: str
    state: State
    approval_id: str | None


@dataclass(frozen=True)
class Reused:
    """Same operation id, same intent, already terminal: the stored outcome is returned."""

    operation_id: str
    state: State


@dataclass(frozen=True)
class InProgress:
    operation_id: str
    state: State


@dataclass(frozen=True)
class Conflict:
    operation_id: str


RegisterOutcome = Created | Reused | InProgress | Conflict


@dataclass(frozen=True)
class Reservation:
    operation_id: str
    generation: int
    owner_token: str
    lease_expires_at: float
    attempts: int
    took_over: bool


@dataclass(frozen=True)
class StaleOperation:
    operation_id: str
    generation: int
    tool_name: str
    lease_expires_at: float


@dataclass(frozen=True)
class ApprovalRecord:
    approval_id: str
    operation_id: str
    intent_hash: str
    impact: dict[str, Any]
    state: str
    requested_at: float
    expires_at: float
