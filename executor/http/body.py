"""Request bodies: a size cap for every request, and a strict JSON reader.

The cap is enforced while the body streams in (a lying or missing
Content-Length does not get past it). The reader refuses what `json.loads`
accepts and a producer in another language may not mean: duplicate keys (which
one wins differs per parser), NaN and Infinity, nesting deeper than a bound,
and bytes that are not UTF-8.
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from executor.core.types import ErrorCode
from executor.http.problems import ProblemDetail, ProblemError, problem_response

MAX_DEPTH = 64


class BodySizeLimit:
    """ASGI middleware: a body over `max_bytes` is answered 413 request_too_large."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await self._refuse(path, scope, receive, send)
                    return
        # Buffer the body (it is small by definition) so that one over the cap is
        # refused before any handler has seen a byte of it.
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away: let the app see it
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                await self._refuse(path, scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, path: str, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response(
            path, 413, ErrorCode.REQUEST_TOO_LARGE,
            f"request bodies are limited to {self.max_bytes} bytes",
        )
        await response(scope, receive, send)


JSON_MEDIA_TYPES = ("application/json",)


def require_json(content_type: str | None, raw: bytes, *, empty_ok: bool = False) -> None:
    """ProblemError 415 unless a body is declared JSON (`application/json` or a
    `+json` type, `charset` UTF-8 if named). An empty body where `empty_ok` needs no type."""
    if empty_ok and not raw.strip():
        return
    media, _, parameters = (content_type or "").partition(";")
    media = media.strip().lower()
    charset = ""
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip('"').lower()
    is_json = media in JSON_MEDIA_TYPES or (media.startswith("application/") and media.endswith("+json"))
    if not is_json or charset not in ("", "utf-8", "utf8"):
        raise ProblemError(
            415, ErrorCode.INVALID_REQUEST, "request bodies are JSON (Content-Type: application/json)",
            errors=[ProblemDetail(path="", code="unsupported_media_type", expected="application/json")],
        )


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _Refused("duplicate_key", "each object key once")
        found[key] = value
    return found


def _no_constant(name: str) -> Any:
    raise _Refused("non_finite_number", "a finite number")


class _Refused(ValueError):
    """Control flow inside this module, answered as a problem; not a `ToolfenceError`."""

    def __init__(self, code: str, expected: str) -> None:
        super().__init__(code)
        self.code = code
        self.expected = expected


def _storable(text: str) -> bool:
    """Text a database column can hold: UTF-8-encodable (no lone surrogate, which a
    JSON `\ud800` escape can produce) and without NUL (PostgreSQL refuses it)."""
    if "\0" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _depth(value: Any, limit: int) -> int:
    """Nesting depth, iteratively (a deep body must not exhaust the stack here);
    _Refused when a string or key is not storable text."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str) and not _storable(node):
            raise _Refused("invalid_text", "text without NUL or lone surrogates")
        if isinstance(node, dict) and not all(_storable(k) for k in node):
            raise _Refused("invalid_text", "text without NUL or lone surrogates")
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return deepest


_SURROGATE = re.compile("[\ud800-\udfff]")


def mend_text(value: Any, fields: frozenset[str]) -> Any:
    """`value` with each lone surrogate in its top-level `fields` (a person's free text)
    replaced by U+FFFD, as a UTF-8 decoder does. After parsing, a valid pair is one
    character, so any surrogate left is a lone one."""
    if isinstance(value, dict):
        for name in fields & value.keys():
            if isinstance(value[name], str):
                value[name] = _SURROGATE.sub("\ufffd", value[name])
    return value


def strict_json(raw: bytes, *, max_depth: int = MAX_DEPTH, mend: frozenset[str] = frozenset()) -> Any:
    """The JSON value of a request body; ProblemError 400 invalid_request otherwise.
    Lone surrogates in the top-level text members named by `mend` are replaced
    (`mend_text`); anywhere else they are refused."""

    def refuse(code: str, expected: str) -> ProblemError:
        return ProblemError(
            400, ErrorCode.INVALID_REQUEST, "the body is not acceptable JSON",
            errors=[ProblemDetail(path="", code=code, expected=expected)],
        )

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise refuse("invalid_utf8", "UTF-8 text") from None
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _Refused as exc:
        raise refuse(exc.code, exc.expected) from None
    except RecursionError:
        raise refuse("too_deep", f"at most {max_depth} levels of nesting") from None
    except ValueError:
        raise refuse("invalid_json", "a JSON document") from None
    value = mend_text(value, mend)
    try:
        too_deep = _depth(value, max_depth) > max_depth
    except _Refused as exc:
        raise refuse(exc.code, exc.expected) from None
    if too_deep:
        raise refuse("too_deep", f"at most {max_depth} levels of nesting")
    return value
