"""Job runtime benchmark (not a test): livepush against pgqueuer, procrastinate and a bare
SKIP LOCKED loop, in one run on the same Postgres.

    .venv/bin/python bench/jobs_bench.py                      # durable Postgres, 3 rounds, ~5 min
    .venv/bin/python bench/jobs_bench.py --pg-port 55500 --rounds 1 --competitors pgqueuer

Without --pg-url it starts a throwaway PostgreSQL (Postgres' durable defaults: fsync and
synchronous_commit on; --pg-no-fsync turns fsync off) and removes it at the end. The
competitors run as subprocesses with the bench-only virtualenv's python (.venv-bench, see
docs/performance.md for how to make it) and a driver each under bench/competitors/, which
prints its figures as JSON. Each system gets its own scratch database on the same server.

Measured, with livepush's state topics on (every change of a job bumps its version and rings
the servers, as in production; the competitors ring nothing):
- enqueue one at a time (1,000 jobs, one transaction each) and in bulk (20 x 1,000);
- 20,000 no-op async jobs drained by one process at concurrency 10 (jobs/s, until the
  last outcome is written);
- pickup latency p50/p99: 300 jobs enqueued at 50 a second into an idle worker, from
  just before the enqueue call to the start of the job function. Every system's client
  enqueues one other job first (then the worker idles for a second), so no system's first
  sample pays for opening its connection or preparing its statements;
- the ceiling: a bare loop claiming 50 jobs per statement (SKIP LOCKED, ordered by the
  claim index that skips claimed rows) and marking them done, nothing else.
Rounds are interleaved (each round runs every system once) so drift hits all alike;
the table shows each figure's median over the rounds and the ratios of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _services import Services  # noqa: E402

from livepush import config  # noqa: E402
from livepush.jobs import database, enqueue_many, job  # noqa: E402
from livepush.jobs.api.registry import Registry  # noqa: E402
from livepush.jobs.runtime.runtime import Runtime  # noqa: E402
from livepush.migrate import migrate  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_PY = os.path.join(ROOT, ".venv-bench", "bin", "python")
DRIVERS = {
    "pgqueuer": os.path.join(ROOT, "bench", "competitors", "pgqueuer_driver.py"),
    "procrastinate": os.path.join(ROOT, "bench", "competitors", "procrastinate_driver.py"),
}
PICKUPS = 300  # jobs for the latency test, at 50 a second

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
def lp_setup(admin: str) -> str:
    url = make_db(admin, "bench_livepush")
    migrate(url)
    config.set_settings(config.Settings(database_url=url, fanout="postgres", env="test"))
    database.configure(url)
    return url


def lp_truncate(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("TRUNCATE livepush_job_payloads, livepush_jobs, livepush_job_runtimes, "
                  "livepush_messages, livepush_topics")
        c.execute("VACUUM ANALYZE livepush_jobs")


def lp_fill(url: str, n: int) -> None:
    lp_truncate(url)
    for _ in range(n // 1000):
        enqueue_many([noop_job.request() for _ in range(1000)])


def lp_enqueue(url: str, n: int) -> dict[str, float]:
    # Connections are opened before the clock starts, as the competitors' drivers connect
    # before theirs: opening a pool is not enqueue throughput.
    async def one() -> float:
        async with (await database.pools().aget()).connection():
            pass
        t = time.perf_counter()
        for _ in range(1000):
            await noop_job.aenqueue()
        rate = 1000 / (time.perf_counter() - t)
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


async def drain_rate(registry: Registry, n: int) -> float:
    """Run one runtime of `registry` (queue default, concurrency 10) until n jobs succeeded; jobs/s."""
    rt = Runtime(registry, queues=["default"], concurrency=10, install_signals=False, heartbeat=5)
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


# -- competitors ----------------------------------------------------------------------------------
def make_db(admin: str, name: str) -> str:
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {name}")
    # A URL, not key=value: asyncpg (pgqueuer's driver) takes URLs only.
    parts = urllib.parse.urlsplit(admin)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))


def drop_db(admin: str, name: str) -> None:
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def competitor(name: str, url: str) -> Callable[[str, int], dict[str, float]]:
    def call(what: str, n: int) -> dict[str, float]:
        proc = subprocess.run([BENCH_PY, DRIVERS[name], url, what, str(n)], capture_output=True, text=True,
                              timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"{name} {what} failed:\n{proc.stderr[-2000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return call


# -- report ----------------------------------------------------------------------------------------------
def fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "n/a"
    return f"{v:.1f} ms" if unit == "ms" else f"{v:,.0f}/s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pg-url", help="an admin URL of a running PostgreSQL (scratch databases are made there)")
    ap.add_argument("--pg-port", type=int, default=0, help="port for the throwaway PostgreSQL (0: any free one)")
    ap.add_argument("--pg-no-fsync", action="store_true", help="throwaway PostgreSQL with fsync=off")
    ap.add_argument("--jobs", type=int, default=20_000, help="jobs in the processing test")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--competitors", default="pgqueuer,procrastinate",
                    help="comma-separated; empty for livepush and the bare loop only")
    args = ap.parse_args()
    names = [c for c in args.competitors.split(",") if c]
    if names and not os.path.exists(BENCH_PY):
        raise SystemExit("no .venv-bench: python3 -m venv .venv-bench && .venv-bench/bin/pip install "
                         "procrastinate pgqueuer 'psycopg[binary]' asyncpg uvloop")
    services = Services()
    try:
        if args.pg_url:
            admin, where = args.pg_url, "given server (--pg-url): its own settings"
        else:
            admin = services.start_postgres(args.pg_port, durable=not args.pg_no_fsync)
            where = ("throwaway PostgreSQL, fsync OFF (--pg-no-fsync)" if args.pg_no_fsync
                     else "throwaway PostgreSQL, durable defaults (fsync on, synchronous_commit on)")
        with psycopg.connect(admin) as c:
            version = c.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            fsync = c.execute("SHOW fsync").fetchone()[0]  # type: ignore[index]
            sync_commit = c.execute("SHOW synchronous_commit").fetchone()[0]  # type: ignore[index]
        print(f"PostgreSQL {version} ({where}; fsync={fsync}, synchronous_commit={sync_commit}), "
              f"{os.cpu_count()} cores, {args.rounds} round(s), {args.jobs:,} jobs, concurrency 10", flush=True)

        lp_url = lp_setup(admin)
        systems: dict[str, dict[str, Callable[[str, int], dict[str, float]]]] = {
            "livepush": {"enqueue": lambda w, n: lp_enqueue(lp_url, n), "process": lambda w, n: lp_process(lp_url, n),
                         "pickup": lambda w, n: lp_pickup(lp_url, n)},
        }
        for name in names:
            call = competitor(name, make_db(admin, f"bench_{name}"))
            call("install", 0)
            systems[name] = {"enqueue": call, "process": call, "pickup": call}
        systems["bare loop"] = {"process": lambda w, n: bare_process(lp_url, n)}

        results: dict[str, dict[str, list[float]]] = {s: {} for s in systems}
        for r in range(args.rounds):
            for what, n in (("enqueue", args.jobs), ("process", args.jobs), ("pickup", PICKUPS)):
                for system, fns in systems.items():
                    if what not in fns:
                        continue
                    t = time.perf_counter()
                    figures = fns[what](what, n)
                    for k, v in figures.items():
                        if k != "processed":
                            results[system].setdefault(k, []).append(v)
                    shown = ", ".join(f"{k} {fmt(v, 'ms' if 'pickup' in k else '/s')}" for k, v in figures.items()
                                      if k != "processed")
                    print(f"  round {r + 1} {system:13} {what:8} {shown}  ({time.perf_counter() - t:.1f} s)",
                          flush=True)

        med = {s: {k: statistics.median(v) for k, v in m.items()} for s, m in results.items()}
        rows = [("enqueue one at a time", "enqueue_one", "/s"), ("enqueue bulk (1,000 per call)", "enqueue_bulk", "/s"),
                (f"process {args.jobs:,} no-op jobs, conc. 10", "process", "/s"),
                ("pickup p50 at 50 jobs/s", "pickup_p50", "ms"), ("pickup p99 at 50 jobs/s", "pickup_p99", "ms")]
        cols = list(systems)
        ratio_cols = [c for c in cols if c != "livepush"]
        print()
        print("| figure | " + " | ".join(cols) + " | " + " | ".join(f"livepush / {c}" for c in ratio_cols) + " |")
        print("|---" * (1 + len(cols) + len(ratio_cols)) + "|")
        for label, key, unit in rows:
            cells = [fmt(med[c].get(key), unit) for c in cols]
            lp = med["livepush"].get(key)
            ratios = []
            for c in ratio_cols:
                other = med[c].get(key)
                ratios.append("n/a" if lp is None or not other else f"{lp / other:.2f}x")
            print(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
        print()
        goals = []
        lp = med["livepush"]
        if "pgqueuer" in med:
            goals.append(("processing >= 2.5x pgqueuer", lp["process"] / med["pgqueuer"]["process"], 2.5, True))
            goals.append(("bulk enqueue >= 1.3x pgqueuer", lp["enqueue_bulk"] / med["pgqueuer"]["enqueue_bulk"], 1.3,
                          True))
            goals.append(("pickup p99 <= pgqueuer", lp["pickup_p99"] / med["pgqueuer"]["pickup_p99"], 1.0, False))
        if "procrastinate" in med:
            goals.append(("processing >= 10x procrastinate", lp["process"] / med["procrastinate"]["process"], 10.0,
                          True))
        for label, ratio, target, higher in goals:
            ok = ratio >= target if higher else ratio <= target
            print(f"goal {label}: {ratio:.2f}x {'met' if ok else 'NOT met'}")
        print(f"livepush / bare loop (processing): {lp['process'] / med['bare loop']['process']:.2f}x")
        print(f"runs: {json.dumps(results)}")
    finally:
        database.configure(None)
        if args.pg_url:
            for name in ["livepush", *names]:
                try:
                    drop_db(args.pg_url, f"bench_{name}")
                except psycopg.Error:
                    pass
        services.stop()


if __name__ == "__main__":
    main()
