"""The handshake's security decisions (docs/reference.md#5-wire-protocol): where the token is,
whether the Origin may connect, and who the connection is. Pure functions; the server applies
the verdicts (HTTP 400 for a duplicated header, 403 for a refused Origin, close 4401 for
`required` without a session).

Headers may be a `websockets.datastructures.Headers`, any mapping, or a list of
(name, value) pairs; names are matched without regard to case.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias
from urllib.parse import unquote, urlsplit

from ..config import Settings
from ..errors import InvalidSession
from .revocations import RevocationStore
from .tokens import Session, decode

COOKIE_NAME = "livepush_session"
# The same cookie with the __Host- prefix, which a browser keeps only if it was set Secure, for
# the exact host and path /: a sibling subdomain cannot plant one (recommended).
HOST_COOKIE_NAME = "__Host-livepush_session"
QUERY_PARAM = "token"
# The JS client offers `livepush` and `livepush.token.<token>` in Sec-WebSocket-Protocol: a header
# proxies do not log, unlike the query string. The server selects `livepush`.
SUBPROTOCOL = "livepush"
_TOKEN_SUBPROTOCOL = "livepush.token."
# Headers a request must not repeat: which value would count is ambiguous, and an ambiguity at
# the gate is for the attacker to resolve.
SINGLE_HEADERS = ("origin", "upgrade", "host", "cookie")

HeadersLike: TypeAlias = Mapping[str, str] | Iterable[tuple[str, str]] | Any

# Failure reasons authenticate() returns for logging (never the token itself).
REASONS = ("missing", "malformed", "bad_signature", "expired", "revoked")

_DEFAULT_PORTS = {"http": 80, "https": 443}


def header_values(headers: HeadersLike, name: str) -> list[str]:
    """Every value of header `name` (case-insensitive), in order."""
    name = name.lower()
    get_all = getattr(headers, "get_all", None)
    if callable(get_all):  # websockets' Headers keeps repeated headers apart
        return [str(v) for v in get_all(name)]
    items = headers.items() if hasattr(headers, "items") else headers
    return [str(v) for k, v in items if isinstance(k, str) and k.lower() == name]


# -- token ------------------------------------------------------------------------------


def duplicated_header(headers: HeadersLike) -> str | None:
    """The name of a header in SINGLE_HEADERS that the request repeats, or None."""
    for name in SINGLE_HEADERS:
        if len(header_values(headers, name)) > 1:
            return name.title()
    return None


def cookie_token(cookie_headers: list[str]) -> str | None:
    """The session cookie's value (either name); None when there is none, or when two
    different values are sent (a planted cookie beside the real one: trust neither)."""
    found = session_cookies(cookie_headers)
    return found.pop() if len(found) == 1 else None


def session_cookies(cookie_headers: list[str]) -> set[str]:
    """Every distinct non-empty value of the session cookie, under either name."""
    # By hand rather than http.cookies: SimpleCookie drops the whole header on one bad pair,
    # and browsers send whatever other apps on the domain set. Linear in the size.
    found: set[str] = set()
    for header in cookie_headers:
        for pair in header.split(";"):
            name, sep, value = pair.partition("=")
            if sep and name.strip() in (COOKIE_NAME, HOST_COOKIE_NAME):
                value = value.strip()
                if len(value) >= 2 and value[0] == value[-1] == '"':
                    value = value[1:-1]
                if value:
                    found.add(value)
    return found


def _subprotocol_token(protocol_headers: list[str]) -> str | None:
    for header in protocol_headers:
        for offered in header.split(","):
            offered = offered.strip()
            if offered.startswith(_TOKEN_SUBPROTOCOL) and len(offered) > len(_TOKEN_SUBPROTOCOL):
                return offered[len(_TOKEN_SUBPROTOCOL):]
    return None


def _query_token(path: str) -> str | None:
    try:
        query = urlsplit(path).query
    except ValueError:  # e.g. an unbalanced "[" in a garbage request target
        return None
    for pair in query.split("&"):
        name, sep, value = pair.partition("=")
        if sep and unquote(name.replace("+", " ")) == QUERY_PARAM and value:
            return unquote(value.replace("+", " "), errors="replace")
    return None


def any_origin(allowed: tuple[str, ...] | None) -> bool:
    return allowed is not None and "*" in (entry.strip() for entry in allowed)


def extract_tokens(headers: HeadersLike, path: str, *, cookies: bool = True, query: bool = True) -> list[str]:
    """The session tokens a handshake carries, in the order they count: the
    `livepush.token.<token>` subprotocol's, the `token` query parameter of `path` (the request
    target), then the session cookie's. What the page passes comes first: a cookie is ambient, sent
    with whatever the domain holds, one a sibling subdomain planted for the parent domain too
    (cookie tossing). `cookies=False` ignores cookies (any origin may connect, so any site could
    use them); `query=False` ignores the query (LIVEPUSH_QUERY_TOKENS=off). No validation here:
    decode() refuses anything that is not a token."""
    found = []
    if (token := _subprotocol_token(header_values(headers, "sec-websocket-protocol"))) is not None:
        found.append(token)
    if query and (token := _query_token(path or "")) is not None:
        found.append(token)
    if cookies and (token := cookie_token(header_values(headers, "cookie"))) is not None:
        found.append(token)
    return found


def ignored_token(headers: HeadersLike, path: str, settings: Settings) -> str | None:
    """Where a connection that `authenticate()` found no token in sent one all the same, and why it
    did not count; None when it sent none. For the log: a client still sending `?token=` after
    LIVEPUSH_QUERY_TOKENS=off, or cookies under LIVEPUSH_ALLOWED_ORIGINS=*, came in anonymous (or
    was closed with 4401 for good) without a word anywhere. Names no token."""
    if settings.authenticate == "off":
        return None
    if any_origin(settings.allowed_origins):
        if session_cookies(header_values(headers, "cookie")):
            return ("a session cookie, which LIVEPUSH_ALLOWED_ORIGINS=* never reads (any site could make a browser "
                    "send it): pass the token in the subprotocol")
    elif len(session_cookies(header_values(headers, "cookie"))) > 1:
        return ("two different session cookies, which count as none (one may have been planted for the parent "
                "domain): delete the stale one")
    if not settings.query_tokens and _query_token(path or "") is not None:
        return "a token in the query, which LIVEPUSH_QUERY_TOKENS=off ignores: pass it in the cookie or the subprotocol"
    return None


# -- origin -----------------------------------------------------------------------------


def _parse_origin(text: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin such as https://Example.com:8443/, lower-cased,
    default port filled in; None when it is not a scheme://host[:port] origin."""
    text = text.strip().rstrip("/")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = parts.hostname  # lower-cased, IPv6 brackets removed
    if scheme not in _DEFAULT_PORTS or not host or parts.path or parts.query or parts.username is not None:
        return None
    return scheme, host, port if port is not None else _DEFAULT_PORTS[scheme]


def _parse_host(text: str, scheme: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit("//" + text.strip())
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or parts.path or parts.username is not None:
        return None
    return parts.hostname, port if port is not None else _DEFAULT_PORTS[scheme]


@functools.lru_cache(maxsize=64)
def _compile_allowed(allowed: tuple[str, ...]) -> tuple[bool, frozenset[tuple[str, str, int]], tuple[tuple[str, str, int], ...]]:
    """(any allowed, exact origins, wildcard-subdomain origins) from the configured list."""
    exact: set[tuple[str, str, int]] = set()
    wild: list[tuple[str, str, int]] = []
    any_origin = False
    for entry in allowed:
        entry = entry.strip()
        if entry == "*":
            any_origin = True
            continue
        wildcard = "://*." in entry
        parsed = _parse_origin(entry.replace("://*.", "://", 1) if wildcard else entry)
        if parsed is None:
            continue  # not an origin: it can never match (config validation reports it)
        if wildcard:
            wild.append(parsed)
        else:
            exact.add(parsed)
    return any_origin, frozenset(exact), tuple(wild)


def origin_allowed(headers: HeadersLike, allowed: tuple[str, ...] | None) -> bool:
    """May a connection with these headers proceed?

    - No Origin header: yes. Only browsers send one, and only a browser can be tricked
      into connecting with a user's cookies from someone else's page.
    - `allowed` None (LIVEPUSH_ALLOWED_ORIGINS unset): same-origin only, i.e. the
      Origin's host and port equal the Host header's (ports default to 80/443 by the
      Origin's scheme). Not the scheme: TLS ends at the proxy and no X-Forwarded-Proto is
      trusted, so nothing here says what the browser used; a list is how to be strict.
    - Otherwise the Origin must equal one configured origin (scheme, host, port; case and
      a trailing slash do not matter); `*` allows any origin, and `https://*.example.com`
      any subdomain of example.com (not example.com itself).
    Several Origin headers, or an unparseable or `null` Origin, are refused unless `*`.
    """
    origins = header_values(headers, "origin")
    if not origins:
        return True
    if len(origins) > 1:
        return False
    if allowed is not None and _compile_allowed(tuple(allowed))[0]:
        return True
    origin = _parse_origin(origins[0])
    if origin is None:
        return False
    scheme, host, port = origin
    if allowed is None:
        hosts = header_values(headers, "host")
        if len(hosts) != 1:
            return False
        return _parse_host(hosts[0], scheme) == (host, port)
    _, exact, wild = _compile_allowed(tuple(allowed))
    if origin in exact:
        return True
    return any(
        scheme == w_scheme and port == w_port and host.endswith("." + w_host) for w_scheme, w_host, w_port in wild
    )


def refused_origin_advice(origin: str, allowed: tuple[str, ...] | None) -> str:
    """Why origin_allowed() refused the Origin `origin` under `allowed`, and what the operator
    changes if the page is theirs: its page shows "reconnecting" for ever and says nothing more,
    and a new domain or a development port missing from the setting is the usual cause."""
    shown = origin.strip().rstrip("/")
    if _parse_origin(shown) is None or "*" in shown or not shown.isascii() or not shown.isprintable():
        return ("it is not an http(s)://host[:port] origin (a browser sends `null` from a sandboxed frame or a "
                "file: page): only LIVEPUSH_ALLOWED_ORIGINS=* admits it, and then no session cookie is read; "
                "serve the page over http(s) instead")
    wildcards = "https://*.example.com admits every subdomain, * any origin but then no session cookie is read"
    if allowed is None:
        return (f"LIVEPUSH_ALLOWED_ORIGINS is unset, so only pages of the server's own host and port may connect: "
                f"if this page is yours, set LIVEPUSH_ALLOWED_ORIGINS={shown} (comma-separated with your other "
                f"pages' origins, the server's own included if its pages connect; {wildcards})")
    listed = ",".join(allowed)
    listed = listed if len(listed) <= 200 else listed[:200] + "..."
    return (f"LIVEPUSH_ALLOWED_ORIGINS ({listed}) does not list it: if this page is yours, add {shown} to it "
            f"(comma-separated; {wildcards})")


# -- who is connecting ------------------------------------------------------------------


async def authenticate(
    headers: HeadersLike, path: str, settings: Settings, store: RevocationStore | None
) -> tuple[Session | None, str | None]:
    """(session, None) for a valid session, else (None, reason) with reason one of
    ``missing | malformed | bad_signature | expired | revoked`` for the log line.

    Mode `off` ignores tokens: (None, None). Modes `optional` and `required` answer the
    same; the server lets `optional` in anonymously and closes `required` with 4401.
    With `store` None revocations are not checked. Raises DependencyError when the store
    cannot be reached, so the server can fail the handshake as temporary (e.g. HTTP 503)
    rather than close with 4401, which would stop the client for good.
    """
    if settings.authenticate == "off":
        return None, None
    # The first token that decodes counts, in extract_tokens()' order (what the page passes before
    # the cookie), the first one's reason when none does: a stale cookie (expired, or signed with a
    # retired secret) left by an earlier sign-in hid the fresh token the page passed in the
    # subprotocol, and the client stopped for good on 4401.
    refused: str | None = None
    for token in extract_tokens(headers, path, cookies=not any_origin(settings.allowed_origins),
                                query=settings.query_tokens):
        try:
            session = decode(token, settings.secrets)
            break
        except InvalidSession as exc:
            refused = refused or exc.reason
    else:
        return None, refused or "missing"
    if store is not None:
        if await store.is_revoked(session):
            return None, "revoked"
        if session.expired():
            # It ran out while the store was read. Let in, its first subscribe would close the
            # connection with 4403, which a client never retries: `optional` lets it in anonymous.
            return None, "expired"
    return session, None


__all__ = ["COOKIE_NAME", "HOST_COOKIE_NAME", "QUERY_PARAM", "REASONS", "SUBPROTOCOL", "any_origin", "authenticate",
           "cookie_token", "duplicated_header", "extract_tokens", "header_values", "ignored_token", "origin_allowed",
           "session_cookies"]
