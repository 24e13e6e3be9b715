"""`toolfence keys create|list|revoke`: the API keys of `toolfence serve`."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from executor.cli.args import UserError, alias, usage_error

if TYPE_CHECKING:
    from executor.core.tools import Registry

HELP = "API keys of `toolfence serve`."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = subparsers.add_parser("keys", help=HELP, description=HELP)
    actions = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    parser = actions.add_parser(
        "create", help="Create a key and print it (once).", description="Create a key and print it once."
    )
    parser.set_defaults(func=run_create)
    parser.add_argument("--tenant", required=True, help="the tenant the key acts for")
    parser.add_argument("--principal", required=True, help="who the key is (audited as the actor)")
    role = parser.add_argument(
        "--role", action="append", default=[], metavar="ROLE", help="a role (repeat, or comma-separate)"
    )
    alias(parser, "--roles", role)  # the comma-separated spelling of enqueue and turn start
    parser.add_argument(
        "--scope", action="append", required=True, metavar="SCOPE",
        help="produce, approve, operate or read (repeat, or comma-separate)",
    )
    parser.add_argument("--label", default=None, help="a note for `keys list`")
    parser.add_argument(
        "--surface", default=None, metavar="NAME",
        help="the turn surface every request and turn of this key runs under (declared in "
        "TOOLFENCE_TOOLS's registry with Registry.add_surface); unset: none, and the key's "
        "turns take TOOLFENCE_TURN_SURFACE",
    )
    parser = actions.add_parser("list", help="List keys (never their secrets).", description="List keys.")
    parser.set_defaults(func=run_list)
    parser.add_argument("--tenant", default=None, help="only this tenant's keys (default: every tenant's)")
    parser = actions.add_parser(
        "revoke", help="Revoke a key (at once, sessions included).", description="Revoke a key."
    )
    parser.set_defaults(func=run_revoke)
    parser.add_argument("key_id", help="the key's id (from `keys list`) or the key itself")


def run_create(args: argparse.Namespace) -> int:
    from executor.cli.common import engine_of, registry_of, settings
    from executor.core.identifiers import InvalidIdentifier
    from executor.http.keys import create_key, parse_scopes

    roles = [r for item in args.role for r in item.split(",") if r]
    try:
        scopes = parse_scopes(s for item in args.scope for s in item.split(","))
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    chosen = settings()
    if args.surface is not None:
        _require_declared_surface(args.surface, registry_of(chosen))
    engine = engine_of(chosen)
    try:
        with engine.begin() as conn:
            key = create_key(
                conn, tenant=args.tenant, principal=args.principal, roles=roles, scopes=scopes,
                label=args.label, surface=args.surface,
            )
    except InvalidIdentifier as exc:
        # Checked before the insert (`insert_api_key`); the message names the field,
        # never the value (a newline or an escape would forge the next output line).
        raise usage_error(f"--{_FLAGS[exc.field.value]}: {exc}") from None
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    # The only time the secret is shown: it is stored as a hash.
    print(key)
    print("store it now: toolfence keeps only its hash", file=sys.stderr)
    return 0


_FLAGS = {"tenant": "tenant", "principal": "principal", "roles": "role"}


def _require_declared_surface(name: str, registry: Registry) -> None:
    """A key's surface must be one the tools declare: a key made with a typo would be
    refused on every request (503) rather than at its creation."""
    if registry.surface(name) is None:
        raise undeclared_surface(registry)


def undeclared_surface(registry: Registry, what: str = "--surface") -> UserError:
    """`--surface` (`keys create`, `turn start`) or `TOOLFENCE_TURN_SURFACE` (`serve`)
    names a surface the registry does not declare: one line naming the declared ones.
    The given name is not echoed: a control character in it would forge the next
    output line."""
    declared = ", ".join(repr(n) for n in registry.surface_names()) or "none"
    return usage_error(f"{what}: TOOLFENCE_TOOLS declares no such surface (declared: {declared})")


def run_list(args: argparse.Namespace) -> int:
    from executor.cli.common import engine_of, iso, print_json, settings, shown
    from executor.store.api_keys import api_keys_of

    engine = engine_of(settings())
    with engine.connect() as conn:
        records = api_keys_of(conn, args.tenant)
    print_json(
        [
            {
                # What an operator reads goes through the sanitiser: a principal or a
                # label shaped like a secret (`sk-…`) is shown redacted.
                "key_id": r.key_id, "tenant": shown(r.tenant), "principal": shown(r.principal),
                "roles": sorted(shown(role) for role in r.roles), "scopes": sorted(r.scopes),
                "label": shown(r.label), "surface": shown(r.surface),
                "created_at": iso(r.created_at), "revoked_at": iso(r.revoked_at),
            }
            for r in records
        ]
    )
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    from executor.cli.common import engine_of, settings
    from executor.http.keys import KeyRefused, split_key
    from executor.store.api_keys import revoke_api_key

    key_id = args.key_id
    if key_id.startswith("tfk_"):
        try:
            key_id = split_key(key_id)[0]
        except KeyRefused:
            raise UserError("that is not a toolfence key or key id") from None
    engine = engine_of(settings())
    with engine.begin() as conn:
        if not revoke_api_key(conn, key_id):
            raise UserError(f"no active key {key_id!r}")
    print(f"revoked {key_id}")
    return 0
