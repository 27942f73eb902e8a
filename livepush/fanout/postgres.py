"""The Postgres fan-out: a message log, and LISTEN/NOTIFY as its doorbell.

This module and sql/0001_message_log.sql are the only places that name the log's tables
(`livepush_topics`, `livepush_messages`, `livepush_log`), its channel (`livepush`) and its offset format
("EPOCH-SEQ"); everything else publishes through `publish()` / `apublish()`.

publish() calls `livepush_publish()`: one round trip that assigns the offset under the
topic's row lock, logs the message and rings the channel, in the caller's transaction when
`conn=` is given. publish_many() calls `livepush_publish_many()`, the same for a batch in one
statement (per 1,000 messages), in one transaction. Offsets are the per-topic sequence numbers,
so they are gap-free and in commit order. The epoch changes only when a crash emptied the
(unlogged) tables, so an offset from before a crash can never be mistaken for a newer one. A
topic nothing was published on has "0-ORIGIN" as its offset (its origin): the log's epoch,
moved on by whole steps of half the idle time, which a crash outdates in the same way (the
steps of a new epoch are other numbers). An idle topic that is forgotten (one nothing was
published on, and no server kept with keep_chains(), for the idle time) reads as never
published, so an origin given out more than the idle time ago may have seen the topic published
and forgotten since: such an origin gets `reset`, as on Redis. Epoch 0 puts an origin below
every offset the topic will have: the log's epoch may be read from the clock after the epoch of
a topic whose first message is being committed meanwhile, so "LOGEPOCH-0" would come after that
topic's first offsets, and a server or a page holding it would take them for messages it had
already seen.

A notification carries "EPOCH-SEQ TOPIC" and no data: any role that can connect may listen
and send on any channel, so the server reads what it delivers from the log (the hub does, in
one read of every topic a batch of doorbells named) and whatever a notification claims is checked there. One that
does not parse is dropped with a debug line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

import psycopg

from ..postgres.connect import PSYCOPG_CONNECTION_HINT, cursor_on, refuse_closed, translated, translated_if_lost
from ..postgres.identity import IDENTITY, other_database
from ..channels import ListenerSlot
from ..postgres.listener import Listener
from ..postgres.batches import ShrinkingBatch
from ..postgres.pools import LoopPools
from ..postgres.text import BIGINT_MAX
from ..postgres.urls import redact
from ..types import JSON, Message, Offset, Topic
from ..errors import ArgumentTypeError, ArgumentValueError, ConfigError, first_line
from .base import (HISTORY_PAGE, HISTORY_PAGE_BYTES, IDLE_EXPIRE, READ_BYTES, FanOut, History, encode_batch,
                   encode_payload, good_origin, idle_expiry, origin_number, plain_topic)

log = logging.getLogger("livepush.fanout.postgres")

CHANNEL = "livepush"
PRUNE_BATCH = 5_000
# The smallest batch a statement_timeout shrinks prune()'s batches to (postgres/batches.py).
PRUNE_FLOOR = 50
# Topics per statement of histories(); their pages share HISTORY_PAGE_BYTES, each topic at
# least MIN_PAGE_BYTES (and its first row whatever its size).
READ_BATCH = 500
MIN_PAGE_BYTES = 4096

# name: publish -- see livepush_publish(): ordered per topic by the topic row's lock.
PUBLISH = "SELECT livepush_publish(%s, %s)"
# name: publish_many -- see livepush_publish_many(): the topics' row locks taken in one order.
PUBLISH_MANY = "SELECT livepush_publish_many(%s::json)"
# name: publish_on, publish_many_on -- publish and publish_many on a caller's connection (`conn=`):
# they run only when that connection is on the database this fan-out publishes to, told apart by
# its server's start time and its name as identity.py reads them (%(started)s, %(name)s), and the
# row names the connection's database either way (NULL first: nothing was written). A message in
# another database's log reaches no server. Safe under concurrency as the functions are; the
# rest is a plain read. CASE runs the (volatile) function only when its condition holds.
_ON_DATABASE = """
SELECT CASE WHEN i.started = %(started)s AND i.name = %(name)s THEN {call} END, i.started, i.name
FROM (SELECT extract(epoch FROM pg_postmaster_start_time())::text AS started, current_database() AS name) i
"""
PUBLISH_ON = _ON_DATABASE.format(call="livepush_publish(%(topic)s, %(data)s)")
PUBLISH_MANY_ON = _ON_DATABASE.format(call="livepush_publish_many(%(batch)s::json)")
# A statement of publish_many takes at most this many messages, or about this many characters
# of data: a batch of any size is one transaction, never one huge JSON parameter.
MANY_CHUNK = 1000
MANY_CHUNK_BYTES = 8 * 1024 * 1024
# name: latest_offset -- a committed value: the topic's epoch and last sequence number; for a
# topic never published (no row), 0, the log's epoch and the database's clock, from which
# origin_number() makes its origin (livepush_log_epoch() makes the epoch if a crash emptied the log).
LATEST = """
SELECT epoch, last_seq, NULL::bigint FROM livepush_topics WHERE topic = %(topic)s
UNION ALL
SELECT 0, livepush_log_epoch(), (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
WHERE NOT EXISTS (SELECT FROM livepush_topics WHERE topic = %(topic)s)
"""
# name: histories -- for each (topic, after) pair, the topic's latest offset and the page after
# `after`, in one statement: one snapshot and one round trip for every topic a batch of
# doorbells named (the server's live reads), or for one topic (a replay). The pairs come as one
# JSON text, [[topic, after], ...]: one call of the C encoder, where psycopg dumps a list
# parameter an element at a time in Python, a cost on every live read. Per topic: capped at
# its latest offset in that snapshot, so every row below it has committed; rows missing below
# it were pruned (the caller resets). A page stops at the row that takes it past the byte
# bound (a page always has one row), so a page of large messages stays small. The bound is
# after + least(last - after, limit), never after + limit: a client's `since` may be as large as
# a bigint goes, and adding to it would fail the read as if Postgres were down. At least one row
# per pair; its topic columns are NULL for a topic never published, its page columns when the
# page is empty. Each row has the log's epoch (NULL when a crash emptied the log and nobody has
# read an origin since) and the database's clock, which an origin offset is checked against.
# Across pairs, in their order, a row's data is left out (NULL, its seq kept so that the page is
# still checked for gaps) once the rows before it hold %(read_bytes)s: the first row is always
# sent, so every statement makes progress, and the caller reads the rest with the next one.
# octet_length() reads a stored value's size without fetching it, and a row left out is not fetched.
# Read-only: concurrent publishers only add rows past what the snapshot shows.
HISTORIES = """
SELECT p.i, p.epoch, p.last_seq, p.seq, CASE WHEN p.read_before < %(read_bytes)s THEN p.data END, p.at,
       (SELECT epoch FROM livepush_log) AS log_epoch, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now
FROM (
    SELECT r.i, t.epoch, t.last_seq, m.seq, m.data, m.at,
           coalesce(sum(octet_length(m.data)) OVER (ORDER BY r.i, m.seq ROWS UNBOUNDED PRECEDING), 0)
               - coalesce(octet_length(m.data), 0) AS read_before
    FROM jsonb_array_elements(%(reads)s::jsonb) WITH ORDINALITY AS r(pair, i)
    CROSS JOIN LATERAL (SELECT r.pair ->> 0 AS topic, (r.pair ->> 1)::bigint AS after) q
    LEFT JOIN livepush_topics t ON t.topic = q.topic
    LEFT JOIN LATERAL (
        SELECT seq, data, extract(epoch FROM created_at)::float8 AS at,
               sum(octet_length(data)) OVER (ORDER BY seq) - octet_length(data) AS before
        FROM livepush_messages
        WHERE topic = q.topic AND seq > q.after AND seq <= q.after + least(t.last_seq - q.after, %(limit)s)
    ) m ON m.before < %(bytes)s
) p
ORDER BY p.i, p.seq
"""
# name: prune -- bounded per call, oldest first (along the created_at index): a topic's messages
# are created in sequence order (its row lock orders its publishers), so what is left of a topic is
# always its newest messages, and a replay from a pruned offset is refused at its first page, never
# after sending part of the range (which rows a bare LIMIT takes depends on where they are stored,
# and a busy log reuses freed space). Servers pruning at once race for the same rows, which
# DELETE tolerates (a row is deleted once). The batch is a parameter: prune() halves it under a
# statement_timeout shorter than a whole one takes.
PRUNE = """
DELETE FROM livepush_messages WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM livepush_messages
    WHERE created_at < now() - make_interval(secs => %s)
    ORDER BY created_at
    LIMIT %s))
"""
# name: forget_idle -- the next `batch` topics after `after` in key order (the sweep's cursor:
# each call looks at a bounded stretch, never at every topic), and of those, the ones idle for
# `idle` seconds whose messages are all pruned lose their row: their next publish starts a new
# epoch, so an older offset gets `reset`, and no message of the old epoch is left to be read
# under the new one's numbers. Safe under concurrency: a publish takes the row's lock before it
# writes a message, so a row locked now is being published to and is skipped; one published to
# and committed since this statement's snapshot has a greater last_seq, which FOR UPDATE's
# re-check of the newest version sees against the snapshot's `scanned` value, so it is kept.
# Servers sweeping at once only skip each other's rows. A row KEEP_CHAINS touched since the
# snapshot has a newer touched_at, which the same re-check sees: it is kept too. Returns the
# stretch's last topic, how many topics it held and how many rows went.
FORGET_IDLE = """
WITH scanned AS MATERIALIZED (
    SELECT topic, last_seq, touched_at FROM livepush_topics
    WHERE topic > %(after)s ORDER BY topic LIMIT %(batch)s
), idle AS (
    SELECT t.topic FROM livepush_topics t
    JOIN scanned s ON s.topic = t.topic AND s.last_seq = t.last_seq AND s.touched_at = t.touched_at
    WHERE s.touched_at < now() - make_interval(secs => %(idle)s)
      AND NOT EXISTS (SELECT FROM livepush_messages m WHERE m.topic = t.topic)
    FOR UPDATE OF t SKIP LOCKED
), gone AS (
    DELETE FROM livepush_topics t USING idle i WHERE t.topic = i.topic RETURNING t.topic
)
SELECT (SELECT max(topic) FROM scanned), (SELECT count(*) FROM scanned)::int, (SELECT count(*) FROM gone)::int
"""
# name: keep_chains -- the rows of the topics a server's subscribers watch, touched as a publish
# touches them (no message, no notification), so that FORGET_IDLE leaves them for another idle
# time: their next message follows their last offset. A row locked now is being published to,
# which touches it: skipped rather than waited for (a publisher's transaction may run long), so
# this never blocks, and servers touching the same rows at once skip each other's. A topic with
# no row (never published, or already forgotten) has nothing to keep. Nor has a row touched within
# `fresh` seconds (a quarter of the idle time, as often as a hub keeps its topics): it is kept
# long enough already, and pages subscribing all day to busy topics then write nothing.
KEEP_CHAINS = """
UPDATE livepush_topics t SET touched_at = now()
FROM (SELECT topic FROM livepush_topics
      WHERE topic = ANY(%(topics)s::text[]) AND touched_at < now() - make_interval(secs => %(fresh)s)
      FOR UPDATE SKIP LOCKED) k
WHERE t.topic = k.topic
"""
# The share of the idle time a kept row stays fresh for (KEEP_CHAINS).
KEEP_FRESH_SHARE = 0.25
# Topics per KEEP_CHAINS statement.
KEEP_BATCH = 5_000

_OFFSET = re.compile(r"([0-9]{1,19})-([0-9]{1,19})")
_DOORBELL = re.compile(r"([0-9]{1,19})-([0-9]{1,19}) ([A-Za-z0-9_.:/-]{1,200})")


def _offset(epoch: int, seq: int) -> Offset:
    return f"{epoch}-{seq}"


def parse_offset(since: str) -> tuple[int, int] | None:
    """(epoch, seq) of an offset this fan-out gives out; None for anything else (ASCII digits
    only). An origin, given out for a topic never published, is (0, a step of the log's epoch)."""
    m = _OFFSET.fullmatch(since)
    if m is None:
        return None
    epoch, seq = int(m.group(1)), int(m.group(2))
    if epoch > BIGINT_MAX or seq > BIGINT_MAX:
        return None  # past what a bigint column holds: never given out
    return epoch, seq


def parse_doorbell(payload: str) -> list[Message]:
    """The doorbells in one notification ("EPOCH-SEQ TOPIC" a line); lines that do not parse
    are left out."""
    found = []
    for line in payload.split("\n", 100)[:100]:
        m = _DOORBELL.fullmatch(line)
        # Past a bigint (19 digits fit the pattern) is an offset no row holds: forged, as is a line
        # that does not parse, rather than a ring that costs a read of the log.
        if m is None or int(m.group(1)) > BIGINT_MAX or int(m.group(2)) > BIGINT_MAX:
            if line:
                log.debug("dropped a notification on %s that is not a doorbell: %r", CHANNEL, line[:80])
            continue
        epoch, seq = int(m.group(1)), int(m.group(2))
        if seq < 1:
            continue
        found.append(Message(m.group(3), _offset(epoch, seq), _offset(epoch, seq - 1), None))
    return found


def _page(topic: Topic, since_epoch: int, after: int, found: list[tuple[Any, ...]], step: int,
          idle: int) -> History | None:
    """One topic's page from its rows of HISTORIES (at least one), read after `after` (0 for an
    origin); `step` and `idle`: the origin's step and the idle time, in microseconds."""
    epoch, last, log_epoch, now = found[0][1], found[0][2], found[0][6], found[0][7]
    # A good origin (given out while the topic had no row): the log was not emptied since, and
    # the topic cannot have been forgotten since, so it has lost nothing; it replays from its
    # first message.
    origin = since_epoch == 0 and good_origin(after, log_epoch, now, step, idle)
    if origin:
        after = 0
    if epoch is None:  # nothing published yet, or not since a crash emptied the log or it was forgotten
        return History([], _offset(0, origin_number(log_epoch, now, step)), False) if origin else None
    if (since_epoch != epoch and not origin) or after > last:
        return None  # from before a crash emptied the log, or an offset never given out
    latest = _offset(epoch, last)
    if after == last:
        return History([], latest, False)
    rows = [(seq, data, at) for _, _, _, seq, data, at, _, _ in found if seq is not None]
    # Never a silent hole: the page runs from after+1 without a gap. Rows past the TTL that no
    # prune has reached yet are served too: present and contiguous, they lose nothing, and a
    # message's created_at is when it was published, so one committed by a transaction that ran
    # longer than the TTL after it is past it the moment it can be read.
    if not rows or rows[0][0] != after + 1 or rows[-1][0] != after + len(rows):
        return None
    # Rows without data are past the statement's READ_BYTES: always the page's tail (the bound
    # counts along each page in order), which the next read starts from.
    sent = [(seq, data, at) for seq, data, at in rows if data is not None]
    messages = [Message(topic, _offset(epoch, seq), _offset(epoch, seq - 1), data, at) for seq, data, at in sent]
    return History(messages, latest, (sent[-1][0] if sent else after) < last)


# A batch's statements: the order they take its items in (None: the batch's own), and their documents.
Statements = tuple[list[int] | None, list[str]]


def _many_statements(encoded: list[tuple[Topic, str]]) -> Statements:
    """The JSON documents of livepush_publish_many() for a batch, and the order they take its
    items in (None: the batch's own). One statement takes it unless it is long; a long one is
    sorted by topic first (stable, so a topic's messages keep their order) and split, so that
    every statement, and the transaction as a whole, locks topic rows in one order."""
    order: list[int] | None = None
    size = sum(len(text) for _, text in encoded)
    if len(encoded) > MANY_CHUNK or size > MANY_CHUNK_BYTES:
        order = sorted(range(len(encoded)), key=lambda i: encoded[i][0])
        encoded = [encoded[i] for i in order]
    chunks: list[list[tuple[Topic, str]]] = []
    used = 0
    for item in encoded:
        if not chunks or len(chunks[-1]) == MANY_CHUNK or (chunks[-1] and used + len(item[1]) > MANY_CHUNK_BYTES):
            chunks.append([])
            used = 0
        chunks[-1].append(item)
        used += len(item[1])
    # Each data goes in as a JSON string holding its text, which the function reads back exactly.
    # Not as the JSON value itself: Postgres' json operators refuse a \u0000 escape anywhere in
    # what they read, and data may hold one (a NUL character in a string).
    return order, [json.dumps(chunk, ensure_ascii=False, separators=(",", ":")) for chunk in chunks]


# Server encodings that take every character livepush sends them: UTF8, and SQL_ASCII, which
# stores the bytes as they come. A database in another (LATIN1, WIN1252, EUC_JP) lacks some.
_ANY_TEXT = ("UTF8", "SQL_ASCII")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def _escaped(match: re.Match[str]) -> str:
    return json.dumps(match.group())[1:-1]  # "\uXXXX", a surrogate pair past U+FFFF


def _takes_any_text(conn: Any) -> bool:
    """Whether `conn` carries every character into its database: no client or server encoding
    on the way that lacks some. Two lookups of what the connection was told at its start."""
    info = conn.info
    return info.parameter_status("server_encoding") in _ANY_TEXT and info.encoding in ("utf-8", "ascii")


def fitted(conn: Any, text: str) -> str:
    """Data's JSON `text` as `conn` can send it: as it is, unless an encoding on its way may lack
    some of its characters; then with each non-ASCII character as its \\u escape, the same JSON
    in characters every encoding has. Postgres refused such text otherwise (and on a caller's
    connection psycopg raised a bare UnicodeEncodeError). Free for ASCII text."""
    return text if text.isascii() or _takes_any_text(conn) else _NON_ASCII.sub(_escaped, text)


def fitted_batch(conn: Any, encoded: list[tuple[Topic, str]], built: Statements) -> Statements:
    """The statements `built` from a batch's `encoded` data, as `conn` can send them: built again
    from each data as fitted() sends it when an encoding on its way may lack some characters
    (topics are ASCII). `built` is made before a pool's connection is taken: encoding the batch is
    most of the call's own work, and that rare rebuild is all that needs the connection."""
    if _takes_any_text(conn):
        return built
    return _many_statements([(topic, _NON_ASCII.sub(_escaped, text)) for topic, text in encoded])


# What a server's reads of the log (history(), alatest_offset()) need, named when the role is
# refused one: the driver's error names the one object it stopped at, not the privilege.
_READS_NEED = "SELECT on livepush_topics, livepush_messages and livepush_log, and EXECUTE on livepush_log_epoch()"


@contextlib.contextmanager
def _read_refused(url: str) -> Iterator[None]:
    """Around a read of the log: a privilege the role lacks becomes ConfigError naming what reads
    need and what grants it, inside translated(), which passes ours through."""
    try:
        yield
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ConfigError(f"the database role may not read the message log at {redact(url)} ({first_line(exc)}): "
                          f"reads need {_READS_NEED}; run `livepush migrate --runtime-role ROLE` as the schema's "
                          "owner, which grants them") from exc


def callers_connection(conn: Any, call: str) -> None:
    """Refuses a `conn=` that `call` cannot publish in: one of the other kind (sync or async), or one
    its caller closed before the call. A closed one that is not broken was closed on purpose (a
    publish after its `with` block): told "cannot reach Postgres", as a lost one is, an operator
    would check a server that is up."""
    kind: type[psycopg.AsyncConnection[Any]] | type[psycopg.Connection[Any]]
    if call.startswith("a"):
        kind, other, other_kind = psycopg.AsyncConnection, call[1:], "a sync Connection"
    else:
        kind, other, other_kind = psycopg.Connection, f"a{call}", "an AsyncConnection"
    if not isinstance(conn, psycopg.BaseConnection):
        # A framework's wrapper (django.db.connection) or a psycopg2 connection: "use the other
        # call" would send the caller the wrong way, so name what was given and where the right one is.
        given = f"{type(conn).__module__}.{type(conn).__qualname__}"
        raise ArgumentTypeError(f"{call}(conn=) takes a psycopg.{kind.__name__} (psycopg 3), got {given}: "
                                + PSYCOPG_CONNECTION_HINT)
    if not isinstance(conn, kind):
        raise ArgumentTypeError(f"{call}(conn=) takes a psycopg.{kind.__name__}; use {other}() for {other_kind}")
    refuse_closed(conn, f"{call}(conn=)", "the messages")


class PostgresFanOut(FanOut):
    name = "postgres"

    def __init__(self, url: str, *, history_ttl: float = 300.0, idle_expire: float = IDLE_EXPIRE,
                 listener: Listener | None = None) -> None:
        super().__init__()
        self.url = url
        self.history_ttl = history_ttl
        self.idle_expire = idle_expiry(idle_expire, history_ttl)
        # The origin moves on every half idle time, in microseconds: half of `idle_expire` as
        # given, not as the history's TTL lengthens it, so that a web process rendering origins
        # with another LIVEPUSH_HISTORY_TTL than the servers' puts them on the same steps. An
        # origin is taken while younger than this process's idle time (two steps or more).
        self._origin_step = max(int(idle_expire * 1_000_000) // 2, 1)
        self._idle_us = int(self.idle_expire * 1_000_000)
        # Where the idle sweep goes on (a topic name; "" from the start): each prune() looks at
        # the next stretch of topics, so every topic is looked at within a few thousand calls.
        self._sweep_after = ""
        # Each of prune()'s statements, halved under a statement_timeout shorter than its batch takes.
        self._prune_batch = ShrinkingBatch("expired messages of the history", floor=PRUNE_FLOOR, log=log)
        self._sweep_batch = ShrinkingBatch("topics looked at for idleness", floor=PRUNE_FLOOR, log=log)
        self._pools = LoopPools(url, name="livepush-fanout")
        # The database's identity (identity.py), read at the first publish with conn=, which must
        # be on it; read again when a connection seems to be on another (a restart changes it).
        self._database: tuple[str, str] | None = None
        # Shared with the process's other listening parts when the wiring passes one in.
        self._listener = ListenerSlot(listener, lambda: Listener(url))

    # -- publishing -------------------------------------------------------------------
    def publish(self, topic: Topic, data: JSON, *, conn: Any = None) -> Offset:
        topic, text = plain_topic(topic), encode_payload(data)
        if conn is not None:
            callers_connection(conn, "publish")
            with translated_if_lost(self.url, conn), cursor_on(conn) as cur:
                row = self._on_database(cur, "publish", PUBLISH_ON, {"topic": topic, "data": fitted(conn, text)})
        else:
            with translated(self.url), self._pools.sync().connection() as c:
                row = c.execute(PUBLISH, (topic, fitted(c, text))).fetchone()
        assert row is not None
        self._published.inc()
        return str(row[0])

    async def apublish(self, topic: Topic, data: JSON, *, conn: Any = None) -> Offset:
        topic, text = plain_topic(topic), encode_payload(data)
        if conn is not None:
            callers_connection(conn, "apublish")
            with translated_if_lost(self.url, conn):
                async with cursor_on(conn) as acur:
                    row = await self._aon_database(acur, "apublish", PUBLISH_ON,
                                                   {"topic": topic, "data": fitted(conn, text)})
        else:
            with translated(self.url):
                async with (await self._pools.aget()).connection() as c:
                    row = await (await c.execute(PUBLISH, (topic, fitted(c, text)))).fetchone()
        assert row is not None
        self._published.inc()
        return str(row[0])

    def publish_many(self, messages: Iterable[tuple[Topic, JSON]], *, conn: Any = None) -> list[Offset]:
        encoded = encode_batch(messages)
        if conn is not None:
            # Before the empty batch's early return: a wrong conn= shows on the first call, not
            # when a batch first has items.
            callers_connection(conn, "publish_many")
        if not encoded:
            return []
        if conn is not None:
            order, statements = fitted_batch(conn, encoded, _many_statements(encoded))
            # In autocommit each statement would commit alone: the batch is one transaction still.
            with translated_if_lost(self.url, conn), \
                    conn.transaction() if conn.autocommit and len(statements) > 1 else contextlib.nullcontext(), \
                    cursor_on(conn) as cur:
                got = [self._on_database(cur, "publish_many", PUBLISH_MANY_ON, {"batch": doc}) for doc in statements]
        else:
            built = _many_statements(encoded)
            with translated(self.url), self._pools.sync().connection() as c:
                order, statements = fitted_batch(c, encoded, built)
                # The pool's connections are in autocommit: a batch of one statement is one round trip.
                with c.transaction() if len(statements) > 1 else contextlib.nullcontext():
                    got = [c.execute(PUBLISH_MANY, (doc,)).fetchone() for doc in statements]
        return self._offsets(order, got)

    async def apublish_many(self, messages: Iterable[tuple[Topic, JSON]], *, conn: Any = None) -> list[Offset]:
        encoded = encode_batch(messages)
        if conn is not None:
            callers_connection(conn, "apublish_many")  # as publish_many(): before the early return
        if not encoded:
            return []
        got = []
        if conn is not None:
            order, statements = fitted_batch(conn, encoded, _many_statements(encoded))
            with translated_if_lost(self.url, conn):
                async with conn.transaction() if conn.autocommit and len(statements) > 1 \
                        else contextlib.nullcontext(), cursor_on(conn) as acur:
                    for doc in statements:
                        got.append(await self._aon_database(acur, "apublish_many", PUBLISH_MANY_ON, {"batch": doc}))
        else:
            built = _many_statements(encoded)
            with translated(self.url):
                async with (await self._pools.aget()).connection() as c:
                    order, statements = fitted_batch(c, encoded, built)
                    async with c.transaction() if len(statements) > 1 else contextlib.nullcontext():
                        for doc in statements:
                            got.append(await (await c.execute(PUBLISH_MANY, (doc,))).fetchone())
        return self._offsets(order, got)

    # -- a caller's connection (conn=) -----------------------------------------------------
    def _on_database(self, cur: Any, call: str, statement: str, params: dict[str, Any]) -> Any:
        """The row of `statement` (PUBLISH_ON, PUBLISH_MANY_ON) run on a caller's cursor, which
        publishes only if its connection is on this fan-out's database; else ArgumentValueError."""
        database = self._database or self._read_database()
        row = cur.execute(statement, {**params, "started": database[0], "name": database[1]}).fetchone()
        if row[0] is None and (fresh := self._read_database()) != database:
            # Read before a restart or a failover, which changed the server's start time.
            row = cur.execute(statement, {**params, "started": fresh[0], "name": fresh[1]}).fetchone()
        return row if row[0] is not None else self._elsewhere(call, row)

    async def _aon_database(self, acur: Any, call: str, statement: str, params: dict[str, Any]) -> Any:
        """_on_database(), on a caller's AsyncConnection."""
        database = self._database or await self._aread_database()
        row = await (await acur.execute(statement, {**params, "started": database[0], "name": database[1]})).fetchone()
        if row[0] is None and (fresh := await self._aread_database()) != database:
            row = await (await acur.execute(statement, {**params, "started": fresh[0], "name": fresh[1]})).fetchone()
        return row if row[0] is not None else self._elsewhere(call, row)

    def _read_database(self) -> tuple[str, str]:
        with translated(self.url), self._pools.sync().connection() as c:
            row = c.execute(IDENTITY).fetchone()
        assert row is not None  # one row, always
        self._database = (row[0], row[1])
        return self._database

    async def _aread_database(self) -> tuple[str, str]:
        with translated(self.url):
            async with (await self._pools.aget()).connection() as c:
                row = await (await c.execute(IDENTITY)).fetchone()
        assert row is not None  # one row, always
        self._database = (row[0], row[1])
        return self._database

    def _elsewhere(self, call: str, row: Any) -> NoReturn:
        """Raise what a publish on a caller's connection to another database (`row`: its start
        time and name, PUBLISH_ON's) says."""
        assert self._database is not None  # read by the call that got `row`
        raise ArgumentValueError(
            f"{other_database(f'{call}(conn=)', row[1:], self._database, self.url)}, the one this process "
            "publishes to and the servers deliver from: a message "
            "written there would reach no one. Pass a connection to that database (or publish without conn=), or "
            "point LIVEPUSH_DATABASE_URL at the connection's database, for the servers too")

    def _offsets(self, order: list[int] | None, rows: list[Any]) -> list[Offset]:
        """The batch's offsets in its own order, from the statements' rows."""
        offsets = [offset for row in rows for offset in row[0]]
        self._published.inc(len(offsets))
        if order is None:
            return offsets
        out: list[Offset] = [""] * len(offsets)
        for at, i in enumerate(order):
            out[i] = offsets[at]
        return out

    # -- listening --------------------------------------------------------------------
    async def listen(self) -> None:
        if self._subscribed:
            return  # listen() is called once at boot; a second call changes nothing
        listener = self._listener.get()
        listener.add(CHANNEL, self._on_notification, on_resync=self._heard.resync)
        await listener.start()
        self._listen_called = self._subscribed = True

    @property
    def listening(self) -> bool:
        return self._subscribed and self._listener.listening

    def relisten(self, reason: str) -> None:
        if self._subscribed:  # the shared listener's other channels resync too: they heard nothing either
            self._listener.get().relisten(reason)

    def _on_notification(self, payload: str) -> None:
        for message in parse_doorbell(payload):
            self._heard.deliver(message)

    # -- history ----------------------------------------------------------------------
    async def history(self, topic: Topic, since: Offset, *, limit: int = HISTORY_PAGE,
                      timeout: float | None = None) -> History | None:
        return (await self._read({topic: since}, limit, timeout))[topic]

    async def histories(self, reads: Mapping[Topic, Offset]) -> dict[Topic, History | None]:
        found: dict[Topic, History | None] = {}
        batch: dict[Topic, Offset] = {}
        for topic, since in reads.items():
            batch[topic] = since
            if len(batch) == READ_BATCH:
                found.update(await self._read(batch, HISTORY_PAGE))
                batch = {}
        if batch:
            found.update(await self._read(batch, HISTORY_PAGE))
        return found

    async def _read(self, reads: Mapping[Topic, Offset], limit: int,
                    timeout: float | None = None) -> dict[Topic, History | None]:
        found: dict[Topic, History | None] = {}
        asked: list[tuple[Topic, int, int]] = []
        for topic, since in reads.items():
            parsed = parse_offset(since) if isinstance(since, str) else None
            if parsed is None:
                found[topic] = None
            else:
                asked.append((topic, *parsed))
        if not asked:
            return found
        # An origin's page starts at the topic's first message; _page checks its log epoch.
        params = {"reads": json.dumps([[topic, 0 if epoch == 0 else after] for topic, epoch, after in asked]),
                  "limit": limit,
                  "bytes": max(HISTORY_PAGE_BYTES // len(asked), MIN_PAGE_BYTES), "read_bytes": READ_BYTES}
        async with self._reading(timeout) as c:
            rows = await (await c.execute(HISTORIES, params)).fetchall()
        by_pair: dict[int, list[tuple[Any, ...]]] = {}
        for row in rows:
            by_pair.setdefault(row[0], []).append(row)
        for i, (topic, since_epoch, after) in enumerate(asked, 1):
            found[topic] = _page(topic, since_epoch, after, by_pair[i], self._origin_step, self._idle_us)
        return found

    def _latest(self, row: tuple[int, int, int | None] | None) -> Offset:
        assert row is not None  # LATEST has a row for every topic
        epoch, number, now = row
        return _offset(epoch, number if now is None else origin_number(number, now, self._origin_step))

    def latest_offset(self, topic: Topic) -> Offset:
        with translated(self.url), self._pools.sync().connection() as c:
            return self._latest(c.execute(LATEST, {"topic": topic}).fetchone())

    async def alatest_offset(self, topic: Topic, *, timeout: float | None = None) -> Offset:
        async with self._reading(timeout) as c:
            return self._latest(await (await c.execute(LATEST, {"topic": topic})).fetchone())

    @contextlib.asynccontextmanager
    async def _reading(self, timeout: float | None) -> AsyncIterator[psycopg.AsyncConnection]:
        """A pool connection for a read (history(), alatest_offset()), its failures translated.
        `timeout` caps the wait for the connection, psycopg_pool's 30 s otherwise: while Postgres
        restarts that wait is all a read does. A statement sent is not cut short: cancelling one
        waits for the server's answer to the cancel, and a restart fails it at once."""
        with translated(self.url), _read_refused(self.url):
            async with (await self._pools.aget()).connection(timeout=timeout) as c:
                yield c

    async def keep_chains(self, topics: Sequence[Topic]) -> None:
        with translated(self.url):
            async with (await self._pools.aget()).connection() as c:
                for start in range(0, len(topics), KEEP_BATCH):
                    await c.execute(KEEP_CHAINS, {"topics": list(topics[start:start + KEEP_BATCH]),
                                                  "fresh": self.idle_expire * KEEP_FRESH_SHARE})

    async def prune(self) -> int:
        """Drops a bounded batch of expired messages, then the rows of idle topics among the next
        stretch of topics; returns the rows dropped. A batch that the statement_timeout cancels
        is halved and run again (ShrinkingBatch), so pruning goes on under any timeout that lets
        PRUNE_FLOOR rows through."""
        with translated(self.url):
            async with (await self._pools.aget()).connection() as c:
                async def prune_messages(batch: int) -> int:
                    return (await c.execute(PRUNE, (self.history_ttl, batch))).rowcount

                async def forget_idle(batch: int) -> Any:
                    return await (await c.execute(FORGET_IDLE, {"after": self._sweep_after, "batch": batch,
                                                                "idle": self.idle_expire})).fetchone()

                pruned, _ = await self._prune_batch.run(PRUNE_BATCH, prune_messages)
                row, stretch = await self._sweep_batch.run(PRUNE_BATCH, forget_idle)
        assert row is not None  # one row, whatever the stretch held
        forgotten: int
        last, scanned, forgotten = row
        # A short stretch reached the end: the next call starts again from the first topic.
        self._sweep_after = last if scanned == stretch else ""
        return pruned + forgotten

    # -- opening and closing ------------------------------------------------------------
    async def aopen(self) -> None:
        await self._pools.aget()

    async def release_loop(self) -> None:
        await self._pools.release_loop()

    async def aclose(self) -> None:
        self._subscribed = False  # a listen() after this must subscribe again
        await self._listener.aclose()
        await self._pools.aclose()

    def close(self) -> None:
        self._pools.close()
