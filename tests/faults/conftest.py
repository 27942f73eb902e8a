"""Fixtures and tools for fault tests: real processes under load, with the shared services faulted.

A fault test starts real `livepush serve` and `livepush jobs` child processes on a fresh
database of the suite's PostgreSQL (and the suite's Redis), puts load on them that keeps going
through the fault (WebSocket clients, a publisher, a job enqueuer), injects the fault with
tests/support/services.py, and then checks a guarantee of docs/reference.md §7.

Fixtures:

- `services_back_up` (autouse)  after every test here the shared PostgreSQL and Redis run
                                again, whatever the test did to them: the rest of the suite
                                uses them too.
- `fleet`                       a `Fleet` on a fresh migrated database (`pg_url`) whose
                                sessions commit synchronously (see the fixture), with this
                                process's jobs API pointed at it and the `job_runs` table the
                                JOB_MODULE jobs record their runs in.

Tools, each in its own module of this folder (import them as `from tests.faults.fleet import Fleet`):

- `fleet.py`    `Fleet`: `await fleet.serve(n, fanout=...)` n servers, /healthz 200;
                `await fleet.runtimes(n)` n runtimes of JOB_MODULE, each registered;
                `fleet.sign(topic)`; `await fleet.wait_jobs_done(ids)`; `fleet.server_log(*words)`,
                `fleet.runtime_log(*words)`; `fleet.still_running()`; `fleet.stop_all()` (SIGTERM,
                exit statuses). `postgres_down(mode)`, `redis_down(hard=)`: async context
                managers, the service down inside the block and up again after it, whatever
                happens; the event loop goes on meanwhile.
- `traffic.py`  `Traffic`: clients on every server, a publisher, an enqueuer and a /healthz
                watch, started and stopped together, and the checks every fault test makes
                (`delivered()`: no loss without a reset, no duplicate, no disorder, no reconnect).
- `clients.py`  `ResumingClient`: keeps its subscriptions the way the JS client does (last
                offset per topic, drops what is not newer, forgets the offset on `reset`,
                reconnects with jittered backoff and resubscribes with `since`); `unaccounted()`:
                the published messages a client neither received nor was told it missed.
- `load.py`     `Publisher`, `Enqueuer`: load that keeps going through an outage, remembering
                each call that returned (the offset publish() gave, the job's id).
- `health.py`   `HealthWatch`: polls each server's /healthz every few milliseconds and keeps
                every change of answer, so a test can see a 503 come and go.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import psycopg
import psycopg.sql
import pytest
import redis

from tests.faults.fleet import Fleet
from tests.jobs import sample_jobs
from tests.support import services
from tests.support.procs import Processes
from tests.support.settings import jobs_settings


def _postgres_answers(admin_url: str) -> bool:
    try:
        psycopg.connect(admin_url, connect_timeout=2).close()
        return True
    except psycopg.Error:
        return False


def _redis_answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


@pytest.fixture(autouse=True)
def services_back_up(request: pytest.FixtureRequest) -> Iterator[None]:
    """After the test, PostgreSQL and Redis run (started again if a fault left them down).

    When the suite's PostgreSQL is there it takes `make_pg_url` first, so that it is torn down
    before it: the databases the test made are dropped only once PostgreSQL is up again. A test
    that needs no service is left alone."""
    admin_url = os.environ.get("LIVEPUSH_TEST_PG_ADMIN_URL", "")
    if admin_url:
        request.getfixturevalue("make_pg_url")
    yield
    if os.environ.get("LIVEPUSH_TEST_PG_DATA") and not _postgres_answers(admin_url):
        services.pg_start()
    redis_url = os.environ.get("LIVEPUSH_TEST_REDIS_URL", "")
    if os.environ.get("LIVEPUSH_TEST_REDIS_CMD") and not _redis_answers(redis_url):
        services.redis_start()


@pytest.fixture
def fleet(pg_url: str, procs: Processes, livepush_env: Callable[..., dict[str, str]], secret: str) -> Iterator[Fleet]:
    """A `Fleet` on a fresh migrated database; this process enqueues jobs into it."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sample_jobs.RUNS_TABLE)
        # bin/test runs PostgreSQL with synchronous_commit off (speed), under which a crash loses
        # commits it had already acknowledged. Every session on this database gets the default
        # back, so that what a crash loses is livepush's doing, never that setting's.
        conn.execute(psycopg.sql.SQL("ALTER DATABASE {} SET synchronous_commit = on").format(
            psycopg.sql.Identifier(services.dbname_of(pg_url))))
    with jobs_settings(pg_url):
        yield Fleet(pg_url, procs, livepush_env, secret)
