"""Helpers for the end-to-end security tests: tokens of every kind, one handshake attempt
reduced to its outcome, and log checks (no traceback, no token text)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets as _secrets
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple
from urllib.parse import quote

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from livepush import config, sessions
from livepush.config import Settings
from tests.support.http import upgrade_request

SUBJECT = "user-7"
ALLOWED_ORIGIN = "http://app.example"
FOREIGN_ORIGIN = "http://evil.example"
ORIGINS = {"none": None, "allowed": ALLOWED_ORIGIN, "foreign": FOREIGN_ORIGIN}
HANDSHAKE_TIMEOUT = 5.0


def new_secret() -> str:
    """A random secret long enough for LIVEPUSH_SECRET."""
    return _secrets.token_urlsafe(36)


class Outcome(NamedTuple):
    """What one connection attempt came to: ("http", status) when the handshake was refused,
    ("close", code) when it completed and the server closed before hello, ("hello", subject
    or None) when the server greeted the client, ("dropped", None) when it hung up without
    an HTTP answer."""

    kind: str
    value: int | str | None

    def __repr__(self) -> str:
        return f"{self.kind}({self.value!r})"


def http(status: int) -> Outcome:
    return Outcome("http", status)


def closed(code: int) -> Outcome:
    return Outcome("close", code)


def dropped() -> Outcome:
    """The server closed the TCP connection without an HTTP answer (a request it cannot parse)."""
    return Outcome("dropped", None)


def hello(subject: str | None) -> Outcome:
    return Outcome("hello", subject)


# -- tokens ---------------------------------------------------------------------------------


@contextlib.contextmanager
def signing_with(secret: str) -> Iterator[None]:
    """Make sessions.issue() sign with `secret` for a moment (a token from another
    deployment, or from before a rotation), then put the previous settings back."""
    previous = config.get_settings()
    config.set_settings(Settings(secret=secret))
    try:
        yield
    finally:
        config.set_settings(previous)


def issue_with(secret: str, subject: str = SUBJECT, ttl: float = 600, now: float | None = None) -> str:
    with signing_with(secret):
        return sessions.issue(subject, ttl=ttl, now=now)


def tamper(token: str) -> str:
    """The token with one character of its signed payload changed."""
    payload, _, sig = token.rpartition(".")
    i = len(payload) // 2
    return payload[:i] + ("A" if payload[i] != "A" else "B") + payload[i + 1 :] + "." + sig


def make_token(
    kind: str, settings: Settings, *, subject: str = SUBJECT, store: sessions.RevocationStore | None = None
) -> str | None:
    """A token of `kind` for a server running with `settings` (the current settings must be
    those, as after start_served): none, valid, expired, revoked, tampered, other_secret,
    fallback_secret. `revoked` is revoked in `store` when one is given (e.g. a local server's
    own memory store, which revoke() refuses since no other process sees it), else through
    sessions.revoke() (the default store, which must be shared)."""
    assert settings.secret is not None
    if kind == "none":
        return None
    if kind == "valid":
        return sessions.issue(subject, ttl=600)
    if kind == "expired":
        return sessions.issue(subject, ttl=60, now=time.time() - 3600)
    if kind == "revoked":
        token = sessions.issue(subject, ttl=600)
        if store is None:
            sessions.revoke(token)
        else:
            session = sessions.decode(token, settings.secrets)
            store.add_session(session.id, session.expires_at)
        return token
    if kind == "tampered":
        return tamper(sessions.issue(subject, ttl=600))
    if kind == "other_secret":
        return issue_with(new_secret(), subject)
    if kind == "fallback_secret":
        assert settings.secret_fallbacks, "the server needs LIVEPUSH_SECRET_FALLBACKS for this token"
        return issue_with(settings.secret_fallbacks[0], subject)
    raise ValueError(f"unknown token kind {kind!r}")


# -- one connection attempt -----------------------------------------------------------------


def token_request(
    port: int, token: str | None, where: str, *, raw_query: str | None = None
) -> tuple[str, list[tuple[str, str]]]:
    """(url, headers) carrying `token` in the livepush_session cookie or the token query
    parameter (percent-encoded); `raw_query` is appended to the URL as it is."""
    url = f"ws://127.0.0.1:{port}/"
    headers: list[tuple[str, str]] = []
    if token is not None:
        if where == "cookie":
            headers.append(("Cookie", f"theme=dark; livepush_session={token}; lang=en"))
        elif where == "query":
            url += "?token=" + quote(token, safe="")
        else:
            raise ValueError(f"unknown token place {where!r}")
    if raw_query is not None:
        url += ("&" if "?" in url else "?") + raw_query
    return url, headers


async def attempt(
    port: int,
    token: str | None = None,
    where: str = "cookie",
    origin: str | None = None,
    *,
    headers: Sequence[tuple[str, str]] = (),
    raw_query: str | None = None,
) -> Outcome:
    """Open one connection and report how the server answered (see Outcome)."""
    url, hdrs = token_request(port, token, where, raw_query=raw_query)
    hdrs += list(headers)
    try:
        ws = await asyncio.wait_for(
            connect(url, additional_headers=hdrs, origin=origin, open_timeout=HANDSHAKE_TIMEOUT),  # type: ignore[arg-type]
            HANDSHAKE_TIMEOUT * 2,
        )
    except InvalidStatus as exc:
        return http(exc.response.status_code)
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT):
            raw = await ws.recv()
    except ConnectionClosed as exc:
        return closed(exc.rcvd.code if exc.rcvd else -1)
    finally:
        await ws.close()
    frame = json.loads(raw)
    assert frame["op"] == "hello", frame
    session = frame["session"]
    return hello(session["subject"] if session is not None else None)


def raw_request(port: int, headers: list[tuple[str, str]], path: str = "/") -> bytes:
    """Send one HTTP request with exactly these headers; return the status line and headers."""
    lines = [f"GET {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in headers]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return sock.recv(65536)


async def raw_attempt(port: int, target: bytes = b"/", headers: Sequence[tuple[bytes, bytes]] = ()) -> Outcome:
    """attempt() with the handshake written by hand, for bytes a well-behaved client refuses
    to send (raw non-ASCII or invalid UTF-8 in the request target or a header)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), HANDSHAKE_TIMEOUT)
    try:
        writer.write(upgrade_request(port, target=target, headers=headers))
        await writer.drain()
        async with asyncio.timeout(HANDSHAKE_TIMEOUT):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return dropped()
            status = int(head.split(b" ", 2)[1])
            if status != 101:
                return http(status)
            first, second = await reader.readexactly(2)
            length = second & 0x7F
            if length == 126:
                length = int.from_bytes(await reader.readexactly(2), "big")
            payload = await reader.readexactly(length)
    finally:
        writer.close()
    opcode = first & 0x0F
    if opcode == 0x8:
        return closed(int.from_bytes(payload[:2], "big"))
    assert opcode == 0x1, f"unexpected first frame, opcode {opcode}"
    frame = json.loads(payload)
    assert frame["op"] == "hello", frame
    session = frame["session"]
    return hello(session["subject"] if session is not None else None)


# -- logs -----------------------------------------------------------------------------------


def assert_clean_logs(records: Iterable[logging.LogRecord], tokens: Iterable[str | None] = ()) -> None:
    """No record carries a traceback or is an error, and none contains any of `tokens`
    (message and traceback text alike)."""
    needles = [s for s in tokens if s]
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    for record in records:
        text = formatter.format(record)
        assert record.exc_info is None and record.levelno < logging.ERROR, f"a traceback or error was logged: {text}"
        for needle in needles:
            # A short needle (a fragment) could match by chance; tokens are long.
            assert needle not in text, f"a token reached a log record: {record.name} {record.levelname}"

