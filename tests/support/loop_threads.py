"""A runtime's event loop in a thread of its own, and a sync job's call in another: for tests of
what a job's thread meets when that loop stops (or cancels its calls) under it. Every wait is
bounded."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any


class LoopThread:
    """An event loop running in a daemon thread; closed once stopped."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.loop.run_forever()
        self.loop.close()

    def stop(self) -> None:
        """Stop the loop (it closes in its thread) and wait for that, at most 5 s."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    def cancel_all(self) -> None:
        """Cancel every task on the loop, as livepush.loops.run() does at its end."""
        self.loop.call_soon_threadsafe(lambda: [task.cancel() for task in asyncio.all_tasks(self.loop)])


class Stuck:
    """A coroutine function that never returns, and the event it sets once called."""

    def __init__(self) -> None:
        self.started = threading.Event()

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.started.set()
        await asyncio.Event().wait()


class Caller:
    """`call()` in a daemon thread of its own, keeping what it raised."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.error: BaseException | None = None
        self._call = call
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._call()
        except BaseException as exc:  # noqa: BLE001 - examined by the test
            self.error = exc

    def ended(self, timeout: float = 5.0) -> bool:
        """Whether the call has ended within `timeout` seconds."""
        self._thread.join(timeout)
        return not self._thread.is_alive()
