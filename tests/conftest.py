"""Shared fixtures: real databases, built once and cloned per test.

PostgreSQL: a template database is migrated once per session and every test gets
`CREATE DATABASE … TEMPLATE` (procrastinate's approach): a fresh schema. The clone
is made one test ahead and dropped after the test, both on a thread of their own
(`_Clones`), so a test waits for neither (each costs 0.1-0.5 s on a busy machine).
SQLite: a migrated file is copied per test. A missing PostgreSQL fails loudly.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine

from executor import settings
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


class _Clones:
    """Clones of the template, made one test ahead and dropped behind, off the test's path.

    `take()` hands out a database made while the previous test ran (the first one
    is made on demand) and asks for the next; `give_back()` queues its drop. Two
    threads, each on its own connection, do the work (`CREATE DATABASE` and
    `DROP DATABASE` then overlap in the server). Drops go in batches of
    `DROP_BATCH`: PostgreSQL 15 makes each `DROP DATABASE` wait for a checkpoint,
    which writes out what every test since the last one dirtied; dropped back to
    back, only the first of a batch has much to write (a dropped database's dirty
    pages are discarded, never written), and drops waiting at the same time (on
    `DROP_LANES` connections) share one checkpoint. Every clone is a fresh
    `CREATE DATABASE … TEMPLATE` of the same migrated template, so a test cannot
    tell when its clone was made. A create that fails fails the test that takes it;
    a drop that fails fails the session at `close()`.
    """

    DROP_BATCH = 25
    DROP_LANES = 4

    def __init__(self, template: str) -> None:
        self._template = template
        self._creates: queue.Queue[bool] = queue.Queue()  # False: stop
        self._drops: queue.Queue[str | None] = queue.Queue()  # None: stop
        self._made: queue.Queue[str | BaseException] = queue.Queue()
        self._owed = 0  # creates asked for and not yet taken
        self._lock = threading.Lock()
        self._drop_errors: list[str] = []
        self._threads = [
            threading.Thread(target=self._create_loop, name="pg-clone-create", daemon=True),
            threading.Thread(target=self._drop_loop, name="pg-clone-drop", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def take(self) -> str:
        with self._lock:
            if self._owed == 0:
                self._ask_create()
            self._owed -= 1
            self._ask_create()  # the next test's, made while this one runs
        try:
            made = self._made.get(timeout=120)
        except queue.Empty:
            pytest.fail("no clone of the template database within 120 s")
        if isinstance(made, BaseException):
            pytest.fail(f"could not clone the template database: {made}")
        return made

    def give_back(self, name: str) -> None:
        self._drops.put(name)

    def close(self) -> None:
        self._creates.put(False)
        self._threads[0].join(timeout=120)
        while not self._made.empty():
            made = self._made.get()
            if isinstance(made, str):
                self._drops.put(made)
        self._drops.put(None)
        self._threads[1].join(timeout=300)
        assert not self._drop_errors, f"test databases not dropped: {self._drop_errors}"

    def _ask_create(self) -> None:
        self._owed += 1
        self._creates.put(True)

    def _create_loop(self) -> None:
        try:
            admin = psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:  # pragma: no cover - CI must have it
            while self._creates.get():
                self._made.put(exc)
            return
        with admin:
            while self._creates.get():
                name = f"toolfence_test_{uuid.uuid4().hex[:12]}"
                try:
                    admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"')
                except Exception as exc:  # noqa: BLE001 - handed to the test that takes it
                    self._made.put(exc)
                else:
                    self._made.put(name)

    def _drop_loop(self) -> None:
        batch: list[str] = []
        while (name := self._drops.get()) is not None:
            batch.append(name)
            if len(batch) >= self.DROP_BATCH:
                self._drop(batch)
                batch = []
        self._drop(batch)

    def _drop(self, names: list[str]) -> None:
        """Drop on DROP_LANES connections at once: drops that wait together share a checkpoint."""

        def lane(share: list[str]) -> None:
            try:
                with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5) as admin:
                    for name in share:
                        try:
                            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                        except Exception as exc:  # noqa: BLE001 - reported by close()
                            self._drop_errors.append(f"{name}: {exc}")
            except psycopg.OperationalError as exc:  # pragma: no cover - CI must have it
                self._drop_errors.append(f"{share}: {exc}")

        shares = [names[i :: self.DROP_LANES] for i in range(self.DROP_LANES)]
        with ThreadPoolExecutor(self.DROP_LANES) as pool:
            list(pool.map(lane, [share for share in shares if share]))


@pytest.fixture(autouse=True)
def _settings_read_per_test() -> Iterator[None]:
    """`settings.current()` reads the environment once per process; each test has
    its own environment (monkeypatched variables), so none inherits another's."""
    settings.forget()
    yield
    settings.forget()


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}"')
        admin.execute(f'CREATE DATABASE "{TEMPLATE}"')
    migrate(_pg_url(TEMPLATE))
    yield TEMPLATE
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_clones(pg_template: str) -> Iterator[_Clones]:
    clones = _Clones(pg_template)
    yield clones
    clones.close()


@pytest.fixture
def pg_url(pg_clones: _Clones) -> Iterator[str]:
    name = pg_clones.take()
    yield _pg_url(name)
    pg_clones.give_back(name)


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
