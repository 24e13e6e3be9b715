"""The operator console under `/console`: server-rendered pages, plain forms.

A person signs in with an `approve` or `operate` key. The session cookie
(HttpOnly, SameSite=Strict, Secure over HTTPS) carries the key's id, a random
session id, an expiry and an HMAC over them, never the key; the key's row is
read on every page, so a revoked key's session ends at once. Signing out
records the session id as ended (a durable row, kept until the session would
have expired), so a copy of the cookie is refused afterwards, across restarts.
Every form carries a CSRF token, an HMAC of the session cookie, checked on every
POST; the sign-in form's token is an HMAC of a random pre-session cookie set
with the form (double submit). Failed sign-ins count against the client
address's failed-authentication budget, as the API's do. The pages show only
the signed-in key's tenant; actions go through the same Service the API uses.
A page shows messages from closed sets, by code: never text from the URL.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode

from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from executor.core.approvers import ApprovalDecision, ApproverRefusal
from executor.core.sanitize import shown_text
from executor.http.api import RateLimiter, client_address
from executor.http.keys import Authenticator, Identity, KeyRefused, KeyScope
from executor.http.problems import ProblemError
from executor.http.service import Service
from executor.store.api_keys import console_session_revoked, revoke_console_session
from executor.store.engine import read_only

COOKIE = "toolfence_session"
# The sign-in form's pre-session cookie: its HMAC is the form's CSRF token.
LOGIN_COOKIE = "toolfence_login"
TEMPLATES = Path(__file__).parent / "templates"

# Messages a redirect may ask a page to show, by code: never text from the URL.
NOTICES = {
    "approved": "Approved: the operation is queued.",
    "denied": "Denied: the call ends approval_denied.",
    "resolved": "Resolved.",
    "signed_out": "Signed out.",
}
REFUSALS = {
    "approver_not_allowed": "The approver policy refused you",
    "not_pending": "That is no longer pending",
    "not_found": "No such item for your tenant",
    "permission_denied": "Your key's scopes do not allow this",
    "invalid_request": "The form was incomplete",
    "csrf": "The form expired; try again",
    "upstream_unavailable": "Your roles or the approver policy could not be checked just now; "
    "it stays pending, try again",
}
# Why the approver policy refused, by ApproverRefusal code (every member has a line).
WHYS = {
    ApproverRefusal.OTHER_TENANT.value: "the approval is another tenant's",
    ApproverRefusal.SELF_APPROVAL.value: "you may not decide your own call",
    ApproverRefusal.ROLE_NOT_ALLOWED.value: "none of your roles may decide it",
    ApproverRefusal.PREDICATE_REFUSED.value: "the tool's approver rule refused you",
    ApproverRefusal.POLICY_FAILED.value: "the approver policy failed; it stays pending",
    ApproverRefusal.NO_APPROVER_POLICY.value: "the tool declares no approver policy",
}
SIGN_IN_REFUSALS = {
    "invalid": "That key is not valid (or revoked).",
    "csrf": "The sign-in form expired; try again.",
    "scope": "Sign in with a key that has the approve or operate scope.",
    "rate_limited": "Too many attempts; wait a minute.",
}


@dataclass(frozen=True)
class Session:
    key_id: str
    session_id: str
    expires_at: float


def same_text(expected: str, given: str) -> bool:
    """A constant-time comparison of a MAC or token with what the browser sent.
    `hmac.compare_digest` raises TypeError on a non-ASCII str, so both sides are
    compared as UTF-8 bytes (a lone surrogate encoded by escape): a forged cookie or
    token is a refusal, never a 500."""
    return hmac.compare_digest(
        expected.encode("utf-8", "backslashreplace"), given.encode("utf-8", "backslashreplace")
    )


class _Sessions:
    def __init__(self, secret: bytes, lifetime: float) -> None:
        self._secret = secret
        self._lifetime = lifetime

    def _mac(self, payload: str) -> str:
        return hmac.new(self._secret, payload.encode(), hashlib.sha256).hexdigest()

    def issue(self, key_id: str) -> str:
        payload = base64.urlsafe_b64encode(
            json.dumps(
                {"k": key_id, "s": secrets.token_hex(16), "exp": time.time() + self._lifetime}
            ).encode()
        ).decode()
        return f"{payload}.{self._mac(payload)}"

    def read(self, cookie: str | None) -> Session | None:
        """The session a cookie names, if its MAC holds and it has not expired."""
        if not cookie or "." not in cookie:
            return None
        payload, _, mac = cookie.rpartition(".")
        if not same_text(mac, self._mac(payload)):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(payload.encode()))
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        key_id, session_id, expires = data.get("k"), data.get("s"), data.get("exp")
        if not isinstance(key_id, str) or not isinstance(session_id, str) or len(session_id) != 32:
            return None
        if not isinstance(expires, int | float) or expires < time.time():
            return None
        return Session(key_id, session_id, float(expires))

    def csrf(self, cookie: str) -> str:
        return self._mac("csrf:" + cookie)[:40]

    def login_csrf(self, nonce: str) -> str:
        return self._mac("login:" + nonce)[:40]


def _age(seconds: float) -> str:
    if seconds < 90:
        return f"{int(seconds)} s"
    if seconds < 5400:
        return f"{int(seconds // 60)} min"
    return f"{seconds / 3600:.1f} h"


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
    templates = Jinja2Templates(directory=str(TEMPLATES))
    templates.env.filters["age"] = _age
    templates.env.filters["pretty"] = lambda v: json.dumps(v, indent=2, sort_keys=True)
    # What a person reads of text the server did not write (a key's principal): sanitised.
    templates.env.filters["shown"] = lambda v: shown_text(str(v))
    sessions = _Sessions(http.session_secret, http.session_seconds)

    def signed_in(request: Request) -> tuple[Identity, str] | None:
        cookie = request.cookies.get(COOKIE)
        session = sessions.read(cookie)
        if session is None or cookie is None:
            return None
        with read_only(service.engine).connect() as conn:
            if console_session_revoked(conn, session.session_id):
                return None
        try:
            return authenticator.by_key_id(session.key_id), cookie
        except KeyRefused:
            return None

    def page(request: Request, name: str, who: Identity, cookie: str, status: int = 200,
             **context: Any) -> HTMLResponse:
        notice = NOTICES.get(request.query_params.get("notice", ""))
        refused = REFUSALS.get(request.query_params.get("refused", ""))
        why = WHYS.get(request.query_params.get("why", ""))
        if refused and why:
            refused = f"{refused}: {why}"
        response = templates.TemplateResponse(
            request, name,
            {"who": who, "csrf": sessions.csrf(cookie), "notice": notice, "refused": refused, **context},
            status_code=status,
        )
        _harden(response)
        return response

    def to_login() -> RedirectResponse:
        return RedirectResponse("/console/login", status_code=303)

    def back(path: str, **query: str) -> RedirectResponse:
        return RedirectResponse(f"{path}?{urlencode(query)}" if query else path, status_code=303)

    def check_csrf(cookie: str, token: str) -> bool:
        return same_text(sessions.csrf(cookie), token)

    stylesheet = (TEMPLATES / "console.css").read_text(encoding="utf-8")

    @app.get("/console/console.css", include_in_schema=False)
    def console_css() -> Response:
        return Response(stylesheet, media_type="text/css", headers={"Cache-Control": "max-age=3600"})

    @app.get("/console", include_in_schema=False)
    def console_home(request: Request) -> Response:
        return back("/console/approvals") if signed_in(request) else to_login()

    @app.get("/console/login", include_in_schema=False)
    def login_page(request: Request) -> Response:
        refused = SIGN_IN_REFUSALS.get(request.query_params.get("refused", ""))
        notice = NOTICES.get(request.query_params.get("notice", ""))
        nonce = secrets.token_hex(16)
        response = templates.TemplateResponse(
            request, "login.html",
            {"refused": refused, "notice": notice, "who": None, "csrf": sessions.login_csrf(nonce)},
        )
        response.set_cookie(
            LOGIN_COOKIE, nonce, max_age=3600, httponly=True, samesite="strict",
            secure=request.url.scheme == "https", path="/console",
        )
        _harden(response)
        return response

    @app.post("/console/login", include_in_schema=False)
    def login(
        request: Request, key: str = Form("", max_length=300), csrf: str = Form("", max_length=100)
    ) -> Response:
        nonce = request.cookies.get(LOGIN_COOKIE, "")
        if not nonce or not same_text(sessions.login_csrf(nonce), csrf):
            return back("/console/login", refused="csrf")
        address = client_address(request)
        if limiter.failures_spent(address) is not None:
            return back("/console/login", refused="rate_limited")
        try:
            who = authenticator.identity(key.strip())
        except KeyRefused:
            limiter.failed(address)
            return back("/console/login", refused="invalid")
        if not who.may(KeyScope.APPROVE, KeyScope.OPERATE):
            return back("/console/login", refused="scope")
        response = back("/console/approvals")
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
            if not check_csrf(cookie, csrf):
                return back("/console/approvals", refused="csrf")
            # Ended server-side: a copy of this cookie is refused from now on.
            with service.engine.begin() as conn:
                revoke_console_session(conn, session.session_id, session.expires_at)
        response = back("/console/login", notice="signed_out")
        response.delete_cookie(COOKIE, path="/console")
        return response

    @app.get("/console/approvals", include_in_schema=False)
    def approvals_page(request: Request) -> Response:
        session = signed_in(request)
        if session is None:
            return to_login()
        who, cookie = session
        return page(request, "approvals.html", who, cookie, approvals=service.approvals(who),
                    may_decide=who.may(KeyScope.APPROVE))

    @app.post("/console/approvals/{approval_id}/{verb}", include_in_schema=False)
    def decide(
        request: Request, approval_id: str, verb: str, csrf: str = Form(""),
        reason: str = Form("", max_length=1000),
    ) -> Response:
        session = signed_in(request)
        if session is None:
            return to_login()
        who, cookie = session
        if not check_csrf(cookie, csrf):
            return back("/console/approvals", refused="csrf")
        if verb not in ("approve", "deny"):
            return back("/console/approvals", refused="invalid_request")
        if not who.may(KeyScope.APPROVE):
            return back("/console/approvals", refused="permission_denied")
        decision = ApprovalDecision.APPROVE if verb == "approve" else ApprovalDecision.DENY
        try:
            service.decide(who, approval_id, decision, reason or None)
        except ProblemError as exc:
            why = exc.errors[0].code if exc.errors else ""
            return back("/console/approvals", refused=exc.code.value, **({"why": why} if why else {}))
        return back("/console/approvals", notice="approved" if verb == "approve" else "denied")

    @app.get("/console/pending", include_in_schema=False)
    def pending_page(request: Request) -> Response:
        session = signed_in(request)
        if session is None:
            return to_login()
        who, cookie = session
        return page(request, "pending.html", who, cookie, operations=service.pending(who),
                    may_resolve=who.may(KeyScope.OPERATE))

    @app.post("/console/operations/{operation_id}/resolve", include_in_schema=False)
    def resolve(
        request: Request, operation_id: str, csrf: str = Form(""), outcome: str = Form(""),
        reference: str = Form("", max_length=200), note: str = Form("", max_length=1000),
    ) -> Response:
        session = signed_in(request)
        if session is None:
            return to_login()
        who, cookie = session
        if not check_csrf(cookie, csrf):
            return back("/console/pending", refused="csrf")
        if not who.may(KeyScope.OPERATE):
            return back("/console/pending", refused="permission_denied")
        if outcome not in ("succeeded", "failed", "requeue"):
            return back("/console/pending", refused="invalid_request")
        try:
            service.resolve(who, operation_id, outcome, reference.strip() or None, note or None)
        except ProblemError as exc:
            return back("/console/pending", refused=exc.code.value)
        return back(f"/console/operations/{operation_id}", notice="resolved")

    @app.get("/console/operations/{operation_id}", include_in_schema=False)
    def operation_page(request: Request, operation_id: str) -> Response:
        session = signed_in(request)
        if session is None:
            return to_login()
        who, cookie = session
        try:
            record = service.operation(who, operation_id)
        except ProblemError:
            return page(request, "missing.html", who, cookie, status=404, what="operation")
        return page(request, "operation.html", who, cookie, op=record)


def _harden(response: Response) -> None:
    response.headers["Content-Security-Policy"] = (
        "default-src 'none'; style-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
