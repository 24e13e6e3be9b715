"""The CI-sized chaos campaign: a real fleet under every fault, judged by the checker.

Runs in `make test` (CI's .ci/run); `-m "not chaos"` leaves it out, `-m chaos`
runs it alone. It starts its own PostgreSQL cluster and Redis server on free
ports, so it disturbs no other test and needs no service beyond the binaries.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.chaos.campaign import Campaign, ci_config, summary_lines
from tests.chaos.services import PG_BIN

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


def _require_binaries() -> None:
    missing = [name for name in ("initdb", "pg_ctl") if not (PG_BIN / name).exists()]
    if shutil.which("redis-server") is None:
        missing.append("redis-server")
    if missing:  # CI has them: fail loudly rather than skip
        pytest.fail(f"the chaos campaign needs {', '.join(missing)} (PostgreSQL in {PG_BIN}, Redis)")


@pytest.mark.timeout(300)
def test_campaign__every_fault__nothing_lost_duplicated_or_unexpected(tmp_path: Path) -> None:
    _require_binaries()
    # Given a fleet (2 relays, 3 workers, a reconciler) on private PostgreSQL and Redis,
    # and a workload of reads and writes of every effect contract
    config = ci_config(tmp_path / "campaign", seed=20_240_601)
    # When every fault fires at least as often as the campaign asks
    report = Campaign(config).run()
    summary = "\n".join(summary_lines(report)) + f"\nrun dir: {config.run_dir}"
    # Then the checker finds nothing lost, duplicated or unexpected, no stale write
    # accepted, I1-I7 hold, and the fleet went quiet within 2 x lease + a reconciler period
    counts = report["counts"]
    assert (counts["lost"], counts["duplicated"], counts["unexpected"]) == (0, 0, 0), summary
    assert counts["accepted_stale_writes"] == 0, summary
    failing = {k: v for k, v in report["invariants"].items() if not v["ok"]}
    assert not failing, summary + "\n" + json.dumps(failing, indent=2)
    unmet = {k: v for k, v in report["requirements"].items() if not v["ok"]}
    assert not unmet, summary + "\n" + json.dumps(unmet, indent=2)
    assert report["passed"], summary
