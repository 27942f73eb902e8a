"""The Redis fan-out: pub/sub carries live messages, one stream per topic keeps history.

Layout in Redis:
- `livepush:h:<topic>`: a stream; each entry is one message, fields `d` (the JSON text)
  and `p` (the id of the entry before it on the topic, "0-0" for the first). The entry
  id is the message's offset ("<ms>-<seq>", ordered by `offset_key`).
- `livepush:pub`: the one pub/sub channel every listening server subscribes to. A frame
  is "<topic>\\n<offset>\\n<prev>\\n<json>": a receiver splits three newlines off the
  front and never parses the payload (topics and compact JSON hold no raw newline).

Why a chain of `p` fields: a stream id alone cannot tell "nothing happened after X" from
"what came after X was trimmed or lost in a restart without persistence". Each entry
names its predecessor, so `history()` checks every link and answers None (the client
gets `reset`) at the first break: recovery is complete or refused, never partial.

One Lua script appends, trims and PUBLISHes, so the stream order, the offsets and the
pub/sub order are the same order, whatever number of processes publish at once.

Retention: trimmed by age (MINID, history_ttl) and by length (MAXLEN, `max_len`) at each
publish and by `prune()`; the newest entry of a topic is kept past the TTL so the chain
stays anchored (`since` == the latest offset replays nothing rather than `reset`). A
topic idle for `idle_expire` seconds loses its key: its next message starts a new chain
and a client still holding an older offset gets `reset`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aredis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from ..errors import DependencyError, ListenError
from ..types import JSON, Message, Offset, Topic
from .base import FanOut, encode_payload

logger = logging.getLogger("livepush.fanout.redis")

CHANNEL = "livepush:pub"
KEY_PREFIX = "livepush:h:"
FIRST_PREV = "0-0"  # the "offset before the first message" of every topic
_STREAM_ID = re.compile(r"\d{1,20}-\d{1,20}")

# KEYS[1] stream; ARGV: topic, json, ttl_ms, max_len, idle_ms, channel.
# Redis 7 replicates a script's effects, so TIME inside it is allowed and consistent
# with the ids XADD generates (both are the server's clock).
_PUBLISH_LUA = """
local key = KEYS[1]
local newest = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
local prev = '0-0'
if #newest > 0 then prev = newest[1][1] end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local min_ms = now_ms - tonumber(ARGV[3])
if min_ms < 0 then min_ms = 0 end
-- MINID ~ never drops the entry being added (its id is >= now), and drops whole
-- radix nodes only, which keeps the trim O(1) amortized.
local id = redis.call('XADD', key, 'MINID', '~', string.format('%d', min_ms), '*', 'd', ARGV[2], 'p', prev)
redis.call('XTRIM', key, 'MAXLEN', '~', ARGV[4])
redis.call('PEXPIRE', key, ARGV[5])
redis.call('PUBLISH', ARGV[6], ARGV[1] .. '\\n' .. id .. '\\n' .. prev .. '\\n' .. ARGV[2])
return id
"""

# KEYS[1] stream; ARGV: ttl_ms. Drops entries older than the TTL but keeps the newest
# one, which anchors the chain (see the module docstring). Returns entries dropped.
_PRUNE_LUA = """
local key = KEYS[1]
local newest = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
if #newest == 0 then return 0 end
local t = redis.call('TIME')
local cutoff = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(ARGV[1])
local newest_ms = tonumber(string.match(newest[1][1], '^(%d+)'))
local minid = string.format('%d', cutoff)
if newest_ms < cutoff then minid = newest[1][1] end
return redis.call('XTRIM', key, 'MINID', minid)
"""

# History is read in pages so a long replay of large payloads never builds one huge reply.
HISTORY_PAGE = 200
# Keys visited per prune() call: bounded work however many topics exist.
PRUNE_SCAN_COUNT = 200


def _redact(url: str) -> str:
    """The URL without its password, safe for an error line."""
    try:
        parts = urlsplit(url)
        if parts.password:
            host = parts.hostname or ""
            if parts.port:
                host = f"{host}:{parts.port}"
            user = f"{parts.username}:***@" if parts.username else ":***@"
            return urlunsplit(parts._replace(netloc=user + host))
        return url
    except ValueError:
        return "(unparseable URL)"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class RedisFanOut(FanOut):
    """Fan-out over Redis pub/sub with per-topic streams as history.

    `history_ttl`: seconds a message stays recoverable. `max_len`: about how many entries a
    topic keeps at most (a memory bound; past it old offsets get `reset`). `idle_expire`:
    seconds after its last message a topic's key is dropped. `heartbeat`: seconds of silence
    after which the listener PINGs; three silent beats count as a lost connection.
    `backoff`: first and largest reconnect delay, each jittered to 50-150 %.
    """

    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        history_ttl: float = 300.0,
        max_len: int = 10_000,
        idle_expire: float = 86_400.0,
        heartbeat: float = 5.0,
        backoff: tuple[float, float] = (0.1, 5.0),
        connect_timeout: float = 5.0,
    ) -> None:
        super().__init__()
        self.url = url
        self.history_ttl = history_ttl
        self.max_len = max_len
        # A key must outlive its history, or a live topic would lose its chain.
        self.idle_expire = max(idle_expire, 2 * history_ttl)
        self.heartbeat = heartbeat
        self.backoff = backoff
        self.connect_timeout = connect_timeout
        self._shown_url = _redact(url)
        self._ttl_ms = int(history_ttl * 1000)
        self._publish_args_tail = [self._ttl_ms, max_len, int(self.idle_expire * 1000), CHANNEL]

        # Sync side (publish from any thread, latest_offset): created on first use, so
        # constructing a fan-out never touches the network.
        self._sync_lock = threading.Lock()
        self._sync: redis.Redis | None = None
        self._sync_publish: Any = None
        # Async side: redis.asyncio connections belong to the loop that made them.
        self._async: aredis.Redis | None = None
        self._async_loop: asyncio.AbstractEventLoop | None = None
        self._async_publish: Any = None
        self._async_prune: Any = None
        self._prune_cursor = 0

        # Listening side: exists only after listen().
        self._listen_pool: aredis.ConnectionPool | None = None
        self._conn: Any = None  # the subscribed redis.asyncio Connection
        self._listening = False
        self._task: asyncio.Task[None] | None = None

    # -- errors -----------------------------------------------------------------------
    def _error(self, exc: BaseException, doing: str, cls: type[DependencyError] = DependencyError) -> DependencyError:
        return cls(
            f"Redis at {self._shown_url} failed while {doing} ({_one_line(exc)}): "
            "check LIVEPUSH_REDIS_URL and that Redis is running"
        )

    # -- clients ----------------------------------------------------------------------
    def _client_kwargs(self, client_name: str) -> dict[str, Any]:
        return {
            "socket_connect_timeout": self.connect_timeout,
            "client_name": client_name,
            "health_check_interval": 30,
            # No retries: a retried EVALSHA whose first reply was lost would publish twice,
            # and redis-py's default backoff makes a publish to a down Redis hang for
            # seconds. A pooled connection whose server restarted is reconnected before
            # use (its socket reads EOF), so a restart alone does not fail a publish.
            "retry": Retry(NoBackoff(), 0),
            # RESP2 on every connection: the replies parsed here (XRANGE entries, script
            # results) are the RESP2 shapes; redis-py 8 defaults to RESP3.
            "protocol": 2,
        }

    def _sync_client(self) -> tuple[redis.Redis, Any]:
        with self._sync_lock:
            if self._sync is None:
                self._sync = redis.Redis.from_url(self.url, **self._client_kwargs("livepush-publisher"))
                self._sync_publish = self._sync.register_script(_PUBLISH_LUA)
            return self._sync, self._sync_publish

    def _async_client(self) -> aredis.Redis:
        loop = asyncio.get_running_loop()
        if self._async is None or self._async_loop is not loop:
            # A client made on another (finished) loop cannot be reused here; its sockets
            # die with that loop.
            self._async = aredis.Redis.from_url(self.url, **self._client_kwargs("livepush-publisher"))
            self._async_loop = loop
            self._async_publish = self._async.register_script(_PUBLISH_LUA)
            self._async_prune = self._async.register_script(_PRUNE_LUA)
        return self._async

    # -- publishing -------------------------------------------------------------------
    def _publish_args(self, topic: Topic, data: JSON, conn: Any) -> tuple[list[str], list[Any]]:
        if conn is not None:
            raise ValueError("conn= needs the Postgres fan-out: set LIVEPUSH_FANOUT=postgres")
        if "\n" in topic:  # would break the frame header; validated topics never have one
            raise ValueError(f"invalid topic {topic[:60]!r}")
        text = encode_payload(data)  # PayloadTooLarge before anything is written
        return [KEY_PREFIX + topic], [topic, text, *self._publish_args_tail]

    def publish(self, topic: Topic, data: JSON, *, conn: Any = None) -> Offset:
        keys, args = self._publish_args(topic, data, conn)
        client, script = self._sync_client()
        try:
            return _text(script(keys=keys, args=args, client=client))
        except (RedisError, OSError) as exc:
            raise self._error(exc, f"publishing on {topic!r}") from exc

    async def apublish(self, topic: Topic, data: JSON, *, conn: Any = None) -> Offset:
        keys, args = self._publish_args(topic, data, conn)
        client = self._async_client()
        try:
            return _text(await self._async_publish(keys=keys, args=args, client=client))
        except (RedisError, OSError) as exc:
            raise self._error(exc, f"publishing on {topic!r}") from exc

    # -- history ----------------------------------------------------------------------
    def latest_offset(self, topic: Topic) -> Offset:
        client, _ = self._sync_client()
        try:
            newest = client.xrevrange(KEY_PREFIX + topic, "+", "-", count=1)
        except (RedisError, OSError) as exc:
            raise self._error(exc, f"reading the latest offset of {topic!r}") from exc
        return _text(newest[0][0]) if newest else FIRST_PREV

    async def alatest_offset(self, topic: Topic) -> Offset:
        client = self._async_client()
        try:
            newest = await client.xrevrange(KEY_PREFIX + topic, "+", "-", count=1)
        except (RedisError, OSError) as exc:
            raise self._error(exc, f"reading the latest offset of {topic!r}") from exc
        return _text(newest[0][0]) if newest else FIRST_PREV

    async def history(self, topic: Topic, since: Offset) -> list[Message] | None:
        if not isinstance(since, str) or not _STREAM_ID.fullmatch(since):
            return None  # not an offset this fan-out ever gave out
        key = KEY_PREFIX + topic
        client = self._async_client()
        try:
            # One MULTI so "nothing after since" and "since is the newest" are read at the
            # same instant: a publish in between cannot turn a valid since into a reset.
            async with client.pipeline(transaction=True) as pipe:
                pipe.time()
                pipe.xrange(key, "(" + since, "+", count=HISTORY_PAGE)
                pipe.xrevrange(key, "+", "-", count=1)
                (now_s, now_us), page, newest = await pipe.execute()
            if not page:
                newest_id = _text(newest[0][0]) if newest else FIRST_PREV
                return [] if newest_id == since else None
            first_ms = int(_text(page[0][0]).split("-")[0])
            if first_ms < int(now_s) * 1000 + int(now_us) // 1000 - self._ttl_ms:
                return None  # the first missed message has expired: never a silent hole
            out: list[Message] = []
            expected = since
            while True:
                for entry_id, fields in page:
                    offset, prev = _text(entry_id), _text(fields[b"p"])
                    if prev != expected:
                        # A trimmed range or a restart without persistence broke the chain.
                        return None
                    out.append(Message(topic, offset, prev, _text(fields[b"d"])))
                    expected = offset
                if len(page) < HISTORY_PAGE:
                    return out
                # Later pages need no MULTI: the chain check catches a trim racing us.
                page = await client.xrange(key, "(" + expected, "+", count=HISTORY_PAGE)
        except (RedisError, OSError) as exc:
            raise self._error(exc, f"reading the history of {topic!r}") from exc
        except (KeyError, ValueError, IndexError):
            # Someone else's data under our key: refuse rather than guess.
            logger.warning("livepush: malformed history stream %r in Redis; answering reset", key)
            return None

    async def prune(self) -> int:
        """Trim a bounded batch of topics (one SCAN step, cursor kept between calls)."""
        client = self._async_client()
        try:
            cursor, keys = await client.scan(self._prune_cursor, match=KEY_PREFIX + "*", count=PRUNE_SCAN_COUNT)
            self._prune_cursor = int(cursor)
            if not keys:
                return 0
            # One round trip for the batch; each script trims one key atomically.
            async with client.pipeline(transaction=False) as pipe:
                for key in keys:
                    await self._async_prune(keys=[key], args=[self._ttl_ms], client=pipe)
                results = await pipe.execute()
            return sum(int(n) for n in results)
        except (RedisError, OSError) as exc:
            raise self._error(exc, "pruning history") from exc

    # -- listening --------------------------------------------------------------------
    @property
    def listening(self) -> bool:
        return self._listening

    async def listen(self) -> None:
        if self._task is not None:
            return  # listen() is called once at boot; a second call changes nothing
        try:
            self._conn = await self._subscribe()
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            await self._drop_connection()
            raise self._error(exc, "subscribing to its pub/sub channel", ListenError) from exc
        self._listen_called = True
        self._listening = True
        self._task = asyncio.create_task(self._run(), name="livepush-redis-listener")

    async def _subscribe(self) -> Any:
        """A connection SUBSCRIBEd to CHANNEL, returned once Redis confirmed it."""
        if self._listen_pool is None:
            self._listen_pool = aredis.ConnectionPool.from_url(
                self.url,
                max_connections=1,
                socket_connect_timeout=self.connect_timeout,
                client_name="livepush-listener",
                # RESP2: the raw replies parsed below (redis-py 8 defaults to RESP3, where
                # pub/sub frames arrive as push messages read_response() does not return).
                protocol=2,
                # No silent reconnects inside redis-py: a lost subscription must be seen
                # here, so `listening` drops and the resync runs.
                retry=Retry(NoBackoff(), 0),
            )
        conn = self._listen_pool.make_connection()
        self._conn = conn
        await asyncio.wait_for(conn.connect(), self.connect_timeout + 1)
        await conn.send_command("SUBSCRIBE", CHANNEL)
        reply = await conn.read_response(timeout=self.connect_timeout)
        if reply is None:
            raise TimeoutError(f"no SUBSCRIBE confirmation within {self.connect_timeout} s")
        if not (isinstance(reply, list) and _text(reply[0]) == "subscribe"):
            raise RedisError(f"unexpected reply to SUBSCRIBE: {reply!r:.80}")
        return conn

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.disconnect(nowait=True)
            except Exception:  # already broken: nothing left to release
                pass

    async def _run(self) -> None:
        """Read frames in order; on loss, reconnect, then let the hub resync from history."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self._read_until_lost()
                reason = "connection closed"
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of the subscribed connection is an outage
                reason = _one_line(exc)
            self._listening = False
            lost_at = loop.time()
            # One warning per outage, so a silent loss is impossible and logs stay readable.
            logger.warning(
                "livepush: lost the Redis listener at %s (%s); reconnecting, then reading what was missed from history",
                self._shown_url,
                reason,
            )
            await self._drop_connection()
            await self._reconnect()
            self._listening = True
            logger.info("livepush: Redis listener back after %.1f s; resyncing from history", loop.time() - lost_at)
            try:
                await self._resynced()
            except Exception:
                logger.exception("livepush: a resync handler failed after the Redis listener came back")

    async def _reconnect(self) -> None:
        low, high = self.backoff
        delay = low
        while True:
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            try:
                self._conn = await self._subscribe()
                return
            except (RedisError, OSError, asyncio.TimeoutError) as exc:
                logger.debug("livepush: Redis listener reconnect failed: %s", _one_line(exc))
                await self._drop_connection()
            delay = min(delay * 2, high)

    async def _read_until_lost(self) -> None:
        conn = self._conn
        loop = asyncio.get_running_loop()
        last_heard = loop.time()
        while True:
            reply = await conn.read_response(timeout=self.heartbeat)
            now = loop.time()
            if reply is None:
                # Quiet: a dead peer (no RST) would look the same, so ping and give it
                # three beats to answer before calling it lost.
                if now - last_heard > 3 * self.heartbeat:
                    raise TimeoutError(f"no reply from Redis for {now - last_heard:.0f} s")
                await conn.send_command("PING")
                continue
            last_heard = now
            if isinstance(reply, list) and reply and _text(reply[0]) == "message":
                self._on_frame(reply[2])

    def _on_frame(self, raw: bytes) -> None:
        try:
            topic, offset, prev, data = raw.split(b"\n", 3)
            message = Message(topic.decode("utf-8"), offset.decode("ascii"), prev.decode("ascii"), data.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            logger.warning("livepush: ignored a malformed frame on Redis channel %s: %r", CHANNEL, raw[:80])
            return
        try:
            self._dispatch(message)
        except Exception:
            # A broken receiver must not stop delivery to the others on the next frames.
            logger.exception("livepush: a receiver failed on a message for %r", message.topic)

    # -- closing ----------------------------------------------------------------------
    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._listening = False
        await self._drop_connection()
        if self._listen_pool is not None:
            await self._listen_pool.disconnect()
            self._listen_pool = None
        if self._async is not None:
            client, self._async = self._async, None
            if self._async_loop is asyncio.get_running_loop():
                await client.aclose()
        self.close()

    def close(self) -> None:
        with self._sync_lock:
            client, self._sync = self._sync, None
        if client is not None:
            client.close()
