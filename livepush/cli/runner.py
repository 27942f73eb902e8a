"""How a long-running command runs: its coroutine on uvloop where available, once per process
(after it, the process only exits)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Coroutine
from typing import Any


def run_async(coro: Coroutine[Any, Any, int]) -> int:
    _open_standard_descriptors()
    try:
        return _run(coro)
    finally:
        # The loop's handlers are gone with it, and the signals' default is to kill: a second
        # SIGTERM or SIGINT (Ctrl-C twice) that lands while Python tears down would turn a clean
        # stop into death by that signal. What it asks for is done already.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)


def _run(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _open_standard_descriptors() -> None:
    """Point any of descriptors 0, 1 and 2 that is closed (`livepush serve <&-`) at /dev/null.

    Otherwise the next socket opened takes it, and uvloop aborts the whole process (SIGABRT) when
    it closes a descriptor that low, which is at the stop at the latest."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)  # the lowest free number: `fd` itself
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
