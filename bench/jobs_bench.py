"""Jobs suite: livepush's job runtime against pgqueuer, procrastinate and a bare SKIP LOCKED
loop, in one run on the same Postgres (docs/performance.md#jobs).

The peers run as subprocesses with the bench-only virtualenv's python (.venv-bench, made by
bin/bench) and a driver each under bench/competitors/, which prints its figures as JSON. Each
system gets its own scratch database on the same server.

Measured, with livepush's state topics on (every change of a job bumps its version and rings
the servers, as in production; the peers ring nothing):
- enqueue one at a time (1,000 jobs, one transaction each; 250 with --quick) and in bulk (calls
  of 1,000);
- N no-op async jobs drained by one process at concurrency 10 (jobs/s, until the last outcome
  is written; livepush also at concurrency 40, against its own figure at 10), and by two
  processes at concurrency 10 each (livepush: two `livepush jobs` processes, started on a paused
  queue that is then resumed; the peers: two workers told to go at once; from the go to the last
  outcome);
- pickup latency p50/p99: jobs enqueued at 50 a second into an idle worker, from just before
  the enqueue call to the start of the job function. Every system's client enqueues one other
  job first (then the worker idles for a second), so no system's first sample pays for opening
  its connection or preparing its statements;
- the ceiling: a bare loop claiming 50 jobs per statement (SKIP LOCKED, ordered by the claim
  index that skips claimed rows) and marking them done, nothing else.
Rounds are interleaved (each round runs every system once) so drift hits all alike; a figure
is the median over the rounds.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import report  # noqa: E402
from _procs import Child  # noqa: E402
from _services import drop_db, livepush_db, make_db  # noqa: E402

from livepush.jobs import database, enqueue_many, job  # noqa: E402
from livepush.jobs.api.registry import Registry  # noqa: E402
from livepush.jobs.runtime.runtime import Runtime  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DRIVERS = {
    "pgqueuer": os.path.join(ROOT, "bench", "competitors", "pgqueuer_driver.py"),
    "procrastinate": os.path.join(ROOT, "bench", "competitors", "procrastinate_driver.py"),
}
PEERS = ("pgqueuer", "procrastinate")
# procrastinate processes some 20x slower than the others: it drains a smaller share of the jobs
# (a rate from the worker's start to its last outcome, so the count barely changes it), to keep
# the suite's run time.
SHARE = {"procrastinate": 4}

done_at: dict[int, float] = {}
REG = Registry()


async def noop(ctx: object) -> None:
    pass


async def stamp(ctx: object, sent: float) -> None:
    done_at[ctx.job_id] = time.time() - sent  # type: ignore[attr-defined]


noop_job = REG.add(job(name="bench.noop")(noop))
stamp_job = REG.add(job(name="bench.stamp")(stamp))


def run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


# -- livepush ---------------------------------------------------------------------------------
def lp_truncate(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("TRUNCATE livepush_job_payloads, livepush_jobs, livepush_job_runtimes, "
                  "livepush_messages, livepush_topics")
        c.execute("VACUUM ANALYZE livepush_jobs")


def lp_fill(url: str, n: int) -> None:
    lp_truncate(url)
    for _ in range(n // 1000):
        enqueue_many([noop_job.request() for _ in range(1000)])


def singles(n: int) -> int:
    """Jobs enqueued one at a time beside n in bulk: 1,000 for the full 20,000 (the drivers agree)."""
    return max(100, min(1000, n // 20))


def lp_enqueue(url: str, n: int) -> dict[str, float]:
    # Connections are opened before the clock starts, as the competitors' drivers connect
    # before theirs: opening a pool is not enqueue throughput.
    async def one() -> float:
        async with (await database.pools().aget()).connection():
            pass
        ones = singles(n)
        t = time.perf_counter()
        for _ in range(ones):
            await noop_job.aenqueue()
        rate = ones / (time.perf_counter() - t)
        await database.release_loop()
        return rate

    lp_truncate(url)
    database.configure(url)
    rate_one = run(one())
    lp_truncate(url)
    with database.pools().sync().connection():
        pass
    t = time.perf_counter()
    for _ in range(n // 1000):
        enqueue_many([noop_job.request() for _ in range(1000)])
    return {"enqueue_one": rate_one, "enqueue_bulk": n / (time.perf_counter() - t)}


async def drain_rate(registry: Registry, n: int, concurrency: int = 10) -> float:
    """Run one runtime of `registry` (queue default) until n jobs succeeded; jobs/s."""
    rt = Runtime(registry, queues=["default"], concurrency=concurrency, install_signals=False, heartbeat=5)
    t = time.perf_counter()
    task = asyncio.create_task(rt.run())
    while rt.counts.get("succeeded", 0) < n:  # counted once its outcome committed
        if task.done():
            task.result()
            raise RuntimeError("the runtime stopped early")
        await asyncio.sleep(0.005)
    rate = n / (time.perf_counter() - t)
    rt.stop()
    await task
    return rate


def lp_process(url: str, n: int) -> dict[str, float]:
    lp_fill(url, n)
    return {"process": run(drain_rate(REG, n))}


def lp_process_wide(url: str, n: int) -> dict[str, float]:
    """The same drain at concurrency 40: a claim takes as many jobs as there are free slots, so this
    shows what larger claims alone are worth beside the figure at 10."""
    lp_fill(url, n)
    return {"process_40": run(drain_rate(REG, n, concurrency=40))}


def lp_pickup(url: str, n: int) -> dict[str, float]:
    lp_truncate(url)
    done_at.clear()

    async def go() -> None:
        rt = Runtime(REG, queues=["default"], concurrency=10, install_signals=False, heartbeat=5)
        task = asyncio.create_task(rt.run())
        await rt.wait_started()
        # Warm the client as every system's is: one job, then idle.
        await noop_job.aenqueue()
        await asyncio.sleep(1.0)  # idle: the runtime waits on its LISTEN
        for _ in range(n):
            await stamp_job.aenqueue(time.time())
            await asyncio.sleep(0.02)
        deadline = time.monotonic() + 30
        while len(done_at) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        rt.stop()
        await task

    run(go())
    lat = sorted(v * 1000 for v in done_at.values())
    return {"pickup_p50": statistics.median(lat), "pickup_p99": lat[int(len(lat) * 0.99) - 1]}


# -- the bare ceiling ---------------------------------------------------------------------------
BARE_CLAIM = """
WITH picked AS (SELECT id FROM livepush_jobs WHERE state = 'available' AND queue = 'default'
                ORDER BY priority, run_at, id LIMIT 50 FOR UPDATE SKIP LOCKED)
UPDATE livepush_jobs j SET state = 'succeeded' FROM picked WHERE j.id = picked.id RETURNING j.id
"""


def bare_process(url: str, n: int) -> dict[str, float]:
    """Claim 50 per statement through livepush's claim index and mark them done: the
    least any Postgres queue must do per job, in one round trip per 50 jobs."""
    lp_fill(url, n)
    t = time.perf_counter()
    done = 0
    with psycopg.connect(url, autocommit=True) as c:
        while True:
            got = len(c.execute(BARE_CLAIM).fetchall())
            if not got:
                break
            done += got
    return {"process": done / (time.perf_counter() - t)}


def lp_process_two(url: str, n: int) -> dict[str, float]:
    """Two `livepush jobs` processes at concurrency 10 each: started on the paused queue, timed
    from its resume to the last outcome committed (counted in the database every 20 ms)."""
    from livepush.jobs import pause_queue, resume_queue

    lp_truncate(url)
    pause_queue("default")
    lp_fill_kept(n)
    env = {**os.environ, "LIVEPUSH_DATABASE_URL": url, "LIVEPUSH_FANOUT": "postgres"}
    runtimes = [Child([sys.executable, "-m", "livepush", "jobs", "jobs_bench", "--queues", "default",
                       "--concurrency", "10", "--heartbeat", "5"], env=env, cwd=HERE) for _ in range(2)]
    try:
        for rt in runtimes:
            rt.wait_for(lambda line: "job runtime" in line and " running" in line, 60, "a runtime starting")
        with psycopg.connect(url, autocommit=True) as c:
            t = time.perf_counter()
            resume_queue("default")
            deadline = time.monotonic() + 300
            while c.execute("SELECT count(*) FROM livepush_jobs WHERE state = 'succeeded'").fetchone()[0] < n:  # type: ignore[index]
                if time.monotonic() > deadline:
                    raise TimeoutError(f"two runtimes did not finish {n} jobs within 300 s")
                time.sleep(0.02)
            return {"process_two": n / (time.perf_counter() - t)}
    finally:
        for rt in runtimes:
            rt.stop()


def lp_fill_kept(n: int) -> None:
    """n no-op jobs, whatever the queue holds already (lp_fill empties it first)."""
    for _ in range(n // 1000):
        enqueue_many([noop_job.request() for _ in range(1000)])


# -- peers ------------------------------------------------------------------------------------------
def peer(bench_python: str, name: str, url: str) -> Callable[[str, int], dict[str, float]]:
    """Calls of the peer's driver: (what, n) -> its figures."""
    def call(what: str, n: int) -> dict[str, float]:
        proc = subprocess.run([bench_python, DRIVERS[name], url, what, str(n)], capture_output=True, text=True,
                              timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"{name} {what} failed:\n{proc.stderr[-2000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return call


def peer_process_two(bench_python: str, name: str, url: str, n: int) -> dict[str, float]:
    """Two of the peer's workers on n queued jobs, told to go at once; from the first one's go to
    the last one's end."""
    peer(bench_python, name, url)("fill", n)
    workers = [Child([bench_python, DRIVERS[name], url, "drain", str(n)]) for _ in range(2)]
    try:
        for w in workers:
            w.wait_for(lambda line: line == "ready", 60, f"a {name} worker starting")
        for w in workers:
            w.send("go")
        got = [json.loads(w.wait_for(lambda line: line.startswith("{"), 300, f"a {name} worker draining")[1])
               for w in workers]
    finally:
        for w in workers:
            w.stop()
    processed = sum(g["processed"] for g in got)
    if processed < n:
        raise RuntimeError(f"two {name} workers processed {processed} of {n} jobs")
    return {"process_two": n / (max(g["end"] for g in got) - min(g["start"] for g in got))}


# -- figures ----------------------------------------------------------------------------------------
# (figure, key, unit, higher is better, goal against each peer)
FIGURES = [
    ("enqueue one at a time", "enqueue_one", "jobs/s", True, {}),
    ("enqueue bulk (1,000 per call)", "enqueue_bulk", "jobs/s", True, {"pgqueuer": 1.3}),
    ("process no-op jobs, 1 process at concurrency 10", "process", "jobs/s", True,
     {"pgqueuer": 2.5, "procrastinate": 10.0}),
    ("process no-op jobs, 2 processes at concurrency 10", "process_two", "jobs/s", True, {}),
    ("pickup p50 at 50 jobs/s", "pickup_p50", "ms", False, {}),
    ("pickup p99 at 50 jobs/s", "pickup_p99", "ms", False, {"pgqueuer": 1.0}),
]


def figures(ctx: report.Context) -> list[report.Figure]:
    """Every figure against pgqueuer (the peer docs/performance.md sets its goals against), then
    against procrastinate, and processing against the bare loop."""
    if ctx.bench_python is None:
        raise RuntimeError("no .venv-bench with the peers: run bin/bench, which makes it")
    # Three rounds, not two: a median of two is their mean, so one disturbed round (a pickup p99
    # of 11 ms beside 3.8 ms in the other) decided the figure alone.
    n, pickups, rounds_n = (5_000, 50, 1) if ctx.quick else (20_000, 300, 3)
    # procrastinate, some 20x slower, would take half of a quick run: full runs only.
    peers = PEERS[:1] if ctx.quick else PEERS
    rounds = report.Rounds()
    with livepush_db(ctx.pg_admin_url, "bench_livepush") as lp_url:
        systems: dict[str, dict[str, Callable[[], dict[str, float]]]] = {"livepush": {
            "enqueue": lambda: lp_enqueue(lp_url, n), "process": lambda: lp_process(lp_url, n),
            "process_40": lambda: lp_process_wide(lp_url, n),
            "process_two": lambda: lp_process_two(lp_url, n), "pickup": lambda: lp_pickup(lp_url, pickups)}}
        for name in peers:
            url = make_db(ctx.pg_admin_url, f"bench_{name}")
            call = peer(ctx.bench_python, name, url)
            call("install", 0)
            m = max(1000, n // SHARE.get(name, 1) // 1000 * 1000)  # the drivers queue whole thousands
            systems[name] = {
                "enqueue": lambda call=call: call("enqueue", n), "process": lambda call=call, m=m: call("process", m),
                "process_two": lambda name=name, url=url, m=m: peer_process_two(ctx.bench_python, name, url, m),  # type: ignore[arg-type]
                "pickup": lambda call=call: call("pickup", pickups)}
        systems["bare loop"] = {"process": lambda: bare_process(lp_url, n)}
        try:
            for r in range(rounds_n):
                for what in ("enqueue", "process", "process_40", "process_two", "pickup"):
                    for system, fns in systems.items():
                        if what in fns:
                            t = time.perf_counter()
                            got = {k: v for k, v in fns[what]().items() if k != "processed"}
                            rounds.add(system, got)
                            report.note(f"  round {r + 1} {system:13} {what:11} "
                                        + ", ".join(f"{k} {v:,.1f}" for k, v in got.items())
                                        + f"  ({time.perf_counter() - t:.1f} s)")
        finally:
            for name in peers:
                drop_db(ctx.pg_admin_url, f"bench_{name}")
    out = []
    for label, key, unit, higher, goals in FIGURES:
        for base in (*PEERS, "bare loop"):
            other = rounds.median(base, key)
            if other is not None:
                out.append(report.Figure(label, rounds.median("livepush", key) or 0.0, unit, base, other,
                                         higher_is_better=higher, goal=goals.get(base)))
        if key == "process":
            # What a claim's size is worth: livepush against itself, whatever the peers' hour.
            out.append(report.Figure("process no-op jobs, 1 process at concurrency 40",
                                     rounds.median("livepush", "process_40") or 0.0, unit,
                                     "livepush at concurrency 10", rounds.median("livepush", "process")))
    return out
