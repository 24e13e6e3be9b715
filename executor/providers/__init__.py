"""Provider envelope adapters: one module per API surface, kept strictly apart.

Each surface reads a provider response (a plain JSON-able dict, as the SDK
serialises it or the HTTP API returns it) into neutral `ProposedCall`s, writes
terminal results back in that surface's own shape, and exports the registry's
tools in its declaration format: exactly the tools admission would let the
caller's server context call (`executor.core.admission.offered_to`), with the
request options that go with them. No surface reads another's field positions:
a Responses `call_id` is not a Chat `id`, a Gemini `functionCall` is not an
Interactions step.

    surface = SURFACES["anthropic"]
    request = {"tools": surface.export_tools(registry, context),
               **surface.request_options(registry, context)}
    proposals = surface.read_proposals(message_dict, known_names=registry.names())
    ...admit, run, collect one terminal result per proposal...
    messages.extend(surface.write_results(proposals, results))
    violations = hosted_violations(surface.read_hosted_calls(message_dict), policy)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from executor.core.tools import Registry
from executor.core.types import ProposedCall, ServerContext
from executor.providers import (
    anthropic_messages,
    gemini_generate,
    gemini_interactions,
    openai_chat,
    openai_responses,
)
from executor.providers.common import (
    AdapterError,
    AdapterErrorCode,
    CallOutcome,
    NameRule,
    ToolResult,
    decode_tool_name,
    encode_tool_name,
)
from executor.providers.hosted import (
    NO_HOSTED_TOOLS,
    HostedCall,
    HostedPolicy,
    HostedServer,
    HostedViolation,
    hosted_violations,
)


class ReadProposals(Protocol):
    def __call__(
        self, response: Mapping[str, Any], *, known_names: Iterable[str] = ...
    ) -> list[ProposedCall]: ...


class ReadHostedCalls(Protocol):
    def __call__(self, response: Mapping[str, Any]) -> list[HostedCall]: ...


class WriteResults(Protocol):
    def __call__(
        self, proposals: Sequence[ProposedCall], results: Sequence[CallOutcome]
    ) -> list[dict[str, Any]]: ...


class ExportTools(Protocol):
    def __call__(self, registry: Registry, context: ServerContext) -> list[dict[str, Any]]: ...


class RequestOptions(Protocol):
    def __call__(self, registry: Registry, context: ServerContext) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Surface:
    """One provider API surface: its name rule, its three conversions, the
    request options that go with an export, and its reader of provider-run calls."""

    name: str
    name_rule: NameRule
    read_proposals: ReadProposals
    write_results: WriteResults
    export_tools: ExportTools
    request_options: RequestOptions
    read_hosted_calls: ReadHostedCalls


def _surface(module: Any) -> Surface:
    return Surface(
        name=module.SURFACE,
        name_rule=module.NAME_RULE,
        read_proposals=module.read_proposals,
        write_results=module.write_results,
        export_tools=module.export_tools,
        request_options=module.request_options,
        read_hosted_calls=module.read_hosted_calls,
    )


SURFACES: Mapping[str, Surface] = MappingProxyType(
    {
        surface.name: surface
        for surface in map(
            _surface,
            (openai_chat, openai_responses, anthropic_messages, gemini_generate, gemini_interactions),
        )
    }
)
"""`openai-chat`, `openai-responses`, `anthropic`, `gemini`, `gemini-interactions`."""

__all__ = [
    "SURFACES",
    "AdapterError",
    "AdapterErrorCode",
    "CallOutcome",
    "NameRule",
    "Surface",
    "ToolResult",
    "decode_tool_name",
    "encode_tool_name",
    "NO_HOSTED_TOOLS",
    "HostedCall",
    "HostedPolicy",
    "HostedServer",
    "HostedViolation",
    "hosted_violations",
]
