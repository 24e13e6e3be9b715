"""API keys: who a caller of `toolfence serve` is, from the credential alone.

A key reads `tfk_<key_id>_<secret>`. `key_id` is public, the lookup prefix the
row is found by; the secret is 32 random bytes, shown once when the key is
created and stored only as an argon2id hash. Verifying a hash costs tens of
milliseconds on purpose, so a process remembers the keys it has verified
(`VerifiedKeys`, decision 0227): bounded, keyed by a digest of the key id and the
presented secret (a wrong secret is never found there), each entry naming the
stored hash it was verified against. The row itself is read on every request, so
a revocation holds on the next request, and a row whose hash changed is verified
again.

An unknown key id costs the same as a known one with a wrong secret: its secret
is verified against a dummy hash made with the same argon2 parameters, and a
revoked key is called revoked only once its secret matched. So neither the
answer nor its time says which key ids exist (decision 0199).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import Connection, Engine

from executor.core.types import ServerContext
from executor.errors import HttpError
from executor.store.api_keys import ApiKeyRecord, api_key, api_key_per_request, insert_api_key
from executor.store.engine import read_only, single_statement

KEY_PREFIX = "tfk"


class KeyScope(StrEnum):
    """What a key may do. `read` sees requests, approvals, the pending queue and
    operations of its tenant; each of the others adds the action it names."""

    PRODUCE = "produce"
    APPROVE = "approve"
    OPERATE = "operate"
    READ = "read"


_SCOPE_NAMES = frozenset(s.value for s in KeyScope)

# OWASP's argon2id minimum (19 MiB, 2 passes): slow for a guesser, ~20 ms here.
_HASHER = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1)


@dataclass(frozen=True)
class Identity:
    """The caller as its key says: never taken from a request body.

    `surface` is the key's turn surface (executor/core/surfaces.py), or None. It is
    part of who the caller is, like the roles: every context made for the key names
    it, so its catalog, write rule and listed targets apply to the key's requests as
    to its turns (decision 0208): a chat frontend's key cannot post a write past the
    card rule by calling `POST /v1/requests` directly."""

    key_id: str
    tenant: str
    principal: str
    roles: frozenset[str]
    scopes: frozenset[KeyScope]
    surface: str | None = None

    def context(self, request_id: str, conversation_id: str | None = None) -> ServerContext:
        return ServerContext(
            principal=self.principal, tenant=self.tenant, roles=self.roles,
            request_id=request_id, conversation_id=conversation_id, surface=self.surface,
        )

    def may(self, *scopes: KeyScope) -> bool:
        return bool(self.scopes & set(scopes))


class KeyRefused(HttpError):
    """The presented key is not one (malformed, unknown, wrong secret) or revoked."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parse_scopes(names: Iterable[str]) -> frozenset[KeyScope]:
    try:
        return frozenset(KeyScope(n.strip()) for n in names if n.strip())
    except ValueError:
        raise ValueError(f"scopes are {', '.join(s.value for s in KeyScope)}") from None


def create_key(
    conn: Connection,
    *,
    tenant: str,
    principal: str,
    roles: Iterable[str],
    scopes: Iterable[KeyScope],
    label: str | None = None,
    surface: str | None = None,
) -> str:
    """Store a new key and return its text: the only time anyone sees the secret.
    `surface` names the turn surface all of the key's requests and turns run under;
    that the registry declares it is the caller's check (`toolfence keys create`
    refuses a name TOOLFENCE_TOOLS does not declare)."""
    if not tenant or not principal:
        raise ValueError("a key needs a tenant and a principal")
    scope_set = frozenset(scopes)
    if not scope_set:
        raise ValueError("a key needs at least one scope")
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    insert_api_key(
        conn, key_id=key_id, tenant=tenant, principal=principal, roles=roles,
        scopes=[s.value for s in scope_set], secret_hash=_HASHER.hash(secret), label=label,
        surface=surface,
    )
    return f"{KEY_PREFIX}_{key_id}_{secret}"


def split_key(text: str) -> tuple[str, str]:
    """(key_id, secret) of a key's text; KeyRefused when it is not shaped like one."""
    prefix, _, rest = text.partition("_")
    key_id, _, secret = rest.partition("_")
    if prefix != KEY_PREFIX or len(key_id) != 16 or not secret or len(text) > 200:
        raise KeyRefused("malformed")
    return key_id, secret


class VerifiedKeys:
    """The keys this process has verified with argon2, so the next request of the same
    key costs a SHA-256 instead (decision 0227). Thread-safe, at most `capacity`
    entries, the least recently used dropped first.

    An entry's key is SHA-256(key id, NUL, secret): only the exact text of a key that
    verified finds it, so a wrong secret (for any key id) misses and pays the full
    argon2 verification, as before. Its value is the stored hash the secret verified
    against: `known` answers True only while the row still holds that hash. Whether
    the key is revoked is not remembered at all: the caller reads the row on every
    request and checks it after this."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _digest(key_id: str, secret: str) -> bytes:
        return hashlib.sha256(f"{key_id}\0{secret}".encode()).digest()

    def known(self, record: ApiKeyRecord, secret: str) -> bool:
        """True when `secret` verified against `record`'s current hash before."""
        digest = self._digest(record.key_id, secret)
        with self._lock:
            verified_hash = self._entries.get(digest)
            if verified_hash is not None:
                self._entries.move_to_end(digest)
        # The hash compared in constant time, though it is not secret: a habit that costs nothing.
        return verified_hash is not None and hmac.compare_digest(verified_hash, record.secret_hash)

    def remember(self, record: ApiKeyRecord, secret: str) -> None:
        """Call only once argon2 has verified `secret` against `record.secret_hash`."""
        digest = self._digest(record.key_id, secret)
        with self._lock:
            self._entries[digest] = record.secret_hash
            self._entries.move_to_end(digest)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


class Authenticator:
    """Turns a presented key into an Identity, or refuses it."""

    def __init__(self, engine: Engine, *, verified: VerifiedKeys | None = None) -> None:
        self._engine = read_only(engine)
        # One statement: in autocommit on PostgreSQL (no ROLLBACK round trip after it);
        # SQLite's read-only BEGIN shares the file with writers.
        self._per_request = single_statement(engine) if engine.dialect.name == "postgresql" else self._engine
        self.verified = verified if verified is not None else VerifiedKeys()
        # What an unknown key id's secret is checked against: the same parameters, so
        # the same cost as a known id's wrong secret. No secret verifies against it.
        self._dummy_hash = _HASHER.hash(secrets.token_urlsafe(32))

    def identity(self, key_text: str) -> Identity:
        """The key's identity, or KeyRefused: argon2 only for a key id and secret this
        process has not verified against the row's current hash (decision 0227)."""
        key_id, secret = split_key(key_text)
        with self._per_request.connect() as conn:
            record = api_key_per_request(conn, key_id)
        if record is not None and self.verified.known(record, secret):
            return self._active(record)
        if record is None:
            try:
                _HASHER.verify(self._dummy_hash, secret)
            except (VerificationError, InvalidHashError):
                pass
            raise KeyRefused("unknown")
        self._verify(record, secret)
        return self._active(record)

    @staticmethod
    def _active(record: ApiKeyRecord) -> Identity:
        # Read from the row on every request, never remembered: a revocation committed
        # before this request's read refuses it, cached secret or not.
        if record.revoked:
            raise KeyRefused("revoked")
        return identity_of(record)

    def by_key_id(self, key_id: str) -> Identity:
        """The identity of a key already verified (a console session): still refused
        once revoked."""
        with self._engine.connect() as conn:
            record = api_key(conn, key_id)
        if record is None or record.revoked:
            raise KeyRefused("revoked" if record is not None else "unknown")
        return identity_of(record)

    def _verify(self, record: ApiKeyRecord, secret: str) -> None:
        try:
            _HASHER.verify(record.secret_hash, secret)  # constant time in the secret
        except (VerificationError, InvalidHashError):
            raise KeyRefused("wrong secret") from None
        self.verified.remember(record, secret)


def identity_of(record: ApiKeyRecord) -> Identity:
    return Identity(
        key_id=record.key_id, tenant=record.tenant, principal=record.principal,
        roles=record.roles, scopes=frozenset(KeyScope(s) for s in record.scopes if s in _SCOPE_NAMES),
        surface=record.surface,
    )
