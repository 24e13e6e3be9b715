"""The partitions campaign: the chaos campaign with every node on a real network.

Same workload, checker and history as `tests/chaos/campaign.py`, but PostgreSQL
runs in namespace `db`, Redis in `broker`, and every relay, worker and the
reconciler in a namespace of its own (`tests/chaos/netns.py`), all linked by one
bridge. The process faults (kills, pauses, terminated sessions, fault points,
PostgreSQL and Redis restarts) fire as before; two more lanes add:

- the **network lane**, one fault at a time, each healed after 1-4 x lease:
  a node cut from the database only (`part_db`) or from the broker only
  (`part_broker`), the nodes split in two random halves (`part_halves`), one-way
  cuts (`part_oneway_to_db`: the node's packets to the database are dropped,
  the answers are not; `part_oneway_from_db`: the reverse), loss of 10-40 % on a
  node's link to the database or broker (`loss`), every packet of that link
  behind a 64-256 kbit/s queue (`delay`: delay with jitter), a quarter of them
  (`reorder`: packet reordering), and 20-50 % of them sent twice (`duplicate`);
- the **clock lane**, beside it: a worker's or relay's wall clock set 1-15
  minutes ahead or behind for a while (`clock_skew`), or jumped forward and
  back again (`clock_jump`), by libfaketime.

`python -m tests.chaos.partitions --minutes 30 --report bench/PARTITIONS.md`
(`make chaos-partitions`) runs the long campaign; `tests/chaos/test_partitions.py`
the CI-sized one. Root only.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from executor.cli.fleet import Fleet, Member
from tests.chaos.campaign import DATABASE, Campaign, CampaignConfig, summary_lines
from tests.chaos.history import History
from tests.chaos.nemesis import TERMINATE_KINDS, Nemesis, Setup
from tests.chaos.netns import Network, Node
from tests.chaos.services import PrivatePostgres, PrivateRedis

NETWORK_KINDS = ("part_db", "part_broker", "part_halves", "part_oneway_to_db", "part_oneway_from_db",
                 "loss", "delay", "reorder", "duplicate")
CLOCK_KINDS = ("clock_skew", "clock_jump")
CLOCKED_ROLES = ("worker", "relay")


class PartitionNemesis(Nemesis):
    def __init__(self, setup: Setup, history: History, *, network: Network, **kwargs: Any) -> None:
        super().__init__(setup, history, **kwargs)
        self.network = network
        self.net_rng = self.rng.__class__(self.rng.random())
        self.clock_rng = self.rng.__class__(self.rng.random())

    def start(self) -> None:
        super().start()
        for target, name in ((self._network_lane, "nemesis-network"), (self._clock_lane, "nemesis-clock")):
            thread = threading.Thread(target=self._guard(target), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _heal_extra(self) -> None:
        self.network.heal_all()  # every rule gone, every clock back to real time

    # ------------------------------------------------------------------ targets

    def _members(self, roles: Sequence[str]) -> list[tuple[Member, Node]]:
        found = []
        for member in self.s.fleet.members:
            node = self.network.nodes.get(f"{member.role}-{member.index}")
            if member.role in roles and member.alive() and node is not None:
                found.append((member, node))
        return found

    def _plan(self, kinds: Sequence[str], rng: Any) -> list[str]:
        plan = [kind for kind in kinds for _ in range(self.targets.get(kind, 0))]
        rng.shuffle(plan)
        return plan

    def _gap(self, remaining_holds: Sequence[float]) -> float:
        """The pause before the next fault: what is left of 85 % of the window, shared
        evenly between the faults still to come (re-computed each time, so a slow
        machine shortens the pauses rather than leaving faults unfired)."""
        left = 0.85 * self.duration - self._elapsed() - sum(remaining_holds)
        return max(0.2, left / (len(remaining_holds) + 1))

    # ------------------------------------------------------------------ network lane

    def _network_lane(self) -> None:
        lease = self.s.lease_seconds
        rng = self.net_rng
        plan = self._plan(NETWORK_KINDS, rng)
        if not plan:
            return
        holds = [rng.uniform(1.0, 3.0) * lease for _ in plan]
        db, broker = self.network.nodes["db"], self.network.nodes["broker"]
        for index, (kind, hold) in enumerate(zip(plan, holds, strict=True)):
            if self._stop.wait(self._gap(holds[index:])):
                return
            members = self._members(("worker", "relay", "reconciler"))
            if not members:
                continue
            member, node = rng.choice(members)
            peer = broker if kind == "part_broker" or (
                kind in ("loss", "delay", "reorder", "duplicate") and rng.random() < 0.5) else db
            details: dict[str, Any] = {"node": node.name, "peer": peer.name, "seconds": round(hold, 2)}
            net = self.network
            if kind in ("part_db", "part_broker"):
                ids = [net.cut([node], [peer])]
            elif kind == "part_oneway_to_db":
                ids = [net.cut([node], [db], both_ways=False)]
            elif kind == "part_oneway_from_db":
                ids = [net.cut([db], [node], both_ways=False)]
            elif kind == "part_halves":
                everyone = [db, broker, *(n for _, n in members)]
                rng.shuffle(everyone)
                half = len(everyone) // 2
                left, right = everyone[:half], everyone[half:]
                details = {"left": [n.name for n in left], "right": [n.name for n in right],
                           "seconds": round(hold, 2)}
                ids = [net.cut(left, right)]
            elif kind == "loss":
                details["percent"] = percent = rng.randint(10, 40)
                ids = [net.loss(node, peer, percent)]
            elif kind == "duplicate":
                details["percent"] = percent = rng.randint(20, 50)
                ids = [net.duplicate(node, peer, percent), net.duplicate(peer, node, percent)]
            else:  # delay (every packet) or reorder (a quarter), both directions
                percent = 100 if kind == "delay" else 25
                details |= {"percent": percent, "kbit": (rate := rng.choice((64, 128, 256)))}
                ids = [net.slow(node, peer, percent, rate), net.slow(peer, node, percent, rate)]
            self.history.add("fault", fault=kind, role=member.role, **details)
            self.counts.add(kind)
            self._stop.wait(hold)
            for fault_id in ids:
                net.heal(fault_id)
            self.history.add("fault_end", fault=kind)

    # ------------------------------------------------------------------ clock lane

    def _clock_lane(self) -> None:
        lease = self.s.lease_seconds
        rng = self.clock_rng
        plan = self._plan(CLOCK_KINDS, rng)
        if not plan:
            return
        holds = [rng.uniform(2.0, 5.0) * lease for _ in plan]
        for index, (kind, hold) in enumerate(zip(plan, holds, strict=True)):
            if self._stop.wait(self._gap(holds[index:])):
                return
            members = self._members(CLOCKED_ROLES)
            if not members:
                continue
            member, node = rng.choice(members)
            offset = rng.choice((-1, 1)) * rng.uniform(60, 900)
            self.history.add("fault", fault=kind, role=member.role, node=node.name,
                             offset_seconds=round(offset), seconds=round(hold, 2))
            self.counts.add(kind)
            self.network.set_clock(node, offset)
            if kind == "clock_jump":
                # Forward (or back) by `offset`, then the other way past real time, then back.
                self._stop.wait(hold / 2)
                self.network.set_clock(node, -offset)
                self._stop.wait(hold / 2)
            else:
                self._stop.wait(hold)
            self.network.set_clock(node, 0)
            self.history.add("fault_end", fault=kind, node=node.name)


# ---------------------------------------------------------------------- the run


class PartitionCampaign(Campaign):
    def __init__(self, config: CampaignConfig) -> None:
        super().__init__(config)
        self.network: Network | None = None

    def _launcher(self, role: str, index: int) -> tuple[Sequence[str], Mapping[str, str]]:
        assert self.network is not None
        node = self.network.add_node(f"{role}-{index}")
        return node.prefix, (self.network.clock_env(node) if role in CLOCKED_ROLES else {})

    def _start_services(self, began: float) -> tuple[PrivatePostgres, PrivateRedis, str]:
        cfg = self.config
        self.network = net = Network(self.run_dir / "net").build()
        db, broker = net.add_node("db"), net.add_node("broker")
        self.postgres = pg = PrivatePostgres(host=db.address, prefix=db.prefix).start()
        direct = self._prepare_database(pg)
        self.redis = redis = PrivateRedis(host=broker.address, prefix=broker.prefix).start(aof=True)
        self.log(f"namespaces {net.prefix}*: postgres {db.address}:{pg.port}, redis "
                 f"{broker.address}:{redis.port}")
        role_env = {
            role: {
                "TOOLFENCE_DATABASE_URL": pg.node_url(DATABASE, application_name=f"toolfence-{role}"),
                "TOOLFENCE_BROKER_URL": redis.url,
                **({"TOOLFENCE_FAULT_POINTS_FILE": str(self.run_dir / f"fault-points-{role}.spec")}
                   if role != "reconciler" else {}),
            }
            for role in ("worker", "relay", "reconciler")
        }
        self.fleet = fleet = Fleet(
            env=self._common_env(), log_dir=self.run_dir / "logs", workers=cfg.workers,
            concurrency=cfg.concurrency, reconcile_every=cfg.reconcile_every, relays=cfg.relays,
            role_env=role_env, launcher=self._launcher,
        )
        fleet.start(wait_ready=90)
        self.log(f"fleet up in {len(net.nodes) - 2} namespaces (setup {time.monotonic() - began:.1f}s)")
        return pg, redis, direct

    def _make_nemesis(self, setup: Setup, history: History) -> Nemesis:
        cfg = self.config
        assert self.network is not None
        return PartitionNemesis(setup, history, network=self.network, chaos_seconds=cfg.chaos_seconds,
                                targets=cfg.targets, seed=cfg.seed, workers=cfg.workers, relays=cfg.relays)

    def _teardown(self) -> None:
        try:
            super()._teardown()
        finally:
            if self.network is not None:
                self.network.destroy()


def _targets(scale: float, *, network: int, clock: int) -> dict[str, int]:
    per = {
        "kill_child": 60, "kill_node": 12, "kill_after_effect": 30, "kill_before_complete": 30,
        "pause": 60, "ambiguous_reserve": 30, "ambiguous_complete": 30,
        **{kind: 10 for kind in TERMINATE_KINDS},
        "pg_restart": 10, "redis_restart_off": 5, "redis_restart_aof": 5,
        "relay_kill_after_publish": 10,
    }
    targets = {kind: max(1, round(n * scale)) for kind, n in per.items()}
    targets |= {kind: network for kind in NETWORK_KINDS}
    targets |= {kind: clock for kind in CLOCK_KINDS}
    return targets


def ci_config(run_dir: Path, seed: int = 1) -> CampaignConfig:
    """About three minutes on a 2-CPU machine; `make test` runs it (tests/chaos/test_partitions.py)."""
    return CampaignConfig(
        chaos_seconds=120, max_chaos_seconds=150, max_total_seconds=240,
        targets=_targets(120 / 1800, network=2, clock=3), run_dir=run_dir, seed=seed,
        concurrency=2, clients=12, min_operations=400, settle_grace_seconds=20.0,
        label="partitions-ci",
    )


def long_config(run_dir: Path, minutes: float, seed: int = 1) -> CampaignConfig:
    """Every network and clock fault at least ten times in 30 minutes (fewer, pro rata, in less)."""
    scale = minutes / 30.0
    # One network fault lasts 2.5 x lease on average, plus its gap: 9 kinds x 14 fit in
    # 30 minutes with the system left alone half of the time.
    return CampaignConfig(
        chaos_seconds=minutes * 60, max_chaos_seconds=minutes * 60 * 1.1,
        targets=_targets(scale, network=max(2, round(14 * scale)), clock=max(2, round(14 * scale))),
        run_dir=run_dir, seed=seed, concurrency=2, clients=16,
        min_operations=round(6_000 * scale), settle_grace_seconds=120.0,
        label=f"partitions-{minutes:g}min",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the partitions campaign (network namespaces; root).")
    parser.add_argument("--minutes", type=float, default=None, help="long campaign of this many minutes")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None,
                        help="write a Markdown report here, and the timeline PNG beside it")
    args = parser.parse_args(argv)
    run_dir = (args.run_dir or Path(".toolfence") / "partitions" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    config = (long_config(run_dir, args.minutes, seed=args.seed) if args.minutes
              else ci_config(run_dir, seed=args.seed))
    report = PartitionCampaign(config).run()
    for line in summary_lines(report):
        print(line)
    if args.report:
        from tests.chaos.partitions_report import write_partitions_markdown

        write_partitions_markdown(report, args.report, run_dir)
        print(f"wrote {args.report} and {args.report.with_suffix('.png')}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
