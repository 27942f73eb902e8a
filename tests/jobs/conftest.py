"""Fixtures for the job tests: a fresh migrated database wired as the jobs' and the fan-out's."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import psycopg
import pytest

from livepush import api, config
from livepush.jobs import database
from tests.jobs import sample_jobs
from tests.support.procs import ChildProcess, Processes
from tests.support.waiting import wait_for


@pytest.fixture
def jobs_db(pg_url: str) -> Iterator[str]:
    """A fresh database used by jobs and the (publish-only) Postgres fan-out, LIVEPUSH_ENV=test."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sample_jobs.RUNS_TABLE)
        conn.execute(sample_jobs.FLAGS_TABLE)
    config.set_settings(config.Settings(database_url=pg_url, fanout="postgres", env="test",
                                        secret=secrets.token_urlsafe(36)))
    api.set_default_fanout(None)
    database.configure(pg_url)
    try:
        yield pg_url
    finally:
        database.configure(None)
        api.set_default_fanout(None)
        config.set_settings(None)


def q(url: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement on its own connection and return its rows."""
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def events_of(url: str, job_id: int) -> list[dict[str, Any]]:
    """Every message published on job:<id>, in offset order (from the fan-out's history)."""
    import json

    rows = q(url, "SELECT data FROM livepush_history WHERE topic = %s ORDER BY seq", (f"job:{job_id}",))
    return [json.loads(r[0]) for r in rows]


def runtime_starter(url: str, module: str, procs: Processes, env: Mapping[str, str]) -> Callable[..., ChildProcess]:
    """`start(*flags, heartbeat=0.3)` runs `livepush jobs MODULE` on `url` and returns once the
    runtime registered (its row is in livepush_job_runtimes): registered means ready."""

    def start(*flags: str, heartbeat: float = 0.3) -> ChildProcess:
        child = procs.livepush("jobs", module, "--heartbeat", str(heartbeat), "--poll-interval", "0.2", *flags,
                               env=env, wait_healthy=False)
        wait_for(lambda: q(url, "SELECT count(*) FROM livepush_job_runtimes WHERE pid = %s", (child.pid,))[0][0] == 1
                 or not child.running, 15.0, message=f"{child.name} to register")
        assert child.running, child.output()
        return child

    return start
