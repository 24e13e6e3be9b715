"""API keys of `toolfence serve`, the HTTP Idempotency-Key map and the console's
ended sessions: their statements.

The store never sees a key's secret: callers hash it (executor/http/keys.py) and
hand over the hash. A key is found by its public `key_id` (the lookup prefix);
whether the presented secret matches is the caller's constant-time check.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, insert, select, update

from executor.core.identifiers import IdentifierField, check_identifier, identifier_problem
from executor.store.clock import DATABASE_CLOCK, Clock
from executor.store.engine import insert_ignore
from executor.store.schema import api_keys, console_revocations, http_idempotency

SURFACE_MAX_CHARS = 64
"""`toolfence_api_keys.surface` is `String(64)`, as a surface's name is (executor/core/surfaces.py)."""


@dataclass(frozen=True)
class ApiKeyRecord:
    key_id: str
    tenant: str
    principal: str
    roles: frozenset[str]
    scopes: frozenset[str]
    secret_hash: str
    label: str | None
    created_at: float
    revoked_at: float | None
    # The turn surface every request made with this key runs under (None: no surface;
    # its turns take the server's TOOLFENCE_TURN_SURFACE). Migration 0010.
    surface: str | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


def _record(row: object) -> ApiKeyRecord:
    data = dict(row._mapping)  # type: ignore[attr-defined]
    return ApiKeyRecord(
        key_id=data["key_id"], tenant=data["tenant"], principal=data["principal"],
        roles=frozenset(json.loads(data["roles"])), scopes=frozenset(json.loads(data["scopes"])),
        secret_hash=data["secret_hash"], label=data["label"], created_at=data["created_at"],
        revoked_at=data["revoked_at"], surface=data.get("surface"),
    )


def insert_api_key(
    conn: Connection,
    *,
    key_id: str,
    tenant: str,
    principal: str,
    roles: Iterable[str],
    scopes: Iterable[str],
    secret_hash: str,
    label: str | None = None,
    surface: str | None = None,
    clock: Clock = DATABASE_CLOCK,
) -> None:
    """Store a key. Its tenant, principal and roles are identifiers (printable, valid
    UTF-8, at most 200 characters: `InvalidIdentifier` otherwise, before the insert,
    so PostgreSQL never aborts the caller's transaction on one); so is its label, and
    its turn surface's name, at most `SURFACE_MAX_CHARS` (`ValueError`). Whether the
    registry declares that surface is the caller's check (`toolfence keys create`):
    the store knows no registry, and a server that no longer declares it refuses the
    key's work (executor/http/service.py)."""
    roles = list(roles)
    check_identifier(IdentifierField.TENANT, tenant)
    check_identifier(IdentifierField.PRINCIPAL, principal)
    for role in roles:
        check_identifier(IdentifierField.ROLE, role)
    problem = None if label is None else identifier_problem(label)
    if problem is not None:
        raise ValueError(f"label is not valid ({problem.value}): printable text of at most 200 characters")
    problem = None if surface is None else identifier_problem(surface, SURFACE_MAX_CHARS)
    if problem is not None:
        raise ValueError(
            f"surface is not valid ({problem.value}): "
            f"printable text of at most {SURFACE_MAX_CHARS} characters"
        )
    conn.execute(
        insert(api_keys).values(
            key_id=key_id, tenant=tenant, principal=principal,
            roles=json.dumps(sorted(set(roles))), scopes=json.dumps(sorted(set(scopes))),
            secret_hash=secret_hash, label=label, created_at=clock.now(), revoked_at=None,
            surface=surface,
        )
    )


def api_key(conn: Connection, key_id: str) -> ApiKeyRecord | None:
    row = conn.execute(select(api_keys).where(api_keys.c.key_id == key_id)).one_or_none()
    return None if row is None else _record(row)


_KEY_COLUMNS = tuple(c.name for c in api_keys.columns)
_KEY_BY_ID = {
    style: f"SELECT {', '.join(_KEY_COLUMNS)} FROM {api_keys.name} WHERE key_id = {marker}"
    for style, marker in (("qmark", "?"), ("pyformat", "%(key_id)s"), ("format", "%(key_id)s"))
}


def api_key_per_request(conn: Connection, key_id: str) -> ApiKeyRecord | None:
    """`api_key`, as the one fixed statement `toolfence serve` runs for every request:
    text written once, run as the driver's SQL (SQLAlchemy's error handling and pool
    invalidation kept, its statement compilation and result processing skipped:
    0.2 ms of a core instead of 0.3 ms here)."""
    style = conn.dialect.paramstyle
    parameters: Any = (key_id,) if style == "qmark" else {"key_id": key_id}
    row = conn.exec_driver_sql(_KEY_BY_ID[style], parameters).one_or_none()
    return None if row is None else _record(row)


def api_keys_of(conn: Connection, tenant: str | None = None) -> list[ApiKeyRecord]:
    query = select(api_keys).order_by(api_keys.c.tenant, api_keys.c.created_at)
    if tenant is not None:
        query = query.where(api_keys.c.tenant == tenant)
    return [_record(row) for row in conn.execute(query)]


def revoke_api_key(conn: Connection, key_id: str, clock: Clock = DATABASE_CLOCK) -> bool:
    """Active → revoked, once; False when there is no such key or it was revoked already."""
    row = conn.execute(
        update(api_keys)
        .where(api_keys.c.key_id == key_id, api_keys.c.revoked_at.is_(None))
        .values(revoked_at=clock.now())
        .returning(api_keys.c.key_id)
    ).first()
    return row is not None


@dataclass(frozen=True)
class IdempotencyClaim:
    """What an Idempotency-Key stands for: `created` when this call claimed it, else
    the request and body digest it was claimed with first."""

    request_id: str
    body_digest: str
    created: bool


def claim_idempotency_key(
    conn: Connection,
    *,
    tenant: str,
    principal: str,
    idempotency_key: str,
    request_id: str,
    body_digest: str,
    clock: Clock = DATABASE_CLOCK,
) -> IdempotencyClaim:
    """Insert the key's row unless it exists (on PostgreSQL a concurrent claim waits
    for the first one's transaction), then answer what the key stands for."""
    created = insert_ignore(
        conn, http_idempotency,
        {
            "tenant": tenant, "principal": principal, "idempotency_key": idempotency_key,
            "request_id": request_id, "body_digest": body_digest, "created_at": clock.now(),
        },
        key=["tenant", "principal", "idempotency_key"],
    )
    row = conn.execute(
        select(http_idempotency.c.request_id, http_idempotency.c.body_digest).where(
            http_idempotency.c.tenant == tenant,
            http_idempotency.c.principal == principal,
            http_idempotency.c.idempotency_key == idempotency_key,
        )
    ).one()
    return IdempotencyClaim(row.request_id, row.body_digest, created)


def revoke_console_session(conn: Connection, session_id: str, expires_at: float) -> None:
    """Remember that a console session ended before `expires_at` (again: no change);
    sessions that have expired by now are forgotten on the way."""
    insert_ignore(
        conn, console_revocations, {"session_id": session_id, "expires_at": expires_at},
        key=["session_id"],
    )
    prune_console_revocations(conn)


def prune_console_revocations(conn: Connection, clock: Clock = DATABASE_CLOCK) -> int:
    """Drop the rows of sessions that have expired anyway; how many."""
    result = conn.execute(delete(console_revocations).where(console_revocations.c.expires_at < clock.now()))
    return int(result.rowcount or 0)


def console_session_revoked(conn: Connection, session_id: str) -> bool:
    row = conn.execute(
        select(console_revocations.c.session_id).where(console_revocations.c.session_id == session_id)
    ).first()
    return row is not None
