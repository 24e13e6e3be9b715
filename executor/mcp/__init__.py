"""MCP client path: register an MCP server's tools and run them as toolfence tools.

Entry point for the fleet: `register_mcp_server(registry, name, command, args,
policies=..., prefix=...)`. Workers call `shutdown_connections()` on exit; a
worker that knows the model's call id wraps `tool.run` in `provider_call(call_id)`.
"""

from executor.mcp.correlation import CALL_HISTORY, McpCallRecord, provider_call
from executor.mcp.errors import FailureKind, McpCallFailure
from executor.mcp.registration import (
    McpContentBlock,
    McpCorrelation,
    McpRegistration,
    McpToolOutput,
    ToolPolicy,
    build_mcp_tools,
    model_view,
    register_mcp_server,
)
from executor.mcp.schema import McpArguments, arguments_model
from executor.mcp.session import (
    McpServerConnection,
    McpServerSpec,
    connection_for,
    list_server_tools,
    shutdown_connections,
)

__all__ = [
    "CALL_HISTORY",
    "FailureKind",
    "McpArguments",
    "McpCallFailure",
    "McpCallRecord",
    "McpContentBlock",
    "McpCorrelation",
    "McpRegistration",
    "McpServerConnection",
    "McpServerSpec",
    "McpToolOutput",
    "ToolPolicy",
    "arguments_model",
    "build_mcp_tools",
    "connection_for",
    "list_server_tools",
    "model_view",
    "provider_call",
    "register_mcp_server",
    "shutdown_connections",
]
