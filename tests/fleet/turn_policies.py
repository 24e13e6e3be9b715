"""Hosted-tool policies for the fleet's turn tests, importable by the worker processes
(TOOLFENCE_HOSTED_POLICY=turn_policies:CRM): the CRM server's `lookup` may run, nothing
else of it, no built-in tool."""

from __future__ import annotations

from executor.providers.hosted import HostedPolicy, HostedServer

CRM = HostedPolicy(
    servers=(HostedServer(
        label="crm", url="https://crm.example/mcp", allowed_tools=frozenset({"lookup"}),
        approval_required=frozenset(),
    ),),
    builtin_tools=frozenset(),
)
