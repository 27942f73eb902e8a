"""Workflow benchmark (not a test): livepush workflows on one runtime process, against a task group
and against DBOS Transact, in one run on the same Postgres.

    .venv/bin/python bench/workflows_bench.py                  # durable Postgres, 5 rounds, 2-5 min
    .venv/bin/python bench/workflows_bench.py --quick          # 1 round, fewer runs, ~30 s
    .venv/bin/python bench/workflows_bench.py --rounds 1 --systems livepush   # without DBOS

Without --pg-url it starts a throwaway PostgreSQL (Postgres' durable defaults: fsync and
synchronous_commit on; --pg-no-fsync turns fsync off; track_commit_timestamp on, for the latency)
and removes it at the end. DBOS runs as subprocesses with the bench-only virtualenv's python
(.venv-bench, with `dbos` installed: see docs/performance.md) and bench/competitors/dbos_driver.py
(its `seq` and `queue` modes: a @DBOS.workflow calling 10 @DBOS.step functions), which prints its
figures as JSON. Each system gets its own scratch database on the same server.

livepush runs in this process: one Runtime at concurrency 10 on the event loop (uvloop when
installed), as an application's `livepush jobs` process would. Its workflow is 10 steps in a line
(s0 -> s1 -> ... -> s9), each an async no-op that notes the time.time() it was entered; every
step is a job (the step's end, in its job's outcome transaction, enqueues the next).

Measured, per round (interleaved: each round runs every figure for both sides, the order of each
pair alternating by round, so drift hits both alike):
a. one run at a time: --seq-runs runs, each started (flow.astart) once the one before finished;
   DBOS: the workflow called --seq-runs times in one thread (after a warm-up call).
   steps/s = runs x 10 / the time from the first start to the last run finished.
b. --conc-runs runs at once: started before the runtime starts, timed from its start (registered
   and listening: its startup is not counted, as DBOS's launch is not) until every run finished;
   DBOS: the workflows enqueued on a paused queue, then released at worker_concurrency=10, polled
   every 10 ms. steps/s as above.
c. step-to-step latency, from (a)'s runs: from the commit of step i's job outcome (the timestamp
   Postgres records with the commit, track_commit_timestamp, which is taken just before the
   commit's WAL flush, so the flush is inside the figure) to step i+1's function being entered
   (9 per run). Also shown: a step's entry to its own outcome's commit, entry to entry, and
   flow.astart() called to the first step entered. The same figures are printed for (b), under
   load (they include the wait for a slot and for the completer).
d. fan-out: a workflow of one fan-out step whose batch is --members no-op jobs, against the same
   no-op jobs in a plain task group (`async with jobs.agroup()`), on a runtime already started
   and idle; from the start call (flow.astart / entering the group block) to finished (the run
   succeeded / the group's finished_at set). overhead = workflow time / group time - 1.
Goals: (a)/(b) >= 1,000 steps/s; (c) p50 <= 5 ms; (d) overhead <= 15 %.
The tables show each figure's median over the rounds; a ratio is the median of the rounds' ratios
(each round's pair ran back to back, so a drift between rounds cancels out of it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _services import Services, commit_timestamped_postgres, dbos_version  # noqa: E402
from jobs_bench import drop_db, make_db, run  # noqa: E402

from livepush import config, jobs  # noqa: E402
from livepush.jobs import REGISTRY, database, get_group, job  # noqa: E402
from livepush.jobs.runtime.runtime import Runtime  # noqa: E402
from livepush.migrate import migrate  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_PY = os.path.join(ROOT, ".venv-bench", "bin", "python")
DBOS_DRIVER = os.path.join(ROOT, "bench", "competitors", "dbos_driver.py")

STEPS = 10
QUEUE = "wfbench"
CONCURRENCY = 10
DBS = ("bench_workflows_livepush", "bench_workflows_dbos")

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
          "livepush_job_steps, livepush_job_signals, livepush_workflow_signals, livepush_workflow_audit, "
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


# -- DBOS ---------------------------------------------------------------------------------------------
def dbos_call(url: str, what: str, n: int = 0) -> dict[str, float]:
    proc = subprocess.run([BENCH_PY, DBOS_DRIVER, url, what, str(n)], capture_output=True, text=True,
                          timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"DBOS {what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- report ----------------------------------------------------------------------------------------------
def load() -> str:
    """The 1, 5 and 15 minute load averages: how busy the machine was around the figures."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pg-url", help="an admin URL of a running PostgreSQL (scratch databases are made there)")
    ap.add_argument("--pg-port", type=int, default=0, help="port for the throwaway PostgreSQL (0: any free one)")
    ap.add_argument("--pg-no-fsync", action="store_true", help="throwaway PostgreSQL with fsync=off")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="1 round (unless --rounds is given) and smaller sizes")
    ap.add_argument("--seq-runs", type=int, default=None, help="runs one after another (default 100)")
    ap.add_argument("--conc-runs", type=int, default=None, help="runs at once (default 300)")
    ap.add_argument("--members", type=int, default=10_000, help="members of the fan-out (quick too)")
    ap.add_argument("--systems", default="livepush,dbos", help="comma-separated: livepush, dbos, or both")
    args = ap.parse_args()
    rounds_given = any(a == "--rounds" or a.startswith("--rounds=") for a in sys.argv[1:])
    if args.quick and not rounds_given:
        args.rounds = 1
    seq_n = args.seq_runs or (30 if args.quick else 100)
    conc_n = args.conc_runs or (100 if args.quick else 300)
    members_n = args.members
    systems = {s.strip().lower() for s in args.systems.split(",") if s.strip()}
    if not systems or systems - {"livepush", "dbos"}:
        raise SystemExit(f"--systems {args.systems}: name livepush, dbos or both")
    with_dbos, with_lp = "dbos" in systems, "livepush" in systems
    if with_dbos and not os.path.exists(BENCH_PY):
        raise SystemExit("no .venv-bench: python3 -m venv .venv-bench && .venv-bench/bin/pip install dbos "
                         "'psycopg[binary]' (see docs/performance.md), or pass --systems livepush")
    # SIGTERM (a CI timeout, kill) unwinds like Ctrl-C, so the finally below stops what was started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    services = Services()
    try:
        pg = commit_timestamped_postgres(services, args.pg_url, args.pg_port, args.pg_no_fsync)
        admin, where, version, fsync, sync_commit = pg.admin, pg.where, pg.version, pg.fsync, pg.synchronous_commit
        commit_ts = pg.commit_timestamps
        if with_lp and not pg.commit_timestamps:
            print("the server keeps no commit timestamps (track_commit_timestamp off): the latency is skipped", flush=True)
        dbos_version_shown = dbos_version(BENCH_PY) if with_dbos else "not run"
        print(f"PostgreSQL {version} ({where}; fsync={fsync}, synchronous_commit={sync_commit}), "
              f"{os.cpu_count()} cores, DBOS {dbos_version_shown}, {args.rounds} round(s); 10-step runs: {seq_n:,} one "
              f"at a time, {conc_n:,} at once at concurrency {CONCURRENCY}; fan-out of {members_n:,}; "
              f"load average {load()}", flush=True)

        pairs: list[list[tuple[str, str, Callable[[], dict[str, Any]]]]] = []
        if with_lp:
            lp_url = make_db(admin, DBS[0])
            migrate(lp_url)
            config.set_settings(config.Settings(database_url=lp_url, fanout="postgres", env="test"))
            database.configure(lp_url)
        if with_dbos:
            dbos_url = make_db(admin, DBS[1])
            dbos_call(dbos_url, "install")
        seq_pair, conc_pair = [], []
        if with_lp:
            seq_pair.append(("livepush", "one at a time", lambda: lp_seq(lp_url, seq_n, commit_ts)))
            conc_pair.append(("livepush", "at once", lambda: lp_conc(lp_url, conc_n, commit_ts)))
        if with_dbos:
            seq_pair.append(("DBOS", "one at a time",
                             lambda: {"seq_steps": dbos_call(dbos_url, "seq", seq_n)["seq_steps"]}))
            conc_pair.append(("DBOS", "at once",
                              lambda: {"conc_steps": dbos_call(dbos_url, "queue", conc_n)["queue_steps"]}))
        pairs += [seq_pair, conc_pair]
        if with_lp:
            pairs.append([("livepush", "group", lambda: lp_group(lp_url, members_n)),
                          ("livepush", "fan-out", lambda: lp_fan(lp_url, members_n))])

        results: dict[str, dict[str, list[Any]]] = {"livepush": {}, "DBOS": {}}
        for r in range(args.rounds):
            for pair in pairs:
                for system, what, fn in (pair if r % 2 == 0 else pair[::-1]):
                    t = time.perf_counter()
                    got = fn()
                    shown = []
                    for k, v in got.items():
                        results[system].setdefault(k, []).append(v)
                        if isinstance(v, list):
                            if v:
                                shown.append(f"{k} p50 {statistics.median(v):.2f} ms")
                        else:
                            shown.append(f"{k} {v:,.2f}")
                    print(f"  round {r + 1} {system:9} {what:14} {', '.join(shown)}  "
                          f"({time.perf_counter() - t:.1f} s)", flush=True)
        report(results, seq_n, conc_n, members_n)
        print(f"load average at the end {load()} (the machine's, others' work included: {os.cpu_count()} cores)")
    finally:
        database.configure(None)
        if args.pg_url:
            for name in DBS:
                try:
                    drop_db(args.pg_url, name)
                except psycopg.Error:
                    pass
        services.stop()


def report(results: dict[str, dict[str, list[Any]]], seq_n: int, conc_n: int, members_n: int) -> None:
    lp, db = results["livepush"], results["DBOS"]

    def med(side: dict[str, list[Any]], key: str) -> float | None:
        return statistics.median(side[key]) if side.get(key) else None

    def rate(v: float | None) -> str:
        return "n/a" if v is None else f"{v:,.0f}/s"

    def spread(values: list[float]) -> str:
        return f"{(max(values) - min(values)) / statistics.median(values) * 100:.0f} %" if len(values) > 1 else "n/a"

    print()
    print("| figure | livepush | DBOS | livepush / DBOS | each round |")
    print("|---|---|---|---|---|")
    for label, key in ((f"10-step runs one at a time ({seq_n:,} runs), steps/s", "seq_steps"),
                       (f"10-step runs at once ({conc_n:,}, concurrency {CONCURRENCY}), steps/s", "conc_steps")):
        ratios = [x / y for x, y in zip(lp.get(key, []), db.get(key, []))]
        shown = f"{statistics.median(ratios):.2f}x" if ratios else ""
        print(f"| {label} | {rate(med(lp, key))} | {rate(med(db, key))} | {shown} | "
              f"{', '.join(f'{x:.2f}' for x in ratios)} |")
    print()
    if lp.get("conc_steps"):
        print(f"livepush spread over the rounds (max - min) / median: one at a time {spread(lp['seq_steps'])}, "
              f"at once {spread(lp['conc_steps'])}; runtime process CPU while {conc_n:,} runs went at once: "
              f"{med(lp, 'conc_cpu'):.0f} % of a core (100 % would mean the process is the limit)")
    if db.get("conc_steps"):
        print(f"DBOS spread: one at a time {spread(db['seq_steps'])}, at once {spread(db['conc_steps'])}")
    print()
    lat_rows = []
    for case, label in (("seq", "one at a time"), ("conc", f"{conc_n:,} at once")):
        for key, what in (("gap", "outcome commit -> next step entered"),
                          ("own", "step entered -> its outcome committed"),
                          ("step", "step entered -> next step entered"),
                          ("first", "flow.astart() called -> first step entered")):
            per_round = lp.get(f"{case}_{key}") or []
            pooled = [x for rnd in per_round for x in rnd]
            if pooled:
                lat_rows.append((f"{what} ({label})", pooled, [statistics.median(x) for x in per_round if x]))
    if lat_rows:
        print("| livepush step latency, ms | p50 | p90 | p99 | p50 of each round |")
        print("|---|---|---|---|---|")
        for label, pooled, p50s in lat_rows:
            print(f"| {label} | {pct(pooled, 0.5):.2f} | {pct(pooled, 0.9):.2f} | {pct(pooled, 0.99):.2f} | "
                  f"{', '.join(f'{x:.2f}' for x in p50s)} |")
        print()
    g, f = med(lp, "group_s"), med(lp, "fan_s")
    if g and f:
        print(f"| {members_n:,} no-op jobs, start to finished | s | jobs/s | start -> members written, ms | "
              "members run, s | group finished -> run finished, ms | each round, s |")
        print("|---|---|---|---|---|---|---|")
        print(f"| plain task group (jobs.agroup) | {g:.2f} | {members_n / g:,.0f} | {med(lp, 'group_made_ms'):.0f} | "
              f"{med(lp, 'group_members_s'):.2f} | | {', '.join(f'{x:.2f}' for x in lp['group_s'])} |")
        print(f"| workflow fan-out step | {f:.2f} | {members_n / f:,.0f} | {med(lp, 'fan_made_ms'):.0f} | "
              f"{med(lp, 'fan_members_s'):.2f} | {med(lp, 'fan_end_ms'):.0f} | "
              f"{', '.join(f'{x:.2f}' for x in lp['fan_s'])} |")
        fan_ratios = [a / b for a, b in zip(lp["fan_s"], lp["group_s"])]
        print(f"| fan-out / group | {statistics.median(fan_ratios):.2f}x | | | | | "
              f"{', '.join(f'{x:.2f}' for x in fan_ratios)} |")
        print()
    goals: list[tuple[str, str, bool]] = []
    v = med(lp, "conc_steps")
    if v is not None:
        goals.append((f"steps/s on one runtime process, {conc_n:,} runs at once >= 1,000", f"{v:,.0f}/s", v >= 1000))
    v = med(lp, "seq_steps")
    if v is not None:
        goals.append(("steps/s on one runtime process, one run at a time >= 1,000",
                      f"{v:,.0f}/s, one step every {1000 / v:.1f} ms", v >= 1000))
    pooled = [x for rnd in lp.get("seq_gap") or [] for x in rnd]
    if pooled:
        p50 = pct(pooled, 0.5)
        goals.append(("step-to-step latency p50 (outcome commit -> next step entered, one at a time) <= 5 ms",
                      f"{p50:.2f} ms", p50 <= 5))
    if g and f:
        over = statistics.median(fan_ratios) - 1
        goals.append((f"fan-out of {members_n:,} vs the same jobs in a task group: overhead <= 15 %",
                       f"{over * 100:.1f} % (the group's own times spread {spread(lp['group_s'])})", over <= 0.15))
    for label, value, ok in goals:
        print(f"goal {label}: {value} {'met' if ok else 'NOT met'}")
    flat = {s: {k: v for k, v in m.items() if not (v and isinstance(v[0], list))} for s, m in results.items()}
    print(f"runs: {json.dumps(flat)}")


if __name__ == "__main__":
    main()
