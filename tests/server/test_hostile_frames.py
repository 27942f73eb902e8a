"""What a buggy or hostile client may send (docs/protocol.md): each frame gets a documented
`error` naming what was wrong, or a documented close code, never a crash, a traceback in the
log, or a stall of the other connections."""

from __future__ import annotations

import json
import logging
import socket
import struct
from dataclasses import dataclass
from typing import Any

import pytest

from livepush import metrics
from tests.server.conftest import Served
from tests.support.rawws import BINARY, CLOSE, CONT, PING, PONG, TEXT, Heard, RawWS, frame, text
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient

AFTER = text('{"op":"ping","ref":"after"}')  # sent after every case: answered unless the case closed


@dataclass(frozen=True)
class Case:
    name: str
    sent: bytes
    texts: list[dict[str, Any]] | None = None  # the exact answers before the pong of AFTER
    error: tuple[str, str] | None = None  # or one `error`: its reason and a part of its detail
    close: tuple[int, str] | None = None  # or the close: its code and a part of its reason
    pongs: tuple[bytes, ...] = ()  # WebSocket pongs expected


def ping(ref: str) -> bytes:
    return text(json.dumps({"op": "ping", "ref": ref}))


def padded_ping(size: int) -> bytes:
    """A ping text frame of exactly `size` bytes."""
    start = '{"op":"ping","ref":"x","pad":"'
    return text(start + "a" * (size - len(start) - 2) + '"}')


CASES = [
    # Frames that are no JSON object.
    Case("a binary frame", frame(BINARY, b'{"op":"ping"}'), error=("bad_frame", "binary frames")),
    Case("a fragmented binary frame", frame(BINARY, b'{"op":', fin=False) + frame(CONT, b'"ping"}'),
         error=("bad_frame", "binary frames")),
    Case("invalid UTF-8", text(b'{"op":"ping","ref":"\xff"}'), close=(1007, "invalid start byte")),
    Case("a surrogate encoded in UTF-8", text(b'{"op":"ping","ref":"\xed\xa0\x80"}'), close=(1007, "invalid")),
    Case("an overlong UTF-8 encoding", text(b'{"op":"ping","ref":"\xc0\xaf"}'), close=(1007, "invalid")),
    Case("an empty text frame", text(""), error=("bad_frame", "not valid JSON: Expecting value at character 0")),
    Case("a byte order mark before the JSON", text('\ufeff{"op":"ping"}'), error=("bad_frame", "byte order mark")),
    Case("a JSON syntax error", text('{"op":"ping",}'), error=("bad_frame", "not valid JSON: Expecting property name")),
    Case("10,000 nested arrays", text("[" * 10000 + "]" * 10000), error=("bad_frame", "nested too deeply")),
    Case("10,000 nested objects", text('{"a":' * 10000 + "1" + "}" * 10000), error=("bad_frame", "nested too deeply")),
    Case("a ping with a field nested 10,000 deep", text('{"op":"ping","x":' + "[" * 10000 + "]" * 10000 + "}"),
         error=("bad_frame", "nested too deeply")),
    Case("a ref of 10**5000 in digits", text('{"op":"ping","ref":1' + "0" * 5000 + "}"),
         error=("bad_frame", "a number of more than 4300 digits")),
    Case("a JSON array", text("[1,2]"), error=("bad_frame", "a JSON object")),
    Case("a JSON string", text('"ping"'), error=("bad_frame", "a JSON object")),
    Case("a JSON number", text("42"), error=("bad_frame", "a JSON object")),
    # Names given twice: which one counts differs from one JSON reader to the next.
    Case("op given twice", text('{"op":"fly","op":"ping","ref":1}'), error=("bad_frame", '"op" twice')),
    Case("topic given twice", text('{"op":"subscribe","topic":"a","topic":"b","ref":1}'),
         error=("bad_frame", '"topic" twice')),
    Case("a name twice in a field no op reads", text('{"op":"ping","ref":1,"x":{"y":1,"y":2}}'),
         error=("bad_frame", '"y" twice')),
    # Unknown or missing ops.
    Case("an unknown op", text('{"op":"fly"}'), error=("unknown_op", "'fly'")),
    Case("a very long unknown op", text('{"op":"' + "x" * 60000 + '"}'), error=("unknown_op", "x" * 40 + "'")),
    Case("an op that is a lone surrogate", text('{"op":"\\ud800"}'), error=("unknown_op", "\\ud800")),
    Case("an op that is no string", text('{"op":["ping"]}'), error=("bad_frame", '"op" must be a string')),
    Case("an op that is null", text('{"op":null}'), error=("bad_frame", '"op" must be a string')),
    Case("no op", text('{"ref":1}'), error=("bad_frame", 'missing "op"')),
    # Fields of the wrong type.
    Case("since as a number", text('{"op":"subscribe","topic":"a","since":17}'), error=("bad_frame", '"since"')),
    Case("since negative", text('{"op":"subscribe","topic":"a","since":-1}'), error=("bad_frame", '"since"')),
    Case("since as a float", text('{"op":"subscribe","topic":"a","since":1.5}'), error=("bad_frame", '"since"')),
    Case("since as a boolean", text('{"op":"subscribe","topic":"a","since":true}'), error=("bad_frame", '"since"')),
    Case("since too long", text('{"op":"subscribe","topic":"a","since":"' + "1" * 101 + '"}'),
         error=("bad_frame", "too long to be an offset")),
    Case("a topic that is a number", text('{"op":"subscribe","topic":5}'), error=("bad_frame", '"topic"')),
    Case("a list of topics", text('{"op":"subscribe","topic":[' + ",".join(["0"] * 30000) + "]}"),
         error=("bad_frame", '"topic" as a string')),
    Case("a list of 100,000 topics", text('{"op":"subscribe","topic":[' + ",".join(['"a"'] * 100000) + "]}"),
         close=(1009, "exceeds limit of 65536 bytes")),
    Case("an unsubscribe without a string topic", text('{"op":"unsubscribe","topic":null}'),
         error=("bad_frame", '"topic"')),
    Case("a ref that is a list", text('{"op":"ping","ref":[1]}'), error=("bad_frame", "ref must be")),
    Case("a ref that is a boolean", text('{"op":"ping","ref":false}'), error=("bad_frame", "ref must be")),
    Case("a ref longer than 200 characters", text('{"op":"ping","ref":"' + "r" * 201 + '"}'),
         error=("bad_frame", "longer than 200")),
    Case("a ref that is a lone surrogate", text('{"op":"ping","ref":"\\udc00"}'), error=("bad_frame", "surrogate")),
    # Numbers no JSON can carry back.
    Case("a ref of 1e400", text('{"op":"ping","ref":1e400}'), error=("bad_frame", "finite number")),
    Case("a ref that is NaN", text('{"op":"ping","ref":NaN}'), error=("bad_frame", "JSON has no NaN")),
    Case("a ref of -Infinity", text('{"op":"ping","ref":-Infinity}'), error=("bad_frame", "JSON has no NaN")),
    Case("NaN in a field no op reads", text('{"op":"ping","ref":1,"x":NaN}'), error=("bad_frame", "JSON has no NaN")),
    Case("Infinity in a field no op reads", text('{"op":"ping","ref":1,"x":[Infinity]}'),
         error=("bad_frame", "JSON has no NaN")),
    Case("a ref of the largest float", text('{"op":"ping","ref":1e308}'), texts=[{"op": "pong", "ref": 1e308}]),
    # Topics no rule can match.
    Case("a 60,000 character topic", text('{"op":"subscribe","topic":"' + "a" * 60000 + '","ref":1}'),
         texts=[{"op": "refused", "ref": 1, "reason": "invalid_topic"}]),
    Case("a 60,000 character signed topic", text('{"op":"subscribe","topic":"' + "a" * 30000 + "~" + "b" * 30000 + '","ref":1}'),
         texts=[{"op": "refused", "ref": 1, "reason": "invalid_signature"}]),
    Case("a signed topic with a lone surrogate", text('{"op":"subscribe","topic":"room:\\ud800~abc","ref":1}'),
         texts=[{"op": "refused", "ref": 1, "reason": "invalid_signature"}]),
    Case("a topic with a NUL", text('{"op":"subscribe","topic":"room:\\u0000","ref":1}'),
         texts=[{"op": "refused", "ref": 1, "reason": "invalid_topic"}]),
    Case("an unsubscribe of a 60,000 character topic", text('{"op":"unsubscribe","topic":"' + "a" * 60000 + '"}'),
         texts=[]),
    # WebSocket control frames.
    Case("a ping with a 125 byte payload", frame(PING, b"p" * 125), texts=[], pongs=(b"p" * 125,)),
    Case("a ping with a 126 byte payload", frame(PING, b"p" * 126), close=(1002, "control frame too long")),
    Case("a fragmented ping", frame(PING, b"p", fin=False), close=(1002, "fragmented control frame")),
    Case("a pong no ping asked for", frame(PONG, b"unasked"), texts=[]),
    Case("a close with code 999", frame(CLOSE, struct.pack("!H", 999)), close=(1002, "invalid status code")),
    Case("a close whose reason is not UTF-8", frame(CLOSE, struct.pack("!H", 1000) + b"\xff"), close=(1007, "invalid")),
    # Fragments.
    Case("a text frame in two fragments", text('{"op":"ping","ref":', fin=False) + frame(CONT, '"two"}'),
         texts=[{"op": "pong", "ref": "two"}]),
    Case("a text frame in 150 fragments",
         text('{"op":"ping","ref":"', fin=False) + b"".join(frame(CONT, "f", fin=False) for _ in range(150))
         + frame(CONT, '"}'), texts=[{"op": "pong", "ref": "f" * 150}]),
    Case("a character split between fragments", text(b'{"op":"ping","ref":"\xc3', fin=False) + frame(CONT, b'\xa9"}'),
         texts=[{"op": "pong", "ref": "\u00e9"}]),
    Case("a ping between fragments", text('{"op":"ping",', fin=False) + frame(PING, b"mid") + frame(CONT, '"ref":"m"}'),
         texts=[{"op": "pong", "ref": "m"}], pongs=(b"mid",)),
    Case("a continuation with nothing to continue", frame(CONT, b"x"), close=(1002, "unexpected continuation")),
    Case("a text frame inside a fragmented one", text("{", fin=False) + text("{}"), close=(1002, "expected a continuation")),
    Case("fragments over 64 KiB together", text("x" * 40000, fin=False) + frame(CONT, "x" * 30000),
         close=(1009, "exceeds limit of 65536 bytes")),
    # Frames at the size limit.
    Case("a frame of exactly 64 KiB", padded_ping(65536), texts=[{"op": "pong", "ref": "x"}]),
    Case("a frame one byte over 64 KiB", padded_ping(65537), close=(1009, "exceeds limit of 65536 bytes")),
    # What RFC 6455 refuses.
    Case("an unmasked frame", frame(TEXT, '{"op":"ping"}', masked=False), close=(1002, "incorrect masking")),
    Case("a reserved bit set", frame(TEXT, '{"op":"ping"}', rsv1=True), close=(1002, "reserved bits")),
    Case("a reserved opcode", frame(0x3, b"x"), close=(1002, "invalid opcode")),
]


def warnings_in(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the server logged that no client may cause: a warning, an error, a traceback."""
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


def check(case: Case, heard: Heard) -> None:
    if case.close is not None:
        code, reason = case.close
        assert heard.ended and heard.close_code == code and reason in heard.close_reason, heard
        return
    assert not heard.ended, heard
    if case.error is not None:
        reason, detail = case.error
        assert len(heard.texts) == 1, heard
        answer = heard.texts[0]
        assert (answer["op"], answer["reason"]) == ("error", reason) and detail in answer["detail"], answer
    else:
        assert heard.texts == case.texts, heard
    assert tuple(heard.pongs) == case.pongs, heard


# These frames never reach a fan-out's history: the local fan-out is enough.
@pytest.mark.parametrize("fanout_kind", ["local"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_a_hostile_frame_gets_a_documented_answer_and_stalls_no_one(
        served: Served, case: Case, caplog: pytest.LogCaptureFixture) -> None:
    """Each frame gets its documented `error` (the connection then answers its next ping) or close code,
    the log holds no warning and no traceback, and a bystander's subscription goes on."""
    caplog.set_level(logging.DEBUG)
    bystander = await WSClient.open(served.url)
    topic = served.sign("room:bystander")
    assert (await bystander.subscribe(topic))["op"] == "subscribed"
    client = await RawWS.open(served.server.port)
    await client.send(case.sent + AFTER)
    check(case, await client.until_pong("after", control_pongs=len(case.pongs)))
    await served.publish("room:bystander", {"after": case.name})
    assert (await bystander.messages(1))[0]["data"] == {"after": case.name}
    await client.close()
    await bystander.close()
    await async_wait_for(lambda: not served.server.clients, 5, message="both connections to go")
    assert not warnings_in(caplog), caplog.text


ODD_OFFSETS = ["", "-", "--", "abc", "-1", "1.5", "1e5", "\u00b2-1", "\u0661-\u0661", "9" * 50, "9" * 40 + "-" + "9" * 40,
               "0-0", "1-2-3", "18446744073709551616-1", "1-18446744073709551616", "9223372036854775808-1",
               "1-9223372036854775808", "99999999999999999999-1", " 1-1", "1-1\n", "\ud800", "null", "0"]


async def test_a_since_that_is_no_offset_gets_subscribed_and_reset_on_every_fan_out(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """A `since` of any string a client may send (signs, other digits, numbers past 64 bits,
    blanks) is an unknown offset: `subscribed` then `reset`, never `unavailable`, and no warning."""
    caplog.set_level(logging.DEBUG)
    topic = served.sign("room:odd")
    await served.publish("room:odd", {"n": 1})
    client = await WSClient.open(served.url)
    for ref, since in enumerate(ODD_OFFSETS):
        await client.send({"op": "subscribe", "topic": topic, "since": since, "ref": ref})
        answer = await client.recv()
        assert (answer["op"], answer["ref"]) == ("subscribed", ref), (since, answer)
        assert await client.recv() == {"op": "reset", "topic": "room:odd", "ref": ref}, since
        # Subscribed again, the connection's stream would go on from where it stands (docs/protocol.md).
        await client.send({"op": "unsubscribe", "topic": topic})
    await client.send({"op": "ping", "ref": "after"})
    assert await client.recv() == {"op": "pong", "ref": "after"}
    await client.close()
    assert not warnings_in(caplog), caplog.text


async def test_a_storm_of_subscribes_and_unsubscribes_on_one_connection_leaves_nothing_behind(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """300 subscribes to one topic (replays among them), each followed by its unsubscribe, and 50
    subscribes of other topics unsubscribed at once, in one write: every subscribe gets one
    answer, the connection hears nothing of the topics afterwards, the server holds no
    subscription of it, and a bystander's messages go on."""
    caplog.set_level(logging.DEBUG)
    subscriptions = metrics.SUBSCRIPTIONS._value.get()
    bystander = await WSClient.open(served.url)
    assert (await bystander.subscribe(served.sign("room:calm")))["op"] == "subscribed"
    first = await served.publish("room:storm", {"n": 0})
    for n in range(1, 4):
        await served.publish("room:storm", {"n": n})
    storm = served.sign("room:storm")
    others = [served.sign(f"room:other{n}") for n in range(50)]
    frames: list[dict[str, Any]] = []
    for ref in range(300):
        frames.append({"op": "subscribe", "topic": storm, "since": first if ref % 2 else None, "ref": ref})
        frames.append({"op": "unsubscribe", "topic": storm})
    for ref, topic in enumerate(others, 300):
        frames += [{"op": "subscribe", "topic": topic, "ref": ref}, {"op": "unsubscribe", "topic": topic}]
    client = await RawWS.open(served.server.port)
    await client.send(b"".join(text(json.dumps(f)) for f in frames) + AFTER)
    heard = await client.until_pong("after", timeout=30)
    answers = [f["ref"] for f in heard.texts if f["op"] in ("subscribed", "refused")]
    assert answers == list(range(350)), heard.texts[:5]
    assert {f["op"] for f in heard.texts} <= {"subscribed", "refused", "message", "reset"}, heard.texts
    await served.publish("room:storm", {"n": "late"})
    await served.publish("room:calm", {"n": "calm"})
    assert (await bystander.messages(1))[0]["data"] == {"n": "calm"}
    await client.send(ping("last"))
    assert (await client.until_pong("last")).texts == []  # nothing of room:storm after its last unsubscribe
    stormed = {"room:storm", *(f"room:other{n}" for n in range(50))}
    await async_wait_for(lambda: not stormed & served.server.hub._topics.keys(), 5,
                         message="the hub to forget the topics no one follows")
    assert metrics.SUBSCRIPTIONS._value.get() == subscriptions + 1  # the bystander's
    await client.close()
    await bystander.close()
    assert not warnings_in(caplog), caplog.text


@pytest.mark.parametrize("fanout_kind", ["local"])
async def test_frames_that_come_a_byte_at_a_time_are_answered_as_whole_ones(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """A subscribe, a message in fragments and a ping, each byte in its own TCP segment, get the
    answers they get in one write."""
    caplog.set_level(logging.DEBUG)
    client = await RawWS.open(served.server.port)
    client.writer.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    subscribe = json.dumps({"op": "subscribe", "topic": served.sign("room:bytes"), "since": None, "ref": "s"})
    sent = text(subscribe) + text('{"op":"ping",', fin=False) + frame(CONT, '"ref":"frag"}') + AFTER
    for byte in sent:
        await client.send(bytes((byte,)))
    heard = await client.until_pong("after")
    assert [f["op"] for f in heard.texts] == ["subscribed", "pong"] and heard.texts[1]["ref"] == "frag", heard
    await client.close()
    assert not warnings_in(caplog), caplog.text


async def test_a_storm_on_state_topics_leaves_nothing_behind(served_jobs: Served, caplog: pytest.LogCaptureFixture) -> None:
    """Subscribes to job, group and workflow topics no row has (and with odd `since`s), each
    unsubscribed at once or not: every one gets one answer, and once the connection is gone the
    server watches none of them."""
    caplog.set_level(logging.DEBUG)
    frames: list[dict[str, Any]] = []
    for ref in range(90):
        topic = served_jobs.sign(f"{('job', 'group', 'workflow')[ref % 3]}:{ref + 1}")
        since = (None, "abc", "1", "99999999999999999999", "")[ref % 5]
        frames.append({"op": "subscribe", "topic": topic, "since": since, "ref": ref})
        if ref % 2:
            frames.append({"op": "unsubscribe", "topic": topic})
    client = await RawWS.open(served_jobs.server.port)
    await client.send(b"".join(text(json.dumps(f)) for f in frames) + AFTER)
    heard = await client.until_pong("after", timeout=30)
    assert [(f["op"], f["ref"], f["offset"]) for f in heard.texts] == [("subscribed", ref, None) for ref in range(90)]
    await client.close()
    hub = served_jobs.server.hub
    await async_wait_for(lambda: not hub._topics and not hub._unborn, 5, message="the hub to watch nothing")
    assert not warnings_in(caplog), caplog.text
