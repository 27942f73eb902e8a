"""Connections to Postgres, and the one place psycopg's errors become livepush's.

Every part that talks to Postgres connects through `connect`/`aconnect` or a pool from
`pools.py`, and wraps what it runs at its public seam in `translated(url)`. A message never
holds a password: URLs are shown as `host:port/dbname`, and the driver's own message is
left out when it may quote the URL (a malformed one).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.rows
from psycopg.pq import Format
from psycopg.types.string import TextLoader
from psycopg_pool import PoolTimeout

from ..config import get_settings
from ..errors import ArgumentValueError, ConfigError, DependencyError, LoginRefused, SchemaError, first_line
from .urls import check_url, fields, redact


class _Unprepared(psycopg.Cursor[Any]):
    """A cursor that prepares none of its statements, whatever its connection's prepare_threshold."""

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                binary: bool | None = None) -> Any:
        return super().execute(query, params, prepare=False, binary=binary)


class _AsyncUnprepared(psycopg.AsyncCursor[Any]):
    """_Unprepared, for an AsyncConnection."""

    async def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                      binary: bool | None = None) -> Any:
        return await super().execute(query, params, prepare=False, binary=binary)


class _Utf8Text(TextLoader):
    """Text read as UTF-8 on a caller's connection to a SQL_ASCII database, where psycopg hands it
    back as bytes: livepush writes its text there in UTF-8 (connection_options())."""

    def __init__(self, oid: int, context: Any = None) -> None:
        super().__init__(oid, context)
        self._encoding = "utf-8"


class _Utf8BinaryText(_Utf8Text):
    format = Format.BINARY


def _reads_text_as_bytes(conn: Any) -> bool:
    """Whether psycopg hands `conn`'s text back as bytes: its client encoding is SQL_ASCII, which
    a caller's connection to such a database has unless the caller set another."""
    try:
        encoding: str = conn.info.encoding
    except psycopg.Error:
        return False  # a connection lost: the statement fails, as on any other
    return encoding == "ascii"


# What a conn= error says when it got no psycopg 3 connection at all: a framework's wrapper
# (django.db.connection) or a psycopg2 connection, whose psycopg connection is one step away.
PSYCOPG_CONNECTION_HINT = ("pass the psycopg connection itself (under Django, django.db.connection.connection; "
                           "under SQLAlchemy, a Connection's .connection.driver_connection)")


def refuse_closed(conn: Any, name: str, what: str) -> None:
    """ArgumentValueError when the caller closed `conn` before the call `name` (`publish(conn=)`):
    told "cannot reach Postgres", as a lost (broken) connection is, an operator would check a
    server that is up, for a call made after the connection's `with` block. `what` is what the
    call writes in the caller's transaction ("the message", "the jobs")."""
    if conn.closed and not conn.broken:
        raise ArgumentValueError(f"{name} got a closed connection: pass the open connection whose transaction {what} "
                                 "belong to, before its `with` block ends")


def cursor_on(conn: Any, row_factory: Any = None) -> Any:
    """A cursor on a caller's connection (`conn=`) that binds as livepush's statements are written
    (`%(name)s`, on the server) and makes tuples (or `row_factory`'s rows), whatever row or cursor
    factory the caller gave the connection: dict rows or a RawCursor's `$1` would break them. With
    LIVEPUSH_PREPARED_STATEMENTS=off it prepares nothing: the connection's prepare_threshold is the
    caller's (psycopg's default, 5, under Django, whose own cursors never prepare), and behind a
    pooler in transaction mode a statement of ours prepared on it failed a later transaction. On a
    SQL_ASCII database it reads text as str, as livepush's own connections do: a job's name or a
    group's state read as bytes broke the handles and the group steps."""
    factory = row_factory or psycopg.rows.tuple_row
    prepared = get_settings().prepared_statements
    cur: psycopg.AsyncCursor[Any] | psycopg.Cursor[Any]
    if isinstance(conn, psycopg.AsyncConnection):
        cur = (psycopg.AsyncCursor if prepared else _AsyncUnprepared)(conn, row_factory=factory)
    else:
        cur = (psycopg.Cursor if prepared else _Unprepared)(conn, row_factory=factory)
    if _reads_text_as_bytes(conn):
        for name in ("text", "varchar", "bpchar", "name"):
            cur.adapters.register_loader(name, _Utf8Text)
            cur.adapters.register_loader(name, _Utf8BinaryText)
    return cur


class PoolBusy(PoolTimeout):
    """A pool's wait for a connection ran out while it held every connection it may open, each
    busy: the server is up, and statements on them wait (pools.py raises it, translate() says so)."""

    def __init__(self, name: str, size: int, timeout: float) -> None:
        super().__init__(f"every connection of the pool {name} ({size}) stayed busy for {timeout:g} s")


class PoolUnreachable(PoolTimeout):
    """A pool's wait for a connection ran out while its attempts to connect failed (the server is
    down, or refuses the login): translate() says it as that failure, `cause`, where a plain
    timeout named neither the reason nor, as PoolBusy, the right one (pools.py raises it)."""

    def __init__(self, name: str, timeout: float, cause: BaseException) -> None:
        super().__init__(f"the pool {name} could not connect within {timeout:g} s ({first_line(cause)})")
        self.cause = cause


CONNECT_TIMEOUT = 5  # seconds; a server that does not answer fails the command rather than hanging it
# TCP keepalives of every connection, unless the URL sets its own: a server gone without closing
# its connections (a failover whose old primary vanished, a NAT that forgot the flow) is found
# after about a minute of silence, not the kernel's two hours and more, during which a statement
# that awaited its answer (a server's history read, a runtime's claim) waited as long.
KEEPALIVES = {"keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


def connect_defaults(url: str) -> dict[str, Any]:
    """The connect_timeout and keepalive options for `url`: CONNECT_TIMEOUT and KEEPALIVES, but
    for those the URL (or libpq's PGCONNECT_TIMEOUT) names. Given as keywords they override the
    URL's, which the operator set for a reason: a serverless Postgres that takes longer to wake,
    or a check that must fail fast."""
    try:
        named = fields(url)
    except psycopg.Error:
        named = {}  # check_url() says what is wrong with it
    defaults: dict[str, Any] = {k: v for k, v in KEEPALIVES.items() if k not in named}
    if "connect_timeout" not in named and not os.environ.get("PGCONNECT_TIMEOUT"):
        defaults["connect_timeout"] = CONNECT_TIMEOUT
    return defaults


def _password(url: str) -> str | None:
    try:
        return fields(url).get("password") or None
    except psycopg.Error:
        return None


def _scrubbed(url: str, text: str) -> str:
    """`text` with the URL and its password taken out."""
    password = _password(url)
    if password and password in text:
        text = text.replace(password, "***")
    if url in text:
        text = text.replace(url, redact(url))
    return text


def _reason(url: str, exc: BaseException) -> str:
    """The first line of the driver's message, with the URL and its password taken out."""
    return _scrubbed(url, first_line(exc))


def _detail_and_hint(url: str, exc: BaseException) -> str:
    """Postgres' detail and hint on `exc`, scrubbed as _reason() is, as the end of a message."""
    diag = getattr(exc, "diag", None)
    said = [text for text in (getattr(diag, "message_detail", None), getattr(diag, "message_hint", None)) if text]
    return ": " + _scrubbed(url, " ".join(said)) if said else ": see its log"


def _setting_of(url: str) -> str:
    """The setting that holds `url`: the listen URL has one of its own, and an operator told to
    check the other, which works, would look in the wrong place."""
    try:
        settings = get_settings()
    except ConfigError:
        return "LIVEPUSH_DATABASE_URL"
    if settings.listen_database_url == url and settings.database_url != url:
        return "LIVEPUSH_LISTEN_DATABASE_URL"
    return settings.database_url_setting if settings.database_url == url else "LIVEPUSH_DATABASE_URL"


# What Postgres says when it refuses a connection for want of a slot (max_connections, the slots
# it keeps for superusers or pg_use_reserved_connections, a role's or database's CONNECTION LIMIT):
# a failed connect carries no SQLSTATE (see _LOGIN_REFUSED), so the words, in English, are the sign.
_NO_SLOT = re.compile(r"too many clients already|too many connections for (?:role|database)"
                      r"|remaining connection slots are reserved")
# What PgBouncer says when it refuses a client for want of a slot of its own: max_client_conn, or
# (1.24 and later) the client limits per database and per user, in other words. It answers the
# login itself, with no SQLSTATE either, so its words are the one sign; the group is the limit.
_POOLER_FULL = re.compile(r"no more connections allowed \((max_client_conn)\)"
                          r"|client connections exceeded \((max_db_client_connections|max_user_client_connections)\)")


# What PgBouncer says when a client's query waited past its query_wait_timeout for a server
# connection of the pool (database and user) that every one of them is held in: up, and full.
_POOL_WAIT = re.compile(r"\bquery_wait_timeout\b")


def unreachable(url: str, exc: BaseException) -> DependencyError:
    if _POOL_WAIT.search(str(exc)):
        # Postgres and PgBouncer are both up: the pool's server connections were all held that
        # long, by transactions that run long or by more clients than the pool has connections.
        return DependencyError(
            f"PgBouncer at {redact(url)} is up but gave no server connection within its query_wait_timeout "
            f"({_reason(url, exc)}): every one of its pool for this database and user was held; raise its "
            "default_pool_size (or the database's pool_size), or find the long transactions holding them in "
            "pg_stat_activity and keep them short")
    full = _POOLER_FULL.search(str(exc))
    if full:
        # Postgres behind it may have slots to spare: what to change is the pooler's limit, or how
        # many connections livepush's processes open through it (each one's pools have fixed sizes).
        return DependencyError(
            f"PgBouncer at {redact(url)} is up but takes no more clients ({_reason(url, exc)}): raise its "
            f"{full[1] or full[2]}, or open fewer connections through it: fewer `serve` workers (LIVEPUSH_WORKERS), "
            "`livepush jobs` processes or app processes, each of which holds its listener and small pools "
            "(LIVEPUSH_LISTEN_DATABASE_URL can send the listeners past it)")
    if getattr(exc, "sqlstate", None) == "53300" or _NO_SLOT.search(str(exc)):
        # Still an outage to retry, but told to check that the server runs, the operator looks at
        # one that is up: what to change is its connection limits, or who holds its connections.
        return DependencyError(
            f"Postgres at {redact(url)} is up but has no connection slot left for this login ({_reason(url, exc)}): "
            "raise max_connections (or the role's or database's CONNECTION LIMIT), or find what holds the "
            "connections in pg_stat_activity (every livepush process holds its listener and small pools)")
    return DependencyError(
        f"cannot reach Postgres at {redact(url)} ({_reason(url, exc)}): "
        f"check {_setting_of(url)} and that the server is running"
    )


# What libpq says when the server refused the login itself (a wrong password, a role or database
# that does not exist, no pg_hba.conf line, NOLOGIN, no CONNECT privilege). A failed connect
# carries no SQLSTATE in psycopg 3 (libpq keeps the server's code to itself: the error's sqlstate
# and diag are empty), so these words are the one sign left. They are bound to the texts of
# Postgres (10 to 18) and libpq, in English: a server whose lc_messages is another language says
# them in its own, and its refusal is then told as an unreachable server (exit 1), as before.
_LOGIN_REFUSED = re.compile(r'authentication failed for user|no pg_hba\.conf entry for|is not permitted to log in'
                            r'|\b(?:role|database) ".*" does not exist|does not have CONNECT privilege')


def _login_refused(url: str, exc: BaseException) -> LoginRefused | None:
    """LoginRefused when `exc` is a connect that the server refused for its login, else None.
    psycopg keeps the failed connection on the error (`pgconn`, psycopg 3.1 and later), whose
    needs_password says, whatever the language, that the server asked for a password the URL
    (and PGPASSWORD, ~/.pgpass) did not give."""
    pgconn = getattr(exc, "pgconn", None)
    if not isinstance(exc, psycopg.OperationalError) or pgconn is None or exc.sqlstate:
        return None  # not a failed connect (a statement's error has a SQLSTATE)
    setting = _setting_of(url)
    if getattr(pgconn, "needs_password", False):
        return LoginRefused(f"Postgres at {redact(url)} asked for a password, which {setting} does not give "
                            f"({_reason(url, exc)}): put it in the URL (postgresql://USER:PASSWORD@HOST/DB)")
    if _LOGIN_REFUSED.search(str(exc)):
        return LoginRefused(f"Postgres at {redact(url)} is up and refused the login ({_reason(url, exc)}): correct "
                            f"the user, password or database in {setting}, or the role or pg_hba.conf on the server")
    return None


def translate(url: str, exc: BaseException) -> Exception:
    """Our error for a psycopg (or pool) error raised while working on the database at `url`."""
    if isinstance(exc, PoolUnreachable):
        return translate(url, exc.cause)
    refused = _login_refused(url, exc)
    if refused is not None:
        return refused
    if isinstance(exc, (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction,
                        psycopg.errors.UndefinedColumn)):
        return SchemaError(
            f"the database at {redact(url)} lacks livepush's schema ({_reason(url, exc)}): run `livepush migrate`"
        )
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return ConfigError(
            f"the database role lacks a privilege livepush needs at {redact(url)} ({_reason(url, exc)}): "
            "run `livepush migrate --runtime-role ROLE` as the schema's owner"
        )
    state = getattr(exc, "sqlstate", None) or ""
    if state.startswith("53") and state != "53300":  # class 53 but "too many connections"
        # Out of memory, disk or a configured limit: the server is there, and says what to change.
        hint = getattr(getattr(exc, "diag", None), "message_hint", None)
        return DependencyError(f"Postgres at {redact(url)} ran out of a resource ({_reason(url, exc)})"
                               + (f": {hint}" if hint else ": see its log"))
    if state.startswith("40"):
        # A deadlock or a serialization failure (psycopg calls them operational errors): the
        # server is there and undid the transaction because another one conflicted with it.
        return DependencyError(f"Postgres at {redact(url)} rolled back the transaction ({_reason(url, exc)}): "
                               "another transaction conflicted with it; run the whole transaction again")
    if state in ("57014", "55P03"):
        # A statement or lock timeout (or a cancel) of the role's, the database's or the caller's
        # settings: the server is there and answered; told to check that it runs, nobody looks
        # at the timeout.
        return DependencyError(f"Postgres at {redact(url)} cancelled the statement ({_reason(url, exc)}): a "
                               "statement_timeout or lock_timeout of the role, the database or the session ended "
                               "it (or another session cancelled it); the server is up")
    if state == "25006":
        # A hot standby (a failover not yet over, a read replica's address) or a database or role
        # set to default_transaction_read_only: said as "failed", it sent nobody to check where the
        # URL points, and a standby refuses LISTEN with only "cannot execute LISTEN during recovery".
        return DependencyError(f"Postgres at {redact(url)} is read-only ({_reason(url, exc)}): it is a standby "
                               "in recovery, or sets default_transaction_read_only; point "
                               f"{_setting_of(url)} at the primary (with several hosts, add "
                               "target_session_attrs=read-write)")
    if state in ("26000", "42P05"):
        # A statement psycopg prepared (_pg3_N) missing or taken on the server connection this one
        # ran on: a pooler in transaction mode handed it another one. psycopg goes on believing it
        # prepared, so every later run of that statement fails alike until the setting changes.
        return DependencyError(f"Postgres at {redact(url)} does not hold the statements this connection prepared "
                               f"({_reason(url, exc)}): a pooler in transaction mode that cannot keep prepared "
                               "statements (PgBouncer before 1.22, or max_prepared_statements = 0) is in between; "
                               "set LIVEPUSH_PREPARED_STATEMENTS=off in every process that uses "
                               f"{_setting_of(url)}")
    if state[:2] in ("54", "55", "58"):
        # A limit of the server's, an object in the wrong state, an I/O failure: psycopg calls them
        # operational errors, but the server is there and said why, with a detail and a hint that
        # name what to do (a full NOTIFY queue, which fails every publish, names the session that
        # holds it back).
        return DependencyError(f"Postgres at {redact(url)} is up but could not run the statement "
                               f"({_reason(url, exc)}){_detail_and_hint(url, exc)}")
    if isinstance(exc, PoolBusy):
        # Told "cannot reach Postgres", an operator checks a server that is up; what holds the
        # connections is a lock (publishers of one topic wait for a transaction that published on
        # it) or a slow statement.
        return DependencyError(f"Postgres at {redact(url)} is up, but {exc}: their statements were waiting, most "
                               "likely for a lock that a long transaction holds (one that published on the same "
                               "topic, or wrote the same rows); find it in pg_stat_activity and keep such "
                               "transactions short")
    if isinstance(exc, (psycopg.OperationalError, PoolTimeout, OSError)):
        return unreachable(url, exc)
    return DependencyError(f"Postgres at {redact(url)} failed: {_reason(url, exc)}")


def as_warned(url: str, exc: BaseException) -> BaseException:
    """What a warning of work that goes on (a runtime's loops, tried again) shows of `exc`: a
    privilege the role lacks as translate() says it, with the command that grants it, where the
    driver names only the table; a lost connection or a pool's wait that ran out likewise, naming
    the database and why (the driver's and psycopg_pool's own words name neither); anything else
    as it was raised, its own words."""
    if isinstance(exc, (psycopg.errors.InsufficientPrivilege, psycopg.OperationalError)):
        return translate(url, exc)
    return exc


@contextlib.contextmanager
def translated(url: str) -> Iterator[None]:
    """Around a public call's database work (sync or async): psycopg errors become ours.
    Errors that are the caller's own (a bad argument Postgres refused) pass through as
    DependencyError too, with the driver's first line: they are not ours to hide."""
    try:
        yield
    except (psycopg.Error, PoolTimeout) as exc:
        raise translate(url, exc) from exc


# Errors on a caller's connection that are livepush's set-up, not the caller's transaction: its
# database lacks the schema, or its role the grants (translate() says what to run for each).
_SET_UP_ERRORS = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction, psycopg.errors.UndefinedColumn,
                  psycopg.errors.InsufficientPrivilege)


@contextlib.contextmanager
def translated_if_lost(url: str, conn: Any) -> Iterator[None]:
    """Around work on a caller's connection (`conn=`): when the connection is lost (a restart, a
    failover, a killed backend), psycopg's error becomes ours, as on livepush's own connections,
    and so does a missing schema or grant, named with the database the connection is on. Any
    other error is the caller's transaction's own (a lock timeout it set, a statement of its that
    failed) and passes through as the driver raised it."""
    try:
        yield
    except psycopg.Error as exc:
        if conn.closed or conn.broken:
            raise translate(url, exc) from exc
        if isinstance(exc, _SET_UP_ERRORS):
            raise translate(conn.info.dsn, exc) from exc
        raise


@contextlib.contextmanager
def translated_on(url: str, conn: Any) -> Iterator[None]:
    """translated(url), around the jobs' work on a caller's connection (`conn=`): a missing schema
    or grant is named with the database the connection is on, which need not be `url`'s (the
    jobs' database), so that the operator migrates or grants the right one. A transaction that an
    earlier statement of the caller's failed refuses every statement until a rollback: that error
    is the caller's own, raised as the driver raised it (as a DependencyError it read as an outage)."""
    try:
        yield
    except psycopg.errors.InFailedSqlTransaction:
        raise
    except psycopg.Error as exc:
        if isinstance(exc, _SET_UP_ERRORS) and not (conn.closed or conn.broken):
            raise translate(conn.info.dsn, exc) from exc
        raise translate(url, exc) from exc


def statement_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """psycopg connection options with preparing turned off when LIVEPUSH_PREPARED_STATEMENTS=off.
    A pooler in transaction mode without prepared-statement support hands each transaction to any
    server connection, where a statement prepared on another is missing or a name is taken."""
    if get_settings().prepared_statements:
        return kwargs
    return {**kwargs, "prepare_threshold": None}


def connection_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The psycopg options of every livepush connection (connect(), aconnect(), pools.py): text in
    UTF-8 whatever the database's encoding, and statement_options(). On a SQL_ASCII database (what
    initdb makes under the C locale) psycopg otherwise handed text back as bytes, so offsets read
    "b'...'", and sent text as ASCII, so the migrations failed in Python; on another encoding it
    encoded in Python and failed there on a character the encoding lacks, where the server now
    converts and names it."""
    return statement_options({"client_encoding": "UTF8", **kwargs})


def connect(url: str, *, autocommit: bool = True, **kwargs: Any) -> psycopg.Connection:
    check_url(url)
    try:
        return psycopg.connect(url, autocommit=autocommit, **connection_options({**connect_defaults(url), **kwargs}))
    except psycopg.Error as exc:
        raise translate(url, exc) from None


async def aconnect(url: str, *, autocommit: bool = True, **kwargs: Any) -> psycopg.AsyncConnection:
    check_url(url)
    try:
        return await psycopg.AsyncConnection.connect(url, autocommit=autocommit,
                                                     **connection_options({**connect_defaults(url), **kwargs}))
    except psycopg.Error as exc:
        raise translate(url, exc) from None
