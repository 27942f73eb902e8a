"""Whatever text reaches a parser, nothing escapes: every notification parser (Postgres and Redis),
the client frame parser and the handshake's checks take arbitrary input without raising, and what
they let through is well formed. Against real servers: garbage on every channel, in client frames
and in HTTP requests stops nothing, loops nothing, and the next real message is delivered."""

from __future__ import annotations

import asyncio
import logging
import re

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from livepush import protocol, sessions, topics
from livepush.errors import InvalidSession, InvalidTopic
from livepush.fanout.postgres import parse_doorbell, parse_offset
from livepush.fanout.redis import parse_frames
from livepush.jobs.events.source import parse_ring
from livepush.jobs.runtime.runtime import parse_ids
from livepush.sessions import decode
from livepush.sessions.handshake import duplicated_header, extract_tokens, origin_allowed
from livepush.types import offset_key
from tests.server.conftest import make_settings, start_served
from tests.support.http import upgrade_headers
from tests.support.security import raw_request
from tests.support.wsclient import WSClient

TOPIC = re.compile(r"[A-Za-z0-9_.:/-]{1,200}")
# Text that looks like what the parsers read, and text that does not.
near = st.text(alphabet="0123456789-: \n,jobgrup²１\x00xé~", max_size=60)
anything = st.one_of(st.text(max_size=300), near)
SOME = settings(max_examples=300, deadline=None)
FEW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SOME
@given(anything)
def test_the_postgres_doorbell_parser_takes_anything(payload: str) -> None:
    """parse_doorbell never raises, and every message it gives has a plain topic and ASCII offsets."""
    for m in parse_doorbell(payload):
        assert TOPIC.fullmatch(m.topic) and m.data_json is None
        assert parse_offset(m.offset) is not None and parse_offset(m.prev) is not None
        assert offset_key(m.prev) < offset_key(m.offset)


@SOME
@given(anything)
def test_the_state_ring_parser_takes_anything(payload: str) -> None:
    """parse_ring never raises and names only canonical job and group topics, and id ranges
    that are not empty and stay within a bigint."""
    ring = parse_ring(payload)
    for topic, version in ring.changed:
        assert topics.state_topic_id(topic) is not None and topic.split(":")[0] in ("job", "group")
        assert version is None or version >= 0
    for prefix, first, last in ring.created:
        assert prefix in ("job:", "group:") and 1 <= first <= last <= 2**63 - 1


@SOME
@given(anything)
def test_the_cancel_and_group_progress_parser_takes_anything(payload: str) -> None:
    """parse_ids never raises and gives non-negative ints only."""
    assert all(isinstance(i, int) and i >= 0 for i in parse_ids(payload, "livepush_jobs_cancel"))


def test_the_ids_parser_drops_ids_no_row_can_have() -> None:
    """An id past the bigint range (19 digits fit the pattern) is dropped, not handed on: read
    against the rows it failed the whole statement, and the cancel of a real id named beside it
    waited for the heartbeat."""
    assert parse_ids(f"7,{2**63},{2**63 - 1},9999999999999999999", "livepush_jobs_cancel") == [7, 2**63 - 1]


@pytest.mark.parametrize("name", ["room a", "room:é", 'room"x', "room\\x", "a" * 201, ""],
                         ids=["a space", "non-ascii", "a quote", "a backslash", "201 characters", "empty"])
def test_a_doorbell_naming_no_topic_is_dropped(name: str) -> None:
    """A doorbell whose topic no client could subscribe to (a character no topic has, or too
    long) names nothing: it is no ring, whatever its offset."""
    assert parse_doorbell(f"1-1 {name}") == []


@pytest.mark.parametrize("digit", ["１", "٣", "²"], ids=["fullwidth one", "arabic-indic three", "superscript two"])
def test_digits_that_are_not_ascii_name_nothing_on_any_channel(digit: str) -> None:
    """Only ASCII digits count in a notification: `１` and `٣`, which int() reads as 1 and 3, name no
    offset, id or version any more than `²`, which int() refuses."""
    assert parse_doorbell(f"{digit}-1 room:a") == parse_doorbell(f"1-{digit} room:a") == []
    assert parse_offset(f"{digit}-1") is None and parse_offset(f"1-{digit}") is None
    for line in (f"job:{digit}", f"job:1 {digit}", f"job:1-{digit}", f"group:{digit}"):
        ring = parse_ring(line)
        assert ring.changed == [] and ring.created == [], line
    assert parse_ids(digit, "livepush_jobs_cancel") == parse_ids(f"1,{digit}", "livepush_jobs_cancel") == []


@SOME
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_the_redis_frame_parser_takes_anything(raw: bytes) -> None:
    """parse_frames never raises; each message of a frame it accepts has a plain topic and stream ids."""
    for m in parse_frames(raw) or []:
        assert TOPIC.fullmatch(m.topic) and offset_key(m.offset) and m.data_json


@SOME
@given(st.one_of(st.text(max_size=500), st.binary(max_size=200)))
def test_the_frame_parser_takes_anything(raw: str | bytes) -> None:
    """protocol.parse answers every frame with a command or a BadFrame, never an exception."""
    assert isinstance(protocol.parse(raw), (protocol.Subscribe, protocol.Unsubscribe, protocol.Ping, protocol.BadFrame))


@SOME
@given(st.text(max_size=60))
def test_offsets_tokens_and_signed_topics_refuse_cleanly(text: str) -> None:
    """offset_key raises only ValueError; decode only InvalidSession; verify only InvalidTopic."""
    for call, allowed in ((lambda: offset_key(text), ValueError),
                          (lambda: decode(text, ("k" * 40,)), InvalidSession),
                          (lambda: topics.verify(text, ("k" * 40,)), InvalidTopic)):
        try:
            call()
        except allowed:
            pass


headers = st.lists(st.tuples(st.sampled_from(["Origin", "Host", "Cookie", "Upgrade", "Sec-WebSocket-Protocol", "X"]),
                             st.text(max_size=80)), max_size=8)


@SOME
@given(headers, st.text(max_size=80), st.none() | st.lists(st.text(max_size=30), max_size=3).map(tuple))
def test_the_handshake_checks_take_anything(hs: list[tuple[str, str]], path: str, allowed: tuple[str, ...] | None) -> None:
    """duplicated_header, extract_tokens and origin_allowed decide on any headers and path without raising."""
    duplicated_header(hs)
    extract_tokens(hs, path)
    extract_tokens(hs, path, cookies=False, query=False)
    assert origin_allowed(hs, allowed) in (True, False)


# -- against real servers --------------------------------------------------------------------

@FEW
@given(st.lists(anything, min_size=1, max_size=15))
def test_garbage_on_every_postgres_channel_stops_nothing(pg_url: str, secret: str, payloads: list[str]) -> None:
    """After arbitrary notifications on every livepush channel, the server still listens and delivers the next real message, and only it."""
    async def body() -> None:
        served = await start_served(make_settings("postgres", secret, pg_url, None))
        try:
            client = await WSClient.open(served.url)
            await client.subscribe(served.sign("room:fuzz"))
            with psycopg.connect(pg_url, autocommit=True) as conn:
                for channel in ("livepush", "livepush_states", "livepush_revocations", "livepush_jobs_cancel"):
                    for payload in payloads:
                        conn.execute("SELECT pg_notify(%s, %s)", (channel, payload.replace("\x00", "")[:7000]))
            offset = await served.publish("room:fuzz", {"real": True})
            (m,) = await client.messages(1)
            assert (m["offset"], m["data"]) == (offset, {"real": True}) and served.server.listening
            await client.close()
        finally:
            await served.stop()

    asyncio.run(body())


@FEW
@given(st.lists(st.binary(max_size=120), min_size=1, max_size=15))
def test_garbage_on_the_redis_channel_stops_nothing(redis_url: str, secret: str, frames: list[bytes]) -> None:
    """After arbitrary frames on the deployment's Redis channel, the next real message is delivered."""
    import redis

    async def body() -> None:
        served = await start_served(make_settings("redis", secret, None, redis_url))
        try:
            client = await WSClient.open(served.url)
            await client.subscribe(served.sign("room:fuzz"))
            raw = redis.Redis.from_url(redis_url)
            for frame in frames:
                raw.publish(served.fanout.channel, frame)  # type: ignore[attr-defined]
            raw.close()
            offset = await served.publish("room:fuzz", {"real": True})
            frames_seen = []
            while not frames_seen or frames_seen[-1]["offset"] != offset:
                frames_seen.append((await client.messages(1))[0])
            assert frames_seen[-1]["data"] == {"real": True} and served.server.listening
            await client.close()
        finally:
            await served.stop()

    asyncio.run(body())


async def test_near_misses_on_the_redis_channels_are_dropped_with_a_debug_line_and_stop_nothing(
        redis_url: str, secret: str, caplog: pytest.LogCaptureFixture) -> None:
    """Frames on the deployment's Redis message channel that are almost one of ours (a line short,
    a topic or an offset no message has, a batch cut off, a non-ASCII topic, 3 MiB of junk) and
    junk on its revocation channel: each dropped frame is named in a debug line, nothing is
    delivered and no session closed, nothing is logged as a warning, and the next real message
    arrives."""
    import redis

    caplog.set_level(logging.DEBUG, logger="livepush")
    served = await start_served(make_settings("redis", secret, None, redis_url))
    try:
        token = sessions.issue("erin")
        client = await WSClient.open(served.url, additional_headers={"Cookie": f"livepush_session={token}"})
        await client.subscribe(served.sign("room:near"))
        first = await served.publish("room:near", {"n": 1})
        await client.messages(1)
        near_misses = [f"room:near\n{first}\n{first}".encode(), b"room:near\n1-2-3\n1-1\n{}",
                       b"room near\n1-2\n1-1\n{}", "room:né\n1-2\n1-1\n{}".encode(), b"room:near\n1-2\n1-1\n",
                       b"*\nroom:near\n1-2\n1-1\n{}\nroom:near\n1-3", b"\xff\xfe", b"x" * (3 << 20)]
        with redis.Redis.from_url(redis_url) as raw:
            for frame in near_misses:
                raw.publish(served.fanout.channel, frame)  # type: ignore[attr-defined]
            for ring in (b"\xff" * (2 << 20), b"canary", b"canary " + b"x" * 100):
                raw.publish(served.server.store.channel, ring)  # type: ignore[attr-defined]
        last = await served.publish("room:near", {"n": 2})
        (message,) = await client.messages(1)
        assert (message["offset"], message["data"]) == (last, {"n": 2})
        await client.send({"op": "ping", "ref": 1})
        assert await client.recv() == {"op": "pong", "ref": 1}
        dropped = [r.getMessage() for r in caplog.records if "dropped a malformed frame" in r.getMessage()]
        assert len(dropped) == len(near_misses), dropped
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert served.server.listening
        await client.close()
    finally:
        await served.stop()


@FEW
@given(st.lists(st.text(max_size=200), min_size=1, max_size=10))
def test_garbage_client_frames_are_answered_and_the_connection_stays(secret: str, frames: list[str]) -> None:
    """Up to ten arbitrary frames from a client each get an answer or nothing, never a crash; the connection then still answers a ping."""
    async def body() -> None:
        served = await start_served(make_settings("local", secret, None, None))
        try:
            client = await WSClient.open(served.url)
            for frame in frames:
                await client.send(frame)
            await client.send({"op": "ping", "ref": "last"})
            while True:
                answer = await client.recv()
                if answer == {"op": "pong", "ref": "last"}:
                    break
                assert answer["op"] in ("error", "subscribed", "refused", "pong", "message", "reset"), answer
            await client.close()
        finally:
            await served.stop()

    asyncio.run(body())


@FEW
@given(st.lists(st.tuples(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=":"),
                                  min_size=1, max_size=20),
                          st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=60)),
                max_size=10))
def test_arbitrary_http_requests_never_get_a_500(secret: str, hs: list[tuple[str, str]]) -> None:
    """A request with arbitrary headers gets a 1xx, 2xx, 3xx or 4xx answer (or is dropped), never a 5xx, and the server keeps serving."""
    async def body() -> None:
        served = await start_served(make_settings("local", secret, None, None))
        try:
            port = served.server.port

            answer = await asyncio.to_thread(raw_request, port, upgrade_headers(port) + list(hs))
            assert not answer.startswith(b"HTTP/1.1 5"), answer
            client = await WSClient.open(served.url)
            await client.close()
        finally:
            await served.stop()

    asyncio.run(body())
