"""The request's livepush session, from its session cookie: a dependency for FastAPI
(`Depends(current_session)`) that plain Starlette code awaits (`await current_session(request)`).

A request without a usable session gets 401 (no cookie, two different ones, a malformed, forged
or expired token) or 403 (a revoked session), through Starlette's HTTPException: the app answers
it like any other, never with a traceback. A store that cannot be reached, or has not answered
within READ_TIMEOUT, answers 503 (SessionsUnavailable); `optional_session` gives None for all of
them."""

from __future__ import annotations

import asyncio
import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request

from ... import sessions
from ...config import get_settings
from ...errors import DependencyError, InvalidSession
from ...sessions import Session
from ...sessions.revocations import READ_TIMEOUT
from .._cookies import cookie_token

log = logging.getLogger("livepush.contrib")


class SessionRefused(HTTPException):
    """No usable session: `status_code` 401 or 403, and `reason`: ``missing``, ``malformed``,
    ``bad_signature``, ``expired`` or ``revoked``."""

    def __init__(self, status_code: int, reason: str, detail: str) -> None:
        super().__init__(status_code, detail)
        self.reason = reason


class SessionsUnavailable(HTTPException):
    """503: the revocation store cannot be reached, or has not answered within READ_TIMEOUT, so
    no session can be told valid just now."""


async def _session(request: Request) -> Session:
    token = cookie_token(request.headers.getlist("cookie"))
    if token is None:
        raise SessionRefused(401, "missing", "sign in first: no livepush session cookie came with this request "
                                             "(or two different ones)")
    try:
        session = sessions.decode(token, get_settings().secrets)
    except InvalidSession as exc:
        raise SessionRefused(401, exc.reason, f"your session is not valid ({exc.reason}): sign in again") from None
    try:
        # Bounded as the push server bounds its own reads: a read that blocks held the request.
        async with asyncio.timeout(READ_TIMEOUT):
            revoked = await sessions.default_store().is_revoked(session)
    except (DependencyError, TimeoutError) as exc:
        why = f"no answer within {READ_TIMEOUT:g} s" if isinstance(exc, TimeoutError) else exc
        log.warning("livepush: cannot check a session against the revocation store: %s", why)
        raise SessionsUnavailable(503, "sessions cannot be checked just now: try again shortly") from None
    if revoked:
        raise SessionRefused(403, "revoked", "this session was revoked (signed out): sign in again")
    return session


async def current_session(request: Request) -> Session:
    """The request's session; SessionRefused (401 or 403) when it has none that is valid."""
    return await _session(request)


async def optional_session(request: Request) -> Session | None:
    """The request's session, or None when it has none that is valid (pages anyone may see), and
    when the revocation store cannot tell (its outage logged by _session): such a page is for
    anyone, and answered 503 while the store was down, though nothing of it needed a session."""
    try:
        return await _session(request)
    except (SessionRefused, SessionsUnavailable):
        return None
