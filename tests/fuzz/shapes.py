"""Hostile inputs built from choices, shared by Hypothesis and atheris: provider
envelopes full of hosted (provider-run) items, HTTP requests to every route of
`toolfence serve`, and console form posts.

A builder takes a `Picker` and asks it for each choice: a value from a menu of
known edge cases (ids one past the 200-character columns, 5,000-deep arguments,
lone surrogates, NUL, integers beyond any float, the canary), or free text the
fuzzer makes up. The suite's Hypothesis tests pass a picker drawing from
Hypothesis data (`tests/fuzz/strategies.py`), the atheris harness one consuming
libFuzzer's bytes (`bench/fuzz/harness.py`): both explore the same shapes, so a
failure either finds reproduces in the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

T = TypeVar("T")

CANARY = "sk-fuzzCANARYfuzzCANARY0123456789"
CANARY_MARK = "fuzzCANARY"
"""What no error answer, no console page and no redirect may show raw."""


class Picker(Protocol):
    def pick(self, menu: Sequence[T]) -> T:
        """One item of a non-empty menu."""

    def text(self, most: int) -> str:
        """Free text of at most `most` characters (lone surrogates, NUL included)."""

    def count(self, most: int) -> int:
        """An integer in 0..most."""

    def flag(self) -> bool: ...

    def raw(self, most: int) -> bytes:
        """Free bytes, at most `most`."""


def nested(depth: int, leaf: Any = 1, kind: str = "dict") -> Any:
    """`depth` levels of one-member objects (or lists), built without recursion."""
    value = leaf
    for _ in range(depth):
        value = {"a": value} if kind == "dict" else [value]
    return value


DEEP_TEXT = "[" * 5_000 + "]" * 5_000
IDS: list[str] = [
    "mcpr_1",
    "mcp_1",
    "srvtoolu_1",
    "call_1",
    "i" * 200,
    "i" * 201,
    "i" * 300,
    "i" * 5_000,
    "\ud800",
    "mcpr_\udc80x",
    "id\x00",
    "",
    " ",
    "hosted:call_1",
    CANARY,
]
LABELS: list[str | None] = ["crm", "crm", "other", None, "", "crm\x00", "\ud800", "l" * 201, CANARY]
MCP_TOOLS: list[str | None] = [
    "update_customer",
    "update_customer",
    "lookup_customer",
    "delete_all",
    None,
    "t" * 201,
    "up\ud800",
    "a\x00",
    CANARY,
]
ARGUMENTS: list[Any] = [
    '{"customer_id": "c-42"}',
    '{"customer_id": "c-42"}',
    "{}",
    DEEP_TEXT,
    "[" * 100_000,
    '{"a": "\\ud800"}',
    '{"a": "\ud800"}',
    '{"a": "\\u0000"}',
    "acme-1\x00",
    "1" * 5_000,
    '{"n": 1e400}',
    '{"n": ' + "9" * 400 + "}",
    '{"a": 1, "a": 2}',
    "NaN",
    "not json",
    "",
    None,
    {"customer_id": "c-42"},
    {"a": "\ud800"},
    {"\ud800": 1},
    {"n": 10**400},
    {"t": "acme-1\x00"},
    nested(5_000),
    nested(5_000, "\ud800", "list"),
    {"secret": CANARY},
    "x" * 70_000,
]
OUTPUTS: list[Any] = [
    None,
    "done",
    10**400,
    {"t": "\ud800"},
    "\x00",
    nested(5_000, "\ud800"),
    CANARY,
    [1.5, True],
]
STATUSES: list[Any] = ["completed", "failed", "in_progress", "incomplete", None, "s" * 201, "\ud800", 7]


def _id(p: Picker) -> Any:
    return p.pick(IDS) if p.count(5) else p.text(24)


KNOWN_SLOTS = 16


def known(p: Picker, ids: dict[str, list[str]], name: str, fallback: str) -> str:
    """An id the rig has seen answered (a real request, approval, operation), or `fallback`.

    Drawn as one of a fixed number of slots, taken modulo what was seen: the choices
    a picker records never depend on the rig's state, which grows from example to
    example (Hypothesis refuses data generation that does: FlakyStrategyDefinition)."""
    seen = ids.get(name) or [fallback]
    return seen[p.count(KNOWN_SLOTS - 1) % len(seen)]


def _maybe_text(p: Picker, menu: Sequence[Any]) -> Any:
    return p.pick(menu) if p.count(4) else p.text(16)


def _drop_some(p: Picker, item: dict[str, Any]) -> dict[str, Any]:
    """Most fields present; now and then one left out."""
    if item and not p.count(3):
        gone = p.pick(sorted(item))
        item = {k: v for k, v in item.items() if k != gone}
    return item


# ---------------------------------------------------------------- hosted envelopes

RESPONSES_KINDS = [
    "mcp_approval_request",
    "mcp_call",
    "mcp_approval_request",
    "mcp_list_tools",
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "tool_search_call",
    "custom_tool_call",
    "function_call",
    "message",
    "k" * 201 + "_call",
    "\ud800_call",
]


def _responses(p: Picker) -> dict[str, Any]:
    output = []
    for _ in range(p.count(4)):
        kind = p.pick(RESPONSES_KINDS)
        if kind == "function_call":
            output.append(
                {
                    "type": kind,
                    "call_id": _id(p),
                    "name": p.pick(["get_weather", "set_alarm", "x"]),
                    "arguments": p.pick(ARGUMENTS),
                    "status": "completed",
                }
            )
            continue
        item = {
            "type": kind,
            "id": _id(p),
            "server_label": p.pick(LABELS),
            "name": _maybe_text(p, MCP_TOOLS),
            "arguments": p.pick(ARGUMENTS),
            "status": p.pick(STATUSES),
            "output": p.pick(OUTPUTS),
            "error": p.pick([None, None, "boom", {"code": CANARY}]),
            "approval_request_id": p.pick([None, *IDS]),
            "action": p.pick(ARGUMENTS),
            "queries": p.pick(ARGUMENTS),
            "results": p.pick(OUTPUTS),
            "code": p.pick(ARGUMENTS),
            "outputs": p.pick(OUTPUTS),
            "tools": p.pick(OUTPUTS),
        }
        output.append(_drop_some(p, item))
    return {
        "status": p.pick(["completed", "completed", "incomplete", "failed", "in_progress"]),
        "output": output,
    }


def _anthropic(p: Picker) -> dict[str, Any]:
    content = []
    for _ in range(p.count(4)):
        kind = p.pick(
            [
                "server_tool_use",
                "mcp_tool_use",
                "mcp_tool_use",
                "mcp_tool_result",
                "web_search_tool_result",
                "code_execution_tool_result",
                "tool_use",
                "text",
                "x" * 201 + "_tool_result",
            ]
        )
        if kind == "tool_use":
            block: dict[str, Any] = {
                "type": kind,
                "id": _id(p),
                "name": "get_weather",
                "input": p.pick(ARGUMENTS),
            }
        elif kind == "text":
            block = {"type": kind, "text": p.pick(["hi", CANARY, "\x00"])}
        elif kind.endswith("_tool_result"):
            block = {
                "type": kind,
                "tool_use_id": _id(p),
                "content": p.pick(OUTPUTS),
                "is_error": p.pick([True, False, None, "yes"]),
            }
        else:
            block = {
                "type": kind,
                "id": _id(p),
                "name": _maybe_text(p, [*MCP_TOOLS, "web_search"]),
                "server_name": p.pick(LABELS),
                "input": p.pick(ARGUMENTS),
            }
        content.append(_drop_some(p, block))
    stop = p.pick(["end_turn", "tool_use", "pause_turn", "max_tokens", None])
    return {"role": "assistant", "stop_reason": stop, "content": content}


def _gemini(p: Picker) -> dict[str, Any]:
    parts: list[Any] = []
    for _ in range(p.count(4)):
        kind = p.pick(
            ["executableCode", "codeExecutionResult", "executable_code", "functionCall", "toolCall", "text"]
        )
        if kind in ("executableCode", "executable_code"):
            parts.append(
                {kind: _drop_some(p, {"code": p.pick(ARGUMENTS), "language": p.pick(STATUSES), "id": _id(p)})}
            )
        elif kind == "codeExecutionResult":
            parts.append(
                {kind: _drop_some(p, {"outcome": p.pick(STATUSES), "output": p.pick(OUTPUTS), "id": _id(p)})}
            )
        elif kind == "functionCall":
            parts.append({kind: {"id": _id(p), "name": "get_weather", "args": p.pick(ARGUMENTS)}})
        elif kind == "toolCall":
            parts.append({kind: {"id": _id(p), "toolType": "GOOGLE_SEARCH", "args": p.pick(ARGUMENTS)}})
        else:
            parts.append({kind: p.pick(["hi", CANARY])})
    return {
        "candidates": [
            {
                "finishReason": p.pick(["STOP", "MAX_TOKENS", None]),
                "content": {"role": "model", "parts": parts},
            }
        ]
    }


def _interactions(p: Picker) -> dict[str, Any]:
    steps = []
    for _ in range(p.count(4)):
        kind = p.pick(
            [
                "google_search_call",
                "google_search_result",
                "code_execution_call",
                "code_execution_result",
                "mcp_server_tool_call",
                "mcp_server_tool_call",
                "mcp_server_tool_result",
                "url_context_call",
                "function_call",
                "thought",
                "x" * 201 + "_call",
            ]
        )
        step = {
            "type": kind,
            "id": _id(p),
            "call_id": _id(p),
            "name": _maybe_text(p, MCP_TOOLS),
            "server_name": p.pick(LABELS),
            "arguments": p.pick(ARGUMENTS),
            "result": p.pick(OUTPUTS),
            "is_error": p.pick([True, False, None]),
        }
        steps.append(_drop_some(p, step))
    return {"status": p.pick(["completed", "requires_action", "incomplete", "in_progress"]), "steps": steps}


def _chat(p: Picker) -> dict[str, Any]:
    calls = [
        _drop_some(
            p,
            {
                "id": _id(p),
                "type": "function",
                "function": {
                    "name": p.pick(["get_weather", "set_alarm", "x"]),
                    "arguments": p.pick(ARGUMENTS),
                },
            },
        )
        for _ in range(p.count(3))
    ]
    return {
        "choices": [
            {
                "finish_reason": p.pick(["tool_calls", "stop", "length"]),
                "message": {"role": "assistant", "tool_calls": calls},
            }
        ]
    }


HOSTED_BUILDERS = {
    "openai-chat": _chat,
    "openai-responses": _responses,
    "anthropic": _anthropic,
    "gemini": _gemini,
    "gemini-interactions": _interactions,
}


def hosted_envelope(surface: str, p: Picker) -> dict[str, Any]:
    """An envelope of `surface` whose items are mostly provider-run ones."""
    return HOSTED_BUILDERS[surface](p)


# ---------------------------------------------------------------- HTTP requests

ROUTES: list[tuple[str, str]] = [
    ("POST", "/v1/requests"),
    ("POST", "/v1/requests"),
    ("GET", "/v1/requests/{request_id}"),
    ("POST", "/v1/request-batches"),
    ("POST", "/v1/turns"),
    ("GET", "/v1/turns/{turn_id}"),
    ("GET", "/v1/approvals"),
    ("POST", "/v1/approvals/{approval_id}/approve"),
    ("POST", "/v1/approvals/{approval_id}/deny"),
    ("GET", "/v1/pending"),
    ("POST", "/v1/operations/{operation_id}/resolve"),
    ("GET", "/v1/operations/{operation_id}"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/openapi.json"),
]
"""Every route of the API (tests/fuzz/test_fuzz_http.py checks the app has no other)."""
OTHER_PATHS = [
    "/v1/nope",
    "/v1/requests/",
    "//v1/requests",
    "/v1/requests/%00",
    "/v1/requests/a%2Fb",
    "/v1",
    "/",
    "/v1/approvals/x/approve/extra",
    "/%ff",
    "/v1/requests/" + "a" * 5_000,
]
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
PATH_IDS = ["nope", "a" * 200, "a" * 201, "%00", "%ed%a0%80", "%0a", "..%2F..", "%20", CANARY, "%25", "tf--x"]
TOOL_NAMES = ["ledger.transfer", "ledger.balance", "ledger.transfer", "nope", "tf--ledger_2etransfer", CANARY]
ACCOUNT_IDS = ["acme-1", "acme-2", "globex-1", "acme-1\x00", "\ud800", "a" * 201, CANARY]
AMOUNTS: list[Any] = [1, 800_000, 0, -5, 10**400, 1.5, "100", None, True]


@dataclass
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    route: str = ""
    """The route's template (what a failure is reported under, never the raw path)."""


def _json_bytes(value: Any) -> bytes:
    import json

    try:
        return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    except (RecursionError, ValueError, TypeError):
        return b"[" * 5_000


def _call(p: Picker) -> dict[str, Any]:
    import json

    arguments: Any = {
        "source_account": p.pick(ACCOUNT_IDS),
        "target_account": p.pick(ACCOUNT_IDS),
        "amount_cents": p.pick(AMOUNTS),
    }
    if p.count(2) == 0:
        arguments = p.pick(ARGUMENTS)
    elif p.flag():
        arguments = json.dumps(arguments, ensure_ascii=p.flag())
    call = {"call_id": _id(p), "tool_name": p.pick(TOOL_NAMES), "arguments": arguments}
    if not p.count(6):
        call[p.pick(["tenant", "principal", "roles", CANARY, "extra"])] = CANARY
    return _drop_some(p, call)


def _body(p: Picker, route: str, ids: dict[str, list[str]]) -> bytes:
    shape = p.count(9)
    if shape == 0:
        return p.raw(256)
    if shape == 1:
        return p.pick(
            [
                b"",
                b"{}",
                b"[]",
                b"null",
                b'"x"',
                DEEP_TEXT.encode(),
                b'{"a":1,"a":2}',
                b"NaN",
                b"\xff\xfe",
                b'{"reason": "\\ud800"}',
                b"x" * 70_000,
                CANARY.encode(),
            ]
        )
    value: Any
    if route == "/v1/requests":
        if p.flag():
            value = {"calls": [_call(p) for _ in range(p.count(3))]}
        else:
            surface = p.pick(sorted(HOSTED_BUILDERS))
            value = {
                "provider": p.pick([surface, surface, "nope", CANARY]),
                "response": hosted_envelope(surface, p),
            }
        if p.flag():
            value["conversation_id"] = p.pick(["conv-1", *PATH_IDS, "\x00"])
    elif route == "/v1/request-batches":
        requests = []
        for _ in range(p.pick([0, 1, 2, 3, 101])):
            item: dict[str, Any] = {"calls": [_call(p) for _ in range(p.count(3))]}
            if p.flag():
                item["conversation_id"] = p.pick(["conv-1", *PATH_IDS, "\x00"])
            if p.flag():
                item["request_key"] = p.pick(["rk-1", "rk-1", "", "k" * 201, "\x00", CANARY])
            requests.append(_drop_some(p, item))
        value = {"requests": requests}
    elif route == "/v1/turns":
        value = {
            "conversation_id": p.pick(["conv-1", "conv-2", "", "a" * 201, "\x00", CANARY]),
            "message": p.pick(["hi", "", CANARY, "\ud800", "x" * 100_001]),
        }
        if not p.count(4):
            value[p.pick(["driver", "options", "max_steps", "tenant", CANARY])] = p.pick(
                ["scripted:/etc/passwd", 5]
            )
    elif route.endswith("/resolve"):
        value = {
            "outcome": p.pick(["succeeded", "failed", "requeue", "nope", None, CANARY]),
            "reference": p.pick([None, "ref-1", "", "\x00", "\ud800", "r" * 201, CANARY]),
            "note": p.pick([None, "n", CANARY, "\ud800", "x" * 1_001]),
        }
    else:
        value = {"reason": p.pick([None, "ok", CANARY, "\ud800", "\x00", "x" * 1_001, 5])}
        if not p.count(4):
            value[p.pick(["principal", CANARY])] = CANARY
    return _json_bytes(_drop_some(p, value))


def http_request(p: Picker, keys: dict[str, str], ids: dict[str, list[str]]) -> HttpRequest:
    """One request: a route (or a wrong method, an unknown path), path ids, query,
    headers (authorization, content-type, content-length, Idempotency-Key) and body."""
    shape = p.count(11)
    if shape == 0:
        method, template = p.pick(METHODS), p.pick([*[r for _, r in ROUTES], *OTHER_PATHS])
    else:
        method, template = p.pick(ROUTES)
    path = template
    for name in ("request_id", "turn_id", "approval_id", "operation_id"):
        if "{" + name + "}" in path:
            chosen = (
                known(p, ids, name, "nope")
                if p.count(2)
                else (
                    p.pick(PATH_IDS)
                    if p.flag()
                    else quote(p.text(20).encode("utf-8", "surrogatepass"), safe="")
                )
            )
            path = path.replace("{" + name + "}", chosen or "x")
    query = []
    if not p.count(2):
        for _ in range(1 + p.count(1)):
            name = p.pick(["wait", "provider", "limit", "x", CANARY])
            value = p.pick(
                [
                    "0",
                    "0.05",
                    "-1",
                    "nan",
                    "inf",
                    "1e400",
                    "31",
                    "",
                    "1",
                    "501",
                    "anthropic",
                    "openai-responses",
                    "nope",
                    CANARY,
                    "%00",
                ]
            )
            query.append(f"{name}={value}")
    if query:
        path += "?" + "&".join(query)
    headers: dict[str, str] = {}
    auth = p.pick(
        [
            "full",
            "full",
            "full",
            "produce",
            "read",
            "approve",
            "operate",
            "globex",
            "revoked",
            "none",
            "garbage",
        ]
    )
    if auth in keys:
        headers["Authorization"] = p.pick(["Bearer ", "Bearer ", "bearer ", "Bearer  "]) + keys[auth]
    elif auth == "garbage":
        headers["Authorization"] = p.pick(
            [
                "Bearer",
                "Bearer " + CANARY,
                "Basic Zm9vOmJhcg==",
                "Bearer tf_x.y",
                "Bearer " + "a" * 400,
                "Bearer " + keys.get("full", "")[:-3] + "abc",
                "Bearer \u00e9",
            ]
        )
    body = _body(p, template, ids) if method in ("POST", "PUT", "PATCH") or not p.count(5) else b""
    content_type = p.pick(
        [
            "application/json",
            "application/json",
            "application/json",
            "text/plain",
            "application/problem+json",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/json; charset=utf-16",
            "",
            None,
        ]
    )
    if content_type is not None:
        headers["Content-Type"] = content_type
    length = p.pick([None, None, None, "correct", "more", "0", "-1", "abc", "99999999999"])
    if length == "correct":
        headers["Content-Length"] = str(len(body))
    elif length == "more":
        headers["Content-Length"] = str(len(body) + 10)
    elif length is not None:
        headers["Content-Length"] = length
    if method == "POST" and not p.count(3):
        headers["Idempotency-Key"] = p.pick(["k1", "k2", "k" * 201, " ", CANARY, "\u00e9"])
    return HttpRequest(method, path, headers, body, template)


# ---------------------------------------------------------------- console forms

COOKIES = [
    "session",
    "session",
    "session",
    "session",
    "",
    "eyJrIjoiMCJ9.0",
    "x.\u00e9",
    "\u00e9.\u00e9",
    "a.b.c",
    CANARY,
    "tampered",
]
"""The session cookie a console request carries: the rig's signed-in session (`session`),
that session with its MAC changed (`tampered`), none (``) or the value itself."""
CONSOLE_GETS = [
    "/console",
    "/console/login",
    "/console/approvals",
    "/console/pending",
    "/console/operations/{operation_id}",
    "/console/console.css",
    "/console/console.js",
    "/console/operations",
    "/console/requests",
    "/console/turns",
    "/console/turns/{operation_id}",
    "/console/requests/{operation_id}",
]


def _form(fields: dict[str, str | bytes]) -> bytes:
    """application/x-www-form-urlencoded, lone surrogates and NUL encoded as sent."""
    parts = []
    for name, value in fields.items():
        raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
        parts.append(f"{quote(name, safe='')}={quote(raw, safe='')}")
    return "&".join(parts).encode("ascii")


def _field(p: Picker, menu: Sequence[str | bytes]) -> str | bytes:
    return p.pick(menu) if p.count(4) else p.text(40)


def console_request(
    p: Picker, keys: dict[str, str], ids: dict[str, list[str]], csrf: str
) -> tuple[HttpRequest, str]:
    """A console page or form post, and the session cookie it carries (of `COOKIES`):
    pages with fuzzed query, sign-in with fuzzed keys, sign-out, approve/deny and
    resolve with fuzzed fields and CSRF tokens."""
    action = p.count(6)
    cookie = p.pick(COOKIES)
    csrf_value = _field(p, [csrf, csrf, csrf, "", csrf[:-1] + "0", CANARY, csrf + "\x00", "x" * 5_000])
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if action == 0:
        template = p.pick(CONSOLE_GETS)
        path = template.replace(
            "{operation_id}", (known(p, ids, "operation_id", "op_x") if p.flag() else p.pick(PATH_IDS))
        )
        query = {
            "notice": p.pick(["approved", "signed_out", CANARY, ""]),
            "refused": p.pick(
                ["approver_not_allowed", "csrf", "invalid", "rate_limited", "impact_changed", CANARY]
            ),
            "why": p.pick(["fuzzCANARY", "fuzzCANARY_why", "<b>" + CANARY, CANARY, "x" * 41, "\x00"]),
            # the lists' filters and cursor
            "state": p.pick(["queued", "pending_approval", "running", CANARY, "\x00", ""]),
            "tool": p.pick(["ledger.transfer", CANARY, "x" * 300, ""]),
            "principal": p.pick(["0" * 16, CANARY, "fuzzCANARY_who", ""]),
            "since": p.pick(["2026-01-01T00:00", "yesterday", CANARY, "9999-99-99", ""]),
            "until": p.pick(["2999-01-01T00:00+05:00", "nan", CANARY, ""]),
            "after": p.pick(["1.5~op_x", "nan~op_x", "inf~" + CANARY, "~", CANARY, "1e400~x", ""]),
        }
        return HttpRequest(
            "GET", path + "?" + _form(dict(_drop_some(p, query))).decode(), route=template
        ), cookie
    if action == 1:
        key = _field(
            p,
            [
                keys["full"],
                keys["full"],
                keys["approve"],
                keys["produce"],
                keys["revoked"],
                CANARY,
                "",
                "k" * 301,
                keys["full"] + "\x00",
                b"\xff\xfe",
                "tf_x." + CANARY,
            ],
        )
        return HttpRequest("POST", "/console/login", headers, _form({"key": key}), "/console/login"), ""
    if action == 2:
        return HttpRequest(
            "POST", "/console/logout", headers, _form({"csrf": csrf_value}), "/console/logout"
        ), cookie
    if action in (3, 4):
        approval = known(p, ids, "approval_id", "apr_x") if p.count(3) else p.pick(PATH_IDS)
        verb = p.pick(["approve", "deny", "approve", "nope", CANARY])
        fields = {
            "csrf": csrf_value, "reason": _field(p, ["", "ok", CANARY, "\ud800", "\x00", "x" * 1_001]),
            "impact_digest": _field(p, ["0" * 32, "f" * 32, CANARY, "\x00", "x" * 65]),
        }
        return HttpRequest(
            "POST",
            f"/console/approvals/{approval}/{verb}",
            headers,
            _form(_drop_some(p, fields)),
            "/console/approvals/{approval_id}/{verb}",
        ), cookie
    operation = known(p, ids, "operation_id", "op_x") if p.count(3) else p.pick(PATH_IDS)
    fields = {
        "csrf": csrf_value,
        "outcome": _field(p, ["succeeded", "failed", "requeue", "", CANARY]),
        "reference": _field(p, ["", "ref-1", CANARY, "\x00", "\ud800", "r" * 201]),
        "note": _field(p, ["", "n", CANARY, "\ud800", "x" * 1_001]),
        "confirm": _field(p, ["it-did-not-happen", "", CANARY, "\x00"]),
    }
    return HttpRequest(
        "POST",
        f"/console/operations/{operation}/resolve",
        headers,
        _form(_drop_some(p, fields)),
        "/console/operations/{operation_id}/resolve",
    ), cookie
