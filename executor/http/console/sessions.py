"""The console's sessions and the messages its pages may show.

The session cookie carries a key's id, a random session id, an expiry and an HMAC
over them, never the key. A cookie whose MAC no longer holds (the server restarted
with a new secret), that has expired, or whose session was ended, is a session
that ended: the page sends the person to sign in again, saying so.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from executor.core.approvers import ApproverRefusal

COOKIE = "toolfence_session"
# The sign-in form's pre-session cookie: its HMAC is the form's CSRF token.
LOGIN_COOKIE = "toolfence_login"

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
    "impact_changed": "The impact changed since you saw it: nothing was decided. "
    "Read the new figures below and decide again",
    "confirm": "Running an unsafe write again needs your confirmation that it did not happen",
}
# Why the approver policy refused, by ApproverRefusal code (every member has a line).
WHYS = {
    ApproverRefusal.OTHER_TENANT.value: "the approval is another tenant's",
    ApproverRefusal.SELF_APPROVAL.value: "you may not decide your own call",
    ApproverRefusal.ROLE_NOT_ALLOWED.value: "none of your roles may decide it",
    ApproverRefusal.PREDICATE_REFUSED.value: "the tool's approver rule refused you",
    ApproverRefusal.POLICY_FAILED.value: "the approver policy failed; it stays pending",
    ApproverRefusal.NO_APPROVER_POLICY.value: "the tool declares no approver policy",
    "impact_unavailable": "its impact cannot be computed now, so it cannot be approved",
}
SIGN_IN_REFUSALS = {
    "invalid": "That key is not valid (or revoked).",
    "csrf": "The sign-in form expired; try again.",
    "scope": "Sign in with a key that has the approve or operate scope.",
    "rate_limited": "Too many attempts; wait a minute.",
    "expired": "Your session expired (or the server restarted, or it was ended): sign in again.",
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
