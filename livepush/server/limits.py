"""Per-connection limits and quiet logging of client mistakes (docs/reference.md#8-trust-boundaries-and-abuse)."""

from __future__ import annotations

import logging
import time
from typing import Any

SUBSCRIBES_PER_SECOND = 100.0
SUBSCRIBE_BURST = 100.0


class TokenBucket:
    """`rate` takes a second, up to `burst` saved; `take()` says whether one is there."""

    __slots__ = ("rate", "burst", "tokens", "at")

    def __init__(self, rate: float = SUBSCRIBES_PER_SECOND, burst: float = SUBSCRIBE_BURST) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.at = 0.0

    def take(self, now: float) -> bool:
        if self.at:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class Quiet:
    """Log lines that clients can cause (their mistakes, their retries of what failed), at most
    `per_minute` a minute per message: anyone can send requests, and the log must not be theirs
    to fill."""

    def __init__(self, logger: logging.Logger, per_minute: int = 10) -> None:
        self.logger = logger
        self.per_minute = per_minute
        self._counts: dict[str, tuple[float, int]] = {}

    def debug(self, message: str, *args: Any) -> None:
        self._log(logging.DEBUG, message, *args)

    def warning(self, message: str, *args: Any) -> None:
        self._log(logging.WARNING, message, *args)

    def _log(self, level: int, message: str, *args: Any) -> None:
        if not self.logger.isEnabledFor(level):
            return
        now = time.monotonic()
        start, count = self._counts.get(message, (now, 0))
        if now - start >= 60.0:
            start, count = now, 0
        if count < self.per_minute:
            self.logger.log(level, message, *args)
        self._counts[message] = (start, count + 1)
        if len(self._counts) > 1000:
            self._counts.clear()
