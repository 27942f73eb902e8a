"""Durable jobs under kill -9 (docs/durable.md): runtimes in child processes are killed at random
instants while parents run checkpoints, park on children and wake, and children run and finish."""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest

from tests.jobs import durable_crash_jobs as cj
from tests.jobs.conftest import q, registered, runtime_spawner, version_gaps
from tests.support.procs import ChildProcess, Processes
from tests.support.waiting import wait_for

MODULE = "tests.jobs.durable_crash_jobs"
ROUNDS = 60
# Three silent beats and a runtime is dead; a runtime starting on this machine finds a killed one
# at once. Either way its jobs are rescued well within a round.
BEAT = 0.1
CONCURRENCY = "8"
MAX_DELAY = 0.25  # seconds from a round's enqueue to its kill, at most
SEED = int(os.environ.get("LIVEPUSH_TEST_CRASH_SEED") or 20250)


@pytest.fixture
def crash_db(jobs_db: str) -> Iterator[str]:
    q(jobs_db, cj.BODIES_TABLE)
    yield jobs_db


@pytest.fixture
def spawn_runtime(crash_db: str, procs: Processes,
                  livepush_env: Callable[..., dict[str, str]]) -> Callable[[], ChildProcess]:
    """Starts a runtime of the crash jobs and returns at once (see `registered`)."""
    return runtime_spawner(MODULE, procs, livepush_env(database_url=crash_db), "--concurrency", CONCURRENCY,
                           heartbeat=BEAT)


@dataclass
class Kill:
    round: int
    at: datetime  # the database's clock just after the kill: later than anything the victim wrote
    interrupted: list[tuple[int, str]]  # (job id, name) the victim was running


def kill_one(url: str, round_no: int, victim: ChildProcess) -> Kill:
    rows = q(url, "SELECT id FROM livepush_job_runtimes WHERE pid = %s", (victim.pid,))
    victim.kill()
    if not rows:
        # Starved of CPU past three beats (a loaded machine), the victim was already presumed dead
        # and its jobs rescued: it held nothing the kill could interrupt.
        return Kill(round_no, q(url, "SELECT clock_timestamp()")[0][0], [])
    (runtime_id,) = rows[0]
    # Nothing moves the victim's jobs on before a rescue (by a runtime that registers after the
    # kill, or three beats from now): these are the runs it lost.
    at, ids, names = q(url, """
        SELECT clock_timestamp(), coalesce(array_agg(id ORDER BY id), '{}'), coalesce(array_agg(name ORDER BY id), '{}')
        FROM livepush_jobs WHERE runtime_id = %s AND state = 'running'""", (runtime_id,))[0]
    return Kill(round_no, at, list(zip(ids, names)))


def where_killed(url: str, kill: Kill, job_id: int) -> str:
    """What a killed run had done last: started a checkpoint body whose result was not stored yet,
    stored a checkpoint, stored a group of children (or, replaying, woke past it), or nothing yet."""
    last = q(url, """
        SELECT what FROM (
            SELECT at, 'inside checkpoint body ' || name AS what FROM crash_bodies WHERE job_id = %(id)s AND at < %(at)s
            UNION ALL
            SELECT at, 'after ' || kind || ' ' || name || ' stored' FROM livepush_job_steps
            WHERE job_id = %(id)s AND at < %(at)s
        ) e ORDER BY at DESC LIMIT 1""", {"id": job_id, "at": kill.at})
    return str(last[0][0]) if last else "before its first step"


def parents_done(url: str, count: int) -> bool:
    states = dict(q(url, "SELECT state, count(*) FROM livepush_jobs WHERE name = 'crash.parent' GROUP BY state"))
    failed = q(url, """SELECT j.id, j.name, p.error FROM livepush_jobs j JOIN livepush_job_payloads p ON p.id = j.id
                       WHERE j.state IN ('failed', 'cancelled') LIMIT 5""")
    assert not failed, f"seed {SEED}: jobs failed: {failed}"
    return bool(states.get("succeeded", 0) == count)


def kills_of(kills: list[Kill], job_id: int) -> list[int]:
    return [k.round for k in kills if any(i == job_id for i, _ in k.interrupted)]


@pytest.mark.slow
def test_kill_9_at_random_points_never_reruns_a_stored_checkpoint_or_a_child(
        crash_db: str, spawn_runtime: Callable[[], ChildProcess]) -> None:
    """SIGKILL of a runtime at random instants, 60 times: no checkpoint body runs once its result
    is committed, no child is created twice, and every parent wakes and returns the right result."""
    url = crash_db
    rng = random.Random(SEED)
    began = time.monotonic()
    alive = [spawn_runtime() for _ in range(2)]
    everyone = list(alive)
    for child in alive:
        registered(url, child)
    parents: dict[int, tuple[int, int]] = {}  # job id -> (tag, fan)
    enqueued_in: dict[int, int] = {}  # job id -> round
    kills: list[Kill] = []
    for round_no in range(ROUNDS):
        # The replacement starts first, so its start overlaps the round; it may register before
        # the kill (then a heartbeat finds the victim dead) or after (then it finds it at start).
        replacement = spawn_runtime()
        everyone.append(replacement)
        for _ in range(rng.randint(1, 2)):
            tag, fan = len(parents), rng.randint(2, 4)
            handle = cj.parent.enqueue(tag, fan)
            parents[handle.id] = (tag, fan)
            enqueued_in[handle.id] = round_no
        # Not a wait for anything: the random instant at which this round's kill lands, among
        # this round's and the earlier rounds' parents and children at whatever step they are.
        time.sleep(rng.uniform(0.0, MAX_DELAY))
        victim = alive.pop(rng.randrange(len(alive)))
        kills.append(kill_one(url, round_no, victim))
        registered(url, replacement)
        alive.append(replacement)
    rounds_took = time.monotonic() - began

    try:
        wait_for(lambda: parents_done(url, len(parents)), 60.0, interval=0.1,
                 message=f"seed {SEED}: all {len(parents)} parents to succeed (every parent wakes)")
    except AssertionError as exc:
        stuck = q(url, """SELECT j.id, j.state, j.attempt, p.waiting FROM livepush_jobs j
                          JOIN livepush_job_payloads p ON p.id = j.id
                          WHERE j.name = 'crash.parent' AND j.state <> 'succeeded' ORDER BY j.id LIMIT 10""")
        shown = "; ".join(f"{row} killed in rounds {kills_of(kills, row[0])}" for row in stuck)
        raise AssertionError(f"{exc}; parents not done: {shown}") from None
    for child in alive:
        assert child.stop(timeout=15) == 0, child.output()
    took = time.monotonic() - began

    def context(job_id: int) -> str:
        """Where to look when `job_id` (a parent or a child) broke the guarantee: the rounds."""
        parent = q(url, """SELECT g.parent_id FROM livepush_jobs j JOIN livepush_groups g ON g.id = j.group_id
                           WHERE j.id = %s""", (job_id,))
        owner = parent[0][0] if parent else job_id
        whose = f" (child of {owner})" if owner != job_id else ""
        rounds = sorted(set(kills_of(kills, job_id) + kills_of(kills, owner)))
        return (f"job {job_id}{whose}: seed {SEED}, parent enqueued in round {enqueued_in.get(owner)}, "
                f"runs killed in rounds {rounds}")

    # A runtime presumed dead while alive would go on running a rescued job: then two runs overlap
    # and the guarantee below is not what this test is about.
    stalled = [c.pid for c in everyone if "was presumed dead" in c.stderr()]
    assert not stalled, f"seed {SEED}: live runtimes {stalled} missed three beats of {BEAT} s: the machine is too slow"

    # No body ran once its result was committed: every body run of a stored checkpoint started
    # before the step's row was written.
    late = q(url, """
        SELECT b.job_id, b.name, b.attempt, b.at, s.at FROM crash_bodies b
        JOIN livepush_job_steps s ON s.job_id = b.job_id AND s.kind = 'checkpoint' AND s.name = b.name
        WHERE b.at >= s.at ORDER BY b.job_id, b.at""")
    assert not late, f"{len(late)} checkpoint bodies ran after their result was committed: " + "; ".join(
        f"job {job_id} {name!r} attempt {attempt} started {(ran - stored).total_seconds():.3f} s after it was stored, "
        f"{context(job_id)}" for job_id, name, attempt, ran, stored in late[:5])
    # Every stored checkpoint had its body run, and every body run belongs to a stored checkpoint
    # (all jobs succeeded, so each reached all of its checkpoints).
    assert q(url, """
        SELECT s.job_id, s.name FROM livepush_job_steps s WHERE s.kind = 'checkpoint'
        EXCEPT SELECT job_id, name FROM crash_bodies""") == []
    assert q(url, """
        SELECT job_id, name FROM crash_bodies
        EXCEPT SELECT s.job_id, s.name FROM livepush_job_steps s WHERE s.kind = 'checkpoint'""") == []

    # No child was created twice: each parent has exactly two groups, the ones its stored children
    # steps name ("0", "1"), each with the members asked for.
    groups = q(url, """
        SELECT g.parent_id, s.name, (SELECT count(*) FROM livepush_jobs j WHERE j.group_id = g.id)
        FROM livepush_groups g
        LEFT JOIN livepush_job_steps s ON s.job_id = g.parent_id AND s.kind = 'children'
                                      AND (s.result->>'group')::bigint = g.id
        ORDER BY g.parent_id, g.id""")
    by_parent: dict[int, list[tuple[Any, ...]]] = {}
    for parent_id, step, members in groups:
        by_parent.setdefault(parent_id, []).append((step, members))
    assert set(by_parent) == set(parents)
    for job_id, (tag, fan) in parents.items():
        got = by_parent[job_id]
        assert got == [("0", fan), ("1", cj.SECOND_FAN)], f"groups (step, members) {got}: {context(job_id)}"
    doubles = q(url, """
        SELECT p.args, count(*) FROM livepush_jobs j JOIN livepush_job_payloads p ON p.id = j.id
        WHERE j.name = 'crash.child' GROUP BY p.args HAVING count(*) > 1""")
    assert doubles == [], f"seed {SEED}: children created twice (args, times): {doubles}"
    total_children = sum(fan + cj.SECOND_FAN for _, fan in parents.values())
    assert q(url, "SELECT count(*) FROM livepush_jobs WHERE name = 'crash.child'") == [(total_children,)]

    # Every parent woke after each group and returned what its steps and children computed.
    results = dict(q(url, """SELECT j.id, p.result FROM livepush_jobs j JOIN livepush_job_payloads p ON p.id = j.id
                             WHERE j.name = 'crash.parent'"""))
    for job_id, (tag, fan) in parents.items():
        assert results[job_id] == cj.expected(tag, fan), f"{json.dumps(results[job_id])}: {context(job_id)}"
    assert q(url, "SELECT state, count(*) FROM livepush_jobs GROUP BY state") == \
        [("succeeded", len(parents) + total_children)]
    assert version_gaps(url) == []  # every job's topic went 1, 2, 3... through every kill and rescue

    # Where the kills landed: the run each one interrupted, by what it had done last.
    landed: Counter[str] = Counter()
    for kill in kills:
        for job_id, name in kill.interrupted:
            landed[f"{name} {where_killed(url, kill, job_id)}"] += 1
    reran = q(url, "SELECT count(*) FROM (SELECT FROM crash_bodies GROUP BY job_id, name HAVING count(*) > 1) r")[0][0]
    rescued = dict(q(url, "SELECT name, count(*) FROM test_job_versions WHERE event = 'retrying' GROUP BY name"))
    most = q(url, "SELECT max(attempt) FROM livepush_jobs")[0][0]
    print(f"seed {SEED}: {len(kills)} kills in {rounds_took:.1f} s, all done in {took:.1f} s; {len(parents)} parents, "
          f"{total_children} children; rescued runs {rescued}, at most {most} attempts for a job; bodies run again "
          f"after a kill before their commit: {reran}; kills landed: {dict(sorted(landed.items()))}")
    # The kills did land where the guarantee is tested: inside bodies before their commit, just
    # after commits, in parents and in children (each of these is expected a dozen times or more).
    assert reran > 0 and any(" inside checkpoint body " in what for what in landed), landed
    assert any(" after checkpoint " in what for what in landed), landed
    assert rescued.get("crash.parent", 0) > 0 and rescued.get("crash.child", 0) > 0, rescued
