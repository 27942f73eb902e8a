"""JobHandle: what enqueue returns."""

from __future__ import annotations

import dataclasses
import functools


@dataclasses.dataclass(frozen=True)
class JobHandle:
    """An enqueued job: its id and the state topic a page subscribes to.

    `signed_topic` is computed on first access with `livepush.sign_topic` (no expiry), so
    enqueue works without LIVEPUSH_SECRET; reading it without one raises ConfigError.
    """

    id: int
    name: str = ""

    @property
    def topic(self) -> str:
        return f"job:{self.id}"

    @functools.cached_property
    def signed_topic(self) -> str:
        from ...api import sign_topic

        return sign_topic(self.topic)


# Ids are Postgres bigints, from 1 up. An int outside that range names nothing; it becomes
# NO_SUCH_ID, so every call answers as for an unknown job or group (False, None,
# GroupNotFound) instead of failing in Postgres with "out of range".
NO_SUCH_ID = 0
_BIGINT_MAX = 2**63 - 1


def checked_id(value: object, what: str) -> int:
    """`value` as a job or group id; TypeError naming `what` unless it is an int."""
    if isinstance(value, bool) or not isinstance(value, int):
        hint = " (pass its .id)" if hasattr(value, "id") else ""
        raise TypeError(f"{what} must be an int{hint}, got {type(value).__name__} {value!r:.60}")
    return value if 0 < value <= _BIGINT_MAX else NO_SUCH_ID
