"""The `livepush_session` cookie as any web framework sets it (docs/reference.md#handshake,
docs/security.md): which name, value and attributes, given a token and whether the request is
secure, and which cookies delete it.

The server reads the token from `livepush_session` or `__Host-livepush_session`, and two different
session cookies count as none, so whoever sets one name must delete the other.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections.abc import Collection, Mapping

from .. import sessions
from ..config import get_settings
from ..errors import InvalidSession
from ..sessions import Session
from ..sessions.handshake import COOKIE_NAME, HOST_COOKIE_NAME, cookie_token, session_cookies

COOKIE_NAMES = (HOST_COOKIE_NAME, COOKIE_NAME)
# Lax: the cookie goes with a top-level navigation to the app and with the same-site WebSocket
# handshake, never with another site's POST (a second layer behind the server's Origin check).
SAMESITE = "Lax"

# A host name, as a cookie's Domain takes it (a leading dot is allowed and ignored by browsers).
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"\.?{_LABEL}(?:\.{_LABEL})*")


def is_host_name(domain: object) -> bool:
    """Whether `domain` can be a cookie's Domain: a browser drops a cookie whose Domain is a URL,
    has a port or a path, and the session would never reach the server."""
    return isinstance(domain, str) and _HOST_NAME.fullmatch(domain) is not None


@dataclasses.dataclass(frozen=True)
class SessionCookie:
    """One Set-Cookie: a name, a value and its attributes; `max_age=0` deletes the cookie."""

    name: str
    value: str
    max_age: int
    secure: bool
    domain: str | None = None
    path: str = "/"
    httponly: bool = True  # out of reach of the page's scripts: an XSS bug cannot read the token
    samesite: str = SAMESITE

    @property
    def other_name(self) -> str:
        """The other session cookie name, to delete beside this one."""
        return COOKIE_NAME if self.name == HOST_COOKIE_NAME else HOST_COOKIE_NAME


_warned_of_host = threading.Event()  # said once a process: the domain is the site's, not a request's


def domain_for(host: str | None, domain: str | None, name: str, log: logging.Logger) -> str | None:
    """The Domain for a cookie that `host` sets: `domain`, unless `host` is not that domain or under
    it. A browser drops such a cookie, and the user had no session (Django's middleware issued one
    more at every request): host-only, it reaches a push server on that host. Said once a process
    on `log`, naming `name`, where the app sets the domain."""
    if domain is None or not host:
        return domain
    bare, host = domain.lstrip(".").lower(), host.lower().rstrip(".")
    if host == bare or host.endswith("." + bare):
        return domain
    if not _warned_of_host.is_set():
        _warned_of_host.set()
        log.warning("livepush: %s is %r, which the host %r is not under: a browser would drop the session cookie, "
                    "so it is set host-only there; give a domain the site's hosts are under (None where there is no "
                    "push server on another host)", name, domain, host)
    return None


def cookie_name(secure: bool, domain: str | None = None) -> str:
    """`__Host-livepush_session` over HTTPS without a domain (the browser then refuses it from any
    other host or path); else `livepush_session`: over plain HTTP a browser drops a `__Host-`
    cookie (it must be Secure), and a domain shared with the push server's host (`example.com`
    for `push.example.com`) rules the prefix out."""
    return HOST_COOKIE_NAME if secure and not domain else COOKIE_NAME


def session_cookie(token: str, *, secure: bool, max_age: float, domain: str | None = None) -> SessionCookie:
    """The cookie that carries `token` for `max_age` seconds (the token's TTL): Path=/, HttpOnly,
    SameSite=Lax, Secure over HTTPS, and host-only unless `domain` is given."""
    return SessionCookie(cookie_name(secure, domain), token, max(1, int(max_age)), secure, domain)


def deleting_cookies(*, secure: bool, domain: str | None = None, carried: Collection[str] = ()) -> list[SessionCookie]:
    """The cookies that delete the session cookie under each name and Domain this app can have set
    (a `__Host-` one exists only over HTTPS, and deleting it needs Secure too; with `domain`, a
    host-only `livepush_session` set before the app had one too: a browser keeps it beside the
    domain's, and two different session cookies count as none). `carried`: the cookie names the
    request came with; a `__Host-` one among them came over HTTPS whatever the app was told (a TLS
    proxy it does not hear of), so it is deleted on a request the app sees as plain HTTP too."""
    names = COOKIE_NAMES if secure or HOST_COOKIE_NAME in carried else (COOKIE_NAME,)
    found = [SessionCookie(name, "", 0, secure or name == HOST_COOKIE_NAME,
                           None if name == HOST_COOKIE_NAME else domain) for name in names]
    return found + [SessionCookie(COOKIE_NAME, "", 0, secure)] if domain else found


def stale_cookies(*, secure: bool, domain: str | None = None, carried: Collection[str] = ()) -> list[SessionCookie]:
    """What to delete beside a new session cookie: the other name, when this app can have set it or
    the request carries it (two different session cookies count as none)."""
    fresh = session_cookie("", secure=secure, max_age=0, domain=domain)
    return [c for c in deleting_cookies(secure=secure, domain=domain, carried=carried)
            if (c.name, c.domain) != (fresh.name, fresh.domain)]


# A Cache-Control or Vary directive: up to the next comma outside a quoted string (`private="a, b"`).
_DIRECTIVE = re.compile(r'(?:[^,"]|"[^"]*")+')


def private_cache_control(values: Collection[str]) -> str:
    """The Cache-Control of a response that sets or deletes the session cookie, from what it said
    (`values`, each header of that name): `private` added, `public` (and a `private` that names
    fields) dropped, every other directive kept, `no-store` and `max-age` included. The cookie
    carries a token: a shared cache that stored the response would give it to the next user."""
    kept = [part.strip() for value in values for part in _DIRECTIVE.findall(value) if part.strip()]
    kept = [part for part in kept if part.split("=", 1)[0].strip().lower() not in ("public", "private")]
    return ", ".join([*kept, "private"])


def vary_cookie(values: Collection[str]) -> str:
    """The Vary of a response that sets or deletes the session cookie, from what it said: `Cookie`
    added unless it is there or `*` already varies on everything."""
    kept = [part.strip() for value in values for part in _DIRECTIVE.findall(value) if part.strip()]
    lowered = {part.lower() for part in kept}
    return ", ".join(kept if lowered & {"cookie", "*"} else [*kept, "Cookie"])


def nowhere_to_revoke(tokens: Collection[object], log: logging.Logger) -> bool:
    """True (said once on `log`) when a sign-in or sign-out has sessions to revoke but this process has
    no shared store (neither a database nor Redis): the site's setup, not the request's failure,
    so the user is signed out all the same, said plainly, without a traceback or a 500."""
    if not tokens or sessions.default_store().shared:
        return False
    log.warning("a livepush session was not revoked at sign-in or sign-out (its open sockets stay open until it "
                "expires): this process has neither a database nor Redis for livepush; set LIVEPUSH_DATABASE_URL "
                "(or LIVEPUSH_REDIS_URL) to the one the servers use")
    return True


def other_subjects(tokens: Collection[str], subject: str) -> list[Session]:
    """The sessions among `tokens` that belong to another subject than `subject`: what a sign-in as
    `subject` revokes (a shared browser, where the user signed in before never signed out). A
    token that is not ours (forged, expired, from a rotated-out secret) opens nothing: skipped."""
    secrets = get_settings().secrets
    found = []
    for token in sorted(tokens):
        try:
            session = sessions.decode(token, secrets)
        except InvalidSession:
            continue
        if session.subject != subject:
            found.append(session)
    return found


def session_token(cookies: Mapping[str, str]) -> str | None:
    """The session token a request's parsed cookies carry, read as the server reads it: None when
    two different ones are present."""
    found = {cookies[name] for name in COOKIE_NAMES if cookies.get(name)}
    return found.pop() if len(found) == 1 else None


__all__ = ["COOKIE_NAMES", "SAMESITE", "SessionCookie", "cookie_name", "cookie_token", "deleting_cookies",
           "domain_for", "is_host_name", "other_subjects", "private_cache_control", "session_cookie", "session_cookies",
           "session_token", "stale_cookies", "vary_cookie"]
