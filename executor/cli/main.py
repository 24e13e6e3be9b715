"""`toolfence`: one entry point, `--help` on every command.

A user mistake (bad URL, missing migration, unknown id, bad input file) is one
clear line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import threading
import traceback
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError, SQLAlchemyError

from executor import store
from executor.core.approvers import ApprovalDecision
from executor.core.identifiers import InvalidIdentifier
from executor.core.sanitize import exception_summary, sanitize_error_text
from executor.core.states import State
from executor.core.strictjson import StrictJSONError, loads_strict
from executor.core.tools import Registry
from executor.core.types import ErrorCode, ProposedCall, ServerContext
from executor.settings import Settings, SettingsError
from executor.store.engine import DatabaseSettingError, get_engine
from executor.store.errors import StoreDatabaseError
from executor.store.migrate import SchemaNotReady, migrate, require_schema

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from executor.providers import Surface
    from executor.providers.hosted import HostedPolicy

EXIT_USAGE = 2
EXIT_FAILURE = 1
# How long `toolfence relay` tries to reach the broker before its first pass.
RELAY_CONNECT_TIMEOUT_SECONDS = 5.0


class UserError(Exception):
    """A mistake the user can fix; printed as one line."""


def _settings() -> Settings:
    return Settings.from_env()


def _engine(settings: Settings, *, check_schema: bool = True) -> Any:
    if check_schema:
        _require_sqlite_file(settings.database_url)
    engine = get_engine(settings.database_url)
    if check_schema:
        require_schema(engine, settings.database_url)
    return engine


def _require_sqlite_file(url: str) -> None:
    """A SQLite file that does not exist yet needs `migrate`, not "cannot reach the database"
    (SQLite cannot open a file in a missing directory, and would create an empty one)."""
    if not url.startswith("sqlite"):
        return
    database = make_url(url).database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return
    if not Path(database).exists():
        raise SchemaNotReady(f"no database at {database}: run `toolfence migrate`")


def _registry(settings: Settings) -> Registry:
    """The tool registry named by TOOLFENCE_TOOLS; a module that will not load is one line."""
    from executor.core.tools import load_registry

    try:
        return load_registry(settings.tools_module)
    except Exception as exc:
        # Whatever the tools module raised (missing module or attribute, not a
        # Registry, an error at import): the user's configuration to fix.
        raise UserError(
            f"cannot load tools from TOOLFENCE_TOOLS={settings.tools_module!r}: "
            f"{type(exc).__name__}: {_first_line(exc)}"
        ) from exc


def _hosted_policy(settings: Settings) -> HostedPolicy:
    """The HostedPolicy named by TOOLFENCE_HOSTED_POLICY (`module:attribute`); unset,
    NO_HOSTED_TOOLS: every provider-run call is reported."""
    from executor.providers.hosted import NO_HOSTED_TOOLS, HostedPolicy

    if settings.hosted_policy is None:
        return NO_HOSTED_TOOLS
    refused = f"cannot load the hosted-tool policy TOOLFENCE_HOSTED_POLICY={settings.hosted_policy!r}"
    module_name, _, attribute = settings.hosted_policy.partition(":")
    if not module_name or not attribute:
        raise UserError(f"{refused}: expected module:attribute")
    try:
        policy = getattr(importlib.import_module(module_name), attribute)
    except Exception as exc:
        raise UserError(f"{refused}: {type(exc).__name__}: {_first_line(exc)}") from exc
    if not isinstance(policy, HostedPolicy):
        raise UserError(f"{refused}: {type(policy).__name__}, not a HostedPolicy")
    return policy


def _surface(name: str) -> Surface:
    from executor.providers import SURFACES

    surface = SURFACES.get(name)
    if surface is None:
        raise UserError(f"unknown provider surface {name!r}: one of {', '.join(SURFACES)}")
    return surface


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _print_json(value: Any) -> None:
    # ASCII-escaped: a lone surrogate or a terminal escape a model wrote cannot break
    # (or drive) the operator's terminal.
    print(json.dumps(value, indent=2, sort_keys=False, default=str, ensure_ascii=True))


def _shown(text: str | None) -> str | None:
    """Text from a producer's server context or an approver (request id, call id,
    actor) as an operator's output shows it: through the sanitiser, so a secret an
    application put there is redacted (and a control character dropped)."""
    return None if text is None else sanitize_error_text(text, 200)


# ---------------------------------------------------------------------- commands


def cmd_migrate(args: argparse.Namespace) -> int:
    settings = _settings()
    revision = migrate(settings.database_url)
    print(f"schema at revision {revision} ({_safe_url(settings.database_url)})")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    if args.pool == "threads":
        # One engine for all the threads of the process: a connection per thread at most.
        os.environ.setdefault("TOOLFENCE_DB_POOL_SIZE", str(max(5, min(args.concurrency, 64))))
    settings = _settings()
    _engine(settings)
    _registry(settings)  # fail here, not in the first task, when the tools do not load
    from celery import signals as celery_signals

    from executor.worker.celery_app import worker_app

    app = worker_app(settings)
    argv = [
        "worker",
        f"--loglevel={args.loglevel}",
        f"--concurrency={args.concurrency}",
        f"--pool={args.pool}",
        "-Q",
        settings.queue_name,
        "-n",
        args.name or f"toolfence-{os.getpid()}@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    # `worker_main` drops the status the worker chose (`app.start` discards what
    # Celery's command returns), so a worker that stopped on an "Unrecoverable
    # error" (a broker reset meeting a late ack, in the chaos campaign) exited 0 and
    # a supervisor restarting on failure only (systemd's Restart=on-failure) left
    # the fleet a worker short. The status is read off the WorkController itself.
    controllers: list[Any] = []

    def remember(sender: Any, **_: Any) -> None:
        controllers.append(sender)

    celery_signals.worker_init.connect(remember, weak=False)
    try:
        app.worker_main(argv)
    finally:
        celery_signals.worker_init.disconnect(remember)
    code = controllers[-1].exitcode if controllers else None
    return code if isinstance(code, int) else 0


def cmd_relay(args: argparse.Namespace) -> int:
    settings = _settings()
    engine = _engine(settings)
    from outbox.relay import Relay, celery_publishers

    if args.once:
        # One pass for a person or cron: an unreachable broker is an error to see,
        # not rows quietly left for a later pass.
        _check_broker(settings)
    publish, publish_turn, connect, close = celery_publishers(settings)
    if args.once:
        failures: list[Exception] = []

        def publish_noting_failures(operation_id: str) -> None:
            try:
                publish(operation_id)
            except Exception as exc:
                failures.append(exc)
                raise

        try:
            count = Relay(settings, engine, publish_noting_failures, publish_turn).run_once()
        finally:
            close()
        if failures:
            raise UserError(
                f"published {count}, {len(failures)} failed and stay queued for the next pass: "
                f"{type(failures[0]).__name__}: {_first_line(failures[0])}"
            )
        print(f"published {count}")
        return 0
    relay = Relay(settings, engine, publish, publish_turn)
    stop = threading.Event()
    _stop_on_signals(stop)
    # Connected before the first pass, so the first call after `ready` is not the one
    # that waits for the broker; at WARNING so the default log level shows it (the
    # fleet waits for this line, as for a worker's).
    connect(RELAY_CONNECT_TIMEOUT_SECONDS)
    logging.getLogger("toolfence.relay").warning("toolfence relay ready (pid %s)", os.getpid())
    try:
        relay.run_forever(stop)
    finally:
        close()
    return 0


def cmd_enqueue(args: argparse.Namespace) -> int:
    settings = _settings()
    surface = _surface(args.provider) if args.provider else None
    engine = _engine(settings)
    from outbox.producer import AdmissionUnavailable, HostedCalls, InvalidBatch, enqueue

    payload = _read_json_file(args.file, settings.max_argument_depth)
    registry = _registry(settings)
    hosted: HostedCalls | None = None
    if surface is not None:
        from executor.providers import AdapterError, AdapterErrorCode

        refused = f"cannot read {args.file} ({surface.name} response)"
        if not isinstance(payload, dict):
            raise UserError(
                f"{refused}: {AdapterErrorCode.MALFORMED_ENVELOPE.value}: "
                f"the file holds a JSON {_json_kind(payload)}, not an object"
            )
        try:
            calls = surface.read_proposals(payload, known_names=registry.names())
            # What the provider ran itself is recorded too, against the application's
            # hosted-tool policy: one outside it is reported, never silent.
            hosted = HostedCalls(surface.read_hosted_calls(payload), _hosted_policy(settings))
        except AdapterError as exc:
            raise UserError(f"{refused}: {exc.code.value}: {exc.message}") from None
    else:
        calls = _neutral_calls(payload)
    context = ServerContext(
        principal=args.principal,
        tenant=args.tenant,
        roles=frozenset(r for r in args.roles.split(",") if r),
        request_id=args.request_id or f"req_{uuid.uuid4().hex[:16]}",
        conversation_id=args.conversation_id,
        turn_id=args.turn_id,
    )
    try:
        # Enqueueing the same request again is idempotent: same calls → their stored
        # statuses, a call id reused for another call → idempotency_conflict.
        with engine.begin() as conn:
            handle = enqueue(conn, calls, context, registry, budgets=settings.budgets, hosted=hosted)
    except (InvalidBatch, InvalidIdentifier) as exc:
        raise UserError(f"{exc.code}: {exc}") from None
    except AdmissionUnavailable as exc:
        raise UserError(
            f"{ErrorCode.UPSTREAM_UNAVAILABLE.value}: {exc}; nothing was recorded, run it again"
        ) from None
    _print_json(
        {
            "request_id": handle.request_id,
            "calls": [
                {"call_id": c.call_id, "operation_id": c.operation_id, **c.status.model_dump(mode="json")}
                for c in handle.calls
            ],
        }
    )
    return 0


def _neutral_calls(payload: Any) -> list[ProposedCall]:
    items = payload.get("calls") if isinstance(payload, dict) else payload
    if not isinstance(items, list):
        raise UserError('the file must hold a list of calls or {"calls": [...]}')
    calls = []
    for index, item in enumerate(items):
        if not isinstance(item, dict) or not {"call_id", "tool_name", "arguments"} <= item.keys():
            raise UserError(f"call #{index} needs call_id, tool_name and arguments")
        try:
            calls.append(ProposedCall.model_validate(item))
        except ValueError:
            raise UserError(
                f"call #{index}: call_id and tool_name must be strings, "
                "arguments a JSON string or an object"
            ) from None
    return calls


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return "number"


def cmd_results(args: argparse.Namespace) -> int:
    settings = _settings()
    surface = _surface(args.provider) if args.provider else None
    engine = _engine(settings)
    from outbox.producer import final, request_exists, results, wait_for_results

    with engine.connect() as conn:
        if not request_exists(conn, args.tenant, args.request_id):
            raise UserError(f"no request {args.request_id!r} for tenant {args.tenant!r}")
    statuses = (
        wait_for_results(engine, args.tenant, args.request_id, timeout=args.wait)
        if args.wait
        else results(engine, args.tenant, args.request_id)
    )
    if surface is not None:
        from executor.providers import AdapterError

        # The calls table keeps each proposal's id and tool name; a call still pending is
        # answered with the code that says why (approval_required, …), as `final` decides.
        proposals = [ProposedCall(call_id=s.call_id, tool_name=s.tool_name, arguments="{}") for s in statuses]
        try:
            written = surface.write_results(proposals, [final(s) for s in statuses])
        except AdapterError as exc:
            raise UserError(
                f"cannot write request {args.request_id!r} ({surface.name} results): "
                f"{exc.code.value}: {exc.message}"
            ) from None
        _print_json(written)
        return 0
    _print_json([s.model_dump(mode="json") for s in statuses])
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from executor.store import operator

    engine = _engine(_settings())
    with engine.connect() as conn:
        # Another tenant's operation is answered like one that does not exist.
        record = operator.operation_record(conn, args.operation_id, tenant=args.tenant)
    if record is None:
        raise UserError(f"no operation {args.operation_id!r} for tenant {args.tenant!r}")
    row = record.row
    _print_json(
        {
            "operation_id": row.operation_id,
            "tenant": row.tenant,
            "request_id": _shown(row.request_id),
            "call_id": _shown(row.call_id),
            "tool": row.tool_name,
            "state": row.state,
            "generation": row.generation,
            "attempts": row.attempts,
            "error_code": row.error_code,
            "cause": operator.operation_cause(row),
            # Operator view: for `approval_scope_exceeded`, the approved and changed sets.
            "error": json.loads(row.error) if row.error else None,
            "receipt": _shown(row.receipt),
            "receipts": [
                {"receipt": _shown(r.receipt), "generation": r.generation, "accepted": r.accepted}
                for r in record.receipts
            ],
            "audit": [
                {
                    "at": e.at,
                    "from": e.from_state,
                    "to": e.to_state,
                    "decision": e.decision_code,
                    "generation": e.generation,
                    "actor": _shown(e.actor),
                }
                for e in record.audit
            ],
        }
    )
    return 0


def cmd_approvals(args: argparse.Namespace) -> int:
    from executor.store import operator

    engine = _engine(_settings())
    with engine.connect() as conn:
        rows = operator.pending_approvals(conn, tenant=args.tenant)
        hosted = store.pending_hosted_approvals(conn, tenant=args.tenant)
    _print_json(
        [
            {
                "approval_id": r.approval_id,
                "operation_id": r.operation_id,
                "tenant": r.tenant,
                "tool": r.tool_name,
                "impact": r.impact,
                "intent_hash": r.intent_hash,
                "expires_at": r.expires_at,
            }
            for r in rows
        ]
        # Hosted MCP approvals (`hapr_…`): no operation; the impact is the redacted
        # server, tool and arguments of the provider's mcp_approval_request.
        + [
            {
                "approval_id": h.approval_id,
                "tenant": h.tenant,
                "request_id": _shown(h.request_id),
                "surface": h.surface,
                "tool": store.HOSTED_APPROVAL_TOOL,
                "impact": h.impact,
                "intent_hash": h.intent_hash,
                "expires_at": h.expires_at,
            }
            for h in hosted
        ]
    )
    return 0


def _approver(args: argparse.Namespace) -> ServerContext:
    """The approver's identity: who decides, of which tenant, with which roles. Never
    a free string: the tool's approver policy is checked against it."""
    if args.approver_context is not None:
        try:
            data = loads_strict(args.approver_context, max_bytes=65_536, max_depth=8)
            return ServerContext.from_json({"request_id": "cli-approval", **data})
        except (ValueError, TypeError, KeyError) as exc:
            raise UserError(
                "--approver-context must be a JSON object with principal, tenant and roles: "
                f"{type(exc).__name__}"
            ) from None
    if not args.approver_principal or not args.approver_tenant:
        raise UserError(
            "say who decides: --approver-principal and --approver-tenant "
            "(and --approver-role for each role), or --approver-context JSON"
        )
    return ServerContext(
        principal=args.approver_principal,
        tenant=args.approver_tenant,
        roles=frozenset(args.approver_role or ()),
        request_id="cli-approval",
    )


def _decide_approval(args: argparse.Namespace, verb: ApprovalDecision) -> store.Decision:
    """approve or deny through the store, which checks the approver; a refusal is
    committed (it is audited) before it is reported."""
    from executor.telemetry import metrics

    settings = _settings()
    engine = _engine(settings)
    registry = _registry(settings)
    approver = _approver(args)
    try:
        if args.approval_id.startswith(store.HOSTED_APPROVAL_PREFIX):
            decision = _decide_hosted_approval(args, verb, engine, registry, approver, settings)
        else:
            decision = _decide_operation_approval(args, verb, engine, registry, approver)
    except store.ApproverUnavailable as exc:
        raise UserError(
            f"{ErrorCode.UPSTREAM_UNAVAILABLE.value}: {exc}; {args.approval_id} stays pending, "
            "run it again"
        ) from None
    metrics.count_approval_decision(decision, verb)
    if decision.outcome is store.DecisionOutcome.APPROVER_NOT_ALLOWED:
        reason = decision.refusal.value if decision.refusal else "refused"
        raise UserError(
            f"approver_not_allowed: {approver.principal} may not {verb.value} "
            f"{args.approval_id} ({reason}); it stays pending"
        )
    if decision.outcome is store.DecisionOutcome.NOT_PENDING:
        raise UserError(f"approval {args.approval_id} is no longer pending (decided or expired)")
    return decision


def _decide_operation_approval(
    args: argparse.Namespace,
    verb: ApprovalDecision,
    engine: Engine,
    registry: Registry,
    approver: ServerContext,
) -> store.Decision:
    with engine.begin() as conn:
        if store.get_approval(conn, args.approval_id) is None:
            raise UserError(f"no approval {args.approval_id!r}")
        if verb is ApprovalDecision.APPROVE:
            return store.approve(conn, args.approval_id, approver=approver, registry=registry)
        return store.deny(
            conn, args.approval_id, approver=approver, registry=registry, reason=args.reason
        )


def _decide_hosted_approval(
    args: argparse.Namespace,
    verb: ApprovalDecision,
    engine: Engine,
    registry: Registry,
    approver: ServerContext,
    settings: Settings,
) -> store.Decision:
    """A hosted MCP approval (`hapr_…`): decided against the server's ApproverPolicy in
    TOOLFENCE_HOSTED_POLICY, by the same approver check as a tool's."""
    approvers_for = _hosted_policy(settings).approvers_for
    with engine.begin() as conn:
        if store.get_hosted_approval(conn, args.approval_id) is None:
            raise UserError(f"no approval {args.approval_id!r}")
        if verb is ApprovalDecision.APPROVE:
            return store.approve_hosted(
                conn, args.approval_id, approver=approver, approvers_for=approvers_for,
                registry=registry,
            )
        return store.deny_hosted(
            conn, args.approval_id, approver=approver, approvers_for=approvers_for,
            registry=registry, reason=args.reason,
        )


def cmd_approve(args: argparse.Namespace) -> int:
    _decide_approval(args, ApprovalDecision.APPROVE)
    print(f"approved {args.approval_id}")
    return 0


def cmd_deny(args: argparse.Namespace) -> int:
    _decide_approval(args, ApprovalDecision.DENY)
    print(f"denied {args.approval_id}")
    return 0


def cmd_reconcile(args: argparse.Namespace) -> int:
    settings = _settings()
    engine = _engine(settings)
    from reconciler.sweep import Reconciler

    _registry(settings)  # one clear line if the tools do not load
    reconciler = Reconciler.from_settings(settings, engine)
    if not args.every:
        report = reconciler.sweep()
        _print_json(report.as_dict())
        return 0
    stop = threading.Event()
    _stop_on_signals(stop)
    while not stop.is_set():
        try:
            report = reconciler.sweep()
            if report.total:
                logging.getLogger("toolfence.reconciler").info("sweep: %s", report.as_dict())
        except SQLAlchemyError as exc:
            logging.getLogger("toolfence.reconciler").error("sweep failed: %s", exception_summary(exc))
        stop.wait(args.every)
    return 0


def cmd_pending(args: argparse.Namespace) -> int:
    from executor.store import operator

    engine = _engine(_settings())
    with engine.connect() as conn:
        rows = operator.reconciliation_pending(conn, tenant=args.tenant, limit=args.limit)
    _print_json(
        [
            {
                "operation_id": r.operation_id,
                "tenant": r.tenant,
                "tool": r.tool_name,
                "request_id": r.request_id,
                "call_id": r.call_id,
                "generation": r.generation,
                "since": r.updated_at,
                "reason": operator.operation_reason(r),
                "cause": operator.operation_cause(r),
            }
            for r in rows
        ]
    )
    return 0


def cmd_resolve(args: argparse.Namespace) -> int:
    from executor.store import operator

    engine = _engine(_settings())
    to_state = operator.RESOLUTIONS[args.outcome]
    if to_state is State.SUCCEEDED and not args.reference:
        raise UserError("resolving as succeeded needs --reference (the downstream's id for the effect)")
    with engine.begin() as conn:
        if store.get_operation(conn, args.operation_id) is None:
            raise UserError(f"no operation {args.operation_id!r}")
        won = operator.resolve_pending(
            conn, args.operation_id, outcome=args.outcome, actor=args.actor,
            reference=args.reference, note=args.note or "",
        )
        if not won:
            raise UserError(f"operation {args.operation_id} is not reconciliation_pending")
    print(f"resolved {args.operation_id} as {to_state.value}")
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    settings = _settings()
    # No schema check here: the exporter must start (and report the outage through
    # toolfence_exporter_database_up) exactly when the database is unreachable.
    from executor.telemetry.exporter import serve

    serve(settings, args.port, args.host)
    return 0


def cmd_turn_start(args: argparse.Namespace) -> int:
    from executor.turns.drivers import DriverError, load_driver
    from executor.turns.service import TurnInProgress, start_turn
    from executor.turns.values import TurnOptions

    settings = _settings()
    engine = _engine(settings)
    driver = args.driver or settings.turn_driver
    if not driver:
        raise UserError("say which model runs the turn: --driver scripted:FILE (or TOOLFENCE_TURN_DRIVER)")
    if driver.startswith("scripted"):
        # The worker reads the script: a relative path would be relative to its cwd.
        kind, _, path = driver.partition(":")
        driver = f"{kind}:{Path(path).resolve()}"
    try:
        load_driver(driver)
    except DriverError as exc:
        raise UserError(f"--driver {args.driver!r}: {exc}") from None
    context = ServerContext(
        principal=args.principal, tenant=args.tenant,
        roles=frozenset(r for r in args.roles.split(",") if r), request_id="turn",
    )
    try:
        options = TurnOptions(
            max_steps=args.max_steps or settings.turn_max_steps, max_calls=args.max_calls,
            **({"fallback_output": args.fallback} if args.fallback is not None else {}),
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    try:
        with engine.begin() as conn:
            handle = start_turn(
                conn, context, args.conversation, args.message, driver=driver, options=options,
                when_busy=args.when_busy,
            )
    except TurnInProgress as exc:
        raise UserError(f"turn_in_progress: {exc}") from None
    print(handle.turn_id)
    if handle.state != "running":
        print(f"queued behind the running turn of this {settings.turn_scope}", file=sys.stderr)
    return 0


def cmd_turn_show(args: argparse.Namespace) -> int:
    from executor.turns.service import get_turn, turn_summary

    settings = _settings()
    engine = _engine(settings)
    view = get_turn(engine, args.tenant, args.turn_id)
    if view is None:
        raise UserError(f"no turn {args.turn_id!r} in tenant {args.tenant!r}")
    if args.json:
        _print_json(view)
    else:
        print(turn_summary(view))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings()
    engine = _engine(settings)
    registry = _registry(settings)
    from executor.http.server import HttpSettings, create_app, run

    http = HttpSettings.from_env()
    app = create_app(settings, registry, http=http, hosted_policy=_hosted_policy(settings), engine=engine)
    logging.getLogger("toolfence.serve").warning(
        "toolfence serve on http://%s:%d (console: /console)", args.host, args.port
    )
    run(app, args.host, args.port, http, log_level=args.log_level)
    return 0


def cmd_keys_create(args: argparse.Namespace) -> int:
    from executor.http.keys import create_key, parse_scopes

    engine = _engine(_settings())
    try:
        scopes = parse_scopes(s for item in args.scope for s in item.split(","))
        with engine.begin() as conn:
            key = create_key(
                conn, tenant=args.tenant, principal=args.principal,
                roles=[r for item in args.role for r in item.split(",") if r],
                scopes=scopes, label=args.label,
            )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    # The only time the secret is shown: it is stored as a hash.
    print(key)
    print("store it now: toolfence keeps only its hash", file=sys.stderr)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    from executor.store.api_keys import api_keys_of

    engine = _engine(_settings())
    with engine.connect() as conn:
        records = api_keys_of(conn, args.tenant)
    _print_json(
        [
            {
                "key_id": r.key_id, "tenant": r.tenant, "principal": r.principal,
                "roles": sorted(r.roles), "scopes": sorted(r.scopes), "label": r.label,
                "created_at": r.created_at, "revoked_at": r.revoked_at,
            }
            for r in records
        ]
    )
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from executor.http.keys import KeyRefused, split_key
    from executor.store.api_keys import revoke_api_key

    key_id = args.key_id
    if key_id.startswith("tfk_"):
        try:
            key_id = split_key(key_id)[0]
        except KeyRefused:
            raise UserError("that is not a toolfence key or key id") from None
    engine = _engine(_settings())
    with engine.begin() as conn:
        if not revoke_api_key(conn, key_id):
            raise UserError(f"no active key {key_id!r}")
    print(f"revoked {key_id}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from executor.cli.demo.run import run_demo

    return int(
        run_demo(
            calls=args.calls, workers=args.workers, lease_seconds=args.lease,
            serve_port=args.serve_port if args.serve else None,
        )
    )


# ---------------------------------------------------------------------- plumbing


def _stop_on_signals(stop: threading.Event) -> None:
    def handler(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _check_broker(settings: Settings) -> None:
    from executor.worker.celery_app import make_celery

    app = make_celery(settings)
    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0.5, timeout=5)
    except Exception as exc:
        # kombu's OperationalError for a refused connection, KeyError for an unknown
        # transport, ImportError for a transport whose library is missing.
        raise UserError(
            f"cannot reach the broker at {_safe_url(settings.broker_url)}: {_first_line(exc)}"
        ) from None
    finally:
        app.close()


MAX_INPUT_FILE_BYTES = 16 * 1024 * 1024
"""The largest input file `toolfence enqueue` reads (a response or a call list)."""
_ENVELOPE_DEPTH = 16
"""Nesting a provider envelope adds around a call's arguments."""


def _read_json_file(path: str, max_argument_depth: int) -> Any:
    """An input file, parsed strictly: at most `MAX_INPUT_FILE_BYTES`, nested at most
    the argument depth plus an envelope's, each key once (an object-form argument
    with a repeated key is refused like a text-form one), finite numbers, UTF-8."""
    try:
        if path == "-":
            stream = getattr(sys.stdin, "buffer", None)
            data = (
                stream.read(MAX_INPUT_FILE_BYTES + 1) if stream is not None
                else sys.stdin.read(MAX_INPUT_FILE_BYTES + 1).encode("utf-8", "surrogatepass")
            )
        else:
            with Path(path).open("rb") as handle:
                data = handle.read(MAX_INPUT_FILE_BYTES + 1)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return loads_strict(
            data, max_bytes=MAX_INPUT_FILE_BYTES, max_depth=max_argument_depth + _ENVELOPE_DEPTH
        )
    except StrictJSONError as exc:
        if exc.code in ("json_syntax", "not_utf8"):
            raise UserError(f"{path} is {exc}") from None
        raise UserError(f"{path} is not accepted: {exc.code}: {exc}") from None


def _safe_url(url: str) -> str:
    """The URL without its password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}" if ":" in creds else f"{scheme}://{user}@{host}"
    return url


class _NoHostnameWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No hostname was supplied")


_NO_HOSTNAME_WARNING = _NoHostnameWarning()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolfence",
        description="Admission, durable fenced execution and correlated results for LLM tool calls.",
        epilog="Configuration: TOOLFENCE_DATABASE_URL, TOOLFENCE_BROKER_URL (see README).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    add("migrate", cmd_migrate, "Create or upgrade the database schema (alembic).")

    p = add("demo", cmd_demo, "Run a real fleet on the embedded default and show it keep its promises.")
    p.add_argument("--calls", type=int, default=300, help="proposed calls in the workload")
    p.add_argument("--workers", type=int, default=2, help="worker processes")
    p.add_argument("--lease", type=float, default=3.0, help="lease seconds")
    p.add_argument(
        "--serve", action="store_true", help="also run the operator console, kept up after the report"
    )
    p.add_argument("--serve-port", type=int, default=8080, help="the console's port (with --serve)")

    p = add("worker", cmd_worker, "Start a Celery worker that executes operations.")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--pool", default="prefork", choices=["prefork", "threads", "solo"])
    p.add_argument("--loglevel", default="WARNING")
    p.add_argument("--name", default=None, help="Celery node name")

    p = add("relay", cmd_relay, "Publish outbox rows to the broker (runs until SIGTERM).")
    p.add_argument("--once", action="store_true", help="one pass, then exit")

    p = add("reconcile", cmd_reconcile, "Resolve crashed or stuck operations: one sweep (for cron).")
    p.add_argument("--every", type=float, default=0.0, metavar="SECONDS", help="loop, sweeping every N s")

    p = add("metrics", cmd_metrics, "Serve Prometheus metrics on /metrics.")
    p.add_argument("--port", type=int, default=9464)
    p.add_argument("--host", default="0.0.0.0")

    p = add("enqueue", cmd_enqueue, "Admit and enqueue calls from a JSON file (or - for stdin).")
    p.add_argument("file", help='neutral format: [{"call_id","tool_name","arguments"}, ...]')
    p.add_argument("--tenant", required=True, help="server context: tenant")
    p.add_argument("--principal", required=True, help="server context: principal")
    p.add_argument("--roles", default="member", help="comma-separated roles")
    p.add_argument("--request-id", default=None, help="scoped by tenant; enqueueing it again is idempotent")
    p.add_argument("--conversation-id", default=None, help="server context: conversation (budgets, repeats)")
    p.add_argument("--turn-id", default=None, help="server context: the conversation turn")
    p.add_argument("--provider", default=None, help="read the file as a provider response envelope")

    p = add("serve", cmd_serve, "Serve the HTTP API and the operator console (runs until SIGTERM).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument(
        "--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"]
    )

    keys = sub.add_parser(
        "keys", help="API keys of `toolfence serve`.", description="API keys of `toolfence serve`."
    )
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    p = keys_sub.add_parser(
        "create", help="Create a key and print it (once).", description="Create a key and print it once."
    )
    p.set_defaults(func=cmd_keys_create)
    p.add_argument("--tenant", required=True, help="the tenant the key acts for")
    p.add_argument("--principal", required=True, help="who the key is (audited as the actor)")
    p.add_argument(
        "--role", action="append", default=[], metavar="ROLE", help="a role (repeat, or comma-separate)"
    )
    p.add_argument(
        "--scope", action="append", required=True, metavar="SCOPE",
        help="produce, approve, operate or read (repeat, or comma-separate)",
    )
    p.add_argument("--label", default=None, help="a note for `keys list`")
    p = keys_sub.add_parser("list", help="List keys (never their secrets).", description="List keys.")
    p.set_defaults(func=cmd_keys_list)
    p.add_argument("--tenant", default=None)
    p = keys_sub.add_parser(
        "revoke", help="Revoke a key (at once, sessions included).", description="Revoke a key."
    )
    p.set_defaults(func=cmd_keys_revoke)
    p.add_argument("key_id", help="the key's id (from `keys list`) or the key itself")

    p = add("results", cmd_results, "Show one result per call of a request, in proposal order.")
    p.add_argument("request_id")
    p.add_argument("--tenant", required=True, help="the request's tenant (request ids are per tenant)")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS", help="wait until settled")
    p.add_argument("--provider", default=None, help="write results in a provider's envelope")

    p = add("show", cmd_show, "Show an operation: state, generations, receipts, audit trail.")
    p.add_argument("operation_id")
    p.add_argument("--tenant", required=True, help="the operation's tenant")

    p = add("approvals", cmd_approvals, "List calls waiting for approval, with their impact.")
    p.add_argument("--tenant", default=None, help="only this tenant's (default: every tenant's)")

    p = add("approve", cmd_approve, "Approve a pending call (single use, bound to its intent).")
    p.add_argument("approval_id")
    _approver_arguments(p)

    p = add("deny", cmd_deny, "Deny a pending call.")
    p.add_argument("approval_id")
    _approver_arguments(p)
    p.add_argument("--reason", default="denied")

    turn = sub.add_parser(
        "turn", help="Start a durable turn, or show one.",
        description="Durable turns: the loop owned by the server.",
    )
    turn_sub = turn.add_subparsers(dest="turn_command", required=True, metavar="COMMAND")
    p = turn_sub.add_parser("start", help="Start a turn (prints its id; a worker runs it).")
    p.set_defaults(func=cmd_turn_start)
    p.add_argument("message", help="the user's message")
    p.add_argument("--tenant", required=True, help="server context: tenant")
    p.add_argument("--principal", required=True, help="server context: principal")
    p.add_argument(
        "--roles", default="member", help="comma-separated roles (admission's, never the prompt's)"
    )
    p.add_argument("--conversation", required=True, help="the conversation the turn belongs to")
    p.add_argument("--driver", default=None, help="scripted:FILE, openai-chat:MODEL, anthropic:MODEL, …")
    p.add_argument("--max-steps", type=int, default=None, help="model steps before the turn ends fallback")
    p.add_argument("--max-calls", type=int, default=16, help="tool calls the turn may propose in all")
    p.add_argument("--fallback", default=None, help="what the user is told when the loop fails")
    p.add_argument(
        "--when-busy", choices=["refuse", "queue"], default=None,
        help="the user already has a running turn: refuse (turn_in_progress) or queue behind it",
    )
    p = turn_sub.add_parser("show", help="Show a turn: state, steps, calls with results, final output.")
    p.set_defaults(func=cmd_turn_show)
    p.add_argument("turn_id")
    p.add_argument("--tenant", required=True, help="the turn's tenant")
    p.add_argument("--json", action="store_true", help="the whole turn as JSON")

    p = add("pending", cmd_pending, "List operations waiting for a person (reconciliation_pending).")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--tenant", default=None, help="only this tenant's (default: every tenant's)")

    p = add("resolve", cmd_resolve, "Resolve a reconciliation_pending operation (audited).")
    p.add_argument("operation_id")
    p.add_argument("outcome", choices=["succeeded", "failed", "requeue"])
    p.add_argument("--actor", required=True, help="who decides (recorded in the audit trail)")
    p.add_argument("--reference", default=None, help="downstream id of the effect (for succeeded)")
    p.add_argument("--note", default=None)
    return parser


def _approver_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--approver-principal", help="who decides (recorded as decided_by)")
    p.add_argument("--approver-tenant", help="the approver's tenant: must be the operation's")
    p.add_argument(
        "--approver-role", action="append", default=[], metavar="ROLE",
        help="a role of the approver (repeat for each); the tool's approver policy names them",
    )
    p.add_argument(
        "--approver-context", default=None, metavar="JSON",
        help='instead of the three above: {"principal": ..., "tenant": ..., "roles": [...]}',
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # The embedded broker URL (filesystem://) has no host by design; kombu warns anyway.
    logging.getLogger("kombu.connection").addFilter(_NO_HOSTNAME_WARNING)  # once: same instance
    try:
        return int(args.func(args))
    except UserError as exc:
        return _fail(str(exc), EXIT_FAILURE, args.verbose)
    except (SettingsError, DatabaseSettingError, SchemaNotReady) as exc:
        return _fail(str(exc), EXIT_USAGE, args.verbose)
    except ArgumentError as exc:
        return _fail(f"invalid database URL: {_first_line(exc)}", EXIT_USAGE, args.verbose)
    except OperationalError as exc:
        reason = _first_line(exc.orig) if exc.orig else "connection failed"
        return _fail(f"cannot reach the database: {reason}", EXIT_FAILURE, args.verbose)
    except StoreDatabaseError as exc:
        return _fail(f"database error: {exc}", EXIT_FAILURE, args.verbose)
    except DBAPIError as exc:
        # Not a connection failure: a file that is not a database, a schema someone
        # else changed. The driver's first line says which; -v shows the rest.
        reason = _first_line(exc.orig) if exc.orig else _first_line(exc)
        return _fail(f"database error: {reason}", EXIT_FAILURE, args.verbose)
    except OSError as exc:
        # A path that cannot be created or written (TOOLFENCE_HOME, a SQLite file).
        where = f": {exc.filename}" if exc.filename else ""
        return _fail(f"{exc.strerror or _first_line(exc)}{where}", EXIT_FAILURE, args.verbose)
    except KeyboardInterrupt:
        return 130
    except (RecursionError, ValueError, UnicodeError, MemoryError) as exc:
        # Input no check above foresaw; its message may quote it, so only its type.
        return _fail(f"invalid input ({type(exc).__name__})", EXIT_FAILURE, args.verbose)
    except Exception as exc:
        return _fail(
            f"internal error ({type(exc).__name__}); run with -v for the traceback",
            EXIT_FAILURE, args.verbose,
        )
    finally:
        _forget_handled_interrupt()


def _forget_handled_interrupt() -> None:
    """Keep the status we return when a Ctrl-C was caught and cleaned up after.

    CPython 3.11 marks a KeyboardInterrupt that leaves code run by `exec` or
    `eval` of a string (dataclasses, namedtuple and SQLAlchemy build methods that
    way) as unhandled, even when a caller above catches it; at exit the
    interpreter then kills itself with SIGINT, after our cleanup, so `toolfence
    demo` interrupted mid-run died by signal instead of exiting 130 (one CI run
    in many). Running a string through `exec` resets that mark, and by the time
    `main` returns every interrupt has been handled.
    """
    exec("pass")  # noqa: S102 -- a constant; see the docstring


def _fail(message: str, exit_code: int, verbose: bool) -> int:
    """One line on stderr; with -v, the traceback too (for a bug report)."""
    if verbose:
        traceback.print_exc()
    print(f"toolfence: {message}", file=sys.stderr)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
