"""Connection pools: `Pool` and `AsyncPool` (psycopg_pool, hardened), and `LoopPools`, the one
way any part of livepush holds pools for a database: one sync pool per process, one async pool
per event loop, each opened on first use.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import select
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

from .connect import PoolBusy, PoolUnreachable, aconnect, connect, connect_defaults, connection_options, translate

OPEN_TIMEOUT = 5.0  # seconds a first use waits for the pool's first connection
# The longest a pool waits between two attempts to connect again, as the listeners (listener.py):
# psycopg_pool doubles its delay up to minutes, so after an outage of N seconds its next attempt
# came up to N seconds after Postgres was back, and every call waited for it meanwhile.
RECONNECT_CAP = 1.0


def _capped(attempt: AttemptWithBackoff | None) -> AttemptWithBackoff | None:
    """`attempt` with its delay held where psycopg_pool's doubling (AttemptWithBackoff.update_delay,
    which runs after a failed attempt) makes the next one RECONNECT_CAP at most. It still gives up
    after the pool's reconnect_timeout; the next caller then starts a new attempt at once."""
    if attempt is not None:
        attempt.delay = min(attempt.delay, RECONNECT_CAP / AttemptWithBackoff.DELAY_BACKOFF)
    return attempt


log = logging.getLogger("livepush.postgres.pools")


class _QuietReconnects(logging.Filter):
    """psycopg_pool logs every failed attempt to connect at WARNING, two lines each: with an
    attempt a second per pool, a process logged several a second for as long as Postgres was down,
    in the driver's words (a host and port, no database, nothing of what livepush does meanwhile).
    Of livepush's pools (named "livepush-..."), the failures are said by `_ConnectFailures` instead;
    the rest of psycopg_pool's lines, and other pools', pass untouched."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (record.msg == "error connecting in %r: %s" and isinstance(args, tuple) and args
                    and str(args[0]).startswith("livepush-"))


class _ConnectFailures:
    """What a pool knows of its attempts to connect: the error of the last one while they fail
    (None once one succeeds), so that a caller whose wait ran out is told why; and a WARNING in
    livepush's words, saying the database and what to do, at the first failure of a run (at most
    once a minute per pool name, should connections come and go: a run that began within that
    minute is said at its first failure past it). Not again while the run lasts:
    the listener says a long outage once a minute, and the calls that fail say what they failed;
    each of a process's pools saying it too made a minute's outage a dozen lines."""

    EVERY = 60.0
    _said: ClassVar[dict[str, float]] = {}  # pool name -> when its failure was last said (monotonic)

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        self.last: BaseException | None = None
        # Whether this run of failures was said: one that began within a minute of the last line
        # is said once that minute is out, not kept quiet for as long as it lasts.
        self._run_said = False

    def failed(self, exc: BaseException) -> None:
        self.last = exc
        now = time.monotonic()
        if not self._run_said and now - self._said.get(self.name, -self.EVERY) >= self.EVERY:
            self._said[self.name] = now
            self._run_said = True
            log.warning("the Postgres pool %s cannot connect, trying again about every %g s (said once until it "
                        "connects): %s", self.name, RECONNECT_CAP, translate(self.url, exc))

    def connected(self) -> None:
        self.last = None
        self._run_said = False


class _QuietHandBacks(logging.Filter):
    """psycopg_pool logs a WARNING for each connection handed back to it broken ("discarding
    closed connection: <psycopg.AsyncConnection [BAD] at 0x...>") or in a failed transaction
    ("rolling back returned connection: <... [INERROR] ...>"), then mends it. Of livepush's
    pools (`_handing_back`) neither line says anything its caller was not told: a closed one's
    loss shows in the error its caller got, or in the listener's line (after a Postgres restart
    a server logged one per pooled connection), and a failed transaction is the error its caller
    got, or a statement cancelled mid-way by a stop, which a runtime's shutdown does by design.
    Other pools' lines, and a transaction handed back open without an error, pass untouched."""

    QUIET = {"discarding closed connection: %s": psycopg.pq.TransactionStatus.UNKNOWN,
             "rolling back returned connection: %s": psycopg.pq.TransactionStatus.INERROR}

    def filter(self, record: logging.LogRecord) -> bool:
        args, status = record.args, self.QUIET.get(record.msg)
        return not (status is not None and isinstance(args, tuple) and args
                    and _HANDED_BACK.get(args[0]) == status)


# Connections of livepush's pools handed back broken or in a failed transaction (their status
# then), until the pool has mended or replaced them.
_HANDED_BACK: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _handing_back(conn: Any) -> None:
    """Note `conn`, about to go back to a livepush pool, if psycopg_pool will mend it with a
    WARNING that says nothing new: closed by the server (its transaction status is unknown), or
    in a failed transaction."""
    status = conn.info.transaction_status
    if status in _QuietHandBacks.QUIET.values():
        _HANDED_BACK[conn] = status
    elif _HANDED_BACK:  # almost always empty: a healthy hand-back makes no weak reference
        _HANDED_BACK.pop(conn, None)


logging.getLogger("psycopg.pool").addFilter(_QuietReconnects())
logging.getLogger("psycopg.pool").addFilter(_QuietHandBacks())


# A statement that is atomic on its own runs in one round trip in autocommit, where BEGIN, the
# statement and COMMIT were three. The pooled connection goes back in transaction mode (unless
# it broke: the pool then discards it).
@contextlib.contextmanager
def autocommitted(conn: psycopg.Connection) -> Iterator[psycopg.Connection]:
    conn.autocommit = True
    try:
        yield conn
    finally:
        if not conn.closed:
            conn.autocommit = False


@contextlib.asynccontextmanager
async def aautocommitted(conn: psycopg.AsyncConnection) -> AsyncIterator[psycopg.AsyncConnection]:
    await conn.set_autocommit(True)
    try:
        yield conn
    finally:
        if not conn.closed:
            await conn.set_autocommit(False)


def _has_input(conn: Any) -> bool:
    """Whether an idle connection has something to read. It should not: the server only
    speaks when asked, except when it hangs up (a restart, a failover, pg_terminate_backend:
    it sends a FATAL message and closes) or, rarely, to report a changed setting. One
    zero-timeout poll(), no round trip: select() refuses a descriptor past 1024, which a process
    with many sockets open (a server's clients) gives every new connection, and its error read
    as input waiting, so each use of such a connection paid a check's round trip."""
    try:
        if _poll is None:
            return bool(select.select([conn.fileno()], [], [], 0)[0])
        poller = _poll()
        poller.register(conn.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):
        return True


_poll = getattr(select, "poll", None)  # Windows has no poll()


def closed_while_idle(conn: psycopg.Connection) -> bool:
    """Whether the server closed an idle connection: no round trip unless it has input waiting,
    which a live one rarely has; then one (an empty query) tells a goodbye from a changed
    setting's report. Every holder of an idle connection checks it here before using it."""
    if not _has_input(conn):
        return False
    try:
        Pool.check_connection(conn)
        return False
    except psycopg.Error:
        return True


async def aclosed_while_idle(conn: psycopg.AsyncConnection) -> bool:
    """closed_while_idle(), for an async connection."""
    if not _has_input(conn):
        return False
    try:
        await AsyncPool.check_connection(conn)
        return False
    except psycopg.Error:
        return True


def _busy(pool: Pool | AsyncPool, timeout: float | None) -> PoolTimeout | None:
    """Why a wait for a connection ran out: PoolUnreachable while the pool's attempts to connect
    fail (it counts a connection it is trying to replace as held, so it looks busy then too);
    PoolBusy when it holds every connection it may open, none free (busy, not short of
    connections); None otherwise."""
    failure = pool.connect_failures.last
    if failure is not None:
        return PoolUnreachable(pool.name, pool.timeout if timeout is None else timeout, failure)
    stats = pool.get_stats()
    if stats.get("pool_size", 0) >= pool.max_size and stats.get("pool_available", 0) == 0:
        return PoolBusy(pool.name, pool.max_size, pool.timeout if timeout is None else timeout)
    return None


# Every transaction of livepush's own begins READ COMMITTED, whatever the database's or role's
# default_transaction_isolation: its decisions (a group's finish, a workflow's next steps) read in
# a later statement what the holder of a lock committed, which a REPEATABLE READ transaction's
# first snapshot would not show. Said in each BEGIN (psycopg writes it there), not SET for the
# session: a transaction-mode PgBouncer would hand that setting on to other clients.
def _read_committed(conn: psycopg.Connection) -> None:
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED


async def _aread_committed(conn: psycopg.AsyncConnection) -> None:
    await conn.set_isolation_level(psycopg.IsolationLevel.READ_COMMITTED)


class Pool(ConnectionPool):
    """A psycopg pool that never hands out a connection the server has closed.

    psycopg_pool notices a dead connection only when it is used, so after a Postgres restart
    the first caller of each idle connection got an error (AdminShutdown). A connection with
    unexpected input is checked with a round trip (an empty query) and, if dead, replaced
    before anyone sees it. Nothing is retried: the caller's statement has not been sent yet.
    (The pool's own `check=` hook would do the same, but waits a second between attempts.)
    It tries to connect again at least every RECONNECT_CAP seconds while it is short of
    connections."""

    def __init__(self, conninfo: str, **kwargs: Any) -> None:
        self.connect_failures = _ConnectFailures(str(kwargs.get("name") or "pool"), conninfo)
        super().__init__(conninfo, **kwargs)

    def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        super()._add_connection(_capped(attempt), growing)

    def _connect(self, timeout: float | None = None) -> Any:
        try:
            conn = super()._connect(timeout)
        except Exception as exc:
            self.connect_failures.failed(exc)
            raise
        self.connect_failures.connected()
        return conn

    def getconn(self, timeout: float | None = None) -> Any:
        try:
            return self._checked_conn(timeout)
        except PoolTimeout:
            busy = _busy(self, timeout)
            if busy is None:
                raise
            raise busy from None

    def _checked_conn(self, timeout: float | None) -> Any:
        for _ in range(self.max_size):
            conn = super().getconn(timeout)
            if not closed_while_idle(conn):
                return conn
            self.putconn(conn)  # broken: the pool drops it and opens another
        return super().getconn(timeout)

    def putconn(self, conn: Any) -> None:
        _handing_back(conn)
        super().putconn(conn)


class AsyncPool(AsyncConnectionPool):
    """Pool, for asyncio; and one that never makes its loop's shutdown hang.

    psycopg_pool counts a cancelled connection attempt as a failed one: it schedules another
    and its worker task lives on. So a loop that ends (asyncio.run(), a test's loop) while a
    pool it never closed is opening a connection waits forever for that task. livepush opens
    pools on the caller's loop (aenqueue(), apublish()), which the caller has no reason to
    close, so each pool keeps a guard task on its loop: when the loop's shutdown cancels the
    guard with every other task, the guard closes the pool, which stops its workers."""

    _guard: asyncio.Task[None] | None = None

    def __init__(self, conninfo: str, **kwargs: Any) -> None:
        self.connect_failures = _ConnectFailures(str(kwargs.get("name") or "pool"), conninfo)
        super().__init__(conninfo, **kwargs)

    async def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        await super()._add_connection(_capped(attempt), growing)

    async def _connect(self, timeout: float | None = None) -> Any:
        try:
            conn = await super()._connect(timeout)
        except Exception as exc:
            self.connect_failures.failed(exc)
            raise
        self.connect_failures.connected()
        return conn

    async def open(self, wait: bool = False, timeout: float = 30.0) -> None:
        # The guard first: an open cancelled while it waits for its first connections has
        # started workers already.
        if self._guard is None:
            self._guard = asyncio.get_running_loop().create_task(self._close_at_shutdown(),
                                                                 name=f"{self.name}-close-at-shutdown")
        await super().open(wait=wait, timeout=timeout)

    async def _close_at_shutdown(self) -> None:
        try:
            await asyncio.get_running_loop().create_future()  # done only by cancellation
        except asyncio.CancelledError:
            self._guard = None
            # The shutdown has cancelled the pool's workers too, and close() waits for them with
            # asyncio.gather(), which raises their CancelledError before close() reaches the idle
            # connections: those stayed open on the server until a garbage collection found them.
            idle = list(self._pool)
            try:
                await self.close()
            finally:
                for conn in idle:
                    await conn.close()
            raise

    async def close(self, timeout: float = 5.0) -> None:
        guard, self._guard = self._guard, None
        if guard is not None and guard is not asyncio.current_task():
            guard.cancel()
        await super().close(timeout)

    async def getconn(self, timeout: float | None = None) -> Any:
        try:
            return await self._checked_conn(timeout)
        except PoolTimeout:
            busy = _busy(self, timeout)
            if busy is None:
                raise
            raise busy from None

    async def _checked_conn(self, timeout: float | None) -> Any:
        for _ in range(self.max_size):
            conn = await super().getconn(timeout)
            if not await aclosed_while_idle(conn):
                return conn
            await self.putconn(conn)
        return await super().getconn(timeout)

    async def putconn(self, conn: Any) -> None:
        _handing_back(conn)
        await super().putconn(conn)


# Every LoopPools of the process, so that a forked child can drop what it inherited.
_EVERY: weakref.WeakSet[LoopPools] = weakref.WeakSet()
# What a forked child inherited: kept, never used, closed nor collected. Its connections are the
# parent's sockets: a query on one mixes the two processes' messages on one session (both fail or
# hang), closing one sends the server a Terminate that ends the parent's session, and collecting a
# pool takes locks a parent thread may have held at the fork.
_INHERITED: list[Any] = []


def _forget_after_fork() -> None:
    for pools in list(_EVERY):
        pools.forget_inherited()


os.register_at_fork(after_in_child=_forget_after_fork)


class LoopPools:
    """The pools of one database for one owner (the fan-out, the jobs, the revocation store,
    state topics): `sync()` for threads, `await aget()` for the running event loop.

    An async pool belongs to the loop that opened it (its connections and tasks do), so there
    is one per loop, forgotten with its loop. The first use of each pool makes one direct
    connection first: a refused or misconfigured database fails at once with our error, where
    a pool would retry in the background until its timeout. Connections are in autocommit
    unless `autocommit=False`; `prepare_threshold=0` prepares a repeated statement from its
    first run (set by owners whose few statements run again and again). With
    LIVEPUSH_PREPARED_STATEMENTS=off no pool prepares anything (connect.connection_options). A
    forked child never uses the pools it inherited: its first use opens its own."""

    def __init__(self, url: str, *, name: str, max_size: int = 4, autocommit: bool = True,
                 prepare_threshold: int | None = None, min_size: int = 1) -> None:
        self.url = url
        self.name = name
        self.max_size = max_size
        self.min_size = min_size
        self._kwargs: dict[str, Any] = {"autocommit": autocommit, **connect_defaults(url)}
        if prepare_threshold is not None:
            self._kwargs["prepare_threshold"] = prepare_threshold
        self._lock = threading.Lock()
        self._map_lock = threading.Lock()
        self._sync: Pool | None = None
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncPool] = weakref.WeakKeyDictionary()
        self._opening: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()
        # The last failed first use (when, monotonic, and its error): see _failed_since().
        self._failed: tuple[float, Exception] | None = None
        _EVERY.add(self)

    def _failed_since(self, asked: float) -> None:
        """Raise the error of a first use that failed after `asked` (while this caller waited for
        the lock it held). Each caller in line made an attempt of its own, so while the database
        did not answer the Nth caller waited N connect timeouts, far past what a call promises."""
        failed = self._failed
        if failed is not None and failed[0] >= asked:
            raise copy.copy(failed[1]) from None

    def _fail(self, exc: Exception) -> None:
        self._failed = (time.monotonic(), exc)

    def forget_inherited(self) -> None:
        """In a forked child: start afresh, the next use opening pools of the child's own."""
        _INHERITED.append((self._sync, dict(self._async), self._lock))
        self._lock = threading.Lock()  # a thread of the parent may have held it at the fork
        self._map_lock = threading.Lock()
        self._sync = None
        self._async = weakref.WeakKeyDictionary()
        self._opening = weakref.WeakKeyDictionary()

    def sync(self) -> Pool:
        asked = time.monotonic()
        with self._lock:
            if self._sync is None:
                self._failed_since(asked)
                try:
                    self._sync = self._open_sync()
                except Exception as exc:
                    self._fail(exc)
                    raise
            return self._sync

    def _open_sync(self) -> Pool:
        connect(self.url).close()  # fails fast, translated
        pool = Pool(self.url, min_size=self.min_size, max_size=self.max_size, open=False,
                    kwargs=connection_options(dict(self._kwargs)), name=f"{self.name}-sync",
                    configure=_read_committed)
        try:
            pool.open(wait=True, timeout=OPEN_TIMEOUT)
        except Exception as exc:
            pool.close()
            raise translate(self.url, exc) from None
        return pool

    async def aget(self) -> AsyncPool:
        loop = asyncio.get_running_loop()
        pool = self._async.get(loop)
        if pool is not None and not pool.closed:
            return pool
        lock = self._opening.get(loop)
        if lock is None:
            lock = self._opening[loop] = asyncio.Lock()
        asked = time.monotonic()
        async with lock:  # several first uses at once share one pool rather than each opening one
            pool = self._async.get(loop)
            if pool is not None and not pool.closed:
                return pool
            self._failed_since(asked)
            try:
                pool = await self._open_async()
            except Exception as exc:
                self._fail(exc)
                raise
            # A pool holds its loop (its tasks and connections do), so the weak mapping never
            # drops an ended loop by itself: sync code running asyncio.run() per call would keep
            # a pool for every call. Under a lock of its own (the sync pool's is held through a
            # connect): loops of other threads add theirs meanwhile, and a mapping that grows while
            # it is read raises RuntimeError.
            with self._map_lock:
                for ended in [old for old in self._async if old.is_closed()]:
                    del self._async[ended]
                    self._opening.pop(ended, None)
                self._async[loop] = pool
            return pool

    async def _open_async(self) -> AsyncPool:
        await (await aconnect(self.url)).close()
        pool = AsyncPool(self.url, min_size=self.min_size, max_size=self.max_size, open=False,
                         kwargs=connection_options(dict(self._kwargs)), name=f"{self.name}-async",
                         configure=_aread_committed)
        try:
            await pool.open(wait=True, timeout=OPEN_TIMEOUT)
        except BaseException as exc:  # a cancelled open too: its workers would retry for ever
            await pool.close()
            if isinstance(exc, Exception):
                raise translate(self.url, exc) from None
            raise
        return pool

    async def release_loop(self) -> None:
        """Close the running loop's pool (a loop about to end); the next use opens a new one."""
        with self._map_lock:
            pool = self._async.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()

    async def aclose(self) -> None:
        """Close the running loop's pool and the sync pool."""
        await self.release_loop()
        self.close()

    def close(self) -> None:
        """Close the sync pool and forget the async ones (their loops close them)."""
        with self._lock:
            pool, self._sync = self._sync, None
        if pool is not None:
            pool.close()
        with self._map_lock:
            self._async.clear()
