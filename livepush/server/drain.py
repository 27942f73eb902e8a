"""Paced drain on SIGTERM (`livepush serve --drain-seconds S`, docs/reference.md#3-commands).

Closing every connection at once sends every page back at once: the next server gets the
whole herd in one burst. A drain closes them in batches spread over S seconds instead, each
with 1001 and a reason `retry=MS` that tells the client how long to wait before it comes back,
drawn so that the reconnects are spread too. `batch_count()`, `batch_size()`, `schedule()` and
`retry_ms()` are the whole policy, as pure functions; `close_paced()` only follows them, round
by round.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass

from websockets.frames import CloseCode
from websockets.http11 import Response

from . import http
from .connection import Connection

BATCH_EVERY_SECONDS = 0.1
# The client's reconnect window after a drain of S seconds is [RETRY_MIN_MS, 1000 × max(S, 1)]:
# never zero (a retry that arrives while this server still drains is refused), and at most the
# client's own cap when S is at its maximum (config.MAX_DRAIN_SECONDS).
RETRY_MIN_MS = 500
RETRY_PREFIX = "retry="


@dataclass(frozen=True)
class Batch:
    """`size` connections to close `at` seconds after the drain began."""

    at: float
    size: int


def batch_count(count: int, seconds: float, every: float = BATCH_EVERY_SECONDS) -> int:
    """How many batches close `count` (> 0) connections over `seconds`: one every `every` s, or
    one per connection when there are fewer; a single one when there is no time."""
    if seconds <= 0:
        return 1
    # The epsilon keeps 0.3 / 0.1 (2.9999…) at 3 batches, not 4.
    return max(1, min(count, math.ceil(seconds / every - 1e-9)))


def batch_size(count: int, batches: int, i: int = 0) -> int:
    """The size of batch `i` of `batches` closing `count` connections: sizes differ by at most
    one, the larger first."""
    base, extra = divmod(count, batches)
    return base + (1 if i < extra else 0)


def schedule(count: int, seconds: float, every: float = BATCH_EVERY_SECONDS) -> list[Batch]:
    """Batches closing `count` connections over `seconds`: one every `every` s (or one per
    connection when there are fewer), the first at once, sizes differing by at most one."""
    if count <= 0:
        return []
    batches = batch_count(count, seconds, every)
    return [Batch(i * max(seconds, 0.0) / batches, batch_size(count, batches, i)) for i in range(batches)]


def retry_ms(seconds: float, draw: Callable[[], float] = random.random) -> int:
    """A reconnect delay in ms, uniform from RETRY_MIN_MS to 1000 × max(seconds, 1)."""
    high = 1000 * max(seconds, 1.0)
    return int(RETRY_MIN_MS + (high - RETRY_MIN_MS) * draw())


def reason(ms: int) -> str:
    """The close reason that carries a reconnect delay (the JS client parses it)."""
    return f"{RETRY_PREFIX}{ms}"


def refusal(seconds_left: float) -> Response:
    """What a WebSocket upgrade gets while this server drains: go elsewhere, or come back once the
    drain is over, `seconds_left` from now (rounded up, at least 1 s). The whole drain's length,
    told late in the drain, sent the client back long after the next server was up."""
    return http.response(503, b"this server is shutting down: retry shortly\n",
                         Retry_After=str(max(1, math.ceil(seconds_left))))


async def close_paced(
    clients: Callable[[], Collection[Connection]], seconds: float, draw: Callable[[], float] = random.random
) -> int:
    """Close every client with 1001 and a `retry=MS` reason, batch by batch as schedule() says;
    return how many closes were started. `clients` is asked again at the end, for a handshake
    that was already past the door when the drain began."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    pending = [c for c in clients() if not c.closing]
    closed = 0
    while closed < len(pending):
        # schedule() drawn again each round (its first batch, and when the second is due) from
        # what is left and the time left: a round that comes late (a loop busy for a while)
        # spreads the rest over the remaining time, rather than closing every batch it missed at
        # once, the herd the drain is there to prevent.
        left, remaining = len(pending) - closed, max(end - loop.time(), 0.0)
        batches = batch_count(left, remaining)
        size = batch_size(left, batches)
        for client in pending[closed:closed + size]:
            client.close(CloseCode.GOING_AWAY, reason(retry_ms(seconds, draw)))
        closed += size
        if batches > 1:
            await asyncio.sleep(remaining / batches)
    late = [c for c in clients() if not c.closing]
    for client in late:
        client.close(CloseCode.GOING_AWAY, reason(retry_ms(seconds, draw)))
    return closed + len(late)
