"""Admission: the ordered gates a proposed call passes before anything is runnable.

Each gate is a pure function of (call, tool, server context) plus the tool's own
hooks; the first failure ends the call with a `failed_terminal` result and the
handler is never invoked. Order (DESIGN.md): allowlist → arguments parse →
schema → authorization → business rules → approval. Operation registration,
the last gate, needs the database and lives in `executor.store`.

Authorization runs before business rules on purpose: a rule reads the resource's
state, and a principal who may not touch the resource must not learn it from
the error.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ValidationError

from executor.core.canonical import NotCanonicalizable, canonical_json, intent_hash
from executor.core.tools import Registry, Tool, ToolFailure
from executor.core.types import ErrorCode, ErrorDetail, FailedTerminal, ProposedCall, ServerContext

DEFAULT_MAX_ARGUMENT_BYTES = 64 * 1024
DEFAULT_MAX_ARGUMENT_DEPTH = 32


class Gate(StrEnum):
    """Where a proposed call was decided: the call budget, the admission gates in
    their order, then proposal order, repeated writes and registration, which the
    producer applies. The values are what `toolfence_calls.gate` stores and the
    proposals counter's `gate` label says."""

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


class Rejected(Exception):
    """Internal control flow between gates; `result` is what the caller sees."""

    def __init__(self, result: FailedTerminal, gate: Gate) -> None:
        super().__init__(result.error.code)
        self.result = result
        self.gate = gate


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


# ---------------------------------------------------------------- gate 1: allowlist


def gate_allowlist(call: ProposedCall, registry: Registry, ctx: ServerContext) -> Tool[Any]:
    tool = registry.get(call.tool_name)
    if tool is None:
        raise _reject(call, Gate.ALLOWLIST, ErrorCode.UNKNOWN_TOOL, "no such tool")
    if not tool.access.exposed_to(ctx):
        raise _reject(
            call, Gate.ALLOWLIST, ErrorCode.TOOL_NOT_ALLOWED, "this tool is not available here"
        )
    return tool


# ---------------------------------------------------------------- gate 2: parse


def _json_depth_exceeds(text: str, limit: int) -> bool:
    """Nesting depth of JSON text, without recursing (a hostile input cannot blow the stack)."""
    depth = 0
    in_string = False
    escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def _value_depth_exceeds(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list | tuple):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in item)
    return False


class _DuplicateKey(ValueError):
    pass


class _NonFinite(ValueError):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            # Two parsers may keep different copies: refuse rather than guess.
            raise _DuplicateKey("duplicate key")
        result[key] = value
    return result


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(literal: str) -> float:
    # `1e400` is valid JSON syntax but Python reads it as inf, which no canonical
    # form (and no downstream) can represent: refuse it like NaN.
    value = float(literal)
    if not math.isfinite(value):
        raise _NonFinite(literal)
    return value


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
        if _contains_lone_surrogate(raw):
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
    if _contains_lone_surrogate(value):
        raise _reject(
            call, Gate.PARSE, code, "arguments are not UTF-8",
            (ErrorDetail(path="", code="not_utf8", expected="UTF-8 JSON text"),),
        )
    return value


def _contains_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


# ---------------------------------------------------------------- gate 3: schema

# Messages for error types whose pydantic text could quote the input.
_VALUE_ERROR_TYPES = {"value_error", "assertion_error"}


def _echoes_input(text: str, rejected_input: Any) -> bool:
    """Does `text` quote the rejected value?

    Strings (where secrets live) anywhere in the text; numbers only as a whole
    token, so "100" is not found in "greater than or equal to 1000".
    """
    if isinstance(rejected_input, bytes):
        rejected_input = rejected_input.decode(errors="replace")
    if isinstance(rejected_input, str):
        return len(rejected_input) >= 3 and rejected_input in text
    if isinstance(rejected_input, int | float) and not isinstance(rejected_input, bool):
        token = re.escape(str(rejected_input))
        return re.search(rf"(?<![\w.]){token}(?![\w.])", text) is not None
    return False


def _expected(err: Any) -> str | None:
    ctx = err.get("ctx") or {}
    if err["type"] in _VALUE_ERROR_TYPES:
        return None
    if "expected" in ctx:
        return str(ctx["expected"])
    if "expected_tags" in ctx:
        # union_tag_invalid: its message quotes the rejected tag.
        return str(ctx["expected_tags"])
    message = str(err["msg"])
    if "error" in ctx:
        # Parser errors ("…, invalid character found `x` at 3") can quote the input.
        message = message.replace(str(ctx["error"]), "").rstrip(" ,:")
    return message


def schema_details(exc: ValidationError) -> tuple[ErrorDetail, ...]:
    """Safe details from a pydantic error: where, which kind, what was expected.

    The input (`err["input"]`) is deliberately dropped, and so is any message that
    could quote it: custom validators' text, a discriminated union's "input tag
    'x'", a parser's error text, and whatever else contains the rejected value.
    """
    details = []
    for err in exc.errors(include_url=False, include_input=True):
        path = ".".join(str(part) for part in err["loc"])
        expected = _expected(err)
        if expected is not None and _echoes_input(expected, err.get("input")):
            expected = None
        details.append(ErrorDetail(path=path, code=err["type"], expected=expected))
    return tuple(details)


def gate_schema(call: ProposedCall, tool: Tool[Any], value: dict[str, Any]) -> BaseModel:
    try:
        args: BaseModel = tool.input_model.model_validate(value, strict=False)
    except ValidationError as exc:
        raise _reject(
            call, Gate.SCHEMA, ErrorCode.INVALID_ARGUMENTS, "arguments do not match the schema",
            schema_details(exc),
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


# ---------------------------------------------------------------- gate 4: authorization


def gate_authorization(
    call: ProposedCall, tool: Tool[Any], args: BaseModel, ctx: ServerContext
) -> None:
    try:
        allowed = tool.access.authorizes(args, ctx)
    except Exception:
        # A rule that cannot decide fails closed; its error text is not shown.
        allowed = False
    if not allowed:
        raise _reject(call, Gate.AUTHORIZATION, ErrorCode.PERMISSION_DENIED, "permission denied")


# ---------------------------------------------------------------- gate 5: business rules


def gate_business_rules(
    call: ProposedCall, tool: Tool[Any], args: BaseModel, ctx: ServerContext
) -> None:
    if tool.check is None:
        return
    try:
        tool.check(args, ctx)
    except ToolFailure as failure:
        raise _reject(
            call, Gate.BUSINESS_RULES, ErrorCode.BUSINESS_RULE_VIOLATION, failure.message,
            failure.details,
        ) from None
    except Exception:
        raise _reject(
            call, Gate.BUSINESS_RULES, ErrorCode.BUSINESS_RULE_VIOLATION,
            "the business rule check failed",
        ) from None


# ---------------------------------------------------------------- gate 6: approval


def gate_approval(
    call: ProposedCall, tool: Tool[Any], args: BaseModel, ctx: ServerContext
) -> tuple[bool, dict[str, Any] | None]:
    try:
        needed = tool.approval.required(args, ctx)
    except Exception:
        needed = True  # a predicate that cannot decide asks a person
    if not needed:
        return False, None
    impact: dict[str, Any] = {"tool": tool.name, "arguments": args.model_dump(mode="json")}
    if tool.impact is not None:
        try:
            impact = dict(tool.impact(args, ctx))
        except Exception:
            raise _reject(
                call, Gate.APPROVAL, ErrorCode.APPROVAL_REQUIRED,
                "the approval impact could not be computed",
            ) from None
    return True, impact


# ---------------------------------------------------------------- all gates


def compute_intent_hash(tool: Tool[Any], args: BaseModel, ctx: ServerContext) -> str:
    resource_ids = tool.resource_ids(args, ctx) if tool.resource_ids else ()
    return intent_hash(
        tenant=ctx.tenant,
        principal=ctx.principal,
        tool_name=tool.name,
        schema_version=tool.schema_version,
        arguments=args.model_dump(mode="json"),
        resource_ids=resource_ids,
    )


def proposal_fingerprint(
    call: ProposedCall, registry: Registry, ctx: ServerContext, limits: Limits = Limits()
) -> str:
    """What a call id of a request was used for, to tell a re-enqueue from a conflict.

    The intent hash where the call parses and fits its schema (so it equals the
    admitted operation's), else a hash of the call as written. Pure: no access
    rule, check or approval hook runs, so re-enqueueing a request that already ran
    gets the stored answers even where a business rule would now refuse the call.
    """
    tool = registry.get(call.tool_name)
    if tool is not None:
        try:
            args = gate_schema(call, tool, gate_parse(call, limits))
            return compute_intent_hash(tool, args, ctx)
        except Exception:
            pass  # refused by parse or schema, or a resource_ids hook raised: use the text
    raw = call.arguments
    if isinstance(raw, bytes):
        written = raw.decode("utf-8", "surrogateescape")
    elif isinstance(raw, str):
        written = raw
    else:
        written = json.dumps(raw, sort_keys=True, default=str)
    document = json.dumps(
        [ctx.tenant, ctx.principal, call.tool_name, written], ensure_ascii=True
    ).encode("utf-8", "surrogatepass")
    return "p_" + hashlib.sha256(document).hexdigest()[:62]


def admit(
    call: ProposedCall,
    registry: Registry,
    ctx: ServerContext,
    limits: Limits = Limits(),
) -> Admitted | Rejected:
    """Run every gate but registration. Returns `Rejected` (with its gate) or `Admitted`."""
    try:
        tool = gate_allowlist(call, registry, ctx)
        value = gate_parse(call, limits)
        args = gate_schema(call, tool, value)
        gate_authorization(call, tool, args, ctx)
        gate_business_rules(call, tool, args, ctx)
        needs_approval, impact = gate_approval(call, tool, args, ctx)
        try:
            digest = compute_intent_hash(tool, args, ctx)
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
            arguments_json=args.model_dump(mode="json"),
            intent_hash=digest,
            needs_approval=needs_approval,
            impact=impact,
        )
    except Rejected as rejected:
        return rejected


def recheck_access(
    tool: Tool[Any] | None, tool_name: str, arguments_json: dict[str, Any], ctx: ServerContext
) -> ErrorCode | None:
    """The worker's check just before running, against *current* policy.

    Returns the code that ends the operation, or None when it may run.
    """
    if tool is None:
        return ErrorCode.UNKNOWN_TOOL
    if not tool.access.exposed_to(ctx):
        return ErrorCode.PERMISSION_DENIED
    try:
        args = tool.input_model.model_validate(arguments_json)
    except ValidationError:
        return ErrorCode.INVALID_ARGUMENTS
    try:
        if not tool.access.authorizes(args, ctx):
            return ErrorCode.PERMISSION_DENIED
    except Exception:
        return ErrorCode.PERMISSION_DENIED
    return None
