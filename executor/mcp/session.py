"""One MCP server subprocess per (process, server), behind a synchronous facade.

Workers are synchronous processes that run many calls, and the SDK is async.
Each process gets one background thread running an event loop; every server
connection lives on it. A connection starts its subprocess lazily on the first
call, keeps it for the next ones, and starts a new one when the old one has
ended (crash, kill, refused response): the next call never reuses a dead
session. Calls are bounded twice: the SDK's per-request timeout (which also
sends `notifications/cancelled`), and a wall-clock bound on the calling thread
in case the loop itself is wedged.

Sessions heal. After a broken stream, or a request timeout the server does
not answer a probe for either (stopped, wedged, deadlocked), the session is
replaced: it is ended, its server process is SIGKILLed by its pinned pid
after a short grace (process.py) and reaped, and the next call starts a fresh
one. A server that answers the probe was only slow with that one call and
keeps its session, so the calls it is serving meanwhile are not lost with it.
Killing a session fails its other in-flight calls as `connection_lost`, whose
writes are then classified like any unknown outcome.

Each session is owned by one task that enters the SDK's context managers and
leaves them in the same task (anyio cancel scopes are task-bound); calls run
in their own tasks and share the session, which multiplexes by request id.

After `fork()` the child forgets the parent's loop and connections (their
thread does not exist in the child) and starts its own on first use.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import sys
import threading
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar, cast

import mcp_types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp_types import (
    REQUEST_TIMEOUT,
    CallToolResult,
    Implementation,
    RequestParamsMeta,
)
from pydantic import ValidationError

from executor.core.sanitize import exception_summary
from executor.mcp.correlation import JsonRpcId
from executor.mcp.errors import (
    McpCallFailure,
    connection_lost_failure,
    invalid_result_failure,
    protocol_failure,
    response_id_mismatch_failure,
    timeout_failure,
    tool_changed_failure,
    unavailable_failure,
)
from executor.mcp.process import ServerProcess
from executor.mcp.sanitize import sanitize_error_text
from executor.mcp.schema import schema_fingerprint
from executor.mcp.wire import (
    CORRELATION_META_KEY,
    InFlightCall,
    ObservedStdioTransport,
    WireObserver,
    WireStats,
)

logger = logging.getLogger("toolfence.mcp.session")

T = TypeVar("T")

CLIENT_INFO = Implementation(name="toolfence", version="0.1.0")
# How long a retiring session may take to stop its server (the SDK itself
# bounds stdin-close, SIGTERM and SIGKILL at 2 s each).
_RETIRE_TIMEOUT_SECONDS = 10.0
# A session being replaced (hung or broken) gets this long to exit on its
# closed stdin before it is SIGKILLed; one closed on purpose gets the SDK's
# own shutdown first, and the kill only as a backstop.
_HEAL_KILL_AFTER_SECONDS = 0.5
_CLOSE_KILL_AFTER_SECONDS = 5.0
# After a request timeout: how long the server has to answer a probe to show
# it is alive (a healthy one answers within milliseconds).
_PROBE_TIMEOUT_SECONDS = 1.0
# Slack on the caller's wall-clock bound over the SDK's own timeout.
_FACADE_GRACE_SECONDS = 5.0
_LIST_PAGE_CAP = 100


@dataclass(frozen=True)
class McpServerSpec:
    """How to start one MCP server over stdio. Equal specs share a connection per process."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    # Merged over the SDK's minimal default environment (PATH, HOME, ...): the
    # server inherits no other variable of the worker, secrets included.
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    connect_timeout_seconds: float = 30.0
    # "auto" probes `server/discover` and falls back to the initialize handshake.
    protocol_mode: str = "auto"
    errlog: TextIO | None = field(default=None, compare=False, hash=False, repr=False)

    def stdio_parameters(self) -> StdioServerParameters:
        return StdioServerParameters(
            command=self.command,
            args=list(self.args),
            env=dict(self.env) or None,
            cwd=self.cwd,
        )


@dataclass(frozen=True)
class CallOutcome:
    """What one `tools/call` produced, with what the wire saw of it."""

    result: CallToolResult | None
    failure: McpCallFailure | None
    jsonrpc_request_ids: tuple[JsonRpcId, ...]
    session_number: int


@dataclass
class _Session:
    number: int
    client: Client
    observer: WireObserver
    tools: dict[str, mcp_types.Tool]
    owner: asyncio.Task[None]
    process: ServerProcess | None
    _retiring: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def alive(self) -> bool:
        return not self.observer.ended.is_set()

    def retire_soon(self, kill_after: float = _HEAL_KILL_AFTER_SECONDS) -> asyncio.Task[None]:
        """End the session now; its server is stopped by a task (one, however often asked)."""
        if self._retiring is None:
            self.observer.mark_ended()
            self._retiring = asyncio.create_task(
                self._stop(kill_after), name=f"{self.owner.get_name()}-retire"
            )
        return self._retiring

    async def retire(self, kill_after: float = _HEAL_KILL_AFTER_SECONDS) -> None:
        """End the session and wait (bounded) until its server is stopped."""
        await asyncio.shield(self.retire_soon(kill_after))

    async def _stop(self, kill_after: float) -> None:
        # The owner's exit runs the SDK's shutdown (close stdin, SIGTERM, SIGKILL
        # over ~4 s); a stopped or wedged server is killed sooner, by its pid.
        done, _ = await asyncio.wait({self.owner}, timeout=kill_after)
        if not done and self.process is not None:
            self.process.kill()
        await _bounded_wait(self.owner, _RETIRE_TIMEOUT_SECONDS)


async def _bounded_wait(task: asyncio.Task[Any], timeout: float) -> None:
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=timeout)


class _EventLoopThread:
    """A daemon thread running the process's MCP event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="toolfence-mcp-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout: float) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)


class McpServerConnection:
    """The process's connection to one MCP server. Thread-safe; methods block."""

    def __init__(self, spec: McpServerSpec, loop: _EventLoopThread) -> None:
        self.spec = spec
        self.stats = WireStats()
        self.sessions_started = 0
        self._loop = loop
        self._session: _Session | None = None
        self._start_lock: asyncio.Lock | None = None
        self._closed = False
        # Sessions being replaced, held until their server is stopped.
        self._retiring: set[asyncio.Task[None]] = set()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def alive(self) -> bool:
        """Whether a server process is up and its session has not ended (a snapshot)."""
        session = self._session
        return session is not None and session.alive

    @property
    def server_pid(self) -> int | None:
        """The pid of the live session's server process (a snapshot), if known."""
        session = self._session
        if session is None or not session.alive or session.process is None:
            return None
        return session.process.pid

    # ------------------------------------------------ sync facade

    def list_tools(self) -> list[mcp_types.Tool]:
        """The tools of the live session (starting one if needed)."""

        async def listed() -> list[mcp_types.Tool]:
            return list((await self._ensure_session()).tools.values())

        return self._run(listed(), self.spec.connect_timeout_seconds * 2 + _FACADE_GRACE_SECONDS)

    def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any],
        *,
        timeout_seconds: float,
        meta: Mapping[str, Any],
        correlation_token: str,
        expected_input_fingerprint: str | None = None,
    ) -> CallOutcome:
        """One `tools/call`; failures come back in `CallOutcome.failure`, never raised."""
        bound = timeout_seconds + self.spec.connect_timeout_seconds + _FACADE_GRACE_SECONDS
        try:
            return self._run(
                self._call(
                    name,
                    dict(arguments),
                    timeout_seconds,
                    dict(meta),
                    correlation_token,
                    expected_input_fingerprint,
                ),
                bound,
            )
        except TimeoutError:
            # The loop did not come back in time at all: whatever the session is
            # doing, it is not answering; the next call gets a fresh one.
            self._loop.submit(self._retire_current())
            return CallOutcome(None, timeout_failure(timeout_seconds), (), 0)

    def close(self) -> None:
        """Stop the server process (bounded); later calls fail as unavailable."""
        if self._loop.loop.is_closed():
            return
        try:
            self._run(self._close(), _RETIRE_TIMEOUT_SECONDS + _FACADE_GRACE_SECONDS)
        except TimeoutError:
            logger.warning("MCP server %r did not stop in time", self.spec.name)

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        future = self._loop.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError from None

    # ------------------------------------------------ on the loop

    async def _ensure_session(self) -> _Session:
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            current = self._session
            if current is not None and current.alive:
                return current
            if current is not None:
                self._session = None
                await current.retire()
            if self._closed:
                raise unavailable_failure("the connection was closed")
            self._session = await self._start_session()
            return self._session

    async def _start_session(self) -> _Session:
        self.sessions_started += 1
        number = self.sessions_started
        observer = WireObserver(self.stats)
        ready: asyncio.Future[_Session] = asyncio.get_running_loop().create_future()
        owner = asyncio.create_task(
            self._own_session(number, observer, ready), name=f"mcp-{self.spec.name}-{number}"
        )
        try:
            return await asyncio.wait_for(
                asyncio.shield(ready), timeout=self.spec.connect_timeout_seconds
            )
        except TimeoutError:
            owner.cancel()
            await _bounded_wait(owner, _RETIRE_TIMEOUT_SECONDS)
            raise unavailable_failure(
                f"no handshake within {self.spec.connect_timeout_seconds:g}s"
            ) from None
        except McpCallFailure:
            await _bounded_wait(owner, _RETIRE_TIMEOUT_SECONDS)
            raise
        except Exception as exc:
            await _bounded_wait(owner, _RETIRE_TIMEOUT_SECONDS)
            raise unavailable_failure(
                f"could not start it ({type(exc).__name__}: {sanitize_error_text(str(exc), 200)})"
            ) from None

    async def _own_session(
        self, number: int, observer: WireObserver, ready: asyncio.Future[_Session]
    ) -> None:
        """Owns one server process from spawn to stop, in this one task."""
        transport = ObservedStdioTransport(
            self.spec.stdio_parameters(), observer, self.spec.errlog or _real_stderr()
        )
        try:
            async with Client(
                transport, mode=self.spec.protocol_mode, cache=None, client_info=CLIENT_INFO
            ) as client:
                tools = await asyncio.wait_for(
                    self._list_all_tools(client), timeout=self.spec.connect_timeout_seconds
                )
                owner = asyncio.current_task()
                assert owner is not None
                if not ready.done():
                    ready.set_result(
                        _Session(number, client, observer, tools, owner, transport.server_process)
                    )
                logger.info("MCP server %r session %d started", self.spec.name, number)
                await observer.ended.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
            raise
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                # Teardown noise of a session that already served its calls.
                logger.debug(
                    "MCP server %r session %d ended: %s", self.spec.name, number, exception_summary(exc)
                )
        finally:
            observer.mark_ended()
            logger.info("MCP server %r session %d stopped", self.spec.name, number)

    @staticmethod
    async def _list_all_tools(client: Client) -> dict[str, mcp_types.Tool]:
        tools: dict[str, mcp_types.Tool] = {}
        cursor: str | None = None
        for _ in range(_LIST_PAGE_CAP):
            page = await client.list_tools(cursor=cursor)
            tools.update((tool.name, tool) for tool in page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    async def _call(
        self,
        name: str,
        arguments: dict[str, Any],
        timeout_seconds: float,
        meta: dict[str, Any],
        correlation_token: str,
        expected_input_fingerprint: str | None,
    ) -> CallOutcome:
        try:
            session = await self._ensure_session()
        except McpCallFailure as unavailable:
            return CallOutcome(None, unavailable, (), self.sessions_started)
        listed = session.tools.get(name)
        if listed is None:
            return CallOutcome(
                None, tool_changed_failure("the server no longer lists it"), (), session.number
            )
        if (
            expected_input_fingerprint is not None
            and schema_fingerprint(listed.input_schema) != expected_input_fingerprint
        ):
            return CallOutcome(None, tool_changed_failure("its input schema differs"), (), session.number)
        call = session.observer.begin_call(correlation_token)
        failure: McpCallFailure | None = None
        result: CallToolResult | None = None
        try:
            result = await session.client.call_tool(
                name,
                arguments,
                read_timeout_seconds=timeout_seconds,
                meta=cast(RequestParamsMeta, {**meta, CORRELATION_META_KEY: correlation_token}),
            )
        except MCPError as exc:
            failure = self._classify(exc, session.observer, call, timeout_seconds)
        except ValidationError:
            failure = invalid_result_failure("it does not match the MCP result schema")
        except RuntimeError as exc:
            if session.observer.ended.is_set():
                # The session was torn down under the call (the SDK refuses to
                # use a client whose context has exited).
                failure = connection_lost_failure(call.delivered)
            else:
                # The SDK's output-schema check and unexpected result shapes.
                failure = invalid_result_failure(sanitize_error_text(str(exc), 200))
        finally:
            session.observer.end_call(correlation_token)
        if failure is not None and await self._broken(session, call):
            self._replace(session, failure)
        return CallOutcome(result, failure, tuple(call.jsonrpc_request_ids), session.number)

    @staticmethod
    async def _broken(session: _Session, call: InFlightCall) -> bool:
        """Whether a session that just failed a call can serve no other."""
        if not session.alive:
            # The stream broke (the process died or closed it), the server
            # answered under a foreign id, or the session was torn down.
            return True
        if call.answered:
            # The server's own error response: it is alive and talking.
            return False
        # Not answered but not broken: a request timeout. A slow tool leaves
        # the server able to answer another request; a stopped or wedged one
        # cannot. The probe is `tools/list` (every server here has tools, and
        # `ping` is gone from the newer protocol versions the SDK negotiates).
        try:
            await asyncio.wait_for(session.client.list_tools(), _PROBE_TIMEOUT_SECONDS)
        except Exception:  # noqa: BLE001 - any failed probe means the same: replace it
            return True
        return False

    def _replace(self, session: _Session, failure: McpCallFailure) -> None:
        """End `session` and kill its server in the background; the next call starts anew."""
        if self._session is session:
            self._session = None
        pid = session.process.pid if session.process is not None else None
        logger.warning(
            "MCP server %r session %d (pid %s) replaced after %s",
            self.spec.name, session.number, pid, failure.kind.value,
        )
        task = session.retire_soon()
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    @staticmethod
    def _classify(
        exc: MCPError, observer: WireObserver, call: InFlightCall, timeout_seconds: float
    ) -> McpCallFailure:
        if observer.violation is not None:
            return response_id_mismatch_failure()
        if call.answered:
            # The server's own error response: a protocol error, classified by code.
            return protocol_failure(exc.code, exc.message)
        # Made up locally by the SDK: nothing from the server answered this call.
        if exc.code == REQUEST_TIMEOUT:
            return timeout_failure(timeout_seconds)
        return connection_lost_failure(call.delivered)

    async def _retire_current(self, kill_after: float = _HEAL_KILL_AFTER_SECONDS) -> None:
        current, self._session = self._session, None
        if current is not None:
            await current.retire(kill_after)

    async def _close(self) -> None:
        self._closed = True
        await self._retire_current(_CLOSE_KILL_AFTER_SECONDS)
        if self._retiring:
            await asyncio.wait(set(self._retiring), timeout=_RETIRE_TIMEOUT_SECONDS)


class _ProcessConnections:
    """The connections of this process, and the loop they run on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: _EventLoopThread | None = None
        self._connections: dict[McpServerSpec, McpServerConnection] = {}

    def _loop_thread(self) -> _EventLoopThread:
        if self._loop is None or self._loop.loop.is_closed():
            self._loop = _EventLoopThread()
        return self._loop

    def connection(self, spec: McpServerSpec) -> McpServerConnection:
        with self._lock:
            connection = self._connections.get(spec)
            if connection is None or connection.closed:
                connection = McpServerConnection(spec, self._loop_thread())
                self._connections[spec] = connection
            return connection

    def temporary(self, spec: McpServerSpec) -> McpServerConnection:
        """A connection outside the pool (registration lists tools and closes it)."""
        with self._lock:
            return McpServerConnection(spec, self._loop_thread())

    def shutdown(self) -> None:
        with self._lock:
            connections = list(self._connections.values())
            self._connections.clear()
            loop, self._loop = self._loop, None
        for connection in connections:
            connection.close()
        if loop is not None:
            loop.stop(_RETIRE_TIMEOUT_SECONDS)

    def forget_after_fork(self) -> None:
        # The parent's loop thread does not exist in the child, and its lock may
        # have been held mid-fork: start from nothing.
        self._lock = threading.Lock()
        self._loop = None
        self._connections = {}


_CONNECTIONS = _ProcessConnections()
os.register_at_fork(after_in_child=_CONNECTIONS.forget_after_fork)
atexit.register(_CONNECTIONS.shutdown)


def connection_for(spec: McpServerSpec) -> McpServerConnection:
    """This process's connection to the server `spec` describes (created on first use)."""
    return _CONNECTIONS.connection(spec)


def list_server_tools(spec: McpServerSpec) -> list[mcp_types.Tool]:
    """The server's tools, from a session opened for this and closed right after.

    Registration uses its own session so a process that registers and then
    forks (a Celery prefork master) leaves no live server pipes to its children.
    """
    connection = _CONNECTIONS.temporary(spec)
    try:
        return connection.list_tools()
    finally:
        connection.close()


def shutdown_connections() -> None:
    """Stop every MCP server this process started (workers call this on shutdown)."""
    _CONNECTIONS.shutdown()


def _real_stderr() -> TextIO:
    """A stderr with a file descriptor for the server subprocess.

    Inside a Celery worker `sys.stderr` is a LoggingProxy without `fileno()`,
    which the subprocess cannot inherit; the process's original stderr can be.
    """
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__ if sys.__stderr__ is not None else open(os.devnull, "w")  # noqa: SIM115
