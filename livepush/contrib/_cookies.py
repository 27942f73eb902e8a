"""The `livepush_session` cookie as any web framework sets it (docs/reference.md#5-wire-protocol,
Handshake): which name, value and attributes, given a token and whether the request is secure.

The server reads the token from `livepush_session` or `__Host-livepush_session`, and two different
session cookies count as none, so whoever sets one name must delete the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..sessions.handshake import COOKIE_NAME, HOST_COOKIE_NAME

COOKIE_NAMES = (HOST_COOKIE_NAME, COOKIE_NAME)


@dataclasses.dataclass(frozen=True)
class SessionCookie:
    """One Set-Cookie for a session token. `other_name`: the session cookie name to delete beside it."""

    name: str
    value: str
    max_age: int
    secure: bool
    domain: str | None = None
    path: str = "/"
    httponly: bool = True  # no page script ever needs the token: the browser sends it
    samesite: str = "Lax"  # the WebSocket handshake is a same-site GET; Lax keeps other sites' posts out

    @property
    def other_name(self) -> str:
        return COOKIE_NAME if self.name == HOST_COOKIE_NAME else HOST_COOKIE_NAME


def session_cookie(token: str, *, secure: bool, max_age: float, domain: str | None = None) -> SessionCookie:
    """The cookie carrying `token`: `__Host-livepush_session` on a secure request without a domain
    (the browser then refuses it from any other host or path), else `livepush_session` (a domain
    shared with the push server's host, e.g. `example.com` for `push.example.com`)."""
    name = HOST_COOKIE_NAME if secure and not domain else COOKIE_NAME
    return SessionCookie(name=name, value=token, max_age=max(0, int(max_age)), secure=secure, domain=domain)


def session_token(cookies: Mapping[str, str]) -> str | None:
    """The session token a request's cookies carry, read as the server reads it: None when two
    different ones are present."""
    found = {cookies[name] for name in COOKIE_NAMES if cookies.get(name)}
    return found.pop() if len(found) == 1 else None
