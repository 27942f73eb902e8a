"""Workflows suite: livepush workflows on one runtime process, against a task group and against
DBOS Transact, in one run on the same Postgres (which keeps commit timestamps, for the latency:
the harness starts it so).

DBOS runs as subprocesses with the bench-only virtualenv's python (.venv-bench, made by
bin/bench) and bench/competitors/dbos_driver.py
(its `seq` and `queue` modes: a @DBOS.workflow calling 10 @DBOS.step functions), which prints its
figures as JSON. Each system gets its own scratch database on the same server.

livepush runs in this process: one Runtime at concurrency 10 on the event loop (uvloop when
installed), as an application's `livepush jobs` process would. Its workflow is 10 steps in a line
(s0 -> s1 -> ... -> s9), each an async no-op that notes the time.time() it was entered; every
step is a job (the step's end, in its job's outcome transaction, enqueues the next).

Measured, per round (interleaved: each round runs every figure for both sides, the order of each
pair alternating by round, so drift hits both alike):
a. one run at a time: 100 runs (15 with --quick), each started (flow.astart) once the one before finished;
   DBOS: the workflow called as many times in one thread (after a warm-up call).
   steps/s = runs x 10 / the time from the first start to the last run finished.
b. 300 runs at once (50 with --quick): started before the runtime starts, timed from its start (registered
   and listening: its startup is not counted, as DBOS's launch is not) until every run finished;
   DBOS: the workflows enqueued on a paused queue, then released at worker_concurrency=10, polled
   every 10 ms. steps/s as above.
c. step-to-step latency, from (a)'s runs: from the commit of step i's job outcome (the timestamp
   Postgres records with the commit, track_commit_timestamp, which is taken just before the
   commit's WAL flush, so the flush is inside the figure) to step i+1's function being entered
   (9 per run). Also shown: a step's entry to its own outcome's commit, entry to entry, and
   flow.astart() called to the first step entered. The same figures are printed for (b), under
   load (they include the wait for a slot and for the completer).
d. fan-out: a workflow of one fan-out step whose batch is 10,000 no-op jobs (2,000 with --quick), against the same
   no-op jobs in a plain task group (`async with jobs.agroup()`), on a runtime already started
   and idle; from the start call (flow.astart / entering the group block) to finished (the run
   succeeded / the group's finished_at set). overhead = workflow time / group time - 1.
Goals: (a)/(b) >= 1,000 steps/s; (c) p50 <= 5 ms; (d) overhead <= 15 %.
The tables show each figure's median over the rounds; a ratio is the median of the rounds' ratios
(each round's pair ran back to back, so a drift between rounds cancels out of it).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import report  # noqa: E402
from _services import drop_db, livepush_db, make_db  # noqa: E402
from jobs_bench import run  # noqa: E402

from livepush import jobs  # noqa: E402
from livepush.jobs import REGISTRY, get_group, job  # noqa: E402
from livepush.jobs.runtime.runtime import Runtime  # noqa: E402

from durable_bench import dbos_call  # noqa: E402

STEPS = 10
QUEUE = "wfbench"
CONCURRENCY = 10

# (run id, step index) -> time.time() when the step's function was entered
entered: dict[tuple[int, int], float] = {}
# run id -> time.time() just before its flow.astart() call
start_called: dict[int, float] = {}


async def noop(ctx: Any) -> None:
    pass


noop_job = job(name="wfbench.noop", queue=QUEUE)(noop)

linear = jobs.workflow("wfbench_linear", queue=QUEUE)


def _make_step(i: int) -> Callable[[Any], Awaitable[None]]:
    async def step(ctx: Any) -> None:
        entered[(ctx.run_id, i)] = time.time()

    return step


for _i in range(STEPS):
    linear.step(after=[f"s{_i - 1}"] if _i else None, name=f"s{_i}")(_make_step(_i))

fan = jobs.workflow("wfbench_fan", queue=QUEUE)


@fan.fan_out()
async def members(ctx: Any, batch: Any) -> None:
    for _ in range(ctx.input["n"]):
        batch.enqueue(noop_job)


# -- livepush ---------------------------------------------------------------------------------
TABLES = ("livepush_job_payloads, livepush_jobs, livepush_job_runtimes, livepush_messages, livepush_topics, "
          "livepush_group_events, livepush_group_callbacks, livepush_group_shards, livepush_groups, "
          "livepush_job_steps, livepush_job_signals, livepush_job_signal_keys, livepush_workflow_signals, "
          "livepush_workflow_signal_keys, livepush_workflow_audit, "
          "livepush_workflow_steps, livepush_workflows")


def lp_truncate(url: str) -> None:
    entered.clear()
    start_called.clear()
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f"TRUNCATE {TABLES}")
        c.execute("VACUUM ANALYZE livepush_jobs, livepush_workflows, livepush_workflow_steps")


def new_runtime() -> Runtime:
    return Runtime(REGISTRY, queues=[QUEUE], concurrency=CONCURRENCY, install_signals=False, heartbeat=5)


def succeeded(rt: Runtime) -> int:
    return rt.counts.get("succeeded", 0)


async def with_runtime(body: Callable[[Runtime, asyncio.Task[None]], Awaitable[Any]]) -> Any:
    """Start a runtime, wait until it is started (registered and listening), run body(rt, task);
    the runtime is stopped (and awaited, bounded) whatever happens."""
    rt = new_runtime()
    task = asyncio.create_task(rt.run())
    try:
        started = asyncio.create_task(rt.wait_started(30))
        await asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            started.cancel()
            task.result()
            raise RuntimeError("the runtime stopped before it started")
        started.result()
        return await body(rt, task)
    finally:
        rt.stop()
        try:
            await asyncio.wait_for(task, 60)
        except TimeoutError:
            rt.stop(now=True)
            await asyncio.wait_for(task, 30)


async def wait_until(done: Callable[[], bool], task: asyncio.Task[None], timeout: float, what: str,
                     every: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if task.done():
            task.result()
            raise RuntimeError(f"the runtime stopped early ({what})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done within {timeout:g} s")
        await asyncio.sleep(every)


def latencies(url: str) -> dict[str, list[float]]:
    """Per step, from the stamps and the commit timestamps of the steps' job outcomes: ms from
    the commit of step i's outcome to step i+1's entry (`gap`), from step i's entry to its
    outcome's commit (`own`), and entry to entry (`step`)."""
    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute(
            "SELECT s.workflow_id, s.name, extract(epoch FROM pg_xact_commit_timestamp(j.xmin))::float8 "
            "FROM livepush_workflow_steps s JOIN livepush_jobs j ON j.id = s.job_id "
            "WHERE s.state = 'succeeded' AND j.state = 'succeeded'").fetchall()
    committed = {(int(r[0]), int(r[1][1:])): float(r[2]) for r in rows}
    out: dict[str, list[float]] = {"gap": [], "own": [], "step": [], "first": []}
    for run_id, at in start_called.items():
        if (run_id, 0) in entered:
            out["first"].append((entered[(run_id, 0)] - at) * 1000)
    for (run_id, i), at in entered.items():
        done = committed.get((run_id, i))
        if done is not None:
            out["own"].append((done - at) * 1000)
        nxt = entered.get((run_id, i + 1))
        if nxt is not None:
            out["step"].append((nxt - at) * 1000)
            if done is not None:
                out["gap"].append((nxt - done) * 1000)
    return out


def check_runs(url: str, n: int, state: str = "succeeded") -> None:
    with psycopg.connect(url, autocommit=True) as c:
        got = c.execute("SELECT count(*) FROM livepush_workflows WHERE state = %s", (state,)).fetchone()[0]  # type: ignore[index]
    if got != n:
        raise RuntimeError(f"{got} runs {state}, {n} expected")


def lp_seq(url: str, n: int, commit_ts: bool) -> dict[str, Any]:
    """n runs, each started once the one before finished (a run is finished in the transaction
    of its last step's outcome, which the runtime counts once committed)."""
    lp_truncate(url)

    async def body(rt: Runtime, task: asyncio.Task[None]) -> float:
        await linear.astart({})  # warm: the first run pays for statement preparation
        await wait_until(lambda: succeeded(rt) >= STEPS, task, 60, "the warm-up run", 0.001)
        entered.clear()
        t = time.perf_counter()
        for k in range(n):
            called = time.time()
            handle = await linear.astart({})
            start_called[handle.id] = called
            target = (k + 2) * STEPS
            await wait_until(lambda: succeeded(rt) >= target, task, 60, f"run {k + 1} of {n}", 0.001)
        return time.perf_counter() - t

    took = run(with_runtime(body))
    check_runs(url, n + 1)
    out: dict[str, Any] = {"seq_steps": n * STEPS / took}
    if commit_ts:
        lat = latencies(url)
        out.update(seq_gap=lat["gap"], seq_own=lat["own"], seq_step=lat["step"], seq_first=lat["first"])
    return out


def lp_conc(url: str, n: int, commit_ts: bool) -> dict[str, Any]:
    """n runs started before the runtime starts; timed from its start to the last run finished."""
    lp_truncate(url)

    async def start_all() -> None:
        for _ in range(n):
            await linear.astart({})

    run(start_all())
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("VACUUM ANALYZE livepush_jobs, livepush_workflows, livepush_workflow_steps")

    async def body(rt: Runtime, task: asyncio.Task[None]) -> tuple[float, float]:
        t, cpu = time.perf_counter(), time.process_time()
        await wait_until(lambda: succeeded(rt) >= n * STEPS, task, 300, f"{n} runs at once")
        took = time.perf_counter() - t
        return took, (time.process_time() - cpu) / took

    took, cpu = run(with_runtime(body))
    check_runs(url, n)
    out: dict[str, Any] = {"conc_steps": n * STEPS / took, "conc_cpu": cpu * 100}
    if commit_ts:
        lat = latencies(url)
        out.update(conc_gap=lat["gap"], conc_own=lat["own"], conc_step=lat["step"])
    return out


def lp_group(url: str, n: int) -> dict[str, Any]:
    lp_truncate(url)
    gid: list[int] = []
    wall = [0.0]

    async def body(rt: Runtime, task: asyncio.Task[None]) -> float:
        await asyncio.sleep(0.2)  # idle, as in the workflow case
        t, wall[0] = time.perf_counter(), time.time()
        async with jobs.agroup() as g:
            for _ in range(n):
                g.enqueue(noop_job)
        gid.append(g.id)
        # The last member's outcome finishes the group in its own transaction, so the count is
        # the finish (checked below, off the clock), as in the fan-out case.
        await wait_until(lambda: succeeded(rt) >= n, task, 300, f"the group of {n}")
        return time.perf_counter() - t

    took = run(with_runtime(body))
    view = get_group(gid[0])
    if not view or not view["finished_at"] or view["succeeded"] != n:
        raise RuntimeError(f"the group ended as {view}")
    return {"group_s": took, **phases(url, wall[0], "group")}


def lp_fan(url: str, n: int) -> dict[str, Any]:
    lp_truncate(url)

    wall = [0.0]

    async def body(rt: Runtime, task: asyncio.Task[None]) -> float:
        await asyncio.sleep(0.2)  # idle, as in the group case
        t, wall[0] = time.perf_counter(), time.time()
        await fan.astart({"n": n})
        # n members and then the fan-out step's own job (whose outcome finishes the run).
        await wait_until(lambda: succeeded(rt) >= n + 1, task, 300, f"the fan-out of {n}")
        return time.perf_counter() - t

    took = run(with_runtime(body))
    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute("SELECT w.state, s.output FROM livepush_workflows w "
                         "JOIN livepush_workflow_steps s ON s.workflow_id = w.id").fetchall()
    if len(rows) != 1 or rows[0][0] != "succeeded" or (rows[0][1] or {}).get("succeeded") != n:
        raise RuntimeError(f"the fan-out run ended as {rows}")
    return {"fan_s": took, **phases(url, wall[0], "fan")}


def phases(url: str, start: float, key: str) -> dict[str, float]:
    """Where the time went, from the one group's Postgres times (each a transaction's start, now()):
    start call -> the transaction writing the members began (the members were built before it), the
    members' run (-> the group's finish), and (a fan-out) the group's finish -> the run's finish."""
    with psycopg.connect(url, autocommit=True) as c:
        made, finished = c.execute("SELECT extract(epoch FROM created_at)::float8, extract(epoch FROM finished_at)::float8 "
                                   "FROM livepush_groups").fetchone()  # type: ignore[misc]
        run_end = c.execute("SELECT extract(epoch FROM max(finished_at))::float8 FROM livepush_workflows").fetchone()[0]  # type: ignore[index]
    out = {f"{key}_made_ms": (made - start) * 1000, f"{key}_members_s": finished - made}
    if run_end is not None:
        out[f"{key}_end_ms"] = (run_end - finished) * 1000
    return out


# -- figures --------------------------------------------------------------------------------------------
def figures(ctx: report.Context) -> list[report.Figure]:
    """Steps/s against DBOS's, step-to-step latency, and a fan-out step against a plain task group."""
    if ctx.bench_python is None:
        raise RuntimeError("no .venv-bench with DBOS: run bin/bench, which makes it")
    bench_py = ctx.bench_python
    rounds_n, seq_n, conc_n, members_n = (1, 15, 50, 2_000) if ctx.quick else (3, 100, 300, 10_000)
    rounds = report.Rounds()
    with livepush_db(ctx.pg_admin_url, "bench_workflows_livepush") as lp_url:
        dbos_url = make_db(ctx.pg_admin_url, "bench_workflows_dbos")
        try:
            pairs: list[list[tuple[str, str, Callable[[], dict[str, Any]]]]] = [
                [("livepush", "one at a time", lambda: lp_seq(lp_url, seq_n, True)),
                 ("DBOS", "one at a time", lambda: {"seq_steps": dbos_call(bench_py, dbos_url, "seq", seq_n)["seq_steps"]})],
                [("livepush", "at once", lambda: lp_conc(lp_url, conc_n, True)),
                 ("DBOS", "at once", lambda: {"conc_steps": dbos_call(bench_py, dbos_url, "queue", conc_n)["queue_steps"]})],
                [("livepush", "group", lambda: lp_group(lp_url, members_n)),
                 ("livepush", "fan-out", lambda: lp_fan(lp_url, members_n))],
            ]
            for r in range(rounds_n):
                for pair in pairs:
                    # The order within each pair alternates by round, so drift hits both alike.
                    for system, what, fn in (pair if r % 2 == 0 else pair[::-1]):
                        t = time.perf_counter()
                        got = fn()
                        rounds.add(system, got)
                        shown = [f"{k} p50 {statistics.median(v):.2f} ms" if isinstance(v, list) else f"{k} {v:,.2f}"
                                 for k, v in got.items() if v or not isinstance(v, list)]
                        report.note(f"  round {r + 1} {system:9} {what:14} {', '.join(shown)}  "
                                    f"({time.perf_counter() - t:.1f} s)")
        finally:
            drop_db(ctx.pg_admin_url, "bench_workflows_dbos")

    def lp(key: str) -> float:
        return rounds.median("livepush", key) or 0.0

    return [
        report.Figure("10-step workflow runs one at a time", lp("seq_steps"), "steps/s", "DBOS",
                      rounds.median("DBOS", "seq_steps")),
        report.Figure(f"10-step workflow runs at once, concurrency {CONCURRENCY}", lp("conc_steps"), "steps/s", "DBOS",
                      rounds.median("DBOS", "conc_steps")),
        report.Figure("workflow step outcome committed -> next step entered, p50", lp("seq_gap"), "ms",
                      higher_is_better=False),
        report.Figure(f"fan-out step of {members_n:,} no-op jobs, start to finished", lp("fan_s"), "s",
                      "the same jobs in a task group", rounds.median("livepush", "group_s"), higher_is_better=False,
                      goal=1 / 1.15),
    ]

