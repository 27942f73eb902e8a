"""livepush behind a real PgBouncer (docs/reference.md#2-configuration).

- Transaction mode: job runtimes, publish() and enqueues work through it, with
  LIVEPUSH_PREPARED_STATEMENTS=off when the pooler cannot keep prepared statements; a LISTEN
  through it is accepted but hears nothing, so a runtime runs on polling, or hears at once
  when LIVEPUSH_LISTEN_DATABASE_URL sends its LISTEN to the database directly.
- Session mode: everything works as on a direct connection, LISTEN included (`serve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from livepush import api, config, jobs
from livepush.errors import ConfigError, DependencyError
from livepush.jobs import database
from livepush.migrate import migrate
from tests.jobs import sample_jobs
from tests.jobs.conftest import q, registered
from tests.support import services
from tests.support.pgbouncer import PgBouncer, pgbouncer_version, start_pgbouncer
from tests.support.procs import ChildProcess, Processes
from tests.support.settings import jobs_settings
from tests.support.waiting import async_wait_for, wait_for
from tests.support.wsclient import WSClient

MODULE = "tests.jobs.sample_jobs"
# What a runtime logs when a claim, a beat or an outcome fails: none may appear behind the pooler.
FAILURE_LINES = ("claim failed", "heartbeat failed", "promoting scheduled jobs failed", "could not", "Traceback",
                 "prepared statement")


def pooled(mode: str) -> Callable[..., Iterator[PgBouncer]]:
    def fixture(pg_admin_url: str) -> Iterator[PgBouncer]:
        bouncer = start_pgbouncer(pg_admin_url, pool_mode=mode)
        try:
            yield bouncer
        finally:
            bouncer.stop()

    return fixture


transaction_pool = pytest.fixture(pooled("transaction"), name="transaction_pool")
session_pool = pytest.fixture(pooled("session"), name="session_pool")


def through(bouncer: PgBouncer, direct_url: str) -> str:
    """The URL of the same database as `direct_url`, through `bouncer`."""
    return bouncer.url(services.dbname_of(direct_url))


def settings_through(url: str, **options: Any) -> contextlib.AbstractContextManager[str]:
    """This process's publish() and enqueues go to `url`, with LIVEPUSH_PREPARED_STATEMENTS=off
    unless given."""
    options.setdefault("prepared_statements", False)
    return jobs_settings(url, **options)


@pytest.fixture
def runs_db(pg_url: str) -> str:
    """A fresh migrated database with the sample jobs' tables."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sample_jobs.RUNS_TABLE)
        conn.execute(sample_jobs.FLAGS_TABLE)
    return pg_url


def count(url: str, sql: str, params: Any = None) -> int:
    return int(q(url, sql, params)[0][0])


def assert_no_failures(child: ChildProcess) -> None:
    text = child.stderr() + child.stdout()
    found = [line for line in text.splitlines() if any(f in line for f in FAILURE_LINES)]
    assert not found, f"{child.name} logged failures behind PgBouncer:\n" + "\n".join(found[:20])


def http_json(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_the_pgbouncer_under_test(transaction_pool: PgBouncer) -> None:
    """Names the PgBouncer these tests ran against (the guarantees below were checked with it)."""
    version = pgbouncer_version()
    print(version)
    assert version.startswith("PgBouncer ")


# ---- transaction mode: job runtimes --------------------------------------------------------------


def test_runtime_through_transaction_mode_runs_every_job_once_by_polling(
        runs_db: str, transaction_pool: PgBouncer, procs: Processes,
        livepush_env: Callable[..., dict[str, str]]) -> None:
    """Two `livepush jobs` runtimes and every enqueue through transaction mode (no LISTEN that
    hears): 400 jobs each run exactly once, a job enqueued to idle runtimes starts within a few
    poll intervals, nothing fails on the way, and both stop cleanly."""
    url = through(transaction_pool, runs_db)
    env = livepush_env(database_url=url, prepared_statements="off")
    children = [procs.livepush("jobs", MODULE, "--concurrency", "10", "--heartbeat", "0.3", "--poll-interval", "0.3",
                               env=env) for _ in range(2)]
    for child in children:
        registered(runs_db, child)
    with settings_through(url):
        handles = jobs.enqueue_many([sample_jobs.record.request(i) for i in range(200)])
        handles += [sample_jobs.record_sync.enqueue(i) for i in range(200, 400)]
    wait_for(lambda: count(runs_db, "SELECT count(*) FROM livepush_jobs WHERE state = 'succeeded'") == 400, 40.0,
             interval=0.1, message="400 jobs to succeed through PgBouncer")
    assert count(runs_db, "SELECT count(*) FROM job_runs") == 400
    assert {r[0] for r in q(runs_db, "SELECT job_id FROM job_runs")} == {h.id for h in handles}

    with settings_through(url):
        late = sample_jobs.record.enqueue("late")
    enqueued = time.monotonic()
    wait_for(lambda: count(runs_db, "SELECT count(*) FROM job_runs WHERE job_id = %s", (late.id,)) == 1, 10.0,
             message="a job enqueued to idle runtimes to run by polling")
    assert time.monotonic() - enqueued < 3.0, "picked up later than a few poll intervals"
    for child in children:
        assert child.stop(timeout=15) == 0, child.output()
        assert_no_failures(child)
    assert count(runs_db, "SELECT count(*) FROM livepush_job_runtimes") == 0
    assert count(runs_db, "SELECT count(*) FROM job_runs") == 401


@pytest.mark.parametrize("mode", ["transaction mode, LISTEN direct", "session mode"])
def test_runtime_that_really_listens_is_woken_at_once(
        mode: str, runs_db: str, transaction_pool: PgBouncer, session_pool: PgBouncer, procs: Processes,
        livepush_env: Callable[..., dict[str, str]]) -> None:
    """A runtime polling only every 30 s still starts a job within 3 s of its enqueue through the
    pooler: its doorbell comes through a LISTEN that holds (a direct one past a transaction-mode
    pool with LIVEPUSH_LISTEN_DATABASE_URL, or one through a session-mode pool)."""
    if mode == "session mode":
        url, listen, prepared = through(session_pool, runs_db), None, "on"
    else:
        url, listen, prepared = through(transaction_pool, runs_db), runs_db, "off"
    env = livepush_env(database_url=url, listen_database_url=listen, prepared_statements=prepared)
    child = procs.livepush("jobs", MODULE, "--heartbeat", "0.3", "--poll-interval", "30", env=env)
    registered(runs_db, child)
    for i in range(3):
        with settings_through(url, prepared_statements=prepared == "on"):
            job = sample_jobs.record.enqueue(i)
        enqueued = time.monotonic()
        wait_for(lambda: count(runs_db, "SELECT count(*) FROM job_runs WHERE job_id = %s", (job.id,)) == 1, 10.0,
                 message=f"job {job.id} to run")
        assert time.monotonic() - enqueued < 3.0, "not woken by its doorbell"
    assert child.stop(timeout=15) == 0, child.output()
    assert_no_failures(child)


# ---- transaction mode: publish() and enqueues -----------------------------------------------------


def test_publish_and_enqueue_through_transaction_mode(pg_url: str, transaction_pool: PgBouncer) -> None:
    """publish() and enqueues, sync from 4 threads at once and async, through transaction mode with
    LIVEPUSH_PREPARED_STATEMENTS=off: every call succeeds and each topic's offsets follow on
    without a gap."""
    url = through(transaction_pool, pg_url)
    errors: list[BaseException] = []

    def publisher(n: int) -> None:
        try:
            for i in range(40):
                api.publish(f"news:{n}", {"i": i})
                sample_jobs.record.enqueue(f"{n}:{i}")
        except BaseException as exc:  # noqa: BLE001 -- reported by the test thread below
            errors.append(exc)

    async def async_calls() -> None:
        for i in range(40):
            await api.apublish("news:async", {"i": i})
            await sample_jobs.record.aenqueue(f"async:{i}")
        await jobs.aenqueue_many([sample_jobs.record.request(f"many:{i}") for i in range(20)])
        await database.release_loop()
        await api.release_loop()

    with settings_through(url):
        threads = [threading.Thread(target=publisher, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        asyncio.run(async_calls())
        offsets = [api.latest_offset(f"news:{n}") for n in range(4)] + [api.latest_offset("news:async")]
    assert not errors, errors[:3]
    assert all(offset.endswith("-40") for offset in offsets), offsets
    assert count(pg_url, "SELECT count(*) FROM livepush_jobs WHERE name = 't.record'") == 4 * 40 + 40 + 20


def test_prepared_statements_off_keeps_every_connection_from_preparing(pg_url: str,
                                                                        transaction_pool: PgBouncer) -> None:
    """With LIVEPUSH_PREPARED_STATEMENTS=off no statement livepush runs is prepared, even those it
    prepares from their first run (the enqueue's, the claim's): the server holds none after 20
    enqueues on one pooled connection."""
    with settings_through(through(transaction_pool, pg_url)):
        for i in range(20):
            sample_jobs.record.enqueue(i)
        pool = database.pools().sync()
        with pool.connection() as conn:
            assert conn.prepare_threshold is None
            assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)


def test_publish_in_callers_transactions_through_transaction_mode_prepares_nothing(
        pg_url: str, transaction_pool: PgBouncer) -> None:
    """publish(conn=) on the app's own connections through transaction mode with
    LIVEPUSH_PREPARED_STATEMENTS=off prepares nothing, whatever the connections' prepare_threshold
    (psycopg's default, as Django leaves it: its client-side cursors never prepare, but livepush's
    statement on them did from its fifth run, and the next connection to do so on the same server
    connection failed the caller's transaction with "prepared statement _pg3_0 already exists")."""
    url = through(transaction_pool, pg_url)
    with settings_through(url):
        conns = [psycopg.connect(url, cursor_factory=psycopg.ClientCursor) for _ in range(2)]
        try:
            for i in range(12):
                for n, conn in enumerate(conns):
                    api.publish(f"app:{n}", {"i": i}, conn=conn)
                    conn.commit()
        finally:
            for conn in conns:
                conn.close()

        async def apublish_in_transactions() -> None:
            aconns = [await psycopg.AsyncConnection.connect(url, cursor_factory=psycopg.AsyncClientCursor)
                      for _ in range(2)]
            try:
                for i in range(12):
                    for n, aconn in enumerate(aconns):
                        await api.apublish(f"app:{n}", {"i": 12 + i}, conn=aconn)
                        await aconn.commit()
            finally:
                for aconn in aconns:
                    await aconn.close()

        asyncio.run(apublish_in_transactions())
        assert [api.latest_offset(f"app:{n}").split("-")[1] for n in range(2)] == ["24", "24"]


def test_group_building_in_callers_transactions_through_transaction_mode_prepares_nothing(
        pg_url: str, transaction_pool: PgBouncer) -> None:
    """A task group built on the app's own connections (`jobs.group(conn=)`, as signals and
    workflow starts are) through transaction mode with LIVEPUSH_PREPARED_STATEMENTS=off prepares
    nothing, whatever the connections' prepare_threshold: the savepoint around its statements,
    run on every call, was prepared from its fifth run, and the next connection to do so on the
    same server connection failed the caller's transaction."""
    url = through(transaction_pool, pg_url)
    with settings_through(url):
        conns = [psycopg.connect(url) for _ in range(2)]
        try:
            for i in range(12):
                for conn in conns:
                    with jobs.group(conn=conn) as g:
                        g.enqueue(sample_jobs.record, i)
                    conn.commit()
        finally:
            for conn in conns:
                conn.close()

        async def agroups_in_transactions() -> None:
            aconns = [await psycopg.AsyncConnection.connect(url) for _ in range(2)]
            try:
                for i in range(12):
                    for aconn in aconns:
                        async with jobs.agroup(conn=aconn) as g:
                            g.enqueue(sample_jobs.record, 12 + i)
                        await aconn.commit()
            finally:
                for aconn in aconns:
                    await aconn.close()
            await database.release_loop()

        asyncio.run(agroups_in_transactions())
    assert count(pg_url, "SELECT count(*) FROM livepush_groups") == 48


def test_prepared_statements_left_on_behind_transaction_mode_fail_naming_the_setting_to_turn_off(
        pg_url: str, transaction_pool: PgBouncer) -> None:
    """Behind a transaction-mode PgBouncer that cannot keep prepared statements, with
    LIVEPUSH_PREPARED_STATEMENTS left on, a publish whose statement was prepared on a server
    connection the pooler has since replaced fails with DependencyError saying to set
    LIVEPUSH_PREPARED_STATEMENTS=off, not only psycopg's "prepared statement _pg3_0 does not exist"."""
    with settings_through(through(transaction_pool, pg_url), prepared_statements=True):
        for i in range(10):  # psycopg prepares a statement from its sixth run
            api.publish("news:prepared", {"i": i})
        dbname = services.dbname_of(pg_url)
        with psycopg.connect(pg_url, autocommit=True) as admin:  # the pooler's server connections end
            for pid in transaction_pool.servers(dbname):
                admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        wait_for(lambda: not transaction_pool.servers(dbname), message="the pooler to drop its ended server connections")
        with pytest.raises(DependencyError) as caught:
            api.publish("news:prepared", {"i": 10})
    message = str(caught.value)
    assert "LIVEPUSH_PREPARED_STATEMENTS=off" in message, message
    assert "_pg3_" in message, message  # the driver's own words are kept


def test_a_pgbouncer_at_its_max_client_conn_is_said_as_full_with_what_to_raise_not_as_postgres_unreachable(
        pg_admin_url: str, pg_url: str) -> None:
    """PgBouncer that takes no more clients (its max_client_conn reached) is up, and so is Postgres
    behind it: a publish through it fails with DependencyError (an outage to retry) that keeps
    PgBouncer's words and says what to change, its max_client_conn or the connections livepush
    opens through it, never "cannot reach Postgres ... check that the server is running"."""
    bouncer = start_pgbouncer(pg_admin_url, max_client_conn=1)
    try:
        url = through(bouncer, pg_url)
        # The one client it takes (once the start's probe, closed, has left its slot).
        held = wait_for(lambda: psycopg.connect(url, autocommit=True), 10.0, interval=0.05,
                        ignore=(psycopg.OperationalError,), message="the pooler's one client slot")
        try:
            with settings_through(url), pytest.raises(DependencyError) as caught:
                api.publish("news:full", {"n": 1})
        finally:
            held.close()
    finally:
        bouncer.stop()
    message = str(caught.value)
    assert "no more connections allowed (max_client_conn)" in message, message
    advice = message.split("(max_client_conn)", 1)[1]
    assert "PgBouncer" in message and "max_client_conn" in advice, message
    assert "LIVEPUSH_WORKERS" in message, message
    assert "cannot reach" not in message and "that the server is running" not in message, message


def test_a_pgbouncer_whose_pool_stays_full_past_query_wait_timeout_is_said_as_a_full_pool_not_postgres_unreachable(
        pg_admin_url: str, pg_url: str) -> None:
    """PgBouncer whose server connections for a database are all held (its pool_size reached, by
    long transactions or too small a pool) ends a query that waited past its query_wait_timeout:
    PgBouncer and Postgres are both up. A publish through it fails with DependencyError (an outage
    to retry) that keeps PgBouncer's words and says what to change, never "cannot reach Postgres
    ... check that the server is running"."""
    bouncer = start_pgbouncer(pg_admin_url, pool_size=1, query_wait_timeout=1)
    try:
        url = through(bouncer, pg_url)
        with psycopg.connect(url) as held:  # its transaction holds the pool's one server connection
            held.execute("SELECT 1")
            with settings_through(url), pytest.raises(DependencyError) as caught:
                api.publish("news:waiting", {"n": 1})
    finally:
        bouncer.stop()
    message = str(caught.value)
    assert "query_wait_timeout" in message and "PgBouncer" in message, message
    assert "default_pool_size" in message, message
    assert "cannot reach" not in message and "that the server is running" not in message, message


@pytest.mark.parametrize("setting", ["max_client_conn", "max_db_client_connections", "max_user_client_connections"])
def test_each_pgbouncer_client_limit_is_said_as_a_full_pooler_naming_that_limit(setting: str) -> None:
    """PgBouncer 1.24 added client limits per database and per user, refused in other words than
    max_client_conn's ("client connections exceeded (...)"). Each is said as a pooler that is up
    and full, naming the limit to raise, never as "cannot reach Postgres ... check that the server
    is running". (The driver's error as psycopg raises it; PgBouncer 1.18 here has only the first.)"""
    from livepush.postgres.connect import translate

    said = ("no more connections allowed (max_client_conn)" if setting == "max_client_conn"
            else f"client connections exceeded ({setting})")
    url = "postgresql://app:secret@pooler.example:6432/app"
    error = translate(url, psycopg.OperationalError(
        f'connection failed: connection to server at "10.0.0.5", port 6432 failed: FATAL:  {said}'))
    message = str(error)
    assert isinstance(error, DependencyError) and said in message, message
    assert f"raise its {setting}" in message and "PgBouncer" in message, message
    assert "cannot reach" not in message and "secret" not in message, message


def test_migrate_through_transaction_mode(pg_admin_url: str, transaction_pool: PgBouncer) -> None:
    """`migrate()` runs in one transaction under a transaction-level advisory lock, so it holds
    through transaction mode too (preparing off): the schema is complete and a second run finds
    nothing to do."""
    name = f"t_{secrets.token_hex(8)}"
    services.create_database(pg_admin_url, name)
    try:
        with settings_through(transaction_pool.url(name)) as url:
            assert len(migrate(url)) >= 1
            assert migrate(url) == []
    finally:
        services.drop_database(pg_admin_url, name)


# ---- servers ----------------------------------------------------------------------------------------


async def delivered(port: int, publish_url: str, secret: str, count_: int = 10) -> list[Any]:
    """Subscribe to `news` (signed with the server's `secret`) on the server at `port`, publish
    `count_` messages to `publish_url`, and return the data delivered."""
    client = await WSClient.open(f"ws://127.0.0.1:{port}/")
    try:
        with settings_through(publish_url, secret=secret):
            assert (await client.subscribe(api.sign_topic("news")))["op"] == "subscribed"
            for i in range(count_):
                await api.apublish("news", {"i": i})
            await api.release_loop()
        return [m["data"] for m in await client.messages(count_, timeout=10)]
    finally:
        await client.close()


async def test_serve_through_session_mode_delivers(pg_url: str, session_pool: PgBouncer, procs: Processes,
                                                  livepush_env: Callable[..., dict[str, str]], secret: str) -> None:
    """`livepush serve` whose every connection, LISTEN included, goes through session mode
    delivers what is published, and /readyz says it is ready."""
    url = through(session_pool, pg_url)
    child = await procs.alivepush("serve", env=livepush_env(database_url=url))
    assert await delivered(child.port, url, secret) == [{"i": i} for i in range(10)]
    await async_wait_for(lambda: http_json(child.port, "/readyz")[0] == 200, 15.0, interval=0.2,
                         message="/readyz to answer 200")


async def test_serve_through_transaction_mode_listening_directly_delivers(
        pg_url: str, transaction_pool: PgBouncer, procs: Processes,
        livepush_env: Callable[..., dict[str, str]], secret: str) -> None:
    """`livepush serve` through transaction mode with LIVEPUSH_LISTEN_DATABASE_URL on the database
    itself delivers what is published through the pooler, and is ready."""
    url = through(transaction_pool, pg_url)
    env = livepush_env(database_url=url, listen_database_url=pg_url, prepared_statements="off")
    child = await procs.alivepush("serve", env=env)
    assert await delivered(child.port, url, secret) == [{"i": i} for i in range(10)]
    await async_wait_for(lambda: http_json(child.port, "/readyz")[0] == 200, 15.0, interval=0.2,
                         message="/readyz to answer 200")
    assert_no_failures(child)


async def test_serve_listening_through_transaction_mode_is_never_ready(
        pg_url: str, transaction_pool: PgBouncer, procs: Processes,
        livepush_env: Callable[..., dict[str, str]]) -> None:
    """A LISTEN through transaction mode is accepted and hears nothing: /healthz answers 200, but
    /readyz answers 503, its canary never coming back, so a load balancer sends it no one."""
    url = through(transaction_pool, pg_url)
    child = await procs.alivepush("serve", env=livepush_env(database_url=url, prepared_statements="off"))

    def canary_late() -> bool:
        status, body = http_json(child.port, "/readyz")
        return status == 503 and "no canary came back" in json.dumps(body)

    await async_wait_for(canary_late, 20.0, interval=0.25, message="/readyz to report the canary missing")
    assert http_json(child.port, "/healthz")[0] == 200


async def test_serve_on_redis_whose_state_listener_goes_through_transaction_mode_is_never_ready(
        pg_url: str, redis_url: str, transaction_pool: PgBouncer, procs: Processes,
        livepush_env: Callable[..., dict[str, str]]) -> None:
    """On the Redis fan-out the canary goes round Redis, but `job:`, `group:` and `workflow:`
    topics are rung on Postgres: their LISTEN through transaction mode hears nothing, and /readyz
    answers 503 for it (canary), while /healthz answers 200."""
    url = through(transaction_pool, pg_url)
    env = livepush_env(database_url=url, redis_url=redis_url, fanout="redis", prepared_statements="off")
    child = await procs.alivepush("serve", env=env)

    def states_late() -> bool:
        status, body = http_json(child.port, "/readyz")
        return status == 503 and "no state ring came back" in json.dumps(body)

    await async_wait_for(states_late, 20.0, interval=0.25, message="/readyz to report the state rings missing")
    assert http_json(child.port, "/healthz")[0] == 200


# ---- settings --------------------------------------------------------------------------------------


def test_listen_url_defaults_to_the_database_url() -> None:
    settings = config.Settings.from_env({"LIVEPUSH_DATABASE_URL": "postgresql://u@pooler:6432/app"})
    assert settings.listen_url == "postgresql://u@pooler:6432/app"
    assert settings.prepared_statements is True
    direct = config.Settings.from_env({"LIVEPUSH_DATABASE_URL": "postgresql://u@pooler:6432/app",
                                       "LIVEPUSH_LISTEN_DATABASE_URL": "postgresql://u@db:5432/app",
                                       "LIVEPUSH_PREPARED_STATEMENTS": "OFF"})
    assert direct.listen_url == "postgresql://u@db:5432/app"
    assert direct.prepared_statements is False


@pytest.mark.parametrize("env,needle", [
    ({"LIVEPUSH_DATABASE_URL": "postgresql://u@db/app", "LIVEPUSH_LISTEN_DATABASE_URL": "postgresql://u:s3cr3t@[bad"},
     "LIVEPUSH_LISTEN_DATABASE_URL cannot be parsed"),
    ({"LIVEPUSH_LISTEN_DATABASE_URL": "postgresql://u@db/app"}, "LIVEPUSH_LISTEN_DATABASE_URL is set without"),
    ({"LIVEPUSH_PREPARED_STATEMENTS": "maybe"}, "LIVEPUSH_PREPARED_STATEMENTS='maybe' is unknown"),
], ids=["malformed-listen-url", "listen-url-alone", "bad-prepared-statements"])
def test_a_bad_pooler_setting_names_it(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config.Settings.from_env(env)
    assert needle in str(caught.value)
    assert "s3cr3t" not in str(caught.value)
