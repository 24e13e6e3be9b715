"""Hosted calls are read, never silent: every provider-run item becomes a
`HostedCall`, and a call outside the application's `HostedPolicy` is reported
as `hosted_call_not_allowed`. Responses are built with each SDK's own types.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import anthropic.types.beta as anthropic_beta
import pytest
from adapter_testkit import Call, assert_keys_within, openai_responses_response, validate_typed
from google.genai import interactions as genai_interactions
from google.genai import types as genai_types
from openai.types.responses import Response, ResponseInputItemParam, ToolParam
from openai.types.responses import Tool as ResponsesTool
from openai.types.responses.response_input_item_param import McpApprovalResponse

from executor.core.approvers import ApproverPolicy
from executor.core.canonical import canonical_json
from executor.core.types import ErrorCode
from executor.providers import (
    NO_HOSTED_TOOLS,
    SURFACES,
    HostedCall,
    HostedPolicy,
    HostedServer,
    anthropic_messages,
    gemini_generate,
    gemini_interactions,
    hosted_violations,
    openai_chat,
    openai_responses,
)
from executor.providers.common import AdapterError
from executor.providers.hosted import GrantedApprovals, hosted_intent_hash

SECRET_OUTPUT = "ssn 078-05-1120 of every customer"

POLICY = HostedPolicy(
    servers=(
        HostedServer(
            label="crm", url="https://crm.example/mcp",
            allowed_tools=frozenset({"lookup_customer", "update_customer"}),
            approval_required=frozenset({"update_customer"}),
            approvers=ApproverPolicy.for_roles("support-lead"),
        ),
    ),
    builtin_tools=frozenset({"web_search", "code_execution"}),
)


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


def _codes(calls: list[HostedCall], policy: HostedPolicy = POLICY) -> list[tuple[str | None, ErrorCode]]:
    return [(v.call.tool_name, v.error.code) for v in hosted_violations(calls, policy)]


# ---------------------------------------------------------------- OpenAI Responses


def _mcp_call(name: str, *, approval_request_id: str | None = None, label: str = "crm") -> dict[str, Any]:
    return {
        "type": "mcp_call", "id": f"mcp_{name}", "server_label": label, "name": name,
        "arguments": '{"scope":"all"}', "output": SECRET_OUTPUT, "status": "completed",
        "approval_request_id": approval_request_id,
    }


def _responses(*items: dict[str, Any]) -> dict[str, Any]:
    response = openai_responses_response([], extra_items=items)
    return Response.model_validate(response).to_dict()


def test_responses__mcp_call_to_a_tool_never_allowed__reported_not_silent() -> None:
    # Given the case: the provider ran delete_all on an MCP server
    response = _responses(_mcp_call("delete_all"))
    # When read
    proposals = openai_responses.read_proposals(response)
    calls = openai_responses.read_hosted_calls(response)
    # Then it is no proposal (toolfence did not run it), but it is read and reported
    assert proposals == []
    assert calls == [
        HostedCall(
            surface="openai-responses", kind="mcp_call", server_label="crm",
            tool_name="delete_all", arguments='{"scope":"all"}', item_id="mcp_delete_all",
            status="completed", output_digest=_digest(SECRET_OUTPUT),
        )
    ]
    assert _codes(calls) == [("delete_all", ErrorCode.HOSTED_CALL_NOT_ALLOWED)]
    assert _codes(calls, NO_HOSTED_TOOLS) == [("delete_all", ErrorCode.HOSTED_CALL_NOT_ALLOWED)]


def test_responses__every_hosted_item_kind__read_with_a_digest_never_the_output() -> None:
    response = _responses(
        _mcp_call("lookup_customer"),
        {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "crm",
         "tools": [{"name": "lookup_customer", "input_schema": {"type": "object"}}]},
        {"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "crm",
         "name": "update_customer", "arguments": '{"id":"c-1"}'},
        {"type": "web_search_call", "id": "ws_1", "status": "completed",
         "action": {"type": "search", "query": "weather"}},
        {"type": "file_search_call", "id": "fs_1", "status": "completed",
         "queries": ["refund policy"], "results": None},
        {"type": "code_interpreter_call", "id": "ci_1", "status": "completed",
         "code": "print(1)", "container_id": "cntr_1",
         "outputs": [{"type": "logs", "logs": SECRET_OUTPUT}]},
    )

    calls = openai_responses.read_hosted_calls(response)

    assert [(c.kind, c.server_label, c.tool_name, c.item_id) for c in calls] == [
        ("mcp_call", "crm", "lookup_customer", "mcp_lookup_customer"),
        ("mcp_list_tools", "crm", None, "mcpl_1"),
        ("mcp_approval_request", "crm", "update_customer", "mcpr_1"),
        ("web_search_call", None, "web_search", "ws_1"),
        ("file_search_call", None, "file_search", "fs_1"),
        ("code_interpreter_call", None, "code_interpreter", "ci_1"),
    ]
    assert calls[5].output_digest == _digest([{"type": "logs", "logs": SECRET_OUTPUT}])
    assert SECRET_OUTPUT not in repr(calls)
    # The policy allows the crm lookup, the listing, the approval request and web
    # search; file search and the code interpreter it never named.
    assert _codes(calls) == [
        ("file_search", ErrorCode.HOSTED_CALL_NOT_ALLOWED),
        ("code_interpreter", ErrorCode.HOSTED_CALL_NOT_ALLOWED),
    ]


def test_responses__approval_routed_tool__runs_only_under_an_approval() -> None:
    without = openai_responses.read_hosted_calls(_responses(_mcp_call("update_customer")))
    approved = openai_responses.read_hosted_calls(
        _responses(_mcp_call("update_customer", approval_request_id="mcpr_1"))
    )
    assert [v.error.details[0].code for v in hosted_violations(without, POLICY)] == ["approval_missing"]
    assert hosted_violations(approved, POLICY) == []


def test_responses__approval_request_for_a_tool_not_routed_to_approval__reported() -> None:
    response = _responses(
        {"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "crm",
         "name": "lookup_customer", "arguments": "{}"},
    )
    assert openai_responses.read_proposals(response) == []  # no longer refused
    [call] = openai_responses.read_hosted_calls(response)
    assert call.kind == "mcp_approval_request"
    assert _codes([call]) == [("lookup_customer", ErrorCode.HOSTED_CALL_NOT_ALLOWED)]


def test_responses__unknown_server__reported_without_quoting_its_label() -> None:
    [call] = openai_responses.read_hosted_calls(_responses(_mcp_call("lookup_customer", label="evil")))
    [violation] = hosted_violations([call], POLICY)
    assert violation.error.details[0].path == "server_label"
    assert "evil" not in violation.error.model_dump_json()


@pytest.mark.parametrize("approve", [True, False])
def test_write_approval_response__valid_sdk_input_item(approve: bool) -> None:
    item = openai_responses.write_approval_response("mcpr_1", approve=approve, reason="policy")

    validate_typed(ResponseInputItemParam, item)
    assert_keys_within(item, McpApprovalResponse, {"type", "approval_request_id", "approve"})
    assert item == {
        "type": "mcp_approval_response", "approval_request_id": "mcpr_1",
        "approve": approve, "reason": "policy",
    }


def test_write_approval_response__no_request_id__refused() -> None:
    with pytest.raises(AdapterError):
        openai_responses.write_approval_response(" ", approve=True)


def test_export_mcp_tools__valid_sdk_tools_from_the_same_declaration() -> None:
    [entry] = openai_responses.export_mcp_tools(POLICY)

    validate_typed(ToolParam, entry)
    validate_typed(ResponsesTool, entry)
    assert entry["allowed_tools"] == ["lookup_customer", "update_customer"]
    assert entry["require_approval"] == {
        "always": {"tool_names": ["update_customer"]},
        "never": {"tool_names": ["lookup_customer"]},
    }
    # What the request allows without approval is what the check lets through.
    for tool_name in entry["require_approval"]["never"]["tool_names"]:
        assert hosted_violations(
            openai_responses.read_hosted_calls(_responses(_mcp_call(tool_name))), POLICY
        ) == []


# ---------------------------------------------------------------- Anthropic Messages


def _anthropic(*blocks: dict[str, Any]) -> dict[str, Any]:
    message = anthropic_beta.BetaMessage.model_validate(
        {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
            "content": [{"type": "text", "text": "Checking."}, *blocks],
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 10},
        }
    )
    return message.to_dict()


def test_anthropic__mcp_and_server_tool_blocks__read_results_paired_with_their_use() -> None:
    response = _anthropic(
        {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "delete_all",
         "server_name": "crm", "input": {"scope": "all"}},
        {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "is_error": False,
         "content": [{"type": "text", "text": SECRET_OUTPUT}]},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
         "input": {"query": "weather"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
         "content": {"type": "web_search_tool_result_error", "error_code": "unavailable"}},
    )

    assert anthropic_messages.read_proposals(response) == []
    calls = anthropic_messages.read_hosted_calls(response)

    assert [(c.kind, c.server_label, c.tool_name, c.item_id, c.status, c.is_result) for c in calls] == [
        ("mcp_tool_use", "crm", "delete_all", "mcptoolu_1", None, False),
        ("mcp_tool_result", "crm", "delete_all", "mcptoolu_1", "completed", True),
        ("server_tool_use", None, "web_search", "srvtoolu_1", None, False),
        ("web_search_tool_result", None, "web_search", "srvtoolu_1", "error", True),
    ]
    assert calls[0].arguments == '{"scope":"all"}'
    assert calls[1].output_digest == _digest([{"type": "text", "text": SECRET_OUTPUT}])
    assert SECRET_OUTPUT not in repr(calls)
    # Reported once, at the use: the result only says what already happened.
    assert _codes(calls) == [("delete_all", ErrorCode.HOSTED_CALL_NOT_ALLOWED)]


def test_anthropic__mcp_tool_needing_approval__reported_the_connector_cannot_ask() -> None:
    calls = anthropic_messages.read_hosted_calls(
        _anthropic({"type": "mcp_tool_use", "id": "m1", "name": "update_customer",
                    "server_name": "crm", "input": {}})
    )
    assert [v.error.details[0].code for v in hosted_violations(calls, POLICY)] == ["approval_missing"]


def test_export_mcp_servers__valid_sdk_param__only_tools_needing_no_approval_enabled() -> None:
    [server] = anthropic_messages.export_mcp_servers(POLICY)

    validate_typed(anthropic_beta.BetaRequestMCPServerURLDefinitionParam, server)
    assert_keys_within(
        server, anthropic_beta.BetaRequestMCPServerURLDefinitionParam, {"type", "url", "name"}
    )
    assert server["name"] == "crm"
    assert server["tool_configuration"] == {"enabled": True, "allowed_tools": ["lookup_customer"]}


# ---------------------------------------------------------------- Gemini


@pytest.mark.parametrize("spelling", ["camel", "snake"])
def test_gemini__code_execution_parts__read_as_the_builtin_tool(spelling: str) -> None:
    response = genai_types.GenerateContentResponse.model_validate(
        {"candidates": [{"content": {"role": "model", "parts": [
            {"executableCode": {"language": "PYTHON", "code": "print(1)"}},
            {"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": SECRET_OUTPUT}},
        ]}, "finishReason": "STOP"}]}
    ).model_dump(mode="json", exclude_none=True, by_alias=spelling == "camel")

    calls = gemini_generate.read_hosted_calls(response)

    assert [(c.kind, c.tool_name, c.status, c.is_result) for c in calls] == [
        ("executable_code", "code_execution", None, False),
        ("code_execution_result", "code_execution", "OUTCOME_OK", True),
    ]
    assert json.loads(calls[0].arguments or "") == {"language": "PYTHON", "code": "print(1)"}
    assert calls[1].output_digest == _digest(SECRET_OUTPUT)
    assert _codes(calls) == []
    assert _codes(calls, NO_HOSTED_TOOLS) == [("code_execution", ErrorCode.HOSTED_CALL_NOT_ALLOWED)]


def test_interactions__server_steps__read_mcp_and_builtin() -> None:
    interaction = genai_interactions.Interaction.model_validate(
        {"id": "int_1", "status": "completed", "steps": [
            {"type": "mcp_server_tool_call", "id": "s1", "name": "delete_all",
             "server_name": "crm", "arguments": {"scope": "all"}},
            {"type": "mcp_server_tool_result", "call_id": "s1", "name": "delete_all",
             "server_name": "crm", "result": SECRET_OUTPUT},
            {"type": "google_search_call", "id": "g1", "arguments": {"queries": ["weather"]}},
        ]}
    ).model_dump(mode="json", exclude_none=True)

    calls = gemini_interactions.read_hosted_calls(interaction)

    assert [(c.kind, c.server_label, c.tool_name, c.item_id, c.is_result) for c in calls] == [
        ("mcp_server_tool_call", "crm", "delete_all", "s1", False),
        ("mcp_server_tool_result", "crm", "delete_all", "s1", True),
        ("google_search_call", None, "google_search", "g1", False),
    ]
    assert _codes(calls) == [
        ("delete_all", ErrorCode.HOSTED_CALL_NOT_ALLOWED),
        ("google_search", ErrorCode.HOSTED_CALL_NOT_ALLOWED),
    ]


# ---------------------------------------------------------------- every surface


def test_every_surface__reads_hosted_calls__chat_runs_none() -> None:
    assert all(callable(surface.read_hosted_calls) for surface in SURFACES.values())
    chat = openai_chat.read_hosted_calls({"choices": []})
    assert chat == []


def test_hosted_call_not_allowed__a_stable_error_code() -> None:
    assert ErrorCode.HOSTED_CALL_NOT_ALLOWED.value == "hosted_call_not_allowed"


def test_policy__approval_outside_allowed_or_duplicate_label__refused_at_declaration() -> None:
    with pytest.raises(ValueError):
        HostedServer(label="crm", url="u", allowed_tools=frozenset(), approval_required=frozenset({"x"}))
    server = POLICY.servers[0]
    with pytest.raises(ValueError):
        HostedPolicy(servers=(server, server), builtin_tools=frozenset())


def test_responses__function_call_beside_hosted_items__still_proposed() -> None:
    response = openai_responses_response(
        [Call("call_1", "get_weather", "{}")], extra_items=[_mcp_call("lookup_customer")]
    )
    assert [p.call_id for p in openai_responses.read_proposals(response)] == ["call_1"]
    assert [c.kind for c in openai_responses.read_hosted_calls(response)] == ["mcp_call"]


# ---------------------------------------------------------------- hosted approvals


def test_policy__approval_required_without_approvers__refused_at_declaration() -> None:
    with pytest.raises(ValueError, match="must declare approvers"):
        HostedServer(
            label="crm", url="u", allowed_tools=frozenset({"x"}), approval_required=frozenset({"x"})
        )
    with pytest.raises(ValueError, match="no role and no rule"):
        HostedServer(
            label="crm", url="u", allowed_tools=frozenset({"x"}), approval_required=frozenset({"x"}),
            approvers=ApproverPolicy(roles=frozenset()),
        )
    # No tool routed to approval: nobody decides anything, so none is needed.
    HostedServer(label="crm", url="u", allowed_tools=frozenset({"x"}), approval_required=frozenset())


def test_policy__approvers_for__only_a_declared_server_routing_that_tool_to_approval() -> None:
    assert POLICY.approvers_for("crm", "update_customer") == ApproverPolicy.for_roles("support-lead")
    assert POLICY.approvers_for("crm", "lookup_customer") is None
    assert POLICY.approvers_for("billing", "update_customer") is None


def test_hosted_intent_hash__canonical_arguments__bound_to_tenant_server_tool_and_arguments() -> None:
    base = hosted_intent_hash("acme", "crm", "update_customer", '{"a": 1, "b": [2]}')
    assert base == hosted_intent_hash("acme", "crm", "update_customer", '{"b":[2],"a":1}')
    assert len({
        base,
        hosted_intent_hash("globex", "crm", "update_customer", '{"a": 1, "b": [2]}'),
        hosted_intent_hash("acme", "billing", "update_customer", '{"a": 1, "b": [2]}'),
        hosted_intent_hash("acme", "crm", "lookup_customer", '{"a": 1, "b": [2]}'),
        hosted_intent_hash("acme", "crm", "update_customer", '{"a": 2, "b": [2]}'),
        hosted_intent_hash("acme", "crm", "update_customer", "not json"),
        hosted_intent_hash("acme", "crm", "update_customer", None),
    }) == 7


def test_mcp_call_citing_an_approval__checked_against_what_toolfence_granted() -> None:
    response = _responses(_mcp_call("update_customer", approval_request_id="mcpr_1"))
    [call] = openai_responses.read_hosted_calls(response)
    intent = hosted_intent_hash("acme", "crm", "update_customer", call.arguments)

    def codes(granted: GrantedApprovals) -> list[str]:
        return [v.error.details[0].code for v in hosted_violations([call], POLICY, granted)]

    assert codes(GrantedApprovals("acme", {})) == ["approval_not_granted"]
    assert codes(GrantedApprovals("acme", {"mcpr_other": intent})) == ["approval_not_granted"]
    assert codes(GrantedApprovals("acme", {"mcpr_1": "0" * 64})) == ["approval_intent_mismatch"]
    assert codes(GrantedApprovals("globex", {"mcpr_1": intent})) == ["approval_intent_mismatch"]
    assert codes(GrantedApprovals("acme", {"mcpr_1": intent})) == []
    # A tool that needs no approval is not affected by what was granted.
    [lookup] = openai_responses.read_hosted_calls(_responses(_mcp_call("lookup_customer")))
    assert hosted_violations([lookup], POLICY, GrantedApprovals("acme", {})) == []
