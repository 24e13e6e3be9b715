"""docs/http.md's curl walkthrough, run as written: a real `toolfence serve`, relay and
worker on the embedded default (SQLite and the filesystem broker under
./.toolfence), started by the walkthrough itself, in a fresh directory.

Only the port is changed (8080 to a free one, so two runs cannot collide); the
walkthrough's own commands start and stop the processes, and whatever is left is
stopped with its process group.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.netkit import free_port
from tests.unit.test_readme import parse_blocks

ROOT = Path(__file__).resolve().parents[2]
HTTP_DOC = ROOT / "docs" / "http.md"
MARK = "tests/http/test_walkthrough.py"
TIMEOUT_SECONDS = 240


def walkthrough() -> str:
    """The bash block docs/http.md marks as run by this test (exactly one)."""
    blocks = [
        b for b in parse_blocks(HTTP_DOC.read_text(encoding="utf-8"), "docs/http.md")
        if b.language == "bash" and b.marker and MARK in b.marker
    ]
    assert len(blocks) == 1, blocks
    return blocks[0].code


@pytest.mark.timeout(TIMEOUT_SECONDS + 30)
def test_http_walkthrough__as_written__the_transfer_waits_is_approved_and_both_calls_succeed(
    tmp_path: Path,
) -> None:
    # Given the walkthrough, on a free port, in an empty directory with nothing configured
    script = re.sub(r"\b8080\b", str(free_port()), walkthrough())
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TOOLFENCE_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    # When it is run by bash, stopping at the first command that fails
    process = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-c", script], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=TIMEOUT_SECONDS)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert process.returncode == 0, err[-4000:]
    # (migrate's line and the worker's banner come first)
    lines = out.splitlines()
    assert "approved" in lines, out
    lines = lines[lines.index("approved"):]
    # Then the approver's decision is "approved", both calls succeeded, and the results
    # read in Anthropic's shape are two tool results, neither an error
    assert [json.loads(line) for line in lines[1:3]] == [
        {"call_id": "c1", "status": "succeeded"}, {"call_id": "c2", "status": "succeeded"},
    ], out
    assert [json.loads(line) for line in lines[3:5]] == [
        {"tool_use_id": "c1", "is_error": False}, {"tool_use_id": "c2", "is_error": False},
    ], out
    # And the ledger moved the 600.00 once
    from ledger.service import Ledger

    ledger = Ledger(f"sqlite:///{tmp_path / '.toolfence' / 'toolfence.db'}")
    try:
        assert (ledger.balance("acme-1"), ledger.balance("acme-2")) == (40_000, 60_000)
    finally:
        ledger.engine.dispose()
