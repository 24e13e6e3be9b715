"""A turn's end is never silent, on real PostgreSQL and SQLite: the calls a provider
ran itself go through the application's hosted policy (recorded exactly as
`enqueue(hosted=...)` records them), a response the adapter refuses or the
provider paused ends with its reason, and a driver that can never answer ends
the turn `failed`.

The real `TurnRunner`, `OperationRunner` and reconciler run in this process
(`turnkit.drive`); tests/fleet/test_fleet_turn_ends.py runs the hosted case in
worker subprocesses with TOOLFENCE_HOSTED_POLICY.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine, func, select
from turnkit import asked, drive, write_script

from executor.core.approvers import ApproverPolicy
from executor.core.types import ServerContext
from executor.providers import SURFACES, encode_tool_name
from executor.providers.hosted import HostedPolicy, HostedServer
from executor.settings import Settings
from executor.store.schema import hosted_approvals, hosted_calls, operations
from executor.turns.drivers import DriverError
from executor.turns.service import get_turn, start_turn
from executor.turns.values import ModelRequest, ModelResponse, step_request_id
from ledger.service import Ledger
from ledger.tools import registry
from outbox.results import results

ALICE = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="turn")

CRM = HostedPolicy(
    servers=(HostedServer(
        label="crm", url="https://crm.example/mcp", allowed_tools=frozenset({"lookup", "update"}),
        approval_required=frozenset({"update"}), approvers=ApproverPolicy(roles=frozenset({"approver"})),
    ),),
    builtin_tools=frozenset({"web_search"}),
)


def start(engine: Engine, driver: str) -> str:
    with engine.begin() as conn:
        return start_turn(conn, ALICE, "conv-1", "Tidy up the CRM, then tell me.", driver=driver).turn_id


def view_of(engine: Engine, turn_id: str) -> dict[str, Any]:
    view = get_turn(engine, "acme", turn_id)
    assert view is not None
    return view


def hosted_rows(engine: Engine, turn_id: str, step: int = 1) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(
            select(hosted_calls).where(hosted_calls.c.request_id == step_request_id(turn_id, step))
            .order_by(hosted_calls.c.hosted_call_row_id)
        ))


def fallbacks(reason: str) -> float:
    return REGISTRY.get_sample_value("toolfence_turn_fallbacks_total", {"reason": reason}) or 0.0


def operations_of(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(operations)).scalar_one())


def responses(*output: dict[str, Any]) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "status": "completed", "output": list(output)}


def mcp_call(name: str, item_id: str = "mcp_1", **extra: Any) -> dict[str, Any]:
    return {"type": "mcp_call", "id": item_id, "server_label": "crm", "name": name, "arguments": "{}",
            "output": "ok", "status": "completed", **extra}


def text(message: str) -> dict[str, Any]:
    return {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": message, "annotations": []}]}


def balance_call() -> dict[str, Any]:
    name = encode_tool_name("ledger.get_balance", SURFACES["openai-responses"].name_rule)
    return {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": name,
            "arguments": '{"account_id": "acme-1"}', "status": "completed"}


# ------------------------------------------------------------------ hosted calls


def test_native_turn__mcp_call_outside_the_policy__recorded_refused_and_the_turn_ends_saying_so(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    # Given a native step in which the provider ran `delete_all` (no hosted policy: nothing may run)
    script = write_script(tmp_path / "turn.jsonl", [responses(mcp_call("delete_all"), text("All tidy."))])
    turn_id = start(engine, f"scripted+openai-responses:{script}")
    # When the turn runs
    state = drive(engine, settings, registry, turn_id)
    # Then it ends fallback, the reason stated, the provider's text not emitted as the answer
    view = view_of(engine, turn_id)
    assert (state, view["end_reason"]) == ("fallback", "hosted_call_not_allowed")
    assert view["final_output"] != "All tidy."
    assert view["error"]["code"] == "hosted_call_not_allowed" and view["error"]["calls"] == ["mcp_1"]
    # And the hosted call is recorded as enqueue(hosted=...) records it: refused, a failed call of the step
    [row] = hosted_rows(engine, turn_id)
    assert (row.kind, row.tool_name, row.allowed, row.code) == ("mcp_call", "delete_all", False,
                                                                 "hosted_call_not_allowed")
    [status] = results(engine, "acme", step_request_id(turn_id, 1))
    assert status.status == "failed_terminal" and status.error.code == "hosted_call_not_allowed"


def test_native_turn__refused_hosted_call_beside_proposals__none_of_the_proposals_is_enqueued(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    script = write_script(tmp_path / "turn.jsonl", [responses(mcp_call("delete_all"), balance_call())])
    turn_id = start(engine, f"scripted+openai-responses:{script}")
    assert drive(engine, settings, registry, turn_id, hosted_policy=CRM) == "fallback"
    view = view_of(engine, turn_id)
    assert view["end_reason"] == "hosted_call_not_allowed"
    assert view["steps"][0]["outcome"] == "tool_calls"
    assert operations_of(engine) == 0  # the response's own proposal never ran


def test_native_turn__hosted_call_within_the_policy__recorded_allowed_and_the_turn_goes_on(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    script = write_script(tmp_path / "turn.jsonl", [
        responses(mcp_call("lookup"), balance_call()),
        responses(text("acme-1 holds 100,000.00; the CRM entry is current.")),
    ])
    turn_id = start(engine, f"scripted+openai-responses:{script}")
    assert drive(engine, settings, registry, turn_id, hosted_policy=CRM) == "succeeded"
    view = view_of(engine, turn_id)
    assert view["final_output"] == "acme-1 holds 100,000.00; the CRM entry is current."
    [row] = hosted_rows(engine, turn_id)
    assert (row.tool_name, row.allowed, row.code) == ("lookup", True, None)
    assert [c["status"] for c in view["steps"][0]["calls"]] == ["succeeded"]
    assert asked(script) == {("turn", 1): 1, ("turn", 2): 1}


def test_native_turn__mcp_approval_request__approval_recorded_and_the_turn_ends_saying_so(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    request = {"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "crm", "name": "update",
               "arguments": '{"id": 7}'}
    script = write_script(tmp_path / "turn.jsonl", [responses(request)])
    turn_id = start(engine, f"scripted+openai-responses:{script}")
    assert drive(engine, settings, registry, turn_id, hosted_policy=CRM) == "fallback"
    view = view_of(engine, turn_id)
    assert view["end_reason"] == "hosted_approval_required"
    with engine.connect() as conn:
        [approval] = conn.execute(select(hosted_approvals)).all()
    assert (approval.approval_request_id, approval.tool_name) == ("mcpr_1", "update")
    assert approval.state == "pending"
    assert view["error"]["approvals"] == [approval.approval_id]
    [row] = hosted_rows(engine, turn_id)
    assert (row.kind, row.allowed) == ("mcp_approval_request", True)


def test_native_turn__approval_request_without_an_id__still_ends_the_turn_saying_so(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    # An approval request nobody can answer (no id) is not an empty success either:
    # an id that is no valid identifier cannot be recorded as an approval nor answered,
    # so the hosted policy refuses the request (decision 0191) and the turn says so
    request = {"type": "mcp_approval_request", "server_label": "crm", "name": "update", "arguments": "{}"}
    script = write_script(tmp_path / "turn.jsonl", [responses(request)])
    turn_id = start(engine, f"scripted+openai-responses:{script}")
    assert drive(engine, settings, registry, turn_id, hosted_policy=CRM) == "fallback"
    view = view_of(engine, turn_id)
    assert view["end_reason"] == "hosted_call_not_allowed"
    assert len(view["error"]["calls"]) == 1
    assert len(hosted_rows(engine, turn_id)) == 1


def test_native_turn__resumed_after_the_checkpoint__hosted_calls_recorded_once(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    # A step's hosted calls are written with its checkpoint: running the turn again
    # (a redelivered message) reads the step back and records nothing twice.
    script = write_script(tmp_path / "turn.jsonl", [responses(mcp_call("delete_all"), text("x"))])
    turn_id = start(engine, f"scripted+openai-responses:{script}")
    drive(engine, settings, registry, turn_id)
    drive(engine, settings, registry, turn_id)
    assert len(hosted_rows(engine, turn_id)) == 1
    assert asked(script) == {("turn", 1): 1}


# ------------------------------------------------------------------ refused and paused responses


def test_native_turn__cut_off_text__ends_response_refused_with_the_adapters_code(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    cut = {"choices": [{"finish_reason": "length", "message": {"role": "assistant", "content": "The bal"}}]}
    script = write_script(tmp_path / "turn.jsonl", [cut])
    turn_id = start(engine, f"scripted+openai-chat:{script}")
    assert drive(engine, settings, registry, turn_id) == "fallback"
    view = view_of(engine, turn_id)
    assert view["end_reason"] == "response_refused"
    assert (view["error"]["code"], view["error"]["source"]) == ("truncated_response", "provider")


def test_native_turn__anthropic_pause_turn__never_an_empty_success(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    # Given an Anthropic response paused mid-turn (a server tool still running), which the
    # scripted driver, like any driver that does not continue it, hands over as it came
    paused = {"role": "assistant", "stop_reason": "pause_turn", "content": [
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "rates"}}]}
    script = write_script(tmp_path / "turn.jsonl", [paused])
    turn_id = start(engine, f"scripted+anthropic:{script}")
    # Then the turn ends with the stated reason, and the provider-run search is recorded
    assert drive(engine, settings, registry, turn_id, hosted_policy=CRM) == "fallback"
    view = view_of(engine, turn_id)
    assert (view["end_reason"], view["error"]["code"]) == ("response_refused", "pause_turn")
    [row] = hosted_rows(engine, turn_id)
    assert (row.kind, row.tool_name, row.allowed) == ("server_tool_use", "web_search", True)


# ------------------------------------------------------------------ failed


def test_turn__driver_error_is_permanent__ends_failed(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    fallbacks_before = fallbacks("driver_failed")
    script = write_script(tmp_path / "turn.jsonl", [])  # no line for step 1: it can never answer
    turn_id = start(engine, f"scripted:{script}")
    assert drive(engine, settings, registry, turn_id) == "failed"
    # Counted with the turns that showed the fallback output: the fallback-rate alert sees it
    assert fallbacks("driver_failed") == fallbacks_before + 1
    view = view_of(engine, turn_id)
    assert view["end_reason"] == "driver_failed"
    assert (view["error"]["code"], view["error"]["retryable"]) == ("script_exhausted", False)
    assert view["final_output"] == "Sorry, I could not finish this request."
    assert asked(script) == {("turn", 1): 1}  # a permanent error is not tried again


def test_turn__unknown_driver_kind__ends_failed(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    turn_id = start(engine, "no-such-kind:model")
    assert drive(engine, settings, registry, turn_id) == "failed"
    view = view_of(engine, turn_id)
    assert (view["end_reason"], view["error"]["code"]) == ("driver_failed", "unknown_driver")


class _Flaky:
    mode = "json"

    def __init__(self) -> None:
        self.calls = 0

    def call(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        raise DriverError("provider_error", "APIConnectionError (status None)", retryable=True)


def test_turn__transient_driver_error_outlasts_the_attempts__ends_fallback(
    engine: Engine, settings: Settings, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # the attempts' backoff
    flaky = _Flaky()
    turn_id = start(engine, "openai-chat:gpt")
    assert drive(engine, settings, registry, turn_id, drivers=lambda spec: flaky) == "fallback"
    view = view_of(engine, turn_id)
    assert (view["end_reason"], view["error"]["code"], view["error"]["retryable"]) == (
        "driver_failed", "provider_error", True)
    assert flaky.calls == 3
