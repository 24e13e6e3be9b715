"""`toolfence results`: one result per call of a request, in proposal order."""

from __future__ import annotations

import argparse

from executor.cli.args import UserError, seconds

HELP = "Show one result per call of a request, in proposal order."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("results", help=HELP, description=HELP)
    parser.set_defaults(func=run)
    parser.add_argument("request_id", help="the request's id (as enqueue printed it)")
    parser.add_argument("--tenant", required=True, help="the request's tenant (request ids are per tenant)")
    parser.add_argument("--wait", type=float, default=0.0, metavar="SECONDS", help="wait until settled")
    parser.add_argument(
        "--provider", default=None, metavar="SURFACE",
        help="write the results in this provider surface's envelope (openai-chat, anthropic, …)",
    )


def run(args: argparse.Namespace) -> int:
    from executor.cli.common import engine_of, print_json, settings, status_json, surface_of
    from executor.core.types import ProposedCall

    wait = seconds(args.wait, "--wait")
    chosen = settings()
    surface = surface_of(args.provider) if args.provider else None
    engine = engine_of(chosen)
    from outbox.results import final, request_exists, results, wait_for_results

    with engine.connect() as conn:
        if not request_exists(conn, args.tenant, args.request_id):
            raise UserError(f"no request {args.request_id!r} for tenant {args.tenant!r}")
    statuses = (
        wait_for_results(engine, args.tenant, args.request_id, timeout=wait)
        if wait
        else results(engine, args.tenant, args.request_id)
    )
    if surface is not None:
        from executor.providers import AdapterError

        # The calls table keeps each proposal's id and tool name; a call still pending is
        # answered with the code that says why (approval_required, …), as `final` decides.
        proposals = [ProposedCall(call_id=s.call_id, tool_name=s.tool_name, arguments="{}") for s in statuses]
        try:
            written = surface.write_results(proposals, [final(s) for s in statuses])
        except AdapterError as exc:
            raise UserError(
                f"cannot write request {args.request_id!r} ({surface.name} results): "
                f"{exc.code.value}: {exc.message}"
            ) from None
        print_json(written)
        return 0
    print_json([status_json(s) for s in statuses])
    return 0
