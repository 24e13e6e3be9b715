"""Bodies whose ids pass the schema's pattern but break the store's identifier contract.

Found by schemathesis: a `conversation_id` with a C1 control character (U+0085) made
`enqueue` raise `InvalidIdentifier` and the server answer 500.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from executor.http.keys import KeyScope
from tests.http.servekit import Served


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/requests", {
            "calls": [{"call_id": "c1", "tool_name": "ledger.get_balance",
                       "arguments": {"account_id": "acme-1"}}],
            "conversation_id": "\u0085conv",
        }),
        ("/v1/turns", {"conversation_id": "c\u0085", "message": "hello"}),
    ],
    ids=["request", "turn"],
)
def test_post__conversation_id_with_a_control_character__400_problem_not_500(
    served_with: Callable[..., Served], tmp_path: Path, path: str, body: dict[str, Any]
) -> None:
    # Given a server that runs turns, and a producer's key
    script = tmp_path / "turn.jsonl"
    script.write_text('{"final": "done"}\n')
    served = served_with(turn_driver=f"scripted:{script}")
    key = served.key("acme", "alice", KeyScope.PRODUCE)
    # When the producer posts a body whose conversation id no store would hold
    with served.client(key) as client:
        answer = client.post(path, json=body)
    # Then it is the caller's error, named by field and problem, never quoting the value
    assert answer.status_code == 400, answer.text
    problem = answer.json()
    assert problem["code"] == "invalid_request"
    assert problem["errors"][0]["path"] == "/conversation_id"
    assert "\u0085" not in answer.text and "\\u0085" not in answer.text
