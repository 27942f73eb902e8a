"""The Postgres fan-out's own retention of topics (what every fan-out shares is in
test_fanout_conformance.py): a topic nothing is published on for a day loses its row, as an idle
Redis topic loses its key, so topics that are never published again do not pile up; its next
message starts a new chain, and an offset from before gets `reset`, never another message under
the same number (an origin held that long too); a day is simulated by moving the rows' times back,
or shortened. Also what a publish says when every connection of its pool is busy, and a
doorbell that reaches the listener during its ping."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import re
import resource
import secrets
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import livepush

from livepush.fanout import postgres as pg_fanout
from livepush.fanout.postgres import PostgresFanOut
from livepush.postgres import connect as pg_connect
from livepush.postgres import pools
from livepush.migrate import migrate
from livepush.postgres.batches import REGROW_AFTER, ShrinkingBatch
from livepush.postgres.listener import Listener
from tests.support import services
from tests.support.fanouts import Collector, offsets_of, read_history, read_on_bounded
from tests.support.waiting import async_wait_for, wait_for

DAY = 86_400


@pytest.fixture
async def fanout(pg_url: str) -> AsyncIterator[PostgresFanOut]:
    made = PostgresFanOut(pg_url)
    yield made
    await made.aclose()


def age(pg_url: str, topic: str, *, seconds: float, messages_too: bool = True) -> None:
    """Moves `topic`'s last publish (and its messages' times) `seconds` into the past."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE livepush_topics SET touched_at = touched_at - make_interval(secs => %s) WHERE topic = %s",
                     (seconds, topic))
        if messages_too:
            conn.execute("UPDATE livepush_messages SET created_at = created_at - make_interval(secs => %s) "
                         "WHERE topic = %s", (seconds, topic))


def has_row(pg_url: str, topic: str) -> bool:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM livepush_topics WHERE topic = %s", (topic,)).fetchone() is not None


async def prune_all(fanout: PostgresFanOut) -> None:
    """prune() until a call drops nothing, as the server's prune cycle does."""
    while await fanout.prune():
        pass


async def test_a_topic_idle_for_a_day_is_forgotten_and_its_old_offsets_get_reset(
        fanout: PostgresFanOut, pg_url: str) -> None:
    """After a day without a publish, prune() drops the topic's row once its messages are pruned:
    the topic reads as never published (its origin offset), an offset from before gets `reset`,
    and the next message starts a new chain that the origin replays."""
    offsets = [fanout.publish("idle:a", {"i": i}) for i in range(3)]
    kept = fanout.publish("busy:a", {"i": 0})
    age(pg_url, "idle:a", seconds=DAY + 60)
    await prune_all(fanout)
    assert not has_row(pg_url, "idle:a")
    assert has_row(pg_url, "busy:a"), "a topic published to within the day keeps its chain"
    assert fanout.latest_offset("busy:a") == kept

    origin = fanout.latest_offset("idle:a")
    assert origin.startswith("0-"), "read as a topic never published"
    for since in offsets:
        assert await fanout.history("idle:a", since) is None, f"since={since}"
    fresh = fanout.publish("idle:a", {"i": 3})
    assert fresh.endswith("-1") and fresh.split("-")[0] != offsets[0].split("-")[0], "a new epoch, from 1"
    assert offsets_of(await read_history(fanout, "idle:a", origin)) == [fresh]
    assert await fanout.history("idle:a", offsets[-1]) is None


async def test_an_idle_topic_keeps_its_row_while_any_of_its_messages_is_left(
        fanout: PostgresFanOut, pg_url: str) -> None:
    """A topic idle for a day whose messages the bounded prune has not reached yet keeps its row,
    so no message of the old chain can be read under the new chain's numbers."""
    offsets = [fanout.publish("lag:a", {"i": i}) for i in range(2)]
    age(pg_url, "lag:a", seconds=DAY + 60, messages_too=False)
    assert await fanout.prune() == 0
    assert has_row(pg_url, "lag:a")
    assert fanout.latest_offset("lag:a") == offsets[-1]
    assert offsets_of(await read_history(fanout, "lag:a", offsets[0])) == offsets[1:]


async def test_a_topic_being_published_to_is_not_forgotten(fanout: PostgresFanOut, pg_url: str) -> None:
    """A transaction publishing on an idle topic holds its row: prune() leaves it, and once the
    transaction commits its message follows the old ones on the same chain."""
    offsets = [fanout.publish("open:a", {"i": i}) for i in range(2)]
    age(pg_url, "open:a", seconds=DAY + 60)
    with psycopg.connect(pg_url) as conn:
        late = fanout.publish("open:a", {"i": 2}, conn=conn)
        await prune_all(fanout)
        conn.commit()
    assert has_row(pg_url, "open:a")
    assert late.split("-")[0] == offsets[0].split("-")[0]
    assert offsets_of(await read_history(fanout, "open:a", offsets[-1])) == [late]


async def test_keeping_a_topic_being_published_to_waits_for_no_publisher(fanout: PostgresFanOut, pg_url: str) -> None:
    """A server keeps the chains of its watched topics beside publishers: a row a transaction is
    publishing on (and locks until it ends, which may be long) is passed over, not waited for, and
    the other topics of the call are kept all the same."""
    fanout.publish("keeping:other", {"i": 0})
    fanout.publish("keeping:busy", {"i": 0})
    age(pg_url, "keeping:other", seconds=DAY + 60)
    with psycopg.connect(pg_url) as conn:
        fanout.publish("keeping:busy", {"i": 1}, conn=conn)
        await asyncio.wait_for(fanout.keep_chains(["keeping:busy", "keeping:other"]), 5)
        conn.commit()
    await prune_all(fanout)
    assert has_row(pg_url, "keeping:other"), "the topic kept beside a busy one was forgotten"


async def test_keeping_a_topic_published_to_or_kept_lately_writes_nothing(fanout: PostgresFanOut, pg_url: str) -> None:
    """Pages subscribe to busy topics all day, and each subscribe has its topic kept: a row
    published to or kept within a quarter of the idle time is kept long enough already, and is
    not written again (its row version stays); one older than that is."""
    fanout.publish("keeping:fresh", {"i": 0})
    fanout.publish("keeping:old", {"i": 0})
    age(pg_url, "keeping:old", seconds=fanout.idle_expire * 0.3, messages_too=False)

    def versions() -> dict[str, str]:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            return dict(conn.execute("SELECT topic, xmin::text FROM livepush_topics WHERE topic LIKE 'keeping:%'"
                                     ).fetchall())

    before = versions()
    await asyncio.wait_for(fanout.keep_chains(["keeping:fresh", "keeping:old"]), 5)
    after = versions()
    assert after["keeping:fresh"] == before["keeping:fresh"], "a fresh row was written again"
    assert after["keeping:old"] != before["keeping:old"], "a row a quarter of the idle time old was not kept"


async def test_an_origin_held_while_its_topic_was_published_and_forgotten_gets_reset(pg_url: str) -> None:
    """A page renders a topic's origin and is away while messages are published, pruned and the
    idle topic forgotten, then another is published: the topic reads as having one message, but
    the page missed the others, so its origin gets None (reset), never a replay of only the new
    chain. An origin younger than the idle time still replays a topic's first messages."""
    fanout = PostgresFanOut(pg_url, history_ttl=0.1, idle_expire=0.5)
    try:
        rendered = fanout.latest_offset("forgot:a")
        missed = [fanout.publish("forgot:a", {"i": i}) for i in range(3)]

        async def forgotten() -> bool:
            await prune_all(fanout)
            return not has_row(pg_url, "forgot:a")

        await async_wait_for(forgotten, 10, message="the idle topic to be forgotten")
        again = fanout.publish("forgot:a", {"i": 3})
        assert await fanout.history("forgot:a", rendered) is None, f"the origin replayed {again} without {missed}"

        # Young by a process with the default idle time: at 0.5 s, an origin given out late in its
        # 0.25 s step was too old for its reads after a quarter of a second, by the database's
        # clock, which runs on while this process waits for a core on a loaded machine.
        steady = PostgresFanOut(pg_url, history_ttl=0.1)
        try:
            young = steady.latest_offset("forgot:b")
            first = steady.publish("forgot:b", {"i": 0})
            assert offsets_of(await read_history(steady, "forgot:b", young)) == [first]
        finally:
            await steady.aclose()
    finally:
        await fanout.aclose()


async def test_an_origin_from_a_process_with_another_history_ttl_replays_the_topic(pg_url: str) -> None:
    """A web process renders origins with its own LIVEPUSH_HISTORY_TTL, perhaps not the server's (a
    long TTL lengthens the idle time): the server still takes them, and replays the topic's first
    message, or nothing, without a reset."""
    web = PostgresFanOut(pg_url)
    server = PostgresFanOut(pg_url, history_ttl=100_000)
    try:
        web.latest_offset("ttl:made")  # makes the log's epoch, then moved back: a log made days ago,
        with psycopg.connect(pg_url, autocommit=True) as conn:  # whose origins have moved on since
            conn.execute("UPDATE livepush_log SET epoch = epoch - %s", (150_000 * 1_000_000,))
        for renders, reads in ((web, server), (server, web)):
            never, published = renders.latest_offset("ttl:never"), renders.latest_offset(f"ttl:{id(renders)}")
            first = renders.publish(f"ttl:{id(renders)}", {"i": 0})
            assert await read_history(reads, "ttl:never", never) == []
            assert offsets_of(await read_history(reads, f"ttl:{id(renders)}", published)) == [first]
    finally:
        await web.aclose()
        await server.aclose()


async def test_prune_drops_a_topics_oldest_messages_first_so_a_replay_is_refused_before_any_of_it_is_sent(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """prune() deletes a bounded batch of expired messages; which ones must not depend on where
    they are stored (a busy log reuses freed space, so storage order is not publish order). The
    oldest go first: what is left of a topic is always its newest messages, so a replay from a
    pruned offset is refused at its first page, never after part of it was sent."""
    monkeypatch.setattr(pg_fanout, "PRUNE_BATCH", 2)
    fanout = PostgresFanOut(pg_url, history_ttl=60)
    try:
        offsets = [fanout.publish("aged:a", {"i": i}) for i in range(4)]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            # The first three past the TTL, each older than the next; the second rewritten, so
            # that it is stored after the others, as in reused space.
            conn.execute("UPDATE livepush_messages SET created_at = now() - make_interval(secs => 200 - seq) "
                         "WHERE topic = 'aged:a' AND seq <= 3")
            conn.execute("UPDATE livepush_messages SET data = data WHERE topic = 'aged:a' AND seq = 2")
        assert await fanout.prune() == 2
        assert offsets_of(await read_history(fanout, "aged:a", offsets[1])) == offsets[2:], "the newest are kept"
        # A page has one message: a client away since the first one is refused at once.
        first_page = await fanout.history("aged:a", offsets[0], limit=1)
        assert first_page is None, f"sent {offsets_of(first_page.messages)} of a range with a hole"
    finally:
        await fanout.aclose()


async def test_a_statement_timeout_shorter_than_a_prune_batch_halves_the_batch_and_pruning_finishes(
        pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A statement_timeout (of the role, the database or here the URL) shorter than one batch of
    expired messages takes cancelled every prune(), every cycle, with a warning each time: nothing
    was ever pruned and the log grew. The batch halves at each cancel, keeping within the
    operator's timeout rather than setting it aside, so pruning finishes; one WARNING says so."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO livepush_messages (topic, seq, data, created_at) "
                     "SELECT 'old', g, '{}', now() - interval '1 hour' FROM generate_series(1, 1500) g")
    fanout = PostgresFanOut(make_conninfo(pg_url, options="-c statement_timeout=300"), history_ttl=60)
    try:
        # A batch of more than 700 rows outlasts the timeout: 5,000, 2,500 and 1,250 are cancelled.
        with services.pg_slow_deletes_past(pg_url, "livepush_messages", 700):
            await asyncio.wait_for(prune_all(fanout), 30)
    finally:
        await fanout.aclose()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM livepush_messages").fetchone() == (0,)
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "statement_timeout" in r.getMessage()]
    assert len(said) == 1 and "expired messages of the history" in said[0], said


async def test_a_halved_prune_batch_doubles_again_after_a_quiet_spell_so_one_slow_moment_does_not_slow_pruning_for_good() -> None:
    """A cancel may be one slow moment (a checkpoint, a lock), not the timeout: ten minutes after
    the last one the batch doubles again, up to its full size; a timeout that still holds halves
    it back, at the cost of one cancelled statement a period. (Pure logic: a clock and a statement
    that Postgres would cancel past a size.)"""
    now = [0.0]
    batch = ShrinkingBatch("rows", floor=50, log=logging.getLogger("test"), clock=lambda: now[0])
    limit = [700]  # what the statement_timeout lets through

    async def delete(size: int) -> int:
        if size > limit[0]:
            raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
        return size

    assert await batch.run(5_000, delete) == (625, 625)
    now[0] += REGROW_AFTER - 1
    assert (await batch.run(5_000, delete))[1] == 625
    limit[0] = 5_000  # the slow moment is over
    now[0] += 1
    assert [(await batch.run(5_000, delete))[1] for _ in range(2)] == [1_250, 1_250]
    for expected in (2_500, 5_000, 5_000):
        now[0] += REGROW_AFTER
        assert (await batch.run(5_000, delete))[1] == expected
    assert batch.cap is None
    limit[0] = 700  # a timeout that comes back halves it again
    assert (await batch.run(5_000, delete))[1] == 625


async def test_the_idle_sweep_reaches_every_topic_a_stretch_at_a_time(
        fanout: PostgresFanOut, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each prune() looks at a bounded stretch of topics after the last one it looked at, and
    starts again from the first after the last: every idle topic goes within a few calls."""
    monkeypatch.setattr(pg_fanout, "PRUNE_BATCH", 2)
    topics = [f"many:{i}" for i in range(5)]
    for topic in topics:
        fanout.publish(topic, {"i": 0})
        age(pg_url, topic, seconds=DAY + 60)
    for _ in range(8):  # 5 topics, 2 a stretch, messages first: well within 8 calls
        await fanout.prune()
    assert [t for t in topics if has_row(pg_url, t)] == []


async def test_a_read_of_many_topics_rung_with_large_messages_holds_a_bounded_amount_and_defers_the_rest(
        fanout: PostgresFanOut) -> None:
    """One read of many topics that each got a message near 1 MiB (what the server does after a
    batch of doorbells) holds a bounded amount of data, not every topic's first message at once,
    which was a MiB per topic for up to 500 topics; the topics past that bound come back as empty
    pages that say `more`, and reading on delivers every message once, in order."""
    big = "x" * 900_000
    topics = [f"big:{i}" for i in range(12)]
    cursors = {topic: fanout.publish(topic, "small") for topic in topics}
    sent = {topic: [fanout.publish(topic, {"n": n, "pad": big}) for n in range(2)] for topic in topics}
    got, reads = await read_on_bounded(fanout, cursors, pg_fanout.READ_BYTES + 1024 * 1024)
    assert got == sent
    assert reads > 1, "the topics did not all fit in one read"


def _unread_by_backend(pg_port: int, client_port: int) -> int:
    """Bytes the backend serving the client at `client_port` has not read yet (from /proc)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)
            if (local, remote) == (pg_port, client_port):
                return int(fields[4].split(":")[1], 16)
    return 0


@contextlib.contextmanager
def _frozen_backend(pg_url: str, listener: Listener) -> Iterator[Callable[[], int]]:
    """The listener's backend stopped (SIGSTOP) until the block ends; yields how many bytes it has
    not read yet (a ping sent to it shows there)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT pid, client_port FROM pg_stat_activity WHERE datname = current_database() "
                           "AND application_name = %s", (listener.name,)).fetchone()
    assert row is not None and row[1] > 0, "the listener's backend, over TCP"
    pid, client_port = row
    pg_port = int(conninfo_to_dict(pg_url).get("port") or 5432)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield lambda: _unread_by_backend(pg_port, client_port)
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_a_doorbell_that_reaches_the_listener_during_its_ping_is_delivered(pg_url: str) -> None:
    """A notification that reaches the LISTEN connection while it runs a statement of its own
    (its keepalive ping) is delivered as one that comes while it waits: none is lost between two
    waits. Its backend is frozen while a message is published and the ping is sent, so that the
    doorbell comes ahead of the ping's answer."""
    # A ping a second, which waits as long for its answer: the backend is continued well before.
    listener = Listener(pg_url, ping=1.0)
    fanout = PostgresFanOut(pg_url, listener=listener)
    await fanout.listen()
    got = Collector(fanout)
    fanout.register(got)
    try:
        with _frozen_backend(pg_url, listener) as unread:
            offset = await fanout.apublish("pinged:a", {"n": 1})  # its doorbell waits for the frozen backend
            await async_wait_for(lambda: unread() > 0, 5, message="the listener's ping to wait for its frozen backend")
        assert offsets_of(await got.wait_count("pinged:a", 1)) == [offset]
    finally:
        await fanout.aclose()


@pytest.mark.parametrize("cause", ["relisten", "ping timeout"])
async def test_a_listener_whose_ping_waits_drops_its_connection_with_livepushs_warning_and_none_of_psycopgs(
        pg_url: str, caplog: pytest.LogCaptureFixture, cause: str) -> None:
    """A listener drops its connection while its ping waits for a backend that does not answer:
    at once when a re-listen is asked meanwhile (readiness's canary came back late), within a cycle,
    not once the ping gives up (its bound, then as long again waiting for the cancelled statement's
    answer); else at the ping's bound. It logs its own "lost the Postgres listener" WARNING naming
    why, and psycopg logs none of its own about the statement it was running: the connection is
    discarded, so an operator reads one line for one event, from livepush."""
    caplog.set_level(logging.WARNING)
    listener = Listener(pg_url, name="lp-drop-in-ping", ping=3.0 if cause == "relisten" else 1.0)
    listener.add("livepush_drop_in_ping", lambda payload: None)
    await listener.start()

    def lost() -> list[str]:
        return [r.getMessage() for r in caplog.records if "lost the Postgres listener" in r.getMessage()]

    try:
        with _frozen_backend(pg_url, listener) as unread:
            await async_wait_for(lambda: unread() > 0, 10, message="the listener's ping to wait for its frozen backend")
            asked = time.monotonic()
            if cause == "relisten":
                listener.relisten("a test asked for it")
            await async_wait_for(lost, 10, message="the listener to drop its connection")
            if cause == "relisten":
                assert time.monotonic() - asked < 1.5
        await async_wait_for(lambda: listener.listening, 10, message="the listener to be back")
    finally:
        await listener.aclose()
    said = "a test asked for it" if cause == "relisten" else "no answer to the listener's ping within 1 s"
    assert len(lost()) == 1 and said in lost()[0], lost()
    psycopgs = [f"{r.name}: {r.getMessage()}" for r in caplog.records
                if r.name.split(".")[0] == "psycopg" and r.levelno >= logging.WARNING]
    assert psycopgs == []


def test_a_publish_that_finds_every_pooled_connection_busy_says_so_not_that_postgres_is_down(
        fanout: PostgresFanOut, pg_url: str) -> None:
    """Publishers of one topic wait for a transaction that published on it and has not ended: once
    they hold every connection of the pool, the next publish waits for one, then fails with an
    error that says the server is up and what holds the connections, never "cannot reach
    Postgres ... check that the server is running", which sends an operator to the wrong place."""
    pool = fanout._pools.sync()
    pool.timeout = 0.5  # the wait for a free connection, short for the test
    with psycopg.connect(pg_url) as holder, ThreadPoolExecutor(pool.max_size) as threads:
        fanout.publish("held:a", {"i": 0}, conn=holder)  # the topic's row lock, held until the end
        waiting = [threads.submit(fanout.publish, "held:a", {"i": i}) for i in range(1, pool.max_size + 1)]
        wait_for(lambda: pool.get_stats().get("pool_available", 0) == 0 and pool.get_stats()["pool_size"]
                 == pool.max_size, 5, message="every pooled connection to wait for the topic's lock")
        with pytest.raises(livepush.DependencyError) as raised:
            fanout.publish("other:a", {"i": 0})
        holder.rollback()
        assert sorted(int(w.result(timeout=10).split("-")[1]) for w in waiting) == list(range(1, pool.max_size + 1))
    said = str(raised.value)
    assert "cannot reach" not in said and "server is running" not in said, said
    assert "busy" in said and "is up" in said and "lock" in said and "pg_stat_activity" in said, said


def test_a_publish_in_a_repeatable_read_transaction_behind_another_publish_fails_whole_and_succeeds_again(
        fanout: PostgresFanOut, pg_url: str) -> None:
    """A REPEATABLE READ transaction whose snapshot predates another publish on the topic cannot
    take the topic's next offset: its publish raises psycopg's SerializationFailure and nothing of
    it is published (no offset is skipped); the same transaction run again commits with the next."""
    first = fanout.publish("rr:a", {"i": 1})
    with psycopg.connect(pg_url) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.execute("SELECT 1")  # the snapshot is taken here
        second = fanout.publish("rr:a", {"i": 2})
        with pytest.raises(psycopg.errors.SerializationFailure):
            fanout.publish("rr:a", {"i": 3}, conn=conn)
        conn.rollback()
        third = fanout.publish("rr:a", {"i": 3}, conn=conn)
        conn.commit()
    assert [int(o.split("-")[1]) for o in (first, second, third)] == [1, 2, 3]


async def test_a_database_in_sql_ascii_migrates_and_publishes_text_with_offsets_as_text(sql_ascii_url: str) -> None:
    """On a database in SQL_ASCII (initdb's choice under the C locale) `livepush migrate` applies
    every migration, and publish(), its async and batch twins, with conn= or not, return offsets
    "EPOCH-SEQ" and history gives back the very text published, non-ASCII characters included; psycopg
    hands such a database's text over as bytes, so offsets came back as "b'...'" and data as bytes."""
    migrate(sql_ascii_url)
    fanout = PostgresFanOut(sql_ascii_url)
    offset_form = re.compile(r"[0-9]+-[0-9]+")
    try:
        offsets = [fanout.publish("ascii:a", {"text": "café"}), await fanout.apublish("ascii:a", {"text": "日本"})]
        offsets += fanout.publish_many([("ascii:a", {"text": "ñ"})])
        with psycopg.connect(sql_ascii_url) as conn:
            offsets.append(fanout.publish("ascii:a", {"text": "ü"}, conn=conn))
            offsets += fanout.publish_many([("ascii:a", {"text": "ø"})], conn=conn)
        async with await psycopg.AsyncConnection.connect(sql_ascii_url) as aconn:
            offsets.append(await fanout.apublish("ascii:a", {"text": "ß"}, conn=aconn))
            offsets += await fanout.apublish_many([("ascii:a", {"text": "å"})], conn=aconn)
        assert all(isinstance(o, str) and offset_form.fullmatch(o) for o in offsets), offsets
        epoch = offsets[0].split("-")[0]
        replay = await read_history(fanout, "ascii:a", f"{epoch}-0")
        assert replay is not None
        assert [m.offset for m in replay] == offsets
        assert [m.data_json for m in replay] == [json.dumps({"text": t}, ensure_ascii=False, separators=(",", ":"))
                                                 for t in ("café", "日本", "ñ", "ü", "ø", "ß", "å")]
        assert fanout.latest_offset("ascii:a") == offsets[-1]
    finally:
        await fanout.aclose()


@pytest.fixture
def latin1_url(pg_admin_url: str) -> Iterator[str]:
    """A migrated database in LATIN1, an encoding that lacks most of Unicode."""
    name = f"t_latin1_{secrets.token_hex(6)}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
                     .format(sql.Identifier(name)))
    try:
        url = services.db_url(pg_admin_url, name)
        migrate(url)
        yield url
    finally:
        services.drop_database(pg_admin_url, name)


async def test_a_database_in_an_encoding_without_most_of_unicode_takes_messages_in_any_script(latin1_url: str) -> None:
    """On a database in LATIN1 (or WIN1252, EUC_JP: any encoding but UTF8) publish(), its async
    and batch twins, with conn= or not, take data in any script, emoji included, and history
    gives back the same JSON: Postgres refused every character its encoding lacks (a
    DependencyError, as if it were down), and psycopg a caller's connection's with a bare
    UnicodeEncodeError."""
    fanout = PostgresFanOut(latin1_url)
    texts = ["日本", "😀", "ñ", "Ω", "é😀", "ß", "✓", "\\ü"]
    try:
        offsets = [fanout.publish("latin:a", {"t": texts[0]}), await fanout.apublish("latin:a", {"t": texts[1]})]
        offsets += fanout.publish_many([("latin:a", {"t": texts[2]})])
        offsets += await fanout.apublish_many([("latin:a", {"t": texts[3]})])
        with psycopg.connect(latin1_url) as conn:
            offsets.append(fanout.publish("latin:a", {"t": texts[4]}, conn=conn))
            offsets += fanout.publish_many([("latin:a", {"t": texts[5]})], conn=conn)
        async with await psycopg.AsyncConnection.connect(latin1_url) as aconn:
            offsets.append(await fanout.apublish("latin:a", {"t": texts[6]}, conn=aconn))
            offsets += await fanout.apublish_many([("latin:a", {"t": texts[7]})], conn=aconn)
        replay = await read_history(fanout, "latin:a", offsets[0].split("-")[0] + "-0")
        assert replay is not None
        assert [m.offset for m in replay] == offsets
        assert [json.loads(m.data_json or "null") for m in replay] == [{"t": t} for t in texts]
    finally:
        await fanout.aclose()


def test_a_publish_refused_by_a_full_notify_queue_says_the_server_is_up_and_what_holds_it(pg_url: str) -> None:
    """A full NOTIFY queue fails every publish at commit with a program-limit error (class 54),
    which psycopg calls operational: the error says that Postgres is up and gives its detail and
    hint (the session holding the queue back), never "cannot reach Postgres ... check that the
    server is running". The refusal is raised by the server itself, as Postgres raises it."""
    from livepush.postgres.connect import translate

    refusal = ("DO $$ BEGIN RAISE EXCEPTION 'too many notifications in the NOTIFY queue' USING ERRCODE = '54000', "
               "DETAIL = 'The server process with PID 4242 is among those with the oldest transactions.', "
               "HINT = 'The NOTIFY queue cannot be emptied until that process ends its current transaction.'; END $$")
    with psycopg.connect(pg_url, autocommit=True) as conn, pytest.raises(psycopg.OperationalError) as raised:
        conn.execute(refusal)
    said = str(translate(pg_url, raised.value))
    assert "cannot reach" not in said and "server is running" not in said, said
    assert "is up" in said and "too many notifications in the NOTIFY queue" in said, said
    assert "PID 4242" in said and "ends its current transaction" in said, said


async def test_starts_of_a_shared_listener_at_the_same_time_open_one_connection_and_deliver_once(
        pg_url: str) -> None:
    """Parts of a process that start their shared listener at the same time (each awaiting
    start() before the first connection is made) share one LISTEN connection: each notification
    reaches a handler once, not once per start, and no connection is left behind."""
    heard: list[str] = []
    listener = Listener(pg_url, name="lp-started-together")
    listener.add("livepush_started_together", heard.append)
    try:
        await asyncio.gather(*(listener.start() for _ in range(3)))
        with psycopg.connect(pg_url, autocommit=True) as conn:
            backends = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                    ("lp-started-together",)).fetchone()
            conn.execute("SELECT pg_notify('livepush_started_together', 'once')")
        assert backends == (1,)
        await async_wait_for(lambda: heard, 5, message="the notification")
        await asyncio.sleep(0.3)  # a second connection would hand it over again within its cycle
        assert heard == ["once"]
    finally:
        await listener.aclose()


async def test_a_listener_started_again_after_aclose_listens_and_hears(pg_url: str) -> None:
    """A listener closed and started again (an app's lifespan run twice) listens anew and hands
    on what it hears, rather than open a connection whose loop ends at once and say it listens."""
    heard: list[str] = []
    listener = Listener(pg_url, name="lp-started-again")
    listener.add("livepush_started_again", heard.append)
    await listener.start()
    await listener.aclose()
    assert not listener.listening
    try:
        await listener.start()
        assert listener.listening
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT pg_notify('livepush_started_again', 'after')")
        await async_wait_for(lambda: heard, 5, message="the notification sent after the second start")
        assert heard == ["after"]
    finally:
        await listener.aclose()

    def backends() -> int:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                ("lp-started-again",)).fetchone()[0]

    await async_wait_for(lambda: backends() == 0, 5, message="the listener's connection to close")


async def test_a_start_of_a_running_listener_cancelled_while_it_waits_for_new_channels_logs_no_error(
        pg_url: str) -> None:
    """A part that adds its channels to a listener already running waits for them to be listened
    to; a stop that cancels that wait (Ctrl-C just as a server with its job runtime starts) ends
    it quietly, not with asyncio's "exception was never retrieved" and a traceback."""
    unretrieved: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    listener = Listener(pg_url, name="lp-start-cancelled")
    listener.add("livepush_start_cancelled_a", lambda payload: None)
    try:
        await listener.start()
        listener.add("livepush_start_cancelled_b", lambda payload: None)
        waiting = asyncio.create_task(listener.start())
        await asyncio.sleep(0)  # it waits now: the running listener takes a new channel within its cycle
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        del waiting
        gc.collect()
        await asyncio.sleep(0)  # what collection found is reported through the loop's next callbacks
        assert unretrieved == []
    finally:
        loop.set_exception_handler(None)
        await listener.aclose()


async def test_a_listener_that_postgres_keeps_refusing_says_why(
        pg_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener whose login Postgres refuses after it was lost (a role or pg_hba.conf changed
    under a running server) stays away until someone acts: it says why at warning level once the
    outage outlasts a restart's, and how often it tries again, and not again within that time;
    back once the login is allowed."""
    from livepush.postgres import listener as listener_module

    monkeypatch.setattr(listener_module, "RETRY_LOG_SECONDS", 0.5)
    role = f"lp_listen_{secrets.token_hex(3)}"
    admin = psycopg.connect(pg_url, autocommit=True)
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    listener = Listener(make_conninfo(pg_url, user=role), name="lp-refused-listener")
    listener.add("livepush_refusal_test", lambda payload: None)
    try:
        await listener.start()
        admin.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(role)))
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
        caplog.set_level(logging.WARNING, logger="livepush.postgres.listener")

        def said() -> list[str]:
            return [r.getMessage() for r in caplog.records if "still cannot reconnect" in r.getMessage()]

        await async_wait_for(said, 10, message="a warning that the listener cannot reconnect")
        assert "not permitted to log in" in said()[0], said()[0]
        assert "still cannot reconnect, trying again about every 1 s" in said()[0], said()[0]
        admin.execute(sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(role)))
        await async_wait_for(lambda: listener.listening, 10, message="the listener back once the login is allowed")
    finally:
        await listener.aclose()
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
        admin.close()


async def conn_refusals(fanout: PostgresFanOut, topic: str, conn: object, aconn: object,
                        error: type[Exception]) -> dict[str, str]:
    """What each publish call says refusing `conn` (`aconn` for the async ones) with `error`."""
    calls = {
        "publish": lambda: fanout.publish(topic, {"i": 0}, conn=conn),
        "publish_many": lambda: fanout.publish_many([(topic, {"i": 0})], conn=conn),
        "apublish": lambda: fanout.apublish(topic, {"i": 0}, conn=aconn),
        "apublish_many": lambda: fanout.apublish_many([(topic, {"i": 0})], conn=aconn),
    }
    said = {}
    for name, call in calls.items():
        with pytest.raises(error) as raised:
            result = call()
            if name.startswith("a"):
                await result
        said[name] = str(raised.value)
    return said


async def test_publish_on_a_connection_the_caller_closed_says_so_not_that_postgres_is_down(
        fanout: PostgresFanOut, pg_url: str) -> None:
    """A connection closed before the call (a publish after its `with` block ended) is the caller's
    mistake: every publish call refuses it with an ArgumentValueError naming conn=, never "cannot
    reach Postgres ... check that the server is running", which sends an operator to a server that
    is up."""
    with psycopg.connect(pg_url) as conn:
        pass
    async with await psycopg.AsyncConnection.connect(pg_url) as aconn:
        pass
    for name, said in (await conn_refusals(fanout, "closed:a", conn, aconn, livepush.ArgumentValueError)).items():
        assert f"{name}(conn=)" in said and "closed" in said and "cannot reach" not in said, said
    assert not has_row(pg_url, "closed:a")


async def test_a_publish_on_a_connection_to_another_livepush_database_is_refused_not_lost(
        fanout: PostgresFanOut, pg_url: str, make_pg_url: Callable[[], str]) -> None:
    """conn= on another database that has livepush's schema too (the app's, migrated for its jobs,
    or after a SchemaError said to migrate it) raises ArgumentValueError naming both databases, and
    writes nothing there: its message log is one no server reads, so every publish returned an
    offset and no page ever heard of it."""
    other = make_pg_url()
    with psycopg.connect(other, autocommit=True) as conn:
        async with await psycopg.AsyncConnection.connect(other, autocommit=True) as aconn:
            refusals = await conn_refusals(fanout, "elsewhere:a", conn, aconn, livepush.ArgumentValueError)
    for name, said in refusals.items():
        assert f"{name}(conn=)" in said and services.dbname_of(other) in said, said
        assert services.dbname_of(pg_url) in said, said
    assert not has_row(other, "elsewhere:a") and not has_row(pg_url, "elsewhere:a")


async def test_a_publish_on_a_connection_to_its_database_works_across_a_postgres_restart(
        fanout: PostgresFanOut, pg_url: str) -> None:
    """conn= on the fan-out's own database publishes before and after Postgres restarts (or fails
    over), when what tells its database from another (the server's start time) has changed."""
    with psycopg.connect(pg_url) as conn:
        before = fanout.publish("restarted:a", {"i": 0}, conn=conn)
    services.pg_restart()
    with psycopg.connect(pg_url) as conn:
        after = fanout.publish("restarted:a", {"i": 1}, conn=conn)
    async with await psycopg.AsyncConnection.connect(pg_url) as aconn:
        latest = await fanout.apublish_many([("restarted:a", {"i": 2})], conn=aconn)
    assert [before, after, *latest] == [fanout.latest_offset("restarted:a").rsplit("-", 1)[0] + f"-{n}"
                                        for n in (1, 2, 3)]


async def test_an_empty_batch_checks_its_conn_as_a_full_one_does(fanout: PostgresFanOut, pg_url: str) -> None:
    """publish_many(conn=) with no items refuses a conn= it could never publish in (not a psycopg
    connection, one of the other kind, or one closed), as every other fan-out and every non-empty
    batch does: the mistake shows on the first call, not when a batch first has items."""
    with psycopg.connect(pg_url) as conn:
        pass
    async with await psycopg.AsyncConnection.connect(pg_url) as aconn:
        with pytest.raises(livepush.ArgumentTypeError, match=r"publish_many\(conn=\) takes a psycopg.Connection"):
            fanout.publish_many([], conn=object())
        with pytest.raises(livepush.ArgumentTypeError, match="apublish_many"):
            fanout.publish_many([], conn=aconn)
        with pytest.raises(livepush.ArgumentTypeError, match=r"use publish_many\(\)"):
            await fanout.apublish_many([], conn=conn)
    with pytest.raises(livepush.ArgumentValueError, match=r"publish_many\(conn=\) got a closed connection"):
        fanout.publish_many([], conn=conn)
    with pytest.raises(livepush.ArgumentValueError, match=r"apublish_many\(conn=\) got a closed connection"):
        await fanout.apublish_many([], conn=aconn)


async def test_a_conn_that_is_no_psycopg_connection_is_named_with_where_to_find_the_right_one(
        fanout: PostgresFanOut) -> None:
    """A conn= that is not a psycopg 3 connection at all (Django's `django.db.connection`, a wrapper
    around it, or a psycopg2 connection) raises ArgumentTypeError naming the type given and where
    the psycopg connection is, never the advice meant for a connection of the other kind (use the
    async call), which sends the caller the wrong way."""
    class DatabaseWrapper:  # the type of django.db.connection, which wraps the psycopg connection
        connection = None

    refusals = await conn_refusals(fanout, "wrapped:a", DatabaseWrapper(), DatabaseWrapper(), livepush.ArgumentTypeError)
    for name, said in refusals.items():
        assert f"{name}(conn=)" in said and "DatabaseWrapper" in said, said
        assert "django.db.connection.connection" in said and "psycopg 3" in said, said
        assert "AsyncConnection;" not in said and "sync Connection" not in said, said


def test_publish_on_a_connection_to_a_database_without_livepush_says_what_to_run(
        fanout: PostgresFanOut, pg_url: str, pg_admin_url: str) -> None:
    """conn= on a database that was never migrated, or as a role never granted livepush's
    privileges, is a set-up mistake, not the caller's transaction's own: it raises SchemaError
    saying to run `livepush migrate`, or ConfigError saying to grant the role, as a publish
    without conn= does, never psycopg's bare "function livepush_publish(unknown, unknown) does
    not exist"."""
    bare = f"t_{secrets.token_hex(8)}"
    role = f"r_{secrets.token_hex(8)}"
    url = services.create_database(pg_admin_url, bare)
    try:
        with psycopg.connect(url) as conn:
            with pytest.raises(livepush.SchemaError, match="livepush migrate"):
                fanout.publish("setup:a", {"i": 0}, conn=conn)
            conn.rollback()
            with pytest.raises(livepush.SchemaError, match="livepush migrate"):
                fanout.publish_many([("setup:a", {"i": 0})], conn=conn)
        with psycopg.connect(pg_admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        info = conninfo_to_dict(pg_url)
        with psycopg.connect(make_conninfo(pg_url, user=role, password=info.get("password"))) as conn:
            with pytest.raises(livepush.ConfigError, match="--runtime-role"):
                fanout.publish("setup:a", {"i": 0}, conn=conn)
    finally:
        services.drop_database(pg_admin_url, bare)
        with psycopg.connect(pg_admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
    assert not has_row(pg_url, "setup:a")


def test_a_process_holding_over_1024_descriptors_gets_pooled_connections_without_a_check_and_loses_no_dead_one(
        pg_url: str, pg_admin_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process with more than 1024 descriptors open (a server with a thousand clients, a busy web
    app) takes a pooled connection with no round trip, as any process does, and still replaces one
    the server closed before handing it out: select() refuses a descriptor past 1024, which was
    taken as input waiting, so every publish and history read checked its connection first."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip(f"the descriptor limit ({hard}) leaves no room past 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300) if soft != resource.RLIM_INFINITY else soft, hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    checked: list[object] = []
    check = pools.Pool.check_connection
    monkeypatch.setattr(pools.Pool, "check_connection", staticmethod(lambda conn: checked.append(conn) or check(conn)))
    fanout = PostgresFanOut(pg_url)
    try:
        for i in range(10):
            fanout.publish("descriptors:a", {"i": i})
        assert checked == [], f"{len(checked)} of 10 publishes checked their connection first"
        with fanout._pools.sync().connection() as conn:
            assert conn.fileno() > 1024, "the pooled connection is not past 1024"
        assert services.pg_terminate(pg_admin_url, services.dbname_of(pg_url)) >= 1
        fanout.publish("descriptors:a", {"i": 10})  # the dead connection is found and replaced
        assert len(checked) >= 1
    finally:
        fanout.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_apublish_on_a_new_event_loop_per_call_leaves_no_connection_open(fanout: PostgresFanOut, pg_url: str) -> None:
    """Sync code that runs each apublish() with asyncio.run() (a new loop each time) leaves no
    connection open on the server once its loop has ended: the loop's shutdown closes the loop's
    pool and its connections, not only the pool, whose idle connections were otherwise held open
    until a garbage collection happened to reach them (the collector is off here to show it)."""
    others = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
              "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
    gc.disable()
    try:
        for i in range(5):
            asyncio.run(fanout.apublish("loops:a", {"i": i}))
        with psycopg.connect(pg_url, autocommit=True) as conn:
            wait_for(lambda: conn.execute(others).fetchone() == (0,), 10,
                     message="the ended loops' connections to be closed")
    finally:
        gc.enable()


def test_publishers_waiting_on_a_database_that_never_answers_fail_together_not_in_turn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads (or tasks) that publish at once while the database does not answer (a host that drops
    packets, a failover in progress) share the one connection attempt under way: each fails when
    it does, rather than each waiting in line for an attempt of its own, which made the Nth
    caller wait N connect timeouts, far past the 30 s a publish waits at most."""
    monkeypatch.setattr(pg_connect, "CONNECT_TIMEOUT", 2)  # libpq's shortest
    callers = 6
    with socket.create_server(("127.0.0.1", 0), backlog=64) as silent:  # accepts, never answers
        fanout = PostgresFanOut(f"postgresql://app@127.0.0.1:{silent.getsockname()[1]}/app")

        def publish(i: int) -> float:
            started = time.monotonic()
            with pytest.raises(livepush.DependencyError, match="cannot reach Postgres"):
                fanout.publish("silent:a", {"i": i})
            return time.monotonic() - started

        async def apublish(i: int) -> float:
            started = time.monotonic()
            with pytest.raises(livepush.DependencyError, match="cannot reach Postgres"):
                await fanout.apublish("silent:a", {"i": i})
            return time.monotonic() - started

        async def apublish_all() -> list[float]:
            return list(await asyncio.gather(*(apublish(i) for i in range(callers))))

        with ThreadPoolExecutor(callers) as threads:
            waited = list(threads.map(publish, range(callers)))
        awaited = asyncio.run(apublish_all())
    # In turn, the last would wait 6 x 2 s; together, each about one attempt (a generous bound).
    assert max(waited) < 7, waited
    assert max(awaited) < 7, awaited


async def test_a_payload_too_large_with_conn_leaves_the_callers_transaction_usable(
        fanout: PostgresFanOut, pg_url: str) -> None:
    """Data over 1 MiB is refused in Python, before anything is sent: with conn=, publish(), its
    async and batch twins raise PayloadTooLarge and the caller's transaction goes on, its own
    statements and its later publishes committing with it (an enqueue's refusal by Postgres for
    size leaves it usable too: docs/jobs.md)."""
    huge = {"s": "x" * (2 * 1024 * 1024)}
    with psycopg.connect(pg_url) as conn:
        with pytest.raises(livepush.PayloadTooLarge):
            fanout.publish("big:conn", huge, conn=conn)
        with pytest.raises(livepush.PayloadTooLarge):
            fanout.publish_many([("big:conn", {"n": 0}), ("big:conn", huge)], conn=conn)
        kept = fanout.publish("big:conn", {"n": 1}, conn=conn)
        conn.commit()
    async with await psycopg.AsyncConnection.connect(pg_url) as aconn:
        with pytest.raises(livepush.PayloadTooLarge):
            await fanout.apublish("big:conn", huge, conn=aconn)
        with pytest.raises(livepush.PayloadTooLarge):
            await fanout.apublish_many([("big:conn", huge)], conn=aconn)
        akept = await fanout.apublish("big:conn", {"n": 2}, conn=aconn)
        await aconn.commit()
    assert fanout.latest_offset("big:conn") == akept
    assert offsets_of(await read_history(fanout, "big:conn", f"{kept.split('-')[0]}-0")) == [kept, akept]


async def test_a_login_postgres_refuses_raises_login_refused_from_publish_and_listen(pg_admin_url: str,
                                                                                   pg_url: str) -> None:
    """A wrong password raised DependencyError ("cannot reach Postgres ... check that the server is
    running") from publish() and ListenError from listen(), of a server that is up. Both raise
    LoginRefused (a ConfigError, and still a DependencyError), listen()'s a ListenError too, naming
    the setting and what the server said, never the password."""
    with services.pg_password_role(pg_admin_url, "s3cret-pw") as role_url:
        url = make_conninfo(services.db_url(role_url, services.dbname_of(pg_url)), password="wrong-pw")
        fanout = PostgresFanOut(url)
        try:
            with pytest.raises(livepush.LoginRefused, match="password authentication failed") as caught:
                fanout.publish("refused:a", {"i": 0})
            assert isinstance(caught.value, livepush.DependencyError), caught.value
            assert "LIVEPUSH_DATABASE_URL" in str(caught.value) and "wrong-pw" not in str(caught.value)
            with pytest.raises(livepush.ListenLoginRefused, match="password authentication failed") as listening:
                await asyncio.wait_for(fanout.listen(), 20)
            assert isinstance(listening.value, livepush.ListenError), listening.value
            assert "wrong-pw" not in str(listening.value)
        finally:
            await fanout.aclose()


@pytest.mark.parametrize("how", ["an error", "a cancel"])
async def test_a_failed_transaction_handed_back_to_a_livepush_pool_logs_no_warning_of_psycopg(
        pg_url: str, caplog: pytest.LogCaptureFixture, how: str) -> None:
    """A connection of livepush's pools handed back in a failed transaction (its caller got the
    error, or a stop cancelled its statement mid-way, as a runtime's shutdown does) is rolled back
    by psycopg_pool without its WARNING "rolling back returned connection", which said nothing the
    caller was not told; the connection serves the next caller. Another pool's still says it."""
    import psycopg_pool

    caplog.set_level(logging.WARNING, logger="psycopg.pool")
    for kind, name in ((pools.AsyncPool, "livepush-test"), (psycopg_pool.AsyncConnectionPool, "theirs")):
        pool = kind(pg_url, min_size=1, max_size=1, open=False, name=name)
        await pool.open(wait=True)
        try:
            # Handed back as the caller left it: `pool.connection()` rolls back itself, unless
            # that rollback is cut short too (a stop's cancel that lands as it runs).
            conn = await pool.getconn()
            with pytest.raises((psycopg.errors.DivisionByZero, TimeoutError)):
                if how == "an error":
                    await conn.execute("SELECT 1/0")
                else:
                    await asyncio.wait_for(conn.execute("SELECT pg_sleep(30)"), 0.2)
            await pool.putconn(conn)
            async with pool.connection() as conn:
                assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
        finally:
            await pool.close()
    said = [r.getMessage() for r in caplog.records if r.name == "psycopg.pool" and r.levelno >= logging.WARNING]
    assert len(said) == 1 and "theirs" not in said[0] and said[0].startswith("rolling back returned connection"), said
