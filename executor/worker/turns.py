"""Run one turn: reserve → (ask the model → checkpoint → enqueue → wait)* → end.

The broker message carries only the turn id; the database is the truth. The
loop's decisions are `executor.turns.loop.next_action` (pure); this module
performs them under the turn's lease (`executor.store.turns`):

- a model step is asked only when it is not recorded yet, and is checkpointed
  (`record_step`, a CAS on the owner and the step count) *before* its calls are
  enqueued, so a resumed turn reads the step back instead of asking again;
- a step's calls are enqueued with request id `<turn>.s<step>` in a transaction
  that first renews the turn's lease (the owner's fence): operation ids derive
  from (tenant, request, call), so a resumed turn re-enqueues the same
  operations and reads their stored results, and nothing runs twice;
- waiting for calls holds the worker at most `turn_wait_seconds`, then the job
  gives the turn back and schedules itself again (`release_turn`); a call
  waiting for a person makes the turn `waiting_approval` (no owner) until the
  reconciler sees the approval decided;
- a native step's provider-run calls are recorded through the application's
  hosted policy in the transaction that checkpoints the step
  (`executor.worker.turn_hosted`);
- a driver that keeps failing ends the turn `driver_failed`: `failed` when its
  error is permanent (not worth another attempt: it can never answer this
  turn), `fallback` when a transient one outlasted the attempts;
- a worker that dies leaves its lease to expire: the next delivery of the
  message (or the reconciler's requeue) takes the turn over with a new
  generation, which fences every write of the dead one.
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from executor.core.admission import offered_to
from executor.core.states import TurnState
from executor.core.surfaces import (
    Target,
    TurnSurface,
    UnknownSurface,
    Writes,
    checked_targets,
    surface_of,
    targets_block,
)
from executor.core.tools import Mode, Registry, Tool
from executor.core.types import CallStatus, ServerContext
from executor.faults import Faults
from executor.providers import SURFACES
from executor.providers.hosted import NO_HOSTED_TOOLS, HostedCall, HostedPolicy, load_hosted_policy
from executor.settings import Settings
from executor.store import new_owner_token
from executor.store import turns as turn_store
from executor.store.engine import read_only
from executor.store.errors import CONNECTION_ERRORS
from executor.telemetry import logcontext, metrics, tracing
from executor.turns import audit as audit_hook
from executor.turns.contract import (
    ContractError,
    Final,
    Nothing,
    Parsed,
    ToolCalls,
    parse_json_contract,
    proposals_to_json,
)
from executor.turns.drivers import Driver, DriverError
from executor.turns.loop import Audit, AwaitCalls, CallModel, End, Enqueue, WaitApproval, next_action
from executor.turns.native import hosted_calls, parse_response
from executor.turns.prompt import CompletedStep, assemble_prompt, audit_prompt, tool_specs
from executor.turns.service import TURN_ID_MAX_CHARS, step_record
from executor.turns.specs import load_driver
from executor.turns.values import (
    JSON_MODE,
    EndReason,
    ModelRequest,
    ModelResponse,
    StepOutcome,
    StepRecord,
    TurnOptions,
    Usage,
    step_request_id,
)
from executor.worker.turn_hosted import record_hosted
from outbox.producer import AdmissionUnavailable, enqueue
from outbox.results import final, results

log = logging.getLogger("toolfence.turns")

POLL_SECONDS = 0.1
DRIVER_ATTEMPTS = 3
RELEASE_DELAY_SECONDS = 0.5
# A tool's hook could not reach what it reads when the step's calls were admitted.
UNAVAILABLE_RETRY_SECONDS = 2.0


# The ends whose reason is the last step's error (the turn's `error` repeats it).
_STEP_ERROR_REASONS = frozenset({
    EndReason.CONTRACT_ERROR, EndReason.RESPONSE_REFUSED, EndReason.AUDIT_FAILED,
    EndReason.HOSTED_CALL_NOT_ALLOWED, EndReason.HOSTED_APPROVAL_REQUIRED,
})


@dataclass(frozen=True)
class TurnOutcome:
    """What one turn message did (a bounded label, for metrics and tests)."""

    label: str
    state: str | None = None


def _step_of(action: object) -> int | None:
    """The step an action of the loop is about (None for the end)."""
    step = getattr(action, "step", None)
    return step.step if isinstance(step, StepRecord) else step if isinstance(step, int) else None


class _TurnHeartbeat(threading.Thread):
    """Renews the turn's lease every third of it (CAS on turn, generation, owner)."""

    def __init__(self, engine: Engine, lease: turn_store.TurnLease, lease_seconds: float) -> None:
        super().__init__(name=f"turn-heartbeat-{lease.turn_id}", daemon=True)
        self._engine, self._lease, self._seconds = engine, lease, lease_seconds
        self._stop_event, self._lost = threading.Event(), threading.Event()
        self._deadline = time.monotonic() + lease_seconds * 0.9
        # A thread starts with no context of its own: its records carry the turn's ids.
        self._log_context = contextvars.copy_context()

    def owned(self) -> bool:
        return not self._lost.is_set() and time.monotonic() < self._deadline

    def run(self) -> None:
        self._log_context.run(self._renew_until_stopped)

    def _renew_until_stopped(self) -> None:
        while not self._stop_event.wait(self._seconds / 3.0):
            sent_at = time.monotonic()
            try:
                with self._engine.begin() as conn:
                    won = turn_store.renew_turn(
                        conn, self._lease.turn_id, self._lease.generation, self._lease.owner_token,
                        self._seconds,
                    )
            except Exception:
                log.warning("turn lease renewal failed to reach the database", exc_info=True)
                continue
            if not won:
                self._lost.set()
                return
            self._deadline = sent_at + self._seconds * 0.9

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=5)


class TurnRunner:
    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        engine: Engine,
        *,
        drivers: Callable[[str], Driver] = load_driver,
        hosted_policy: HostedPolicy | None = None,
    ) -> None:
        self.settings = settings
        # Loaded once per process, like the registry: TOOLFENCE_HOSTED_POLICY's.
        self.hosted_policy = (
            hosted_policy if hosted_policy is not None else load_hosted_policy(settings.hosted_policy)
        )
        self.registry = registry
        self.engine = engine
        self.reader = read_only(engine)
        self._load_driver = drivers
        self._drivers: dict[str, Driver] = {}
        self.faults = Faults(settings)

    def drivers(self, spec: str) -> Driver:
        """One driver per spec per process: an SDK driver keeps its client (and its
        connection pool) from step to step."""
        driver = self._drivers.get(spec)
        if driver is None:
            driver = self._drivers[spec] = self._load_driver(spec)
        return driver

    # ----------------------------------------------------------------- entry

    def handle(self, turn_id: object) -> TurnOutcome:
        # The turn's id (and, as they become known, its tenant and step) on every record
        # logged while it runs, its heartbeat thread's included.
        known = turn_id if isinstance(turn_id, str) else None
        with logcontext.log_context(turn_id=known and known[:TURN_ID_MAX_CHARS]):
            outcome = self._handle(turn_id)
        metrics.TURN_MESSAGES.labels(outcome.label).inc()
        return outcome

    def _handle(self, turn_id: object) -> TurnOutcome:
        if not isinstance(turn_id, str) or not 0 < len(turn_id) <= TURN_ID_MAX_CHARS:
            return TurnOutcome("bad_message")
        with self.reader.connect() as conn:
            row = turn_store.get_turn(conn, turn_id)
        if row is None:
            return TurnOutcome("unknown_turn")
        if row.state != TurnState.RUNNING.value:
            # A duplicate or late delivery: waiting or ended, nothing to run.
            return TurnOutcome("duplicate", row.state)
        lease = self._acquire(turn_id)
        if lease is None:
            return TurnOutcome("owned_elsewhere", row.state)
        if lease.took_over:
            metrics.TURN_RESUMES.inc()
        heartbeat = _TurnHeartbeat(self.engine, lease, self.settings.lease_seconds)
        heartbeat.start()
        try:
            return self._run(row, lease, heartbeat)
        finally:
            heartbeat.stop()

    def _acquire(self, turn_id: str) -> turn_store.TurnLease | None:
        owner = new_owner_token()
        with self.engine.begin() as conn:
            lease = turn_store.reserve_turn(conn, turn_id, owner, self.settings.lease_seconds)
        if lease is not None:
            return lease
        # A redelivered message (its worker died) usually arrives while the dead owner's
        # lease still runs: wait it out once, then take over; a live owner renews
        # meanwhile and the reservation simply loses.
        with self.reader.connect() as conn:
            remaining = turn_store.turn_lease_remaining(conn, turn_id)
        if remaining is None or not 0 < remaining <= self.settings.lease_seconds:
            return None
        time.sleep(remaining + 0.05)
        with self.engine.begin() as conn:
            return turn_store.reserve_turn(conn, turn_id, owner, self.settings.lease_seconds)

    # ----------------------------------------------------------------- the loop

    def _run(self, row: Any, lease: turn_store.TurnLease, heartbeat: _TurnHeartbeat) -> TurnOutcome:
        context = ServerContext.from_json(json.loads(row.context))
        logcontext.bind(tenant=context.tenant)
        options = TurnOptions.from_json(json.loads(row.options))
        try:
            # The surface as this worker's registry declares it now (fail closed).
            surface = surface_of(self.registry, context)
        except UnknownSurface:
            return self._end(
                lease, [], End(TurnState.FAILED, EndReason.UNKNOWN_SURFACE), options,
                error={"code": EndReason.UNKNOWN_SURFACE.value, "message": "its surface is not declared"},
            )
        cards = surface is not None and surface.writes is Writes.APPROVAL
        wait_until = time.monotonic() + self.settings.turn_wait_seconds
        enqueued: set[int] = set()
        while True:
            if not heartbeat.owned():
                return TurnOutcome("lost_ownership")
            with self.reader.connect() as conn:
                steps = [step_record(r) for r in turn_store.steps_of(conn, lease.turn_id)]
            action = next_action(steps, None, options, cards=cards)
            logcontext.bind(step=_step_of(action))
            if isinstance(action, Enqueue):
                if action.step.step not in enqueued:
                    try:
                        if not self._enqueue(lease, context, action.step):
                            return TurnOutcome("lost_ownership")
                    except AdmissionUnavailable as exc:
                        return self._release_unavailable(lease, exc)
                    enqueued.add(action.step.step)
                action = next_action(steps, self._statuses(context, action.step), options, cards=cards)
                logcontext.bind(step=_step_of(action))

            if isinstance(action, AwaitCalls):
                if time.monotonic() >= wait_until:
                    with self.engine.begin() as conn:
                        won = turn_store.release_turn(conn, lease, delay_seconds=RELEASE_DELAY_SECONDS)
                    return TurnOutcome("released" if won else "lost_ownership")
                time.sleep(POLL_SECONDS)
                continue
            if isinstance(action, WaitApproval):
                with self.engine.begin() as conn:
                    won = turn_store.wait_for_approval(conn, lease)
                return TurnOutcome("waiting_approval" if won else "lost_ownership", "waiting_approval")
            if isinstance(action, CallModel):
                self.faults.fire("turn_before_model", f"step{action.step}")
                try:
                    targets = self._targets(surface, context)
                except CONNECTION_ERRORS as exc:
                    return self._release_unavailable(lease, exc)
                recorded = self._model_step(row, lease, context, steps, action, options, surface, targets)
                if recorded is None:
                    error = self._driver_error or {}
                    # A permanent error: this driver can never answer the turn.
                    state = TurnState.FALLBACK if error.get("retryable", True) else TurnState.FAILED
                    return self._end(lease, steps, End(state, EndReason.DRIVER_FAILED), options, error=error)
                if not recorded:
                    return TurnOutcome("lost_ownership")
                self.faults.fire("turn_step_recorded", f"step{action.step}")
                continue
            if isinstance(action, Audit):
                if not self._audit_step(row, lease, context, steps, action, options):
                    return TurnOutcome("lost_ownership")
                continue
            if isinstance(action, End):
                return self._end(lease, steps, action, options)
            raise AssertionError(f"unhandled action {action!r}")  # pragma: no cover

    # ----------------------------------------------------------------- calls

    def _enqueue(self, lease: turn_store.TurnLease, context: ServerContext, step: StepRecord) -> bool:
        """The step's calls as operations, in a transaction fenced by the turn's lease."""
        with (
            logcontext.log_context(request_id=step.request_id), tracing.resumed(step.trace_context),
            self.engine.begin() as conn,
        ):
            if not turn_store.renew_turn(
                conn, lease.turn_id, lease.generation, lease.owner_token, self.settings.lease_seconds
            ):
                return False
            # The step's listed items travel with its calls: admitted against them here,
            # and re-checked against them by the worker that runs each call.
            enqueue(
                conn, list(step.proposals),
                context.model_copy(update={"request_id": step.request_id, "offered": step.offered}),
                self.registry,
            )
        return True

    def _release_unavailable(self, lease: turn_store.TurnLease, exc: BaseException) -> TurnOutcome:
        """A tool's hook lost its connection while the step's calls were admitted
        (`AdmissionUnavailable`), or the surface's target source lost its own before a
        model step: nothing of the step was recorded. The turn is given back and its
        job scheduled again shortly, rather than failing the job and leaving the turn
        owned until its lease expires and a sweep finds it."""
        # A driver's own text may quote the row it read: only the class of one is logged.
        shown = exc if isinstance(exc, AdmissionUnavailable) else type(exc).__name__
        log.warning(
            "turn %s: %s; it is taken up again in %.1f s", lease.turn_id, shown, UNAVAILABLE_RETRY_SECONDS
        )
        with self.engine.begin() as conn:
            won = turn_store.release_turn(conn, lease, delay_seconds=UNAVAILABLE_RETRY_SECONDS)
        return TurnOutcome("released" if won else "lost_ownership")

    def _statuses(self, context: ServerContext, step: StepRecord) -> list[CallStatus]:
        return results(self.reader, context.tenant, step.request_id)

    def _history(self, context: ServerContext, steps: Sequence[StepRecord]) -> list[CompletedStep]:
        history: list[CompletedStep] = []
        for step in steps:
            if not step.proposals:
                continue
            by_call = {s.call_id: final(s) for s in self._statuses(context, step)}
            history.append(CompletedStep(
                step.step,
                tuple((p, by_call[p.call_id]) for p in step.proposals if p.call_id in by_call),
            ))
        return history

    def _exposed(self, context: ServerContext, *, reads_only: bool = False) -> list[Tool[Any]]:
        exposed = []
        for name in self.registry.names():
            tool = self.registry.get(name)
            if tool is None or not offered_to(self.registry, tool, context):
                continue
            if reads_only and tool.mode is not Mode.READ:
                continue
            exposed.append(tool)
        return exposed

    def _targets(self, surface: TurnSurface | None, context: ServerContext) -> tuple[Target, ...] | None:
        """The requester's items the surface lists at this step (None: it lists none),
        read on a read-only connection and checked (`checked_targets`). A source that
        raises lists nothing (the model is told so, and a listed argument is then
        refused); one that lost its connection raises it, so the turn is given back."""
        if surface is None or surface.targets is None:
            return None
        try:
            with self.reader.connect() as conn:
                return checked_targets(surface, surface.targets(conn, context))
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:
            log.error("surface %s: its target source failed (%s); nothing is listed",
                      surface.name, type(exc).__name__)
            return ()

    # ----------------------------------------------------------------- model steps

    _driver_error: dict[str, Any] | None = None

    def _ask(self, driver: Driver, request: ModelRequest) -> ModelResponse | None:
        """The driver's answer, retrying a retryable failure; None when it kept failing."""
        for attempt in range(DRIVER_ATTEMPTS):
            started = time.perf_counter()
            try:
                response = driver.call(request)
            except DriverError as exc:
                metrics.MODEL_CALLS.labels(request.purpose, "driver_error").inc()
                self._driver_error = {"code": exc.code, "message": str(exc)[:500], "retryable": exc.retryable}
                if not exc.retryable or attempt == DRIVER_ATTEMPTS - 1:
                    return None
                time.sleep(0.5 * 2**attempt)
                continue
            except Exception as exc:  # an SDK's own error type: the driver failed
                metrics.MODEL_CALLS.labels(request.purpose, "driver_error").inc()
                self._driver_error = {
                    "code": "driver_exception", "message": type(exc).__name__, "retryable": True,
                }
                if attempt == DRIVER_ATTEMPTS - 1:
                    return None
                time.sleep(0.5 * 2**attempt)
                continue
            metrics.MODEL_LATENCY_SECONDS.labels(request.purpose).observe(time.perf_counter() - started)
            metrics.MODEL_TOKENS.labels(request.purpose, "input").inc(response.usage.input_tokens)
            metrics.MODEL_TOKENS.labels(request.purpose, "output").inc(response.usage.output_tokens)
            return response
        return None

    def _model_step(
        self, row: Any, lease: turn_store.TurnLease, context: ServerContext,
        steps: Sequence[StepRecord], action: CallModel, options: TurnOptions,
        surface: TurnSurface | None = None, targets: tuple[Target, ...] | None = None,
    ) -> bool | None:
        """Ask for step `action.step` and checkpoint it. True: recorded; False: ownership
        lost; None: the driver kept failing (nothing recorded)."""
        try:
            driver = self.drivers(row.driver)
        except DriverError as exc:
            self._driver_error = {"code": exc.code, "message": str(exc)[:500], "retryable": exc.retryable}
            return None
        tools = self._exposed(context)
        prompt = assemble_prompt(
            requester=context.principal, message=row.message, tools=tool_specs(tools),
            history=self._history(context, steps), mode=driver.mode,
            surface_instructions=surface.prompt_instructions() if surface is not None else "",
            listed=targets_block(targets) if targets is not None else "",
        )
        native_tools: tuple[Any, ...] = ()
        if driver.mode != JSON_MODE:
            native_tools = tuple(SURFACES[driver.mode].export_tools(self.registry, context))
        request = ModelRequest(
            purpose="turn", prompt=prompt, tools=tool_specs(tools), turn_id=lease.turn_id,
            call_index=action.call_index, native_tools=native_tools,
            # A paused response may be continued with what is left of the step budget.
            max_continuations=max(0, options.max_steps - action.call_index),
        )
        with tracing.chat_span(row.trace_context, lease.turn_id, action.step, driver) as chat:
            response = self._ask(driver, request)
            if response is not None:
                chat.answered(response.usage)
        if response is None:
            return None
        parsed = self._parse(driver, response)
        hosted: list[HostedCall] = []
        if driver.mode != JSON_MODE and response.raw is not None:
            read = hosted_calls(driver.mode, response.raw)
            if isinstance(read, ContractError):
                parsed = parsed if isinstance(parsed, ContractError) else read
            else:
                hosted = read
        outcome = {
            ToolCalls: StepOutcome.TOOL_CALLS, Final: StepOutcome.FINAL, Nothing: StepOutcome.NOTHING,
            ContractError: StepOutcome.CONTRACT_ERROR,
        }[type(parsed)]
        metrics.MODEL_CALLS.labels(
            "turn", "contract_error" if isinstance(parsed, ContractError) else "ok"
        ).inc()
        request_id = step_request_id(lease.turn_id, action.step)
        with self.engine.connect() as conn, conn.begin() as transaction:
            # The owner's fence first: a stale owner records no hosted call either.
            if hosted and not turn_store.renew_turn(
                conn, lease.turn_id, lease.generation, lease.owner_token, self.settings.lease_seconds
            ):
                return False  # (no hosted calls: record_step's own owner check fences the step)
            # A surface runs no provider-run call unless it says so: one already
            # happened at the provider, so it can never be a card.
            policy = self.hosted_policy if surface is None or surface.hosted else NO_HOSTED_TOOLS
            stop = record_hosted(
                conn, self.registry, context.model_copy(update={"request_id": request_id}), hosted, policy,
            )
            error = stop or (parsed.to_json() if isinstance(parsed, ContractError) else None)
            if not turn_store.record_step(
                conn, lease, step=action.step, outcome=outcome.value,
                proposals=proposals_to_json(parsed.proposals) if isinstance(parsed, ToolCalls) else [],
                request_id=request_id, usage=response.usage.to_json(),
                final_output=parsed.text if isinstance(parsed, Final) else None, error=error,
                offered=None if targets is None else [t.id for t in targets],
                trace_context=chat.stored,
            ):
                transaction.rollback()  # the hosted records go with the lost checkpoint
                return False
        return True

    def _parse(self, driver: Driver, response: ModelResponse) -> Parsed:
        if driver.mode == JSON_MODE:
            return parse_json_contract(response.text or "")
        if response.raw is None:
            return ContractError("no_response", "the native driver returned no response", "")
        return parse_response(driver.mode, response.raw, self.registry.names())

    def _audit_step(
        self, row: Any, lease: turn_store.TurnLease, context: ServerContext,
        steps: Sequence[StepRecord], action: Audit, options: TurnOptions,
    ) -> bool:
        """Ask the audit hook about the candidate and checkpoint its verdict. A failure
        or a timeout is a verdict too (`failed`): the candidate is emitted."""
        reads = self._exposed(context, reads_only=True)
        started = time.perf_counter()
        usage = Usage(model="", purpose="audit")
        outcome = audit_hook.failed("audit_not_configured")
        if options.audit_driver:
            request = ModelRequest(
                purpose="audit",
                prompt=audit_prompt(
                    requester=context.principal, message=row.message,
                    candidate=action.candidate.final_output or "", read_tools=tool_specs(reads),
                    history=self._history(context, steps),
                ),
                tools=tool_specs(reads), turn_id=lease.turn_id, call_index=action.call_index,
                read_only_tools=True,
            )
            outcome, usage = self._run_audit(options, request, {t.name for t in reads})
        metrics.AUDIT_VERDICTS.labels(outcome.verdict.value).inc()
        error = None
        if outcome.verdict is audit_hook.Verdict.FAILED:
            error = {"failure": outcome.failure, "excerpt": outcome.excerpt}
            usage = Usage(model=usage.model, purpose="audit", latency_seconds=time.perf_counter() - started)
        with self.engine.begin() as conn:
            return turn_store.record_step(
                conn, lease, step=action.step, outcome=StepOutcome.AUDIT.value,
                proposals=proposals_to_json(outcome.proposals),
                request_id=step_request_id(lease.turn_id, action.step), usage=usage.to_json(),
                final_output=outcome.question, error=error, verdict=outcome.verdict.value,
                # Its reads name what the answer it reviews was shown.
                offered=action.candidate.offered,
            )

    def _run_audit(
        self, options: TurnOptions, request: ModelRequest, read_names: set[str]
    ) -> tuple[audit_hook.AuditOutcome, Usage]:
        assert options.audit_driver is not None
        try:
            driver = self.drivers(options.audit_driver)
        except DriverError as exc:
            return audit_hook.failed(exc.code), Usage(model="", purpose="audit")
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="turn-audit")
        future = pool.submit(driver.call, request)
        try:
            response = future.result(timeout=options.audit_timeout_seconds)
        except FutureTimeout:
            metrics.MODEL_CALLS.labels("audit", "timeout").inc()
            return audit_hook.failed("timeout"), Usage(model="", purpose="audit")
        except Exception as exc:
            metrics.MODEL_CALLS.labels("audit", "driver_error").inc()
            code = exc.code if isinstance(exc, DriverError) else "driver_exception"
            return audit_hook.failed(code), Usage(model="", purpose="audit")
        finally:
            # Never wait for a timed-out call: a driver executes nothing, so leaving it
            # to finish in its own thread harms nothing.
            pool.shutdown(wait=False)
        metrics.MODEL_CALLS.labels("audit", "ok").inc()
        metrics.MODEL_TOKENS.labels("audit", "input").inc(response.usage.input_tokens)
        metrics.MODEL_TOKENS.labels("audit", "output").inc(response.usage.output_tokens)
        return audit_hook.parse_verdict(response.text or "", read_names), response.usage

    # ----------------------------------------------------------------- the end

    def _end(
        self, lease: turn_store.TurnLease, steps: Sequence[StepRecord], action: End,
        options: TurnOptions, error: dict[str, Any] | None = None,
    ) -> TurnOutcome:
        output = action.output if action.state is TurnState.SUCCEEDED else options.fallback_output
        if error is None and action.reason in _STEP_ERROR_REASONS and steps:
            error = dict(steps[-1].error or {})
        with self.engine.begin() as conn:
            won = turn_store.end_turn(
                conn, lease, state=action.state, end_reason=action.reason.value, final_output=output,
                error=error,
            )
        if not won:
            return TurnOutcome("lost_ownership")
        model_steps = [s for s in steps if s.outcome is not StepOutcome.AUDIT]
        metrics.TURNS_ENDED.labels(action.state.value, action.reason.value).inc()
        metrics.TURN_STEPS.labels(action.state.value).observe(len(model_steps))
        # Every turn that showed the fallback output (`failed` ones too: a driver that can
        # never answer must not slip past the fallback-rate alert), and an audit failure.
        if action.state is not TurnState.SUCCEEDED or action.reason is EndReason.AUDIT_FAILED:
            metrics.TURN_FALLBACKS.labels(action.reason.value).inc()
        return TurnOutcome(action.state.value, action.state.value)
