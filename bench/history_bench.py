#!/usr/bin/env python
"""History benchmark: what keeping history costs a publish, and how fast a replay is.

    .venv/bin/python bench/history_bench.py [--seconds 3] [--concurrency 4] [--rate 1000]
        [--fanouts postgres,redis] [--pg-url URL] [--redis-url URL]

In one run:
1. Publish throughput, history on vs plain, with one listener in another process:
   - livepush Postgres (`fanout.apublish()`: row lock, log row, NOTIFY) vs plain
     `SELECT pg_notify('bench', payload)`, one per transaction (autocommit);
   - livepush Redis (`fanout.apublish()`: one Lua script, XADD + trims + PUBLISH) vs plain
     `PUBLISH bench payload`.
   Same concurrency on both sides: 1 publisher, one message per round trip; then
   `--concurrency` publishers in one process (asyncio tasks; livepush's Postgres fan-out
   shares its own pool of at most 4 connections, the plain side opens one connection each).
   With several publishers livepush runs twice: all on one topic (they queue on the topic's
   row lock, by design) and each on its own topic. msg/s = messages the listener received /
   (its receipt of the last one - first publish); every publish must arrive.
   The listener: the server's own hub over `fanout.listen()` (on Postgres it reads the log
   for every doorbell, as a server does) vs a plain psycopg LISTEN / a raw redis-py
   SUBSCRIBE connection (the same calls the fan-outs use).
2. Publish-to-receive latency at `--rate` messages a second from one publisher (each message
   carries `time.time()` taken before the publish call), p50/p99 over `--seconds` after
   half a second of warm-up.
3. Replay: `--replay` (10,000) messages published while nobody listened, then one WebSocket
   client subscribes with `since` through a real server (`python -m livepush serve`; for the
   local fan-out the in-process harness of bench/_servers.py). Time from sending `subscribe`
   to receiving the last missed message, for each fan-out.

Messages are ~200 bytes of JSON. Without --pg-url / --redis-url a throwaway PostgreSQL and
Redis are started in a temp dir and stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import secrets
import sys
import tempfile
import time
from array import array
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _clients import open_group, raise_fd_limit  # noqa: E402
from _services import Services, free_port, migrate, redis_fanout_available  # noqa: E402
from _servers import start_harness, start_livepush_cli  # noqa: E402

CHANNEL = "bench"
GOAL = 0.5  # of the plain rate


def payload(k: int, pad: str) -> dict:
    return {"t": time.time(), "k": k, "p": pad}


def time_in(text: str) -> float:
    i = text.index('"t":') + 4
    return float(text[i : text.index(",", i)])


# -- the listener, in its own process ------------------------------------------------------
class _Sink:
    """The hub's one subscriber: hands each message frame's data to the listener."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener

    def send(self, frame: str) -> None:
        i = frame.find('"data":')
        if i >= 0:
            self.listener.got(frame[i + 7 : -1])

    async def drain(self) -> None:
        pass


class Listener:
    def __init__(self) -> None:
        self.count = 0
        self.last_at = 0.0
        self.lat = array("d")
        self.task: asyncio.Task[None] | None = None
        self.close = None
        self.watch: Any = None  # fan-out listeners: subscribe the hub to a topic before it is published on

    def got(self, text: str) -> None:
        now = time.time()
        if not text.startswith('{"t":'):
            return  # a publisher's warm-up message
        self.count += 1
        self.last_at = now
        self.lat.append(now - time_in(text))

    async def start(self, kind: str, url: str) -> None:
        if kind in ("postgres", "redis"):
            from livepush.config import Settings
            from livepush.fanout import from_env
            from livepush.server.hub import Hub

            fanout = from_env(Settings(fanout=kind, database_url=url if kind == "postgres" else None,
                                       redis_url=url if kind == "redis" else None))
            # The server's own hub does the listening: on Postgres every notification is a
            # doorbell that makes it read the topic's log, and the figures include those reads.
            sink = _Sink(self)

            def broadcast(subscribers: Any, frame: str) -> None:
                for subscriber in subscribers:
                    subscriber.send(frame)

            hub = Hub(fanout, broadcast)
            await fanout.listen()
            fanout.register(hub.on_message)
            fanout.on_resync(hub.resync)
            self.watch = lambda topic: hub.subscribe(sink, topic, None, None)

            async def close_fanout() -> None:
                await hub.aclose()
                await fanout.aclose()

            self.close = close_fanout
        elif kind == "pg_notify":
            import psycopg

            conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
            await conn.execute(f"LISTEN {CHANNEL}")

            async def loop() -> None:
                async for note in conn.notifies():
                    self.got(note.payload)

            self.task = asyncio.create_task(loop())

            async def close() -> None:
                self.task.cancel()
                with contextlib.suppress(BaseException):
                    await self.task
                await conn.close()

            self.close = close
        elif kind == "redis_publish":
            import redis.asyncio as aredis

            pool = aredis.ConnectionPool.from_url(url, protocol=2)  # replies as lists, as parsed below
            conn = pool.make_connection()
            await conn.connect()
            await conn.send_command("SUBSCRIBE", CHANNEL)
            await conn.read_response()

            async def loop() -> None:
                while True:
                    # Block between messages (the pool's socket timeout would end an idle wait).
                    reply = await conn.read_response(timeout=math.inf)
                    if isinstance(reply, list) and reply[0] == b"message":
                        self.got(reply[2].decode())

            self.task = asyncio.create_task(loop())

            async def close() -> None:
                self.task.cancel()
                with contextlib.suppress(BaseException):
                    await self.task
                await conn.disconnect()
                await pool.disconnect()

            self.close = close
        else:
            raise ValueError(kind)


async def listener_main(control: str) -> None:
    reader, writer = await asyncio.open_unix_connection(control, limit=2**26)
    listener: Listener | None = None
    while line := await reader.readline():
        cmd = json.loads(line)
        reply: dict = {}
        if cmd["cmd"] == "listen":
            listener = Listener()
            try:
                await listener.start(cmd["kind"], cmd["url"])
            except Exception as exc:
                reply = {"error": f"{type(exc).__name__}: {exc}"}
        elif cmd["cmd"] == "watch":
            if listener.watch is not None:
                for topic in cmd["topics"]:
                    await listener.watch(topic)
        elif cmd["cmd"] == "reset":
            listener.count, listener.lat = 0, array("d")
        elif cmd["cmd"] == "count":
            reply = {"count": listener.count, "last_at": listener.last_at}
        elif cmd["cmd"] == "collect":
            lat = sorted(listener.lat)
            reply = {"count": listener.count, "p50": _pct(lat, 0.5), "p99": _pct(lat, 0.99), "max": lat[-1] if lat else None}
        elif cmd["cmd"] == "stop":
            if listener is not None and listener.close is not None:
                await listener.close()
            listener = None
        writer.write(json.dumps(reply).encode() + b"\n")
        await writer.drain()


def _pct(values: list[float], q: float) -> float | None:
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


class ListenerProcess:
    def __init__(self, tmp: str) -> None:
        self.path = os.path.join(tmp, "listener.sock")
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        conns: asyncio.Queue = asyncio.Queue()
        server = await asyncio.start_unix_server(lambda r, w: conns.put_nowait((r, w)), self.path, limit=2**26)
        self.proc = await asyncio.create_subprocess_exec(sys.executable, os.path.abspath(__file__), "--listener", self.path)
        self.reader, self.writer = await asyncio.wait_for(conns.get(), 30)
        server.close()

    async def call(self, **cmd) -> dict:
        self.writer.write(json.dumps(cmd).encode() + b"\n")
        reply = json.loads(await asyncio.wait_for(self.reader.readline(), 60))
        if reply.get("error"):
            raise RuntimeError(reply["error"])
        return reply

    async def wait_count(self, n: int, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            reply = await self.call(cmd="count")
            if reply["count"] >= n or time.monotonic() > deadline:
                return reply
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        if self.proc is not None:
            self.writer.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 10)
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()


# -- publishers ----------------------------------------------------------------------------
class Publishers:
    """`c` publishers of one kind; `publish(i, data)` sends with publisher i."""

    def __init__(self, kind: str, url: str, c: int, pad: str) -> None:
        self.kind, self.url, self.c, self.pad = kind, url, c, pad
        self._conns: list = []
        self._fanout = None

    async def open(self) -> None:
        if self.kind == "pg_notify":
            import psycopg

            self._conns = [await psycopg.AsyncConnection.connect(self.url, autocommit=True) for _ in range(self.c)]
        elif self.kind == "redis_publish":
            import redis.asyncio as aredis

            self._client = aredis.Redis.from_url(self.url)
            await self._client.ping()
        else:
            from livepush.config import Settings
            from livepush.fanout import from_env

            self._fanout = from_env(Settings(fanout=self.kind, database_url=self.url if self.kind == "postgres" else None,
                                                  redis_url=self.url if self.kind == "redis" else None))
            # Open its connections before the clock starts, as the plain side does. (One call
            # first: concurrent first calls each open a pool of their own, see bench/README.md.)
            await self._fanout.apublish("bench:warmup", {"warmup": True})

    async def publish(self, i: int, topic: str, k: int) -> None:
        data = payload(k, self.pad)
        if self.kind == "pg_notify":
            text = json.dumps(data, separators=(",", ":"))  # the same encoding cost as livepush's
            await self._conns[i].execute("SELECT pg_notify(%s, %s)", (CHANNEL, text))
        elif self.kind == "redis_publish":
            await self._client.publish(CHANNEL, json.dumps(data, separators=(",", ":")))
        else:
            await self._fanout.apublish(topic, data)

    async def close(self) -> None:
        for conn in self._conns:
            await conn.close()
        if self.kind == "redis_publish":
            await self._client.aclose()
        if self._fanout is not None:
            await self._fanout.aclose()


async def measure_throughput(listener: ListenerProcess, pubs: Publishers, seconds: float, topics: list[str]) -> dict:
    await listener.call(cmd="watch", topics=topics)
    await listener.call(cmd="reset")
    counter = 0
    t0 = time.time()
    stop_at = time.monotonic() + seconds

    async def one(i: int) -> None:
        nonlocal counter
        while time.monotonic() < stop_at:
            counter += 1
            await pubs.publish(i, topics[i % len(topics)], counter)

    await asyncio.gather(*(one(i) for i in range(pubs.c)))
    publish_wall = time.time() - t0
    got = await listener.wait_count(counter, timeout=30)
    wall = (got["last_at"] or time.time()) - t0
    return {"published": counter, "received": got["count"], "rate": got["count"] / wall, "publish_rate": counter / publish_wall}


async def measure_latency(listener: ListenerProcess, pubs: Publishers, seconds: float, rate: float, topic: str) -> dict:
    loop = asyncio.get_running_loop()

    async def paced(first: int, count: int) -> None:
        t0 = loop.time()  # an absolute schedule: a slow publish does not shift the ones after it
        for i in range(count):
            delay = t0 + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await pubs.publish(0, topic, first + i)

    await listener.call(cmd="watch", topics=[topic])
    warm = int(rate * 0.5)
    await paced(1, warm)
    await listener.wait_count(warm, timeout=10)
    await listener.call(cmd="reset")
    measured = int(rate * seconds)
    await paced(warm + 1, measured)
    await listener.wait_count(measured, timeout=30)
    return await listener.call(cmd="collect")


# -- replay through a real server -----------------------------------------------------------
async def measure_replay(kind: str, n: int, env: dict[str, str], port: int, tmp: str, pad: str) -> dict:
    from livepush import topics
    from livepush.config import Settings
    from livepush.fanout import from_env

    topic = f"bench:replay:{kind}:{secrets.token_hex(4)}"
    secret = env["LIVEPUSH_SECRET"]
    fanout = None
    if kind == "local":
        server = start_harness("local", port, os.path.join(tmp, "replay.sock"), env, topic)
        await server.connect_control()
        for k in range(n + 1):
            server.publish_line(json.dumps(payload(k, pad), separators=(",", ":")))
            if k % 200 == 0:
                await server.drain()
        await server.drain()
        marker = "1"  # a fresh topic's offsets count from 1
    else:
        server = await asyncio.to_thread(start_livepush_cli, port, dict(env, LIVEPUSH_FANOUT=kind), os.path.join(tmp, f"{kind}.log"))
        fanout = from_env(Settings(fanout=kind, database_url=env.get("LIVEPUSH_DATABASE_URL"),
                                        redis_url=env.get("LIVEPUSH_REDIS_URL")))
        marker = await fanout.apublish(topic, payload(0, pad))  # also opens its pool before the gather below
        sem = asyncio.Semaphore(4)
        done = 0

        async def one(k: int) -> None:
            nonlocal done
            async with sem:
                await fanout.apublish(topic, payload(k, pad))
                done += 1

        # Order across concurrent publishers does not matter here: only the count is checked.
        await asyncio.gather(*(one(k) for k in range(1, n + 1)))
    try:
        if kind == "local":
            await asyncio.sleep(0.2)  # the harness publishes what is still in its socket
        last = {"k": 0, "at": 0.0}

        def report(k: int, at: float) -> None:
            last["k"], last["at"] = k, at

        sub = json.dumps({"op": "subscribe", "topic": topics.sign(topic, [secret]), "since": marker, "ref": 1})
        group, failed, error = await open_group("127.0.0.1", server.port, "/", 1, sub, 0, 0, report)
        if failed:
            raise RuntimeError(error)
        deadline = time.monotonic() + 60
        while last["k"] < n and time.monotonic() < deadline and not group.others and not group.codes and group.n:
            await asyncio.sleep(0.002)
        elapsed = last["at"] - group.subscribe_sent_at
        for conn in group.conns:
            conn.transport.abort()
        out = {"received": last["k"], "seconds": elapsed if last["k"] else None}
        if group.others:
            out["other"] = group.others[0].decode(errors="replace")
        if group.codes:
            out["closed"] = dict(group.codes)
        return out
    finally:
        if fanout is not None:
            await fanout.aclose()
        await server.stop()


# -- the run ----------------------------------------------------------------------------------
def fmt_rate(r: dict | None) -> str:
    if r is None:
        return "n/a"
    lost = "" if r["received"] == r["published"] else f" (got {r['received']}/{r['published']}!)"
    return f"{r['rate']:>8,.0f}{lost}"


async def amain(args: argparse.Namespace) -> int:
    raise_fd_limit()
    fanouts = [f.strip() for f in args.fanouts.split(",") if f.strip()]
    services = Services()
    tmp = tempfile.mkdtemp(prefix="livepush-history-bench-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEPUSH_") and k != "DATABASE_URL"}
    env["LIVEPUSH_SECRET"] = secrets.token_urlsafe(48)
    pad = "x" * max(0, args.size - 50)
    listener = ListenerProcess(tmp)
    rows: list[tuple[str, str, dict | None, dict | None, dict | None]] = []  # family, side, c=1, c=N, c=N many topics
    latency: dict[str, dict | str] = {}
    replay: dict[str, dict | str] = {}
    notes: list[str] = []
    try:
        families = []
        if "postgres" in fanouts:
            url = args.pg_url or services.start_postgres(args.pg_port, durable=not args.pg_no_fsync)
            await asyncio.to_thread(migrate, url)
            env["LIVEPUSH_DATABASE_URL"] = url
            families.append(("postgres", "pg_notify", url))
        if "redis" in fanouts:
            why = redis_fanout_available()
            url = args.redis_url or services.start_redis(args.redis_port)
            env["LIVEPUSH_REDIS_URL"] = url
            if why:
                notes.append(f"redis: livepush's Redis fan-out is not available ({why}); only the plain side ran")
            families.append(("redis" if not why else None, "redis_publish", url))
        await listener.start()
        c = args.concurrency
        for lp_kind, plain_kind, url in families:
            for side in (plain_kind, lp_kind):
                if side is None:
                    rows.append((plain_kind, "livepush", None, None, None))
                    continue
                print(f"[{side}] throughput and latency ...", file=sys.stderr, flush=True)
                try:
                    await listener.call(cmd="listen", kind=side, url=url)
                    results = []
                    for conc, many in ((1, False), (c, False), (c, True)):
                        if many and side == plain_kind:
                            results.append(None)  # plain NOTIFY/PUBLISH has no topics to spread over
                            continue
                        pubs = Publishers(side, url, conc, pad)
                        await pubs.open()
                        try:
                            tps = [f"bench:t{secrets.token_hex(3)}:{i}" for i in range(conc if many else 1)]
                            results.append(await measure_throughput(listener, pubs, args.seconds, tps))
                        finally:
                            await pubs.close()
                    pubs = Publishers(side, url, 1, pad)
                    await pubs.open()
                    try:
                        latency[side] = await measure_latency(listener, pubs, args.seconds, args.rate, f"bench:lat{secrets.token_hex(3)}")
                    finally:
                        await pubs.close()
                    rows.append((plain_kind, side, *results))
                except Exception as exc:
                    rows.append((plain_kind, side, None, None, None))
                    latency[side] = f"{type(exc).__name__}: {exc}"
                finally:
                    with contextlib.suppress(Exception):
                        await listener.call(cmd="stop")
        replay_kinds = ["local"] + [f for f in ("postgres", "redis") if f in fanouts and not (f == "redis" and redis_fanout_available())]
        for i, kind in enumerate(replay_kinds):
            print(f"[{kind}] replay of {args.replay} messages ...", file=sys.stderr, flush=True)
            port = free_port(args.ws_port + i if args.ws_port else 0)
            try:
                replay[kind] = await measure_replay(kind, args.replay, env, port, tmp, pad)
            except Exception as exc:
                replay[kind] = f"{type(exc).__name__}: {exc}"
        print_report(args, rows, latency, replay, notes)
    finally:
        await listener.close()
        services.stop()
        for name in os.listdir(tmp):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(tmp, name))
        with contextlib.suppress(OSError):
            os.rmdir(tmp)
    return 0


def print_report(args, rows, latency, replay, notes) -> None:
    c = args.concurrency
    print()
    print(f"Publish throughput (msg/s received by one listener in another process; {args.size}-byte messages, {args.seconds:g} s each)")
    head = f"{'':<24} {'1 publisher':>12} {'vs plain':>9} {f'{c} publishers':>13} {'vs plain':>9} {f'{c} pubs, {c} topics':>17} {'vs plain':>9}"
    print(head)
    print("-" * len(head))
    plain: dict[str, tuple] = {}
    for family, side, one, many, spread in rows:
        label = {"pg_notify": "plain pg_notify", "redis_publish": "plain Redis PUBLISH",
                 "postgres": "livepush postgres", "redis": "livepush redis", "livepush": "livepush redis"}[side]
        if side == family:
            plain[family] = (one, many)
            print(f"{label:<24} {fmt_rate(one):>12} {'':>9} {fmt_rate(many):>13} {'':>9} {'(no topics)':>17}")
            continue
        base1, baseN = plain.get(family, (None, None))

        def ratio(x, base):
            if x is None or base is None:
                return ""
            r = x["rate"] / base["rate"]
            return f"{r:.2f}x" + ("" if r >= GOAL else "!")

        print(f"{label:<24} {fmt_rate(one):>12} {ratio(one, base1):>9} {fmt_rate(many):>13} {ratio(many, baseN):>9} "
              f"{fmt_rate(spread):>17} {ratio(spread, baseN):>9}")
    print(f"goal: >= {GOAL}x plain ('!' marks a miss). Postgres: livepush's fan-out publishes through its own pool "
          "of at most 4 connections; the plain side has one connection per publisher.")
    print()
    print(f"Publish-to-receive latency at {args.rate:g} msg/s, one publisher, one listener ({args.seconds:g} s after 0.5 s warm-up)")
    for side, label in (("pg_notify", "plain pg_notify"), ("postgres", "livepush postgres"),
                        ("redis_publish", "plain Redis PUBLISH"), ("redis", "livepush redis")):
        r = latency.get(side)
        if r is None:
            continue
        if isinstance(r, str):
            print(f"  {label:<22} n/a ({r})")
        else:
            print(f"  {label:<22} p50 {r['p50'] * 1000:6.2f} ms   p99 {r['p99'] * 1000:6.2f} ms   max {r['max'] * 1000:6.2f} ms   ({r['count']} messages)")
    print()
    print(f"Replay of {args.replay:,} missed messages to one WebSocket client (subscribe with since -> last message received)")
    for kind in ("local", "postgres", "redis"):
        r = replay.get(kind)
        if r is None:
            continue
        if isinstance(r, str):
            print(f"  {kind:<10} n/a ({r})")
            continue
        ok = r["received"] == args.replay
        line = f"  {kind:<10} {r['seconds'] * 1000:8.0f} ms  ({r['received'] / r['seconds']:,.0f} msg/s)" if ok and r["seconds"] else \
            f"  {kind:<10} FAILED: got {r['received']} of {args.replay}"
        if "other" in r:
            line += f"; unexpected frame {r['other'][:80]}"
        if "closed" in r:
            line += f"; closed by the server with {r['closed']}"
        print(line)
    for note in notes:
        print("note:", note)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=3.0, help="length of each throughput and latency measurement")
    p.add_argument("--concurrency", type=int, default=4, help="publishers in the concurrent measurement")
    p.add_argument("--rate", type=float, default=1000.0, help="messages per second in the latency measurement")
    p.add_argument("--replay", type=int, default=10_000, help="missed messages to replay")
    p.add_argument("--fanouts", default="postgres,redis", help="comma-separated (local is always in the replay)")
    p.add_argument("--size", type=int, default=200, help="bytes of JSON data per message")
    p.add_argument("--pg-url")
    p.add_argument("--redis-url")
    p.add_argument("--pg-no-fsync", action="store_true",
                   help="run the throwaway PostgreSQL with fsync=off (default: Postgres' durable defaults)")
    p.add_argument("--pg-port", type=int, default=0, help="port for the throwaway PostgreSQL (0: any free)")
    p.add_argument("--redis-port", type=int, default=0, help="port for the throwaway Redis (0: any free)")
    p.add_argument("--ws-port", type=int, default=0, help="first WebSocket server port for the replay servers")
    return p.parse_args(argv)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--listener":
        import uvloop

        uvloop.run(listener_main(sys.argv[2]))
        return 0
    args = parse_args()
    import uvloop

    return uvloop.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
