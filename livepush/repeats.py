"""Warnings of something that may happen again and again, said at most once a minute each: the
failures of a runtime's background loops (claims, beats, promotions, housekeeping), the Redis
subscriptions that Redis closes while it stays up.

Each loop tries again within a second or a beat. While the database refuses every attempt (a
failover's standby that takes no writes, a role whose grants changed), each attempt failed at
once and was a line: hundreds a minute per runtime, in which the line that mattered was lost.
The first one is said at once; the next one of its kind a minute later at the earliest, with
how many were not said meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

EVERY_SECONDS = 60.0


class Repeats:
    """`warning(message, *args)`: logged unless the same message (its format, not its values) was
    logged less than `every` seconds ago; counted then, and the count said with the next one.
    `shown` turns each argument into what the line shows (a runtime's: a refused grant as the
    command that grants it), only for the lines logged."""

    def __init__(self, logger: logging.Logger, every: float = EVERY_SECONDS,
                 clock: Callable[[], float] = time.monotonic, shown: Callable[[Any], Any] | None = None) -> None:
        self.logger = logger
        self.every = every
        self.clock = clock
        self.shown = shown
        self._said: dict[str, tuple[float, int]] = {}  # message format -> (said at, not said since)

    def warning(self, message: str, *args: Any) -> None:
        now = self.clock()
        said_at, unsaid = self._said.get(message, (None, 0))
        if said_at is not None and now - said_at < self.every:
            self._said[message] = (said_at, unsaid + 1)
            return
        self._said[message] = (now, 0)
        if self.shown is not None:
            args = tuple(map(self.shown, args))
        if unsaid:
            self.logger.warning(message + " (%d more like it in the last %s, said at most once a minute)",
                                *args, unsaid, _ago(now - said_at))  # type: ignore[operator]
        else:
            self.logger.warning(message, *args)


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
