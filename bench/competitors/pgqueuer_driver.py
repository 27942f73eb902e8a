"""pgqueuer under the jobs benchmark: run by bench/jobs_bench.py with .venv-bench's python.

    .venv-bench/bin/python bench/competitors/pgqueuer_driver.py URL install|enqueue|process|fill|drain|pickup [N]

Prints one JSON object of figures. `fill` queues N no-op jobs; `drain` (one of several workers
on them) says "ready" once connected, waits for a line on stdin, and drains the queue. Configuration: pgqueuer's best as measured on this kind of machine, its default batch of 10 on
asyncpg, no cap on tasks in flight.
A pool driver is used so that the worker's listener, dequeue and status writes do not take
turns on one connection.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

import asyncpg
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.domain.types import QueueExecutionMode


async def _queries(url: str) -> tuple[asyncpg.Connection, Queries]:
    conn = await asyncpg.connect(url)
    return conn, Queries(AsyncpgDriver(conn))


async def install(url: str) -> dict:
    pool, q = await _queries(url)
    if not await q.schema_is_installed():
        await q.install()
    await pool.close()
    return {}


async def _clear(q: Queries) -> None:
    await q.clear_queue()
    await q.clear_queue_log()


async def enqueue(url: str, n: int) -> dict:
    pool, q = await _queries(url)
    await _clear(q)
    ones = max(100, min(1000, n // 20))  # as jobs_bench.singles()
    t = time.perf_counter()
    for _ in range(ones):
        await q.enqueue("noop", None)
    one = ones / (time.perf_counter() - t)
    await _clear(q)
    t = time.perf_counter()
    for _ in range(n // 1000):
        await q.enqueue(["noop"] * 1000, [None] * 1000, [0] * 1000)
    bulk = n / (time.perf_counter() - t)
    await _clear(q)
    await pool.close()
    return {"enqueue_one": one, "enqueue_bulk": bulk}


async def _fill(q: Queries, n: int) -> None:
    await _clear(q)
    for _ in range(n // 1000):
        await q.enqueue(["noop"] * 1000, [None] * 1000, [0] * 1000)


def _noop_manager(q: Queries, stop_at: int | None = None) -> tuple[QueueManager, list[int]]:
    """A QueueManager running no-op jobs, and its count of jobs run (stopping at `stop_at`)."""
    qm = QueueManager(q)
    seen = [0]

    @qm.entrypoint("noop")
    async def noop(job: object) -> None:
        seen[0] += 1
        if stop_at is not None and seen[0] >= stop_at:
            qm.shutdown.set()

    return qm, seen


async def process(url: str, n: int) -> dict:
    pool, q = await _queries(url)
    await _fill(q, n)
    qm, seen = _noop_manager(q, stop_at=n)
    t = time.perf_counter()
    # Drain mode also stops when the queue is empty; the entrypoint stops it at the Nth job.
    # run() returns after flushing its status buffer, so every outcome is written.
    await qm.run(batch_size=10, mode=QueueExecutionMode.drain)
    rate = n / (time.perf_counter() - t)
    await pool.close()
    return {"process": rate, "processed": seen[0]}


async def fill(url: str, n: int) -> dict:
    pool, q = await _queries(url)
    await _fill(q, n)
    await pool.close()
    return {}


async def drain(url: str, n: int) -> dict:
    """Drain what `fill` queued, from the parent's go (a line on stdin) until the queue is empty:
    the wall-clock start and end, for a rate over several workers."""
    pool, q = await _queries(url)
    qm, seen = _noop_manager(q)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    start = time.time()
    await qm.run(batch_size=10, mode=QueueExecutionMode.drain)
    end = time.time()
    await pool.close()
    return {"start": start, "end": end, "processed": seen[0]}


async def pickup(url: str, n: int) -> dict:
    pool, q = await _queries(url)
    await _clear(q)
    qm = QueueManager(q)
    lat: list[float] = []
    got = asyncio.Event()

    @qm.entrypoint("stamp")
    async def stamp(job: object) -> None:
        lat.append((time.time() - float(job.payload)) * 1000)  # type: ignore[attr-defined]
        if len(lat) >= n:
            got.set()

    @qm.entrypoint("warm")
    async def warm(job: object) -> None:
        pass

    task = asyncio.create_task(qm.run(batch_size=10))
    # Warm the client as every system's is (jobs_bench.py's docstring): one job, then idle.
    await q.enqueue("warm", None)
    await asyncio.sleep(1.0)  # idle: the worker waits on its LISTEN
    for _ in range(n):
        await q.enqueue("stamp", str(time.time()).encode())
        await asyncio.sleep(0.02)
    await asyncio.wait_for(got.wait(), 30)
    qm.shutdown.set()
    await asyncio.wait_for(task, 30)
    await pool.close()
    lat.sort()
    return {"pickup_p50": statistics.median(lat), "pickup_p99": lat[int(len(lat) * 0.99) - 1]}


def main() -> None:
    url, what = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 20_000
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    import logging

    logging.disable(logging.WARNING)
    coro = {"install": lambda: install(url), "enqueue": lambda: enqueue(url, n),
            "process": lambda: process(url, n), "fill": lambda: fill(url, n),
            "drain": lambda: drain(url, n), "pickup": lambda: pickup(url, n)}[what]()
    print(json.dumps(asyncio.run(coro)))


if __name__ == "__main__":
    main()
