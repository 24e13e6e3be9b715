"""Hostile programs through a real worker: `sandbox.run_python` in a prefork child.

The same programs as tests/sandbox (tests/sandbox/hostile.py), each its own request
(the per-tool call budget is 8 a request), run by one worker whose environment
holds a canary variable. Every one is contained and ends with its stable outcome
(a limit: `failed_terminal` with the limit's code), nothing of any run is left
running (the worker runs bwrap as a host uid of this test's own), and the same
worker process answers the next call.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from fleet_tools import registry
from fleetkit import call, context

from executor.cli.fleet import children_of
from executor.core.types import ErrorCode
from executor.store.engine import make_engine
from outbox.producer import enqueue
from outbox.results import wait_for_results
from tests.sandbox.hostile import CANARY_ENV, CHECKOUT, HOSTILE, Host, names_checkout, nothing_left

LIMIT_CODES = {
    "timeout": ErrorCode.SANDBOX_TIMEOUT,
    "memory_limit": ErrorCode.SANDBOX_MEMORY_LIMIT,
    "output_limit": ErrorCode.SANDBOX_OUTPUT_LIMIT,
}


def test_worker__hostile_programs__contained_stable_outcomes_worker_still_healthy(
    settings, ledger, make_fleet, tmp_path: Path
) -> None:
    # Given one worker (prefork, one child) with a canary in its environment, running
    # bwrap as a host uid nothing else uses
    host = Host.create(tmp_path)
    uid = 61_000 + uuid.uuid4().int % 4_000
    fleet = make_fleet(
        workers=1, concurrency=1, env={CANARY_ENV: host.env_secret, "TOOLFENCE_SANDBOX_HOST_UID": uid}
    ).start()
    engine = make_engine(settings.database_url)
    [worker] = fleet.by_role("worker")
    pool = set(children_of(worker.pid))
    assert len(pool) == 1, pool
    # When each hostile program is proposed as a call of its own request
    for index, hostile in enumerate(HOSTILE):
        with engine.begin() as conn:
            enqueue(conn, [call(
                f"h{index}", "sandbox.run_python", code=host.render(hostile.code),
                timeout_seconds=hostile.timeout, memory_mb=hostile.memory_mb,
            )], context(f"req-hostile-{index}"), registry)
    # Then each ends with its outcome: a result for ok, the limit's code for a limit
    for index, hostile in enumerate(HOSTILE):
        [status] = wait_for_results(engine, "acme", f"req-hostile-{index}", timeout=120)
        shown = status.model_dump_json()
        for secret in host.secrets:
            leaked = names_checkout(shown) if secret == str(CHECKOUT) else secret in shown
            assert not leaked, (hostile.name, fleet.logs())
        if hostile.outcome in LIMIT_CODES:
            assert status.status == "failed_terminal", (hostile.name, shown)
            assert status.error.code is LIMIT_CODES[hostile.outcome], (hostile.name, shown)
            assert "untrusted data from the program" in status.error.message
            continue
        assert status.status == "succeeded", (hostile.name, shown, fleet.logs())
        output = status.output
        assert status.untrusted is True and output["untrusted"] is True
        assert output["outcome"] == hostile.outcome, (hostile.name, shown)
        lines = output["stdout"].splitlines()
        for line in hostile.expect:
            assert any(seen == line or seen.startswith(line + " ") for seen in lines), (hostile.name, shown)
        kinds = {f["name"]: f["kind"] for f in output["files"]}
        for name, kind in hostile.files.items():
            assert kinds[name] == kind, (hostile.name, shown)
    # And nothing of any run is left running
    assert nothing_left(uid, host.marker) == []
    # And the same worker process (its one prefork child ran every program) answers the next call
    assert worker.process.poll() is None and set(children_of(worker.pid)) == pool, fleet.logs()
    with engine.begin() as conn:
        enqueue(
            conn, [call("after", "sandbox.run_python", code="print(6 * 7)")], context("req-after"), registry
        )
    [after] = wait_for_results(engine, "acme", "req-after", timeout=60)
    assert after.status == "succeeded", json.dumps(after.model_dump(mode="json"))
    assert after.output["stdout"] == "42\n"
    assert worker.process.poll() is None and set(children_of(worker.pid)) == pool, fleet.logs()
