"""Every error livepush raises on purpose.

    LivepushError
    ├── ConfigError            a setting is missing or wrong (CLI: exit 2)
    │   ├── LoginRefused       Postgres or Redis is up and refused the URL's login (also a DependencyError)
    │   │   └── ListenLoginRefused  the same, met by listen() (also a ListenError)
    │   └── AclRefused         Redis is up and its ACL refused a command, key or channel (a DependencyError too)
    │       └── ListenAclRefused    the same, met by listen() (also a ListenError)
    ├── DependencyError        Postgres or Redis cannot be reached (CLI: exit 1)
    │   ├── ListenError        listen() could not subscribe
    │   └── SchemaBusyError    a lock held past a read's or migrate's lock timeout (CLI: exit 75)
    ├── SchemaError            the database schema is older than this code needs
    ├── NotListeningError      a receiver registered before listen()
    ├── ArgumentValueError (ValueError)  a call's argument has a value livepush refuses
    ├── ArgumentTypeError (TypeError)    a call's argument has a type livepush refuses
    │   └── jobs.InvalidArgumentsError   a job's arguments are not plain JSON
    ├── InvalidTopic (ValueError)    a topic or signed topic is malformed, forged or expired
    ├── InvalidSession (ValueError)  a session token is malformed, forged or expired
    └── PayloadTooLarge (ValueError) publish() data over 1 MiB of JSON

Foreign errors (psycopg, redis, websockets) are translated at the seam where they occur
(`raise X from exc`), so callers only ever catch ours. Messages say what to do next.
"""

from __future__ import annotations


class LivepushError(Exception):
    """Base class of every error livepush raises on purpose."""


class ConfigError(LivepushError):
    """A setting is missing or has a bad value. The message names the setting and the fix."""


class DependencyError(LivepushError):
    """Postgres or Redis could not be reached or failed."""


class ListenError(DependencyError):
    """`FanOut.listen()` could not put its subscription in effect."""


class LoginRefused(ConfigError, DependencyError):
    """Postgres or Redis is up and refused the login its URL gives: a wrong password, none where
    one is needed, a role or database that does not exist, no pg_hba.conf line for it. A setting
    to correct, so the CLI exits 2 (a process manager restarting it would be refused forever); a
    DependencyError too, so code that retries a lost connection goes on retrying when a password
    changed under a running process, until the server or the setting is put right."""


class ListenLoginRefused(LoginRefused, ListenError):
    """LoginRefused, met by `listen()` as it starts: a ListenError, as everything listen() raises."""


class AclRefused(ConfigError, DependencyError):
    """Redis is up, took the login, and its ACL refused the URL's user a command, key or channel
    livepush needs (a rule left out of the ACL line docs/security.md shows, or the prefix written
    without its braces). `rule` is the rule of that line the user lacks (`+publish`, `&{P}:*`),
    None when Redis' refusal does not tell. As Postgres' refused privilege, a setting to correct,
    which no reconnect heals (the CLI's exit 2); a DependencyError too, so code that retries a
    failing Redis goes on retrying until the ACL is put right."""

    def __init__(self, message: str, rule: str | None = None) -> None:
        super().__init__(message)
        self.rule = rule


class ListenAclRefused(AclRefused, ListenError):
    """AclRefused, met by `listen()`: a ListenError, as everything listen() raises."""


class SchemaBusyError(DependencyError):
    """Postgres is up, but a schema change (a `livepush migrate` under way, or another DDL) held a
    lock on livepush's tables past the lock timeout of a read that must not wait for it
    (`jobs.status()`, `livepush status`): try again once it has finished. Also a transaction that
    held a table's lock past the lock timeout of `livepush migrate`'s statements, which then
    migrated nothing (or was in a deadlock with it on every try): the message names the sessions
    that held it."""


class SchemaError(LivepushError):
    """The database schema is older than this code needs: run `livepush migrate`."""


class NotListeningError(LivepushError):
    """A receiver was registered on a fan-out before `await fanout.listen()`."""


class ArgumentValueError(LivepushError, ValueError):
    """A livepush call got an argument whose value it refuses (a negative delay, a limit out of
    range, an empty name). Raised at the call, before anything is written; the message names the
    call and the argument and says what it takes. A ValueError, so `except ValueError` holds."""


class ArgumentTypeError(LivepushError, TypeError):
    """A livepush call got an argument of a type it does not take (a str where seconds go, data
    that is not JSON, a sync connection to an async call). Raised at the call, before anything is
    written; the message names the argument and what it takes. A TypeError, so `except TypeError`
    holds."""


class InvalidTopic(LivepushError, ValueError):
    """A topic is malformed, or a signed topic is forged or expired.

    `reason` is the wire reason a server sends in `refused`:
    ``invalid_topic``, ``invalid_signature`` or ``expired``.
    """

    def __init__(self, message: str, reason: str = "invalid_topic") -> None:
        super().__init__(message)
        self.reason = reason


class InvalidSession(LivepushError, ValueError):
    """A session token is malformed, signed with an unknown secret, or expired.

    `reason` is ``malformed``, ``bad_signature`` or ``expired``. The message never
    contains the token: tokens are credentials and must not reach logs.
    """

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason


class PayloadTooLarge(LivepushError, ValueError):
    """publish() data encodes to more than 1 MiB of JSON."""


def first_line(exc: BaseException) -> str:
    """An exception's first line for a one-line log or error message (its type if it says nothing)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = [
    "AclRefused",
    "ArgumentTypeError",
    "ArgumentValueError",
    "ConfigError",
    "DependencyError",
    "InvalidSession",
    "InvalidTopic",
    "ListenAclRefused",
    "ListenError",
    "ListenLoginRefused",
    "LivepushError",
    "LoginRefused",
    "NotListeningError",
    "PayloadTooLarge",
    "SchemaBusyError",
    "SchemaError",
]
