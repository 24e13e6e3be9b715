"""RFC 9457 problem details: every error `toolfence serve` answers.

`type` is `urn:toolfence:problem:<code>`, `code` the stable ErrorCode (an
extension member, for clients that branch on it), `errors` the safe details
(path, code, expected) and never the rejected value.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse

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
        status=status, detail=detail, instance=request_path, code=code.value, errors=errors or [],
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
