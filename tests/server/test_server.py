"""The WebSocket server on every fan-out: frames, ordering, limits, health (docs/reference.md §5)."""

from __future__ import annotations

import asyncio
import gzip
import json
import urllib.request
from pathlib import Path

import pytest

import livepush
from livepush import topics
from tests.server.conftest import Served
from tests.support.http import http_exchange, raw_exchange, upgrade_headers
from tests.support.wsclient import WSClient


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    def get() -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    return await asyncio.to_thread(get)


async def test_server_speaks_first_with_hello(served: Served) -> None:
    """The first frame is hello with no session (anonymous) and the heartbeat interval."""
    client = await WSClient.open(served.url)
    assert client.hello["session"] is None and client.hello["heartbeat"] > 0
    await client.close()


async def test_signed_topic_subscribes_and_receives_in_publish_order(served: Served) -> None:
    """A signed topic is its own permission; messages arrive in publish order with increasing offsets."""
    client = await WSClient.open(served.url)
    answer = await client.subscribe(served.sign("chat:lobby"), None)
    assert answer["op"] == "subscribed" and answer["topic"] == "chat:lobby"
    offsets = [await served.publish("chat:lobby", {"n": i}) for i in range(50)]
    got = await client.messages(50)
    assert [m["data"]["n"] for m in got] == list(range(50))
    assert [m["offset"] for m in got] == offsets
    assert all(m["topic"] == "chat:lobby" for m in got)
    await client.close()


async def test_each_subscriber_gets_every_message_once(served: Served) -> None:
    """Several subscribers of one topic each get every message exactly once."""
    clients = [await WSClient.open(served.url) for _ in range(5)]
    for c in clients:
        assert (await c.subscribe(served.sign("room:1")))["op"] == "subscribed"
    for i in range(20):
        await served.publish("room:1", {"i": i})
    for c in clients:
        assert [m["data"]["i"] for m in await c.messages(20)] == list(range(20))
        with pytest.raises(asyncio.TimeoutError):
            await c.recv(timeout=0.2)
        await c.close()


async def test_unsubscribe_stops_delivery(served: Served) -> None:
    """After unsubscribe the client hears nothing more on that topic."""
    client = await WSClient.open(served.url)
    await client.subscribe(served.sign("t:1"))
    await client.send({"op": "unsubscribe", "topic": served.sign("t:1")})
    await client.send({"op": "ping", "ref": "after"})
    assert (await client.recv())["op"] == "pong"
    await served.publish("t:1", {"x": 1})
    await client.send({"op": "ping", "ref": 2})
    assert await client.recv() == {"op": "pong", "ref": 2}
    await client.close()


async def test_plain_topic_without_a_rule_is_forbidden(served: Served) -> None:
    """Without an --app rule only signed topics are allowed."""
    client = await WSClient.open(served.url)
    assert (await client.subscribe("chat:lobby"))["reason"] == "forbidden"
    await client.close()


@pytest.mark.parametrize(
    "topic,reason",
    [
        ("bad topic", "invalid_topic"),
        ("x" * 201, "invalid_topic"),
        ("_livepush.revocations", "invalid_topic"),
        ("chat:lobby~forged", "invalid_signature"),
        ("", "invalid_topic"),
    ],
)
async def test_bad_topics_are_refused_with_a_reason(served: Served, topic: str, reason: str) -> None:
    """Malformed, reserved and forged topics get `refused` with the matching reason."""
    client = await WSClient.open(served.url)
    assert (await client.subscribe(topic))["reason"] == reason
    await client.close()


async def test_expired_signed_topic_is_refused(served: Served) -> None:
    """A signed topic past its TTL is refused with `expired`."""
    signed = topics.sign("job:1", served.settings.secrets, ttl=1, now=0)
    client = await WSClient.open(served.url)
    assert (await client.subscribe(signed))["reason"] == "expired"
    await client.close()


BAD_FRAMES: list[str | bytes] = [
    "not json",
    "[]",
    "42",
    '{"no":"op"}',
    '{"op":"fly"}',
    '{"op":"subscribe"}',
    '{"op":"subscribe","topic":["a"]}',
    '{"op":"subscribe","topic":"a","since":3}',
    b"binary",
    '{"op":"unsubscribe","topic":null}',
]


async def test_every_malformed_frame_gets_an_error_and_the_connection_stays_open(served: Served) -> None:
    """Ten malformed frames of every kind each get an `error`; the connection still works."""
    client = await WSClient.open(served.url)
    for raw in BAD_FRAMES:
        await client.send(raw)
        frame = await client.recv()
        assert frame["op"] == "error" and frame["reason"] in ("bad_frame", "unknown_op") and frame["detail"]
    await client.send({"op": "ping", "ref": "ok"})
    assert await client.recv() == {"op": "pong", "ref": "ok"}
    await client.close()


async def test_a_ref_no_frame_can_carry_back_gets_an_error_and_the_connection_stays_open(served: Served) -> None:
    """A ping and a subscribe whose ref is a lone surrogate (`"\\ud800"`: valid JSON, but no UTF-8 text can carry it back in `pong` or `subscribed`) each get `error` bad_frame; the connection still answers."""
    client = await WSClient.open(served.url)
    topic = served.sign("room:surrogate")
    for raw in ('{"op":"ping","ref":"\\ud800"}', '{"op":"subscribe","topic":"%s","ref":"a\\udfff"}' % topic):
        await client.send(raw)
        frame = await client.recv()
        assert (frame["op"], frame["reason"]) == ("error", "bad_frame"), frame
    await client.send({"op": "ping", "ref": "ok"})
    assert await client.recv() == {"op": "pong", "ref": "ok"}
    await client.close()


async def test_an_error_answers_its_frame_in_the_place_of_that_frames_answer(served: Served) -> None:
    """An `error` names no ref: it comes where the answer to the frame it is about would, after
    the answers to the frames sent before it and before those to the frames sent after, and that
    frame gets no other answer, so a client knows which subscribe it was (docs/protocol.md)."""
    client = await WSClient.open(served.url)
    frames = [
        {"op": "subscribe", "topic": served.sign("order:a"), "since": None, "ref": "a"},
        {"op": "subscribe", "topic": served.sign("order:b"), "since": None, "ref": {"not": "a ref"}},
        {"op": "subscribe", "topic": served.sign("order:c"), "since": None, "ref": "c"},
        {"op": "ping", "ref": "p"},
    ]
    for frame in frames:
        await client.send(frame)
    answers = [await client.recv() for _ in frames]
    assert [(a["op"], a.get("ref")) for a in answers] == [
        ("subscribed", "a"), ("error", None), ("subscribed", "c"), ("pong", "p")], answers
    with pytest.raises(asyncio.TimeoutError):
        await client.recv(timeout=0.3)
    await client.close()


async def test_a_client_that_keeps_sending_garbage_is_closed_with_1008(served: Served) -> None:
    """More than 10 bad frames in a minute close the connection with 1008."""
    client = await WSClient.open(served.url)
    for _ in range(11):
        await client.send("garbage")
    assert await client.closed_with() == 1008


async def test_a_frame_over_64_kib_closes_with_1009(served: Served) -> None:
    """A client frame larger than 64 KiB closes the connection with 1009."""
    client = await WSClient.open(served.url)
    await client.send(json.dumps({"op": "ping", "ref": "x" * (65 * 1024)}))
    assert await client.closed_with() == 1009


async def test_healthz_and_client_js_are_served_on_the_same_port(served: Served) -> None:
    """GET /healthz answers 200 while listening; GET /livepush.js serves the client with CORS."""
    status, body = await http_get(served.server.port, "/healthz")
    assert status == 200 and json.loads(body) == {"status": "ok", "fanout": served.fanout.name}

    def get_js() -> tuple[int, str, str, bytes]:
        with urllib.request.urlopen(f"http://127.0.0.1:{served.server.port}/livepush.js", timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.headers["Access-Control-Allow-Origin"], resp.read()

    status, content_type, cors, js = await asyncio.to_thread(get_js)
    assert status == 200 and content_type.startswith("text/javascript") and cors == "*"
    assert js == (Path(livepush.__file__).parent / "static" / "livepush.js").read_bytes()
    status, _ = await http_get(served.server.port, "/nope")
    assert status == 404


@pytest.mark.parametrize("fanout_kind", ["local"])
async def test_client_js_is_revalidated_with_its_etag_and_gzipped_for_browsers_that_take_it(served: Served) -> None:
    """Every page load revalidates /livepush.js (no-cache), and while it is unchanged gets 304
    without a body; a browser that takes gzip gets it gzipped, one that does not gets it as is."""
    port, js = served.server.port, (Path(livepush.__file__).parent / "static" / "livepush.js").read_bytes()
    status, headers, body = await http_exchange(port, "GET", "/livepush.js", {"Accept-Encoding": "gzip, deflate, br"})
    assert (status, headers["content-encoding"], headers["cache-control"]) == (200, "gzip", "no-cache")
    assert gzip.decompress(body) == js and int(headers["content-length"]) == len(body) < len(js) / 2
    assert headers["vary"] == "Accept-Encoding" and headers["access-control-allow-origin"] == "*"
    etag = headers["etag"]
    for if_none_match in (etag, f'"other", W/{etag}', "*"):
        status, unchanged, body = await http_exchange(port, "GET", "/livepush.js", {"If-None-Match": if_none_match})
        assert (status, body, unchanged["etag"]) == (304, b"", etag), if_none_match
        assert "content-length" not in unchanged
    status, headers, body = await http_exchange(port, "GET", "/livepush.js", {"If-None-Match": '"other"',
                                                                             "Accept-Encoding": "gzip;q=0"})
    assert (status, body, headers.get("content-encoding")) == (200, js, None)


@pytest.mark.parametrize("fanout_kind", ["local"])
@pytest.mark.parametrize("accept", ["*, gzip;q=0", "identity, *;q=0.5, gzip;q=0", "*;q=1, x-gzip;q=0"])
async def test_client_js_is_never_gzipped_for_a_client_that_refuses_gzip_beside_a_wildcard(
        served: Served, accept: str) -> None:
    """An Accept-Encoding that takes `*` but refuses gzip by name gets /livepush.js as it is: the
    named coding overrides the wildcard wherever it stands in the list (RFC 9110 §12.5.3)."""
    js = (Path(livepush.__file__).parent / "static" / "livepush.js").read_bytes()
    status, headers, body = await http_exchange(served.server.port, "GET", "/livepush.js", {"Accept-Encoding": accept})
    assert (status, headers.get("content-encoding"), body) == (200, None, js)


@pytest.mark.parametrize("fanout_kind", ["local"])
@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/livepush.js"])
async def test_the_http_routes_answer_get_and_head_and_refuse_other_methods_with_405(served: Served, path: str) -> None:
    """The routes are read-only: GET answers; HEAD gets GET's status and headers without a body
    (RFC 9110 §9.3.2); POST, PUT and DELETE get 405 with `Allow: GET, HEAD`, never the GET answer."""
    port = served.server.port
    status, headers, body = await http_exchange(port, "GET", path)
    assert status in (200, 503) and body and int(headers["content-length"]) == len(body)
    status_head, headers_head, body_head = await http_exchange(port, "HEAD", path)
    assert (status_head, body_head) == (status, b"")
    assert headers_head["content-type"] == headers["content-type"]
    for method in ("POST", "PUT", "DELETE"):
        status, headers, _ = await http_exchange(port, method, path)
        assert (status, headers.get("allow")) == (405, "GET, HEAD"), method


@pytest.mark.parametrize("fanout_kind", ["local"])
@pytest.mark.parametrize("draining", [False, True], ids=["serving", "draining"])
async def test_a_head_with_upgrade_headers_is_answered_without_a_body(served: Served, draining: bool) -> None:
    """A HEAD that carries the upgrade's headers is no upgrade (only a GET is): its refusal (405,
    or 503 while the server drains) has the status and headers and no body, as every answer to a
    HEAD must (RFC 9110 §9.3.2); a client reads a body there as the start of the next answer."""
    if draining:
        served.server._draining = True  # what a drain's first step sets: upgrades get 503
    headers = dict(upgrade_headers(served.server.port))
    del headers["Host"]  # http_exchange sends its own
    status, answer, body = await http_exchange(served.server.port, "HEAD", "/", headers)
    assert status == (503 if draining else 405) and int(answer["content-length"]) > 0, (status, answer)
    assert body == b""


@pytest.mark.parametrize("fanout_kind", ["local"])
@pytest.mark.parametrize("request_bytes,status", [
    (b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", 413),
    (b"POST /nope HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 413),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nUpgrade: websocket\r\n\r\nhello", 413),
    # No length at all (RFC 9110 §8.6: 1*DIGIT), or two that disagree: a malformed head, not a body.
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\ncontent-length: 5x\r\n\r\n", 400),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400),
    (b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", 400),
    (b"NONSENSE\r\n\r\n", 400),
    (b"GET /healthz HTTP/1.1\nHost: x\n\n", 400),
    # The start of a TLS ClientHello (a client told https:// or wss:// on this plain port): no line
    # ends in it, yet its first byte already says it is no request.
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\xab" * 32, 400),
], ids=["content-length", "chunked", "upgrade-with-body", "negative-length", "length-not-a-number",
        "lengths-that-disagree", "http2", "no-request-line", "lines-without-cr",
        "tls-client-hello"])
async def test_a_request_the_server_cannot_read_gets_a_status_not_a_silent_close(
        served: Served, request_bytes: bytes, status: int) -> None:
    """No route reads a request body, and only HTTP/1.1 (or 1.0) heads are read at all: such a
    request gets an HTTP answer saying so (413 for a body, 400 for the rest) before the server
    closes, not a connection that ends with no status, nor one held until the open timeout; the
    server serves on."""
    raw = await raw_exchange(served.server.port, request_bytes)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), raw
    assert body and b"Content-Length: %d" % len(body) in head, raw
    assert (await http_exchange(served.server.port, "GET", "/healthz"))[0] == 200


@pytest.mark.parametrize("fanout_kind", ["local"])
@pytest.mark.parametrize("lengths", [b"Content-Length: 00\r\n", b"content-length: 0, 0\r\n",
                                     b"Content-Length:0 ,00\r\nContent-Length: 000\r\n"],
                         ids=["leading-zero", "list-of-copies", "both-in-two-lines"])
@pytest.mark.parametrize("reads", ["whole", "byte-by-byte"])
async def test_a_content_length_that_says_zero_in_another_spelling_is_served_as_zero(
        served: Served, lengths: bytes, reads: str) -> None:
    """`00` is a zero (RFC 9110 §8.6: 1*DIGIT), and a list of copies of one length is that length:
    the request has no body and is served, not told 413 (too large), however its bytes arrive."""
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + lengths + b"\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", served.server.port)
    try:
        for part in ([request] if reads == "whole" else [request[i:i + 1] for i in range(len(request))]):
            writer.write(part)
            await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout=5)
    finally:
        writer.close()
    assert raw.startswith(b"HTTP/1.1 200 "), raw


@pytest.mark.parametrize("fanout_kind", ["local"])
@pytest.mark.parametrize("lengths", [b"Content-Length: -1\r\n", b"content-length: 5x\r\n",
                                     b"Content-Length: 5\r\nContent-Length: 6\r\n", b"Content-Length: 1, 2\r\n"])
async def test_a_content_length_that_is_no_length_gets_a_400_naming_the_header(served: Served, lengths: bytes) -> None:
    """A 400 for a malformed Content-Length says which header is wrong and what to send instead,
    not only that the request could not be read."""
    raw = await raw_exchange(served.server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + lengths + b"\r\n")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), raw
    assert b"Content-Length" in body and b"Content-Length: 0" in body, body


@pytest.mark.parametrize("fanout_kind", ["local"])
async def test_a_list_of_copies_of_a_length_above_zero_is_a_body(served: Served) -> None:
    """`Content-Length: 5, 5` is the length 5 (RFC 9110 §8.6): a body, 413, not a malformed head."""
    raw = await raw_exchange(served.server.port, b"POST /healthz HTTP/1.1\r\nHost: x\r\n"
                                                 b"Content-Length: 5, 05\r\n\r\nhello")
    assert raw.startswith(b"HTTP/1.1 413 "), raw


@pytest.mark.parametrize("fanout_kind", ["local", "redis"])
async def test_a_state_topic_on_a_server_without_a_database_is_refused_with_invalid_topic(served: Served) -> None:
    """Jobs, groups and workflows live in Postgres: a server without a database can never show
    one, and nobody may publish on their topics. A (validly signed) `job:`, `group:` or
    `workflow:` subscription there is refused with invalid_topic, which the client does not
    retry, instead of a `subscribed` that hears nothing for ever; the connection goes on."""
    client = await WSClient.open(served.url)
    for topic in ("job:42", "group:7", "workflow:3"):
        answer = await client.subscribe(served.sign(topic))
        assert (answer["op"], answer.get("reason")) == ("refused", "invalid_topic"), (topic, answer)
    assert (await client.subscribe(served.sign("room:1")))["op"] == "subscribed"
    await client.close()


async def test_a_since_no_fan_out_gives_out_gets_subscribed_then_reset_never_refused(served: Served) -> None:
    """`since` as 21 zeros (digits, but more than any offset has) on a topic with nothing published: `subscribed`, then `reset`, then live messages; never a `refused` after the `subscribed`."""
    client = await WSClient.open(served.url)
    topic = served.sign("room:zeros")
    answer = await client.subscribe(topic, since="0" * 21)
    assert answer["op"] == "subscribed"
    assert await client.recv() == {"op": "reset", "topic": "room:zeros", "ref": answer["ref"]}
    await served.publish("room:zeros", {"n": 1})
    assert (await client.messages(1))[0]["data"] == {"n": 1}
    await client.close()


async def test_subscribing_twice_restarts_the_subscription_without_duplicates(served: Served) -> None:
    """A second subscribe to the same topic answers again and delivers each later message once."""
    client = await WSClient.open(served.url)
    await client.subscribe(served.sign("dup:1"))
    await client.subscribe(served.sign("dup:1"))
    await served.publish("dup:1", {"x": 1})
    assert len(await client.messages(1)) == 1
    with pytest.raises(asyncio.TimeoutError):
        await client.recv(timeout=0.2)
    await client.close()


async def test_a_slow_subscriber_gets_every_message_once_it_reads_again_and_never_slows_the_others(
        served: Served) -> None:
    """A client that stops reading on a message topic holds no unbounded buffer (past its share, what follows waits in history) and stays open; once it reads again it gets every message in order, none twice, and no `reset`; a reader gets everything."""
    slow = await WSClient.open(served.url)
    fast = await WSClient.open(served.url)
    await slow.subscribe(served.sign("firehose"))
    await fast.subscribe(served.sign("firehose"))
    slow.ws.transport.pause_reading()
    blob = "x" * 60_000
    count = 120  # ~7 MB: more than the kernel buffers and a topic's share of the backlog hold
    # The fast client reads each message as it comes (it shares this loop with the server).
    for i in range(count):
        await served.publish("firehose", {"i": i, "blob": blob})
        assert (await fast.recv(timeout=5))["data"]["i"] == i
    slow.ws.transport.resume_reading()
    frames = []
    while not frames or frames[-1]["op"] != "message" or frames[-1]["data"]["i"] != count - 1:
        frames.append(await slow.recv(timeout=5))
    assert [f["op"] for f in frames] == ["message"] * count, [f["op"] for f in frames if f["op"] != "message"]
    assert [f["data"]["i"] for f in frames] == list(range(count))
    port = slow.ws.local_address[1]
    assert any(c.remote_address[1] == port and not c.closing for c in served.server.clients), "closed"
    await slow.close()
    await fast.close()


@pytest.mark.parametrize("fanout_kind", ["local"])
async def test_every_plain_http_answer_says_the_connection_closes(served: Served) -> None:
    """The server answers one request per connection and then ends it: every plain HTTP answer,
    whichever part made it (a route, a 404, a 405, an upgrade refused for its two
    Origin headers), says `Connection: close`
    (RFC 9112 §9.6), so that an HTTP/1.1 client does not send a second request it will never
    see answered."""
    port = served.server.port
    requests = [b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n",
                b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /livepush.js HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", b"DELETE /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nOrigin: http://a\r\n"
                b"Origin: http://b\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"]
    for request in requests:
        head = (await raw_exchange(port, request)).partition(b"\r\n\r\n")[0].lower()
        assert b"\r\nconnection: close" in head, (request, head)


@pytest.mark.parametrize("fanout_kind", ["local"])
async def test_a_request_in_absolute_form_is_routed_by_its_path(served: Served) -> None:
    """A server must accept a target in absolute form (RFC 9112 §3.2.2; a proxy may send one):
    `GET http://host/healthz` is the /healthz route, not a 404, and a target no URL can be read
    from still gets an answer."""
    port = served.server.port
    for target, status in ((b"http://127.0.0.1/healthz", 200), (b"HTTP://h:1/readyz?x=1", None),
                           (b"http://h/nope", 404), (b"http://[/healthz", 404)):
        raw = await raw_exchange(port, b"GET " + target + b" HTTP/1.1\r\nHost: h\r\n\r\n")
        if status is None:  # /readyz: 200 or 503 with its JSON body, depending on the canary
            assert raw.startswith((b"HTTP/1.1 200 ", b"HTTP/1.1 503 ")) and b'"checks"' in raw, (target, raw)
        else:
            assert raw.startswith(b"HTTP/1.1 %d " % status), (target, raw)


@pytest.mark.parametrize("fanout_kind", ["local"])
async def test_empty_lines_before_the_request_line_are_ignored(served: Served) -> None:
    """A server should ignore empty lines before a request line (RFC 9112 §2.2: some clients
    send a CRLF after a previous request): `\\r\\n\\r\\nGET /healthz` is answered 200, whether the
    empty lines come with the request or alone before it."""
    port = served.server.port
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    assert (await raw_exchange(port, b"\r\n\r\n" + request)).startswith(b"HTTP/1.1 200 ")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for part in (b"\r\n", b"\r", b"\n" + request):
            writer.write(part)
            await writer.drain()
        assert (await asyncio.wait_for(reader.read(), timeout=5)).startswith(b"HTTP/1.1 200 ")
    finally:
        writer.close()


def _parsed(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    return int(status_line.split()[1]), {n.lower(): v.strip() for n, _, v in (x.partition(":") for x in lines)}, body


@pytest.mark.parametrize("fanout_kind", ["local"])
@pytest.mark.parametrize("refused", ["414", "431", "400", "413"])
async def test_a_refused_head_request_gets_no_body_and_a_plain_request_no_websocket_wording(
        served: Served, refused: str) -> None:
    """A request the server refuses before it is read (a request line or header past the parser's
    limits, a garbled head, a body) is answered as any other: without a body for a HEAD (RFC 9110
    §9.3.2), and with words that fit a plain HTTP request, which is no WebSocket connection."""
    port = served.server.port
    target, extra = {"414": ("/healthz?" + "a" * 9000, ""), "431": ("/healthz", "X-Big: " + "a" * 9000 + "\r\n"),
                     "400": ("/healthz", "Bad Header Line\r\n"), "413": ("/healthz", "Content-Length: 5\r\n")}[refused]
    for method in ("GET", "HEAD"):
        request = f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}\r\n".encode()
        status, headers, body = _parsed(await raw_exchange(port, request))
        assert status == int(refused) and int(headers["content-length"]) > 0, (method, status, headers)
        assert headers["connection"] == "close"
        if method == "HEAD":
            assert body == b"", body
        else:
            assert len(body) == int(headers["content-length"]) and b"WebSocket" not in body, body


@pytest.mark.parametrize("fanout_kind", ["local"])
async def test_a_request_the_gate_fails_on_gets_500_worded_for_any_request(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the gate answers 500, and a plain GET of a route is told so without being called a
    WebSocket connection; a HEAD gets no body."""

    async def broken(request: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(served.server, "admit", broken)
    port = served.server.port
    status, headers, body = await http_exchange(port, "GET", "/healthz")
    assert status == 500 and b"WebSocket" not in body and len(body) == int(headers["content-length"]), body
    status, headers, body = await http_exchange(port, "HEAD", "/healthz")
    assert (status, body) == (500, b"")
