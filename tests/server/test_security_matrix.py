"""Who may connect and what they may hear, through a real in-process server (docs/reference.md §5, §8).

Every cell of mode × token × where the token comes from × Origin, checked against a small
oracle that states the rules plainly; bad input (garbage, huge, non-ASCII tokens) handled
without a traceback and without a token in the logs; topic rules, the authorize hook and the
subscription limit; and `serve --app` as a child process.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from livepush import api, sessions
from livepush.config import Settings, set_settings
from livepush.sessions.rules import Allow, App
from tests.server.conftest import Served, start_served
from tests.server.test_metrics import scrape, value
from tests.support.http import upgrade_headers
from tests.support.security import (
    ALLOWED_ORIGIN,
    ORIGINS,
    SUBJECT,
    Outcome,
    assert_clean_logs,
    attempt,
    closed,
    hello,
    http,
    issue_with,
    make_token,
    new_secret,
    raw_attempt,
)
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient

MODES = ("required", "optional", "off")
TOKENS = ("none", "valid", "expired", "revoked", "tampered", "other_secret", "fallback_secret")
PLACES = ("cookie", "query")
ORIGIN_KINDS = ("none", "allowed", "foreign")


def expected(mode: str, token: str, origin: str) -> Outcome:
    """The rules of docs/reference.md §5, stated plainly; where the token comes from never matters."""
    if origin == "foreign":
        return http(403)  # before anything else: cookie and anonymous connections alike
    if mode == "off":
        return hello(None)  # tokens are ignored
    if token in ("valid", "fallback_secret"):  # fallback secrets still verify after a rotation
        return hello(SUBJECT)
    if mode == "required":
        return closed(4401)  # the handshake completes, then the server closes at once
    return hello(None)  # optional: anything but a valid session comes in anonymous


def matrix() -> Iterator[Any]:
    for mode in MODES:
        for token in TOKENS:
            # No token has no place: one cell, not two.
            for place in ("nowhere",) if token == "none" else PLACES:
                for origin in ORIGIN_KINDS:
                    yield pytest.param(mode, token, place, origin, id=f"{mode}-{token}-in_{place}-origin_{origin}")


# -- servers --------------------------------------------------------------------------------

Start = Callable[..., Awaitable[Served]]


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every livepush record down to DEBUG, and every other logger's warnings and errors."""
    caplog.set_level(logging.DEBUG, logger="livepush")
    return caplog


@pytest.fixture
async def start(secret: str) -> AsyncIterator[Start]:
    """start(mode=..., app=..., **settings) -> a local-fan-out server in this process, with one
    fallback secret and ALLOWED_ORIGIN allowed; stopped (and global state reset) afterwards."""
    started: list[Served] = []

    async def make(mode: str = "optional", app: App | None = None, **extra: Any) -> Served:
        options: dict[str, Any] = {"secret_fallbacks": (new_secret(),), "allowed_origins": (ALLOWED_ORIGIN,)}
        options.update(extra)
        settings = Settings(fanout="local", secret=secret, port=0, authenticate=mode, **options)
        served = await start_served(settings, app=app)
        started.append(served)
        return served

    sessions.set_default_store(None)
    sessions.MEMORY.clear()
    try:
        yield make
    finally:
        for served in started:
            await served.stop()
        api.set_default_fanout(None)
        set_settings(None)
        sessions.set_default_store(None)
        sessions.MEMORY.clear()


# -- the matrix -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode,token_kind,place,origin", list(matrix()))
async def test_handshake_matrix(
    start: Start, logs: pytest.LogCaptureFixture, mode: str, token_kind: str, place: str, origin: str
) -> None:
    """Each mode × token × place × Origin cell ends as the oracle says, with clean logs."""
    served = await start(mode)
    # The local server's revocations are its own (memory) store's: `revoked` is revoked there.
    token = make_token(token_kind, served.settings, store=served.server.store)
    got = await attempt(served.server.port, token, place, ORIGINS[origin])
    assert got == expected(mode, token_kind, origin)
    assert_clean_logs(logs.records, [token])


def test_the_matrix_covers_every_cell_once() -> None:
    """3 modes × (1 tokenless + 6 tokens × 2 places) × 3 origins, no cell twice."""
    cells = [tuple(p.values) for p in matrix()]
    assert len(cells) == len(set(cells)) == 3 * (1 + 6 * 2) * 3


async def test_same_origin_is_the_default(start: Start) -> None:
    """Without LIVEPUSH_ALLOWED_ORIGINS only the server's own origin (Host's host and port) may connect."""
    served = await start("optional", allowed_origins=None)
    port = served.server.port
    assert await attempt(port, origin=f"http://127.0.0.1:{port}") == hello(None)
    assert await attempt(port, origin=f"http://127.0.0.1:{port + 1}") == http(403)
    assert await attempt(port, origin=ALLOWED_ORIGIN) == http(403)
    assert await attempt(port) == hello(None)  # no Origin: not a browser, not checked


async def test_the_query_token_the_page_passes_counts_before_the_cookie(start: Start) -> None:
    """With a valid token in both places the query's is used: what the page's own script passes
    comes before the ambient cookie, which a sibling subdomain can plant where the site's cookie
    has a Domain (reference §5, Handshake). A site whose pages copy their own URL into the socket's turns
    query tokens off (LIVEPUSH_QUERY_TOKENS=off), and then the cookie counts."""
    served = await start("optional")
    cookie = sessions.issue("from-cookie")
    query = sessions.issue("from-query")
    assert await attempt(served.server.port, cookie, "cookie", raw_query=f"token={query}") == hello("from-query")
    served = await start("optional", query_tokens=False)
    assert await attempt(served.server.port, cookie, "cookie", raw_query=f"token={query}") == hello("from-cookie")


# -- bad input ------------------------------------------------------------------------------

GARBAGE = [
    "garbage",
    "a.b",
    "a.b.c.d",
    "....",
    "-_-_-_-_",
    "eyJzdWIiOiJ1c2VyLTcifQ.c2lnbmF0dXJl",
    '{"subject":"user-7"}',
    "null",
    "x" * 4000,
    "%00%0a%0d",
    "Bearer abc",
]


@pytest.mark.parametrize("mode", ["optional", "required"])
@pytest.mark.parametrize("place", PLACES)
async def test_garbage_tokens_are_refused_cleanly(
    start: Start, logs: pytest.LogCaptureFixture, mode: str, place: str
) -> None:
    """Garbage in the cookie or the query is no session: anonymous or 4401, never a traceback or an echo."""
    served = await start(mode)
    want = hello(None) if mode == "optional" else closed(4401)
    garbage = [*GARBAGE, served.sign("user:7")]  # signed by us, but a topic, not a session
    for text in garbage:
        assert await attempt(served.server.port, text, place) == want, text
    assert_clean_logs(logs.records, [g for g in garbage if len(g) >= 8])


@pytest.mark.parametrize("mode", ["optional", "required"])
async def test_non_ascii_tokens_are_refused_cleanly(start: Start, logs: pytest.LogCaptureFixture, mode: str) -> None:
    """Non-ASCII in the cookie or the query (raw bytes, percent-encoded, invalid UTF-8) is no session."""
    served = await start(mode)
    port = served.server.port
    want = hello(None) if mode == "optional" else closed(4401)
    token = sessions.issue(SUBJECT)
    utf8 = "jeton-\u00e9t\u00e9-\u4e2d\u6587-\U0001f36a".encode()
    cases = {
        "query, percent-encoded UTF-8": await attempt(port, "jeton-\u00e9t\u00e9-\u4e2d\u6587", "query"),
        "query, token + \u00e9": await attempt(port, token + "\u00e9", "query"),
        "query, invalid UTF-8 escapes": await attempt(port, raw_query="token=%FF%FE%C3%28" + token[:20]),
        "cookie, raw UTF-8 bytes": await raw_attempt(port, headers=[(b"Cookie", b"livepush_session=" + utf8)]),
        "cookie, token + latin-1 byte": await raw_attempt(
            port, headers=[(b"Cookie", b"a=\xff; livepush_session=" + token.encode() + b"\xe9")]
        ),
    }
    assert cases == {name: want for name in cases}
    # Raw non-ASCII bytes in the request target are not HTTP: refused with 400 before livepush
    # routes the request (nothing logged above DEBUG), rather than a hang-up with no status.
    assert await raw_attempt(port, b"/?token=" + utf8) == http(400)
    assert await raw_attempt(port, b"/?token=" + token.encode() + b"\xe9\xff") == http(400)
    # The same raw handshake with a clean token works: the refusals above are about the bytes.
    assert await raw_attempt(port, headers=[(b"Cookie", b"livepush_session=" + token.encode())]) == hello(SUBJECT)
    assert_clean_logs(logs.records, [token])


@pytest.mark.parametrize("mode", ["optional", "required"])
async def test_a_100_kb_cookie_is_handled(start: Start, logs: pytest.LogCaptureFixture, mode: str) -> None:
    """A Cookie line as long as the HTTP parser accepts is read in full (the session among ~8 KB
    of junk is found, a 7 KB livepush_session value is no session); 100 KB of cookies, which
    need many Cookie lines, get 400 like any repeated Cookie header: never a 500 or a traceback."""
    served = await start(mode)
    port = served.server.port
    token = sessions.issue(SUBJECT)
    junk = "; ".join(f"junk{j}={'v' * 70}" for j in range(100))
    line = f"theme=dark; {junk}; livepush_session={token}; lang=en"
    assert 7_500 < len("Cookie: " + line) < 8_192, "one line, just under the parser's limit"
    assert await attempt(port, headers=[("Cookie", line)]) == hello(SUBJECT)
    huge = [("Cookie", "livepush_session=" + "A" * 7000)]
    want = hello(None) if mode == "optional" else closed(4401)
    assert await attempt(port, headers=huge) == want
    lines = [("Cookie", "; ".join(f"junk{i}_{j}={'v' * 70}" for j in range(90))) for i in range(15)]
    assert sum(len(v) for _, v in lines) > 100_000
    assert await attempt(port, token, "cookie", headers=lines) == http(400)
    assert await attempt(port, token, "cookie") == hello(SUBJECT), "and the server carries on"
    assert_clean_logs(logs.records, [token, "A" * 100])


async def test_a_single_100_kb_cookie_line_gets_431_without_a_traceback(
    start: Start, logs: pytest.LogCaptureFixture
) -> None:
    """One 100 KB Cookie header line is over the HTTP parser's line limit: 431, nothing logged as an error."""
    served = await start("optional")
    port = served.server.port
    got = await attempt(port, headers=[("Cookie", "livepush_session=" + "A" * 100_000)])
    assert got == http(431)
    assert await attempt(port) == hello(None)  # and the server carries on
    assert_clean_logs(logs.records, ["A" * 100])


async def test_an_upgrade_with_128_header_lines_is_served_and_one_more_gets_431(
    start: Start, logs: pytest.LogCaptureFixture
) -> None:
    """The documented bound on a request head's header lines, proxies' additions included: 128 are
    served, 129 get 431, and nothing is logged as an error."""
    served = await start("optional")
    port = served.server.port
    fill = [(f"X-Added-{i}".encode(), b"1") for i in range(128 - len(upgrade_headers(port)))]
    assert await raw_attempt(port, headers=fill) == hello(None)
    assert await raw_attempt(port, headers=[*fill, (b"X-One-More", b"1")]) == http(431)
    assert_clean_logs(logs.records, [])


async def test_a_request_line_past_8_kib_gets_414_without_a_traceback(
    start: Start, logs: pytest.LogCaptureFixture
) -> None:
    """The request line has the same 8 KiB bound as a header line, and past it the status names the
    target as too long (414), as the reference says: a token in the query cannot make it 431."""
    served = await start("optional")
    port = served.server.port
    assert await raw_attempt(port, target=b"/?token=" + b"A" * 9000) == http(414)
    assert await raw_attempt(port, target=b"/?token=" + b"A" * 7000) == hello(None)  # under the bound: served
    assert_clean_logs(logs.records, ["A" * 100])


@pytest.mark.parametrize("mode", ["optional", "required"])
async def test_a_token_for_another_deployment_is_no_session(
    start: Start, logs: pytest.LogCaptureFixture, mode: str
) -> None:
    """A well-formed token signed with a secret this server does not know is refused, and not logged."""
    served = await start(mode)
    token = issue_with(new_secret())
    want = hello(None) if mode == "optional" else closed(4401)
    assert await attempt(served.server.port, token, "query") == want
    assert await attempt(served.server.port, token, "cookie") == want
    assert_clean_logs(logs.records, [token])


# -- rules through the server ---------------------------------------------------------------

RULES = [Allow("public:*", anonymous=True), Allow("user:{subject}")]


async def open_client(served: Served, subject: str | None = None) -> WSClient:
    headers = {"Cookie": f"livepush_session={sessions.issue(subject)}"} if subject else {}
    client = await WSClient.open(served.url, additional_headers=headers)
    assert client.hello["session"] == ({"subject": subject} if subject else None)
    return client


async def test_anonymous_rule_allows_anonymous_connections(start: Start) -> None:
    """Allow("public:*", anonymous=True) lets anonymous connections and sessions subscribe; other topics stay forbidden."""
    served = await start("optional", app=App(rules=RULES))
    anonymous = await open_client(served)
    assert (await anonymous.subscribe("public:news"))["op"] == "subscribed"
    assert (await anonymous.subscribe("public:news:eu"))["op"] == "subscribed"
    assert (await anonymous.subscribe("private:news"))["reason"] == "forbidden"
    with_session = await open_client(served, "7")
    assert (await with_session.subscribe("public:news"))["op"] == "subscribed"
    await served.publish("public:news", {"n": 1})
    assert [m["data"] for m in await anonymous.messages(1)] == [{"n": 1}]
    assert [m["data"] for m in await with_session.messages(1)] == [{"n": 1}]
    await anonymous.close()
    await with_session.close()


async def test_subject_rule_allows_only_the_matching_session(start: Start) -> None:
    """Allow("user:{subject}"): subject 7 gets user:7 and is refused user:8; anonymous is refused user:7."""
    served = await start("optional", app=App(rules=RULES))
    seven = await open_client(served, "7")
    assert (await seven.subscribe("user:7"))["op"] == "subscribed"
    assert (await seven.subscribe("user:8"))["reason"] == "forbidden"
    assert (await seven.subscribe("user:70"))["reason"] == "forbidden"
    anonymous = await open_client(served)
    assert (await anonymous.subscribe("user:7"))["reason"] == "forbidden"
    await served.publish("user:8", {"for": 8})
    await served.publish("user:7", {"for": 7})
    assert [m["data"] for m in await seven.messages(1)] == [{"for": 7}]
    await seven.close()
    await anonymous.close()


async def test_a_server_that_ignores_tokens_says_which_rules_can_allow_nothing(
        start: Start, logs: pytest.LogCaptureFixture) -> None:
    """Under LIVEPUSH_AUTHENTICATE=off every connection is anonymous, so a rule that needs a
    session refuses every subscribe, each a `forbidden` the client takes as final: the server says
    so once as it starts, naming those rules and the setting, and says nothing when none needs one."""
    served = await start("off", app=App(rules=RULES))
    said = [r for r in logs.records if r.name == "livepush.server" and "LIVEPUSH_AUTHENTICATE=off" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING, said
    text = said[0].getMessage()
    assert "Allow('user:{subject}')" in text and "public:*" not in text and "optional" in text, text
    anonymous = await open_client(served)
    assert (await anonymous.subscribe("public:news"))["op"] == "subscribed"  # as documented: anonymous rules work
    await anonymous.close()
    logs.clear()
    await start("off", app=App(rules=[Allow("public:*", anonymous=True)]))
    await start("optional", app=App(rules=RULES))
    assert not [r for r in logs.records if "LIVEPUSH_AUTHENTICATE=off" in r.getMessage()]


async def test_authorize_raising_refuses_and_is_logged_once_not_sent(
    start: Start, logs: pytest.LogCaptureFixture
) -> None:
    """An exception in authorize answers unavailable (op/ref/reason only: the client retries later) and is logged once, not sent."""

    def authorize(session: object, topic: str) -> bool:
        raise RuntimeError("database password is hunter2")

    served = await start("optional", app=App(rules=RULES, authorize=authorize))
    client = await open_client(served, "7")
    first = await client.subscribe("orders:1")
    assert first == {"op": "refused", "ref": first["ref"], "reason": "unavailable"}
    second = await client.subscribe("orders:2")
    assert second == {"op": "refused", "ref": second["ref"], "reason": "unavailable"}
    assert (await client.subscribe("user:7"))["op"] == "subscribed"  # rules still work
    await client.close()
    mentions = [r for r in logs.records if r.name.startswith("livepush") and "authorize" in r.getMessage()]
    assert len(mentions) == 1 and mentions[0].levelno == logging.ERROR, [r.getMessage() for r in mentions]
    assert "RuntimeError" in mentions[0].getMessage()


async def test_async_authorize_timing_out_refuses(start: Start) -> None:
    """An async authorize that does not answer within authorize_timeout is answered unavailable, in time."""
    never = asyncio.Event()

    async def authorize(session: object, topic: str) -> bool:
        await never.wait()
        return True

    served = await start("optional", app=App(authorize=authorize, authorize_timeout=0.1))
    client = await open_client(served, "7")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert (await client.subscribe("orders:1"))["reason"] == "unavailable"
    # The authorize never answers: any bound shows the timeout; 3 s leaves a loaded machine room.
    assert loop.time() - t0 < 3.0
    await client.close()


async def test_sync_authorize_blocking_refuses_and_the_server_stays_responsive(start: Start) -> None:
    """A sync authorize that blocks past authorize_timeout is answered unavailable; other clients are not held up."""
    entered, release = threading.Event(), threading.Event()

    def authorize(session: object, topic: str) -> bool:
        entered.set()
        release.wait(10)  # blocks its pool thread, never the event loop
        return True

    served = await start("optional", app=App(rules=RULES, authorize=authorize, authorize_timeout=0.2))
    try:
        client = await open_client(served, "7")
        other = await open_client(served)
        pending = asyncio.ensure_future(client.subscribe("orders:1"))
        assert await asyncio.to_thread(entered.wait, 5), "authorize was never called"
        await other.send({"op": "ping", "ref": "p"})
        # While authorize blocks (10 s): a loop it held would miss the default bound too.
        assert await other.recv() == {"op": "pong", "ref": "p"}
        assert (await pending)["reason"] == "unavailable"
        await client.close()
        await other.close()
    finally:
        release.set()


async def test_authorize_allows_what_rules_do_not_cover(start: Start) -> None:
    """authorize returning True allows a topic no rule covers; anything but True refuses."""

    async def authorize(session: Any, topic: str) -> Any:
        return True if topic == "orders:mine" else "yes"

    served = await start("optional", app=App(rules=RULES, authorize=authorize))
    client = await open_client(served, "7")
    assert (await client.subscribe("orders:mine"))["op"] == "subscribed"
    assert (await client.subscribe("orders:theirs"))["reason"] == "forbidden"
    await client.close()


async def test_a_connection_lost_while_authorize_answers_leaves_no_subscription_behind(start: Start) -> None:
    """A connection that ends just as authorize() allows its subscribe leaves nothing on the server:
    no subscriber in the hub, and the subscriptions gauge back where it was."""
    served: Served | None = None

    async def authorize(session: object, topic: str) -> bool:
        assert served is not None
        for conn in list(served.server.clients):
            conn.transport.abort()  # the connection ends while the answer is on its way
        return True

    served = await start("optional", app=App(rules=RULES, authorize=authorize))
    before = value(await scrape(served.server.port), "livepush_subscriptions")
    client = await open_client(served, "7")
    await client.send({"op": "subscribe", "topic": "orders:lost", "since": None, "ref": 1})
    assert await client.closed_with() is None, "aborted: no close frame"
    await async_wait_for(lambda: not served.server.clients, 5, message="the server to see the connection lost")
    await async_wait_for(lambda: "orders:lost" not in served.server.hub._topics, 5,
                         message="the hub to forget the lost connection's subscription")
    assert value(await scrape(served.server.port), "livepush_subscriptions") == before


async def test_subscription_limit(start: Start) -> None:
    """With max_subscriptions=3 the 4th distinct topic is refused with limit; re-subscribing one held is not."""
    served = await start("optional", app=App(rules=RULES, max_subscriptions=3))
    client = await open_client(served)
    for topic in ("public:a", "public:b", served.sign("room:c")):
        assert (await client.subscribe(topic))["op"] == "subscribed", topic
    assert (await client.subscribe("public:d"))["reason"] == "limit"
    assert (await client.subscribe(served.sign("room:e")))["reason"] == "limit"
    again = await client.subscribe("public:a")
    assert again["op"] == "subscribed" and again["topic"] == "public:a"
    await client.send({"op": "unsubscribe", "topic": "public:b"})
    assert (await client.subscribe("public:d"))["op"] == "subscribed"  # a freed slot can be used
    await client.close()



async def test_a_subscribe_past_the_limit_is_refused_without_asking_authorize(start: Start) -> None:
    """A client at max_subscriptions gets `limit` for a new topic before the app's authorize() runs:
    a client sending refused subscribes in a loop does not make the app check each one."""
    asked: list[str] = []

    def authorize(session: Any, topic: str) -> bool:
        asked.append(topic)
        return True

    served = await start("optional", app=App(rules=RULES, authorize=authorize, max_subscriptions=2))
    client = await open_client(served)
    for topic in ("other:a", "other:b"):  # no rule allows them: authorize() decides
        assert (await client.subscribe(topic))["op"] == "subscribed", topic
    assert asked == ["other:a", "other:b"]
    for n in range(5):
        assert (await client.subscribe(f"other:more{n}"))["reason"] == "limit"
    assert asked == ["other:a", "other:b"], "authorize() ran for subscribes refused by the limit"
    await client.close()

# -- serve --app as a child process ---------------------------------------------------------


async def test_serve_with_app_module(procs: Any, livepush_env: Callable[..., dict[str, str]], secret: str) -> None:
    """`livepush serve --app tests.support.security_app:app` applies its rules."""
    env = livepush_env()
    child = await procs.alivepush("serve", "--app", "tests.support.security_app:app", env=env)
    url = f"ws://127.0.0.1:{child.port}/"
    set_settings(Settings(secret=secret))
    try:
        token = sessions.issue("7")
    finally:
        set_settings(None)
    seven = await WSClient.open(url, additional_headers={"Cookie": f"livepush_session={token}"})
    assert seven.hello["session"] == {"subject": "7"}
    assert (await seven.subscribe("user:7"))["op"] == "subscribed"
    assert (await seven.subscribe("user:8"))["reason"] == "forbidden"
    anonymous = await WSClient.open(url)
    assert anonymous.hello["session"] is None
    assert (await anonymous.subscribe("public:news"))["op"] == "subscribed"
    assert (await anonymous.subscribe("user:7"))["reason"] == "forbidden"
    await seven.close()
    await anonymous.close()
    assert token not in child.stderr() + child.stdout()


@pytest.mark.parametrize(
    "spec,needle",
    [
        ("tests.support.no_such_module:app", "no_such_module"),
        ("tests.support.security_app:no_such_attr", "no_such_attr"),
        ("tests.support.security_app:not_an_app", "not a livepush.App"),
        ("tests.support.security_app", "MODULE:ATTR"),
    ],
    ids=["missing-module", "missing-attribute", "not-an-app", "no-colon"],
)
async def test_serve_with_a_bad_app_exits_2_with_one_line(
    procs: Any, livepush_env: Callable[..., dict[str, str]], spec: str, needle: str
) -> None:
    """A missing module or attribute (or not an App) ends `serve --app` with status 2 and one line."""
    child = await procs.alivepush("serve", "--app", spec, env=livepush_env(), wait_healthy=False)
    assert await child.await_exit(15) == 2, child.output()
    lines = [line for line in child.stderr().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in child.stderr(), child.output()
    assert needle in lines[0], lines[0]



async def test_serve_with_a_rule_whose_anonymous_is_not_a_bool_exits_2_naming_it(
    procs: Any, livepush_env: Callable[..., dict[str, str]]
) -> None:
    """`Allow("team:*", anonymous="no")` (text where True or False belongs) ends `serve --app` with status 2 and one line naming `anonymous`, rather than serving team:* to anonymous clients."""
    child = await procs.alivepush("serve", "--app", "tests.support.security_app_anonymous_text:app",
                                  env=livepush_env(), wait_healthy=False)
    assert await child.await_exit(15) == 2, child.output()
    lines = [line for line in child.stderr().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in child.stderr(), child.output()
    assert "anonymous=" in lines[0] and "'no'" in lines[0], lines[0]


# -- handshakes that fail after the session check --------------------------------------------


async def test_failed_handshakes_leave_no_session_behind(start: Start) -> None:
    """A handshake refused after the session check (here: no Sec-WebSocket-Key, 400) keeps nothing alive in the server."""
    served = await start("optional")
    port = served.server.port
    token = sessions.issue(SUBJECT)
    for _ in range(20):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"GET /?token={token} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        status = await asyncio.wait_for(reader.readline(), 5)
        assert status.split()[1] == b"400", status
        writer.close()
        await writer.wait_closed()
    assert await attempt(port, token, "query") == hello(SUBJECT)  # served after all that

    def leftovers() -> int:
        core = served.server._core
        assert core is not None
        # What the connection core keeps for a handshake under way (and a connection it never
        # attached): it must not outlive a handshake that was refused.
        return len(core._opening) + len(core._handshakes) + core._live - len(served.server.clients)

    await async_wait_for(lambda: leftovers() == 0, timeout=5, message="no per-handshake state left")
