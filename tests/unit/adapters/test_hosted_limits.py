"""Pure checks of the hosted path's boundary (no database): hosted arguments go through
the proposals' strict parser and limits, the intent hash never raises, an approval
request toolfence could not record or answer is refused with a stable code, and
every bounded column of the hosted tables is classified (refused, clipped or
digested) so a new one cannot be added unclassified.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import String

from executor.core.admission import Limits
from executor.core.approvers import ApproverPolicy
from executor.core.identifiers import storable_key, storable_text
from executor.core.strictjson import StrictJSONError
from executor.providers.hosted import (
    GrantedApprovals,
    HostedCall,
    HostedPolicy,
    HostedServer,
    hosted_arguments,
    hosted_intent_hash,
    hosted_violations,
)
from executor.store.schema import hosted_approval_events, hosted_approvals, hosted_calls

DEEP = "[" * 5000 + "]" * 5000

POLICY = HostedPolicy(
    servers=(
        HostedServer(
            label="crm", url="https://crm.example/mcp",
            allowed_tools=frozenset({"update_customer"}),
            approval_required=frozenset({"update_customer"}),
            approvers=ApproverPolicy.for_roles("support-lead"),
        ),
    ),
    builtin_tools=frozenset(),
)


def approval_request(**changes: Any) -> HostedCall:
    values: dict[str, Any] = {
        "surface": "openai-responses", "kind": "mcp_approval_request", "server_label": "crm",
        "tool_name": "update_customer", "arguments": '{"a": 1}', "item_id": "mcpr_1",
        "status": None, "output_digest": None,
    }
    return HostedCall(**(values | changes))


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (DEEP, "too_deep"),
        ('{"a": 1, "a": 2}', "duplicate_key"),
        ('{"a": NaN}', "json_syntax"),
        ('{"a": 1e400}', "non_finite"),
        ('{"a": "\\ud800"}', "not_utf8"),
        ('{"a": "\ud800"}', "not_utf8"),
        ("x" * 70_000, "too_large"),
    ],
)
def test_hosted_arguments__what_a_proposal_refuses__strict_json_error_with_its_code(
    text: str, code: str
) -> None:
    with pytest.raises(StrictJSONError) as refused:
        hosted_arguments(text)
    assert refused.value.code == code


def test_hosted_arguments__limits_are_the_callers() -> None:
    assert hosted_arguments("[[1]]", Limits(max_argument_depth=2)) == [[1]]
    with pytest.raises(StrictJSONError):
        hosted_arguments("[[[1]]]", Limits(max_argument_depth=2))
    assert hosted_arguments(None) is None and hosted_arguments(" ") == {}


@pytest.mark.parametrize(
    "arguments", [DEEP, '{"a": "\ud800"}', '{"a": 1, "a": 2}', "not json", None, ""],
)
def test_hosted_intent_hash__hostile_arguments__never_raises_stable_and_distinct(
    arguments: str | None,
) -> None:
    first = hosted_intent_hash("acme", "crm", "update_customer", arguments)
    assert first == hosted_intent_hash("acme", "crm", "update_customer", arguments)
    assert first != hosted_intent_hash("acme", "crm", "update_customer", '{"a": 1}')


def test_hosted_intent_hash__lone_surrogate_in_names__still_a_digest() -> None:
    assert len(hosted_intent_hash("acme", "crm\ud800", "t\udfff", "{}")) == 64


@pytest.mark.parametrize(
    ("changes", "path", "code"),
    [
        ({"item_id": "m" * 201}, "item_id", "too_long"),
        ({"item_id": "m\ud800"}, "item_id", "lone_surrogate"),
        ({"item_id": "m\x00"}, "item_id", "nul"),
        ({"item_id": None}, "item_id", "not_text"),
        ({"item_id": ""}, "item_id", "empty"),
        ({"arguments": DEEP}, "arguments", "too_deep"),
        ({"arguments": '{"a": "\ud800"}'}, "arguments", "not_utf8"),
        ({"arguments": '{"a": 9007199254740993}'}, "arguments", "not_canonicalizable"),
    ],
)
def test_approval_request__unrecordable__refused_naming_field_and_problem(
    changes: dict[str, Any], path: str, code: str
) -> None:
    [violation] = hosted_violations([approval_request(**changes)], POLICY)
    assert violation.error.code == "hosted_call_not_allowed"
    assert [(d.path, d.code) for d in violation.error.details] == [(path, code)]


def test_approval_request__recordable__no_violation() -> None:
    assert hosted_violations([approval_request(item_id="m" * 200)], POLICY) == []


def test_mcp_call__hostile_approval_id_or_deep_arguments__refused_never_raises() -> None:
    intent = hosted_intent_hash("acme", "crm", "update_customer", '{"a": 1}')
    granted = GrantedApprovals("acme", {"mcpr_1": intent})
    calls = [
        approval_request(kind="mcp_call", approval_request_id="mcpr_\ud800"),
        approval_request(kind="mcp_call", approval_request_id="mcpr_1", arguments=DEEP),
        approval_request(kind="mcp_call", approval_request_id="mcpr_1"),
    ]
    codes = [[d.code for d in v.error.details] for v in hosted_violations(calls, POLICY, granted)]
    assert codes == [["approval_not_granted"], ["approval_intent_mismatch"]]


# How each bounded column of the hosted tables is kept within its size when a provider
# or model writes it: `refused` (an approval request that would not fit is refused,
# `hosted_violations`), `digest` (stored as itself when it is an identifier of the
# column's size, else `h_` + a digest: `storable_key`), `clipped` (`storable_text`),
# `identifier` (the request's tenant / request id / principal, checked by
# `check_server_context` before anything is written), `toolfence` (written by toolfence
# itself: computed ids and hashes, states, codes).
HOSTED_COLUMNS = {
    "toolfence_hosted_calls": {
        "tenant": "identifier", "request_id": "identifier", "hosted_call_id": "digest",
        "surface": "clipped", "kind": "clipped", "server_label": "clipped", "tool_name": "clipped",
        "item_id": "clipped", "status": "clipped", "output_digest": "digest", "code": "clipped",
        "call_id": "digest",
    },
    "toolfence_hosted_approvals": {
        "approval_id": "toolfence", "tenant": "identifier", "request_id": "identifier",
        "approval_request_id": "refused", "surface": "clipped", "server_label": "refused",
        "tool_name": "refused", "intent_hash": "toolfence", "state": "toolfence",
        "decided_by": "identifier",
    },
    "toolfence_hosted_approval_events": {
        "approval_id": "toolfence", "from_state": "toolfence", "to_state": "toolfence",
        "decision_code": "toolfence", "actor": "identifier",
    },
}


def test_every_bounded_hosted_column__classified() -> None:
    # A bounded column added to a hosted table without saying how provider text is kept
    # within it fails here (decision 0191).
    for table in (hosted_calls, hosted_approvals, hosted_approval_events):
        bounded = {c.name for c in table.columns if isinstance(c.type, String) and c.type.length}
        assert bounded == set(HOSTED_COLUMNS[table.name]), table.name


def test_storable_key_and_text__fit_their_column() -> None:
    assert storable_key("a" * 64, 64) == "a" * 64
    assert storable_key("a" * 65, 64).startswith("h_") and len(storable_key("a" * 65, 64)) == 34
    assert storable_key("a\ud800", 64) == storable_key("a\ud800", 64) != storable_key("a\udfff", 64)
    assert storable_text("x\x00\ud800" * 20, 32) == ("x\ufffd?" * 20)[:32]
    assert storable_text(None, 32) is None
