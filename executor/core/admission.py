"""Admission: the ordered gates a proposed call passes before anything is runnable.

Each gate is a pure function of (call, tool, server context) plus the tool's own
hooks; the first failure ends the call with a `failed_terminal` result and the
handler is never invoked. Order (docs/design.md §Admission): allowlist → arguments parse →
schema → listed targets → authorization → business rules → approval. Operation registration,
the last gate, needs the database and lives in `executor.store`.

Authorization runs before business rules on purpose: a rule reads the resource's
state, and a principal who may not touch the resource must not learn it from
the error.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ValidationError

from executor.core.argument_limits import DEFAULT_MAX_ARGUMENT_BYTES, DEFAULT_MAX_ARGUMENT_DEPTH
from executor.core.canonical import NotCanonicalizable, canonical_json, intent_hash
from executor.core.sanitize import ERROR_MESSAGE_MAX_CHARS, sanitize_error_text
from executor.core.schema_errors import schema_details
from executor.core.scope import MAX_DECLARED_RESOURCES, InvalidResourceSet, declared_resources
from executor.core.strictjson import (
    _DuplicateKey,
    _finite_float,
    _json_depth_exceeds,
    _no_constants,
    _no_duplicate_keys,
    _NonFinite,
    _value_depth_exceeds,
    contains_lone_surrogate,
)
from executor.core.surfaces import surface_forces_approval, surface_offers, unlisted_argument
from executor.core.tools import Registry, Tool, ToolFailure
from executor.core.types import ErrorCode, ErrorDetail, FailedTerminal, ProposedCall, ServerContext
from executor.errors import AdmissionError


class Gate(StrEnum):
    """Where a proposed call was decided: the call budget, the admission gates in
    their order, then proposal order, repeated writes and registration, which the
    producer applies; and `hosted`, a provider-run call reported on the request.
    The values are what `toolfence_calls.gate` stores and the proposals counter's
    `gate` label says."""

    # An identifier of the call (call id, tool name, operation id) breaks the input
    # contract (executor/core/identifiers.py): decided before anything else.
    IDENTIFIER = "identifier"
    BUDGET = "budget"
    ALLOWLIST = "allowlist"
    PARSE = "parse"
    SCHEMA = "schema"
    AUTHORIZATION = "authorization"
    BUSINESS_RULES = "business_rules"
    APPROVAL = "approval"
    ORDERING = "ordering"
    REPEAT = "repeat"
    REGISTRATION = "registration"
    # A provider-run call outside the hosted-tool policy, reported after the proposals.
    HOSTED = "hosted"
    # A listed argument (executor/core/surfaces.py) names an item the server did not
    # list: after the schema, before the tool's access rule runs.
    TARGETS = "targets"


@dataclass(frozen=True)
class Limits:
    max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES
    max_argument_depth: int = DEFAULT_MAX_ARGUMENT_DEPTH


@dataclass(frozen=True)
class Admitted:
    """A call that passed every gate but registration."""

    call: ProposedCall
    tool: Tool[Any]
    arguments: BaseModel
    arguments_json: dict[str, Any]
    intent_hash: str
    needs_approval: bool
    impact: dict[str, Any] | None
    # The resource ids a write declaring `resources` is admitted for (None: declares none).
    approved_resources: frozenset[str] | None = None


class Rejected(AdmissionError):
    """Internal control flow between gates; `result` is what the caller sees."""

    def __init__(self, result: FailedTerminal, gate: Gate) -> None:
        super().__init__(result.error.code)
        self.result = result
        self.gate = gate


_HOOKS = {
    Gate.AUTHORIZATION: "access rule",
    Gate.BUSINESS_RULES: "business rule check",
    Gate.APPROVAL: "approval predicate, resources or impact hook",
}


class AdmissionUnavailable(AdmissionError):
    """A tool's access rule, business rule check, approval predicate, resources or
    impact hook raised one of `admit`'s `reraise` exceptions (the producer's:
    `CONNECTION_ERRORS`, it lost its connection to what it reads): it decided
    nothing, so the call is neither refused nor admitted and `enqueue` raises this
    instead of recording an answer. Roll the transaction back, as for
    `StoreDatabaseError`, and enqueue the same request again (calls already
    recorded are found by their call ids). Carries the tool's name, the gate
    (`authorization`, `business_rules` or `approval`) and the exception's class,
    never its text (a driver's message may quote a connection string or the row
    it read). A value the database refused is an answer, not this (`admit`'s
    `refusal_for`)."""

    def __init__(self, tool_name: str, gate: Gate, kind: str) -> None:
        hook = _HOOKS.get(gate, "hook")
        super().__init__(f"the {hook} of {tool_name!r} could not reach what it reads ({kind})")
        self.tool_name = tool_name
        self.gate = gate
        self.kind = kind


REFUSED_BY_DATABASE = ErrorDetail(
    path="", code="refused_by_database", expected="values the database can hold"
)
"""The detail of an `invalid_arguments` answer whose value the database refused."""

RefusalFor = Callable[[BaseException], "Refusal | None"]
"""For an exception of `admit`'s `reraise`: the refusal it stands for, or None when it
decided nothing (the producer's: a value the database refused, decision 0193)."""


def _undecided(
    call: ProposedCall, gate: Gate, exc: BaseException, refusal_for: RefusalFor | None = None
) -> AdmissionUnavailable | Rejected:
    """`AdmissionUnavailable`, unless `refusal_for` says the exception is an answer:
    then this call alone is refused (at the gate whose hook raised it)."""
    refusal = refusal_for(exc) if refusal_for is not None else None
    if refusal is not None:
        return _reject(call, gate, refusal.code, refusal.message, refusal.details)
    return AdmissionUnavailable(call.tool_name, gate, type(exc).__name__)


def _reject(
    call: ProposedCall,
    gate: Gate,
    code: ErrorCode,
    message: str,
    details: tuple[ErrorDetail, ...] = (),
) -> Rejected:
    return Rejected(
        FailedTerminal(
            call_id=call.call_id,
            tool_name=call.tool_name,
            error={"code": code, "message": message, "details": details},  # type: ignore[arg-type]
        ),
        gate,
    )


# ---------------------------------------------------------------- exposure


def exposed_to(tool: Tool[Any], ctx: ServerContext) -> bool:
    """May this server context see and call `tool` at all? The one answer.

    The allowlist gate, the authorization gate, the worker's recheck and every
    provider export (`executor.providers`, which declares to the model exactly
    the tools this returns True for) ask this function, so what a principal is
    shown and what admission lets through cannot drift apart.

    It reads only what is known before arguments exist: the tool's roles (or
    its explicit public flag) against the context's roles. An access `rule` is
    a per-resource decision on validated arguments (is this account in the
    caller's tenant?), so exposure cannot evaluate it; a tool is exposed when
    its rule *could* admit some call, and toolfence takes every rule to admit
    some arguments for each context its roles admit. A condition on the caller
    alone (say "only admins") belongs in the roles, where exposure sees it.
    """
    return tool.access.exposed_to(ctx)


def offered_to(registry: Registry, tool: Tool[Any], ctx: ServerContext) -> bool:
    """`exposed_to`, narrowed by the context's turn surface (its catalog and write
    rule, executor/core/surfaces.py): what a turn of that surface is shown and may
    run. Without a surface, exactly `exposed_to`; a surface the registry does not
    declare offers nothing."""
    return exposed_to(tool, ctx) and surface_offers(registry, tool, ctx)


# ---------------------------------------------------------------- gate 1: allowlist


def gate_allowlist(call: ProposedCall, registry: Registry, ctx: ServerContext) -> Tool[Any]:
    tool = registry.get(call.tool_name)
    if tool is None:
        raise _reject(call, Gate.ALLOWLIST, ErrorCode.UNKNOWN_TOOL, "no such tool")
    if not offered_to(registry, tool, ctx):
        raise _reject(
            call, Gate.ALLOWLIST, ErrorCode.TOOL_NOT_ALLOWED, "this tool is not available here"
        )
    return tool


# ---------------------------------------------------------------- gate 3b: listed targets


TARGET_NOT_LISTED = "not_listed"


def target_refusal(tool: Tool[Any], arguments_json: Mapping[str, Any], ctx: ServerContext) -> Refusal | None:
    """A listed argument naming an item the server did not list refuses the call,
    before its access rule runs: a model-made id is never looked up. The path is the
    argument's name, never its value."""
    name = unlisted_argument(tool, arguments_json, ctx)
    if name is None:
        return None
    return Refusal(
        ErrorCode.TARGET_NOT_OFFERED, "the call names an item that was not listed",
        (ErrorDetail(path=name, code=TARGET_NOT_LISTED, expected="the id of a listed item"),),
    )


def gate_targets(call: ProposedCall, tool: Tool[Any], args: BaseModel, ctx: ServerContext) -> None:
    if not tool.listed:
        return
    refusal = target_refusal(tool, args.model_dump(mode="json"), ctx)
    if refusal is not None:
        raise _reject(call, Gate.TARGETS, refusal.code, refusal.message, refusal.details)


# ---------------------------------------------------------------- gate 2: parse


def gate_parse(call: ProposedCall, limits: Limits) -> dict[str, Any]:
    raw = call.arguments
    code = ErrorCode.INVALID_ARGUMENTS_JSON
    if isinstance(raw, Mapping):
        if _value_depth_exceeds(raw, limits.max_argument_depth):
            raise _reject(
                call, Gate.PARSE, code, "arguments are nested too deeply",
                (ErrorDetail(path="", code="too_deep", expected=f"depth <= {limits.max_argument_depth}"),),
            )
        try:
            size = len(json.dumps(raw, allow_nan=False).encode())
        except (TypeError, ValueError, RecursionError):
            raise _reject(call, Gate.PARSE, code, "arguments are not JSON values") from None
        if size > limits.max_argument_bytes:
            raise _reject(
                call, Gate.PARSE, code, "arguments are too large",
                (ErrorDetail(path="", code="too_large", expected=f"<= {limits.max_argument_bytes} bytes"),),
            )
        if contains_lone_surrogate(raw):
            # The text path refuses these; a mapping must not be a way around it.
            raise _reject(
                call, Gate.PARSE, code, "arguments are not UTF-8",
                (ErrorDetail(path="", code="not_utf8", expected="UTF-8 JSON text"),),
            )
        return dict(raw)
    if isinstance(raw, bytes):
        if len(raw) > limits.max_argument_bytes:
            raise _reject(
                call, Gate.PARSE, code, "arguments are too large",
                (ErrorDetail(path="", code="too_large", expected=f"<= {limits.max_argument_bytes} bytes"),),
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _reject(
                call, Gate.PARSE, code, "arguments are not UTF-8",
                (ErrorDetail(path="", code="not_utf8", expected="UTF-8 JSON text"),),
            ) from None
    else:
        text = raw
    if len(text.encode("utf-8", "surrogatepass")) > limits.max_argument_bytes:
        raise _reject(
            call, Gate.PARSE, code, "arguments are too large",
            (ErrorDetail(path="", code="too_large", expected=f"<= {limits.max_argument_bytes} bytes"),),
        )
    if text.strip() == "":
        # Several providers send "" for a call without arguments.
        text = "{}"
    if _json_depth_exceeds(text, limits.max_argument_depth):
        raise _reject(
            call, Gate.PARSE, code, "arguments are nested too deeply",
            (ErrorDetail(path="", code="too_deep", expected=f"depth <= {limits.max_argument_depth}"),),
        )
    try:
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicate_keys,
            parse_constant=_no_constants,
            parse_float=_finite_float,
        )
    except _DuplicateKey:
        raise _reject(
            call, Gate.PARSE, code, "arguments repeat a key",
            (ErrorDetail(path="", code="duplicate_key", expected="each key once"),),
        ) from None
    except _NonFinite:
        raise _reject(
            call, Gate.PARSE, code, "arguments contain a number too large to represent",
            (ErrorDetail(path="", code="non_finite", expected="a finite number"),),
        ) from None
    except (ValueError, RecursionError):
        raise _reject(
            call, Gate.PARSE, code, "arguments are not valid JSON",
            (ErrorDetail(path="", code="json_syntax", expected="a JSON object"),),
        ) from None
    if not isinstance(value, dict):
        raise _reject(
            call, Gate.SCHEMA, ErrorCode.INVALID_ARGUMENTS, "arguments must be a JSON object",
            (ErrorDetail(path="", code="type", expected="object"),),
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (an escaped \udc80, say) survive json.loads but are not text.
        raise _reject(
            call, Gate.PARSE, code, "arguments are not UTF-8",
            (ErrorDetail(path="", code="not_utf8", expected="UTF-8 JSON text"),),
        ) from None
    if contains_lone_surrogate(value):
        raise _reject(
            call, Gate.PARSE, code, "arguments are not UTF-8",
            (ErrorDetail(path="", code="not_utf8", expected="UTF-8 JSON text"),),
        )
    return value


# ---------------------------------------------------------------- gate 3: schema

def gate_schema(call: ProposedCall, tool: Tool[Any], value: dict[str, Any]) -> BaseModel:
    try:
        args: BaseModel = tool.input_model.model_validate(value, strict=False)
    except ValidationError as exc:
        raise _reject(
            call, Gate.SCHEMA, ErrorCode.INVALID_ARGUMENTS, "arguments do not match the schema",
            schema_details(exc, value),
        ) from None
    try:
        # The intent hash needs a canonical form; a value without one (an integer
        # beyond 2**53 - 1) is a schema problem, refused before any hook of the tool
        # (access rule, check, approval: they may do I/O) is consulted for it.
        canonical_json(args.model_dump(mode="json"))
    except NotCanonicalizable:
        raise _reject(
            call, Gate.SCHEMA, ErrorCode.INVALID_ARGUMENTS,
            "arguments contain a number outside the interoperable JSON range",
            (ErrorDetail(path="", code="not_canonical", expected="|integer| < 2**53"),),
        ) from None
    return args


# ---------------------------------------------------------------- shared with execution


@dataclass(frozen=True)
class Refusal:
    """Why a call may not run, decided by a hook of the tool (or its absence).

    Admission and the worker's re-check just before running ask the same
    functions below, so "is access granted", "do the business rules hold" and
    "does this need a person" have one answer each, wherever they are asked.
    """

    code: ErrorCode
    message: str
    details: tuple[ErrorDetail, ...] = ()


def authorization_refusal(
    tool: Tool[Any],
    args: BaseModel,
    ctx: ServerContext,
    *,
    reraise: tuple[type[BaseException], ...] = (),
) -> Refusal | None:
    """The tool's access rule against the server context. A rule that raises denies;
    `reraise` names exceptions the caller handles itself, as for `business_rule_refusal`
    (the worker: a rule that reads a database whose connection was lost has not
    decided anything, and the call may be tried again).

    Exposure again, not only the rule: called on its own (the worker path, a
    future caller skipping the allowlist), authorization never grants a tool
    this context is not exposed to."""
    try:
        allowed = exposed_to(tool, ctx) and tool.access.authorizes(args, ctx)
    except reraise:
        raise
    except Exception:
        # A rule that cannot decide fails closed; its error text is not shown.
        allowed = False
    return None if allowed else Refusal(ErrorCode.PERMISSION_DENIED, "permission denied")


def business_rule_refusal(
    tool: Tool[Any],
    args: BaseModel,
    ctx: ServerContext,
    *,
    reraise: tuple[type[BaseException], ...] = (),
) -> Refusal | None:
    """The tool's `check` against current state. A check that raises anything but a
    `ToolFailure` refuses with a generic message (its text may quote state);
    `reraise` names exceptions the caller handles itself (the worker: a lost
    database connection, which is a reason to try again, not to refuse)."""
    if tool.check is None:
        return None
    try:
        tool.check(args, ctx)
    except ToolFailure as failure:
        # The rule's text reaches the model: the same sanitiser as every output.
        return Refusal(
            ErrorCode.BUSINESS_RULE_VIOLATION,
            sanitize_error_text(failure.message, ERROR_MESSAGE_MAX_CHARS),
            failure.details,
        )
    except reraise:
        raise
    except Exception:
        return Refusal(ErrorCode.BUSINESS_RULE_VIOLATION, "the business rule check failed")
    return None


def approval_needed(
    tool: Tool[Any], args: BaseModel, ctx: ServerContext, *,
    reraise: tuple[type[BaseException], ...] = (),
) -> bool:
    """Whether the tool's approval predicate wants a person for this call. One that
    raises asks a person, unless what it raised is in `reraise` (a lost connection:
    the caller tries again rather than ask someone for nothing)."""
    try:
        return tool.approval.required(args, ctx)
    except reraise:
        raise
    except Exception:
        return True  # a predicate that cannot decide asks a person


# ---------------------------------------------------------------- gate 4: authorization


def gate_authorization(
    call: ProposedCall, tool: Tool[Any], args: BaseModel, ctx: ServerContext,
    reraise: tuple[type[BaseException], ...] = (),
    refusal_for: RefusalFor | None = None,
) -> None:
    try:
        refusal = authorization_refusal(tool, args, ctx, reraise=reraise)
    except reraise as exc:
        raise _undecided(call, Gate.AUTHORIZATION, exc, refusal_for) from None
    if refusal is not None:
        raise _reject(call, Gate.AUTHORIZATION, refusal.code, refusal.message)


# ---------------------------------------------------------------- gate 5: business rules


def gate_business_rules(
    call: ProposedCall, tool: Tool[Any], args: BaseModel, ctx: ServerContext,
    reraise: tuple[type[BaseException], ...] = (),
    refusal_for: RefusalFor | None = None,
) -> None:
    try:
        refusal = business_rule_refusal(tool, args, ctx, reraise=reraise)
    except reraise as exc:
        raise _undecided(call, Gate.BUSINESS_RULES, exc, refusal_for) from None
    if refusal is not None:
        raise _reject(call, Gate.BUSINESS_RULES, refusal.code, refusal.message, refusal.details)


# ---------------------------------------------------------------- gate 6: approval


def gate_resources(
    call: ProposedCall, tool: Tool[Any], args: BaseModel, ctx: ServerContext,
    reraise: tuple[type[BaseException], ...] = (),
    refusal_for: RefusalFor | None = None,
) -> frozenset[str] | None:
    """The set of resource ids a write may change, computed by the server from its
    validated arguments: what the approver is shown and the handler is held to.

    Part of the approval gate, after authorization (the hook may read resources a
    principal must be allowed to touch first). A hook that cannot say fails closed.
    """
    if tool.resources is None:
        return None
    try:
        return declared_resources(tool.resources(args, ctx))
    except InvalidResourceSet:
        raise _reject(
            call, Gate.APPROVAL, ErrorCode.INVALID_ARGUMENTS,
            "the call would change too many resources, or names invalid ones",
            (ErrorDetail(path="", code="resources", expected=f"1..{MAX_DECLARED_RESOURCES} resource ids"),),
        ) from None
    except ToolFailure as failure:
        raise _reject(
            call, Gate.APPROVAL, ErrorCode.BUSINESS_RULE_VIOLATION, failure.message, failure.details
        ) from None
    except reraise as exc:
        raise _undecided(call, Gate.APPROVAL, exc, refusal_for) from None
    except Exception:
        raise _reject(
            call, Gate.APPROVAL, ErrorCode.BUSINESS_RULE_VIOLATION,
            "the resources this call would change could not be determined",
        ) from None


def impact_with_resources(
    impact: dict[str, Any] | None, resources: frozenset[str] | None
) -> dict[str, Any] | None:
    """The approver sees the server's set, whatever the tool's own impact hook says."""
    if impact is None or resources is None:
        return impact
    return impact | {"resources": sorted(resources), "resource_count": len(resources)}


def _value_summary(value: Any) -> Any:
    """What an approver is shown of one argument by default: numbers, booleans and
    null as they are (an amount is what an approval is about), text and containers
    only by their size (text is where a secret or a crafted message would be)."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return f"<text, {len(value)} characters>"
    if isinstance(value, Mapping):
        return f"<object, {len(value)} keys>"
    if isinstance(value, list | tuple):
        return f"<list, {len(value)} items>"
    return f"<{type(value).__name__}>"


def default_impact(tool: Tool[Any], args: BaseModel) -> dict[str, Any]:
    """The impact of a tool that declares no `impact` hook: a redacted summary of its
    validated arguments (each declared field, its text and containers by size only).
    A tool whose approvers must read more says so in its own `impact` hook."""
    return {
        "tool": tool.name,
        "arguments": {name: _value_summary(value) for name, value in args.model_dump(mode="json").items()},
        "note": "summary: declare an impact hook on the tool to show approvers more",
    }


def gate_approval(
    call: ProposedCall, tool: Tool[Any], args: BaseModel, ctx: ServerContext,
    reraise: tuple[type[BaseException], ...] = (),
    refusal_for: RefusalFor | None = None,
    *,
    forced: bool = False,
) -> tuple[bool, dict[str, Any] | None]:
    """Whether a person must approve, and what they are shown. `forced`: the
    context's surface wants every write approved (its tool's predicate is not asked)."""
    try:
        needed = forced or approval_needed(tool, args, ctx, reraise=reraise)
    except reraise as exc:
        raise _undecided(call, Gate.APPROVAL, exc, refusal_for) from None
    if not needed:
        return False, None
    impact: dict[str, Any] = default_impact(tool, args)
    if tool.impact is not None:
        try:
            impact = dict(tool.impact(args, ctx))
        except reraise as exc:
            raise _undecided(call, Gate.APPROVAL, exc, refusal_for) from None
        except Exception:
            raise _reject(
                call, Gate.APPROVAL, ErrorCode.APPROVAL_REQUIRED,
                "the approval impact could not be computed",
            ) from None
    return True, impact


# ---------------------------------------------------------------- all gates


def compute_intent_hash(
    tool: Tool[Any],
    args: BaseModel,
    ctx: ServerContext,
    approved_resources: frozenset[str] | None = None,
    *,
    arguments_json: dict[str, Any] | None = None,
) -> str:
    """The intent hash; for a tool declaring `resources`, over that set too (computed
    here unless given), so an approval binds the set the approver saw."""
    resource_ids = tool.resource_ids(args, ctx) if tool.resource_ids else ()
    if tool.resources is not None and approved_resources is None:
        approved_resources = declared_resources(tool.resources(args, ctx))
    return intent_hash(
        tenant=ctx.tenant,
        principal=ctx.principal,
        tool_name=tool.name,
        schema_version=tool.schema_version,
        arguments=args.model_dump(mode="json") if arguments_json is None else arguments_json,
        resource_ids=resource_ids,
        approved_resources=approved_resources if tool.resources is not None else None,
    )


@dataclass(frozen=True)
class Prepared:
    """What `proposal_fingerprint` computed of a call that `admit` would compute
    again: the tool it named, its arguments parsed and validated (the parse and
    schema gates are pure: the same call, limits and tool give the same value), and
    the intent hash when it depends on nothing else (the tool declares no
    `resources` or `resource_ids` hook, so it is a function of the context, the tool
    and the arguments alone). Decision 0234."""

    tool: Tool[Any]
    args: BaseModel
    arguments_json: dict[str, Any]
    intent_hash: str | None


def prepare_proposal(
    call: ProposedCall, registry: Registry, ctx: ServerContext, limits: Limits = Limits()
) -> tuple[str, Prepared | None]:
    """`proposal_fingerprint`, and what `admit(prepared=...)` may reuse of it."""
    tool = registry.get(call.tool_name)
    if tool is not None:
        try:
            args = gate_schema(call, tool, gate_parse(call, limits))
            arguments_json = args.model_dump(mode="json")
            pure = tool.resources is None and tool.resource_ids is None
            digest = compute_intent_hash(tool, args, ctx, arguments_json=arguments_json)
            return digest, Prepared(tool, args, arguments_json, digest if pure else None)
        except Exception:
            pass  # refused by parse or schema, or a resource_ids hook raised: use the text
    return _written_fingerprint(call, ctx), None


def proposal_fingerprint(
    call: ProposedCall, registry: Registry, ctx: ServerContext, limits: Limits = Limits()
) -> str:
    """What a call id of a request was used for, to tell a re-enqueue from a conflict.

    The intent hash where the call parses and fits its schema (so it equals the
    admitted operation's), else a hash of the call as written. Pure: no access
    rule, check or approval hook runs, so re-enqueueing a request that already ran
    gets the stored answers even where a business rule would now refuse the call.
    """
    return prepare_proposal(call, registry, ctx, limits)[0]


def _written_fingerprint(call: ProposedCall, ctx: ServerContext) -> str:
    """The fingerprint of a call that does not parse or fit: a hash of it as written."""
    raw = call.arguments
    if isinstance(raw, bytes):
        written = raw.decode("utf-8", "surrogateescape")
    elif isinstance(raw, str):
        written = raw
    else:
        try:
            written = json.dumps(raw, sort_keys=True, default=str)
        except (RecursionError, ValueError, TypeError):
            # Nested past what json can write (the parse gate refuses it): its
            # fingerprint is its kind, so re-enqueueing it finds its stored refusal.
            written = "<unserialisable arguments>"
    document = json.dumps(
        [ctx.tenant, ctx.principal, call.tool_name, written], ensure_ascii=True
    ).encode("utf-8", "surrogatepass")
    return "p_" + hashlib.sha256(document).hexdigest()[:62]


def admit(
    call: ProposedCall,
    registry: Registry,
    ctx: ServerContext,
    limits: Limits = Limits(),
    *,
    reraise: tuple[type[BaseException], ...] = (),
    refusal_for: RefusalFor | None = None,
    prepared: Prepared | None = None,
) -> Admitted | Rejected:
    """Run every gate but registration. Returns `Rejected` (with its gate) or `Admitted`.

    `reraise`: exceptions of a tool's hook (access rule, business rule check,
    approval predicate, resources or impact hook) that are not an answer (the
    producer: a lost connection to what the hook reads). One of them raises
    `AdmissionUnavailable` (tool, gate, exception class) instead of refusing the call, so
    nothing is recorded for it and the caller may try again; every other exception
    of a hook still refuses (fails closed). `refusal_for` turns one of `reraise` that
    is an answer into this call's refusal instead (the producer's: a value the
    database refused, `invalid_arguments` with detail `refused_by_database`), so the
    other calls of the batch are admitted. `prepared`: this call's
    `prepare_proposal` with the same registry, context and limits (its parse,
    schema and, when pure, intent hash are not computed again)."""
    try:
        tool = gate_allowlist(call, registry, ctx)
        if prepared is not None and prepared.tool is tool:
            args, arguments_json = prepared.args, prepared.arguments_json
        else:
            prepared = None
            args = gate_schema(call, tool, gate_parse(call, limits))
            arguments_json = args.model_dump(mode="json")
        gate_targets(call, tool, args, ctx)
        gate_authorization(call, tool, args, ctx, reraise, refusal_for)
        gate_business_rules(call, tool, args, ctx, reraise, refusal_for)
        approved_resources = gate_resources(call, tool, args, ctx, reraise, refusal_for)
        needs_approval, impact = gate_approval(
            call, tool, args, ctx, reraise, refusal_for,
            forced=surface_forces_approval(registry, tool, ctx),
        )
        impact = impact_with_resources(impact, approved_resources)
        try:
            digest = prepared.intent_hash if prepared is not None else None
            if digest is None:
                digest = compute_intent_hash(
                    tool, args, ctx, approved_resources, arguments_json=arguments_json
                )
        except NotCanonicalizable:
            raise _reject(
                call, Gate.SCHEMA, ErrorCode.INVALID_ARGUMENTS,
                "arguments contain a number outside the interoperable JSON range",
                (ErrorDetail(path="", code="not_canonical", expected="|integer| < 2**53"),),
            ) from None
        return Admitted(
            call=call,
            tool=tool,
            arguments=args,
            arguments_json=arguments_json,
            intent_hash=digest,
            needs_approval=needs_approval,
            impact=impact,
            approved_resources=approved_resources,
        )
    except Rejected as rejected:
        return rejected


def recheck_access(
    tool: Tool[Any] | None,
    tool_name: str,
    arguments_json: dict[str, Any],
    ctx: ServerContext,
    *,
    reraise: tuple[type[BaseException], ...] = (),
) -> ErrorCode | None:
    """The worker's access check just before running, against *current* policy and
    the principal's current roles (`ctx`). The same rule as admission's gates.

    Returns the code that ends the operation, or None when it may run; an exception
    of `reraise` from the rule propagates (see `authorization_refusal`).
    """
    if tool is None:
        return ErrorCode.UNKNOWN_TOOL
    if not exposed_to(tool, ctx):
        return ErrorCode.PERMISSION_DENIED
    try:
        args = tool.input_model.model_validate(arguments_json)
    except ValidationError:
        return ErrorCode.INVALID_ARGUMENTS
    refusal = authorization_refusal(tool, args, ctx, reraise=reraise)
    return None if refusal is None else refusal.code


def recheck_surface(
    registry: Registry, tool: Tool[Any], arguments_json: Mapping[str, Any], ctx: ServerContext
) -> Refusal | None:
    """The worker's turn-surface check just before running, on the context stored
    with the operation and the registry's surfaces *now*: a tool the surface no
    longer offers (or a surface no longer declared) and a listed argument naming an
    item that was not listed are refused as admission would have."""
    if not surface_offers(registry, tool, ctx):
        return Refusal(ErrorCode.TOOL_NOT_ALLOWED, "this tool is not available here")
    return target_refusal(tool, arguments_json, ctx) if tool.listed else None


def recheck_before_run(
    tool: Tool[Any],
    args: BaseModel,
    ctx: ServerContext,
    *,
    approved: bool,
    business_rules: bool = True,
    reraise: tuple[type[BaseException], ...] = (),
    forced_approval: bool = False,
) -> Refusal | None:
    """After access: the approval requirement and the business rules, again, just
    before the downstream call (docs/design.md §Worker). An approval approves an
    intent, not the facts it was shown, so an approved call's rules are checked
    too; a call the *current* policy wants approved runs only with an approval.
    `business_rules=False` skips the rules (the worker's retry of a write whose
    earlier attempt may already have changed those facts itself). `forced_approval`:
    the context's surface wants every write approved (`surface_forces_approval`).
    """
    if not approved and (forced_approval or approval_needed(tool, args, ctx, reraise=reraise)):
        return Refusal(
            ErrorCode.APPROVAL_REQUIRED, "the tool now needs an approval this call does not have"
        )
    return business_rule_refusal(tool, args, ctx, reraise=reraise) if business_rules else None
