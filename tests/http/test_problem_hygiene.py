"""What the API answers says nothing the caller wrote, and says what HTTP expects
(issue #27): problem+json paths and instances never echo the caller's input, a 405
names its `Allow`, a body that is not JSON is 415, and the document says what the
strict reader refuses (a succeeded resolve without a reference, NUL and lone
surrogates in text)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from servekit import Served

from executor.http.body import mend_text
from executor.http.keys import KeyScope

DOCUMENT = json.loads((Path(__file__).resolve().parents[2] / "docs" / "openapi.json").read_text())
SECRET_NAME = "sk-live0123456789abcdefSECRET"


def schema_of(name: str) -> dict[str, object]:
    """A component schema of the checked-in document, its references resolvable."""
    return {**DOCUMENT["components"]["schemas"][name], "components": DOCUMENT["components"]}


def test_problem__rejected_key_names__never_echoed(served: Served) -> None:
    key = served.key("acme", "alice", KeyScope.PRODUCE)
    with served.client(key) as client:
        # When a body carries unknown members whose names are a secret and markup
        nested = client.post("/v1/requests", json={"calls": [
            {"call_id": "c1", "tool_name": "ledger.get_balance", "arguments": {}, SECRET_NAME: 1}
        ]})
        top = client.post("/v1/turns", json={"conversation_id": "c", "message": "hi", "<script>x": 1})
    # Then the problem names them by a digest, never by their text
    for answer in (nested, top):
        assert answer.status_code in (400, 422)
        assert answer.headers["content-type"] == "application/problem+json"
        for raw in (SECRET_NAME, "<script>", "sk-live"):
            assert raw not in answer.text
    paths = [e["path"] for e in nested.json()["errors"]]
    assert any(p.startswith("/") and "/~" in p for p in paths), paths
    # while the schema's own names and positions are kept
    assert any("/calls/0/" in p for p in paths), paths


@pytest.mark.parametrize(
    ("raw_path", "absent"),
    [
        ("/v1/operations/op%00x", "\x00"),
        (f"/v1/operations/{SECRET_NAME}", SECRET_NAME),
        ("/v1/operations/%1b%5b31mred", "\x1b"),
        ("/v1/nowhere/%3Cimg%20src%3Dx%3E", "<img"),
    ],
)
def test_problem__instance__never_the_raw_path(served: Served, raw_path: str, absent: str) -> None:
    key = served.key("acme", "alice", KeyScope.READ)
    with served.client(key) as client:
        answer = client.get(raw_path)
    problem = answer.json()
    assert answer.status_code in (404, 422), answer.text
    assert absent not in problem["instance"] and absent not in answer.text
    assert problem["instance"].startswith("/v1/")
    assert all(0x20 < ord(c) < 0x7F for c in problem["instance"])  # a URI reference, encoded


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/v1/approvals", "GET"),
        ("PUT", "/v1/requests", "POST"),
        ("GET", "/v1/operations/op1/resolve", "POST"),
        ("POST", "/healthz", "GET"),
    ],
)
def test_405__names_its_allow_header(served: Served, method: str, path: str, allow: str) -> None:
    with served.client(served.key("acme", "alice", *KeyScope)) as client:
        answer = client.request(method, path)
    assert answer.status_code == 405
    assert answer.headers["allow"] == allow
    assert answer.headers["content-type"] == "application/problem+json"


def test_415__a_body_that_is_not_json__refused_before_it_is_read(served: Served) -> None:
    key = served.key("acme", "alice", *KeyScope)
    body = json.dumps({"calls": [{"call_id": "c1", "tool_name": "ledger.get_balance", "arguments": {}}]})
    with served.client(key) as client:
        plain = client.post("/v1/requests", content=body, headers={"Content-Type": "text/plain"})
        form = client.post("/v1/turns", content="message=hi", headers={
            "Content-Type": "application/x-www-form-urlencoded"})
        latin = client.post("/v1/requests", content=body, headers={
            "Content-Type": "application/json; charset=latin-1"})
        untyped = client.post("/v1/operations/op1/resolve", content=b'{"outcome": "failed"}')
        deny_plain = client.post(
            "/v1/approvals/apr_x/deny", content="no", headers={"Content-Type": "text/plain"}
        )
        # An approval's body is optional: an empty one needs no type
        deny_empty = client.post("/v1/approvals/apr_x/deny")
        typed = client.post("/v1/requests", content=body, headers={
            "Content-Type": "application/json; charset=utf-8"})
    for answer in (plain, form, latin, untyped, deny_plain):
        assert answer.status_code == 415, answer.text
        assert answer.json()["errors"][0]["code"] == "unsupported_media_type"
        assert answer.headers["content-type"] == "application/problem+json"
    assert deny_empty.status_code == 404
    assert typed.status_code == 202


def test_resolve__succeeded_without_a_reference__refused_as_the_document_says(served: Served) -> None:
    resolve = schema_of("ResolveBody")
    body = {"outcome": "succeeded", "reference": None}
    # The document calls it invalid, and the server answers 422 (not an undocumented 400)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, resolve)
    jsonschema.validate({"outcome": "succeeded", "reference": "ref-1"}, resolve)
    jsonschema.validate({"outcome": "failed", "reference": None}, resolve)
    with served.client(served.key("acme", "olga", KeyScope.OPERATE)) as client:
        answer = client.post("/v1/operations/op_nothing/resolve", json=body)
    assert answer.status_code == 422 and answer.json()["code"] == "invalid_request"


@pytest.mark.parametrize(("component", "field"), [
    ("DecisionBody", "reason"), ("ResolveBody", "note"), ("TurnBody", "message"),
])
def test_free_text__nul_refused_and_lone_surrogates_read__as_the_document_says(
    served: Served, component: str, field: str
) -> None:
    schema = schema_of(component)
    base = {"TurnBody": {"conversation_id": "c"}, "ResolveBody": {"outcome": "failed"}}.get(component, {})
    route = {"DecisionBody": "/v1/approvals/apr_x/deny", "ResolveBody": "/v1/operations/op_x/resolve",
             "TurnBody": "/v1/turns"}[component]
    # The document says NUL is not text, and a lone surrogate reads as U+FFFD
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**base, field: "bad \x00 text"}, schema)
    jsonschema.validate({**base, field: "fine 🙂 text"}, schema)
    assert "U+FFFD" in json.dumps(schema)

    def send(text: str) -> tuple[int, dict[str, object]]:
        with served.client(served.key("acme", "olga", *KeyScope)) as client:
            answer = client.post(route, content=json.dumps({**base, field: text}),
                                 headers={"Content-Type": "application/json"})
        return answer.status_code, answer.json()

    # And the server does what it says: NUL is 400 invalid_text, a lone surrogate is read
    status, problem = send("bad \x00 text")
    assert status == 400 and problem["errors"][0]["code"] == "invalid_text"  # type: ignore[index]
    status, answer = send("odd \ud800 text")
    # (past the reader: 404 for no such approval or operation, 503 where no turn driver is set)
    assert status in (404, 503) and answer["code"] in ("not_found", "turns_not_configured"), answer


def test_ids__lone_surrogate__refused_as_the_description_says(served: Served) -> None:
    assert "lone surrogate is refused" in json.dumps(schema_of("TurnBody")["properties"])
    with served.client(served.key("acme", "olga", *KeyScope)) as client:
        answer = client.post("/v1/turns", content=json.dumps({"conversation_id": "c\ud800", "message": "hi"}),
                             headers={"Content-Type": "application/json"})
    assert answer.status_code == 400 and answer.json()["errors"][0]["code"] == "invalid_text"


def test_mend_text__lone_surrogates_only__become_u_fffd() -> None:
    value = json.loads('{"reason": "a\\ud800b\\ud83d\\ude42c\\udfff", "call_id": "x\\ud800"}')
    mended = mend_text(value, frozenset({"reason"}))
    assert mended["reason"] == "a\ufffdb🙂c\ufffd"
    assert mended["call_id"] == "x\ud800"  # not a free-text field: left for the refusal
