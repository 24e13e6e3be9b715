"""The eval report: the five figures overall and per category, each failing case and
why; as JSON (CI), Markdown or HTML (people); and the comparison of two runs.

A comparison reads two JSON reports and gives, per category and figure, the
candidate's failure rate as a ratio of the baseline's: 1 - rate, because a model
going from 99 % to 95 % fails five times as often, which a 4-point drop hides.
A figure with no failures in the baseline and some in the candidate is an
infinite ratio; none in either, 1.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from executor.eval.fixtures import FixtureError, Fixtures
from executor.eval.scoring import FIGURES, TITLES, CaseScore, Tally

REPORT_VERSION = 1


def _tallies(scores: Sequence[CaseScore]) -> dict[str, Tally]:
    totals = {name: Tally() for name in FIGURES}
    for score in scores:
        for name, tally in score.tallies.items():
            totals[name].passed += tally.passed
            totals[name].total += tally.total
    return totals


def build_report(
    fixtures: Fixtures, driver: str, run_dir: Path, scores: Sequence[CaseScore]
) -> dict[str, Any]:
    categories = sorted({score.category for score in scores})
    return {
        "report": REPORT_VERSION,
        "fixtures": str(fixtures.path),
        "fixtures_sha256": fixtures.sha256,
        "dataset": fixtures.header.dataset,
        "driver": driver,
        "run_dir": str(run_dir),
        "cases": len(scores),
        "cases_passed": sum(score.passed for score in scores),
        "figures": {name: tally.to_json() for name, tally in _tallies(scores).items()},
        "categories": {
            category: {
                "cases": sum(1 for s in scores if s.category == category),
                "figures": {
                    name: tally.to_json()
                    for name, tally in _tallies([s for s in scores if s.category == category]).items()
                },
            }
            for category in categories
        },
        "usage": _usage(scores),
        "failures": [score.to_json() for score in scores if not score.passed],
        "results": [score.to_json() for score in scores],
    }


def _usage(scores: Sequence[CaseScore]) -> dict[str, Any]:
    """The model's cost over the run, beside the figures (never folded into them):
    model calls, tokens, and dollars when every driver call reported them."""
    total: dict[str, Any] = {"model_calls": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0}
    known = True
    for score in scores:
        for key in ("model_calls", "input_tokens", "output_tokens"):
            total[key] += int(score.usage.get(key, 0))
        total["cost_usd"] += float(score.usage.get("cost_usd", 0.0))
        known = known and bool(score.usage.get("cost_known", False))
    if not known:
        total["cost_usd"] = None
    return total


def _rate(figure: Mapping[str, Any]) -> str:
    if not figure["total"]:
        return "–"
    return f"{100 * figure['rate']:.1f} % ({figure['passed']}/{figure['total']})"


def markdown(report: Mapping[str, Any]) -> str:
    dataset = report.get("dataset") or {}
    lines = [
        "# toolfence eval",
        "",
        f"{report['cases']} case(s) from `{Path(report['fixtures']).name}`"
        + (f" ({dataset.get('name')} {dataset.get('version')})" if dataset else "")
        + f", driver `{report['driver']}`: {report['cases_passed']} passed every check.",
        "",
        _usage_line(report.get("usage")),
        "",
        "| figure | all | " + " | ".join(report["categories"]) + " |",
        "| --- | --- | " + " | ".join("---" for _ in report["categories"]) + " |",
    ]
    for name in FIGURES:
        cells = [_rate(report["figures"][name])]
        cells += [_rate(c["figures"][name]) for c in report["categories"].values()]
        lines.append(f"| {TITLES[name]} | " + " | ".join(cells) + " |")
    lines += ["", "## Failing cases", ""]
    if not report["failures"]:
        lines.append("None.")
    for failure in report["failures"]:
        head = f"- `{failure['case']}` ({failure['category']}"
        head += f", perturbed: {failure['perturbation']})" if failure.get("perturbation") else ")"
        lines.append(head)
        for reason in failure["reasons"]:
            lines.append(f"  - {TITLES.get(reason['figure'], reason['figure'])}: {reason['why']}")
    return "\n".join(lines) + "\n"


def _usage_line(usage: Mapping[str, Any] | None) -> str:
    if not usage:
        return "Model usage: not recorded."
    cost = usage.get("cost_usd")
    shown = "cost not reported by the driver" if cost is None else f"{cost:.4f} USD"
    return (f"Model usage: {usage['model_calls']} call(s), {usage['input_tokens']} input and "
            f"{usage['output_tokens']} output tokens, {shown}.")


def html_report(report: Mapping[str, Any]) -> str:
    rows = []
    for name in FIGURES:
        cells = [_rate(report["figures"][name])]
        cells += [_rate(c["figures"][name]) for c in report["categories"].values()]
        rows.append("<tr><th>" + html.escape(TITLES[name]) + "</th>"
                    + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    failures = []
    for failure in report["failures"]:
        reasons = "".join(
            f"<li>{html.escape(TITLES.get(r['figure'], r['figure']))}: {html.escape(r['why'])}</li>"
            for r in failure["reasons"]
        )
        failures.append(f"<li><code>{html.escape(failure['case'])}</code> "
                        f"({html.escape(failure['category'])})<ul>{reasons}</ul></li>")
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["figure", "all", *report["categories"]])
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>toolfence eval</title></head><body>"
        f"<h1>toolfence eval</h1><p>{report['cases']} case(s), driver <code>{html.escape(report['driver'])}"
        f"</code>: {report['cases_passed']} passed every check.</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        f"<h2>Failing cases</h2><ul>{''.join(failures) or '<li>None.</li>'}</ul></body></html>\n"
    )


def write_report(report: Mapping[str, Any], path: Path) -> None:
    """By the file's suffix: .json, .html, or Markdown (anything else)."""
    if path.suffix == ".json":
        text = json.dumps(report, indent=1, sort_keys=True) + "\n"
    elif path.suffix in (".html", ".htm"):
        text = html_report(report)
    else:
        text = markdown(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def load_report(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FixtureError(f"{path}: not a readable JSON report ({exc})") from None
    if not isinstance(data, dict) or data.get("report") != REPORT_VERSION:
        raise FixtureError(f"{path}: not a toolfence eval JSON report (write one with --report FILE.json)")
    return data


def failure_ratio(baseline: Mapping[str, Any], candidate: Mapping[str, Any]) -> float | None:
    """The candidate's failure rate over the baseline's (None: a side measured nothing)."""
    if not baseline["total"] or not candidate["total"]:
        return None
    base = 1 - float(baseline["rate"])
    cand = 1 - float(candidate["rate"])
    if base == 0:
        return 1.0 if cand == 0 else math.inf
    return cand / base


def compare(baseline: Mapping[str, Any], candidate: Mapping[str, Any]) -> dict[str, Any]:
    rows = []
    scopes = [("all", baseline["figures"], candidate["figures"])]
    for category, data in baseline["categories"].items():
        if category in candidate["categories"]:
            scopes.append((category, data["figures"], candidate["categories"][category]["figures"]))
    for scope, base, cand in scopes:
        for name in FIGURES:
            ratio = failure_ratio(base[name], cand[name])
            if ratio is not None:
                rows.append({"category": scope, "figure": name, "baseline": base[name]["rate"],
                             "candidate": cand[name]["rate"], "failure_ratio": ratio})
    return {"baseline": baseline.get("driver"), "candidate": candidate.get("driver"), "rows": rows}


def comparison_text(comparison: Mapping[str, Any], threshold: float) -> str:
    lines = [f"baseline {comparison['baseline']} → candidate {comparison['candidate']}",
             f"{'category':<22} {'figure':<38} {'baseline':>9} {'candidate':>9} {'failures':>9}"]
    for row in comparison["rows"]:
        ratio = row["failure_ratio"]
        shown = "∞" if math.isinf(ratio) else f"{ratio:.2f}×"
        flag = "  REGRESSION" if ratio >= threshold and ratio > 1 else ""
        lines.append(
            f"{row['category'][:22]:<22} {TITLES[row['figure']]:<38} {100 * row['baseline']:>8.1f}% "
            f"{100 * row['candidate']:>8.1f}% {shown:>9}{flag}"
        )
    return "\n".join(lines)


def regressions(comparison: Mapping[str, Any], threshold: float) -> list[dict[str, Any]]:
    return [r for r in comparison["rows"] if r["failure_ratio"] > 1 and r["failure_ratio"] >= threshold]
