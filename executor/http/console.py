"""The operator console under `/console`: server-rendered pages, plain forms.

A person signs in with an `approve` or `operate` key. The session cookie
(HttpOnly, SameSite=Strict, Secure over HTTPS) carries the key's id, an expiry
and an HMAC over both, never the key; the key's row is read on every page, so a
revoked key's session ends at once. Every form carries a CSRF token, an HMAC of
the session cookie, checked on every POST. The pages show only the signed-in
key's tenant; actions go through the same Service the API uses.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode

from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from executor.core.approvers import ApprovalDecision
from executor.http.api import RateLimiter
from executor.http.keys import Authenticator, Identity, KeyRefused, KeyScope, split_key
from executor.http.problems import ProblemError
from executor.http.service import Service

COOKIE = "toolfence_session"
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
SIGN_IN_REFUSALS = {
    "invalid": "That key is not valid (or revoked).",
    "scope": "Sign in with a key that has the approve or operate scope.",
    "rate_limited": "Too many attempts; wait a minute.",
}


class _Sessions:
    def __init__(self, secret: bytes, lifetime: float) -> None:
        self._secret = secret
        self._lifetime = lifetime

    def _mac(self, payload: str) -> str:
        return hmac.new(self._secret, payload.encode(), hashlib.sha256).hexdigest()

    def issue(self, key_id: str) -> str:
        payload = base64.urlsafe_b64encode(
            json.dumps({"k": key_id, "exp": time.time() + self._lifetime}).encode()
        ).decode()
        return f"{payload}.{self._mac(payload)}"

    def key_id(self, cookie: str | None) -> str | None:
        if not cookie or "." not in cookie:
            return None
        payload, _, mac = cookie.rpartition(".")
        if not hmac.compare_digest(mac, self._mac(payload)):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(payload.encode()))
        except ValueError:
            return None
        if not isinstance(data, dict) or float(data.get("exp", 0)) < time.time():
            return None
        key_id = data.get("k")
        return key_id if isinstance(key_id, str) else None

    def csrf(self, cookie: str) -> str:
        return self._mac("csrf:" + cookie)[:40]


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
    sessions = _Sessions(http.session_secret, http.session_seconds)

    def signed_in(request: Request) -> tuple[Identity, str] | None:
        cookie = request.cookies.get(COOKIE)
        key_id = sessions.key_id(cookie)
        if key_id is None or cookie is None:
            return None
        try:
            return authenticator.by_key_id(key_id), cookie
        except KeyRefused:
            return None

    def page(request: Request, name: str, who: Identity, cookie: str, status: int = 200,
             **context: Any) -> HTMLResponse:
        notice = NOTICES.get(request.query_params.get("notice", ""))
        refused = REFUSALS.get(request.query_params.get("refused", ""))
        why = request.query_params.get("why", "")
        if refused and why.replace("_", "").isalnum() and len(why) <= 40:
            refused = f"{refused} ({why})"
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
        return hmac.compare_digest(sessions.csrf(cookie), token)

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
        response = templates.TemplateResponse(
            request, "login.html", {"refused": refused, "notice": notice, "who": None}
        )
        _harden(response)
        return response

    @app.post("/console/login", include_in_schema=False)
    def login(request: Request, key: str = Form("", max_length=300)) -> Response:
        try:
            key_id, _ = split_key(key.strip())
            if limiter.hit(key_id) is not None:
                return back("/console/login", refused="rate_limited")
            who = authenticator.identity(key.strip())
        except KeyRefused:
            return back("/console/login", refused="invalid")
        if not who.may(KeyScope.APPROVE, KeyScope.OPERATE):
            return back("/console/login", refused="scope")
        response = back("/console/approvals")
        response.set_cookie(
            COOKIE, sessions.issue(who.key_id), max_age=int(http.session_seconds), httponly=True,
            samesite="strict", secure=request.url.scheme == "https", path="/console",
        )
        return response

    @app.post("/console/logout", include_in_schema=False)
    def logout(request: Request, csrf: str = Form("")) -> Response:
        session = signed_in(request)
        if session is not None and not check_csrf(session[1], csrf):
            return back("/console/approvals", refused="csrf")
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
