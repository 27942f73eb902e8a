"""The session cookie a web app sets for the WebSocket server, framework-neutral: its name and
attributes for a token (docs/reference.md#handshake, docs/security.md), and the cookies that
delete it on logout."""

from __future__ import annotations

from dataclasses import dataclass

from ..sessions.handshake import COOKIE_NAME, HOST_COOKIE_NAME, cookie_token, session_cookies

# Lax: the cookie goes with a top-level navigation to the app, never with another site's
# WebSocket handshake or POST (a second layer behind the server's Origin check).
SAMESITE = "lax"


@dataclass(frozen=True)
class SessionCookie:
    """One Set-Cookie: a name, a value and its attributes; `max_age=0` deletes the cookie."""

    name: str
    value: str
    max_age: int
    secure: bool
    path: str = "/"
    httponly: bool = True  # out of reach of the page's scripts: an XSS bug cannot read the token
    samesite: str = SAMESITE


def cookie_name(secure: bool) -> str:
    """`__Host-livepush_session` over HTTPS; over plain HTTP a browser would drop a `__Host-`
    cookie (it must be Secure), so `livepush_session`."""
    return HOST_COOKIE_NAME if secure else COOKIE_NAME


def session_cookie(token: str, *, secure: bool, max_age: float) -> SessionCookie:
    """The cookie that carries `token` for `max_age` seconds (the token's TTL): host-only, Path=/,
    HttpOnly, SameSite=Lax, and Secure with the `__Host-` prefix when the request was secure."""
    return SessionCookie(cookie_name(secure), token, max(1, int(max_age)), secure)


def deleting_cookies(*, secure: bool) -> list[SessionCookie]:
    """The cookies that delete the session cookie under each name this app can have set (a
    `__Host-` one exists only over HTTPS, and deleting it needs Secure too)."""
    names = [HOST_COOKIE_NAME, COOKIE_NAME] if secure else [COOKIE_NAME]
    return [SessionCookie(name, "", 0, secure) for name in names]


def stale_cookies(*, secure: bool) -> list[SessionCookie]:
    """What to delete beside a new session cookie: over HTTPS, one under the plain name, left
    from plain HTTP (two different session cookies count as none, docs/reference.md#handshake)."""
    return [SessionCookie(COOKIE_NAME, "", 0, secure)] if secure else []


__all__ = ["SAMESITE", "SessionCookie", "cookie_name", "cookie_token", "deleting_cookies", "session_cookie",
           "session_cookies", "stale_cookies"]
