"""How a long-running command runs: its coroutine on uvloop where available, once per process
(after it, the process only exits)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any

from .. import loops, stopsignals


def run_async(coro: Coroutine[Any, Any, int]) -> int:
    """Run the command's coroutine to its end (loops.run(): a job that swallows its cancellation
    does not hold the stopped process). After it the process only exits, so a stop signal while
    the loop closes (Ctrl-C twice) is ignored, not left to kill by default."""
    open_standard_descriptors()
    return loops.run(coro, loop_factory=_loop_factory(), closing=stopsignals.held_then_ignored)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def open_standard_descriptors() -> None:
    """Point any of descriptors 0, 1 and 2 that is closed (`livepush serve <&-`) at /dev/null.

    Otherwise the next file or socket opened takes it: uvloop aborts the whole process (SIGABRT)
    when it closes a descriptor that low, and what a subprocess writes to its standard output
    (a worker's, or a job's) lands in that file (a metrics file of `serve --workers N`)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)  # the lowest free number: `fd` itself
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
            # os.open() makes it close on exec: the processes this one starts (the workers of
            # `serve --workers N`) would find it closed again.
            os.set_inheritable(fd, True)
