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
        self._declared: set[int] = set()

    def _declare_routes(self, app: object) -> None:
        # The app's own route table is the route label's closed set (metrics.HTTP_ROUTE).
        if app is not None and id(app) not in self._declared:
            self._declared.add(id(app))
            metrics.declare_routes(
                str(getattr(route, "path", "")) for route in getattr(app, "routes", ())
            )

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
            self._declare_routes(scope.get("app"))
            route = scope.get("route")
            template = str(getattr(route, "path", "unmatched")) if route is not None else "unmatched"
            metrics.HTTP_RESPONSES.labels(template, str(status)).inc()
            metrics.HTTP_SECONDS.labels(template).observe(time.monotonic() - started)
