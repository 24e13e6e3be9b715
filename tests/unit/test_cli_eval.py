"""`toolfence eval`'s command line: bad input is one clear line and nothing runs;
`import-bfcl` from a data directory; the HTML report escapes what it shows."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from executor.cli.main import main
from executor.eval.fixtures import load_fixtures
from executor.eval.report import html_report
from executor.eval.runner import Manifest

ROOT = Path(__file__).resolve().parents[2]
LEDGER = ROOT / "ledger" / "eval" / "ledger.jsonl"
HEADER = {
    "eval": 1, "tools": "executor.eval.declared:registry", "downstream": "executor.eval.declared:downstream",
}


class Run(NamedTuple):
    code: int
    out: str
    err: str


@pytest.fixture
def cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Run]:
    monkeypatch.setenv("TOOLFENCE_HOME", str(tmp_path / "home"))

    def run(*argv: str) -> Run:
        code = main(list(argv))
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


def one_line_error(run: Run, *fragments: str) -> None:
    assert run.code != 0 and run.out == "" and "Traceback" not in run.err, run
    [line] = run.err.splitlines()
    assert line.startswith("toolfence: "), line
    for fragment in fragments:
        assert fragment in line, line


def test_eval__unreadable_or_bad_fixtures__one_line_naming_the_line(
    cli: Callable[..., Run], tmp_path: Path
) -> None:
    one_line_error(cli("eval", str(tmp_path / "none.jsonl"), "--driver", "perturb"), "cannot read")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(HEADER) + "\n" + json.dumps({"id": "a", "category": "c"}) + "\n")
    one_line_error(cli("eval", str(bad), "--driver", "perturb"), "bad.jsonl:2: messages: Field required")
    assert not (tmp_path / "home").exists()  # nothing was started


def test_eval__driver_problems_are_refused_before_anything_runs(
    cli: Callable[..., Run], tmp_path: Path
) -> None:
    one_line_error(cli("eval", str(LEDGER)), "--driver recorded:FILE")
    run_dir = tmp_path / "run"
    one_line_error(cli("eval", str(LEDGER), "--driver", "scripted:x.jsonl", "--run-dir", str(run_dir)),
                   "in an eval use recorded:FILE")
    sideways = cli("eval", str(LEDGER), "--driver", "perturb:sideways", "--run-dir", str(tmp_path / "r2"))
    one_line_error(sideways, "unknown kind(s) sideways")
    one_line_error(cli("eval", str(LEDGER), "--driver", "recorded:" + str(tmp_path / "missing.jsonl"),
                       "--run-dir", str(tmp_path / "r3")), "cannot read")
    one_line_error(cli("eval", str(LEDGER), "--driver", "perturb", "--parallel", "0"), "--parallel is 1..64")


def test_eval__a_run_dir_of_other_fixtures_or_driver_is_refused(
    cli: Callable[..., Run], tmp_path: Path
) -> None:
    other = tmp_path / "other.jsonl"
    other.write_text(LEDGER.read_text().replace("parallel-reads", "parallel-reads-2"))
    run_dir = tmp_path / "run"
    Manifest.open(run_dir, load_fixtures(other), "perturb")
    one_line_error(cli("eval", str(LEDGER), "--driver", "perturb", "--run-dir", str(run_dir)),
                   "holds a run of other fixtures")
    one_line_error(cli("eval", str(other), "--driver", "perturb:wrong_tool", "--run-dir", str(run_dir)),
                   "holds a run with --driver 'perturb'")


def test_compare__usage_and_a_file_that_is_no_report(cli: Callable[..., Run], tmp_path: Path) -> None:
    one_line_error(cli("eval", "compare", "a.json"), "compare BASELINE.json CANDIDATE.json")
    text = tmp_path / "notes.json"
    text.write_text('{"figures": {}}')
    one_line_error(cli("eval", "compare", str(text), str(text)), "not a toolfence eval JSON report")


def _bfcl_data(root: Path) -> Path:
    data = root / "bfcl_eval" / "data"
    (data / "possible_answer").mkdir(parents=True)
    (root / "bfcl_eval-2026.3.23.dist-info").mkdir()
    (root / "bfcl_eval-2026.3.23.dist-info" / "METADATA").write_text("Name: bfcl-eval\nVersion: 2026.3.23\n")
    function = {"name": "area", "description": "Area.", "parameters": {
        "type": "dict", "properties": {"base": {"type": "float"}, "height": {"type": "float"}},
        "required": ["base", "height"]}}
    questions = [{"id": f"simple_python_{n}", "question": [[{"role": "user", "content": f"area {n}"}]],
                  "function": [function]} for n in range(5)]
    answers = [{"id": f"simple_python_{n}", "ground_truth": [{"area": {"base": [n + 1], "height": [2.5]}}]}
               for n in range(5)]
    answers[4]["ground_truth"] = [{"area": {"base": ["wide"], "height": [1]}}]  # not its own schema
    (data / "BFCL_v4_simple_python.json").write_text("".join(json.dumps(q) + "\n" for q in questions))
    (data / "possible_answer" / "BFCL_v4_simple_python.json").write_text(
        "".join(json.dumps(a) + "\n" for a in answers))
    irrelevant = [{"id": "irrelevance_0", "question": [[{"role": "user", "content": "weather?"}]],
                   "function": [function]}]
    (data / "BFCL_v4_irrelevance.json").write_text(json.dumps(irrelevant[0]) + "\n")
    return data


def test_import_bfcl__from_a_data_directory__version_recorded_bad_ground_truth_skipped(
    cli: Callable[..., Run], tmp_path: Path
) -> None:
    data = _bfcl_data(tmp_path / "wheel")
    out, recording = tmp_path / "bfcl.jsonl", tmp_path / "bfcl.recorded.jsonl"
    run = cli("eval", "import-bfcl", str(out), "--data", str(data), "--categories",
              "simple_python,irrelevance", "--recording", str(recording))
    assert run.code == 0, run
    fixtures = load_fixtures(out)
    assert fixtures.header.dataset == {"name": "bfcl-eval", "version": "2026.3.23", "sample": None,
                                       "seed": 31, "categories": ["simple_python", "irrelevance"]}
    assert [c.id for c in fixtures.cases] == [*(f"simple_python_{n}" for n in range(4)), "irrelevance_0"]
    assert fixtures.cases[-1].expect.calls == []
    recorded = [json.loads(line) for line in recording.read_text().splitlines()]
    assert [r["case"] for r in recorded] == [c.id for c in fixtures.cases]
    tool_call = recorded[0]["turns"][0][0]["choices"][0]["message"]["tool_calls"][0]["function"]
    arguments = json.loads(tool_call["arguments"])
    assert (tool_call["name"], arguments) == ("area", {"base": 1, "height": 2.5})
    # a sample is drawn with a fixed seed: the same cases each time
    sample = ("eval", "import-bfcl", str(out), "--data", str(data), "--categories", "simple_python",
              "--sample", "2")
    cli(*sample)
    first = [c.id for c in load_fixtures(out).cases]
    cli(*sample)
    assert [c.id for c in load_fixtures(out).cases] == first and len(first) <= 2
    one_line_error(cli("eval", "import-bfcl", str(out), "--data", str(data), "--categories", "chess"),
                   "BFCL category 'chess'")


def test_html_report__escapes_what_it_shows() -> None:
    figure = {"passed": 0, "total": 1, "rate": 0.0}
    figures = {name: figure for name in ("tool_selection", "argument_validation", "violation_catch",
                                         "side_effects", "final_answer")}
    report = {"cases": 1, "cases_passed": 0, "driver": "<script>", "figures": figures,
              "categories": {"a&b": {"figures": figures}},
              "failures": [{"case": "<c>", "category": "a&b",
                            "reasons": [{"figure": "tool_selection", "why": "got <img src=x>"}]}]}
    text = html_report(report)
    assert "<script>" not in text and "<img" not in text
    assert "&lt;script&gt;" in text and "got &lt;img src=x&gt;" in text and "<th>a&amp;b</th>" in text
