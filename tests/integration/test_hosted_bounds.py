"""The hosted path never loses the caller's data, on SQLite and PostgreSQL.

Every provider-written string of a hosted call that reaches a bounded column
(`String(n)`) is written at its column's limit and at limit + 1 through the public
path, `enqueue(..., hosted=...)` in the caller's own transaction, after the caller
wrote a row of its own: nothing raises, the caller's row and the proposal's call
commit, and the field is stored as written (at the limit) or refused / recorded
under a digest (past it). The same for what the database refuses whatever its
length (NUL, a lone surrogate) and for arguments too deep for `json.loads`
(`RecursionError`). Provider envelopes are built from the official SDK types and
read by the adapters, as a producer does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anthropic.types.beta as anthropic_beta
import pytest
from notekit import REGISTRY
from openai.types.responses import Response
from sqlalchemy import Engine, select, text

from executor import store
from executor.core.approvers import ApproverPolicy
from executor.core.identifiers import InvalidIdentifier
from executor.core.types import ErrorCode, FailedTerminal, Pending, ProposedCall, ServerContext
from executor.providers import anthropic_messages, openai_responses
from executor.providers.hosted import HostedCall, HostedPolicy, HostedServer
from executor.store.schema import hosted_approvals, hosted_calls
from outbox.producer import EnqueueHandle, HostedCalls, enqueue
from outbox.results import results

RESPONSES = openai_responses.SURFACE
DEEP = "[" * 5000 + "]" * 5000
ARGUMENTS = '{"customer_id": "c-42"}'


def policy(label: str = "crm", tool: str = "update_customer") -> HostedPolicy:
    return HostedPolicy(
        servers=(
            HostedServer(
                label=label, url="https://crm.example/mcp",
                allowed_tools=frozenset({tool, "lookup_customer"}),
                approval_required=frozenset({tool}),
                approvers=ApproverPolicy.for_roles("support-lead"),
            ),
        ),
        builtin_tools=frozenset({"web_search"}),
    )


def ctx(request_id: str) -> ServerContext:
    return ServerContext(
        principal="alice", tenant="acme", roles=frozenset({"support-lead"}), request_id=request_id
    )


@pytest.fixture
def caller(engine: Engine) -> Engine:
    """The producer's own business table, written in the same transaction as `enqueue`."""
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE business_rows (note TEXT NOT NULL)"))
    return engine


def enqueue_with_caller_row(
    engine: Engine, request_id: str, hosted: Sequence[HostedCall], hosted_policy: HostedPolicy
) -> EnqueueHandle:
    """The caller's row, a proposal and the hosted calls in one transaction, then commit.
    Any exception escaping `enqueue` fails the test (and would lose the caller's row)."""
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO business_rows VALUES (:note)"), {"note": request_id})
        handle = enqueue(
            conn, [ProposedCall(call_id="c1", tool_name="notes.read", arguments='{"text": "hi"}')],
            ctx(request_id), REGISTRY, hosted=HostedCalls(hosted, hosted_policy),
        )
        conn.execute(text("INSERT INTO business_rows VALUES (:note)"), {"note": request_id + "/after"})
    return handle


def assert_caller_data_committed(engine: Engine, request_id: str) -> None:
    with engine.connect() as conn:
        notes = conn.execute(
            text("SELECT note FROM business_rows WHERE note LIKE :p ORDER BY note"), {"p": request_id + "%"}
        ).scalars().all()
    assert notes == [request_id, request_id + "/after"]
    first = results(engine, "acme", request_id)[0]
    assert first.call_id == "c1" and isinstance(first, Pending)


def hosted_rows(engine: Engine, request_id: str) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(
            select(hosted_calls).where(hosted_calls.c.request_id == request_id)
            .order_by(hosted_calls.c.hosted_call_row_id)
        ).all())


def approvals_of(engine: Engine, request_id: str) -> list[store.HostedApprovalRecord]:
    with engine.connect() as conn:
        return store.hosted_approvals_of_request(conn, "acme", request_id)


def refusals(engine: Engine, request_id: str) -> list[FailedTerminal]:
    return [s for s in results(engine, "acme", request_id) if isinstance(s, FailedTerminal)]


def approval_request(**changes: Any) -> HostedCall:
    values: dict[str, Any] = {
        "surface": RESPONSES, "kind": "mcp_approval_request", "server_label": "crm",
        "tool_name": "update_customer", "arguments": ARGUMENTS, "item_id": "mcpr_1",
        "status": None, "output_digest": None,
    }
    return HostedCall(**(values | changes))


def mcp_call(**changes: Any) -> HostedCall:
    values: dict[str, Any] = {
        "surface": RESPONSES, "kind": "mcp_call", "server_label": "crm",
        "tool_name": "lookup_customer", "arguments": ARGUMENTS, "item_id": "mcp_1",
        "status": "completed", "output_digest": "0" * 64,
    }
    return HostedCall(**(values | changes))


# ----------------------------------------------------------------- every bounded field

# An approval request's id, server label and tool name go to `toolfence_hosted_approvals`
# (String(200) each) and the id is answered back to the provider: refused past the limit.
APPROVAL_FIELDS = [
    pytest.param("item_id", 200, id="approval_request_id-200"),
    pytest.param("server_label", 200, id="approval_server_label-200"),
    pytest.param("tool_name", 200, id="approval_tool_name-200"),
]


@pytest.mark.parametrize("over", [0, 1], ids=["at_limit", "limit_plus_1"])
@pytest.mark.parametrize(("field", "limit"), APPROVAL_FIELDS)
def test_approval_request_field__at_limit_and_limit_plus_1__caller_rows_survive(
    caller: Engine, field: str, limit: int, over: int
) -> None:
    value = "a" * (limit + over)
    request_id = f"req-{field}-{over}"
    hosted_policy = policy(
        label=value if field == "server_label" else "crm",
        tool=value if field == "tool_name" else "update_customer",
    )
    # Given an approval request whose field is `limit + over` characters, the policy
    # routing exactly that server and tool to approval
    # When it is enqueued after the caller's own row, in the caller's transaction
    enqueue_with_caller_row(caller, request_id, [approval_request(**{field: value})], hosted_policy)
    # Then the caller's rows and the proposal commit
    assert_caller_data_committed(caller, request_id)
    [row] = hosted_rows(caller, request_id)
    if over == 0:
        # At the limit: a pending approval, the field stored as the provider wrote it
        [approval] = approvals_of(caller, request_id)
        stored = {"item_id": approval.approval_request_id, "server_label": approval.server_label,
                  "tool_name": approval.tool_name}
        assert stored[field] == value and row.allowed is True
        assert refusals(caller, request_id) == []
    else:
        # Past it: refused with a stable code naming the field, nothing to approve
        assert approvals_of(caller, request_id) == []
        [refused] = refusals(caller, request_id)
        assert refused.error.code is ErrorCode.HOSTED_CALL_NOT_ALLOWED
        assert [(d.path, d.code) for d in refused.error.details] == [(field, "too_long")]
        assert row.allowed is False and row.code == ErrorCode.HOSTED_CALL_NOT_ALLOWED.value
        assert value not in refused.model_dump_json()


# What every other hosted-call field reaches: `toolfence_hosted_calls` (surface 32, kind
# 64, server label / tool / item id 200, status 32, output digest 64), the reported
# call's row (`toolfence_calls`: call id 200, tool name `hosted.<kind>` 200) and the
# approval lookup of an mcp_call's `approval_request_id`.
RECORDED_FIELDS = [
    pytest.param("surface", 32, "item_id", id="surface-32"),
    pytest.param("kind", 64, "item_id", id="kind-64"),
    pytest.param("kind", 64, None, id="kind-64-no_item_id"),
    pytest.param("server_label", 200, "item_id", id="server_label-200"),
    pytest.param("tool_name", 200, "item_id", id="tool_name-200"),
    pytest.param("item_id", 200, "item_id", id="item_id-200"),
    pytest.param("status", 32, "item_id", id="status-32"),
    pytest.param("output_digest", 64, "item_id", id="output_digest-64"),
    pytest.param("approval_request_id", 200, "item_id", id="approval_request_id-200"),
]


@pytest.mark.parametrize("over", [0, 1], ids=["at_limit", "limit_plus_1"])
@pytest.mark.parametrize(("field", "limit", "item"), RECORDED_FIELDS)
def test_hosted_call_field__at_limit_and_limit_plus_1__recorded_caller_rows_survive(
    caller: Engine, field: str, limit: int, item: str | None, over: int
) -> None:
    value = "b" * (limit + over)
    request_id = f"req-{field}-{item}-{over}"
    # Given an mcp_call the policy does not allow (so it is also reported as a call row
    # and every column is written), its field `limit + over` characters long; the
    # approval-request-id case calls a tool that needs an approval
    changes: dict[str, Any] = {field: value, "server_label": "not-declared"}
    if field == "server_label":
        changes["server_label"] = value
    if field == "approval_request_id":
        changes.update(server_label="crm", tool_name="update_customer")
    if item is None:
        changes["item_id"] = None
    # When it is enqueued after the caller's own row
    enqueue_with_caller_row(caller, request_id, [mcp_call(**changes)], policy())
    # Then the caller's rows commit and the call is recorded and reported, its text
    # stored within its column
    assert_caller_data_committed(caller, request_id)
    [row] = hosted_rows(caller, request_id)
    [refused] = refusals(caller, request_id)
    assert refused.error.code is ErrorCode.HOSTED_CALL_NOT_ALLOWED
    assert row.allowed is False and row.call_id == refused.call_id
    assert len(row.hosted_call_id) <= 200 and len(refused.call_id) <= 200
    assert len(refused.tool_name) <= 200
    stored = {
        "surface": row.surface, "kind": row.kind, "server_label": row.server_label,
        "tool_name": row.tool_name, "item_id": row.item_id, "status": row.status,
        "output_digest": row.output_digest,
    }
    if field in stored:
        assert len(stored[field]) <= limit
        if over == 0 and field != "output_digest":
            assert stored[field] == value
    if field == "approval_request_id":
        # An id longer than any recorded approval's was never granted
        assert [d.code for d in refused.error.details] == ["approval_not_granted"]


# ----------------------------------------------------------------- the adapters' envelopes


def responses_with(*items: dict[str, Any]) -> dict[str, Any]:
    return Response.model_validate({
        "id": "resp_1", "object": "response", "created_at": 1_700_000_000, "model": "gpt-test",
        "output": list(items), "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "status": "completed",
    }).to_dict()


def anthropic_with(*blocks: dict[str, Any]) -> dict[str, Any]:
    return anthropic_beta.BetaMessage.model_validate({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
        "content": list(blocks), "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }).to_dict()


@pytest.mark.parametrize("over", [0, 1], ids=["at_limit", "limit_plus_1"])
def test_responses_envelope__approval_request_id_past_200__refused_caller_rows_survive(
    caller: Engine, over: int
) -> None:
    # Given the Responses envelope of the issue: an mcp_approval_request whose id is
    # 200 + over characters, for a tool the policy routes to approval, and an mcp_call
    # citing it with a long id of its own
    long_id = "mcpr_" + "x" * (195 + over)
    envelope = responses_with(
        {"type": "mcp_approval_request", "id": long_id, "server_label": "crm",
         "name": "update_customer", "arguments": ARGUMENTS},
        {"type": "mcp_call", "id": "mcp_" + "y" * (196 + over), "server_label": "crm",
         "name": "update_customer", "arguments": ARGUMENTS, "output": "ok", "status": "completed",
         "approval_request_id": long_id},
    )
    request_id = f"req-envelope-{over}"
    # When the adapter's hosted calls are enqueued in the caller's transaction
    enqueue_with_caller_row(caller, request_id, openai_responses.read_hosted_calls(envelope), policy())
    # Then nothing raised, the caller's rows commit, both items are recorded
    assert_caller_data_committed(caller, request_id)
    assert len(hosted_rows(caller, request_id)) == 2
    codes = [[d.code for d in r.error.details] for r in refusals(caller, request_id)]
    if over == 0:
        # The approval is pending (never granted yet), so the call citing it is refused
        assert [a.approval_request_id for a in approvals_of(caller, request_id)] == [long_id]
        assert codes == [["approval_not_granted"]]
    else:
        assert approvals_of(caller, request_id) == []
        assert codes == [["too_long"], ["approval_not_granted"]]


def test_anthropic_envelope__mcp_tool_use_names_past_200__recorded_caller_rows_survive(
    caller: Engine,
) -> None:
    # Given an Anthropic MCP connector block whose id, server and tool names are 201
    # characters (what the policy never declares)
    envelope = anthropic_with(
        {"type": "mcp_tool_use", "id": "mcptoolu_" + "z" * 192, "name": "t" * 201,
         "server_name": "s" * 201, "input": {"a": 1}},
    )
    request_id = "req-anthropic"
    calls = anthropic_messages.read_hosted_calls(envelope)
    # When they are enqueued in the caller's transaction
    enqueue_with_caller_row(caller, request_id, calls, policy())
    # Then they are recorded within their columns and reported; the caller's rows commit
    assert_caller_data_committed(caller, request_id)
    [row] = hosted_rows(caller, request_id)
    assert (len(row.server_label), len(row.tool_name), len(row.item_id)) == (200, 200, 200)
    assert row.hosted_call_id.startswith("h_")
    [refused] = refusals(caller, request_id)
    assert refused.call_id == row.hosted_call_id


# ----------------------------------------------------------------- what no length fixes

UNSTORABLE = [
    pytest.param("mcpr_\ud800", "lone_surrogate", id="lone_surrogate"),
    pytest.param("mcpr_\x00", "nul", id="nul"),
    pytest.param("mcpr_\n1", "not_printable", id="line_break"),
]


@pytest.mark.parametrize(("approval_id", "problem"), UNSTORABLE)
def test_approval_request_id__unstorable__refused_with_the_problem_caller_rows_survive(
    caller: Engine, approval_id: str, problem: str
) -> None:
    # Given an approval request whose id holds what the database refuses (or what a
    # terminal would act on), within the policy
    request_id = f"req-id-{problem}"
    # When it is enqueued in the caller's transaction (was: UnicodeEncodeError, or a
    # database error rolling the transaction back)
    enqueue_with_caller_row(caller, request_id, [approval_request(item_id=approval_id)], policy())
    # Then it is refused naming the field and the problem; nothing to approve
    assert_caller_data_committed(caller, request_id)
    assert approvals_of(caller, request_id) == []
    [refused] = refusals(caller, request_id)
    assert [(d.path, d.code) for d in refused.error.details] == [("item_id", problem)]
    assert refused.call_id.startswith("h_")


HOSTILE_ARGUMENTS = [
    pytest.param(DEEP, "too_deep", id="deep_5000"),
    pytest.param('{"note": "\ud800"}', "not_utf8", id="raw_lone_surrogate"),
    pytest.param('{"note": "\\ud800"}', "not_utf8", id="escaped_lone_surrogate"),
    pytest.param('{"a": 1, "a": 2}', "duplicate_key", id="duplicate_key"),
    pytest.param('{"a": 1e400}', "non_finite", id="non_finite"),
    pytest.param('{"a": "' + "x" * 70_000 + '"}', "too_large", id="too_large"),
    pytest.param('{"a": ', "json_syntax", id="not_json"),
]


@pytest.mark.parametrize(("arguments", "code"), HOSTILE_ARGUMENTS)
def test_approval_request_arguments__strict_parse_refuses__stable_code_caller_rows_survive(
    caller: Engine, arguments: str, code: str
) -> None:
    # Given an approval request within the policy whose arguments a proposal's parse
    # gate would refuse
    request_id = f"req-args-{code}"
    # When it is enqueued (was: RecursionError, NotCanonicalizable escaping enqueue)
    enqueue_with_caller_row(caller, request_id, [approval_request(arguments=arguments)], policy())
    # Then it is refused with the strict parser's code: nothing to approve
    assert_caller_data_committed(caller, request_id)
    assert approvals_of(caller, request_id) == []
    [refused] = refusals(caller, request_id)
    assert [(d.path, d.code) for d in refused.error.details] == [("arguments", code)]


@pytest.mark.parametrize("arguments", ["", "  "], ids=["empty", "blank"])
def test_approval_request_arguments__blank__read_as_no_arguments_like_a_proposal(
    caller: Engine, arguments: str
) -> None:
    request_id = f"req-blank-{len(arguments)}"
    enqueue_with_caller_row(caller, request_id, [approval_request(arguments=arguments)], policy())
    [approval] = approvals_of(caller, request_id)
    assert approval.impact["arguments"] == {}


def grant(engine: Engine, request_id: str) -> None:
    """Record `mcpr_1` for update_customer with ARGUMENTS and have bob approve it."""
    enqueue_with_caller_row(engine, request_id, [approval_request()], policy())
    [approval] = approvals_of(engine, request_id)
    bob = ServerContext(principal="bob", tenant="acme", roles=frozenset({"support-lead"}), request_id="cli")
    with engine.begin() as conn:
        decided = store.approve_hosted(
            conn, approval.approval_id, approver=bob, approvers_for=policy().approvers_for
        )
    assert decided.outcome is store.DecisionOutcome.DECIDED


@pytest.mark.parametrize(
    ("arguments", "approval_request_id", "code"),
    [
        pytest.param(DEEP, "mcpr_1", "approval_intent_mismatch", id="deep_arguments"),
        pytest.param('{"note": "\ud800"}', "mcpr_1", "approval_intent_mismatch", id="surrogate_arguments"),
        pytest.param(ARGUMENTS, "mcpr_\ud800", "approval_not_granted", id="surrogate_approval_id"),
        pytest.param(ARGUMENTS, "mcpr_\x00", "approval_not_granted", id="nul_approval_id"),
        pytest.param(ARGUMENTS, "m" * 201, "approval_not_granted", id="overlong_approval_id"),
        pytest.param(ARGUMENTS, "mcpr_1", None, id="the_granted_call"),
    ],
)
def test_mcp_call_under_a_granted_approval__hostile_arguments_or_id__refused_never_raises(
    caller: Engine, arguments: str, approval_request_id: str, code: str | None
) -> None:
    # Given an approval toolfence granted for mcpr_1 with ARGUMENTS
    grant(caller, "req-granted")
    request_id = f"req-follow-{code}-{len(arguments)}-{len(approval_request_id)}"
    # When an mcp_call citing an approval id, with hostile arguments or a hostile id, is
    # enqueued (was: RecursionError, UnicodeEncodeError, a database error)
    call = mcp_call(tool_name="update_customer", arguments=arguments, approval_request_id=approval_request_id)
    enqueue_with_caller_row(caller, request_id, [call], policy())
    # Then the caller's rows commit and the call is refused with a stable code (only
    # the very call approved passes)
    assert_caller_data_committed(caller, request_id)
    found = [[d.code for d in r.error.details] for r in refusals(caller, request_id)]
    assert found == ([] if code is None else [[code]])


def test_record_hosted_approval__unstorable_names__invalid_identifier_nothing_written(
    caller: Engine,
) -> None:
    # Given the store's own entry point called with an overlong provider id
    with caller.begin() as conn:
        conn.execute(text("INSERT INTO business_rows VALUES ('direct')"))
        with pytest.raises(InvalidIdentifier) as raised:
            store.record_hosted_approval(
                conn, tenant="acme", request_id="r", approval_request_id="x" * 201,
                surface=RESPONSES, server_label="crm", tool_name="update_customer",
                intent_hash="0" * 64, impact={}, requester=ctx("r"), ttl_seconds=60.0,
            )
    # Then it is refused before any write, naming the field: the caller's row commits
    assert raised.value.field.value == "approval_request_id"
    with caller.connect() as conn:
        assert conn.execute(select(hosted_approvals)).all() == []
        assert conn.execute(text("SELECT note FROM business_rows")).scalars().all() == ["direct"]


@pytest.mark.parametrize("item_id", ["mcp_\x00\ud800\n", None], ids=["hostile_item_id", "no_item_id"])
def test_hosted_call__every_text_field_hostile__recorded_and_reported_caller_rows_survive(
    caller: Engine, item_id: str | None
) -> None:
    # Given a hosted call (as an adapter reading an unknown item type might build it)
    # whose every text holds a NUL, a lone surrogate and a line break, past its column
    hostile = "\x00\ud800\n" * 100
    call = HostedCall(
        surface="s" + hostile, kind="k" + hostile, server_label=hostile, tool_name=hostile,
        arguments=hostile, item_id=item_id, status=hostile, output_digest=hostile,
        approval_request_id=hostile,
    )
    request_id = f"req-hostile-{item_id is None}"
    # When it is enqueued twice in the caller's transactions (was: UnicodeEncodeError
    # on the key and the reported tool name)
    enqueue_with_caller_row(caller, request_id, [call], policy())
    with caller.begin() as conn:
        again = enqueue(conn, [], ctx(request_id), REGISTRY, hosted=HostedCalls([call], policy()))
    # Then it is recorded once and reported under identifiers, the same answer both times
    assert_caller_data_committed(caller, request_id)
    [row] = hosted_rows(caller, request_id)
    [refused] = refusals(caller, request_id)
    assert [h.call_id for h in again.calls] == [refused.call_id] == [row.call_id]
    for value in (refused.call_id, refused.tool_name, row.hosted_call_id):
        assert value.isprintable() and "\x00" not in value and len(value) <= 200
        value.encode("utf-8")


@pytest.mark.parametrize("tool", ["delete_all", "\x1f"], ids=["outside_the_policy", "unprintable"])
def test_approval_request_flagged_as_result__never_recorded_as_an_approval(caller: Engine, tool: str) -> None:
    # Given an mcp_approval_request a caller built as a result item (results are not
    # checked against the policy), naming a tool the policy does not route to approval
    request_id = f"req-result-approval-{tool.isprintable()}"
    call = approval_request(tool_name=tool, is_result=True)
    # When it is enqueued (was: a pending approval outside the policy, or, with a name
    # no column holds, an error out of enqueue)
    enqueue_with_caller_row(caller, request_id, [call], policy())
    # Then it is recorded as a reported run only: nothing to approve
    assert_caller_data_committed(caller, request_id)
    assert approvals_of(caller, request_id) == []
    [row] = hosted_rows(caller, request_id)
    assert row.allowed is None
