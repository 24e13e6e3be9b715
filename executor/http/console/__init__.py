"""The operator console under `/console`: server-rendered pages, plain forms.

A person signs in with an `approve` or `operate` key. The session cookie
(HttpOnly, SameSite=Strict, Secure over HTTPS) carries the key's id, a random
session id, an expiry and an HMAC over them, never the key; the key's row is
read on every page, so a revoked key's session ends at once. Signing out
records the session id as ended (a durable row, kept until the session would
have expired), so a copy of the cookie is refused afterwards, across restarts;
a browser that sends an ended session lands on the sign-in page, told so.
Every form carries a CSRF token, an HMAC of the session cookie, checked on every
POST; the sign-in form's token is an HMAC of a random pre-session cookie set
with the form (double submit). Failed sign-ins count against the client
address's failed-authentication budget, as the API's do. The pages show only
the signed-in key's tenant; actions go through the same Service the API uses.
A page shows messages from closed sets, by code: never text from the URL.

Pages that change while a person looks (approvals, needs a person, the lists, an
operation, a turn) are live: `console.js` asks for the page again every few
seconds and swaps its live region, unless the person is typing in it. Without
JavaScript every page is complete and every form works; it is just not refreshed
(decision 0223).

Modules: `sessions` (cookies, messages), `base` (rendering), `views` (how values
are shown), `decisions` (approvals, needs a person, an operation), `lists`
(requests, operations, turns).
"""

from __future__ import annotations

import secrets
from typing import Protocol

from fastapi import FastAPI, Form, Request
from fastapi.responses import Response

from executor.http.api import RateLimiter, client_address
from executor.http.console import decisions, lists
from executor.http.console.base import TEMPLATES, Console, harden, templates
from executor.http.console.sessions import (
    COOKIE,
    LOGIN_COOKIE,
    NOTICES,
    REFUSALS,
    SIGN_IN_REFUSALS,
    WHYS,
    Session,
    _Sessions,
    same_text,
)
from executor.http.keys import Authenticator, KeyRefused, KeyScope
from executor.http.service import Service
from executor.store.api_keys import revoke_console_session

__all__ = [
    "COOKIE", "LOGIN_COOKIE", "NOTICES", "REFUSALS", "SIGN_IN_REFUSALS", "WHYS", "Session",
    "SessionSettings", "_Sessions", "mount_console", "same_text",
]


class SessionSettings(Protocol):
    """What the console reads of the server's settings (`server.HttpSettings`): the
    console is mounted by the server's app factory and does not import it back."""

    @property
    def session_secret(self) -> bytes: ...

    @property
    def session_seconds(self) -> float: ...


def mount_console(
    app: FastAPI, service: Service, authenticator: Authenticator, limiter: RateLimiter, http: SessionSettings
) -> None:
    sessions = _Sessions(http.session_secret, http.session_seconds)
    console = Console(service, authenticator, sessions, templates())
    stylesheet = (TEMPLATES / "console.css").read_text(encoding="utf-8")
    script = (TEMPLATES / "console.js").read_text(encoding="utf-8")

    @app.get("/console/console.css", include_in_schema=False)
    def console_css() -> Response:
        return Response(stylesheet, media_type="text/css", headers={"Cache-Control": "max-age=3600"})

    @app.get("/console/console.js", include_in_schema=False)
    def console_js() -> Response:
        return Response(
            script, media_type="text/javascript", headers={"Cache-Control": "max-age=3600"}
        )

    @app.get("/console", include_in_schema=False)
    def console_home(request: Request) -> Response:
        return console.back("/console/approvals") if console.signed_in(request) else console.to_login(request)

    @app.get("/console/login", include_in_schema=False)
    def login_page(request: Request) -> Response:
        refused = SIGN_IN_REFUSALS.get(request.query_params.get("refused", ""))
        notice = NOTICES.get(request.query_params.get("notice", ""))
        nonce = secrets.token_hex(16)
        response = console.templates.TemplateResponse(
            request, "login.html",
            {"refused": refused, "notice": notice, "who": None, "csrf": sessions.login_csrf(nonce)},
        )
        response.set_cookie(
            LOGIN_COOKIE, nonce, max_age=3600, httponly=True, samesite="strict",
            secure=request.url.scheme == "https", path="/console",
        )
        harden(response)
        return response

    @app.post("/console/login", include_in_schema=False)
    def login(
        request: Request, key: str = Form("", max_length=300), csrf: str = Form("", max_length=100)
    ) -> Response:
        nonce = request.cookies.get(LOGIN_COOKIE, "")
        if not nonce or not same_text(sessions.login_csrf(nonce), csrf):
            return console.back("/console/login", refused="csrf")
        address = client_address(request)
        if limiter.failures_spent(address) is not None:
            return console.back("/console/login", refused="rate_limited")
        try:
            who = authenticator.identity(key.strip())
        except KeyRefused:
            limiter.failed(address)
            return console.back("/console/login", refused="invalid")
        if not who.may(KeyScope.APPROVE, KeyScope.OPERATE):
            return console.back("/console/login", refused="scope")
        response = console.back("/console/approvals")
        response.set_cookie(
            COOKIE, sessions.issue(who.key_id), max_age=int(http.session_seconds), httponly=True,
            samesite="strict", secure=request.url.scheme == "https", path="/console",
        )
        response.delete_cookie(LOGIN_COOKIE, path="/console")
        return response

    @app.post("/console/logout", include_in_schema=False)
    def logout(request: Request, csrf: str = Form("")) -> Response:
        cookie = request.cookies.get(COOKIE)
        session = sessions.read(cookie)
        if session is not None and cookie is not None:
            if not console.check_csrf(cookie, csrf):
                return console.back("/console/approvals", refused="csrf")
            # Ended server-side: a copy of this cookie is refused from now on.
            with service.engine.begin() as conn:
                revoke_console_session(conn, session.session_id, session.expires_at)
        response = console.back("/console/login", notice="signed_out")
        response.delete_cookie(COOKIE, path="/console")
        return response

    decisions.mount(app, console)
    lists.mount(app, console)
