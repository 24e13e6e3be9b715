"""The per-process cache of verified keys (executor/http/keys.py, decision 0227), on
a real database: a key verified once costs no argon2 on its next request, a wrong
secret never finds the cache, a revoked key or a changed hash defeats it on the
next request, and it holds at most its capacity."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, update

from executor.http import keys
from executor.http.keys import Authenticator, KeyRefused, KeyScope, VerifiedKeys, create_key
from executor.store.api_keys import revoke_api_key
from executor.store.schema import api_keys


class CountingHasher:
    """The real hasher, counting its verifications."""

    def __init__(self, hasher: Any) -> None:
        self.hasher = hasher
        self.verified = 0

    def verify(self, hashed: str, secret: str) -> bool:
        self.verified += 1
        return bool(self.hasher.verify(hashed, secret))

    def hash(self, secret: str) -> str:
        return str(self.hasher.hash(secret))


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    """SQLite only (the cache is the same on both): conftest's `engine` is made of it."""
    return sqlite_url


@pytest.fixture
def hasher(monkeypatch: pytest.MonkeyPatch) -> CountingHasher:
    counting = CountingHasher(keys._HASHER)
    monkeypatch.setattr(keys, "_HASHER", counting)
    return counting


def new_key(engine: Engine) -> str:
    with engine.begin() as conn:
        return create_key(conn, tenant="acme", principal="alice", roles=["member"], scopes=[KeyScope.PRODUCE])


def test_verified_key__second_request__no_argon2(engine: Engine, hasher: CountingHasher) -> None:
    authenticator = Authenticator(engine)
    key = new_key(engine)
    # When the same key is presented twice
    first = authenticator.identity(key)
    second = authenticator.identity(key)
    # Then argon2 ran once
    assert first == second and first.tenant == "acme"
    assert hasher.verified == 1


def test_wrong_secret__after_the_right_one_was_cached__still_costs_argon2_and_is_refused(
    engine: Engine, hasher: CountingHasher
) -> None:
    authenticator = Authenticator(engine)
    key = new_key(engine)
    authenticator.identity(key)
    wrong = key[:-4] + ("aaaa" if not key.endswith("aaaa") else "bbbb")
    for _ in range(3):
        with pytest.raises(KeyRefused) as refused:
            authenticator.identity(wrong)
        assert refused.value.reason == "wrong secret"
    # Each wrong guess paid a verification; none entered the cache
    assert hasher.verified == 4
    assert len(authenticator.verified) == 1


def test_revoked_after_caching__refused_on_the_next_request(engine: Engine, hasher: CountingHasher) -> None:
    authenticator = Authenticator(engine)
    key = new_key(engine)
    authenticator.identity(key)
    with engine.begin() as conn:
        assert revoke_api_key(conn, key.split("_")[1])
    with pytest.raises(KeyRefused) as refused:
        authenticator.identity(key)
    assert refused.value.reason == "revoked"


def test_hash_changed_under_the_same_key_id__verified_again(engine: Engine, hasher: CountingHasher) -> None:
    authenticator = Authenticator(engine)
    key = new_key(engine)
    key_id, secret = keys.split_key(key)
    authenticator.identity(key)
    # When the row's hash is replaced (a re-issued secret under the same id)
    with engine.begin() as conn:
        conn.execute(update(api_keys).where(api_keys.c.key_id == key_id).values(
            secret_hash=keys._HASHER.hash("another secret")
        ))
    # Then the cached secret no longer passes: argon2 runs again, against the new hash
    with pytest.raises(KeyRefused):
        authenticator.identity(key)
    assert hasher.verified == 2


def test_capacity__least_recently_used_dropped(engine: Engine, hasher: CountingHasher) -> None:
    authenticator = Authenticator(engine, verified=VerifiedKeys(capacity=2))
    first, second, third = new_key(engine), new_key(engine), new_key(engine)
    for key in (first, second, first, third):  # `second` is the least recently used
        authenticator.identity(key)
    assert len(authenticator.verified) == 2 and hasher.verified == 3
    authenticator.identity(first)
    assert hasher.verified == 3  # still cached
    authenticator.identity(second)
    assert hasher.verified == 4  # dropped, verified again


def test_unknown_key_id__dummy_hash_verified(engine: Engine, hasher: CountingHasher) -> None:
    authenticator = Authenticator(engine)
    with pytest.raises(KeyRefused) as refused:
        authenticator.identity("tfk_0123456789abcdef_" + "x" * 43)
    assert refused.value.reason == "unknown" and hasher.verified == 1
