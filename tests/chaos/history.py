"""The campaign's history: one JSON object per line, in the order things were seen.

Kinds written while the campaign runs:

- `admission`: one per proposed call, as the producer's `enqueue` answered it
  (`operation_id` set when admitted, `code` when rejected);
- `result`: what the client saw when the request settled (or `timeout`);
- `fault`: each fault the harness injected (`fault` names the kind);
- `fault_point`: each firing of an in-process fault point (from the fault log);
- `member_exit`: a fleet process that died without the harness killing it;
- `phase`: chaos started, faults stopped, quiet reached.

And after the run, from the database (`db.*`): the operations, every audit event
(each reservation with its generation), the receipts toolfence recorded, the
ledger's accepted effects and fenced writes, the calls table and each call's final
result. The checker reads only this file, so a run can be re-checked offline.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class History:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._handle = path.open("a", encoding="utf-8")
        self.started = time.time()

    def add(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"kind": kind, "t": round(time.time(), 4), **fields}, default=str)
        with self._lock:
            self._handle.write(line + "\n")

    def add_many(self, kind: str, rows: list[dict[str, Any]]) -> None:
        now = round(time.time(), 4)
        if rows and ("kind" in rows[0] or "t" in rows[0]):
            raise ValueError(f"{kind}: a row's own `kind` or `t` would be lost; rename it")
        with self._lock:
            for row in rows:
                self._handle.write(json.dumps({"kind": kind, "t": now, **row}, default=str) + "\n")

    def flush(self) -> None:
        with self._lock:
            self._handle.flush()

    def close(self) -> None:
        with self._lock:
            self._handle.close()


def read(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def by_kind(path: Path) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in read(path):
        grouped[event["kind"]].append(event)
    return grouped
