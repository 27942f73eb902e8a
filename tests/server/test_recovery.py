"""Nothing lost across reconnects (docs/reference.md §7): `since` replays, seams, gaps, resets."""

from __future__ import annotations

import asyncio

import pytest

from livepush import PayloadTooLarge
from livepush.fanout.postgres import PostgresFanOut
from livepush.fanout.redis import RedisFanOut
from livepush.types import offset_key
from tests.server.conftest import Served, make_settings, start_served
from tests.support.wsclient import WSClient


async def test_a_client_away_during_1000_messages_gets_all_of_them_on_since(served: Served) -> None:
    """Subscribing with the last offset seen replays every missed message, in order, once, then goes live."""
    client = await WSClient.open(served.url)
    await client.subscribe(served.sign("feed"))
    await served.publish("feed", {"i": -1})
    last_seen = (await client.messages(1))[0]["offset"]
    await client.close()
    for i in range(1000):
        await served.publish("feed", {"i": i})
    back = await WSClient.open(served.url)
    answer = await back.subscribe(served.sign("feed"), since=last_seen)
    assert answer["op"] == "subscribed"
    replay = await back.messages(1000)
    assert [m["data"]["i"] for m in replay] == list(range(1000))
    await served.publish("feed", {"i": 1000})
    live = await back.messages(1)
    assert live[0]["data"]["i"] == 1000
    with pytest.raises(asyncio.TimeoutError):
        await back.recv(timeout=0.3)
    await back.close()


async def test_no_gap_and_no_duplicate_at_the_seam_between_replay_and_live(served: Served) -> None:
    """Messages published while a replay is read arrive once, after the replay, in order."""
    rendered = await served.fanout.alatest_offset("seam")  # before anything was published
    for i in range(200):
        await served.publish("seam", {"i": i})
    client = await WSClient.open(served.url)
    await client.send({"op": "subscribe", "topic": served.sign("seam"), "since": rendered, "ref": 1})
    for i in range(200, 400):  # races the replay read
        await served.publish("seam", {"i": i})
        if i % 50 == 0:
            await asyncio.sleep(0)
    assert (await client.recv())["op"] == "subscribed"
    got = await client.messages(400, timeout=10)
    assert [m["data"]["i"] for m in got] == list(range(400))
    assert sorted(offset_key(m["offset"]) for m in got) == [offset_key(m["offset"]) for m in got]
    with pytest.raises(asyncio.TimeoutError):
        await client.recv(timeout=0.3)
    await client.close()


@pytest.mark.parametrize("unsubscribed", [False, True], ids=["subscribed", "unsubscribed"])
async def test_a_subscribe_again_brings_after_its_subscribed_every_message_on_its_way_before_it(
        served: Served, unsubscribed: bool) -> None:
    """A client subscribes again (still subscribed, or right after an unsubscribe), from the offset
    it held, to a topic whose messages are on their way to it: what it reads before the new
    `subscribed` it may ignore (docs/protocol.md, what a client keeps), since the replay after the
    `subscribed` brings every message after `since` again, once each and in order, and the live
    ones follow."""
    client = await WSClient.open(served.url)
    topic = served.sign("again")
    since = (await client.subscribe(topic))["offset"]
    for i in range(5):
        await served.publish("again", {"i": i})
    assert (await client.messages(1))[0]["data"] == {"i": 0}  # the rest are on their way, or soon
    if unsubscribed:
        await client.send({"op": "unsubscribe", "topic": topic})
    await client.send({"op": "subscribe", "topic": topic, "since": since, "ref": "again"})
    before = []
    while (frame := await client.recv())["op"] != "subscribed":
        assert frame["op"] == "message", frame
        before.append(frame["data"]["i"])
    assert frame["ref"] == "again" and before == list(range(1, len(before) + 1)), (frame, before)
    await served.publish("again", {"i": 5})
    after = await client.messages(6)
    assert [m["data"] for m in after] == [{"i": i} for i in range(6)]
    assert [offset_key(m["offset"]) for m in after] == sorted({offset_key(m["offset"]) for m in after})
    with pytest.raises(asyncio.TimeoutError):
        await client.recv(timeout=0.3)
    await client.close()


async def test_a_since_ahead_of_the_topic_gets_the_latest_offset_below_it_then_reset_then_the_next_message(
        served: Served) -> None:
    """A `since` past the topic's latest offset in its own epoch (kept from a store since restarted or
    restored) is answered with `subscribed` at the latest offset, below that `since`, and `reset`;
    the next message's offset is below the `since` too, so a client moves its cursor back to the
    `subscribed` offset on that reset (docs/protocol.md, what a client keeps) or drops it."""
    latest = await served.publish("ahead", {"i": 0})
    first, second = latest.split("-")
    # Postgres and the local fan-out: later in the same epoch; Redis, whose ids are its clock's
    # milliseconds and a sequence: ten minutes ahead (its clock set back since that offset).
    since = f"{int(first) + 600_000}-0" if served.fanout.name == "redis" else f"{first}-{int(second) + 5}"
    client = await WSClient.open(served.url)
    answer = await client.subscribe(served.sign("ahead"), since=since)
    assert (answer["op"], answer["offset"]) == ("subscribed", latest), answer
    assert await client.recv() == {"op": "reset", "topic": "ahead", "ref": answer["ref"]}
    await served.publish("ahead", {"i": 1})
    message = (await client.messages(1))[0]
    assert message["data"] == {"i": 1}
    assert offset_key(latest) < offset_key(message["offset"]) < offset_key(since), (latest, message, since)
    await client.close()


async def test_latest_offset_closes_the_render_to_subscribe_gap(served: Served) -> None:
    """A page that embeds latest_offset() and subscribes with it misses nothing published in between."""
    await served.publish("doc:1", {"v": 1})
    rendered_at = await served.fanout.alatest_offset("doc:1")  # what the web process embeds
    await served.publish("doc:1", {"v": 2})  # published after render, before subscribe
    client = await WSClient.open(served.url)
    await client.subscribe(served.sign("doc:1"), since=rendered_at)
    assert [m["data"]["v"] for m in await client.messages(1)] == [2]
    await client.close()


async def test_latest_offset_of_a_new_topic_replays_its_first_message(served: Served) -> None:
    """Embedding latest_offset() of a topic nobody published on yet still catches the first message."""
    rendered_at = await served.fanout.alatest_offset("fresh:1")
    await served.publish("fresh:1", {"first": True})
    client = await WSClient.open(served.url)
    await client.subscribe(served.sign("fresh:1"), since=rendered_at)
    assert (await client.messages(1))[0]["data"] == {"first": True}
    await client.close()


async def test_mixed_small_and_200_kb_messages_arrive_in_order(served: Served) -> None:
    """Large payloads (past NOTIFY's 8000 bytes) keep their place among small ones, live and replayed."""
    client = await WSClient.open(served.url)
    await client.subscribe(served.sign("mixed"))
    start = await served.fanout.alatest_offset("mixed")
    sizes = [10, 200_000, 5, 7_990, 200_000, 1, 9_000, 3]
    for i, size in enumerate(sizes):
        await served.publish("mixed", {"i": i, "pad": "x" * size})
    live = await client.messages(len(sizes), timeout=10)
    assert [(m["data"]["i"], len(m["data"]["pad"])) for m in live] == list(enumerate(sizes))
    again = await WSClient.open(served.url)
    await again.subscribe(served.sign("mixed"), since=start)
    replay = await again.messages(len(sizes), timeout=10)
    assert [(m["data"]["i"], len(m["data"]["pad"])) for m in replay] == list(enumerate(sizes))
    await client.close()
    await again.close()


async def test_one_mib_works_and_two_mib_is_refused_before_anything_is_written(served: Served) -> None:
    """Up to 1 MiB of JSON is delivered; 2 MiB raises PayloadTooLarge and publishes nothing."""
    client = await WSClient.open(served.url)
    await client.subscribe(served.sign("huge"))
    near_limit = {"pad": "y" * (1024 * 1024 - 20)}
    await served.publish("huge", near_limit)
    assert len((await client.messages(1, timeout=10))[0]["data"]["pad"]) == len(near_limit["pad"])
    before = await served.fanout.alatest_offset("huge")
    with pytest.raises(PayloadTooLarge):
        await served.publish("huge", {"pad": "z" * (2 * 1024 * 1024)})
    assert await served.fanout.alatest_offset("huge") == before
    await client.close()


async def test_a_replay_page_of_about_2_mib_reaches_a_client_that_reads_as_fast_as_it_can(served: Served) -> None:
    """A page of history holds up to a MiB of data before its last message, which may be a MiB
    itself. A client that resumes over such a page and reads as fast as it can gets every
    message, in order: it is not closed as too slow (1013) for what the server sent at once."""
    topic = "t" * 200  # the longest topic: the most bytes of frame around each message
    client = await WSClient.open(served.url)
    await client.subscribe(served.sign(topic))
    await served.publish(topic, {"i": -1})
    last_seen = (await client.messages(1))[0]["offset"]
    await client.close()
    pad = "x" * 1030  # 999 of these stay just under the page's MiB
    await served.fanout.apublish_many([(topic, {"i": i, "p": pad}) for i in range(999)])
    await served.publish(topic, {"i": 999, "p": "y" * (1024 * 1024 - 30)})
    back = await WSClient.open(served.url)
    assert (await back.subscribe(served.sign(topic), since=last_seen))["op"] == "subscribed"
    replay = await back.messages(1000, timeout=10)
    assert [m["data"]["i"] for m in replay] == list(range(1000))
    await back.close()


@pytest.mark.parametrize("since", ["garbage", "999999999", "-1",
                                   # past a Postgres bigint, and past a Redis stream id's halves
                                   "1-9999999999999999999", "99999999999999999999-0",
                                   # the very top of a Postgres bigint and of a Redis stream id
                                   "1-9223372036854775807", "18446744073709551615-18446744073709551615"])
async def test_an_unknown_since_gets_reset_then_live(served: Served, since: str) -> None:
    """A `since` this topic never had is answered with `reset`, then live messages flow: never
    `unavailable`, which a client would retry with the same offset for ever."""
    await served.publish("unknown", {"i": 0})
    client = await WSClient.open(served.url)
    if served.fanout.name == "redis" and since.isdigit():
        since = "99999999999999-0"
    assert (await client.subscribe(served.sign("unknown"), since=since))["op"] == "subscribed"
    assert (await client.recv())["op"] == "reset"
    await served.publish("unknown", {"i": 1})
    assert (await client.messages(1))[0]["data"] == {"i": 1}
    await client.close()


async def test_a_since_padded_past_any_offset_gets_one_answer_and_reset(served: Served) -> None:
    """The latest offset behind thirty zeros was never given out: `subscribed`, then `reset`, then live messages; never a second answer (`refused`) to the same subscribe."""
    offset = await served.publish("padded", {"i": 0})
    client = await WSClient.open(served.url)
    assert (await client.subscribe(served.sign("padded"), since="0" * 30 + offset))["op"] == "subscribed"
    assert (await client.recv())["op"] == "reset"
    await served.publish("padded", {"i": 1})
    assert (await client.messages(1))[0]["data"] == {"i": 1}
    await client.close()


@pytest.mark.parametrize("kind", ["postgres", "redis"])
async def test_a_server_that_was_not_running_answers_since_from_history(procs, livepush_env, secret: str, kind: str,
                                                                       request) -> None:  # type: ignore[no-untyped-def]
    """A `livepush serve` process is stopped; messages published meanwhile from another process
    are replayed, in order, by the server started again to a client resuming from the last
    offset it saw, and the live stream follows. On Postgres and on Redis: the history, not the
    server, holds them."""
    from livepush import topics

    url = request.getfixturevalue("pg_url" if kind == "postgres" else "redis_url")
    env = livepush_env(database_url=url) if kind == "postgres" else livepush_env(redis_url=url, fanout="redis")
    server = await procs.alivepush("serve", env=env)
    ws_url = f"ws://127.0.0.1:{env['LIVEPUSH_PORT']}/"
    signed = topics.sign("restart", [secret])
    client = await WSClient.open(ws_url)
    await client.subscribe(signed)
    publisher = PostgresFanOut(url) if kind == "postgres" else RedisFanOut(url)
    try:
        await publisher.apublish("restart", {"i": 0})
        seen = (await client.messages(1))[0]["offset"]
        server.stop()
        for i in range(1, 1001):
            await publisher.apublish("restart", {"i": i})
        await procs.alivepush("serve", env=env)
        back = await WSClient.open(ws_url)
        await back.subscribe(signed, since=seen)
        got = await back.messages(1000, timeout=15)
        assert [m["data"]["i"] for m in got] == list(range(1, 1001))
        await publisher.apublish("restart", {"i": 1001})
        assert [m["data"]["i"] for m in await back.messages(1)] == [1001], "the live stream follows the replay"
        await back.close()
    finally:
        await publisher.aclose()


async def test_since_older_than_the_history_ttl_gets_reset(fanout_kind: str, secret: str, request) -> None:
    """Past LIVEPUSH_HISTORY_TTL the missed messages are gone: the client gets `reset`, never a hole."""
    pg = request.getfixturevalue("pg_url") if fanout_kind == "postgres" else None
    rd = request.getfixturevalue("redis_url") if fanout_kind == "redis" else None
    served = await start_served(make_settings(fanout_kind, secret, pg, rd, history_ttl=0.5))
    try:
        first = await served.publish("ttl", {"i": 0})
        await served.publish("ttl", {"i": 1})
        await asyncio.sleep(0.7)  # the TTL itself is what is under test
        await served.fanout.prune()
        client = await WSClient.open(served.url)
        await client.subscribe(served.sign("ttl"), since=first)
        assert (await client.recv())["op"] == "reset"
        await client.close()
    finally:
        await served.stop()
