"""Settings from the environment (docs/reference.md#2-configuration); a CLI flag of the same
meaning overrides.

`Settings.from_env()` validates everything up front so a command fails at once, with one line
naming the setting and the fix, instead of later with a traceback. No message and no `repr`
here holds a secret, a token or a password.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from .types import shown
from .errors import ConfigError

FANOUTS = ("postgres", "redis", "local")
# Every variable Settings.from_env() reads: a framework integration names one written where
# livepush never looks (a Django settings module) rather than let it be silently ignored.
ENVIRONMENT = frozenset({
    "LIVEPUSH_DATABASE_URL", "DATABASE_URL", "LIVEPUSH_FANOUT", "LIVEPUSH_ALLOWED_ORIGINS", "LIVEPUSH_MAX_CONNECTIONS",
    "LIVEPUSH_QUERY_TOKENS", "LIVEPUSH_PREPARED_STATEMENTS", "LIVEPUSH_REDIS_URL", "LIVEPUSH_SECRET",
    "LIVEPUSH_SECRET_FALLBACKS", "LIVEPUSH_AUTHENTICATE", "LIVEPUSH_HOST", "LIVEPUSH_PORT", "LIVEPUSH_HISTORY_TTL",
    "LIVEPUSH_ENV", "LIVEPUSH_REDIS_PREFIX", "LIVEPUSH_SIGNED_TOPIC_TTL", "LIVEPUSH_DRAIN_SECONDS",
    "LIVEPUSH_LISTEN_DATABASE_URL", "LIVEPUSH_MIGRATE_LOCK_TIMEOUT", "LIVEPUSH_WORKER_STOP_MARGIN"})
AUTH_MODES = ("required", "optional", "off")
MIN_SECRET_LENGTH = 32
MIN_SECRET_DISTINCT = 8  # fewer distinct characters than this is not a random secret (e.g. 32 times "a")
DEFAULT_SIGNED_TOPIC_TTL = 86400.0
# A drain's reconnect delays reach 1000 × S ms, and the JS client honours at most 5 minutes.
MAX_DRAIN_SECONDS = 300.0
# The longest a `livepush migrate` statement may be told to wait for a table's lock (a day): an
# application's statements on that table wait behind it all that time.
MAX_MIGRATE_LOCK_TIMEOUT = 86400.0
# How long a worker of `serve --workers N` may outlive its stop's bound before the supervisor
# kills it (docs/reference.md#3-commands); at most an hour, as a stop nobody waits for is no stop.
DEFAULT_WORKER_STOP_MARGIN = 10.0
MAX_WORKER_STOP_MARGIN = 3600.0
# The most server processes `serve --workers N` runs (livepush.cli.workers checks it); here with
# the other settings' bounds so that `livepush serve --help` can state it without importing the
# supervisor's modules.
MAX_WORKERS = 1024
# History is kept at most a year: past that, the stores' time arithmetic overflows (and Redis
# streams and the Postgres log are no archive).
MAX_HISTORY_TTL = 366 * 86400.0
# The shortest TTLs a setting takes. Below a second a history is gone before a reconnecting
# client asks for it (Redis trims in whole milliseconds: 1e-300 s trimmed every message at once),
# and a signed topic expires before the page that embeds it has loaded.
MIN_HISTORY_TTL = 1.0
MIN_SIGNED_TOPIC_TTL = 1.0
_ORIGIN_SCHEMES = ("http", "https")
# How the secret errors say to make one: `python3`, which Debian and Ubuntu have, not `python`.
MAKE_SECRET = "python3 -c 'import secrets; print(secrets.token_urlsafe(48))'"


@dataclasses.dataclass(frozen=True)
class Settings:
    database_url: str | None = dataclasses.field(default=None, repr=False)
    redis_url: str | None = dataclasses.field(default=None, repr=False)
    fanout: str = "local"
    secret: str | None = dataclasses.field(default=None, repr=False)
    secret_fallbacks: tuple[str, ...] = dataclasses.field(default=(), repr=False)
    authenticate: str = "optional"
    allowed_origins: tuple[str, ...] | None = None  # None: same-origin only
    host: str = "127.0.0.1"
    port: int = 8765
    history_ttl: float = 300.0
    env: str | None = None
    redis_prefix: str | None = None  # None: livepush:<db number of the Redis URL>
    max_connections: int | None = None
    signed_topic_ttl: float = DEFAULT_SIGNED_TOPIC_TTL
    query_tokens: bool = True
    drain_seconds: float = 0.0  # 0: on SIGTERM close every connection at once
    worker_stop_margin: float = DEFAULT_WORKER_STOP_MARGIN
    # Where the LISTEN connection goes when it must bypass a pooler that cannot keep it (None: database_url).
    listen_database_url: str | None = dataclasses.field(default=None, repr=False)
    # False behind a pooler that cannot keep prepared statements (PgBouncer in transaction mode before 1.22).
    prepared_statements: bool = True
    # Seconds a `livepush migrate` statement waits for a table's lock (0: as long as it takes);
    # None: the role's own lock_timeout, else migrate.DEFAULT_LOCK_TIMEOUT.
    migrate_lock_timeout: float | None = None
    # The variable database_url was read from, for messages that tell the operator what to check.
    database_url_setting: str = "LIVEPUSH_DATABASE_URL"
    # How the command that reads these settings names them (see named()): its flags, by setting
    # (`{"port": "--port"}`), and the settings those flags gave on its command line.
    flags: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    flagged: frozenset[str] = dataclasses.field(default=frozenset(), repr=False, compare=False)

    @property
    def is_test(self) -> bool:
        return self.env == "test"

    @property
    def secrets(self) -> tuple[str, ...]:
        """The signing secret first, then fallbacks accepted for verification only."""
        return ((self.secret,) if self.secret else ()) + self.secret_fallbacks

    def require_secret(self) -> str:
        if not self.secret:
            raise ConfigError(
                "LIVEPUSH_SECRET is not set: set it to a random string of at least "
                f"{MIN_SECRET_LENGTH} characters (e.g. `{MAKE_SECRET}`)"
            )
        return self.secret

    @property
    def listen_url(self) -> str | None:
        """The URL the process's Postgres listener connects to."""
        return self.listen_database_url or self.database_url

    def require_database(self) -> str:
        if not self.database_url:
            raise ConfigError(
                "LIVEPUSH_DATABASE_URL is not set: set it (or DATABASE_URL) to a Postgres URL "
                "such as postgresql://user@localhost/app"
            )
        return self.database_url

    def named(self, name: str, value: object = None) -> str:
        """How an error names setting `name` (holding `value`, when given) to the operator: as the
        flag that gave it, whose variable is then not read (`--port 70000`); else as its variable,
        with the command's flag for it beside (`LIVEPUSH_PORT=70000 (or --port)`), or alone on a
        command without that flag, where the flag would be refused as usage."""
        return named_setting(name, value, self.flags.get(name), given_by_flag=name in self.flagged)

    def replace(self, **changes: Any) -> Settings:
        """A copy with CLI overrides applied (None means "not given") and re-validated. A change
        to a setting the command has a flag for is that flag's value: errors name the flag."""
        given = {k: v for k, v in changes.items() if v is not None}
        new = dataclasses.replace(self, **given, flagged=self.flagged | (given.keys() & self.flags.keys()))
        new._validate()
        return new

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, validate: bool = True,
                 flags: Mapping[str, str] | None = None) -> Settings:
        """The settings `environ` (default os.environ) gives; `validate=False` reads each variable
        as usual but skips the checks across them, for comparing one variable's readings (a
        Django setting against the environment's) where the environment itself may be incomplete.
        `flags`: the command's flags that stand in for settings, by setting, named beside their
        variables in errors (see named())."""
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(name)
            if value and not _is_utf8(value):
                # Python hands bytes that are not UTF-8 over as lone surrogates, which fail later
                # wherever the value is encoded (a driver, a resolver, every signature).
                raise ConfigError(f"{name} is not valid UTF-8 text: write it in UTF-8 (percent-encode such "
                                  "characters in a URL)")
            return value.strip() if value and value.strip() else None

        def number(name: str, default: str, kind: type[int] | type[float], hint: str) -> Any:
            text = get(name) or default
            try:
                return read_number(text, kind)
            except ValueError:
                # Always the variable's text: a flag given leaves its variable unread.
                setting = name.removeprefix("LIVEPUSH_").lower()
                said = named_setting(setting, shown(text, width=40), (flags or {}).get(setting), given_by_flag=False)
                raise ConfigError(f"{said} is not a number: set {hint}") from None

        database_url = get("LIVEPUSH_DATABASE_URL")
        database_url_setting = "LIVEPUSH_DATABASE_URL"
        if database_url is None and (fallback := get("DATABASE_URL")):
            database_url, database_url_setting = fallback, "DATABASE_URL"
            from .postgres.urls import check_url

            # Checked under its own name here: _validate() would name LIVEPUSH_DATABASE_URL, which
            # is not set, and send the operator looking in the wrong place.
            check_url(database_url, "DATABASE_URL (read as LIVEPUSH_DATABASE_URL is not set)")
        fanout = (get("LIVEPUSH_FANOUT") or ("postgres" if database_url else "local")).lower()
        origins = get("LIVEPUSH_ALLOWED_ORIGINS")
        max_connections = get("LIVEPUSH_MAX_CONNECTIONS")
        migrate_lock_timeout = get("LIVEPUSH_MIGRATE_LOCK_TIMEOUT")
        query_tokens = (get("LIVEPUSH_QUERY_TOKENS") or "on").lower()
        if query_tokens not in ("on", "off"):
            raise ConfigError(f"LIVEPUSH_QUERY_TOKENS={query_tokens!r} is unknown: use on or off")
        prepared = (get("LIVEPUSH_PREPARED_STATEMENTS") or "on").lower()
        if prepared not in ("on", "off"):
            raise ConfigError(f"LIVEPUSH_PREPARED_STATEMENTS={prepared!r} is unknown: use on, or off behind a "
                              "pooler in transaction mode that cannot keep prepared statements")
        settings = cls(
            database_url=database_url,
            database_url_setting=database_url_setting,
            redis_url=get("LIVEPUSH_REDIS_URL"),
            fanout=fanout,
            secret=get("LIVEPUSH_SECRET"),
            secret_fallbacks=tuple(s.strip() for s in (get("LIVEPUSH_SECRET_FALLBACKS") or "").split(",") if s.strip()),
            authenticate=(get("LIVEPUSH_AUTHENTICATE") or "optional").lower(),
            allowed_origins=tuple(o.strip().rstrip("/") for o in origins.split(",") if o.strip()) if origins else None,
            host=get("LIVEPUSH_HOST") or "127.0.0.1",
            port=number("LIVEPUSH_PORT", "8765", int, "a port from 0 to 65535"),
            history_ttl=number("LIVEPUSH_HISTORY_TTL", "300", float, "seconds, e.g. 300"),
            # Any case, as every other word-valued setting: LIVEPUSH_ENV=TEST left jobs.clear()
            # refusing with a message that asks for the very setting the operator made.
            env=(get("LIVEPUSH_ENV") or "").lower() or None,
            redis_prefix=get("LIVEPUSH_REDIS_PREFIX"),
            max_connections=(number("LIVEPUSH_MAX_CONNECTIONS", max_connections, int, "a number of connections")
                             if max_connections else None),
            signed_topic_ttl=number("LIVEPUSH_SIGNED_TOPIC_TTL", str(DEFAULT_SIGNED_TOPIC_TTL), float,
                                    "seconds, e.g. 86400"),
            query_tokens=query_tokens == "on",
            drain_seconds=number("LIVEPUSH_DRAIN_SECONDS", "0", float, "seconds, e.g. 10 (0: close every connection at once)"),
            worker_stop_margin=number("LIVEPUSH_WORKER_STOP_MARGIN", str(DEFAULT_WORKER_STOP_MARGIN), float,
                                      "seconds, e.g. 10"),
            listen_database_url=get("LIVEPUSH_LISTEN_DATABASE_URL"),
            prepared_statements=prepared == "on",
            migrate_lock_timeout=(number("LIVEPUSH_MIGRATE_LOCK_TIMEOUT", migrate_lock_timeout, float,
                                         "seconds, e.g. 5 (0: wait as long as it takes)")
                                  if migrate_lock_timeout else None),
            flags=dict(flags or {}),
        )
        if validate:
            settings._validate()
        return settings

    def _validate(self) -> None:
        # Named by named(): `serve --fanout redis` leaves LIVEPUSH_FANOUT unread, so naming it sent
        # the operator to a variable they never set.
        if self.fanout not in FANOUTS:
            raise ConfigError(f"{self.named('fanout', repr(self.fanout))} is unknown: use one of {', '.join(FANOUTS)}")
        if self.fanout == "postgres" and not self.database_url:
            raise ConfigError(f"{self.named('fanout', 'postgres')} needs LIVEPUSH_DATABASE_URL (or DATABASE_URL): set "
                              "it to a Postgres URL")
        if self.fanout == "redis" and not self.redis_url:
            raise ConfigError(f"{self.named('fanout', 'redis')} needs LIVEPUSH_REDIS_URL: set it to a URL such as "
                              "redis://localhost:6379/0")
        if self.database_url:
            from .postgres.urls import check_url

            check_url(self.database_url)
        if self.listen_database_url:
            from .postgres.urls import check_url

            if not self.database_url:
                raise ConfigError("LIVEPUSH_LISTEN_DATABASE_URL is set without LIVEPUSH_DATABASE_URL: set that too "
                                  "(the listen URL only moves the LISTEN connection of the same database)")
            check_url(self.listen_database_url, "LIVEPUSH_LISTEN_DATABASE_URL")
        if self.redis_url:
            from .redis.client import check_url as check_redis_url

            check_redis_url(self.redis_url)
        if self.authenticate not in AUTH_MODES:
            raise ConfigError(f"{self.named('authenticate', repr(self.authenticate))} is unknown: use one of "
                              f"{', '.join(AUTH_MODES)}")
        if self.secret is not None:
            _check_secret("LIVEPUSH_SECRET", self.secret)
            if "," in self.secret:
                # A rotation moves it into the fallbacks, which are split at commas.
                raise ConfigError("LIVEPUSH_SECRET has a comma, so it could not be moved into "
                                  "LIVEPUSH_SECRET_FALLBACKS (comma-separated) when you rotate it: generate one "
                                  f"without, e.g. `{MAKE_SECRET}`")
        for i, fallback in enumerate(self.secret_fallbacks):
            _check_secret(f"LIVEPUSH_SECRET_FALLBACKS entry {i + 1}", fallback)
        if self.allowed_origins == ():
            # "," or ", ,": no entry at all, which would refuse every browser, same-origin pages too.
            raise ConfigError("LIVEPUSH_ALLOWED_ORIGINS names no origin: list scheme://host[:port] entries "
                              "separated by commas, or unset it for same-origin only")
        for entry in self.allowed_origins or ():
            if entry != "*" and not _is_origin(entry):
                raise ConfigError(
                    f"LIVEPUSH_ALLOWED_ORIGINS entry {entry[:100]!r} is not an origin: write scheme://host[:port], "
                    "e.g. https://app.example.com (or https://*.example.com for its subdomains, or * for any)"
                )
            if not entry.isascii():
                # A browser's Origin holds a non-ASCII host in its ASCII (xn--) form: this entry
                # would never equal one, and every page of the site would get 403.
                raise ConfigError(
                    f"LIVEPUSH_ALLOWED_ORIGINS entry {entry[:100]!r} is not ASCII, and browsers send a host that "
                    "is not ASCII in its ASCII (xn--) form, which this entry never equals: write the host that "
                    "way, e.g. https://xn--bcher-kva.example.com for https://bücher.example.com"
                )
            if _wildcard_over_a_top_level_domain(entry):
                raise ConfigError(
                    f"LIVEPUSH_ALLOWED_ORIGINS entry {entry[:100]!r} admits every site under a top-level domain: "
                    "name your own domain, e.g. https://*.example.com (or * for any origin, said as such)"
                )
        if not self.host.strip():
            # An empty bind address is every interface: a `--host "$UNSET"` must not publish the
            # server to the network when an empty LIVEPUSH_HOST means the loopback default.
            raise ConfigError(f"{self.named('host')} is empty: give the address to listen on, e.g. 127.0.0.1, "
                              "or 0.0.0.0 for every interface")
        try:
            # What the resolver is handed (socket and uvloop both encode the name so): an empty or
            # over-long label fails there with a UnicodeError, a traceback rather than this line.
            self.host.encode("idna")
        except UnicodeError as exc:
            reason = exc.__cause__ or exc.__context__ or exc
            raise ConfigError(f"{self.named('host', repr(self.host[:100]))} is not a host name ({reason}): give "
                              "an address to listen on, e.g. 127.0.0.1, or 0.0.0.0 for every interface") from None
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"{self.named('port', shown(self.port))} is out of range: use a port from 0 to 65535")
        if not MIN_HISTORY_TTL <= self.history_ttl <= MAX_HISTORY_TTL:
            raise ConfigError(f"LIVEPUSH_HISTORY_TTL={_digits(self.history_ttl)} is out of range: set seconds from "
                              f"{_digits(MIN_HISTORY_TTL)} to {_digits(MAX_HISTORY_TTL)} (a year), e.g. 300")
        if not MIN_SIGNED_TOPIC_TTL <= self.signed_topic_ttl < float("inf"):
            raise ConfigError(f"LIVEPUSH_SIGNED_TOPIC_TTL={_digits(self.signed_topic_ttl)} is out of range: set "
                              f"seconds, {_digits(MIN_SIGNED_TOPIC_TTL)} or more and finite, e.g. 86400")
        if not 0 <= self.drain_seconds <= MAX_DRAIN_SECONDS:
            raise ConfigError(
                f"{self.named('drain_seconds', _digits(self.drain_seconds))} is out of range: use 0 to "
                f"{_digits(MAX_DRAIN_SECONDS)} seconds (0: close every connection at once)"
            )
        if not 0 <= self.worker_stop_margin <= MAX_WORKER_STOP_MARGIN:
            raise ConfigError(f"LIVEPUSH_WORKER_STOP_MARGIN={_digits(self.worker_stop_margin)} is out of range: use 0 "
                              f"to {_digits(MAX_WORKER_STOP_MARGIN)} seconds, e.g. {_digits(DEFAULT_WORKER_STOP_MARGIN)}")
        if self.migrate_lock_timeout is not None and not 0 <= self.migrate_lock_timeout <= MAX_MIGRATE_LOCK_TIMEOUT:
            raise ConfigError(f"{self.named('migrate_lock_timeout', _digits(self.migrate_lock_timeout))} "
                              f"is out of range: use 0 to {_digits(MAX_MIGRATE_LOCK_TIMEOUT)} seconds (0: wait as long "
                              "as it takes)")
        if self.max_connections is not None and self.max_connections < 1:
            raise ConfigError(f"LIVEPUSH_MAX_CONNECTIONS={shown(self.max_connections)} must be at least 1 (or unset: no cap)")
        if self.redis_prefix is not None:
            from .redis.client import check_prefix  # the redis package only where a prefix is set

            check_prefix(self.redis_prefix)


def variable_of(name: str) -> str:
    """The environment variable of setting `name`, for the settings a flag can stand in for."""
    return f"LIVEPUSH_{name.upper()}"


def named_setting(name: str, value: object, flag: str | None, *, given_by_flag: bool) -> str:
    """Settings.named() for setting `name` holding `value` (None: not shown), whose command has
    `flag` for it (None: no such flag); also for a command-line setting outside Settings
    (`--workers`)."""
    if flag is not None and given_by_flag:
        return flag if value is None else f"{flag} {value}"
    variable = variable_of(name)
    said = variable if value is None else f"{variable}={value}"
    return said if flag is None else f"{said} (or {flag})"


def _digits(value: float) -> str:
    """A number in a setting's error line, every digit kept: `:g` keeps six, and a value just past
    its limit read as the limit itself (31622401 and 31622400 both as 3.16224e+07)."""
    return f"{value:.15g}"


def read_number(text: str, kind: type[int] | type[float]) -> Any:
    """`text` as an int or a float, written in plain ASCII; ValueError otherwise. Python's own
    parsers also take "1_000" and digits of other scripts ("٨٠", "１０"): not what an operator
    writes, and a typo would be read as a different number. Every numeric setting and flag is
    read through here; each caller checks its own range."""
    if not isinstance(text, str) or not text.isascii() or "_" in text:
        raise ValueError(f"not a plain number: {shown(text, width=40)}")
    return kind(text)


# What a shell replaces with a command's output or a variable's value. In a secret it means the
# line was copied where nothing runs a shell (a .env file, a systemd unit, a container spec): the
# secret is then the command's text, which anyone who has read these docs knows. A random secret
# (token_urlsafe, openssl rand) never holds one.
_UNEXPANDED = ("$(", "${", "`")


def _check_secret(name: str, value: str) -> None:
    mark = next((m for m in _UNEXPANDED if m in value), None)
    if mark is not None:
        raise ConfigError(
            f"{name} holds {mark!r}: it is the text of a shell command or variable that was never run or expanded "
            "(a .env file, a systemd unit or a container spec runs no shell), a secret anyone could read. Put the "
            f"generated value itself there: run {MAKE_SECRET} and paste its output"
        )
    if len(value) < MIN_SECRET_LENGTH:
        raise ConfigError(f"{name} is {len(value)} characters long: use at least {MIN_SECRET_LENGTH} random "
                          f"characters, e.g. `{MAKE_SECRET}`")
    if len(set(value)) < MIN_SECRET_DISTINCT:
        raise ConfigError(
            f"{name} has only {len(set(value))} distinct characters, which is not a random secret: generate one, e.g. "
            f"`{MAKE_SECRET}`"
        )


def _is_utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_origin(entry: str) -> bool:
    text = entry.replace("://*.", "://", 1)
    if "*" in text:  # only a leading `*.` label is a wildcard: a '*' elsewhere would never match
        return False
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 -- raises ValueError for a bad port
    except ValueError:
        return False
    return (parts.scheme.lower() in _ORIGIN_SCHEMES and bool(parts.hostname) and not parts.path
            and not parts.query and not parts.fragment and parts.username is None and parts.password is None)


def _wildcard_over_a_top_level_domain(entry: str) -> bool:
    """`https://*.com`: a wildcard over a single label. localhost's subdomains are a development
    setup's, not other people's sites."""
    if "://*." not in entry:
        return False
    host = urlsplit(entry.replace("://*.", "://", 1)).hostname or ""
    return "." not in host and host != "localhost"


_current: Settings | None = None


def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first use."""
    global _current
    if _current is None:
        _current = Settings.from_env()
    return _current


def set_settings(settings: Settings | None) -> None:
    """Install settings for this process (the CLI after applying flags; tests). None: re-read env."""
    global _current
    _current = settings
