"""What every console page shares: the signed-in check, rendering with the session's
CSRF token and the page's message, redirects, and the response headers."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from executor.core.sanitize import shown_text
from executor.http.console import views
from executor.http.console.sessions import COOKIE, NOTICES, REFUSALS, WHYS, _Sessions, same_text
from executor.http.keys import Authenticator, Identity, KeyRefused
from executor.http.service import Service
from executor.store.api_keys import console_session_revoked
from executor.store.engine import read_only

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
# How often a live page asks for itself again (console.js), in seconds.
LIVE_SECONDS = 2


def templates() -> Jinja2Templates:
    found = Jinja2Templates(directory=str(TEMPLATES))
    filters: dict[str, Callable[..., Any]] = {
        "age": views.age,
        "iso": views.iso_time,
        "plural": views.plural,
        "pretty": views.pretty,
        "structured": views.is_structured,
        "impact_rows": views.impact_rows,
        "principal_key": views.principal_key,
        "receipt_rows": views.receipt_rows,
        # What a person reads of text the server did not write (a key's principal): sanitised.
        "shown": lambda v: shown_text(str(v)),
        "json": lambda v: json.dumps(v, sort_keys=True, ensure_ascii=False),
    }
    found.env.filters.update(filters)
    found.env.globals["live_seconds"] = LIVE_SECONDS
    return found


@dataclass
class Console:
    service: Service
    authenticator: Authenticator
    sessions: _Sessions
    templates: Jinja2Templates

    def signed_in(self, request: Request) -> tuple[Identity, str] | None:
        cookie = request.cookies.get(COOKIE)
        session = self.sessions.read(cookie)
        if session is None or cookie is None:
            return None
        with read_only(self.service.engine).connect() as conn:
            if console_session_revoked(conn, session.session_id):
                return None
        try:
            return self.authenticator.by_key_id(session.key_id), cookie
        except KeyRefused:
            return None

    def page(
        self, request: Request, name: str, who: Identity, cookie: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        notice = NOTICES.get(request.query_params.get("notice", ""))
        refused = REFUSALS.get(request.query_params.get("refused", ""))
        why = WHYS.get(request.query_params.get("why", ""))
        if refused and why:
            refused = f"{refused}: {why}"
        response = self.templates.TemplateResponse(
            request, name,
            {"who": who, "csrf": self.sessions.csrf(cookie), "notice": notice, "refused": refused,
             "path": request.url.path, **context},
            status_code=status,
        )
        harden(response)
        return response

    @staticmethod
    def to_login(request: Request) -> RedirectResponse:
        """To the sign-in page; saying the session ended when the browser sent one (a
        restarted server's new secret, an expired or ended session), and dropping it."""
        if request.cookies.get(COOKIE):
            response = RedirectResponse("/console/login?refused=expired", status_code=303)
            response.delete_cookie(COOKIE, path="/console")
            return response
        return RedirectResponse("/console/login", status_code=303)

    @staticmethod
    def back(path: str, **query: str) -> RedirectResponse:
        return RedirectResponse(f"{path}?{urlencode(query)}" if query else path, status_code=303)

    def check_csrf(self, cookie: str, token: str) -> bool:
        return same_text(self.sessions.csrf(cookie), token)


def harden(response: Response) -> None:
    response.headers["Content-Security-Policy"] = (
        "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
