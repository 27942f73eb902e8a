"""Periodic jobs under real runtimes (`livepush jobs`): three at once enqueue each tick of an
every-second schedule once, a runtime starting after all were stopped for several ticks enqueues
one job for the newest missed tick, and a module with a bad schedule stops `livepush jobs` at import."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from livepush import jobs
from tests.jobs import periodic_jobs
from tests.jobs.conftest import q, runtime_starter
from tests.support.procs import ChildProcess, Processes
from tests.support.waiting import wait_for

MODULE = "tests.jobs.periodic_jobs"
NAME = periodic_jobs.every_second.name
SECOND = timedelta(seconds=1)


@pytest.fixture
def start_runtime(jobs_db: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> Callable[..., ChildProcess]:
    return runtime_starter(jobs_db, MODULE, procs, livepush_env(database_url=jobs_db))


def ticks(url: str, after: datetime | None = None) -> list[datetime]:
    """The ticks of the every-second job's enqueued jobs (their one argument), in order."""
    rows = q(url, """SELECT p.args ->> 0 FROM livepush_jobs j JOIN livepush_job_payloads p ON p.id = j.id
                     WHERE j.name = %s ORDER BY 1""", (NAME,))
    found = [datetime.fromisoformat(r[0]) for r in rows]
    return [t for t in found if after is None or t > after]


def assert_consecutive(found: list[datetime]) -> None:
    assert found == sorted(set(found)), f"a tick enqueued twice: {found}"
    assert [b - a for a, b in zip(found, found[1:])] == [SECOND] * (len(found) - 1), f"a tick missed: {found}"


def test_three_runtimes_enqueue_each_tick_once(jobs_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """An every-second job in three runtimes: every tick while they run is enqueued and run once."""
    runtimes = [start_runtime() for _ in range(3)]
    wait_for(lambda: len(ticks(jobs_db)) >= 6, 20.0, interval=0.1, message="six ticks enqueued")
    for child in runtimes:
        assert child.stop(timeout=15) == 0, child.output()
    found = ticks(jobs_db)
    assert len(found) >= 6
    assert_consecutive(found)
    for tick in found:  # ISO 8601 with its UTC offset, on a whole second
        assert tick.utcoffset() == timedelta(0) and tick.microsecond == 0
    # Each one ran once (a stop lets the jobs in hand finish), with its tick as its argument.
    runs = q(jobs_db, "SELECT key FROM job_runs WHERE phase = 'tick' ORDER BY key")
    done = {r[0] for r in q(jobs_db, """SELECT p.args ->> 0 FROM livepush_jobs j JOIN livepush_job_payloads p
                                        ON p.id = j.id WHERE j.state = 'succeeded'""")}
    assert sorted(r[0] for r in runs) == sorted(done) and len(runs) == len(set(runs))
    job_id = q(jobs_db, "SELECT min(id) FROM livepush_jobs WHERE name = %s", (NAME,))[0][0]
    info = jobs.get_job(job_id)
    assert info is not None and info.args == [found[0].isoformat()]


def test_a_runtime_back_after_missed_ticks_enqueues_the_newest_once(
        jobs_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """All runtimes stopped for four ticks or more: the one that comes back enqueues one job, for the
    newest due tick, not one per missed tick; then it goes on tick by tick."""
    first = start_runtime()
    wait_for(lambda: len(ticks(jobs_db)) >= 2, 15.0, interval=0.1, message="two ticks enqueued")
    assert first.stop(timeout=15) == 0, first.output()
    last = ticks(jobs_db)[-1]
    # Let four ticks pass on the database's clock with no runtime running.
    wait_for(lambda: q(jobs_db, "SELECT clock_timestamp()")[0][0] >= last + 4.2 * SECOND, 10.0, interval=0.1,
             message="four ticks to pass")
    assert ticks(jobs_db, after=last) == []
    again = start_runtime()
    wait_for(lambda: len(ticks(jobs_db, after=last)) >= 3, 15.0, interval=0.1, message="three ticks after the restart")
    assert again.stop(timeout=15) == 0, again.output()
    after = ticks(jobs_db, after=last)
    # The first is the catch-up, the newest tick due when the runtime came back (at least four
    # after `last`): the three or more missed ticks between them were not enqueued.
    assert after[0] - last >= 4 * SECOND, (last, after)
    assert_consecutive(after)


def test_a_bad_schedule_stops_the_runtime_at_import(procs: Processes, jobs_db: str,
                                                    livepush_env: Callable[..., dict[str, str]]) -> None:
    """`livepush jobs` on a module with a bad cron expression, or an unknown zone, exits 2 naming it."""
    for cron, zone, says in [("*/5 * *", "UTC", "'*/5 * *'"),
                             ("*/5 * * * *", "Nowhere/Land", "unknown timezone 'Nowhere/Land'")]:
        env = livepush_env(database_url=jobs_db, extra={"PERIODIC_TEST_CRON": cron, "PERIODIC_TEST_TIMEZONE": zone})
        child = procs.livepush("jobs", "tests.jobs.periodic_bad_jobs", env=env)
        assert child.wait(20) == 2, child.output()
        assert says in child.output(), child.output()
