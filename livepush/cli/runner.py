"""How a long-running command runs: its coroutine on uvloop where available, once per process
(after it, the process only exits)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any


def run_async(coro: Coroutine[Any, Any, int]) -> int:
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
