"""The server process of one MCP session, killed by its pid without ever hitting a reused one.

The SDK's stdio transport spawns the server in a new session (so its pid is
also its process group id) and, when the session ends, closes its stdin and
escalates SIGTERM → SIGKILL over about four seconds. A stopped (SIGSTOP) or
wedged server ignores all but the last step, and until then every call waits
on it. Healing a session kills the process itself, after a short grace.

A pid is only safe to signal while it is unreaped: once reaped it may be
handed to any new process. So the process is held by a pidfd opened as soon
as it is spawned and checked to be a child of this process (`waitid` on a
pidfd answers only for one's own children); a signal through the pidfd
reaches that process or fails, never another one. Reaping stays with
asyncio's child watcher, which waits for every child it spawned.
"""

from __future__ import annotations

import logging
import os
import signal
from contextlib import suppress
from typing import Any

logger = logging.getLogger("toolfence.mcp.process")


class ServerProcess:
    """One spawned MCP server: its pid, a pidfd that pins it, and whether it has exited."""

    def __init__(self, process: Any) -> None:
        self._process = process
        self.pid: int = int(process.pid)
        self._pidfd: int | None = None
        # Reaped before it could be pinned: its pid may already be someone else's.
        self._gone = False
        if hasattr(os, "pidfd_open"):
            self._pidfd, self._gone = _own_child_pidfd(self.pid)

    @classmethod
    def from_stdio_context(cls, context: Any) -> ServerProcess | None:
        """The process behind an entered `mcp.client.stdio.stdio_client` context, if visible.

        The SDK does not expose it; the suspended generator's frame holds it as
        its local `process`. Read-only; if an SDK change hides it, healing falls
        back to the SDK's own shutdown and this says so.
        """
        frame = getattr(getattr(context, "gen", None), "ag_frame", None)
        process = frame.f_locals.get("process") if frame is not None else None
        if process is None or not isinstance(getattr(process, "pid", None), int):
            logger.warning("cannot see the MCP server process of the stdio transport; "
                           "a hung server is stopped by the SDK's slower shutdown only")
            return None
        return cls(process)

    @property
    def exited(self) -> bool:
        """Whether the process has been reaped (its exit status is known)."""
        return self._process.returncode is not None

    @property
    def pinned(self) -> bool:
        """Whether a pidfd pins the process (signals cannot reach a reused pid)."""
        return self._pidfd is not None

    def kill(self) -> bool:
        """SIGKILL the server and its process group; False if it was already gone."""
        if self._gone:
            return False
        if self._pidfd is not None:
            try:
                # Signal 0 through the pidfd: the leader is still unreaped, so its
                # pid, which is also its group's id, still names our process group.
                signal.pidfd_send_signal(self._pidfd, 0)
            except ProcessLookupError:
                return False
        elif self.exited:
            return False
        # The group first: descendants (an `npx` wrapper's node) die with the leader.
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        if self._pidfd is not None:
            with suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        logger.info("killed MCP server process %d", self.pid)
        return True

    def release(self) -> None:
        """Close the pidfd (the session is over; the process was waited for)."""
        pidfd, self._pidfd = self._pidfd, None
        # Whatever became of it, it is no longer ours to signal.
        self._gone = True
        if pidfd is not None:
            os.close(pidfd)


def _own_child_pidfd(pid: int) -> tuple[int | None, bool]:
    """(a pidfd for `pid`, False) if it is a child of ours; (None, True) if it is not any more."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None, True
    except OSError:
        # No pidfd support here: fall back to the returncode check.
        return None, False
    try:
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        # The pid was reaped and reused by a process that is not our child.
        os.close(pidfd)
        return None, True
    return pidfd, False
