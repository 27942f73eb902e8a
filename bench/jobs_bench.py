"""Job runtime benchmark (not a test): livepush against a bare SKIP LOCKED loop, same Postgres.

    .venv/bin/python bench/jobs_bench.py postgresql://postgres@127.0.0.1:5432/postgres

Creates (and drops) a scratch database `livepush_jobs_bench`. Measures, with job events on
(Postgres fan-out): enqueue one at a time and in bulk (jobs/s); 20,000 no-op async jobs
drained by one runtime at concurrency 10 (jobs/s); pickup latency p50/p99 at 50 jobs/s into
an idle runtime; and the bare loop claiming 50 per statement as the ceiling. procrastinate
and pgqueuer (in a separate .venv-bench) are not wired in yet.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

import psycopg

from livepush import config
from livepush.jobs import database, enqueue_many, job
from livepush.jobs.registry import Registry
from livepush.jobs.runtime import Runtime
from livepush.migrate import migrate

N = 20_000
done_at: dict[int, float] = {}
REG = Registry()


async def noop(ctx: object) -> None:
    pass


async def stamp(ctx: object, sent: float) -> None:
    done_at[ctx.job_id] = time.time() - sent  # type: ignore[attr-defined]


noop_job = REG.add(job(name="bench.noop")(noop))
stamp_job = REG.add(job(name="bench.stamp")(stamp))


def setup(admin: str) -> str:
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS livepush_jobs_bench")
        c.execute("CREATE DATABASE livepush_jobs_bench")
    url = psycopg.conninfo.make_conninfo(admin, dbname="livepush_jobs_bench")
    migrate(url)
    config.set_settings(config.Settings(database_url=url, fanout="postgres", env="test"))
    database.configure(url)
    return url


def truncate(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("TRUNCATE livepush_job_payloads, livepush_jobs, livepush_messages, livepush_topics")
        c.execute("VACUUM ANALYZE livepush_jobs")


def bench_enqueue(url: str) -> tuple[float, float]:
    truncate(url)
    t = time.perf_counter()
    for _ in range(1000):
        noop_job.enqueue()
    one = 1000 / (time.perf_counter() - t)
    truncate(url)
    t = time.perf_counter()
    for _ in range(N // 1000):
        enqueue_many([noop_job.request() for _ in range(1000)])
    bulk = N / (time.perf_counter() - t)
    return one, bulk


async def bench_process(url: str) -> float:
    truncate(url)
    for _ in range(N // 1000):
        enqueue_many([noop_job.request() for _ in range(1000)])
    rt = Runtime(REG, queues=["default"], concurrency=10, install_signals=False, heartbeat=5)
    t = time.perf_counter()
    task = asyncio.create_task(rt.run())
    while rt.counts.get("succeeded", 0) < N:
        await asyncio.sleep(0.01)
    rate = N / (time.perf_counter() - t)
    rt.stop()
    await task
    return rate


async def bench_pickup(url: str) -> tuple[float, float]:
    truncate(url)
    done_at.clear()
    rt = Runtime(REG, queues=["default"], concurrency=10, install_signals=False, heartbeat=5)
    task = asyncio.create_task(rt.run())
    await rt.wait_started()
    await asyncio.sleep(0.3)
    for _ in range(300):
        await stamp_job.aenqueue(time.time())
        await asyncio.sleep(0.02)
    while len(done_at) < 300:
        await asyncio.sleep(0.01)
    rt.stop()
    await task
    lat = sorted(v * 1000 for v in done_at.values())
    return statistics.median(lat), lat[int(len(lat) * 0.99) - 1]


def bench_bare(url: str) -> float:
    truncate(url)
    for _ in range(N // 1000):
        enqueue_many([noop_job.request() for _ in range(1000)])
    sql = """
    WITH picked AS (SELECT id FROM livepush_jobs WHERE state = 'available' AND queue = 'default'
                    ORDER BY priority, run_at, id LIMIT 50 FOR UPDATE SKIP LOCKED)
    UPDATE livepush_jobs j SET state = 'succeeded' FROM picked WHERE j.id = picked.id RETURNING j.id"""
    t = time.perf_counter()
    n = 0
    with psycopg.connect(url, autocommit=True) as c:
        while True:
            got = len(c.execute(sql).fetchall())
            if not got:
                break
            n += got
    return n / (time.perf_counter() - t)


def main() -> None:
    admin = sys.argv[1] if len(sys.argv) > 1 else "postgresql://postgres@127.0.0.1:5432/postgres"
    url = setup(admin)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    one, bulk = bench_enqueue(url)
    print(f"enqueue one at a time: {one:,.0f} jobs/s")
    print(f"enqueue bulk (1000 per call): {bulk:,.0f} jobs/s")
    rates = [runner(bench_process(url)) for _ in range(3)]
    print(f"process {N:,} no-op async jobs, concurrency 10, events on: {statistics.median(rates):,.0f} jobs/s "
          f"(runs {', '.join(f'{r:,.0f}' for r in rates)})")
    p50, p99 = runner(bench_pickup(url))
    print(f"pickup latency at 50 jobs/s: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    bare = statistics.median(bench_bare(url) for _ in range(3))
    print(f"bare SKIP LOCKED loop, 50 per statement: {bare:,.0f} jobs/s")
    print(f"livepush / bare: {statistics.median(rates) / bare:.2f}")
    database.configure(None)
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS livepush_jobs_bench WITH (FORCE)")


if __name__ == "__main__":
    main()
