"""What recomputing each card's impact costs `GET /v1/approvals` (decision 0222).

For each number of pending approvals it creates a scratch PostgreSQL database,
migrates it, opens the reference ledger in it, and enqueues that many transfers
from one account (each above the approval threshold, so each waits for a person
and each card's related operations are all the others). It then times
`Service.approvals` as the console and the API call it (every impact recomputed
by the ledger's hook, its digest, the related operations) against the same read
with the stored impact and no related operations (what it did before), and prints
the ratio. Both sides build the same response models.

    .venv/bin/python bench/approvals_cost.py                 # 10 and 50 cards
    .venv/bin/python bench/approvals_cost.py --cards 200 --repeat 10
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from executor.core.types import ProposedCall, ServerContext
from executor.http import cards
from executor.http.keys import Identity, KeyScope
from executor.http.service import Service
from executor.settings import Settings
from executor.store.engine import make_engine
from executor.store.migrate import migrate
from ledger import service as ledger_service
from ledger import tools as ledger_tools
from ledger.service import Ledger
from outbox.producer import enqueue


def _url(admin_dsn: str, dbname: str) -> str:
    base = admin_dsn.rsplit("/", 1)[0]
    return f"{base}/{dbname}".replace("postgresql://", "postgresql+psycopg://", 1)


def prepare(admin_dsn: str, count: int) -> str:
    dbname = f"toolfence_bench_approvals_{count}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{dbname}"')
    url = _url(admin_dsn, dbname)
    migrate(url)
    book = Ledger(url)
    book.create_schema()
    book.open_account("acme-1", "acme", 1_000_000_000)
    book.open_account("acme-2", "acme", 0)
    ledger_service._default = book  # the tools' hooks read this ledger (default_ledger())
    engine = make_engine(url)
    context = ServerContext(principal="alice", tenant="acme", roles=frozenset({"member"}), request_id="bench")
    with engine.begin() as conn:
        for index in range(count):
            call = ProposedCall(
                call_id=f"t{index}", tool_name="ledger.transfer",
                arguments=json.dumps(
                    {"source_account": "acme-1", "target_account": "acme-2", "amount_cents": 60_000 + index}
                ),
            )
            enqueue(conn, [call], context.model_copy(update={"request_id": f"bench-{index}"}),
                    ledger_tools.registry)
    engine.dispose()
    return url


def timed(function: object, repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()  # type: ignore[operator]
        samples.append(time.perf_counter() - started)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--cards", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    who = Identity(key_id="bench", tenant="acme", principal="carol", roles=frozenset({"approver"}),
                   scopes=frozenset({KeyScope.APPROVE}))
    print("| cards | recomputed p50 ms | stored p50 ms | ratio |")
    print("|---|---|---|---|")
    for count in args.cards:
        url = prepare(args.dsn, count)
        engine = make_engine(url)
        service = Service(Settings(database_url=url, broker_url="memory://"), engine, ledger_tools.registry)
        read = functools.partial(service.approvals, who)
        assert len(read()) == count
        now = statistics.median(timed(read, args.repeat))
        recompute, related = cards.card_impact, cards.related_operations
        cards.card_impact = lambda registry, a: (a.impact, "0" * 32)  # type: ignore[assignment]
        cards.related_operations = lambda conn, registry, tenant, cs: {}  # type: ignore[assignment]
        try:
            stored = statistics.median(timed(read, args.repeat))
        finally:
            cards.card_impact, cards.related_operations = recompute, related
        engine.dispose()
        print(f"| {count} | {now * 1000:.1f} | {stored * 1000:.1f} | {now / stored:.2f} |", flush=True)
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "toolfence_bench_approvals_{count}" WITH (FORCE)')


if __name__ == "__main__":
    main()
