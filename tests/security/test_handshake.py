"""Handshake and HTTP: duplicated headers are refused and a target that is not a URL answered,
without a traceback, `*` never reads cookies, bad origin entries end the command, the `__Host-`
cookie and the subprotocol token are accepted, query tokens can be turned off, client
mistakes are logged quietly, and a refused origin is named once in a warning."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import sys
import warnings
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from livepush import sessions
from livepush.cli.commands import main as cli
from livepush.config import Settings, set_settings
from livepush.errors import ConfigError, DependencyError
from livepush.fanout.local import LocalFanOut
from livepush.server.app import WARNED_ORIGINS, PushServer
from livepush.server.limits import FirstOfEach
from livepush.sessions import MemoryRevocations
from tests.server.conftest import Served, make_settings, start_served
from tests.support.http import upgrade_headers, upgrade_request
from tests.support.security import attempt, hello, http, raw_attempt, raw_request, signing_with
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient


async def serve(secret: str, **settings: object) -> Served:
    return await start_served(make_settings("local", secret, None, None, **settings))


@pytest.fixture
async def served(secret: str) -> AsyncIterator[Served]:
    s = await serve(secret)
    try:
        yield s
    finally:
        await s.stop()


async def test_duplicated_headers_get_400_and_no_traceback(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """A handshake or an HTTP request with two Origin, Upgrade, Host or Cookie headers gets 400 and leaves no error in the log."""
    caplog.set_level(logging.DEBUG)
    port = served.server.port
    base = upgrade_headers(port)
    for name, value in (("Origin", "http://127.0.0.1"), ("Upgrade", "websocket"), ("Host", "other"),
                        ("Cookie", "a=b")):
        answer = await asyncio.to_thread(raw_request, port, base + [(name, value), (name, value + "x")])
        assert answer.startswith(b"HTTP/1.1 400"), (name, answer[:80])
    answer = await asyncio.to_thread(raw_request, port, [("Host", "h"), ("Upgrade", "a"), ("Upgrade", "b")], "/healthz")
    assert answer.startswith(b"HTTP/1.1 400"), answer[:80]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.text
    assert "Traceback" not in caplog.text


async def test_an_upgrade_without_a_host_header_gets_400_saying_so(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """Every HTTP/1.1 request names its Host (RFC 9112 asks a server to refuse one that does not, with 400): an
    upgrade without one is refused, and an empty Host counts as one; a plain request (a health probe) is still answered."""
    caplog.set_level(logging.DEBUG)
    port = served.server.port
    base = [(name, value) for name, value in upgrade_headers(port) if name != "Host"]
    answer = await asyncio.to_thread(raw_request, port, base)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:80]
    assert b"Host header" in answer, answer
    assert (await asyncio.to_thread(raw_request, port, base + [("Host", "")])).startswith(b"HTTP/1.1 101")
    assert (await asyncio.to_thread(raw_request, port, [], "/healthz")).startswith(b"HTTP/1.1 200")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.text


async def test_a_request_target_that_is_not_a_url_is_answered_without_a_traceback(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """`//[` as the request target (an unbalanced bracket where a URL would have its host): a plain GET gets 404 and an upgrade is served, and neither leaves an error in the log."""
    caplog.set_level(logging.DEBUG)
    port = served.server.port
    answer = await asyncio.to_thread(raw_request, port, [("Host", "h")], "//[")
    assert answer.startswith(b"HTTP/1.1 404"), answer[:80]
    assert await raw_attempt(port, b"//[") == hello(None)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.text


async def test_any_origin_never_reads_cookie_sessions(secret: str) -> None:
    """With LIVEPUSH_ALLOWED_ORIGINS=* a session cookie is ignored (any site could use it); a token in the subprotocol still works."""
    s = await serve(secret, allowed_origins=("*",))
    token = sessions.issue("frank")
    try:
        by_cookie = await WSClient.open(s.url, additional_headers={"Cookie": f"livepush_session={token}",
                                                                   "Origin": "https://evil.example"})
        assert by_cookie.hello["session"] is None
        by_protocol = await WSClient.open(s.url, subprotocols=["livepush", f"livepush.token.{token}"])
        assert by_protocol.hello["session"] == {"subject": "frank"}
        for c in (by_cookie, by_protocol):
            await c.close()
    finally:
        await s.stop()


def test_entries_that_are_not_origins_end_the_command(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str], secret: str) -> None:
    """`app.example.com` or `null` in LIVEPUSH_ALLOWED_ORIGINS ends `serve` with exit 2 and a line naming the entry."""
    for entry in ("app.example.com", "null", "https://ok.example,ftp://x.example", "wss://push.example",
                  # a '*' matches only as a whole subdomain label up front: anywhere else it would never match
                  "https://exa*mple.com", "https://app.*.example.com", "https://*example.com", "https://*.*.example.com"):
        with pytest.raises(ConfigError, match="is not an origin"):
            Settings.from_env({"LIVEPUSH_ALLOWED_ORIGINS": entry, "LIVEPUSH_SECRET": secret})
    for nothing in (",", " , ,"):
        with pytest.raises(ConfigError, match="names no origin"):
            Settings.from_env({"LIVEPUSH_ALLOWED_ORIGINS": nothing, "LIVEPUSH_SECRET": secret})
    monkeypatch.setenv("LIVEPUSH_ALLOWED_ORIGINS", "https://app.example.com,null")
    monkeypatch.setenv("LIVEPUSH_SECRET", secret)
    assert cli(["serve"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'null'" in err[0] and "LIVEPUSH_ALLOWED_ORIGINS" in err[0], err
    Settings.from_env({"LIVEPUSH_ALLOWED_ORIGINS": "https://*.example.com,http://localhost:8000,*"})


async def test_the_host_prefixed_cookie_is_accepted_and_two_different_cookies_are_none(served: Served) -> None:
    """`__Host-livepush_session` carries a session; two different session cookies carry none (a planted one beside the real one)."""
    mine, planted = sessions.issue("gina"), sessions.issue("mallory")
    host = await WSClient.open(served.url, additional_headers={"Cookie": f"__Host-livepush_session={mine}"})
    assert host.hello["session"] == {"subject": "gina"}
    both = await WSClient.open(served.url, additional_headers={
        "Cookie": f"__Host-livepush_session={mine}; livepush_session={planted}"})
    assert both.hello["session"] is None
    same = await WSClient.open(served.url, additional_headers={
        "Cookie": f"__Host-livepush_session={mine}; livepush_session={mine}"})
    assert same.hello["session"] == {"subject": "gina"}
    for c in (host, both, same):
        await c.close()


async def test_a_planted_cookie_does_not_take_over_the_token_the_page_passes(served: Served) -> None:
    """A `livepush_session` cookie a sibling subdomain planted for the parent domain (cookie tossing)
    comes with the handshake, but the token the page passes in the subprotocol is the session."""
    mine, planted = sessions.issue("gina"), sessions.issue("mallory")
    client = await WSClient.open(served.url, subprotocols=["livepush", f"livepush.token.{mine}"],
                                 additional_headers={"Cookie": f"livepush_session={planted}"})
    assert client.hello["session"] == {"subject": "gina"}
    await client.close()


async def test_the_token_is_accepted_in_the_subprotocol_and_the_server_selects_livepush(served: Served) -> None:
    """A client offering `livepush` and `livepush.token.<token>` comes in with its session, and the server answers with `livepush`."""
    token = sessions.issue("hana")
    client = await WSClient.open(served.url, subprotocols=["livepush", f"livepush.token.{token}"])
    assert client.hello["session"] == {"subject": "hana"}
    assert client.ws.subprotocol == "livepush"
    plain = await WSClient.open(served.url)
    assert plain.ws.subprotocol is None and plain.hello["session"] is None
    for c in (client, plain):
        await c.close()


async def test_query_tokens_off_refuses_the_query_and_keeps_the_other_ways(secret: str) -> None:
    """With LIVEPUSH_QUERY_TOKENS=off a `?token=` is ignored (anonymous), while the cookie and the subprotocol still work."""
    s = await serve(secret, query_tokens=False)
    token = sessions.issue("ivan")
    try:
        query = await WSClient.open(s.url + f"?token={token}")
        assert query.hello["session"] is None
        cookie = await WSClient.open(s.url, additional_headers={"Cookie": f"livepush_session={token}"})
        protocol = await WSClient.open(s.url, subprotocols=["livepush", f"livepush.token.{token}"])
        assert cookie.hello["session"] == protocol.hello["session"] == {"subject": "ivan"}
        for c in (query, cookie, protocol):
            await c.close()
    finally:
        await s.stop()
    assert Settings.from_env({"LIVEPUSH_QUERY_TOKENS": "off"}).query_tokens is False
    with pytest.raises(ConfigError, match="LIVEPUSH_QUERY_TOKENS"):
        Settings.from_env({"LIVEPUSH_QUERY_TOKENS": "maybe"})


async def test_client_mistakes_are_logged_at_debug_and_rate_limited(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """Fifty refusals of one origin and fifty bad tokens leave one WARNING, naming the origin the
    first time, and otherwise nothing above DEBUG in the log, and at most ten lines of each."""
    caplog.set_level(logging.DEBUG, logger="livepush")
    port = served.server.port
    for _ in range(50):
        await asyncio.to_thread(raw_request, port, upgrade_headers(port) + [("Origin", "https://evil.example")])
        await asyncio.to_thread(raw_request, port, upgrade_headers(port) + [("Cookie", "livepush_session=forged.token")])
    mine = [r for r in caplog.records if r.name.startswith("livepush")]
    above_debug = [r.getMessage() for r in mine if r.levelno > logging.DEBUG]
    assert len(above_debug) == 1 and "'https://evil.example'" in above_debug[0], above_debug
    debug = [r.getMessage() for r in mine if r.levelno == logging.DEBUG]
    origins = [line for line in debug if "origin" in line]
    tokens = [line for line in debug if "session" in line]
    assert 1 <= len(origins) <= 10 and 1 <= len(tokens) <= 10, (len(origins), len(tokens))


async def refused(port: int, origin: str) -> tuple[int, bytes]:
    """The status and body the server answers a browser handshake from `origin` with, refused."""
    try:
        ws = await connect(f"ws://127.0.0.1:{port}/", origin=origin, open_timeout=5)  # type: ignore[arg-type]
    except InvalidStatus as exc:
        return exc.response.status_code, exc.response.body or b""
    await ws.close()
    raise AssertionError(f"the server let a page of {origin} connect")


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("livepush") and r.levelno >= logging.WARNING]


async def test_a_refused_origin_is_named_once_in_a_warning_that_says_what_to_set(
        secret: str, caplog: pytest.LogCaptureFixture) -> None:
    """A page on an origin the server refuses shows "reconnecting" for ever, and the cause is
    usually the operator's setting (a new domain, a development port). The first refusal of each
    origin is a WARNING naming the origin and LIVEPUSH_ALLOWED_ORIGINS, what to add to it; the
    same origin again adds none. The refusal itself is unchanged: 403 and its body."""
    caplog.set_level(logging.DEBUG, logger="livepush")
    for allowed, said in ((None, "LIVEPUSH_ALLOWED_ORIGINS is unset"),
                          (("https://app.example.com",), "LIVEPUSH_ALLOWED_ORIGINS (https://app.example.com) does "
                                                         "not list it")):
        s = await serve(secret, allowed_origins=allowed)
        try:
            caplog.clear()
            for _ in range(3):
                assert await refused(s.server.port, "http://localhost:8000") == (
                    403, b"origin not allowed: set LIVEPUSH_ALLOWED_ORIGINS\n")
        finally:
            await s.stop()
        [warning] = warnings_of(caplog)
        assert "'http://localhost:8000'" in warning and said in warning, warning
        assert "LIVEPUSH_ALLOWED_ORIGINS=http://localhost:8000" in warning or "add http://localhost:8000" in warning, warning


async def test_an_origin_no_list_can_admit_is_named_with_why(secret: str, caplog: pytest.LogCaptureFixture) -> None:
    """`null`, which a sandboxed frame or a file: page sends, is no origin a list can name: the
    warning says so and that only `*` admits it, rather than to list `null`, which ends the server
    at start."""
    caplog.set_level(logging.DEBUG, logger="livepush")
    s = await serve(secret)
    try:
        assert (await refused(s.server.port, "null"))[0] == 403
    finally:
        await s.stop()
    [warning] = warnings_of(caplog)
    assert "'null'" in warning and "only LIVEPUSH_ALLOWED_ORIGINS=*" in warning, warning


async def test_refused_origins_named_in_warnings_are_bounded(secret: str, caplog: pytest.LogCaptureFixture) -> None:
    """A client sending a new Origin on each handshake cannot fill the log: the first
    WARNED_ORIGINS distinct origins get their WARNING, then one line says that further ones are
    logged at debug level only, and no refusal after it, of a new origin or an old one, adds any."""
    caplog.set_level(logging.DEBUG, logger="livepush")
    s = await serve(secret)
    try:
        port = s.server.port
        for n in range(WARNED_ORIGINS + 20):
            answer = await asyncio.to_thread(raw_request, port, upgrade_headers(port) + [("Origin", f"https://s{n}.example")])
            assert answer.startswith(b"HTTP/1.1 403"), answer[:80]
        first_ones = warnings_of(caplog)
        await asyncio.to_thread(raw_request, port, upgrade_headers(port) + [("Origin", "https://s0.example")])
    finally:
        await s.stop()
    assert [w.split("'")[1] for w in first_ones[:WARNED_ORIGINS]] == [f"https://s{n}.example" for n in range(WARNED_ORIGINS)]
    assert len(first_ones) == WARNED_ORIGINS + 1 and "logged at debug level only" in first_ones[-1], first_ones
    assert warnings_of(caplog) == first_ones


def test_the_named_origins_start_again_each_hour_so_a_scanners_origins_do_not_hide_yours_the_next_hour(
        caplog: pytest.LogCaptureFixture) -> None:
    """Clients that sent ten origins first (a scanner's) took the hour's slots; the operator's own
    missing origin, refused after them, is named once the hour is over. (Pure logic: a clock.)"""
    now = [0.0]
    named = FirstOfEach(logging.getLogger("livepush.test"), 10, "further origins at debug", 3600.0,
                        clock=lambda: now[0])
    assert all(named.new(f"https://scan{n}.example") for n in range(10))
    assert not named.new("https://app.example")
    now[0] += 3600.0
    assert named.new("https://app.example")
    assert not named.new("https://app.example")
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == ["further origins at debug"]


async def test_a_token_the_server_ignores_is_named_in_a_debug_line_without_the_token(
        secret: str, caplog: pytest.LogCaptureFixture) -> None:
    """A connection that comes in anonymous although it sent a token (in the query under
    LIVEPUSH_QUERY_TOKENS=off, in a cookie under LIVEPUSH_ALLOWED_ORIGINS=*, or in two different
    session cookies) leaves a debug line saying where the token was and why it did not count,
    which never holds the token: under `required` such a client is closed with 4401 for good, and
    nothing said why."""
    caplog.set_level(logging.DEBUG, logger="livepush")
    with signing_with(secret):
        token, other = sessions.issue("ivan"), sessions.issue("mallory")
    cases = [({"query_tokens": False}, f"?token={token}", {}, "LIVEPUSH_QUERY_TOKENS=off"),
             ({"allowed_origins": ("*",)}, "", {"Cookie": f"livepush_session={token}"}, "LIVEPUSH_ALLOWED_ORIGINS=*"),
             ({}, "", {"Cookie": f"__Host-livepush_session={token}; livepush_session={other}"},
              "two different session cookies")]
    for settings, query, headers, said in cases:
        s = await serve(secret, **settings)
        try:
            caplog.clear()
            client = await WSClient.open(s.url + query, additional_headers=headers)
            assert client.hello["session"] is None
            await client.close()
        finally:
            await s.stop()
        lines = [r.getMessage() for r in caplog.records if r.name.startswith("livepush")]
        assert any(said in line for line in lines), (said, lines)
        assert not [line for line in lines if token in line or other in line]
    caplog.clear()
    s = await serve(secret)
    try:
        anonymous = await WSClient.open(s.url)
        await anonymous.close()
    finally:
        await s.stop()
    assert not [r for r in caplog.records if "did not count" in r.getMessage()]


class _StoreDown(MemoryRevocations):
    """A revocation store that cannot be reached, as Postgres or Redis during an outage."""

    async def revoked_among(self, sessions: Any) -> set[str]:
        raise DependencyError("cannot reach the revocation store (connection refused)")


async def test_handshakes_during_a_store_outage_log_at_most_ten_lines_a_minute(
        secret: str, caplog: pytest.LogCaptureFixture) -> None:
    """While the revocation store cannot be reached, every handshake with a session gets 503 and reconnects; fifty of them (any signed-in user can make more) log at most ten lines, so clients retrying cannot fill the log."""
    caplog.set_level(logging.DEBUG, logger="livepush")
    settings = make_settings("local", secret, None, None)
    set_settings(settings)
    server = PushServer(settings, LocalFanOut(), store=_StoreDown())
    await server.start()
    try:
        token = sessions.issue("user-7")
        for _ in range(50):
            outcome = await attempt(server.port, token)
            assert outcome == http(503), outcome
    finally:
        await server.stop()
        set_settings(None)
    lines = [r for r in caplog.records if r.name.startswith("livepush") and "sessions" in r.getMessage()]
    assert 1 <= len(lines) <= 10, len(lines)


async def test_an_app_that_configures_livepush_logging_at_debug_never_logs_a_token(
        procs: Any, livepush_env: Any, secret: str) -> None:
    """An --app module whose dictConfig (a Django project's LOGGING) sets the `livepush` loggers to DEBUG, after livepush is loaded, still never gets a token into the log: not from the query, the cookie or the subprotocol."""
    child = await procs.alivepush("serve", "--app", "tests.support.security_app_debug_logging:app",
                                  env=livepush_env())
    url = f"ws://127.0.0.1:{child.port}/"
    set_settings(Settings(secret=secret))
    try:
        by_query, by_cookie, by_protocol = (sessions.issue(subject) for subject in ("q", "c", "p"))
    finally:
        set_settings(None)
    tampered = by_query[:-4] + ("AAAA" if not by_query.endswith("AAAA") else "BBBB")
    clients = [
        await WSClient.open(url + "?token=" + by_query),
        await WSClient.open(url, additional_headers={"Cookie": f"livepush_session={by_cookie}"}),
        await WSClient.open(url, subprotocols=["livepush", f"livepush.token.{by_protocol}"]),
        await WSClient.open(url + "?token=" + tampered),
    ]
    assert [c.hello["session"] for c in clients] == [{"subject": "q"}, {"subject": "c"}, {"subject": "p"}, None]
    for c in clients:
        await c.close()
    assert child.stop(timeout=15) == 0, child.output()
    log = child.stderr() + child.stdout()
    assert "a connection without a valid session: bad_signature" in log, "the app's DEBUG logging took no effect"
    for token in (by_query, by_cookie, by_protocol, tampered):
        assert token not in log


async def test_a_list_header_sent_twice_is_read_as_one_list_without_a_traceback(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """`Accept-Encoding` or `If-None-Match` in two header lines (a list field, RFC 9110 §5.3: proxies may split one so) on GET /livepush.js is read as the two joined, not answered 500 with a traceback in the log."""
    caplog.set_level(logging.DEBUG)
    port = served.server.port
    split = await asyncio.to_thread(raw_request, port, [("Host", "h"), ("Accept-Encoding", "br"),
                                                        ("Accept-Encoding", "gzip")], "/livepush.js")
    assert split.startswith(b"HTTP/1.1 200") and b"Content-Encoding: gzip" in split, split[:200]
    etag = next(line.split(b": ", 1)[1] for line in split.split(b"\r\n") if line.lower().startswith(b"etag:"))
    unchanged = await asyncio.to_thread(raw_request, port, [("Host", "h"), ("If-None-Match", '"other"'),
                                                            ("If-None-Match", etag.decode())], "/livepush.js")
    assert unchanged.startswith(b"HTTP/1.1 304"), unchanged[:80]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.text


def _send_and_leave(port: int, headers: list[tuple[str, str]], path: str = "/") -> None:
    """Send one request and close at once, reading nothing: as a browser leaves a page, or drops
    a refused handshake without reading its answer. The answer then finds the socket reset."""
    lines = [f"GET {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in headers]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())


async def test_a_client_that_leaves_before_its_answer_leaves_no_error_in_the_log(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """A client that sends its request and closes at once (a refused Origin, a plain GET, an upgrade) gets no error and no traceback into the log, however often it does (the refused origin's one warning aside)."""
    caplog.set_level(logging.DEBUG)
    port = served.server.port
    for _ in range(10):
        _send_and_leave(port, upgrade_headers(port) + [("Origin", "https://evil.example")])
        _send_and_leave(port, [("Host", "h")], "/healthz")
        _send_and_leave(port, upgrade_headers(port))
    # Served in the order they came: once this one is, every request above has been read.
    assert await attempt(port, None) == hello(None)
    core = served.server._core
    assert core is not None
    await async_wait_for(lambda: not core._handshakes and core._live == 0, timeout=5,
                         message="every handshake answered and every connection gone")
    gc.collect()  # a task's unretrieved exception is logged when the task goes
    assert not [r for r in caplog.records if (r.levelno >= logging.WARNING and "refused a connection from origin "
                                               "'https://evil.example'" not in r.getMessage()) or r.exc_info], caplog.text


class _StoreHeld(MemoryRevocations):
    """A revocation store whose reads wait until the test lets them go, saying when one began."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = asyncio.Event()
        self.answer = asyncio.Event()

    async def revoked_among(self, sessions: Any) -> set[str]:
        self.reading.set()
        await self.answer.wait()
        return await super().revoked_among(sessions)


async def test_a_client_that_resets_while_its_handshake_is_checked_leaves_nothing_unserved_behind(secret: str) -> None:
    """A client that sends its upgrade and a subscribe in one write, then resets the connection while its session is checked, is not served when the check ends: no subscribe is started for it, so none is left never run (which Python reports on stderr), and the server keeps nothing of it."""
    settings = make_settings("local", secret, None, None)
    set_settings(settings)
    store = _StoreHeld()
    server = PushServer(settings, LocalFanOut(), store=store)
    await server.start()
    try:
        port = server.port
        token = sessions.issue("user-7")
        subscribe = b'{"op":"subscribe","topic":"public:news","since":null,"ref":1}'
        frame = bytes([0x81, 0x80 | len(subscribe)]) + bytes(4) + subscribe  # masked with zeros
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(upgrade_request(port, target=f"/?token={token}".encode()) + frame)
            await asyncio.wait_for(store.reading.wait(), 5)
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                       (1).to_bytes(4, sys.byteorder) + bytes(4))
            writer.transport.abort()  # a reset, while the server is not reading it
            store.answer.set()
            core = server._core
            assert core is not None
            await async_wait_for(lambda: not core._handshakes and core._live == 0 and not server.clients, timeout=5,
                                 message="the reset connection to go")
            gc.collect()
        assert not [w for w in caught if "never awaited" in str(w.message)], [str(w.message) for w in caught]
    finally:
        await server.stop()
        set_settings(None)
