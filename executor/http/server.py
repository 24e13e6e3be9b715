"""The app factory and the runner of `toolfence serve`.

Settings of the server itself (declared with the others in
executor/settings/variables.py, read when the server starts):

- `TOOLFENCE_HTTP_MAX_BODY_BYTES` (default 1 MiB): larger bodies are 413;
- `TOOLFENCE_HTTP_RATE_LIMIT` (default `600/minute`): per key, `limits` syntax;
- `TOOLFENCE_HTTP_AUTH_FAILURE_LIMIT` (default `30/minute`): failed authentications
  per client address (API and console sign-in), `limits` syntax;
- `TOOLFENCE_HTTP_RATE_LIMIT_STORAGE` (default `memory://`): `redis://…` to share
  the budget between several server processes;
- `TOOLFENCE_HTTP_SESSION_SECRET`: signs console sessions and CSRF tokens (unset:
  a random one per process, so a restart signs everyone out);
- `TOOLFENCE_HTTP_SESSION_SECONDS` (default 8 h): a console session's lifetime;
- `TOOLFENCE_HTTP_WORKERS` (default 1, `--workers`): server processes on one port
  (executor/http/workers.py); more than one refuses `memory://` rate-limit storage;
- `TOOLFENCE_HTTP_THREADS` (default 8): threads per process for blocking database
  work, and at least as many pooled PostgreSQL connections, so a request never
  waits for, nor opens, a connection of its own (decision 0228).

On SIGTERM or SIGINT the server stops accepting connections, tells long-polls
to answer what they have, waits for requests in flight (up to
`TOOLFENCE_HTTP_DRAIN_SECONDS`, default 30) and exits 0.
"""

from __future__ import annotations

import gc
import secrets
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import FrameType

import uvicorn
from fastapi import FastAPI
from sqlalchemy import Engine

from executor.core.tools import Registry
from executor.http.api import RateLimiter, build_api
from executor.http.body import BodySizeLimit
from executor.http.keys import Authenticator
from executor.http.observe import CountResponses, NameRequests
from executor.http.service import Service
from executor.providers.hosted import NO_HOSTED_TOOLS, HostedPolicy
from executor.settings import Settings, SettingsError, read
from executor.store.engine import get_engine

GC_YOUNG_THRESHOLD = 20_000
"""Allocations between two collections of the youngest generation in a server process
(CPython's default: 700)."""


@dataclass(frozen=True)
class HttpSettings:
    max_body_bytes: int = 1024 * 1024
    rate_limit: str = "600/minute"
    auth_failure_limit: str = "30/minute"
    rate_limit_storage: str = "memory://"
    session_secret: bytes = b""
    session_seconds: float = 8 * 3600.0
    drain_seconds: float = 30.0
    workers: int = 1
    threads: int = 8

    @classmethod
    def from_env(cls) -> HttpSettings:
        def number(name: str, default: float) -> float:
            return float(read(name))

        secret = read("TOOLFENCE_HTTP_SESSION_SECRET") or ""
        settings = cls(
            max_body_bytes=int(number("TOOLFENCE_HTTP_MAX_BODY_BYTES", cls.max_body_bytes)),
            rate_limit=read("TOOLFENCE_HTTP_RATE_LIMIT") or cls.rate_limit,
            auth_failure_limit=read("TOOLFENCE_HTTP_AUTH_FAILURE_LIMIT") or cls.auth_failure_limit,
            rate_limit_storage=read("TOOLFENCE_HTTP_RATE_LIMIT_STORAGE") or cls.rate_limit_storage,
            session_secret=secret.encode() if secret else secrets.token_bytes(32),
            session_seconds=number("TOOLFENCE_HTTP_SESSION_SECONDS", cls.session_seconds),
            drain_seconds=number("TOOLFENCE_HTTP_DRAIN_SECONDS", cls.drain_seconds),
            workers=int(read("TOOLFENCE_HTTP_WORKERS")),
            threads=int(read("TOOLFENCE_HTTP_THREADS")),
        )
        try:
            RateLimiter(settings.rate_limit, settings.rate_limit_storage, settings.auth_failure_limit)
        except Exception as exc:
            raise SettingsError(
                f"TOOLFENCE_HTTP_RATE_LIMIT={settings.rate_limit!r} / _STORAGE="
                f"{settings.rate_limit_storage!r} / TOOLFENCE_HTTP_AUTH_FAILURE_LIMIT="
                f"{settings.auth_failure_limit!r}: {exc}"
            ) from None
        return settings

    def shared_limits_problem(self) -> str | None:
        """Why these settings cannot run `workers` processes, or None. Counted in memory,
        each process would keep its own per-key budget and failed-authentication budget:
        N times the limits, and a guesser spreading over the N processes' connections
        would get N times the tries (decision 0228)."""
        if self.workers > 1 and self.rate_limit_storage.startswith("memory"):
            return (
                f"{self.workers} server processes would each count the rate limits in memory "
                f"(TOOLFENCE_HTTP_RATE_LIMIT_STORAGE={self.rate_limit_storage}): {self.workers} times "
                "the per-key budget and the failed-authentication budget. Set "
                "TOOLFENCE_HTTP_RATE_LIMIT_STORAGE=redis://… to share them, or run one worker"
            )
        return None


def create_app(
    settings: Settings,
    registry: Registry,
    *,
    http: HttpSettings | None = None,
    hosted_policy: HostedPolicy = NO_HOSTED_TOOLS,
    engine: Engine | None = None,
) -> FastAPI:
    from executor.http.console import mount_console

    http = http or HttpSettings(session_secret=secrets.token_bytes(32))
    engine = engine or get_engine(settings.database_url)
    service = Service(settings, engine, registry, hosted_policy)
    authenticator = Authenticator(engine)
    limiter = RateLimiter(http.rate_limit, http.rate_limit_storage, http.auth_failure_limit)
    app = build_api(service, authenticator, limiter)
    mount_console(app, service, authenticator, limiter, http)
    app.add_middleware(BodySizeLimit, max_bytes=http.max_body_bytes)
    app.add_middleware(CountResponses)  # sees every answer
    app.add_middleware(NameRequests)  # added last: outermost, names the request for every record
    return app


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, telling long-polls to finish as soon as shutdown begins, with
    its blocking work bounded to `threads` threads (the pool holds as many connections)
    and `on_started` called once it listens."""

    def __init__(
        self, config: uvicorn.Config, service: Service, threads: int,
        on_started: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self._service = service
        self._threads = threads
        self._on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        import anyio.to_thread

        # Starlette's threadpool (sync routes and dependencies, run_in_threadpool): one
        # limiter per event loop, 40 threads by default. At most `threads` here, each
        # holding at most one pooled connection at a time (decision 0228).
        anyio.to_thread.current_default_thread_limiter().total_tokens = self._threads
        # What the process built to serve (modules, the app, its schemas, the pool) lives
        # as long as it does: kept out of the cyclic collector's passes, and the youngest
        # generation collected every 20,000 allocations instead of 700. A collection holds
        # the GIL and stalls every request in flight (decision 0228).
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        await super().startup(sockets)
        if self.started and self._on_started is not None:
            self._on_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._service.draining.set()
        super().handle_exit(sig, frame)


def run(
    app: FastAPI, host: str, port: int, http: HttpSettings, log_level: str = "warning",
    *, own_logging: bool = True, sock: socket.socket | None = None,
    on_started: Callable[[], None] | None = None,
) -> None:
    """Serve until SIGTERM (on `sock` when given: a worker of several, whose socket the
    supervisor bound). `own_logging=False` leaves uvicorn's loggers to the root logger
    the process configured (JSON lines) instead of uvicorn's handlers."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, lifespan="off",
        timeout_graceful_shutdown=int(http.drain_seconds), server_header=False,
        log_config=uvicorn.config.LOGGING_CONFIG if own_logging else None,
    )
    if threading.current_thread() is threading.main_thread():
        # uvicorn re-raises the signal it shut down for once it has drained; a drained
        # SIGTERM (or SIGINT) is a clean stop, so that second delivery is swallowed (exit 0).
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        if sock is not None:
            signal.signal(signal.SIGINT, lambda signum, frame: None)
    server = _DrainingServer(config, app.state.service, http.threads, on_started)
    server.run(sockets=[sock] if sock is not None else None)


def serve_engine(settings: Settings, http: HttpSettings) -> Settings:
    """`settings` with a database pool of at least `http.threads` connections: each of
    the server's threads holds at most one, so none waits for a connection or opens
    one past the pool (an overflow connection is closed again when given back)."""
    return replace(settings, db_pool_size=max(settings.db_pool_size, http.threads))
