"""The Celery application: `toolfence.execute(operation_id)` and `toolfence.run_turn(turn_id)`.

Configuration follows docs/design.md §Defaults: late acks, reject on worker lost, prefetch 1,
JSON only, visibility timeout well above the hard time limit. Correctness never
depends on the broker delivering exactly once: the store's CAS does.

The configuration and the task names live in `executor.broker.app`, which the relay
publishes with; this module binds the tasks to a runner per worker process.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from contextvars import Token
from typing import TYPE_CHECKING, Any

from celery import Celery, signals
from celery.worker.consumer import Consumer

from executor.broker.app import TASK_NAME, TURN_TASK_NAME, make_celery
from executor.core.sanitize import exception_summary
from executor.core.tools import load_registry
from executor.errors import WorkerError
from executor.settings import Settings
from executor.store.engine import dispose_engines, get_engine
from executor.telemetry import logcontext, metrics, tracing
from executor.worker.runner import OperationRunner

if TYPE_CHECKING:
    from executor.worker.turns import TurnRunner

log = logging.getLogger("toolfence.worker")
# A message's id as a log field: the runner refuses longer ones as bad messages anyway.
MAX_LOGGED_ID_CHARS = 200


class CountingConsumer(Consumer):  # type: ignore[misc]
    """Counts undecodable messages (Celery logs and acknowledges them)."""

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        metrics.MESSAGES.labels("bad_message").inc()
        super().on_decode_error(message, exc)


# The worker process's state, set up in `worker_app()`.
_runner: OperationRunner | None = None
_turn_runner: TurnRunner | None = None
_settings: Settings | None = None


def _get_runner() -> OperationRunner:
    global _runner
    if _runner is None:
        settings = _settings or Settings.from_env()
        _runner = OperationRunner(
            settings, load_registry(settings.require_tools()), get_engine(settings.database_url)
        )
    return _runner


def _get_turn_runner() -> TurnRunner:
    global _turn_runner
    if _turn_runner is None:
        # Imported here: a worker that never gets a turn never loads the turn loop.
        from executor.worker.turns import TurnRunner

        settings = _settings or Settings.from_env()
        _turn_runner = TurnRunner(
            settings, load_registry(settings.require_tools()), get_engine(settings.database_url)
        )
    return _turn_runner


def worker_app(settings: Settings | None = None) -> Celery:
    """The app a worker runs: the task bound to an OperationRunner per process."""
    global _settings
    _settings = settings or Settings.from_env()
    app = make_celery(_settings)

    @app.task(name=TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
    def execute(self: Any, *args: Any, **kwargs: Any) -> str:
        # Exactly one operation id, positional or by name. Any other shape is a bad
        # message for the runner to count and acknowledge, not a task error (a
        # TypeError from the call would be acknowledged but never counted).
        given = [*args, *kwargs.values()] if set(kwargs) <= {"operation_id"} else []
        try:
            return _get_runner().handle(given[0] if len(given) == 1 else None).label
        except Exception as exc:
            # Celery would log this exception's message and traceback (a database
            # error can quote a row); the operation is the reconciler's to settle.
            label = repr(given[0])[:80] if len(given) == 1 else "a bad message"
            log.error("task for %s failed: %s", label, exception_summary(exc))
            raise TaskFailed(type(exc).__name__) from None

    @app.task(name=TURN_TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
    def run_turn(self: Any, *args: Any, **kwargs: Any) -> str:
        # One turn id, like `execute`'s one operation id; any other shape is a bad message.
        given = [*args, *kwargs.values()] if set(kwargs) <= {"turn_id"} else []
        return _get_turn_runner().handle(given[0] if len(given) == 1 else None).label

    return app


class TaskFailed(WorkerError):
    """What Celery is told when a task fails: the original's type, nothing it said."""


@signals.worker_process_init.connect
def _after_fork(**_: Any) -> None:
    """A forked pool child must not share its parent's database connections."""
    global _runner, _turn_runner
    dispose_engines()
    _runner = None
    _turn_runner = None
    # Traces are set up in each child, on its first span, never shared with the parent.
    tracing.after_fork()


# Celery's own lines about a task ("succeeded in", "raised unexpected") are logged
# between task_prerun and task_postrun, after the runner's scope has ended: the
# message's id is bound for the whole of it. (task id, thread) -> the scope to close:
# a redelivered message keeps its task id, and may run beside itself in a threads pool.
_task_scopes: dict[tuple[str, int], Token[Any]] = {}
_MESSAGE_ID_FIELDS = {TASK_NAME: "operation_id", TURN_TASK_NAME: "turn_id"}


@signals.task_prerun.connect
def _bind_message_id(task_id: str | None = None, task: Any = None, args: Any = None,
                     kwargs: Any = None, **_: Any) -> None:
    field = _MESSAGE_ID_FIELDS.get(getattr(task, "name", ""))
    if field is None or task_id is None:
        return
    given = [*(args or ()), *(kwargs or {}).values()]
    value = given[0] if len(given) == 1 and isinstance(given[0], str) else None
    _task_scopes[task_id, threading.get_ident()] = logcontext.open_scope(
        **{field: value[:MAX_LOGGED_ID_CHARS] if value else None}
    )


@signals.task_postrun.connect
def _unbind_message_id(task_id: str | None = None, **_: Any) -> None:
    token = _task_scopes.pop((task_id, threading.get_ident()), None) if task_id is not None else None
    if token is not None:
        logcontext.close_scope(token)


@signals.task_rejected.connect
def _count_rejected(**_: Any) -> None:
    metrics.MESSAGES.labels("bad_message").inc()


@signals.task_unknown.connect
def _count_unknown(**_: Any) -> None:
    metrics.MESSAGES.labels("bad_message").inc()


@signals.worker_process_shutdown.connect
def _mark_dead(pid: int | None = None, **_: Any) -> None:
    mcp = sys.modules.get("executor.mcp")
    if mcp is not None:
        # MCP server subprocesses belong to this process: stop them with it.
        mcp.shutdown_connections()
    # A pool child ends with os._exit: no atexit hook flushes its last spans.
    tracing.shutdown()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())  # type: ignore[no-untyped-call]


@signals.worker_ready.connect
def _announce_ready(**_: Any) -> None:
    # Printed at WARNING so it shows at the default log level: the fleet waits for it.
    log.warning("toolfence worker ready (pid %s)", os.getpid())
