"""Where the jobs' database is, and the pools that what a user calls (enqueue, operator calls,
groups) uses.

Jobs always need Postgres, whatever the push fan-out is. The URL is the settings' database URL
unless `jobs.configure(url)` set one (tests, and apps that keep jobs in another database). A
runtime has pools of its own (runtime.Runtime).
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg

from ..config import get_settings
from ..errors import ArgumentTypeError, ConfigError
from ..postgres.connect import PSYCOPG_CONNECTION_HINT, refuse_closed, translated
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
