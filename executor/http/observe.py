"""Counting `toolfence serve`'s responses (toolfence_http_responses_total and
toolfence_http_request_seconds), by route template so the labels stay bounded."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from executor.telemetry import metrics


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
