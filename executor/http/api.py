"""The HTTP API of `toolfence serve` (FastAPI): routes, authentication, rate limits.

Every `/v1` route takes its caller from `Authorization: Bearer <key>` and checks
the key's scopes; nothing in a body or a query names who the caller is. Bodies
are read by the strict reader (executor/http/body.py), checked for identity
fields, then validated by the route's model, so a body naming a tenant is
`identity_in_body` and not merely "unexpected field".
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import time
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from limits import RateLimitItem, parse, storage, strategies
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from executor.core.approvers import ApprovalDecision
from executor.core.types import ErrorCode
from executor.http.body import require_json, strict_json
from executor.http.keys import Authenticator, Identity, KeyRefused, KeyScope
from executor.http.models import (
    ID_PATTERN,
    IDENTITY_FIELDS,
    MAX_WAIT_SECONDS,
    MENDED_TEXT_FIELDS,
    NAMED_SCHEMAS,
    TURN_SERVER_FIELDS,
    ApprovalList,
    BatchAnswer,
    DecisionBody,
    DecisionOut,
    Health,
    NeutralBatch,
    OperationOut,
    PendingList,
    ProviderEnvelope,
    ProviderName,
    Ready,
    RequestAnswer,
    RequestBatch,
    ResolveBody,
    ResolveOut,
    TurnBody,
    TurnOut,
    TurnStarted,
    named_refs,
)
from executor.http.problems import (
    Problem,
    ProblemDetail,
    ProblemError,
    problem_doc,
    problem_handler,
    problem_response,
)
from executor.http.service import Service, body_digest
from executor.store.errors import StoreDatabaseError
from executor.telemetry import tracing
from outbox.producer import AdmissionUnavailable

M = TypeVar("M", bound=BaseModel)

API_TITLE = "toolfence"
API_VERSION = "1"

_bearer = HTTPBearer(auto_error=False, description="an API key from `toolfence keys create`")
# Declares the scheme in the OpenAPI document; the dependency reads the header itself
# (FastAPI's own answer to a missing key is not problem+json).
_documented_bearer = Depends(_bearer)


class RateLimiter:
    """Per-key request budget and per-address failed-authentication budget (the
    `limits` package, moving window). Storage is `memory://` (per process) unless
    TOOLFENCE_HTTP_RATE_LIMIT_STORAGE names a shared one (`redis://…`) for several
    server processes.

    A key's budget is counted only once the key is authenticated, so an unknown
    key id never creates a counter. Failed authentications are counted per client
    address, in one of `ADDRESS_BUCKETS` buckets (a digest of the address, an IPv6
    address by its /64), by a fixed window in the same storage (one integer per
    bucket): however many addresses or key ids a caller tries, memory holds at
    most `ADDRESS_BUCKETS` counters, about 1.2 MB (decision 0199)."""

    ADDRESS_BUCKETS = 4096

    def __init__(self, rate: str, storage_uri: str = "memory://", failure_rate: str = "30/minute") -> None:
        self.item: RateLimitItem = parse(rate)
        self.failure_item: RateLimitItem = parse(failure_rate)
        self.storage = storage.storage_from_string(storage_uri)
        self.limiter = strategies.MovingWindowRateLimiter(self.storage)
        self.failures = strategies.FixedWindowRateLimiter(self.storage)

    def hit(self, key_id: str) -> float | None:
        """None when within budget, else the seconds until the next request may pass."""
        if self.limiter.hit(self.item, key_id):
            return None
        return self._wait(self.item, key_id)

    def hit_more(self, key_id: str, count: int) -> float | None:
        """Count `count` more requests of the key at once (a request batch's requests
        after its first, which authentication counted): None when within budget,
        else the seconds to wait (then none of them is counted)."""
        if count <= 0 or self.limiter.hit(self.item, key_id, cost=count):
            return None
        return self._wait(self.item, key_id)

    def _wait(self, item: RateLimitItem, key: str, limiter: strategies.RateLimiter | None = None) -> float:
        stats = (limiter or self.limiter).get_window_stats(item, key)
        return max(1.0, stats.reset_time - time.time())

    @classmethod
    def address_bucket(cls, address: str) -> str:
        """The counter a client address's failed authentications are counted under."""
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError:
            network = address  # not an IP (a test client, a unix socket): itself
        else:
            wide = parsed.version == 6
            network = str(ipaddress.ip_network(f"{parsed}/64", strict=False)) if wide else str(parsed)
        digest = hashlib.blake2b(network.encode("utf-8", "replace"), digest_size=8).digest()
        return f"auth-failures:{int.from_bytes(digest, 'big') % cls.ADDRESS_BUCKETS}"

    def failures_spent(self, address: str) -> float | None:
        """None while `address` may still fail to authenticate, else the seconds to wait."""
        bucket = self.address_bucket(address)
        if self.failures.test(self.failure_item, bucket):
            return None
        return self._wait(self.failure_item, bucket, self.failures)

    def failed(self, address: str) -> None:
        """Count one failed authentication from `address`."""
        self.failures.hit(self.failure_item, self.address_bucket(address))


def client_address(request: Request) -> str:
    """The TCP peer's address (behind a proxy, the proxy's: forwarded headers are the
    caller's to write, so they are not trusted)."""
    return request.client.host if request.client is not None else "unknown"


async def request_body(request: Request, *, empty_ok: bool = False) -> bytes:
    """The raw body of a request declared JSON; ProblemError 415 otherwise."""
    raw = await request.body()
    require_json(request.headers.get("content-type"), raw, empty_ok=empty_ok)
    return raw


def read_body(
    raw: bytes,
    model: type[M] | TypeAdapter[Any],
    *,
    empty_ok: bool = False,
    server_fields: frozenset[str] = frozenset(),
) -> tuple[Any, Any]:
    """(validated body, parsed JSON) of a request; ProblemError otherwise. A body naming
    one of `server_fields` (what only the server's settings decide) is refused too."""
    value: Any = {} if (empty_ok and not raw.strip()) else strict_json(raw, mend=MENDED_TEXT_FIELDS)
    if isinstance(value, dict):
        named = sorted(IDENTITY_FIELDS & value.keys())
        calls = value.get("calls")
        if isinstance(calls, list):
            for call in calls:
                if isinstance(call, dict):
                    named += sorted(IDENTITY_FIELDS & call.keys())
        if named:
            raise ProblemError(
                400, ErrorCode.IDENTITY_IN_BODY,
                "who the caller is comes from the API key; the body may not name it",
                errors=[ProblemDetail(path=f"/{name}", code="identity_field") for name in sorted(set(named))],
            )
        settings_named = sorted(server_fields & value.keys())
        if settings_named:
            raise ProblemError(
                400, ErrorCode.INVALID_REQUEST,
                "the server's settings decide this, never a request's body",
                errors=[ProblemDetail(path=f"/{name}", code="server_setting") for name in settings_named],
            )
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python(value), value
        return model.model_validate(value), value
    except ValidationError as exc:
        raise ProblemError(
            422, ErrorCode.INVALID_REQUEST, "the body does not match the schema",
            errors=_details(exc.errors(include_input=False, include_url=False)),
        ) from None


def _details(errors: Any) -> list[ProblemDetail]:
    return [
        ProblemDetail(
            path="/" + "/".join(str(p) for p in e.get("loc", ()) if p != "body"),
            code=str(e.get("type", "invalid")),
            expected=str(e.get("msg", ""))[:200] or None,
        )
        for e in list(errors)[:20]
    ]


IdPath = Annotated[str, Path(min_length=1, max_length=200, pattern=ID_PATTERN)]

ALL_PROBLEMS = (400, 401, 403, 404, 405, 409, 413, 415, 422, 429)



# The two POSTs that start work share their idempotency surface: the header, its
# documentation, and the 202 that says whether it answers a retried POST.
IdempotencyKey = Annotated[str | None, Header(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")]
REPLAYED_HEADER: dict[str, Any] = {"Idempotent-Replayed": {
    "schema": {"type": "string", "enum": ["true"]},
    "description": "present when this answers a retried POST of the same Idempotency-Key",
}}


def _accepted(answer: BaseModel, replayed: bool) -> JSONResponse:
    headers = {"Idempotent-Replayed": "true"} if replayed else None
    return JSONResponse(answer.model_dump(mode="json"), status_code=202, headers=headers)


OPENAPI_TAGS = [
    {"name": "requests", "description": "Submit tool calls and read one result per call"},
    {"name": "turns", "description": "Durable turns: the model loop run by the server"},
    {"name": "approvals", "description": "Calls waiting for a person's approval, and the decision"},
    {"name": "operations", "description": "Operations: their record, and those waiting for a person"},
    {"name": "health", "description": "Liveness and readiness"},
]
"""The tags of the API's operations, in the order a reader meets them."""


def build_api(service: Service, authenticator: Authenticator, limiter: RateLimiter) -> FastAPI:
    app = FastAPI(
        title=API_TITLE, version=API_VERSION,
        description=(
            "Any-language producers for toolfence: admit and enqueue tool calls, read "
            "their results, decide approvals and settle operations waiting for a person. "
            "Errors are RFC 9457 problem+json with toolfence's stable codes."
        ),
        docs_url=None, redoc_url=None, openapi_url="/openapi.json",
        # Each operation's id is its function's name (submit_request, approve, ...), and
        # each has a tag: a generated client's `api.approvals.approve`, not
        # `approve_v1_approvals_approval_id_approve_post` (decision 0219).
        generate_unique_id_function=lambda route: route.name,
        openapi_tags=OPENAPI_TAGS,
        # FastAPI's own SERVER and operation spans, into toolfence's tracer when tracing
        # is on (a POST /v1/requests' operations join its trace); off, none at all.
        telemetry=tracing.fastapi_telemetry(),  # type: ignore[arg-type]
    )
    app.state.service = service
    app.add_exception_handler(ProblemError, problem_handler)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = ErrorCode.NOT_FOUND if exc.status_code == 404 else ErrorCode.INVALID_REQUEST
        # A 405 names the methods the route has (`Allow`, RFC 9110 §15.5.6).
        return problem_response(
            request.url.path, exc.status_code, code, str(exc.detail), headers=dict(exc.headers or {})
        )

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return problem_response(
            request.url.path, 422, ErrorCode.INVALID_REQUEST, "the request does not match the schema",
            errors=_details(exc.errors()),
        )

    async def database_error(request: Request, exc: Exception) -> JSONResponse:
        # The store boundary's error carries no statement or parameters. A lost
        # connection is worth retrying; anything else is the server's fault.
        assert isinstance(exc, StoreDatabaseError)
        if exc.connection_error:
            return problem_response(
                request.url.path, 503, ErrorCode.UPSTREAM_UNAVAILABLE, "the database is unreachable",
                headers={"Retry-After": "1"},
            )
        return problem_response(
            request.url.path, 500, ErrorCode.EXECUTION_FAILED, "the database refused the statement",
        )

    async def admission_unavailable(request: Request, exc: Exception) -> JSONResponse:
        # A tool's rule lost its connection: nothing was recorded (the transaction
        # rolled back, the Idempotency-Key claim with it), so the same request may
        # be sent again. The message names the tool and the gate, never the error's text.
        assert isinstance(exc, AdmissionUnavailable)
        return problem_response(
            request.url.path, 503, ErrorCode.UPSTREAM_UNAVAILABLE, str(exc),
            headers={"Retry-After": "1"},
        )

    app.add_exception_handler(StoreDatabaseError, database_error)
    app.add_exception_handler(AdmissionUnavailable, admission_unavailable)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)

    challenge = {"WWW-Authenticate": 'Bearer realm="toolfence"'}

    def presented_key(request: Request) -> str:
        header = request.headers.get("authorization", "")
        scheme, _, key_text = header.partition(" ")
        if scheme.lower() != "bearer" or not key_text.strip():
            raise ProblemError(401, ErrorCode.UNAUTHENTICATED, "send Authorization: Bearer <key>",
                               headers=challenge)
        return key_text.strip()

    def authenticate(key_text: str, address: str, scopes: tuple[KeyScope, ...]) -> Identity:
        """The caller, or ProblemError 401/403/429: blocking (the key's row, the limits'
        storage), so run in a worker thread."""
        wait = limiter.failures_spent(address)
        if wait is not None:
            raise ProblemError(
                429, ErrorCode.RATE_LIMITED, "too many failed authentications from this address",
                headers={"Retry-After": str(math.ceil(wait))},
            )
        try:
            who = authenticator.identity(key_text)
        except KeyRefused as exc:
            limiter.failed(address)
            detail = "the key is revoked" if exc.reason == "revoked" else "the key is not valid"
            raise ProblemError(401, ErrorCode.UNAUTHENTICATED, detail, headers=challenge) from None
        # Counted once the key is known to be this caller's: an unknown id has no budget.
        wait = limiter.hit(who.key_id)
        if wait is not None:
            raise ProblemError(
                429, ErrorCode.RATE_LIMITED, "this key's request budget is spent for now",
                headers={"Retry-After": str(math.ceil(wait))},
            )
        if not who.may(*scopes):
            raise ProblemError(
                403, ErrorCode.PERMISSION_DENIED,
                f"this needs a key with one of the scopes: {', '.join(s.value for s in scopes)}",
            )
        return who

    def caller(*scopes: KeyScope) -> Callable[..., Identity]:
        def dependency(request: Request, _: Any = _documented_bearer) -> Identity:
            return authenticate(presented_key(request), client_address(request), scopes)

        return dependency

    def caller_in_thread(*scopes: KeyScope) -> Callable[..., Any]:
        """`caller`, for a route that runs blocking work in a thread anyway: the key's
        header checked at once, its verification returned to be called first thing in
        that thread, so a request costs one thread hand-off, not two (decision 0228)."""

        async def dependency(request: Request, _: Any = _documented_bearer) -> Callable[[], Identity]:
            key_text, address = presented_key(request), client_address(request)
            return lambda: authenticate(key_text, address, scopes)

        return dependency

    producer = Depends(caller(KeyScope.PRODUCE))
    producer_in_thread = Depends(caller_in_thread(KeyScope.PRODUCE))
    reader = Depends(caller(KeyScope.PRODUCE, KeyScope.READ))
    approvals_reader = Depends(caller(KeyScope.APPROVE, KeyScope.READ))
    approver = Depends(caller(KeyScope.APPROVE))
    operator_reader = Depends(caller(KeyScope.OPERATE, KeyScope.READ))
    operator = Depends(caller(KeyScope.OPERATE))
    anyone = Depends(caller(*KeyScope))

    v1 = APIRouter(prefix="/v1", responses=problem_doc(*ALL_PROBLEMS))
    batch_or_envelope: TypeAdapter[NeutralBatch | ProviderEnvelope] = TypeAdapter(
        NeutralBatch | ProviderEnvelope
    )

    @v1.post(
        "/requests", status_code=202, response_model=RequestAnswer, tags=["requests"],
        summary="Admit and enqueue a batch of calls, or a provider response's calls",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"anyOf": [
                    {"$ref": "#/components/schemas/NeutralBatch"},
                    {"$ref": "#/components/schemas/ProviderEnvelope"},
                ]}}},
            },
        },
        responses={202: {"headers": REPLAYED_HEADER}},
    )
    async def submit_request(
        request: Request,
        who_of: Callable[[], Identity] = producer_in_thread,
        idempotency_key: IdempotencyKey = None,
    ) -> JSONResponse:
        raw = await request.body()
        content_type = request.headers.get("content-type")

        def admit() -> tuple[RequestAnswer, bool]:
            # In this order, as every route: the key (401/429/403), then the body.
            who = who_of()
            require_json(content_type, raw)
            body, value = read_body(raw, batch_or_envelope)
            # The body's canonical digest matters only to an Idempotency-Key's claim.
            digest = body_digest(value, raw) if idempotency_key else ""
            return service.submit(who, body, digest, idempotency_key)

        answer, replayed = await _in_thread(admit)
        return _accepted(answer, replayed)

    @v1.post(
        "/request-batches", status_code=202, response_model=BatchAnswer, tags=["requests"],
        summary="Admit and enqueue many requests in one transaction",
        description=(
            "Each request is admitted as POST /v1/requests admits one (its own idempotency, budgets, "
            "repeat rules, ordering and results), all in one transaction. Each request counts "
            "against the key's rate limit. A request the batch cannot take (a bad conversation id, "
            "a call id twice, a request_key twice) refuses the whole batch before anything is "
            "written: the problem's errors[].path names it (/requests/<index>/...)."
        ),
        openapi_extra={"requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/RequestBatch"}}
        }}},
        responses=problem_doc(503),
    )
    async def submit_request_batch(request: Request, who: Identity = producer) -> JSONResponse:
        raw = await request_body(request)
        _, value = read_body(raw, _ANY_JSON)
        _no_identity_in_items(value)  # before the schema: 400 identity_in_body, as for one request
        try:
            body = RequestBatch.model_validate(value)
        except ValidationError as exc:
            raise ProblemError(
                422, ErrorCode.INVALID_REQUEST, "the body does not match the schema",
                errors=_details(exc.errors(include_input=False, include_url=False)),
            ) from None
        wait = limiter.hit_more(who.key_id, len(body.requests) - 1)
        if wait is not None:
            raise ProblemError(
                429, ErrorCode.RATE_LIMITED, "this key's request budget cannot take the whole batch now",
                headers={"Retry-After": str(math.ceil(wait))},
            )
        answer = await _in_thread(service.submit_many, who, body)
        return JSONResponse(answer.model_dump(mode="json"), status_code=202)

    @v1.get(
        "/requests/{request_id}", response_model=RequestAnswer, summary="One result per call",
        tags=["requests"],
    )
    async def get_request(
        request_id: IdPath,
        who: Identity = reader,
        provider: ProviderName | None = None,
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT_SECONDS, description="long-poll seconds")] = 0.0,
    ) -> RequestAnswer:
        return await service.request(who, request_id, provider=provider, wait=wait)

    @v1.post(
        "/turns", status_code=202, response_model=TurnStarted, tags=["turns"],
        summary="Run a user message as a durable turn (on the server's driver)",
        openapi_extra={"requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/TurnBody"}}
        }}},
        responses={
            202: {"headers": REPLAYED_HEADER},
            **problem_doc(503),
        },
    )
    async def start_turn(
        request: Request,
        who: Identity = producer,
        idempotency_key: IdempotencyKey = None,
    ) -> JSONResponse:
        raw = await request_body(request)
        body, value = read_body(raw, TurnBody, server_fields=TURN_SERVER_FIELDS)
        digest = body_digest(value, raw, kind="turn\0")
        answer, replayed = await _in_thread(service.start_turn, who, body, digest, idempotency_key)
        return _accepted(answer, replayed)

    @v1.get(
        "/turns/{turn_id}", response_model=TurnOut, summary="A turn: state, steps, calls, output",
        tags=["turns"],
    )
    async def get_turn(
        turn_id: IdPath,
        who: Identity = reader,
        wait: Annotated[
            float, Query(ge=0, le=MAX_WAIT_SECONDS, description="long-poll seconds until the turn ends")
        ] = 0.0,
    ) -> TurnOut:
        return await service.turn(who, turn_id, wait=wait)

    @v1.get(
        "/approvals", response_model=ApprovalList, summary="Calls waiting for a person's approval",
        tags=["approvals"],
    )
    def list_approvals(who: Identity = approvals_reader) -> ApprovalList:
        return ApprovalList(approvals=service.approvals(who))

    decision_body = {
        "requestBody": {
            "required": False,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DecisionBody"}}},
        }
    }

    @v1.post(
        "/approvals/{approval_id}/approve", response_model=DecisionOut, openapi_extra=decision_body,
        summary="Approve a pending call", tags=["approvals"],
    )
    async def approve(request: Request, approval_id: IdPath, who: Identity = approver) -> DecisionOut:
        body, _ = read_body(await request_body(request, empty_ok=True), DecisionBody, empty_ok=True)
        decided: DecisionOut = await _in_thread(
            service.decide, who, approval_id, ApprovalDecision.APPROVE, body.reason, body.impact_digest
        )
        return decided

    @v1.post(
        "/approvals/{approval_id}/deny", response_model=DecisionOut, openapi_extra=decision_body,
        summary="Deny a pending call", tags=["approvals"],
    )
    async def deny(request: Request, approval_id: IdPath, who: Identity = approver) -> DecisionOut:
        body, _ = read_body(await request_body(request, empty_ok=True), DecisionBody, empty_ok=True)
        decided: DecisionOut = await _in_thread(
            service.decide, who, approval_id, ApprovalDecision.DENY, body.reason
        )
        return decided

    @v1.get(
        "/pending", response_model=PendingList, summary="Operations waiting for a person", tags=["operations"]
    )
    def list_pending(
        who: Identity = operator_reader, limit: Annotated[int, Query(ge=1, le=500)] = 100
    ) -> PendingList:
        return PendingList(operations=service.pending(who, limit))

    @v1.post(
        "/operations/{operation_id}/resolve", response_model=ResolveOut, tags=["operations"],
        summary="Resolve an operation waiting for a person (audited)",
        openapi_extra={"requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/ResolveBody"}}
        }}},
    )
    async def resolve_operation(
        request: Request, operation_id: IdPath, who: Identity = operator
    ) -> ResolveOut:
        body, _ = read_body(await request_body(request), ResolveBody)
        resolved: ResolveOut = await _in_thread(
            service.resolve, who, operation_id, body.outcome, body.reference, body.note
        )
        return resolved

    @v1.get(
        "/operations/{operation_id}", response_model=OperationOut, tags=["operations"],
        summary="An operation: state, generations, receipts, audit trail",
    )
    def get_operation(operation_id: IdPath, who: Identity = anyone) -> OperationOut:
        return service.operation(who, operation_id)

    app.include_router(v1)

    @app.get("/healthz", response_model=Health, summary="The process is up", tags=["health"])
    def healthz() -> Health:
        return Health(status="ok")

    @app.get("/readyz", response_model=Ready, responses=problem_doc(503), tags=["health"],
             summary="The database is reachable and its schema current")
    def readyz() -> Ready:
        from executor.store.migrate import current_revision, head_revision

        try:
            current = current_revision(service.engine)
        except Exception:
            raise ProblemError(503, ErrorCode.NOT_READY, "the database is not reachable") from None
        head = head_revision(service.settings.database_url)
        if current != head:
            raise ProblemError(
                503, ErrorCode.NOT_READY, f"schema at {current or 'nothing'}, expected {head}"
            )
        return Ready(status="ready", revision=head)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes,
                tags=app.openapi_tags,
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(NAMED_SCHEMAS)
            for model in (
                NeutralBatch, ProviderEnvelope, RequestBatch, DecisionBody, ResolveBody, TurnBody, Problem,
            ):
                found = model.model_json_schema(ref_template="#/components/schemas/{model}")
                for name, definition in found.pop("$defs", {}).items():
                    components.setdefault(name, definition)
                components[model.__name__] = found
            app.openapi_schema = named_refs(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


_ANY_JSON: TypeAdapter[Any] = TypeAdapter(Any)


def _no_identity_in_items(value: Any) -> None:
    """A batch's requests and their calls may not name who the caller is either
    (`read_body` checks a body's top level and its calls)."""
    named: set[str] = set()
    for item in value.get("requests", []) if isinstance(value, dict) else []:
        if isinstance(item, dict):
            named |= IDENTITY_FIELDS & item.keys()
            for call in item.get("calls", []) if isinstance(item.get("calls"), list) else []:
                if isinstance(call, dict):
                    named |= IDENTITY_FIELDS & call.keys()
    if named:
        raise ProblemError(
            400, ErrorCode.IDENTITY_IN_BODY,
            "who the caller is comes from the API key; the body may not name it",
            errors=[ProblemDetail(path=f"/{name}", code="identity_field") for name in sorted(named)],
        )


async def _in_thread(function: Callable[..., Any], *args: Any) -> Any:
    """Blocking database work off the event loop."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(function, *args)
