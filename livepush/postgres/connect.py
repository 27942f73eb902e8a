"""Postgres connections: the one place psycopg connection errors become ours."""

from __future__ import annotations

import asyncio
import re
import select
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from ..errors import DependencyError


# What Postgres text and jsonb cannot hold: NUL, and lone surrogates (not valid Unicode, so
# not encodable as UTF-8; Python makes them from undecodable bytes, e.g. file names).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable(text: str) -> str | None:
    """What in `text` Postgres cannot store (NUL, a lone surrogate), described; else None."""
    if text.isascii():
        return "a NUL character (\\x00)" if "\x00" in text else None
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    char = found.group()
    return "a NUL character (\\x00)" if char == "\x00" else f"a lone surrogate ({char!r}: not valid Unicode text)"


def storable_text(text: str) -> str:
    """`text` with every character Postgres cannot store replaced by U+FFFD."""
    return _UNSTORABLE.sub("\ufffd", text)


def _redact(url: str) -> str:
    """The URL without its password, safe for an error line."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "(unparseable URL)"
    host = info.get("host") or "localhost"
    port = info.get("port") or "5432"
    return f"{info.get('dbname') or info.get('user') or ''}@{host}:{port}"


def unreachable(url: str, exc: BaseException) -> DependencyError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DependencyError(
        f"cannot reach Postgres at {_redact(url)} ({first}): check LIVEPUSH_DATABASE_URL and that the server is running"
    )


def connect(url: str, *, autocommit: bool = True, **kwargs: object) -> psycopg.Connection:
    try:
        return psycopg.connect(url, autocommit=autocommit, connect_timeout=5, **kwargs)  # type: ignore[arg-type]
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
        raise unreachable(url, exc) from exc


async def aconnect(url: str, *, autocommit: bool = True, **kwargs: object) -> psycopg.AsyncConnection:
    try:
        return await psycopg.AsyncConnection.connect(url, autocommit=autocommit, connect_timeout=5, **kwargs)  # type: ignore[arg-type]
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
        raise unreachable(url, exc) from exc


# -- pools ------------------------------------------------------------------------------

def _has_input(conn: Any) -> bool:
    """Whether an idle connection has something to read. It should not: the server only
    speaks when asked, except when it hangs up (a restart, a failover, pg_terminate_backend:
    it sends a FATAL message and closes) or, rarely, to report a changed setting. One
    zero-timeout select(), no round trip."""
    try:
        return bool(select.select([conn.fileno()], [], [], 0)[0])
    except (OSError, ValueError, psycopg.Error):
        return True


class Pool(ConnectionPool):
    """A psycopg pool that never hands out a connection the server has closed.

    psycopg_pool notices a dead connection only when it is used, so after a Postgres restart
    the first caller of each idle connection got an error (AdminShutdown). A connection with
    unexpected input is checked with a round trip (an empty query) and, if dead, replaced
    before anyone sees it. Nothing is retried: the caller's statement has not been sent yet.
    (The pool's own `check=` hook would do the same, but waits a second between attempts.)"""

    def getconn(self, timeout: float | None = None) -> Any:
        for _ in range(self.max_size):
            conn = super().getconn(timeout)
            if not _has_input(conn):
                return conn
            try:
                self.check_connection(conn)
                return conn
            except psycopg.Error:
                self.putconn(conn)  # broken: the pool drops it and opens another
        return super().getconn(timeout)


class AsyncPool(AsyncConnectionPool):
    """Pool, for asyncio; and one that never makes its loop's shutdown hang.

    psycopg_pool counts a cancelled connection attempt as a failed one: it schedules another
    and its worker task lives on, waiting for work. So a loop that ends (asyncio.run(),
    a test's loop) while a pool it never closed is opening a connection, after a restart
    or a pool growing, waited forever for that task to finish (seen in our tests: about one
    run in 20 of tests/jobs/test_jobs_pools.py). livepush opens pools on the caller's loop
    for aenqueue() and apublish(), which the caller has no reason to close. So each pool
    keeps a guard task on its loop: when the loop's shutdown cancels the guard with every
    other task, the guard closes the pool, which stops its workers."""

    _guard: asyncio.Task[None] | None = None

    async def open(self, wait: bool = False, timeout: float = 30.0) -> None:
        await super().open(wait=wait, timeout=timeout)
        if self._guard is None:
            self._guard = asyncio.get_running_loop().create_task(self._close_at_shutdown(),
                                                                 name=f"{self.name}-close-at-shutdown")

    async def _close_at_shutdown(self) -> None:
        try:
            await asyncio.get_running_loop().create_future()  # done only by cancellation
        except asyncio.CancelledError:
            self._guard = None
            await self.close()
            raise

    async def close(self, timeout: float = 5.0) -> None:
        guard, self._guard = self._guard, None
        if guard is not None and guard is not asyncio.current_task():
            guard.cancel()
        await super().close(timeout)

    async def getconn(self, timeout: float | None = None) -> Any:
        for _ in range(self.max_size):
            conn = await super().getconn(timeout)
            if not _has_input(conn):
                return conn
            try:
                await self.check_connection(conn)
                return conn
            except psycopg.Error:
                await self.putconn(conn)
        return await super().getconn(timeout)
