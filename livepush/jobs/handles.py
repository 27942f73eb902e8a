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
        from ..api import sign_topic

        return sign_topic(self.topic)
