"""The CI-sized partitions campaign: every node in a network namespace, every network
and clock nemesis, with the process faults, judged by the same checker.

Runs in `make test` (the processes tier, like test_campaign.py). It needs root
(namespaces, nftables, tc) and skips with that reason otherwise; as root, a
missing binary fails it rather than skipping (scripts/ci-deps.sh installs them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.chaos.campaign import summary_lines
from tests.chaos.netns import unavailable_reason
from tests.chaos.partitions import CLOCK_KINDS, NETWORK_KINDS, PartitionCampaign, ci_config
from tests.chaos.partitions_report import write_partitions_markdown
from tests.chaos.services import PG_BIN

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces, nftables and tc need root")]


@pytest.mark.timeout(330)
def test_partitions__every_network_and_clock_fault__nothing_lost_duplicated_or_stale(tmp_path: Path) -> None:
    reason = unavailable_reason()
    missing = [name for name in ("initdb", "pg_ctl") if not (PG_BIN / name).exists()]
    if reason or missing or shutil.which("redis-server") is None:
        pytest.fail(f"the partitions campaign cannot run: {reason or ''} {missing}")
    # Given PostgreSQL, Redis, 2 relays, 3 workers and a reconciler, each in its own namespace
    run_dir = tmp_path / "partitions"
    config = ci_config(run_dir, seed=20_261_205)
    # When every network and clock nemesis fires, with the kills, pauses and restarts
    report = PartitionCampaign(config).run()
    summary = "\n".join(summary_lines(report)) + f"\nrun dir: {run_dir}"
    # Then nothing is lost, duplicated or unexpected, no stale write is accepted,
    # I1-I7 hold and the fleet is quiet within its bound after the last heal
    counts = report["counts"]
    assert (counts["lost"], counts["duplicated"], counts["unexpected"]) == (0, 0, 0), summary
    assert counts["accepted_stale_writes"] == 0, summary
    failing = {k: v for k, v in report["invariants"].items() if not v["ok"]}
    assert not failing, summary + "\n" + json.dumps(failing, indent=2)
    fired = report["nemesis"]["fired"]
    assert all(fired.get(kind, 0) >= 1 for kind in (*NETWORK_KINDS, *CLOCK_KINDS)), summary
    unmet = {k: v for k, v in report["requirements"].items() if not v["ok"]}
    assert not unmet, summary + "\n" + json.dumps(unmet, indent=2)
    # And the harness left no namespace behind
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert f"tf-{os.getpid()}-" not in listed
    # And the report and its timeline are written from the history
    write_partitions_markdown(report, tmp_path / "PARTITIONS.md", run_dir)
    assert (tmp_path / "PARTITIONS.png").stat().st_size > 10_000
    assert "| 0 | 0 | 0 |" in (tmp_path / "PARTITIONS.md").read_text()
