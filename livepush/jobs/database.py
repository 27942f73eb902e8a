"""Where the jobs' database is, and the connections enqueue uses.

Jobs always need Postgres, whatever the push fan-out is. The URL is
`livepush.config.get_settings().require_database()` unless `jobs.configure(url)` set one
(tests and apps that keep jobs in another database).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any

from psycopg_pool import AsyncConnectionPool, ConnectionPool

from ..config import get_settings
from ..postgres.connect import AsyncPool, Pool

_lock = threading.Lock()
_url: str | None = None
_sync_pool: ConnectionPool | None = None
_sync_pool_url: str | None = None
# One async pool per event loop: a pool's connections belong to the loop that opened them.
_async_pools: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[str, AsyncConnectionPool]]" = (
    weakref.WeakKeyDictionary()
)


def configure(url: str | None) -> None:
    """Use `url` for jobs in this process (None: back to LIVEPUSH_DATABASE_URL)."""
    global _url
    with _lock:
        _url = url
    close_pools()


def database_url() -> str:
    return _url or get_settings().require_database()


# prepare_threshold=0: enqueue runs the same few statements again and again, so they are
# prepared on the server from their first run rather than their sixth (psycopg's default,
# meant for one-off queries); the first enqueues of a process are no slower than the rest.
_POOL_KWARGS: dict[str, Any] = {"autocommit": False, "prepare_threshold": 0}


def sync_pool() -> ConnectionPool:
    """A small shared pool for sync enqueue and the admin calls."""
    global _sync_pool, _sync_pool_url
    url = database_url()
    with _lock:
        if _sync_pool is None or _sync_pool_url != url:
            if _sync_pool is not None:
                _sync_pool.close()
            _sync_pool = Pool(url, min_size=1, max_size=4, open=True, kwargs=dict(_POOL_KWARGS),
                              name="livepush-jobs-sync")
            _sync_pool_url = url
        return _sync_pool


async def async_pool() -> AsyncConnectionPool:
    """A small pool bound to the running loop, for aenqueue and the async admin calls."""
    loop = asyncio.get_running_loop()
    url = database_url()
    entry = _async_pools.get(loop)
    if entry is not None and entry[0] == url:
        return entry[1]
    pool = AsyncPool(url, min_size=1, max_size=4, open=False, kwargs=dict(_POOL_KWARGS),
                     name="livepush-jobs-async")
    await pool.open()
    _async_pools[loop] = (url, pool)
    if entry is not None:
        await entry[1].close()
    return pool


async def close_async_pool() -> None:
    """Close the running loop's pool. A loop must do this before it ends: asyncio.run()
    cancelling a still-open pool's tasks at shutdown was seen to hang."""
    entry = _async_pools.pop(asyncio.get_running_loop(), None)
    if entry is not None:
        await entry[1].close()


def close_pools() -> None:
    global _sync_pool, _sync_pool_url
    with _lock:
        pool, _sync_pool, _sync_pool_url = _sync_pool, None, None
    if pool is not None:
        pool.close()
    _async_pools.clear()  # their loops close them; dropping the reference is enough here


def conn_kind(conn: Any) -> str:
    """'async' for a psycopg AsyncConnection, 'sync' for a Connection."""
    import psycopg

    if isinstance(conn, psycopg.AsyncConnection):
        return "async"
    if isinstance(conn, psycopg.Connection):
        return "sync"
    raise TypeError(f"conn= must be a psycopg Connection or AsyncConnection, got {type(conn).__name__}")
