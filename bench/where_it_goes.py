"""Where an idle connection's bytes and a delivery's time go in one server process (not a
benchmark with a baseline: the profile behind docs/performance.md's account of the connection
core).

    .venv/bin/python bench/where_it_goes.py                  # 5,000 idle connections, 5,000 subscribers
    .venv/bin/python bench/where_it_goes.py --connections 2000 --messages 100

A PushServer on the local fan-out runs in this process; the subscribers are bench/_clients.py's
raw clients in 2 other processes. Two measurements:
1. memory: tracemalloc snapshots before and after N subscribed, idle connections, the
   difference grouped by the line that allocated it, in bytes per connection (Python objects
   only: the kernel's socket buffers and the allocator's slack are in RSS, not here);
2. time: cProfile around `--messages` publishes to the same N subscribers, each awaited until
   every subscriber has it; the functions with the most time of their own, per delivery
   (cProfile's overhead inflates every figure alike; read the shares, not the microseconds).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _clients import ClientPool, livepush_dialect, raise_fd_limit  # noqa: E402

from livepush import topics  # noqa: E402
from livepush.config import Settings  # noqa: E402
from livepush.fanout.local import LocalFanOut  # noqa: E402
from livepush.server.app import PushServer  # noqa: E402

SECRET = "where-it-goes-bench-secret-7Kq2xV9"
TOPIC = "bench:x"


async def main(args: argparse.Namespace) -> None:
    raise_fd_limit()
    settings = Settings(secret=SECRET, fanout="local", port=0)
    fanout = LocalFanOut(history_ttl=settings.history_ttl)
    server = PushServer(settings, fanout)
    await server.start()
    pool = ClientPool()
    await pool.start()
    try:
        frame = json.dumps({"op": "subscribe", "topic": topics.sign(TOPIC, [SECRET]), "since": None, "ref": 1})
        dialect = livepush_dialect([frame])
        await pool.open("127.0.0.1", server.port, 20, dialect=dialect)  # what the first ones load
        await pool.collect()
        tracemalloc.start(1)
        before = tracemalloc.take_snapshot()
        got = await pool.open("127.0.0.1", server.port, args.connections, dialect=dialect)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        print(f"memory: {got:,} idle subscribed connections, Python objects per connection by allocating line")
        stats = after.compare_to(before, "lineno")
        total = sum(s.size_diff for s in stats)
        for s in stats[: args.top]:
            frame0 = s.traceback[0]
            print(f"  {s.size_diff / got:8.0f} B  {s.count_diff / got:5.2f} objects  "
                  f"{os.path.relpath(frame0.filename)}:{frame0.lineno}")
        print(f"  {total / got:8.0f} B  in all")

        profiler = cProfile.Profile()
        profiler.enable()
        for k in range(1, args.messages + 1):
            fanout.publish(TOPIC, {"t": time.time(), "k": k, "p": "x" * 150})
            await pool.wait_through(k, timeout=30)
        profiler.disable()
        deliveries = args.messages * got
        print(f"\ntime: {args.messages} messages to {got:,} subscribers, own time per delivery by function")
        st = pstats.Stats(profiler)
        rows = sorted(st.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
        for (filename, line, name), (_cc, calls, tottime, _cum, _callers) in rows[: args.top]:
            where = os.path.relpath(filename) if filename.startswith("/") else filename
            print(f"  {tottime / deliveries * 1e6:7.3f} us  {calls / deliveries:6.2f} calls  {name} ({where}:{line})")
        print(f"  {sum(v[2] for v in st.stats.values()) / deliveries * 1e6:7.3f} us  in all")  # type: ignore[attr-defined]
    finally:
        await pool.collect()
        await pool.close()
        await server.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=5000)
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--top", type=int, default=12)
    asyncio.run(main(ap.parse_args()))
