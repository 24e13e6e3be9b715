"""Draw ops/grafana/toolfence.json's panels from a real Prometheus that watched `toolfence demo`.

`make dashboard-snapshot` runs it and writes docs/dashboard.png, the picture in the
README's metrics chapter. Grafana itself is not packaged for Debian and nothing here
downloads it, so the picture is drawn by matplotlib from exactly what Grafana would
ask: every panel's own PromQL (with `$tool` as `.*` and `$__rate_interval` as four
scrape intervals, as Grafana computes it), laid out by the panels' own `gridPos`,
answered by a real Prometheus (Debian's package) that scraped the real exporter
every second while the demo's fleet ran: its kills, takeovers, approvals, turns
and reconciler sweeps are what the curves show. A `toolfence serve` on the demo's
database answers a trickle of reads, health checks and unauthenticated calls, so
the HTTP panels have routes, status codes and latencies to show (the demo's own
workload never goes through HTTP, and the trickle adds no operation to it).

    python scripts/dashboard_snapshot.py [--out docs/dashboard.png] [--calls 400]

Needs `prometheus` on PATH (scripts/ci-deps.sh installs it) and matplotlib (the
target installs it into the virtualenv; it is not a dependency of toolfence).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "ops" / "grafana" / "toolfence.json"
SCRAPE_SECONDS = 1
RATE_INTERVAL = f"{4 * SCRAPE_SECONDS * 5}s"  # smoother than Grafana's minimum (4 scrapes)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def wait_until(what: str, check: Any, timeout: float, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if process.poll() is not None:
            raise SystemExit(f"dashboard-snapshot: {what}: the process exited ({process.returncode})")
        time.sleep(0.5)
    raise SystemExit(f"dashboard-snapshot: {what} not after {timeout:.0f} s")


def start(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as output:
        return subprocess.Popen(
            args, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def query_range(prometheus: str, expr: str, begin: float, end: float, step: float) -> list[dict[str, Any]]:
    expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace('=~"$tool"', '=~".*"')
    url = f"{prometheus}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": begin, "end": end, "step": step}
    )
    with urllib.request.urlopen(url, timeout=30) as response:
        body = json.load(response)
    if body.get("status") != "success":
        raise SystemExit(f"dashboard-snapshot: Prometheus refused {expr!r}: {body}")
    return list(body["data"]["result"])


def http_trickle(base_url: str, key: str, stop_event: threading.Event) -> None:
    """Reads (404: no such request), health checks and calls without a key (401)."""
    calls = [
        ("GET", "/healthz", None),
        ("GET", "/readyz", None),
        ("GET", "/v1/requests/req-dashboard-none", key),
        ("POST", "/v1/requests", None),
    ]
    n = 0
    while not stop_event.is_set():
        method, path, bearer = calls[n % len(calls)]
        request = urllib.request.Request(
            base_url + path, method=method, data=b"{}" if method == "POST" else None
        )
        request.add_header("Content-Type", "application/json")
        if bearer:
            request.add_header("Authorization", f"Bearer {bearer}")
        try:
            with urllib.request.urlopen(request, timeout=5):
                pass
        except OSError:
            pass  # 4xx arrive as HTTPError; what matters is the server's count of them
        n += 1
        stop_event.wait(0.1)


def legend(template: str | None, labels: dict[str, str], expr: str) -> str:
    if template:
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)
    shown = {k: v for k, v in labels.items() if k not in {"__name__", "job", "instance"}}
    return ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or expr[:40]


def unit_suffix(unit: str | None) -> str:
    return {"s": " s", "ops": "/s", "reqps": " req/s"}.get(unit or "", "")


def draw(
    panels: list[dict[str, Any]],
    series: dict[int, list[tuple[str, list[float], list[float]]]],
    begin: float,
    out: Path,
    title: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit_px, width_px, dpi = 26, 1800, 100
    fig = plt.figure(figsize=(width_px / dpi, (bottom * unit_px + 60) / dpi), dpi=dpi, facecolor="#111217")
    fig.text(0.01, 1 - 30 / (bottom * unit_px + 60), title, color="#d8d9da", fontsize=15, weight="bold")
    height = bottom * unit_px + 60
    palette = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#fade2a"]
    for index, panel in enumerate(panels):
        pos = panel["gridPos"]
        left, top = pos["x"] / 24, (pos["y"] * unit_px + 50) / height
        w, h = pos["w"] / 24, pos["h"] * unit_px / height
        if panel["type"] == "row":
            fig.text(
                left + 0.005, 1 - top - h * 0.8, panel["title"], color="#d8d9da", fontsize=12, weight="bold"
            )
            continue
        ax = fig.add_axes((left + 0.03 * w + 0.004, 1 - top - h + 0.16 * h, w * 0.94 - 0.008, h * 0.7))
        ax.set_facecolor("#181b1f")
        for spine in ax.spines.values():
            spine.set_color("#2c3235")
        ax.tick_params(colors="#9fa7b3", labelsize=7)
        ax.set_title(panel["title"], color="#d8d9da", fontsize=9, loc="left")
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        found = series.get(index, [])
        if panel["type"] == "stat":
            ax.set_xticks([])
            ax.set_yticks([])
            if not found:
                ax.text(
                    0.5, 0.5, "No data", color="#9fa7b3", ha="center", va="center", transform=ax.transAxes
                )
            for n, (name, _, values) in enumerate(found):
                value = values[-1] if values else float("nan")
                colour = "#73bf69" if value == 0 else "#f2495c"
                x = (n + 0.5) / len(found)
                ax.text(
                    x,
                    0.55,
                    f"{value:g}",
                    color=colour,
                    fontsize=18,
                    weight="bold",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                )
                ax.text(x, 0.2, name, color="#9fa7b3", fontsize=7, ha="center", transform=ax.transAxes)
            continue
        if not found:
            ax.text(0.5, 0.5, "No data", color="#9fa7b3", ha="center", va="center", transform=ax.transAxes)
        for n, (name, xs, ys) in enumerate(found[:8]):
            ax.plot(
                [x - begin for x in xs], ys, color=palette[n % len(palette)], linewidth=1.2, label=name[:38]
            )
        ax.set_xlabel("seconds since the demo started", color="#9fa7b3", fontsize=6)
        if unit_suffix(unit):
            ax.set_ylabel(unit_suffix(unit).strip(), color="#9fa7b3", fontsize=7)
        ax.grid(color="#2c3235", linewidth=0.5)
        if found:
            ax.legend(
                fontsize=6,
                loc="upper left",
                facecolor="#181b1f",
                edgecolor="#2c3235",
                labelcolor="#d8d9da",
                ncol=2 if len(found) > 3 else 1,
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, facecolor=fig.get_facecolor())
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    parser.add_argument("--calls", type=int, default=400, help="the demo's proposed calls")
    parser.add_argument(
        "--after", type=float, default=20.0, help="seconds Prometheus keeps scraping after the demo's report"
    )
    args = parser.parse_args()
    prometheus_binary = shutil.which("prometheus")
    if prometheus_binary is None:
        raise SystemExit("dashboard-snapshot: prometheus is not installed (scripts/ci-deps.sh installs it)")
    dashboard = json.loads(DASHBOARD.read_text())
    panels = sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))

    base = Path(tempfile.mkdtemp(prefix="toolfence-dashboard-"))
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TOOLFENCE_") and k != "PROMETHEUS_MULTIPROC_DIR"
    }
    env["TOOLFENCE_HOME"] = str(base / "home")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        began = time.time()
        demo = start(
            [sys.executable, "-m", "executor.cli", "demo", "--calls", str(args.calls)], base / "demo.log", env
        )
        processes.append(demo)

        def run_dir() -> str | None:
            found = glob.glob(str(base / "home" / "demo-*" / "toolfence.db"))
            return os.path.dirname(found[0]) if found else None

        wait_until("the demo's database", lambda: run_dir() is not None, 120, demo)
        place = Path(str(run_dir()))
        exporter_port, prometheus_port = free_port(), free_port()
        exporter_env = {
            **env,
            "TOOLFENCE_DATABASE_URL": f"sqlite:///{place / 'toolfence.db'}",
            "PROMETHEUS_MULTIPROC_DIR": str(place / "metrics"),
            "TOOLFENCE_TOOLS": "ledger.tools:registry",
        }
        exporter_url = f"http://127.0.0.1:{exporter_port}/metrics"
        # The demo migrates its database right after creating it: retry until it can.
        exporter = None
        deadline = time.monotonic() + 60
        while exporter is None or not answers(exporter_url):
            if exporter is not None and exporter.poll() is not None:
                exporter = None
            if exporter is None:
                exporter = start(
                    [sys.executable, "-m", "executor.cli", "metrics", "--port", str(exporter_port)],
                    base / "exporter.log",
                    exporter_env,
                )
                processes.append(exporter)
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"dashboard-snapshot: the exporter did not answer; see {base / 'exporter.log'}"
                )
            time.sleep(0.5)
        key = subprocess.run(
            [
                sys.executable,
                "-m",
                "executor.cli",
                "keys",
                "create",
                "--tenant",
                "acme",
                "--principal",
                "dashboard",
                "--scope",
                "read",
            ],
            env=exporter_env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        serve_port = free_port()
        serve = start(
            [sys.executable, "-m", "executor.cli", "serve", "--port", str(serve_port)],
            base / "serve.log",
            exporter_env,
        )
        processes.append(serve)
        serve_url = f"http://127.0.0.1:{serve_port}"
        wait_until("toolfence serve", lambda: answers(f"{serve_url}/healthz"), 60, serve)
        trickle_stop = threading.Event()
        trickle = threading.Thread(target=http_trickle, args=(serve_url, key, trickle_stop), daemon=True)
        trickle.start()
        config = base / "prometheus.yml"
        config.write_text(
            json.dumps(
                {
                    "global": {
                        "scrape_interval": f"{SCRAPE_SECONDS}s",
                        "scrape_timeout": f"{SCRAPE_SECONDS}s",
                        "evaluation_interval": f"{SCRAPE_SECONDS}s",
                    },
                    "scrape_configs": [
                        {
                            "job_name": "toolfence",
                            "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}],
                        }
                    ],
                }
            )
        )
        prometheus = start(
            [
                prometheus_binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={base / 'data'}",
                f"--web.listen-address=127.0.0.1:{prometheus_port}",
            ],
            base / "prometheus.log",
        )
        processes.append(prometheus)
        prometheus_url = f"http://127.0.0.1:{prometheus_port}"
        wait_until("prometheus", lambda: answers(f"{prometheus_url}/-/ready"), 60, prometheus)
        code = demo.wait(timeout=900)
        if code != 0:
            raise SystemExit(f"dashboard-snapshot: the demo failed ({code}); see {base / 'demo.log'}")
        time.sleep(args.after)
        trickle_stop.set()
        end = time.time()
        step = max(1.0, math.ceil((end - began) / 300))
        series: dict[int, list[tuple[str, list[float], list[float]]]] = {}
        for index, panel in enumerate(panels):
            for target in panel.get("targets", []):
                for result in query_range(prometheus_url, target["expr"], began, end, step):
                    xs = [float(t) for t, _ in result["values"]]
                    ys = [float(v) for _, v in result["values"]]
                    name = legend(target.get("legendFormat"), result["metric"], target["expr"])
                    series.setdefault(index, []).append((name, xs, ys))
        draw(
            panels,
            series,
            began,
            args.out,
            f"{dashboard['title']}: ops/grafana/toolfence.json's queries over "
            f"`toolfence demo --calls {args.calls}`",
        )
        print(
            f"dashboard-snapshot: wrote {args.out} ({len(panels)} panels, "
            f"{sum(len(v) for v in series.values())} series, {end - began:.0f} s of scrapes)"
        )
        return 0
    finally:
        for process in reversed(processes):
            stop(process)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
