"""Admission gates, pure: no database, no broker.

The registry below is small on purpose. Its access rule reads only the server
context (a resource → tenant table the application owns), its business rule reads
the resource's state (a refund's remaining amount: exactly what an unauthorized
principal must not learn) and every hook counts its calls, so a test can show a
gate was never consulted.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Annotated, Any, Literal
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from executor.core.admission import Admitted, Limits, Rejected, admit
from executor.core.approvers import ApproverPolicy
from executor.core.canonical import intent_hash
from executor.core.tools import (
    Access,
    Approval,
    BusinessRuleViolation,
    Effect,
    Mode,
    Registry,
    RunContext,
    Tool,
    ToolDeclarationError,
)
from executor.core.types import ErrorCode, ProposedCall, ServerContext

SECRET = "SECRET-7f3a9c-hunter2"
SECRET_NUMBER = 4111111111111111 // 1000  # a card-like number, still below 2**53

# The application's own records: which tenant owns an order, and how much of it
# may still be refunded. Only the server consults these.
ORDER_TENANT = {"ord-1": "tenant-a", "ord-2": "tenant-b", "ord-3": "tenant-a"}
REMAINING_CENTS = {"ord-1": 5_000, "ord-2": 7_123, "ord-3": 500}
APPROVAL_THRESHOLD_CENTS = 1_000

calls: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _reset_counters() -> None:
    calls.clear()


class RefundArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    order_id: str
    amount_cents: int = Field(ge=1)
    reason: str = ""


class Email(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["email"]
    address: str


class Phone(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["phone"]
    number: str


class ProfileArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nickname: str = Field(default="", max_length=12)
    code: str = Field(default="AAA", pattern=r"^[A-Z]{3}$")
    plan: Literal["free", "pro"] = "free"
    contact: Annotated[Email | Phone, Field(discriminator="kind")] | None = None
    motto: str = ""
    handle: str = ""
    ticket: UUID | None = None
    counter: int = 0
    level: int = Field(default=1000, ge=1000)
    meta: dict[str, Any] = {}

    @field_validator("motto")
    @classmethod
    def _no_shouting(cls, value: str) -> str:
        if value.isupper():
            # A careless validator that quotes its input: admission must not pass it on.
            raise ValueError(f"motto {value!r} is shouting")
        return value

    @field_validator("handle")
    @classmethod
    def _handle_free(cls, value: str) -> str:
        if value.startswith("SECRET"):
            raise PydanticCustomError("handle_taken", "handle {handle} is taken", {"handle": value})
        return value


class Output(BaseModel):
    ok: bool = True


def run_refund(args: RefundArgs, ctx: RunContext) -> Output:
    calls["run:refund_order"] += 1
    return Output()


def run_profile(args: ProfileArgs, ctx: RunContext) -> Output:
    calls["run:update_profile"] += 1
    return Output()


def owns_order(args: RefundArgs, ctx: ServerContext) -> bool:
    calls["access:refund_order"] += 1
    return ORDER_TENANT.get(args.order_id) == ctx.tenant


def refund_within_remaining(args: RefundArgs, ctx: ServerContext) -> None:
    calls["check:refund_order"] += 1
    remaining = REMAINING_CENTS[args.order_id]
    if args.amount_cents > remaining:
        raise BusinessRuleViolation(f"refund exceeds the remaining {remaining} cents")


def large_refund(args: RefundArgs, ctx: ServerContext) -> bool:
    calls["approval:refund_order"] += 1
    return args.amount_cents >= APPROVAL_THRESHOLD_CENTS


def refund_impact(args: RefundArgs, ctx: ServerContext) -> dict[str, Any]:
    return {"order_id": args.order_id, "refund_cents": args.amount_cents, "tenant": ctx.tenant}


def refund_tool(schema_version: int = 1) -> Tool[RefundArgs]:
    return Tool(
        name="refund_order",
        description="Refund part of an order",
        mode=Mode.WRITE,
        untrusted_output=False,
        input_model=RefundArgs,
        output_model=Output,
        run=run_refund,
        access=Access.for_roles("support", rule=owns_order),
        approval=Approval.when(large_refund),
        approvers=ApproverPolicy.for_roles("supervisor"),
        effect=[Effect.IDEMPOTENT],
        check=refund_within_remaining,
        impact=refund_impact,
        resource_ids=lambda args, ctx: [f"order:{args.order_id}"],
        schema_version=schema_version,
    )


def profile_tool() -> Tool[ProfileArgs]:
    return Tool(
        name="update_profile",
        description="Update the caller's profile",
        mode=Mode.WRITE,
        untrusted_output=False,
        input_model=ProfileArgs,
        output_model=Output,
        run=run_profile,
        access=Access.public_tool(),
        approval=Approval.never(),
        effect=[Effect.FENCED],
    )


REGISTRY = Registry([refund_tool(), profile_tool()])

SUPPORT_A = ServerContext(
    principal="alice", tenant="tenant-a", roles=frozenset({"support"}), request_id="req-1"
)
VIEWER_A = ServerContext(
    principal="victor", tenant="tenant-a", roles=frozenset({"viewer"}), request_id="req-2"
)


def call(arguments: str | bytes | dict[str, Any], tool_name: str = "refund_order") -> ProposedCall:
    return ProposedCall(call_id="call-1", tool_name=tool_name, arguments=arguments)


def refund(**fields: Any) -> str:
    return json.dumps({"order_id": "ord-1", "amount_cents": 200} | fields)


def handler_invocations() -> int:
    return sum(count for key, count in calls.items() if key.startswith("run:"))


def rejected(
    result: Admitted | Rejected, code: ErrorCode, gate: str | None = None
) -> Rejected:
    assert isinstance(result, Rejected), f"expected {code}, got admitted"
    assert result.result.error.code == code, result.result.error
    if gate is not None:
        assert result.gate == gate
    assert result.result.status == "failed_terminal"
    assert result.result.call_id == "call-1"
    # I7: a rejected call invoked its handler zero times.
    assert handler_invocations() == 0
    return result


# ------------------------------------------------------------------ one gate fails alone


def test_admit__all_gates_pass__admitted_without_approval() -> None:
    result = admit(call(refund()), REGISTRY, SUPPORT_A)

    assert isinstance(result, Admitted)
    assert result.needs_approval is False
    assert result.impact is None
    assert result.arguments_json == {"order_id": "ord-1", "amount_cents": 200, "reason": ""}
    assert calls["check:refund_order"] == 1
    assert handler_invocations() == 0  # admission never runs a tool


@pytest.mark.parametrize(
    ("tool_name", "arguments", "ctx", "code", "gate"),
    [
        pytest.param("drop_tables", refund(), SUPPORT_A, ErrorCode.UNKNOWN_TOOL, "allowlist",
                     id="unknown_tool"),
        pytest.param("refund_order", refund(), VIEWER_A, ErrorCode.TOOL_NOT_ALLOWED, "allowlist",
                     id="tool_not_allowed"),
        pytest.param("refund_order", '{"order_id": "ord-1", amount_cents: 200}', SUPPORT_A,
                     ErrorCode.INVALID_ARGUMENTS_JSON, "parse", id="invalid_arguments_json"),
        pytest.param("refund_order", refund(amount_cents="two hundred"), SUPPORT_A,
                     ErrorCode.INVALID_ARGUMENTS, "schema", id="invalid_arguments"),
        pytest.param("refund_order", refund(order_id="ord-2"), SUPPORT_A,
                     ErrorCode.PERMISSION_DENIED, "authorization", id="permission_denied"),
        pytest.param("refund_order", refund(order_id="ord-3", amount_cents=800), SUPPORT_A,
                     ErrorCode.BUSINESS_RULE_VIOLATION, "business_rules",
                     id="business_rule_violation"),
    ],
)
def test_admit__single_gate_fails__rejected_with_its_code_and_no_handler_call(
    tool_name: str, arguments: str, ctx: ServerContext, code: ErrorCode, gate: str
) -> None:
    # Given a call that passes every gate but one
    # When it is admitted
    result = admit(call(arguments, tool_name), REGISTRY, ctx)
    # Then it ends failed_terminal with that gate's code, and the tool never ran
    outcome = rejected(result, code, gate)
    assert outcome.result.tool_name == tool_name


def test_admit__approval_predicate_true__admitted_pending_with_server_impact() -> None:
    result = admit(call(refund(amount_cents=2_000)), REGISTRY, SUPPORT_A)

    assert isinstance(result, Admitted)
    assert result.needs_approval is True
    # The impact is computed by the server (the tenant comes from the context).
    assert result.impact == {"order_id": "ord-1", "refund_cents": 2_000, "tenant": "tenant-a"}
    assert handler_invocations() == 0


def test_admit__approval_always_without_impact_hook__impact_shows_tool_and_arguments() -> None:
    tool = Tool(
        name="close_account", description="", mode=Mode.WRITE, input_model=RefundArgs,
        untrusted_output=False,
        output_model=Output, run=run_refund, access=Access.for_roles("support"),
        approval=Approval.always(), approvers=ApproverPolicy.for_roles("supervisor"),
        effect=[Effect.FENCED],
    )
    result = admit(call(refund(), "close_account"), Registry([tool]), SUPPORT_A)

    assert isinstance(result, Admitted)
    assert result.needs_approval is True
    # The default impact is a redacted summary: numbers shown, text only by its size
    assert result.impact == {
        "tool": "close_account",
        "arguments": {
            "order_id": "<text, 5 characters>", "amount_cents": 200, "reason": "<text, 0 characters>",
        },
        "note": "summary: declare an impact hook on the tool to show approvers more",
    }


# ------------------------------------------------------------------ gate order


def test_admit__approval_needed_but_not_allowlisted__tool_not_allowed() -> None:
    # Given a call that would need approval, from a principal without the tool's role
    result = admit(call(refund(amount_cents=2_000)), REGISTRY, VIEWER_A)
    # Then approval cannot rescue it: the allowlist refuses first
    rejected(result, ErrorCode.TOOL_NOT_ALLOWED, "allowlist")
    assert sum(calls.values()) == 0  # no hook was consulted at all


def test_admit__unknown_tool_with_malformed_arguments__unknown_tool() -> None:
    rejected(admit(call("{{{", "no_such_tool"), REGISTRY, SUPPORT_A), ErrorCode.UNKNOWN_TOOL)


def test_admit__not_allowlisted_with_malformed_arguments__tool_not_allowed() -> None:
    rejected(admit(call("{{{"), REGISTRY, VIEWER_A), ErrorCode.TOOL_NOT_ALLOWED)


def test_admit__approval_needed_but_schema_invalid__invalid_arguments() -> None:
    result = admit(call(refund(amount_cents=2_000, approved="yes")), REGISTRY, SUPPORT_A)

    rejected(result, ErrorCode.INVALID_ARGUMENTS, "schema")
    assert sum(calls.values()) == 0


def test_admit__schema_invalid_for_foreign_resource__invalid_arguments_before_access_rule() -> None:
    result = admit(call(refund(order_id="ord-2", amount_cents=-5)), REGISTRY, SUPPORT_A)

    rejected(result, ErrorCode.INVALID_ARGUMENTS, "schema")
    assert calls["access:refund_order"] == 0


def test_admit__approval_needed_but_unauthorized__permission_denied() -> None:
    result = admit(call(refund(order_id="ord-2", amount_cents=2_000)), REGISTRY, SUPPORT_A)

    rejected(result, ErrorCode.PERMISSION_DENIED, "authorization")
    assert calls["approval:refund_order"] == 0


def test_admit__unauthorized_and_rule_violated__permission_denied_and_rule_never_consulted() -> None:
    # Given a principal of tenant-a asking to refund more than tenant-b's order has left
    result = admit(call(refund(order_id="ord-2", amount_cents=999_999)), REGISTRY, SUPPORT_A)
    # Then authorization refuses before the business rule could reveal the remaining amount
    outcome = rejected(result, ErrorCode.PERMISSION_DENIED, "authorization")
    assert calls["check:refund_order"] == 0
    assert str(REMAINING_CENTS["ord-2"]) not in outcome.result.model_dump_json()


def test_admit__authorized_and_rule_violated__business_rule_violation_message_shown() -> None:
    result = admit(call(refund(order_id="ord-3", amount_cents=800)), REGISTRY, SUPPORT_A)

    outcome = rejected(result, ErrorCode.BUSINESS_RULE_VIOLATION)
    assert outcome.result.error.message == "refund exceeds the remaining 500 cents"


def test_admit__rule_violated_and_approval_needed__business_rule_violation_before_approval() -> None:
    result = admit(call(refund(amount_cents=9_000)), REGISTRY, SUPPORT_A)

    rejected(result, ErrorCode.BUSINESS_RULE_VIOLATION, "business_rules")
    assert calls["approval:refund_order"] == 0


# ------------------------------------------------------------------ authorization: server context only


def test_admit__schema_valid_argument_names_other_tenants_resource__permission_denied() -> None:
    # The model names ord-2 (tenant-b); the principal is tenant-a's. Nothing the model
    # writes changes who the principal is.
    result = admit(call(refund(order_id="ord-2")), REGISTRY, SUPPORT_A)

    rejected(result, ErrorCode.PERMISSION_DENIED)
    assert calls["access:refund_order"] == 1


def test_admit__model_claims_tenant_in_arguments__refused_as_unknown_field() -> None:
    result = admit(call(refund(order_id="ord-2", tenant="tenant-b")), REGISTRY, SUPPORT_A)

    outcome = rejected(result, ErrorCode.INVALID_ARGUMENTS)
    assert [(d.path, d.code) for d in outcome.result.error.details] == [
        ("<key 3>", "additional_property")
    ]


def test_admit__same_arguments_other_tenant_context__authorized() -> None:
    tenant_b = SUPPORT_A.model_copy(update={"tenant": "tenant-b"})

    assert isinstance(admit(call(refund(order_id="ord-2")), REGISTRY, tenant_b), Admitted)


def test_admit__access_rule_raises__permission_denied_without_its_text() -> None:
    def broken_rule(args: RefundArgs, ctx: ServerContext) -> bool:
        raise RuntimeError(f"lookup failed for {SECRET}")

    tool = Tool(
        name="refund_order", description="", mode=Mode.WRITE, input_model=RefundArgs,
        untrusted_output=False,
        output_model=Output, run=run_refund,
        access=Access.for_roles("support", rule=broken_rule), approval=Approval.never(),
        effect=[Effect.IDEMPOTENT],
    )
    outcome = rejected(admit(call(refund()), Registry([tool]), SUPPORT_A),
                       ErrorCode.PERMISSION_DENIED)
    assert SECRET not in outcome.result.model_dump_json()


def test_admit__check_raises_unexpected_error__business_rule_violation_without_its_text() -> None:
    def broken_check(args: RefundArgs, ctx: ServerContext) -> None:
        raise KeyError(SECRET)

    tool = Tool(
        name="refund_order", description="", mode=Mode.WRITE, input_model=RefundArgs,
        untrusted_output=False,
        output_model=Output, run=run_refund, access=Access.for_roles("support"),
        approval=Approval.never(), effect=[Effect.IDEMPOTENT], check=broken_check,
    )
    outcome = rejected(admit(call(refund()), Registry([tool]), SUPPORT_A),
                       ErrorCode.BUSINESS_RULE_VIOLATION)
    assert SECRET not in outcome.result.model_dump_json()


def test_admit__approval_predicate_raises__asks_a_person() -> None:
    def broken_predicate(args: RefundArgs, ctx: ServerContext) -> bool:
        raise RuntimeError("cannot decide")

    tool = Tool(
        name="refund_order", description="", mode=Mode.WRITE, input_model=RefundArgs,
        untrusted_output=False,
        output_model=Output, run=run_refund, access=Access.for_roles("support"),
        approval=Approval.when(broken_predicate), approvers=ApproverPolicy.for_roles("supervisor"),
        effect=[Effect.IDEMPOTENT],
    )
    result = admit(call(refund()), Registry([tool]), SUPPORT_A)

    assert isinstance(result, Admitted)
    assert result.needs_approval is True


# ------------------------------------------------------------------ schema details are safe


@pytest.mark.parametrize(
    ("arguments", "path", "code"),
    [
        pytest.param({"counter": SECRET}, "counter", "int_parsing", id="wrong_type"),
        pytest.param({"nickname": SECRET}, "nickname", "string_too_long", id="too_long"),
        pytest.param({"code": SECRET}, "code", "string_pattern_mismatch", id="pattern"),
        pytest.param({"plan": SECRET}, "plan", "literal_error", id="literal"),
        pytest.param({"contact": {"kind": SECRET}}, "contact", "union_tag_invalid",
                     id="discriminator_tag"),
        pytest.param({"motto": SECRET.upper()}, "motto", "value_error", id="custom_validator"),
        pytest.param({"handle": SECRET}, "handle", "handle_taken", id="custom_error_type"),
        pytest.param({"ticket": SECRET}, "ticket", "uuid_parsing", id="parser_error"),
        pytest.param({"nickname": SECRET_NUMBER}, "nickname", "string_type", id="number_secret"),
        pytest.param({"level": -SECRET_NUMBER}, "level", "greater_than_equal",
                     id="number_secret_below_bound"),
        pytest.param({"unexpected": SECRET}, "<key 1>", "additional_property", id="unknown_field"),
        pytest.param({"contact": {"kind": "email", "address": "a@b", "cc": SECRET}},
                     "contact.email.<key 3>", "additional_property", id="nested_unknown_field"),
        pytest.param({SECRET: 1}, "<key 1>", "additional_property", id="secret_as_unknown_key"),
        pytest.param({"nickname": "n", "contact": {"kind": "email", "address": "a@b", SECRET: 1}},
                     "contact.email.<key 3>", "additional_property", id="secret_as_nested_key"),
    ],
)
def test_admit__schema_error__details_name_path_and_code_never_the_value(
    arguments: dict[str, Any], path: str, code: str
) -> None:
    # Given a schema-invalid value that is a secret (or an injection payload)
    result = admit(call(json.dumps(arguments), "update_profile"), REGISTRY, SUPPORT_A)
    # Then the details say where and what kind, and the value appears nowhere
    outcome = rejected(result, ErrorCode.INVALID_ARGUMENTS, "schema")
    details = outcome.result.error.details
    assert (details[0].path, details[0].code) == (path, code)
    dumped = outcome.result.model_dump_json()
    for secret in (SECRET, SECRET.upper(), str(SECRET_NUMBER)):
        assert secret not in dumped


def test_admit__schema_error__expected_says_what_was_wanted() -> None:
    result = admit(call('{"plan": "enterprise"}', "update_profile"), REGISTRY, SUPPORT_A)

    detail = rejected(result, ErrorCode.INVALID_ARGUMENTS).result.error.details[0]
    assert detail.model_dump() == {"path": "plan", "code": "literal_error", "expected": "'free' or 'pro'"}


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"contact": {"kind": "fax"}}', "'email', 'phone'"),
        ('{"ticket": "not-a-uuid"}', "Input should be a valid UUID"),
        ('{"counter": "many"}', "Input should be a valid integer"),
        ('{"level": 100}', "Input should be greater than or equal to 1000"),
    ],
)
def test_admit__schema_error_whose_message_quotes_input__expected_keeps_only_the_safe_part(
    arguments: str, expected: str
) -> None:
    result = admit(call(arguments, "update_profile"), REGISTRY, SUPPORT_A)

    detail = rejected(result, ErrorCode.INVALID_ARGUMENTS).result.error.details[0]
    assert detail.expected is not None
    assert detail.expected.startswith(expected)


def test_admit__several_schema_errors__one_detail_each() -> None:
    result = admit(call('{"order_id": 5, "amount_cents": 0}'), REGISTRY, SUPPORT_A)

    details = rejected(result, ErrorCode.INVALID_ARGUMENTS).result.error.details
    assert sorted((d.path, d.code) for d in details) == [
        ("amount_cents", "greater_than_equal"),
        ("order_id", "string_type"),
    ]


# ------------------------------------------------------------------ hostile and broken input


def nested_text(depth: int) -> str:
    return '{"meta": ' + '{"a": ' * (depth - 1) + "1" + "}" * depth


def nested_value(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


LIMITS = Limits()


@pytest.mark.parametrize(
    ("arguments", "code", "detail_code"),
    [
        pytest.param("{'order_id': 'ord-1'}", ErrorCode.INVALID_ARGUMENTS_JSON, "json_syntax",
                     id="malformed"),
        pytest.param('{"order_id": "ord-1", "amount_cents": 2', ErrorCode.INVALID_ARGUMENTS_JSON,
                     "json_syntax", id="truncated"),
        pytest.param('{"order_id": "ord-1", "amount_cents": 200}}',
                     ErrorCode.INVALID_ARGUMENTS_JSON, "json_syntax", id="trailing_garbage"),
        pytest.param("[" * (LIMITS.max_argument_depth + 1) + "]" * (LIMITS.max_argument_depth + 1),
                     ErrorCode.INVALID_ARGUMENTS_JSON, "too_deep", id="deeper_than_limit"),
        pytest.param("[" * 100_000 + "]" * 100_000, ErrorCode.INVALID_ARGUMENTS_JSON, "too_large",
                     id="100000_deep_is_also_too_large"),
        pytest.param(refund(reason="x" * LIMITS.max_argument_bytes),
                     ErrorCode.INVALID_ARGUMENTS_JSON, "too_large", id="huge_text"),
        pytest.param(refund(reason="x" * LIMITS.max_argument_bytes).encode(),
                     ErrorCode.INVALID_ARGUMENTS_JSON, "too_large", id="huge_bytes"),
        pytest.param(refund(reason="é" * (LIMITS.max_argument_bytes // 2)),
                     ErrorCode.INVALID_ARGUMENTS_JSON, "too_large", id="huge_in_utf8_bytes"),
        pytest.param(refund(amount_cents="200 cents"), ErrorCode.INVALID_ARGUMENTS,
                     "int_parsing", id="wrong_type"),
        pytest.param(refund(amount_cents=[200]), ErrorCode.INVALID_ARGUMENTS, "int_type",
                     id="wrong_container"),
        pytest.param(refund(admin=True), ErrorCode.INVALID_ARGUMENTS, "additional_property",
                     id="unknown_field"),
        pytest.param('{"order_id": "ord-1"}', ErrorCode.INVALID_ARGUMENTS, "missing",
                     id="missing_field"),
        pytest.param(b'{"order_id": "ord-\xff\xfe", "amount_cents": 200}',
                     ErrorCode.INVALID_ARGUMENTS_JSON, "not_utf8", id="non_utf8_bytes"),
        pytest.param('{"order_id": "ord-\\ud800", "amount_cents": 200}',
                     ErrorCode.INVALID_ARGUMENTS_JSON, "not_utf8", id="lone_surrogate_escape"),
        pytest.param('{"order_id": "ord-\\udc00\\ud800", "amount_cents": 200}',
                     ErrorCode.INVALID_ARGUMENTS_JSON, "not_utf8", id="reversed_surrogate_pair"),
        pytest.param('{"order_id": "ord-\ud800", "amount_cents": 200}',
                     ErrorCode.INVALID_ARGUMENTS_JSON, "not_utf8", id="lone_surrogate_char"),
        pytest.param('{"ord\\udfffer_id": "ord-1", "amount_cents": 200}',
                     ErrorCode.INVALID_ARGUMENTS_JSON, "not_utf8", id="lone_surrogate_in_key"),
        pytest.param({"order_id": "ord-\ud800", "amount_cents": 200},
                     ErrorCode.INVALID_ARGUMENTS_JSON, "not_utf8", id="lone_surrogate_in_mapping"),
        pytest.param('{"order_id": "ord-1", "amount_cents": 200, "amount_cents": 9}',
                     ErrorCode.INVALID_ARGUMENTS_JSON, "duplicate_key", id="duplicate_keys"),
        pytest.param('{"order_id": "ord-1", "amount_cents": NaN}',
                     ErrorCode.INVALID_ARGUMENTS_JSON, "json_syntax", id="nan"),
        pytest.param('{"order_id": "ord-1", "amount_cents": -Infinity}',
                     ErrorCode.INVALID_ARGUMENTS_JSON, "json_syntax", id="infinity"),
        pytest.param('{"order_id": "ord-1", "amount_cents": 1e400}',
                     ErrorCode.INVALID_ARGUMENTS_JSON, "non_finite", id="overflowing_number"),
        pytest.param({"order_id": "ord-1", "amount_cents": float("nan")},
                     ErrorCode.INVALID_ARGUMENTS_JSON, None, id="nan_in_mapping"),
        pytest.param('[{"order_id": "ord-1", "amount_cents": 200}]', ErrorCode.INVALID_ARGUMENTS,
                     "type", id="top_level_array"),
        pytest.param('"ord-1"', ErrorCode.INVALID_ARGUMENTS, "type", id="top_level_string"),
        pytest.param("null", ErrorCode.INVALID_ARGUMENTS, "type", id="top_level_null"),
        pytest.param(refund(amount_cents=2**53 + 1), ErrorCode.INVALID_ARGUMENTS, "not_canonical",
                     id="integer_above_2_53"),
        pytest.param(refund(amount_cents=10**400), ErrorCode.INVALID_ARGUMENTS, "not_canonical",
                     id="integer_with_400_digits"),
        pytest.param({"order_id": "ord-1", "amount_cents": 2**64}, ErrorCode.INVALID_ARGUMENTS,
                     "not_canonical", id="integer_above_2_53_in_mapping"),
        pytest.param({"order_id": "ord-1", "amount_cents": 200, "x": {1, 2}},
                     ErrorCode.INVALID_ARGUMENTS_JSON, None, id="mapping_with_non_json_value"),
        pytest.param(nested_value(LIMITS.max_argument_depth + 1),
                     ErrorCode.INVALID_ARGUMENTS_JSON, "too_deep", id="deep_mapping"),
        pytest.param(nested_value(100_000), ErrorCode.INVALID_ARGUMENTS_JSON, "too_deep",
                     id="100000_deep_mapping"),
    ],
)
def test_admit__bad_arguments__rejected_with_stable_code_never_raises(
    arguments: str | bytes | dict[str, Any], code: ErrorCode, detail_code: str | None
) -> None:
    result = admit(call(arguments), REGISTRY, SUPPORT_A)

    outcome = rejected(result, code)
    if detail_code is not None:
        assert detail_code in [d.code for d in outcome.result.error.details]
    # Nothing reached the business rule: only arguments that parse and validate do.
    assert calls["check:refund_order"] == 0


def test_admit__empty_arguments_text__treated_as_empty_object() -> None:
    result = admit(call("  ", "update_profile"), REGISTRY, SUPPORT_A)

    assert isinstance(result, Admitted)
    assert result.arguments_json["plan"] == "free"


def test_admit__depth_exactly_at_limit__admitted_one_more__refused() -> None:
    at_limit = nested_text(LIMITS.max_argument_depth)
    beyond = nested_text(LIMITS.max_argument_depth + 1)

    assert isinstance(admit(call(at_limit, "update_profile"), REGISTRY, SUPPORT_A), Admitted)
    outcome = rejected(
        admit(call(beyond, "update_profile"), REGISTRY, SUPPORT_A), ErrorCode.INVALID_ARGUMENTS_JSON
    )
    assert outcome.result.error.details[0].code == "too_deep"


@pytest.mark.parametrize(
    "text", ["[" * 100_000 + "]" * 100_000, "[" * 100_000, '{"a":' * 100_000],
    ids=["balanced", "unclosed_arrays", "unclosed_objects"],
)
def test_admit__100000_deep_within_byte_limit__too_deep_without_recursion_error(text: str) -> None:
    roomy = Limits(max_argument_bytes=10_000_000)

    outcome = rejected(admit(call(text), REGISTRY, SUPPORT_A, roomy), ErrorCode.INVALID_ARGUMENTS_JSON)
    assert outcome.result.error.details[0].code == "too_deep"


@pytest.mark.parametrize("as_mapping", [False, True], ids=["text", "mapping"])
def test_admit__100000_deep_under_a_raised_depth_limit__rejected_without_recursion_error(
    as_mapping: bool,
) -> None:
    # Given an operator who raised the depth limit far beyond what Python can recurse
    limits = Limits(max_argument_depth=200_000, max_argument_bytes=10_000_000)
    deep = nested_value(100_000)
    arguments: str | dict[str, Any] = {"meta": deep} if as_mapping else json.dumps(
        {"meta": {"leaf": 1}}
    ).replace('{"leaf": 1}', '{"a": ' * 100_000 + "1" + "}" * 100_000)
    # When a 100000-deep document arrives, Then it is refused, not a crash
    result = admit(call(arguments, "update_profile"), REGISTRY, SUPPORT_A, limits)
    rejected(result, ErrorCode.INVALID_ARGUMENTS_JSON)


def test_admit__argument_byte_limit__is_configurable() -> None:
    text = refund(reason="r" * 200)
    assert isinstance(admit(call(text), REGISTRY, SUPPORT_A), Admitted)

    small = Limits(max_argument_bytes=len(text.encode()) - 1)
    rejected(admit(call(text), REGISTRY, SUPPORT_A, small), ErrorCode.INVALID_ARGUMENTS_JSON)
    exact = Limits(max_argument_bytes=len(text.encode()))
    assert isinstance(admit(call(text), REGISTRY, SUPPORT_A, exact), Admitted)


def test_admit__argument_depth_limit__is_configurable() -> None:
    text = nested_text(4)
    assert isinstance(admit(call(text, "update_profile"), REGISTRY, SUPPORT_A), Admitted)

    rejected(
        admit(call(text, "update_profile"), REGISTRY, SUPPORT_A, Limits(max_argument_depth=3)),
        ErrorCode.INVALID_ARGUMENTS_JSON,
    )


@pytest.mark.parametrize("value", [2**53 - 1, -(2**53) + 1])
def test_admit__integer_at_interoperable_bound__admitted(value: int) -> None:
    result = admit(call(json.dumps({"counter": value}), "update_profile"), REGISTRY, SUPPORT_A)

    assert isinstance(result, Admitted)


@pytest.mark.parametrize("value", [2**53, -(2**53)])
def test_admit__integer_one_past_interoperable_bound__invalid_arguments(value: int) -> None:
    result = admit(call(json.dumps({"counter": value}), "update_profile"), REGISTRY, SUPPORT_A)

    rejected(result, ErrorCode.INVALID_ARGUMENTS, "schema")


def test_admit__integer_above_2_53__refused_before_business_rule_and_approval() -> None:
    # A number that has no canonical form is a schema problem: the tool's own hooks
    # (which may do I/O) must not be consulted for it.
    result = admit(call(refund(amount_cents=2**53 + 1)), REGISTRY, SUPPORT_A)

    rejected(result, ErrorCode.INVALID_ARGUMENTS, "schema")
    assert calls["access:refund_order"] == 0
    assert calls["check:refund_order"] == 0
    assert calls["approval:refund_order"] == 0


# ------------------------------------------------------------------ fuzzing


def fuzz_registry() -> Registry:
    return REGISTRY


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
profile_like = st.fixed_dictionaries(
    {},
    optional={
        "nickname": st.text(),
        "code": st.text(max_size=4),
        "plan": st.sampled_from(["free", "pro", "gold"]),
        "counter": st.integers() | st.floats() | st.text(),
        "meta": json_values,
        "contact": json_values,
        "motto": st.text(),
    },
)
fuzzed_arguments = (
    st.text()
    | st.binary()
    | json_values.map(lambda v: json.dumps(v, allow_nan=True))
    | profile_like.map(lambda v: json.dumps(v, allow_nan=True))
    | st.dictionaries(st.text(max_size=8), json_values, max_size=5)
    | profile_like
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arguments=fuzzed_arguments,
    tool_name=st.sampled_from(["refund_order", "update_profile", "nope"]),
    ctx=st.sampled_from([SUPPORT_A, VIEWER_A]),
)
def test_admit__arbitrary_arguments__returns_admitted_or_rejected_never_raises(
    arguments: str | bytes | dict[str, Any], tool_name: str, ctx: ServerContext
) -> None:
    calls.clear()
    result = admit(
        ProposedCall(call_id="call-1", tool_name=tool_name, arguments=arguments),
        REGISTRY,
        ctx,
    )

    assert isinstance(result, Admitted | Rejected)
    assert handler_invocations() == 0
    if isinstance(result, Rejected):
        assert result.result.error.code in set(ErrorCode)
        assert result.result.tool_name == tool_name
    else:
        assert len(result.intent_hash) == 64


# ------------------------------------------------------------------ tool declarations


def declare(**overrides: Any) -> Tool[Any]:
    fields: dict[str, Any] = {
        "name": "wire_money",
        "description": "",
        "mode": Mode.WRITE,
        "input_model": RefundArgs,
        "output_model": Output,
        "run": run_refund,
        "access": Access.for_roles("support"),
        "approval": Approval.never(),
        "effect": [Effect.UNSAFE],
        "untrusted_output": False,
    }
    fields.update(overrides)
    return Tool(**{k: v for k, v in fields.items() if v is not MISSING})


MISSING = object()


@pytest.mark.parametrize("field", ["access", "approval", "effect", "untrusted_output"])
def test_tool__safety_field_missing__declaration_error_names_tool_and_field(field: str) -> None:
    with pytest.raises(ToolDeclarationError) as info:
        declare(**{field: MISSING})

    assert "wire_money" in str(info.value)
    assert field in str(info.value)


def test_tool__read_without_effect__declared() -> None:
    tool = declare(mode=Mode.READ, effect=MISSING)

    assert tool.effects == frozenset()
    assert tool.takeover_allowed


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"effect": []}, id="write_with_no_effect"),
        pytest.param({"mode": Mode.READ}, id="read_with_effect"),
        pytest.param({"effect": [Effect.UNSAFE, Effect.IDEMPOTENT]}, id="unsafe_and_idempotent"),
        pytest.param({"effect": [Effect.LOOKUP]}, id="lookup_without_hook"),
        pytest.param({"input_model": Output}, id="input_model_allows_extra"),
        pytest.param({"access": Access(roles=frozenset())}, id="access_names_no_role"),
    ],
)
def test_tool__inconsistent_declaration__error_names_tool(overrides: dict[str, Any]) -> None:
    with pytest.raises(ToolDeclarationError, match="wire_money"):
        declare(**overrides)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        pytest.param({"mode": "write", "effect": MISSING}, "effect", id="string_write_without_effect"),
        pytest.param({"mode": "write", "effect": []}, "at least one effect", id="string_write_empty"),
        pytest.param({"mode": "execute"}, "mode must be one of", id="unknown_mode"),
        pytest.param({"effect": None}, "collection of effects", id="effect_none"),
        pytest.param({"effect": "idempotent"}, "collection of effects", id="effect_bare_string"),
        pytest.param({"effect": Effect.IDEMPOTENT}, "collection of effects", id="effect_bare_member"),
        pytest.param({"effect": ["exactly_once"]}, "unknown effect 'exactly_once'", id="effect_unknown"),
    ],
)
def test_tool__mode_or_effect_malformed__declaration_error_says_what(
    overrides: dict[str, Any], says: str
) -> None:
    # A mode given as a plain string is still a write: it must declare its effect
    # like Mode.WRITE does, and a malformed effect is a declaration error, not a
    # TypeError or ValueError from inside the constructor.
    with pytest.raises(ToolDeclarationError, match="wire_money") as info:
        declare(**overrides)

    assert says in str(info.value)


def test_tool__mode_and_effects_as_strings__normalised() -> None:
    tool = declare(mode="write", effect=["idempotent", "lookup"], lookup=lambda args, ctx: None)

    assert tool.mode is Mode.WRITE
    assert tool.effects == frozenset({Effect.IDEMPOTENT, Effect.LOOKUP})


def test_registry__same_name_twice__declaration_error_names_tool() -> None:
    with pytest.raises(ToolDeclarationError, match="refund_order"):
        Registry([refund_tool(), refund_tool()])


@pytest.mark.parametrize(
    ("effects", "takeover"),
    [
        ([Effect.IDEMPOTENT], True),
        ([Effect.FENCED], True),
        ([Effect.IDEMPOTENT, Effect.LOOKUP], True),
        ([Effect.UNSAFE], False),
    ],
)
def test_tool__takeover_allowed__only_for_deduping_or_fenced_writes(
    effects: list[Effect], takeover: bool
) -> None:
    lookup = (lambda args, ctx: None) if Effect.LOOKUP in effects else None
    assert declare(effect=effects, lookup=lookup).takeover_allowed is takeover


# ------------------------------------------------------------------ intent hash


def admitted_hash(arguments: str, ctx: ServerContext = SUPPORT_A, registry: Registry = REGISTRY) -> str:
    result = admit(call(arguments), registry, ctx)
    assert isinstance(result, Admitted), result
    return result.intent_hash


@pytest.mark.parametrize(
    "spelling",
    [
        '{"amount_cents": 200, "order_id": "ord-1"}',
        '{ "order_id" : "ord-1" ,\n\t"amount_cents" : 200 }',
        '{"order_id": "ord-1", "amount_cents": 2e2}',
        '{"order_id": "ord-1", "amount_cents": 200.0}',
        '{"order_id": "ord-1", "amount_cents": 20000E-2}',
        '{"order_id": "ord-1", "amount_cents": 200, "reason": ""}',
        '{"order_id": "\\u006frd-1", "amount_cents": 200}',
    ],
)
def test_intent_hash__spelling_of_same_arguments__same_hash(spelling: str) -> None:
    assert admitted_hash(spelling) == admitted_hash('{"order_id":"ord-1","amount_cents":200}')


def test_intent_hash__mapping_and_text_of_same_arguments__same_hash() -> None:
    assert admitted_hash(refund()) == admit(
        call({"amount_cents": 200, "order_id": "ord-1"}), REGISTRY, SUPPORT_A
    ).intent_hash  # type: ignore[union-attr]


BASE_INTENT: dict[str, Any] = {
    "tenant": "tenant-a",
    "principal": "alice",
    "tool_name": "refund_order",
    "schema_version": 1,
    "arguments": {"order_id": "ord-1", "amount_cents": 200},
    "resource_ids": ["order:ord-1"],
}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tenant", "tenant-b"),
        ("principal", "mallory"),
        ("tool_name", "refund_order_v2"),
        ("schema_version", 2),
        ("arguments", {"order_id": "ord-1", "amount_cents": 201}),
        ("arguments", {"order_id": "ord-1", "amount_cents": "200"}),
        ("arguments", {"order_id": "ord-1", "amount_cents": 200, "reason": ""}),
        ("resource_ids", ["order:ord-2"]),
        ("resource_ids", []),
    ],
)
def test_intent_hash__any_component_changes__hash_changes(field: str, value: Any) -> None:
    assert intent_hash(**BASE_INTENT) != intent_hash(**(BASE_INTENT | {field: value}))


def test_intent_hash__resource_id_order_and_repeats__same_hash() -> None:
    reordered = BASE_INTENT | {"resource_ids": ["b", "a", "a"]}
    assert intent_hash(**reordered) == intent_hash(**(BASE_INTENT | {"resource_ids": ["a", "b"]}))


def test_intent_hash__via_admit__context_tool_version_and_resources_change_it() -> None:
    base = admitted_hash(refund())
    other_principal = SUPPORT_A.model_copy(update={"principal": "bob"})
    other_request = SUPPORT_A.model_copy(update={"request_id": "req-99"})
    v2 = Registry([refund_tool(schema_version=2)])

    assert admitted_hash(refund(), other_principal) != base
    assert admitted_hash(refund(), registry=v2) != base
    assert admitted_hash(refund(amount_cents=201)) != base
    # The request id is correlation, not intent: a retry in a new request is the same intent.
    assert admitted_hash(refund(), other_request) == base
