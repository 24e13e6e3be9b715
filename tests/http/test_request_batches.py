"""POST /v1/request-batches over a real server on PostgreSQL: many requests in one
transaction (`enqueue_many`), each answered as POST /v1/requests answers one; a
request the batch cannot take refuses the batch and writes nothing; each request
counts against the key's rate limit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from servekit import Served
from sqlalchemy import func, select

from executor.http.keys import KeyScope
from executor.http.server import HttpSettings
from executor.store.schema import calls, operations
from tests.http.test_api import assert_problem, balance, transfer

P, R = KeyScope.PRODUCE, KeyScope.READ


def rows(served: Served) -> tuple[int, int]:
    with served.engine.connect() as conn:
        return (
            conn.execute(select(func.count()).select_from(operations)).scalar_one(),
            conn.execute(select(func.count()).select_from(calls)).scalar_one(),
        )


def test_batch__three_requests__one_answer_each_in_order_and_each_readable(served: Served) -> None:
    key = served.key("acme", "alice", P, R)
    body: dict[str, Any] = {"requests": [
        {"calls": [balance("c1")], "request_key": "job-1"},
        {"calls": [transfer("c1", 500_000), {"call_id": "c2", "tool_name": "nope", "arguments": "{}"}],
         "conversation_id": "conv-1"},
        {"calls": [balance("c1", "acme-2")], "request_key": "job-3"},
    ]}
    with served.client(key) as client:
        response = client.post("/v1/request-batches", json=body)
        assert response.status_code == 202, response.text
        answers = response.json()["requests"]
        # each request as POST /v1/requests answers it
        assert [[c["status"] for c in a["calls"]] for a in answers] == [
            ["pending"], ["pending", "failed_terminal"], ["pending"],
        ]
        assert answers[1]["calls"][0]["state"] == "pending_approval"
        assert answers[1]["calls"][1]["error"]["code"] == "unknown_tool"
        assert len({a["request_id"] for a in answers}) == 3
        read = client.get(f"/v1/requests/{answers[0]['request_id']}")
        assert read.status_code == 200 and read.json()["calls"][0]["call_id"] == "c1"
        # The same batch again: the keyed requests answer from what is recorded
        before = rows(served)
        keyed = [body["requests"][0], body["requests"][2]]
        again = client.post("/v1/request-batches", json={"requests": keyed})
    assert again.status_code == 202, again.text
    replayed = again.json()["requests"]
    assert [a["request_id"] for a in replayed] == [answers[0]["request_id"], answers[2]["request_id"]]
    assert [a["calls"][0]["operation_id"] for a in replayed] == [
        answers[0]["calls"][0]["operation_id"], answers[2]["calls"][0]["operation_id"],
    ]
    assert rows(served) == before


def test_batch__one_bad_request__400_naming_it_and_nothing_written(served: Served) -> None:
    key = served.key("acme", "alice", P)
    with served.client(key) as client:
        duplicate_call = client.post("/v1/request-batches", json={"requests": [
            {"calls": [balance("c1")]},
            {"calls": [balance("c1"), balance("c1")]},
        ]})
        duplicate_key = client.post("/v1/request-batches", json={"requests": [
            {"calls": [balance("c1")], "request_key": "k"},
            {"calls": [balance("c2")], "request_key": "k"},
        ]})
        bad_conversation = client.post("/v1/request-batches", json={"requests": [
            {"calls": [balance("c1")]},
            {"calls": [balance("c1")], "conversation_id": "conv\u0085"},  # a C1 control
        ]})
        named = client.post("/v1/request-batches", json={"requests": [
            {"calls": [balance("c1")], "tenant": "globex"},
        ]})
    problem = assert_problem(duplicate_call, 400, "invalid_request")
    assert [(e["path"], e["code"]) for e in problem["errors"]] == [("/requests/1/calls", "duplicate_call_id")]
    problem = assert_problem(duplicate_key, 400, "invalid_request")
    assert [(e["path"], e["code"]) for e in problem["errors"]] == [("/requests/1", "duplicate_request")]
    problem = assert_problem(bad_conversation, 400, "invalid_request")
    assert problem["errors"][0]["path"] == "/requests/1/conversation_id"
    assert_problem(named, 400, "identity_in_body")
    assert rows(served) == (0, 0)


def test_batch__too_many_calls_in_all__422(served: Served) -> None:
    key = served.key("acme", "alice", P)
    many = [{"calls": [balance(f"c{k}") for k in range(200)]} for _ in range(6)]
    with served.client(key) as client:
        response = client.post("/v1/request-batches", json={"requests": many})
    assert_problem(response, 422, "invalid_request")
    assert rows(served) == (0, 0)


def test_batch__each_request_counts_against_the_keys_rate_limit(served_with: Callable[..., Served]) -> None:
    served = served_with(HttpSettings(session_secret=b"s" * 32, rate_limit="5/minute"))
    key = served.key("acme", "alice", P)
    with served.client(key) as client:
        four = client.post("/v1/request-batches", json={"requests": [{"calls": [balance("c1")]}] * 4})
        three = client.post("/v1/request-batches", json={"requests": [{"calls": [balance("c1")]}] * 3})
    assert four.status_code == 202, four.text
    problem = assert_problem(three, 429, "rate_limited")
    assert problem["status"] == 429 and 1 <= int(three.headers["Retry-After"]) <= 60
    assert rows(served)[0] == 4
