"""Turn surfaces on real PostgreSQL and SQLite: the catalog, the card rule, listed targets.

The turn job, the operations' worker and the reconciler run in this process
(`turnkit.drive`) against the reference ledger and the scripted driver; the
fleet tests (tests/fleet/test_fleet_turn_surfaces.py) run the same in worker
subprocesses. Each safety promise is checked at both places: admission (the
turn's step) and the worker, on the context stored with the operation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine, select
from turnkit import Recording, calls, drive, write_script

from executor import store
from executor.core.approvers import ApproverPolicy
from executor.core.surfaces import (
    CARD_INSTRUCTIONS,
    READ_ONLY_INSTRUCTIONS,
    TurnSurface,
    UnknownSurface,
    Writes,
)
from executor.core.tools import Access, Approval, Mode, Registry, Tool
from executor.core.types import ErrorCode, ProposedCall, ServerContext
from executor.settings import Settings
from executor.store.schema import operations, turn_steps
from executor.turns.loop import CARD_HEADER
from executor.turns.service import get_turn, start_turn
from executor.turns.targets import open_items
from executor.worker.runner import OperationRunner
from ledger import tools as ledger_tools
from ledger.service import Ledger
from outbox.producer import enqueue
from outbox.results import results

ALICE = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="turn")
MALLORY = ServerContext(principal="mallory", tenant="acme", roles=frozenset({"member"}), request_id="m")
APPROVER = ServerContext(principal="bob", tenant="acme", roles=frozenset({"approver"}), request_id="ap")

SEEN: list[str] = []
"""What the describe tool's access rule was asked about: a listed target is checked first."""


class OperationArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    operation_id: str


class Described(BaseModel):
    operation_id: str


def _seen_rule(args: OperationArgs, ctx: ServerContext) -> bool:
    SEEN.append(args.operation_id)
    return True


describe: Tool[OperationArgs] = Tool(
    name="cards.describe",
    description="Describe one of the requester's listed operations.",
    mode=Mode.READ,
    untrusted_output=False,
    input_model=OperationArgs,
    output_model=Described,
    run=lambda args, ctx: Described(operation_id=args.operation_id),
    access=Access.for_roles("member", rule=_seen_rule),
    approval=Approval.never(),
    listed=["operation_id"],
)

CATALOG = {"ledger.get_balance", "ledger.credit", "ledger.transfer", "cards.describe"}


def surfaced_registry() -> Registry:
    registry = Registry([*ledger_tools.registry, describe])
    registry.add_surface(TurnSurface(
        "chat", tools=frozenset(CATALOG), writes="approval",  # type: ignore[arg-type]
        approvers=ApproverPolicy.for_roles("approver"), targets=open_items(),
    ))
    registry.add_surface(TurnSurface("lookup", tools=frozenset(CATALOG), writes="never"))  # type: ignore[arg-type]
    return registry


def begin(engine: Engine, registry: Registry, script: Path, *, surface: str = "chat",
          context: ServerContext = ALICE, conversation: str = "conv-1") -> str:
    with engine.begin() as conn:
        return start_turn(conn, context, conversation, "Credit acme-2 with 5.00.",
                          driver=f"scripted:{script}", surface=surface, registry=registry).turn_id


def operation(engine: Engine, operation_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(operations).where(operations.c.operation_id == operation_id)).one()


@pytest.fixture(autouse=True)
def _forget_seen() -> None:
    SEEN.clear()


def test_card_surface__a_write_needing_no_approval__ends_the_turn_with_a_card_and_runs_once_approved(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    registry = surfaced_registry()
    recording = Recording()
    # Given a chat-surface turn whose model credits an account (ledger.credit needs no approval)
    script = write_script(tmp_path / "t.jsonl", [
        calls("ledger.get_balance", "c1", account_id="acme-1"),
        calls("ledger.credit", "c2", account_id="acme-2", amount_cents=500),
        {"final": "Done: credited."},
    ])
    turn_id = begin(engine, registry, script)
    # When the fleet runs it
    state = drive(engine, settings, registry, turn_id, drivers=recording.factory())
    # Then the read ran inside the turn, and the write became a card: the turn ended
    # succeeded, approval_card, with the server's answer (never the model's "Done")
    view = get_turn(engine, "acme", turn_id)
    assert view is not None and state == "succeeded"
    assert view["end_reason"] == "approval_card" and view["surface"] == "chat"
    assert view["final_output"].startswith(CARD_HEADER) and "Done" not in view["final_output"]
    [read] = view["steps"][0]["calls"]
    [card] = view["steps"][1]["calls"]
    assert read["status"] == "succeeded"
    assert (card["status"], card["state"]) == ("pending", "pending_approval")
    assert card["operation_id"] in view["final_output"]
    # And the model was asked twice only, told that a write is a card, not a done deed
    assert len(recording.prompts()) == 2
    assert all(CARD_INSTRUCTIONS in prompt for prompt in recording.prompts())
    # And nothing happened to the ledger yet
    assert ledger.balance("acme-2") == 0 and ledger.effects_per_operation() == {}
    # When a person approves the card and a worker runs the queued operation
    with engine.begin() as conn:
        decided = store.approve(conn, card["approval_id"], approver=APPROVER, registry=registry)
    assert decided.outcome.value == "decided"
    assert OperationRunner(settings, registry, engine).handle(card["operation_id"]).label == "succeeded"
    # Then the write happened exactly once
    assert ledger.effects_per_operation() == {card["operation_id"]: 1}
    assert ledger.balance("acme-2") == 500


def test_card_surface__the_requester_cannot_approve_her_own_card_under_an_approver_role_policy(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    registry = surfaced_registry()
    script = write_script(tmp_path / "t.jsonl", [calls("ledger.credit", "c1", account_id="acme-2",
                                                       amount_cents=100)])
    turn_id = begin(engine, registry, script)
    assert drive(engine, settings, registry, turn_id) == "succeeded"
    view = get_turn(engine, "acme", turn_id)
    assert view is not None
    [card] = view["steps"][0]["calls"]
    # The surface's approvers decide a card of a tool that declares none: not alice
    with engine.begin() as conn:
        refused = store.approve(conn, card["approval_id"], approver=ALICE, registry=registry)
    assert refused.outcome.value == "approver_not_allowed"
    assert operation(engine, card["operation_id"]).state == "pending_approval"


def test_catalog__a_tool_outside_it__is_neither_shown_nor_runnable(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    registry = surfaced_registry()
    recording = Recording()
    # Given a chat-surface turn whose model proposes ledger.send_notice (not in the catalog)
    script = write_script(tmp_path / "t.jsonl", [
        calls("ledger.send_notice", "c1", account_id="acme-2", text="hello"),
        {"final": "I could not send it."},
    ])
    turn_id = begin(engine, registry, script)
    assert drive(engine, settings, registry, turn_id, drivers=recording.factory()) == "succeeded"
    # Then the tool was never shown: the prompt lists the catalog's tools and not it
    first = recording.prompts()[0]
    assert "- ledger.get_balance (read)" in first and "ledger.send_notice" not in first
    # And the call was refused tool_not_allowed before anything ran
    view = get_turn(engine, "acme", turn_id)
    assert view is not None
    [refused] = view["steps"][0]["calls"]
    assert (refused["status"], refused["error"]["code"]) == ("failed_terminal", "tool_not_allowed")
    assert ledger.effects_per_operation() == {}


def test_provider_exports__are_the_catalog(engine: Engine) -> None:
    from executor.providers import SURFACES
    from executor.providers.common import declared_tools

    registry = surfaced_registry()
    rule = SURFACES["openai-chat"].name_rule

    def exported(surface: str) -> set[str]:
        context = ALICE.model_copy(update={"surface": surface})
        return {tool.name for _, tool in declared_tools(registry, context, rule, surface="test")}

    # Every provider export declares what declared_tools returns: the surface's catalog
    assert exported("chat") == CATALOG
    assert exported("lookup") == {"ledger.get_balance", "cards.describe"}
    # A surface the registry does not declare offers nothing (fails closed)
    assert exported("gone") == set()


def test_read_only_surface__refuses_writes_and_says_so(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    registry = surfaced_registry()
    recording = Recording()
    script = write_script(tmp_path / "t.jsonl", [
        calls("ledger.credit", "c1", account_id="acme-2", amount_cents=500), {"final": "no"},
    ])
    turn_id = begin(engine, registry, script, surface="lookup")
    assert drive(engine, settings, registry, turn_id, drivers=recording.factory()) == "succeeded"
    view = get_turn(engine, "acme", turn_id)
    assert view is not None
    [refused] = view["steps"][0]["calls"]
    assert refused["error"]["code"] == "tool_not_allowed"
    assert READ_ONLY_INSTRUCTIONS in recording.prompts()[0]
    assert "ledger.credit" not in recording.prompts()[0]
    assert ledger.effects_per_operation() == {}


def test_listed_targets__only_an_item_the_server_listed_passes_and_the_access_rule_never_sees_another(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    registry = surfaced_registry()
    # Given alice has a pending card (a first chat turn) and mallory has one too
    first = write_script(tmp_path / "a.jsonl", [calls("ledger.credit", "c1", account_id="acme-2",
                                                      amount_cents=100)])
    assert drive(engine, settings, registry, begin(engine, registry, first)) == "succeeded"
    other = write_script(tmp_path / "m.jsonl", [calls("ledger.credit", "c1", account_id="acme-1",
                                                      amount_cents=100)])
    mallory_turn = begin(engine, registry, other, context=MALLORY, conversation="conv-m")
    assert drive(engine, settings, registry, mallory_turn) == "succeeded"
    mallory_view = get_turn(engine, "acme", mallory_turn)
    assert mallory_view is not None
    mallory_card = mallory_view["steps"][0]["calls"][0]["operation_id"]
    with engine.connect() as conn:
        [alice_card] = conn.execute(
            select(operations.c.operation_id).where(
                operations.c.state == "pending_approval", operations.c.conversation_id == "conv-1")
        ).scalars().all()
    recording = Recording()
    # When alice's next turn asks about her card, mallory's card and a made-up id
    script = write_script(tmp_path / "b.jsonl", [
        {"tool_calls": [
            {"id": "d1", "name": "cards.describe", "arguments": {"operation_id": alice_card}},
            {"id": "d2", "name": "cards.describe", "arguments": {"operation_id": mallory_card}},
            {"id": "d3", "name": "cards.describe", "arguments": {"operation_id": "op_made_up"}},
        ]},
        {"final": "That one waits for approval."},
    ])
    turn_id = begin(engine, registry, script)
    assert drive(engine, settings, registry, turn_id, drivers=recording.factory()) == "succeeded"
    # Then the prompt listed alice's card by number, and not mallory's
    prompt = recording.prompts()[0]
    assert f"1. {alice_card}: ledger.credit, pending approval" in prompt
    assert mallory_card not in prompt
    # And only the listed id passed; the others were refused target_not_offered, their
    # value never reaching the tool's access rule, and no handler ran for them
    view = get_turn(engine, "acme", turn_id)
    assert view is not None
    by_call = {c["call_id"]: c for c in view["steps"][0]["calls"]}
    assert by_call["d1"]["status"] == "succeeded"
    for refused in ("d2", "d3"):
        assert by_call[refused]["error"]["code"] == "target_not_offered"
        assert by_call[refused]["error"]["details"] == [
            {"path": "operation_id", "code": "not_listed", "expected": "the id of a listed item"}
        ]
    assert SEEN.count(alice_card) >= 1 and mallory_card not in SEEN and "op_made_up" not in SEEN
    # And the step checkpointed what it listed, which travelled with its calls
    with engine.connect() as conn:
        offered = conn.execute(select(turn_steps.c.offered).where(turn_steps.c.turn_id == turn_id,
                                                                  turn_steps.c.step == 1)).scalar_one()
    assert alice_card in json.loads(offered)
    assert view["steps"][0]["listed"] == json.loads(offered)
    stored = json.loads(operation(engine, by_call["d1"]["operation_id"]).context)
    assert stored["surface"] == "chat" and alice_card in stored["offered"]


def test_worker__refuses_what_the_surface_no_longer_offers_and_targets_it_did_not_list(
    engine: Engine, settings: Settings, ledger: Ledger
) -> None:
    # Given calls admitted under the chat surface, which listed op_1: a balance read, a
    # describe of op_1, and a describe of op_2 by a deployment whose describe tool did
    # not declare its argument listed yet
    unlisted = Tool(
        name=describe.name, description=describe.description, mode=Mode.READ, untrusted_output=False,
        input_model=OperationArgs, output_model=Described, run=describe.run,
        access=Access.for_roles("member"), approval=Approval.never(),
    )
    before = Registry([*ledger_tools.registry, unlisted])
    before.add_surface(TurnSurface("chat", tools=frozenset(CATALOG), writes=Writes.POLICY))
    context = ALICE.model_copy(update={"surface": "chat", "offered": ("op_1",), "request_id": "r1"})
    with engine.begin() as conn:
        enqueue(conn, [
            ProposedCall(call_id="c1", tool_name="ledger.get_balance", arguments={"account_id": "acme-1"}),
            ProposedCall(call_id="c2", tool_name="cards.describe", arguments={"operation_id": "op_1"}),
            ProposedCall(call_id="c3", tool_name="cards.describe", arguments={"operation_id": "op_2"}),
        ], context, before)
        queued = results(conn, "acme", "r1")
    assert [s.status for s in queued] == ["pending"] * 3
    # When, before a worker runs them, the deployment narrows the surface (no balance
    # reads) and declares the describe tool's argument listed
    narrowed = Registry([*ledger_tools.registry, describe])
    narrowed.add_surface(TurnSurface("chat", tools=frozenset({"cards.describe"}), writes=Writes.POLICY))
    runner = OperationRunner(settings, narrowed, engine)
    for status in queued:
        runner.handle(status.operation_id)  # type: ignore[union-attr]
    # Then the worker refused the balance read (tool_not_allowed) and the describe of
    # the item that was never listed (target_not_offered), and ran the listed one
    with engine.connect() as conn:
        after = {s.call_id: s for s in results(conn, "acme", "r1")}
    assert after["c1"].error.code is ErrorCode.TOOL_NOT_ALLOWED  # type: ignore[union-attr]
    assert after["c2"].status == "succeeded"
    assert after["c3"].error.code is ErrorCode.TARGET_NOT_OFFERED  # type: ignore[union-attr]


def test_worker__a_write_admitted_without_approval_waits_once_its_surface_wants_cards(
    engine: Engine, settings: Settings, ledger: Ledger
) -> None:
    # Given a credit admitted under a surface that kept each tool's own policy
    registry = Registry([*ledger_tools.registry])
    registry.add_surface(TurnSurface("chat", tools=frozenset({"ledger.credit"}), writes="policy"))  # type: ignore[arg-type]
    context = ALICE.model_copy(update={"surface": "chat", "request_id": "r2"})
    with engine.begin() as conn:
        credit = ProposedCall(call_id="c1", tool_name="ledger.credit",
                              arguments={"account_id": "acme-2", "amount_cents": 500})
        enqueue(conn, [credit], context, registry)
        [queued] = results(conn, "acme", "r2")
    # When the deployment turns the surface into a card surface before a worker runs it
    carded = Registry([*ledger_tools.registry])
    carded.add_surface(TurnSurface("chat", tools=frozenset({"ledger.credit"}), writes="approval",  # type: ignore[arg-type]
                                   approvers=ApproverPolicy.for_roles("approver")))
    OperationRunner(settings, carded, engine).handle(queued.operation_id)
    # Then the worker refused it (no approval) and the ledger never saw it
    with engine.connect() as conn:
        [after] = results(conn, "acme", "r2")
    assert after.error.code is ErrorCode.APPROVAL_REQUIRED  # type: ignore[union-attr]
    assert ledger.effects_per_operation() == {}


def test_unknown_surface__start_turn_refuses_and_a_worker_fails_the_turn_closed(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    registry = surfaced_registry()
    script = write_script(tmp_path / "t.jsonl", [calls("ledger.get_balance", "c1", account_id="acme-1")])
    with engine.begin() as conn, pytest.raises(UnknownSurface):
        start_turn(conn, ALICE, "conv-1", "hi", driver=f"scripted:{script}", surface="gone",
                   registry=registry)
    # A turn written under a surface a later worker's registry no longer declares
    turn_id = begin(engine, registry, script)
    bare = Registry([*ledger_tools.registry])
    assert drive(engine, settings, bare, turn_id) == "failed"
    view = get_turn(engine, "acme", turn_id)
    assert view is not None
    assert (view["end_reason"], view["steps"]) == ("unknown_surface", [])
    assert ledger.effects_per_operation() == {}


def test_surface_from_the_setting__applies_when_start_turn_names_none(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = surfaced_registry()
    monkeypatch.setenv("TOOLFENCE_TURN_SURFACE", "chat")
    script = write_script(tmp_path / "t.jsonl", [calls("ledger.credit", "c1", account_id="acme-2",
                                                       amount_cents=100)])
    with engine.begin() as conn:
        turn_id = start_turn(conn, ALICE, "conv-1", "credit", driver=f"scripted:{script}",
                             registry=registry).turn_id
    assert drive(engine, settings, registry, turn_id) == "succeeded"
    view = get_turn(engine, "acme", turn_id)
    assert view is not None and view["end_reason"] == "approval_card"


@pytest.mark.parametrize("allowed", [False, True], ids=["surface_default", "hosted_true"])
def test_hosted_calls__refused_in_a_surface_turn_unless_it_allows_them(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path, allowed: bool
) -> None:
    from test_turn_ends import CRM, balance_call, mcp_call, responses, text

    # Given a surface (writes keep each tool's policy) and a hosted policy allowing the
    # CRM's lookup, and a native turn whose provider ran that lookup itself
    registry = Registry([*ledger_tools.registry])
    registry.add_surface(TurnSurface("chat", tools=frozenset({"ledger.get_balance"}),
                                     writes=Writes.POLICY, hosted=allowed))
    script = write_script(tmp_path / "t.jsonl", [
        responses(mcp_call("lookup"), balance_call()), responses(text("acme-1 holds 100,000.00.")),
    ])
    with engine.begin() as conn:
        turn_id = start_turn(conn, ALICE, "conv-1", "look it up",
                             driver=f"scripted+openai-responses:{script}", surface="chat",
                             registry=registry).turn_id
    state = drive(engine, settings, registry, turn_id, hosted_policy=CRM)
    view = get_turn(engine, "acme", turn_id)
    assert view is not None
    if allowed:
        # Then with hosted=True the application's policy decides, as without a surface
        assert (state, view["end_reason"]) == ("succeeded", "final")
    else:
        # Then by default the call the provider already ran ends the turn, and none of
        # the step's proposals is enqueued (a surface's turn runs no provider-run call)
        assert (state, view["end_reason"]) == ("fallback", "hosted_call_not_allowed")
        assert view["steps"][0]["calls"][0]["error"]["code"] == "hosted_call_not_allowed"
        with engine.connect() as conn:
            assert conn.execute(select(operations.c.operation_id)).all() == []
