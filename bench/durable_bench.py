"""Durable jobs suite: livepush's durable jobs against DBOS Transact, in one run on the same
Postgres (which keeps commit timestamps: the harness starts it so).

DBOS runs as subprocesses with the bench-only virtualenv's python (.venv-bench) and
bench/competitors/dbos_driver.py, which prints its figures as JSON. Each system gets its own
scratch database on the same server (DBOS's is its system database).

Measured (livepush jobs are async, their steps async no-op functions; DBOS's workflows and steps
are sync: async ones ran no faster here):
a. steps/s of a 10-step job (`await ctx.checkpoint(f"s{i}", noop_step)` ten times): jobs run one
   after another (livepush: a Runtime at concurrency 1 draining them; DBOS: the workflow called
   in one thread, after one warm-up call), and jobs enqueued at once, then run at concurrency 10
   (livepush: one Runtime; DBOS: a queue paused while they are enqueued, then given
   worker_concurrency=10, polled every 10 ms). Timed from the runtime's start (registered and
   listening: its startup, like DBOS's launch, is not counted; DBOS: the first call, the queue's
   release) to the last job's outcome committed. Goal: 3x DBOS.
b. replay: a 100-step job whose final step raises on attempt 1; attempt 2 replays the 100 stored
   checkpoints. Time from the job function's entry on attempt 2 to the call of its final step.
   DBOS: the 100-step workflow forked at its final step (DBOS.fork_workflow), which replays the
   100 steps copied to the fork; same clock, from the fork's entry to its final step.
c. recovery after kill -9: a runtime process (livepush: `livepush jobs` with --heartbeat 0.2;
   DBOS: a launched DBOS process) runs a 10-step job; its 5th step never returns, and the process
   is SIGKILLed in it and reaped. A new process of the same kind starts right after; the figure
   is the time from the kill to the start of the 5th step in the new process (printed with
   time.time() by the step itself). livepush: a runtime starting on the same machine releases at
   once the jobs of runtimes whose process is gone; from another machine (the victim run in a pid
   namespace of its own, which livepush takes for another machine; needs root) a runtime silent
   for three of its heartbeats is dead. DBOS re-enqueues the PENDING workflows of its executor id
   and application version at launch, on an internal queue it polls once a second, wherever the
   new process runs: its one figure is the baseline of both. Goal: no slower than DBOS.
d. parking and waking (livepush only): a parent job calls ctx.run_children() on its children;
   the time from the commit of the last child's outcome (the same transaction finishes the group
   and makes the parent available; its time is the commit timestamp Postgres records) to the
   parent's function starting again. And no-op jobs at concurrency 10 with jobs parked (each
   waiting for a signal that never comes) against the same with none parked (which of the two
   runs first alternates by round).
Rounds are interleaved (each round runs every figure for both systems) so drift hits all alike;
a figure is the median over the rounds.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import shutil
import signal
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
from jobs_bench import run  # noqa: E402

from livepush.jobs import enqueue_many, job  # noqa: E402
from livepush.jobs.api.registry import Registry  # noqa: E402
from livepush.jobs.runtime.runtime import Runtime  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DBOS_DRIVER = os.path.join(ROOT, "bench", "competitors", "dbos_driver.py")

STEPS = 10
REPLAY_STEPS = 100
KILL_STEPS, KILL_AT = 10, 5
KILL_QUEUE = "durable-kill"
# The runtime process that gets killed runs with this in its environment: its KILL_AT-th step
# then never returns, so the kill always lands inside a step.
ROLE = os.environ.get("DURABLE_BENCH_ROLE", "")
EMIT = "durable-bench"  # prefix of the lines job code prints for the benchmark to read

REG = Registry()
replay_marks: dict[str, float] = {}
parent_runs: dict[int, list[float]] = collections.defaultdict(list)


def emit(*words: Any) -> None:
    print(EMIT, *words, time.time(), flush=True)


async def noop_step() -> None:
    return None


async def ten_steps(ctx: Any) -> None:
    for i in range(STEPS):
        await ctx.checkpoint(f"s{i}", noop_step)


async def final_step(attempt: int) -> None:
    if attempt == 1:
        raise RuntimeError("the first attempt fails after its 100 stored steps, so the second replays them")
    replay_marks["final"] = time.perf_counter()


async def hundred_steps(ctx: Any) -> None:
    if ctx.attempt > 1:
        replay_marks["entry"] = time.perf_counter()
    for i in range(REPLAY_STEPS):
        await ctx.checkpoint(f"s{i}", noop_step)
    await ctx.checkpoint("final", final_step, ctx.attempt)


async def kill_step(i: int) -> None:
    emit("step", i)
    if ROLE == "victim" and i == KILL_AT:
        await asyncio.sleep(60)  # the benchmark SIGKILLs this process while it waits here


async def kill_job(ctx: Any) -> None:
    for i in range(1, KILL_STEPS + 1):
        await ctx.checkpoint(f"s{i}", kill_step, i)
    emit("done")


async def child(ctx: Any, i: int) -> int:
    return i


async def parent(ctx: Any, n: int) -> None:
    parent_runs[ctx.job_id].append(time.time())
    results = await ctx.run_children([child_job.request(i) for i in range(n)])
    assert len(results) == n, len(results)


async def parked(ctx: Any) -> None:
    await ctx.wait_for_signal("never")


async def noop(ctx: Any) -> None:
    pass


ten_job = REG.add(job(name="dbench.ten")(ten_steps))
replay_job = REG.add(job(name="dbench.replay", queue="durable-replay", max_attempts=2,
                         backoff=lambda attempt: 0.0)(hundred_steps))
kill = REG.add(job(name="dbench.kill", queue=KILL_QUEUE)(kill_job))
child_job = REG.add(job(name="dbench.child", queue="durable-wake")(child))
parent_job = REG.add(job(name="dbench.parent", queue="durable-wake")(parent))
parked_job = REG.add(job(name="dbench.parked")(parked))
noop_job = REG.add(job(name="dbench.noop")(noop))


# -- livepush ---------------------------------------------------------------------------------
TABLES = ("livepush_job_payloads, livepush_jobs, livepush_job_runtimes, livepush_messages, livepush_topics, "
          "livepush_group_events, livepush_group_callbacks, livepush_group_shards, livepush_groups, "
          "livepush_job_steps, livepush_job_signals, livepush_job_signal_keys")


def lp_truncate(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f"TRUNCATE {TABLES}")
        c.execute("VACUUM ANALYZE livepush_jobs")


def lp_count(url: str, state: str) -> int:
    with psycopg.connect(url, autocommit=True) as c:
        return c.execute("SELECT count(*) FROM livepush_jobs WHERE state = %s", (state,)).fetchone()[0]  # type: ignore[index]


def enqueue(requests: list[Any]) -> None:
    for i in range(0, len(requests), 1000):
        enqueue_many(requests[i:i + 1000])


async def run_until(rt: Runtime, done: Callable[[], bool], timeout: float, what: str) -> float:
    """Run `rt` until done() (polled every 5 ms, as jobs_bench.py does); seconds from the moment it
    is started (registered and listening), so that opening its pools is not in the figure, as
    DBOS's launch is not in its."""
    task = asyncio.create_task(rt.run())
    try:
        started = asyncio.create_task(rt.wait_started(30))
        await asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            started.cancel()
            task.result()
            raise RuntimeError(f"the runtime stopped before it started ({what})")
        started.result()
        t = time.perf_counter()
        deadline = time.monotonic() + timeout
        while not done():
            if task.done():
                task.result()
                raise RuntimeError(f"the runtime stopped early ({what})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not done within {timeout:g} s (counts {rt.counts})")
            await asyncio.sleep(0.005)
        return time.perf_counter() - t
    finally:
        rt.stop()
        await asyncio.wait_for(task, 60)


def lp_steps(url: str, n: int, concurrency: int) -> float:
    """steps/s of n 10-step jobs, enqueued before the runtime starts."""
    lp_truncate(url)
    enqueue([ten_job.request() for _ in range(n)])

    async def go() -> float:
        rt = Runtime(REG, queues=["default"], concurrency=concurrency, install_signals=False, heartbeat=5)
        return await run_until(rt, lambda: rt.counts.get("succeeded", 0) >= n, 300, f"{n} 10-step jobs")

    return n * STEPS / run(go())


def lp_replay(url: str) -> dict[str, float]:
    lp_truncate(url)
    replay_marks.clear()
    handle = replay_job.enqueue()

    async def go() -> None:
        rt = Runtime(REG, queues=["durable-replay"], concurrency=1, install_signals=False, heartbeat=5,
                     poll_interval=0.05)  # the retry is scheduled: the promoter makes it available
        await run_until(rt, lambda: rt.counts.get("succeeded", 0) >= 1, 60, "the replayed job")

    run(go())
    with psycopg.connect(url, autocommit=True) as c:
        stored = c.execute("SELECT count(*) FROM livepush_job_steps WHERE job_id = %s AND kind = 'checkpoint'",
                           (handle.id,)).fetchone()[0]  # type: ignore[index]
    return {"replay_ms": (replay_marks["final"] - replay_marks["entry"]) * 1000, "stored": stored}


def lp_wake(url: str, children: int, samples: int) -> list[float]:
    """ms from the commit of the last child's outcome to the parent's function starting again.
    The commit's time is the one Postgres records with it (track_commit_timestamp), taken just
    before the commit's WAL flush; the parent's is time.time() at its entry, the same clock."""
    lp_truncate(url)
    parent_runs.clear()
    handles: list[int] = []

    async def go() -> None:
        rt = Runtime(REG, queues=["durable-wake"], concurrency=10, install_signals=False, heartbeat=5)
        task = asyncio.create_task(rt.run())
        try:
            await rt.wait_started()
            for _ in range(samples):
                before = rt.counts.get("succeeded", 0)
                handle = await parent_job.aenqueue(children)
                handles.append(handle.id)
                deadline = time.monotonic() + 120
                # Done when the parent ran again and its outcome (after its children's) is written.
                while len(parent_runs[handle.id]) < 2 or rt.counts.get("succeeded", 0) < before + children + 1:
                    if task.done():
                        task.result()
                        raise RuntimeError("the runtime stopped early (wake)")
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"parent {handle.id} did not finish within 120 s")
                    await asyncio.sleep(0.005)
        finally:
            rt.stop()
            await asyncio.wait_for(task, 60)

    run(go())
    waits = []
    with psycopg.connect(url, autocommit=True) as c:
        for parent_id in handles:
            if len(parent_runs[parent_id]) != 2:
                raise RuntimeError(f"parent {parent_id} ran {len(parent_runs[parent_id])} times, not twice (park, wake)")
            # A child's row is last written by the transaction of its outcome; the latest of those
            # is the one that finished the group and made the parent available.
            committed = c.execute(
                "SELECT extract(epoch FROM max(pg_xact_commit_timestamp(j.xmin)))::float8 FROM livepush_jobs j "
                "JOIN livepush_groups g ON g.id = j.group_id WHERE g.parent_id = %s", (parent_id,)).fetchone()[0]  # type: ignore[index]
            waits.append((parent_runs[parent_id][1] - committed) * 1000)
    return waits


def lp_parked(url: str, n: int, parked_n: int) -> dict[str, float]:
    """n no-op jobs at concurrency 10, with parked_n jobs parked on a signal in the same queue."""
    lp_truncate(url)
    figures: dict[str, float] = {}
    if parked_n:
        enqueue([parked_job.request() for _ in range(parked_n)])

        async def park() -> float:
            # Not timed as a figure of the test, so more slots than 10 to get it over with.
            rt = Runtime(REG, queues=["default"], concurrency=30, install_signals=False, heartbeat=5)
            seen = [0.0, 0]
            with psycopg.connect(url, autocommit=True) as c:

                def all_parked() -> bool:
                    # A count of rows: read at most every 50 ms.
                    if time.monotonic() - seen[0] >= 0.05:
                        seen[0] = time.monotonic()
                        seen[1] = c.execute("SELECT count(*) FROM livepush_jobs WHERE state = 'waiting'").fetchone()[0]  # type: ignore[index]
                    return seen[1] >= parked_n

                return await run_until(rt, all_parked, 300, f"parking {parked_n} jobs")

        figures["parks"] = parked_n / run(park())
    enqueue([noop_job.request() for _ in range(n)])
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("VACUUM ANALYZE livepush_jobs")

    async def go() -> float:
        rt = Runtime(REG, queues=["default"], concurrency=10, install_signals=False, heartbeat=5)
        return await run_until(rt, lambda: rt.counts.get("succeeded", 0) >= n, 300, f"{n} no-op jobs")

    figures["rate"] = n / run(go())
    still = lp_count(url, "waiting")
    if still != parked_n:
        raise RuntimeError(f"{still} jobs waiting after the run, {parked_n} parked before it")
    return figures


def with_parked(url: str, n: int, parked_n: int) -> dict[str, float]:
    got = lp_parked(url, n, parked_n)
    return {"rate_parked": got["rate"], "parks": got["parks"]}


# -- kill -9 and recovery (both systems) ---------------------------------------------------------
def emitted(line: str) -> list[str] | None:
    """The words of a line job code printed (the last one its time.time()), else None."""
    words = line.split()
    return words[1:] if words and words[0] == EMIT else None


def is_step(line: str) -> bool:
    w = emitted(line)
    return w is not None and w[0] == "step"


def kill_and_recover(start: Callable[[str], Child], is_ready: Callable[[str], bool]) -> dict[str, float]:
    """Run the victim to its KILL_AT-th step, SIGKILL it, start the recovery process at once;
    seconds from the kill to the recovery's ready line and to its first step."""
    victim = start("victim")
    recovery: Child | None = None
    try:
        victim.wait_for(lambda line: is_step(line) and emitted(line)[1] == str(KILL_AT), 60,  # type: ignore[index]
                        "the victim reaching its step")
        killed = time.time()
        os.kill(victim.proc.pid, signal.SIGKILL)
        # Reaped before the new process starts, as a service manager reaps what it restarts: a
        # zombie's pid still exists, and livepush takes a runtime whose pid exists for alive.
        victim.proc.wait(10)
        recovery = start("recover")
        ready_at, line = recovery.wait_for(lambda line: is_ready(line) or is_step(line), 60, "the new process")
        words = emitted(line)
        if words and words[0] == "ready":
            ready_at = float(words[-1])
        _, line = recovery.wait_for(is_step, 60, "the interrupted job running on")
        words = emitted(line)
        assert words is not None
        if words[1] != str(KILL_AT):
            raise RuntimeError(f"the new process ran step {words[1]} first, not {KILL_AT}: a stored step ran again")
        resumed = float(words[-1])
        recovery.wait_for(lambda line: (emitted(line) or [""])[0] == "done", 60, "the recovered job finishing")
        return {"recover_s": resumed - killed, "up_s": ready_at - killed}
    finally:
        victim.stop(signal.SIGKILL)
        if recovery is not None:
            recovery.stop()


def other_node_prefix() -> list[str] | None:
    """A command prefix that runs a process as if on another machine, or None when this one
    cannot. livepush tells machines apart by boot id and pid namespace: a process in a pid
    namespace of its own is on another node, so its death is found by the heartbeat. --kill-child:
    SIGKILL to unshare kills the runtime under it too."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    probe = subprocess.run(["unshare", "--pid", "--kill-child", "true"], capture_output=True, timeout=30, check=False)
    return ["unshare", "--pid", "--kill-child"] if probe.returncode == 0 else None


def lp_kill(url: str, heartbeat: float, victim_prefix: list[str] | None = None) -> dict[str, float]:
    lp_truncate(url)
    kill.enqueue()
    env = {**os.environ, "LIVEPUSH_DATABASE_URL": url, "LIVEPUSH_FANOUT": "postgres",
           "PYTHONPATH": os.path.dirname(os.path.abspath(__file__)) + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def start(role: str) -> Child:
        prefix = (victim_prefix or []) if role == "victim" else []
        return Child([*prefix, sys.executable, "-m", "livepush", "jobs", "durable_bench", "--queues", KILL_QUEUE,
                      "--concurrency", "1", "--heartbeat", str(heartbeat), "--shutdown-timeout", "5"],
                     env={**env, "DURABLE_BENCH_ROLE": role})

    # The runtime logs "job runtime N running" once registered and claiming.
    return kill_and_recover(start, lambda line: "job runtime" in line and " running" in line)


# -- DBOS ---------------------------------------------------------------------------------------------
def dbos_call(bench_python: str, url: str, what: str, n: int = 0) -> dict[str, float]:
    proc = subprocess.run([bench_python, DBOS_DRIVER, url, what, str(n)], capture_output=True, text=True,
                          timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"DBOS {what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def dbos_kill(bench_python: str, url: str, round_no: int) -> dict[str, float]:
    workflow_id = f"kill-{round_no}-{os.getpid()}"

    def start(role: str) -> Child:
        return Child([bench_python, DBOS_DRIVER, url, role, workflow_id])

    return kill_and_recover(start, lambda line: (emitted(line) or [""])[0] == "ready")


# -- figures --------------------------------------------------------------------------------------------
HEARTBEAT = 0.2  # livepush's heartbeat in the kill test, seconds


def figures(ctx: report.Context) -> list[report.Figure]:
    """Steps/s, replay and recovery against DBOS; waking and processing beside parked jobs alone."""
    if ctx.bench_python is None:
        raise RuntimeError("no .venv-bench with DBOS: run bin/bench, which makes it")
    bench_py = ctx.bench_python
    if ctx.quick:
        rounds_n, seq_n, conc_n, children, wakes, jobs_n, parked_n = 1, 30, 100, 200, 1, 5_000, 1_000
    else:
        rounds_n, seq_n, conc_n, children, wakes, jobs_n, parked_n = 2, 100, 300, 1_000, 3, 20_000, 10_000
    rounds = report.Rounds()
    with livepush_db(ctx.pg_admin_url, "bench_durable_livepush") as lp_url:
        dbos_url = make_db(ctx.pg_admin_url, "bench_durable_dbos")
        try:
            elsewhere = other_node_prefix()
            if elsewhere is None:
                report.note("  cannot run a process in a pid namespace of its own (needs root and unshare): the "
                            "kill test with the new process on another machine is skipped")
            # A round runs each figure for both systems back to back, so drift hits both alike.
            tests: list[tuple[str, str, Callable[[int], dict[str, Any]]]] = [
                ("livepush", "seq", lambda r: {"seq_steps": lp_steps(lp_url, seq_n, 1)}),
                ("DBOS", "seq", lambda r: {"seq_steps": dbos_call(bench_py, dbos_url, "seq", seq_n)["seq_steps"]}),
                ("livepush", "conc", lambda r: {"conc_steps": lp_steps(lp_url, conc_n, 10)}),
                ("DBOS", "conc", lambda r: {"conc_steps": dbos_call(bench_py, dbos_url, "queue", conc_n)["queue_steps"]}),
                ("livepush", "replay", lambda r: lp_replay(lp_url)),
                ("DBOS", "replay", lambda r: dbos_call(bench_py, dbos_url, "replay")),
                ("livepush", "kill", lambda r: lp_kill(lp_url, HEARTBEAT)),
                ("DBOS", "kill", lambda r: dbos_kill(bench_py, dbos_url, r)),
            ]
            if elsewhere is not None:
                tests.append(("livepush", "kill elsewhere", lambda r: {
                    f"{k}_other": v for k, v in lp_kill(lp_url, HEARTBEAT, elsewhere).items()}))
            tests += [
                ("livepush", "wake", lambda r: {"wake_ms": lp_wake(lp_url, children, wakes)}),
                ("livepush", "none parked", lambda r: {"rate_none": lp_parked(lp_url, jobs_n, 0)["rate"]}),
                ("livepush", "parked", lambda r: with_parked(lp_url, jobs_n, parked_n)),
            ]
            for r in range(rounds_n):
                # The two processing runs of the parked test swap places every round, so that what
                # the first of the pair pays for following another test falls on each case in turn.
                for system, what, fn in (tests if r % 2 == 0 else [*tests[:-2], tests[-1], tests[-2]]):
                    t = time.perf_counter()
                    got = {k: v for k, v in fn(r).items() if k not in ("stored", "replayed")}
                    rounds.add(system, got)
                    report.note(f"  round {r + 1} {system:9} {what:14} " + ", ".join(
                        f"{k} {statistics_text(v)}" for k, v in got.items()) + f"  ({time.perf_counter() - t:.1f} s)")
        finally:
            drop_db(ctx.pg_admin_url, "bench_durable_dbos")

    def lp(key: str) -> float:
        return rounds.median("livepush", key) or 0.0

    def dbos(key: str) -> float | None:
        return rounds.median("DBOS", key)

    out = [
        report.Figure("10-step durable jobs one at a time", lp("seq_steps"), "steps/s", "DBOS", dbos("seq_steps"),
                      goal=3.0),
        report.Figure("10-step durable jobs at concurrency 10", lp("conc_steps"), "steps/s", "DBOS",
                      dbos("conc_steps"), goal=3.0),
        report.Figure(f"replay of {REPLAY_STEPS} stored checkpoints", lp("replay_ms"), "ms", "DBOS (a fork)",
                      dbos("replay_ms"), higher_is_better=False),
        report.Figure("kill -9 to the job's next step, new process on the same machine", lp("recover_s"), "s",
                      "DBOS", dbos("recover_s"), higher_is_better=False, goal=1.0),
    ]
    if rounds.median("livepush", "recover_s_other") is not None:
        out.append(report.Figure(f"kill -9 to the job's next step, new process elsewhere (heartbeat {HEARTBEAT:g} s)",
                                 lp("recover_s_other"), "s", "DBOS", dbos("recover_s"), higher_is_better=False,
                                 goal=1.0))
    out += [
        report.Figure(f"parent running again after its last child's commit ({children:,} children)", lp("wake_ms"),
                      "ms", higher_is_better=False),
        report.Figure(f"process no-op jobs beside {parked_n:,} parked jobs", lp("rate_parked"), "jobs/s",
                      "the same with none parked", rounds.median("livepush", "rate_none")),
    ]
    return out


def statistics_text(value: float | list[float]) -> str:
    return ", ".join(f"{x:,.1f}" for x in value) if isinstance(value, list) else f"{value:,.2f}"
