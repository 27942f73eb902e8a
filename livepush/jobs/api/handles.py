"""What enqueue and a workflow's start() return (JobHandle, WorkflowHandle), the checks of ids and
cursors a user passes in, and how a read with a cursor cuts its page."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, cast

from ...api import sign_topic
from ...config import get_settings
from ...postgres.text import BIGINT_MAX
from ...errors import ArgumentTypeError
from ...topics import PAGE_TTL_DEFAULT, check_ttl
from ...types import Seconds, shown


def signed_for_page(topic: str, ttl: Seconds | None = None, *, call: str = "sign()") -> str:
    """`topic` signed for a page, expiring after `ttl` seconds or a timedelta (default
    LIVEPUSH_SIGNED_TOPIC_TTL): a handle's signed topic is a capability handed to a browser, and
    must not be one for ever. A bad `ttl` is refused naming `call`, the user's call that took it."""
    if ttl is None:
        return sign_topic(topic, ttl=get_settings().signed_topic_ttl)
    return sign_topic(topic, ttl=check_ttl(ttl, none_means=PAGE_TTL_DEFAULT, call=call))


class StateTopicHandle:
    """What every handle of a row with a state topic has: `topic` (`<_kind>:<id>`) and
    `signed_topic`, signed when read (it expires LIVEPUSH_SIGNED_TOPIC_TTL after that read; use
    `sign(ttl=...)` for another lifetime), so creating a handle works without LIVEPUSH_SECRET;
    reading it without one raises ConfigError.

    Handles are slotted dataclasses: enqueue_many makes one per job, and an object without a
    `__dict__` is cheaper to make and to collect. The signed topic is kept in its own slot."""

    __slots__ = ("_signed",)
    id: int
    _kind: str = ""  # the topic's prefix, set by each handle class

    @property
    def topic(self) -> str:
        try:
            return f"{self._kind}:{self.id}"
        except ValueError:
            # An id of over 4,300 digits, which Python refuses to write: its size stands in, a
            # topic that sign() refuses (InvalidTopic) as it refuses any id that names no row.
            return f"{self._kind}:{shown(self.id)}"

    @property
    def signed_topic(self) -> str:
        # Cached with its expiry (whole seconds, as signed): a read a second or more later signs
        # again, so a handle kept for longer than the TTL never hands a page an expired topic.
        expires = int(time.time() + get_settings().signed_topic_ttl)
        cached: tuple[int, str] | None = getattr(self, "_signed", None)
        if cached is not None and cached[0] == expires:
            return cached[1]
        signed = signed_for_page(self.topic)
        object.__setattr__(self, "_signed", (expires, signed))  # a cache, not a field: the handles are frozen
        return signed

    def sign(self, ttl: Seconds | None = None) -> str:
        """The topic signed for a page, valid for `ttl` seconds or a timedelta."""
        return signed_for_page(self.topic, ttl, call=f"{type(self).__name__}.sign()")


@dataclasses.dataclass(frozen=True, slots=True)
class JobHandle(StateTopicHandle):
    """An enqueued job: its id, its function's name, and its state topic `job:<id>`."""

    id: int
    name: str = ""
    _kind = "job"


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowHandle(StateTopicHandle):
    """A workflow run: its id and its state topic `workflow:<id>`. Here, not beside the runner that
    makes it, so that a Workflow's start() can name what it returns without importing the runner."""

    id: int
    name: str = ""
    _kind = "workflow"


# Ids are Postgres bigints, from 1 up. An int outside that range names nothing; it becomes
# NO_SUCH_ID, so every call answers as for an unknown job or group (False, None, GroupNotFound)
# instead of failing in Postgres with "out of range".
NO_SUCH_ID = 0


def checked_id(value: object, what: str) -> int:
    """`value` as a job or group id; TypeError naming `what` unless it is an int."""
    if isinstance(value, bool) or not isinstance(value, int):
        hint = " (pass its .id)" if hasattr(value, "id") else ""
        raise ArgumentTypeError(f"{what} must be an int{hint}, got {shown(value, typed=True, width=60)}")
    return value if 0 < value <= BIGINT_MAX else NO_SUCH_ID


def checked_cursor(value: object, what: str) -> int:
    """A page cursor (an id to page after or before): an int (TypeError naming `what` otherwise),
    clamped to the bigint range. Not checked_id, which reads an out-of-range int as NO_SUCH_ID: a
    cursor past the last id would then page from the first, or before it find nothing."""
    checked_id(value, what)
    return min(max(cast(int, value), 0), BIGINT_MAX)  # checked_id() raised unless it is an int


def page_of(rows: list[dict[str, Any]], limit: int, key: str) -> tuple[list[dict[str, Any]], int | None]:
    """A page from rows read with LIMIT limit + 1: the first `limit` rows, and the cursor of the
    next page (the last row's `key`), None when the extra row shows there is no next page."""
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (rows[-1][key] if more else None)
