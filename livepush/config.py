"""Settings from the environment (SPEC §2); a CLI flag of the same meaning overrides.

`Settings.from_env()` validates everything up front so a command fails at once, with
one line naming the setting and the fix, instead of later with a traceback.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError

FANOUTS = ("postgres", "redis", "local")
AUTH_MODES = ("required", "optional", "off")
MIN_SECRET_LENGTH = 32


@dataclasses.dataclass(frozen=True)
class Settings:
    database_url: str | None = None
    redis_url: str | None = None
    fanout: str = "local"
    secret: str | None = None
    secret_fallbacks: tuple[str, ...] = ()
    authenticate: str = "optional"
    allowed_origins: tuple[str, ...] | None = None  # None: same-origin only
    host: str = "127.0.0.1"
    port: int = 8765
    history_ttl: float = 300.0
    env: str | None = None

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
                f"{MIN_SECRET_LENGTH} characters (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(48))'`)"
            )
        return self.secret

    def require_database(self) -> str:
        if not self.database_url:
            raise ConfigError(
                "LIVEPUSH_DATABASE_URL is not set: set it (or DATABASE_URL) to a Postgres URL "
                "such as postgresql://user@localhost/app"
            )
        return self.database_url

    def replace(self, **changes: Any) -> Settings:
        """A copy with CLI overrides applied (None means "not given") and re-validated."""
        given = {k: v for k, v in changes.items() if v is not None}
        new = dataclasses.replace(self, **given)
        new._validate()
        return new

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(name)
            return value.strip() if value and value.strip() else None

        database_url = get("LIVEPUSH_DATABASE_URL") or get("DATABASE_URL")
        redis_url = get("LIVEPUSH_REDIS_URL")
        fanout = (get("LIVEPUSH_FANOUT") or ("postgres" if database_url else "local")).lower()
        port_text = get("LIVEPUSH_PORT") or "8765"
        try:
            port = int(port_text)
        except ValueError:
            raise ConfigError(f"LIVEPUSH_PORT={port_text!r} is not a number: set a port from 0 to 65535") from None
        ttl_text = get("LIVEPUSH_HISTORY_TTL") or "300"
        try:
            ttl = float(ttl_text)
        except ValueError:
            raise ConfigError(f"LIVEPUSH_HISTORY_TTL={ttl_text!r} is not a number: set seconds, e.g. 300") from None
        origins = get("LIVEPUSH_ALLOWED_ORIGINS")
        settings = cls(
            database_url=database_url,
            redis_url=redis_url,
            fanout=fanout,
            secret=get("LIVEPUSH_SECRET"),
            secret_fallbacks=tuple(s.strip() for s in (get("LIVEPUSH_SECRET_FALLBACKS") or "").split(",") if s.strip()),
            authenticate=(get("LIVEPUSH_AUTHENTICATE") or "optional").lower(),
            allowed_origins=tuple(o.strip().rstrip("/") for o in origins.split(",") if o.strip()) if origins else None,
            host=get("LIVEPUSH_HOST") or "127.0.0.1",
            port=port,
            history_ttl=ttl,
            env=get("LIVEPUSH_ENV"),
        )
        settings._validate()
        return settings

    def _validate(self) -> None:
        if self.fanout not in FANOUTS:
            raise ConfigError(f"LIVEPUSH_FANOUT={self.fanout!r} is unknown: use one of {', '.join(FANOUTS)}")
        if self.fanout == "postgres" and not self.database_url:
            raise ConfigError("LIVEPUSH_FANOUT=postgres needs LIVEPUSH_DATABASE_URL (or DATABASE_URL): set it to a Postgres URL")
        if self.fanout == "redis" and not self.redis_url:
            raise ConfigError("LIVEPUSH_FANOUT=redis needs LIVEPUSH_REDIS_URL: set it to a URL such as redis://localhost:6379/0")
        if self.authenticate not in AUTH_MODES:
            raise ConfigError(f"LIVEPUSH_AUTHENTICATE={self.authenticate!r} is unknown: use one of {', '.join(AUTH_MODES)}")
        if self.secret is not None and len(self.secret) < MIN_SECRET_LENGTH:
            raise ConfigError(
                f"LIVEPUSH_SECRET is {len(self.secret)} characters long: use at least {MIN_SECRET_LENGTH} random characters"
            )
        for i, fallback in enumerate(self.secret_fallbacks):
            if len(fallback) < MIN_SECRET_LENGTH:
                raise ConfigError(
                    f"LIVEPUSH_SECRET_FALLBACKS entry {i + 1} is shorter than {MIN_SECRET_LENGTH} characters: remove or fix it"
                )
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"LIVEPUSH_PORT={self.port} is out of range: use a port from 0 to 65535")
        if self.history_ttl <= 0:
            raise ConfigError(f"LIVEPUSH_HISTORY_TTL={self.history_ttl} must be positive: set seconds, e.g. 300")


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
