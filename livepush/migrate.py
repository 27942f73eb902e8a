"""Schema migrations: numbered files in `sql/`, applied in order, once; and the grants of a
runtime role that needs no more than `serve`, `jobs`, `publish()` and enqueues do.

`migrate()` holds a transaction-level advisory lock for the whole run, so two `livepush
migrate` at once serialize: the second waits, whatever lock_timeout or statement_timeout the
role has, then finds nothing left to do. Each file runs
in the same transaction as the row that records it, so a failed file leaves no trace.

Its DDL waits for a table's lock a bounded time (`lock_timeout`): while a DDL waits behind a long
transaction, every statement of the application on that table queues behind the DDL. Past it the
whole run is rolled back and tried again a few times, then given up naming what held the lock; a
deadlock with the application, which Postgres ends by rolling one side back, is treated alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from .config import Settings
from .errors import ConfigError, LivepushError, SchemaBusyError, SchemaError, first_line
from .postgres.connect import aconnect, connect, translated
from .postgres.urls import redact

# An arbitrary constant: any process migrating livepush's schema takes this lock.
MIGRATION_LOCK_KEY = 0x6C697665_70757368 & 0x7FFFFFFFFFFFFFFF  # "livepush"

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

# name: runtime_objects -- livepush's tables and sequences in the current schema, whoever owns
# them: a runtime role may read and write their rows (and use their sequences), nothing more (no
# DDL, no TRUNCATE, no ownership). The schema table only to check the version.
_RUNTIME_OBJECTS = """
SELECT c.relname, c.relkind FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'u', 'S')
  AND c.relname LIKE 'livepush\\_%' AND c.relname <> 'livepush_schema'
ORDER BY c.relname
"""


# name: runtime_functions -- livepush's functions in the current schema that the runtime calls,
# as signatures Postgres quotes itself (regprocedure), for GRANT EXECUTE: PUBLIC may execute new
# functions by default, but a database hardened past that (REVOKE EXECUTE ... FROM PUBLIC, or
# default privileges without it) left the runtime role unable to publish or enqueue. Trigger
# functions are left out: a trigger fires whoever may execute its function.
_RUNTIME_FUNCTIONS = """
SELECT p.oid::regprocedure::text FROM pg_proc p
WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'livepush\\_%'
  AND p.prorettype <> 'trigger'::regtype
ORDER BY 1
"""


# name: runtime_missing -- what the runtime role still lacks after the grants, by name: a plain
# read of the catalog, in the migration's transaction (its own grants are visible to it).
_RUNTIME_MISSING = """
SELECT c.relname::text FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'u', 'S')
  AND c.relname LIKE 'livepush\\_%%' AND NOT CASE
      WHEN c.relkind = 'S' THEN has_sequence_privilege(%(role)s, c.oid, 'USAGE')
      WHEN c.relname = 'livepush_schema' THEN has_table_privilege(%(role)s, c.oid, 'SELECT')
      ELSE has_table_privilege(%(role)s, c.oid, 'SELECT') AND has_table_privilege(%(role)s, c.oid, 'INSERT')
           AND has_table_privilege(%(role)s, c.oid, 'UPDATE') AND has_table_privilege(%(role)s, c.oid, 'DELETE')
  END
UNION ALL
SELECT p.oid::regprocedure::text FROM pg_proc p
WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'livepush\\_%%'
  AND p.prorettype <> 'trigger'::regtype AND NOT has_function_privilege(%(role)s, p.oid, 'EXECUTE')
UNION ALL
SELECT 'schema ' || current_schema() WHERE NOT has_schema_privilege(%(role)s, current_schema(), 'USAGE')
UNION ALL
SELECT 'database ' || current_database() WHERE NOT has_database_privilege(%(role)s, current_database(), 'CONNECT')
ORDER BY 1
"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        """What the database records of the file it ran: before 1.0 files are rewritten in place,
        so a name alone does not say which schema a database has."""
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def bundled() -> list[Migration]:
    """The migrations shipped with this package, in version order."""
    found = []
    for entry in resources.files("livepush").joinpath("sql").iterdir():
        m = _NAME.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise SchemaError(f"two migrations share a number in sql/: {versions}")
    return found


def required_version() -> int:
    migrations = bundled()
    return migrations[-1].version if migrations else 0


# name: wait_untimed -- for this transaction only, until timeouts_back: no lock_timeout nor
# statement_timeout, so that the wait for another migrate's advisory lock (for as long as it
# migrates) is not cut short by the timeouts a migrating role often has.
_WAIT_UNTIMED = "SELECT set_config('lock_timeout', '0', true), set_config('statement_timeout', '0', true)"
# name: migration_lock -- the advisory lock every migrate takes, held to the transaction's end.
_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(%s)"
# name: statement_timeout_back -- the session's own statement_timeout again (the role's, the
# database's or the URL's), for the migrations' statements.
_STATEMENT_TIMEOUT_BACK = ("SELECT set_config(name, reset_val, true) FROM pg_settings "
                           "WHERE name = 'statement_timeout'")
# name: own_lock_timeout -- the session's own lock_timeout (the role's, the database's or the
# URL's), in milliseconds (the setting's unit); 0 when none is set. A plain read.
_OWN_LOCK_TIMEOUT = "SELECT reset_val::bigint FROM pg_settings WHERE name = 'lock_timeout'"
# name: ddl_lock_timeout -- for this transaction only, how long a migration's statement waits for
# a table's lock: while it waits, every statement of the application on that table waits behind it.
_DDL_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %(ms)s, true)"
# name: lock_holders -- after a statement gave up waiting for a lock: the sessions holding a lock on
# one of livepush's tables since before that wait began (it lasted `seconds`), oldest transaction
# first, with the tables. The likely blockers: a lock wait's blockers can no longer be asked for
# once it has ended. After a deadlock, the sessions `pids` that Postgres named in it instead (when
# not null). Also every prepared (two-phase) transaction holding such a lock, which has no session
# and no pid (its locks keep its virtual transaction, which its transactionid lock ties to its
# xid): named by its gid (the last column),
# its owner and when it was prepared (its start, here). A plain read of pg_locks,
# pg_stat_activity and pg_prepared_xacts (a session of another role shows no state or start to a
# role without pg_read_all_stats: kept, with those unknown).
_LOCK_HOLDERS = """
WITH held AS (
    SELECT l.pid, l.virtualtransaction, c.relname::text AS relname FROM pg_locks l
    JOIN pg_class c ON c.oid = l.relation
    WHERE l.granted AND l.pid IS DISTINCT FROM pg_backend_pid()
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND c.relname LIKE 'livepush\\_%%' AND c.relkind IN ('r', 'p')
)
SELECT a.pid, a.usename::text, a.application_name::text, a.state::text, a.xact_start,
       extract(epoch FROM clock_timestamp() - a.xact_start)::float8,
       string_agg(DISTINCT h.relname, ', ' ORDER BY h.relname), NULL::text
FROM held h JOIN pg_stat_activity a ON a.pid = h.pid
WHERE CASE WHEN %(pids)s::int[] IS NULL
           THEN a.xact_start IS NULL OR a.xact_start <= clock_timestamp() - make_interval(secs => %(seconds)s)
           ELSE a.pid = ANY(%(pids)s::int[]) END
GROUP BY a.pid, a.usename, a.application_name, a.state, a.xact_start
UNION ALL
SELECT NULL, p.owner::text, NULL, 'prepared', p.prepared, extract(epoch FROM clock_timestamp() - p.prepared)::float8,
       string_agg(DISTINCT h.relname, ', ' ORDER BY h.relname), p.gid
FROM pg_prepared_xacts p
JOIN pg_locks x ON x.locktype = 'transactionid' AND x.transactionid = p.transaction AND x.pid IS NULL
JOIN held h ON h.pid IS NULL AND h.virtualtransaction = x.virtualtransaction
WHERE %(pids)s::int[] IS NULL AND p.database = current_database()
GROUP BY p.gid, p.owner, p.prepared
ORDER BY 5 NULLS LAST, 1
LIMIT 4
"""
# name: schema_table_exists -- read under the advisory lock, so no other migrator creates it
# between this read and the CREATE below.
_SCHEMA_TABLE_EXISTS = "SELECT to_regclass('livepush_schema') IS NOT NULL"
# name: pin_schema -- for this transaction only, the search_path is the schema holding
# livepush_schema: one created since the first migrate earlier in the path (a schema named after
# the migrating role, which "$user" puts first) would get the new objects apart from the others,
# and the grants would look for them there. Read under the advisory lock, as the check above.
_PIN_SCHEMA = """
SELECT set_config('search_path', quote_ident(n.nspname), true)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass('livepush_schema')
"""
# name: schema_table -- idempotent; runs under the advisory lock.
_CREATE_SCHEMA_TABLE = """
CREATE TABLE IF NOT EXISTS livepush_schema (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
# name: schema_elsewhere -- where livepush_schema is when this session's search_path does not
# find it: each schema of the database holding one, whether this role may use it, and the
# search_path and role to name in the advice. A plain read of the catalog, which every role may read.
_SCHEMA_ELSEWHERE = """
SELECT n.nspname::text, has_schema_privilege(n.oid, 'USAGE'), current_setting('search_path'), current_user::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = 'livepush_schema' AND c.relkind IN ('r', 'p') AND n.nspname NOT LIKE 'pg\\_temp\\_%'
ORDER BY 1
"""
# name: schema_version -- a plain read of one number.
_SCHEMA_VERSION = "SELECT max(version) FROM livepush_schema"
# name: applied -- a plain read; under migrate()'s lock nobody adds rows meanwhile.
_APPLIED = "SELECT version, name, checksum FROM livepush_schema ORDER BY version"


# What applying a migration raises when an object it creates is already there.
_LEFT_OVER = (psycopg.errors.DuplicateTable, psycopg.errors.DuplicateFunction, psycopg.errors.DuplicateObject)


def _foreign(url: str, what: str) -> SchemaError:
    return SchemaError(
        f"the database at {redact(url)} has a livepush schema this version cannot use ({what}): a schema from "
        "before 1.0 is not migrated in place; use a new database, or drop livepush's tables and functions "
        "(livepush_*), and run `livepush migrate`")


def _check_lineage(url: str, applied: list[tuple[int, str, str]]) -> None:
    """Refuse a database whose schema differs from ours in a migration we ship, file for file (a
    0.1 schema, or one made by an earlier build of this version). Migrations past our newest are
    a newer livepush's: upgrades migrate first, and the code running meanwhile (restarted or
    rolled back too) keeps working on that schema (docs/operations.md, "Upgrades")."""
    ours = {m.version: m for m in bundled()}
    newest = max(ours, default=0)
    for version, name, checksum in applied:
        if version > newest:
            continue
        mine = ours.get(version)
        if mine is None or mine.name != name or mine.checksum != checksum:
            raise _foreign(url, f"migration {version:04d}_{name} differs from this version's")


def _out_of_reach(url: str, rows: Sequence[Any]) -> LivepushError | None:
    """What to say when the search path finds no livepush_schema but the database holds one
    (_SCHEMA_ELSEWHERE's rows): the schema `migrate` made it in, which this session cannot reach.
    Told "run livepush migrate", the owner would run it and be told there is nothing to do."""
    if not rows:
        return None
    schema, usable, search_path, role = rows[0]
    quoted, who = (sql.Identifier(name).as_string(None) for name in (schema, role))
    if not usable:
        return ConfigError(
            f"the database at {redact(url)} has livepush's schema in schema {quoted}, on which role {who} lacks "
            f"USAGE: run `livepush migrate --runtime-role {role}` as the schema's owner, with the owner's "
            "search_path")
    return SchemaError(
        f"the database at {redact(url)} has livepush's schema in schema {quoted}, which the search_path of role "
        f"{who} ({search_path}) does not reach: give the role that schema (ALTER ROLE {who} SET search_path = "
        f"{quoted}), or add options=-csearch_path%3D{schema} to the database URL; for `livepush migrate` too, "
        "which would otherwise make a second copy beside it")


@contextlib.contextmanager
def _may_create(url: str) -> Iterator[None]:
    """A role that may not create in the schema, said for `migrate`: the advice given for the
    runtime's statements ("run livepush migrate as the schema's owner") would send the operator
    round in a circle."""
    try:
        yield
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ConfigError(f"the role of {redact(url)} may not create livepush's tables and functions "
                          f"({first_line(exc)}): run `livepush migrate` with the credentials of the schema's "
                          "owner (or of a role that may create in it)") from None


# How long a migration's statement waits for a table's lock when neither the caller nor the
# role's own lock_timeout says (seconds), and how many times a run given up so is tried again.
DEFAULT_LOCK_TIMEOUT = 5.0
LOCK_RETRIES = 3


# In a deadlock's detail, each session of the cycle: "Process 1 waits for ...; blocked by process 2."
_DEADLOCK_PIDS = re.compile(r"blocked by process (\d+)")


class _LockWaitEnded(Exception):
    """A statement of one try gave up waiting for a lock, or Postgres ended it as one side of a
    deadlock (`deadlock`): what it was for, what held it (said)."""

    def __init__(self, doing: str, seconds: float, holders: str, *, deadlock: bool = False) -> None:
        super().__init__(doing)
        self.doing, self.seconds, self.holders, self.deadlock = doing, seconds, holders, deadlock

    @property
    def said(self) -> str:
        if self.deadlock:
            return f"was in a deadlock {self.doing}, with {self.holders}"
        return f"waited {self.seconds:g} s for a lock {self.doing}, held by {self.holders}"

    @property
    def advice(self) -> str:
        """What the operator can do once every try ended so."""
        if self.deadlock:
            return ("a transaction of the application waited for a lock migrate held while migrate waited for one of "
                    "its own, and Postgres rolled migrate back. Run migrate again once that work has ended, or pause "
                    "it meanwhile")
        # The variable first: `demo` migrates too, and has no --lock-timeout.
        return ("while a migration waits for a lock, every statement of the application on that table waits behind "
                "it. End that transaction and run migrate again, or let migrate wait longer with "
                "LIVEPUSH_MIGRATE_LOCK_TIMEOUT=S (`livepush migrate --lock-timeout S`; 0: as long as it takes)")


def migrate(url: str, runtime_role: str | None = None, *, lock_timeout: float | None = None,
            on_retry: Callable[[str], None] | None = None) -> list[Migration]:
    """Apply every bundled migration not yet applied; then, with `runtime_role`, grant that role
    what the runtime needs. Returns the migrations applied now.

    `lock_timeout`: seconds a statement waits for a table's lock (0: as long as it takes); None:
    the role's own lock_timeout when it has one, else DEFAULT_LOCK_TIMEOUT. A try that waited that
    long, or that Postgres ended in a deadlock with the application, is rolled back whole and made
    again after as long a pause, LOCK_RETRIES more times (each said to `on_retry` in a line),
    then SchemaBusyError names the sessions holding the lock."""
    tries = 0
    while True:
        tries += 1
        try:
            return _migrate_once(url, runtime_role, lock_timeout)
        except _LockWaitEnded as ended:
            if tries > LOCK_RETRIES:
                raise SchemaBusyError(f"migrate {ended.said}, {tries} times, and migrated nothing: "
                                      f"{ended.advice}") from None
            if on_retry is not None:
                on_retry(f"migrate {ended.said}; rolled back, trying again in {ended.seconds:g} s "
                         f"({tries + 1} of {LOCK_RETRIES + 1})")
            # As long as it made the application wait: the blocker may end, and what queued
            # behind the try catches up meanwhile.
            time.sleep(ended.seconds)


def migrate_configured(settings: Settings, runtime_role: str | None = None, *,
                       on_retry: Callable[[str], None] | None = None) -> list[Migration]:
    """migrate() of the settings' database, with the lock timeout they give (LIVEPUSH_MIGRATE_LOCK_TIMEOUT,
    or `--lock-timeout` put in its place): every command that migrates (`migrate`, `demo`) goes
    through here, so each waits for locks, tries again and gives up alike."""
    return migrate(settings.require_database(), runtime_role, lock_timeout=settings.migrate_lock_timeout,
                   on_retry=on_retry)


def _lock_timeout_ms(conn: psycopg.Connection, lock_timeout: float | None) -> int:
    """The migrations' lock_timeout in milliseconds (0: none), from migrate()'s `lock_timeout`."""
    if lock_timeout is not None:
        # At least a millisecond: Postgres reads a smaller value as 0, which waits for ever.
        return max(round(lock_timeout * 1000), 1) if lock_timeout > 0 else 0
    own = conn.execute(_OWN_LOCK_TIMEOUT).fetchone()
    return int(own[0]) if own is not None and int(own[0]) > 0 else round(DEFAULT_LOCK_TIMEOUT * 1000)


def _lock_holders(conn: psycopg.Connection, seconds: float, pids: list[int] | None = None) -> str:
    """The sessions _LOCK_HOLDERS finds, said for an operator (pid, role, application, state)."""
    said = []
    found = conn.execute(_LOCK_HOLDERS, {"seconds": seconds, "pids": pids}).fetchall()
    for pid, role, application, state, start, age, tables, gid in found:
        if gid is not None:
            # No session to terminate: it waits, locks held, for its transaction manager's verdict.
            quoted = sql.Literal(gid).as_string(conn)
            said.append(f"prepared transaction {quoted} (role {role}, prepared at {start:%Y-%m-%d %H:%M:%S %Z}, "
                        f"{age:.0f} s ago, on {tables}; COMMIT PREPARED {quoted} or ROLLBACK PREPARED {quoted} "
                        "ends it: ask the transaction manager that prepared it which)")
            continue
        what = f"pid {pid} (role {role}" + (f", application {application!r}" if application else "")
        what += f", {state}" if state else ""
        what += f" for {age:.0f} s" if age is not None else ""
        said.append(f"{what}, on {tables}; SELECT pg_terminate_backend({pid}) ends it)")
    return "; ".join(said) or "a transaction that has ended since"


def _migrate_once(url: str, runtime_role: str | None, lock_timeout: float | None) -> list[Migration]:
    """One try of migrate(), in one transaction; _LockWaitEnded when a statement waited its
    lock_timeout for a lock (everything rolled back)."""
    applied_now: list[Migration] = []
    doing = "for livepush_schema"
    with translated(url), connect(url, autocommit=False) as conn:
        # Transaction-scoped lock: released at commit or rollback, never leaked by a crash.
        conn.execute(_WAIT_UNTIMED)
        conn.execute(_MIGRATION_LOCK, (MIGRATION_LOCK_KEY,))
        conn.execute(_STATEMENT_TIMEOUT_BACK)
        ms = _lock_timeout_ms(conn, lock_timeout)
        conn.execute(_DDL_LOCK_TIMEOUT, {"ms": str(ms)})
        try:
            exists = conn.execute(_SCHEMA_TABLE_EXISTS).fetchone()
            if not (exists and exists[0]):
                # A copy in a schema the search path misses is the deployment's: a second one here
                # would share its notification channels but not its messages or its jobs.
                elsewhere = _out_of_reach(url, conn.execute(_SCHEMA_ELSEWHERE).fetchall())
                if elsewhere is not None:
                    raise elsewhere
                # Only when missing: the runtime role, which may not create, can then run `migrate`
                # on a current schema and be told there is nothing to do.
                with _may_create(url):
                    conn.execute(_CREATE_SCHEMA_TABLE)
            else:
                conn.execute(_PIN_SCHEMA)
            applied = _applied(conn, url)
            _check_lineage(url, applied)
            done = {v for v, _, _ in applied}
            for migration in bundled():
                if migration.version in done:
                    continue
                doing = f"for migration {migration.version:04d}_{migration.name}"
                try:
                    with _may_create(url):
                        conn.execute(migration.sql)
                except _LEFT_OVER as exc:
                    # The object is livepush's own, made by an earlier run whose record is gone (its tables
                    # dropped but not its functions, or the other way round): not Postgres failing.
                    raise _foreign(url, f"{first_line(exc)}, but livepush_schema does not record "
                                        f"{migration.version:04d}_{migration.name}") from None
                conn.execute("INSERT INTO livepush_schema (version, name, checksum) VALUES (%s, %s, %s)",
                             (migration.version, migration.name, migration.checksum))
                applied_now.append(migration)
            if runtime_role is not None:
                doing = f"to grant {runtime_role} what the runtime needs"
                _grant_runtime(conn, runtime_role)
            conn.commit()
        except psycopg.errors.LockNotAvailable:
            conn.rollback()
            raise _LockWaitEnded(doing, ms / 1000, _lock_holders(conn, ms / 1000)) from None
        except psycopg.errors.DeadlockDetected as exc:
            # The application's transaction and this one each waited for the other's lock: which
            # one Postgres ends is chance, and when it is this one, it is a lock wait that ended.
            conn.rollback()
            own = conn.info.backend_pid
            pids = {int(pid) for pid in _DEADLOCK_PIDS.findall(exc.diag.message_detail or "")} - {own}
            raise _LockWaitEnded(doing, ms / 1000, _lock_holders(conn, ms / 1000, sorted(pids)),
                                 deadlock=True) from None
    return applied_now


# name: role_named -- the role of that exact name, else the one that name means in SQL, where an
# unquoted name is folded to lower case (CREATE ROLE App_Runtime makes app_runtime). A plain read.
_ROLE_NAMED = """
SELECT rolname::text FROM pg_roles WHERE rolname::text IN (%(role)s::text, lower(%(role)s::text))
ORDER BY rolname::text = %(role)s::text DESC LIMIT 1
"""


def _grant_runtime(conn: psycopg.Connection, role: str) -> None:
    found = conn.execute(_ROLE_NAMED, {"role": role}).fetchone()
    if found is None:
        raise ConfigError(f"--runtime-role {role!r}: no such role; create it first (CREATE ROLE ... LOGIN)")
    if found[0] != role:
        # Told to create it, the operator would be told it already exists.
        raise ConfigError(f"--runtime-role {role!r}: no such role, but there is {found[0]!r} (SQL folds an unquoted "
                          f"name to lower case; the flag takes it as written): run with --runtime-role {found[0]}")
    who = sql.Identifier(role)
    database = conn.execute("SELECT current_database(), current_schema()").fetchone()
    assert database is not None
    conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database[0]), who))
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(database[1]), who))
    conn.execute(sql.SQL("GRANT SELECT ON livepush_schema TO {}").format(who))
    objects = conn.execute(_RUNTIME_OBJECTS).fetchall()
    tables = [sql.Identifier(name) for name, kind in objects if kind != "S"]
    sequences = [sql.Identifier(name) for name, kind in objects if kind == "S"]
    conn.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(sql.SQL(", ").join(tables), who))
    conn.execute(sql.SQL("GRANT USAGE, SELECT ON SEQUENCE {} TO {}").format(sql.SQL(", ").join(sequences), who))
    functions = [sql.SQL(signature) for (signature,) in conn.execute(_RUNTIME_FUNCTIONS).fetchall()]
    conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(sql.SQL(", ").join(functions), who))
    # A GRANT by a role that neither owns the object nor holds the grant option only warns
    # ("no privileges were granted"): without this check, `migrate` would say "granted" and
    # the runtime would fail at its first statement.
    missing = [name for (name,) in conn.execute(_RUNTIME_MISSING, {"role": role}).fetchall()]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ConfigError(f"--runtime-role {role!r}: could not grant {role} what the runtime needs on {shown}, "
                          "as this role does not own them: run `livepush migrate --runtime-role` with the "
                          "credentials of the schema's owner")


# name: runtime_leftovers -- what the role may still create beyond the grants above, through
# PUBLIC (which every role belongs to, and which no grant of ours can take from one role) or a
# grant of its own: TEMPORARY on the database, CREATE on the schema. A plain read of the catalog.
_RUNTIME_LEFTOVERS = """
SELECT has_database_privilege(%(role)s, current_database(), 'TEMPORARY'),
       has_schema_privilege(%(role)s, current_schema(), 'CREATE'),
       current_database(), current_schema()
"""
# name: runtime_above -- whether the role is above any grant: a superuser, or the owner of one of
# livepush's objects or a member with its privileges (pg_has_role USAGE), which may alter, drop
# and truncate it whatever is granted or revoked. A plain read of the catalog.
_RUNTIME_ABOVE = """
SELECT r.rolsuper OR EXISTS (
    SELECT 1 FROM pg_class c
    WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'u', 'S')
      AND c.relname LIKE 'livepush\\_%%' AND pg_has_role(r.oid, c.relowner, 'USAGE'))
FROM pg_roles r WHERE r.rolname = %(role)s
"""


def runtime_leftovers(url: str, role: str) -> list[str]:
    """One line for each privilege `role` holds that lets it create objects (none of them granted
    by `migrate`), naming the statement that takes it away; empty when it can create nothing. One
    line alone for a role above every grant (a superuser, the owner or a member of it)."""
    with translated(url), connect(url) as conn, conn.transaction():
        # Where livepush is, as migrate() pinned it for the grants: a schema named after the
        # migrating role, made since, comes first in its search_path and holds none of it.
        conn.execute(_PIN_SCHEMA)
        above = conn.execute(_RUNTIME_ABOVE, {"role": role}).fetchone()
        if above is not None and above[0]:
            # REVOKEs from PUBLIC would leave it as it is: the one fix is another role.
            return [f"{role} is a superuser, or owns livepush's tables (or is a member of their owner): it may alter, "
                    "drop and truncate them whatever is granted, so the grants limit nothing; create a role of its "
                    "own for serve and jobs (CREATE ROLE app_runtime LOGIN) and name it in --runtime-role"]
        row = conn.execute(_RUNTIME_LEFTOVERS, {"role": role}).fetchone()
        assert row is not None
        temporary, create, database, schema = row
        # Quoted where they need it, so the statement can be pasted as it is.
        database, schema = (sql.Identifier(name).as_string(conn) for name in (database, schema))
    found = []
    if temporary:
        found.append(f"{role} can create temporary tables and functions (PUBLIC holds TEMPORARY on database "
                     f"{database} by default): REVOKE TEMPORARY ON DATABASE {database} FROM PUBLIC")
    if create:
        found.append(f"{role} can create objects in schema {schema}: REVOKE CREATE ON SCHEMA {schema} FROM PUBLIC "
                     f"(and from {role})")
    return found


_NO_CHECKSUMS = "its migrations were recorded without checksums"  # by a livepush that kept none


def _recorded(rows: Iterable[Any]) -> list[tuple[int, str, str]]:
    """_APPLIED's rows as (version, name, checksum)."""
    return [(int(v), str(n), str(c)) for v, n, c in rows]


def _applied(conn: psycopg.Connection, url: str) -> list[tuple[int, str, str]]:
    """The migrations recorded in the database, oldest first; none before the first migrate."""
    try:
        return _recorded(conn.execute(_APPLIED))
    except psycopg.errors.UndefinedTable:
        if not conn.autocommit:
            conn.rollback()
        elsewhere = _out_of_reach(url, conn.execute(_SCHEMA_ELSEWHERE).fetchall())
        if elsewhere is not None:
            raise elsewhere from None
        return []
    except psycopg.errors.UndefinedColumn:
        raise _foreign(url, _NO_CHECKSUMS) from None


def check_schema(url: str, who: str = "this livepush") -> None:
    """Refuse to run on a schema older than this code needs, or not ours at all."""
    with translated(url), connect(url) as conn:
        applied = _applied(conn, url)
    _judge(url, applied, who)


@contextlib.contextmanager
def schema_named_when_missing(url: str, who: str) -> Iterator[None]:
    """Around work on the database at `url` whose SchemaError names a missing table or function:
    the schema may be there, older than this code needs or in a schema the search_path misses,
    which check_schema() names with its fix (`livepush migrate` would not help the second). The
    work's own error when the check finds nothing more to say."""
    try:
        yield
    except SchemaError:
        check_schema(url, who)
        raise


async def acheck_schema(url: str, who: str = "this livepush") -> None:
    """check_schema() for async code. A stop asked for while it waits on a database that does not
    answer cancels it at once, where a thread's connect would hold the process for its timeout."""
    with translated(url):
        conn = await aconnect(url)
        try:
            try:
                applied = _recorded(await (await conn.execute(_APPLIED)).fetchall())
            except psycopg.errors.UndefinedTable:
                elsewhere = _out_of_reach(url, await (await conn.execute(_SCHEMA_ELSEWHERE)).fetchall())
                if elsewhere is not None:
                    raise elsewhere from None
                applied = []
            except psycopg.errors.UndefinedColumn:
                raise _foreign(url, _NO_CHECKSUMS) from None
        finally:
            await conn.close()
    _judge(url, applied, who)


def schema_version(url: str) -> int:
    """The newest migration the database records (0 before the first migrate): after `livepush
    migrate`, what the database is at, which is past required_version() once a newer livepush migrated it."""
    with translated(url), connect(url) as conn:
        return max((v for v, _, _ in _applied(conn, url)), default=0)


async def aschema_version(url: str) -> int:
    """The newest migration the database records (0 before the first migrate), on a short
    connection of its own: what a running server's readiness check compares with
    required_version(). A newer schema is fine for running code (upgrades migrate first)."""
    with translated(url):
        conn = await aconnect(url)
        try:
            try:
                rows = await (await conn.execute(_SCHEMA_VERSION)).fetchall()
            except psycopg.errors.UndefinedTable:
                return 0
        finally:
            await conn.close()
    return int(rows[0][0] or 0)


async def aschema_behind(url: str) -> str | None:
    """None when the database's schema is what this code needs (or newer), else what to do."""
    have, need = await aschema_version(url), required_version()
    if have >= need:
        return None
    return f"the database schema is at version {have} but this server needs {need}: run `livepush migrate`"


def _judge(url: str, applied: list[tuple[int, str, str]], who: str) -> None:
    have = max((v for v, _, _ in applied), default=0)
    _check_lineage(url, applied)
    need = required_version()
    if have < need:
        raise SchemaError(f"the database schema is at version {have} but {who} needs {need}: run `livepush migrate`")
