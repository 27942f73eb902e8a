"""The Redis fan-out: pub/sub carries live messages, one stream per topic keeps history.

Layout in Redis, all under `{P}`, the deployment's prefix P (LIVEPUSH_REDIS_PREFIX, default
`livepush:<db number>`: pub/sub ignores database numbers, so two deployments on one server
would otherwise hear each other) in braces, which no prefix holds: `P:h:<topic>` would make
deployment `prod`'s topic `h:x` deployment `prod:h`'s topic `x` (redis.client.namespace()):
- `{P}:h:<topic>`: a stream; each entry is one message, fields `d` (the JSON text) and `p` (the
  id of the entry before it on the topic; for the first, the deployment's origin). The entry id
  is the message's offset ("<ms>-<seq>", ordered by `offset_key`).
- `{P}:origin`: the deployment's epoch E, made (from Redis' clock in microseconds) by whichever
  script first finds it missing, and made anew by the first script past half the idle time
  after it. "0-E" is the offset of every topic nothing was published on yet, and the `p` of each
  topic's first entry, so it sorts below every offset a topic will have.
- `{P}:origin:prev`: the epoch before E (E itself when E was made because none was found).
- `{P}:pub`: the one pub/sub channel every listening server subscribes to. A frame is
  "<topic>\\n<offset>\\n<prev>\\n<json>", or, for several messages of a publish_many, "*" and
  then theirs, all joined by newlines: a receiver splits it into lines, four a message, and never
  parses the payload (topics and compact JSON hold no raw newline). Whoever may write under {P}
  is trusted (docs/security.md shows the ACL that gives the app only its prefix); a frame
  that does not parse is dropped with a debug line.

Why a chain of `p` fields: a stream id alone cannot tell "nothing happened after X" from "what
came after X was trimmed or lost in a restart without persistence". Each entry names its
predecessor, so `history()` checks every link and answers None (the client gets `reset`) at
the first break: recovery is complete or refused, never partial. The origin carries an epoch for
the same reason: a restart without persistence (or a flush) loses the origin key with the
streams, so a page that rendered a topic's origin before it and resumes after it finds a first
entry, or an origin, that is not the one it holds, and is reset rather than replayed only what
came after the loss. It moves on every half idle time because a forgotten topic (below) reads
as never published again: an origin given out more than the idle time ago may have seen the
topic published and forgotten since, so `history()` takes an origin only while it is one of the
two newest and younger than the idle time (else `reset`), and takes a chain that starts at the
newer one from a client holding the older.

One Lua script appends, trims and PUBLISHes, so the stream order, the offsets and the pub/sub
order are the same order, whatever number of processes publish at once.

Retention: trimmed by length (MAXLEN, `max_len`) at each publish, and by age (history_ttl) by
`prune()`, which every server runs: the TTL is the servers' (as on Postgres), never that of a
process that only publishes, which may run with another LIVEPUSH_HISTORY_TTL (the default). The
newest entry of a topic is kept past the TTL so the chain stays anchored (`since` == the latest
offset replays nothing rather than `reset`). A topic idle for
`idle_expire` seconds loses its key (each publish sets its expiry, prune() lengthens one that a
publisher with a shorter idle time set, and keep_chains() one whose topic a server's subscribers
watch): its next message starts a new chain and a client still
holding an older offset, or an origin given out more than `idle_expire` seconds ago, gets
`reset`. The origin moves on by the idle time of whichever process reads it: a shorter one only
resets origins sooner, and prune() keeps a topic for the servers' idle time, which
their reads of origins count on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio as aredis
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..channels import ListenerSlot
from ..redis.client import (LoopClients, answered_at_start, async_client, deployment_prefix, failed, known_script,
                            listener_name, namespace, one_line, redact, sync_client, text, wrong_type)
from ..redis.subscriber import Subscriber
from ..topics import RESERVED_PREFIX, TOPIC_RE
from ..types import JSON, Message, Offset, Topic
from ..errors import ArgumentValueError, DependencyError, ListenError
from .base import (HISTORY_PAGE, HISTORY_PAGE_BYTES, IDLE_EXPIRE, FanOut, History, encode_batch, encode_payload,
                   idle_expiry, plain_topic)

logger = logging.getLogger("livepush.fanout.redis")
T = TypeVar("T")

_STREAM_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
STREAM_ID_PART_MAX = 2**64 - 1  # each half of a stream id is an unsigned 64-bit number
LAST_ID = f"{STREAM_ID_PART_MAX}-{STREAM_ID_PART_MAX}"  # no stream id comes after it


def _is_stream_id(text: str) -> bool:
    return bool(_STREAM_ID.fullmatch(text)) and all(int(part) <= STREAM_ID_PART_MAX for part in text.split("-"))


# The deployment's origin offset ("0-E"), its epoch E made on first use and anew once it is half
# the idle time (idle_ms) old, the one before kept in prev_key. A script only: made and read in
# one step, two processes that find it missing or old at once cannot make two. A new epoch that
# found none before is its own prev: a lost origin's prev must not pair with a new one. Moving
# on is best effort: a Redis out of memory (noeviction) refuses the write, and the origin stays
# as it is rather than fail every read that finds it due.
_ORIGIN_LUA = """
local function origin(key, prev_key, idle_ms)
  local epoch = redis.call('GET', key)
  local t = redis.call('TIME')
  local made = t[1] .. string.format('%06d', tonumber(t[2]))
  if not tonumber(epoch) then
    redis.call('SET', key, made)
    redis.call('SET', prev_key, made)
    return '0-' .. made
  end
  if tonumber(made) - tonumber(epoch) >= tonumber(idle_ms) * 500 then
    local moved = redis.pcall('SET', key, made)
    if type(moved) == 'table' and moved.err then return '0-' .. epoch end
    redis.pcall('SET', prev_key, epoch)
    epoch = made
  end
  return '0-' .. epoch
end
"""

# KEYS: the origin keys (origin, prev), then the stream of each message; ARGV: max_len, idle_ms,
# channel, then the topic and the json of each message, then FRAME_BYTES. Returns their
# ids in order, and how many subscribers the frames reached in all (PUBLISH's count). One script for one message or a batch (publish_many: PUBLISH_CHUNK messages or PUBLISH_CHUNK_BYTES per call). A
# batch's messages share pub/sub frames of about FRAME_BYTES, each costing a listening server one
# read and one parse.
_PUBLISH_LUA = known_script(_ORIGIN_LUA + """
local ids = {}
local frames, size, heard = {}, 0, 0
local streams = #KEYS - 2
for i = 1, streams do
  local key = KEYS[i + 2]
  local topic, json = ARGV[2 + 2 * i], ARGV[3 + 2 * i]
  local newest = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
  local prev
  if #newest > 0 then prev = newest[1][1] else prev = origin(KEYS[1], KEYS[2], ARGV[2]) end
  -- MAXLEN ~ drops whole radix nodes only, which keeps the trim O(1) amortized. No trim by
  -- age here: the TTL is the servers' (prune), not this publisher's.
  local id = redis.call('XADD', key, 'MAXLEN', '~', ARGV[1], '*', 'd', json, 'p', prev)
  redis.call('PEXPIRE', key, ARGV[2])
  local frame = topic .. '\\n' .. id .. '\\n' .. prev .. '\\n' .. json
  frames[#frames + 1] = frame
  size = size + #frame
  if size >= tonumber(ARGV[4 + 2 * streams]) or i == streams then
    if #frames == 1 then
      heard = heard + redis.call('PUBLISH', ARGV[3], frame)
    else
      heard = heard + redis.call('PUBLISH', ARGV[3], '*\\n' .. table.concat(frames, '\\n'))
    end
    frames, size = {}, 0
  end
  ids[i] = id
end
return {ids, heard}
""")
# A script call of publish_many takes at most this many messages, or about this many bytes of
# data (UTF-8, as Redis holds it): a call holds Redis until it ends, and Redis sends a subscriber
# nothing of what the call published before it ends (all of it waits in the subscriber's output
# buffer, which Redis caps at 32 MB by default before it drops the subscriber).
PUBLISH_CHUNK = 1000
PUBLISH_CHUNK_BYTES = 4 * 1024 * 1024
FRAME_BYTES = 256 * 1024

# KEYS[1] stream; ARGV: ttl_ms, idle_ms. Drops entries older than the TTL but keeps the newest
# one, which anchors the chain (see the module docstring). Returns entries dropped. A key set to
# expire sooner than the idle time after its newest entry (by a publisher whose TTL, and so idle
# time, is shorter) is kept that long: the servers' idle time is the one their reads of origins
# count on. GT (Redis 7) writes nothing when the publisher's expiry is as long, so a pass costs no
# write per key; a Redis before 7 refuses GT, and keeps the publisher's expiry (pcall).
_PRUNE_LUA = known_script("""
local key = KEYS[1]
local newest = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
if #newest == 0 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = now - tonumber(ARGV[1])
local newest_ms = tonumber(string.match(newest[1][1], '^(%d+)'))
local keep = newest_ms + tonumber(ARGV[2]) - now
if keep > 0 then redis.pcall('PEXPIRE', key, keep, 'GT') end
local minid = string.format('%d', cutoff)
if newest_ms < cutoff then minid = newest[1][1] end
return redis.call('XTRIM', key, 'MINID', minid)
""")

# KEYS: the streams of topics a server's subscribers watch; ARGV: idle_ms. Each key set to expire
# sooner than the idle time from now is kept that long, as a publish would keep it (no entry, no
# frame): their next message follows their newest entry. A key that is gone (never published, or
# forgotten) has nothing to keep. GT (Redis 7) never shortens an expiry that a publisher with a
# longer idle time set, and leaves a key without one as it is; a Redis before 7 refuses GT (pcall)
# and gets the idle time from now, which the servers' idle time is. Only PEXPIRE: the ACL
# docs/security.md shows allows it, and no read of the expiry (PTTL) that it does not. So each keep
# is a write (to the AOF and the replicas), unlike Postgres' (which skips a row kept lately): one a
# watched topic every quarter of the idle time, and one as a page first watches it.
_KEEP_LUA = known_script("""
for _, key in ipairs(KEYS) do
  local kept = redis.pcall('PEXPIRE', key, ARGV[1], 'GT')
  if type(kept) == 'table' and kept.err then redis.call('PEXPIRE', key, ARGV[1]) end
end
return 0
""")
# Keys per call of the keep script: Redis serves nobody else while a script runs.
KEEP_BATCH = 500

# KEYS: stream, origin keys; ARGV: idle_ms. The topic's latest offset: its newest entry's id, or the origin.
_LATEST_LUA = known_script(_ORIGIN_LUA + """
local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #newest > 0 then return newest[1][1] end
return origin(KEYS[2], KEYS[3], ARGV[1])
""")

# KEYS: stream, origin keys; ARGV: since (exclusive), count, bytes, idle_ms. One page of history,
# read atomically with the server's time, the topic's latest offset and the two newest origins,
# so "nothing after since" and "since is the newest" are one instant: a publish in between
# cannot turn a valid since into a reset. The page ends at
# the entry that takes its data past ARGV[3] bytes (a page always has one entry), so 1,000 large
# messages never leave Redis in one reply. Entries are read a few at a time, the count doubling
# up to 128, never all `count` at once: the script copies what it reads, and Redis
# serves nobody else while it runs, so reading 1,000 entries of a MiB to keep two would hold
# every client of Redis for seconds and take a GiB of memory.
_HISTORY_LUA = known_script(_ORIGIN_LUA + """
local want = tonumber(ARGV[2])
local budget = tonumber(ARGV[3])
local page, used = {}, 0
local start = '(' .. ARGV[1]
local step = 1
while #page < want and used < budget do
  local ask = math.min(step, want - #page)
  local batch = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', ask)
  for _, entry in ipairs(batch) do
    if used >= budget then break end
    local fields = entry[2]
    for j = 1, #fields, 2 do
      if fields[j] == 'd' then used = used + #fields[j + 1] end
    end
    page[#page + 1] = entry
  end
  if #batch < ask then break end
  start = '(' .. batch[#batch][1]
  step = math.min(step * 2, 128)
end
local current = origin(KEYS[2], KEYS[3], ARGV[4])
local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local latest = current
if #newest > 0 then latest = newest[1][1] end
local previous = redis.call('GET', KEYS[3])
if previous then previous = '0-' .. previous else previous = current end
return {redis.call('TIME'), page, latest, current, previous}
""")

# Seconds a call waits for Redis' answer before it raises DependencyError. Set here, not left to
# redis-py: before redis-py 8 its default is no limit, and a publish or a history read to a Redis
# cut off without a reset (a network partition, a paused VM) waited for ever.
CALL_TIMEOUT = 5.0

# What deleting a key of another type under the prefix costs, by what livepush keeps there: said
# with the key, whose refusal Redis does not name (WRONGTYPE), and which it takes a TYPE to find.
_ORIGIN_DELETED = ("livepush makes a new origin; a page resuming from an offset of the old one on a topic with no "
                   "message since may get reset")
_STREAM_DELETED = "the topic's history is lost with it"

# Keys visited per SCAN step of prune(), and SCAN steps per call at most: bounded work however
# many topics exist. A call goes on to the next step while it has dropped nothing, since a server
# stops calling for the cycle at a call that drops nothing: with one step a call, a run of topics
# with nothing to drop (idle ones, already trimmed) ended every cycle at its first 200 keys, and
# a pass over many topics took hours of cycles, their expired entries kept meanwhile.
PRUNE_SCAN_COUNT = 200
PRUNE_SCAN_STEPS = 25

# A topic nobody publishes on (reserved), whose latest offset aopen() and listen() read to see that
# what the URL leads to runs the fan-out's scripts on its keys: PING and SUBSCRIBE alone succeed on
# a Redis Sentinel, and on a node of a Redis Cluster that does not hold the deployment's keys, and a
# server started there failed every publish and history read after.
_CHECK_TOPIC = RESERVED_PREFIX + "check"


def _published_at(offset: bytes) -> float:
    """A stream entry's id starts with Redis' clock at XADD, in milliseconds."""
    return int(offset.split(b"-", 1)[0]) / 1000.0


def parse_frames(raw: bytes) -> list[Message] | None:
    """The messages in a pub/sub frame (one, four lines; or a batch's: a `*` line, then four lines
    a message), or None when it is not one of ours; one bad message makes the whole frame not
    ours. The `*` line is not a topic: a server from before batch frames drops the frame (and
    reads the messages from history when the next one's `prev` shows it missed them) rather
    than take its first message's data to run on to the frame's end."""
    try:
        lines = raw.split(b"\n")
        if lines[0] == b"*":
            del lines[0]
        elif len(lines) != 4:
            return None
        if not lines or len(lines) % 4:
            return None
        messages = []
        for at in range(0, len(lines), 4):
            topic, offset, prev, data = lines[at:at + 4]
            message = Message(topic.decode("ascii"), offset.decode("ascii"), prev.decode("ascii"),
                              data.decode("utf-8"), _published_at(offset))
            if not (TOPIC_RE.fullmatch(message.topic) and _STREAM_ID.fullmatch(message.offset)
                    and _STREAM_ID.fullmatch(message.prev) and message.data_json):
                return None
            messages.append(message)
    except (ValueError, UnicodeDecodeError):
        return None
    return messages


def _topics_named(encoded: list[tuple[Topic, str]]) -> str:
    """A batch's topics for an error message: the first few, and how many in all."""
    topics = list(dict.fromkeys(topic for topic, _ in encoded))
    return ", ".join(map(repr, topics[:3])) + (f" and {len(topics) - 3} more topics" if len(topics) > 3 else "")


def _publishing(what: str, done: list[Offset]) -> str:
    """What failed, for failed(): a batch cut short says how much of it was published."""
    return f"publishing on {what}" if not done else \
        f"publishing on {what} (at least the first {len(done)} messages of the batch were published)"


# Every Redis fan-out of the process, so that a forked child can start afresh (_after_fork). The
# loops' clients set themselves aside (client.LoopClients).
_EVERY: weakref.WeakSet[RedisFanOut] = weakref.WeakSet()


def _after_fork() -> None:
    for fanout in list(_EVERY):
        fanout.forget_inherited()


os.register_at_fork(after_in_child=_after_fork)


class _LoopSide:
    """An event loop's client and the fan-out's scripts on it."""

    def __init__(self, client: aredis.Redis) -> None:
        self.client = client
        self.publish = client.register_script(_PUBLISH_LUA)
        self.prune = client.register_script(_PRUNE_LUA)
        self.history = client.register_script(_HISTORY_LUA)
        self.latest = client.register_script(_LATEST_LUA)
        self.keep = client.register_script(_KEEP_LUA)

    async def aclose(self) -> None:
        await self.client.aclose()


class RedisFanOut(FanOut):
    """Fan-out over Redis pub/sub with per-topic streams as history.

    `history_ttl`: seconds a message stays recoverable. `max_len`: about how many entries a
    topic keeps at most (a memory bound; past it old offsets get `reset`). `idle_expire`:
    seconds after its last message a topic's key is dropped. `prefix`: the namespace of every
    key and channel (they start with `{prefix}:`). `subscriber`: the process's shared Redis listener (else one of its own,
    with `heartbeat`, `backoff` and `connect_timeout`).
    """

    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        history_ttl: float = 300.0,
        max_len: int = 10_000,
        idle_expire: float = IDLE_EXPIRE,
        prefix: str | None = None,
        subscriber: Subscriber | None = None,
        heartbeat: float = 5.0,
        backoff: tuple[float, float] = (0.1, 1.0),
        connect_timeout: float = 5.0,
    ) -> None:
        super().__init__()
        self.url = url
        self.history_ttl = history_ttl
        self.max_len = max_len
        self.idle_expire = idle_expiry(idle_expire, history_ttl)
        self.connect_timeout = connect_timeout
        self.prefix = deployment_prefix(url, prefix)
        self.channel = f"{namespace(self.prefix)}:pub"
        self.key_prefix = f"{namespace(self.prefix)}:h:"
        self.origin_key = f"{namespace(self.prefix)}:origin"
        self._origin_keys = [self.origin_key, f"{self.origin_key}:prev"]
        # SCAN's MATCH is a glob: a prefix may hold *, ?, [ or a backslash, which must match only themselves,
        # or prune() would trim another deployment's streams (`app[1]` matching `app1`).
        self._key_pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self.key_prefix) + "*"
        self._ttl_ms = int(history_ttl * 1000)
        self._idle_ms = int(self.idle_expire * 1000)
        self._publish_args_tail = [max_len, self._idle_ms, self.channel]
        self._subscriber = ListenerSlot(subscriber, lambda: Subscriber(url, name=listener_name(self.prefix),
                                                                       heartbeat=heartbeat, backoff=backoff,
                                                                       connect_timeout=connect_timeout))

        # Sync side (publish from any thread, latest_offset): created on first use, so
        # constructing a fan-out never touches the network.
        self._sync_lock = threading.Lock()
        self._sync: redis.Redis | None = None
        self._sync_publish: Any = None
        self._sync_latest: Any = None
        # Async side: a client and its scripts per event loop (their connections are the loop's).
        self._loops: LoopClients[_LoopSide] = LoopClients(
            lambda: _LoopSide(async_client(self.url, "livepush-publisher", self.connect_timeout,
                                           socket_timeout=CALL_TIMEOUT)))
        self._prune_cursor = 0
        # Whether a publish that no server heard is still to be said (_published_call).
        self._unheard_warning_due = True
        _EVERY.add(self)

    def forget_inherited(self) -> None:
        """In a forked child: a thread of the parent may have held the sync lock at the fork. (The
        sync client's pool starts afresh by itself, as redis-py checks the process id, and the
        loops' clients set themselves aside.)"""
        self._sync_lock = threading.Lock()

    # -- clients ----------------------------------------------------------------------
    def _sync_client(self) -> tuple[redis.Redis, Any]:
        with self._sync_lock:
            if self._sync is None:
                self._sync = sync_client(self.url, "livepush-publisher", self.connect_timeout,
                                         socket_timeout=CALL_TIMEOUT)
                self._sync_publish = self._sync.register_script(_PUBLISH_LUA)
                self._sync_latest = self._sync.register_script(_LATEST_LUA)
            return self._sync, self._sync_publish

    # -- publishing -------------------------------------------------------------------
    def _publish_calls(self, encoded: list[tuple[Topic, str]], conn: Any) -> list[tuple[list[str], list[Any]]]:
        """The script calls (keys, args) that publish `encoded`, PUBLISH_CHUNK messages each."""
        if conn is not None:
            raise ArgumentValueError("conn= needs the Postgres fan-out: set LIVEPUSH_FANOUT=postgres")
        calls: list[tuple[list[str], list[Any]]] = []
        used = 0
        for topic, json_text in encoded:
            # Bytes, not characters: text beyond ASCII takes up to four bytes a character in Redis.
            size = len(json_text) if json_text.isascii() else len(json_text.encode("utf-8"))
            if not calls or len(calls[-1][0]) == PUBLISH_CHUNK or \
                    (calls[-1][0] and used + size > PUBLISH_CHUNK_BYTES):
                calls.append(([], [*self._publish_args_tail]))
                used = 0
            keys, args = calls[-1]
            keys.append(self.key_prefix + topic)
            args += (topic, json_text)
            used += size
        for keys, args in calls:
            keys[:0] = self._origin_keys  # the script's KEYS[1..2]: a topic's first message links to the origin
            args.append(FRAME_BYTES)
        return calls

    def publish(self, topic: Topic, data: JSON, *, conn: Any = None) -> Offset:
        return self._publish_sync(self._publish_calls([(plain_topic(topic), encode_payload(data))], conn),
                                  lambda: repr(topic))[0]

    async def apublish(self, topic: Topic, data: JSON, *, conn: Any = None) -> Offset:
        return (await self._publish_async(self._publish_calls([(plain_topic(topic), encode_payload(data))], conn),
                                          lambda: repr(topic)))[0]

    def publish_many(self, messages: Iterable[tuple[Topic, JSON]], *, conn: Any = None) -> list[Offset]:
        encoded = encode_batch(messages)
        return self._publish_sync(self._publish_calls(encoded, conn), lambda: _topics_named(encoded))

    async def apublish_many(self, messages: Iterable[tuple[Topic, JSON]], *, conn: Any = None) -> list[Offset]:
        encoded = encode_batch(messages)
        return await self._publish_async(self._publish_calls(encoded, conn), lambda: _topics_named(encoded))

    def _publish_sync(self, calls: list[tuple[list[str], list[Any]]], what: Callable[[], str]) -> list[Offset]:
        client, script = self._sync_client()
        offsets: list[Offset] = []
        for keys, args in calls:
            try:
                ids, heard = script(keys=keys, args=args, client=client)
            except (RedisError, OSError) as exc:
                raise self._failed(exc, _publishing(what(), offsets), self._wrong_key_sync(exc, keys)) from exc
            self._published_call(offsets, ids, heard)
        return offsets

    async def _publish_async(self, calls: list[tuple[list[str], list[Any]]], what: Callable[[], str]) -> list[Offset]:
        side = self._loops.get()
        offsets: list[Offset] = []
        for keys, args in calls:
            try:
                ids, heard = await side.publish(keys=keys, args=args)
            except (RedisError, OSError) as exc:
                raise self._failed(exc, _publishing(what(), offsets), await self._wrong_key(exc, keys)) from exc
            self._published_call(offsets, ids, heard)
        return offsets

    def _published_call(self, offsets: list[Offset], ids: list[Any], heard: int) -> None:
        """Take one script call's offsets into `offsets`, and say once when no server heard it."""
        offsets += [text(i) for i in ids]
        self._published.inc(len(ids))
        if not heard and self._unheard_warning_due:
            # A web process given another database number (so another default prefix) or another
            # LIVEPUSH_REDIS_PREFIX than the servers' publishes where none listens: every publish
            # returns an offset, and nothing reaches a page.
            self._unheard_warning_due = False
            logger.warning(
                "livepush: a publish reached no server: nothing listens on %s at %s. If no `livepush serve` runs "
                "on this Redis now, this is expected (pages read it from history once one does); if one does, it "
                "listens under another prefix: give this process the servers' database number in "
                "LIVEPUSH_REDIS_URL and their LIVEPUSH_REDIS_PREFIX (said once)", self.channel, redact(self.url))

    # -- keys of another type -----------------------------------------------------------
    def _failed(self, exc: BaseException, doing: str, key: str | None, *, reads: bool = False) -> DependencyError:
        """failed(), naming the key of another type when one was found, with what deleting it costs."""
        deleting = _ORIGIN_DELETED if key in self._origin_keys else _STREAM_DELETED
        return failed(self.url, exc, doing, key=key, deleting=deleting, reads=reads)

    def _first_wrong(self, keys: list[str], types: list[Any]) -> str | None:
        """The first of `keys` whose type (TYPE's answers, `types`) is not what livepush keeps there."""
        for key, found in zip(keys, types, strict=True):
            kept = "string" if key in self._origin_keys else "stream"
            if text(found) not in (kept, "none"):
                return key
        return None

    def _wrong_key_sync(self, exc: BaseException, keys: list[str]) -> str | None:
        """After a script's refusal `exc`: which of its `keys` holds another type of value, if that
        was the refusal (one more round trip, on this path only); None when no TYPE tells."""
        if not wrong_type(exc):
            return None
        client, _ = self._sync_client()
        try:
            with client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.type(key)
                return self._first_wrong(keys, pipe.execute())
        except (RedisError, OSError):
            return None  # the refusal is said all the same, without the key

    async def _wrong_key(self, exc: BaseException, keys: list[str]) -> str | None:
        """_wrong_key_sync() on this loop's client."""
        if not wrong_type(exc):
            return None
        try:
            async with self._loops.get().client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.type(key)
                return self._first_wrong(keys, await pipe.execute())
        except (RedisError, OSError):
            return None

    # -- history ----------------------------------------------------------------------
    def latest_offset(self, topic: Topic) -> Offset:
        client, _ = self._sync_client()
        keys = [self.key_prefix + topic, *self._origin_keys]
        try:
            return text(self._sync_latest(keys=keys, args=[self._idle_ms], client=client))
        except (RedisError, OSError) as exc:
            wrong = self._wrong_key_sync(exc, keys)
            raise self._failed(exc, f"reading the latest offset of {topic!r}", wrong, reads=True) from exc

    async def alatest_offset(self, topic: Topic, *, timeout: float | None = None) -> Offset:
        side = self._loops.get()
        keys = [self.key_prefix + topic, *self._origin_keys]
        doing = f"reading the latest offset of {topic!r}"
        try:
            return text(await self._within(timeout, doing, side.latest(keys=keys, args=[self._idle_ms])))
        except (RedisError, OSError) as exc:
            wrong = await self._wrong_key(exc, keys)
            raise self._failed(exc, doing, wrong, reads=True) from exc

    async def _within(self, timeout: float | None, doing: str, call: Awaitable[T]) -> T:
        """`call` (a read: history(), alatest_offset()), bounded by `timeout` as a whole: the wait
        for one of the pool's connections (up to POOL_WAIT_SECONDS), a connect, and CALL_TIMEOUT
        for the answer could add up past it. The scripts only read (and make an origin that is
        missing), so cutting one short is safe. None leaves those waits."""
        bound = asyncio.timeout(timeout)
        try:
            async with bound:
                return await call
        except TimeoutError:
            if not bound.expired():
                raise  # not ours: the caller says it as any other failure
            raise failed(self.url, RedisTimeoutError(f"no answer within {timeout:g} s"), doing, reads=True) from None

    async def history(self, topic: Topic, since: Offset, *, limit: int = HISTORY_PAGE,
                      timeout: float | None = None) -> History | None:
        if not isinstance(since, str) or not _is_stream_id(since) or since == LAST_ID:
            # Not an offset this fan-out ever gave out. The last id is one too: XADD * never
            # reaches it, and Redis refuses a range that starts after it.
            return None
        key = self.key_prefix + topic
        side = self._loops.get()
        try:
            (now_s, now_us), page, latest_id, current, previous = await self._within(
                timeout, f"reading the history of {topic!r}",
                side.history(keys=[key, *self._origin_keys], args=[since, limit, HISTORY_PAGE_BYTES, self._idle_ms]))
            latest = text(latest_id)
            # An origin held past the idle time may have seen the topic published and forgotten
            # since: only the two newest origins, while younger than that, are still good.
            origins = [text(current), text(previous)]
            good_origin = since in origins and \
                int(now_s) * 1_000_000 + int(now_us) - int(since.split("-")[1]) < self._idle_ms * 1000
            if not page:
                # An origin is good only while young, even the newest: one that could not move on
                # (Redis out of memory) ages all the same.
                known = good_origin if since in origins else latest == since
                return History([], latest, False) if known else None
            first_ms = int(text(page[0][0]).split("-")[0])
            if first_ms < int(now_s) * 1000 + int(now_us) // 1000 - self._ttl_ms:
                return None  # the first missed message has expired: never a silent hole
            out: list[Message] = []
            expected = since
            for entry_id, flat in page:
                fields = dict(zip(flat[::2], flat[1::2], strict=True))  # a script returns fields flat
                offset, prev = text(entry_id), text(fields[b"p"])
                # The topic's first message came after the origin moved on from the client's.
                moved_on = expected == since == origins[1] and prev == origins[0] and good_origin
                if prev != expected and not moved_on:
                    # A trimmed range or a restart without persistence broke the chain.
                    return None
                out.append(Message(topic, offset, prev, text(fields[b"d"])))
                expected = offset
            return History(out, latest, expected != latest)
        except (RedisError, OSError) as exc:
            if not wrong_type(exc):
                raise failed(self.url, exc, f"reading the history of {topic!r}", reads=True) from exc
            # Something else wrote another type of value under the topic's key, or the origin's: no
            # history of ours, which a retry would not bring back. As a DependencyError it was read
            # again and again, and held up every topic read with it (a resync reads them all at once).
            wrong = await self._wrong_key(exc, [key, *self._origin_keys])
            if wrong in self._origin_keys:
                logger.warning("livepush: %r in Redis holds another type of value than livepush's origin (%s): every "
                               "publish to a new topic fails and every read answers reset until it is deleted "
                               "(something else writes under LIVEPUSH_REDIS_PREFIX); answering reset", wrong,
                               one_line(exc))
            else:
                logger.warning("livepush: %r in Redis is not a stream (%s); answering reset", key, one_line(exc))
            return None
        except (KeyError, ValueError, IndexError):
            # Someone else's data under our key: refuse rather than guess.
            logger.warning("livepush: malformed history stream %r in Redis; answering reset", key)
            return None

    async def keep_chains(self, topics: Sequence[Topic]) -> None:
        side = self._loops.get()
        try:
            for start in range(0, len(topics), KEEP_BATCH):
                await side.keep(keys=[self.key_prefix + topic for topic in topics[start:start + KEEP_BATCH]],
                                args=[self._idle_ms])
        except (RedisError, OSError) as exc:
            raise failed(self.url, exc, f"keeping the history of {len(topics)} watched topics", reads=True) from exc

    async def prune(self) -> int:
        """Trim bounded batches of topics (SCAN steps, cursor kept between calls) until one drops
        something, the pass over every topic ends, or PRUNE_SCAN_STEPS steps were taken."""
        side = self._loops.get()
        client = side.client
        dropped = 0
        try:
            for _ in range(PRUNE_SCAN_STEPS):
                cursor, keys = await client.scan(self._prune_cursor, match=self._key_pattern, count=PRUNE_SCAN_COUNT)
                self._prune_cursor = int(cursor)
                if keys:
                    # One round trip for the batch; each script trims one key atomically.
                    async with client.pipeline(transaction=False) as pipe:
                        for key in keys:
                            await side.prune(keys=[key], args=[self._ttl_ms, self._idle_ms], client=pipe)
                        results = await pipe.execute(raise_on_error=False)
                    dropped += self._pruned(keys, results)
                if dropped or self._prune_cursor == 0:
                    break
            return dropped
        except (RedisError, OSError) as exc:
            raise failed(self.url, exc, "pruning history") from exc

    @staticmethod
    def _pruned(keys: list[Any], results: list[Any]) -> int:
        """The entries a batch of prune scripts dropped. A key that something else overwrote with
        another type of value is passed over with a warning (history() resets its topic): raised,
        it failed every pass that met it, and ended the server's prune cycle there."""
        dropped = 0
        for key, result in zip(keys, results, strict=True):
            if isinstance(result, Exception):
                if not wrong_type(result):
                    raise result
                logger.warning("livepush: %r in Redis is not a stream (%s); not pruning it", text(key, "replace"),
                               one_line(result))
            else:
                dropped += int(result)
        return dropped

    # -- listening --------------------------------------------------------------------
    @property
    def listening(self) -> bool:
        return self._subscribed and self._subscriber.listening

    def relisten(self, reason: str) -> None:
        if self._subscribed:  # the shared listener's other channels resync too: they heard nothing either
            self._subscriber.get().relisten(reason)

    async def listen(self) -> None:
        if self._subscribed:
            return  # listen() is called once at boot; a second call changes nothing
        await self._check_scripts_run(ListenError, while_loading=True)
        subscriber = self._subscriber.get()
        subscriber.add(self.channel, self._on_frame, on_resync=self._heard.resync)
        await subscriber.start()
        self._listen_called = self._subscribed = True

    def _on_frame(self, raw: bytes) -> None:
        messages = parse_frames(raw)
        if messages is None:
            logger.debug("dropped a malformed frame on Redis channel %s: %r", self.channel, raw[:80])
            return
        for message in messages:
            self._heard.deliver(message)

    # -- opening and closing ------------------------------------------------------------
    async def aopen(self) -> None:
        await self._check_scripts_run(DependencyError, while_loading=False)

    async def _check_scripts_run(self, cls: type[DependencyError], *, while_loading: bool) -> None:
        """Raise `cls` saying why unless Redis runs the fan-out's scripts on its keys (a read: the
        latest offset of a topic nobody publishes on)."""
        read = self._loops.get().latest(keys=[self.key_prefix + _CHECK_TOPIC, *self._origin_keys],
                                        args=[self._idle_ms])
        await answered_at_start(self.url, read, cls, while_loading=while_loading)

    async def release_loop(self) -> None:
        await self._loops.release_loop()

    async def aclose(self) -> None:
        self._subscribed = False
        await self._subscriber.aclose()
        await self._loops.release_loop()
        self._loops.forget()
        self.close()

    def close(self) -> None:
        with self._sync_lock:
            client, self._sync = self._sync, None
        if client is not None:
            client.close()
