"""A runtime under churn keeps a flat memory: once the work is done, what it keeps per job, per
concurrency key, per queue, per group and per workflow run is back to its idle size.

The test runs rounds of mixed work through one runtime in this process: plain async and sync
jobs with progress, jobs of a thousand distinct concurrency keys, durable jobs with checkpoints
that wait for a signal, parents parked on a child, groups, workflow runs, jobs cancelled while
they run, and a queue paused and resumed. After each round, and a warm-up before them, every
in-memory map of the runtime is back to what it was at idle.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import re
import tracemalloc
from typing import Any

from livepush import jobs
from livepush.jobs.runtime.runtime import Runtime
from tests.jobs.conftest import q, running
from tests.support.churn import grown
from tests.support.waiting import async_wait_for

QUEUE = "churn"
PAUSED = "churn-paused"
ROUNDS = 3  # rounds after the warm-up
SIZE = 200  # jobs of each kind a round (keys: 5 times as many)
# Jobs a round: plain, sync, paused and keyed ones, parents and their children, durable and held
# ones, group members, and the two steps of each workflow run.
JOBS_A_ROUND = (SIZE * 3 + 5 * SIZE + 2 * (SIZE // 4) + SIZE // 4 + SIZE // 10 + 10 * (SIZE // 20) + 2 * (SIZE // 4)
                + 10 * (SIZE // 20))
# Bytes livepush's own allocations may grow by a job of the rounds after the first: what they hold
# between rounds wanders by tens of KB (a dict's table, a batch's lists), while an entry kept for
# every job takes 100 bytes and more.
GROWTH_PER_JOB = 25


@jobs.job(name="churn.plain", queue=QUEUE)
async def plain(ctx: Any, n: int) -> int:
    await ctx.progress(1, 2, "half")
    return n


@jobs.job(name="churn.sync", queue=QUEUE)
def sync(ctx: Any, n: int) -> int:
    ctx.progress(1, 2, "half")
    return n


@jobs.job(name="churn.keyed", queue=QUEUE, concurrency=("key", 1))
async def keyed(ctx: Any, key: str) -> str:
    return key


@jobs.job(name="churn.durable", queue=QUEUE)
async def durable(ctx: Any, n: int) -> Any:
    first = await ctx.checkpoint("first", _double, n)
    got = await ctx.wait_for_signal("go", timeout=600)
    return [first, got]


async def _double(n: int) -> int:
    return 2 * n


@jobs.job(name="churn.parent", queue=QUEUE)
async def parent(ctx: Any, n: int) -> Any:
    return await ctx.run_child(plain.request(n))


@jobs.job(name="churn.hold", queue=QUEUE, timeout=600)
async def hold(ctx: Any) -> None:
    await asyncio.sleep(600)  # until cancelled


@jobs.job(name="churn.late", queue=PAUSED)
async def late(ctx: Any, n: int) -> int:
    return n


flow = jobs.workflow("churn_flow", queue=QUEUE)


@flow.step()
async def first(ctx: Any) -> Any:
    return ctx.input["n"]


@flow.step(after=["first"])
def second(ctx: Any) -> Any:
    return ctx.outputs["first"] + 1


def maps(rt: Runtime) -> dict[str, int]:
    """The size of each in-memory map the runtime keeps per job, key, queue, group or run."""
    completer = rt._completer
    assert completer is not None
    out = {
        "in_hand": len(rt.in_hand),
        "deadlines": len(rt._deadlines),
        "deadline_buckets": rt._deadlines.buckets,
        "excluded": len(rt.excluded),
        "limited_empty": len(rt._limited_empty),
        "cancels_due": len(rt._cancels_due),
        "heard_while_claiming": len(rt._heard_while_claiming),
        "completer.outcomes": len(completer._outcomes),
        "completer.started": len(completer._started),
        "completer.dirty": len(completer._dirty),
        "groups_tracked": rt._group_progress.tracked() if rt._group_progress is not None else 0,
        "groups_marked": len(rt._group_progress._marked) if rt._group_progress is not None else 0,
    }
    scheduled = getattr(asyncio.get_running_loop(), "_scheduled", [])
    out["loop.timers"] = sum(not handle.cancelled() for handle in scheduled)
    names = collections.Counter(re.sub(r"\d+", "N", t.get_name()) for t in asyncio.all_tasks())
    for name, count in names.items():
        out[f"task {name}"] = count
    return out


def own_bytes() -> int:
    """Bytes that livepush's own code has allocated and still holds."""
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*/livepush/*")])
    return sum(stat.size for stat in snapshot.statistics("filename"))


def unfinished(url: str) -> int:
    return int(q(url, "SELECT count(*) FROM livepush_jobs WHERE queue IN (%s, %s) AND state NOT IN "
                      "('succeeded', 'failed', 'cancelled')", (QUEUE, PAUSED))[0][0])


async def churn(url: str, round_no: int, size: int) -> None:
    """One round of mixed work, waited for until every job of it has finished."""
    base = round_no * 100_000
    assert await jobs.apause_queue(PAUSED)
    for n in range(size):
        await late.aenqueue(n)
    await asyncio.gather(*(plain.aenqueue(n) for n in range(size)))
    await asyncio.gather(*(sync.aenqueue(n) for n in range(size)))
    await asyncio.gather(*(keyed.aenqueue(f"k{base + n}") for n in range(5 * size)))
    await asyncio.gather(*(parent.aenqueue(n) for n in range(size // 4)))
    waiting = await asyncio.gather(*(durable.aenqueue(n) for n in range(size // 4)))
    held = await asyncio.gather(*(hold.aenqueue() for _ in range(size // 10)))
    for _ in range(size // 20):
        with jobs.group() as g:
            for n in range(10):
                g.enqueue(plain, n)
    await asyncio.gather(*(flow.astart({"n": n}) for n in range(size // 4)))
    # Groups cancelled once their members here have run: the rest wait on the paused queue, and
    # the cancel finishes the group in its own transaction, not through an outcome of ours.
    cancelled = []
    for _ in range(size // 20):
        with jobs.group() as g:
            for n in range(5):
                g.enqueue(plain, n)
                g.enqueue(late, n)
        cancelled.append(g.handle.id)

    def parked(ids: list[int], state: str) -> bool:
        rows = q(url, "SELECT count(*) FROM livepush_jobs WHERE id = ANY(%s) AND state = %s", (ids, state))
        return bool(rows[0][0] == len(ids))

    await async_wait_for(lambda: parked([h.id for h in waiting], "waiting"), timeout=120)
    for h in waiting:
        await jobs.asignal(h.id, "go", {"n": h.id})
    await async_wait_for(lambda: parked([h.id for h in held], "running"), timeout=120)
    for h in held:
        assert await jobs.acancel(h.id)

    def ran_here(group_ids: list[int]) -> bool:
        rows = q(url, "SELECT count(*) FROM livepush_jobs WHERE group_id = ANY(%s) AND state = 'succeeded'",
                 (group_ids,))
        return bool(rows[0][0] == 5 * len(group_ids))

    await async_wait_for(lambda: ran_here(cancelled), timeout=120)
    await asyncio.sleep(0.5)  # their progress published (every PROGRESS_INTERVAL at most)
    for group_id in cancelled:
        assert await jobs.acancel_group(group_id)
    assert await jobs.aresume_queue(PAUSED)
    await async_wait_for(lambda: unfinished(url) == 0, timeout=300, interval=0.2,
                         message="every job of the round to finish")


async def idle_maps(rt: Runtime, idle: dict[str, int] | None = None) -> dict[str, int]:
    """The maps once the runtime has written every outcome and published every group's progress
    (bounded waits); with `idle`, waits for them to come back to it."""
    assert rt._completer is not None
    await rt._completer.wait_idle(30)
    if idle is not None:
        try:
            await async_wait_for(lambda: not grown(idle, maps(rt)), timeout=10)
        except AssertionError:
            pass
    else:
        await asyncio.sleep(1.0)  # group progress is published at most every PROGRESS_INTERVAL
    return maps(rt)


async def test_the_runtime_keeps_nothing_of_the_work_it_has_done(jobs_db: str) -> None:
    """Rounds of jobs, keys, durable waits, signals, children, groups, workflow runs, cancels and
    a paused queue leave every map of the runtime at its idle size once the work is done, and the
    memory livepush's own code holds no larger than after the first round."""
    async with running(queues=[QUEUE, PAUSED], concurrency=20, poll_interval=0.2) as rt:
        await churn(jobs_db, 0, SIZE // 4)
        idle = await idle_maps(rt)
        assert idle["in_hand"] == 0 and idle["completer.dirty"] == 0, idle
        tracemalloc.start(1)
        held: list[int] = []
        try:
            for round_no in range(1, ROUNDS + 1):
                await churn(jobs_db, round_no, SIZE)
                after = await idle_maps(rt, idle)
                assert not grown(idle, after), grown(idle, after)
                held.append(own_bytes())
        finally:
            tracemalloc.stop()
    # The first round's figure holds what is made once (prepared statements, metric children).
    assert held[-1] - held[0] <= GROWTH_PER_JOB * JOBS_A_ROUND * (ROUNDS - 1), (
        f"the runtime's own memory after each round of {JOBS_A_ROUND} jobs: {held} bytes")
