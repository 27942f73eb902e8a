"""Redis clients as livepush makes them, the namespace every channel and key lives under
(`{P}:...` for the deployment's prefix P), and URLs shown without their credentials."""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import re
import stat
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.exceptions import (AskError, AuthenticationError, BusyLoadingError, ClusterCrossSlotError,
                              ClusterDownError, ConnectionError as RedisConnectionError, MasterDownError,
                              NoPermissionError, OutOfMemoryError, ReadOnlyError, RedisError, ResponseError,
                              TimeoutError as RedisTimeout, TryAgainError)
from redis.retry import Retry

from ..errors import (AclRefused, ConfigError, DependencyError, ListenAclRefused, ListenError, ListenLoginRefused,
                      LoginRefused)

CONNECT_TIMEOUT = 5.0
# A client's connections (an event loop's, or a process's sync calls from all its threads), and
# how long a call waits for one of them to free up. redis-py's own pool refuses a call at once
# past its limit (100: "Too many connections"), which turned a burst of subscribes to new topics,
# or of publishes from a threaded web server's threads, into refusals; a call now waits its turn.
POOL_CONNECTIONS = 100
POOL_WAIT_SECONDS = 10.0
_POOL_WAIT_ENDED = "No connection available"
# Query parameters of a Redis URL that are credentials.
_SECRET_PARAMS = {"password", "username", "user", "pass", "auth", "token"}
# A database number in a Redis URL's path or `db` parameter.
_DB_NUMBER = re.compile(r"[0-9]{1,9}")


def _misread(url: str) -> bool:
    """Whether a URL parser reads part of the credentials as the path, query or fragment: they
    end at the first '/', '?' or '#', so a password holding one unencoded spills into what
    redact() shows (and the rest is taken as the host and port)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return "@" in parts.path or ("@" not in parts.netloc and "@" in parts.query + parts.fragment)


def redact(url: str) -> str:
    """`url` without a password, username or credential parameter; safe for any output."""
    if _misread(url):
        return "(a URL with an unencoded '/', '?' or '#' in its password)"
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        if parts.port:
            host = f"{host}:{parts.port}"
        netloc = ("***@" if parts.username or parts.password else "") + host
        query = urlencode([(k, "***" if k.lower() in _SECRET_PARAMS else v) for k, v in parse_qsl(parts.query)], safe="*")
        if not netloc and "://" in url:
            # urlunsplit drops the `//` of an empty host: `unix:///run/redis.sock` came out as
            # `unix:/run/redis.sock`, a URL redis-py refuses, in the errors a user copies from.
            return f"{parts.scheme}://{parts.path}" + (f"?{query}" if query else "")
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
    except ValueError:
        return "(a malformed URL)"


def check_url(url: str) -> None:
    """ConfigError, naming no credential, when `url` is not a Redis URL or names its database
    by anything but a number."""
    if _misread(url):
        raise ConfigError("LIVEPUSH_REDIS_URL has a '/', '?' or '#' in its user or password that would be read as "
                          "the URL's path: percent-encode them (%2F for '/', %3F for '?', %23 for '#')")
    _check_scheme(url)
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query)
    except (ValueError, TypeError) as exc:
        raise _unreadable(url, exc) from None
    host = parts.netloc.rpartition("@")[2]
    if parts.scheme == "unix" and host:
        # redis-py takes the socket's path from the URL's path alone: `unix://run/redis.sock`
        # connected to /redis.sock, "No such file or directory" for a socket that is there.
        raise ConfigError(
            f"LIVEPUSH_REDIS_URL {redact(url)} reads {host[:40]!r} as a host name, which a socket URL has none of: "
            f"write the socket's path after three slashes, unix://{('/' + host + parts.path)[:200]}?db=DB"
        )
    # redis-py reads a path that is not a number (`/abc`, a typo such as `/1l`) as no database,
    # that is database 0, and takes `/-1`: the deployment would join database 0's namespace
    # (livepush:0) and hear its messages, or fail at its first command.
    named = [unquote(parts.path).lstrip("/")] if parts.scheme in ("redis", "rediss") else []
    named += [value for name, value in query if name == "db"]
    for db in named:
        if db and not _DB_NUMBER.fullmatch(db):
            raise ConfigError(
                f"LIVEPUSH_REDIS_URL {redact(url)} names database {db[:40]!r}, which is not a database number: "
                "use redis://[:PASSWORD@]HOST:PORT/DB with DB a whole number (0 when you have no other)"
            )
    # redis-py takes the first `db` parameter over the path, silently: `/2?db=5` used database 5
    # (and the prefix livepush:5) where whoever wrote /2 meant 2. Which was meant, only they know.
    numbers = sorted({int(db) for db in named if db})
    if len(numbers) > 1:
        raise ConfigError(
            f"LIVEPUSH_REDIS_URL {redact(url)} names two databases ({numbers[0]} and {numbers[1]}) in its path and "
            "db parameters: keep the one you mean (redis://[:PASSWORD@]HOST:PORT/DB)"
        )
    try:
        # After the database check: redis-py's refusal of `?db=abc` names no database.
        parsed = parse_url(url)
    except (ValueError, TypeError) as exc:
        raise _unreadable(url, exc) from None
    _check_numbers(url, parsed)
    _check_parameters(url)


# The URL's numeric parameters, which redis-py reads with no range, and what each takes: a negative
# timeout or check interval failed only at the first connect or PING, told as Redis being down.
_NUMBERS = {"socket_timeout": (False, "seconds above 0"), "socket_connect_timeout": (False, "seconds above 0"),
            "timeout": (False, "seconds above 0"), "health_check_interval": (True, "seconds, 0 or more"),
            "max_connections": (False, "a whole number above 0"), "socket_read_size": (False, "a whole number above 0")}


def _check_numbers(url: str, parsed: dict[str, Any]) -> None:
    for name, (zero_too, takes) in _NUMBERS.items():
        value = parsed.get(name)
        if value is None or (math.isfinite(value) and (value > 0 or (zero_too and value == 0))):
            continue
        raise ConfigError(f"LIVEPUSH_REDIS_URL {redact(url)} has {name}={value}: it takes {takes}; fix it, or "
                          "leave it out")


# redis-py's words for a parameter whose value it cannot convert, and for the URL's port.
_INVALID_VALUE = re.compile(r"Invalid value for '(\w{1,60})'")
_PORT_WORDS = ("Port out of range", "Port could not be cast")


def _unreadable(url: str, exc: BaseException) -> ConfigError:
    """The error for a URL that cannot be read, saying which part when the parser's words do:
    "not a Redis URL" alone left the operator to find it. The parser's own words are not quoted,
    as they may hold what sits where the port goes (a password written there)."""
    said = str(exc)
    invalid = _INVALID_VALUE.search(said)
    if invalid is not None:
        why = f" (its {invalid.group(1)} parameter has a value Redis connections do not take)"
    elif said.startswith(_PORT_WORDS):
        why = " (its port is not a number from 0 to 65535)"
    else:
        why = ""
    return ConfigError(f"LIVEPUSH_REDIS_URL {redact(url)} is not a Redis URL{why}: use "
                       "redis://[:PASSWORD@]HOST:PORT/DB")


def _check_scheme(url: str) -> None:
    """ConfigError saying what livepush connects to when `url` has the scheme another client
    gives Sentinel or Cluster (`redis+sentinel://`, `sentinel://`, `redis+cluster://`): as "not a
    Redis URL" it left the user to guess whether livepush takes them at all."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if "sentinel" in scheme:
        raise ConfigError(
            f"LIVEPUSH_REDIS_URL {redact(url)} is a URL for Redis Sentinel, which livepush does not connect "
            "through: give the address of the primary that Sentinel names (redis-cli -p 26379 SENTINEL "
            "get-master-addr-by-name NAME) as redis://[:PASSWORD@]HOST:PORT/DB, and after a failover the new one")
    if "cluster" in scheme:
        raise ConfigError(
            f"LIVEPUSH_REDIS_URL {redact(url)} is a URL for a Redis Cluster, which livepush does not support: "
            "give it a standalone Redis as redis://[:PASSWORD@]HOST:PORT/DB")


_UNEXPECTED = re.compile(r"unexpected keyword argument '(\w{1,60})'")


def _check_parameters(url: str) -> None:
    """ConfigError naming a query parameter of `url` that redis-py hands to its connections and they
    do not take (`?ssl_cert_reqs=none` on a redis:// URL, which only rediss:// connections know, a
    misspelling): made, not connected, as livepush's connections are, so that the mistake is this
    line at start and not a TypeError traceback at the first connect."""
    from redis import asyncio as aredis

    try:
        aredis.ConnectionPool.from_url(own_url(url), **client_kwargs("livepush", for_asyncio=True)).make_connection()
    except TypeError as exc:
        found = _UNEXPECTED.search(str(exc))
        parameter = f" {found.group(1)!r}" if found else ""
        raise ConfigError(
            f"LIVEPUSH_REDIS_URL {redact(url)} has a parameter{parameter} that Redis connections do not take "
            "(TLS options need a rediss:// URL): remove it, or fix its spelling"
        ) from None


def deployment_prefix(url: str, prefix: str | None = None) -> str:
    """The deployment's prefix: `prefix` (LIVEPUSH_REDIS_PREFIX) when given, else
    `livepush:<db number>`: Redis pub/sub ignores database numbers, so deployments on two
    databases of one server would otherwise hear each other's messages and revocations."""
    if prefix is not None:
        return prefix
    try:
        db = parse_url(url).get("db", 0)
    except (ValueError, TypeError):
        db = 0
    return f"livepush:{int(db or 0)}"


PREFIX_MAX = 100


def check_prefix(prefix: str) -> None:
    """ConfigError unless `prefix` is 1 to PREFIX_MAX printable characters without spaces or braces
    (the braces are what end it in every key and channel: see namespace())."""
    if not (isinstance(prefix, str) and 0 < len(prefix) <= PREFIX_MAX and prefix.isprintable()
            and not any(c in prefix for c in " {}")):
        raise ConfigError(f"LIVEPUSH_REDIS_PREFIX {str(prefix)[:PREFIX_MAX]!r} must be 1 to {PREFIX_MAX} printable "
                          "characters without spaces, { or }")


def namespace(prefix: str) -> str:
    """`{prefix}`: what every key and channel of the deployment with this prefix starts with, then
    `:`. The braces end the prefix where no prefix can (none holds `}`), so a deployment's keys
    are never another's, whatever both prefixes are: under a bare `P:` layout, deployment `prod`
    read deployment `prod:h`'s history as its topic `h:<topic>`, its prune() trimmed it, and the
    ACL `~prod:*` let prod's user at it. `~{prod}:*` matches prod's keys and nobody else's."""
    check_prefix(prefix)
    return "{" + prefix + "}"


def listener_name(prefix: str) -> str:
    """The client name of the pub/sub connection of a deployment's process: `livepush status`
    lists the servers of its own deployment by it, on a Redis that other deployments share. Redis
    takes only `!` to `~` in a name: a prefix with other characters is named by its hash."""
    tag = namespace(prefix)
    if not all("!" <= c <= "~" for c in tag):
        tag = "#" + hashlib.sha256(prefix.encode("utf-8")).hexdigest()[:16]
    return f"livepush-listener:{tag}"


# Query parameters of a Redis URL that redis-py lets override what a client is given, where
# livepush needs its own: RESP3 delivers pub/sub frames as pushes (a SUBSCRIBE never confirmed),
# decoded replies are text where the parsers read bytes (every history read taken for a
# malformed stream), and `livepush status` finds the servers by their client name. A URL
# written for another client may hold them.
_OWN_PARAMS = {"protocol", "decode_responses", "encoding", "encoding_errors", "client_name"}


def own_url(url: str) -> str:
    """`url` as livepush's own connections use it: without the parameters livepush sets itself
    (client_kwargs())."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url  # redis-py refuses it as it would have
    query = parse_qsl(parts.query, keep_blank_values=True)
    if not any(name in _OWN_PARAMS for name, _ in query):
        return url
    return urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query if k not in _OWN_PARAMS])))


def client_kwargs(client_name: str, connect_timeout: float = CONNECT_TIMEOUT, *,
                  for_asyncio: bool = False) -> dict[str, Any]:
    """What every connection livepush opens to Redis is given; `for_asyncio` for an asyncio
    client, whose retry policy is redis-py's asyncio one (a sync one is converted with a warning)."""
    return {
        "socket_connect_timeout": connect_timeout,
        "client_name": client_name,
        "health_check_interval": 30,
        # No retries: a retried script whose first reply was lost would run twice, and
        # redis-py's default backoff makes a call to a down Redis hang for seconds. A pooled
        # connection whose server restarted is reconnected before use (its socket reads EOF).
        "retry": no_retries(for_asyncio),
        # RESP2 on every connection: the replies parsed here (stream entries, script results,
        # pub/sub frames) are the RESP2 shapes; redis-py 8 defaults to RESP3.
        "protocol": 2,
    }


def no_retries(for_asyncio: bool) -> Any:
    if for_asyncio:
        from redis.asyncio.retry import Retry as AsyncRetry

        return AsyncRetry(NoBackoff(), 0)
    return Retry(NoBackoff(), 0)


def text(value: Any, errors: str = "strict") -> str:
    """A reply value as text: Redis answers bytes (this client never decodes replies itself)."""
    return value.decode("utf-8", errors) if isinstance(value, bytes) else str(value)


def one_line(exc: BaseException) -> str:
    said = " ".join(str(exc).split())
    return said or type(exc).__name__


def failed(url: str, exc: BaseException, doing: str, cls: type[DependencyError] = DependencyError, *,
           reads: bool = False, key: str | None = None, deleting: str = "") -> DependencyError:
    """Our error for a Redis failure: the URL redacted, the driver's words, which never hold the
    password (redis-py does not quote URLs or AUTH arguments in its errors), and what to do.
    `reads`: the call writes nothing of the user's (a read, a subscribe), so no advice about what
    it may have done all the same. `key`: the key that holds another type of value, when the
    caller knows it (Redis' refusal names none), with what `deleting` it costs."""
    remedy = (_url_remedy(url, exc) or (_wrong_key_remedy(key, deleting) if key and wrong_type(exc) else None)
              or _remedy(exc, reads))
    if isinstance(exc, AuthenticationError) or no_such_database(exc):
        # Redis is up and refused the URL's password or user, or has no database of its number
        # (as Postgres refuses a database that does not exist): a setting to correct (the CLI's
        # exit 2), and still `cls`'s kind (a ListenError from listen()) for those who catch it.
        cls = ListenLoginRefused if issubclass(cls, ListenError) else LoginRefused
    said = f"Redis at {redact(url)} failed while {doing} ({one_line(exc)}): {remedy}"
    if acl_denied(exc):
        # Up, logged in, and refused by its ACL: a rule to add in Redis, which no reconnect brings
        # (the CLI's exit 2, /readyz naming it), and still `cls`'s kind for those who catch it.
        refused = ListenAclRefused if issubclass(cls, ListenError) else AclRefused
        return refused(said, _acl_rule_lacking(exc))
    return cls(said)


def _wrong_key_remedy(key: str, deleting: str) -> str:
    # Only livepush's scripts write under the deployment's prefix, and always the type they read.
    return (f"Redis is up but {key!r} holds another type of value than livepush keeps there: something else writes "
            f"under LIVEPUSH_REDIS_PREFIX; give it a prefix of its own and delete that key"
            + (f" ({deleting})" if deleting else ""))


def _url_remedy(url: str, exc: BaseException) -> str | None:
    """What to do about `exc` when the URL shows what went wrong, else None."""
    return _socket_remedy(url) or _tls_remedy(url, exc) or _auth_remedy(url, exc)


def _auth_remedy(url: str, exc: BaseException) -> str | None:
    """What to do when Redis wants a password the URL does not give: told to correct "the user or
    password", a user looked for a mistake in a password the URL did not hold (none, or one written
    where the user goes, `redis://PASSWORD@HOST`, the colon forgotten)."""
    if not isinstance(exc, AuthenticationError):
        return None
    try:
        given = parse_url(url)
    except (ValueError, TypeError):
        return None
    if given.get("password"):
        return None
    if given.get("username"):
        return ("Redis is up and refused LIVEPUSH_REDIS_URL's user, which comes with no password (a password alone "
                "goes after a colon): use redis://:PASSWORD@HOST:PORT/DB, or USER:PASSWORD@ for an ACL user")
    return ("Redis is up and needs a password, which LIVEPUSH_REDIS_URL does not give: use "
            "redis://:PASSWORD@HOST:PORT/DB, or USER:PASSWORD@ for an ACL user")


def _tls_remedy(url: str, exc: BaseException) -> str | None:
    """What to do when the URL's scheme may not match its port's TLS: a Redis that takes only TLS
    resets a plain connection as it opens, and a plain one never completes a TLS handshake (the
    connect times out). Either was told to check that Redis runs, of a Redis that ran."""
    scheme = url.split("://", 1)[0].lower()
    if scheme == "redis" and isinstance(exc, RedisConnectionError) and "reset by peer" in str(exc):
        # Also what a Redis killed mid-call does: the words leave room for that.
        return ("Redis reset the connection, as one that takes only TLS on that port does to every plain "
                "connection: if it does, use rediss://HOST:PORT/DB (else it went away or closed it, which its log says)")
    if scheme == "rediss" and isinstance(exc, RedisTimeout) and "connecting" in str(exc):
        return ("no TLS handshake was answered in time, as a Redis that takes plain connections on that port never "
                "answers one: if it does, use redis://HOST:PORT/DB; else check that Redis is running and reachable")
    return None


def _socket_remedy(url: str) -> str | None:
    """What to do when a unix:// URL's path runs on below a socket (`unix:///run/redis.sock/2`,
    the database written as a redis:// URL writes it): a socket is no folder, so the connection
    fails with "Not a directory", and told to check that Redis runs, a user looks at a Redis that
    does."""
    try:
        parts = urlsplit(url)
        if parts.scheme != "unix":
            return None
        below, _, last = unquote(parts.path).rstrip("/").rpartition("/")
        if not (below and stat.S_ISSOCK(os.stat(below).st_mode)):
            return None
    except (ValueError, OSError):
        return None
    fixed = f"unix://{below}?db={last}" if _DB_NUMBER.fullmatch(last) else f"unix://{below}"
    return (f"{below} is the socket and no folder, so the URL's path must end there; a database number goes in "
            f"the db parameter: {fixed}")


async def answered_at_start(url: str, read: Awaitable[Any], cls: type[DependencyError], *, while_loading: bool) -> None:
    """Await `read`, one the part's work makes on the deployment's keys, at its start: `cls`
    saying why when Redis refuses it. PING and SUBSCRIBE alone succeed on a Redis Sentinel and
    on a node of a Redis Cluster that does not hold the deployment's keys, where every later
    call fails. `while_loading`: a Redis still loading its data after a restart passes, as it
    will answer once loaded."""
    try:
        await read
    except (RedisError, OSError) as exc:
        if while_loading and isinstance(exc, BusyLoadingError):
            return
        raise failed(url, exc, "connecting", cls, reads=True) from exc


# Words of Redis' refusal of a command that the ACL denies inside a script (EVAL): a plain
# command's comes as NOPERM, a script's as an error of its own (Redis 7.0 "The user executing
# the script can't ...", 7.2 and later "ACL failure in script: ...").
_SCRIPT_ACL_DENIALS = ("user executing the script can't", "no permissions", "ACL failure in script")
# Words of Redis' refusal of a key or channel the ACL denies, which name neither: 6.2 and 7.0
# ("one of the keys used as arguments", in a script "at least one of the keys" or "publish to the
# channel"), 7.2 and later ("No permissions to access a key", in a script after "ACL failure in
# script: "). Not "channel" alone: a user named so appears in 7.2's refusal of a command.
_KEY_DENIED = re.compile(r"one of the keys|access (?:a|the '.*') key\b")
_CHANNEL_DENIED = re.compile(r"one of the channels|to the channel|access (?:a|the '.*') channel\b")
# The command a plain refusal names (NOPERM "has no permissions to run the 'ping' command", 7.2's
# in a script too); a subcommand comes as 'script|load', as the ACL's rule names it.
_COMMAND_DENIED = re.compile(r"to run the '([A-Za-z|]+)' command")
# Redis 7.0 names neither the command nor the rule in that refusal, only the script's SHA1 and
# line: the scripts livepush runs, by SHA1, let the error name the rule the user lacks.
_SCRIPTS: dict[str, str] = {}
_SCRIPT_LINE = re.compile(r"script: ([0-9a-f]{40}), on @user_script:([0-9]+)")
_SCRIPT_CALL = re.compile(r"redis\.p?call\('([A-Za-z]+)'")


def known_script(source: str) -> str:
    """`source`, a Lua script livepush runs, kept so that an ACL's refusal inside it is named."""
    _SCRIPTS[hashlib.sha1(source.encode("utf-8")).hexdigest()] = source
    return source


def _rule_denied_in_script(exc: BaseException) -> str | None:
    """The ACL rule (`+xadd`) of the one command on the script line that Redis refused, if known."""
    found = _SCRIPT_LINE.search(str(exc))
    lines = _SCRIPTS.get(found[1], "").split("\n") if found else []
    at = int(found[2]) if found else 0
    commands = {name.lower() for name in _SCRIPT_CALL.findall(lines[at - 1])} if 0 < at <= len(lines) else set()
    return f"+{commands.pop()}" if len(commands) == 1 else None


def acl_denied(exc: BaseException) -> bool:
    """Whether `exc` is Redis' refusal, by the ACL of the URL's user, of a command, key or channel:
    a plain command's NOPERM, or a script's refusal of one it runs."""
    return isinstance(exc, NoPermissionError) or (
        isinstance(exc, ResponseError) and any(words in str(exc) for words in _SCRIPT_ACL_DENIALS))


def _acl_rule_lacking(exc: BaseException) -> str | None:
    """The rule of the ACL line docs/security.md shows that the user lacks for the refusal `exc`
    (`+publish`, `&{P}:*`, `~{P}:*`), None when Redis' words do not tell."""
    said = str(exc)
    if _CHANNEL_DENIED.search(said):
        return "&{P}:*"
    if _KEY_DENIED.search(said):
        return "~{P}:*"
    named = _COMMAND_DENIED.search(said)
    return f"+{named[1].lower()}" if named else _rule_denied_in_script(exc)
# What a Redis before 6.2 answers the stream commands of livepush's scripts: it takes an exclusive
# range's start ("(ID", history reads) for a malformed id, and XTRIM's MINID (prune) for a syntax
# error. A Redis that livepush supports never says either to them: the scripts send ids they made.
_OLD_REDIS_WORDS = "Invalid stream ID specified as stream command argument"
_REDIS_NEEDED = "6.2"


def _older_than_needed(exc: BaseException) -> bool:
    said = str(exc)
    return isinstance(exc, ResponseError) and (
        _OLD_REDIS_WORDS in said or ("ERR syntax error" in said and "script" in said))


def in_cluster(exc: BaseException) -> bool:
    """Whether `exc` is what a node of a Redis Cluster answers: a redirection to the node that
    holds the key (MOVED, ASK), another cluster refusal, or its refusal of a database number.
    MASTERDOWN is not one: a replica whose primary is away says it too."""
    if isinstance(exc, MasterDownError):
        return False
    return isinstance(exc, (AskError, TryAgainError, ClusterCrossSlotError, ClusterDownError)) or (
        isinstance(exc, ResponseError) and "not allowed in cluster mode" in str(exc))


def no_such_database(exc: BaseException) -> bool:
    """Whether `exc` is Redis' refusal of the URL's database number (SELECT past its `databases`)."""
    return isinstance(exc, ResponseError) and "DB index is out of range" in str(exc)


def unknown_command(exc: BaseException) -> bool:
    """Whether `exc` is Redis' answer to a command it does not know (`unknown command 'EVALSHA'`,
    older ones quote it with backticks): a Sentinel's to everything livepush runs but PING and
    SUBSCRIBE. (A script calling an unknown command says "Unknown Redis command" instead.)"""
    return isinstance(exc, ResponseError) and str(exc).startswith("unknown command")


def wrong_type(exc: BaseException) -> bool:
    """Whether Redis refused a command (of a script too) because its key holds another type of
    value than the command works on."""
    return isinstance(exc, ResponseError) and str(exc).startswith("WRONGTYPE")


def _remedy(exc: BaseException, reads: bool) -> str:
    """What to do about `exc`, met by a call that `reads` only or not. A Redis that answers with a refusal is up and
    reachable: told to check the URL and that Redis runs, an operator looks everywhere but at its
    memory or ACL."""
    if in_cluster(exc):
        # Every key of a deployment is in one hash slot (the braces of its prefix), but calls go
        # to the node the URL names, which follows no redirection and may not hold that slot.
        return ("Redis is up but is a node of a Redis Cluster, which livepush does not support (it sends every call "
                "to the one Redis the URL names and follows no redirection): point LIVEPUSH_REDIS_URL at a "
                "standalone Redis, or at the primary of one that Sentinel watches")
    if unknown_command(exc):
        return ("what answered is not a Redis that runs livepush's commands: a Redis Sentinel (its port is usually "
                "26379) knows none of them but PING and SUBSCRIBE; point LIVEPUSH_REDIS_URL at the Redis primary "
                "that Sentinel names, not at Sentinel itself (or give this Redis back the command its rename-command "
                "took away)")
    if isinstance(exc, OutOfMemoryError):
        return ("Redis is up but at its maxmemory and refuses writes: raise its maxmemory, or keep less history "
                "(LIVEPUSH_HISTORY_TTL); see Redis in docs/operations.md")
    if isinstance(exc, ReadOnlyError):
        return ("Redis is up but a read-only replica: point LIVEPUSH_REDIS_URL at the primary (after a failover, the "
                "promoted one)")
    if isinstance(exc, AuthenticationError):
        return "Redis is up but refused the user or password: correct them in LIVEPUSH_REDIS_URL"
    if "DENIED" in str(exc) and "protected mode" in str(exc):
        # Redis' first answer to a client from another host when its default user has no password.
        return ("Redis is up but in protected mode, which takes connections only from Redis' own host while its "
                "default user has no password: give Redis a password (requirepass, or an ACL user as docs/security.md "
                "shows) and put it in LIVEPUSH_REDIS_URL")
    if no_such_database(exc):
        return ("Redis is up but has no database of the number LIVEPUSH_REDIS_URL names: name one below its "
                "`databases` setting (16 unless configured)")
    if "max number of clients reached" in str(exc):
        # Words, not a class: older redis-py versions raise a plain ConnectionError for it.
        return ("Redis is up but serves as many clients as its maxclients allows: raise maxclients (each livepush "
                "process holds up to 100 connections per event loop that publishes or reads history, 100 for its "
                "threads' sync calls, and one that listens), or find what holds the others (CLIENT LIST)")
    if "CERTIFICATE_VERIFY_FAILED" in str(exc):
        # rediss:// checks Redis' certificate against this machine's CAs and the URL's host name.
        return ("Redis answered but its TLS certificate was refused (signed by a CA this machine does not trust, or "
                "for another host name): give its CA in LIVEPUSH_REDIS_URL (rediss://HOST:PORT/DB?ssl_ca_certs="
                "/path/to/ca.pem), or use the host name the certificate names")
    if isinstance(exc, BusyLoadingError):
        # Redis answers while it reads its data back after a restart, and refuses every command.
        return "Redis is up but still loading its data after a restart: try again once it has loaded"
    if acl_denied(exc):
        rule = _acl_rule_lacking(exc)
        if rule in ("&{P}:*", "~{P}:*"):
            # Redis names no key or channel, and a prefix written without its braces
            # (`~livepush:12:*`) matches none of livepush's.
            denied = "channels" if rule.startswith("&") else "keys"
            return (f"Redis is up but the ACL of LIVEPUSH_REDIS_URL's user denies the deployment's {denied}, "
                    "all named `{P}:...`, P being the deployment's prefix (LIVEPUSH_REDIS_PREFIX, else livepush:<database "
                    "number>) in braces: give it `~{P}:*` and `&{P}:*`, in the ACL that docs/security.md shows")
        if rule:
            runs = "livepush's scripts run" if _SCRIPT_LINE.search(str(exc)) else "livepush runs"
            return (f"Redis is up but the ACL of LIVEPUSH_REDIS_URL's user lacks {rule} (a command {runs}): give it "
                    "the ACL that docs/security.md shows for the deployment's prefix, which has it")
        return ("Redis is up but the ACL of LIVEPUSH_REDIS_URL's user denies a command or key livepush needs: give "
                "it the ACL that docs/security.md shows for the deployment's prefix")
    if isinstance(exc, RedisConnectionError) and _POOL_WAIT_ENDED in str(exc):
        # redis-py's words when a pool of async_client() or sync_client() had no connection free
        # within its wait.
        return (f"every one of the {POOL_CONNECTIONS} connections this event loop (or, for sync calls, this process's "
                f"threads) holds to Redis stayed in use for "
                f"{POOL_WAIT_SECONDS:g} s, so the call was never sent: the calls holding them wait for a Redis that "
                f"answers slowly or not at all (their own errors say which), or the process makes more than "
                f"{POOL_CONNECTIONS} calls at once")
    if wrong_type(exc):
        # A caller that could not tell which key (failed(key=) names it): what is kept there is unknown too.
        return ("Redis is up but a key under the deployment's prefix holds another type of value than livepush "
                "keeps there: something else writes under LIVEPUSH_REDIS_PREFIX; give it a prefix of its own and "
                "delete that key (redis-cli's TYPE shows a key's type)")
    if _older_than_needed(exc):
        return (f"Redis is up but older than livepush needs (Redis {_REDIS_NEEDED} or newer, for its stream "
                "commands): upgrade it; `redis-cli INFO server` shows its redis_version")
    if isinstance(exc, RedisTimeout) and "reading" in str(exc) and reads:
        # A read: nothing of the user's was sent, and what takes the connection but never answers
        # is as often no Redis at all (a wrong port) as a paused one.
        return ("Redis did not answer in time (slow, paused or cut off, or what listens there is not Redis): "
                "check LIVEPUSH_REDIS_URL and that Redis is running")
    if isinstance(exc, RedisTimeout) and "reading" in str(exc):
        # The command was sent: Redis may run it after the wait ended (a pause, a slow script).
        return ("Redis did not answer in time (slow, paused or cut off): what the call sent may have been done all "
                "the same (a publish: look at the topic's latest offset before publishing again)")
    return "check LIVEPUSH_REDIS_URL and that Redis is running"


def async_client(url: str, client_name: str, connect_timeout: float = CONNECT_TIMEOUT, **extra: Any) -> Any:
    """An asyncio Redis client whose calls wait (up to POOL_WAIT_SECONDS) for one of its
    POOL_CONNECTIONS connections rather than fail when a burst has them all in use."""
    from redis import asyncio as aredis

    pool = aredis.BlockingConnectionPool.from_url(own_url(url), max_connections=POOL_CONNECTIONS,
                                                  timeout=POOL_WAIT_SECONDS,
                                                  **client_kwargs(client_name, connect_timeout, for_asyncio=True), **extra)
    return aredis.Redis.from_pool(pool)


def sync_client(url: str, client_name: str, connect_timeout: float = CONNECT_TIMEOUT, **extra: Any) -> Any:
    """A Redis client for sync calls from any thread whose calls wait (up to POOL_WAIT_SECONDS)
    for one of its POOL_CONNECTIONS connections rather than fail when a burst has them all in use."""
    import redis

    pool = redis.BlockingConnectionPool.from_url(own_url(url), max_connections=POOL_CONNECTIONS,
                                                 timeout=POOL_WAIT_SECONDS, **client_kwargs(client_name, connect_timeout),
                                                 **extra)
    return redis.Redis.from_pool(pool)


class Closable(Protocol):
    """What LoopClients keeps: a client closed on its own loop."""

    async def aclose(self) -> None: ...


C = TypeVar("C", bound=Closable)


# Every LoopClients of the process, so that a forked child starts afresh (_after_fork).
_EVERY: weakref.WeakSet[LoopClients[Any]] = weakref.WeakSet()
# What forked children inherited: kept, never used nor collected. Those clients' sockets and
# their loops' epoll are the parent's: a connection collected while its loop is open is closed,
# which takes its socket out of that epoll, the parent's too, and the parent never hears it again.
_INHERITED: list[Any] = []


def _after_fork() -> None:
    for clients in list(_EVERY):
        clients.forget_inherited()


os.register_at_fork(after_in_child=_after_fork)


class LoopClients(Generic[C]):
    """One asyncio client (made by `make`) per event loop, for an owner called from any of them.

    A redis.asyncio connection belongs to the loop that made it. Keeping only the last loop's
    client made loops that take turns (a web app's and a worker thread's) open a connection at
    each call and leave the one before unclosed; each loop keeps its own here, dropped once the
    loop has ended, and `release_loop()` closes the running loop's (one that is about to end)."""

    def __init__(self, make: Callable[[], C]) -> None:
        self._make = make
        self._clients: dict[asyncio.AbstractEventLoop, C] = {}
        # Loops run in threads of their own (sync code calling asyncio.run() in worker threads):
        # one thread's client must not land or go while another walks the dict for ended loops,
        # which raised "dictionary changed size during iteration" out of that thread's call.
        self._making = threading.Lock()
        _EVERY.add(self)

    def forget_inherited(self) -> None:
        """In a forked child: set aside (never close) the parent's clients; the next use makes one."""
        _INHERITED.append(self._clients)
        self._clients = {}
        self._making = threading.Lock()  # a parent thread may have held it at the fork

    def get(self) -> C:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            with self._making:
                # A client's connections hold their loop, so a weak mapping would never let an ended
                # loop go: sync code that runs asyncio.run() per call would keep a client, and its
                # socket, for every call. Ended loops are dropped here (their sockets close as
                # they are collected: only their own loop could close them properly).
                for ended in [old for old in self._clients if old.is_closed()]:
                    del self._clients[ended]
                client = self._clients[loop] = self._make()
        return client

    async def release_loop(self) -> None:
        with self._making:
            client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    def forget(self) -> None:
        """Drop every loop's client without closing it: only its own loop can, and a loop that
        ended took its sockets with it."""
        with self._making:
            self._clients.clear()
