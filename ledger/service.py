"""A small ledger service: the reference downstream for the demo, tests and users to copy.

It lives on the same database as toolfence but in its own tables, and is written
the way a downstream must be for each effect contract:

- `credit` dedupes on the idempotency key (effect `idempotent`);
- `transfer` keeps the highest fencing token per key and refuses lower ones in
  the same transaction as the effect (effect `fenced`); it also dedupes on the
  key, so a new generation that finds the effect already applied returns the
  existing receipt instead of applying it again; and it refuses to take an
  account below zero in that same transaction (`InsufficientFunds`), whatever
  a caller checked before: a downstream keeps its own invariants;
- `create_invoice` does neither but can answer "did operation K happen?" (`lookup`),
  and its answer stays true: asking closes the door on the attempt asked about
  (see `find_invoice`);
- `send_notice` promises nothing (`unsafe`);
- `send_notices` sends one notice per account of a batch, each a row, deduped on
  the key (`idempotent`), and holds the batch to the accounts it was approved for:
  one account outside that set (or of another tenant) refuses the whole batch in
  the effect's own transaction, so nothing is sent.

Every accepted effect is recorded in `ledger_effects` with operation id and
generation, and every refused stale write in `ledger_fenced`, so tests can count
side effects per operation from the downstream's own point of view.
"""

from __future__ import annotations

import functools
import os
import secrets
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Executable,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    any_,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from executor.core.tools import RetryableError, StaleFencingToken
from executor.store import driver
from executor.store.clock import db_now
from executor.store.engine import insert_ignore, make_engine, read_only
from executor.store.schema import Id

metadata = MetaData()

accounts = Table(
    "ledger_accounts",
    metadata,
    Column("account_id", String(64), primary_key=True),
    Column("tenant", String(64), nullable=False),
    Column("balance_cents", BigInteger, nullable=False),
)

effects = Table(
    "ledger_effects",
    metadata,
    Column("effect_id", Id, primary_key=True, autoincrement=True),
    Column("receipt", String(64), nullable=False),
    Column("operation_id", String(200), nullable=False),
    Column("idempotency_key", String(300), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("account_id", String(64)),
    Column("amount_cents", BigInteger),
    Column("at", Float, nullable=False),
)
# `toolfence check` reads a chunk of operations' effects, and the effects of a window.
Index("ix_ledger_effects_operation", effects.c.operation_id)
Index("ix_ledger_effects_at", effects.c.at)

# Dedupe tables: one row per key that ever produced an effect.
dedupe = Table(
    "ledger_dedupe",
    metadata,
    Column("kind", String(32), primary_key=True),
    Column("idempotency_key", String(300), primary_key=True),
    Column("receipt", String(64), nullable=False),
)

fences = Table(
    "ledger_fences",
    metadata,
    Column("idempotency_key", String(300), primary_key=True),
    Column("highest_token", Integer, nullable=False),
)

fenced_writes = Table(
    "ledger_fenced",
    metadata,
    Column("fenced_id", Id, primary_key=True, autoincrement=True),
    Column("operation_id", String(200), nullable=False),
    Column("idempotency_key", String(300), nullable=False),
    Column("token", Integer, nullable=False),
    Column("highest_token", Integer, nullable=False),
    Column("at", Float, nullable=False),
)
Index("ix_ledger_fenced_operation", fenced_writes.c.operation_id)
Index("ix_ledger_fenced_at", fenced_writes.c.at)

invoices = Table(
    "ledger_invoices",
    metadata,
    Column("invoice_id", String(64), primary_key=True),
    Column("reference", String(300), nullable=False),
    Column("account_id", String(64), nullable=False),
    Column("amount_cents", BigInteger, nullable=False),
    UniqueConstraint("invoice_id"),
)

notices = Table(
    "ledger_notices",
    metadata,
    Column("notice_id", String(64), primary_key=True),
    Column("account_id", String(64), nullable=False),
    Column("text", String(2000), nullable=False),
)


# One row per notice of a batch; an account gets at most one notice per batch.
batch_notices = Table(
    "ledger_batch_notices",
    metadata,
    Column("notice_id", String(64), primary_key=True),
    Column("batch_receipt", String(64), nullable=False),
    Column("operation_id", String(200), nullable=False),
    Column("account_id", String(64), nullable=False),
    Column("text", String(2000), nullable=False),
    UniqueConstraint("batch_receipt", "account_id"),
)


class AccountNotFound(LookupError):
    pass


class OutsideApprovedSet(PermissionError):
    """A batch named accounts outside the set it was approved for; nothing was sent."""

    def __init__(self, outside_count: int) -> None:
        super().__init__(f"{outside_count} account(s) outside the approved set")
        self.outside_count = outside_count


@dataclass(frozen=True)
class NoticeBatch:
    receipt: str
    applied: bool  # False when an earlier attempt with the same key had sent it
    account_ids: frozenset[str]  # the accounts the batch notified
class InsufficientFunds(Exception):
    """A debit would take the account below zero: refused in the effect's transaction."""


@dataclass(frozen=True)
class Applied:
    receipt: str
    applied: bool  # False when an earlier generation had already applied it


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


# The reads a tool's access rule and check make before every call, built once.
_ACCOUNT_TENANTS = select(accounts.c.account_id, accounts.c.tenant).where(
    accounts.c.account_id.in_(bindparam("account_ids", expanding=True))
)
# PostgreSQL's form, one array parameter: the driver-level path binds no expanding IN.
_ACCOUNT_TENANTS_ANY = select(accounts.c.account_id, accounts.c.tenant).where(
    accounts.c.account_id == any_(bindparam("account_ids", type_=ARRAY(accounts.c.account_id.type)))
)
_TENANT = select(accounts.c.tenant).where(accounts.c.account_id == bindparam("account_id"))
_BALANCE = select(accounts.c.balance_cents).where(accounts.c.account_id == bindparam("account_id"))


class _TransferStatements(NamedTuple):
    raise_fence: Executable
    record_fenced: Executable
    claim_receipt: Executable
    debit: Executable
    credit: Executable
    account: Executable
    record_effect: Executable
    existing_receipt: Executable


@functools.cache
def _transfer_statements(dialect: str) -> _TransferStatements:
    """`transfer`'s statements, built once per dialect over bound parameters (a
    statement built per call costs more of the client's CPU than it takes to run)."""
    upsert: Any = postgresql_insert if dialect == "postgresql" else sqlite_insert
    fence = upsert(fences).values(idempotency_key=bindparam("key"), highest_token=bindparam("given_token"))
    greatest = func.greatest if dialect == "postgresql" else func.max  # SQLite's max(a, b)
    return _TransferStatements(
        raise_fence=fence.on_conflict_do_update(
            index_elements=[fences.c.idempotency_key],
            set_={"highest_token": greatest(fences.c.highest_token, fence.excluded.highest_token)},
        ).returning(fences.c.highest_token),
        record_fenced=insert(fenced_writes).values(
            operation_id=bindparam("of_operation"), idempotency_key=bindparam("key"),
            token=bindparam("given_token"), highest_token=bindparam("highest_seen"), at=db_now(),
        ),
        claim_receipt=upsert(dedupe)
        .values(kind="transfer", idempotency_key=bindparam("key"), receipt=bindparam("new_receipt"))
        .on_conflict_do_nothing(index_elements=[dedupe.c.kind, dedupe.c.idempotency_key])
        .returning(dedupe.c.receipt),
        # Never below zero: the row lock serialises concurrent debits, and each re-reads
        # the balance it compares (PostgreSQL re-evaluates the WHERE on the latest row
        # version), so two debits that each fit but together do not cannot both pass.
        debit=update(accounts)
        .where(
            accounts.c.account_id == bindparam("of_account"),
            accounts.c.balance_cents >= bindparam("amount"),
        )
        .values(balance_cents=accounts.c.balance_cents - bindparam("amount")),
        credit=update(accounts)
        .where(accounts.c.account_id == bindparam("of_account"))
        .values(balance_cents=accounts.c.balance_cents + bindparam("amount")),
        account=select(accounts.c.account_id).where(accounts.c.account_id == bindparam("of_account")),
        record_effect=insert(effects).values(
            receipt=bindparam("new_receipt"), operation_id=bindparam("of_operation"),
            idempotency_key=bindparam("key"), generation=bindparam("of_generation"), kind="transfer",
            account_id=bindparam("of_account"), amount_cents=bindparam("amount"), at=db_now(),
        ),
        existing_receipt=select(dedupe.c.receipt).where(
            dedupe.c.kind == "transfer", dedupe.c.idempotency_key == bindparam("key")
        ),
    )


# The example's own knob (not a toolfence setting): a simulated downstream latency.
LATENCY_ENV = "TOOLFENCE_LEDGER_LATENCY_MS"


class Ledger:
    """The ledger's own client. One per process; the engine is created lazily."""

    def __init__(self, database_url: str | None = None, latency_seconds: float | None = None) -> None:
        self._url = database_url
        self._engine: Engine | None = None
        self._pid = os.getpid()
        env_latency = os.environ.get(LATENCY_ENV)
        self.latency_seconds = (
            latency_seconds
            if latency_seconds is not None
            else (float(env_latency) / 1000.0 if env_latency else 0.0)
        )

    @property
    def engine(self) -> Engine:
        if self._engine is None or self._pid != os.getpid():
            from executor.settings import Settings

            self._engine = make_engine(self._url or Settings.from_env().database_url)
            self._pid = os.getpid()
        return self._engine

    @property
    def reader(self) -> Engine:
        return read_only(self.engine)

    # The transfer and the reads its tool's hooks make on every call (the tenants of
    # the accounts, the balance) run on the pooled driver connection on PostgreSQL, as
    # the executor's own reservation and completion do (executor/store/driver.py):
    # the same statements, built once, without SQLAlchemy's per-statement execution
    # machinery. A read is one statement in autocommit (one round trip, its own
    # snapshot). SQLite keeps SQLAlchemy's `Connection`.

    @contextmanager
    def _writing(self) -> Iterator[Any]:
        engine = self.engine
        if driver.supported(engine):
            with driver.transaction(engine) as conn:
                yield conn
        else:
            with engine.begin() as conn:
                yield conn

    @contextmanager
    def _reading(self) -> Iterator[Any]:
        engine = self.engine
        if driver.supported(engine):
            with driver.autocommit(engine) as conn:
                yield conn
        else:
            with self.reader.connect() as conn:
                yield conn

    def create_schema(self) -> None:
        """The ledger is a separate service with its own schema; it creates it itself."""
        metadata.create_all(self.engine)

    def _pause(self) -> None:
        if self.latency_seconds:
            time.sleep(self.latency_seconds)

    # -------------------------------------------------------------- setup and reads

    def open_account(self, account_id: str, tenant: str, balance_cents: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                insert(accounts).values(
                    account_id=account_id, tenant=tenant, balance_cents=balance_cents
                )
            )

    def account_tenants(self, account_ids: Sequence[str]) -> dict[str, str]:
        """Tenant per account, for the accounts that exist (one query for a batch)."""
        with self._reading() as conn:
            statement = _ACCOUNT_TENANTS_ANY if conn.dialect.name == "postgresql" else _ACCOUNT_TENANTS
            rows = conn.execute(statement, {"account_ids": list(account_ids)}).all()
        return {row.account_id: row.tenant for row in rows}

    def notices_of_operation(self, operation_id: str) -> list[str]:
        """Accounts notified by an operation's batches, sorted (a duplicate shows twice)."""
        with self.reader.connect() as conn:
            return sorted(
                conn.execute(
                    select(batch_notices.c.account_id).where(
                        batch_notices.c.operation_id == operation_id
                    )
                ).scalars()
            )

    def account_tenant(self, account_id: str) -> str | None:
        with self._reading() as conn:
            tenant: str | None = conn.execute(_TENANT, {"account_id": account_id}).scalar_one_or_none()
        return tenant

    def balance(self, account_id: str) -> int:
        with self._reading() as conn:
            value = conn.execute(_BALANCE, {"account_id": account_id}).scalar_one_or_none()
        if value is None:
            raise AccountNotFound(account_id)
        return int(value)

    def effects_per_operation(self) -> dict[str, int]:
        """Distinct receipts per operation, from the ledger's own records."""
        with self.reader.connect() as conn:
            rows = conn.execute(
                select(effects.c.operation_id, func.count(func.distinct(effects.c.receipt)))
                .group_by(effects.c.operation_id)
            ).all()
        return {op: int(count) for op, count in rows}

    def effect_rows_per_operation(self) -> dict[str, int]:
        """Accepted effect rows per operation (a duplicate effect would show as 2)."""
        with self.reader.connect() as conn:
            rows = conn.execute(
                select(effects.c.operation_id, func.count()).group_by(effects.c.operation_id)
            ).all()
        return {op: int(count) for op, count in rows}

    def fenced_count(self) -> int:
        with self.reader.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(fenced_writes)).scalar_one())

    # -------------------------------------------------------------- effects

    def _record_effect(
        self, conn: object, *, receipt: str, operation_id: str, key: str, generation: int,
        kind: str, account_id: str | None, amount_cents: int | None,
    ) -> None:
        conn.execute(  # type: ignore[attr-defined]
            insert(effects).values(
                receipt=receipt, operation_id=operation_id, idempotency_key=key,
                generation=generation, kind=kind, account_id=account_id,
                amount_cents=amount_cents, at=db_now(),
            )
        )

    def _existing(self, conn: object, kind: str, key: str) -> str | None:
        return conn.execute(  # type: ignore[attr-defined,no-any-return]
            select(dedupe.c.receipt).where(dedupe.c.kind == kind, dedupe.c.idempotency_key == key)
        ).scalar_one_or_none()

    def _adjust(self, conn: object, account_id: str, delta: int) -> None:
        changed = conn.execute(  # type: ignore[attr-defined]
            update(accounts)
            .where(accounts.c.account_id == account_id)
            .values(balance_cents=accounts.c.balance_cents + delta)
        ).rowcount
        if changed != 1:
            raise AccountNotFound(account_id)

    def credit(
        self, *, key: str, operation_id: str, generation: int, account_id: str, amount_cents: int
    ) -> Applied:
        """Idempotent: the same key applies once, and returns the same receipt after."""
        self._pause()
        with self.engine.begin() as conn:
            receipt = _new_id("cr")
            if not insert_ignore(
                conn, dedupe, {"kind": "credit", "idempotency_key": key, "receipt": receipt},
                ["kind", "idempotency_key"],
            ):
                existing = self._existing(conn, "credit", key)
                assert existing is not None
                return Applied(existing, applied=False)
            self._adjust(conn, account_id, amount_cents)
            self._record_effect(
                conn, receipt=receipt, operation_id=operation_id, key=key, generation=generation,
                kind="credit", account_id=account_id, amount_cents=amount_cents,
            )
            return Applied(receipt, applied=True)

    def transfer(
        self, *, key: str, operation_id: str, token: int, source: str, target: str,
        amount_cents: int,
    ) -> Applied:
        """Fenced: refuses a token below the highest seen for the key, in the effect's tx.

        Five statements in the common case, each built once (`_transfer_statements`):
        raise the key's fence (and lock it), claim the key's receipt, debit, credit,
        record the effect."""
        self._pause()
        with self._writing() as conn:
            outcome = self._transfer_in(
                conn, key=key, operation_id=operation_id, token=token, source=source, target=target,
                amount_cents=amount_cents,
            )
        # A refusal is raised once its transaction has ended: committed with its record
        # (a stale token), or rolled back whole (a missing account, too little money).
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def _transfer_in(
        self, conn: Any, *, key: str, operation_id: str, token: int, source: str, target: str,
        amount_cents: int,
    ) -> Applied | StaleFencingToken | AccountNotFound | InsufficientFunds:
        built = _transfer_statements(conn.dialect.name)
        # The key's fence row, created at its first write, raised to this token if
        # that is higher, and locked either way (an upsert locks the row it writes):
        # every writer of the key serialises on that lock. The answer is the highest
        # token now; higher than ours means a newer generation wrote first.
        highest = conn.execute(built.raise_fence, {"key": key, "given_token": token}).scalar_one()
        if token < highest:
            conn.execute(
                built.record_fenced,
                {"of_operation": operation_id, "key": key, "given_token": token, "highest_seen": highest},
            )
            return StaleFencingToken(key, token, highest)  # the record commits with the block
        receipt = _new_id("tr")
        claimed = conn.execute(built.claim_receipt, {"key": key, "new_receipt": receipt}).first()
        if claimed is None:
            # An earlier generation applied it: its receipt, nothing applied again.
            existing = conn.execute(built.existing_receipt, {"key": key}).scalar_one_or_none()
            assert existing is not None
            return Applied(existing, applied=False)
        if conn.execute(built.debit, {"of_account": source, "amount": amount_cents}).rowcount != 1:
            missing = conn.execute(built.account, {"of_account": source}).first() is None
            conn.rollback()  # nothing of this transfer stays: the fence and the claim neither
            return AccountNotFound(source) if missing else InsufficientFunds(source)
        if conn.execute(built.credit, {"of_account": target, "amount": amount_cents}).rowcount != 1:
            conn.rollback()  # the debit with the rest
            return AccountNotFound(target)
        conn.execute(
            built.record_effect,
            {"new_receipt": receipt, "of_operation": operation_id, "key": key, "of_generation": token,
             "of_account": source, "amount": amount_cents},
        )
        return Applied(receipt, applied=True)

    def create_invoice(
        self, *, reference: str, operation_id: str, generation: int, account_id: str,
        amount_cents: int,
    ) -> str:
        """No dedupe: calling twice makes two invoices. `find_invoice` answers lookups.

        It refuses an attempt whose generation a lookup already answered for (or that
        a newer attempt overtook): without that, a paused owner's write landing after
        the reconciler heard "not done" and requeued would make a second invoice.
        """
        self._pause()
        with self.engine.begin() as conn:
            closed_below = self._lock_reference(conn, reference, generation)
            if generation < closed_below:
                conn.execute(
                    insert(fenced_writes).values(
                        operation_id=operation_id, idempotency_key=reference, token=generation,
                        highest_token=closed_below, at=db_now(),
                    )
                )
                conn.commit()  # keep the record of the refusal, then tell the caller
                raise StaleFencingToken(reference, generation, closed_below)
            if generation > closed_below:
                conn.execute(
                    update(fences).where(fences.c.idempotency_key == reference)
                    .values(highest_token=generation)
                )
            if conn.execute(
                select(accounts.c.account_id).where(accounts.c.account_id == account_id)
            ).first() is None:
                raise AccountNotFound(account_id)
            invoice_id = _new_id("inv")
            conn.execute(
                insert(invoices).values(
                    invoice_id=invoice_id, reference=reference, account_id=account_id,
                    amount_cents=amount_cents,
                )
            )
            self._record_effect(
                conn, receipt=invoice_id, operation_id=operation_id, key=reference,
                generation=generation, kind="invoice", account_id=account_id,
                amount_cents=amount_cents,
            )
            return invoice_id

    def _lock_reference(self, conn: Any, reference: str, generation: int) -> int:
        """Lock the reference's fence row (created at `generation` if new); its token.

        Every invoice write and every fencing lookup of one reference serialise on
        this row, so a lookup either sees the invoice or shuts its writer out.
        """
        insert_ignore(conn, fences, {"idempotency_key": reference, "highest_token": generation},
                      ["idempotency_key"])
        return int(
            conn.execute(
                select(fences.c.highest_token)
                .where(fences.c.idempotency_key == reference)
                .with_for_update()
            ).scalar_one()
        )

    def find_invoice(self, reference: str, fencing_token: int | None = None) -> str | None:
        """The invoice made for `reference`, if any.

        With `fencing_token` (the generation whose outcome is asked about), the answer
        is made final: the reference is closed to that generation and older ones, in
        the same transaction as the read, so a write of theirs still in flight (a
        paused worker, a partitioned one) is refused instead of landing after a "not
        done" and duplicating the invoice. The next attempt has a higher generation.
        """
        query = (
            select(invoices.c.invoice_id)
            .where(invoices.c.reference == reference)
            .order_by(invoices.c.invoice_id)
            .limit(1)
        )
        try:
            if fencing_token is None:
                with self.reader.connect() as conn:
                    return conn.execute(query).scalar_one_or_none()
            with self.engine.begin() as conn:
                closed_below = self._lock_reference(conn, reference, fencing_token + 1)
                if closed_below <= fencing_token:
                    conn.execute(
                        update(fences).where(fences.c.idempotency_key == reference)
                        .values(highest_token=fencing_token + 1)
                    )
                return conn.execute(query).scalar_one_or_none()
        except Exception as exc:  # the downstream could not answer
            raise RetryableError("ledger unavailable for lookup") from exc

    def send_notice(
        self, *, operation_id: str, generation: int, account_id: str, text: str
    ) -> str:
        """Unsafe: no key, no fence, no lookup."""
        self._pause()
        with self.engine.begin() as conn:
            notice_id = _new_id("ntc")
            conn.execute(
                insert(notices).values(notice_id=notice_id, account_id=account_id, text=text)
            )
            self._record_effect(
                conn, receipt=notice_id, operation_id=operation_id, key=notice_id,
                generation=generation, kind="notice", account_id=account_id, amount_cents=None,
            )
            return notice_id

    def send_notices(
        self, *, key: str, operation_id: str, generation: int, tenant: str,
        account_ids: Sequence[str], text: str, approved_accounts: frozenset[str] | None,
    ) -> NoticeBatch:
        """Idempotent batch: one notice row per account, applied once per key.

        In the same transaction as the effect it refuses the whole batch when one
        account is outside `approved_accounts` (`OutsideApprovedSet`) or is not
        `tenant`'s (`AccountNotFound`): a batch is all or nothing, so a refusal
        leaves nothing sent and nothing to reconcile. `approved_accounts=None` is a
        caller that holds no approved set: only the tenant is checked.
        """
        self._pause()
        wanted = list(dict.fromkeys(account_ids))
        with self.engine.begin() as conn:
            receipt = _new_id("nb")
            # The dedupe row first: every writer of the key serialises on it.
            if not insert_ignore(
                conn, dedupe, {"kind": "notices", "idempotency_key": key, "receipt": receipt},
                ["kind", "idempotency_key"],
            ):
                existing = self._existing(conn, "notices", key)
                assert existing is not None
                sent = conn.execute(
                    select(batch_notices.c.account_id).where(
                        batch_notices.c.batch_receipt == existing
                    )
                ).scalars()
                return NoticeBatch(existing, applied=False, account_ids=frozenset(sent))
            if approved_accounts is not None:
                outside = [a for a in wanted if a not in approved_accounts]
                if outside:
                    raise OutsideApprovedSet(len(outside))  # rolls the dedupe row back too
            owners = dict(
                conn.execute(
                    select(accounts.c.account_id, accounts.c.tenant).where(
                        accounts.c.account_id.in_(wanted)
                    )
                ).all()
            )
            foreign = [a for a in wanted if owners.get(a) != tenant]
            if foreign:
                raise AccountNotFound(foreign[0])
            for account_id in wanted:
                conn.execute(
                    insert(batch_notices).values(
                        notice_id=_new_id("ntc"), batch_receipt=receipt,
                        operation_id=operation_id, account_id=account_id, text=text,
                    )
                )
            self._record_effect(
                conn, receipt=receipt, operation_id=operation_id, key=key,
                generation=generation, kind="notices", account_id=None, amount_cents=None,
            )
            return NoticeBatch(receipt, applied=True, account_ids=frozenset(wanted))


    def invoice_accounts(self, invoice_ids: Sequence[str]) -> dict[str, str]:
        """The account of each invoice that exists (one query for a batch)."""
        with self.reader.connect() as conn:
            rows = conn.execute(
                select(invoices.c.invoice_id, invoices.c.account_id).where(
                    invoices.c.invoice_id.in_(list(invoice_ids))
                )
            ).all()
        return {invoice_id: account_id for invoice_id, account_id in rows}

    def delete_invoices(
        self, *, key: str, operation_id: str, generation: int, invoice_ids: Sequence[str]
    ) -> Applied:
        """Delete a batch of invoices, deduplicated on the key (effect `idempotent`): one
        `delete_invoice` effect per invoice deleted, in the deletion's transaction."""
        self._pause()
        with self.engine.begin() as conn:
            receipt = _new_id("del")
            if not insert_ignore(
                conn, dedupe, {"kind": "delete_invoices", "idempotency_key": key, "receipt": receipt},
                ["kind", "idempotency_key"],
            ):
                existing = self._existing(conn, "delete_invoices", key)
                assert existing is not None
                return Applied(existing, applied=False)
            deleted = conn.execute(
                invoices.delete().where(invoices.c.invoice_id.in_(list(invoice_ids)))
                .returning(invoices.c.account_id)
            ).all()
            for (account_id,) in deleted:
                self._record_effect(
                    conn, receipt=receipt, operation_id=operation_id, key=key, generation=generation,
                    kind="delete_invoice", account_id=account_id, amount_cents=None,
                )
            return Applied(receipt, applied=True)


_default: Ledger | None = None


def default_ledger() -> Ledger:
    global _default
    if _default is None or _default._pid != os.getpid():
        _default = Ledger()
    return _default
