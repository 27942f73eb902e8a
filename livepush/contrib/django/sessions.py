"""A livepush session for `request.user`, in the `livepush_session` cookie, so the browser needs no
token code: `LivePushSessionMiddleware` (after Django's AuthenticationMiddleware) issues one for a
signed-in user whose cookie is missing, expiring, another user's or set for another cookie
domain than the setting's, and drops it for anonymous requests (a response it sets or deletes
the cookie on is made `private` and varies on Cookie: no shared cache may keep a token);
signing out (Django's `user_logged_out`) revokes it, and those it replaced at renewal, so the
sockets they opened close with 4403, and so does another user signing in over it (Django's
`user_logged_in`). Sync and async capable: under ASGI it runs in the event loop, with no thread
hop per request.

Settings (all optional):
    LIVEPUSH_SESSION_TTL = 86400              seconds (or a timedelta) a token lives; renewed once half
                                              of it has passed, or at once when lowered below what a
                                              cookie's has left
    LIVEPUSH_SESSION_COOKIE_DOMAIN = None     e.g. "example.com" when the push server is push.example.com
    LIVEPUSH_SESSION_SUBJECT = None           a function user -> subject, or its dotted path (imported at
                                              first use); default str(user.pk)
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.contrib.auth.signals import user_logged_in, user_logged_out
from django.core.exceptions import DisallowedHost, ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.http.request import split_domain_port
from django.utils.cache import patch_cache_control, patch_vary_headers
from django.utils.functional import SimpleLazyObject, empty
from django.utils.module_loading import import_string

from ... import sessions
from ...config import get_settings
from ...errors import DependencyError, InvalidSession, LivepushError
from ...sessions import Session
from ...sessions.revocations import CLOCK_ALLOWANCE, READ_TIMEOUT
from ...sessions.handshake import COOKIE_NAME, HOST_COOKIE_NAME
from ...sessions.tokens import MAX_TTL, check_subject
from ...types import as_seconds, shown
from ...usercode import cannot_take, what_raised
from .._cookies import (COOKIE_NAMES, domain_for, is_host_name, nowhere_to_revoke, other_subjects, session_cookie,
                       session_cookies, session_token)

log = logging.getLogger("livepush.contrib.django")

DEFAULT_TTL = 86400.0
# The Django settings this module reads: the only livepush settings taken from Django's settings.
SETTINGS = ("LIVEPUSH_SESSION_TTL", "LIVEPUSH_SESSION_SUBJECT", "LIVEPUSH_SESSION_COOKIE_DOMAIN")
_REVOKED = "_livepush_session_revoked"  # set on a request whose session was revoked by its logout
# On a request, per signal: which of the signal's two receivers ("sync", "async") took its dispatch.
_TAKEN = "_livepush_taken_by_"
# In the user's Django session: [id, subject, expires_at] of each livepush session issued to it.
_ISSUED = "_livepush_sessions"
# In the user's Django session: the Domain the middleware last set the cookie with ("" host-only).
# A browser sends no cookie's Domain, so only this tells a cookie set before the setting changed.
_SET_FOR = "_livepush_cookie_domain"
# In the user's Django session: the Domain of a `livepush_session` copy an earlier release left on
# another Domain for the next response to delete (a move now deletes it in the same response).
_STALE = "_livepush_stale_cookie_domain"


def subject_of(user: Any) -> str:
    """The livepush subject of a Django user (what `Allow("user:{subject}")` rules compare);
    ImproperlyConfigured naming LIVEPUSH_SESSION_SUBJECT when that setting gives none."""
    custom = _subject_setting()
    if custom is None:
        # A user an authentication backend built without saving it has no pk: str() would give
        # every such user the one subject "None", as below for a subject function's None.
        if user.pk is None:
            raise ImproperlyConfigured(f"a signed-in user ({type(user).__name__}) has no pk, so it has no livepush "
                                       "subject: set LIVEPUSH_SESSION_SUBJECT to a function that returns the "
                                       "user's own subject, a string no other user has")
        return str(user.pk)
    subject = custom(user)
    # Only a string or a whole number: str() of None would give every user it is returned for the
    # one subject "None", and so each other's sessions and topics.
    if isinstance(subject, bool) or not isinstance(subject, (str, int)):
        raise ImproperlyConfigured(f"LIVEPUSH_SESSION_SUBJECT returned {shown(subject, width=60)} for user {user.pk!r}: it must "
                                   "return the user's subject, a string (or an int) that no other user has")
    try:
        return check_subject(str(subject))
    except ValueError as exc:
        raise ImproperlyConfigured(f"LIVEPUSH_SESSION_SUBJECT returned a subject livepush refuses: {exc}") from None


def _subject_setting() -> Callable[[Any], object] | None:
    """LIVEPUSH_SESSION_SUBJECT: a function of the user, or its dotted path (Django's way for a
    function whose module imports models, which settings.py cannot import), or None for str(user.pk)."""
    custom = getattr(settings, "LIVEPUSH_SESSION_SUBJECT", None)
    if isinstance(custom, str):
        custom = _subject_function(custom)
    if custom is not None and not callable(custom):
        raise ImproperlyConfigured(f"LIVEPUSH_SESSION_SUBJECT must be a function of the user that returns its "
                                   f"subject, or its dotted path ('myapp.auth.subject'), got {shown(custom, width=60)}")
    # Called with the user alone, at each signed-in request: one of another shape failed every
    # one of them with a TypeError, where this is checked at the server's start.
    why = None if custom is None else cannot_take(custom, None)
    if why is not None:
        raise ImproperlyConfigured(f"LIVEPUSH_SESSION_SUBJECT is called with the user alone, but {shown(custom, width=60)} "
                                   f"cannot take it ({why}): e.g. def subject(user): return str(user.pk)")
    return custom


@functools.lru_cache(maxsize=8)
def _subject_function(path: str) -> Callable[[Any], object]:
    """The function LIVEPUSH_SESSION_SUBJECT's dotted `path` names, imported at its first use (the
    middleware's making, at the server's start, once every app is loaded) and kept after that."""
    try:
        found = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"LIVEPUSH_SESSION_SUBJECT = {shown(path, width=100)} does not import ({what_raised(exc)}): "
                                   "name the function as 'package.module.function', importable from the "
                                   "web processes") from exc
    except Exception as exc:  # noqa: BLE001 - the site's own module: any error in it, at its import
        # Let through, a NameError in the site's code stopped `manage.py check` with a traceback
        # before it reported anything, where this setting's other mistakes are livepush.E003.
        raise ImproperlyConfigured(f"LIVEPUSH_SESSION_SUBJECT = {shown(path, width=100)} failed while its module was imported "
                                   f"({what_raised(exc)}): fix that error in the module, or name another "
                                   "function") from exc
    if not callable(found):
        raise ImproperlyConfigured(f"LIVEPUSH_SESSION_SUBJECT = {shown(path, width=100)} names {shown(found, width=60)}, which is no "
                                   "function: name a function of the user that returns its subject")
    subject_of: Callable[[Any], object] = found
    return subject_of


def _domain() -> str | None:
    """LIVEPUSH_SESSION_COOKIE_DOMAIN: None (host-only) or a host name. A browser drops a cookie
    whose Domain is a URL, has a port or a path: the session would never reach the server, and
    every socket would come in anonymous with nothing saying why."""
    domain = getattr(settings, "LIVEPUSH_SESSION_COOKIE_DOMAIN", None)
    if domain is not None and not is_host_name(domain):
        raise ImproperlyConfigured(f"LIVEPUSH_SESSION_COOKIE_DOMAIN must be a host name such as 'example.com' (no "
                                   f"scheme, port or path), or None for a host-only cookie; got {shown(domain, width=60)}")
    return domain


def _cookie_domain(request: HttpRequest) -> str | None:
    """The Domain of the request's cookie: the setting's, unless the request's host is not under
    it (see domain_for): each request issued one more session, kept in the Django session for a day."""
    domain = _domain()
    if domain is None:
        return None
    try:
        host = split_domain_port(request.get_host())[0]
    except DisallowedHost:  # Django answers such a request 400 itself
        return domain
    return domain_for(host, domain, "LIVEPUSH_SESSION_COOKIE_DOMAIN", log)


def check_settings() -> None:
    """What every signed-in request needs, checked when the middleware is made (a web server's
    start): LIVEPUSH_SECRET (ConfigError), LIVEPUSH_SESSION_TTL, LIVEPUSH_SESSION_SUBJECT and
    LIVEPUSH_SESSION_COOKIE_DOMAIN (ImproperlyConfigured), each naming the setting."""
    _ttl()
    _subject_setting()
    _domain()
    get_settings().require_secret()


def _ttl() -> float:
    """LIVEPUSH_SESSION_TTL in seconds (a number, its text as an environment variable gives it, or
    a timedelta)."""
    value = getattr(settings, "LIVEPUSH_SESSION_TTL", DEFAULT_TTL)
    try:
        ttl = float(as_seconds(value)) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int no float holds (10**400)
        ttl = math.nan
    if not 0 < ttl <= MAX_TTL:  # NaN and infinities too
        raise ImproperlyConfigured(f"LIVEPUSH_SESSION_TTL must be a number of seconds or a timedelta, more than 0 "
                                   f"and at most {int(MAX_TTL)} (366 days), got {shown(value, width=60)}")
    return ttl


def _current(token: str | None, subject: str, ttl: float) -> bool:
    """Whether `token` is a valid session of `subject` with more than half its lifetime left, and
    no more than that lifetime: one issued before LIVEPUSH_SESSION_TTL was lowered lived on for
    up to half the old lifetime, past what the site now allows."""
    if token is None:
        return False
    try:
        session = sessions.decode(token, get_settings().secrets)
    except InvalidSession:
        return False
    left = session.expires_at - time.time()
    # CLOCK_ALLOWANCE: another web process, whose clock is ahead of this one's, issued it.
    return session.subject == subject and ttl / 2 < left <= ttl + CLOCK_ALLOWANCE


def _set(response: HttpResponse, token: str, ttl: float, secure: bool, domain: str | None,
         old_domain: str | None, old_copy: bool) -> None:
    """Set `token`'s cookie on `domain` and delete the other name's; `old_domain`: where the cookie
    was set before, when the cookie domain changed since; `old_copy`: whether the request carries
    a `livepush_session`, which may be the copy left there."""
    cookie = session_cookie(token, secure=secure, max_age=ttl, domain=domain)
    moved = old_domain is not None and old_domain != (cookie.domain or "")
    if moved and old_copy and cookie.name == COOKIE_NAME:
        # The old Domain's copy of this very name, deleted before the new one is set: a browser
        # that takes a host-only cookie and its host's Domain cookie for one (RFC 6265 compares
        # name, domain and path only) then keeps the new one rather than deleting it.
        _delete(response, COOKIE_NAME, old_domain or None, beside=True)
    response.set_cookie(cookie.name, cookie.value, max_age=cookie.max_age, path=cookie.path, domain=cookie.domain,
                        secure=cookie.secure, httponly=cookie.httponly, samesite=cookie.samesite)
    _delete(response, cookie.other_name, (old_domain or None) if moved else cookie.domain)


def _delete(response: HttpResponse, name: str, domain: str | None, beside: bool = False) -> None:
    """Delete the cookie `name` of `domain` on `response`; `beside`: in an entry of its own, before
    a cookie of the same name the caller sets next."""
    # A browser ignores a __Host- cookie, deleting one included, that names a Domain: that one is
    # always deleted host-only (Django adds Secure for the prefix).
    domain = None if name == HOST_COOKIE_NAME else domain
    if name not in response.cookies and not beside:
        response.delete_cookie(name, path="/", domain=domain)
        return
    # A second cookie of the name (another Domain's): response.cookies keys its cookies by name,
    # but Django's WSGI and ASGI handlers both write one Set-Cookie per entry, named by the entry
    # itself, in the entries' order, so this one goes under a key no cookie name can be (it holds "; ").
    deleting = HttpResponse()
    deleting.delete_cookie(name, path="/", domain=domain)
    response.cookies[f"{name}; Domain={domain or ''}"] = deleting.cookies[name]


def _drop(request: HttpRequest, response: HttpResponse) -> None:
    domain = _cookie_domain(request)
    for name in COOKIE_NAMES:
        if name in request.COOKIES:
            _delete(response, name, domain)
    if domain is not None and COOKIE_NAME in request.COOKIES:
        # The host-only copy a browser may keep beside the domain's, set before the cookie domain
        # was: it sends both under one name, and neither's Domain, so both are deleted.
        _delete(response, COOKIE_NAME, None)


class LivePushSessionMiddleware:
    """Keeps the `livepush_session` cookie in step with `request.user` (see the module docstring).

    Sync and async capable, as Django documents: under ASGI it is called as a coroutine, with no
    thread hop per request, and does the same on either path."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        # Django makes its middleware when a server starts: a setting no signed-in request could
        # use stops the start there, rather than failing every such request with a 500.
        check_settings()
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if iscoroutinefunction(self):
            return self.__acall__(request)
        response = self.get_response(request)
        user = getattr(request, "user", None)
        if not _signed_in(request, user):
            _drop(request, response)
        else:
            _renew(request, response, subject_of(user), _django_sign_in(request))
        _keep_from_shared_caches(response)
        return response

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        response = await self.get_response(request)
        user = await _auser(request)
        if not _signed_in(request, user):
            _drop(request, response)
        else:
            _renew(request, response, await _asubject_of(user), await _adjango_sign_in(request))
        _keep_from_shared_caches(response)
        return response


def _keep_from_shared_caches(response: HttpResponse) -> None:
    """Make a response that sets or deletes the session cookie `private`, merged with what the view
    said (Django drops a `public`, keeps `no-store` and `max-age`), and vary it on Cookie: a
    shared cache in front of the site that stored it with its Set-Cookie would hand the token to
    the next user who asks. A response that sets no such cookie is left as the view made it."""
    if any(morsel.key in COOKIE_NAMES for morsel in response.cookies.values()):
        patch_cache_control(response, private=True)
        patch_vary_headers(response, ("Cookie",))


async def _asubject_of(user: Any) -> str:
    """subject_of() for async code: a subject function may read the database (a profile's id), which
    async code must not do in the event loop's thread; the default, str(user.pk), reads nothing."""
    return subject_of(user) if _subject_setting() is None else await sync_to_async(subject_of)(user)


def _signed_in(request: HttpRequest, user: Any) -> bool:
    """Whether `request` is a signed-in user's that its own sign-out has not just ended."""
    return user is not None and user.is_authenticated and not getattr(request, _REVOKED, False)


async def _auser(request: HttpRequest) -> Any:
    """request.user, as the sync path reads it, without a database read in the event loop's thread.
    A user that is no lazy object was set by login(), alogin(), logout() or other code, and is the
    one that counts: the user Django loaded before (a view that looked, anonymous, then signed in)
    stays cached. A lazy one a sync view already loaded is taken as it is; else Django's
    `request.auser()` loads it, or, without one, a thread."""
    user = getattr(request, "user", None)
    if not isinstance(user, SimpleLazyObject):
        return user
    if user._wrapped is not empty:  # what LazyObject itself tests: loaded
        return user._wrapped
    auser = getattr(request, "auser", None)
    if auser is not None:
        return await auser()
    await sync_to_async(getattr)(user, "is_authenticated")  # loads it in a thread
    return user


def _renew(request: HttpRequest, response: HttpResponse, subject: str, signed_in_here: bool) -> None:
    """Set a new session of `subject` on `response` when the request's cookie is not a current one
    of it, or was set for another cookie domain than the setting's; `signed_in_here`: the user
    signed in through Django, whose session (loaded) keeps what the cookie was set with."""
    ttl, domain = _ttl(), _cookie_domain(request)
    # With a cookie domain, the push server is on another host, where a host-only cookie (set
    # before the domain was) never goes: its session is moved to the domain's cookie. A `__Host-`
    # one is always host-only; of a `livepush_session`, only the Django session can say.
    old_domain = request.session.get(_SET_FOR) if signed_in_here else None
    if not isinstance(old_domain, str):
        old_domain = "" if signed_in_here and domain is not None else None  # set before this was kept
    moved = old_domain is not None and old_domain != (domain or "")
    host_only = domain is not None and bool(request.COOKIES.get(HOST_COOKIE_NAME))
    if not moved and not host_only and _current(_cookie_token(request, signed_in_here), subject, ttl):
        _delete_stale(request, response, signed_in_here)
        return
    token = sessions.issue(subject, ttl=ttl)
    # The browser sends every copy it keeps to this host: with none, there is nothing left to delete.
    _set(response, token, ttl, _secure(request), domain, old_domain, COOKIE_NAME in request.COOKIES)
    if signed_in_here:
        _remember(request, token)
        request.session[_SET_FOR] = domain or ""


def _cookie_token(request: HttpRequest, signed_in_here: bool) -> str | None:
    """The request's session token; while the old copy an earlier release left at a move is still
    there (see _STALE: both come, and Django keeps one value a name), the one this sign-in was
    given last, when it came."""
    if signed_in_here and isinstance(request.session.get(_STALE), str):
        issued = _issued(request)
        for token in _request_tokens(request) if issued else ():
            session = _decoded(token)
            if session is not None and session.id == issued[-1].id:
                return token
    return session_token(request.COOKIES)


def _delete_stale(request: HttpRequest, response: HttpResponse, signed_in_here: bool) -> None:
    """Delete the `livepush_session` a move by an earlier release left on the old Domain (see
    _STALE): the browser keeps both until then, and two different session cookies count as none."""
    stale = request.session.get(_STALE) if signed_in_here else None
    if isinstance(stale, str):
        _delete(response, COOKIE_NAME, stale or None)
        del request.session[_STALE]


def _secure(request: HttpRequest) -> bool:
    """Whether the cookie is set Secure (and so `__Host-`): over HTTPS, and on a site whose own
    session cookie is Secure. Behind a proxy that ends TLS, without SECURE_PROXY_SSL_HEADER,
    Django sees plain HTTP, and the token went in a cookie a browser also sends over http://,
    where anyone on the path reads it; a Secure Django session cookie says the site is HTTPS."""
    return request.is_secure() or bool(getattr(settings, "SESSION_COOKIE_SECURE", False))


def _django_sign_in(request: HttpRequest) -> bool:
    """Whether the request's user signed in through Django (which Django's logout() ends): a user
    an API's token authentication set has no Django sign-in, and writing one its sessions made a
    new Django session, a row and a cookie, per request."""
    django_session = getattr(request, "session", None)
    return django_session is not None and SESSION_KEY in django_session


async def _adjango_sign_in(request: HttpRequest) -> bool:
    """_django_sign_in() for async code: the Django session is loaded without a read in the loop's thread."""
    django_session = getattr(request, "session", None)
    return django_session is not None and await django_session.ahas_key(SESSION_KEY)


def _remember(request: HttpRequest, token: str) -> None:
    """Keep the session `token` opens in the user's Django session (loaded: see _django_sign_in),
    for sign-out to revoke. A renewal replaces the cookie, but the sockets the pages opened with
    the old token stay open on it: sign-out, which sees only the cookie, left them showing the
    user's topics until it expired. Expired entries are dropped, so a sign-in keeps the few a
    renewal every half lifetime makes."""
    issued = sessions.decode(token, get_settings().secrets)
    now = time.time()
    kept = [[s.id, s.subject, s.expires_at] for s in _issued(request) if s.expires_at > now]
    # Two requests renewing at once may each save the Django session without the other's entry:
    # the cookie the browser keeps is revoked from the request itself at sign-out all the same.
    request.session[_ISSUED] = [*kept, [issued.id, issued.subject, issued.expires_at]]


def _issued(request: HttpRequest) -> list[Session]:
    """The livepush sessions _remember() kept in the request's Django session."""
    return _issued_in(getattr(request, "session", {}).get(_ISSUED))


async def _aissued(request: HttpRequest) -> list[Session]:
    """_issued() for async code: the Django session is loaded without a read in the loop's thread."""
    django_session = getattr(request, "session", None)
    return _issued_in(None if django_session is None else await django_session.aget(_ISSUED))


def _issued_in(entries: Any) -> list[Session]:
    """The sessions of a Django session's _ISSUED entry (an entry of another shape, which no release
    of this code wrote, is skipped)."""
    found: list[Session] = []
    for entry in entries if isinstance(entries, list) else ():
        if (isinstance(entry, list) and len(entry) == 3 and all(isinstance(part, str) for part in entry[:2])
                and isinstance(entry[2], (int, float))):
            found.append(Session(id=entry[0], subject=entry[1], expires_at=float(entry[2])))
    return found


def _take(request: HttpRequest, signal: str, kind: str) -> bool:
    """Whether the receiver of `kind` ("sync" or "async") is the first of `signal`'s two to see this
    dispatch of it for `request`. Each dispatch reaches both: send() (logout(), login()) calls the
    sync one first, asend() (alogout(), alogin()) starts the async one first; the second must not
    revoke again, and clears the mark for the next dispatch. A mark of its own kind is one whose
    other half never came (a receiver raised): a new dispatch. setdefault(): atomic between the
    two threads."""
    key = _TAKEN + signal
    if vars(request).setdefault(key, kind) == kind:
        return True
    del vars(request)[key]
    return False


def revoke_on_logout(sender: Any, request: HttpRequest | None = None, user: Any = None, **kwargs: Any) -> None:
    """`user_logged_out` receiver of logout() (and of a sync view under ASGI): revoke the session in
    the request's cookie, so the sockets it opened close with 4403; the middleware then deletes the
    cookie. Every session cookie the request carries is revoked: two different ones count as none
    for a new socket, but each may have opened sockets before the other came (an HTTPS page's
    `__Host-` cookie, then a plain HTTP page's), and those must close too; and so is every session
    the middleware issued to this sign-in (kept in its Django session), the ones a renewal replaced
    among them."""
    if request is None or not _take(request, "logout", "sync"):
        return
    # Read before Django's logout() flushes the Django session, which it does after this signal.
    _revoke(_signed_out(request, _issued(request)))


async def arevoke_on_logout(sender: Any, request: HttpRequest | None = None, user: Any = None,
                            **kwargs: Any) -> None:
    """revoke_on_logout() for alogout(): awaited in the event loop. As a sync receiver, asend() ran
    it in the one thread every sync_to_async() call of an ASGI site shares, which a locked store
    held for up to READ_TIMEOUT."""
    if request is None or not _take(request, "logout", "async"):
        return
    await _arevoke(_signed_out(request, await _aissued(request)))


def _signed_out(request: HttpRequest, issued: list[Session]) -> list[str | Session]:
    """What a sign-out revokes, `request` marked as signed out for the middleware: the request's
    session cookies and the sessions `issued` to the sign-in. The cookie's own session is kept
    there too: revoked once, one write to the store."""
    setattr(request, _REVOKED, True)
    tokens = _request_tokens(request)
    in_cookies = {session.id for session in map(_decoded, tokens) if session is not None}
    return [*tokens, *(session for session in issued if session.id not in in_cookies)]


def _decoded(token: str) -> Session | None:
    try:
        return sessions.decode(token, get_settings().secrets)
    except InvalidSession:
        return None


def revoke_on_login(sender: Any, request: HttpRequest | None = None, user: Any = None, **kwargs: Any) -> None:
    """`user_logged_in` receiver: revoke the sessions of another subject the request's cookies
    carry. A user who signs in over another's session (a shared browser) makes Django flush that
    one without sending user_logged_out, and the sockets its pages opened went on showing the other
    user's topics to this one until the token expired. The same user signing in again keeps them."""
    if request is None or user is None or not _take(request, "login", "sync"):
        return
    tokens = _request_tokens(request)
    if tokens:
        _revoke(other_subjects(tokens, subject_of(user)))


async def arevoke_on_login(sender: Any, request: HttpRequest | None = None, user: Any = None, **kwargs: Any) -> None:
    """revoke_on_login() for alogin(): awaited in the event loop, not in the thread every
    sync_to_async() call of an ASGI site shares (see arevoke_on_logout)."""
    if request is None or user is None or not _take(request, "login", "async"):
        return
    tokens = _request_tokens(request)
    if tokens:
        await _arevoke(other_subjects(tokens, await _asubject_of(user)))


def _request_tokens(request: HttpRequest) -> list[str]:
    """Every session token the request's cookies carry, read from the header: request.COOKIES keeps
    one value a name."""
    return sorted(session_cookies([request.META.get("HTTP_COOKIE", "")]))


def _revoke(tokens: Sequence[str | Session]) -> None:
    """Revoke `tokens`; a sign-in or sign-out never fails because the shared store cannot be
    reached, nor waits longer than READ_TIMEOUT for it."""
    if nowhere_to_revoke(tokens, log):
        return
    # In a thread of its own, waited for as long as the push server waits for a store read: a
    # write that blocks (a migration holding the table's lock, a frozen connection) held the
    # sign-out for as long. The thread goes on, so the revocation is made once the store answers.
    revoking = threading.Thread(target=_revoke_now, args=(tokens,), name="livepush-revoke", daemon=True)
    revoking.start()
    revoking.join(READ_TIMEOUT)
    if revoking.is_alive():
        _still_revoking()


async def _arevoke(tokens: Sequence[str | Session]) -> None:
    """_revoke() for async code: the same thread and bound, waited for in the event loop."""
    if nowhere_to_revoke(tokens, log):
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle() -> None:
        if not done.done():  # not when the wait below gave up already
            done.set_result(None)

    def revoke_then_tell() -> None:
        try:
            _revoke_now(tokens)
        finally:
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:
                pass  # the loop closed after the wait gave up: nobody is told any more

    threading.Thread(target=revoke_then_tell, name="livepush-revoke", daemon=True).start()
    try:
        await asyncio.wait_for(done, READ_TIMEOUT)
    except TimeoutError:
        _still_revoking()


def _still_revoking() -> None:
    log.warning("a livepush session's revocation has not been stored within %g s (the revocation store is "
                "locked or slow): the sign-in or sign-out goes on, and the revocation is stored once the store "
                "answers", READ_TIMEOUT)


# How long the revoking thread tries again a store that did not answer (a migration holding its
# table past the write's lock timeout, a restart), and how long it waits between tries.
REVOKE_RETRY_FOR = 300.0
REVOKE_RETRY_PAUSE = 1.0


def _revoke_now(tokens: Sequence[str | Session]) -> None:
    give_up_at = time.monotonic() + REVOKE_RETRY_FOR
    for token in tokens:
        while True:
            try:
                sessions.revoke(token)
            except InvalidSession:
                pass  # not a token of ours (forged, or from a rotated-out secret): nothing it opens is accepted
            except DependencyError:
                # The write gives up on a locked table after READ_TIMEOUT, and a sign-out that
                # was told "stored once the store answers" lost its revocation instead.
                if time.monotonic() < give_up_at:
                    time.sleep(REVOKE_RETRY_PAUSE)
                    continue
                _not_revoked()
                return
            except LivepushError:
                _not_revoked()
                return
            break


def _not_revoked() -> None:
    # Revocation needs the shared store: signing in or out must not fail because of it, but the
    # sockets stay open until their token expires, so say so.
    log.exception("could not revoke a livepush session at a user's sign-in or sign-out")


# A sync and an async receiver for each signal, the one that comes first taking the dispatch (_take):
# logout() and login() wait in the request's thread, alogout() and alogin() in the event loop.
user_logged_out.connect(revoke_on_logout, dispatch_uid="livepush.contrib.django.sessions.revoke_on_logout")
user_logged_out.connect(arevoke_on_logout, dispatch_uid="livepush.contrib.django.sessions.arevoke_on_logout")
user_logged_in.connect(revoke_on_login, dispatch_uid="livepush.contrib.django.sessions.revoke_on_login")
user_logged_in.connect(arevoke_on_login, dispatch_uid="livepush.contrib.django.sessions.arevoke_on_login")
