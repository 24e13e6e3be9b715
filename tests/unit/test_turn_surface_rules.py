"""Turn surfaces, pure: declarations, what a source's items become, the loop's card end,
the targets gate's place among the gates (the database-backed tests are in
tests/integration/test_turn_surfaces.py and tests/fleet/test_fleet_turn_surfaces.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from executor.core.admission import Gate, Rejected, admit
from executor.core.approvers import ApproverPolicy
from executor.core.surfaces import (
    CARD_INSTRUCTIONS,
    MAX_TARGETS,
    TARGETS_INSTRUCTIONS,
    SurfaceDeclarationError,
    Target,
    TurnSurface,
    Writes,
    checked_targets,
    targets_block,
)
from executor.core.tools import Access, Approval, Mode, Registry, Tool, ToolDeclarationError
from executor.core.types import ErrorCode, Pending, ProposedCall, ServerContext, Succeeded
from executor.turns.loop import CARD_HEADER, End, WaitApproval, card_answer, next_action
from executor.turns.values import EndReason, StepOutcome, StepRecord, TurnOptions, Usage

APPROVERS = ApproverPolicy.for_roles("approver")
ALICE = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="r")


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    item_id: str | None = None
    item_ids: list[str] = []


def tool(name: str = "items.cancel", *, mode: Mode = Mode.READ, listed: Any = ("item_id", "item_ids"),
         rule: Any = None) -> Tool[Args]:
    extra: dict[str, Any] = {"effect": ["idempotent"]} if mode is Mode.WRITE else {}
    return Tool(
        name=name, description="", mode=mode, input_model=Args, output_model=Args,
        run=lambda args, ctx: args, access=Access.for_roles("member", rule=rule),
        approval=Approval.never(), untrusted_output=False, listed=listed, **extra,
    )


# ------------------------------------------------------------------ declarations


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"name": "", "tools": {"a"}, "writes": "policy"}, "name"),
    ({"name": "chat", "tools": "ledger.credit", "writes": "policy"}, "collection"),
    ({"name": "chat", "tools": set(), "writes": "policy"}, "at least one"),
    ({"name": "chat", "tools": {"a"}, "writes": "sometimes"}, "writes must be one of"),
    ({"name": "chat", "tools": {"a"}, "writes": "approval"}, "must declare approvers"),
    ({"name": "chat", "tools": {"a"}, "writes": "policy", "targets": "x"}, "callable"),
    ({"name": "chat", "tools": {"a"}, "writes": "policy", "max_targets": MAX_TARGETS + 1}, "max_targets"),
    ({"name": "chat", "tools": {"a"}, "writes": "policy", "max_targets": "5"}, "max_targets"),
    ({"name": "chat", "tools": {"a"}, "writes": "policy", "instructions": None}, "instructions"),
])
def test_surface_declaration__a_mistake_is_an_error_naming_it(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(SurfaceDeclarationError, match=says):
        TurnSurface(**kwargs)


def test_surface_declaration__writes_from_text_and_a_twice_declared_name() -> None:
    surface = TurnSurface("chat", tools=frozenset({"a"}), writes="approval", approvers=APPROVERS)  # type: ignore[arg-type]
    assert surface.writes is Writes.APPROVAL
    registry = Registry()
    registry.add_surface(surface)
    with pytest.raises(SurfaceDeclarationError, match="twice"):
        registry.add_surface(surface)
    assert registry.surface("chat") is surface and registry.surface("other") is None


def test_tool_declaration__listed_must_name_arguments() -> None:
    with pytest.raises(ToolDeclarationError, match="listed names no argument 'nope'"):
        tool(listed=["nope"])
    with pytest.raises(ToolDeclarationError, match="collection"):
        tool(listed="item_id")


def test_offers_and_forces_approval__by_catalog_and_write_rule() -> None:
    read, write = tool("a.read"), tool("a.write", mode=Mode.WRITE)
    both = frozenset({"a.read", "a.write"})
    cards = TurnSurface("c", tools=both, writes=Writes.APPROVAL, approvers=APPROVERS)
    never = TurnSurface("n", tools=frozenset({"a.read", "a.write"}), writes=Writes.NEVER)
    narrow = TurnSurface("p", tools=frozenset({"a.read"}), writes=Writes.POLICY)
    assert (cards.offers(read), cards.offers(write)) == (True, True)
    assert (cards.forces_approval(read), cards.forces_approval(write)) == (False, True)
    assert (never.offers(read), never.offers(write)) == (True, False)
    assert (narrow.offers(read), narrow.offers(write), narrow.forces_approval(write)) == (True, False, False)
    assert CARD_INSTRUCTIONS in cards.prompt_instructions()
    assert TARGETS_INSTRUCTIONS not in cards.prompt_instructions()


# ------------------------------------------------------------------ listed items


def test_checked_targets__drops_bad_ids_and_duplicates__caps__and_seals_labels() -> None:
    surface = TurnSurface("c", tools=frozenset({"a"}), writes=Writes.POLICY, max_targets=3)
    found = [
        Target("op_1", "first"), Target("op_1", "again"), Target("bad\x00id", "nul"),
        Target("x" * 201, "long"),
        Target("op_2", "key sk-live-0123456789abcdefghijklmnop"), "not a target",  # type: ignore[list-item]
        Target("op_3", "third"), Target("op_4", "over the cap"),
    ]
    kept = checked_targets(surface, found)
    assert [t.id for t in kept] == ["op_1", "op_2", "op_3"]
    assert "sk-live-0123456789abcdefghijklmnop" not in kept[1].label
    assert targets_block(kept).splitlines()[1:] == [f"{n}. {t.id}: {t.label}" for n, t in enumerate(kept, 1)]
    assert targets_block(()) == "Listed items: none."


def _registry_with(t: Tool[Args]) -> Registry:
    registry = Registry([t])
    registry.add_surface(TurnSurface("c", tools=frozenset({t.name}), writes=Writes.POLICY))
    return registry


def test_targets_gate__after_schema__before_the_access_rule() -> None:
    asked: list[Any] = []
    listed = tool(rule=lambda args, ctx: asked.append(args) or True)
    registry = _registry_with(listed)
    ctx = ALICE.model_copy(update={"surface": "c", "offered": ("op_1", "op_2")})

    def decide(arguments: Any, context: ServerContext = ctx) -> Any:
        call = ProposedCall(call_id="c1", tool_name=listed.name, arguments=arguments)
        return admit(call, registry, context)

    # A schema error is the schema's, whatever the id
    bad = decide({"item_id": 5})
    assert isinstance(bad, Rejected) and bad.gate is Gate.SCHEMA
    # Listed ids pass (one, a list of them, or none named); the access rule then runs
    for ok in ({"item_id": "op_1"}, {"item_ids": ["op_1", "op_2"]}, {}):
        assert not isinstance(decide(ok), Rejected)
    # One unlisted id, alone or in a list, is refused before the rule is asked
    asked.clear()
    for refused in ({"item_id": "op_9"}, {"item_ids": ["op_1", "op_9"]}):
        rejected = decide(refused)
        assert isinstance(rejected, Rejected) and rejected.gate is Gate.TARGETS
        assert rejected.result.error.code is ErrorCode.TARGET_NOT_OFFERED
        assert "op_9" not in rejected.result.model_dump_json()
    assert asked == []
    # Nothing listed (no `offered`) lists nothing: a listed argument is refused anywhere
    nothing = decide({"item_id": "op_1"}, ALICE)
    assert isinstance(nothing, Rejected) and nothing.gate is Gate.TARGETS


def test_allowlist__a_surface_the_registry_lacks_offers_nothing() -> None:
    listed = tool(listed=())
    rejected = admit(ProposedCall(call_id="c1", tool_name=listed.name, arguments={}), _registry_with(listed),
                     ALICE.model_copy(update={"surface": "gone"}))
    assert isinstance(rejected, Rejected) and rejected.result.error.code is ErrorCode.TOOL_NOT_ALLOWED


# ------------------------------------------------------------------ the loop


def _step(n: int = 1) -> StepRecord:
    return StepRecord(step=n, outcome=StepOutcome.TOOL_CALLS, proposals=(
        ProposedCall(call_id="c1", tool_name="ledger.credit", arguments={}),
    ), request_id=f"t.s{n}", usage=Usage(model="m", purpose="turn"))


def test_next_action__a_pending_approval_is_a_card_end_only_in_a_card_surface() -> None:
    card = Pending(call_id="done-already", tool_name="ledger.credit", operation_id="op_7",
                   state="pending_approval")
    read = Succeeded(call_id="c0", tool_name="ledger.get_balance", output={"balance_cents": 1})
    assert isinstance(next_action([_step()], [read, card], TurnOptions()), WaitApproval)
    action = next_action([_step()], [read, card], TurnOptions(), cards=True)
    assert isinstance(action, End) and action.reason is EndReason.APPROVAL_CARD
    assert action.output == card_answer([read, card])
    # The answer is the server's: the operation, never the call id the model wrote
    assert action.output is not None and action.output.startswith(CARD_HEADER)
    assert "op_7" in action.output and "done-already" not in action.output
    # A call still running is waited for first
    running = Pending(call_id="c2", tool_name="ledger.credit", operation_id="op_8", state="queued")
    assert not isinstance(next_action([_step()], [running, card], TurnOptions(), cards=True), End)
