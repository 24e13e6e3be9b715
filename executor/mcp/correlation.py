"""What links one MCP call to the rest of toolfence: call id, operation id, JSON-RPC ids.

A call is identified three ways by three parties: the model provider's call id
(what the model wrote), toolfence's operation id (the logical operation, stable
across retries), and the JSON-RPC request id (what the MCP server saw, new per
attempt). `McpCallRecord` keeps them together; every attempted call leaves one,
in the tool's output, on its failure, in the log and in a bounded in-process
history that tests and operators can query.
"""

from __future__ import annotations

import contextvars
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

JsonRpcId = int | str

# RunContext carries no provider call id; the worker (or a test) names it here
# around `tool.run`. A future `RunContext.call_id` is read first.
_provider_call_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "toolfence_mcp_provider_call_id", default=None
)


@contextmanager
def provider_call(call_id: str | None) -> Iterator[None]:
    """Attribute the MCP calls made inside this block to the model's call `call_id`."""
    token = _provider_call_id.set(call_id)
    try:
        yield
    finally:
        _provider_call_id.reset(token)


def current_provider_call_id(ctx: Any) -> str | None:
    explicit = getattr(ctx, "call_id", None)
    # RunContext.call_id is "" when the caller did not know it: use the block's then.
    return explicit if isinstance(explicit, str) and explicit else _provider_call_id.get()


@dataclass(frozen=True)
class McpCallRecord:
    """One attempted `tools/call`, as seen from both ends."""

    server: str
    tool_name: str
    mcp_tool_name: str
    operation_id: str
    call_id: str | None
    request_id: str
    attempt: int
    fencing_token: int
    correlation_token: str
    jsonrpc_request_ids: tuple[JsonRpcId, ...]
    session_number: int
    outcome: str
    duration_seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "tool_name": self.tool_name,
            "mcp_tool_name": self.mcp_tool_name,
            "operation_id": self.operation_id,
            "call_id": self.call_id,
            "request_id": self.request_id,
            "attempt": self.attempt,
            "fencing_token": self.fencing_token,
            "jsonrpc_request_ids": list(self.jsonrpc_request_ids),
            "session_number": self.session_number,
            "outcome": self.outcome,
        }


@dataclass
class CallHistory:
    """The last `maxlen` call records of this process, thread-safe."""

    maxlen: int = 1024
    _records: deque[McpCallRecord] = field(init=False)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._records = deque(maxlen=self.maxlen)

    def add(self, record: McpCallRecord) -> None:
        with self._lock:
            self._records.append(record)

    def find(
        self, *, operation_id: str | None = None, call_id: str | None = None
    ) -> list[McpCallRecord]:
        with self._lock:
            return [
                record
                for record in self._records
                if (operation_id is None or record.operation_id == operation_id)
                and (call_id is None or record.call_id == call_id)
            ]


CALL_HISTORY = CallHistory()
