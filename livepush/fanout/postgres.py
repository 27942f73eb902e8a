"""The Postgres fan-out: a message log plus LISTEN/NOTIFY as the doorbell.

publish() calls `livepush_publish()` (sql/0001_history.sql): one round trip that assigns the
offset under the topic's row lock, logs the message and NOTIFYs, in the caller's
transaction when `conn=` is given. Offsets are the per-topic sequence numbers, so they are
gap-free and in commit order; a receiver that sees a number jump reads the rest from the log.
An offset is "EPOCH-SEQ": the epoch changes only when a crash emptied the (unlogged)
history tables, so an offset from before a crash can never be mistaken for a newer one.

The listener is one dedicated connection (application_name `livepush-listener`). When it
drops it reconnects with capped, jittered backoff, LISTENs again, and only then runs the
resync handlers, which read what was missed from the log: listen first, then catch up.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from ..postgres import connect as db
from ..postgres.connect import AsyncPool, Pool
from ..errors import DependencyError, ListenError
from ..types import JSON, Message, Offset, Topic
from .base import FanOut, encode_payload

log = logging.getLogger("livepush.fanout.postgres")

CHANNEL = "livepush"
LISTENER_APP_NAME = "livepush-listener"
# A missed range longer than this is answered with `reset` rather than read into memory.
MAX_REPLAY = 50_000
PRUNE_BATCH = 5_000
# How often an idle listener proves its connection is alive.
LISTENER_PING_SECONDS = 5.0

# name: publish -- see livepush_publish(): ordered per topic by the topic row's lock.
PUBLISH = "SELECT livepush_publish(%s, %s)"
# name: latest_offset -- a committed value; no row for a topic never published ("0").
LATEST = "SELECT epoch, last_seq FROM livepush_topics WHERE topic = %s"
# name: history -- read after LATEST, capped at its value: rows past it may commit meanwhile
# and belong to the live stream; rows missing below it were pruned (the caller resets).
# The view adds the "enqueued" events a bulk enqueue derives rather than stores (sql/0010).
HISTORY = """
SELECT seq, data, created_at >= now() - make_interval(secs => %s) AS fresh
FROM livepush_history
WHERE topic = %s AND seq > %s AND seq <= %s
ORDER BY seq
"""
# name: prune -- bounded per call; concurrent servers pruning at once only delete rows twice
# over in the sense of racing for the same ones, which DELETE tolerates.
PRUNE = """
DELETE FROM livepush_messages WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM livepush_messages
    WHERE created_at < now() - make_interval(secs => %s)
    LIMIT %s))
"""


# The offset of a topic nothing was published on yet: "before the first message" of
# whatever epoch the topic's first publish starts.
ORIGIN = "0"


def _offset(epoch: int, seq: int) -> Offset:
    return f"{epoch}-{seq}"


def _latest(row: tuple[int, int] | None) -> Offset:
    return _offset(row[0], row[1]) if row else ORIGIN


def _parse_offset(since: Offset) -> tuple[int | None, int] | None:
    """(epoch, seq), with epoch None for ORIGIN; None for anything malformed."""
    if since == ORIGIN:
        return None, 0
    epoch_text, sep, seq_text = since.partition("-")
    if not sep or not epoch_text.isdigit() or not seq_text.isdigit():
        return None
    return int(epoch_text), int(seq_text)


def _parse_notification(payload: str) -> Message | None:
    head, sep, data = payload.partition("\n")
    offset, _, topic = head.partition(" ")
    parsed = _parse_offset(offset)
    if parsed is None or parsed[0] is None:
        return None
    epoch, seq = parsed
    return Message(topic, offset, _offset(epoch, seq - 1), data if sep else None)


class PostgresFanOut(FanOut):
    name = "postgres"

    def __init__(self, url: str, *, history_ttl: float = 300.0) -> None:
        super().__init__()
        self.url = url
        self.history_ttl = history_ttl
        self._sync_pool: ConnectionPool | None = None
        self._sync_lock = threading.Lock()
        self._apool: AsyncConnectionPool | None = None
        self._apool_loop: asyncio.AbstractEventLoop | None = None
        self._apool_lock: asyncio.Lock | None = None
        self._apool_lock_loop: asyncio.AbstractEventLoop | None = None
        self._listener_task: asyncio.Task[None] | None = None
        self._listening = False
        self._closing = False

    # -- connections ------------------------------------------------------------------
    def _pool(self) -> ConnectionPool:
        with self._sync_lock:
            if self._sync_pool is None:
                pool = Pool(self.url, min_size=1, max_size=4, open=False, kwargs={"autocommit": True})
                try:
                    pool.open(wait=True, timeout=5)
                except psycopg.pool.PoolTimeout as exc:
                    pool.close()
                    raise db.unreachable(self.url, exc) from exc
                self._sync_pool = pool
            return self._sync_pool

    async def _apool_get(self) -> AsyncConnectionPool:
        loop = asyncio.get_running_loop()
        if self._apool is not None and self._apool_loop is loop:
            return self._apool
        if self._apool_lock is None or self._apool_lock_loop is not loop:
            self._apool_lock, self._apool_lock_loop = asyncio.Lock(), loop
        # Several first publishes at once must share one pool, not each open (and leak) one.
        async with self._apool_lock:
            if self._apool is None or self._apool_loop is not loop:
                pool = AsyncPool(self.url, min_size=1, max_size=4, open=False, kwargs={"autocommit": True})
                try:
                    await pool.open(wait=True, timeout=5)
                except psycopg.pool.PoolTimeout as exc:
                    await pool.close()
                    raise db.unreachable(self.url, exc) from exc
                self._apool, self._apool_loop = pool, loop
        return self._apool

    # -- publishing -------------------------------------------------------------------
    def publish(self, topic: Topic, data: JSON, *, conn: Any = None) -> Offset:
        text = encode_payload(data)
        if conn is not None:
            if not isinstance(conn, psycopg.Connection):
                raise TypeError("publish(conn=) takes a psycopg.Connection; use apublish() for an AsyncConnection")
            row = conn.execute(PUBLISH, (topic, text)).fetchone()
        else:
            try:
                with self._pool().connection() as c:
                    row = c.execute(PUBLISH, (topic, text)).fetchone()
            except psycopg.OperationalError as exc:
                raise db.unreachable(self.url, exc) from exc
        assert row is not None
        return str(row[0])

    async def apublish(self, topic: Topic, data: JSON, *, conn: Any = None) -> Offset:
        text = encode_payload(data)
        if conn is not None:
            if not isinstance(conn, psycopg.AsyncConnection):
                raise TypeError("apublish(conn=) takes a psycopg.AsyncConnection; use publish() for a sync Connection")
            cur = await conn.execute(PUBLISH, (topic, text))
            row = await cur.fetchone()
        else:
            try:
                async with (await self._apool_get()).connection() as c:
                    cur = await c.execute(PUBLISH, (topic, text))
                    row = await cur.fetchone()
            except psycopg.OperationalError as exc:
                raise db.unreachable(self.url, exc) from exc
        assert row is not None
        return str(row[0])

    # -- listening --------------------------------------------------------------------
    async def listen(self) -> None:
        if self._listen_called:
            raise RuntimeError("listen() was already called on this fan-out: call it once, at boot")
        try:
            conn = await self._connect_listener()
        except (DependencyError, psycopg.Error) as exc:
            raise ListenError(str(exc).splitlines()[0]) from exc
        self._listen_called = True
        self._listening = True
        self._listener_task = asyncio.create_task(self._listen_loop(conn), name="livepush-pg-listener")

    async def _connect_listener(self) -> psycopg.AsyncConnection:
        conn = await db.aconnect(self.url, application_name=LISTENER_APP_NAME)
        await conn.execute(f"LISTEN {CHANNEL}")
        return conn

    @property
    def listening(self) -> bool:
        return self._listening

    async def _listen_loop(self, conn: psycopg.AsyncConnection) -> None:
        attempt = 0
        while not self._closing:
            try:
                while not self._closing:
                    async for note in conn.notifies(timeout=LISTENER_PING_SECONDS):
                        message = _parse_notification(note.payload)
                        if message is not None:
                            self._dispatch(message)
                    await conn.execute("SELECT 1")  # a silent network drop shows up here
            except (psycopg.Error, OSError) as exc:
                if self._closing:
                    break
                self._listening = False
                log.warning("Postgres listener lost (%s); reconnecting", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            finally:
                await conn.close()
            while not self._closing:
                attempt += 1
                delay = min(5.0, 0.1 * 2 ** min(attempt, 10)) * random.uniform(0.5, 1.5)
                await asyncio.sleep(delay)
                try:
                    conn = await self._connect_listener()
                except (DependencyError, psycopg.Error):
                    continue
                attempt = 0
                self._listening = True
                log.warning("Postgres listener is back; reading what was missed from history")
                try:
                    await self._resynced()
                except Exception:
                    log.exception("resync after listener reconnect failed")
                break

    # -- history ----------------------------------------------------------------------
    async def history(self, topic: Topic, since: Offset) -> list[Message] | None:
        parsed = _parse_offset(since)
        if parsed is None:
            return None
        since_epoch, after = parsed
        async with (await self._apool_get()).connection() as c:
            cur = await c.execute(LATEST, (topic,))
            row = await cur.fetchone()
            if row is None:
                return [] if after == 0 else None  # nothing published yet (or since a crash)
            epoch, last = row
            if since_epoch not in (None, epoch):
                return None  # an offset from before a crash emptied the history
            if after > last or last - after > MAX_REPLAY:
                return None
            if after == last:
                return []
            cur = await c.execute(HISTORY, (self.history_ttl, topic, after, last))
            rows = await cur.fetchall()
        # Never a silent hole: every seq in (after, last] must be here and unexpired.
        if len(rows) != last - after or rows[0][0] != after + 1 or not rows[0][2]:
            return None
        return [Message(topic, _offset(epoch, seq), _offset(epoch, seq - 1), data) for seq, data, _fresh in rows]

    def latest_offset(self, topic: Topic) -> Offset:
        try:
            with self._pool().connection() as c:
                row = c.execute(LATEST, (topic,)).fetchone()
        except psycopg.OperationalError as exc:
            raise db.unreachable(self.url, exc) from exc
        return _latest(row)

    async def alatest_offset(self, topic: Topic) -> Offset:
        async with (await self._apool_get()).connection() as c:
            cur = await c.execute(LATEST, (topic,))
            return _latest(await cur.fetchone())

    async def prune(self) -> int:
        async with (await self._apool_get()).connection() as c:
            cur = await c.execute(PRUNE, (self.history_ttl, PRUNE_BATCH))
            return cur.rowcount

    # -- closing ----------------------------------------------------------------------
    async def release_loop(self) -> None:
        # A pool left open when its loop ends has its tasks cancelled mid-connect, which
        # psycopg can turn into a connection error the pool then retries: the loop's
        # shutdown never returns. Close it while the loop still runs.
        if self._apool is not None and self._apool_loop is asyncio.get_running_loop():
            pool, self._apool, self._apool_loop = self._apool, None, None
            await pool.close()

    async def aclose(self) -> None:
        self._closing = True
        self._listening = False
        if self._listener_task is not None:
            self._listener_task.cancel()
            try:
                await self._listener_task
            except (asyncio.CancelledError, Exception):
                pass
            self._listener_task = None
        if self._apool is not None:
            await self._apool.close()
            self._apool = None
        self.close()

    def close(self) -> None:
        with self._sync_lock:
            if self._sync_pool is not None:
                self._sync_pool.close()
                self._sync_pool = None
