"""Postgres fan-out through a real server: transactions, listener loss, concurrent publishers.

Every notification on `livepush` is a doorbell ("EPOCH-SEQ TOPIC"); the server reads what it
delivers from the message log, so these tests see only what the log holds."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading

import psycopg
import pytest
from websockets.exceptions import ConnectionClosed

from tests.conftest import ROOT
from tests.faults.test_history_reads import backends_waiting_for_a_lock, terminate
from tests.server.conftest import Served, make_settings, start_served
from tests.server.test_server import http_get
from tests.server.test_slow_clients import offsets_read, paused_past_its_share, server_side
from tests.support import services
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient

# The application_name of the process's one LISTEN connection (livepush/postgres/listener.py).
LISTENER_APP_NAME = "livepush-listener"


@pytest.fixture
async def pg_served(pg_url: str, secret: str):
    served = await start_served(make_settings("postgres", secret, pg_url, None))
    try:
        yield served
    finally:
        await served.stop()


async def test_publish_in_a_transaction_is_delivered_only_if_it_commits(pg_served: Served, pg_url: str) -> None:
    """conn= ties the message to the caller's transaction: rollback delivers nothing, commit delivers."""
    client = await WSClient.open(pg_served.url)
    await client.subscribe(pg_served.sign("orders"))
    with psycopg.connect(pg_url) as conn:
        pg_served.fanout.publish("orders", {"n": "rolled back"}, conn=conn)
        conn.rollback()
    with pytest.raises(asyncio.TimeoutError):
        await client.recv(timeout=0.3)
    with psycopg.connect(pg_url) as conn:
        offset = pg_served.fanout.publish("orders", {"n": "committed"}, conn=conn)
        conn.commit()
    got = await client.messages(1)
    assert got[0]["data"] == {"n": "committed"} and got[0]["offset"] == offset
    assert offset.endswith("-1"), "the rolled-back publish gave its number back"
    await client.close()


async def test_publish_many_in_a_transaction_is_delivered_whole_only_if_it_commits(pg_served: Served,
                                                                                    pg_url: str) -> None:
    """publish_many(conn=) puts a whole batch, past one statement's size, in the caller's transaction: a
    rollback delivers none of it and gives its offsets back; a commit delivers all of it, in order."""
    client = await WSClient.open(pg_served.url)
    await client.subscribe(pg_served.sign("batch"))
    batch = [("batch", {"i": i}) for i in range(1500)] + [("batch:other", {"i": -1})]
    with psycopg.connect(pg_url) as conn:
        pg_served.fanout.publish_many(batch, conn=conn)
        conn.rollback()
    with pytest.raises(asyncio.TimeoutError):
        await client.recv(timeout=0.3)
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        offsets = await pg_served.fanout.apublish_many(batch, conn=conn)
        await conn.commit()
    got = await client.messages(1500, timeout=20)
    assert [m["data"]["i"] for m in got] == list(range(1500))
    assert [m["offset"] for m in got] == offsets[:1500]
    assert offsets[0].endswith("-1"), "the rolled-back batch gave its numbers back"
    await client.close()


def test_a_long_or_heavy_batch_is_split_sorted_by_topic_keeping_each_topics_order() -> None:
    """A batch past 1,000 messages or about 8 MiB of data goes in several statements, its items
    sorted by topic (stable: a topic's messages keep their batch order); a short one stays whole."""
    from livepush.fanout.postgres import MANY_CHUNK, MANY_CHUNK_BYTES, _many_statements

    short = [("b", '{"i":0}'), ("a", '{"i":1}')]
    order, [doc] = _many_statements(short)
    assert order is None and json.loads(doc) == [["b", '{"i":0}'], ["a", '{"i":1}']]
    heavy = [(f"t{i % 3}", '"' + "x" * (MANY_CHUNK_BYTES // 4) + '"') for i in range(12)]
    order, statements = _many_statements(heavy)
    assert order == [0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11] and len(statements) >= 3
    assert all(len(doc) < MANY_CHUNK_BYTES + len(heavy[0][1]) + 100 for doc in statements)
    long = [(f"t{i % 2}", "{}") for i in range(MANY_CHUNK + 1)]
    order, statements = _many_statements(long)
    assert order is not None and len(statements) == 2


async def test_publish_many_on_an_autocommit_connection_is_still_all_or_nothing(pg_served: Served,
                                                                                pg_url: str) -> None:
    """conn= in autocommit: a batch of several statements is one transaction all the same. When its
    last statement fails (a lock it cannot get in time), nothing of the earlier ones stays."""
    holder = psycopg.connect(pg_url)
    try:
        pg_served.fanout.publish("ac:z", {"held": True}, conn=holder)  # holds ac:z's row until rollback
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '200ms'")
            before = pg_served.fanout.latest_offset("ac:a")
            batch = [("ac:a", {"i": i}) for i in range(1500)] + [("ac:z", {"i": -1})]
            with pytest.raises(psycopg.errors.LockNotAvailable):
                pg_served.fanout.publish_many(batch, conn=conn)
            assert pg_served.fanout.latest_offset("ac:a") == before, "the first statement's messages stayed"
    finally:
        holder.rollback()
        holder.close()


async def test_concurrent_batches_sharing_topics_in_opposite_orders_both_commit(pg_served: Served,
                                                                                pg_url: str) -> None:
    """Two long batches (several statements each) over the same topics in opposite orders, in concurrent
    transactions, both succeed: every statement locks topic rows in one order, so neither waits for a
    row the other will only lock later. Each topic's offsets stay gap-free."""
    topics = ["cross:a", "cross:b"]
    # Each topic a block of a statement's size: taken in item order, each batch's first statement
    # would lock the topic the other's second statement needs.
    forward = [(topic, {"i": i}) for topic in topics for i in range(1000)]
    backward = list(reversed(forward))
    barrier = threading.Barrier(2)
    found: dict[str, list[str]] = {}

    def publish(name: str, batch: list[tuple[str, dict[str, int]]]) -> None:
        with psycopg.connect(pg_url) as conn:
            barrier.wait(timeout=10)
            found[name] = pg_served.fanout.publish_many(batch, conn=conn)
            conn.commit()

    threads = [threading.Thread(target=publish, args=("forward", forward)),
               threading.Thread(target=publish, args=("backward", backward))]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join, 60)
    assert set(found) == {"forward", "backward"}, "a batch failed (a deadlock is reported as an error)"
    for topic in topics:
        seqs = sorted(int(o.split("-")[1]) for name in found for o, (t, _) in
                      zip(found[name], forward if name == "forward" else backward, strict=True) if t == topic)
        assert seqs == list(range(1, 2001)), topic


async def test_transactions_publishing_two_topics_in_opposite_orders_fail_one_whole_and_deliver_the_other(
        pg_served: Served, pg_url: str) -> None:
    """Each publish(conn=) holds its topic's row until the transaction ends: two transactions that
    publish on the same two topics in opposite orders wait for each other, and Postgres breaks the
    cycle by failing one with psycopg's DeadlockDetected (docs/guarantees.md). Nothing of the
    failed one is delivered; the other commits whole, and each topic's offsets stay gap-free."""
    client = await WSClient.open(pg_served.url)
    for topic in ("cycle:a", "cycle:b"):
        await client.subscribe(pg_served.sign(topic))
    barrier = threading.Barrier(2)
    outcome: dict[str, str] = {}

    def publish(name: str, order: tuple[str, str]) -> None:
        with psycopg.connect(pg_url) as conn:
            try:
                pg_served.fanout.publish(order[0], {"by": name}, conn=conn)
                barrier.wait(timeout=10)  # each holds its first topic before it asks for the other
                pg_served.fanout.publish(order[1], {"by": name}, conn=conn)
                conn.commit()
                outcome[name] = "committed"
            except psycopg.errors.DeadlockDetected:
                conn.rollback()
                outcome[name] = "deadlock"

    threads = [threading.Thread(target=publish, args=("ab", ("cycle:a", "cycle:b"))),
               threading.Thread(target=publish, args=("ba", ("cycle:b", "cycle:a")))]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join, 30)
    assert sorted(outcome.values()) == ["committed", "deadlock"], outcome
    winner = next(name for name, how in outcome.items() if how == "committed")
    got = await client.messages(2, timeout=10)
    assert sorted((m["topic"], m["data"]["by"], m["offset"].split("-")[1]) for m in got) == [
        ("cycle:a", winner, "1"), ("cycle:b", winner, "1")]
    with pytest.raises(asyncio.TimeoutError):
        await client.recv(timeout=0.3)
    await client.close()


async def test_a_two_phase_transaction_that_published_fails_its_prepare_and_delivers_nothing(
        pg_served: Served, pg_url: str) -> None:
    """A publish(conn=) rings the servers with NOTIFY in the caller's transaction, and Postgres
    cannot PREPARE a transaction that did (two-phase commit): the prepare fails with psycopg's
    FeatureNotSupported, the whole transaction rolls back, and nothing is delivered
    (docs/reference.md section 4 says to publish after the second phase instead)."""
    client = await WSClient.open(pg_served.url)
    await client.subscribe(pg_served.sign("twophase"))
    conn = psycopg.connect(pg_url)
    try:
        conn.tpc_begin(conn.xid(1, "livepush-test", "twophase"))
        pg_served.fanout.publish("twophase", {"n": 1}, conn=conn)
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="NOTIFY"):
            conn.tpc_prepare()
    finally:
        conn.close()  # not `with`: its exit commits, which a two-phase transaction refuses
    with pytest.raises(asyncio.TimeoutError):
        await client.recv(timeout=0.3)
    assert (await pg_served.fanout.alatest_offset("twophase")).startswith("0-"), "nothing was published"
    await client.close()


async def test_a_watched_topic_forgotten_all_the_same_gets_its_subscribers_reset_at_its_next_message(
        pg_served: Served, pg_url: str) -> None:
    """The server keeps the topics its subscribers watch from being forgotten as idle (every
    quarter of the idle time). One forgotten all the same (its keeps failed for most of a day:
    simulated by moving the topic's times back past them) starts a new chain at its next message,
    and a client subscribed all along gets `reset` for it (refetch), then the live messages: the
    server cannot tell, from a chain it no longer finds, that nothing was published and forgotten
    after the last message it sent (docs/guarantees.md)."""
    client = await WSClient.open(pg_served.url)
    await client.subscribe(pg_served.sign("quiet"))
    await pg_served.publish("quiet", {"n": 1})
    assert [m["data"] for m in await client.messages(1)] == [{"n": 1}]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE livepush_topics SET touched_at = touched_at - interval '2 days' WHERE topic = 'quiet'")
        conn.execute("UPDATE livepush_messages SET created_at = created_at - interval '2 days' WHERE topic = 'quiet'")

    async def forgotten() -> bool:
        await pg_served.fanout.prune()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            return conn.execute("SELECT FROM livepush_topics WHERE topic = 'quiet'").fetchone() is None

    await async_wait_for(forgotten, 10, message="the idle topic to be forgotten")
    await pg_served.publish("quiet", {"n": 2})
    assert [f["op"] for f in await client.messages(1, timeout=10)] == ["reset"]
    # The reset stands for everything up to the offset the server read before sending it (the
    # client refetches): what is published after it is delivered.
    later = await pg_served.publish("quiet", {"n": 3})
    (message,) = await client.messages(1, timeout=10)
    assert (message["op"], message["offset"], message["data"]) == ("message", later, {"n": 3})
    assert later.endswith("-2"), "the topic's next message started a new chain"
    await client.close()


async def test_a_gap_in_the_log_becomes_reset_never_a_silent_hole(pg_served: Served, pg_url: str) -> None:
    """Doorbells for rows the log no longer holds (a row deleted under the cursor) give the
    subscriber `reset`, never the messages around the hole; the live stream then goes on."""
    client = await WSClient.open(pg_served.url)
    await client.subscribe(pg_served.sign("holes"))
    await pg_served.publish("holes", {"n": 1})
    assert (await client.messages(1))[0]["data"] == {"n": 1}
    with psycopg.connect(pg_url) as conn:
        lost = pg_served.fanout.publish("holes", {"n": 2}, conn=conn)
        pg_served.fanout.publish("holes", {"n": 3}, conn=conn)
        conn.execute("DELETE FROM livepush_messages WHERE topic = 'holes' AND seq = %s", (int(lost.split("-")[1]),))
        conn.commit()  # both doorbells ring now; the log holds 3 but not 2
    assert [f["op"] for f in await client.messages(1)] == ["reset"]
    after = await pg_served.publish("holes", {"n": 4})
    (message,) = await client.messages(1)
    assert (message["op"], message["offset"], message["data"]) == ("message", after, {"n": 4})
    await client.close()



async def test_a_replay_across_a_hole_inside_its_page_gets_reset_before_any_message(pg_served: Served,
                                                                                   pg_url: str) -> None:
    """A `since` whose next messages are all there but one further on is gone (a row deleted
    inside the range, as a prune by publish time would leave after the clock stepped back) gets
    `reset` before any message: the page is checked whole, not only where it starts. A `since`
    past the hole replays what follows it."""
    offsets = [await pg_served.publish("inner:hole", {"n": n}) for n in range(5)]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DELETE FROM livepush_messages WHERE topic = 'inner:hole' AND seq = %s",
                     (int(offsets[3].split("-")[1]),))
    client = await WSClient.open(pg_served.url)
    assert (await client.subscribe(pg_served.sign("inner:hole"), since=offsets[0]))["op"] == "subscribed"
    assert (await client.recv())["op"] == "reset", "a message before the hole was sent as if none were missing"
    past = await WSClient.open(pg_served.url)
    await past.subscribe(pg_served.sign("inner:hole"), since=offsets[3])
    assert [m["offset"] for m in await past.messages(1)] == [offsets[4]]
    await client.close()
    await past.close()

async def test_other_fanouts_refuse_conn(secret: str) -> None:
    """conn= is a Postgres-only feature: the local fan-out refuses it with ValueError."""
    from livepush.fanout.local import LocalFanOut

    with pytest.raises(ValueError, match="Postgres"):
        LocalFanOut().publish("a", {}, conn=object())


async def test_listener_loss_turns_healthz_503_then_recovers_with_nothing_missed(pg_served: Served, pg_url: str, pg_admin_url: str) -> None:
    """Killing the listener's backend: /healthz says 503 until it is back; messages published
    meanwhile and afterwards reach a client that stayed connected, in order, once."""
    client = await WSClient.open(pg_served.url)
    await client.subscribe(pg_served.sign("ticker"))
    await pg_served.publish("ticker", {"i": 0})
    assert (await client.messages(1))[0]["data"] == {"i": 0}

    dbname = services.dbname_of(pg_url)
    # Opened before the outage: the database refuses new connections while it lasts.
    publisher = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
    try:
        with services.pg_refusing_connections(pg_admin_url, dbname):
            killed = await asyncio.to_thread(services.pg_terminate, pg_admin_url, dbname, LISTENER_APP_NAME)
            assert killed == 1
            await async_wait_for(lambda: not pg_served.fanout.listening, 5, message="the listener to notice its loss")
            assert (await http_get(pg_served.server.port, "/healthz"))[0] == 503
            # Published while nobody listens: only history can bring these.
            for i in range(1, 6):
                await pg_served.fanout.apublish("ticker", {"i": i}, conn=publisher)
            assert (await http_get(pg_served.server.port, "/healthz"))[0] == 503, "503 for as long as the listener is away"
    finally:
        await publisher.close()
    await async_wait_for(lambda: pg_served.fanout.listening, 15, message="the listener to come back")
    for i in range(6, 11):
        await pg_served.publish("ticker", {"i": i})
    got = await client.messages(10, timeout=10)
    assert [m["data"]["i"] for m in got] == list(range(1, 11))
    with pytest.raises(asyncio.TimeoutError):
        await client.recv(timeout=0.3)
    status, _ = await http_get(pg_served.server.port, "/healthz")
    assert status == 200
    await client.close()


async def test_concurrent_publishers_are_ordered_by_commit_across_a_listener_reconnect(
    pg_served: Served, pg_url: str, pg_admin_url: str
) -> None:
    """A later transaction cannot take an offset ahead of an uncommitted earlier one: the second
    publisher waits for the first's commit, so the cursor never skips a row that commits late."""
    client = await WSClient.open(pg_served.url)
    await client.subscribe(pg_served.sign("race"))
    first = psycopg.connect(pg_url)
    offset_a = pg_served.fanout.publish("race", {"who": "a"}, conn=first)  # holds the topic's row lock
    second_done = threading.Event()
    result: dict[str, str] = {}

    def second_publisher() -> None:
        with psycopg.connect(pg_url) as conn:
            result["b"] = pg_served.fanout.publish("race", {"who": "b"}, conn=conn)
            conn.commit()
        second_done.set()

    thread = threading.Thread(target=second_publisher)
    thread.start()
    first_pid = first.info.backend_pid
    # The second publisher gets as far as it can: blocked on the row lock the first one holds.
    await async_wait_for(lambda: asyncio.to_thread(lock_waiters, pg_url, first_pid), 10,
                         message="the second publisher to wait for the first's row lock")
    assert not second_done.is_set(), "the second publisher must wait for the first's commit"
    await asyncio.to_thread(services.pg_terminate, pg_admin_url, services.dbname_of(pg_url), LISTENER_APP_NAME)
    first.commit()
    first.close()
    await asyncio.to_thread(thread.join, 10)
    epoch_a, seq_a = offset_a.split("-")
    assert result["b"] == f"{epoch_a}-{int(seq_a) + 1}"
    got = await client.messages(2, timeout=10)
    assert [(m["data"]["who"], m["offset"]) for m in got] == [("a", offset_a), ("b", result["b"])]
    await client.close()


def lock_waiters(url: str, holder_pid: int) -> int:
    """How many backends wait for a lock that backend `holder_pid` holds."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))",
                           (holder_pid,)).fetchone()
    return int(row[0]) if row else 0


async def test_publish_only_process_holds_no_listen_backend(pg_url: str, pg_admin_url: str) -> None:
    """publish() from a process that never called listen() opens no LISTEN connection."""
    from livepush.fanout.postgres import PostgresFanOut

    publisher = PostgresFanOut(pg_url)
    await publisher.apublish("a", {"x": 1})
    publisher.publish("a", {"x": 2})
    with psycopg.connect(pg_admin_url) as admin:
        rows = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND (application_name = %s OR query ILIKE 'LISTEN%%')",
            (services.dbname_of(pg_url), LISTENER_APP_NAME),
        ).fetchone()
    assert rows[0] == 0
    await publisher.aclose()


async def test_livepush_publish_command_reaches_a_subscriber(procs, livepush_env, pg_served: Served, pg_url: str) -> None:
    """`livepush publish TOPIC JSON` from another process is delivered and prints the offset."""
    client = await WSClient.open(pg_served.url)
    await client.subscribe(pg_served.sign("cli"))
    child = procs.livepush("publish", "cli", '{"hello": "world"}', env=livepush_env(database_url=pg_url))
    assert await child.await_exit(20) == 0, child.output()
    assert child.stdout().strip().endswith("-1")
    assert (await client.messages(1))[0]["data"] == {"hello": "world"}
    bad = procs.livepush("publish", "cli", "{not json", env=livepush_env(database_url=pg_url))
    assert await bad.await_exit(20) == 2 and "Traceback" not in bad.stderr()
    await client.close()


async def test_livepush_publish_dash_publishes_the_json_on_standard_input(
        livepush_env, pg_served: Served, pg_url: str) -> None:
    """`livepush publish TOPIC -` reads the message's JSON from standard input, as UTF-8 whatever
    the locale: a document from a file or a program, or one past what a command line carries. A
    byte order mark before it, which some editors write, is skipped."""
    client = await WSClient.open(pg_served.url)
    await client.subscribe(pg_served.sign("cli"))
    data = {"text": "h\u00e9 \u2603", "long": "x" * 200_000}  # one argument carries at most 128 KiB
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "livepush", "publish", "cli", "-", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**livepush_env(database_url=pg_url), "LC_ALL": "C", "PYTHONIOENCODING": "latin-1"})
    out, err = await asyncio.wait_for(child.communicate(b"\xef\xbb\xbf" + json.dumps(data, ensure_ascii=False).encode()), 30)
    assert child.returncode == 0, err.decode()
    assert out.decode().strip().endswith("-1")
    assert (await client.messages(1))[0]["data"] == data
    await client.close()


def test_migrate_twice_at_once_is_safe(procs, livepush_env, pg_admin_url: str) -> None:
    """Two `livepush migrate` at once both succeed and apply each migration once."""
    name = "migrate_race"
    url = services.create_database(pg_admin_url, name)
    try:
        env = livepush_env(database_url=url)
        a = procs.livepush("migrate", env=env)
        b = procs.livepush("migrate", env=env)
        assert a.wait(30) == 0 and b.wait(30) == 0, a.output() + b.output()
        with psycopg.connect(url) as conn:
            versions = [r[0] for r in conn.execute("SELECT version FROM livepush_schema ORDER BY version")]
        assert versions == sorted(set(versions)) and versions
        again = procs.livepush("migrate", env=env)
        assert again.wait(30) == 0 and "nothing to do" in again.stdout()
    finally:
        services.drop_database(pg_admin_url, name)


async def test_a_postgres_crash_starts_a_new_epoch_so_old_offsets_get_reset(pg_url: str, secret: str) -> None:
    """History tables are unlogged: a crash empties them. Offsets from before the crash, a
    topic's origin included, are answered with `reset` (never replayed as if the new messages
    were the old ones), offsets keep increasing across the crash, and an origin read after the
    crash replays from the topic's first message since."""
    from livepush.fanout.postgres import PostgresFanOut
    from livepush.types import offset_key

    before = PostgresFanOut(pg_url)
    origin = await before.alatest_offset("crashy")  # a page rendered the topic before its first message
    old = [await before.apublish("crashy", {"i": i}) for i in range(3)]
    await before.aclose()
    await asyncio.to_thread(services.pg_stop, "immediate")  # a crash: unlogged tables are reset
    await asyncio.to_thread(services.pg_start)
    served = await start_served(make_settings("postgres", secret, pg_url, None))
    try:
        rendered = await served.fanout.alatest_offset("crashy")
        new = [await served.publish("crashy", {"i": i}) for i in range(3, 6)]
        assert offset_key(new[0]) > offset_key(old[-1])
        for since in (old[0], origin):
            client = await WSClient.open(served.url)
            await client.subscribe(served.sign("crashy"), since=since)
            assert (await client.recv())["op"] == "reset", since
            await client.close()
        fresh = await WSClient.open(served.url)
        await fresh.subscribe(served.sign("crashy"), since=rendered)
        assert [m["data"]["i"] for m in await fresh.messages(3)] == [3, 4, 5]
        await fresh.close()
    finally:
        await served.stop()



async def test_a_history_emptied_after_a_restore_answers_older_offsets_with_reset(pg_url: str, secret: str) -> None:
    """A database restored from a dump brings the history's rows back unless they are left out
    (docs/operations.md: dump with --no-unlogged-table-data, or empty the three tables after the
    restore). Emptied, the history answers every offset from before with `reset`, as after a
    crash, and the offsets given out from then on sort after them."""
    from livepush.fanout.postgres import PostgresFanOut
    from livepush.types import offset_key

    before = PostgresFanOut(pg_url)
    old = [await before.apublish("restored", {"i": i}) for i in range(3)]
    await before.aclose()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("TRUNCATE livepush_topics, livepush_log, livepush_messages")  # as the docs say
    served = await start_served(make_settings("postgres", secret, pg_url, None))
    try:
        new = await served.publish("restored", {"i": 3})
        assert offset_key(new) > offset_key(old[-1])
        for since in old:
            client = await WSClient.open(served.url)
            await client.subscribe(served.sign("restored"), since=since)
            assert (await client.recv())["op"] == "reset", since
            await client.close()
    finally:
        await served.stop()

async def test_a_message_committed_by_a_transaction_longer_than_the_ttl_is_delivered(pg_url: str, secret: str) -> None:
    """publish(conn=) delivers the message if and only if the transaction commits: a transaction
    that lasts longer than LIVEPUSH_HISTORY_TTL still delivers it to the subscribers connected
    when it commits, not `reset`."""
    served = await start_served(make_settings("postgres", secret, pg_url, None, history_ttl=0.5))
    try:
        client = await WSClient.open(served.url)
        await client.subscribe(served.sign("long:tx"))
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            offset = await served.fanout.apublish("long:tx", {"i": 1}, conn=conn)
            await asyncio.sleep(0.8)  # the TTL is wall-clock time: there is no event to await
            await conn.commit()
        frame = await client.recv()
        assert frame == {"op": "message", "topic": "long:tx", "offset": offset, "data": {"i": 1}}
        await client.close()
    finally:
        await served.stop()


async def test_retention_prunes_a_bounded_batch_per_run(pg_url: str) -> None:
    """Each prune() deletes at most PRUNE_BATCH expired rows, so a run is short and delivery
    never waits behind it; repeated runs clear the rest."""
    from livepush.fanout import postgres as pg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO livepush_messages (topic, seq, data, created_at) "
            "SELECT 'old', g, '{}', now() - interval '1 hour' FROM generate_series(1, %s) g",
            (pg.PRUNE_BATCH + 1234,),
        )
    fanout = pg.PostgresFanOut(pg_url, history_ttl=60)
    try:
        assert await fanout.prune() == pg.PRUNE_BATCH
        assert await fanout.prune() == 1234
        assert await fanout.prune() == 0
    finally:
        await fanout.aclose()


async def test_a_server_prunes_every_expired_row_each_cycle_not_one_batch(
        pg_url: str, secret: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server prunes the history a bounded batch at a time, but keeps going while batches come
    back full: at one batch per cycle (5,000 rows every 30 s, about 170 a second) a server
    publishing at the documented 4,000 messages a second would let the history grow without end."""
    from livepush.fanout import postgres as pg
    from livepush.server import app as server_app

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO livepush_messages (topic, seq, data, created_at) "
            "SELECT 'old', g, '{}', now() - interval '1 hour' FROM generate_series(1, %s) g",
            (4 * pg.PRUNE_BATCH + 1,),
        )
    monkeypatch.setattr(server_app, "PRUNE_EVERY_SECONDS", 1.0)
    # The first call puts the next cycle an hour away, so all that is dropped while the test runs
    # is the first cycle's: told apart by that, not by the clock, which a loaded machine stretches
    # past a cycle's length.
    dropped: list[int] = []
    real_prune = pg.PostgresFanOut.prune

    async def first_cycle_prune(self: pg.PostgresFanOut) -> int:
        monkeypatch.setattr(server_app, "PRUNE_EVERY_SECONDS", 3600.0)
        n = await real_prune(self)
        dropped.append(n)
        return n

    monkeypatch.setattr(pg.PostgresFanOut, "prune", first_cycle_prune)

    async def none_left() -> bool:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            # The server's own readiness canary publishes too: count the expired rows only.
            row = await (await conn.execute("SELECT count(*) FROM livepush_messages WHERE topic = 'old'")).fetchone()
        return row is not None and row[0] == 0

    served = await start_served(make_settings("postgres", secret, pg_url, None))
    try:
        await async_wait_for(lambda: 0 in dropped, 30, 0.05, message="the first prune cycle to end with a call that drops nothing")
        assert await none_left(), f"the first cycle dropped {dropped} and stopped with expired rows left"
    finally:
        await served.stop()


async def test_a_subscribe_again_that_cannot_read_closes_the_connection_so_the_client_resumes(
        pg_served: Served, pg_url: str) -> None:
    """A page's second subscription to a topic its connection follows subscribes the connection
    again. If that cannot read the topic just now, the connection's first subscription is gone
    too: the server closes with 1011, so the client reconnects and resumes from its offsets,
    rather than retry the second one from now while the first hears nothing."""
    client = await WSClient.open(pg_served.url)
    assert (await client.subscribe(pg_served.sign("again")))["op"] == "subscribed"
    await pg_served.publish("again", {"n": 1})
    assert (await client.messages(1))[0]["data"] == {"n": 1}
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
        await admin.execute("ALTER TABLE livepush_messages RENAME TO livepush_messages_away")
        try:
            await client.send({"op": "subscribe", "topic": pg_served.sign("again"), "since": None, "ref": "again"})
            assert await client.closed_with() == 1011
        finally:
            await admin.execute("ALTER TABLE livepush_messages_away RENAME TO livepush_messages")


async def test_a_topics_first_message_in_flight_when_the_log_epoch_is_made_comes_after_its_origin(
        pg_served: Served, pg_url: str) -> None:
    """The first read of an origin after the migration (or a crash) makes the log's epoch. A topic
    whose first message is being committed in that instant still has offsets above the origin the
    server anchored it at: the server delivers them, never takes them for messages it already sent."""
    from livepush.types import offset_key

    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
        await admin.execute("DELETE FROM livepush_log")  # as after `livepush migrate`: no origin read yet
    client = await WSClient.open(pg_served.url)
    async with await psycopg.AsyncConnection.connect(pg_url) as publisher:
        first = await pg_served.fanout.apublish("fresh:topic", {"i": 1}, conn=publisher)
        # The server anchors the topic (and makes the log's epoch) while that message is uncommitted.
        subscribed = await client.subscribe(pg_served.sign("fresh:topic"))
        await publisher.commit()
    assert offset_key(first) > offset_key(subscribed["offset"])
    second = await pg_served.publish("fresh:topic", {"i": 2})
    assert [(f["offset"], f["data"]) for f in await client.messages(2)] == [(first, {"i": 1}), (second, {"i": 2})]
    await client.close()


async def test_publish_in_a_transaction_works_whatever_rows_the_callers_connection_makes(pg_served: Served,
                                                                                          pg_url: str) -> None:
    """conn= takes the caller's connection as it is: one made with another row factory (dicts, as
    many apps configure theirs) or cursor factory publishes, and returns the offsets, as any other does."""
    from psycopg.rows import dict_row

    with psycopg.connect(pg_url, row_factory=dict_row) as conn:
        one = pg_served.fanout.publish("rows:sync", {"i": 1}, conn=conn)
        many = pg_served.fanout.publish_many([("rows:sync", {"i": 2}), ("rows:other", {"i": 3})], conn=conn)
        conn.commit()
    async with await psycopg.AsyncConnection.connect(pg_url, row_factory=dict_row) as aconn:
        aone = await pg_served.fanout.apublish("rows:async", {"i": 1}, conn=aconn)
        amany = await pg_served.fanout.apublish_many([("rows:async", {"i": 2})], conn=aconn)
        await aconn.commit()
    assert [one, *many] == [pg_served.fanout.latest_offset("rows:sync")[:-1] + "1",
                            pg_served.fanout.latest_offset("rows:sync"), pg_served.fanout.latest_offset("rows:other")]
    assert [aone, *amany] == [pg_served.fanout.latest_offset("rows:async")[:-1] + "1",
                              pg_served.fanout.latest_offset("rows:async")]
    with psycopg.connect(pg_url, cursor_factory=psycopg.RawCursor) as raw:  # $1 placeholders
        assert pg_served.fanout.publish("rows:raw", {"i": 1}, conn=raw).endswith("-1")


async def test_a_message_published_late_in_a_long_transaction_stays_recoverable_for_the_ttl(pg_url: str,
                                                                                            secret: str) -> None:
    """A message stays recoverable for LIVEPUSH_HISTORY_TTL seconds after it was published, also
    when the transaction that publishes it began longer ago than that: the prune that follows its
    commit keeps it, and a client resuming from the offset before it gets it, not `reset`."""
    served = await start_served(make_settings("postgres", secret, pg_url, None, history_ttl=2.0))
    try:
        before = await served.publish("late:tx", {"i": 0})
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            await conn.execute("SELECT 1")  # the transaction begins
            await asyncio.sleep(2.5)  # the TTL is wall-clock time: there is no event to await
            offset = await served.fanout.apublish("late:tx", {"i": 1}, conn=conn)
            await conn.commit()
        await served.fanout.prune()  # what every server does every 30 s
        client = await WSClient.open(served.url)
        await client.subscribe(served.sign("late:tx"), since=before)
        assert await client.recv() == {"op": "message", "topic": "late:tx", "offset": offset, "data": {"i": 1}}
        await client.close()
    finally:
        await served.stop()


async def waiting_inside_a_replay(served: Served, topic: str) -> tuple[WSClient, list[str]]:
    """A client that subscribes to `topic` with `since` before 299 messages of 8 KB (three pages
    of history), reads `subscribed`, then nothing more: returns once the server waits for it
    inside the replay's first page, with the offsets of the messages it is to be replayed."""
    first = await served.publish(topic, {"n": 0})
    blob = "x" * 8000
    sent = [await served.publish(topic, {"n": n, "blob": blob}) for n in range(1, 300)]  # a page holds a MiB
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the first page cannot fit in buffers
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", served.server.port))
    client = await WSClient.open(served.url, sock=sock)
    await client.send({"op": "subscribe", "topic": served.sign(topic), "since": first, "ref": "r"})
    assert (await client.recv())["op"] == "subscribed"
    await async_wait_for(lambda: any(c.paused for c in served.server.clients), 10,
                         message="the server to wait for the client inside the replay's first page")
    return client, sent


async def test_a_replay_that_cannot_read_its_next_page_closes_the_connection_never_refuses_after_subscribed(
        pg_served: Served, pg_url: str) -> None:
    """A subscribe's first answer is final: once `subscribed` went out, a replay whose next page
    cannot be read (the schema is gone: no outage to wait out) closes the connection with 1011
    (the client reconnects and resumes from the last offset it got), never `refused`, which a
    client takes for no answer at all and so keeps a subscription the server dropped."""
    client, _ = await waiting_inside_a_replay(pg_served, "replayed")
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
        await admin.execute("ALTER TABLE livepush_messages RENAME TO livepush_messages_away")
        try:
            frames, code = [], None
            try:
                async with asyncio.timeout(10):
                    while not frames or frames[-1]["op"] == "message":
                        frames.append(json.loads(await client.ws.recv()))
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
            assert [f["op"] for f in frames if f["op"] != "message"] == []
            assert 0 < len(frames) < 299, "the replay stopped at the page it could not read"
            assert code == 1011
        finally:
            await admin.execute("ALTER TABLE livepush_messages_away RENAME TO livepush_messages")


async def read_while_log_reads_are_killed(pg_url: str, pg_admin_url: str, client: WSClient, count: int,
                                         logged: str, caplog: pytest.LogCaptureFixture) -> list[str]:
    """The offsets of the next `count` messages `client` reads (its reads resumed, if paused),
    while the message log is locked and every read waiting behind the lock is killed (as in a
    restart or a failover; a live read, if one waits, is retried too), until `logged` (the
    server's read failed) is in the log; then the lock goes."""
    locker = await psycopg.AsyncConnection.connect(pg_url)
    try:
        await locker.execute("LOCK TABLE livepush_messages IN ACCESS EXCLUSIVE MODE")
        client.ws.transport.resume_reading()
        read = asyncio.ensure_future(offsets_read(client, count))
        dbname, locker_pid = services.dbname_of(pg_url), locker.info.backend_pid

        async def read_failed() -> bool:
            for pid in await asyncio.to_thread(backends_waiting_for_a_lock, pg_admin_url, dbname, but=locker_pid):
                await asyncio.to_thread(terminate, pg_admin_url, pid)
            return logged in caplog.text or read.done()

        await async_wait_for(read_failed, 10, message="the server's read to be killed")
        await locker.rollback()
        return await asyncio.wait_for(read, 30)
    finally:
        await locker.close()


async def test_a_replay_whose_next_page_read_is_killed_goes_on_from_where_the_client_stands(
        pg_served: Served, pg_url: str, pg_admin_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A client resumes with `since`; after its `subscribed` and part of the replay, the read of the
    replay's next page waits behind a lock and its backend is killed (as in a restart or a
    failover), while the log still holds the rest: the read is tried again from the last message
    the client was sent, as a read-on's is, and the client gets every message once, in order, no
    `reset`, and keeps its connection (no 1011, no reconnect of its other subscriptions)."""
    topic = "room:killed-replay"
    client, sent = await waiting_inside_a_replay(pg_served, topic)
    try:
        got = await read_while_log_reads_are_killed(
            pg_url, pg_admin_url, client, len(sent), f"could not read the replay of {topic}", caplog)
        assert got == sent, "every message once, in order, no reset"
        await client.send({"op": "ping", "ref": "after"})
        assert await client.recv(timeout=10) == {"op": "pong", "ref": "after"}
        assert not server_side(pg_served.server, client).closing
    finally:
        await client.close()


async def test_a_ping_sent_while_a_replay_waits_on_the_store_is_answered_after_that_replay(
        pg_served: Served, pg_url: str, pg_admin_url: str) -> None:
    """A connection's frames are answered in order (docs/reference.md §5): a ping sent after a
    subscribe's `subscribed`, while the replay's next page read waits behind a lock (as behind a
    store restart), gets its pong only after every message of that replay. Clients' liveness
    checks rely on it: the JS client gives such a ping the whole heartbeat, not the grace."""
    topic = "room:ping-behind-replay"
    client, sent = await waiting_inside_a_replay(pg_served, topic)
    locker = await psycopg.AsyncConnection.connect(pg_url)
    got: list[str] = []

    async def until_pong() -> None:
        while (frame := await client.recv(timeout=30))["op"] == "message":
            got.append(frame["offset"])
        assert frame == {"op": "pong", "ref": "wake"}, frame

    try:
        await locker.execute("LOCK TABLE livepush_messages IN ACCESS EXCLUSIVE MODE")
        await client.send({"op": "ping", "ref": "wake"})
        client.ws.transport.resume_reading()
        read = asyncio.ensure_future(until_pong())
        dbname, locker_pid = services.dbname_of(pg_url), locker.info.backend_pid
        await async_wait_for(
            lambda: asyncio.to_thread(backends_waiting_for_a_lock, pg_admin_url, dbname, but=locker_pid), 10,
            message="the replay's next page read to wait behind the lock")
        assert not read.done() and len(got) < len(sent), "the pong waits, and the replay stopped at its read"
        await locker.rollback()
        await asyncio.wait_for(read, 30)
        assert got == sent, "the whole replay, then the pong"
    finally:
        await locker.close()
        await client.close()


# A publisher process: `rounds` transactions on one topic, each publishing one to three messages
# with conn= and holding its transaction a moment, then committing, or rolling back one in four.
# Prints the offset and data of each message that committed.
TRANSACTIONAL_CHILD = """
import json, random, sys, time
import psycopg
from livepush.fanout.postgres import PostgresFanOut
url, topic, name, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rnd = random.Random(name)
fanout = PostgresFanOut(url)
with psycopg.connect(url) as conn:
    for r in range(rounds):
        done = [(fanout.publish(topic, {"who": name, "r": r, "k": k}, conn=conn), (name, r, k))
                for k in range(rnd.randint(1, 3))]
        time.sleep(rnd.random() / 200)
        if rnd.random() < 0.25:
            conn.rollback()
        else:
            conn.commit()
            for offset, data in done:
                print(json.dumps([offset, data]), flush=True)
fanout.close()
"""


async def test_publishers_in_several_processes_deliver_exactly_what_committed_in_gap_free_offset_order(
        pg_served: Served, pg_url: str) -> None:
    """Three processes publish on one topic in transactions of varying length, a quarter of them
    rolled back: a subscriber gets exactly the committed messages, each once, in offset order,
    with offsets 1, 2, 3... (a rolled-back publish gives its number back) and each transaction's
    messages together and in their order (a topic's publishers serialize on its row)."""
    client = await WSClient.open(pg_served.url)
    await client.subscribe(pg_served.sign("many:procs"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    children = [await asyncio.create_subprocess_exec(
        sys.executable, "-c", TRANSACTIONAL_CHILD, pg_url, "many:procs", name, "25",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env) for name in ("a", "b", "c")]
    outputs = await asyncio.wait_for(asyncio.gather(*(child.communicate() for child in children)), 60)
    for child, (_, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err.decode()
    committed = {offset: tuple(data) for out, _ in outputs for offset, data in map(json.loads, out.decode().split("\n")[:-1])}
    got = await client.messages(len(committed), timeout=20)
    assert [int(m["offset"].split("-")[1]) for m in got] == list(range(1, len(committed) + 1))
    assert {m["offset"]: (m["data"]["who"], m["data"]["r"], m["data"]["k"]) for m in got} == committed
    runs = [(m["data"]["who"], m["data"]["r"]) for m in got]
    assert all(runs[i] == runs[i - 1] or runs[i] not in runs[:i] for i in range(1, len(runs))), \
        "a transaction's messages were split by another's"
    with pytest.raises(asyncio.TimeoutError):
        await client.recv(timeout=0.3)
    await client.close()


async def test_a_client_reading_on_from_history_whose_read_is_killed_gets_every_message_without_reset(
        pg_served: Served, pg_url: str, pg_admin_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A client past its share reads on from history; that read waits behind a lock and its backend
    is killed (as in a restart or a failover), while the log still holds the client's place: the
    read is tried again, as a live read is, and the client gets every message, in order, none
    twice, and no `reset`."""
    topic = "room:killed-read-on"
    slow, sent = await paused_past_its_share(pg_served, topic, 600)
    try:
        got = await read_while_log_reads_are_killed(
            pg_url, pg_admin_url, slow, len(sent), f"could not read on from the history of {topic}", caplog)
        assert got == sent, "every message once, in order, no reset"
        assert not server_side(pg_served.server, slow).closing
    finally:
        await slow.close()
