"""Schema migrations (alembic), applied by `toolfence migrate`."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from executor.errors import ConfigurationError
from executor.store.engine import normalize_url

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "toolfence_alembic_version"


class SchemaNotReady(ConfigurationError, RuntimeError):
    """The database's schema is not the one this code needs: run `toolfence migrate`."""


def _config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


def migrate(url: str) -> str:
    """Bring the schema to the newest revision; returns it."""
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(_config(url), "head")
    return head_revision(url)


def head_revision(url: str) -> str:
    head = ScriptDirectory.from_config(_config(url)).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE}
        ).get_current_revision()


def require_schema(engine: Engine, url: str) -> None:
    """Refuse to run against a database that `toolfence migrate` has not prepared."""
    current = current_revision(engine)
    head = head_revision(url)
    if current != head:
        raise SchemaNotReady(
            f"database schema is at {current or 'nothing'}, expected {head}: run `toolfence migrate`"
        )

