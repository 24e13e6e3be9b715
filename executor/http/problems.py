"""RFC 9457 problem details: every error `toolfence serve` answers.

`type` is `urn:toolfence:problem:<code>`, `code` the stable ErrorCode (an
extension member, for clients that branch on it), `errors` the safe details
(path, code, expected) and never the rejected value.

Nothing the caller wrote is echoed raw (decision 0201): a segment of an error's
`path` is kept only when it is a position or a name of the API's own schemas
(anything else, a rejected key's name say, becomes `~` and a digest of it), and
`instance` and `detail` pass through the sanitiser (controls dropped, secrets
redacted, capped) and `instance` is percent-encoded.
"""

from __future__ import annotations

import hashlib
from functools import cache
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse

from executor.core.sanitize import sanitize_text
from executor.core.types import ErrorCode
from executor.errors import HttpError

PROBLEM_MEDIA_TYPE = "application/problem+json"

TITLES: dict[ErrorCode, str] = {
    ErrorCode.UNAUTHENTICATED: "No valid API key",
    ErrorCode.PERMISSION_DENIED: "The key's scopes do not allow this",
    ErrorCode.NOT_FOUND: "No such resource for this tenant",
    ErrorCode.IDENTITY_IN_BODY: "Identity comes from the API key, never the body",
    ErrorCode.INVALID_REQUEST: "The request is malformed",
    ErrorCode.REQUEST_TOO_LARGE: "The request body is too large",
    ErrorCode.RATE_LIMITED: "Too many requests for this key",
    ErrorCode.IDEMPOTENCY_CONFLICT: "The Idempotency-Key was used for a different request",
    ErrorCode.NOT_PENDING: "Nothing is waiting for that decision",
    ErrorCode.APPROVER_NOT_ALLOWED: "This approver may not decide this approval",
    ErrorCode.NOT_READY: "Not ready",
}


class ProblemDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    code: str
    expected: str | None = None


class Problem(BaseModel):
    """The problem+json body (RFC 9457), with toolfence's `code` and `errors`."""

    model_config = ConfigDict(extra="forbid")

    type: str
    title: str
    status: int
    detail: str
    instance: str
    code: str
    errors: list[ProblemDetail] = []


class ProblemError(HttpError):
    """Raised by a handler: answered as problem+json with `status` and `code`."""

    def __init__(
        self,
        status: int,
        code: ErrorCode,
        detail: str,
        *,
        errors: list[ProblemDetail] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.errors = errors or []
        self.headers = headers or {}


INSTANCE_MAX_CHARS = 200
DETAIL_MAX_CHARS = 500


@cache
def schema_names() -> frozenset[str]:
    """Every property and schema name of the API's request bodies: the path segments
    an error may name as they are (the server wrote them, not the caller)."""
    from executor.http.models import (
        DecisionBody,
        NeutralBatch,
        ProviderEnvelope,
        RequestBatch,
        ResolveBody,
        TurnBody,
    )

    # Where an error is, and the parameters of the routes (query, path, header).
    names: set[str] = {
        "body", "query", "header", "path", "wait", "limit", "provider", "request_id", "turn_id",
        "approval_id", "operation_id", "idempotency-key", "authorization", "content-type",
    }

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("properties", "$defs"):
                if isinstance(node.get(key), dict):
                    names.update(node[key])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for model in (NeutralBatch, ProviderEnvelope, RequestBatch, DecisionBody, ResolveBody, TurnBody):
        names.add(model.__name__)
        walk(model.model_json_schema())
    from executor.http.models import IDENTITY_FIELDS, TURN_SERVER_FIELDS

    return frozenset(names | IDENTITY_FIELDS | TURN_SERVER_FIELDS)


def _segment(segment: str) -> str:
    if segment.isdigit() or segment in schema_names() or segment == "":
        return segment
    return "~" + hashlib.sha256(segment.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def safe_path(path: str) -> str:
    """An error's JSON-pointer-like path, each segment a position, a schema name or a digest."""
    return "/".join(_segment(segment) for segment in path.split("/"))


def safe_instance(request_path: str) -> str:
    """The request's path as a problem may show it: sanitised, capped, percent-encoded."""
    text = request_path.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    cleaned, _ = sanitize_text(text, INSTANCE_MAX_CHARS)
    return quote(cleaned, safe="/-._~[]")


def problem_response(
    request_path: str,
    status: int,
    code: ErrorCode,
    detail: str,
    *,
    errors: list[ProblemDetail] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = Problem(
        type=f"urn:toolfence:problem:{code.value}", title=TITLES.get(code, code.value),
        status=status, detail=sanitize_text(detail, DETAIL_MAX_CHARS)[0],
        instance=safe_instance(request_path), code=code.value,
        errors=[
            ProblemDetail(
                path=safe_path(e.path), code=e.code,
                expected=None if e.expected is None else sanitize_text(e.expected, DETAIL_MAX_CHARS)[0],
            )
            for e in errors or []
        ],
    )
    return JSONResponse(
        body.model_dump(mode="json"), status_code=status, media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


async def problem_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProblemError)
    return problem_response(
        request.url.path, exc.status, exc.code, exc.detail, errors=exc.errors, headers=exc.headers
    )


def problem_doc(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` entries of the problems a route may answer."""
    return {
        status: {
            "description": "problem details (RFC 9457)",
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }
