"""The demo's stop signals, in this process: where the handler raises and where it only records.

A raising signal handler that lands in a garbage-collector callback has its
exception printed and dropped by Python; these tests put the signal exactly
there (and in `pause()`), with real signals through `signal.raise_signal`.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from executor.cli.demo.constants import STOP, _Terminated, pause
from executor.cli.demo.run import _signals_raise


@pytest.fixture(autouse=True)
def _restore_handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    STOP.signum, STOP.received = None, False


class _Thing:
    pass


def test_stop__signal_lands_in_a_gc_callback__nothing_raised_there__the_next_pause_raises_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dropped: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)
    with _signals_raise():
        # Given an object whose weakref callback runs when it is collected
        thing = _Thing()
        ref = weakref.ref(thing, lambda _: signal.raise_signal(signal.SIGINT))
        # When Ctrl-C is handled inside that callback
        del thing
        assert ref() is None
        # Then nothing was raised (and dropped) there, and the stop is still owed
        assert dropped == []
        assert STOP.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            pause(0.01)
    # And both signals stay ignored until the process exits
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def test_stop__sigterm_while_asleep_in_pause__raised_at_once() -> None:
    with _signals_raise():
        # Given the demo asleep in a long pause
        main = threading.main_thread().ident
        assert main is not None
        threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGTERM)).start()
        started = time.monotonic()
        # When SIGTERM arrives, Then the pause ends with _Terminated, long before its 30 s
        with pytest.raises(_Terminated):
            pause(30)
        assert time.monotonic() - started < 20


def test_stop__no_signal__handlers_put_back() -> None:
    before = signal.getsignal(signal.SIGINT)
    with _signals_raise():
        pause(0.01)
    assert signal.getsignal(signal.SIGINT) is before
