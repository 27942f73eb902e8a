"""How the handlers of the stop signals (SIGTERM, SIGINT) leave an event loop.

When a loop's handler is removed the signal's default action comes back, and for these two it
kills the process. A process whose stop a signal already asked for is on its way out: a second
Ctrl-C or SIGTERM in its last moments asks for what is done, and must not turn a clean exit into
death by that signal. So the signals are held back while the handlers change hands, and ignored
from then on once a stop was asked for. The command line holds them back from its first moment
too, until the command has set what they do while it starts (hold_start, release_start).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not imported here: the command line imports this module first thing (hold_start)
    import asyncio

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# What the command line holds back while it starts: the stop signals, and the hangup it may
# turn into one.
_START_SIGNALS = (*STOP_SIGNALS, signal.SIGHUP)
# The signal mask from before hold_start(), until release_start() puts it back.
_mask_before_start: set[int] | None = None


@contextmanager
def held_then_ignored(signals: Iterable[int] = STOP_SIGNALS, *, ignore: bool = True) -> Iterator[None]:
    """Hold `signals` back for the block; ignore them after it when `ignore`. One that came
    meanwhile is dropped (setting SIG_IGN discards a pending signal) or, if not ignored,
    delivered to whatever handler the block left. Main thread only, as signal.signal()."""
    signals = list(signals)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        try:
            if ignore:
                for sig in signals:
                    signal.signal(sig, signal.SIG_IGN)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


def remove_handlers(loop: asyncio.AbstractEventLoop, signals: Iterable[int], *, ignore: bool) -> None:
    """Take the loop's handlers of `signals` off; the signals are ignored after when `ignore`
    (a stop was asked for), else they get their default action back."""
    signals = list(signals)
    if not signals:
        return
    with held_then_ignored(signals, ignore=ignore):
        for sig in signals:
            loop.remove_signal_handler(sig)


def hold_start() -> None:
    """Hold SIGTERM, SIGINT and SIGHUP back from the command line's first moment until
    release_start(): while the package imports, no handler of ours is set yet, and SIGTERM's
    default would end a starting `livepush jobs` with 143 instead of its clean stop. Main thread,
    before any other thread starts (they inherit the mask)."""
    global _mask_before_start
    if _mask_before_start is None:
        _mask_before_start = signal.pthread_sigmask(signal.SIG_BLOCK, _START_SIGNALS)


def release_start() -> None:
    """Let the signals hold_start() held back through, to the handlers the command has set by
    now (term_as_interrupt(): a clean stop); one that came meanwhile is delivered here. Does
    nothing when nothing was held (the command run in-process)."""
    global _mask_before_start
    if _mask_before_start is not None:
        before, _mask_before_start = _mask_before_start, None
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def term_as_interrupt() -> None:
    """Until an event loop takes the stop signals over, SIGTERM stops the command as Ctrl-C does
    (KeyboardInterrupt, which the command line ends with exit 0) instead of killing it where it
    stands: a stop asked for while it starts (waiting for a database, importing the app) is a
    clean stop too. Main thread only, as signal.signal()."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def hangup_as_term() -> None:
    """SIGHUP, which a closed terminal or a dropped ssh session sends, stops the command as SIGTERM
    does, whatever SIGTERM does at that moment (a clean stop while it starts, a drain once it
    runs, nothing once it stops): by default it would end the process where it stands. Only the
    first one: a closing terminal sends two (the shell passes its own on, and the kernel sends
    one as the shell exits), which ask for one stop, not for a hurried one. Not under `nohup`,
    which asked for SIGHUP to be ignored. Main thread only, as signal.signal()."""
    if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:
        signal.signal(signal.SIGHUP, _relay_hangup)


def _relay_hangup(signum: int, frame: object) -> None:
    # Ignored from now on, rather than relayed again: a second SIGTERM would cut the drain short.
    # SIG_IGN also outlives the interpreter's teardown, which puts a Python handler back to the
    # default action, so a hangup while the process exits cannot end it by the signal either.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    loop = None
    aio = sys.modules.get("asyncio")  # no loop runs before asyncio was imported
    if aio is not None:
        try:
            loop = aio.get_running_loop()
        except RuntimeError:
            pass
    if loop is None:
        os.kill(os.getpid(), signal.SIGTERM)
    else:
        # From the loop's next turn, not from inside this handler: uvloop runs a loop's handler
        # twice for a signal raised while it dispatches another, and a second SIGTERM hurries
        # the stop (jobs given back undrained).
        loop.call_soon_threadsafe(os.kill, os.getpid(), signal.SIGTERM)
