"""Task groups suite: N no-op jobs in one group against the same N jobs without a group, in one
run on the same Postgres, and the group topic's event rate.

Each round runs both cases (interleaved, so drift hits both alike) in one runtime of this
process's event loop at concurrency 10:
- plain: `jobs.enqueue_many` of N jobs (1,000 per call), then run until every outcome is written;
- group: one `jobs.group()` block of the same N members with an on_finish callback, then run
  until the group is finished (its callback enqueued).
Figures: enqueue and processing rates (medians over the rounds; the goal: at most 15 % processing
overhead), and the most changes rung on `group:<id>` in any one second while members finished
(recorded in the group's event log; the goal: about 10 a second at most).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import report  # noqa: E402
from _services import livepush_db  # noqa: E402
from jobs_bench import run  # noqa: E402

from livepush.jobs import enqueue_many, get_group, group, job  # noqa: E402
from livepush.jobs.api.registry import Registry  # noqa: E402
from livepush.jobs.runtime.runtime import Runtime  # noqa: E402

REG = Registry()


async def noop(ctx: object) -> None:
    pass


noop_job = REG.add(job(name="gbench.noop")(noop))
finish_job = REG.add(job(name="gbench.finish")(noop))


def truncate(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("TRUNCATE livepush_job_payloads, livepush_jobs, livepush_job_runtimes, livepush_messages, "
                  "livepush_topics, livepush_group_events, livepush_group_callbacks, livepush_group_shards, "
                  "livepush_groups")
        c.execute("VACUUM ANALYZE livepush_jobs")


async def process(n: int, runtimes: int, concurrency: int, done: Any) -> float:
    """Run `runtimes` runtimes until done() is true; returns jobs per second."""
    rts = [Runtime(REG, queues=["default"], concurrency=concurrency, install_signals=False, heartbeat=5)
           for _ in range(runtimes)]
    t = time.perf_counter()
    tasks = [asyncio.create_task(rt.run()) for rt in rts]
    while not await done(rts):
        for task in tasks:
            if task.done():
                task.result()
                raise RuntimeError("a runtime stopped early")
        await asyncio.sleep(0.005)
    rate = n / (time.perf_counter() - t)
    for rt in rts:
        rt.stop()
    await asyncio.gather(*tasks)
    return rate


def plain(url: str, n: int, runtimes: int, concurrency: int) -> dict[str, float]:
    truncate(url)
    t = time.perf_counter()
    for _ in range(n // 1000):
        enqueue_many([noop_job.request() for _ in range(1000)])
    enq = n / (time.perf_counter() - t)

    async def done(rts: list[Runtime]) -> bool:
        return sum(rt.counts.get("succeeded", 0) for rt in rts) >= n

    return {"enqueue": enq, "process": run(process(n, runtimes, concurrency, done))}


def grouped(url: str, n: int, runtimes: int, concurrency: int) -> dict[str, float]:
    truncate(url)
    t = time.perf_counter()
    with group(on_finish=finish_job.request()) as g:
        for _ in range(n):
            g.enqueue(noop_job)
    enq = n / (time.perf_counter() - t)
    gid = g.handle.id

    async def done(rts: list[Runtime]) -> bool:
        # Members done, and the group finished (the last outcome's transaction enqueued the callback).
        if sum(rt.counts.get("succeeded", 0) for rt in rts) < n:
            return False
        view = await asyncio.to_thread(get_group, gid)
        return bool(view and view["finished_at"])

    rate = run(process(n, runtimes, concurrency, done))
    with psycopg.connect(url, autocommit=True) as c:
        # The group's events as its topic showed them (livepush records them for group_history()).
        rows = c.execute("SELECT extract(epoch FROM at) FROM livepush_group_events WHERE group_id = %s ORDER BY seq",
                         (gid,)).fetchall()
        callbacks = c.execute("SELECT count(*) FROM livepush_jobs WHERE callback_of = %s", (gid,)).fetchone()[0]
    stamps = [float(r[0]) for r in rows]
    span = max(stamps[-1] - stamps[0], 1e-9) if len(stamps) > 1 else 1.0
    window = 0
    j = 0
    for i, s in enumerate(stamps):
        while stamps[j] < s - 1.0:
            j += 1
        window = max(window, i - j + 1)
    assert callbacks == 1, callbacks
    return {"enqueue": enq, "process": rate, "events": len(stamps), "events_per_s": len(stamps) / span,
            "max_events_1s": window}


def figures(ctx: report.Context) -> list[report.Figure]:
    """The group's enqueue and processing rates against the same jobs without a group."""
    n, rounds_n = (5_000, 1) if ctx.quick else (10_000, 3)
    rounds = report.Rounds()
    with livepush_db(ctx.pg_admin_url, "bench_groups") as url:
        for r in range(rounds_n):
            for name, fn in (("plain", plain), ("group", grouped)):
                got = fn(url, n, 1, 10)
                rounds.add(name, got)
                report.note(f"  round {r + 1} {name}: " + ", ".join(f"{k} {v:,.1f}" for k, v in got.items()))
    base = "the same jobs without a group"
    return [
        report.Figure("enqueue in a task group", rounds.median("group", "enqueue") or 0.0, "jobs/s", base,
                      rounds.median("plain", "enqueue")),
        report.Figure("process in a task group, concurrency 10", rounds.median("group", "process") or 0.0, "jobs/s",
                      base, rounds.median("plain", "process"), goal=0.85),
        report.Figure("group topic events in the busiest second", rounds.median("group", "max_events_1s") or 0.0,
                      "events", higher_is_better=False),
    ]
