"""A fault-injection campaign against a real fleet, end to end.

One run: a private PostgreSQL cluster and a private Redis (so restarting them
disturbs nobody else), the proxy on the workers' path to both, a fleet of
relays, workers and a reconciler (`executor.cli.fleet`), the reference ledger, the
workload's clients, and the nemesis. Then:

1. chaos window: clients enqueue and await results while the nemesis fires;
2. faults stop (every fault healed at once) and clients stop submitting; the
   quiet clock starts;
3. quiet: every admitted operation terminal or `reconciliation_pending` — it
   must happen within 2 × lease + one reconciler period;
4. the database is dumped into the history and the checker judges it.

`python -m tests.chaos.campaign --minutes 30 --report bench/CHAOS.md` runs the
long campaign; `tests/chaos/test_campaign.py` runs the CI-sized one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import select, text

from executor.cli.fleet import Fleet
from executor.core.states import SETTLED
from executor.store.engine import make_engine
from executor.store.migrate import migrate
from executor.store.schema import audit_events, calls, operations, receipts
from ledger import service as ledger_service
from ledger.service import Ledger
from ledger.service import effects as ledger_effects
from ledger.service import fenced_writes as ledger_fenced
from ledger.tools import registry
from outbox.results import results
from tests.chaos import checker
from tests.chaos.history import History
from tests.chaos.nemesis import (
    AMBIGUOUS_KINDS,
    KILL_KINDS,
    NET_KINDS,
    PAUSE_KINDS,
    TERMINATE_KINDS,
    Nemesis,
    Setup,
)
from tests.chaos.proxy import ProxyControl
from tests.chaos.services import PrivatePostgres, PrivateRedis
from tests.chaos.workload import OPENING_BALANCE_CENTS, Workload, make_tenants

DATABASE = "chaos"
SETTLED_VALUES = tuple(s.value for s in SETTLED)


@dataclass
class CampaignConfig:
    chaos_seconds: float
    targets: dict[str, int]
    run_dir: Path
    lease_seconds: float = 2.0
    reconcile_every: float = 1.0
    workers: int = 3
    concurrency: int = 2
    relays: int = 2
    clients: int = 6
    ledger_latency_ms: int = 20
    seed: int = 1
    # The chaos window lasts `chaos_seconds`, and longer (faults still firing, up to
    # `max_chaos_seconds`) while fewer than `min_operations` were admitted: a
    # loaded machine gets more time rather than a failed run.
    max_chaos_seconds: float | None = None
    # Wall-clock budget of the whole run: the chaos window never extends past the
    # point where quiet, checking and teardown would no longer fit in it.
    max_total_seconds: float | None = None
    # The run fails unless these are met.
    min_operations: int = 1000
    min_group: dict[str, int] = field(default_factory=dict)
    # Past the I2 bound, how long to keep watching (for the report) before giving up.
    settle_grace_seconds: float = 60.0
    label: str = "campaign"

    @property
    def quiet_bound_seconds(self) -> float:
        return 2 * self.lease_seconds + self.reconcile_every


def ci_config(run_dir: Path, seed: int = 1) -> CampaignConfig:
    """Fits in about three and a half minutes on a 2-CPU machine; CI runs it in `make test`."""
    targets = {
        "kill_child": 12, "kill_node": 4, "kill_after_effect": 8, "kill_before_complete": 8,
        "pause": 8, "ambiguous_reserve": 8, "ambiguous_complete": 8,
        **{kind: 3 for kind in TERMINATE_KINDS},
        "pg_restart": 2, "redis_restart_off": 2, "redis_restart_aof": 2,
        "relay_kill_after_publish": 3,
        **{kind: 1 for kind in NET_KINDS},
    }
    return CampaignConfig(
        chaos_seconds=150, max_chaos_seconds=230, max_total_seconds=285, targets=targets,
        run_dir=run_dir, seed=seed,
        concurrency=3, clients=16, min_operations=1000, min_group={"faults 1-3": 50},
        settle_grace_seconds=20.0, label="ci",
    )


def long_config(run_dir: Path, minutes: float, seed: int = 1) -> CampaignConfig:
    scale = minutes / 30.0
    per = {
        "kill_child": 300, "kill_node": 60, "kill_after_effect": 90, "kill_before_complete": 90,
        "pause": 240, "ambiguous_reserve": 120, "ambiguous_complete": 120,
        **{kind: 40 for kind in TERMINATE_KINDS},
        "pg_restart": 12, "redis_restart_off": 8, "redis_restart_aof": 8,
        "relay_kill_after_publish": 40,
        **{kind: 4 for kind in NET_KINDS},
    }
    targets = {kind: max(1, round(n * scale)) for kind, n in per.items()}
    return CampaignConfig(
        chaos_seconds=minutes * 60, max_chaos_seconds=minutes * 60 * 1.1, targets=targets,
        run_dir=run_dir, seed=seed, concurrency=3, clients=20,
        min_operations=round(10_000 * scale),
        min_group={"kills (1)": round(500 * scale), "zombie pauses (2)": round(200 * scale),
                   "faults 1-3": round(50 * scale)},
        settle_grace_seconds=120.0, label=f"long-{minutes:g}min",
    )


# ---------------------------------------------------------------------- machine


def machine_info(pg_dsn: str | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "loadavg": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    try:
        info["redis"] = subprocess.run(["redis-server", "--version"], capture_output=True, text=True,
                                       check=False).stdout.strip()
    except OSError:
        pass
    if pg_dsn:
        try:
            with psycopg.connect(pg_dsn) as conn:
                row = conn.execute("SHOW server_version").fetchone()
                info["postgresql"] = row[0] if row else None
        except psycopg.Error:
            pass
    import celery
    import kombu
    import sqlalchemy

    info |= {"celery": celery.__version__, "kombu": kombu.__version__,
             "sqlalchemy": sqlalchemy.__version__, "psycopg": psycopg.__version__}
    return info


# ---------------------------------------------------------------------- the run


class Campaign:
    def __init__(self, config: CampaignConfig) -> None:
        self.config = config
        self.run_dir = config.run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.postgres: PrivatePostgres | None = None
        self.redis: PrivateRedis | None = None
        self.proxy: ProxyControl | None = None
        self.fleet: Fleet | None = None
        self._saved_env: dict[str, str | None] = {}

    def log(self, message: str) -> None:
        line = f"[chaos {time.strftime('%H:%M:%S')}] {message}"
        print(line, flush=True)
        with (self.run_dir / "campaign.log").open("a") as handle:
            handle.write(line + "\n")

    def run(self) -> dict[str, Any]:
        began = time.monotonic()
        try:
            return self._run(began)
        finally:
            self._teardown()

    def _run(self, began: float) -> dict[str, Any]:
        cfg = self.config
        self.log(f"run dir {self.run_dir}")
        pg, redis, direct = self._start_services(began)
        fleet = self.fleet
        assert fleet is not None
        tenants = make_tenants()  # the accounts _start_services opened
        # The producer runs in this process: admission's access rules and business
        # checks read the ledger through its default client, which reads the URL here.
        producer_url = pg.url(DATABASE, application_name="toolfence-producer")
        self._set_env("TOOLFENCE_DATABASE_URL", producer_url)
        ledger_service._default = None
        engine = make_engine(producer_url, pool_size=cfg.clients + 2, max_overflow=4)

        history = History(self.run_dir / "history.jsonl")
        history.add("config", **{k: (str(v) if isinstance(v, Path) else v)
                                 for k, v in asdict(cfg).items()})
        workload = Workload(engine, registry, history, tenants, clients=cfg.clients, seed=cfg.seed)
        setup = Setup(fleet, pg, redis, self.proxy, DATABASE, cfg.lease_seconds, cfg.reconcile_every,
                      self.run_dir)
        nemesis = self._make_nemesis(setup, history)
        workload.start()
        nemesis.start()
        chaos_began = time.monotonic()
        self._progress(nemesis, workload, chaos_began, began)
        workload.stop(abandon=True)
        stopping = time.monotonic()
        stopped_at = nemesis.stop()
        self.log(f"faults stopped after {stopped_at - chaos_began:.1f}s of chaos "
                 f"(healing took {stopped_at - stopping:.1f}s)")
        quiet = self._await_quiet(direct, stopped_at)
        history.add("quiet", **quiet)
        self.log(f"quiet: {quiet}")
        workload.join()
        nemesis.stop_supervisor()
        self._dump(direct, engine, history)
        history.close()
        engine.dispose()

        report = checker.check(self.run_dir / "history.jsonl")
        report["nemesis"] = nemesis.summary()
        report["workload"] = {
            "requests": workload.requests, "calls": workload.calls, "admitted": workload.admitted,
            "ambiguous_enqueues": workload.ambiguous_enqueues, "enqueue_errors": workload.enqueue_errors,
        }
        report["config"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
        report["machine"] = machine_info(pg.admin_dsn)
        report["seconds"] = {
            "total": round(time.monotonic() - began, 1),
            "chaos": round(stopped_at - chaos_began, 1),
            "quiet": quiet.get("quiet_seconds"),
        }
        report["throughput_ops_per_second"] = round(
            report["counts"]["operations"] / max(1.0, stopped_at - chaos_began), 1
        )
        report["requirements"] = self._requirements(report, nemesis)
        report["passed"] = report["ok"] and all(r["ok"] for r in report["requirements"].values())
        (self.run_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
        self.log(f"report: {self.run_dir / 'report.json'} passed={report['passed']}")
        return report

    def _start_services(self, began: float) -> tuple[PrivatePostgres, PrivateRedis, str]:
        """PostgreSQL, Redis, the proxy and the fleet; returns the harness's database URL."""
        cfg = self.config
        self.postgres = pg = PrivatePostgres().start()
        direct = self._prepare_database(pg)
        self.redis = redis = PrivateRedis().start(aof=True)
        self.proxy = proxy = ProxyControl(
            {"pg": ("127.0.0.1", pg.port), "redis": ("127.0.0.1", redis.port)},
            log_path=self.run_dir / "proxy.log",
        )
        self.log(f"postgres :{pg.port}, redis :{redis.port}, proxy {proxy.ports}")
        common = self._common_env()
        role_env = {
            "worker": {
                "TOOLFENCE_DATABASE_URL": pg.url(DATABASE, port=proxy.ports["pg"],
                                                 application_name="toolfence-worker"),
                "TOOLFENCE_BROKER_URL": f"redis://127.0.0.1:{proxy.ports['redis']}/0",
                "TOOLFENCE_FAULT_POINTS_FILE": str(self.run_dir / "fault-points-worker.spec"),
            },
            "relay": {
                "TOOLFENCE_DATABASE_URL": pg.url(DATABASE, application_name="toolfence-relay"),
                "TOOLFENCE_BROKER_URL": redis.url,
                "TOOLFENCE_FAULT_POINTS_FILE": str(self.run_dir / "fault-points-relay.spec"),
            },
            "reconciler": {
                "TOOLFENCE_DATABASE_URL": pg.url(DATABASE, application_name="toolfence-reconciler"),
                "TOOLFENCE_BROKER_URL": redis.url,
            },
        }
        self.fleet = fleet = Fleet(
            env=common, log_dir=self.run_dir / "logs", workers=cfg.workers, concurrency=cfg.concurrency,
            reconcile_every=cfg.reconcile_every, relays=cfg.relays, role_env=role_env,
        )
        fleet.start(wait_ready=90)
        self.log(f"fleet up: {cfg.relays} relays, {cfg.workers}x{cfg.concurrency} workers, reconciler "
                 f"(setup {time.monotonic() - began:.1f}s)")
        return pg, redis, direct

    def _prepare_database(self, pg: PrivatePostgres) -> str:
        """The campaign's database, migrated, with the ledger's accounts; its harness URL."""
        pg.create_database(DATABASE)
        direct = pg.url(DATABASE)
        migrate(direct)
        book = Ledger(direct)
        book.create_schema()
        for tenant in make_tenants():
            for account in tenant.accounts:
                book.open_account(account, tenant.name, OPENING_BALANCE_CENTS)
        book.engine.dispose()
        return direct

    def _common_env(self) -> dict[str, str]:
        cfg = self.config
        return {
            "TOOLFENCE_QUEUE": f"tf-chaos-{uuid.uuid4().hex[:8]}",
            "TOOLFENCE_LEASE_SECONDS": str(cfg.lease_seconds),
            "TOOLFENCE_RELAY_POLL_SECONDS": "0.05",
            "TOOLFENCE_RECONCILE_QUEUED_AFTER_SECONDS": str(cfg.lease_seconds),
            "TOOLFENCE_HOME": str(self.run_dir / "home"),
            "TOOLFENCE_TOOLS": "ledger.tools:registry",
            "TOOLFENCE_LEDGER_LATENCY_MS": str(cfg.ledger_latency_ms),
            "TOOLFENCE_FAULT_LOG": str(self.run_dir / "fault-points.log"),
            "TOOLFENCE_FAULT_POINTS": "",
        }

    def _make_nemesis(self, setup: Setup, history: History) -> Nemesis:
        cfg = self.config
        return Nemesis(setup, history, chaos_seconds=cfg.chaos_seconds, targets=cfg.targets,
                       seed=cfg.seed, workers=cfg.workers, relays=cfg.relays)

    def _requirements(self, report: dict[str, Any], nemesis: Nemesis) -> dict[str, dict[str, Any]]:
        fired = nemesis.summary()["fired"]
        groups = dict(report["fault_groups"])
        groups["faults 1-3"] = sum(groups.values())
        requirements: dict[str, dict[str, Any]] = {
            "operations": {"asked": self.config.min_operations, "got": report["counts"]["operations"]},
        }
        for name, asked in self.config.min_group.items():
            requirements[name] = {"asked": asked, "got": groups.get(name, 0)}
        for kind, asked in self.config.targets.items():
            requirements[kind] = {"asked": asked, "got": fired.get(kind, 0)}
        for requirement in requirements.values():
            requirement["ok"] = requirement["got"] >= requirement["asked"]
        requirements["no harness errors"] = {"asked": 0, "got": len(nemesis.errors),
                                             "ok": not nemesis.errors}
        return requirements

    def _progress(self, nemesis: Nemesis, workload: Workload, began: float, run_began: float) -> None:
        cfg = self.config
        end = began + cfg.chaos_seconds
        hard_end = began + max(cfg.chaos_seconds, cfg.max_chaos_seconds or 0.0)
        if cfg.max_total_seconds:
            # Keep room for the quiet wait (bound), the dump, the check and teardown.
            reserve = cfg.quiet_bound_seconds + 40.0
            hard_end = max(end, min(hard_end, run_began + cfg.max_total_seconds - reserve))
        last_log = began
        while True:
            now = time.monotonic()
            if now >= hard_end or (now >= end and workload.admitted >= cfg.min_operations):
                return
            time.sleep(1.0)
            if time.monotonic() - last_log < 30.0:
                continue
            last_log = time.monotonic()
            fired = nemesis.counts.fired
            self.log(
                f"t+{time.monotonic() - began:5.0f}s requests {workload.requests} admitted "
                f"{workload.admitted} | kills {sum(fired[k] for k in KILL_KINDS)} pauses "
                f"{sum(fired[k] for k in PAUSE_KINDS)} ambiguous {sum(fired[k] for k in AMBIGUOUS_KINDS)}"
                f" | pg restarts {fired['pg_restart']} redis {fired['redis_restart_off']}"
                f"+{fired['redis_restart_aof']}"
            )

    def _await_quiet(self, url: str, stopped_at: float) -> dict[str, Any]:
        """Poll until every operation is settled; note how many were not at the bound."""
        bound = self.config.quiet_bound_seconds
        engine = make_engine(url)
        unsettled_at_bound: int | None = None
        last: list[Any] = []
        try:
            while True:
                elapsed = time.monotonic() - stopped_at
                try:
                    with engine.connect() as conn:
                        last = list(conn.execute(
                            select(operations.c.operation_id, operations.c.tool_name, operations.c.state)
                            .where(operations.c.state.not_in(SETTLED_VALUES))
                        ))
                except Exception:
                    last = [("?", "?", "database unreachable")]
                if elapsed >= bound and unsettled_at_bound is None:
                    unsettled_at_bound = len(last)
                if not last:
                    return {"quiet_seconds": round(elapsed, 2), "bound_seconds": bound,
                            "unsettled_at_bound": unsettled_at_bound or 0}
                if elapsed > bound + self.config.settle_grace_seconds:
                    return {"quiet_seconds": None, "bound_seconds": bound,
                            "unsettled_at_bound": unsettled_at_bound,
                            "still_unsettled": [list(map(str, r)) for r in last[:20]],
                            "still_unsettled_count": len(last)}
                time.sleep(0.1)
        finally:
            engine.dispose()

    def _dump(self, url: str, producer_engine: Any, history: History) -> None:
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                history.add_many("db.operations", [dict(r._mapping) for r in conn.execute(select(
                    operations.c.operation_id, operations.c.request_id, operations.c.call_id,
                    operations.c.tool_name, operations.c.mode, operations.c.state,
                    operations.c.generation, operations.c.receipt, operations.c.error_code,
                    operations.c.error, operations.c.attempts,
                ))])
                history.add_many("db.audit", [dict(r._mapping) for r in conn.execute(
                    select(audit_events.c.event_id, audit_events.c.operation_id, audit_events.c.from_state,
                           audit_events.c.to_state, audit_events.c.decision_code,
                           audit_events.c.generation, audit_events.c.actor, audit_events.c.at)
                )])
                history.add_many("db.receipts", [dict(r._mapping) for r in conn.execute(select(receipts))])
                history.add_many("db.effects", [
                    {**{k: v for k, v in r._mapping.items() if k != "kind"}, "effect_kind": r.kind}
                    for r in conn.execute(select(ledger_effects))
                ])
                history.add_many("db.fenced", [dict(r._mapping) for r in conn.execute(select(ledger_fenced))])
                call_rows = [dict(r._mapping) for r in conn.execute(
                    select(calls.c.tenant, calls.c.request_id, calls.c.call_id, calls.c.position,
                           calls.c.tool_name, calls.c.operation_id, calls.c.gate,
                           calls.c.reused_from_call_id)
                )]
                history.add_many("db.calls", call_rows)
                request_ids = sorted({(r["tenant"], r["request_id"]) for r in call_rows})
                finals = []
                for tenant, request_id in request_ids:
                    for status in results(conn, tenant, request_id):
                        final: dict[str, Any] = {
                            "request_id": request_id, "call_id": status.call_id,
                            "tool_name": status.tool_name, "status": status.status,
                        }
                        if status.status == "pending":
                            final["state"] = status.state
                        finals.append(final)
                history.add_many("db.final_results", finals)
                conn.execute(text("SELECT 1"))
        finally:
            engine.dispose()

    def _set_env(self, key: str, value: str) -> None:
        self._saved_env.setdefault(key, os.environ.get(key))
        os.environ[key] = value

    def _teardown(self) -> None:
        if self.fleet is not None:
            try:
                self.fleet.stop(timeout=10)  # continues paused processes before SIGTERM
            except Exception as exc:
                self.log(f"fleet stop: {exc!r}")
        if self.proxy is not None:
            self.proxy.close()
        if self.redis is not None:
            self.redis.destroy()
        if self.postgres is not None:
            (self.run_dir / "postgres.log").write_bytes(
                self.postgres.log_file.read_bytes() if self.postgres.log_file.exists() else b""
            )
            self.postgres.destroy()
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        ledger_service._default = None


# ---------------------------------------------------------------------- report


def summary_lines(report: dict[str, Any]) -> list[str]:
    c = report["counts"]
    lines = [
        f"operations {c['operations']} (requests {c['requests']}, calls {c['calls']}, "
        f"rejected at admission {c['rejected_at_admission']}), reservations {c['reservations']}, "
        f"effects {c['effects_accepted']}",
        f"lost {c['lost']}  duplicated {c['duplicated']}  unexpected {c['unexpected']}  "
        f"recovered {c['recovered']}  fenced {c['fenced']}  accepted stale writes "
        f"{c['accepted_stale_writes']}",
        "invariants: " + "  ".join(
            f"{name} {'ok' if v['ok'] else 'FAIL(' + str(v['violations']) + ')'}"
            for name, v in report["invariants"].items()
        ),
        f"quiet after {report['quiet'].get('quiet_seconds')}s "
        f"(bound {report['quiet'].get('bound_seconds')}s)",
        "faults: " + ", ".join(f"{k} {v}" for k, v in report["faults"].items()),
    ]
    failed = {k: v for k, v in report.get("requirements", {}).items() if not v["ok"]}
    if failed:
        lines.append(f"requirements not met: {failed}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a chaos campaign against a real fleet.")
    parser.add_argument("--minutes", type=float, default=None, help="long campaign of this many minutes")
    parser.add_argument("--ci", action="store_true", help="the CI-sized campaign (default without --minutes)")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None, help="write a Markdown report here")
    args = parser.parse_args(argv)
    run_dir = args.run_dir or Path(".toolfence") / "chaos" / time.strftime("%Y%m%d-%H%M%S")
    if args.minutes:
        config = long_config(run_dir.resolve(), args.minutes, seed=args.seed)
    else:
        config = ci_config(run_dir.resolve(), seed=args.seed)
    report = Campaign(config).run()
    for line in summary_lines(report):
        print(line)
    if args.report:
        from tests.chaos.report import write_markdown

        write_markdown(report, args.report, run_dir.resolve())
        print(f"wrote {args.report}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
