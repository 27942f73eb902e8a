"""Hypothesis against a running `livepush serve` process (docs/reference.md §5, §8): generated
client frames (text and binary; commands with wrong types, huge numbers, non-finite numbers,
unicode, deep nesting, over-long strings, garbage) and generated session tokens (in `?token=`,
the session cookies and the subprotocol header).

Every frame is answered as §5 says (`error`, `refused`, `pong` or `subscribed`; an unsubscribe
gets nothing) in valid JSON, or the connection is closed with a code §5 documents for what was
sent; every token gives the session it carries or, in `required` mode, close 4401. The process
never dies and never logs a traceback, an error or a warning about any of it.

The examples are derandomized (the same ones on every run) and bounded in number, so CI is
reproducible and the module takes seconds.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from livepush import protocol, topics
from livepush.errors import InvalidSession
from livepush.sessions import decode
from livepush.sessions.handshake import extract_tokens
from tests.support.procs import ChildProcess, Processes
from tests.support.security import Outcome, closed, hello, issue_with, raw_attempt

SECRET = "fuzz-secret-" + "k7Qz" * 10  # the server's: strategies sign topics and tokens with it
SUBJECT = "fuzzer"
VALID_TOKEN = issue_with(SECRET, SUBJECT, ttl=86400)
FUZZ = settings(max_examples=300, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.large_base_example])
ANSWER_TIMEOUT = 10.0
# Frames per connection, at most: past ten bad ones in a minute the server closes with 1008.
MAX_FRAMES = 12
ANSWERS = {"error", "refused", "pong", "subscribed"}
# After `subscribed`, what a subscription may bring: a replay, a reset, a state snapshot.
FOLLOW_UPS = {"message", "reset"}
# What a log line about a client's frames or tokens must never be (client mistakes are debug).
LOUD = re.compile(r"Traceback|\b(WARNING|ERROR|CRITICAL)\b")


# -- strategies ------------------------------------------------------------------------------

# No lone surrogates: a text frame is UTF-8, and a client cannot encode them (invalid UTF-8 has
# its own strategy below).
chars = st.characters(exclude_categories=("Cs",))
text = st.text(chars, max_size=40)
plain_topics = st.one_of(
    st.from_regex(r"[A-Za-z0-9_.:/-]{1,30}", fullmatch=True),
    st.sampled_from(["public:lobby", "user:fuzzer", "user:someone", "job:1", "group:1", "job:0001", "job:0_1",
                     "group:07", "workflow:1", "_livepush.x", "job:" + "9" * 30, "public:" + "x" * 193]),
    st.text(st.sampled_from("abc:/.-_~é中\x00 "), min_size=0, max_size=12),
    st.text(chars, min_size=195, max_size=260),
)
valid_topics = st.one_of(st.from_regex(r"[A-Za-z0-9_.:/-]{1,40}", fullmatch=True),
                         st.sampled_from(["public:lobby", "user:fuzzer", "user:someone", "job:1", "group:1",
                                          "job:0001", "workflow:1", "_livepush.x", "public:" + "x" * 193]))
signed_topics = valid_topics.filter(lambda t: not t.startswith("_livepush.")).map(lambda t: topics.sign(t, [SECRET]))
tampered = st.tuples(signed_topics, st.integers(0, 200), st.sampled_from("A0~_.é")).map(
    lambda s: s[0][: s[1] % len(s[0])] + s[2] + s[0][s[1] % len(s[0]) + 1:])
offsets = st.one_of(st.none(), st.from_regex(r"[0-9]{1,21}(-[0-9]{1,21})?", fullmatch=True),
                    st.sampled_from(["0", "0-0", "-", "1--2", "１２", "9" * 101]), text)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers().map(lambda n: n * 10**400 + 1), st.floats(), text)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                      max_leaves=8)
refs = st.one_of(st.none(), st.integers(), st.floats(), text, st.text(chars, min_size=190, max_size=230), values)
commands = st.builds(
    lambda fields, extra: {**extra, **fields},
    st.fixed_dictionaries(
        {"op": st.one_of(st.sampled_from(["subscribe", "unsubscribe", "ping"]), text, values)},
        optional={"topic": st.one_of(plain_topics, signed_topics, tampered, values),
                  "since": st.one_of(offsets, values), "ref": refs}),
    st.dictionaries(text, values, max_size=2),
)
# Subscribes the server may grant: signed topics, the rules' topics, state topics.
subscribes = st.fixed_dictionaries({
    "op": st.just("subscribe"),
    "topic": st.one_of(signed_topics, st.sampled_from(["public:lobby", "user:fuzzer", "job:1", "group:1"]),
                       st.from_regex(r"public:[A-Za-z0-9_.:/-]{1,30}", fullmatch=True)),
    "since": offsets, "ref": refs})
# Numbers JSON allows but Python reads oddly, and literals only Python's json reads.
number_literals = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e-999", "-0", "1E400",
                                   "9" * 4300, "9" * 4301, "1." + "0" * 5000, "0.1e-99999"])


def with_literal(template: str) -> Callable[[str], str]:
    return lambda literal: template.replace("@", literal)


def nested(depth: int, inner: str = "") -> str:
    return "[" * depth + inner + "]" * depth


Frame = tuple[str, Any]  # ("text", str) | ("binary", bytes) | ("utf8-invalid", bytes)

frames = st.one_of(
    commands.map(lambda c: ("text", json.dumps(c))),
    subscribes.map(lambda c: ("text", json.dumps(c, ensure_ascii=False))),
    commands.map(lambda c: ("text", json.dumps(c, ensure_ascii=False))),
    st.tuples(st.sampled_from(['{"op":"ping","ref":@}', '{"op":"subscribe","topic":"public:x","since":@,"ref":1}',
                               '{"op":"subscribe","topic":"public:x","since":null,"ref":@}', '{"op":@}', "@"]),
              number_literals).map(lambda t: ("text", with_literal(t[0])(t[1]))),
    st.integers(1, 30_000).map(lambda n: ("text", '{"op":"ping","ref":' + nested(n, "1") + "}")),
    st.integers(1, 30_000).map(lambda n: ("text", nested(n))),
    st.integers(1, 6_000).map(lambda n: ("text", '{"op":"ping","ref":' + '{"a":' * n + "1" + "}" * n + "}")),
    st.integers(65_400, 66_000).map(lambda n: ("text", '{"op":"ping","ref":"' + "x" * n + '"}')),
    st.integers(40_000, 70_000).map(lambda n: ("text", '{"op":"subscribe","topic":"' + "é" * (n // 2) + '","ref":1}')),
    st.text(chars, max_size=200).map(lambda s: ("text", s)),
    st.binary(max_size=200).map(lambda b: ("binary", b)),
    commands.map(lambda c: ("binary", json.dumps(c).encode())),
    st.binary(min_size=1, max_size=60).map(lambda b: ("utf8-invalid", b"\xff" + b)),
)


# -- what the server may answer --------------------------------------------------------------


def strict_json(raw: str | bytes) -> Any:
    """The frame as JSON, refusing NaN and Infinity: a browser's JSON.parse refuses them too."""
    def refuse(name: str) -> Any:
        raise AssertionError(f"the server sent {name}, which is not JSON: {raw[:200]!r}")

    assert isinstance(raw, str), f"the server sent a binary frame: {raw[:200]!r}"
    return json.loads(raw, parse_constant=refuse)


def size_of(frame: Frame) -> int:
    kind, payload = frame
    return len(payload.encode()) if kind == "text" else len(payload)


def is_unsubscribe(frame: Frame) -> bool:
    """An unsubscribe, as a client means it: gets no answer when it is well formed."""
    kind, payload = frame
    if kind != "text":
        return False
    try:
        parsed = json.loads(payload)
    except (ValueError, RecursionError):
        return False
    return isinstance(parsed, dict) and parsed.get("op") == "unsubscribe"


async def exchange(url: str, frames_: list[Frame]) -> list[tuple[Frame, list[dict[str, Any]], int | None]]:
    """Send each frame followed by a ping of our own, and collect what came back before its pong:
    (frame, answers, close code or None). Stops at a close."""
    out: list[tuple[Frame, list[dict[str, Any]], int | None]] = []
    ws = await connect(url, subprotocols=["livepush", "livepush.token." + VALID_TOKEN],  # type: ignore[list-item]
                       open_timeout=10, max_size=None, close_timeout=1)
    try:
        first = strict_json(await asyncio.wait_for(ws.recv(), ANSWER_TIMEOUT))
        assert first["op"] == "hello" and first["session"] == {"subject": SUBJECT}, first
        for i, frame in enumerate(frames_):
            kind, payload = frame
            answers: list[dict[str, Any]] = []
            try:
                await ws.send(payload, text=kind != "binary")
                await ws.send(json.dumps({"op": "ping", "ref": f"sentinel-{i}"}))
                while True:
                    answer = strict_json(await asyncio.wait_for(ws.recv(), ANSWER_TIMEOUT))
                    if answer == {"op": "pong", "ref": f"sentinel-{i}"}:
                        break
                    answers.append(answer)
            except ConnectionClosed as exc:
                out.append((frame, answers, exc.rcvd.code if exc.rcvd else None))
                return out
            out.append((frame, answers, None))
    finally:
        await ws.close()
    return out


def check_answers(results: list[tuple[Frame, list[dict[str, Any]], int | None]]) -> None:
    errors = 0
    for frame, answers, code in results:
        shown = f"{frame[0]} frame {str(frame[1])[:300]!r} got {answers[:3]!r}"
        ops = [a.get("op") for a in answers]
        errors += ops.count("error")
        event(f"closed {code}" if code is not None else f"answered {ops[:1]}"
              + (f" {answers[0].get('reason')}" if ops[:1] in (["error"], ["refused"]) else ""))
        if code is not None:
            # A frame over 64 KiB: 1009; more than ten bad frames in a minute: 1008 after the
            # eleventh one's error; a text frame that is not UTF-8: 1007.
            if code == 1009:
                assert size_of(frame) > protocol.MAX_FRAME_BYTES, f"closed 1009 on a small frame: {shown}"
            elif code == 1008:
                assert errors > protocol.BAD_FRAMES_PER_MINUTE, f"closed 1008 after {errors} bad frames: {shown}"
            elif code == 1007:
                assert frame[0] == "utf8-invalid", f"closed 1007 on valid UTF-8: {shown}"
            else:
                raise AssertionError(f"closed with {code}, which §5 does not document for this: {shown}")
            continue
        assert size_of(frame) <= protocol.MAX_FRAME_BYTES, f"a frame over 64 KiB was not closed with 1009: {shown}"
        assert frame[0] != "utf8-invalid", f"a text frame that is not UTF-8 was accepted: {shown}"
        if not answers:
            assert is_unsubscribe(frame), f"no answer: {shown}"
            continue
        assert ops[0] in ANSWERS, f"the first answer is not one of {sorted(ANSWERS)}: {shown}"
        assert ops.count(ops[0]) == 1 or ops[0] == "error", f"answered twice: {shown}"
        assert all(op in FOLLOW_UPS for op in ops[1:]) and (len(ops) == 1 or ops[0] == "subscribed"), \
            f"unexpected frames after the answer: {shown}"
        if ops[0] == "error":
            assert isinstance(answers[0].get("reason"), str) and isinstance(answers[0].get("detail"), str), shown
        if ops[0] in ("pong", "subscribed", "refused"):
            sent = json.loads(frame[1])
            assert answers[0]["ref"] == sent.get("ref"), f"the ref came back changed: {shown}"


# -- the server ------------------------------------------------------------------------------


class Watched:
    """A running `livepush serve` child, and a check that it is alive and quiet since the last one."""

    def __init__(self, child: ChildProcess) -> None:
        self.child = child
        self.port = child.port
        self.url = f"ws://127.0.0.1:{child.port}/"
        self._seen = len(child.stderr())

    def assert_alive_and_quiet(self, what: str) -> None:
        assert self.child.running, f"the server died after {what}\n{self.child.output()}"
        err = self.child.stderr()
        new, self._seen = err[self._seen:], len(err)
        assert not LOUD.search(new), f"the server logged after {what}:\n{new[-3000:]}"
        assert VALID_TOKEN not in err, "a session token reached the log"


@pytest.fixture
def server(procs: Processes, livepush_env: Callable[..., dict[str, str]], pg_url: str) -> Iterator[Watched]:
    """`livepush serve` on Postgres (its job: and group: state topics too), sessions required,
    with the security tests' rules (public:* for anyone, user:{subject})."""
    env = livepush_env(database_url=pg_url, secret=SECRET, authenticate="required")
    watched = Watched(procs.livepush("serve", "--app", "tests.support.security_app:app", env=env))
    yield watched
    watched.assert_alive_and_quiet("the test")


@FUZZ
@given(st.one_of(st.lists(frames, min_size=1, max_size=MAX_FRAMES),
                 # Ten bad frames, then more: the eleventh bad one in a minute closes with 1008.
                 st.tuples(st.lists(st.text(chars, max_size=20).map(lambda s: ("text", "!" + s)), min_size=10,
                                    max_size=10), st.lists(frames, min_size=1, max_size=2)).map(lambda t: t[0] + t[1])))
# A ref that json.loads reads as a float no JSON can carry (NaN, Infinity, 1e999) was echoed as
# `NaN` or `Infinity`, which a client's JSON.parse refuses: now it is a bad frame.
@example(sent=[("text", '{"op":"ping","ref":NaN}'), ("text", '{"op":"ping","ref":1e999}'),
               ("text", '{"op":"subscribe","topic":"public:x","since":null,"ref":-Infinity}')])
def test_every_generated_frame_is_answered_and_the_server_stays_quiet(server: Watched, sent: list[Frame]) -> None:
    """Up to twelve generated frames on one connection: each gets its answer (or, for an
    unsubscribe, nothing) in valid JSON with its ref, or a close code §5 documents for it; the
    server neither dies nor logs a traceback, error or warning."""
    results = asyncio.run(exchange(server.url, sent))
    server.assert_alive_and_quiet(f"frames {[(k, str(p)[:200]) for k, p in sent]}")
    check_answers(results)


# -- tokens ----------------------------------------------------------------------------------


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """The valid token with one edit: cut, a character changed or added, or something appended."""
    token = VALID_TOKEN
    i = draw(st.integers(0, len(token)))
    how = draw(st.sampled_from(["cut", "change", "insert", "append"]))
    c = draw(st.characters(exclude_categories=("Cs",)) | st.sampled_from("=.-_Aa0"))
    if how == "cut":
        return token[:i]
    if how == "change":
        return token[:i] + c + token[i + 1:]
    if how == "insert":
        return token[:i] + c + token[i:]
    return token + draw(st.text(chars, max_size=20))


tokens = st.one_of(st.just(VALID_TOKEN), mutated(), text, st.text(chars, min_size=4000, max_size=4200),
                   st.from_regex(r"[A-Za-z0-9_.\-]{1,120}", fullmatch=True))
LINE_LIMIT = 8000  # bytes; websockets refuses lines over 8 KiB (MAX_LINE_LENGTH)
PLACES = ("query", "cookie", "host-cookie", "two-cookies", "subprotocol")


def request_for(place: str, token: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The request target and headers that carry `token` in `place` (header values as UTF-8)."""
    if place == "query":
        return b"/?token=" + quote(token, safe="").encode(), []
    if place == "cookie":
        return b"/", [(b"Cookie", b"theme=dark; livepush_session=" + token.encode() + b"; lang=en")]
    if place == "host-cookie":
        return b"/", [(b"Cookie", b"__Host-livepush_session=" + token.encode())]
    if place == "two-cookies":
        return b"/", [(b"Cookie", b"livepush_session=" + VALID_TOKEN.encode() + b"; __Host-livepush_session="
                       + token.encode())]
    return b"/", [(b"Sec-WebSocket-Protocol", b"livepush, livepush.token." + token.encode())]


def expected(target: bytes, headers: list[tuple[bytes, bytes]]) -> Outcome:
    """What §5 promises for this request in `required` mode: hello with the subject when a token
    found where the server looks is valid, else close 4401."""
    # The server reads header bytes as latin-1 (HTTP/1.1) and the target as ASCII.
    for found in extract_tokens([(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers],
                                target.decode("ascii")):
        try:
            decode(found, [SECRET])
        except InvalidSession:
            continue
        return hello(SUBJECT)
    return closed(4401)


def unprintable(headers: list[tuple[bytes, bytes]]) -> bool:
    """Control characters in a header value: not HTTP, which a server may refuse with 400 or drop."""
    return any(re.search(rb"[\x00-\x08\x0a-\x1f\x7f]", v) for _, v in headers)


@FUZZ
@given(tokens, st.sampled_from(PLACES))
def test_every_generated_token_gives_its_session_or_4401(server: Watched, token: str, place: str) -> None:
    """A generated token in the query, a cookie or the subprotocol header: a valid one gives its
    session, anything else closes with 4401 (`required` mode), and the server stays quiet."""
    target, headers = request_for(place, token)
    outcome = asyncio.run(raw_attempt(server.port, target, headers))
    server.assert_alive_and_quiet(f"token {token[:200]!r} in {place}")
    want = expected(target, headers)
    event(f"{place}: {outcome}")
    allowed = {want}
    if unprintable(headers):
        allowed |= {Outcome("http", 400), Outcome("dropped", None)}
    # Past websockets' line limit the request is refused before anyone reads it: 414 for the
    # request line, 431 for a header line.
    if len(target) > LINE_LIMIT:
        allowed.add(Outcome("http", 414))
    if any(len(k) + len(v) + 2 > LINE_LIMIT for k, v in headers):
        allowed.add(Outcome("http", 431))
    if place == "subprotocol":
        # websockets checks the header's syntax (comma-separated tokens) before livepush reads it.
        allowed.add(Outcome("http", 400))
    assert outcome in allowed, f"token {token[:200]!r} in {place}: got {outcome}, expected {want}"
