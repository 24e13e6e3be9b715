"""Durable turns on real PostgreSQL and SQLite: the loop, its checkpoints, its ends, approvals.

The turn job (`TurnRunner`), the operations' worker (`OperationRunner`) and the
reconciler run in this process (`turnkit.drive`), against the reference ledger
and the scripted driver. The fleet tests (tests/fleet/test_fleet_turns.py) run
the same loop in worker subprocesses with SIGKILLs.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select
from turnkit import Recording, asked, calls, drive, turn_state, write_script

from executor import store
from executor.core.types import ServerContext
from executor.faults import AmbiguousCommit
from executor.settings import Settings
from executor.store import turns as turn_store
from executor.store.clock import db_now
from executor.store.engine import make_engine
from executor.store.schema import outbox, turn_steps, turns
from executor.telemetry import logcontext
from executor.turns.drivers import DriverError, ScriptedDriver
from executor.turns.prompt import COMPLETED_HEADER
from executor.turns.service import TurnInProgress, get_turn, start_turn
from executor.turns.specs import load_driver
from executor.turns.values import ModelRequest, ModelResponse, TurnOptions, Usage, step_request_id
from executor.worker.turns import UNAVAILABLE_RETRY_SECONDS, TurnRunner
from ledger import service as ledger_service
from ledger.service import Ledger
from ledger.tools import registry
from outbox.results import results
from tests.netkit import refused_database_url

ALICE = ServerContext(
    principal="alice", tenant="acme", roles=frozenset({"member", "vip-admin"}), request_id="turn"
)
APPROVER = ServerContext(principal="bob", tenant="acme", roles=frozenset({"approver"}), request_id="ap")


def start(engine: Engine, script: Path, *, context: ServerContext = ALICE, conversation: str = "conv-1",
          options: TurnOptions | None = None) -> str:
    with engine.begin() as conn:
        return start_turn(conn, context, conversation, "Move 5.00 to acme-2, then tell me.",
                          driver=f"scripted:{script}", options=options).turn_id


THREE_STEPS = [
    calls("ledger.get_balance", "c1", account_id="acme-1"),
    calls("ledger.credit", "c2", account_id="acme-2", amount_cents=500),
    {"final": "Done: acme-2 was credited 5.00."},
]


def test_turn__read_write_final__succeeds_with_the_write_applied_once(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    # Given a scripted model that reads, writes, then answers
    script = write_script(tmp_path / "turn.jsonl", THREE_STEPS)
    recording = Recording()
    turn_id = start(engine, script)
    # When the turn runs
    state = drive(engine, settings, registry, turn_id, drivers=recording.factory())
    # Then it succeeded with the model's final text, after three recorded steps
    assert state == "succeeded"
    view = get_turn(engine, "acme", turn_id)
    assert view is not None
    assert view["final_output"] == "Done: acme-2 was credited 5.00."
    assert view["end_reason"] == "final"
    assert [s["outcome"] for s in view["steps"]] == ["tool_calls", "tool_calls", "final"]
    assert [c["status"] for s in view["steps"] for c in s["calls"]] == ["succeeded", "succeeded"]
    # And the write's effect happened once, under the operation derived from (turn, step 2, c2)
    [credit_op] = [c["operation_id"] for c in view["steps"][1]["calls"]]
    assert ledger.effects_per_operation()[credit_op] == 1
    assert ledger.balance("acme-2") == 500
    # And each step was asked exactly once
    assert asked(script) == {("turn", 1): 1, ("turn", 2): 1, ("turn", 3): 1}
    # And while it asked, the turn job's log records carried the turn, its tenant and step
    assert recording.log_ids == [{"turn_id": turn_id, "tenant": "acme", "step": n} for n in (1, 2, 3)]
    assert logcontext.current() == {}  # nothing left behind once the job ended
    # And the model saw the earlier results as a labelled block, never the requester's roles
    prompts = recording.prompts()
    assert COMPLETED_HEADER not in prompts[0]
    assert COMPLETED_HEADER in prompts[1] and '"balance_cents":10000000' in prompts[1]
    assert all("alice" in p and "vip-admin" not in p and "member" not in p for p in prompts)


def test_turn__owner_dies_after_a_checkpoint__next_owner_resumes_without_asking_again(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    # Given a turn whose first job dies right after step 1 was checkpointed
    script = write_script(tmp_path / "turn.jsonl", THREE_STEPS)
    turn_id = start(engine, script)
    doomed = TurnRunner(settings.with_(fault_points=frozenset({"turn_step_recorded:step1=ambiguous"})),
                        registry, engine)
    with pytest.raises(AmbiguousCommit):
        doomed.handle(turn_id)
    with engine.connect() as conn:
        row = turn_store.get_turn(conn, turn_id)
    assert row is not None and row.owner_token is not None and row.steps == 1
    # When another worker gets the turn (it waits out the dead owner's lease, then takes over)
    state = drive(engine, settings, registry, turn_id)
    # Then the turn finished under a later generation, step 1 asked once, its call run once
    assert state == "succeeded"
    assert asked(script) == {("turn", 1): 1, ("turn", 2): 1, ("turn", 3): 1}
    with engine.connect() as conn:
        generations = dict(conn.execute(
            select(turn_steps.c.step, turn_steps.c.generation).where(turn_steps.c.turn_id == turn_id)
        ).all())
    assert generations[1] == 1 and generations[2] >= 2
    assert max(ledger.effects_per_operation().values()) == 1


def test_turn__ledger_database_down_when_its_calls_are_enqueued__resumes_and_runs_them_once(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a turn whose step 1 was checkpointed while the ledger's database, which the
    # tools' access rule reads, refused connections: admission could not decide (a
    # lease of 5 s, not the fixture's 1 s: the first job must still hold the turn when
    # it gives it back, however slow a loaded machine makes its SQLite commits)
    settings = settings.with_(lease_seconds=5.0)
    down = Ledger(refused_database_url("ledger"))
    monkeypatch.setattr(ledger_service, "_default", down)
    script = write_script(tmp_path / "turn.jsonl", THREE_STEPS)
    turn_id = start(engine, script)
    outcome = TurnRunner(settings, registry, engine).handle(turn_id)
    down.engine.dispose()
    # Then nothing of the step's calls was recorded (no refusal the model would be told),
    # and the turn was given back at once with its next job scheduled (not left owned
    # until its lease expires)
    assert outcome.label == "released"
    with engine.connect() as conn:
        row = turn_store.get_turn(conn, turn_id)
        scheduled = conn.execute(
            select(func.max(outbox.c.next_attempt_at) - db_now()).where(
                outbox.c.operation_id == turn_id, outbox.c.published_at.is_(None)
            )
        ).scalar_one()
    assert row is not None and row.steps == 1 and row.owner_token is None
    assert 0 < scheduled <= UNAVAILABLE_RETRY_SECONDS
    assert results(engine, "acme", step_request_id(turn_id, 1)) == []
    # When the ledger answers again and the next job gets the turn
    monkeypatch.setattr(ledger_service, "_default", ledger)
    state = drive(engine, settings, registry, turn_id)
    # Then step 1's calls are admitted and run once, and step 1 is not asked again
    assert state == "succeeded"
    assert asked(script) == {("turn", 1): 1, ("turn", 2): 1, ("turn", 3): 1}
    assert [s.status for s in results(engine, "acme", step_request_id(turn_id, 1))] == ["succeeded"]
    assert max(ledger.effects_per_operation().values()) == 1


def test_turn__stale_owner_after_takeover__its_checkpoint_and_end_change_nothing(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    # Given a turn reserved by a first owner, whose lease then expired and was taken over
    script = write_script(tmp_path / "turn.jsonl", THREE_STEPS)
    turn_id = start(engine, script)
    with engine.begin() as conn:
        first = turn_store.reserve_turn(conn, turn_id, "old-owner", 0.05)
    assert first is not None
    import time

    time.sleep(0.1)
    with engine.begin() as conn:
        second = turn_store.reserve_turn(conn, turn_id, "new-owner", 5.0)
    assert second is not None and second.generation == first.generation + 1
    # When the first owner tries to checkpoint a step and to end the turn
    with engine.begin() as conn:
        recorded = turn_store.record_step(
            conn, first, step=1, outcome="final", proposals=[], request_id=step_request_id(turn_id, 1),
            usage=Usage("m", "turn").to_json(), final_output="stale",
        )
        from executor.core.states import TurnState

        ended = turn_store.end_turn(conn, first, state=TurnState.SUCCEEDED, end_reason="final",
                                    final_output="stale")
        renewed = turn_store.renew_turn(conn, turn_id, first.generation, first.owner_token, 5.0)
    # Then none of its writes matched: no step, still running under the new owner
    assert (recorded, ended, renewed) == (False, False, False)
    with engine.connect() as conn:
        assert turn_store.steps_of(conn, turn_id) == []
        row = turn_store.get_turn(conn, turn_id)
    assert row is not None and row.state == "running" and row.owner_token == "new-owner"


# ------------------------------------------------------------------ one running turn per user


def test_start_turn__second_turn_of_the_same_user__refused_turn_in_progress_by_the_index(
    engine: Engine, settings: Settings, tmp_path: Path
) -> None:
    script = write_script(tmp_path / "turn.jsonl", [{"final": "hi"}])
    # Given a running turn of alice
    first = start(engine, script)
    # When alice starts another (another conversation), inside a transaction that goes on
    with engine.begin() as conn:
        with pytest.raises(TurnInProgress) as refused:
            start_turn(conn, ALICE, "conv-2", "again", driver=f"scripted:{script}")
        # Then it is refused turn_in_progress, and the caller's transaction is still usable
        assert refused.value.code.value == "turn_in_progress"
        other = start_turn(conn, ALICE.model_copy(update={"principal": "carol"}), "conv-3", "hello",
                           driver=f"scripted:{script}")
    with engine.connect() as conn:
        running = conn.execute(
            select(turns.c.principal).where(turns.c.state == "running").order_by(turns.c.principal)
        ).scalars().all()
    assert running == ["alice", "carol"]
    assert other.turn_id != first


def test_start_turn__two_at_once_on_two_connections__the_index_lets_exactly_one_in(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # PostgreSQL only: two open write transactions at once (SQLite serialises writers
    # at BEGIN IMMEDIATE, so the second could not even begin).
    monkeypatch.setenv("TOOLFENCE_DATABASE_URL", pg_url)
    engine = make_engine(pg_url)
    script = write_script(tmp_path / "turn.jsonl", [{"final": "hi"}])
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def attempt(conversation: str) -> None:
        with engine.begin() as conn:
            barrier.wait()
            try:
                start_turn(conn, ALICE, conversation, "at once", driver=f"scripted:{script}")
                outcomes.append("started")
            except TurnInProgress:
                outcomes.append("turn_in_progress")

    # Given two producers starting a turn for alice at the same moment
    threads = [threading.Thread(target=attempt, args=(f"conv-{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    # Then one got in and the other was refused: no Python check, the unique index decided
    assert sorted(outcomes) == ["started", "turn_in_progress"]
    engine.dispose()


def test_start_turn__conversation_scope__one_running_turn_per_conversation(
    engine: Engine, settings: Settings, tmp_path: Path
) -> None:
    script = write_script(tmp_path / "turn.jsonl", [{"final": "hi"}])
    with engine.begin() as conn:
        start_turn(conn, ALICE, "shared", "one", driver=f"scripted:{script}", scope="conversation")
        # Another principal, same conversation: refused; alice in another conversation: fine
        with pytest.raises(TurnInProgress):
            start_turn(conn, ALICE.model_copy(update={"principal": "dave"}), "shared", "two",
                       driver=f"scripted:{script}", scope="conversation")
        start_turn(conn, ALICE, "elsewhere", "three", driver=f"scripted:{script}", scope="conversation")


def test_start_turn__after_the_first_ended__the_user_may_start_again(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    script = write_script(tmp_path / "turn.jsonl", [{"final": "hi"}])
    first = start(engine, script)
    assert drive(engine, settings, registry, first) == "succeeded"
    second_script = write_script(tmp_path / "second.jsonl", [{"final": "again"}])
    second = start(engine, second_script)
    assert drive(engine, settings, registry, second) == "succeeded"


# ------------------------------------------------------------------ ends


def test_turn__contract_error__ends_fallback_with_the_reason_and_an_excerpt(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    prose = "Sure! I will move the money now. " * 40
    script = write_script(tmp_path / "turn.jsonl", [prose])
    turn_id = start(engine, script, options=TurnOptions(fallback_output="Please try again later."))
    assert drive(engine, settings, registry, turn_id) == "fallback"
    view = get_turn(engine, "acme", turn_id)
    assert view is not None
    assert (view["end_reason"], view["final_output"]) == ("contract_error", "Please try again later.")
    assert view["error"]["code"] == "not_json"
    assert view["error"]["excerpt"] == prose[:500]


def test_turn__max_steps_spent__ends_fallback_max_steps(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    lines = [calls("ledger.get_balance", f"c{i}", account_id="acme-1") for i in range(5)]
    script = write_script(tmp_path / "turn.jsonl", lines)
    turn_id = start(engine, script, options=TurnOptions(max_steps=2))
    assert drive(engine, settings, registry, turn_id) == "fallback"
    view = get_turn(engine, "acme", turn_id)
    assert view is not None and view["end_reason"] == "max_steps" and len(view["steps"]) == 2
    assert asked(script) == {("turn", 1): 1, ("turn", 2): 1}


def test_turn__calls_past_max_calls__end_fallback_before_they_are_enqueued(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    many = {"tool_calls": [
        {"id": f"c{i}", "name": "ledger.get_balance", "arguments": {"account_id": "acme-1"}} for i in range(3)
    ]}
    script = write_script(tmp_path / "turn.jsonl", [many])
    turn_id = start(engine, script, options=TurnOptions(max_calls=2))
    assert drive(engine, settings, registry, turn_id) == "fallback"
    view = get_turn(engine, "acme", turn_id)
    assert view is not None and view["end_reason"] == "call_budget_exceeded"
    assert view["steps"][0]["calls"] == []  # nothing was enqueued


def test_turn__driver_can_never_answer__ends_failed_driver_failed(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    script = write_script(tmp_path / "turn.jsonl", [])  # no line for step 1: a permanent error
    turn_id = start(engine, script)
    assert drive(engine, settings, registry, turn_id) == "failed"
    view = get_turn(engine, "acme", turn_id)
    assert view is not None and view["end_reason"] == "driver_failed"
    assert view["error"]["code"] == "script_exhausted"


def test_turn__unknown_tool__admission_refuses_it_and_the_model_is_told(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    script = write_script(tmp_path / "turn.jsonl", [calls("ledger.drain_everything", "c1"), {"final": "ok"}])
    recording = Recording()
    turn_id = start(engine, script)
    assert drive(engine, settings, registry, turn_id, drivers=recording.factory()) == "succeeded"
    assert "failed_terminal unknown_tool" in recording.prompts()[1]


# ------------------------------------------------------------------ approvals


def transfer_turn(engine: Engine, tmp_path: Path) -> tuple[str, Path]:
    script = write_script(tmp_path / "turn.jsonl", [
        calls("ledger.transfer", "t1", source_account="acme-1", target_account="acme-2",
              amount_cents=60_000),
        {"final": "The transfer is settled."},
    ])
    return start(engine, script), script


def pending_approval_id(engine: Engine, turn_id: str) -> str:
    view = get_turn(engine, "acme", turn_id)
    assert view is not None
    [call] = view["steps"][0]["calls"]
    assert call["state"] == "pending_approval"
    return str(call["approval_id"])


def test_turn__needs_approval__waits_then_an_allowed_approver_approves_and_it_resumes(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    # Given a turn whose write needs an approval
    turn_id, script = transfer_turn(engine, tmp_path)
    recording = Recording()
    # When it runs, it waits for a person, with no owner
    assert drive(engine, settings, registry, turn_id, drivers=recording.factory()) == "waiting_approval"
    with engine.connect() as conn:
        row = turn_store.get_turn(conn, turn_id)
    assert row is not None and row.owner_token is None
    approval_id = pending_approval_id(engine, turn_id)
    # And the requester herself may not approve it: it stays pending, the turn waits
    with engine.begin() as conn:
        refused = store.approve(conn, approval_id, approver=ALICE, registry=registry)
    assert refused.outcome is store.DecisionOutcome.APPROVER_NOT_ALLOWED
    assert drive(engine, settings, registry, turn_id, rounds=2) == "waiting_approval"
    # When an allowed approver approves
    with engine.begin() as conn:
        decided = store.approve(conn, approval_id, approver=APPROVER, registry=registry)
    assert decided.outcome is store.DecisionOutcome.DECIDED
    # Then the reconciler wakes the turn, the transfer runs once, the model answers
    assert drive(engine, settings, registry, turn_id, drivers=recording.factory()) == "succeeded"
    assert ledger.balance("acme-2") == 60_000
    assert asked(script) == {("turn", 1): 1, ("turn", 2): 1}
    assert "t1 ledger.transfer" in recording.prompts()[1] and "-> succeeded" in recording.prompts()[1]


def test_turn__approval_denied__the_model_is_told_and_the_turn_ends(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    turn_id, _ = transfer_turn(engine, tmp_path)
    recording = Recording()
    assert drive(engine, settings, registry, turn_id, drivers=recording.factory()) == "waiting_approval"
    with engine.begin() as conn:
        store.deny(conn, pending_approval_id(engine, turn_id), approver=APPROVER, registry=registry,
                   reason="too large")
    assert drive(engine, settings, registry, turn_id, drivers=recording.factory()) == "succeeded"
    assert ledger.balance("acme-2") == 0
    assert "failed_terminal approval_denied" in recording.prompts()[-1]


def test_turn__waiting_turn_decided_while_the_user_has_another_running__stays_waiting_until_it_ends(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    # Given a turn waiting for approval, and a second turn of alice started meanwhile
    turn_id, _ = transfer_turn(engine, tmp_path)
    assert drive(engine, settings, registry, turn_id) == "waiting_approval"
    other = start(engine, write_script(tmp_path / "other.jsonl", [{"final": "hi"}]), conversation="c-9")
    with engine.begin() as conn:
        store.approve(conn, pending_approval_id(engine, turn_id), approver=APPROVER, registry=registry)
    # When the reconciler sweeps, the unique index keeps the first waiting
    from reconciler.sweep import Reconciler

    Reconciler(settings, engine, registry).sweep()
    assert turn_state(engine, turn_id) == "waiting_approval"
    # Then once the other turn ended, the first resumes and finishes
    assert drive(engine, settings, registry, other) == "succeeded"
    assert drive(engine, settings, registry, turn_id) == "succeeded"


# ------------------------------------------------------------------ the audit hook


class SlowDriver:
    """An audit model that never answers in time."""

    mode = "json"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def call(self, request: ModelRequest) -> ModelResponse:
        import time

        time.sleep(self.seconds)
        return ModelResponse(usage=Usage("slow", request.purpose), text='{"verdict": "suppress"}')


def audit_drivers(slow: SlowDriver) -> object:
    return lambda spec: slow if spec == "slow:audit" else load_driver(spec)


def test_audit__times_out__the_candidate_is_emitted_and_the_fallback_recorded(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    script = write_script(tmp_path / "turn.jsonl", [{"final": "Your balance is 100,000.00."}])
    turn_id = start(engine, script, options=TurnOptions(audit_driver="slow:audit", audit_timeout_seconds=0.2))
    import time

    started = time.monotonic()
    state = drive(engine, settings, registry, turn_id, drivers=audit_drivers(SlowDriver(12.0)))  # type: ignore[arg-type]
    # Then the turn did not wait for the 12 s audit: the candidate went out, audit_failed recorded
    assert time.monotonic() - started < 8.0
    assert state == "succeeded"
    view = get_turn(engine, "acme", turn_id)
    assert view is not None
    assert (view["final_output"], view["end_reason"]) == ("Your balance is 100,000.00.", "audit_failed")
    assert view["steps"][-1]["verdict"] == "failed" and view["error"]["failure"] == "timeout"


def test_audit__verdicts__suppress_ask_user_and_a_write_request_refused(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    ended = {}
    verdicts = {
        "suppress": {"verdict": "suppress"},
        "ask_user": {"verdict": "ask_user", "question": "Which account do you mean?"},
        "write": {"verdict": "deny_and_read", "tool_calls": [
            {"id": "a1", "name": "ledger.credit", "arguments": {"account_id": "acme-2", "amount_cents": 1}}
        ]},
    }
    for index, (name, verdict) in enumerate(verdicts.items()):
        principal = f"user-{index}"
        script = write_script(tmp_path / f"{name}.jsonl", [{"final": "candidate"}])
        audit = write_script(tmp_path / f"{name}.audit.jsonl", [verdict])
        turn_id = start(engine, script, context=ALICE.model_copy(update={"principal": principal}),
                        options=TurnOptions(audit_driver=f"scripted:{audit}", fallback_output="fallback"))
        drive(engine, settings, registry, turn_id)
        view = get_turn(engine, "acme", turn_id)
        assert view is not None
        ended[name] = (view["state"], view["end_reason"], view["final_output"])
    assert ended == {
        "suppress": ("fallback", "audit_suppressed", "fallback"),
        "ask_user": ("succeeded", "audit_ask_user", "Which account do you mean?"),
        # A write is refused by enforcement, not only by the prompt: the audit failed
        "write": ("succeeded", "audit_failed", "candidate"),
    }
    assert ledger.balance("acme-2") == 0


def test_audit__deny_and_read__its_reads_run_and_the_model_answers_again(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    script = write_script(tmp_path / "turn.jsonl", [{"final": "guess: 0"}, {"final": "balance: 100000.00"}])
    audit = write_script(tmp_path / "audit.jsonl", [
        {"verdict": "deny_and_read",
         "tool_calls": [{"id": "a1", "name": "ledger.get_balance", "arguments": {"account_id": "acme-1"}}]},
        {"verdict": "emit"},
    ])
    recording = Recording()
    turn_id = start(engine, script, options=TurnOptions(audit_driver=f"scripted:{audit}"))
    assert drive(engine, settings, registry, turn_id, drivers=recording.factory()) == "succeeded"
    view = get_turn(engine, "acme", turn_id)
    assert view is not None and view["final_output"] == "balance: 100000.00"
    assert [(s["outcome"], s["verdict"]) for s in view["steps"]] == [
        ("final", None), ("audit", "deny_and_read"), ("final", None), ("audit", "emit"),
    ]
    assert "a1 ledger.get_balance" in recording.prompts()[1]
    # The audit is shown only read tools
    assert all(t.mode == "read" for r in recording.requests if r.purpose == "audit" for t in r.tools)


def test_get_turn__another_tenant__sees_nothing(engine: Engine, settings: Settings, tmp_path: Path) -> None:
    turn_id = start(engine, write_script(tmp_path / "turn.jsonl", [{"final": "hi"}]))
    assert get_turn(engine, "globex", turn_id) is None
    assert get_turn(engine, "acme", turn_id) is not None


def test_load_driver__bad_specs__refused_with_stable_codes(tmp_path: Path) -> None:
    for spec, code in [("nonsense", "bad_driver_spec"), ("llama:7b", "unknown_driver")]:
        with pytest.raises(DriverError) as refused:
            load_driver(spec)
        assert refused.value.code == code
    assert isinstance(load_driver(f"scripted:{tmp_path}/x.jsonl"), ScriptedDriver)


# ------------------------------------------------------------------ queue behind


def test_start_turn__queue_when_busy__later_turns_wait_and_run_in_order(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    # Given a running turn of alice, and two more started with when_busy="queue"
    first = start(engine, write_script(tmp_path / "1.jsonl", [{"final": "one"}]))
    queued = []
    for name in ("2", "3"):
        script = write_script(tmp_path / f"{name}.jsonl", [{"final": name}])
        with engine.begin() as conn:
            handle = start_turn(conn, ALICE, f"conv-{name}", "next", when_busy="queue",
                                driver=f"scripted:{script}")
        queued.append(handle)
    assert [h.state for h in queued] == ["queued", "queued"]
    # When a worker is handed a queued turn, nothing runs
    assert drive(engine, settings, registry, queued[0].turn_id, rounds=2) == "queued"
    # Then each runs once the one before it ended, oldest first
    assert drive(engine, settings, registry, first) == "succeeded"
    assert [turn_state(engine, h.turn_id) for h in queued] == ["running", "queued"]
    assert drive(engine, settings, registry, queued[0].turn_id) == "succeeded"
    assert drive(engine, settings, registry, queued[1].turn_id) == "succeeded"
    view = get_turn(engine, "acme", queued[1].turn_id)
    assert view is not None and view["final_output"] == "3"


def test_queued_turn__the_one_ahead_waits_for_approval__it_runs_meanwhile(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    turn_id, _ = transfer_turn(engine, tmp_path)
    with engine.begin() as conn:
        behind = start_turn(conn, ALICE, "conv-b", "meanwhile", when_busy="queue",
                            driver=f"scripted:{write_script(tmp_path / 'b.jsonl', [{'final': 'b'}])}")
    assert behind.state == "queued"
    # A turn waiting for a person is not running: the one queued behind it goes on
    assert drive(engine, settings, registry, turn_id) == "waiting_approval"
    assert turn_state(engine, behind.turn_id) == "running"
    assert drive(engine, settings, registry, behind.turn_id) == "succeeded"


def test_reconciler__queued_turn_whose_scope_is_free__is_promoted(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    from sqlalchemy import update

    from reconciler.sweep import Reconciler

    # Given a queued turn whose running predecessor was ended outside the loop (an operator)
    first = start(engine, write_script(tmp_path / "1.jsonl", [{"final": "one"}]))
    with engine.begin() as conn:
        behind = start_turn(conn, ALICE, "conv-b", "later", when_busy="queue",
                            driver=f"scripted:{write_script(tmp_path / 'b.jsonl', [{'final': 'b'}])}")
        conn.execute(update(turns).where(turns.c.turn_id == first).values(state="failed"))
    assert turn_state(engine, behind.turn_id) == "queued"
    # When the reconciler sweeps, then the queued turn runs
    report = Reconciler(settings, engine, registry).sweep()
    assert report.actions["turn_promoted"] == 1
    assert drive(engine, settings, registry, behind.turn_id) == "succeeded"


def test_decided_waiting_turns__several_waiting__only_the_decided_one_is_found(
    engine: Engine, settings: Settings, ledger: Ledger, tmp_path: Path
) -> None:
    # Given two users' turns, each waiting for an approval
    waiting = []
    for principal in ("alice", "erin"):
        script = write_script(tmp_path / f"{principal}.jsonl", [
            calls("ledger.transfer", "t1", source_account="acme-1", target_account="acme-2",
                  amount_cents=60_000),
            {"final": "ok"},
        ])
        turn_id = start(engine, script, context=ALICE.model_copy(update={"principal": principal}))
        assert drive(engine, settings, registry, turn_id) == "waiting_approval"
        waiting.append(turn_id)
    # When only the second one's approval is decided
    with engine.begin() as conn:
        store.approve(conn, pending_approval_id(engine, waiting[1]), approver=APPROVER, registry=registry)
    # Then only it is ready to wake (each turn's own last step decides, not any turn's)
    with engine.connect() as conn:
        assert turn_store.decided_waiting_turns(conn, 10) == [waiting[1]]
