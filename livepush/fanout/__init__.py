"""Fan-outs: how a published message reaches every server (see `base.FanOut`)."""

from __future__ import annotations

from ..config import Settings, get_settings
from .base import MAX_PAYLOAD_BYTES, FanOut, encode_payload


def from_settings(settings: Settings) -> FanOut:
    if settings.fanout == "postgres":
        from .postgres import PostgresFanOut

        return PostgresFanOut(settings.require_database(), history_ttl=settings.history_ttl)
    if settings.fanout == "redis":
        from .redis import RedisFanOut

        assert settings.redis_url is not None  # Settings validation guarantees it
        return RedisFanOut(settings.redis_url, history_ttl=settings.history_ttl)
    from .local import LocalFanOut

    return LocalFanOut(history_ttl=settings.history_ttl)


def from_env() -> FanOut:
    """A new fan-out as configured by the environment (SPEC §2). It does not listen yet."""
    return from_settings(get_settings())


__all__ = ["MAX_PAYLOAD_BYTES", "FanOut", "encode_payload", "from_env", "from_settings"]
