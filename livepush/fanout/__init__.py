"""Fan-outs: how a published message reaches every server (see `base.FanOut`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import Settings
from .base import HISTORY_PAGE, HISTORY_PAGE_BYTES, MAX_PAYLOAD_BYTES, FanOut, History, encode_payload

if TYPE_CHECKING:
    from ..postgres.listener import Listener
    from ..redis.subscriber import Subscriber


def from_env(settings: Settings | None = None, *, listener: Listener | None = None,
             subscriber: Subscriber | None = None) -> FanOut:
    """A new fan-out as configured (by `settings`, else by the environment). It does not listen
    yet. `listener` / `subscriber`: the process's shared Postgres or Redis listener, if any."""
    if settings is None:
        settings = Settings.from_env()
    if settings.fanout == "postgres":
        from .postgres import PostgresFanOut

        return PostgresFanOut(settings.require_database(), history_ttl=settings.history_ttl, listener=listener)
    if settings.fanout == "redis":
        from .redis import RedisFanOut

        assert settings.redis_url is not None  # Settings validation guarantees it
        return RedisFanOut(settings.redis_url, history_ttl=settings.history_ttl, prefix=settings.redis_prefix,
                           subscriber=subscriber)
    from .local import LocalFanOut

    return LocalFanOut(history_ttl=settings.history_ttl)


__all__ = ["HISTORY_PAGE", "HISTORY_PAGE_BYTES", "MAX_PAYLOAD_BYTES", "FanOut", "History", "encode_payload", "from_env"]
