"""Postgres URLs as settings: whether one parses, and how to show one without its password.

Apart from connect.py so that the settings can check a URL without importing the connections
(which read the settings).
"""

from __future__ import annotations

import functools
import re
from typing import cast

import psycopg

from ..errors import ConfigError

# The sslmode values libpq knows.
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
# The options libpq reads as integers, and refuses only when it connects.
INTEGER_OPTIONS = ("connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
                   "tcp_user_timeout")
# The range libpq takes them in (a C int); connect_timeout is psycopg's to read, in any size.
_INT_RANGE = range(-2**31, 2**31)


def _misread(url: str) -> bool:
    """Whether libpq reads part of a URI's user or password as its host, port or database name.
    It ends the credentials at the first '@' or '/', so a password holding an unencoded '@' or
    '/' spills into what redact() shows and psycopg's own messages quote."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep or scheme.lower() not in ("postgresql", "postgres"):
        return False
    ends = [i for i in (rest.find("@"), rest.find("/")) if i >= 0]
    if not ends:
        return False
    # An '@' left between the credentials' end and the parameters: the written one came later.
    return "@" in rest[min(ends) + 1:].split("?", 1)[0]


def fields(url: str) -> dict[str, str]:
    """The fields of a Postgres URL or conninfo, as libpq parses them: all text. (psycopg's type
    allows ints too, for the keyword arguments conninfo_to_dict() also takes; none is passed.)"""
    return cast("dict[str, str]", psycopg.conninfo.conninfo_to_dict(url))


def redact(url: str) -> str:
    """`host:port/dbname` of a Postgres URL or conninfo, never its user or password; safe for any
    output. (As `dbname@host:port` it read as a user at a host: "cannot reach Postgres at
    postgres@..." about a role that did not exist sent people after the wrong name.)"""
    try:
        info = fields(url)
    except psycopg.Error:
        return "(a malformed URL)"
    if _misread(url):
        return "(a URL with an unencoded '@' or '/' in its password)"
    host = info.get("host") or "localhost"
    if host.startswith("/"):  # a unix socket directory
        host = "unix socket"
    elif ":" in host:  # an IPv6 address
        host = f"[{host}]"
    port = info.get("port") or "5432"
    return f"{host}:{port}/{info.get('dbname') or info.get('user') or ''}"


def malformed(url: str, setting: str = "LIVEPUSH_DATABASE_URL") -> ConfigError:
    # psycopg's message for a URL it cannot parse quotes the offending part, password included:
    # nothing of the URL is said, not even its redacted form (which is only "a malformed URL" here).
    return ConfigError(
        f"{setting} cannot be parsed as a Postgres URL: use postgresql://USER:PASSWORD@HOST:PORT/DBNAME, "
        "with special characters in the password percent-encoded"
    )


@functools.lru_cache(maxsize=1)
def _libpq_keywords() -> frozenset[str]:
    # `ssl` too: libpq's URI parser takes `ssl=true` (JDBC's spelling) for sslmode=require.
    return frozenset(option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults()) | {"ssl"}


def _unknown_parameters(url: str) -> list[str]:
    """The names of the query parameters of a postgresql:// URL that libpq does not know: another
    client's options (Prisma's `schema=`, `pgbouncer=`, `connection_limit=`), which a shared
    DATABASE_URL often carries. Only names shaped like parameter names: nothing else is quoted."""
    scheme, sep, rest = url.strip().partition("://")
    at = rest.rfind("@")
    # A '?' in the credentials (an unencoded one in a password) would make a piece of the password
    # look like a parameter's name: then nothing is named.
    if not sep or scheme.lower() not in ("postgresql", "postgres") or "?" in rest[:max(at, 0)]:
        return []
    query_at = rest.find("?", at + 1)
    if query_at < 0:
        return []
    names = (part.partition("=")[0] for part in rest[query_at + 1:].split("&"))
    return [name for name in dict.fromkeys(names)
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,59}", name) and name not in _libpq_keywords()]


def _a_c_int(digits: str) -> bool:
    """Whether a whole number (as the check above matched it) fits the C int libpq reads it into;
    its length first, since int() refuses a string of thousands of digits."""
    return len(digits.strip().lstrip("+-")) <= 10 and int(digits) in _INT_RANGE


def check_url(url: str, setting: str = "LIVEPUSH_DATABASE_URL") -> None:
    """ConfigError, naming `setting` and no part of the URL but an unknown parameter's name, when
    `url` is not a Postgres URL or conninfo, or holds a port or sslmode libpq refuses before it
    connects."""
    try:
        info = fields(url)
    except psycopg.Error:
        unknown = _unknown_parameters(url)
        if unknown:
            # Said as "cannot be parsed ... percent-encode the password", it sent the operator
            # after a password that was fine.
            raise ConfigError(
                f"{setting} has the parameter {', '.join(unknown)}, which Postgres does not know (an option "
                "of another client, such as Prisma's schema= or pgbouncer=, or a misspelling): remove it, "
                "or give livepush a URL of its own in LIVEPUSH_DATABASE_URL"
            ) from None
        raise malformed(url, setting) from None
    if _misread(url):
        raise ConfigError(
            f"{setting} has an '@' or '/' in its user or password that Postgres would read as part of the host "
            "or database name: percent-encode them (%40 for '@', %2F for '/')"
        )
    # libpq parses these only when it connects, and its refusal then read as a database that is
    # down (exit 1, "cannot reach Postgres"): it is the setting's mistake, to be said as such.
    # Checked after _misread, and never quoted: a misread password lands in exactly these fields.
    for port in str(info.get("port") or "").split(","):  # one per host of a multi-host URL
        if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise ConfigError(f"{setting} has a port that is not a number from 1 to 65535: fix it (5432 by default)")
    sslmode = info.get("sslmode")
    if sslmode is not None and sslmode not in SSLMODES:
        raise ConfigError(f"{setting} has an unknown sslmode: use one of {', '.join(SSLMODES)}")
    for option in INTEGER_OPTIONS:
        value = info.get(option)
        if value is None:
            continue
        bounded = option != "connect_timeout"
        if not re.fullmatch(r"\s*[+-]?[0-9]+\s*", value) or (bounded and not _a_c_int(value)):
            within = " from -2147483648 to 2147483647" if bounded else ""
            raise ConfigError(f"{setting} has a {option} that is not a whole number{within}: fix it, or leave it out")
