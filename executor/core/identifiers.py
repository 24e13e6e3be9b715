"""The input contract for identifiers: what a tool name, call id, request id,
operation id, principal, tenant (or conversation, turn, role) may be.

Every identifier is stored in a `String(200)` column (executor/store/schema.py)
and shown to operators and models, so it must be text any database holds and
any terminal prints: at most `MAX_IDENTIFIER_CHARS` characters, printable
(`str.isprintable`: no control characters, no NUL, no line breaks, no
non-ASCII spaces), valid UTF-8 (no lone surrogates), not empty. PostgreSQL
refuses NUL and lone surrogates and an overlong value with an error that
aborts the caller's whole transaction; checked here first, in pure code, a
bad identifier becomes a value the producer can answer per call.

Pure: no database, broker or network.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum

from executor.core.types import ServerContext
from executor.errors import AdmissionError

MAX_IDENTIFIER_CHARS = 200
"""The length of every identifier column (`String(200)`): the check and the schema agree."""

SUBSTITUTE_PREFIX = "h_"
"""A stored key standing for an identifier that cannot be stored: `h_` + 32 hex digits."""


class IdentifierProblem(StrEnum):
    """Why a value is not an identifier: the `code` of its error detail."""

    NOT_TEXT = "not_text"
    EMPTY = "empty"
    TOO_LONG = "too_long"
    NUL = "nul"
    LONE_SURROGATE = "lone_surrogate"
    NOT_PRINTABLE = "not_printable"


class IdentifierField(StrEnum):
    """Which identifier: the `path` of its error detail."""

    TOOL_NAME = "tool_name"
    CALL_ID = "call_id"
    REQUEST_ID = "request_id"
    OPERATION_ID = "operation_id"
    PRINCIPAL = "principal"
    TENANT = "tenant"
    CONVERSATION_ID = "conversation_id"
    TURN_ID = "turn_id"
    ROLE = "roles"
    # Provider-written names a hosted approval is recorded and answered under
    # (executor/store/approvals.py): refused, never clipped, since the provider is
    # answered with the id as it wrote it.
    APPROVAL_REQUEST_ID = "approval_request_id"
    SERVER_LABEL = "server_label"


class InvalidIdentifier(AdmissionError, ValueError):
    """A request-level identifier (tenant, principal, request id, …) breaks the
    contract. Raised before anything is written; the message never quotes the
    value (it may be a secret, or text written to mislead an operator)."""

    def __init__(self, field: IdentifierField, problem: IdentifierProblem) -> None:
        super().__init__(f"{field.value} is not a valid identifier ({problem.value})")
        self.field = field
        self.problem = problem
        self.code = "invalid_identifier"
        self.request_index: int | None = None  # which request of an `enqueue_many`


def identifier_problem(value: object, max_chars: int = MAX_IDENTIFIER_CHARS) -> IdentifierProblem | None:
    """What is wrong with `value` as an identifier, or None when nothing is.

    Linear in the value's length, and bounded: an overlong value is refused by
    its length before its characters are looked at.
    """
    if not isinstance(value, str):
        return IdentifierProblem.NOT_TEXT
    if value == "":
        return IdentifierProblem.EMPTY
    if len(value) > max_chars:
        return IdentifierProblem.TOO_LONG
    if "\x00" in value:
        return IdentifierProblem.NUL
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return IdentifierProblem.LONE_SURROGATE
    if not value.isprintable():
        return IdentifierProblem.NOT_PRINTABLE
    return None


def check_identifier(field: IdentifierField, value: object) -> None:
    """Raise `InvalidIdentifier` unless `value` is a valid identifier."""
    problem = identifier_problem(value)
    if problem is not None:
        raise InvalidIdentifier(field, problem)


def check_server_context(context: ServerContext) -> None:
    """Every identifier of a server context (principal, tenant, request id, the
    conversation and turn ids when set, each role): `InvalidIdentifier` on the first
    bad one. A request-level refusal: no call of the request can be answered."""
    check_identifier(IdentifierField.TENANT, context.tenant)
    check_identifier(IdentifierField.PRINCIPAL, context.principal)
    check_identifier(IdentifierField.REQUEST_ID, context.request_id)
    if context.conversation_id is not None:
        check_identifier(IdentifierField.CONVERSATION_ID, context.conversation_id)
    if context.turn_id is not None:
        check_identifier(IdentifierField.TURN_ID, context.turn_id)
    for role in context.roles:
        check_identifier(IdentifierField.ROLE, role)


def storable_key(value: str, max_chars: int = MAX_IDENTIFIER_CHARS) -> str:
    """`value` itself when it is a valid identifier of at most `max_chars` characters,
    else a stable digest of it (`h_` + 32 hex digits) that a database can hold: the
    key a call row of a refused call is stored under, the same every time the same
    text arrives."""
    if identifier_problem(value, max_chars) is None:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return SUBSTITUTE_PREFIX + digest


def storable_text(value: str | None, max_chars: int) -> str | None:
    """Provider-written text that is recorded, not keyed on (a hosted call's status,
    label, item id), made storable in a `String(max_chars)` column: NUL (by U+FFFD) and
    lone surrogates (by `?`) replaced, then clipped to `max_chars` characters.
    PostgreSQL refuses all three with an error that rolls back the caller's whole
    transaction."""
    if value is None:
        return None
    storable = value.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")
    return storable[:max_chars]


__all__ = [
    "MAX_IDENTIFIER_CHARS",
    "IdentifierField",
    "IdentifierProblem",
    "InvalidIdentifier",
    "check_identifier",
    "check_server_context",
    "identifier_problem",
    "storable_key",
    "storable_text",
]


def default_operation_id(tenant: str, request_id: str, call_id: str) -> str:
    """Deterministic per (tenant, request, call): re-enqueueing the same request reuses
    the operations, and two tenants' requests of one id never share one. (Here, in
    pure code, because `toolfence check` and the exporter name the operation id a
    rejected call would have had, I7, from the calls table alone.)"""
    material = f"{tenant}\0{request_id}\0{call_id}".encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(material).hexdigest()
    return f"op_{digest[:32]}"
