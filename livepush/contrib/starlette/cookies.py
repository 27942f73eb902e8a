"""The session cookie on a Starlette response: set for a subject when a user signs in, revoked
and deleted when they sign out (docs/security.md, where the token travels)."""

from __future__ import annotations

import asyncio
import logging

from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response

from ... import sessions
from ...errors import ArgumentTypeError, ArgumentValueError, DependencyError, InvalidSession
from ...sessions import Session
from ...sessions.revocations import READ_TIMEOUT
from ...sessions.tokens import issue_for
from ...types import Seconds, as_seconds, shown
from .._cookies import (SessionCookie, deleting_cookies, domain_for, is_host_name, nowhere_to_revoke,
                       other_subjects, private_cache_control, session_cookie, session_cookies, stale_cookies,
                       vary_cookie)

log = logging.getLogger("livepush.contrib")


def _secure(request: Request, secure: bool | None) -> bool:
    # Behind a proxy that terminates TLS, run uvicorn with --proxy-headers so the scheme is https.
    return request.url.scheme in ("https", "wss") if secure is None else secure


def _check_order(call: str, response: object, request: object) -> None:
    """ArgumentTypeError unless `response` is a Response and `request` a request: given the other
    way round (the order of Django's helpers) they failed with an AttributeError from in here."""
    if isinstance(response, Response) and isinstance(request, HTTPConnection):
        return
    if isinstance(response, HTTPConnection) and isinstance(request, Response):
        raise ArgumentTypeError(f"{call}() takes the response first, then the request: {call}(response, request, ...)")
    raise ArgumentTypeError(f"{call}(response, request, ...) takes the Starlette Response to set the cookie on and "
                            f"the Request, got {type(response).__name__} and {type(request).__name__}")


def _check_domain(call: str, domain: object) -> None:
    """ArgumentValueError unless `domain` is None or a host name: a browser drops a cookie whose
    Domain is a URL, has a port or a path, and every socket came in anonymous with nothing saying why."""
    if domain is not None and not is_host_name(domain):
        raise ArgumentValueError(f"{call}(domain=) takes a host name such as 'example.com' (no scheme, port or "
                                 f"path), or None for a host-only cookie; got {shown(domain, width=60)}")


def _set(response: Response, cookie: SessionCookie) -> None:
    response.set_cookie(cookie.name, cookie.value, max_age=cookie.max_age, path=cookie.path, domain=cookie.domain,
                        secure=cookie.secure, httponly=cookie.httponly,
                        samesite=cookie.samesite)  # type: ignore[arg-type]
    # Kept from shared caches, merged with what the route said (docs/security.md): a proxy cache
    # that stored this response with its Set-Cookie would hand the token to the next user.
    response.headers["cache-control"] = private_cache_control(response.headers.getlist("cache-control"))
    response.headers["vary"] = vary_cookie(response.headers.getlist("vary"))


def set_session_cookie(response: Response, request: Request, subject: str, *, ttl: Seconds = 86400,
                       secure: bool | None = None, domain: str | None = None) -> str:
    """Issue a session for `subject` (livepush.sessions.issue) valid `ttl` seconds (or a timedelta),
    and set it on `response`: `__Host-livepush_session` with Secure over HTTPS (`livepush_session` over plain
    HTTP), host-only, Path=/, HttpOnly, SameSite=Lax, expiring with the token. `secure` overrides
    what the request's scheme says. `domain` (e.g. "example.com" when the push server is
    push.example.com): `livepush_session` with that Domain instead, the host-only copies deleted.
    The response gets `Cache-Control: private` (merged with its own) and `Vary: Cookie`, as every
    response of these helpers does: no shared cache may store a token. Returns the token. Revokes
    nothing: at a sign-in, where the browser may still carry another user's session, call
    aset_session_cookie()."""
    _check_order("set_session_cookie", response, request)
    _check_domain("set_session_cookie", domain)
    token = issue_for("set_session_cookie", subject, ttl)
    return _set_session(response, request, token, as_seconds(ttl), secure, domain)


async def aset_session_cookie(response: Response, request: Request, subject: str, *, ttl: Seconds = 86400,
                              secure: bool | None = None, domain: str | None = None) -> str:
    """set_session_cookie() for a sign-in: first revoke the sessions of another subject the
    request's cookies carry, as Django's sign-in does. A user who signs in over another's session
    (a shared browser) would otherwise leave the sockets that user's pages opened showing their
    topics to this one until the token expires; the same subject signing in again keeps them.
    A store that cannot be reached, or has not answered within READ_TIMEOUT, is logged and the
    cookie set all the same: the push store never keeps a user out of the app."""
    _check_order("aset_session_cookie", response, request)
    _check_domain("aset_session_cookie", domain)
    token = issue_for("aset_session_cookie", subject, ttl)  # a bad subject or ttl raises before anything is revoked
    await _revoke_others(request, subject)
    return _set_session(response, request, token, as_seconds(ttl), secure, domain)


def _set_session(response: Response, request: Request, token: str, ttl: float, secure: bool | None,
                 domain: str | None) -> str:
    is_secure, domain = _secure(request, secure), domain_for(request.url.hostname, domain, "domain=", log)
    # Deleted first: one may share the new cookie's name (a host-only `livepush_session` beside the
    # domain's), and a cookie jar that keys by name alone (some HTTP clients') keeps the new one.
    for stale in stale_cookies(secure=is_secure, domain=domain, carried=request.cookies.keys()):
        _set(response, stale)
    _set(response, session_cookie(token, secure=is_secure, max_age=ttl, domain=domain))
    return token


async def _revoke_others(request: Request, subject: str) -> None:
    others = other_subjects(session_cookies(request.headers.getlist("cookie")), subject)
    if not others or nowhere_to_revoke(others, log):
        return
    try:
        async with asyncio.timeout(READ_TIMEOUT):  # bounded as logout() is
            for session in others:
                await sessions.arevoke(session)
    except (DependencyError, TimeoutError) as exc:
        why = f"no answer within {READ_TIMEOUT:g} s" if isinstance(exc, TimeoutError) else exc
        log.warning("livepush: the session of the user signed in before on this browser was not revoked at "
                    "sign-in (%s): its open sockets stay open until it expires", why)


async def logout(response: Response, request: Request, *, everywhere: bool = False,
                 secure: bool | None = None, domain: str | None = None) -> Session | None:
    """Revoke the request's session (with `everywhere=True`, every session of its subject) so
    that its open WebSocket connections close with 4403, and delete the cookie on `response`.
    Returns the session revoked, or None when the request had none of ours. Every session cookie
    the request carries is revoked, a second one beside it too. When the store cannot be reached,
    or has not answered within READ_TIMEOUT, nothing is deleted and the request gets 503: the user
    can try again. An app with neither a
    database nor Redis has no store: the cookie is deleted, nothing revoked (None), and a warning
    logged. `domain`: the one the sign-in gave set_session_cookie(), where the cookie is deleted
    (and its host-only copies)."""
    _check_order("logout", response, request)
    _check_domain("logout", domain)
    revoked: Session | None = None
    tokens = session_cookies(request.headers.getlist("cookie"))
    if nowhere_to_revoke(tokens, log):  # an app the lifespan let start without one: a 500 kept users in
        tokens = set()
    try:
        # Bounded as the session check is: a write that blocks (a migration holding the table's
        # lock) held the sign-out for as long. Revoking again is harmless, so a retry is safe.
        async with asyncio.timeout(READ_TIMEOUT):
            for token in tokens:
                try:
                    session = await sessions.arevoke(token)
                except InvalidSession:
                    continue  # not a token of ours: nothing to revoke, the cookie goes anyway
                if everywhere:
                    await sessions.arevoke_subject(session.subject)
                revoked = revoked or session
    except (DependencyError, TimeoutError) as exc:
        why = f"no answer within {READ_TIMEOUT:g} s" if isinstance(exc, TimeoutError) else exc
        log.warning("livepush: cannot revoke a session at logout: %s", why)
        raise HTTPException(503, "signing out failed: the session store cannot be reached, try again") from None
    domain = domain_for(request.url.hostname, domain, "domain=", log)
    for cookie in deleting_cookies(secure=_secure(request, secure), domain=domain, carried=request.cookies.keys()):
        _set(response, cookie)
    return revoked
