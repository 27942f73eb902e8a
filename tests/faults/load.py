"""Load that keeps going through an outage: a publisher and a job enqueuer that try again after
a failure and remember every call that returned."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from livepush.fanout import FanOut
from livepush.jobs.api.functions import JobFunction
from livepush.types import Offset

# Seconds between two publishes of the load (an enqueue: four times that).
LOAD_INTERVAL = 0.005
# Seconds a background task of a test gets to end once told to stop.
STOP_BOUND = 10.0
# Pause after a failed publish or enqueue (the service is down): a retry, not a flood.
RETRY_PAUSE = 0.05


@dataclass(frozen=True)
class Published:
    """One publish() that returned: its topic, the offset it gave, the message's number."""

    topic: str
    offset: Offset
    n: int
    at: float  # time.monotonic() when publish() returned


class _Loop:
    """A background task that calls `step()` every `interval` s until stopped; a step that
    raises is counted (and its last error kept) and tried again after RETRY_PAUSE."""

    name = "load"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.failures = 0
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    async def step(self, n: int) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def _run(self) -> None:
        n = 0
        while not self._stopping:
            try:
                await self.step(n)
            except Exception as exc:  # the service is down: keep going, as an application would
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(RETRY_PAUSE)
            else:
                await asyncio.sleep(self.interval)
            n += 1  # never reused: a call that failed may still have taken effect

    async def stop(self) -> None:
        """Stop after the call in progress (a call that hangs is cancelled after STOP_BOUND s)."""
        self._stopping = True
        if self._task is not None:
            await stop_tasks([self._task], cancel=False)


async def stop_tasks(tasks: Sequence[asyncio.Task[None]], *, cancel: bool = True) -> None:
    """Wait until `tasks` (told to stop) end: cancelled at once with cancel=True, else after
    STOP_BOUND s; AssertionError if they are still running STOP_BOUND s after that."""
    if not tasks:
        return
    if not cancel:
        _, pending = await asyncio.wait(tasks, timeout=STOP_BOUND)
        tasks = list(pending)
    for task in tasks:
        task.cancel()
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=STOP_BOUND)
        assert not pending, f"{[t.get_name() for t in pending]} did not stop within {STOP_BOUND:g} s"


class Publisher(_Loop):
    """Publishes {"n": N} round-robin on `topics` through `fanout`; `published` lists every
    publish that returned an offset, in the order they returned."""

    name = "publisher"

    def __init__(self, fanout: FanOut, topic_names: Sequence[str], interval: float = LOAD_INTERVAL) -> None:
        super().__init__(interval)
        self.fanout = fanout
        self.topics = list(topic_names)
        self.published: list[Published] = []

    async def step(self, n: int) -> None:
        topic = self.topics[n % len(self.topics)]
        offset = await self.fanout.apublish(topic, {"n": n})
        self.published.append(Published(topic, offset, n, time.monotonic()))

    def count_since(self, t: float) -> int:
        return sum(1 for p in self.published if p.at >= t)


class Enqueuer(_Loop):
    """Enqueues `job(N)`; `ids` lists the job of every enqueue that returned a handle."""

    name = "enqueuer"

    def __init__(self, job: JobFunction, interval: float = 4 * LOAD_INTERVAL) -> None:
        super().__init__(interval)
        self.job = job
        self.ids: list[int] = []
        self.returned_at: list[float] = []

    async def step(self, n: int) -> None:
        handle = await self.job.aenqueue(n)
        self.ids.append(handle.id)
        self.returned_at.append(time.monotonic())

    def count_since(self, t: float) -> int:
        return sum(1 for at in self.returned_at if at >= t)
