"""Claim limits suite: what a concurrency limit and a paused-queue check cost, and how closely a
start rate holds, each against a baseline measured in the same run.

Figures, each from child processes (this file run with `--child`, the one entry it keeps):
- concurrency: N no-op jobs drained by one runtime at concurrency 10, declared with
  `concurrency=("key", 2)` and a distinct key each (no key ever collides, so the limit never
  binds), against the same jobs without a limit. The goal: within 10 %.
- rate: jobs declared `rate="100/s"` and two runtime processes of 20 slots: starts counted over
  the window (30 s; 5 s with --quick) after the first one, against the 100/s asked. The goal:
  within 5 %.
- plain path (full runs on a branch only: skipped when the tree's HEAD is main's commit): the
  jobs without limits with this tree's code against main's (exported to a temp dir), rounds
  interleaved, each on its own database migrated by its own code. Jobs without limits must not
  get slower.
"""

from __future__ import annotations

import asyncio
import json
import os
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

sys.path.insert(0, HERE)

import report  # noqa: E402
from _services import drop_db, livepush_db, make_db  # noqa: E402


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
    fn = reg.add(job(name="bench.keyed_noop", **options)(noop))
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
        raise RuntimeError(f"a child failed ({proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def export(rev: str, into: str) -> str:
    """The package of git revision `rev` in `into` (livepush/ and the sql/ its symlink points at)."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "livepush", "sql"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def rate_round(admin: str, window: float) -> dict[str, Any]:
    from livepush.jobs import enqueue_many, job
    from livepush.jobs.api.registry import Registry

    with livepush_db(admin, "bench_limits_rate") as url:
        async def rated(ctx: Any) -> None:
            pass

        fn = Registry().add(job(name="bench.rated", rate=f"{RATE:g}/s")(rated))
        enqueue_many([fn.request() for _ in range(int(RATE * (window + 10)))])
        children = [spawn(ROOT, "rate", url, str(window + 3)) for _ in range(2)]
        per_child = [result(c)["starts"] for c in children]
    starts = sorted(t for c in per_child for t in c)
    first = starts[0]
    within = [t for t in starts if t < first + window]
    # Each process's share of the window's starts (both must take part for the rate to be shared).
    shares = [sum(1 for t in c if t < first + window) for c in per_child]
    return {"rate": len(within) / window, "shares": shares}


def head_is_main() -> bool:
    """True when this tree's HEAD is main's commit (or either is unknown): nothing to compare."""
    def rev(name: str) -> str:
        out = subprocess.run(["git", "-C", ROOT, "rev-parse", "-q", "--verify", name], capture_output=True, text=True,
                             check=False)
        return out.stdout.strip()

    head, main = rev("HEAD"), rev("main")
    return not head or not main or head == main


def figures(ctx: report.Context) -> list[report.Figure]:
    """The never-binding limit against none, the rate against the asked one, and (full runs on a
    branch) this tree's plain path against main's."""
    n, rounds_n, window = (3_000, 1, 5.0) if ctx.quick else (10_000, 3, 30.0)
    with_base = not ctx.quick and not head_is_main()
    base_dir = tempfile.mkdtemp(prefix="livepush-base-", dir=ctx.workdir)
    names = ["plain", "limited"] + (["base"] if with_base else [])
    urls = {name: make_db(ctx.pg_admin_url, f"bench_limits_{name}") for name in names}
    trees = {"base": export("main", base_dir) if with_base else "", "plain": ROOT, "limited": ROOT}
    runs = report.Rounds()
    try:
        for r in range(rounds_n):
            # Rotated each round, so that drift and each figure's position hit all alike.
            for name in names[r % len(names):] + names[:r % len(names)]:
                mode = "limited" if name == "limited" else "plain"
                rate = result(spawn(trees[name], "process", urls[name], str(n), mode))["process"]
                runs.add(name, {"process": rate})
                report.note(f"  round {r + 1} {name:8} {rate:,.0f} jobs/s")
                # Vacuumed now, untimed: an autovacuum of this run's dead rows must not run into
                # the next figure's.
                with psycopg.connect(urls[name], autocommit=True) as c:
                    c.execute("VACUUM livepush_jobs, livepush_job_payloads")
        got = rate_round(ctx.pg_admin_url, window)
        report.note(f"  rate {got['rate']:.1f} starts/s, per process {got['shares']}")
    finally:
        for name in names:
            drop_db(ctx.pg_admin_url, f"bench_limits_{name}")
    out = [
        report.Figure("process with concurrency=(key, 2), keys never colliding", runs.median("limited", "process") or 0.0,
                      "jobs/s", "the same jobs without a limit", runs.median("plain", "process"), goal=0.9),
        report.Figure(f'rate="{RATE:g}/s", 2 runtime processes, over {window:g} s', got["rate"], "starts/s",
                      "the rate asked", RATE),
    ]
    if with_base:
        out.append(report.Figure("process without limits", runs.median("plain", "process") or 0.0, "jobs/s",
                                 "main's code", runs.median("base", "process"), goal=0.97))
    return out


if __name__ == "__main__":
    # The one entry left: a child process of figures() (see spawn()).
    kind, url, *rest = sys.argv[2:]
    if kind == "process":
        print(json.dumps(child_process(url, int(rest[0]), rest[1] == "limited")))
    else:
        print(json.dumps(child_rate(url, float(rest[0]))))
