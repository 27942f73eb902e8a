"""Least privilege: `livepush migrate --runtime-role ROLE` grants a role exactly what serve, jobs,
publish() and enqueues need, and a server and a runtime run as that role."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from livepush import topics
from livepush.cli.commands import main as cli
from livepush.fanout.postgres import PostgresFanOut
from livepush.jobs import database
from tests.security import role_jobs
from tests.security.conftest import role_of
from tests.support.procs import Processes
from tests.support import services
from tests.support.services import dbname_of
from tests.support.wsclient import WSClient



SECURITY_DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def documented_lockdown(database: str, owner: str, runtime: str) -> list[str]:
    """The statements docs/security.md gives to close the database to everyone else, for these names."""
    text = SECURITY_DOC.read_text(encoding="utf-8")
    block = text.split("close it to everyone else:", 1)[1].split("```sql\n", 1)[1].split("```", 1)[0]
    names = {"app": database, "app_owner": owner, "app_runtime": runtime}
    quoted = re.sub(r"\b(app_owner|app_runtime|app)\b", lambda m: f'"{names[m.group(1)]}"', block)
    return [statement.strip() for statement in quoted.split(";") if statement.strip()]


@pytest.fixture
def runtime_url(pg_url: str, role_url: Callable[..., str], monkeypatch: pytest.MonkeyPatch,
                capsys: pytest.CaptureFixture[str]) -> str:
    """A runtime role set up as docs/security.md says: the database closed to everyone else, then
    `migrate --runtime-role` as the owner."""
    url = role_url("app")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        owner = conn.execute("SELECT current_user").fetchone()[0]  # type: ignore[index]
        for statement in documented_lockdown(dbname_of(pg_url), owner, role_of(url)):
            conn.execute(statement)  # type: ignore[arg-type]
    monkeypatch.setenv("LIVEPUSH_DATABASE_URL", pg_url)
    assert cli(["migrate", "--runtime-role", role_of(url)]) == 0
    out, err = capsys.readouterr()
    assert f"granted {role_of(url)}" in out and "warning" not in err, err
    return url


async def test_a_server_and_a_runtime_run_as_the_runtime_role(
    runtime_url: str, livepush_env: Callable[..., dict[str, str]], procs: Processes, secret: str
) -> None:
    """As the runtime role: `serve` and `jobs` start, an enqueue runs, its progress reaches a subscriber, and a publish is delivered."""
    env = livepush_env(database_url=runtime_url)
    server = await procs.alivepush("serve", env=env)
    procs.livepush("jobs", role_jobs.__name__, "--heartbeat", "0.5", env=env)
    database.configure(runtime_url)
    fanout = PostgresFanOut(runtime_url)
    client = await WSClient.open(f"ws://127.0.0.1:{server.port}/")
    try:
        handle = await role_jobs.work.aenqueue(2)
        assert (await client.subscribe(topics.sign(handle.topic, (secret,))))["op"] == "subscribed"
        seen = []
        while not seen or seen[-1]["data"]["event"] != "succeeded":
            seen.append((await client.messages(1, timeout=15))[0])
        assert seen[-1]["data"]["job"]["progress"] == {"done": 2, "total": 2, "message": "step 2"}
        assert (await client.subscribe(topics.sign("room:role", (secret,))))["op"] == "subscribed"
        offset = await fanout.apublish("room:role", {"as": "runtime role"})
        (message,) = await client.messages(1)
        assert message["offset"] == offset and message["data"] == {"as": "runtime role"}
    finally:
        await client.close()
        await fanout.aclose()
        await database.release_loop()
        database.configure(None)


def test_the_runtime_role_has_no_ddl_truncate_or_ownership(runtime_url: str) -> None:
    """The runtime role may read and write livepush's rows, and may not create (temporary objects
    included), truncate, alter or drop anything."""
    with psycopg.connect(runtime_url, autocommit=True) as conn:
        conn.execute("SELECT count(*) FROM livepush_jobs")
        for statement in ("CREATE TABLE t_role_probe (x int)", "CREATE TEMP TABLE t_role_probe (x int)",
                          "CREATE FUNCTION pg_temp.f_role_probe() RETURNS int LANGUAGE sql AS 'SELECT 1'",
                          "TRUNCATE livepush_jobs",
                          "ALTER TABLE livepush_jobs ADD COLUMN x int", "DROP TABLE livepush_messages",
                          "INSERT INTO livepush_schema (version, name) VALUES (99, 'x')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)  # type: ignore[arg-type]


def test_migrate_run_as_the_runtime_role_on_a_current_schema_has_nothing_to_do(
        runtime_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A deploy script that runs `livepush migrate` with the app's own (runtime) credentials, after
    the owner migrated: nothing is to be applied, so it exits 0 and says the schema is current,
    rather than failing on a CREATE it has no right to and would not need."""
    monkeypatch.setenv("LIVEPUSH_DATABASE_URL", runtime_url)
    assert cli(["migrate"]) == 0
    out, err = capsys.readouterr()
    assert "(nothing to do)" in out and not err, (out, err)


def test_migrate_run_as_the_runtime_role_with_work_to_do_says_to_run_it_as_the_owner(
        runtime_url: str, pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """With a migration still to apply, the runtime role cannot apply it: one line says so and
    names the way out (the owner's credentials), exit 2, no traceback."""
    with psycopg.connect(pg_url, autocommit=True) as conn:  # as if the newest migration were new
        conn.execute("DELETE FROM livepush_schema WHERE version = (SELECT max(version) FROM livepush_schema)")
    monkeypatch.setenv("LIVEPUSH_DATABASE_URL", runtime_url)
    assert cli(["migrate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "owner" in err[0], err
    # Told to run migrate (what failed) as the owner, not to run `migrate --runtime-role`.
    assert "may not create livepush's tables" in err[0] and "--runtime-role" not in err[0], err


def test_migrate_as_a_role_that_may_not_create_on_a_new_database_says_to_run_it_as_the_owner(
        pg_admin_url: str, role_url: Callable[..., str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """On a database never migrated, a role that may not create in its schema (Postgres 15 gives
    PUBLIC no CREATE on `public`) fails at the first table: one line naming what to do, exit 2."""
    name = f"t_new_{uuid.uuid4().hex[:12]}"
    services.create_database(pg_admin_url, name)
    try:
        nobody = psycopg.conninfo.make_conninfo(role_url("nobody"), dbname=name)
        monkeypatch.setenv("LIVEPUSH_DATABASE_URL", nobody)
        assert cli(["migrate"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "may not create livepush's tables" in err[0], err
        assert "owner" in err[0] and "--runtime-role" not in err[0], err
    finally:
        database.close_pools()
        services.drop_database(pg_admin_url, name)


def test_migrate_refuses_a_role_that_does_not_exist(pg_url: str, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`migrate --runtime-role` naming no role ends with exit 2 and one line saying to create it."""
    monkeypatch.setenv("LIVEPUSH_DATABASE_URL", pg_url)
    assert cli(["migrate", "--runtime-role", "no_such_role_xyz"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such role" in err[0] and "CREATE ROLE" in err[0], err


def test_migrate_names_the_role_a_runtime_role_in_other_letter_case_means(
        pg_url: str, role_url: Callable[..., str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`--runtime-role APP_RUNTIME` for a role made with CREATE ROLE app_runtime (SQL folds an
    unquoted name to lower case; the flag takes the name as it is): exit 2 naming the role that
    exists, not "create it first", which would fail with "already exists"."""
    role = role_of(role_url("app"))
    monkeypatch.setenv("LIVEPUSH_DATABASE_URL", pg_url)
    assert cli(["migrate", "--runtime-role", role.upper()]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--runtime-role {role}" in err[0] and "CREATE ROLE" not in err[0], err


def test_migrate_run_by_a_role_that_may_not_grant_says_so_instead_of_granted(
        runtime_url: str, role_url: Callable[..., str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`migrate --runtime-role` run with credentials that own none of livepush's objects (the
    runtime role's own, in a deploy script) grants nothing: Postgres only warns. It exits 2 naming
    the owner's credentials, never "granted" with the role left without its rights."""
    other = role_of(role_url("other"))
    monkeypatch.setenv("LIVEPUSH_DATABASE_URL", runtime_url)
    assert cli(["migrate", "--runtime-role", other]) == 2
    out, err = capsys.readouterr()
    assert f"granted {other}" not in out, out
    (line,) = err.strip().splitlines()
    assert f"could not grant {other}" in line and "owner" in line and "livepush_" in line, line
    with psycopg.connect(runtime_url) as conn:
        assert conn.execute("SELECT has_table_privilege(%s, 'livepush_jobs', 'SELECT')",
                            (other,)).fetchone() == (False,)


def test_migrate_names_what_the_runtime_role_could_still_create(pg_url: str, role_url: Callable[..., str],
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """On a database whose PUBLIC still holds TEMPORARY (Postgres' default), `migrate --runtime-role`
    grants as usual and warns that the role can create temporary objects, naming the REVOKE."""
    role = role_of(role_url("app"))
    monkeypatch.setenv("LIVEPUSH_DATABASE_URL", pg_url)
    assert cli(["migrate", "--runtime-role", role]) == 0
    out, err = capsys.readouterr()
    assert f"granted {role}" in out
    (warning,) = err.strip().splitlines()
    assert warning.startswith(f"warning: {role} can create temporary tables") and \
        f"REVOKE TEMPORARY ON DATABASE {dbname_of(pg_url)} FROM PUBLIC" in warning.replace('"', ""), warning


@pytest.mark.parametrize("who", ["the owner itself", "a member of the owner"])
def test_migrate_warns_that_a_runtime_role_above_the_grants_is_limited_by_nothing(
        pg_url: str, role_url: Callable[..., str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], who: str) -> None:
    """`--runtime-role` naming the migrating role (`--runtime-role "$PGUSER"`), a superuser or a
    member of the owner of livepush's tables, whose privileges it has: no grant or REVOKE limits
    it, so the warning says so and to name a role of its own, rather than print REVOKEs from PUBLIC
    as if they would make it least-privileged."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        owner = conn.execute("SELECT current_user").fetchone()[0]  # type: ignore[index]
        role = owner
        if who == "a member of the owner":
            role = role_of(role_url("member"))
            conn.execute(psycopg.sql.SQL("GRANT {} TO {}").format(psycopg.sql.Identifier(owner),
                                                                 psycopg.sql.Identifier(role)))
    monkeypatch.setenv("LIVEPUSH_DATABASE_URL", pg_url)
    assert cli(["migrate", "--runtime-role", role]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"warning: {role} ") and "limit nothing" in err[0] and "CREATE ROLE" in err[0], err
    assert "REVOKE" not in err[0], err


async def test_the_runtime_role_needs_nothing_from_public_to_publish_and_enqueue(
        pg_url: str, role_url: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    """On a database hardened past the documented setup, where PUBLIC may not execute functions
    either, `migrate --runtime-role` still grants the role what publish() and enqueues need."""
    url = role_url("app")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC")
    monkeypatch.setenv("LIVEPUSH_DATABASE_URL", pg_url)
    assert cli(["migrate", "--runtime-role", role_of(url)]) == 0
    database.configure(url)
    fanout = PostgresFanOut(url)
    try:
        assert await fanout.apublish("room:role", {"n": 1})
        assert (await role_jobs.work.aenqueue(1)).id
        assert (await role_jobs.work.aenqueue(1, key="role:1")).id
        assert (await role_jobs.work.aenqueue(1, key="role:2", debounce=5)).id
    finally:
        await fanout.aclose()
        await database.release_loop()
        database.configure(None)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_with_jobs_whose_runtime_cannot_start_exits_at_once_with_its_error(
    runtime_url: str, pg_url: str, livepush_env: Callable[..., dict[str, str]], procs: Processes, workers: str
) -> None:
    """A role short of a grant the runtime needs (here, to register itself) lets the server start
    but not its job runtime: the process exits 2 with one line naming what to run, and under `--workers` the first
    worker's failure is a boot failure that stops the supervisor, not a worker that served and is
    restarted again and again."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("REVOKE INSERT ON livepush_job_runtimes FROM {}").format(
            psycopg.sql.Identifier(role_of(runtime_url))))
    env = livepush_env(database_url=runtime_url)
    child = procs.livepush("serve", "--workers", workers, "--with-jobs", role_jobs.__name__, env=env,
                           wait_healthy=False)
    assert child.wait(30) == 2, child.output()
    stderr = child.stderr()
    assert "livepush_job_runtimes" in stderr and "migrate --runtime-role" in stderr, child.output()
    assert "restarting" not in stderr and "Traceback" not in stderr, child.output()
    if workers == "2":
        assert "[worker 2 " not in stderr and "before it served" in stderr, child.output()


def test_a_runtime_whose_role_may_not_beat_says_what_to_run_in_its_warning(
    runtime_url: str, pg_url: str, livepush_env: Callable[..., dict[str, str]], procs: Processes
) -> None:
    """A runtime role that lost UPDATE on the runtimes' table (a grant revoked by hand) starts, but
    each heartbeat is refused: its WARNING names the table, as the driver does, and what to run,
    `livepush migrate --runtime-role ROLE`, which the driver's words do not; the runtime runs on."""
    from tests.support.waiting import wait_for

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("REVOKE UPDATE ON livepush_job_runtimes FROM {}").format(
            psycopg.sql.Identifier(role_of(runtime_url))))
    child = procs.livepush("jobs", role_jobs.__name__, "--heartbeat", "0.3",
                           env=livepush_env(database_url=runtime_url), wait_healthy=False)
    wait_for(lambda: "heartbeat failed" in child.stderr() or not child.running, 20.0,
             message="the runtime's first heartbeat to fail")
    said = [line for line in child.stderr().splitlines() if "heartbeat failed" in line]
    assert said and "permission denied for table livepush_job_runtimes" in said[0], child.output()
    assert "livepush migrate --runtime-role ROLE" in said[0], child.output()
    assert child.running and child.stop(timeout=15) == 0, child.output()


async def test_a_runtime_role_that_may_not_prune_is_told_in_one_line_each_cycle_and_pruning_resumes_once_granted(
        runtime_url: str, pg_url: str, secret: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A runtime role that lost DELETE on the history (a grant revoked by hand) fails each prune
    cycle with one WARNING naming the table and what to run, never a traceback; the cycles go on
    (past the ten failures after which a supervised task gives up), so pruning resumes by itself
    once the grant is back, and the history does not grow for good."""
    from livepush.fanout import postgres as pg
    from livepush.server import app as server_app
    from tests.server.conftest import make_settings, start_served
    from tests.support.waiting import async_wait_for

    role = psycopg.sql.Identifier(role_of(runtime_url))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("REVOKE DELETE ON livepush_messages FROM {}").format(role))
        conn.execute("INSERT INTO livepush_messages (topic, seq, data, created_at) "
                     "SELECT 'old', g, '{}', now() - interval '1 hour' FROM generate_series(1, 10) g")
    monkeypatch.setattr(server_app, "PRUNE_EVERY_SECONDS", 0.05)
    calls = 0
    real_prune = pg.PostgresFanOut.prune

    async def counted_prune(self: pg.PostgresFanOut) -> int:
        nonlocal calls
        calls += 1
        return await real_prune(self)

    monkeypatch.setattr(pg.PostgresFanOut, "prune", counted_prune)

    async def expired_left() -> int:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            row = await (await conn.execute("SELECT count(*) FROM livepush_messages WHERE topic = 'old'")).fetchone()
        assert row is not None
        return int(row[0])

    served = await start_served(make_settings("postgres", secret, runtime_url, None))
    try:
        await async_wait_for(lambda: calls >= 15, 30, 0.05, message="prune cycles to go on failing past ten")
        assert await expired_left() == 10
        failed = [r for r in caplog.records if r.levelname in ("WARNING", "ERROR") and "prun" in r.getMessage()]
        assert failed and all(r.levelname == "WARNING" and r.exc_info is None for r in failed), \
            [(r.levelname, r.getMessage()) for r in failed]
        said = failed[0].getMessage()
        assert "permission denied for table livepush_messages" in said and "--runtime-role" in said, said
        assert "\n" not in said, said
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute(psycopg.sql.SQL("GRANT DELETE ON livepush_messages TO {}").format(role))

        async def none_left() -> bool:
            return await expired_left() == 0

        await async_wait_for(none_left, 30, 0.1, message="pruning to resume once DELETE is granted")
    finally:
        await served.stop()


async def readyz_naming_refusal(port: int, table: str) -> str:
    """The `canary` check's detail of the server on `port` once it names a privilege refused on
    `table`; /readyz answers 503 all along."""
    from tests.server.test_server import http_get
    from tests.support.waiting import async_wait_for

    async def refused_in_readyz() -> str | None:
        status, body = await http_get(port, "/readyz")
        assert status == 503, body
        detail = str(json.loads(body)["checks"]["canary"].get("detail", ""))
        return detail if f"permission denied for table {table}" in detail else None

    return await async_wait_for(refused_in_readyz, 20, 0.2, message=f"/readyz to name the refused privilege on {table}")


async def test_a_server_whose_role_may_not_publish_its_readiness_canary_says_why_it_is_not_ready(
        runtime_url: str, pg_url: str, secret: str, caplog: pytest.LogCaptureFixture) -> None:
    """A runtime role that lost UPDATE on the topics (a grant revoked by hand) cannot publish the
    server's readiness canary: /readyz stays 503, and both its body and one WARNING name the refused
    privilege and what to run, rather than only "no canary came back", which sends the operator
    to the network and the listener."""
    from tests.server.conftest import make_settings, start_served

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("REVOKE UPDATE ON livepush_topics FROM {}").format(
            psycopg.sql.Identifier(role_of(runtime_url))))
    served = await start_served(make_settings("postgres", secret, runtime_url, None))
    try:
        detail = await readyz_naming_refusal(served.server.port, "livepush_topics")
        assert "--runtime-role" in detail, detail
        said = [r.getMessage() for r in caplog.records
                if r.levelname == "WARNING" and "permission denied for table livepush_topics" in r.getMessage()]
        assert len(said) == 1 and "canary" in said[0] and "--runtime-role" in said[0], said
    finally:
        await served.stop()


async def test_a_server_whose_role_may_not_read_the_message_log_is_not_ready_until_granted(
        runtime_url: str, pg_url: str, secret: str) -> None:
    """A runtime role that lost SELECT on the messages (a grant revoked by hand) publishes and hears
    the readiness canary, but can serve no history, nor, on Postgres, any live message (a doorbell
    is read from the log): /readyz stays 503, its body naming the table, the privilege and what to
    run, and turns 200 once the grant is back."""
    from tests.server.conftest import make_settings, start_served
    from tests.server.test_server import http_get
    from tests.support.waiting import async_wait_for

    role = psycopg.sql.Identifier(role_of(runtime_url))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("REVOKE SELECT ON livepush_messages FROM {}").format(role))
    served = await start_served(make_settings("postgres", secret, runtime_url, None))
    try:
        detail = await readyz_naming_refusal(served.server.port, "livepush_messages")
        assert "SELECT" in detail and "--runtime-role" in detail, detail
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("GRANT SELECT ON livepush_messages TO {}").format(role))

        async def ready() -> bool:
            return (await http_get(served.server.port, "/readyz"))[0] == 200

        await async_wait_for(ready, 20, 0.2, message="/readyz to turn 200 once SELECT is granted")
    finally:
        await served.stop()


def test_a_publish_refused_for_want_of_connection_slots_says_the_server_is_up_and_full(
        runtime_url: str, pg_url: str) -> None:
    """Postgres that refuses a connection because its slots are taken (max_connections, or the
    role's CONNECTION LIMIT) is up: the error says it is full and what to raise, still as an
    outage to retry (DependencyError), never "check the URL and that the server is running"."""
    from livepush.errors import DependencyError

    role = psycopg.sql.Identifier(role_of(runtime_url))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("ALTER ROLE {} CONNECTION LIMIT 0").format(role))
    fanout = PostgresFanOut(runtime_url)
    try:
        with pytest.raises(DependencyError) as raised:
            fanout.publish("room:full", {"n": 1})
    finally:
        fanout.close()
    said = str(raised.value)
    assert "too many connections for role" in said and "is up" in said, said
    assert "max_connections" in said and "CONNECTION LIMIT" in said, said
    assert "cannot reach" not in said and "that the server is running" not in said, said
