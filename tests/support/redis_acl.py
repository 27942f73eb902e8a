"""Redis users made from the very `ACL SETUSER` line docs/security.md shows a deployment, so the
tests prove that line: what it allows the app works, and it reaches no other deployment."""

from __future__ import annotations

import contextlib
import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis

SECURITY_DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
DOCUMENTED_PREFIX = "livepush:12"  # the prefix the documented line is written for


def documented_acl_rules(prefix: str, password: str) -> list[str]:
    """The rules of the `ACL SETUSER` line docs/security.md shows, for `prefix` and `password`."""
    (line,) = [line for line in SECURITY_DOC.read_text(encoding="utf-8").splitlines()
               if line.startswith("ACL SETUSER ")]
    rules = shlex.split(line.replace(DOCUMENTED_PREFIX, prefix))[3:]  # after ACL SETUSER <name>
    return [f">{password}" if rule.startswith(">") else rule for rule in rules]


@contextlib.contextmanager
def documented_user(redis_url: str, prefix: str, *, without: str | None = None) -> Iterator[str]:
    """`redis_url` as a new user with the documented ACL for `prefix` (less the rule `without`,
    as an operator who left one out would have it); the user is deleted after."""
    admin = redis.Redis.from_url(redis_url)
    name, password = f"app_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    rules = documented_acl_rules(prefix, password)
    assert without is None or without in rules, f"{without} is not in the documented ACL line"
    admin.execute_command("ACL", "SETUSER", name, "reset", *[rule for rule in rules if rule != without])
    try:
        parts = urlsplit(redis_url)
        yield urlunsplit(parts._replace(netloc=f"{name}:{password}@{parts.netloc}"))
    finally:
        admin.execute_command("ACL", "DELUSER", name)
        admin.close()
