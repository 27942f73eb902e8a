"""One contract, three fan-outs: every test here runs against local, Postgres and Redis.

The contract is `livepush.fanout.base` (SPEC §4, §7). A test that cannot apply to one
fan-out (the local one has no server to lose, no other process to hear from) skips it and
says why.

Receivers and large payloads: a receiver may get `Message.data_json is None` when the
transport could not carry the payload (Postgres NOTIFY stops at 8000 bytes). The message
still has its offset and prev; the receiver must read the payload with
`history(topic, message.prev)`, whose first entry is that message. The hub does exactly
this; `payload_of()` below is the same rule, and every test reads payloads through it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

import livepush
from livepush.fanout.base import MAX_PAYLOAD_BYTES, FanOut
from livepush.types import Message, offset_key
from tests.support import services
from tests.support.procs import free_port
from tests.support.waiting import async_wait_for, wait_for

ROOT = Path(__file__).resolve().parent.parent
KINDS = ["local", "postgres", "redis"]
SERVER_KINDS = ("postgres", "redis")
WAIT = 10.0  # seconds: the bound on every wait for a delivery

MakeFanOut = Callable[..., Awaitable[FanOut]]


# ---- helpers ------------------------------------------------------------------------------------


class Collector:
    """A receiver that records messages and lets a test await a condition on them."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self._changed = asyncio.Event()

    def __call__(self, message: Message) -> None:
        self.messages.append(message)
        self._changed.set()

    def on(self, topic: str) -> list[Message]:
        return [m for m in self.messages if m.topic == topic]

    async def wait(self, predicate: Callable[[list[Message]], bool], timeout: float = WAIT) -> None:
        try:
            async with asyncio.timeout(timeout):
                while not predicate(self.messages):
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"timed out after {timeout} s; received {[(m.topic, m.offset) for m in self.messages]}") from None

    async def wait_count(self, topic: str, n: int, timeout: float = WAIT) -> list[Message]:
        await self.wait(lambda _: len(self.on(topic)) >= n, timeout)
        return self.on(topic)


async def payload_of(fanout: FanOut, message: Message) -> Any:
    """The message's data; read from history when the transport left it out (the contract)."""
    if message.data_json is not None:
        return json.loads(message.data_json)
    replay = await fanout.history(message.topic, message.prev)
    assert replay, f"{message.offset} was delivered without its payload and is not in history"
    assert replay[0].offset == message.offset
    assert replay[0].data_json is not None
    return json.loads(replay[0].data_json)


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
        pytest.importorskip("livepush.fanout.postgres", reason="livepush/fanout/postgres.py is not written yet")
        default_url = request.getfixturevalue("pg_url")
    elif kind == "redis":
        default_url = request.getfixturevalue("redis_url")
    made: list[FanOut] = []

    async def make(*, history_ttl: float = 300.0, listen: bool = True, url: str | None = None) -> FanOut:
        fanout: FanOut
        if kind == "local":
            from livepush.fanout.local import LocalFanOut

            fanout = LocalFanOut(history_ttl=history_ttl)
        elif kind == "postgres":
            from livepush.fanout.postgres import PostgresFanOut

            fanout = PostgresFanOut(url or default_url, history_ttl=history_ttl)  # type: ignore[arg-type]
        else:
            from livepush.fanout.redis import RedisFanOut

            fanout = RedisFanOut(url or default_url, history_ttl=history_ttl)  # type: ignore[arg-type]
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
        pytest.importorskip("livepush.fanout.postgres", reason="livepush/fanout/postgres.py is not written yet")
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
    """Sync and async publishes reach a receiver in publish order per topic, with rising offsets."""
    fanout = await make_fanout()
    got = Collector()
    fanout.register(got)
    sent: dict[str, list[tuple[str, Any]]] = {"order:a": [], "order:b": []}
    for i in range(40):
        topic = "order:a" if i % 3 else "order:b"
        data = {"i": i, "text": f"message {i} é"}
        offset = fanout.publish(topic, data) if i % 2 else await fanout.apublish(topic, data)
        sent[topic].append((offset, data))
    for topic, expected in sent.items():
        received = await got.wait_count(topic, len(expected))
        assert [m.offset for m in received] == [offset for offset, _ in expected]
        assert [await payload_of(fanout, m) for m in received] == [data for _, data in expected]
        keys = [offset_key(m.offset) for m in received]
        assert keys == sorted(keys) and len(set(keys)) == len(keys), "offsets must increase per topic"
        for before, after in zip(received, received[1:], strict=False):
            assert after.prev == before.offset, "prev names the message before on the topic"


async def test_publish_right_after_listen_is_received(make_fanout: MakeFanOut) -> None:
    """A message published the moment listen() returns is delivered: the subscription was in effect."""
    fanout = await make_fanout(listen=False)
    await fanout.listen()
    got = Collector()
    fanout.register(got)
    offset = await fanout.apublish("seam:first", {"n": 1})
    [message] = await got.wait_count("seam:first", 1)
    assert message.offset == offset


async def test_receiver_gets_messages_from_another_process(kind: str, make_fanout: MakeFanOut) -> None:
    """A receiver registered after listen() gets what a separate publish-only process publishes."""
    server_only(kind)
    fanout = await make_fanout()
    got = Collector()
    fanout.register(got)
    offsets = await publish_from_child(kind, fanout.url, "child:topic", 3)  # type: ignore[attr-defined]
    received = await got.wait_count("child:topic", 3)
    assert [m.offset for m in received] == offsets
    assert [await payload_of(fanout, m) for m in received] == [{"from": "child", "i": i} for i in range(3)]


async def test_conn_is_refused_without_postgres(kind: str, make_fanout: MakeFanOut) -> None:
    """publish(conn=...) on a fan-out other than Postgres raises ValueError and writes nothing."""
    if kind == "postgres":
        pytest.skip("conn= is the Postgres fan-out's own feature (tested with transactions)")
    fanout = await make_fanout()
    with pytest.raises(ValueError, match="Postgres"):
        fanout.publish("conn:topic", {"a": 1}, conn=object())
    with pytest.raises(ValueError, match="Postgres"):
        await fanout.apublish("conn:topic", {"a": 1}, conn=object())
    assert await fanout.history("conn:topic", fanout.latest_offset("conn:topic")) == []


# ---- payload size -------------------------------------------------------------------------------


async def test_payload_of_exactly_1_mib_arrives_intact(make_fanout: MakeFanOut) -> None:
    """A payload of exactly 1 MiB of JSON (multi-byte text included) is delivered and replayed intact."""
    fanout = await make_fanout()
    got = Collector()
    fanout.register(got)
    tail = "é€😀"  # 2, 3 and 4 bytes in UTF-8
    filler = MAX_PAYLOAD_BYTES - len('{"s":""}') - len(tail.encode("utf-8"))
    data = {"s": "x" * filler + tail}
    assert len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")) == MAX_PAYLOAD_BYTES
    small_before = fanout.publish("big:one", {"n": 0})
    offset = await fanout.apublish("big:one", data)
    fanout.publish("big:one", {"n": 2})
    received = await got.wait_count("big:one", 3)
    assert [m.offset for m in received][1] == offset
    assert await payload_of(fanout, received[1]) == data
    assert await payload_of(fanout, received[2]) == {"n": 2}, "order holds around a large message"
    replay = await fanout.history("big:one", small_before)
    assert replay is not None and replay[0].offset == offset
    assert json.loads(replay[0].data_json or "null") == data


async def test_payload_over_1_mib_is_refused_and_nothing_written(make_fanout: MakeFanOut) -> None:
    """2 MiB raises PayloadTooLarge (a ValueError) before anything is written or delivered."""
    fanout = await make_fanout()
    got = Collector()
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
    assert [m.offset for m in received][1] == marker, "nothing was delivered between the two"
    assert [m.offset for m in (await fanout.history("big:two", before) or [])] == [marker]


# ---- history and offsets ------------------------------------------------------------------------


async def test_history_returns_exactly_what_came_after(make_fanout: MakeFanOut) -> None:
    """history(since) returns every later message of the topic, in order, and nothing else."""
    fanout = await make_fanout()
    start = fanout.latest_offset("hist:a")
    offsets, datas = [], []
    for i in range(8):
        data = {"i": i}
        offsets.append(fanout.publish("hist:a", data) if i % 2 else await fanout.apublish("hist:a", data))
        datas.append(data)
        fanout.publish("hist:other", {"noise": i})
    for cut, since in enumerate([start, *offsets]):
        replay = await fanout.history("hist:a", since)
        assert replay is not None, f"since={since} is in history"
        assert [m.offset for m in replay] == offsets[cut:]
        assert [json.loads(m.data_json or "null") for m in replay] == datas[cut:]
        assert all(m.topic == "hist:a" for m in replay)
    assert await fanout.history("hist:a", offsets[-1]) == []


async def test_history_replays_1000_missed_messages(make_fanout: MakeFanOut) -> None:
    """A client away while 1,000 messages are published gets all of them from history, in order, once."""
    fanout = await make_fanout()
    since = fanout.latest_offset("away:a")
    offsets = [fanout.publish("away:a", {"i": i}) for i in range(1000)]
    replay = await fanout.history("away:a", since)
    assert replay is not None
    assert [m.offset for m in replay] == offsets
    assert [json.loads(m.data_json or "null")["i"] for m in replay] == list(range(1000))


async def test_history_of_unknown_or_garbage_offset_is_none(make_fanout: MakeFanOut) -> None:
    """An offset the topic never had, or that is no offset at all, gets None (the client resets)."""
    fanout = await make_fanout()
    offsets = [fanout.publish("hist:b", {"i": i}) for i in range(3)]
    other = fanout.publish("hist:c", {"i": 0})
    for since in ["garbage", "", "-1", "1.5", "--", "12x", "0-0-0", beyond(offsets[-1])]:
        assert await fanout.history("hist:b", since) is None, f"since={since!r}"
    assert await fanout.history("hist:never", beyond(other)) is None


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
    replay = await fanout.history("ttl:a", offsets[2])
    assert replay is not None and [m.offset for m in replay] == [fresh]
    assert await fanout.history("ttl:a", fresh) == []


async def test_latest_offset_closes_the_render_to_subscribe_gap(make_fanout: MakeFanOut) -> None:
    """latest_offset() is the last published offset; replaying from it yields what came after, or []."""
    fanout = await make_fanout()
    unknown = fanout.latest_offset("latest:new")
    assert await fanout.alatest_offset("latest:new") == unknown
    assert await fanout.history("latest:new", unknown) == [], "an unknown topic replays nothing, not reset"
    offsets = [fanout.publish("latest:a", {"i": i}) for i in range(3)]
    assert fanout.latest_offset("latest:a") == offsets[-1]
    assert await fanout.alatest_offset("latest:a") == offsets[-1]
    # A page rendered now embeds `rendered`; what is published before it subscribes is replayed.
    rendered = fanout.latest_offset("latest:new")
    late = await fanout.apublish("latest:new", {"late": True})
    replay = await fanout.history("latest:new", rendered)
    assert [m.offset for m in replay or []] == [late]


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


async def test_lost_listener_reconnects_resyncs_and_history_covers_the_outage(
    kind: str, make_fanout: MakeFanOut, request: pytest.FixtureRequest
) -> None:
    """A lost listener goes not-listening, comes back, runs resync handlers, then delivers; history covers the gap."""
    server_only(kind)
    server: PrivateRedis | None = None
    if kind == "redis":
        server = request.getfixturevalue("private_redis")
        fanout = await make_fanout(url=server.url)
    else:
        fanout = await make_fanout()
    url: str = fanout.url  # type: ignore[attr-defined]
    got = Collector()
    fanout.register(got)
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

        replay = await fanout.history("loss:a", before)
        assert replay is not None, "history covers the outage"
        assert [m.offset for m in replay] == [*during, after]
        assert [json.loads(m.data_json or "null")["phase"] for m in replay] == ["during"] * 3 + ["after"]
    finally:
        sampler.cancel()
