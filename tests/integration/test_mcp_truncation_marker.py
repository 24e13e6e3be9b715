"""An MCP output cut by any cap still tells the model it was cut.

A real MCP server process (tests/fixtures/mcp_test_server.py, tool `large`) answers
just over each cap on the way to the model: the MCP text budget
(`max_output_chars`), the structured-content cap (`max_structured_chars`), the
sealed model view of a stored result (`MODEL_VIEW_MAX_CHARS`), and a turn's
prompt (`MAX_RESULT_CHARS`). Each time, what the model reads carries
`truncated: true`: before, the model view's cap cut the flag itself away, since
it comes after the content it describes.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import pytest

from executor.core.admission import Admitted, admit
from executor.core.sanitize import MODEL_VIEW_MAX_CHARS, TRUNCATION_MARK
from executor.core.tools import Access, Approval, Registry, RunContext
from executor.core.types import ProposedCall, ServerContext, Succeeded
from executor.mcp import (
    McpToolOutput,
    ToolPolicy,
    provider_call,
    register_mcp_server,
    shutdown_connections,
)
from executor.mcp.registration import DEFAULT_MAX_OUTPUT_CHARS, DEFAULT_MAX_STRUCTURED_CHARS
from executor.turns.prompt import MAX_RESULT_CHARS, CompletedStep, completed_block

pytestmark = pytest.mark.timeout(90)

FIXTURE_SERVER = str(Path(__file__).resolve().parents[1] / "fixtures" / "mcp_test_server.py")
SERVER_CTX = ServerContext(principal="alice", tenant="acme", roles=frozenset({"agent"}), request_id="req-1")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    registry = Registry()
    with open(tmp_path_factory.mktemp("mcp-marker") / "server.err", "w") as errlog:
        errlog_io: TextIO = errlog
        register_mcp_server(
            registry, "fx", sys.executable, [FIXTURE_SERVER],
            policies={"large": ToolPolicy(access=Access.public_tool(), approval=Approval.never())},
            errlog=errlog_io,
        )
        yield registry
        shutdown_connections()


def _call(registry: Registry, arguments: dict[str, Any]) -> tuple[Admitted, McpToolOutput, dict[str, Any]]:
    """Run `fx.large` for real; its output, and the stored result a reader is given."""
    proposed = ProposedCall(call_id=f"call-{uuid.uuid4().hex[:8]}", tool_name="fx.large", arguments=arguments)
    admitted = admit(proposed, registry, SERVER_CTX)
    assert isinstance(admitted, Admitted)
    ctx = RunContext(
        operation_id=f"op-{uuid.uuid4().hex[:12]}", idempotency_key="idem", fencing_token=1,
        deadline=time.time() + 60, server=SERVER_CTX, attempt=1, still_owner=lambda: True,
    )
    with provider_call(proposed.call_id):
        output = admitted.tool.run(admitted.arguments, ctx)
    assert isinstance(output, McpToolOutput)
    return admitted, output, admitted.tool.stored_result(output)


# Sizes just over each cap (and one just under the first, which the model view's
# cap alone cuts): (arguments, whether the MCP output itself is marked).
JUST_OVER = [
    pytest.param({"size": DEFAULT_MAX_OUTPUT_CHARS + 1}, True, id="text_budget_plus_1"),
    pytest.param({"size": DEFAULT_MAX_OUTPUT_CHARS - 100}, False, id="model_view_cap_only"),
    pytest.param(
        {"size": DEFAULT_MAX_STRUCTURED_CHARS - 11, "structured": True}, True, id="structured_cap_plus_1"
    ),
]


@pytest.mark.parametrize(("arguments", "marked_at_source"), JUST_OVER)
def test_mcp_output_just_over_a_cap__model_view_still_says_truncated(
    registry: Registry, arguments: dict[str, Any], marked_at_source: bool
) -> None:
    # Given an MCP server answering just over a cap
    _, output, stored = _call(registry, arguments)
    assert output.truncated is marked_at_source
    # When its result is sealed for the model (the stored model view every reader gets)
    view = stored["model_view"]
    # Then the view was cut, and says so with the flag, not only with a mark in a string
    assert TRUNCATION_MARK in json.dumps(view, ensure_ascii=False)
    assert len(json.dumps(view, ensure_ascii=False)) <= MODEL_VIEW_MAX_CHARS + 200
    assert view["truncated"] is True
    assert view["untrusted"] is True and view["source"] == "mcp:fx/large"


def test_mcp_output_just_over_the_prompt_cap__turn_prompt_still_says_truncated(registry: Registry) -> None:
    # Given an MCP result that fits the model view but not a turn prompt's result cap
    admitted, _, stored = _call(registry, {"size": MAX_RESULT_CHARS - 50})
    assert stored["model_view"]["truncated"] is False
    result = Succeeded(
        call_id=admitted.call.call_id, tool_name="fx.large", output=stored["model_view"], untrusted=True
    )
    # When the next model step is shown it
    block = completed_block([CompletedStep(step=1, calls=((admitted.call, result),))])
    # Then the prompt's cut kept the flag, and set it
    assert '"truncated":true' in block
    assert len(block) <= MAX_RESULT_CHARS + 400


def test_mcp_output_under_every_cap__not_marked(registry: Registry) -> None:
    admitted, output, stored = _call(registry, {"size": 100})
    result = Succeeded(
        call_id=admitted.call.call_id, tool_name="fx.large", output=stored["model_view"], untrusted=True
    )
    block = completed_block([CompletedStep(step=1, calls=((admitted.call, result),))])

    assert output.truncated is False and stored["model_view"]["truncated"] is False
    assert '"truncated":false' in block and TRUNCATION_MARK not in block
