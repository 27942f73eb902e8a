"""Per-connection limits and quiet logging of client mistakes (docs/reference.md#8-trust-boundaries-and-abuse)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

SUBSCRIBES_PER_SECOND = 100.0
SUBSCRIBE_BURST = 100.0

# The frame budget of a connection (docs/reference.md#8-trust-boundaries-and-abuse): what its
# frames cost, in seconds of a budget that refills at one second a second and holds at most
# FRAME_BUDGET_SECONDS. Past it the server reads nothing more from the connection until
# FRAME_RESUME_SECONDS of budget are back: TCP slows that client alone, and nothing is lost. A
# page sends a few frames a second; these are far above it, and bound what one connection
# takes of the event loop (a 64 KiB frame of many objects takes milliseconds to parse).
FRAMES_PER_SECOND = 200
FRAME_BYTES_PER_SECOND = 512 * 1024
FRAME_SECONDS = 1.0 / FRAMES_PER_SECOND  # each frame, whatever its size
FRAME_BYTE_SECONDS = 1.0 / FRAME_BYTES_PER_SECOND  # and each of its bytes on the wire
FRAME_BUDGET_SECONDS = 2.0  # a burst of 400 frames, or 1 MiB
FRAME_RESUME_SECONDS = 0.25  # read again once 50 frames' worth is back: a few wake-ups a second
FRAME_HEAD_BYTES = 6  # a masked client frame's header, at least: what a parsed frame is charged beside its data


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


class FirstOfEach:
    """Which keys a line is said for once a period: each of the first `limit` distinct keys of a
    period is new the first time it comes in it, and none after. Keys come from clients, so past
    `limit` none is remembered (the memory stays bounded) and `past_limit` is logged once at
    WARNING instead: a client sending a new key each time cannot fill the log either. A new period
    forgets them all, so keys that clients (a scanner) sent in one period take no slot of the next."""

    def __init__(self, logger: logging.Logger, limit: int, past_limit: str, period: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.limit = limit
        self.past_limit = past_limit
        self.period = period
        self._clock = clock
        self._seen: set[str] = set()
        self._full = False
        self._since = clock()

    def new(self, key: str) -> bool:
        """Whether `key` is one of the first `limit` keys of this period, come for the first time."""
        if self._clock() - self._since >= self.period:
            self._seen.clear()
            self._full = False
            self._since = self._clock()
        if key in self._seen:
            return False
        if len(self._seen) >= self.limit:
            if not self._full:
                self._full = True
                self.logger.warning(self.past_limit)
            return False
        self._seen.add(key)
        return True
