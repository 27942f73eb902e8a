"""The wire protocol as pure code: every client frame maps to a command or a BadFrame."""

from __future__ import annotations

import json

import pytest

from livepush import protocol
from livepush.protocol import BadFrame, Ping, Subscribe, Unsubscribe


def test_subscribe_frame_is_parsed_with_since_and_ref() -> None:
    """A well-formed subscribe keeps its topic, since and ref."""
    assert protocol.parse('{"op":"subscribe","topic":"a:b","since":"4","ref":7}') == Subscribe("a:b", "4", 7)
    assert protocol.parse('{"op":"subscribe","topic":"a:b"}') == Subscribe("a:b", None, None)


def test_unsubscribe_and_ping_frames_are_parsed() -> None:
    """unsubscribe carries a topic; ping carries the ref echoed in pong."""
    assert protocol.parse('{"op":"unsubscribe","topic":"a"}') == Unsubscribe("a")
    assert protocol.parse('{"op":"ping","ref":"x"}') == Ping("x")


@pytest.mark.parametrize(
    "raw,reason",
    [
        ("not json", "bad_frame"),
        ("[1,2]", "bad_frame"),
        ('"text"', "bad_frame"),
        ("{}", "bad_frame"),
        ('{"op":5}', "bad_frame"),
        ('{"op":"dance"}', "unknown_op"),
        ('{"op":"subscribe"}', "bad_frame"),
        ('{"op":"subscribe","topic":5}', "bad_frame"),
        ('{"op":"subscribe","topic":"a","since":5}', "bad_frame"),
        ('{"op":"subscribe","topic":"a","ref":{"x":1}}', "bad_frame"),
        ('{"op":"subscribe","topic":"a","ref":true}', "bad_frame"),
        ('{"op":"ping","ref":"\\ud800"}', "bad_frame"),
        ('{"op":"unsubscribe"}', "bad_frame"),
        (b"\x00\x01", "bad_frame"),
        ("[" * 100000, "bad_frame"),
    ],
)
def test_malformed_frames_become_bad_frames_never_exceptions(raw: str | bytes, reason: str) -> None:
    """Anything malformed is a BadFrame with a reason and a detail; parse never raises."""
    cmd = protocol.parse(raw)
    assert isinstance(cmd, BadFrame) and cmd.reason == reason and cmd.detail


def test_message_frame_embeds_the_payload_text_unchanged() -> None:
    """The message frame is valid JSON built around the published JSON text."""
    frame = protocol.message("chat:x", "12", '{"text":"h\\u00e9 \\"q\\""}')
    assert json.loads(frame) == {"op": "message", "topic": "chat:x", "offset": "12", "data": {"text": 'hé "q"'}}


def test_hello_says_a_whole_heartbeat_as_an_integer() -> None:
    """hello carries the server's heartbeat of 25.0 s as `25`, as documented: a client that reads it
    into an integer type fails on `25.0`; a fraction of a second stays a fraction."""
    assert protocol.hello(None, 25.0) == '{"op":"hello","session":null,"heartbeat":25}'
    assert json.loads(protocol.hello(None, 0.4))["heartbeat"] == 0.4


def test_server_frames_have_the_spec_shapes() -> None:
    """hello, subscribed, refused, reset, pong and error frames match docs/reference.md §5."""
    assert json.loads(protocol.hello("u1", 25)) == {"op": "hello", "session": {"subject": "u1"}, "heartbeat": 25}
    assert json.loads(protocol.hello(None, 25))["session"] is None
    assert json.loads(protocol.subscribed(1, "a", "3")) == {"op": "subscribed", "ref": 1, "topic": "a", "offset": "3"}
    # A state topic with no row yet (no such job) is subscribed at offset null.
    assert json.loads(protocol.subscribed(2, "job:9", None)) == {"op": "subscribed", "ref": 2, "topic": "job:9", "offset": None}
    assert json.loads(protocol.refused("r", "limit")) == {"op": "refused", "ref": "r", "reason": "limit"}
    assert json.loads(protocol.refused("r", "unavailable")) == {"op": "refused", "ref": "r", "reason": "unavailable"}
    assert json.loads(protocol.reset("a")) == {"op": "reset", "topic": "a"}
    assert json.loads(protocol.reset("a", "r1")) == {"op": "reset", "topic": "a", "ref": "r1"}
    assert json.loads(protocol.pong(None)) == {"op": "pong", "ref": None}
    assert json.loads(protocol.error("bad_frame", "x"))["reason"] == "bad_frame"


def test_bad_frame_window_trips_after_ten_in_a_minute() -> None:
    """Ten bad frames in a minute are tolerated; the eleventh closes; old ones age out."""
    window = protocol.BadFrameWindow()
    assert not any(window.add(float(i)) for i in range(10))
    assert window.add(10.0)
    fresh = protocol.BadFrameWindow()
    assert not any(fresh.add(i * 7.0) for i in range(20))  # spread over more than a minute
