"""Counting `toolfence serve`'s responses (toolfence_http_responses_total and
toolfence_http_request_seconds), by route template so the labels stay bounded;
and naming each request in the logs (`http_request_id`)."""

from __future__ import annotations

import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from executor.telemetry import logcontext, metrics

# A request id a client or a proxy in front sent (`X-Request-ID`) is kept when it
# looks like one (uuids, ULIDs, hex, a load balancer's `Root=1-…`); anything else
# is replaced, so a header cannot put arbitrary text in every line of the request.
_REQUEST_ID_HEADER = b"x-request-id"
_REQUEST_ID_RE = re.compile(rb"[A-Za-z0-9._:=+-]{1,128}")


class CountResponses:
    """ASGI middleware, outermost: every answer is counted, refusals included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = 500  # what the client sees if the app fails before answering

        async def noting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, noting_send)
        finally:
            route = scope.get("route")
            template = str(getattr(route, "path", "unmatched")) if route is not None else "unmatched"
            if route is not None:
                # A route object the router matched: a template of the app's own table,
                # never the request's path, so the route label's set stays closed.
                metrics.declare_routes((template,))
            metrics.HTTP_RESPONSES.labels(template, str(status)).inc()
            metrics.HTTP_SECONDS.labels(template).observe(time.monotonic() - started)


class NameRequests:
    """ASGI middleware, outermost: every record logged while a request is served
    carries its `http_request_id` (the client's `X-Request-ID` when it looks like
    an id, else a new one), through the threads its handlers run in as well."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with logcontext.log_context(http_request_id=request_id_of(scope)):
            await self.app(scope, receive, send)


def request_id_of(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == _REQUEST_ID_HEADER and _REQUEST_ID_RE.fullmatch(value):
            return bytes(value).decode("ascii")
    return uuid.uuid4().hex
