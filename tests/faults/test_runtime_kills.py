"""Job runtimes under kill -9 and SIGTERM during a load (docs/reference.md §7, Jobs): three
`livepush jobs` processes run 5,000 tiny jobs while one of them, picked at random, is killed
(SIGKILL), drained (SIGTERM) or drained and interrupted (SIGTERM then SIGINT), again and again,
each time replaced by a new one. Every job succeeds exactly once, and a job runs again only after
its earlier run was rescued from a killed runtime (attempt spent) or given back by a draining one
(attempt not spent).

The instants are random and seeded: LIVEPUSH_TEST_FAULT_SEED=N replays a seed (the same choices;
the machine's timing still varies). A failure names its seed.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from signal import SIGINT, SIGTERM

import psycopg
import pytest

from livepush import api, jobs
from tests.faults import runtime_kill_jobs as kj
from tests.jobs.conftest import q, registered, version_gaps
from tests.support.job_versions import VERSIONS_TABLE
from tests.support.procs import ChildProcess, Processes
from tests.support.settings import jobs_settings
from tests.support.waiting import wait_for

MODULE = "tests.faults.runtime_kill_jobs"
SEED = int(os.environ.get("LIVEPUSH_TEST_FAULT_SEED") or 71_523)
JOBS = 5_000
RUNTIMES = 3
CONCURRENCY = 10
# Three silent beats and a runtime is dead; a runtime starting on this machine finds a killed one
# at once. Either way a killed runtime's jobs come back well within the test.
BEAT = 0.3
# Faults stop once this share of the jobs succeeded: the last ones then finish undisturbed.
FAULTS_UNTIL = 0.9
MAX_FAULTS = 40
MAX_DELAY = 0.6  # seconds between faults, at most
SHUTDOWN_TIMEOUTS = ("0", "0.05", "2")  # a drain gives back all, some, or none of the jobs in hand


@dataclass
class Faults:
    """Which runtime got which fault, by pid (a pid names one process for the whole test)."""

    killed: set[int] = field(default_factory=set)
    drained: set[int] = field(default_factory=set)
    log: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return f"seed {SEED}; faults in order: {', '.join(self.log)}"


@contextlib.contextmanager
def naming_the_seed(faults: Faults) -> Iterator[None]:
    """Any failure inside names the seed and the faults, so that it can be replayed."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n({faults.describe()})") from None


@pytest.fixture
def kill_db(pg_url: str) -> Iterator[str]:
    """A fresh database for jobs, recording every execution (fault_runs) and every committed
    version of every job (test_job_versions)."""
    q(pg_url, kj.RUNS_TABLE)
    q(pg_url, VERSIONS_TABLE)
    with jobs_settings(pg_url):
        yield pg_url


@pytest.fixture
def spawn(kill_db: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> Callable[[str], ChildProcess]:
    """`spawn(shutdown_timeout)` starts a runtime of the tiny job and returns at once (see `registered`)."""
    env = livepush_env(database_url=kill_db)

    def start(shutdown_timeout: str) -> ChildProcess:
        return procs.livepush("jobs", MODULE, "--heartbeat", str(BEAT), "--poll-interval", "0.2",
                              "--concurrency", str(CONCURRENCY), "--shutdown-timeout", shutdown_timeout,
                              env=env, wait_healthy=False)

    return start


def succeeded(url: str) -> int:
    return int(q(url, "SELECT count(*) FROM livepush_jobs WHERE state = 'succeeded'")[0][0])


@dataclass
class History:
    """One job's runs as its committed versions tell them: the attempts it succeeded, was
    rescued and was given back at."""

    succeeded: list[int] = field(default_factory=list)
    rescued: Counter[int] = field(default_factory=Counter)
    given_back: Counter[int] = field(default_factory=Counter)
    odd: list[str] = field(default_factory=list)


def histories(url: str) -> dict[int, History]:
    """Every job's History, from test_job_versions: each run (a `running` version) ends in exactly
    one of succeeded (same attempt), rescued (`available`, same attempt: spent) or given back
    (`available`, one attempt less: not spent); anything else is odd."""
    rows = q(url, """
        SELECT id, version, event, state, attempt,
               lag(state) OVER w, lag(attempt) OVER w
        FROM test_job_versions WINDOW w AS (PARTITION BY id ORDER BY version) ORDER BY id, version""")
    out: dict[int, History] = defaultdict(History)
    for job_id, version, event, state, attempt, prev_state, prev_attempt in rows:
        h = out[job_id]
        if prev_state != "running":
            if state != "running" and not (version == 1 and (event, state, attempt) == ("enqueued", "available", 0)):
                h.odd.append(f"v{version} {event}/{state} attempt {attempt} after {prev_state}")
            continue
        if state == "succeeded" and attempt == prev_attempt:
            h.succeeded.append(attempt)
        elif (event, state, attempt) == ("retrying", "available", prev_attempt):
            h.rescued[attempt] += 1
        elif state == "available" and attempt == prev_attempt - 1:
            h.given_back[prev_attempt] += 1
        else:
            h.odd.append(f"v{version} {event}/{state} attempt {attempt} after running attempt {prev_attempt}")
    return out


def test_runtimes_killed_and_drained_at_random_run_every_job_once_to_success(
        kill_db: str, spawn: Callable[[str], ChildProcess]) -> None:
    """5,000 jobs, three runtimes, one at a time killed or drained at random: every job succeeds
    exactly once, and every extra run follows a rescue (attempt spent) or a give-back (not spent)."""
    url = kill_db
    rng = random.Random(SEED)
    faults = Faults()
    began = time.monotonic()
    handles = jobs.enqueue_many([kj.tiny.request(n) for n in range(JOBS)])
    starting = [spawn(rng.choice(SHUTDOWN_TIMEOUTS)) for _ in range(RUNTIMES)]
    everyone = list(starting)
    alive: list[ChildProcess] = []
    drained: list[ChildProcess] = []
    with naming_the_seed(faults):
        while len(faults.log) < MAX_FAULTS and succeeded(url) < FAULTS_UNTIL * JOBS:
            # Replacements start at once, so that their start overlaps the next faults.
            while len(alive) + len(starting) < RUNTIMES:
                starting.append(spawn(rng.choice(SHUTDOWN_TIMEOUTS)))
                everyone.append(starting[-1])
            # Not a wait for anything: the random instant at which the next fault lands.
            time.sleep(rng.uniform(0.0, MAX_DELAY))
            up = {pid for (pid,) in q(url, "SELECT pid FROM livepush_job_runtimes")}
            for child in list(starting):
                assert child.running, child.output()
                if child.pid in up:
                    starting.remove(child)
                    alive.append(child)
            if len(alive) < 2:
                continue  # never the last runtime standing: its replacement is not running yet
            victim = alive.pop(rng.randrange(len(alive)))
            action = rng.choice(("kill", "term", "term+int"))
            done = succeeded(url)
            if action == "kill":
                victim.kill()
                faults.killed.add(victim.pid)
            else:
                victim.signal(SIGTERM)
                if action == "term+int":
                    victim.signal(SIGINT)  # the second signal: give back at once
                faults.drained.add(victim.pid)
                drained.append(victim)
            faults.log.append(f"{action} pid {victim.pid} at {done} done")
        for child in starting:
            registered(url, child)
        alive += starting
        faulted_for = time.monotonic() - began

        wait_for(lambda: succeeded(url) == JOBS, 45.0, interval=0.1, message=f"all {JOBS} jobs to succeed")
        for child in drained:
            assert child.wait(15) == 0, child.output()  # a drain ends with exit status 0
        for child in alive:
            assert child.stop(timeout=15) == 0, child.output()
        took = time.monotonic() - began

        # A live runtime presumed dead would have its jobs run twice without a fault: that is a
        # machine too slow for BEAT, not what this test checks.
        stalled = [c.pid for c in everyone if "was presumed dead" in c.stderr()]
        assert not stalled, f"live runtimes {stalled} missed three beats of {BEAT} s: the machine is too slow"
        assert q(url, "SELECT state, count(*) FROM livepush_jobs GROUP BY state") == [("succeeded", JOBS)]
        assert version_gaps(url) == []  # every job's versions went 1, 2, 3... through every fault
        assert q(url, "SELECT count(*) FROM livepush_job_runtimes WHERE pid = ANY(%s)",
                 (sorted(faults.drained | {c.pid for c in alive}),)) == [(0,)]  # a drain deregisters

        attempts = dict(q(url, "SELECT id, attempt FROM livepush_jobs"))
        runs: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for job_id, attempt, pid in q(url, "SELECT job_id, attempt, pid FROM fault_runs ORDER BY at"):
            runs[job_id].append((attempt, pid))
        story = histories(url)
        assert set(runs) == set(story) == {h.id for h in handles}
        problems: list[str] = []
        for job_id, h in story.items():
            final = attempts[job_id]

            def bad(what: str, job_id: int = job_id, h: History = h) -> None:
                problems.append(f"job {job_id}: {what} (runs (attempt, pid): {runs[job_id]}, rescued at "
                                f"{dict(h.rescued)}, given back at {dict(h.given_back)})")

            if h.odd:
                bad(f"unexpected versions {h.odd}")
            if h.succeeded != [final]:
                bad(f"succeeded at attempts {h.succeeded}, final attempt {final}")
            # Attempts go up by rescues only: the final one is one more than the rescues.
            if final != 1 + sum(h.rescued.values()):
                bad(f"final attempt {final} after {sum(h.rescued.values())} rescues")
            last_attempt, _ = runs[job_id][-1]
            if last_attempt != final:
                bad(f"its last run was attempt {last_attempt}, not the final attempt {final}")
            # Every run before the last was cut short by a fault of its own runtime.
            for attempt, pid in runs[job_id][:-1]:
                if not (pid in faults.killed and h.rescued[attempt]
                        or pid in faults.drained and h.given_back[attempt]):
                    bad(f"attempt {attempt} ran in pid {pid} ({fault_of(faults, pid)}) and the job ran again")
        assert not problems, f"{len(problems)} jobs broke the guarantee: " + "; ".join(problems[:5])

        reruns = sum(len(r) - 1 for r in runs.values())
        rescues = sum(sum(h.rescued.values()) for h in story.values())
        give_backs = sum(sum(h.given_back.values()) for h in story.values())
        print(f"seed {SEED}: {len(faults.log)} faults in {faulted_for:.1f} s, all {JOBS} jobs done in {took:.1f} s; "
              f"{rescues} runs rescued, {give_backs} given back, {reruns} recorded executions ran again; "
              f"runtimes: {len(everyone)}; {faults.describe()}")
        # The faults landed where the guarantee is tested: on jobs in hand, of both kinds.
        assert faults.killed and faults.drained, faults.describe()
        assert rescues > 0 and give_backs > 0, (rescues, give_backs)


def test_a_sigterm_while_the_runtime_starts_drains_it_too(kill_db: str, spawn: Callable[[str], ChildProcess]) -> None:
    """SIGTERM after the runtime registered but before it runs jobs: it deregisters and exits 0,
    like any SIGTERM (the random test above once caught one dying of the signal there)."""
    # The runtime's start ends by publishing its state on `runtimes`; a transaction that published
    # there first holds the topic's lock, so the start waits, registered, until it ends.
    with psycopg.connect(kill_db) as holder:
        api.default_fanout().publish("runtimes", {"held": True}, conn=holder)  # as a runtime publishes there
        child = spawn("30")
        registered(kill_db, child)
        child.signal(SIGTERM)
        holder.rollback()
    assert child.wait(15) == 0, child.output()
    assert q(kill_db, "SELECT count(*) FROM livepush_job_runtimes WHERE pid = %s", (child.pid,)) == [(0,)]


def fault_of(faults: Faults, pid: int) -> str:
    if pid in faults.killed:
        return "killed"
    return "drained" if pid in faults.drained else "never faulted"
