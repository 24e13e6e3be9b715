"""The console's lists (requests, operations, turns of the key's tenant, filtered,
newest first, by keyset pages) and a turn's page."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from executor.core.sanitize import shown_text
from executor.core.states import State, TurnState
from executor.http.console import views
from executor.http.console.base import Console
from executor.http.problems import ProblemError
from executor.store import console_reads
from executor.store.engine import read_only

PAGE_SIZE = 50
OPERATION_STATES = [s.value for s in State]
TURN_STATES = [s.value for s in TurnState]


def _principal(context: str) -> str:
    try:
        return shown_text(str(json.loads(context).get("principal", "")))
    except (ValueError, AttributeError):
        return ""


def mount(app: FastAPI, console: Console) -> None:
    service = console.service

    def tools() -> list[str]:
        return sorted(service.registry.names())

    @app.get("/console/operations", include_in_schema=False)
    def operations_page(request: Request) -> Response:
        session = console.signed_in(request)
        if session is None:
            return console.to_login(request)
        who, cookie = session
        with read_only(service.engine).connect() as conn:
            principals = console_reads.known_principals(conn, who.tenant)
            query = views.list_query(request.query_params, OPERATION_STATES, tools(), principals)
            page = console_reads.list_operations(conn, who.tenant, query.filters, query.after, PAGE_SIZE)
            counts = console_reads.operation_state_counts(conn, who.tenant, query.filters)
        rows = [
            {"operation_id": r.operation_id, "tool": r.tool_name, "state": r.state,
             "error_code": r.error_code, "principal": _principal(r.context), "request_id": r.request_id,
             "call_id": r.call_id, "created_at": r.created_at}
            for r in page.rows
        ]
        return console.page(
            request, "operations.html", who, cookie, rows=rows, query=query, states=OPERATION_STATES,
            tools=tools(), principals=principals, counts=counts, total=sum(counts.values()),
            next_page=views.page_link("/console/operations", query.form, page.next), live=query.after is None,
        )

    @app.get("/console/requests", include_in_schema=False)
    def requests_page(request: Request) -> Response:
        session = console.signed_in(request)
        if session is None:
            return console.to_login(request)
        who, cookie = session
        with read_only(service.engine).connect() as conn:
            principals = console_reads.known_principals(conn, who.tenant)
            query = views.list_query(request.query_params, OPERATION_STATES, tools(), principals)
            page = console_reads.list_requests(conn, who.tenant, query.filters, query.after, PAGE_SIZE)
            ids = [r.request_id for r in page.rows]
            states = console_reads.request_operation_states(conn, who.tenant, ids)
            called = console_reads.request_tools(conn, who.tenant, ids)
        rows = [
            {"request_id": r.request_id, "calls": r.calls, "created_at": r.created_at,
             "conversation_id": r.conversation_id, "states": states.get(r.request_id, {}),
             "tools": called.get(r.request_id, [])}
            for r in page.rows
        ]
        return console.page(
            request, "requests.html", who, cookie, rows=rows, query=query, states=OPERATION_STATES,
            tools=tools(), principals=principals,
            next_page=views.page_link("/console/requests", query.form, page.next), live=query.after is None,
        )

    @app.get("/console/requests/{request_id}", include_in_schema=False)
    def request_page(request: Request, request_id: str) -> Response:
        """A request is shown as its first operation's page lists its calls; a request
        without operations (every call refused at admission) as its calls alone."""
        session = console.signed_in(request)
        if session is None:
            return console.to_login(request)
        who, cookie = session
        with read_only(service.engine).connect() as conn:
            page = console_reads.list_operations(
                conn, who.tenant, console_reads.Filters(), None, 1, request_id=request_id
            )
        if page.rows:
            return console.back(f"/console/operations/{page.rows[0].operation_id}")
        return console.page(request, "missing.html", who, cookie, status=404, what="request with operations")

    @app.get("/console/turns", include_in_schema=False)
    def turns_page(request: Request) -> Response:
        session = console.signed_in(request)
        if session is None:
            return console.to_login(request)
        who, cookie = session
        with read_only(service.engine).connect() as conn:
            principals = console_reads.known_principals(conn, who.tenant)
            query = views.list_query(request.query_params, TURN_STATES, tools(), principals)
            page = console_reads.list_turns(conn, who.tenant, query.filters, query.after, PAGE_SIZE)
        rows = [
            {"turn_id": r.turn_id, "principal": shown_text(r.principal), "state": r.state,
             "end_reason": r.end_reason, "steps": r.steps, "conversation_id": r.conversation_id,
             "created_at": r.created_at, "finished_at": r.finished_at}
            for r in page.rows
        ]
        return console.page(
            request, "turns.html", who, cookie, rows=rows, query=query, states=TURN_STATES, tools=tools(),
            principals=principals, next_page=views.page_link("/console/turns", query.form, page.next),
            live=query.after is None,
        )

    @app.get("/console/turns/{turn_id}", include_in_schema=False)
    async def turn_page(request: Request, turn_id: str) -> Response:
        session = console.signed_in(request)
        if session is None:
            return console.to_login(request)
        who, cookie = session
        try:
            turn: Any = await service.turn(who, turn_id, wait=0.0)
        except ProblemError:
            return console.page(request, "missing.html", who, cookie, status=404, what="turn")
        return console.page(request, "turn.html", who, cookie, turn=turn, live=not turn.terminal)
