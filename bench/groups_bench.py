"""Task group benchmark (not a test): 10,000 no-op jobs in one group against the same 10,000
jobs without a group, in one run on the same Postgres, and the group topic's event rate.

    .venv/bin/python bench/groups_bench.py                      # throwaway durable Postgres, 3 rounds
    .venv/bin/python bench/groups_bench.py --pg-port 55510 --rounds 1 --runtimes 2

Without --pg-url it starts a throwaway PostgreSQL (durable defaults; --pg-no-fsync turns
fsync off) and removes it at the end. Each round runs both cases (interleaved, so drift hits
both alike) in `--runtimes` runtimes of this process's event loop at `--concurrency` each:
- plain: `jobs.enqueue_many` of N jobs (1,000 per call), then run until every outcome is written;
- group: one `jobs.group()` block of the same N members with an on_finish callback, then run
  until the group is finished (its callback enqueued).
Reported: enqueue and processing rates (medians over the rounds), the group's overhead on
processing, and the changes rung on `group:<id>` while members finished (recorded in the
group's event log: total, per second over the run, and the most in any one-second window).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from typing import Any

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _services import Services  # noqa: E402
from jobs_bench import drop_db, make_db, run  # noqa: E402

from livepush import config  # noqa: E402
from livepush.jobs import database, enqueue_many, get_group, group, job  # noqa: E402
from livepush.jobs.api.registry import Registry  # noqa: E402
from livepush.jobs.runtime.runtime import Runtime  # noqa: E402
from livepush.migrate import migrate  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pg-url", help="an admin URL of a running PostgreSQL (a scratch database is made there)")
    ap.add_argument("--pg-port", type=int, default=0)
    ap.add_argument("--pg-no-fsync", action="store_true")
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runtimes", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=10)
    args = ap.parse_args()
    services = Services()
    try:
        admin = args.pg_url or services.start_postgres(args.pg_port, durable=not args.pg_no_fsync)
        url = make_db(admin, "bench_groups")
        migrate(url)
        config.set_settings(config.Settings(database_url=url, fanout="postgres", env="test"))
        database.configure(url)
        print(f"{os.cpu_count()} cores, {args.rounds} round(s), {args.jobs:,} jobs, {args.runtimes} runtime(s) "
              f"x concurrency {args.concurrency}, fsync {'off' if args.pg_no_fsync else 'on'}", flush=True)
        results: dict[str, list[dict[str, float]]] = {"plain": [], "group": []}
        for r in range(args.rounds):
            for name, fn in (("plain", plain), ("group", grouped)):
                got = fn(url, args.jobs, args.runtimes, args.concurrency)
                results[name].append(got)
                print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:,.1f}" for k, v in got.items()), flush=True)

        def med(name: str, key: str) -> float:
            return statistics.median(x[key] for x in results[name])

        print()
        print(f"{'':28}{'plain':>12}{'group':>12}{'group/plain':>14}")
        for key, label in (("enqueue", "enqueue jobs/s"), ("process", "process jobs/s")):
            p, g = med("plain", key), med("group", key)
            print(f"{label:28}{p:>12,.0f}{g:>12,.0f}{g / p:>14.2f}")
        overhead = 1 - med("group", "process") / med("plain", "process")
        print(f"processing overhead of the group: {overhead * 100:.1f} % (goal: at most 15 %)")
        print(f"group topic events: {med('group', 'events'):.0f} in total, {med('group', 'events_per_s'):.1f}/s "
              f"over the run, at most {med('group', 'max_events_1s'):.0f} in any second (goal: about 10/s at most)")
        drop_db(admin, "bench_groups")
    finally:
        services.stop()


if __name__ == "__main__":
    main()
