"""Fixtures for the job tests: a fresh migrated database wired as the jobs' and the fan-out's,
with a recording of every version of every job's state topic."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import psycopg
import pytest

from livepush.jobs.api.registry import REGISTRY, Registry
from livepush.jobs.periodic.decorator import SCHEDULES
from livepush.jobs.runtime.runtime import Runtime
from livepush.types import State
from tests.jobs import sample_jobs
from tests.support.job_versions import VERSIONS_TABLE, events_of, versions_of
from tests.support.procs import ChildProcess, Processes
from tests.support.settings import jobs_settings
from tests.support.waiting import wait_for



@pytest.fixture
def jobs_db(pg_url: str) -> Iterator[str]:
    """A fresh database used by jobs and the (publish-only) Postgres fan-out, LIVEPUSH_ENV=test,
    recording every job version (events_of)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sample_jobs.RUNS_TABLE)
        conn.execute(sample_jobs.FLAGS_TABLE)
        conn.execute(VERSIONS_TABLE)
    with jobs_settings(pg_url):
        yield pg_url


@contextlib.asynccontextmanager
async def running(**options: Any) -> AsyncIterator[Runtime]:
    """A runtime of every job of `registry` (the process-wide REGISTRY unless given) on this loop
    (queues "default" and "second" unless given; None: every queue of the registry's jobs; 0.2 s
    heartbeat), stopped at once when the block ends."""
    registry: Registry = options.pop("registry", REGISTRY)
    options.setdefault("queues", ["default", "second"])
    options.setdefault("heartbeat", 0.2)
    # Periodic jobs are process-wide: one another test defined on these queues would be scheduled
    # here, its runs counted among this test's jobs only when a tick falls while it runs.
    queues = options["queues"] if options["queues"] is not None else registry.queues()
    stray = SCHEDULES.served_by(registry, queues)
    assert not stray, (f"periodic jobs on the queues {queues} would be scheduled by this test's runtime: "
                       f"{', '.join(s.name for s in stray)}; define them on a queue of their own")
    rt = Runtime(registry, install_signals=False, **options)
    task = asyncio.create_task(rt.run())
    await rt.wait_started()
    try:
        yield rt
    finally:
        rt.stop(now=True)
        await asyncio.wait_for(task, 10)


def q(url: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement on its own connection and return its rows."""
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def over_jsonb(elements: int = 23_000_000) -> list[list[int]]:
    """JSON (arguments, an input, data) whose jsonb passes the 256 MiB a value holds (268,435,455
    bytes) at a sixth of that in JSON text: each 0 is 2 characters of text and 12 bytes of jsonb
    (an entry and a numeric). Postgres refuses 23 million of them; 11.5 million (one of two jobs
    of a batch) it stores. One inner list, shared, so that the test holds little."""
    row = [0] * 1000
    return [row] * (elements // 1000)


def version_gaps(url: str) -> list[tuple[Any, ...]]:
    """Jobs whose recorded versions are not exactly 1, 2, ... up to the row's version, each once
    (for checks over many jobs at once): (id, row version, recorded versions)."""
    return q(url, """
        SELECT j.id, j.version, array_agg(v.version ORDER BY v.version) FILTER (WHERE v.version IS NOT NULL)
        FROM livepush_jobs j LEFT JOIN test_job_versions v ON v.id = j.id
        GROUP BY j.id, j.version
        HAVING count(v.version) <> j.version OR count(DISTINCT v.version) <> j.version
            OR coalesce(max(v.version), 0) <> j.version
        ORDER BY j.id LIMIT 20""")


def names_of(url: str, job_id: int) -> list[str]:
    """The event names of events_of(), each with the state it left the job in: "retrying/scheduled"."""
    return [f"{e['event']}/{e['job']['state']}" for e in events_of(url, job_id)]


def read_states(url: str, topics: Sequence[str]) -> dict[str, State]:
    """What the server's state source for job: and group: topics (JobStates) reads for `topics`,
    on a loop of its own (from sync code)."""
    from livepush.jobs.events.source import JobStates

    async def read() -> dict[str, State]:
        source = JobStates(url)
        try:
            return dict(await source.read(topics))
        finally:
            await source.aclose()

    return asyncio.run(read())


def group_events(group_id: int) -> list[dict[str, Any]]:
    """Every event livepush recorded for group:<id> (jobs.group_history()), oldest first."""
    from livepush import jobs

    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        page, cursor = jobs.group_history(group_id, before=cursor, limit=500)
        rows.extend(page)
        if cursor is None:
            break
    return rows[::-1]


def registered(url: str, child: ChildProcess) -> None:
    """Returns once the runtime's row is in livepush_job_runtimes: registered means ready."""
    wait_for(lambda: q(url, "SELECT count(*) FROM livepush_job_runtimes WHERE pid = %s", (child.pid,))[0][0] == 1
             or not child.running, 15.0, message=f"{child.name} (pid {child.pid}) to register")
    assert child.running, child.output()


def runtime_spawner(module: str, procs: Processes, env: Mapping[str, str], *flags: str,
                    heartbeat: float = 0.3) -> Callable[[], ChildProcess]:
    """`spawn()` starts `livepush jobs MODULE` with these flags and returns at once (wait with
    `registered`): the kill -9 loops overlap a replacement's start with their rounds."""

    def spawn() -> ChildProcess:
        return procs.livepush("jobs", module, "--heartbeat", str(heartbeat), "--poll-interval", "0.2", *flags,
                              env=env, wait_healthy=False)

    return spawn


def runtime_starter(url: str, module: str, procs: Processes, env: Mapping[str, str]) -> Callable[..., ChildProcess]:
    """`start(*flags, heartbeat=0.3)` runs `livepush jobs MODULE` on `url` and returns once the
    runtime registered."""

    def start(*flags: str, heartbeat: float = 0.3) -> ChildProcess:
        child = runtime_spawner(module, procs, env, *flags, heartbeat=heartbeat)()
        registered(url, child)
        return child

    return start
