"""`livepush migrate` refuses a schema it did not make, file for file: before 1.0 migrations are
rewritten in place, so a database made by an earlier build is refused, not half-migrated."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest

from livepush import migrate
from livepush.errors import ConfigError, SchemaBusyError, SchemaError
from tests.jobs.conftest import q
from tests.support import services
from tests.support.waiting import wait_for


def acheck_schema(url: str) -> None:
    """The schema check of async starts (a job runtime's, an app's), called as the sync one is."""
    asyncio.run(migrate.acheck_schema(url))


def test_a_migrated_database_is_accepted_again(pg_url: str) -> None:
    """Migrating twice applies nothing the second time, and the schema check passes."""
    assert migrate.migrate(pg_url) == []
    migrate.check_schema(pg_url)
    acheck_schema(pg_url)


def test_a_migration_recorded_from_another_file_is_refused(pg_url: str) -> None:
    """A database whose migration 0003 came from another version of that file is refused, by
    migrate and by the check every command runs, with what to do."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE livepush_schema SET checksum = 'from an earlier build' WHERE version = 3")
    for call in (migrate.migrate, migrate.check_schema, acheck_schema):
        with pytest.raises(SchemaError, match="0003_jobs differs .* not migrated in place; use a new database"):
            call(pg_url)


# What "drop livepush's ..." may name, and how a reader drops each kind of object named livepush_*.
_DROPS = {
    "tables": "SELECT format('DROP TABLE IF EXISTS %I CASCADE', tablename) FROM pg_tables "
              "WHERE schemaname = current_schema() AND tablename LIKE 'livepush\\_%'",
    "functions": "SELECT format('DROP FUNCTION IF EXISTS %s CASCADE', p.oid::regprocedure) FROM pg_proc p "
                 "JOIN pg_namespace n ON n.oid = p.pronamespace "
                 "WHERE n.nspname = current_schema() AND p.proname LIKE 'livepush\\_%'",
}


def test_dropping_what_the_refusal_names_lets_migrate_start_afresh(pg_url: str) -> None:
    """Doing what the refusal of an earlier build's schema says (drop the kinds of livepush_* objects
    it names) leaves a database `livepush migrate` migrates from scratch."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE livepush_schema SET checksum = 'from an earlier build' WHERE version = 3")
    with pytest.raises(SchemaError) as refused:
        migrate.migrate(pg_url)
    said = re.search(r"drop livepush's (.+?) \(livepush_\*\)", str(refused.value))
    assert said, refused.value
    kinds = re.split(r", | and ", said.group(1))
    assert set(kinds) <= set(_DROPS), kinds
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for kind in kinds:
            for (statement,) in conn.execute(_DROPS[kind]).fetchall():
                conn.execute(statement)
    assert [m.version for m in migrate.migrate(pg_url)] == [m.version for m in migrate.bundled()]
    migrate.check_schema(pg_url)


@pytest.mark.parametrize("left", ["functions", "tables"])
def test_livepush_objects_left_without_their_record_are_refused_with_what_to_drop(pg_url: str, procs, livepush_env,
                                                                                 left: str) -> None:
    """A database that still holds some of livepush's objects but no record of them (only the
    tables were dropped, or only the functions) exits 2 naming what is left and what to drop,
    not 1 as if Postgres were down; doing what it says lets migrate start afresh."""
    dropped = {"functions": "tables", "tables": "functions"}[left]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for (statement,) in conn.execute(_DROPS[dropped]).fetchall():
            conn.execute(statement)
        conn.execute("DROP TABLE IF EXISTS livepush_schema")
    child = procs.livepush("migrate", env=livepush_env(database_url=pg_url))
    assert child.wait(30) == 2, child.output()
    err = child.stderr()
    assert "already exists" in err and "drop livepush's tables and functions (livepush_*)" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for kind in ("tables", "functions"):
            for (statement,) in conn.execute(_DROPS[kind]).fetchall():
                conn.execute(statement)
    assert [m.version for m in migrate.migrate(pg_url)] == [m.version for m in migrate.bundled()]


def test_migrations_recorded_without_checksums_are_refused(pg_url: str) -> None:
    """A schema recorded by a livepush that kept no checksums is refused, not migrated further."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE livepush_schema DROP COLUMN checksum")
    for call in (migrate.migrate, migrate.check_schema, acheck_schema):
        with pytest.raises(SchemaError, match="recorded without checksums.*not migrated in place"):
            call(pg_url)


def _as_migrated_by_a_newer_livepush(url: str) -> int:
    """Record one migration past this version's, as the next release's `livepush migrate` would."""
    newer = migrate.required_version() + 1
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE livepush_next_release (id bigint)")
        conn.execute("INSERT INTO livepush_schema (version, name, checksum) VALUES (%s, 'next_release', %s)",
                     (newer, "0" * 64))
    return newer


def test_code_older_than_the_schema_starts_as_the_upgrade_order_needs(pg_url: str, procs, livepush_env) -> None:
    """Upgrades migrate first, and the old code keeps running on the newer schema until it is
    replaced: an old server, runtime or `livepush migrate` that (re)starts meanwhile (a crash, a
    worker restarted, a rolled-back deploy) works as before, and is never told to drop its tables."""
    _as_migrated_by_a_newer_livepush(pg_url)
    migrate.check_schema(pg_url)
    assert migrate.migrate(pg_url) == []
    env = livepush_env(database_url=pg_url)
    server = procs.livepush("serve", env=env)
    runtime = procs.livepush("jobs", "tests.jobs.sample_jobs", env=env)
    wait_for(lambda: "running: queues" in runtime.stderr() or not runtime.running, 20,
             message="the job runtime to start")
    for child in (server, runtime):
        child.signal()
        assert child.wait(20) == 0, child.output()
        assert "drop livepush's tables" not in child.stderr(), child.output()


def test_a_newer_schema_that_differs_in_a_known_migration_is_still_refused(pg_url: str) -> None:
    """Tolerating a newer release's migrations does not tolerate a rewritten one of ours."""
    _as_migrated_by_a_newer_livepush(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE livepush_schema SET checksum = 'from an earlier build' WHERE version = 3")
    with pytest.raises(SchemaError, match="0003_jobs differs"):
        migrate.check_schema(pg_url)


def test_migrate_on_a_schema_a_newer_livepush_made_reports_the_database_version(pg_url: str, procs,
                                                                                livepush_env) -> None:
    """`livepush migrate` run by older code after an upgrade migrated says the database is at the
    newer version, not at the version this code ships, and exits 0 having done nothing."""
    newer = _as_migrated_by_a_newer_livepush(pg_url)
    child = procs.livepush("migrate", env=livepush_env(database_url=pg_url))
    assert child.wait(30) == 0, child.output()
    assert child.stdout().strip() == (f"schema at version {newer}, newer than this livepush's "
                                      f"{migrate.required_version()} (nothing to do)"), child.output()


@pytest.mark.parametrize("role", ["", " "])
def test_migrate_with_an_empty_runtime_role_exits_2_naming_the_flag(pg_url: str, procs, livepush_env,
                                                                    role: str) -> None:
    """`livepush migrate --runtime-role "$ROLE"` with the variable unset exits 2 saying the flag is
    empty, not that a role named '' does not exist."""
    child = procs.livepush("migrate", "--runtime-role", role, env=livepush_env(database_url=pg_url))
    assert child.wait(30) == 2, child.output()
    err = child.stderr()
    assert "--runtime-role is empty" in err and "Traceback" not in err, err


def test_migrate_with_a_runtime_role_that_is_not_text_exits_2_naming_the_flag(pg_url: str, procs,
                                                                              livepush_env) -> None:
    """`--runtime-role` holding bytes that are not UTF-8 (a role name read from a file in another
    encoding) exits 2 with one line naming the flag, not with the driver's UnicodeEncodeError
    traceback and exit 1, as if the database were down."""
    child = procs.livepush("migrate", "--runtime-role", "r\udcffle", env=livepush_env(database_url=pg_url))
    assert child.wait(30) == 2, child.output()
    err = child.stderr()
    assert "--runtime-role" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_second_migrate_waits_for_the_first_whatever_lock_timeout_and_statement_timeout_say(
        pg_admin_url: str) -> None:
    """With a lock_timeout and a statement_timeout on the database (a role's or a database's
    settings, common for migrating roles), a migrate that meets another one under way waits for it
    rather than failing with "canceling statement due to lock timeout", and then migrates."""
    name = f"t_migrate_wait_{uuid.uuid4().hex[:12]}"
    url = services.create_database(pg_admin_url, name)
    try:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {name} SET lock_timeout = '50ms'")  # type: ignore[arg-type]
            admin.execute(f"ALTER DATABASE {name} SET statement_timeout = '100ms'")  # type: ignore[arg-type]
        done: list[object] = []
        with psycopg.connect(url) as holder:  # another migrate, under way
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (migrate.MIGRATION_LOCK_KEY,))
            second = threading.Thread(target=lambda: done.append(_outcome(lambda: migrate.migrate(url))))
            second.start()
            # It has waited for the lock past both timeouts, and waits on.
            wait_for(lambda: q(url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                    "AND wait_event_type = 'Lock' AND now() - query_start > interval '500 ms'")[0][0],
                     10, message="the second migrate to wait for the lock past the timeouts")
            assert not done, done
        second.join(30)
        assert not second.is_alive()
        applied = done[0]
        assert isinstance(applied, list) and [m.version for m in applied] == [m.version for m in migrate.bundled()], applied
    finally:
        services.drop_database(pg_admin_url, name)


def _outcome(call: Callable[[], object]) -> object:
    """What `call` returned, or the exception it raised."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 -- handed to the test thread
        return exc


def test_a_search_path_that_misses_the_migrated_schema_is_named_instead_of_run_migrate(pg_admin_url: str) -> None:
    """A server or runtime whose role's search_path does not reach the schema `migrate` put
    livepush's tables in is told which schema holds them and how to reach it, not "schema at
    version 0: run livepush migrate", which the owner runs to be told there is nothing to do."""
    with services.pg_migrated_into_schema_app(pg_admin_url) as (url, in_app):
        migrate.check_schema(in_app)
        for call in (migrate.check_schema, acheck_schema):
            with pytest.raises(SchemaError) as refused:
                call(url)
            said = str(refused.value)
            assert 'in schema "app"' in said and "search_path" in said and "version 0" not in said, said
            assert "search_path = app" in said or "search_path%3Dapp" in said, said


def test_a_role_without_usage_on_the_migrated_schema_is_told_to_run_migrate_runtime_role(
        pg_admin_url: str) -> None:
    """A role whose search_path names the schema but that was never granted its use (migrate ran
    without --runtime-role) is told to grant it, not to run a migrate that has nothing to do."""
    with services.pg_migrated_into_schema_app(pg_admin_url) as (url, in_app):
        role = f"r_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(in_app, autocommit=True) as admin:
            admin.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN").format(psycopg.sql.Identifier(role)))
        try:
            as_role = psycopg.conninfo.make_conninfo(in_app, user=role)
            for call in (migrate.check_schema, acheck_schema):
                with pytest.raises(ConfigError, match=r'in schema "app", on which role .* lacks USAGE: run `livepush migrate --runtime-role'):
                    call(as_role)
        finally:
            with psycopg.connect(in_app, autocommit=True) as admin:
                admin.execute(psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(role)))


def test_migrate_makes_no_second_schema_beside_one_its_search_path_misses(pg_admin_url: str, procs,
                                                                          livepush_env) -> None:
    """`livepush migrate` run with a search_path that misses the schema livepush is in (as another
    role than the owner, or without the owner's URL options) exits 2 naming that schema, rather
    than make a second copy where it looks: processes on the two copies would share the
    notification channels but not the messages or the jobs."""
    with services.pg_migrated_into_schema_app(pg_admin_url) as (url, _):
        child = procs.livepush("migrate", env=livepush_env(database_url=url))
        assert child.wait(30) == 2, child.output()
        err = child.stderr()
        assert 'in schema "app"' in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert q(url, "SELECT to_regclass('public.livepush_schema')")[0][0] is None


def test_a_migrate_interrupted_by_ctrl_c_exits_non_zero_having_migrated_nothing(pg_admin_url: str, procs,
                                                                                 livepush_env) -> None:
    """Ctrl-C (or `timeout -s INT`) on a migrate that waits for another one stops it with exit 130,
    as the shell reports a command stopped by SIGINT, and one line saying so: a deploy script that
    runs `livepush migrate && restart` must not go on as if the schema were migrated."""
    name = f"t_migrate_int_{uuid.uuid4().hex[:12]}"
    url = services.create_database(pg_admin_url, name)
    try:
        with psycopg.connect(url) as holder:  # another migrate, under way
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (migrate.MIGRATION_LOCK_KEY,))
            child = procs.livepush("migrate", env=livepush_env(database_url=url))
            wait_for(lambda: q(url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                    "AND wait_event_type = 'Lock' AND query LIKE '%%pg_advisory_xact_lock%%' "
                                    "AND pid <> %s", (holder.info.backend_pid,))[0][0],
                     20, message="the migrate to wait for the lock")
            child.interrupt()
            assert child.wait(20) == 130, child.output()
            holder.rollback()
        err = child.stderr()
        assert "interrupted" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert child.stdout() == "", child.output()
        assert q(url, "SELECT to_regclass('livepush_schema')")[0][0] is None
    finally:
        services.drop_database(pg_admin_url, name)


def test_an_upgrade_adds_its_objects_beside_the_others_when_an_earlier_schema_of_the_path_appeared(
        pg_url: str) -> None:
    """A schema named after the migrating role, made after the first migrate (for another app,
    say), comes first in the default search_path ("$user", public): the next migrate still adds
    its tables where livepush's others are, not apart in that schema, where a runtime role whose
    own "$user" is another found none of them and was told to run a migrate with nothing to do."""
    newest = migrate.bundled()[-1]
    tables = re.findall(r"^CREATE TABLE (livepush_\w+)", newest.sql, re.MULTILINE)
    assert tables, newest.name
    with psycopg.connect(pg_url, autocommit=True) as conn:  # as before the release that adds `newest`
        for table in tables:
            conn.execute(psycopg.sql.SQL("DROP TABLE {}").format(psycopg.sql.Identifier(table)))
        conn.execute("DELETE FROM livepush_schema WHERE version = %s", (newest.version,))
        conn.execute("CREATE SCHEMA AUTHORIZATION CURRENT_USER")
    assert [m.version for m in migrate.migrate(pg_url)] == [newest.version]
    for table in tables:
        assert q(pg_url, "SELECT relnamespace::regnamespace::text FROM pg_class WHERE relname = %s",
                 (table,)) == [("public",)], table


# The first migration after the jobs' table that builds on it (an index on livepush_jobs, whose
# ShareLock waits for every transaction that wrote the table): an upgrade to it meets the app.
_UPGRADE = next(m for m in migrate.bundled() if m.version > 3 and re.search(r"\bON livepush_jobs\b", m.sql))


@contextlib.contextmanager
def _before_upgrade(pg_admin_url: str) -> Iterator[tuple[str, psycopg.Connection]]:
    """A database migrated up to the migration before _UPGRADE, and an application's transaction
    that wrote livepush_jobs and stays open (idle in transaction): (its URL, that transaction)."""
    name = f"t_migrate_lock_{uuid.uuid4().hex[:12]}"
    url = services.create_database(pg_admin_url, name)
    try:
        older = [m for m in migrate.bundled() if m.version < _UPGRADE.version]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(migrate, "bundled", lambda: older)
            migrate.migrate(url)
        with psycopg.connect(url, application_name="app-holding-jobs") as holder:
            holder.execute("DELETE FROM livepush_jobs WHERE id = -1")
            yield url, holder
    finally:
        services.drop_database(pg_admin_url, name)


def test_a_migrate_behind_a_long_transaction_gives_up_naming_it_rather_than_queue_every_statement(
        pg_admin_url: str) -> None:
    """A DDL waiting for a lock holds up every statement of the application on that table behind
    it. So migrate waits for its locks a bounded time (here 0.2 s), tries again a few times with
    a pause between, rolls everything back, and then fails with SchemaBusyError naming the session
    that holds the lock (pid, application, state) and how to wait longer."""
    with _before_upgrade(pg_admin_url) as (url, holder):
        notices: list[str] = []
        with pytest.raises(SchemaBusyError) as blocked:
            migrate.migrate(url, lock_timeout=0.2, on_retry=notices.append)
        said = str(blocked.value)
        pid = holder.info.backend_pid
        for part in (f"pid {pid}", "app-holding-jobs", "idle in transaction", "livepush_jobs",
                     f"{_UPGRADE.version:04d}_{_UPGRADE.name}", "--lock-timeout", "LIVEPUSH_MIGRATE_LOCK_TIMEOUT"):
            assert part in said, (part, said)
        assert len(notices) == migrate.LOCK_RETRIES and all(f"pid {pid}" in n for n in notices), notices
        holder.rollback()
        # Nothing of the upgrade stayed: each try is one transaction, rolled back whole.
        assert migrate.schema_version(url) == _UPGRADE.version - 1


def test_a_migrate_whose_blocker_ends_between_two_tries_migrates(pg_admin_url: str) -> None:
    """The long transaction ends after the first try gave up: the next one migrates."""
    with _before_upgrade(pg_admin_url) as (url, holder):
        notices: list[str] = []

        def on_retry(line: str) -> None:
            notices.append(line)
            holder.rollback()

        applied = migrate.migrate(url, lock_timeout=0.2, on_retry=on_retry)
        assert [m.version for m in applied] == [m.version for m in migrate.bundled() if m.version >= _UPGRADE.version]
        assert len(notices) == 1 and f"pid {holder.info.backend_pid}" in notices[0], notices


def test_livepush_migrate_behind_a_long_transaction_exits_75_naming_it(pg_admin_url: str, procs,
                                                                      livepush_env) -> None:
    """`livepush migrate --lock-timeout S` behind a transaction that does not end: a line for each
    try that waited, then exit 75 (try again) with one line naming the blocker; nothing migrated."""
    with _before_upgrade(pg_admin_url) as (url, holder):
        child = procs.livepush("migrate", "--lock-timeout", "0.2", env=livepush_env(database_url=url))
        assert child.wait(60) == 75, child.output()
        lines = child.stderr().strip().splitlines()
        assert "Traceback" not in child.stderr() and len(lines) == migrate.LOCK_RETRIES + 1, child.output()
        assert f"pid {holder.info.backend_pid}" in lines[-1] and "--lock-timeout" in lines[-1], lines
        assert child.stdout() == "", child.output()
        holder.rollback()
        assert migrate.schema_version(url) == _UPGRADE.version - 1


def test_the_migrations_lock_timeout_is_the_roles_own_when_one_is_set(pg_admin_url: str, procs,
                                                                     livepush_env) -> None:
    """Without --lock-timeout or LIVEPUSH_MIGRATE_LOCK_TIMEOUT a lock_timeout the database or the
    role sets is kept (its DBA chose it); a setting given replaces it, 0 waiting as long as it takes."""
    with _before_upgrade(pg_admin_url) as (url, holder):
        name = services.dbname_of(url)
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {name} SET lock_timeout = '100ms'")  # type: ignore[arg-type]
        with pytest.raises(SchemaBusyError, match="waited 0.1 s for a lock"):
            migrate.migrate(url)
        child = procs.livepush("migrate", env=livepush_env(database_url=url, migrate_lock_timeout="0"))
        wait_for(lambda: q(url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                "AND wait_event_type = 'Lock' AND now() - query_start > interval '500 ms'")[0][0],
                 20, message="the migrate to wait past the database's lock_timeout")
        holder.rollback()
        assert child.wait(30) == 0, child.output()
        assert migrate.schema_version(url) == migrate.required_version()


def test_the_runtime_roles_warnings_look_where_livepush_is_when_an_earlier_schema_of_the_path_appeared(
        pg_url: str) -> None:
    """A schema named after the migrating role, made after the first migrate, comes first in its
    search_path ("$user", public). What `migrate --runtime-role` then says of the role looks at the
    schema livepush's tables are in, as the grants do: a member of their owner is told that the
    grants limit nothing, not that it may create objects in the schema that appeared."""
    role = f"r_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        owner = conn.execute("SELECT current_user").fetchone()[0]  # type: ignore[index]
        conn.execute("CREATE SCHEMA AUTHORIZATION CURRENT_USER")
        conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER").format(psycopg.sql.Identifier(role)))
        conn.execute(psycopg.sql.SQL("GRANT {} TO {}").format(psycopg.sql.Identifier(owner),
                                                                psycopg.sql.Identifier(role)))
    try:
        said = migrate.runtime_leftovers(pg_url, role)
        assert len(said) == 1 and "the grants limit nothing" in said[0], said
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(role)))


@contextlib.contextmanager
def _deadlocking(url: str, holder: psycopg.Connection) -> Iterator[tuple[Callable[[], None], Callable[[], None]]]:
    """(provoke, end). provoke(): the application's transaction `holder` (which wrote livepush_jobs) waits, in a
    thread, for a lock the migration holds once the migration waits for its table: a deadlock,
    which Postgres finds on the migration's side (deadlock_timeout 500 ms there, which the
    thread's wait must begin within; 20 s for `holder`). Called again, first ends the previous one: its transaction rolled back, the table
    written again. end(): the application's transaction rolled back, once the thread is done."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {services.dbname_of(url)} SET deadlock_timeout = '500ms'")  # type: ignore[arg-type]
    threads: list[threading.Thread] = []

    def app_waits_for_the_migration() -> None:
        with psycopg.connect(url, autocommit=True) as watcher:  # one connection: polled every 20 ms
            wait_for(lambda: watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                             "AND wait_event_type = 'Lock' AND wait_event = 'relation'").fetchone()[0],
                     20, message="the migration to wait for livepush_jobs")
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (migrate.MIGRATION_LOCK_KEY,))

    def end() -> None:
        for thread in threads:
            thread.join(20)
            assert not thread.is_alive()
        threads.clear()
        holder.rollback()

    def provoke() -> None:
        if threads:
            end()
        holder.execute("SET deadlock_timeout = '20s'")
        holder.execute("DELETE FROM livepush_jobs WHERE id = -1")
        thread = threading.Thread(target=app_waits_for_the_migration, daemon=True)
        threads.append(thread)
        thread.start()

    try:
        yield provoke, end
    finally:
        end()


def test_a_migrate_that_meets_a_deadlock_with_the_application_tries_again(pg_admin_url: str) -> None:
    """A deadlock between a migration and the application (Postgres rolls one of them back) is
    treated as a lock wait that ended: rolled back, said in a line naming the other session, and
    tried again; here the application's transaction ends meanwhile and the next try migrates."""
    with _before_upgrade(pg_admin_url) as (url, holder), _deadlocking(url, holder) as (provoke, end):
        pid = holder.info.backend_pid
        notices: list[str] = []
        provoke()
        applied = migrate.migrate(url, lock_timeout=1, on_retry=lambda line: (notices.append(line), end()))
        assert [m.version for m in applied] == [m.version for m in migrate.bundled() if m.version >= _UPGRADE.version]
        assert len(notices) == 1 and "deadlock" in notices[0] and f"pid {pid}" in notices[0], notices


def test_a_migrate_that_meets_a_deadlock_on_every_try_gives_up_as_behind_a_lock(pg_admin_url: str) -> None:
    """Deadlocks on every try count against the same bounded tries as lock waits, then
    SchemaBusyError (exit 75: try again) naming the application's session; nothing migrated."""
    with _before_upgrade(pg_admin_url) as (url, holder), _deadlocking(url, holder) as (provoke, _):
        pid = holder.info.backend_pid
        notices: list[str] = []
        provoke()
        with pytest.raises(SchemaBusyError) as blocked:
            migrate.migrate(url, lock_timeout=1, on_retry=lambda line: (notices.append(line), provoke()))
        said = str(blocked.value)
        assert "deadlock" in said and f"pid {pid}" in said and "app-holding-jobs" in said, said
        assert len(notices) == migrate.LOCK_RETRIES and all("deadlock" in n for n in notices), notices
        assert migrate.schema_version(url) == _UPGRADE.version - 1


def test_a_migrate_behind_a_prepared_transaction_names_it_and_how_to_end_it(pg_admin_url: str) -> None:
    """A prepared (two-phase) transaction holding the table's lock has no session, so no pid to
    name: migrate names it by its gid, owner and prepared time, and says how to end it."""
    with _before_upgrade(pg_admin_url) as (url, holder):
        if int(q(url, "SHOW max_prepared_transactions")[0][0]) == 0:
            pytest.skip("this Postgres sets max_prepared_transactions = 0 (bin/test's sets it)")
        gid = "app's-2pc-1"
        holder.execute(psycopg.sql.SQL("PREPARE TRANSACTION {}").format(psycopg.sql.Literal(gid)))
        try:
            with pytest.raises(SchemaBusyError) as blocked:
                migrate.migrate(url, lock_timeout=0.2)
            said = str(blocked.value)
            for part in ("prepared transaction 'app''s-2pc-1'", "role postgres", "prepared at", "livepush_jobs",
                         "COMMIT PREPARED 'app''s-2pc-1'", "ROLLBACK PREPARED 'app''s-2pc-1'"):
                assert part in said, (part, said)
            assert "has ended since" not in said, said
        finally:
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(psycopg.sql.SQL("ROLLBACK PREPARED {}").format(psycopg.sql.Literal(gid)))
        assert migrate.schema_version(url) == _UPGRADE.version - 1


def test_the_demo_on_your_database_migrates_as_livepush_migrate_does(pg_admin_url: str, procs,
                                                                     livepush_env) -> None:
    """The demo migrates through migrate's own path: LIVEPUSH_MIGRATE_LOCK_TIMEOUT holds for it, each
    try that waited is said on stderr naming the blocker, and behind a transaction that does not
    end it exits 75 as `livepush migrate` does, rather than sit silent and then stop."""
    with _before_upgrade(pg_admin_url) as (url, holder):
        child = procs.livepush("demo", env=livepush_env(database_url=url, migrate_lock_timeout="0.2"))
        assert child.wait(60) == 75, child.output()
        pid = f"pid {holder.info.backend_pid}"
        tries = [line for line in child.stderr().splitlines() if "trying again" in line]
        assert len(tries) == migrate.LOCK_RETRIES and all(pid in line for line in tries), child.output()
        assert pid in child.stderr().strip().splitlines()[-1], child.output()
        assert "Traceback" not in child.stderr(), child.output()
        holder.rollback()
        assert migrate.schema_version(url) == _UPGRADE.version - 1
