"""One slow client never raises the others' latency (docs/reference.md §8, slow clients).

A `livepush serve` process on the Redis fan-out; 1,000 subscribers (raw sockets in two child
processes, bench/_clients.py) measure publish-to-deliver latency on one topic, in phases run in
turn on the same server: without, then with, one client subscribed to the same topic that never
reads after its handshake (its socket buffers are filled first, so every frame for it waits in
its backlog during the phase). This is bench/slow_client_bench.py's measurement, asserted: the
others' p99 with the slow client stays within a generous bound of the p99 without it, the slow
client's backlog passed a topic's bound (the rest of that topic waits in history for it) rather
than growing, and the server's memory stays flat. Each condition runs twice and the better run of each is compared,
so that a burst of load from elsewhere on the machine does not decide the outcome.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from livepush import topics
from livepush.config import Settings
from livepush.fanout import from_env
from tests.support.procs import Processes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import slow_client_bench as bench  # noqa: E402
from _clients import ClientPool, raise_fd_limit  # noqa: E402

SUBSCRIBERS = 1000
RATE, SECONDS, WARMUP = 20.0, 2.0, 1.0  # 20,000 deliveries a second
# The slow client's p99 may be at most this many times the other's, plus this many ms.
P99_FACTOR, P99_SLACK_MS = 2.0, 25.0
MAX_RSS_GROWTH_MIB = 32.0  # the slow client's backlog is bounded at 2 MiB; the rest is allocator noise


async def test_one_client_that_never_reads_does_not_raise_the_others_p99(
        procs: Processes, livepush_env: Callable[..., dict[str, str]], redis_url: str, secret: str) -> None:
    """1,000 subscribers' p99 publish-to-deliver latency with a client that never reads on the same topic stays within 2x + 25 ms of the p99 without it (the better of two runs each, in turn on one server); the slow client's share of a topic passes its bound (the rest waits in history), the server's memory stays flat, no subscriber is closed."""
    raise_fd_limit()
    child = await procs.alivepush("serve", env=livepush_env(redis_url=redis_url, fanout="redis"))
    assert child.port is not None
    fanout = from_env(Settings(secret=secret, fanout="redis", redis_url=redis_url))
    pool = ClientPool(processes=2)
    try:
        await pool.start()
        pairs, passed = await bench.run_rounds(
            pool, child.port, child.pid, fanout.apublish, lambda t: topics.sign(t, [secret]), rounds=2,
            subscribers=SUBSCRIBERS, rate=RATE, seconds=SECONDS, warmup=WARMUP)
    finally:
        await pool.close()
        await fanout.aclose()
    alone = min(p[0].p99_ms for p in pairs)
    slow = min(p[1].p99_ms for p in pairs)
    growth = max(p[1].rss_mib for p in pairs) - min(p[0].rss_mib for p in pairs)
    print(f"{SUBSCRIBERS} subscribers at {RATE:g} msg/s: p99 {alone:.2f} ms alone, {slow:.2f} ms beside a client "
          f"that never reads (better of {len(pairs)} each); p50 {min(p[0].p50_ms for p in pairs):.2f} / "
          f"{min(p[1].p50_ms for p in pairs):.2f} ms; server CPU per delivery {min(p[0].cpu_us for p in pairs):.1f} / "
          f"{min(p[1].cpu_us for p in pairs):.1f} us; server RSS grew {growth:.1f} MiB; a share passed its bound "
          f"in {passed} of {len(pairs)} runs")
    assert all(not p.closed for pair in pairs for p in pair), pairs
    assert all(p.samples == SUBSCRIBERS * int(SECONDS * RATE) for pair in pairs for p in pair), pairs
    assert passed == len(pairs), "the slow client's backlog never passed a topic's bound"
    assert slow <= P99_FACTOR * alone + P99_SLACK_MS, (slow, alone)
    assert growth <= MAX_RSS_GROWTH_MIB, growth
    assert child.running, child.output()
