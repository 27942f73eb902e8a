"""History suite: what keeping history costs a publish, and how fast a replay is.

In one run:
1. Publish throughput, history on vs plain, with one listener in another process:
   - livepush Postgres (`fanout.apublish()`: row lock, log row, NOTIFY) vs plain
     `SELECT pg_notify('bench', payload)`, one per transaction (autocommit);
   - livepush Redis (`fanout.apublish()`: one Lua script, XADD + trims + PUBLISH) vs plain
     `PUBLISH bench payload`.
   Same concurrency on both sides: 1 publisher, one message per round trip; then 4 publishers
   in one process (asyncio tasks; livepush's Postgres fan-out shares its own pool of at most 4
   connections, the plain side opens one connection each). With several publishers livepush
   runs twice: all on one topic (they queue on the topic's row lock, by design) and each on its
   own topic. msg/s = messages the listener received / (its receipt of the last one - first
   publish); every publish must arrive (a loss fails the suite). Goal: >= 0.5x plain.
   The listener: the server's own hub over `fanout.listen()` (on Postgres it reads the log for
   every doorbell, as a server does) vs a plain psycopg LISTEN / a raw redis-py SUBSCRIBE
   connection (the same calls the fan-outs use).
2. Publish-to-receive latency at 1,000 messages a second from one publisher (each message
   carries `time.time()` taken before the publish call), p50/p99 after half a second of warm-up.
3. Replay: 10,000 messages (2,000 with --quick) published while nobody listened, then one
   WebSocket client subscribes with `since` through a real server (`python -m livepush serve`;
   for the local fan-out the in-process harness of bench/_servers.py). Time from sending
   `subscribe` to receiving the last missed message, for each fan-out; the local fan-out, which
   replays from memory, is the baseline of the other two.

Messages are ~200 bytes of JSON. Each measurement runs 3 s (0.5 s with --quick). The listener
process is this file run with `--listener` (the one entry it keeps).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import secrets
import sys
import time
from array import array
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import report  # noqa: E402
from _clients import livepush_dialect, open_group, raise_fd_limit  # noqa: E402
from _services import drop_db, free_port, make_db, migrate, redis_fanout_available  # noqa: E402
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

            def broadcast(subscribers: Any, frame: str, topic: str, kind: str) -> None:
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
        for k in range(1, n + 1):
            server.publish_line(json.dumps(payload(k, pad), separators=(",", ":")))
            if k % 200 == 0:
                await server.drain()
        await server.drain()
        marker = server.origin  # the topic's start: messages 1 to n are replayed
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
        group, failed, error = await open_group("127.0.0.1", server.port, 1, livepush_dialect([sub]), 0, 0, report)
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
CONCURRENCY = 4
RATE = 1000.0  # messages a second in the latency measurement
SIZE = 200  # bytes of JSON data per message
FAMILIES = (("postgres", "pg_notify", "Postgres", "pg_notify"), ("redis", "redis_publish", "Redis", "Redis PUBLISH"))


async def measure(ctx: report.Context, url: str) -> tuple[dict, dict]:
    """Throughput and latency of each side, then the replays: ({side: {case: result}}, {fan-out: ms})."""
    seconds, replay_n = (0.5, 2_000) if ctx.quick else (3.0, 10_000)
    why = redis_fanout_available()
    if why:
        raise RuntimeError(f"livepush's Redis fan-out is not available: {why}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEPUSH_") and k != "DATABASE_URL"}
    env.update(LIVEPUSH_SECRET=secrets.token_urlsafe(48), LIVEPUSH_DATABASE_URL=url, LIVEPUSH_REDIS_URL=ctx.redis_url)
    pad = "x" * max(0, SIZE - 50)
    listener = ListenerProcess(ctx.workdir)
    results: dict[str, dict] = {}
    replays: dict[str, float] = {}
    await listener.start()
    try:
        for lp_kind, plain_kind, _, _ in FAMILIES:
            side_url = url if lp_kind == "postgres" else ctx.redis_url
            for side in (plain_kind, lp_kind):
                report.note(f"  [{side}] throughput and latency ...")
                await listener.call(cmd="listen", kind=side, url=side_url)
                try:
                    got: dict = {}
                    cases = [("one", 1, False), ("many", CONCURRENCY, False)]
                    if side == lp_kind:
                        cases.append(("spread", CONCURRENCY, True))  # plain NOTIFY/PUBLISH has no topics
                    for case, conc, many in cases:
                        pubs = Publishers(side, side_url, conc, pad)
                        await pubs.open()
                        try:
                            tps = [f"bench:t{secrets.token_hex(3)}:{i}" for i in range(conc if many else 1)]
                            got[case] = r = await measure_throughput(listener, pubs, seconds, tps)
                        finally:
                            await pubs.close()
                        if r["received"] != r["published"]:
                            raise RuntimeError(f"{side}: the listener got {r['received']} of {r['published']} messages")
                    pubs = Publishers(side, side_url, 1, pad)
                    await pubs.open()
                    try:
                        got["latency"] = await measure_latency(listener, pubs, seconds, RATE,
                                                               f"bench:lat{secrets.token_hex(3)}")
                    finally:
                        await pubs.close()
                    results[side] = got
                finally:
                    await listener.call(cmd="stop")
        for kind in ("local", "postgres", "redis"):
            report.note(f"  [{kind}] replay of {replay_n:,} messages ...")
            r = await measure_replay(kind, replay_n, env, free_port(0), ctx.workdir, pad)
            if r["received"] != replay_n or not r["seconds"]:
                raise RuntimeError(f"{kind} replay: got {r['received']} of {replay_n} messages "
                                   f"(other frame {r.get('other', '-')[:80]}, closed {r.get('closed', '-')})")
            replays[kind] = r["seconds"] * 1000
    finally:
        await listener.close()
    return results, replays


def figures(ctx: report.Context) -> list[report.Figure]:
    """Each fan-out's publish rate and latency against plain NOTIFY / PUBLISH; replays against local's."""
    raise_fd_limit()
    url = make_db(ctx.pg_admin_url, "bench_history")
    try:
        migrate(url)
        import uvloop

        results, replays = uvloop.run(measure(ctx, url))
    finally:
        drop_db(ctx.pg_admin_url, "bench_history")
    out = []
    c = CONCURRENCY
    for lp_kind, plain_kind, name, plain_name in FAMILIES:
        lp, plain = results[lp_kind], results[plain_kind]
        for case, base_case, label in (("one", "one", "1 publisher"), ("many", "many", f"{c} publishers, one topic"),
                                       ("spread", "many", f"{c} publishers, {c} topics")):
            out.append(report.Figure(f"publish with history, {name}, {label}", lp[case]["rate"], "msg/s",
                                     f"plain {plain_name}", plain[base_case]["rate"], goal=0.5))
        for q in ("p50", "p99"):
            out.append(report.Figure(f"publish to receive {q} at {RATE:,.0f} msg/s, {name}",
                                     lp["latency"][q] * 1000, "ms", f"plain {plain_name}",
                                     plain["latency"][q] * 1000, higher_is_better=False))
    n = 2_000 if ctx.quick else 10_000
    out.append(report.Figure(f"replay of {n:,} missed messages, local fan-out", replays["local"], "ms",
                             higher_is_better=False))
    for kind, name in (("postgres", "Postgres"), ("redis", "Redis")):
        out.append(report.Figure(f"replay of {n:,} missed messages, {name} fan-out", replays[kind], "ms",
                                 "local fan-out (from memory)", replays["local"], higher_is_better=False))
    return out


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--listener":
    # The one entry left: the listener process of ListenerProcess.
    import uvloop

    uvloop.run(listener_main(sys.argv[2]))
