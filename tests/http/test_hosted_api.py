"""Hosted MCP approvals (`hapr_…`) through `toolfence serve`: an OpenAI Responses
envelope carrying an `mcp_approval_request` is posted, the approval is listed for
its tenant only and decided by the server's ApproverPolicy against the key's
principal, exactly as `toolfence approve` does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai.types.responses import Response
from servekit import Served, free_port, start_in_thread

from executor.core.approvers import ApproverPolicy
from executor.core.tools import Registry
from executor.http.keys import KeyScope
from executor.http.server import HttpSettings, create_app
from executor.providers.hosted import HostedPolicy, HostedServer
from executor.settings import Settings
from executor.store.engine import make_engine

POLICY = HostedPolicy(
    servers=(
        HostedServer(
            label="crm",
            url="https://crm.example/mcp",
            allowed_tools=frozenset({"update_customer"}),
            approval_required=frozenset({"update_customer"}),
            approvers=ApproverPolicy.for_roles("support-lead"),
        ),
    ),
    builtin_tools=frozenset(),
)


@pytest.fixture
def served_hosted(pg_url: str, tmp_path: Path) -> Iterator[Served]:
    settings = Settings(database_url=pg_url, broker_url=f"filesystem://{tmp_path / 'broker'}")
    engine = make_engine(pg_url)
    app = create_app(
        settings,
        Registry([]),
        engine=engine,
        hosted_policy=POLICY,
        http=HttpSettings(session_secret=b"s" * 32, rate_limit="10000/minute"),
    )
    port = free_port()
    server, thread = start_in_thread(app, port)
    yield Served(f"http://127.0.0.1:{port}", engine, settings)
    server.should_exit = True
    thread.join(timeout=10)
    engine.dispose()


def responses_envelope(**changes: str) -> dict[str, object]:
    request: dict[str, str] = {
        "type": "mcp_approval_request",
        "id": "mcpr_1",
        "server_label": "crm",
        "name": "update_customer",
        "arguments": '{"customer_id": "c-42"}',
    }
    return Response.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 1_700_000_000,
            "model": "gpt-test",
            "output": [request | changes],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "status": "completed",
        }
    ).to_dict()


def test_hosted_approval__posted_listed_decided__by_the_servers_policy(served_hosted: Served) -> None:
    served = served_hosted
    # Given alice's Responses envelope asking to approve a hosted MCP call
    alice = served.key("acme", "alice", KeyScope.PRODUCE, KeyScope.APPROVE, roles=("support-lead",))
    member = served.key("acme", "carol", KeyScope.APPROVE, roles=("member",))
    lead = served.key("acme", "bob", KeyScope.APPROVE, roles=("support-lead",))
    globex = served.key("globex", "gina", KeyScope.APPROVE, roles=("support-lead",))
    with served.client(alice) as client:
        posted = client.post(
            "/v1/requests", json={"provider": "openai-responses", "response": responses_envelope()}
        )
        assert posted.status_code == 202, posted.text
        # When the approvals are listed by acme and by globex
        [approval] = client.get("/v1/approvals").json()["approvals"]
        self_approved = client.post(f"/v1/approvals/{approval['approval_id']}/approve")
    with served.client(globex) as other, served.client(member) as carol, served.client(lead) as bob:
        theirs = other.get("/v1/approvals").json()["approvals"]
        foreign = other.post(f"/v1/approvals/{approval['approval_id']}/approve")
        wrong_role = carol.post(f"/v1/approvals/{approval['approval_id']}/approve")
        approved = bob.post(f"/v1/approvals/{approval['approval_id']}/approve")
    # Then acme sees its hosted approval (no operation), globex sees none and gets 404,
    # the requester and a member are refused by the server's policy, the lead approves
    assert approval["kind"] == "hosted" and approval["operation_id"] is None
    assert approval["approval_id"].startswith("hapr_") and approval["requester"] == "alice"
    assert theirs == [] and foreign.status_code == 404
    assert [self_approved.json()["errors"][0]["code"], wrong_role.json()["errors"][0]["code"]] == [
        "self_approval",
        "role_not_allowed",
    ]
    assert approved.status_code == 200, approved.text
    assert approved.json()["decided_by"] == "bob" and approved.json()["decision"] == "approved"
    with httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {lead}"}) as bob:
        assert bob.get("/v1/approvals").json()["approvals"] == []


@pytest.mark.parametrize(
    ("changes", "path", "code"),
    [
        pytest.param({"id": "mcpr_" + "x" * 196}, "item_id", "too_long", id="approval_id_201_chars"),
        pytest.param(
            {"arguments": "[" * 5000 + "]" * 5000}, "arguments", "too_deep", id="arguments_5000_deep"
        ),
        pytest.param({"arguments": '{"a": 1, "a": 2}'}, "arguments", "duplicate_key", id="duplicate_key"),
    ],
)
def test_hosted_approval_request__unrecordable_id_or_arguments__202_refused_not_500(
    served_hosted: Served, changes: dict[str, str], path: str, code: str
) -> None:
    served = served_hosted
    alice = served.key("acme", "alice", KeyScope.PRODUCE, KeyScope.APPROVE, roles=("support-lead",))
    # Given an envelope whose approval request toolfence cannot record as written (was:
    # 500 execution_failed on the long id, a plain-text 500 on the deep arguments)
    with served.client(alice) as client:
        posted = client.post(
            "/v1/requests", json={"provider": "openai-responses", "response": responses_envelope(**changes)}
        )
        listed = client.get("/v1/approvals").json()["approvals"]
    # Then the request is accepted and the approval request answered refused, with the
    # field and the problem; nothing waits for an approver
    assert posted.status_code == 202, posted.text
    [refused] = posted.json()["calls"]
    assert refused["status"] == "failed_terminal"
    assert refused["error"]["code"] == "hosted_call_not_allowed"
    assert [(d["path"], d["code"]) for d in refused["error"]["details"]] == [(path, code)]
    assert listed == []
