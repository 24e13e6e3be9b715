"""`toolfence migrate`: create or upgrade the database schema (alembic)."""

from __future__ import annotations

import argparse

HELP = "Create or upgrade the database schema (alembic)."


def configure_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("migrate", help=HELP, description=HELP)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from executor.cli.common import safe_url, settings
    from executor.store.migrate import migrate

    database_url = settings().database_url
    revision = migrate(database_url)
    print(f"schema at revision {revision} ({safe_url(database_url)})")
    return 0
