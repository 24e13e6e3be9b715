"""The pages where a person decides: approvals (with the impact as of now), what
needs a person (`reconciliation_pending`), and one operation's record."""

from __future__ import annotations

import re

from fastapi import FastAPI, Form, Request
from fastapi.responses import Response

from executor.core.approvers import ApprovalDecision
from executor.core.states import TERMINAL
from executor.core.tools import Effect
from executor.http.console.base import Console
from executor.http.keys import KeyScope
from executor.http.models import IMPACT_DIGEST_PATTERN
from executor.http.problems import ProblemError

# The confirmation "Run it again" on an unsafe write needs (a checkbox's value).
RUN_AGAIN_CONFIRMED = "it-did-not-happen"


def mount(app: FastAPI, console: Console) -> None:
    service = console.service

    @app.get("/console/approvals", include_in_schema=False)
    def approvals_page(request: Request) -> Response:
        session = console.signed_in(request)
        if session is None:
            return console.to_login(request)
        who, cookie = session
        return console.page(request, "approvals.html", who, cookie, approvals=service.approvals(who),
                            may_decide=who.may(KeyScope.APPROVE), live=True)

    @app.post("/console/approvals/{approval_id}/{verb}", include_in_schema=False)
    def decide(
        request: Request, approval_id: str, verb: str, csrf: str = Form(""),
        reason: str = Form("", max_length=1000), impact_digest: str = Form("", max_length=64),
    ) -> Response:
        session = console.signed_in(request)
        if session is None:
            return console.to_login(request)
        who, cookie = session
        if not console.check_csrf(cookie, csrf):
            return console.back("/console/approvals", refused="csrf")
        if verb not in ("approve", "deny"):
            return console.back("/console/approvals", refused="invalid_request")
        if not who.may(KeyScope.APPROVE):
            return console.back("/console/approvals", refused="permission_denied")
        decision = ApprovalDecision.APPROVE if verb == "approve" else ApprovalDecision.DENY
        # The console always sends the digest of the impact it showed: an approve
        # form without one is incomplete, never "approve whatever it is now".
        if decision is ApprovalDecision.APPROVE and not re.fullmatch(IMPACT_DIGEST_PATTERN, impact_digest):
            return console.back("/console/approvals", refused="invalid_request")
        try:
            service.decide(
                who, approval_id, decision, reason or None,
                impact_digest if decision is ApprovalDecision.APPROVE else None,
            )
        except ProblemError as exc:
            why = exc.errors[0].code if exc.errors else ""
            # (a `why` outside WHYS, such as a stale digest's, shows nothing more)
            return console.back("/console/approvals", refused=exc.code.value, **({"why": why} if why else {}))
        return console.back("/console/approvals", notice="approved" if verb == "approve" else "denied")

    @app.get("/console/pending", include_in_schema=False)
    def pending_page(request: Request) -> Response:
        session = console.signed_in(request)
        if session is None:
            return console.to_login(request)
        who, cookie = session
        return console.page(request, "pending.html", who, cookie, operations=service.pending(who),
                            may_resolve=who.may(KeyScope.OPERATE), confirmed=RUN_AGAIN_CONFIRMED,
                            unsafe=Effect.UNSAFE.value, live=True)

    @app.post("/console/operations/{operation_id}/resolve", include_in_schema=False)
    def resolve(
        request: Request, operation_id: str, csrf: str = Form(""), outcome: str = Form(""),
        reference: str = Form("", max_length=200), note: str = Form("", max_length=1000),
        confirm: str = Form("", max_length=40),
    ) -> Response:
        session = console.signed_in(request)
        if session is None:
            return console.to_login(request)
        who, cookie = session
        if not console.check_csrf(cookie, csrf):
            return console.back("/console/pending", refused="csrf")
        if not who.may(KeyScope.OPERATE):
            return console.back("/console/pending", refused="permission_denied")
        if outcome not in ("succeeded", "failed", "requeue"):
            return console.back("/console/pending", refused="invalid_request")
        if outcome == "requeue" and confirm != RUN_AGAIN_CONFIRMED:
            # Running a write again whose first run may have happened can do it twice:
            # the form says so, and the server holds it to the person's confirmation.
            try:
                record = service.operation(who, operation_id)
            except ProblemError as exc:
                return console.back("/console/pending", refused=exc.code.value)
            tool = service.registry.get(record.tool)
            if tool is None or Effect.UNSAFE in tool.effects:
                return console.back("/console/pending", refused="confirm")
        try:
            service.resolve(who, operation_id, outcome, reference.strip() or None, note or None)
        except ProblemError as exc:
            return console.back("/console/pending", refused=exc.code.value)
        return console.back(f"/console/operations/{operation_id}", notice="resolved")

    @app.get("/console/operations/{operation_id}", include_in_schema=False)
    def operation_page(request: Request, operation_id: str) -> Response:
        session = console.signed_in(request)
        if session is None:
            return console.to_login(request)
        who, cookie = session
        try:
            record = service.operation(who, operation_id)
        except ProblemError:
            return console.page(request, "missing.html", who, cookie, status=404, what="operation")
        # Live until it has ended: a terminal operation's page no longer changes.
        live = record.state not in {s.value for s in TERMINAL}
        return console.page(request, "operation.html", who, cookie, op=record, live=live)
