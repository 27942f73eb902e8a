"""Workflows under kill -9 (docs/workflows.md): runtimes in child processes are killed at random
instants while steps run, while a fan-out step makes its batch, and just after an operator
resumed a run its batch's failures paused; every run still ends as it should, with each step's
job and each batch member created once."""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import pytest

from livepush import jobs
from tests.jobs import workflow_checks as checks
from tests.jobs import workflow_crash_defs as cd
from tests.jobs.conftest import q, registered, runtime_spawner, version_gaps
from tests.support.procs import ChildProcess, Processes
from tests.support.waiting import wait_for

MODULE = "tests.jobs.workflow_crash_defs"
ROUNDS = 36
# Three silent beats and a runtime is dead; a runtime starting on this machine finds a killed one
# at once. Either way its jobs are rescued well within a round.
BEAT = 0.1
CONCURRENCY = "8"
MAX_DELAY = 0.25  # seconds from a round's start (or its resume) to its kill, at most
SEED = int(os.environ.get("LIVEPUSH_TEST_CRASH_SEED") or 4242)


@pytest.fixture
def crash_db(jobs_db: str) -> Iterator[str]:
    q(jobs_db, cd.RUNS_TABLE)
    q(jobs_db, checks.STARTS_TABLE)
    yield jobs_db


@pytest.fixture
def spawn_runtime(crash_db: str, procs: Processes,
                  livepush_env: Callable[..., dict[str, str]]) -> Callable[[], ChildProcess]:
    """Starts a runtime of the crash workflows and returns at once (see `registered`)."""
    return runtime_spawner(MODULE, procs, livepush_env(database_url=crash_db), "--concurrency", CONCURRENCY,
                           heartbeat=BEAT)


@dataclass
class Kill:
    round: int
    why: str  # what the round aimed the kill at
    at: datetime  # the database's clock just after the kill: later than anything the victim wrote
    interrupted: list[tuple[int, str]]  # (job id, name) the victim was running


def runtime_of(url: str, job_id: int) -> int | None:
    """The pid of the runtime running `job_id` now, if one is."""
    rows = q(url, """SELECT r.pid FROM livepush_jobs j JOIN livepush_job_runtimes r ON r.id = j.runtime_id
                     WHERE j.id = %s AND j.state = 'running'""", (job_id,))
    return rows[0][0] if rows else None


def kill(url: str, round_no: int, why: str, victim: ChildProcess) -> Kill:
    rows = q(url, "SELECT id FROM livepush_job_runtimes WHERE pid = %s", (victim.pid,))
    victim.kill()
    if not rows:
        # Starved of CPU past three beats (a loaded machine), the victim was already presumed dead
        # and its jobs rescued: it held nothing the kill could interrupt.
        return Kill(round_no, why, q(url, "SELECT clock_timestamp()")[0][0], [])
    (runtime_id,) = rows[0]
    # Nothing moves the victim's jobs on before a rescue: these are the runs it lost.
    at, ids, names = q(url, """
        SELECT clock_timestamp(), coalesce(array_agg(id ORDER BY id), '{}'), coalesce(array_agg(name ORDER BY id), '{}')
        FROM livepush_jobs WHERE runtime_id = %s AND state = 'running'""", (runtime_id,))[0]
    return Kill(round_no, why, at, list(zip(ids, names)))


def where_killed(url: str, kill: Kill, job_id: int, name: str, resumed: set[int]) -> str:
    """What a killed run of a job was doing: a step's body, a fan-out step making its batch (its
    first one, or the one a resume asked for) or parked on it, a member."""
    if name == "wfc.member":
        return "a member"
    batch = q(url, """SELECT count(*) FROM livepush_job_steps WHERE job_id = %s AND kind = 'children'
                      AND at < %s""", (job_id, kill.at))[0][0]
    if name == "wfc_fan.spread":
        if batch:
            return "a fan-out step woken by its batch"
        if job_id in resumed:
            return "a resumed fan-out step making its new batch"
        making = q(url, "SELECT count(*) FROM wf_crash_runs WHERE job_id = %s AND what = 'spread making its batch' "
                        "AND at < %s", (job_id, kill.at))[0][0]
        return "a fan-out step making its batch" if making else "a fan-out step before its function"
    began = q(url, "SELECT count(*) FROM wf_crash_runs WHERE job_id = %s AND at < %s", (job_id, kill.at))[0][0]
    return "a step in its body" if began else "a step before its body"


@pytest.mark.slow
def test_kill_9_during_steps_batches_and_resumes_creates_each_step_and_member_once(
        crash_db: str, spawn_runtime: Callable[[], ChildProcess]) -> None:
    """SIGKILL of a runtime 36 times, aimed at steps' bodies, at fan-out steps making batches of 20 to
    50 members, and just after a resume of a run paused by failed members: every run succeeds with the
    right outputs and counts; each step has one job, plus one per pause its batch's failures caused
    and a resume undid; each member was created once per batch it was asked for."""
    url = crash_db
    rng = random.Random(SEED)
    began = time.monotonic()
    alive = [spawn_runtime() for _ in range(2)]
    everyone = list(alive)
    for child in alive:
        registered(url, child)
    diamonds: dict[int, int] = {}  # run id -> n
    fans: dict[int, tuple[int, dict[str, int]]] = {}  # run id -> (n, failing members: batches they fail)
    resumed: set[int] = set()  # fan-out steps' jobs that resumes created
    resumes: dict[int, int] = Counter()  # run id -> resumes that applied
    kills: list[Kill] = []

    def start_diamond() -> int:
        n = rng.randint(1, 1000)
        run = cd.diamond.start({"n": n})
        diamonds[run.id] = n
        return run.id

    def start_fan() -> int:
        n = rng.randint(20, 50)
        # Members that fail in their first batch, or in their first two: one resume or two.
        failing = {str(i): rng.choice([1, 1, 2]) for i in rng.sample(range(n), rng.choice([0, 1, 1, 2, 3]))}
        run = cd.fan.start({"n": n, "failing": failing})
        fans[run.id] = (n, failing)
        return run.id

    def pick(job_id: int | None, replacement: ChildProcess) -> ChildProcess:
        """The runtime running `job_id` if one still does (the round's replacement too, once it
        registered), else one of the older ones at random."""
        pid = runtime_of(url, job_id) if job_id is not None else None
        for i, child in enumerate(alive):
            if child.pid == pid:
                return alive.pop(i)
        if replacement.pid == pid:
            return replacement
        return alive.pop(rng.randrange(len(alive)))

    watch = psycopg.connect(url, autocommit=True)  # one connection for the tight polls that aim the kills

    def one(sql: str, *params: Any) -> Any:
        row = watch.execute(sql, params).fetchone()
        return row[0] if row else None

    try:
        for round_no in range(ROUNDS):
            # The replacement starts first, so its start overlaps the round; it may register before
            # the kill (then a heartbeat finds the victim dead) or after (then it finds it at start).
            replacement = spawn_runtime()
            everyone.append(replacement)
            paused = [r for (r,) in q(url, "SELECT id FROM livepush_workflows WHERE state = 'paused' ORDER BY id")]
            aim = rng.choice(["body", "batch", "resume", "resume"] if paused else ["body", "batch"])
            target: int | None = None
            if aim == "body":
                for _ in range(rng.randint(1, 3)):
                    start_diamond()
                # Not a wait for anything: the random instant at which this round's kill lands.
                time.sleep(rng.uniform(0.0, MAX_DELAY))
                running = q(url, "SELECT id FROM livepush_jobs WHERE state = 'running' AND name LIKE 'wfc_diamond.%%'")
                target = rng.choice(running)[0] if running else None
            elif aim == "batch":
                run_id = start_fan()
                if rng.random() < 0.5:
                    start_diamond()
                # The fan-out step's job starts making its batch (its function records that first).
                wait_for(lambda: one("SELECT count(*) FROM wf_crash_runs WHERE run_id = %s AND what = "
                                     "'spread making its batch'", run_id) > 0, 15.0, interval=0.002,
                         message=f"run {run_id}'s fan-out step to start making its batch")
                time.sleep(rng.uniform(0.0, 0.15))  # the random instant, within its 20-50 members
                target = q(url, "SELECT job_id FROM livepush_workflow_steps WHERE workflow_id = %s AND name = 'spread'",
                           (run_id,))[0][0]
            else:
                run_id = rng.choice(paused)
                assert jobs.workflows.resume(run_id, actor=f"round {round_no}", reason="members fixed")
                resumes[run_id] += 1
                target = one("SELECT job_id FROM livepush_workflow_steps WHERE workflow_id = %s AND name = 'spread'",
                             run_id)
                resumed.add(target)
                # A runtime claims the step's new job; the kill lands at a random instant after that.
                wait_for(lambda: one("SELECT state FROM livepush_jobs WHERE id = %s", target) != "available", 15.0,
                         interval=0.001, message=f"run {run_id}'s resumed fan-out step to be claimed")
                time.sleep(rng.uniform(0.0, 0.01))  # within its new batch's making, or just after
            victim = pick(target, replacement)
            kills.append(kill(url, round_no, aim, victim))
            if victim is not replacement:
                registered(url, replacement)
                alive.append(replacement)
    finally:
        watch.close()
    rounds_took = time.monotonic() - began

    def unfinished() -> list[tuple[Any, ...]]:
        for (run_id,) in q(url, "SELECT id FROM livepush_workflows WHERE state = 'paused'"):
            if jobs.workflows.resume(run_id, actor="after the kills", reason="members fixed"):
                resumes[run_id] += 1
        return q(url, "SELECT id, name, state FROM livepush_workflows WHERE state <> 'succeeded' ORDER BY id")

    try:
        wait_for(lambda: not unfinished(), 60.0, interval=0.1, message=f"seed {SEED}: every run to succeed")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {unfinished()[:10]}; kills {[(k.round, k.why, k.interrupted) for k in kills]}") \
            from None
    for child in alive:
        assert child.stop(timeout=15) == 0, child.output()
    took = time.monotonic() - began

    # A runtime presumed dead while alive would go on running a rescued job: then two runs overlap
    # and the guarantee below is not what this test is about.
    stalled = [c.pid for c in everyone if "was presumed dead" in c.stderr()]
    assert not stalled, f"seed {SEED}: live runtimes {stalled} missed three beats of {BEAT} s: the machine is too slow"

    def context(run_id: int) -> str:
        rounds = sorted({k.round for k in kills for job_id, _ in k.interrupted
                         if q(url, "SELECT workflow_id FROM livepush_jobs WHERE id = %s", (job_id,))[0][0] == run_id
                         or q(url, "SELECT 1 FROM livepush_jobs j JOIN livepush_groups g ON g.id = j.group_id "
                                   "JOIN livepush_workflow_steps s ON s.job_id = g.parent_id "
                                   "WHERE j.id = %s AND s.workflow_id = %s", (job_id, run_id))})
        return f"seed {SEED}, run {run_id}: its jobs killed in rounds {rounds}"

    # Every step started once per generation, only when what it comes after was done.
    problems = checks.bad_starts(url) + checks.bad_generations(url) + checks.bad_batches(url)
    assert not problems, "\n".join(problems[:10])
    by_step = checks.step_jobs(url)
    pauses = checks.step_pauses(url)
    outputs = {(r, s): o for r, s, o in q(url, "SELECT workflow_id, name, output FROM livepush_workflow_steps")}
    for run_id, n in diamonds.items():
        for step in "abcd":
            got = by_step[(run_id, f"wfc_diamond.{step}")]
            assert [j["state"] for j in got] == ["succeeded"], f"step {step}: jobs {got}: {context(run_id)}"
        assert {s: outputs[(run_id, s)] for s in "abcd"} == cd.diamond_outputs(n), context(run_id)
    for run_id, (n, failing) in fans.items():
        batches = 1 + max(failing.values(), default=0)
        for step in ("plan", "spread", "report"):
            got = by_step[(run_id, f"wfc_fan.{step}")]
            want = batches if step == "spread" else 1
            assert len(got) == want, f"step {step}: {len(got)} jobs, {want} wanted: {context(run_id)}"
        assert pauses.get((run_id, "spread"), 0) == batches - 1 == resumes[run_id], \
            (pauses.get((run_id, "spread")), resumes[run_id], context(run_id))
        # Each batch holds the members asked for, each created once: all n, then the ones that
        # failed in the batch before.
        spread_jobs = [j["id"] for j in by_step[(run_id, "wfc_fan.spread")]]
        members = q(url, """SELECT g.parent_id, g.total, count(j.id), array_agg((p.args ->> 1)::int ORDER BY j.id)
                            FROM livepush_groups g JOIN livepush_jobs j ON j.group_id = g.id
                            JOIN livepush_job_payloads p ON p.id = j.id
                            WHERE g.parent_id = ANY(%s) GROUP BY g.id ORDER BY g.id""", (spread_jobs,))
        wanted = [sorted(i for i in range(n) if failing.get(str(i), 0) >= batch) for batch in range(batches)]
        assert [(m[0], m[1], m[2], sorted(m[3])) for m in members] == \
            [(job, len(w), len(w), w) for job, w in zip(spread_jobs, wanted)], \
            f"batches (parent, total, members, which): {members}: {context(run_id)}"
        counts = {"total": n, "succeeded": n, "failed": 0, "cancelled": 0}
        assert outputs[(run_id, "spread")] == counts, f"{outputs[(run_id, 'spread')]}: {context(run_id)}"
        assert outputs[(run_id, "report")] == {"rows": counts, "n": n}, context(run_id)
        assert outputs[(run_id, "plan")] == {"n": n}, context(run_id)
    doubles = q(url, """SELECT p.args, count(*) FROM livepush_jobs j JOIN livepush_job_payloads p ON p.id = j.id
                        WHERE j.name = 'wfc.member' GROUP BY p.args
                        HAVING count(*) > 1 + coalesce((p.args ->> 2)::int, 0)""")
    assert doubles == [], f"seed {SEED}: members created more often than their batches (args, times): {doubles}"
    assert q(url, "SELECT count(*) FROM livepush_jobs WHERE state NOT IN ('succeeded', 'failed')") == [(0,)]
    assert q(url, "SELECT count(*) FROM livepush_jobs WHERE state = 'failed' AND name <> 'wfc.member'") == [(0,)]
    assert version_gaps(url) == []  # every job's topic went 1, 2, 3... through every kill and rescue

    # Where the kills landed: the runs each one interrupted.
    landed: Counter[str] = Counter()
    for k in kills:
        for job_id, name in k.interrupted:
            landed[where_killed(url, k, job_id, name, resumed)] += 1
    rescued = dict(q(url, "SELECT name, count(*) FROM test_job_versions WHERE event = 'retrying' GROUP BY name"))
    print(f"seed {SEED}: {len(kills)} kills ({dict(Counter(k.why for k in kills))}) in {rounds_took:.1f} s, all done "
          f"in {took:.1f} s; {len(diamonds)} diamonds, {len(fans)} fan-outs "
          f"({sum(1 for _, f in fans.values() if f)} paused, {sum(resumes.values())} resumes); rescued runs {rescued}; "
          f"kills landed: {dict(sorted(landed.items()))}")
    # The kills did land where the guarantee is tested.
    for where in ("a step in its body", "a fan-out step making its batch",
                  "a resumed fan-out step making its new batch"):
        assert landed[where] > 0, (where, dict(landed))
