"""One contract, three fan-outs: every test here runs against local, Postgres and Redis.

The contract is `livepush.fanout.base` (docs/reference.md §4, §7). A test that cannot apply to
one fan-out (the local one has no server to lose, no other process to hear from) skips it and
says why.

Receivers and doorbells: the Postgres fan-out's receivers get doorbells, `Message.data_json` is
None (a notification carries no data: any role that can connect may send one). The message
still has its offset and prev; the receiver reads it with `history(topic, message.prev)`, whose
first entry is that message. The hub does exactly this; `Collector` (tests/support/fanouts.py)
does the same for every test here. `history()` answers one page, `History(messages, latest,
more)`, or None; `read_history()` follows the pages to the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

import livepush
from livepush.errors import ArgumentTypeError
from livepush.fanout.base import (
    HISTORY_PAGE,
    HISTORY_PAGE_BYTES,
    IDLE_EXPIRE,
    MAX_PAYLOAD_BYTES,
    FanOut,
)
from livepush.types import offset_key
from tests.support import services
from tests.support.fanouts import WAIT, Collector, offsets_of, payload_of, read_history
from tests.support.procs import free_port
from tests.support.waiting import async_wait_for, wait_for

ROOT = Path(__file__).resolve().parent.parent
KINDS = ["local", "postgres", "redis"]
SERVER_KINDS = ("postgres", "redis")

MakeFanOut = Callable[..., Awaitable[FanOut]]

# ---- helpers ------------------------------------------------------------------------------------


def datas_of(messages: list[Any] | None) -> list[Any]:
    return [json.loads(m.data_json or "null") for m in messages or []]


def beyond(offset: str) -> str:
    """An offset of the same shape far past `offset`: never handed out on that topic."""
    head, *rest = offset.split("-")
    return "-".join([str(int(head) + 10_000_000), *rest])


def server_only(kind: str) -> None:
    if kind not in SERVER_KINDS:
        pytest.skip("the local fan-out has no server connection and lives in one process")


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, f"error message spans lines: {text!r}"
    return text


class PrivateRedis:
    """A Redis of the test's own that it may stop and start (the shared one must stay up).

    It runs without save points; `stop(save=True)` is SHUTDOWN SAVE, so the streams survive
    the restart as on a production Redis with persistence; `stop(save=False)` loses them.
    """

    def __init__(self, directory: Path, port: int) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed: run the tests with bin/test")
        self.binary = binary
        self.dir = directory
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.pidfile = directory / "redis.pid"

    def _client(self) -> redis.Redis:
        # No retries: SHUTDOWN closes the connection, and retrying would only wait.
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2, socket_connect_timeout=2, retry=None)

    def start(self) -> None:
        subprocess.run(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--daemonize", "yes",
             "--pidfile", str(self.pidfile), "--dir", str(self.dir), "--save", "", "--appendonly", "no",
             "--logfile", str(self.dir / "redis.log")],
            check=True, timeout=10, capture_output=True,
        )  # fmt: skip
        client = self._client()
        try:
            wait_for(client.ping, 10, message=f"private Redis on {self.port} to answer", ignore=(redis.RedisError,))
        finally:
            client.close()

    def stop(self, *, save: bool) -> None:
        try:
            pid = int(self.pidfile.read_text().strip())
        except (FileNotFoundError, ValueError):
            return
        client = self._client()
        try:
            client.shutdown(save=save, nosave=not save)
        except redis.ConnectionError:
            pass  # already gone
        finally:
            client.close()
        wait_for(lambda: services.process_gone(pid), 10, message=f"private Redis (pid {pid}) to exit")


@pytest.fixture
def private_redis(tmp_path: Path) -> Any:
    """A restartable Redis on its own port, stopped after the test."""
    # LIVEPUSH_TEST_PRIVATE_REDIS_PORT pins the port (for machines shared by several runs).
    port = int(os.environ.get("LIVEPUSH_TEST_PRIVATE_REDIS_PORT") or free_port())
    server = PrivateRedis(tmp_path, port)
    server.start()
    try:
        yield server
    finally:
        server.stop(save=False)


# ---- the parametrized fan-out -------------------------------------------------------------------


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def make_fanout(kind: str, request: pytest.FixtureRequest) -> AsyncIterator[MakeFanOut]:
    """Factory: `await make_fanout(history_ttl=..., listen=True, url=None)` -> a fan-out of `kind`.

    Servers are only asked for when the kind needs them, so the local tests run anywhere.
    Every fan-out made is closed after the test.
    """
    default_url: str | None = None
    if kind == "postgres":
        default_url = request.getfixturevalue("pg_url")
    elif kind == "redis":
        default_url = request.getfixturevalue("redis_url")
    made: list[FanOut] = []

    async def make(*, history_ttl: float = 300.0, listen: bool = True, url: str | None = None,
                   idle_expire: float = IDLE_EXPIRE) -> FanOut:
        fanout: FanOut
        if kind == "local":
            from livepush.fanout.local import LocalFanOut

            fanout = LocalFanOut(history_ttl=history_ttl, idle_expire=idle_expire)
        elif kind == "postgres":
            from livepush.fanout.postgres import PostgresFanOut

            fanout = PostgresFanOut(url or default_url, history_ttl=history_ttl,  # type: ignore[arg-type]
                                    idle_expire=idle_expire)
        else:
            from livepush.fanout.redis import RedisFanOut

            fanout = RedisFanOut(url or default_url, history_ttl=history_ttl,  # type: ignore[arg-type]
                                 idle_expire=idle_expire)
        made.append(fanout)
        if listen:
            await fanout.listen()
        return fanout

    yield make
    for fanout in made:
        await fanout.aclose()


# A publisher in another process, as a web or job process would be: prints one offset a line.
CHILD_PUBLISHER = """
import json, sys
kind, url, topic, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if kind == "postgres":
    from livepush.fanout.postgres import PostgresFanOut as F
else:
    from livepush.fanout.redis import RedisFanOut as F
fanout = F(url)
for i in range(count):
    print(fanout.publish(topic, {"from": "child", "i": i}), flush=True)
fanout.close()
"""


async def publish_from_child(kind: str, url: str, topic: str, count: int) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD_PUBLISHER, kind, url, topic, str(count),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    except TimeoutError:
        proc.kill()
        raise
    assert proc.returncode == 0, err.decode()
    return out.decode().split()


# ---- listen() and register() --------------------------------------------------------------------


async def test_listen_returns_listening(make_fanout: MakeFanOut) -> None:
    """listen() returns with the subscription in effect: `listening` is True at once."""
    fanout = await make_fanout(listen=False)
    assert not fanout.listening
    await fanout.listen()
    assert fanout.listening


async def test_listen_called_again_changes_nothing(make_fanout: MakeFanOut) -> None:
    """listen() is called once at boot; a second call (two parts of an app each making sure)
    returns at once, and each message still reaches a receiver once."""
    fanout = await make_fanout(listen=False)
    await fanout.listen()
    await fanout.listen()
    assert fanout.listening
    got = Collector(fanout)
    fanout.register(got)
    offsets = [await fanout.apublish("twice:a", {"i": i}) for i in range(3)]
    await got.wait_count("twice:a", 3)
    # In order: a second copy of a message would have come before the next message.
    assert offsets_of(got.raw[:3]) == offsets and len(got.raw) == 3


async def test_listen_after_aclose_listens_again_and_delivers(make_fanout: MakeFanOut) -> None:
    """A fan-out closed and then listened on again (an app's lifespan run twice) holds a
    subscription again and delivers to its receivers, rather than return as if it listened."""
    fanout = await make_fanout()
    got = Collector(fanout)
    fanout.register(got)
    await fanout.aclose()
    await fanout.listen()
    assert fanout.listening
    offset = await fanout.apublish("relisten:a", {"i": 0})
    assert offsets_of(await got.wait_count("relisten:a", 1)) == [offset]


@pytest.mark.parametrize("topic", [123, None, "", "bad topic!", "a" * 201])
async def test_a_topic_no_subscriber_could_name_is_refused_by_every_publish(make_fanout: MakeFanOut,
                                                                           topic: Any) -> None:
    """A topic that is not 1 to 200 characters of A-Z a-z 0-9 _ . : / - (or not a str at all) is
    refused with InvalidTopic naming it, by publish() and publish_many(), sync and async, on every
    fan-out, before anything is written: no subscriber could ever receive it. (publish_many() says of
    a topic that is no str that it must be one, with the item, as the module API does.)"""
    fanout = await make_fanout(listen=False)
    refused = livepush.InvalidTopic if isinstance(topic, str) else (livepush.InvalidTopic, ArgumentTypeError)
    for call in (lambda: fanout.publish(topic, {"i": 0}), lambda: fanout.publish_many([(topic, {"i": 0})])):
        with pytest.raises(refused, match="topic"):
            call()
    for acall in (lambda: fanout.apublish(topic, {"i": 0}), lambda: fanout.apublish_many([(topic, {"i": 0})])):
        with pytest.raises(refused, match="topic"):
            await acall()


async def test_register_before_listen_raises(make_fanout: MakeFanOut) -> None:
    """Registering a receiver or a resync handler before listen() raises NotListeningError."""
    fanout = await make_fanout(listen=False)
    with pytest.raises(livepush.NotListeningError, match="listen"):
        fanout.register(lambda message: None)
    with pytest.raises(livepush.NotListeningError):
        fanout.on_resync(lambda: None)


async def test_listen_unreachable_server_raises_listen_error(kind: str) -> None:
    """listen() against a closed port raises ListenError, one line naming the setting to fix."""
    server_only(kind)
    port = free_port()  # nothing listens there
    fanout: FanOut
    if kind == "postgres":
        from livepush.fanout.postgres import PostgresFanOut

        fanout, setting = PostgresFanOut(f"postgresql://postgres@127.0.0.1:{port}/postgres"), "LIVEPUSH_DATABASE_URL"
    else:
        from livepush.fanout.redis import RedisFanOut

        fanout, setting = RedisFanOut(f"redis://127.0.0.1:{port}/0"), "LIVEPUSH_REDIS_URL"
    try:
        with pytest.raises(livepush.ListenError) as caught:
            await asyncio.wait_for(fanout.listen(), 15)
        assert isinstance(caught.value, livepush.DependencyError)
        assert setting in one_line(caught.value)
        assert not fanout.listening
    finally:
        await fanout.aclose()


# ---- publish and delivery -----------------------------------------------------------------------


async def test_delivery_in_publish_order_sync_and_async(make_fanout: MakeFanOut) -> None:
    """Sync and async publishes reach a receiver in publish order per topic, each once, with rising offsets."""
    fanout = await make_fanout()
    got = Collector(fanout)
    fanout.register(got)
    sent: dict[str, list[tuple[str, Any]]] = {"order:a": [], "order:b": []}
    for i in range(40):
        topic = "order:a" if i % 3 else "order:b"
        data = {"i": i, "text": f"message {i} é"}
        offset = fanout.publish(topic, data) if i % 2 else await fanout.apublish(topic, data)
        sent[topic].append((offset, data))
    for topic, expected in sent.items():
        received = await got.wait_count(topic, len(expected))
        assert offsets_of(received) == [offset for offset, _ in expected]
        assert datas_of(received) == [data for _, data in expected]
        keys = [offset_key(m.offset) for m in received]
        assert keys == sorted(keys) and len(set(keys)) == len(keys), "offsets must increase per topic"
        for before, after in zip(received, received[1:], strict=False):
            assert after.prev == before.offset, "prev names the message before on the topic"


async def test_receivers_get_the_data_or_a_doorbell_that_history_resolves(kind: str, make_fanout: MakeFanOut) -> None:
    """Postgres receivers get doorbells (offset and prev, no data) and read the message from history; the others get the data."""
    fanout = await make_fanout()
    got = Collector(fanout)
    fanout.register(got)
    offsets = [await fanout.apublish("bell:a", {"i": i}) for i in range(3)]
    received = await got.wait_count("bell:a", 3)
    doorbells = [m.data_json is None for m in got.raw]
    assert doorbells == [kind == "postgres"] * 3, "only Postgres notifications are doorbells"
    assert offsets_of(got.raw) == offsets == offsets_of(received)
    assert [m.prev for m in got.raw] == [m.prev for m in received]
    assert [await payload_of(fanout, m) for m in got.raw] == [{"i": i} for i in range(3)]


async def test_publish_right_after_listen_is_received(make_fanout: MakeFanOut) -> None:
    """A message published the moment listen() returns is delivered: the subscription was in effect."""
    fanout = await make_fanout(listen=False)
    await fanout.listen()
    got = Collector(fanout)
    fanout.register(got)
    offset = await fanout.apublish("seam:first", {"n": 1})
    [message] = await got.wait_count("seam:first", 1)
    assert message.offset == offset


async def test_receiver_gets_messages_from_another_process(kind: str, make_fanout: MakeFanOut) -> None:
    """A receiver registered after listen() gets what a separate publish-only process publishes."""
    server_only(kind)
    fanout = await make_fanout()
    got = Collector(fanout)
    fanout.register(got)
    offsets = await publish_from_child(kind, fanout.url, "child:topic", 3)  # type: ignore[attr-defined]
    received = await got.wait_count("child:topic", 3)
    assert offsets_of(received) == offsets
    assert datas_of(received) == [{"from": "child", "i": i} for i in range(3)]


async def test_conn_is_refused_without_postgres(kind: str, make_fanout: MakeFanOut) -> None:
    """publish(conn=...) on a fan-out other than Postgres raises ValueError and writes nothing."""
    if kind == "postgres":
        pytest.skip("conn= is the Postgres fan-out's own feature (tested with transactions)")
    fanout = await make_fanout()
    start = fanout.latest_offset("conn:topic")
    with pytest.raises(ValueError, match="Postgres"):
        fanout.publish("conn:topic", {"a": 1}, conn=object())
    with pytest.raises(ValueError, match="Postgres"):
        await fanout.apublish("conn:topic", {"a": 1}, conn=object())
    assert fanout.latest_offset("conn:topic") == start
    assert await read_history(fanout, "conn:topic", start) == []


# ---- publish_many -------------------------------------------------------------------------------


async def test_publish_many_delivers_a_batch_in_order_with_each_topics_next_offsets(make_fanout: MakeFanOut) -> None:
    """publish_many / apublish_many return the offsets in batch order; each topic's messages take its next
    offsets in batch order, arrive in that order, each once, data intact, and replay from history."""
    fanout = await make_fanout()
    got = Collector(fanout)
    fanout.register(got)
    before = {t: fanout.publish(t, {"first": True}) for t in ("many:a", "many:b")}
    batch = [("many:a" if i % 3 else "many:b", {"i": i, "text": f"é€😀 {i}", "nested": [1, {"x": None}]})
             for i in range(12)]
    offsets = fanout.publish_many(batch[:6]) + await fanout.apublish_many(batch[6:])
    assert len(offsets) == len(batch)
    for topic in before:
        sent = [(offset, data) for offset, (t, data) in zip(offsets, batch, strict=True) if t == topic]
        received = await got.wait_count(topic, len(sent) + 1)
        assert offsets_of(received)[1:] == [offset for offset, _ in sent]
        assert datas_of(received)[1:] == [data for _, data in sent]
        assert received[1].prev == before[topic], "the batch continues the topic's chain"
        for earlier, later in zip(received, received[1:], strict=False):
            assert later.prev == earlier.offset
        assert datas_of(await read_history(fanout, topic, before[topic])) == [data for _, data in sent]
    assert fanout.publish_many([]) == [] and await fanout.apublish_many([]) == []


async def test_publish_many_keeps_any_json_text_exactly(make_fanout: MakeFanOut) -> None:
    """Data with a NUL character, line and paragraph separators, quotes, backslashes, emoji, huge and
    negative-zero numbers goes through publish_many as publish() takes it, and comes back as the same
    JSON text."""
    fanout = await make_fanout()
    got = Collector(fanout)
    fanout.register(got)
    odd = [{"nul": "a\x00b"}, {"seps": "\u2028\u2029", "q": "\"\\"}, {"e": "😀é"}, [1.5e300, -0.0, 10**30], "plain"]
    offsets = fanout.publish_many([("exact:many", d) for d in odd])
    received = await got.wait_count("exact:many", len(odd))
    assert offsets_of(received) == offsets
    assert [m.data_json for m in received] == [json.dumps(d, separators=(",", ":"), ensure_ascii=False) for d in odd]


async def test_publish_many_checks_every_item_before_anything_is_published(make_fanout: MakeFanOut) -> None:
    """An item that is not plain JSON, too large, or not a (topic, data) pair fails the whole batch, naming
    the item, and nothing of the batch is written or delivered."""
    fanout = await make_fanout()
    got = Collector(fanout)
    fanout.register(got)
    start = fanout.publish("many:check", {"n": 0})
    bad_batches: list[tuple[list[Any], type[Exception], str]] = [
        ([("many:check", {"n": 1}), ("many:check", {"n": 2}), ("many:check", {"bad": float("nan")})], TypeError,
         "item 2's data must be plain JSON"),
        ([("many:check", {"n": 1}), ("many:check", {"s": "x" * (2 * MAX_PAYLOAD_BYTES)})], livepush.PayloadTooLarge,
         "item 1's data is"),
        ([("many:check", {"n": 1}), ["many:check", {"n": 2}]], TypeError, "item 1 is"),
        ([("many:check", {"n": 1}), (7, {"n": 2})], TypeError, "item 1: the topic must be a str"),
    ]
    for batch, error, words in bad_batches:
        with pytest.raises(error, match=words) as caught:
            fanout.publish_many(batch)
        one_line(caught.value)
        with pytest.raises(error, match=words):
            await fanout.apublish_many(batch)
    assert fanout.latest_offset("many:check") == start
    marker = fanout.publish("many:check", {"n": "marker"})
    received = await got.wait_count("many:check", 2)
    assert offsets_of(received)[1] == marker, "nothing of the refused batches was delivered"


async def test_publish_many_of_no_iterable_says_what_it_takes(make_fanout: MakeFanOut) -> None:
    """publish_many(None) (a variable never set, or a number) raises TypeError saying it takes an iterable
    of (topic, data) pairs, not Python's bare "'NoneType' object is not iterable"."""
    fanout = await make_fanout()
    for bad in (None, 5):
        with pytest.raises(TypeError, match=r"publish_many\(\) takes an iterable of \(topic, data\) pairs"):
            fanout.publish_many(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"publish_many\(\) takes an iterable of \(topic, data\) pairs"):
            await fanout.apublish_many(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"publish_many\(\) takes an iterable of \(topic, data\) pairs"):
            livepush.publish_many(bad)  # type: ignore[arg-type]


async def test_data_that_is_not_unicode_text_is_refused_naming_the_item(make_fanout: MakeFanOut) -> None:
    """A string holding a lone surrogate (what Python makes of an undecodable file name) is not
    plain JSON text: publish() and publish_many() refuse it with TypeError naming the item, and
    nothing is written."""
    fanout = await make_fanout()
    start = fanout.publish("odd:text", {"n": 0})
    name = b"report-\xff.pdf".decode("utf-8", "surrogateescape")
    with pytest.raises(TypeError, match="publish\\(\\) data must be plain JSON") as caught:
        fanout.publish("odd:text", {"file": name})
    one_line(caught.value)
    with pytest.raises(TypeError, match="publish\\(\\) data must be plain JSON"):
        await fanout.apublish("odd:text", {"file": name})
    with pytest.raises(TypeError, match="item 1's data must be plain JSON"):
        fanout.publish_many([("odd:text", {"n": 1}), ("odd:text", {"file": name})])
    with pytest.raises(TypeError, match="item 1's data must be plain JSON"):
        await fanout.apublish_many([("odd:text", {"n": 1}), ("odd:text", {"file": name})])
    assert fanout.latest_offset("odd:text") == start


async def test_data_nested_past_what_json_encoding_can_follow_is_refused_naming_the_item(
        make_fanout: MakeFanOut) -> None:
    """Data nested thousands of levels deep (a few KiB of JSON) cannot be encoded: publish() and
    publish_many() refuse it with TypeError naming the item, as any data that is not plain JSON,
    not with the encoder's RecursionError, and nothing is written."""
    fanout = await make_fanout()
    start = fanout.publish("odd:deep", {"n": 0})
    deep: list[Any] = []
    inner = deep
    for _ in range(5000):
        inner.append([])
        inner = inner[0]
    with pytest.raises(TypeError, match="publish\\(\\) data must be plain JSON") as caught:
        fanout.publish("odd:deep", deep)
    one_line(caught.value)
    with pytest.raises(TypeError, match="publish\\(\\) data must be plain JSON"):
        await fanout.apublish("odd:deep", deep)
    with pytest.raises(TypeError, match="item 1's data must be plain JSON"):
        fanout.publish_many([("odd:deep", {"n": 1}), ("odd:deep", deep)])
    with pytest.raises(TypeError, match="item 1's data must be plain JSON"):
        await fanout.apublish_many([("odd:deep", {"n": 1}), ("odd:deep", deep)])
    assert fanout.latest_offset("odd:deep") == start


async def test_publish_many_of_thousands_on_long_topic_names_arrives_whole(make_fanout: MakeFanOut) -> None:
    """A batch of 2,500 messages over 300 topics, some named with 200 characters, is published (past one
    statement or script call, and past a notification's size), delivered in batch order per topic, and
    replayable."""
    fanout = await make_fanout()
    got = Collector(fanout)
    fanout.register(got)
    topics = [f"long:{i:03d}:" + "x" * (200 - len("long:000:")) if i % 2 else f"short:{i}" for i in range(300)]
    assert max(map(len, topics)) == 200
    batch = [(topics[(i * 7) % 300], {"i": i}) for i in range(2500)]
    offsets = await fanout.apublish_many(batch)
    assert len(offsets) == 2500
    by_topic: dict[str, list[tuple[str, int]]] = {}
    for offset, (topic, data) in zip(offsets, batch, strict=True):
        by_topic.setdefault(topic, []).append((offset, data["i"]))
    for topic, sent in by_topic.items():
        received = await got.wait_count(topic, len(sent), timeout=30)
        assert offsets_of(received) == [offset for offset, _ in sent], topic
        assert [d["i"] for d in datas_of(received)] == [i for _, i in sent], topic
        assert offsets_of(await read_history(fanout, topic, received[0].prev)) == offsets_of(received), topic


async def test_publish_many_of_large_messages_past_a_statements_bytes_arrives_whole(make_fanout: MakeFanOut) -> None:
    """Twelve messages of about 900 KB on three topics (past what one statement or pub/sub frame
    carries) are published in one call, delivered intact in batch order per topic, and replayable."""
    fanout = await make_fanout()
    got = Collector(fanout)
    fanout.register(got)
    big = "x" * (900 * 1024)
    batch = [(f"heavy:{i % 3}", {"i": i, "s": big}) for i in range(12)]
    offsets = fanout.publish_many(batch)
    for t in range(3):
        topic = f"heavy:{t}"
        received = await got.wait_count(topic, 4, timeout=30)
        assert offsets_of(received) == [o for o, (tt, _) in zip(offsets, batch, strict=True) if tt == topic]
        assert [d["i"] for d in datas_of(received)] == [i for i in range(12) if i % 3 == t]
        assert all(d["s"] == big for d in datas_of(received))
        assert offsets_of(await read_history(fanout, topic, received[0].prev)) == offsets_of(received)


# ---- payload size -------------------------------------------------------------------------------


async def test_payload_of_exactly_1_mib_arrives_intact(make_fanout: MakeFanOut) -> None:
    """A payload of exactly 1 MiB of JSON (multi-byte text included) is delivered and replayed intact."""
    fanout = await make_fanout()
    got = Collector(fanout)
    fanout.register(got)
    tail = "é€😀"  # 2, 3 and 4 bytes in UTF-8
    filler = MAX_PAYLOAD_BYTES - len('{"s":""}') - len(tail.encode("utf-8"))
    data = {"s": "x" * filler + tail}
    assert len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")) == MAX_PAYLOAD_BYTES
    small_before = fanout.publish("big:one", {"n": 0})
    offset = await fanout.apublish("big:one", data)
    fanout.publish("big:one", {"n": 2})
    received = await got.wait_count("big:one", 3)
    assert offsets_of(received)[1] == offset
    assert datas_of(received)[1:] == [data, {"n": 2}], "intact, and order holds around a large message"
    replay = await read_history(fanout, "big:one", small_before)
    assert offsets_of(replay)[0] == offset
    assert datas_of(replay) == [data, {"n": 2}]


async def test_payload_over_1_mib_is_refused_and_nothing_written(make_fanout: MakeFanOut) -> None:
    """2 MiB raises PayloadTooLarge (a ValueError) before anything is written or delivered."""
    fanout = await make_fanout()
    got = Collector(fanout)
    fanout.register(got)
    fanout.publish("big:two", {"n": 0})
    await got.wait_count("big:two", 1)
    before = fanout.latest_offset("big:two")
    huge = {"s": "x" * (2 * MAX_PAYLOAD_BYTES)}
    with pytest.raises(livepush.PayloadTooLarge) as caught:
        fanout.publish("big:two", huge)
    assert isinstance(caught.value, ValueError)
    with pytest.raises(livepush.PayloadTooLarge):
        await fanout.apublish("big:two", huge)
    assert fanout.latest_offset("big:two") == before
    marker = fanout.publish("big:two", {"n": 1})
    received = await got.wait_count("big:two", 2)
    assert offsets_of(received)[1] == marker, "nothing was delivered between the two"
    assert offsets_of(await read_history(fanout, "big:two", before)) == [marker]


# ---- history and offsets ------------------------------------------------------------------------


async def test_history_returns_exactly_what_came_after(make_fanout: MakeFanOut) -> None:
    """history(since) returns every later message of the topic, in order, and nothing else; `latest` is the newest offset."""
    fanout = await make_fanout()
    start = fanout.latest_offset("hist:a")
    offsets, datas = [], []
    for i in range(8):
        data = {"i": i}
        offsets.append(fanout.publish("hist:a", data) if i % 2 else await fanout.apublish("hist:a", data))
        datas.append(data)
        fanout.publish("hist:other", {"noise": i})
    for cut, since in enumerate([start, *offsets]):
        page = await fanout.history("hist:a", since)
        assert page is not None, f"since={since} is in history"
        assert offsets_of(page.messages) == offsets[cut:]
        assert datas_of(page.messages) == datas[cut:]
        assert all(m.topic == "hist:a" for m in page.messages)
        assert page.latest == offsets[-1] and page.more is False
    last = await fanout.history("hist:a", offsets[-1])
    assert last is not None and (last.messages, last.latest, last.more) == ([], offsets[-1], False)


async def test_histories_answer_for_each_topic_what_history_does(make_fanout: MakeFanOut) -> None:
    """histories() reads many topics at once (the server's live reads) and answers for each what history() would: a page after its offset, an empty page at its latest, None for an offset it never gave."""
    fanout = await make_fanout()
    starts = {f"many:{i}": fanout.latest_offset(f"many:{i}") for i in range(30)}
    sent = {t: [fanout.publish(t, {"t": t, "n": n}) for n in range(i % 4)] for i, t in enumerate(starts)}
    reads = {t: starts[t] for t in starts}
    reads["many:0"] = "garbage"
    reads["many:never"] = fanout.latest_offset("many:never")
    reads["many:3"] = sent["many:3"][0]
    pages = await fanout.histories(reads)
    assert set(pages) == set(reads)
    for topic, since in reads.items():
        assert pages[topic] == await fanout.history(topic, since), topic
    assert pages["many:0"] is None
    assert pages["many:never"] is not None and pages["many:never"].messages == []
    page = pages["many:3"]
    assert page is not None and offsets_of(page.messages) == sent["many:3"][1:] and not page.more
    for topic in [t for t in starts if t not in ("many:0", "many:3")]:
        page = pages[topic]
        assert page is not None and offsets_of(page.messages) == sent[topic], topic


async def test_history_replays_1000_missed_messages(make_fanout: MakeFanOut) -> None:
    """A client away while 1,000 messages are published gets all of them from history, in order, once."""
    fanout = await make_fanout()
    since = fanout.latest_offset("away:a")
    offsets = [fanout.publish("away:a", {"i": i}) for i in range(1000)]
    replay = await read_history(fanout, "away:a", since)
    assert offsets_of(replay) == offsets
    assert [d["i"] for d in datas_of(replay)] == list(range(1000))


async def test_a_long_history_comes_in_pages_with_more_until_the_last(make_fanout: MakeFanOut) -> None:
    """history() answers one page of at most HISTORY_PAGE messages (or `limit`), `more` true until the last page."""
    fanout = await make_fanout()
    since = fanout.latest_offset("pages:a")
    n = 2 * HISTORY_PAGE + 50
    offsets = [fanout.publish("pages:a", {"i": i}) for i in range(n)]
    pages = []
    cursor = since
    while not pages or pages[-1].more:
        assert len(pages) < n, "history never said it was done"
        page = await fanout.history("pages:a", cursor)
        assert page is not None
        assert 0 < len(page.messages) <= HISTORY_PAGE
        assert page.latest == offsets[-1], "every page knows where the replay ends"
        pages.append(page)
        cursor = page.messages[-1].offset
    assert [m.offset for p in pages for m in p.messages] == offsets
    assert [len(p.messages) for p in pages] == [HISTORY_PAGE, HISTORY_PAGE, 50], "pages are full but the last"
    assert [p.more for p in pages] == [True] * (len(pages) - 1) + [False]
    small = await fanout.history("pages:a", since, limit=7)
    assert small is not None and offsets_of(small.messages) == offsets[:7] and small.more


async def test_a_page_of_large_messages_stops_at_about_a_mib(make_fanout: MakeFanOut) -> None:
    """A page ends at the message that takes its data past HISTORY_PAGE_BYTES, so large messages come a few a page."""
    fanout = await make_fanout()
    since = fanout.latest_offset("pages:big")
    blob = "z" * (400 * 1024)
    offsets = [fanout.publish("pages:big", {"i": i, "blob": blob}) for i in range(8)]
    one_mib = fanout.publish("pages:big", {"blob": "y" * (MAX_PAYLOAD_BYTES - 20)})
    pages = []
    cursor = since
    while not pages or pages[-1].more:
        assert len(pages) < 100, "history never said it was done"
        page = await fanout.history("pages:big", cursor)
        assert page is not None and page.messages, "a page always has a message, however large"
        before_last = sum(len((m.data_json or "").encode()) for m in page.messages[:-1])
        assert before_last < HISTORY_PAGE_BYTES, "a page holds about a MiB: what precedes its last message is under it"
        pages.append(page)
        cursor = page.messages[-1].offset
    assert [m.offset for p in pages for m in p.messages] == [*offsets, one_mib]
    assert len(pages) >= 3, f"8 × 400 KiB + 1 MiB came in {len(pages)} page(s)"
    assert pages[0].more and not pages[-1].more


async def test_history_of_unknown_or_garbage_offset_is_none(make_fanout: MakeFanOut) -> None:
    """An offset the topic never had, or that is no offset at all, gets None (the client resets)."""
    fanout = await make_fanout()
    offsets = [fanout.publish("hist:b", {"i": i}) for i in range(3)]
    other = fanout.publish("hist:c", {"i": 0})
    for since in ["garbage", "", "-1", "1.5", "--", "12x", "0-0-0", "0" * 21, beyond(offsets[-1])]:
        assert await fanout.history("hist:b", since) is None, f"since={since!r}"
    assert await fanout.history("hist:never", beyond(other)) is None


async def test_history_at_the_top_of_the_offset_range_is_none(kind: str, make_fanout: MakeFanOut) -> None:
    """An offset as large as the store's numbers go was never given out: history() answers None
    (the client gets `reset`), not an error that reads as the store being down (the client would
    be refused `unavailable` and retry the same offset for ever)."""
    fanout = await make_fanout()
    offset = fanout.publish("hist:top", {"i": 0})
    epoch = offset.split("-")[0]
    tops = {
        "local": [f"{epoch}-9223372036854775807", f"{epoch}-" + "9" * 30],
        "postgres": [f"{epoch}-9223372036854775807", f"{epoch}-9223372036854775000"],
        "redis": ["18446744073709551615-18446744073709551615", "18446744073709551615-0"],
    }[kind]
    for since in tops:
        assert await fanout.history("hist:top", since) is None, f"since={since}"
        assert (await fanout.histories({"hist:top": since}))["hist:top"] is None, f"since={since}"


async def test_expired_range_is_none(make_fanout: MakeFanOut) -> None:
    """Once a missed message is past history_ttl and pruned, history() answers None, never a hole."""
    fanout = await make_fanout(history_ttl=0.2)
    start = fanout.latest_offset("ttl:a")
    offsets = [fanout.publish("ttl:a", {"i": i}) for i in range(3)]
    await asyncio.sleep(0.5)  # the TTL is wall-clock time: there is no event to await
    await fanout.prune()
    for since in (start, offsets[0], offsets[1]):
        assert await fanout.history("ttl:a", since) is None, f"since={since}"
    # Fresh messages after the expired ones replay normally.
    fresh = fanout.publish("ttl:a", {"i": 3})
    assert offsets_of(await read_history(fanout, "ttl:a", offsets[2])) == [fresh]
    assert await read_history(fanout, "ttl:a", fresh) == []



async def test_a_prune_keeps_every_message_younger_than_the_ttl(make_fanout: MakeFanOut) -> None:
    """A message stays recoverable for the TTL: a prune drops what is past it and nothing
    younger, so a client that saw the expired message and was away for less than the TTL since
    the next ones gets every one of them, not `reset`."""
    fanout = await make_fanout(listen=False, history_ttl=0.5)
    seen = fanout.publish("young:a", {"i": 0})
    await asyncio.sleep(0.7)  # the TTL is wall-clock time: there is no event to await
    missed = [fanout.publish("young:a", {"i": i}) for i in (1, 2)]
    await fanout.prune()
    assert offsets_of(await read_history(fanout, "young:a", seen)) == missed

async def test_the_local_history_keeps_the_newest_10000_messages_of_a_topic() -> None:
    """The local fan-out keeps at most 10,000 messages per topic (docs/guarantees.md): a `since`
    whose next message is still kept replays the rest; one older than that gets None (`reset`),
    never a replay with a hole."""
    from livepush.fanout.local import MAX_KEPT_PER_TOPIC, LocalFanOut

    fanout = LocalFanOut()
    origin = fanout.latest_offset("kept:a")
    offsets = fanout.publish_many([("kept:a", {"i": i}) for i in range(MAX_KEPT_PER_TOPIC + 1)])
    assert MAX_KEPT_PER_TOPIC == 10_000
    assert await fanout.history("kept:a", origin) is None, "the first message is gone"
    assert offsets_of(await read_history(fanout, "kept:a", offsets[0])) == offsets[1:]


async def test_latest_offset_closes_the_render_to_subscribe_gap(make_fanout: MakeFanOut) -> None:
    """latest_offset() is the last published offset; replaying from it yields what came after, or nothing."""
    fanout = await make_fanout()
    unknown = fanout.latest_offset("latest:new")
    assert await fanout.alatest_offset("latest:new") == unknown
    empty = await fanout.history("latest:new", unknown)
    assert empty is not None, "an unknown topic replays nothing, not reset"
    assert (empty.messages, empty.latest, empty.more) == ([], unknown, False)
    offsets = [fanout.publish("latest:a", {"i": i}) for i in range(3)]
    assert fanout.latest_offset("latest:a") == offsets[-1]
    assert await fanout.alatest_offset("latest:a") == offsets[-1]
    # A page rendered now embeds `rendered`; what is published before it subscribes is replayed.
    rendered = fanout.latest_offset("latest:new")
    late = await fanout.apublish("latest:new", {"late": True})
    assert offsets_of(await read_history(fanout, "latest:new", rendered)) == [late]


async def test_an_origin_offset_from_before_the_history_was_lost_is_none(
    kind: str, make_fanout: MakeFanOut, request: pytest.FixtureRequest
) -> None:
    """A page rendered a topic nothing was published on yet, with its latest_offset(). Messages
    were published, then the history was lost (a Postgres crash empties the unlogged log; a
    Redis without persistence restarts empty), then one more was published. Subscribing with the
    rendered offset must get `reset`: replaying only what came after the loss would hide the
    messages it lost."""
    server_only(kind)
    fanout = await make_fanout(listen=False)
    rendered = fanout.latest_offset("lost:a")
    lost = [fanout.publish("lost:a", {"i": i}) for i in range(2)]
    if kind == "redis":
        client = redis.Redis.from_url(fanout.url)  # type: ignore[attr-defined]
        try:
            client.flushall()  # what a restart without persistence leaves
            # A restart takes seconds; a flush, less than the millisecond a stream id counts in.
            # Until Redis' clock passes the last lost id's, the next id would repeat it.
            def redis_ms() -> int:
                seconds, micros = client.time()
                return seconds * 1000 + micros // 1000

            lost_ms = offset_key(lost[-1])[0]
            wait_for(lambda: redis_ms() > lost_ms, WAIT, message="Redis' clock to pass the last lost message's millisecond")
        finally:
            client.close()
    else:
        await fanout.aclose()
        await asyncio.to_thread(services.pg_stop, "immediate")  # a crash: unlogged tables come back empty
        await asyncio.to_thread(services.pg_start)
        fanout = await make_fanout(listen=False)
    after = fanout.publish("lost:a", {"i": 2})
    assert offset_key(after) > offset_key(lost[-1])
    replay = await read_history(fanout, "lost:a", rendered)
    assert replay is None, f"since={rendered} replayed {offsets_of(replay)}, hiding the lost {lost}"


async def test_an_origin_held_while_its_topic_was_published_and_forgotten_gets_reset(
        make_fanout: MakeFanOut) -> None:
    """A page renders a topic's origin and is away while messages are published, pruned and the
    idle topic forgotten, then another is published: the topic reads as having only that one,
    but the page missed the others, so its origin gets None (reset), never a replay of only the
    new chain. Forgetting leaves nothing to tell the lost chain by: the origin's age does."""
    fanout = await make_fanout(listen=False, history_ttl=0.1, idle_expire=0.5)
    rendered = fanout.latest_offset("forgot:a")
    missed = [fanout.publish("forgot:a", {"i": i}) for i in range(3)]

    async def forgotten() -> bool:
        await fanout.prune()
        # A forgotten topic reads as one never published: its latest offset is an origin.
        return fanout.latest_offset("forgot:a") == fanout.latest_offset("forgot:never")

    await async_wait_for(forgotten, WAIT, message="the idle topic to be forgotten")
    again = fanout.publish("forgot:a", {"i": 3})
    replay = await read_history(fanout, "forgot:a", rendered)
    assert replay is None, f"the origin replayed {offsets_of(replay)} without {missed}, before {again}"



async def test_a_topic_is_kept_for_twice_the_history_ttl_when_that_is_longer_than_its_idle_time(
        make_fanout: MakeFanOut) -> None:
    """A topic is forgotten once idle for a day or for twice the TTL, whichever is longer: with a
    TTL past half the idle time, a topic idle for longer than that idle time but not yet twice
    the TTL is still known (its latest offset is its last message's, a replay from there holds
    nothing, not `reset`) once its messages are pruned, and its next message follows on."""
    fanout = await make_fanout(listen=False, history_ttl=1.0, idle_expire=0.2)
    last = fanout.publish("twice:ttl", {"i": 0})
    quiet_since = time.monotonic()

    async def past_the_ttl() -> bool:
        await fanout.prune()
        return time.monotonic() - quiet_since > 1.2

    await async_wait_for(past_the_ttl, WAIT, interval=0.05, message="the TTL to pass")
    assert fanout.latest_offset("twice:ttl") == last, "forgotten within twice the TTL"
    assert await read_history(fanout, "twice:ttl", last) == []
    after = fanout.publish("twice:ttl", {"i": 1})
    assert offsets_of(await read_history(fanout, "twice:ttl", last)) == [after]

async def test_a_topic_kept_by_keep_chains_outlives_its_idle_time_and_its_next_message_follows_on(
        make_fanout: MakeFanOut) -> None:
    """keep_chains() is what a server calls for the topics its subscribers watch: a topic kept
    more often than its idle time is not forgotten, however long nothing is published on it, and
    its next message follows its last offset (a replay from there holds just that message), while
    a topic nobody keeps is forgotten as before. A topic with no chain is passed over."""
    fanout = await make_fanout(listen=False, history_ttl=0.1, idle_expire=1)
    kept = fanout.publish("keep:a", {"i": 0})
    fanout.publish("keep:b", {"i": 0})
    quiet_since = time.monotonic()

    async def past_the_idle_time() -> bool:
        await fanout.keep_chains(["keep:a", "keep:never"])
        await fanout.prune()
        forgotten = fanout.latest_offset("keep:b") == fanout.latest_offset("keep:never")
        return forgotten and time.monotonic() - quiet_since > 2 * fanout.idle_expire

    await async_wait_for(past_the_idle_time, WAIT, interval=0.05, message="the topic nobody keeps to be forgotten")
    assert fanout.latest_offset("keep:a") == kept, "the kept topic was forgotten"
    after = fanout.publish("keep:a", {"i": 1})
    assert offsets_of(await read_history(fanout, "keep:a", kept)) == [after]


async def test_an_origin_from_before_the_origin_moved_on_still_replays_everything(make_fanout: MakeFanOut) -> None:
    """The origin moves on every half idle time (so that one held past the idle time is known
    stale): an origin given out just before, on a topic whose first message comes after, still
    replays that message, and on a topic still never published, replays nothing, without a reset."""
    fanout = await make_fanout(listen=False, history_ttl=0.1, idle_expire=4)
    rendered = fanout.latest_offset("moved:a")

    async def moved_on() -> bool:
        return await fanout.alatest_offset("moved:never") != rendered

    await async_wait_for(moved_on, WAIT, message="the origin to move on")
    current = fanout.latest_offset("moved:never")
    assert offset_key(rendered) < offset_key(current)
    first = fanout.publish("moved:a", {"i": 0})
    assert offset_key(current) < offset_key(first)
    assert offsets_of(await read_history(fanout, "moved:a", rendered)) == [first]
    assert await read_history(fanout, "moved:never", rendered) == []


# ---- connections: publish-only processes and lost listeners --------------------------------------


async def test_publish_only_holds_no_listening_connection(kind: str, make_fanout: MakeFanOut) -> None:
    """A fan-out that publishes and reads offsets but never listens holds no LISTEN / SUBSCRIBE connection."""
    fanout = await make_fanout(listen=False)
    fanout.publish("pubonly:a", {"n": 1})
    await fanout.apublish("pubonly:a", {"n": 2})
    fanout.latest_offset("pubonly:a")
    assert not fanout.listening
    url = getattr(fanout, "url", None)
    if kind == "postgres":
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute(
                """
                SELECT pid, application_name, query FROM pg_stat_activity
                WHERE datname = current_database() AND pid <> pg_backend_pid()
                  AND (application_name = 'livepush-listener' OR query ILIKE 'listen%%')
                """
            ).fetchall()
        assert rows == []
    elif kind == "redis":
        client = redis.Redis.from_url(url, decode_responses=True)
        try:
            clients = client.client_list()
        finally:
            client.close()
        subscribed = [c for c in clients if int(c.get("sub", 0)) or int(c.get("psub", 0)) or "P" in c.get("flags", "")]
        assert subscribed == []
        assert any(c.get("name") == "livepush-publisher" for c in clients), "the publisher's connection is there"


async def lost_listeners_fanout(kind: str, make_fanout: MakeFanOut, request: pytest.FixtureRequest
                                ) -> tuple[FanOut, Collector, PrivateRedis | None]:
    """A listening fan-out whose listener a test drops, a Collector registered on it, and, for
    Redis, the Redis of its own it runs on (the test may stop it or kill its subscription)."""
    server_only(kind)
    server: PrivateRedis | None = None
    if kind == "redis":
        server = request.getfixturevalue("private_redis")
        fanout = await make_fanout(url=server.url)
    else:
        fanout = await make_fanout()
    got = Collector(fanout)
    fanout.register(got)
    return fanout, got, server


async def test_lost_listener_reconnects_resyncs_and_history_covers_the_outage(
    kind: str, make_fanout: MakeFanOut, request: pytest.FixtureRequest
) -> None:
    """A lost listener goes not-listening, comes back, runs resync handlers, then delivers; history covers the gap."""
    fanout, got, server = await lost_listeners_fanout(kind, make_fanout, request)
    url: str = fanout.url  # type: ignore[attr-defined]
    resyncs: list[bool] = []
    resynced = asyncio.Event()

    def on_resync() -> None:
        resyncs.append(fanout.listening)
        resynced.set()

    fanout.on_resync(on_resync)

    # `listening` has no event of its own: sample it often enough to see a short outage.
    seen: list[bool] = [fanout.listening]

    async def sample() -> None:
        while True:
            if fanout.listening != seen[-1]:
                seen.append(fanout.listening)
            await asyncio.sleep(0.001)

    sampler = asyncio.create_task(sample(), name="listening-sampler")
    try:
        before = fanout.publish("loss:a", {"phase": "before"})
        await got.wait_count("loss:a", 1)

        during: list[str] = []
        if kind == "redis":
            assert server is not None
            server.stop(save=True)  # a restart of a Redis with persistence
            await async_wait_for(lambda: not fanout.listening, WAIT, message="listening to drop")
            server.start()
            # Published as soon as Redis is back, whether or not the listener is yet.
            during = [fanout.publish("loss:a", {"phase": "during", "i": i}) for i in range(3)]
        else:
            admin = request.getfixturevalue("pg_admin_url")
            killed = services.pg_terminate(admin, services.dbname_of(url), "livepush-listener")
            assert killed == 1, "the listener's backend is named livepush-listener"
            # Publishing does not need the listener.
            during = [fanout.publish("loss:a", {"phase": "during", "i": i}) for i in range(3)]
        await asyncio.wait_for(resynced.wait(), WAIT)
        assert fanout.listening
        assert seen[0] is True and False in seen, f"listening went {seen}, never False"
        assert resyncs == [True], "resync handlers run once, after the listener is back"

        after = await fanout.apublish("loss:a", {"phase": "after"})
        await got.wait(lambda _: after in [m.offset for m in got.on("loss:a")])

        replay = await read_history(fanout, "loss:a", before)
        assert replay is not None, "history covers the outage"
        assert offsets_of(replay) == [*during, after]
        assert [d["phase"] for d in datas_of(replay)] == ["during"] * 3 + ["after"]
    finally:
        sampler.cancel()


async def test_a_resync_handler_slow_to_catch_up_holds_up_no_delivery(
    kind: str, make_fanout: MakeFanOut, request: pytest.FixtureRequest
) -> None:
    """Once a lost listener is back, its resync handlers run in a task of their own
    (docs/architecture.md, Listener loss): a message published while one of them still waits
    (a slow read of history) is delivered meanwhile, not once that handler is done."""
    fanout, got, _ = await lost_listeners_fanout(kind, make_fanout, request)
    url: str = fanout.url  # type: ignore[attr-defined]
    resyncing, release = asyncio.Event(), asyncio.Event()

    async def slow_resync() -> None:
        resyncing.set()
        await release.wait()

    fanout.on_resync(slow_resync)
    try:
        if kind == "redis":
            admin = redis.Redis.from_url(url, socket_timeout=5)
            try:
                assert admin.client_kill_filter(_type="pubsub") == 1, "one subscription: the fan-out's"
            finally:
                admin.close()
        else:
            killed = services.pg_terminate(request.getfixturevalue("pg_admin_url"), services.dbname_of(url),
                                           "livepush-listener")
            assert killed == 1, "the listener's backend is named livepush-listener"
        await asyncio.wait_for(resyncing.wait(), WAIT)
        offset = await fanout.apublish("slowsync:a", {"i": 1})
        await got.wait(lambda _: offset in [m.offset for m in got.on("slowsync:a")])
    finally:
        release.set()


async def test_a_restarted_local_fan_out_resets_an_offset_of_the_process_before() -> None:
    """The local fan-out numbers a topic from 1 again in a new process: an offset of the process
    before gets `reset`, even once the new one has passed its number, never the new process's
    messages as if they followed it."""
    from livepush.fanout.local import LocalFanOut

    before, after = LocalFanOut(), LocalFanOut()
    old = [before.publish("restart:a", {"i": i}) for i in range(3)]
    new = [after.publish("restart:a", {"i": i}) for i in range(6)]
    assert await after.history("restart:a", old[1]) is None
    assert await after.history("restart:a", before.latest_offset("never:a")) is None
    assert offsets_of(await read_history(after, "restart:a", new[1])) == new[2:]


async def test_an_offset_of_another_topic_gets_reset(kind: str, make_fanout: MakeFanOut) -> None:
    """A page that resumes a topic with an offset of another one (one `since` rendered for two
    topics) has seen none of the topic's messages: it gets `reset` (None), since each topic's
    offsets carry an epoch of their own, never a replay of only the messages numbered past it."""
    if kind == "redis":
        pytest.skip("a stream id is Redis' clock: an id that another topic's entry of the same "
                    "millisecond also has is a place in this topic's chain too, and its replay is right")
    fanout = await make_fanout()
    fanout.publish("mixed:a", {"i": 0})
    held = fanout.publish("mixed:a", {"i": 1})
    origin = fanout.latest_offset("mixed:b")
    published = [fanout.publish("mixed:b", {"i": i}) for i in range(5)]
    assert await fanout.history("mixed:b", held) is None, "an offset of mixed:a skipped mixed:b's first messages"
    assert await fanout.history("mixed:never", held) is None
    assert offsets_of(await read_history(fanout, "mixed:b", origin)) == published
    assert offsets_of(await read_history(fanout, "mixed:b", published[1])) == published[2:]


async def test_a_topic_the_local_fan_out_holds_idle_is_forgotten_and_its_old_offsets_get_reset() -> None:
    """The local fan-out forgets a topic nothing was published on for its idle time once its
    messages are pruned, as Postgres and Redis do (docs/guarantees.md): a process serving many
    short-lived topics keeps none of them for ever. An offset from before gets `reset`, never a
    message of the topic's next chain under the same number; offsets never go backwards; an
    origin given out since the topic was forgotten replays it from its first message, and one
    held from before it was published gets `reset`, since it missed the forgotten chain."""
    from livepush.fanout.local import LocalFanOut

    # An idle time long enough for a fresh origin to stay good across a few statements.
    fanout = LocalFanOut(history_ttl=0.1, idle_expire=2)
    held = fanout.latest_offset("idle:a")
    old = [fanout.publish(f"idle:{t}", {"i": 1}) for t in ("a", "b", "c")]

    async def forgotten() -> bool:
        await fanout.prune()
        return not fanout._logs  # a forgotten topic holds no memory: what the forgetting is for

    await async_wait_for(forgotten, WAIT, message="the idle topics to be forgotten")
    origin = fanout.latest_offset("idle:never")
    assert [fanout.latest_offset(f"idle:{t}") for t in ("a", "b", "c")] == [origin] * 3
    assert await fanout.history("idle:a", old[0]) is None
    again = [fanout.publish("idle:a", {"i": 2}) for _ in range(2)]
    assert offset_key(again[0]) > offset_key(old[0])
    assert await fanout.history("idle:a", old[0]) is None, "the old offset is no place in the new chain"
    assert await fanout.history("idle:a", held) is None, f"the held origin replayed {again} without {old[0]}"
    assert offsets_of(await read_history(fanout, "idle:a", origin)) == again
    assert offsets_of(await read_history(fanout, "idle:a", again[0])) == again[1:]
