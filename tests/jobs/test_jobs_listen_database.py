"""A job runtime hears the rings of the database its jobs are in: with `jobs.configure()` naming
another database than LIVEPUSH_DATABASE_URL (reference §4), `serve --with-jobs` and `livepush jobs`
(with LIVEPUSH_LISTEN_DATABASE_URL set) listened on the settings' database, where no enqueue or
cancel of those jobs rings, so a cancel waited for the runtime's next heartbeat."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import psycopg
import pytest

from livepush import config, jobs
from livepush.cli import wiring
from livepush.jobs import database
from livepush.jobs.periodic.decorator import Schedules
from livepush.jobs.runtime import runtime as runtime_module
from livepush.jobs.runtime.runtime import Runtime
from tests.support import slow_jobs
from tests.support.waiting import async_wait_for

# Well under the runtime's 10 s heartbeat, which finds a cancel without any ring.
RING_BOUND = 5.0


@pytest.fixture
async def two_databases(make_pg_url: Callable[[], str], secret: str) -> AsyncIterator[tuple[str, str]]:
    """(the settings' database, the jobs' own database chosen with jobs.configure())."""
    settings_db, jobs_db = make_pg_url(), make_pg_url()
    config.set_settings(config.Settings(database_url=settings_db, listen_database_url=settings_db,
                                        fanout="postgres", secret=secret, port=0, env="test"))
    database.configure(jobs_db)
    try:
        yield settings_db, jobs_db
    finally:
        database.configure(None)
        config.set_settings(None)


async def _runtime(how: str) -> tuple[Runtime, Callable[[], object]]:
    settings = config.get_settings()
    if how == "serve --with-jobs":
        parts = wiring.server_parts(settings, with_jobs=["tests.support.slow_jobs"])
        assert parts.runtime is not None
        return parts.runtime, parts.close
    runtime, fanout = wiring.jobs_runtime(settings, ["tests.support.slow_jobs"], install_signals=False)
    return runtime, fanout.aclose


@pytest.mark.parametrize("how", ["serve --with-jobs", "jobs"])
async def test_a_runtime_whose_jobs_are_in_a_configured_database_hears_their_cancels_there(
        two_databases: tuple[str, str], how: str, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # At INFO: a failure then shows whether the cancel was heard and confirmed ("cancel requested").
    caplog.set_level(logging.INFO, logger="livepush")
    # This runtime serves every registered queue, as the commands build it, and so scheduled the
    # periodic jobs other test modules of the process defined (some every second) into the jobs'
    # database, the only other jobs there: in one CI run 9 jobs held its 10 slots, and the slow job
    # did not start within 10 s. The test is about a cancel's ring: the runtime schedules none.
    monkeypatch.setattr(runtime_module, "SCHEDULES", Schedules())
    _, jobs_db = two_databases
    runtime, close = await _runtime(how)
    task = asyncio.create_task(runtime.run())
    try:
        await runtime.wait_started()
        try:
            state = await slow_jobs.started_slow_job(jobs_db, 60)
        except AssertionError as exc:  # what held the slots, or what the runtime was doing instead
            raise AssertionError(f"{exc}; {_what_held_the_runtime(runtime, jobs_db)}") from None
        database.configure(jobs_db)  # the helper put it back to None
        # Its row says running once the claim commits, a moment before the claim's answer reaches
        # the runtime's loop and puts the job in hand.
        handle_id = state.id
        await async_wait_for(lambda: handle_id in runtime.in_hand, 10.0,
                             message="the job to be in the runtime's hand")
        assert await jobs.acancel(handle_id)
        # Told by its ring at once, the job stops at its next await: well before a heartbeat.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RING_BOUND
        while (now := await asyncio.to_thread(state)) == "running" and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert now == "cancelled", (f"the job was still {now} {RING_BOUND} s after its cancel; "
                                    f"{_what_the_runtime_saw(runtime, jobs_db, handle_id)}")
    finally:
        runtime.stop(now=True)
        await asyncio.wait_for(task, 10)
        await close()  # type: ignore[misc]


def _what_held_the_runtime(runtime: Runtime, url: str) -> str:
    """For a failure to start the slow job: the jobs' rows by name and state, and what the runtime
    had in hand."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT name, queue, state, count(*) FROM livepush_jobs GROUP BY 1, 2, 3 ORDER BY 1").fetchall()
        paused = conn.execute("SELECT * FROM livepush_paused_queues").fetchall()
    return (f"jobs (name, queue, state, count) {rows}; paused {paused}; in hand {sorted(runtime.in_hand)}; "
            f"runtime ended {runtime._ended.is_set()}, a claim under way {not runtime._claim_returned.is_set()}")


def _what_the_runtime_saw(runtime: Runtime, url: str, job_id: int) -> str:
    """For a failure: the job's row and the runtime's side of the cancel, to tell a ring never
    heard from a confirmation that found nothing or a task that would not stop."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT state, cancel_requested, runtime_id FROM livepush_jobs WHERE id = %s",
                           (job_id,)).fetchone()
    entry = runtime.in_hand.get(job_id)
    return (f"row (state, cancel_requested, runtime_id) {row}; runtime id {runtime.id}, its listener listening "
            f"{runtime._listener.listening}, cancels due {runtime._cancels_due}, cancel check "
            f"{runtime._cancel_check}, in hand {entry is not None}, told {entry and entry.ctx._cancel_requested}")
