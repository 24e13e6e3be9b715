"""Register an MCP server's tools as toolfence tools.

The server says what its tools are called, what arguments they take and what
they return; it never says who may call them. The application supplies, per
tool, a `ToolPolicy` with the access rule, the approval policy and (for writes)
the effect contract, and only tools with a policy are registered: a tool the
server adds later stays invisible until someone decides who may use it.
MCP annotations are the server's hints: `readOnlyHint` may make an undeclared
`mode` a read, and a policy that calls a tool a read while the server says it
is not read-only is refused; they never grant access.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TextIO

import mcp_types
from pydantic import BaseModel, ConfigDict, JsonValue

from executor.core.amounts import Amount
from executor.core.approvers import ApproverPolicy
from executor.core.tools import (
    Access,
    Approval,
    Effect,
    LookupResult,
    Mode,
    Registry,
    RetryPolicy,
    RunContext,
    Tool,
    ToolDeclarationError,
    Written,
)
from executor.core.types import ServerContext
from executor.mcp.correlation import CALL_HISTORY, McpCallRecord, current_provider_call_id
from executor.mcp.errors import (
    McpCallFailure,
    StructuredToolError,
    deadline_passed_failure,
    structured_tool_error,
    tool_error_failure,
)
from executor.mcp.sanitize import sanitize_text, seal_json
from executor.mcp.schema import McpArguments, arguments_model, schema_fingerprint, schema_version_of
from executor.mcp.session import (
    CallOutcome,
    McpServerConnection,
    McpServerSpec,
    connection_for,
    list_server_tools,
)

logger = logging.getLogger("toolfence.mcp")

DEFAULT_MAX_OUTPUT_CHARS = 16_000
DEFAULT_MAX_STRUCTURED_CHARS = 64_000
DEFAULT_MAX_ERROR_CHARS = 500
_MAX_CONTENT_BLOCKS = 64
_MAX_DESCRIPTION_CHARS = 1_024
_MAX_URI_CHARS = 2_048
_PREFIX_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")

# `_meta` keys sent with every call, so a downstream that can dedupe or fence
# receives what it needs to (docs/design.md §Effect contracts).
META_OPERATION_ID = "io.toolfence/operationId"
META_IDEMPOTENCY_KEY = "io.toolfence/idempotencyKey"
META_FENCING_TOKEN = "io.toolfence/fencingToken"


# ---------------------------------------------------------------- what the application declares


@dataclass(frozen=True)
class ToolPolicy:
    """The application's decisions about one MCP tool. `access` and `approval` have no default.

    `approvers`: who may decide its approvals; required (by `Tool`) whenever
    `approval` is not `Approval.never()`.

    `mode`: None lets `readOnlyHint: true` make it a read, anything else a
    write (which then needs `effect`); a declared `effect` makes it a write.
    `receipt`: for writes, the downstream's id of the effect, read from the
    output; without it each execution gets its own synthetic receipt, so a
    repeated execution shows up as a second side effect (the truth, as far as
    toolfence can know).
    """

    access: Access
    approval: Approval
    approvers: ApproverPolicy | None = None
    effect: Iterable[Effect] | None = None
    mode: Mode | None = None
    description: str | None = None
    timeout_seconds: float = 30.0
    retry: RetryPolicy = RetryPolicy()
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    max_structured_chars: int = DEFAULT_MAX_STRUCTURED_CHARS
    max_error_chars: int = DEFAULT_MAX_ERROR_CHARS
    check: Callable[[McpArguments, ServerContext], None] | None = None
    impact: Callable[[McpArguments, ServerContext], Mapping[str, Any]] | None = None
    # Display hints for the impact's integers (executor/core/amounts.py)
    amounts: Mapping[str, Amount] | None = None
    resource_ids: Callable[[McpArguments, ServerContext], Iterable[str]] | None = None
    lookup: Callable[[McpArguments, RunContext], LookupResult] | None = None
    receipt: Callable[[McpToolOutput], str] | None = None

    def __post_init__(self) -> None:
        if self.effect is not None:
            # One policy may serve several tools: a generator would be used up by the first.
            object.__setattr__(self, "effect", frozenset(Effect(e) for e in self.effect))


# ---------------------------------------------------------------- what a call returns


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class McpContentBlock(_Frozen):
    """One content block. Binary payloads are not carried, only their size."""

    type: Literal["text", "image", "audio", "resource_link", "resource"]
    text: str | None = None
    mime_type: str | None = None
    uri: str | None = None
    omitted_bytes: int | None = None


class McpCorrelation(_Frozen):
    server: str
    tool_name: str
    mcp_tool_name: str
    operation_id: str
    call_id: str | None
    request_id: str
    attempt: int
    jsonrpc_request_ids: tuple[int | str, ...]
    session_number: int


class McpToolOutput(_Frozen):
    """A successful MCP call: third-party data, labelled as such, sanitised and capped."""

    untrusted: Literal[True] = True
    source: str
    content: tuple[McpContentBlock, ...]
    structured: JsonValue = None
    truncated: bool
    correlation: McpCorrelation


def model_view(output: Any) -> Any:
    """The model-safe projection: the data and its label, not the wire bookkeeping."""
    if isinstance(output, Written):
        output = output.output
    if isinstance(output, McpToolOutput):
        return output.model_dump(mode="json", exclude={"correlation"})
    if isinstance(output, Mapping):
        return {key: value for key, value in output.items() if key != "correlation"}
    return output


# ---------------------------------------------------------------- registration


@dataclass(frozen=True)
class McpRegistration:
    """What `register_mcp_server` did."""

    spec: McpServerSpec
    prefix: str
    tools: tuple[Tool[Any], ...]
    # Tools the server offers that had no policy, hence were not registered.
    skipped: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(tool.name for tool in self.tools)

    def connection(self) -> McpServerConnection:
        return connection_for(self.spec)


def register_mcp_server(
    registry: Registry,
    name: str,
    command: str,
    args: Sequence[str] = (),
    *,
    policies: Mapping[str, ToolPolicy],
    prefix: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    connect_timeout_seconds: float = 30.0,
    protocol_mode: str = "auto",
    errlog: TextIO | None = None,
) -> McpRegistration:
    """Start the server once to list its tools, and register those with a policy.

    Tools are named `<prefix>.<mcp tool name>` (prefix defaults to `name`).
    Raises `ToolDeclarationError` for a policy naming a tool the server does
    not offer, a schema that is not valid JSON Schema, a name already in the
    registry, or an inconsistent declaration; `McpCallFailure` when the server
    cannot be started. Nothing is registered unless every tool is.
    """
    spec = McpServerSpec(
        name=name,
        command=command,
        args=tuple(args),
        env=tuple(sorted((env or {}).items())),
        cwd=cwd,
        connect_timeout_seconds=connect_timeout_seconds,
        protocol_mode=protocol_mode,
        errlog=errlog,
    )
    listing = list_server_tools(spec)
    tools, skipped = build_mcp_tools(spec, listing, policies, prefix or name)
    taken = [tool.name for tool in tools if tool.name in registry]
    if taken:
        raise ToolDeclarationError(f"tools already registered: {sorted(taken)}")
    for tool in tools:
        registry.add(tool)
    if skipped:
        logger.info(
            "MCP server %r offers tools without a policy, not registered: %s", name, sorted(skipped)
        )
    return McpRegistration(spec=spec, prefix=prefix or name, tools=tuple(tools), skipped=skipped)


def build_mcp_tools(
    spec: McpServerSpec,
    listing: Sequence[mcp_types.Tool],
    policies: Mapping[str, ToolPolicy],
    prefix: str,
) -> tuple[list[Tool[Any]], tuple[str, ...]]:
    """toolfence tools for the listed MCP tools that have a policy; and the names skipped.

    Pure (no I/O): a listing cached elsewhere can be registered without a server.
    """
    if not _PREFIX_RE.match(prefix):
        raise ToolDeclarationError(
            f"MCP tool prefix {prefix!r} must be a letter then letters, digits, '_' or '-'"
        )
    offered = {tool.name: tool for tool in listing}
    unknown = sorted(set(policies) - set(offered))
    if unknown:
        raise ToolDeclarationError(
            f"policies name tools MCP server {spec.name!r} does not offer: {unknown}"
        )
    tools = [
        _build_tool(spec, offered[mcp_name], policy, prefix)
        for mcp_name, policy in sorted(policies.items())
    ]
    skipped = tuple(sorted(set(offered) - set(policies)))
    return tools, skipped


def _resolve_mode(name: str, policy: ToolPolicy, annotations: mcp_types.ToolAnnotations | None) -> Mode:
    if policy.mode is None:
        if policy.effect is not None:
            return Mode.WRITE
        hinted_read = annotations is not None and annotations.read_only_hint is True
        return Mode.READ if hinted_read else Mode.WRITE
    mode = Mode(policy.mode)
    if mode is Mode.READ and annotations is not None and annotations.read_only_hint is False:
        # Declaring a read makes it retryable and takeover-safe; the server itself
        # says it changes something, so that needs a second look, not a default.
        raise ToolDeclarationError(
            f"tool {name!r} is declared a read, but its server marks it readOnlyHint=false"
        )
    return mode


def _build_tool(
    spec: McpServerSpec, listed: mcp_types.Tool, policy: ToolPolicy, prefix: str
) -> Tool[Any]:
    tool_name = f"{prefix}.{listed.name}"
    try:
        input_model = arguments_model(listed.name, listed.input_schema)
    except ToolDeclarationError as exc:
        raise ToolDeclarationError(f"tool {tool_name!r}: {exc}") from None
    mode = _resolve_mode(tool_name, policy, listed.annotations)
    effects = frozenset(Effect(e) for e in policy.effect) if policy.effect is not None else None
    takeover_safe = mode is Mode.READ or bool((effects or frozenset()) & {Effect.IDEMPOTENT, Effect.FENCED})
    description = policy.description
    if description is None:
        # The server's description goes to the model: third-party text, so capped
        # and cleaned like any other output of the server.
        description = sanitize_text(listed.description or listed.name, _MAX_DESCRIPTION_CHARS)[0]
    binding = _Binding(
        spec=spec,
        tool_name=tool_name,
        mcp_tool_name=listed.name,
        mode=mode,
        takeover_safe=takeover_safe,
        policy=policy,
        input_fingerprint=schema_fingerprint(listed.input_schema),
    )
    declared: dict[str, Any] = {}
    if effects is not None:
        declared["effect"] = effects
    return Tool(
        name=tool_name,
        description=description,
        mode=mode,
        input_model=input_model,
        output_model=McpToolOutput,
        run=binding.run,
        access=policy.access,
        approval=policy.approval,
        approvers=policy.approvers,
        schema_version=schema_version_of(input_model.mcp_input_schema),
        check=policy.check,
        impact=policy.impact,
        amounts=policy.amounts,
        lookup=policy.lookup,
        model_view=model_view,
        resource_ids=policy.resource_ids,
        untrusted_output=True,
        retry=policy.retry,
        timeout_seconds=policy.timeout_seconds,
        **declared,
    )


# ---------------------------------------------------------------- execution


@dataclass(frozen=True)
class _Binding:
    """One registered MCP tool: where it runs and how its calls end."""

    spec: McpServerSpec
    tool_name: str
    mcp_tool_name: str
    mode: Mode
    takeover_safe: bool
    policy: ToolPolicy
    input_fingerprint: str

    def run(self, args: McpArguments, ctx: RunContext) -> McpToolOutput | Written:
        # `deadline` is epoch seconds, like every timestamp the store hands out.
        timeout = min(self.policy.timeout_seconds, ctx.deadline - time.time())
        if timeout <= 0:
            raise deadline_passed_failure()
        if self.mode is Mode.WRITE:
            ctx.ensure_owner()
        correlation_token = uuid.uuid4().hex
        started = time.monotonic()
        outcome = connection_for(self.spec).call_tool(
            self.mcp_tool_name,
            args.arguments,
            timeout_seconds=timeout,
            meta={
                META_OPERATION_ID: ctx.operation_id,
                META_IDEMPOTENCY_KEY: ctx.idempotency_key,
                META_FENCING_TOKEN: ctx.fencing_token,
                # The W3C trace context, under the keys MCP's `_meta` uses for it.
                **({"traceparent": ctx.traceparent} if ctx.traceparent else {}),
                **({"tracestate": ctx.tracestate} if ctx.tracestate else {}),
            },
            correlation_token=correlation_token,
            expected_input_fingerprint=self.input_fingerprint,
        )
        failure = outcome.failure
        if failure is None and outcome.result is not None and outcome.result.is_error:
            structured = structured_tool_error(outcome.result.structured_content)
            failure = tool_error_failure(
                _error_text(outcome.result, structured),
                self.policy.max_error_chars,
                structured,
                may_retry=self.takeover_safe,
            )
        record = McpCallRecord(
            server=self.spec.name,
            tool_name=self.tool_name,
            mcp_tool_name=self.mcp_tool_name,
            operation_id=ctx.operation_id,
            call_id=current_provider_call_id(ctx),
            request_id=ctx.server.request_id,
            attempt=ctx.attempt,
            fencing_token=ctx.fencing_token,
            correlation_token=correlation_token,
            jsonrpc_request_ids=outcome.jsonrpc_request_ids,
            session_number=outcome.session_number,
            outcome="succeeded" if failure is None else f"{failure.code.value}:{failure.kind.value}",
            duration_seconds=time.monotonic() - started,
        )
        CALL_HISTORY.add(record)
        logger.info("mcp call %s", json.dumps(record.to_json(), sort_keys=True))
        if failure is not None:
            raise self._final(failure, record)
        assert outcome.result is not None
        output = self._output(outcome, record)
        if self.mode is Mode.WRITE:
            receipt = (
                self.policy.receipt(output)
                if self.policy.receipt is not None
                else f"mcp:{self.tool_name}:{ctx.operation_id}:g{ctx.fencing_token}:"
                f"{record.session_number}.{'.'.join(map(str, record.jsonrpc_request_ids))}"
            )
            return Written(output=output, receipt=receipt)
        return output

    def _final(self, failure: McpCallFailure, record: McpCallRecord) -> McpCallFailure:
        failure.record = record
        if failure.retryable and failure.outcome_unknown and not self.takeover_safe:
            # The server may have acted; running this write again could repeat
            # the effect, so it goes to reconciliation instead of a retry.
            return failure.not_retryable()
        return failure

    def _output(self, outcome: CallOutcome, record: McpCallRecord) -> McpToolOutput:
        result = outcome.result
        assert result is not None
        blocks, truncated = _content_blocks(result.content, self.policy.max_output_chars)
        structured: Any = None
        if result.structured_content is not None:
            # Redacted with the cap as the bound on what is scanned (one walk); a
            # structure the cap had to cut is left out whole, since it would no longer
            # match the tool's output schema, and sets `truncated`.
            sealed, cut = seal_json(result.structured_content, self.policy.max_structured_chars)
            structured = None if cut else sealed
            truncated |= cut
        return McpToolOutput(
            source=f"mcp:{self.spec.name}/{self.mcp_tool_name}",
            content=tuple(blocks),
            structured=structured,
            truncated=truncated,
            correlation=McpCorrelation(
                server=record.server,
                tool_name=record.tool_name,
                mcp_tool_name=record.mcp_tool_name,
                operation_id=record.operation_id,
                call_id=record.call_id,
                request_id=record.request_id,
                attempt=record.attempt,
                jsonrpc_request_ids=record.jsonrpc_request_ids,
                session_number=record.session_number,
            ),
        )


def _content_blocks(
    content: Sequence[mcp_types.ContentBlock], max_chars: int
) -> tuple[list[McpContentBlock], bool]:
    """Content blocks within one text budget shared by all blocks."""
    blocks: list[McpContentBlock] = []
    budget = max_chars
    truncated = len(content) > _MAX_CONTENT_BLOCKS
    for block in content[:_MAX_CONTENT_BLOCKS]:
        if isinstance(block, mcp_types.TextContent):
            if budget <= 0:
                truncated = True
                continue
            text, cut = sanitize_text(block.text, budget)
            budget -= len(text)
            truncated |= cut
            blocks.append(McpContentBlock(type="text", text=text))
        elif isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
            blocks.append(
                McpContentBlock(
                    type=block.type,
                    mime_type=_clean(block.mime_type, 100),
                    omitted_bytes=len(block.data) * 3 // 4,
                )
            )
        elif isinstance(block, mcp_types.ResourceLink):
            blocks.append(
                McpContentBlock(
                    type="resource_link",
                    text=_clean(block.name, 200),
                    uri=_clean(str(block.uri), _MAX_URI_CHARS),
                    mime_type=_clean(block.mime_type, 100),
                )
            )
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            uri = _clean(str(resource.uri), _MAX_URI_CHARS)
            mime_type = _clean(resource.mime_type, 100)
            if isinstance(resource, mcp_types.TextResourceContents) and budget > 0:
                text, cut = sanitize_text(resource.text, budget)
                budget -= len(text)
                truncated |= cut
                blocks.append(McpContentBlock(type="resource", text=text, uri=uri, mime_type=mime_type))
            elif isinstance(resource, mcp_types.BlobResourceContents):
                blocks.append(
                    McpContentBlock(
                        type="resource",
                        uri=uri,
                        mime_type=mime_type,
                        omitted_bytes=len(resource.blob) * 3 // 4,
                    )
                )
            else:
                truncated = True
    return blocks, truncated


def _clean(text: str | None, limit: int) -> str | None:
    return None if text is None else sanitize_text(text, limit)[0]


def _error_text(result: mcp_types.CallToolResult, structured: StructuredToolError | None) -> str:
    texts = [block.text for block in result.content if isinstance(block, mcp_types.TextContent)]
    if texts:
        return "\n".join(texts)
    if structured is not None and structured.message:
        return structured.message
    return "(no error text)"
