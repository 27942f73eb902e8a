"""procrastinate under the jobs benchmark: run by bench/jobs_bench.py with .venv-bench's python.

    .venv-bench/bin/python bench/competitors/procrastinate_driver.py URL install|enqueue|process|fill|drain|pickup [N]

Prints one JSON object of figures. Configuration: its psycopg connector, a worker at
concurrency 10 with LISTEN/NOTIFY on (its default), async no-op tasks. `fill` queues N no-op
jobs; `drain` (one of several workers on them) says "ready" once connected, waits for a line on
stdin, and runs until no job is left.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import sys
import time

import procrastinate

URL = sys.argv[1]
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=URL))
seen = 0
target = 0
lat: list[float] = []
all_done = asyncio.Event()


@app.task(name="noop")
async def noop() -> None:
    global seen
    seen += 1


@app.task(name="stamp")
async def stamp(sent: float) -> None:
    lat.append((time.time() - sent) * 1000)
    if len(lat) >= target:
        all_done.set()


async def _clear() -> None:
    await app.connector.execute_query_async(
        "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers CASCADE")


async def install(n: int) -> dict:
    async with app.open_async():
        try:
            await app.schema_manager.apply_schema_async()
        except Exception as exc:  # already there
            if "already exists" not in str(exc):
                raise
    return {}


async def enqueue(n: int) -> dict:
    async with app.open_async():
        await _clear()
        ones = max(100, min(1000, n // 20))  # as jobs_bench.singles()
        t = time.perf_counter()
        for _ in range(ones):
            await noop.defer_async()
        one = ones / (time.perf_counter() - t)
        await _clear()
        t = time.perf_counter()
        for _ in range(n // 1000):
            await noop.batch_defer_async(*[{} for _ in range(1000)])
        bulk = n / (time.perf_counter() - t)
        await _clear()
    return {"enqueue_one": one, "enqueue_bulk": bulk}


async def process(n: int) -> dict:
    async with app.open_async():
        await _clear()
        for _ in range(n // 1000):
            await noop.batch_defer_async(*[{} for _ in range(1000)])
        t = time.perf_counter()
        # wait=False: the worker returns once no job is left, each outcome written.
        await app.run_worker_async(concurrency=10, wait=False)
        rate = n / (time.perf_counter() - t)
    return {"process": rate, "processed": seen}


async def fill(n: int) -> dict:
    async with app.open_async():
        await _clear()
        for _ in range(n // 1000):
            await noop.batch_defer_async(*[{} for _ in range(1000)])
    return {}


async def drain(n: int) -> dict:
    """From the parent's go (a line on stdin) until no job is left: the wall-clock start and end."""
    async with app.open_async():
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        start = time.time()
        await app.run_worker_async(concurrency=10, wait=False)
        end = time.time()
    return {"start": start, "end": end, "processed": seen}


async def pickup(n: int) -> dict:
    global target
    target = n
    async with app.open_async():
        await _clear()
        worker = asyncio.create_task(app.run_worker_async(concurrency=10, wait=True))
        # Warm the client as every system's is (jobs_bench.py's docstring): one job, then idle.
        await noop.defer_async()
        await asyncio.sleep(1.0)  # idle: the worker waits on its LISTEN
        for _ in range(n):
            await stamp.defer_async(sent=time.time())
            await asyncio.sleep(0.02)
        await asyncio.wait_for(all_done.wait(), 30)
        worker.cancel()
        try:
            await asyncio.wait_for(worker, 30)
        except asyncio.CancelledError:
            pass
    lat.sort()
    return {"pickup_p50": statistics.median(lat), "pickup_p99": lat[int(len(lat) * 0.99) - 1]}


def main() -> None:
    what = sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 20_000
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    logging.disable(logging.WARNING)
    fn = {"install": install, "enqueue": enqueue, "process": process, "fill": fill, "drain": drain,
          "pickup": pickup}[what]
    print(json.dumps(asyncio.run(fn(n))))


if __name__ == "__main__":
    main()
