"""`toolfence serve` when the ledger's database refuses a value of one call (decision 0193).

The body holds the arguments as JSON text, as a model writes them, so the NUL
reaches the tool's access rule. Before, psycopg's `DataError` for a NUL in an
account id read as a lost connection: the whole request answered 503
`upstream_unavailable`, on every retry. A real uvicorn server on PostgreSQL.
"""

from __future__ import annotations

import json
from typing import Any

from servekit import Served

from executor.http.keys import KeyScope


def _balance(call_id: str, account: str) -> dict[str, Any]:
    # Arguments as the model wrote them, a JSON text: the body itself holds no NUL (the
    # server refuses such a body whole, `invalid_text`); the arguments' escape does.
    arguments = json.dumps({"account_id": account})
    return {"call_id": call_id, "tool_name": "ledger.get_balance", "arguments": arguments}


def test_post_requests__nul_in_one_account_id__202_that_call_refused_the_others_pending(
    served: Served,
) -> None:
    key = served.key("acme", "alice", KeyScope.PRODUCE)
    body = {"calls": [_balance("c1", "acme-1"), _balance("c2", "acme-1\u0000"), _balance("c3", "acme-2")]}
    with served.client(key) as client:
        response = client.post("/v1/requests", json=body)
    # Then the request is accepted: the innocent calls pending, the NUL one refused for good
    assert response.status_code == 202, response.text
    answered = {c["call_id"]: c for c in response.json()["calls"]}
    assert answered["c1"]["status"] == answered["c3"]["status"] == "pending"
    refused = answered["c2"]
    assert refused["status"] == "failed_terminal"
    assert refused["error"]["code"] == "invalid_arguments"
    assert [d["code"] for d in refused["error"]["details"]] == ["refused_by_database"]
    # And the refused value is not echoed
    assert "\\u0000" not in response.text and "\x00" not in response.text
