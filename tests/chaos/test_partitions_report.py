"""The partitions report's arithmetic, on a small history written by hand."""

from __future__ import annotations

import json
from pathlib import Path

from tests.chaos.partitions_report import effects, timeline_png, windows


def _history(path: Path, events: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_windows_and_effects__per_fault_rates_latencies_and_wait_after_heal(tmp_path: Path) -> None:
    # Given 20 s of chaos: a cut from t=5 to 10 during which one call settled, a
    # clock skew from 12 to 14, and calls settling every second outside the cut
    events: list[dict] = [{"kind": "phase", "phase": "chaos_started", "t": 100.0}]
    events += [{"kind": "fault", "fault": "part_db", "t": 105.0},
               {"kind": "fault_end", "fault": "part_db", "t": 110.0},
               {"kind": "fault", "fault": "clock_skew", "t": 112.0},
               {"kind": "fault_end", "fault": "clock_skew", "t": 114.0},
               {"kind": "fault", "fault": "kill_child", "t": 103.0}]
    settled = [t for t in range(100, 120) if not 105 <= t <= 110] + [107.5, 112.5]
    events += [{"kind": "result", "t": float(t), "seconds": 4.0 if 105 <= t <= 110 else 0.5}
               for t in sorted(settled)]
    events.append({"kind": "phase", "phase": "faults_stopped", "t": 120.0})
    history = _history(tmp_path / "history.jsonl", events)
    # When the windows and their effects are read
    start, stop, spans = windows(history)
    rows = effects(history)
    # Then each window is paired with its end, and the rates are per second of window
    assert (start, stop) == (100.0, 120.0)
    assert [(s["fault"], s["start"], s["end"]) for s in spans] == [
        ("part_db", 105.0, 110.0), ("clock_skew", 112.0, 114.0)]
    assert rows["part_db"]["per_second"] == round(1 / 5, 1) and rows["part_db"]["p50"] == 4.0
    assert rows["part_db"]["first_settle_after_heal_max"] == 1.0  # the call at t=111
    assert rows["no network fault"]["seconds"] == 15.0
    assert rows["no network fault"]["per_second"] == round(15 / 15, 1)  # 14 whole + 112.5
    # 112, 112.5, 113 and 114 settled in its 2 s
    assert rows["clock_skew"]["windows"] == 1 and rows["clock_skew"]["per_second"] == 4 / 2
    # And the timeline is drawn
    timeline_png(history, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 5_000
