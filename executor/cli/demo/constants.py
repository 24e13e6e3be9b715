"""The demo's tuning and exit codes (shared by every part of it)."""

from __future__ import annotations

import signal
import time
from types import FrameType

from executor.core.types import ServerContext
from executor.errors import CommandError

EXIT_OK = 0
EXIT_INVARIANT_FAILED = 1
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
EXIT_USAGE = 2

# Tuned on a 2-core machine running SQLite and the filesystem transport: a
# downstream call takes ~60 ms (so a fault can be caught inside one), the relay
# polls every 50 ms (each write of a request waits for the previous one to be
# published), and a `queued` operation is only republished after 15 s, so a
# backlog in the broker is not mistaken for a lost message.
LEDGER_LATENCY_MS = 60
RELAY_POLL_SECONDS = 0.05
RECONCILE_EVERY_SECONDS = 1.0
REQUEUE_QUEUED_AFTER_SECONDS = 15.0
POLL_SECONDS = 0.25
SETTLE_TIMEOUT_SECONDS = 90.0
WAVES = (0.4, 0.3, 0.3)
STEADY_QUEUED = 25  # wave 2 arrives as the fleet keeps up: the pause's takeover is not stuck in a queue

# The demo's durable turn (executor/cli/demo/turn.py): the worker holding it pauses
# right after step 2's checkpoint, so the demo can SIGKILL it there. The only fault
# point the demo sets; nothing in the workload is a turn, so it fires once.
TURN_FAULT = "turn_step_recorded:step2=sleep2"
TURN_WAIT_SECONDS = 2.0

# The people who decide the demo's approvals: an approver of each tenant, never the
# requester (the ledger's transfer lets only role "approver" of its tenant decide).
APPROVER = ServerContext(
    principal="ops-lead@acme", tenant="acme", roles=frozenset({"approver"}), request_id="demo-approvals"
)
DENIER = ServerContext(
    principal="ops-lead@globex", tenant="globex", roles=frozenset({"approver"}),
    request_id="demo-approvals",
)


class DemoError(CommandError):
    """Something the user can fix; printed as one line."""


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so the same cleanup runs as for Ctrl-C.

    A `BaseException` like `KeyboardInterrupt`, so no `except Exception` (nor
    `except ToolfenceError`) swallows it: deliberately outside the error family."""


class StopRequest:
    """The first Ctrl-C or SIGTERM: recorded by the handler, raised by the demo's own code.

    A raising handler runs at whatever bytecode the main thread is at, and that
    can be a garbage-collector callback (SQLAlchemy's `_collection_gced`), where
    Python prints "Exception ignored" with a traceback and drops the exception:
    the demo then ran to the end and exited 0 after a Ctrl-C. So the handler
    raises only when the main thread is asleep in `pause()` (where it spends
    most of its time, and where the exception lands in a frame of ours);
    anywhere else it records the signal, and the next `pause()` or
    `DemoRun.tick()` raises it.
    """

    def __init__(self) -> None:
        self.signum: int | None = None  # a stop still to be raised
        self.received = False  # a signal came: keep SIGINT/SIGTERM ignored until exit

    def request(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        self.received = True
        if frame is not None and frame.f_code is pause.__code__:
            self.check()

    def check(self) -> None:
        if self.signum is None:
            return
        raise KeyboardInterrupt() if self.signum == signal.SIGINT else _Terminated()


STOP = StopRequest()


def pause(seconds: float) -> None:
    """The demo's `time.sleep`: raise a stop that a signal asked for, before or during it."""
    STOP.check()
    time.sleep(seconds)


# ---------------------------------------------------------------------- where it runs
