"""The runtime's job timeouts (livepush/jobs/runtime/deadlines.py): a deadline never fires early,
fires at most a grain late, and one discarded never fires; nothing is kept for either."""

from __future__ import annotations

import asyncio

from livepush.jobs.runtime.deadlines import GRAIN, Deadlines
from tests.support.waiting import async_wait_for


async def test_a_deadline_fires_after_its_time_never_before() -> None:
    loop = asyncio.get_running_loop()
    fired: dict[str, float] = {}
    deadlines: Deadlines[str] = Deadlines(lambda item: fired.setdefault(item, loop.time()))
    start = loop.time()
    for n, seconds in enumerate((0.01, 0.12, 0.12, 0.3)):
        deadlines.add(n, seconds, f"{n}:{seconds}")
    await async_wait_for(lambda: len(fired) == 4, timeout=5)
    for item, at in fired.items():
        assert at - start >= float(item.split(":")[1]), item
    assert len(deadlines) == 0


async def test_the_timer_of_a_deadline_is_set_within_a_grain_of_it() -> None:
    """The bucket's one timer is the end of the grain-long slice its deadlines fall in."""
    loop = asyncio.get_running_loop()
    deadlines: Deadlines[int] = Deadlines(lambda item: None)
    before = loop.time()
    bucket = deadlines.add(1, 30, 1)
    after = loop.time()
    assert before + 30 <= bucket * GRAIN < after + 30 + GRAIN
    assert deadlines.add(2, 30, 2) in (bucket, bucket + 1)  # one timer for the jobs of a slice


async def test_a_discarded_deadline_never_fires_and_nothing_is_kept() -> None:
    fired: list[int] = []
    deadlines: Deadlines[int] = Deadlines(fired.append)
    buckets = [deadlines.add(n, 0.05, n) for n in range(100)]
    for n, bucket in enumerate(buckets):
        if n % 2:
            deadlines.discard(bucket, n)
    assert len(deadlines) == 50
    await async_wait_for(lambda: len(fired) == 50, timeout=5)
    assert sorted(fired) == list(range(0, 100, 2))
    assert len(deadlines) == 0
