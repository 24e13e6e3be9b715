"""An `mcp_approval_request` goes through toolfence's own approval flow, on SQLite and
PostgreSQL: `enqueue(hosted=...)` records a pending hosted approval bound to the
intent hash of (tenant, server label, tool, canonical arguments), the server's
ApproverPolicy decides who may approve it (the same `approver_refusal` as a tool's),
and `hosted_approval_responses` answers it with the Responses surface's own
`mcp_approval_response` item. A follow-up `mcp_call` citing an approval passes only
if toolfence granted that approval for that very call. Responses are built from
the official OpenAI SDK types.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from notekit import REGISTRY
from openai.types.responses import Response, ResponseInputItemParam
from pydantic import TypeAdapter
from sqlalchemy import Engine, select

from executor import store
from executor.cli.main import main
from executor.core.approvers import ApproverPolicy, ApproverRefusal
from executor.core.states import ApprovalState
from executor.core.types import ErrorCode, FailedTerminal, ServerContext
from executor.providers import openai_responses
from executor.providers.hosted import HostedPolicy, HostedServer, hosted_intent_hash
from executor.settings import Settings
from executor.store import engine as store_engine
from executor.store.schema import hosted_approvals, hosted_calls
from outbox.producer import EnqueueHandle, HostedCalls, NoApprovalResponse, enqueue, hosted_approval_responses
from outbox.results import results
from reconciler.sweep import Reconciler

ARGUMENTS = '{"customer_id": "c-42", "email": "new@example.com", "api_key": "sk-live-abcdefghijklmnop"}'
# The same object spelt differently: the intent hash is of canonical arguments.
ARGUMENTS_RESPELT = '{"api_key":"sk-live-abcdefghijklmnop","customer_id":"c-42","email":"new@example.com"}'
OTHER_ARGUMENTS = '{"customer_id": "c-43", "email": "new@example.com", "api_key": "sk-live-abcdefghijklmnop"}'
RESPONSES = openai_responses.SURFACE


POLICY = HostedPolicy(
    servers=(
        HostedServer(
            label="crm", url="https://crm.example/mcp",
            allowed_tools=frozenset({"lookup_customer", "update_customer"}),
            approval_required=frozenset({"update_customer"}),
            approvers=ApproverPolicy.for_roles("support-lead"),
        ),
    ),
    builtin_tools=frozenset(),
)

ALICE = ServerContext(principal="alice", tenant="acme", roles=frozenset({"support-lead"}), request_id="cli")
BOB = ServerContext(principal="bob", tenant="acme", roles=frozenset({"support-lead"}), request_id="cli")
CAROL_MEMBER = ServerContext(principal="carol", tenant="acme", roles=frozenset({"member"}), request_id="cli")
GLOBEX_LEAD = ServerContext(
    principal="gina", tenant="globex", roles=frozenset({"support-lead"}), request_id="cli"
)


def ctx(request_id: str) -> ServerContext:
    # The requester holds the approver role herself: only self-approval stops her.
    return ServerContext(
        principal="alice", tenant="acme", roles=frozenset({"support-lead"}), request_id=request_id
    )


def response_with(*items: dict[str, Any]) -> dict[str, Any]:
    """A Responses API `Response` (validated by the SDK's own model) carrying `items`."""
    return Response.model_validate({
        "id": "resp_1", "object": "response", "created_at": 1_700_000_000, "model": "gpt-test",
        "output": list(items), "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "status": "completed",
    }).to_dict()


def approval_request(
    item_id: str = "mcpr_1", tool: str = "update_customer", arguments: str = ARGUMENTS
) -> dict[str, Any]:
    return {"type": "mcp_approval_request", "id": item_id, "server_label": "crm", "name": tool,
            "arguments": arguments}


def mcp_call(
    approval_request_id: str | None, arguments: str = ARGUMENTS, item_id: str = "mcp_1"
) -> dict[str, Any]:
    return {"type": "mcp_call", "id": item_id, "server_label": "crm", "name": "update_customer",
            "arguments": arguments, "output": "updated", "status": "completed",
            "approval_request_id": approval_request_id}


def enqueue_response(
    engine: Engine, response: dict[str, Any], request_id: str, *, ttl: float = 3600.0
) -> EnqueueHandle:
    hosted = HostedCalls(openai_responses.read_hosted_calls(response), POLICY, approval_ttl_seconds=ttl)
    with engine.begin() as conn:
        return enqueue(
            conn, openai_responses.read_proposals(response), ctx(request_id), REGISTRY, hosted=hosted
        )


def the_approval(engine: Engine, request_id: str) -> store.HostedApprovalRecord:
    with engine.connect() as conn:
        [approval] = store.hosted_approvals_of_request(conn, "acme", request_id)
    return approval


def approve(engine: Engine, approval_id: str, approver: ServerContext) -> store.Decision:
    with engine.begin() as conn:
        return store.approve_hosted(
            conn, approval_id, approver=approver, approvers_for=POLICY.approvers_for
        )


def deny(engine: Engine, approval_id: str, approver: ServerContext, reason: str) -> store.Decision:
    with engine.begin() as conn:
        return store.deny_hosted(
            conn, approval_id, approver=approver, approvers_for=POLICY.approvers_for, reason=reason
        )


def answers(engine: Engine, request_id: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return hosted_approval_responses(conn, "acme", request_id, RESPONSES)


def trail(engine: Engine, approval_id: str) -> list[tuple[str | None, str, str, str | None]]:
    with engine.connect() as conn:
        return [
            (e.from_state, e.to_state, e.decision_code, e.actor)
            for e in store.hosted_approval_trail(conn, approval_id)
        ]


def as_sdk_input_item(item: dict[str, Any]) -> Any:
    return TypeAdapter(ResponseInputItemParam).validate_python(item)


def follow_up_violations(engine: Engine, request_id: str, *items: dict[str, Any]) -> list[FailedTerminal]:
    enqueue_response(engine, response_with(*items), request_id)
    return [s for s in results(engine, "acme", request_id) if isinstance(s, FailedTerminal)]


# ------------------------------------------------------------------ recording


def test_mcp_approval_request__enqueued__pending_hosted_approval_bound_to_intent_redacted_impact(
    engine: Engine,
) -> None:
    # Given a response in which the provider asks approval for crm's update_customer
    # When it is enqueued with the policy that routes update_customer to approval
    handle = enqueue_response(engine, response_with(approval_request()), "req-a1")
    # Then no call is reported (the request is within policy) ...
    assert handle.calls == ()
    # ... and one pending hosted approval waits, bound to tenant, server, tool, arguments
    approval = the_approval(engine, "req-a1")
    assert approval.approval_id.startswith("hapr_")
    assert approval.state is ApprovalState.PENDING
    assert (approval.approval_request_id, approval.server_label, approval.tool_name) == (
        "mcpr_1", "crm", "update_customer"
    )
    assert approval.intent_hash == hosted_intent_hash("acme", "crm", "update_customer", ARGUMENTS_RESPELT)
    assert approval.intent_hash != hosted_intent_hash("globex", "crm", "update_customer", ARGUMENTS)
    assert approval.requester["principal"] == "alice"
    assert approval.expires_at > approval.requested_at
    # ... whose impact shows the arguments with the secret redacted, stored nowhere raw
    assert approval.impact["tool"] == "update_customer"
    assert approval.impact["arguments"]["customer_id"] == "c-42"
    assert "sk-live" not in json.dumps(approval.impact)
    with engine.connect() as conn:
        stored = [dict(r._mapping) for r in conn.execute(select(hosted_approvals)).all()]
        stored += [dict(r._mapping) for r in conn.execute(select(hosted_calls)).all()]
    assert "sk-live" not in json.dumps(stored, default=str)
    assert trail(engine, approval.approval_id) == [(None, "pending", "requested", "alice")]
    # ... and nothing is answered while it is pending
    assert answers(engine, "req-a1") == []


def test_mcp_approval_request__same_response_again__one_approval_not_two(engine: Engine) -> None:
    enqueue_response(engine, response_with(approval_request()), "req-a2")
    first = the_approval(engine, "req-a2")
    enqueue_response(engine, response_with(approval_request()), "req-a2")
    assert the_approval(engine, "req-a2") == first


def test_mcp_approval_request__tool_not_routed_to_approval__violation_and_no_approval(
    engine: Engine,
) -> None:
    handle = enqueue_response(engine, response_with(approval_request(tool="lookup_customer")), "req-a3")
    [reported] = [c.status for c in handle.calls]
    assert isinstance(reported, FailedTerminal)
    assert reported.error.code is ErrorCode.HOSTED_CALL_NOT_ALLOWED
    with engine.connect() as conn:
        assert store.hosted_approvals_of_request(conn, "acme", "req-a3") == []


# ------------------------------------------------------------------ deciding


@pytest.mark.parametrize(
    ("approver", "refusal"),
    [
        pytest.param(ALICE, ApproverRefusal.SELF_APPROVAL, id="the-requester"),
        pytest.param(GLOBEX_LEAD, ApproverRefusal.OTHER_TENANT, id="another-tenant"),
        pytest.param(CAROL_MEMBER, ApproverRefusal.ROLE_NOT_ALLOWED, id="without-the-role"),
    ],
)
def test_hosted_approval__approver_the_server_policy_refuses__approver_not_allowed_audited_still_pending(
    engine: Engine, approver: ServerContext, refusal: ApproverRefusal
) -> None:
    enqueue_response(engine, response_with(approval_request()), "req-d1")
    approval = the_approval(engine, "req-d1")
    # When someone the crm server's ApproverPolicy does not allow approves it
    decision = approve(engine, approval.approval_id, approver)
    # Then it is refused with the stable reason, audited, and still pending
    assert decision.outcome is store.DecisionOutcome.APPROVER_NOT_ALLOWED
    assert decision.refusal is refusal
    assert decision.tool_name == store.HOSTED_APPROVAL_TOOL
    assert the_approval(engine, "req-d1").state is ApprovalState.PENDING
    assert trail(engine, approval.approval_id)[-1] == (
        "pending", "pending", ErrorCode.APPROVER_NOT_ALLOWED.value, approver.principal
    )
    assert answers(engine, "req-d1") == []
    # ... and an allowed approver still can, afterwards
    assert approve(engine, approval.approval_id, BOB).decided


def test_hosted_approval__allowed_approver__answered_approve_true_as_sdk_input_item_once(
    engine: Engine,
) -> None:
    enqueue_response(engine, response_with(approval_request()), "req-d2")
    approval = the_approval(engine, "req-d2")
    # When bob (support-lead of acme, not the requester) approves it
    decision = approve(engine, approval.approval_id, BOB)
    assert decision.decided
    # Then the Responses surface's answer is an mcp_approval_response with approve=true ...
    [item] = answers(engine, "req-d2")
    assert item == {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
    validated = as_sdk_input_item(item)
    assert (validated["type"], validated["approve"]) == ("mcp_approval_response", True)
    # ... single use: a second decision changes nothing, and answering again is the same item
    assert approve(engine, approval.approval_id, BOB).outcome is store.DecisionOutcome.NOT_PENDING
    assert deny(engine, approval.approval_id, BOB, "changed my mind").outcome is (
        store.DecisionOutcome.NOT_PENDING
    )
    assert answers(engine, "req-d2") == [item]
    decided = the_approval(engine, "req-d2")
    assert (decided.state, decided.decided_by) == (ApprovalState.APPROVED, "bob")
    assert trail(engine, approval.approval_id)[-1] == ("pending", "approved", "approved", "bob")


def test_hosted_approval__denied__answered_approve_false_with_the_reason(engine: Engine) -> None:
    enqueue_response(engine, response_with(approval_request()), "req-d3")
    approval = the_approval(engine, "req-d3")
    assert deny(engine, approval.approval_id, BOB, "not this customer").decided
    [item] = answers(engine, "req-d3")
    assert item == {"type": "mcp_approval_response", "approval_request_id": "mcpr_1",
                    "approve": False, "reason": "not this customer"}
    as_sdk_input_item(item)
    assert trail(engine, approval.approval_id)[-1] == (
        "pending", "denied", ErrorCode.APPROVAL_DENIED.value, "bob"
    )


def test_hosted_approval__requester_withdraws__denied(engine: Engine) -> None:
    enqueue_response(engine, response_with(approval_request()), "req-d4")
    approval = the_approval(engine, "req-d4")
    assert deny(engine, approval.approval_id, ALICE, "wrong customer").decided


def test_hosted_approval__server_no_longer_routes_the_tool__no_approver_policy(engine: Engine) -> None:
    enqueue_response(engine, response_with(approval_request()), "req-d5")
    approval = the_approval(engine, "req-d5")
    with engine.begin() as conn:
        decision = store.approve_hosted(
            conn, approval.approval_id, approver=BOB, approvers_for=lambda label, tool: None
        )
    assert decision.refusal is ApproverRefusal.NO_APPROVER_POLICY
    assert the_approval(engine, "req-d5").state is ApprovalState.PENDING


def test_hosted_approval__expired_by_the_store_sweep__answered_approve_false_cannot_be_approved(
    engine: Engine,
) -> None:
    # Given an approval whose time to decide is already over
    enqueue_response(engine, response_with(approval_request()), "req-d6", ttl=0.0)
    approval = the_approval(engine, "req-d6")
    # Then nobody can approve it any more, and the reconciler's sweep expires it
    assert approve(engine, approval.approval_id, BOB).outcome is store.DecisionOutcome.NOT_PENDING
    with engine.begin() as conn:
        assert approval.approval_id in store.expired_hosted_approvals(conn, 100)
        expire = store.expire_hosted_approval
        assert expire(conn, approval.approval_id, approver="reconciler", reason="expired")
        # A CAS on pending: a second (concurrent) reconciler changes nothing.
        assert not expire(conn, approval.approval_id, approver="reconciler", reason="expired")
    [item] = answers(engine, "req-d6")
    assert (item["approve"], item["reason"]) == (False, "approval expired")


def test_reconciler_sweep__hosted_approval_past_expiry__expired_and_answered_approve_false(
    engine: Engine, db_url: str
) -> None:
    enqueue_response(engine, response_with(approval_request()), "req-d8", ttl=0.0)
    enqueue_response(engine, response_with(approval_request("mcpr_live")), "req-d8b")
    approval = the_approval(engine, "req-d8")
    reconciler = Reconciler(Settings(database_url=db_url, broker_url="memory://"), engine, REGISTRY)
    # When the reconciler sweeps (twice: the second finds nothing left)
    report = reconciler.sweep()
    assert report.actions["hosted_approval_expired"] == 1
    assert "hosted_approval_expired" not in reconciler.sweep().actions
    # Then the overdue one is expired (audited, by the reconciler), the live one untouched
    assert the_approval(engine, "req-d8").state is ApprovalState.EXPIRED
    assert the_approval(engine, "req-d8b").state is ApprovalState.PENDING
    assert trail(engine, approval.approval_id)[-1] == ("pending", "expired", "approval_expired", "reconciler")
    [item] = answers(engine, "req-d8")
    assert item["approve"] is False


def test_hosted_approval_responses__surface_without_mcp_approvals__refused_clearly(engine: Engine) -> None:
    enqueue_response(engine, response_with(approval_request()), "req-d7")
    with engine.connect() as conn, pytest.raises(NoApprovalResponse, match="no MCP approval response"):
        hosted_approval_responses(conn, "acme", "req-d7", "anthropic")


# ------------------------------------------------------------------ the follow-up mcp_call


def test_follow_up_mcp_call__approval_id_toolfence_never_granted__hosted_call_not_allowed(
    engine: Engine,
) -> None:
    # Given a provider-run update_customer citing an approval toolfence never issued
    [reported] = follow_up_violations(engine, "req-f1", mcp_call("mcpr_forged"))
    assert reported.error.code is ErrorCode.HOSTED_CALL_NOT_ALLOWED
    assert [d.code for d in reported.error.details] == ["approval_not_granted"]


def test_follow_up_mcp_call__approval_still_pending_or_denied__hosted_call_not_allowed(
    engine: Engine,
) -> None:
    enqueue_response(engine, response_with(approval_request("mcpr_p")), "req-f2")
    [pending] = follow_up_violations(engine, "req-f2b", mcp_call("mcpr_p", item_id="mcp_p"))
    assert [d.code for d in pending.error.details] == ["approval_not_granted"]
    approval = the_approval(engine, "req-f2")
    assert deny(engine, approval.approval_id, BOB, "no").decided
    [denied] = follow_up_violations(engine, "req-f2c", mcp_call("mcpr_p", item_id="mcp_p2"))
    assert [d.code for d in denied.error.details] == ["approval_not_granted"]


def test_follow_up_mcp_call__granted_approval__allowed_only_for_the_approved_arguments(
    engine: Engine,
) -> None:
    enqueue_response(engine, response_with(approval_request("mcpr_g")), "req-f3")
    assert approve(engine, the_approval(engine, "req-f3").approval_id, BOB).decided
    # The same call, arguments spelt differently: within the approval
    assert follow_up_violations(
        engine, "req-f3b", mcp_call("mcpr_g", ARGUMENTS_RESPELT, item_id="mcp_ok")
    ) == []
    # Another customer under the same approval: not what was approved
    [other] = follow_up_violations(engine, "req-f3c", mcp_call("mcpr_g", OTHER_ARGUMENTS, item_id="mcp_x"))
    assert [d.code for d in other.error.details] == ["approval_intent_mismatch"]
    assert "c-43" not in other.model_dump_json()


def test_follow_up_mcp_call__another_tenants_granted_approval__not_granted_here(engine: Engine) -> None:
    enqueue_response(engine, response_with(approval_request("mcpr_t")), "req-f4")
    assert approve(engine, the_approval(engine, "req-f4").approval_id, BOB).decided
    globex = ServerContext(principal="gus", tenant="globex", roles=frozenset(), request_id="req-f4g")
    response = response_with(mcp_call("mcpr_t", item_id="mcp_t"))
    with engine.begin() as conn:
        handle = enqueue(
            conn, [], globex, REGISTRY,
            hosted=HostedCalls(openai_responses.read_hosted_calls(response), POLICY),
        )
    [reported] = [c.status for c in handle.calls]
    assert isinstance(reported, FailedTerminal)
    assert [d.code for d in reported.error.details] == ["approval_not_granted"]


# ------------------------------------------------------------------ the CLI


@pytest.fixture
def cli(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Callable[..., tuple[int, str, str]]]:
    """`toolfence` in process against this test's database, with TOOLFENCE_HOSTED_POLICY
    naming a policy whose crm server routes update_customer to support-leads."""
    for name in list(os.environ):
        if name.startswith("TOOLFENCE_"):
            monkeypatch.delenv(name)
    (tmp_path / "hosted_policy_for_approvals.py").write_text(
        "from executor import ApproverPolicy, HostedPolicy, HostedServer\n"
        "POLICY = HostedPolicy(servers=(HostedServer(label='crm', url='https://crm.example/mcp',"
        " allowed_tools=frozenset({'update_customer'}), approval_required=frozenset({'update_customer'}),"
        " approvers=ApproverPolicy.for_roles('support-lead')),), builtin_tools=frozenset())\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TOOLFENCE_HOME", str(tmp_path))
    monkeypatch.setenv("TOOLFENCE_DATABASE_URL", db_url)
    monkeypatch.setenv("TOOLFENCE_HOSTED_POLICY", "hosted_policy_for_approvals:POLICY")
    monkeypatch.setenv("TOOLFENCE_TOOLS", "ledger.tools:registry")
    engines: dict[str, Any] = {}
    monkeypatch.setattr(store_engine, "_engines", engines)

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    yield run
    for cached in engines.values():
        cached.dispose()


def who(principal: str, tenant: str = "acme", *roles: str) -> list[str]:
    argv = ["--approver-principal", principal, "--approver-tenant", tenant]
    for role in roles:
        argv += ["--approver-role", role]
    return argv


@pytest.mark.parametrize(
    ("verb", "approver", "outcome"),
    [
        pytest.param("approve", who("bob", "acme", "support-lead"), "approved", id="lead-approves"),
        pytest.param("deny", who("bob", "acme", "support-lead"), "denied", id="lead-denies"),
        pytest.param("approve", who("alice", "acme", "support-lead"), "self_approval", id="requester"),
        pytest.param("approve", who("gina", "globex", "support-lead"), "other_tenant", id="other-tenant"),
        pytest.param("approve", who("carol", "acme", "member"), "role_not_allowed", id="wrong-role"),
        pytest.param("deny", who("gina", "globex", "support-lead"), "other_tenant", id="other-tenant-denies"),
    ],
)
def test_cli__approvals_lists_hosted_with_impact__approve_or_deny_hapr_through_the_server_policy(
    engine: Engine, cli: Callable[..., tuple[int, str, str]], verb: str, approver: Sequence[str],
    outcome: str,
) -> None:
    enqueue_response(engine, response_with(approval_request()), "req-cli")
    code, out, _ = cli("approvals")
    assert code == 0
    [listed] = [row for row in json.loads(out) if row["approval_id"].startswith("hapr_")]
    assert listed["tool"] == store.HOSTED_APPROVAL_TOOL
    assert listed["impact"]["server_label"] == "crm"
    assert listed["impact"]["arguments"]["customer_id"] == "c-42"
    assert "sk-live" not in out
    approval_id = listed["approval_id"]

    extra = ["--reason", "not now"] if verb == "deny" else []
    code, out, err = cli(verb, approval_id, *approver, *extra)
    state = the_approval(engine, "req-cli").state
    if outcome in ("approved", "denied"):
        assert (code, out) == (0, f"{outcome} {approval_id}\n")
        assert state.value == outcome
        [item] = answers(engine, "req-cli")
        assert item["approve"] is (outcome == "approved")
        as_sdk_input_item(item)
    else:
        assert code != 0 and out == ""
        assert "approver_not_allowed" in err and outcome in err and "stays pending" in err
        assert state is ApprovalState.PENDING
        assert trail(engine, approval_id)[-1][2] == ErrorCode.APPROVER_NOT_ALLOWED.value


def test_cli__approve_unknown_hapr_id__one_line(cli: Callable[..., tuple[int, str, str]]) -> None:
    code, out, err = cli("approve", "hapr_nope", *who("bob", "acme", "support-lead"))
    assert code != 0 and out == ""
    assert err.splitlines() == ["toolfence: no approval 'hapr_nope'"]
