"""Checks of the enqueue options key=, debounce= and tags= (docs/jobs.md "Enqueue options"), and
of queue names: a mistake raises at the call, before anything is written."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ...postgres.text import unstorable
from ...errors import ArgumentTypeError, ArgumentValueError, ConfigError
from ...types import as_seconds, shown
from ..errors import InvalidArgumentsError

MAX_KEY_LENGTH = 500  # characters; a key is an index entry, and Postgres refuses btree entries past ~2,700 bytes
MAX_TAGS = 20  # tags per job: they are for finding jobs again, not for data
MAX_TAG_LENGTH = 200  # characters per tag
MAX_QUEUE_LENGTH = 200  # characters; a queue name is an index entry too
MAX_NAME_LENGTH = 500  # characters of a job name; module.qualname fits with room to spare
MAX_DEBOUNCE = 366 * 86400.0  # seconds; a debounce is a short quiet period, and Postgres' intervals end somewhere


def check_key(key: Any) -> str | None:
    """`key` as an idempotency key: a non-empty str of at most MAX_KEY_LENGTH characters, or None."""
    if key is None:
        return None
    if not isinstance(key, str) or not key:
        raise InvalidArgumentsError(f"key= takes a non-empty str, got {shown(key, typed=True, width=60)}")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidArgumentsError(f"key= is {len(key)} characters long, more than {MAX_KEY_LENGTH}: "
                                    "use a shorter key (e.g. a hash of what identifies the work)")
    bad = unstorable(key)
    if bad:
        raise InvalidArgumentsError(f"key= contains {bad}, which Postgres cannot store")
    return key


def check_queue(queue: Any, where: str) -> str:
    """A queue name: a non-empty str of at most MAX_QUEUE_LENGTH characters Postgres can store,
    which `livepush jobs --queues` can name: that list is split at commas and each name stripped,
    so a name with a comma or a space at either end would be served by no runtime given it."""
    if (not isinstance(queue, str) or not queue or len(queue) > MAX_QUEUE_LENGTH or unstorable(queue)
            or "," in queue or queue != queue.strip()):
        raise ConfigError(f"{where}: a queue is a non-empty string of at most {MAX_QUEUE_LENGTH} characters "
                          f"Postgres can store (no NUL, no lone surrogate), with no comma and no space at "
                          f"either end (`livepush jobs --queues` could not name it), got {shown(queue, width=80)}")
    return queue


def check_name(name: Any, where: str) -> str:
    """A job name: a non-empty str of at most MAX_NAME_LENGTH characters Postgres can store. Runtimes
    find a job's function by the name stored, so it must be the very str the registry holds."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH or unstorable(name):
        raise ConfigError(f"{where}: a job name is a non-empty string of at most {MAX_NAME_LENGTH} characters "
                          f"Postgres can store (no NUL, no lone surrogate), got {shown(name, width=80)}")
    return name


def check_tags(tags: Any) -> list[str] | None:
    """`tags` as a list of at most MAX_TAGS distinct non-empty strs (order kept), or None for none."""
    if tags is None:
        return None
    if isinstance(tags, (str, bytes)) or not isinstance(tags, Sequence):
        raise InvalidArgumentsError(f"tags= takes a list of str, got {shown(tags, typed=True, width=60)}"
                                    + (" (wrap a single tag in a list)" if isinstance(tags, str) else ""))
    out: list[str] = []
    for i, tag in enumerate(tags):
        _check_one_tag(tag, f"tags[{i}]")
        if tag not in out:
            # The limit is on distinct tags, what is stored: a tag repeated is stored once.
            if len(out) == MAX_TAGS:
                raise InvalidArgumentsError(f"tags= has more than {MAX_TAGS} distinct tags: tags[{i}] {shown(tag, width=60)} "
                                            f"is number {MAX_TAGS + 1}")
            out.append(tag)
    return out or None


def _check_one_tag(tag: Any, label: str) -> str:
    """`tag` if it is a tag; else InvalidArgumentsError naming it as `label`."""
    if not isinstance(tag, str) or not tag:
        raise InvalidArgumentsError(f"{label} is {shown(tag, typed=True, width=60)}: a tag is a non-empty str")
    if len(tag) > MAX_TAG_LENGTH:
        raise InvalidArgumentsError(f"{label} is {len(tag)} characters long, more than {MAX_TAG_LENGTH}")
    bad = unstorable(tag)
    if bad:
        raise InvalidArgumentsError(f"{label} contains {bad}, which Postgres cannot store")
    return tag


def check_tag(tag: Any) -> str:
    """One tag to look jobs up by (list_tagged, cancel_tagged): named `tag` in errors, since the
    caller gave one, not a list."""
    return _check_one_tag(tag, "tag")


def check_debounce(debounce: Any, key: str | None, wait: Any, at: datetime | None) -> float | None:
    """`debounce` in seconds (zero or more, finite), or None; it needs a key and excludes wait=/at=
    (it is the run time)."""
    debounce = as_seconds(debounce)
    if debounce is None:
        return None
    if key is None:
        raise ArgumentValueError("debounce= needs key=: the key names the pending job a later enqueue replaces")
    if wait is not None or at is not None:
        raise ArgumentValueError("debounce= sets the run time (now + debounce): give it without wait= or at=")
    if isinstance(debounce, bool) or not isinstance(debounce, (int, float)):
        raise ArgumentTypeError(f"debounce= takes a number of seconds or a timedelta, got {shown(debounce, typed=True, width=60)}")
    if not debounce >= 0 or debounce == math.inf:  # `not >=` also catches NaN
        raise ArgumentValueError(f"debounce= must be zero or more seconds, a finite number, got {shown(debounce)}")
    if debounce > MAX_DEBOUNCE:
        # The value after "got": a long int's words read oddly where a count of seconds stands.
        raise ArgumentValueError(f"debounce= is more than a year: pass a shorter delay, got {shown(debounce)}")
    return float(debounce)
