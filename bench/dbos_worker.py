"""A DBOS worker process for the comparison: a queued workflow with one step."""

from __future__ import annotations

import os
import signal
import threading

from dbos import DBOS

DBOS(
    config={
        "name": "toolfence-bench",
        "system_database_url": os.environ["BENCH_DBOS_URL"],
        "run_admin_server": False,
    }
)



@DBOS.step()
def bench_step(i: int) -> int:
    return i


@DBOS.workflow()
def bench_workflow(i: int) -> int:
    return bench_step(i)


if __name__ == "__main__":
    DBOS.launch()
    DBOS.register_queue(
        "bench",
        worker_concurrency=int(os.environ.get("BENCH_DBOS_CONCURRENCY", "1")),
        polling_interval_sec=float(os.environ.get("BENCH_DBOS_POLL", "0.01")),
    )
    print("dbos worker ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    DBOS.destroy()
