"""Where the jobs' database is, and the pools that what a user calls (enqueue, operator calls,
groups) uses.

Jobs always need Postgres, whatever the push fan-out is. The URL is the settings' database URL
unless `jobs.configure(url)` set one (tests, and apps that keep jobs in another database). A
runtime has pools of its own (runtime.Runtime).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, cast

import psycopg
from psycopg_pool import AsyncConnectionPool

from ..config import get_settings
from ..errors import ArgumentTypeError, ArgumentValueError, ConfigError
from ..postgres.connect import PSYCOPG_CONNECTION_HINT, cursor_on, refuse_closed, translated
from ..postgres.identity import IDENTITY, other_database
from ..postgres.pools import LoopPools
from ..postgres.urls import check_url

_lock = threading.Lock()
_url: str | None = None
_pools: LoopPools | None = None


def _after_fork() -> None:
    """In a forked child: a thread of the parent may have held the lock at the fork, and no thread
    of the child would ever release it (its first enqueue would wait for ever). The pools set
    their inherited connections aside themselves."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def configure(url: str | None) -> None:
    """Use `url` for jobs in this process (None: back to LIVEPUSH_DATABASE_URL)."""
    global _url
    # Checked here, as the settings check theirs: a mistake found at the first enqueue came out
    # as an AttributeError, or named LIVEPUSH_DATABASE_URL, which was not what was wrong.
    if url is not None:
        if not isinstance(url, str):
            raise ArgumentTypeError(f"jobs.configure() takes a Postgres URL (a str) or None, got {type(url).__name__}")
        if not url.strip():
            raise ConfigError("jobs.configure() was given an empty URL: pass a Postgres URL such as "
                              "postgresql://user@localhost/jobs, or None for LIVEPUSH_DATABASE_URL's database")
        check_url(url, "the URL given to jobs.configure()")
    with _lock:
        _url = url
    close_pools()


def configured_url() -> str | None:
    """The URL configure() set, or None (LIVEPUSH_DATABASE_URL is used)."""
    return _url


def database_url() -> str:
    return _url or get_settings().require_database()


def pool_url(pool: AsyncConnectionPool) -> str:
    """The URL of one of livepush's pools: each is opened with a URL, never with a function that
    gives one (which psycopg_pool's conninfo also takes)."""
    return cast(str, pool.conninfo)


def on_settings_database() -> bool:
    """Whether the jobs' database is the settings' own (LIVEPUSH_DATABASE_URL): only then does
    a LISTEN on the settings' listen URL hear its jobs' rings (enqueues, cancels, group counts)."""
    return _url is None or _url == get_settings().database_url


def listen_url() -> str | None:
    """Where a runtime of the jobs' database LISTENs, when not on the jobs' own URL:
    LIVEPUSH_LISTEN_DATABASE_URL, a way to the settings' database only, so None when
    jobs.configure() chose another database."""
    return get_settings().listen_database_url if on_settings_database() else None


def pools() -> LoopPools:
    """The pools of the jobs' database. Transactions are explicit here (groups add and count in
    one), and `prepare_threshold=0` prepares the enqueue's few statements from their first run."""
    global _pools
    url = database_url()
    with _lock:
        if _pools is None or _pools.url != url:
            if _pools is not None:
                _pools.close()
            _pools = LoopPools(url, name="livepush-jobs", autocommit=False, prepare_threshold=0)
        return _pools


@contextmanager
def connection() -> Iterator[psycopg.Connection]:
    """A pooled connection of the jobs' database in a transaction, committed when the block
    ends; psycopg's errors come out as ours."""
    with translated(database_url()), pools().sync().connection() as conn:
        yield conn


@asynccontextmanager
async def aconnection() -> AsyncIterator[psycopg.AsyncConnection]:
    """connection(), on the running loop's pool."""
    with translated(database_url()):
        async with (await pools().aget()).connection() as conn:
            yield conn


async def aopen() -> None:
    """Open the running loop's pool now (a web app's start): a bad URL fails at once."""
    await pools().aget()


async def release_loop() -> None:
    """Close the running loop's pool: a loop must do this before it ends (asyncio.run()
    cancelling a still-open pool's tasks at shutdown was seen to hang)."""
    if _pools is not None:
        await _pools.release_loop()


def close_pools() -> None:
    global _pools
    with _lock:
        pools, _pools = _pools, None
    if pools is not None:
        pools.close()


def conn_kind(conn: Any, call: str | None = None) -> str:
    """'async' for a psycopg AsyncConnection, 'sync' for a Connection, open or lost; one its caller
    closed is refused (connect.refuse_closed)."""
    import psycopg

    if isinstance(conn, psycopg.AsyncConnection):
        kind = "async"
    elif isinstance(conn, psycopg.Connection):
        kind = "sync"
    else:
        raise ArgumentTypeError(f"conn= must be a psycopg Connection or AsyncConnection, got {type(conn).__name__} "
                                f"({type(conn).__module__}): {PSYCOPG_CONNECTION_HINT}")
    refuse_closed(conn, f"{call}(conn=)" if call else "conn=", "the jobs")
    return kind


# name: joinable -- run on a caller's connection (conn=), in its transaction: whether its database
# holds livepush's tables, and which database it is (identity.py). A plain read by any role: it
# claims, writes and counts nothing, and cannot fail for want of a privilege, which would abort
# the caller's transaction. The start time as the text of its epoch, as IDENTITY reads it: a
# connection made by Django loads a timestamptz its own way (naive, with USE_TZ = False).
JOINABLE = ("SELECT to_regclass('livepush_jobs') IS NOT NULL,"
            " extract(epoch FROM pg_postmaster_start_time())::text, current_database()")

# Callers' connections (conn=) found on a jobs database, by that database's URL: a connection
# stays on the database it opened, so one read serves it for its life.
_checked: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
# Each jobs URL's database (identity.py), read again when a connection disagrees with it: the
# server may have restarted since, which changes its start time.
_identities: dict[str, tuple[str, str]] = {}


def known_on_database(conn: Any) -> None:
    """Record that a caller's `conn` is on the jobs' database, told by a check of its own that
    holds for every connection it makes (the Django backend's, once per database alias): the
    check below then reads nothing on it."""
    _checked[conn] = database_url()


def check_on_database(conn: Any, call: str | None = None) -> None:
    """Raise ArgumentValueError unless a caller's sync `conn` is on the jobs' database. Another
    database with livepush's schema too (the app's, migrated for its own reasons) takes the job,
    and no runtime ever looks there: it would never run, and its handle said it was enqueued. A
    database without the schema is left to the statement that follows, whose SchemaError names it
    as the one to migrate, as publish(conn=) does."""
    url = database_url()
    if _checked.get(conn) == url:
        return
    with cursor_on(conn) as cur:
        found, *theirs = cur.execute(JOINABLE).fetchone()
    if not found:
        return
    if _identities.get(url) != tuple(theirs):
        with pools().sync().connection() as own:
            _identities[url] = tuple(own.execute(IDENTITY).fetchone())  # type: ignore[arg-type]
    _settle(conn, url, tuple(theirs), call)


async def acheck_on_database(conn: Any, call: str | None = None, pool: AsyncConnectionPool | None = None) -> None:
    """check_on_database() for an AsyncConnection; `pool`: the jobs database's pool when it is not
    the process's (a runtime's own)."""
    url = pool_url(pool) if pool is not None else database_url()
    if _checked.get(conn) == url:
        return
    async with cursor_on(conn) as cur:
        found, *theirs = await (await cur.execute(JOINABLE)).fetchone()
    if not found:
        return
    if _identities.get(url) != tuple(theirs):
        async with (pool or await pools().aget()).connection() as own:
            _identities[url] = tuple(await (await own.execute(IDENTITY)).fetchone())  # type: ignore[arg-type]
    _settle(conn, url, tuple(theirs), call)


def _settle(conn: Any, url: str, theirs: tuple[Any, ...], call: str | None) -> None:
    ours = _identities[url]
    if theirs == ours:
        _checked[conn] = url
        return
    raise ArgumentValueError(
        f"{other_database(f'{call}(conn=)' if call else 'conn=', theirs, ours, url)}, the jobs' database, where "
        "the runtimes look for jobs: a job written there would never run. Pass a connection to the jobs' database "
        "(or leave conn= out), or point LIVEPUSH_DATABASE_URL (or jobs.configure()) at the connection's database, "
        "for the runtimes too")
