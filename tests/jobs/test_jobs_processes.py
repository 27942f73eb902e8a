"""Runtimes as child processes (`livepush jobs`): many at once, SIGTERM drain, second signal,
kill -9 rescue, and a stalled runtime whose late outcome is fenced off."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from livepush import jobs, loops
from livepush.jobs.runtime import runtime
from tests.jobs import sample_jobs
from tests.jobs.conftest import events_of, names_of, q, registered, runtime_starter
from tests.support import services
from tests.support.procs import ChildProcess, Processes, stalled_import_script, stop_while_connecting
from tests.support.waiting import wait_for

MODULE = "tests.jobs.sample_jobs"


@pytest.fixture
def start_runtime(jobs_db: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> Callable[..., ChildProcess]:
    return runtime_starter(jobs_db, MODULE, procs, livepush_env(database_url=jobs_db))


def count(url: str, sql: str, params: Any = None) -> int:
    return int(q(url, sql, params)[0][0])


def test_ten_thousand_jobs_three_runtimes_each_once(jobs_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """10,000 jobs across 3 runtimes: every job runs, none twice, and every runtime takes part."""
    handles = jobs.enqueue_many([sample_jobs.record.request(i) for i in range(10_000)])
    # A runtime missing three beats is rescued and its jobs run again (at least once, by design);
    # 1 s beats keep a busy CI machine's stalls from being read as a death here.
    children = [start_runtime("--concurrency", "20", heartbeat=1.0) for _ in range(3)]
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE state = 'succeeded'") == 10_000, 120.0,
             interval=0.2, message="10,000 jobs to succeed")
    assert count(jobs_db, "SELECT count(*) FROM job_runs") == 10_000, "\n".join(c.output() for c in children)
    assert count(jobs_db, "SELECT count(DISTINCT job_id) FROM job_runs") == 10_000
    assert count(jobs_db, "SELECT count(DISTINCT pid) FROM job_runs") == 3
    assert {r[0] for r in q(jobs_db, "SELECT job_id FROM job_runs")} == {h.id for h in handles}
    # On every job's topic: versions 1, 2, 3 (enqueued, started once, succeeded), each recorded once.
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE version <> 3") == [(0,)]
    assert q(jobs_db, """
        SELECT count(*) FROM (
            SELECT id, array_agg(event ORDER BY version) AS events, count(DISTINCT version) AS versions
            FROM test_job_versions GROUP BY id) v
        WHERE v.events <> ARRAY['enqueued', 'started', 'succeeded'] OR v.versions <> 3""") == [(0,)]
    for child in children:
        assert child.stop(timeout=15) == 0, child.output()
    assert count(jobs_db, "SELECT count(*) FROM livepush_job_runtimes") == 0


def test_sigterm_finishes_the_jobs_in_hand(jobs_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """SIGTERM with 20 jobs in hand: all 20 finish, none twice, none more, and the runtime exits 0."""
    # The jobs end when the test says, once the runtime drains: jobs that ended on a timer could
    # end before a loaded machine delivered the signal, and the runtime would rightly claim the
    # other five in their place.
    jobs.enqueue_many([sample_jobs.wait_flag.request("go") for _ in range(25)])
    child = start_runtime("--concurrency", "20", "--shutdown-timeout", "20")
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'start'") == 20, 15.0)
    child.signal(signal.SIGTERM)
    wait_for(lambda: q(jobs_db, "SELECT state FROM livepush_job_runtimes WHERE pid = %s", (child.pid,)) == [("draining",)],
             10.0, message="the runtime to drain")
    q(jobs_db, "INSERT INTO job_flags VALUES ('go')")
    assert child.wait(15) == 0, child.output()
    assert count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'done'") == 20
    assert count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'start'") == 20
    assert count(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE state = 'succeeded'") == 20
    assert count(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE state = 'available' AND attempt = 0") == 5
    assert count(jobs_db, "SELECT count(*) FROM livepush_job_runtimes") == 0


def test_a_hangup_drains_the_runtime_as_sigterm_does(jobs_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """SIGHUP (the terminal `livepush jobs` runs in closed, its ssh session dropped) with jobs in
    hand: they finish, none runs again, and the runtime deregisters and exits 0. Left at its
    default, SIGHUP ended the process where it stood, its jobs left for the rescue."""
    jobs.enqueue_many([sample_jobs.hold.request(1.0) for _ in range(3)])
    child = start_runtime("--concurrency", "3", "--shutdown-timeout", "20")
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'start'") == 3, 15.0)
    child.signal(signal.SIGHUP)
    assert child.wait(15) == 0, child.output()
    assert "SIGTERM: draining" in child.stderr(), child.output()
    assert count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'done'") == 3, child.output()
    assert count(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE state = 'succeeded'") == 3
    assert count(jobs_db, "SELECT count(*) FROM livepush_job_runtimes") == 0


def test_a_runtime_started_with_nohup_keeps_running_after_a_hangup(
        jobs_db: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """Under `nohup`, which asked for SIGHUP to be ignored, a hangup leaves the runtime running
    (it still runs a job enqueued after it); SIGTERM stops it as always, with exit 0."""
    child = procs.start(["nohup", sys.executable, "-m", "livepush", "jobs", MODULE, "--poll-interval", "0.2"],
                        env=livepush_env(database_url=jobs_db), name="nohup livepush jobs")
    registered(jobs_db, child)
    child.signal(signal.SIGHUP)
    handle = sample_jobs.record.enqueue(1)
    wait_for(lambda: jobs.get_job(handle.id).state == "succeeded" or not child.running, 15.0,  # type: ignore[union-attr]
             message="the job enqueued after the hangup to run")
    assert child.running and "draining" not in child.stderr(), child.output()
    assert child.stop() == 0, child.output()


def test_second_signal_gives_back_at_once(jobs_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """A second signal gives the jobs in hand back at once (attempt not spent); another runtime finishes them."""
    handles = jobs.enqueue_many([sample_jobs.wait_flag.request("go") for _ in range(5)])
    first = start_runtime("--concurrency", "5", "--shutdown-timeout", "60")
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'start'") == 5, 15.0)
    first.signal(signal.SIGTERM)
    # The second signal comes while it drains (its heartbeat says so), not with the first.
    wait_for(lambda: q(jobs_db, "SELECT state FROM livepush_job_runtimes WHERE pid = %s", (first.pid,)) == [("draining",)],
             10.0, message="the runtime to drain")
    first.signal(signal.SIGINT)
    assert first.wait(10) == 0, first.output()
    assert count(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE state = 'available' AND attempt = 0") == 5
    second = start_runtime("--concurrency", "5")
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'start' AND pid = %s", (second.pid,)) == 5, 15.0)
    q(jobs_db, "INSERT INTO job_flags VALUES ('go')")
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE state = 'succeeded'") == 5, 15.0)
    assert q(jobs_db, "SELECT DISTINCT attempt FROM job_runs") == [(1,)]
    assert count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'done'") == 5
    for h in handles:  # given back as it was (attempt 0), then run by the second runtime
        assert names_of(jobs_db, h.id) == ["enqueued/available", "started/running", "enqueued/available",
                                           "started/running", "succeeded/succeeded"]
        assert [e["job"]["attempt"] for e in events_of(jobs_db, h.id)] == [0, 1, 0, 1, 1]
    assert {r[0] for r in q(jobs_db, "SELECT job_id FROM job_runs WHERE pid = %s", (second.pid,))} == {h.id for h in handles}
    assert second.stop() == 0, second.output()


def test_a_second_signal_while_the_runtime_closes_still_exits_0(jobs_db: str,
                                                               start_runtime: Callable[..., ChildProcess]) -> None:
    """Signalled twice in a row (Ctrl-C twice, a process manager that signals twice), a runtime with
    nothing in hand drains at once and closes: writes its last outcomes, deregisters, closes its
    pools. A second signal that lands in that close must not kill it by the signal's default
    action (its row left behind, outcomes unwritten): it exits 0, deregistered. The close lasts
    milliseconds, so the second signal follows the first after a few delays around it."""
    for delay in (0.0, 0.005, 0.01, 0.02, 0.04):
        child = start_runtime()
        child.signal(signal.SIGTERM)
        time.sleep(delay)  # the gap between the two signals is what is tested: nothing to wait for
        child.signal(signal.SIGTERM)
        assert child.wait(15) == 0, f"second signal {delay} s after the first:\n{child.output()}"
        assert count(jobs_db, "SELECT count(*) FROM livepush_job_runtimes WHERE pid = %s", (child.pid,)) == 0


def test_a_job_that_swallows_its_cancellation_does_not_hold_the_stopping_runtime(
        jobs_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """SIGTERM with an async job in hand that ignores every cancel: past --shutdown-timeout the job
    is given back (attempt not spent), the runtime deregisters and the process exits 0, rather
    than waiting forever for a job whose lease is gone (and ignoring every later signal)."""
    handle = sample_jobs.deaf_to_cancel.enqueue()
    child = start_runtime("--shutdown-timeout", "0.5")
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'start'") == 1, 15.0)
    child.signal(signal.SIGTERM)
    assert child.wait(15) == 0, child.output()
    assert q(jobs_db, "SELECT state, attempt FROM livepush_jobs WHERE id = %s", (handle.id,)) == [("available", 0)]
    assert count(jobs_db, "SELECT count(*) FROM livepush_job_runtimes") == 0


def test_a_job_blocked_in_asyncio_to_thread_does_not_hold_the_stopping_runtime(
        jobs_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """SIGTERM with an async job in hand that waits on asyncio.to_thread(): past --shutdown-timeout
    the job is given back (attempt not spent) and the process exits 0 within the 2 s grace
    (loops.SETTLE_SECONDS), leaving the call running in its thread, rather than waiting for the
    call to return while ignoring every later signal."""
    handle = sample_jobs.blocked_in_a_thread.enqueue()
    child = start_runtime("--shutdown-timeout", "0.5")
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'start'") == 1, 15.0)
    signalled = time.monotonic()
    child.signal(signal.SIGTERM)
    assert child.wait(15) == 0, child.output()
    took = time.monotonic() - signalled
    # Generous: the process also closes its pools and exits, on a machine shared with others.
    assert took <= 0.5 + loops.SETTLE_SECONDS + 8.0, (took, child.output())
    assert "left running" in child.output(), child.output()
    assert q(jobs_db, "SELECT state, attempt FROM livepush_jobs WHERE id = %s", (handle.id,)) == [("available", 0)]
    assert count(jobs_db, "SELECT count(*) FROM livepush_job_runtimes") == 0


def test_a_job_deaf_to_its_cancel_is_given_back_and_the_process_exits_within_the_timeout_and_grace(
        jobs_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """SIGTERM with an async job in hand that ignores every cancel: the process exits 0 within
    --shutdown-timeout plus the 2 s it gives the job once given back (loops.SETTLE_SECONDS),
    with a warning naming the job's task; the job is `available` again, its attempt unspent,
    and no runtime row is left. A second SIGTERM in those 2 s changes none of it: the process
    still exits 0, deregistered, not killed by the signal."""
    for second_signal in (False, True):
        handle = sample_jobs.deaf_to_cancel.enqueue()
        child = start_runtime("--shutdown-timeout", "0.5")
        wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE job_id = %s AND phase = 'start'",
                               (handle.id,)) == 1, 15.0)
        signalled = time.monotonic()
        child.signal(signal.SIGTERM)
        if second_signal:
            # Given back at the drain's end: the grace has begun.
            wait_for(lambda: q(jobs_db, "SELECT state FROM livepush_jobs WHERE id = %s", (handle.id,)) ==
                     [("available",)], 10.0, interval=0.02, message="the job to be given back")
            child.signal(signal.SIGTERM)
        assert child.wait(15) == 0, child.output()
        took = time.monotonic() - signalled
        # Generous: the process also closes its pools and exits, on a machine shared with others.
        assert took <= 0.5 + loops.SETTLE_SECONDS + 8.0, (took, child.output())
        assert f"livepush-job-{handle.id}" in child.output(), child.output()
        assert q(jobs_db, "SELECT state, attempt FROM livepush_jobs WHERE id = %s", (handle.id,)) == [("available", 0)]
        assert count(jobs_db, "SELECT count(*) FROM livepush_job_runtimes") == 0
        q(jobs_db, "DELETE FROM livepush_jobs WHERE id = %s", (handle.id,))


def test_a_stopping_runtime_whose_deaf_job_timed_out_exits_without_waiting_out_the_shutdown_timeout(
        jobs_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """SIGTERM while an async job that swallows every cancel runs past its timeout: the job fails
    its attempt 2 s after its timeout's cancel (runtime.TIMEOUT_GRACE), as when no stop is under
    way, and with nothing left in hand the runtime stops then, not at the end of a long
    --shutdown-timeout: it waited for the job's task, which never ends."""
    handle = sample_jobs.deaf_to_timeout.enqueue("never-set")
    child = start_runtime("--shutdown-timeout", "60")
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE job_id = %s AND phase = 'start'",
                           (handle.id,)) == 1, 15.0)
    child.signal(signal.SIGTERM)
    assert child.wait(0.2 + runtime.TIMEOUT_GRACE + loops.SETTLE_SECONDS + 10.0) == 0, child.output()
    info = jobs.get_job(handle.id)
    assert info is not None
    assert (info.state, info.attempt, info.error) == ("failed", 1, "TimeoutError: timed out after 0.2 s")
    assert count(jobs_db, "SELECT count(*) FROM livepush_job_runtimes") == 0


@pytest.mark.parametrize("second_signal", [False, True])
def test_a_sync_job_past_the_shutdown_timeout_is_given_back_and_its_thread_not_waited_for(
        jobs_db: str, start_runtime: Callable[..., ChildProcess], second_signal: bool) -> None:
    """SIGTERM (and a second one while it drains) with a sync job in hand that runs far longer
    than --shutdown-timeout and never calls ctx.progress(): the job is given back, its attempt
    unspent, and the process exits 0 without waiting for the thread, which cannot be stopped."""
    handle = sample_jobs.sleep_sync.enqueue(60)
    child = start_runtime("--shutdown-timeout", "1" if not second_signal else "60")
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE job_id = %s AND phase = 'start'",
                           (handle.id,)) == 1, 15.0)
    child.signal(signal.SIGTERM)
    if second_signal:
        wait_for(lambda: q(jobs_db, "SELECT state FROM livepush_job_runtimes WHERE pid = %s", (child.pid,)) ==
                 [("draining",)], 10.0, message="the runtime to drain")
        child.signal(signal.SIGTERM)
    assert child.wait(1 + loops.SETTLE_SECONDS + 10.0) == 0, child.output()
    assert q(jobs_db, "SELECT state, attempt FROM livepush_jobs WHERE id = %s", (handle.id,)) == [("available", 0)]
    assert count(jobs_db, "SELECT count(*) FROM livepush_job_runtimes") == 0
    assert count(jobs_db, "SELECT count(*) FROM job_runs WHERE job_id = %s AND phase = 'done'", (handle.id,)) == 0


def test_kill_9_jobs_rescued_within_three_beats(jobs_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """kill -9: another runtime releases the jobs within about three heartbeats and runs them, attempt counted."""
    # Beats of a second, and 1.5 s for the rescuer's claim and the four starts: with 0.3 s beats
    # and 0.5 s for those, a loaded machine could run past the bound with the rescue on time.
    beat = 1.0
    handles = jobs.enqueue_many([sample_jobs.wait_flag.request("go") for _ in range(4)])
    victim = start_runtime("--concurrency", "4", heartbeat=beat)
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'start'") == 4, 15.0)
    rescuer = start_runtime("--concurrency", "4", heartbeat=beat)
    victim.kill()
    killed_at = time.monotonic()
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'start' AND pid = %s", (rescuer.pid,)) == 4,
             15.0, interval=0.02)
    took = time.monotonic() - killed_at
    # Dead after 3 silent beats (the last beat may have just happened: up to 4), found on the next beat.
    assert took < 5 * beat + 1.5, took
    assert q(jobs_db, "SELECT DISTINCT attempt FROM job_runs WHERE pid = %s", (rescuer.pid,)) == [(2,)]
    q(jobs_db, "INSERT INTO job_flags VALUES ('go')")
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE state = 'succeeded' AND attempt = 2") == 4, 15.0)
    for h in handles:  # released with its attempt counted, then run again
        assert names_of(jobs_db, h.id) == ["enqueued/available", "started/running", "retrying/available",
                                           "started/running", "succeeded/succeeded"]
        assert [e["job"]["attempt"] for e in events_of(jobs_db, h.id)] == [0, 1, 1, 2, 2]
    assert rescuer.stop() == 0


def test_a_runtime_starting_on_the_same_machine_rescues_a_killed_ones_jobs_at_once(
        jobs_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """kill -9, then a new runtime on the same machine: it finds the dead process at its start and
    runs the jobs at once, long before three of its (60 s) heartbeats."""
    jobs.enqueue_many([sample_jobs.wait_flag.request("go") for _ in range(3)])
    victim = start_runtime("--concurrency", "3", heartbeat=60.0)
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'start'") == 3, 15.0)
    victim.kill()
    successor = start_runtime("--concurrency", "3", heartbeat=60.0)
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'start' AND pid = %s",
                           (successor.pid,)) == 3, 10.0, message="the successor to run the killed runtime's jobs")
    assert q(jobs_db, "SELECT DISTINCT attempt FROM job_runs WHERE pid = %s", (successor.pid,)) == [(2,)]
    q(jobs_db, "INSERT INTO job_flags VALUES ('go')")
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE state = 'succeeded'") == 3, 15.0)
    assert successor.stop() == 0


def test_stalled_runtime_is_fenced_off(jobs_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """A runtime that stalls past three beats loses its job to another; when it comes back its
    late outcome is ignored and it registers again."""
    beat = 0.3
    (h,) = jobs.enqueue_many([sample_jobs.wait_flag.request("go")])
    stalled = start_runtime("--concurrency", "1", heartbeat=beat)
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'start'") == 1, 15.0)
    (old_id,) = q(jobs_db, "SELECT id FROM livepush_job_runtimes WHERE pid = %s", (stalled.pid,))[0]
    other = start_runtime("--concurrency", "1", heartbeat=beat)
    os.kill(stalled.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'start' AND pid = %s", (other.pid,)) == 1, 15.0)
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM livepush_job_runtimes WHERE id = %s", (old_id,)) == 1, 10.0,
             message="the stalled runtime to register again")
    q(jobs_db, "INSERT INTO job_flags VALUES ('go')")
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE phase = 'done'") == 2, 15.0)
    wait_for(lambda: "outcome 'succeeded' ignored" in stalled.stderr(), 10.0, message="the fenced outcome to be logged")
    state = jobs.job_state(h.id)
    assert state is not None and (state["state"], state["attempt"]) == ("succeeded", 2)
    assert stalled.stop() == 0 and other.stop() == 0
    # The stalled runtime's late outcome wrote no version: the job's topic shows only the rescue
    # and the second attempt.
    assert names_of(jobs_db, h.id) == ["enqueued/available", "started/running", "retrying/available",
                                       "started/running", "succeeded/succeeded"]


def test_a_killed_runtime_process_its_parent_has_not_reaped_counts_as_gone() -> None:
    """A runtime killed but not yet reaped by its supervisor (a zombie) is gone, not alive."""
    import subprocess

    from livepush.jobs.runtime.maintenance import _process_exists

    child = subprocess.Popen(["sleep", "30"])
    try:
        assert _process_exists(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        wait_for(lambda: not _process_exists(child.pid), 5.0, message="the killed child to count as gone")
    finally:
        child.kill()
        child.wait(5)
    assert _process_exists(os.getpid())



@pytest.mark.parametrize("how", ["exit", "interrupt"])
@pytest.mark.parametrize("job", ["exits", "exits_sync"])
def test_a_job_raising_systemexit_or_keyboardinterrupt_fails_its_attempt_not_the_runtime(
        jobs_db: str, start_runtime: Callable[..., ChildProcess], job: str, how: str) -> None:
    """A job that raises SystemExit (sys.exit() in a library it calls) or KeyboardInterrupt fails
    that attempt like any other exception and is retried: the runtime runs on, and the other job
    it holds meanwhile finishes with its first attempt."""
    child = start_runtime()
    other = sample_jobs.wait_flag.enqueue("go")
    wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE job_id = %s", (other.id,)) == 1, 15.0,
             message="the other job to start")
    h = getattr(sample_jobs, job).enqueue(how)
    wait_for(lambda: q(jobs_db, "SELECT state FROM livepush_jobs WHERE id = %s", (h.id,)) == [("failed",)]
             or not child.running, 15.0, message="the job to fail its two attempts")
    assert child.running, child.output()
    error = {"exit": "SystemExit: 3", "interrupt": "KeyboardInterrupt"}[how]
    assert jobs.get_job(h.id).error == error  # type: ignore[union-attr]
    assert q(jobs_db, "SELECT attempt, pid FROM job_runs WHERE job_id = %s ORDER BY attempt", (h.id,)) == [
        (1, child.pid), (2, child.pid)]
    q(jobs_db, "INSERT INTO job_flags VALUES ('go')")
    wait_for(lambda: q(jobs_db, "SELECT state, attempt FROM livepush_jobs WHERE id = %s", (other.id,))
             == [("succeeded", 1)], 15.0, message="the other job to succeed on its first attempt")
    assert child.stop() == 0, child.output()


def test_a_second_signal_ends_a_runtime_whose_postgres_is_down(jobs_db: str,
                                                             start_runtime: Callable[..., ChildProcess]) -> None:
    """With Postgres down, a stopping runtime can write nothing: not its state, not its jobs'
    outcomes, not its deregistration, and it waits for Postgres to come back. A second signal
    still ends it at once, as it promises; what it could not write is left as after a crash (the
    rescue releases its jobs once Postgres is back)."""
    child = start_runtime("--shutdown-timeout", "60")
    h = sample_jobs.progress.enqueue(100, 0.1)  # touches no database while it runs: 10 s of progress
    wait_for(lambda: q(jobs_db, "SELECT state FROM livepush_jobs WHERE id = %s", (h.id,)) == [("running",)], 10.0,
             message="the job to run")
    with services.pg_down("fast"):
        child.signal(signal.SIGTERM)
        wait_for(lambda: "draining" in child.stderr(), 10.0, message="the runtime to drain")
        child.signal(signal.SIGTERM)
        assert child.wait(10) == 0, child.output()
    other = start_runtime()
    wait_for(lambda: q(jobs_db, "SELECT state FROM livepush_jobs WHERE id = %s", (h.id,)) == [("succeeded",)], 60.0,
             message="the job, rescued, to succeed on the other runtime")
    assert other.stop() == 0, other.output()


# A job module whose import takes long (a project set up on import): it says when it started.
SLOW_IMPORT = """
import os
import time

open(os.environ["IMPORT_STARTED"], "w").close()
time.sleep(60)
"""


def test_sigterm_while_the_modules_import_is_a_clean_stop(jobs_db: str, procs: Processes, tmp_path: Any,
                                                          livepush_env: Callable[..., dict[str, str]]) -> None:
    """SIGTERM while `livepush jobs` is still importing its modules, before the runtime has taken
    the signals over, stops it at once with exit 0, as a stop once it runs does (it was killed
    where it stood)."""
    (tmp_path / "slow_import_jobs.py").write_text(SLOW_IMPORT)
    started = tmp_path / "import-started"
    env = livepush_env(database_url=jobs_db, extra={"IMPORT_STARTED": str(started)})
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    child = procs.livepush("jobs", "slow_import_jobs", env=env)
    wait_for(started.exists, 20.0, message="the job module's import to start")
    child.signal(signal.SIGTERM)
    assert child.wait(10) == 0, child.output()
    assert "Traceback" not in child.stderr(), child.output()


# `python -m livepush ARGS`, its import of the package's API (drivers, fan-outs: the bulk of its
# start) held up until a signal came: the moment before `livepush jobs` set any handler.
PACKAGE_API = "livepush.api"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_while_livepush_itself_imports_is_a_clean_stop(
        sig: signal.Signals, jobs_db: str, procs: Processes, tmp_path: Any,
        livepush_env: Callable[..., dict[str, str]]) -> None:
    """A stop signal in the first moments of `livepush jobs`, while the package itself imports
    (before the command could set any handler), stops it with exit 0 as one a moment later does.
    SIGTERM and SIGHUP killed it with their default action (143, 129), SIGINT with a traceback."""
    started = tmp_path / "import-started"
    script = stalled_import_script(PACKAGE_API, 2, started)
    child = procs.start([sys.executable, "-c", script, "jobs", MODULE], env=livepush_env(database_url=jobs_db),
                        name="livepush jobs (stalled)")
    wait_for(started.exists, 20.0, message="livepush's own import to start")
    child.signal(sig)
    assert child.wait(10) == 0, child.output()
    assert "Traceback" not in child.stderr() and "running" not in child.stderr(), child.output()


def test_sigterm_while_the_runtime_opens_on_a_silent_database_is_a_clean_stop(
        procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """SIGTERM while `livepush jobs` is opening its runtime (here, waiting on a database that
    accepted the connection and says nothing) stops it at once with exit 0, as `serve` does: it has
    nothing in hand yet, and waiting out the connect timeout would only end in a failure."""
    child = stop_while_connecting(lambda url: procs.livepush("jobs", MODULE, env=livepush_env(database_url=url)))
    assert child.returncode == 0, child.output()
    assert "Traceback" not in child.stderr(), child.output()


def test_a_job_module_that_runs_asyncio_at_import_is_loaded(jobs_db: str, procs: Processes,
                                                           livepush_env: Callable[..., dict[str, str]]) -> None:
    """`livepush jobs` imports its modules as `python -c "import mod"` would, outside any event loop:
    a module that calls asyncio.run() at import (or a project's set-up that may not run in one)
    is loaded, not refused with "cannot be called from a running event loop"."""
    child = procs.livepush("jobs", "tests.jobs.asyncio_at_import_jobs", env=livepush_env(database_url=jobs_db))
    wait_for(lambda: "running: queues" in child.stderr() or not child.running, 20.0, message="the runtime to start")
    assert child.stop() == 0, child.output()


def test_a_rescue_that_waits_at_a_lock_never_holds_up_the_rescuers_heartbeat(
        jobs_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """The rescue of a dead runtime's jobs counts the ones it ends (here a group member whose
    cancel was asked for) in their group, which waits while an open transaction holds the group
    (an add with conn=). The rescuer must keep beating meanwhile: silent for three beats, it was
    presumed dead in turn, and the job it was running ran again elsewhere."""
    group = jobs.create_group()
    member = jobs.add_to_group(group.id, sample_jobs.wait_flag, "never")
    victim = start_runtime()
    wait_for(lambda: q(jobs_db, "SELECT state FROM livepush_jobs WHERE id = %s", (member.id,)) == [("running",)],
             15.0, message="the member to run")
    victim.kill()
    assert jobs.cancel(member.id)  # running, as far as the database knows: flagged for its runtime
    with psycopg.connect(jobs_db) as locker:
        jobs.add_to_group(group.id, sample_jobs.record, conn=locker)  # holds the group until it ends
        held = sample_jobs.wait_flag.enqueue("go")
        rescuer = start_runtime()  # finds the victim gone at its start, and rescues its member
        wait_for(lambda: count(jobs_db, """SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                                          AND wait_event_type = 'Lock'""") > 0, 10.0,
                 message="the rescue to wait at the group's lock")
        wait_for(lambda: count(jobs_db, "SELECT count(*) FROM job_runs WHERE job_id = %s AND phase = 'start'",
                               (held.id,)) == 1, 10.0, message="the rescuer to run its own job")
        since = q(jobs_db, "SELECT now()")[0][0]
        watcher = start_runtime("--queues", "second")  # it rescues what it finds dead
        wait_for(lambda: q(jobs_db, """SELECT coalesce(bool_and(heartbeat_at > %s + interval '1.5 s'), true)
                                      FROM livepush_job_runtimes WHERE pid = %s""", (since, rescuer.pid))[0][0],
                 10.0, message="five beats of the rescuer's while its rescue waits (or it presumed dead)")
        assert count(jobs_db, "SELECT count(*) FROM livepush_job_runtimes WHERE pid = %s", (rescuer.pid,)) == 1, (
            rescuer.output() + watcher.output())
        assert q(jobs_db, "SELECT state, attempt FROM livepush_jobs WHERE id = %s", (held.id,)) == [("running", 1)]
        locker.rollback()
    wait_for(lambda: q(jobs_db, "SELECT state FROM livepush_jobs WHERE id = %s", (member.id,)) == [("cancelled",)],
             10.0, message="the rescue to end the member cancelled")
    q(jobs_db, "INSERT INTO job_flags VALUES ('go')")
    wait_for(lambda: q(jobs_db, "SELECT state FROM livepush_jobs WHERE id = %s", (held.id,)) == [("succeeded",)],
             10.0, message="the rescuer's job to succeed")
    assert count(jobs_db, "SELECT count(*) FROM job_runs WHERE job_id = %s AND phase = 'start'", (held.id,)) == 1
    assert rescuer.stop() == 0, rescuer.output()
    assert watcher.stop() == 0, watcher.output()
