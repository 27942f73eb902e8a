"""The runtime's job timeouts (livepush/jobs/runtime/deadlines.py): a deadline never fires early,
fires at most a grain late, and one discarded never fires; nothing is kept for either, and a
timeout must be a positive number of seconds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from livepush import jobs
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


async def test_an_infinite_time_sets_no_timer_and_a_bucket_goes_once_emptied() -> None:
    deadlines: Deadlines[int] = Deadlines(lambda item: None)
    assert deadlines.add(0, float("inf"), 0) is None
    deadlines.discard(None, 0)
    buckets = [deadlines.add(n, 3600, n) for n in range(10)]
    for n, bucket in enumerate(buckets):
        deadlines.discard(bucket, n)
    # The bucket being added to stays (it would only be made again), the others go.
    assert deadlines.buckets <= 1 and len(deadlines) == 0
    later = deadlines.add(10, 7200, 10)
    assert deadlines.buckets == 1 and later not in buckets


def test_a_timeout_that_is_not_a_positive_number_is_refused_at_the_decorator() -> None:
    async def f(ctx: Any) -> None: ...

    for bad in (0, -1, float("nan"), True, "5"):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            jobs.job(name="t.bad_timeout", timeout=bad)(f)
    assert jobs.job(name="t.no_timeout", timeout=float("inf"))(f).timeout == float("inf")
