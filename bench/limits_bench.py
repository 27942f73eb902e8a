"""Claim limits benchmark (not a test): what a concurrency limit and a paused-queue check cost, and
how closely a start rate holds, each against a baseline measured in the same run.

    .venv/bin/python bench/limits_bench.py                       # 6 rounds, ~3 min
    .venv/bin/python bench/limits_bench.py --pg-port 55500 --rounds 1 --base main

Figures, each from child processes on one throwaway PostgreSQL (durable defaults):
- plain path: 10,000 no-op jobs drained by one runtime at concurrency 10, with this tree's code
  and with the code of `--base` (a git revision, default main, exported to a temp dir), rounds
  interleaved, each on its own database migrated by its own code. Jobs without limits must not
  get slower.
- concurrency: the same jobs declared with `concurrency=("key", 2)` and a distinct key each (no
  key ever collides, so the limit never binds), against the same jobs without a limit, both
  with this tree. The goal: within 10 %.
- rate: 4,000 jobs declared `rate="100/s"` and two runtime processes of 20 slots for 33 s:
  starts counted over the 30 s after the first one. The goal: within 5 % of 100/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = sys.executable
RATE = 100.0
RATE_WINDOW = 30.0


# -- child side: imports whichever livepush is first on sys.path -----------------------------------

def child_process(url: str, n: int, limited: bool) -> dict[str, float]:
    """Drain n no-op jobs with one runtime at concurrency 10; jobs/s until the last outcome."""
    from livepush import config
    from livepush.jobs import database, enqueue_many, job
    from livepush.jobs.api.registry import Registry
    from livepush.migrate import migrate

    migrate(url)
    config.set_settings(config.Settings(database_url=url, fanout="postgres", env="test"))
    database.configure(url)
    reg = Registry()

    async def noop(ctx: Any, key: int) -> None:
        pass

    options: dict[str, Any] = {"concurrency": ("key", 2)} if limited else {}
    fn = reg.add(job(name="bench.noop", **options)(noop))
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("TRUNCATE livepush_job_payloads, livepush_jobs, livepush_job_runtimes")
    for start in range(0, n, 1000):
        enqueue_many([fn.request(i) for i in range(start, min(start + 1000, n))])
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("VACUUM ANALYZE livepush_jobs")
    # Imported here, after PYTHONPATH chose the livepush under test: jobs_bench imports it too.
    from jobs_bench import drain_rate, run

    return {"process": run(drain_rate(reg, n))}


def child_rate(url: str, seconds: float) -> dict[str, Any]:
    """Run a runtime of the rate-limited job for `seconds`; the wall-clock times of its starts."""
    from livepush import config
    from livepush.jobs import database, job
    from livepush.jobs.api.registry import Registry
    from livepush.jobs.runtime.runtime import Runtime

    config.set_settings(config.Settings(database_url=url, fanout="postgres", env="test"))
    database.configure(url)
    reg = Registry()
    starts: list[float] = []

    async def rated(ctx: Any) -> None:
        starts.append(time.time())

    reg.add(job(name="bench.rated", rate=f"{RATE:g}/s")(rated))

    async def go() -> None:
        rt = Runtime(reg, queues=["default"], concurrency=20, install_signals=False, heartbeat=2)
        task = asyncio.create_task(rt.run())
        await asyncio.sleep(seconds)
        rt.stop()
        await task

    from jobs_bench import run

    run(go())
    return {"starts": starts}


# -- parent side ---------------------------------------------------------------------------------------

def spawn(tree: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": tree}
    return subprocess.Popen([PY, os.path.abspath(__file__), "--child", *args], env=env, cwd=tree,
                            stdout=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen[str]) -> Any:
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"a child failed ({proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def make_db(admin: str, name: str) -> str:
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name}")
        c.execute(f"CREATE DATABASE {name}")
    parts = admin.rsplit("/", 1)
    return f"{parts[0]}/{name}"


def export(rev: str, into: str) -> str:
    """The package of git revision `rev` in `into` (livepush/ and the sql/ its symlink points at)."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "livepush", "sql"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def rate_round(url: str, tree: str) -> dict[str, float]:
    from livepush import config
    from livepush.jobs import database, enqueue_many, job
    from livepush.jobs.api.registry import Registry
    from livepush.migrate import migrate

    migrate(url)
    config.set_settings(config.Settings(database_url=url, fanout="postgres", env="test"))
    database.configure(url)

    async def rated(ctx: Any) -> None:
        pass

    fn = Registry().add(job(name="bench.rated", rate=f"{RATE:g}/s")(rated))
    enqueue_many([fn.request() for _ in range(int(RATE * (RATE_WINDOW + 10)))])
    children = [spawn(tree, "rate", url, str(RATE_WINDOW + 3)) for _ in range(2)]
    per_child = [result(c)["starts"] for c in children]
    starts = sorted(t for c in per_child for t in c)
    first = starts[0]
    within = [t for t in starts if t < first + RATE_WINDOW]
    # Each process's share of the window's starts (both must take part for the rate to be shared).
    shares = [sum(1 for t in c if t < first + RATE_WINDOW) for c in per_child]
    return {"rate": len(within) / RATE_WINDOW, "started": float(len(starts)), "shares": shares}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--pg-url", help="an admin URL of a running PostgreSQL (scratch databases are made there)")
    ap.add_argument("--pg-port", type=int, default=0, help="port for the throwaway PostgreSQL (0: any free one)")
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--base", default="main", help="git revision the plain path is compared with")
    ap.add_argument("--skip-rate", action="store_true")
    args = ap.parse_args()
    if args.child:
        kind, url, *rest = args.child
        if kind == "process":
            print(json.dumps(child_process(url, int(rest[0]), rest[1] == "limited")))
        else:
            print(json.dumps(child_rate(url, float(rest[0]))))
        return

    sys.path.insert(0, HERE)
    from _services import Services

    services = Services()
    base_dir = tempfile.mkdtemp(prefix="livepush-base-")
    try:
        admin = args.pg_url or services.start_postgres(args.pg_port, durable=True)
        base = export(args.base, base_dir)
        urls = {name: make_db(admin, f"bench_limits_{name}") for name in ("base", "plain", "limited")}
        with psycopg.connect(admin) as c:
            version = c.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        print(f"PostgreSQL {version} (durable defaults), {os.cpu_count()} cores, {args.rounds} round(s), "
              f"{args.jobs:,} jobs, concurrency 10; base {args.base}", flush=True)
        runs: dict[str, list[float]] = {"base": [], "plain": [], "limited": []}
        trees = {"base": base, "plain": ROOT, "limited": ROOT}
        order = list(runs)
        for r in range(args.rounds):
            # Rotated each round, so that drift and each figure's position hit all alike.
            for name in order[r % 3:] + order[:r % 3]:
                mode = "limited" if name == "limited" else "plain"
                rate = result(spawn(trees[name], "process", urls[name], str(args.jobs), mode))["process"]
                runs[name].append(rate)
                print(f"  round {r + 1} {name:8} {rate:,.0f} jobs/s", flush=True)
                # Vacuumed now, untimed: an autovacuum of this run's dead rows must not run into
                # the next figure's.
                with psycopg.connect(urls[name], autocommit=True) as c:
                    c.execute("VACUUM livepush_jobs, livepush_job_payloads")
        med = {k: statistics.median(v) for k, v in runs.items()}
        # Paired within each round as well: a round's figures ran minutes apart at most.
        paired_plain = statistics.median(p / b for p, b in zip(runs["plain"], runs["base"]))
        paired_limited = statistics.median(x / p for x, p in zip(runs["limited"], runs["plain"]))
        print()
        print("| figure | jobs/s (median) | ratio of medians | median of per-round ratios |")
        print("|---|---|---|---|")
        print(f"| no limits, {args.base} | {med['base']:,.0f} | 1.00x | 1.00x |")
        print(f"| no limits, this tree | {med['plain']:,.0f} | {med['plain'] / med['base']:.2f}x of {args.base} | "
              f"{paired_plain:.2f}x |")
        print(f"| concurrency=(key, 2), keys never collide | {med['limited']:,.0f} | "
              f"{med['limited'] / med['plain']:.2f}x of no limits | {paired_limited:.2f}x |")
        goals = [("plain path >= 0.97x of " + args.base + " (per-round ratios)", paired_plain >= 0.97),
                 ("concurrency limit within 10 % of none (per-round ratios)", paired_limited >= 0.90)]
        if not args.skip_rate:
            rates = [rate_round(make_db(admin, "bench_limits_rate"), ROOT) for _ in range(1)]
            got = rates[0]["rate"]
            print(f"| rate=\"{RATE:g}/s\", 2 runtime processes, {RATE_WINDOW:g} s | {got:.1f} starts/s | "
                  f"{got / RATE:.3f}x of asked | starts per process: {rates[0]['shares']} |")
            goals.append((f"rate within 5 % of {RATE:g}/s", abs(got / RATE - 1) <= 0.05))
        print()
        for label, ok in goals:
            print(f"goal {label}: {'met' if ok else 'NOT met'}")
        print(f"runs: {json.dumps(runs)}")
    finally:
        services.stop()
        subprocess.run(["rm", "-rf", base_dir], check=False)


if __name__ == "__main__":
    main()
