"""`toolfence enqueue`: admit and enqueue calls from a JSON file."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from executor.cli.args import UserError, add_actor, add_option, roles_of

if TYPE_CHECKING:
    from executor.core.types import ProposedCall

HELP = "Admit and enqueue calls from a JSON file (or - for stdin)."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("enqueue", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument("file", help='neutral format: [{"call_id","tool_name","arguments"}, ...]')
    add_actor(
        parser, tenant_help="server context: tenant", principal_help="server context: principal",
        role_help="server context: a role (repeat, or comma-separate)", default_roles=["member"],
    )
    parser.add_argument(
        "--request-id", default=None, help="scoped by tenant; enqueueing it again is idempotent"
    )
    add_option(
        parser, "--conversation-id", aliases=["--conversation"], default=None,
        help="server context: conversation (budgets, repeats)",
    )
    parser.add_argument("--turn-id", default=None, help="server context: the conversation turn")
    parser.add_argument(
        "--provider", default=None, metavar="SURFACE",
        help="read the file as this provider surface's response envelope (openai-chat, anthropic, …)",
    )


def run(args: argparse.Namespace) -> int:
    import secrets

    from executor.cli.common import (
        engine_of,
        hosted_policy_of,
        print_json,
        read_json_file,
        registry_of,
        settings,
        status_json,
        surface_of,
    )
    from executor.core.identifiers import InvalidIdentifier
    from executor.core.types import ErrorCode, ServerContext

    chosen = settings()
    surface = surface_of(args.provider) if args.provider else None
    engine = engine_of(chosen)
    from outbox.producer import AdmissionUnavailable, HostedCalls, InvalidBatch, enqueue

    payload = read_json_file(args.file, chosen.max_argument_depth)
    registry = registry_of(chosen)
    hosted: HostedCalls | None = None
    if surface is not None:
        from executor.providers import AdapterError, AdapterErrorCode

        refused = f"cannot read {args.file} ({surface.name} response)"
        if not isinstance(payload, dict):
            raise UserError(
                f"{refused}: {AdapterErrorCode.MALFORMED_ENVELOPE.value}: "
                f"the file holds a JSON {_json_kind(payload)}, not an object"
            )
        try:
            calls = surface.read_proposals(payload, known_names=registry.names())
            # What the provider ran itself is recorded too, against the application's
            # hosted-tool policy: one outside it is reported, never silent.
            hosted = HostedCalls(surface.read_hosted_calls(payload), hosted_policy_of(chosen))
        except AdapterError as exc:
            raise UserError(f"{refused}: {exc.code.value}: {exc.message}") from None
    else:
        calls = neutral_calls(payload)
    context = ServerContext(
        principal=args.principal,
        tenant=args.tenant,
        roles=roles_of(args),
        request_id=args.request_id or f"req_{secrets.token_hex(8)}",
        conversation_id=args.conversation_id,
        turn_id=args.turn_id,
    )
    try:
        # Enqueueing the same request again is idempotent: same calls → their stored
        # statuses, a call id reused for another call → idempotency_conflict.
        with engine.begin() as conn:
            handle = enqueue(conn, calls, context, registry, budgets=chosen.budgets, hosted=hosted)
    except (InvalidBatch, InvalidIdentifier) as exc:
        raise UserError(f"{exc.code}: {exc}") from None
    except AdmissionUnavailable as exc:
        raise UserError(
            f"{ErrorCode.UPSTREAM_UNAVAILABLE.value}: {exc}; nothing was recorded, run it again"
        ) from None
    print_json(
        {
            "request_id": handle.request_id,
            "calls": [
                {"call_id": c.call_id, "operation_id": c.operation_id, **status_json(c.status)}
                for c in handle.calls
            ],
        }
    )
    return 0


def neutral_calls(payload: Any) -> list[ProposedCall]:
    from executor.core.types import ProposedCall

    items = payload.get("calls") if isinstance(payload, dict) else payload
    if not isinstance(items, list):
        raise UserError('the file must hold a list of calls or {"calls": [...]}')
    calls = []
    for index, item in enumerate(items):
        if not isinstance(item, dict) or not {"call_id", "tool_name", "arguments"} <= item.keys():
            raise UserError(f"call #{index} needs call_id, tool_name and arguments")
        try:
            calls.append(ProposedCall.model_validate(item))
        except ValueError:
            raise UserError(
                f"call #{index}: call_id and tool_name must be strings, "
                "arguments a JSON string or an object"
            ) from None
    return calls


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return "number"
