"""Shared fixtures: real databases, built once and cloned per test.

PostgreSQL: a template database is migrated once per session and every test gets
`CREATE DATABASE … TEMPLATE` (procrastinate's approach): a fresh schema in ~50 ms.
SQLite: a migrated file is copied per test. A missing PostgreSQL fails loudly.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine

from executor.store.engine import make_engine
from executor.store.migrate import migrate

PG_ADMIN_DSN = os.environ.get("TOOLFENCE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
TEMPLATE = f"toolfence_template_{os.getpid()}"


def _pg_url(dbname: str) -> str:
    base = PG_ADMIN_DSN.rsplit("/", 1)[0]
    return f"{base}/{dbname}".replace("postgresql://", "postgresql+psycopg://", 1)


def _admin() -> psycopg.Connection:
    try:
        return psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:  # pragma: no cover - CI must have it
        pytest.fail(f"PostgreSQL is required for these tests and is not reachable: {exc}")


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}"')
        admin.execute(f'CREATE DATABASE "{TEMPLATE}"')
    migrate(_pg_url(TEMPLATE))
    yield TEMPLATE
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_template: str) -> Iterator[str]:
    name = f"toolfence_test_{uuid.uuid4().hex[:12]}"
    with _admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield _pg_url(name)
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    migrate(f"sqlite:///{path}")
    return path


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    target = tmp_path / "toolfence.db"
    shutil.copy(sqlite_template, target)
    return f"sqlite:///{target}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    fixture = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def pg_engine(pg_url: str) -> Iterator[Engine]:
    eng = make_engine(pg_url)
    yield eng
    eng.dispose()
