"""The soak test's child processes: publishers and WebSocket clients (see soak.py).

- `publisher`: calls livepush.publish() at a steady rate, round-robin over its topics, on the
  fan-out its environment names. Each message's data is {"t": unix time of the call, "k": a
  number unique to the run}. A publish that raises is retried (same k, new t) and is not
  counted. Writes one line per call to stdout: `P topic offset k t returned_at` (returned an offset) or
  `E topic k error` (raised).
- `clients`: many `websockets` clients that behave like the JS client: on a close they
  reconnect after a jittered, capped exponential backoff and resubscribe with `since` = the
  last offset they saw; on `reset` they refetch (subscribe again with no `since`: what the
  `subscribed` offset names is what the refetch covers; the connection's stream goes on from
  where it stood, so messages at or below that offset may follow it, once). On SIGTERM (or once every topic got
  its end marker and the parent says stop) it writes what it saw as JSON to its output file.

Run as `python bench/_soak_children.py publisher|clients ...` (soak.py does).
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import signal
import sys
import time
from array import array
from dataclasses import dataclass, field

from livepush.types import offset_key

BACKOFF_FIRST, BACKOFF_CAP = 0.1, 5.0  # the JS client's reconnect schedule (docs/reference.md#7-guarantees)


# -- publisher ---------------------------------------------------------------------------
def publisher(index: int, rate: float, topics: list[str]) -> None:
    """Publish `rate` messages a second until SIGTERM; one stdout line per publish() call."""
    import livepush

    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    out = sys.stdout
    k = index * 1_000_000_000
    interval = 1.0 / rate
    due = time.monotonic()
    while not stopping:
        topic = topics[k % len(topics)]
        while not stopping:
            t = time.time()
            try:
                offset = livepush.publish(topic, {"t": t, "k": k})
            except Exception as exc:  # an outage: retry, uncounted
                out.write(f"E {topic} {k} {type(exc).__name__}\n")
                out.flush()
                time.sleep(0.1)
                continue
            out.write(f"P {topic} {offset} {k} {t:.6f} {time.time():.6f}\n")
            out.flush()
            break
        k += 1
        due = max(due + interval, time.monotonic() - 1.0)  # behind after an outage: catch up at most 1 s worth
        time.sleep(max(0.0, due - time.monotonic()))


# -- clients -----------------------------------------------------------------------------
@dataclass
class Pair:
    """What one client saw on one topic."""

    topic: str
    signed: str
    base: str | None = None  # offset `subscribed` named at the first subscribe
    last: str | None = None  # where the client stands (newest offset seen, or a refetch's): a resubscribe's `since`
    seen: str | None = None  # newest offset delivered (or a first subscribe's): one at or below it is a duplicate
    replay_to: tuple[int, ...] = ()  # messages up to here came by a `since` replay
    reset_to: str | None = None  # what the newest refetch covered
    # When the last refetch found the topic without history (after Redis lost its streams, or a
    # Postgres crash emptied the log): it covers every message published before it.
    origin_refetch_at: float = 0.0
    ks: list[int] = field(default_factory=list)
    live: int = 0
    replayed: int = 0
    dups: int = 0
    resets: int = 0
    refused: int = 0
    done: bool = False  # the end marker arrived
    events: list[str] = field(default_factory=list)  # resets and refetches, for reading a loss


class Client:
    def __init__(self, ident: int, url: str, pairs: list[Pair], lat: array, lat_t: array) -> None:
        self.ident = ident
        self.url = url
        self.pairs = {p.topic: p for p in pairs}
        self.lat, self.lat_t = lat, lat_t
        self.connected = False
        self.reconnects = 0
        self.closes: dict[str, int] = {}

    async def run(self) -> None:
        from websockets.asyncio.client import connect

        failures = 0
        while True:
            try:
                async with connect(self.url, open_timeout=5, close_timeout=1, compression=None,
                                   max_size=2**21, ping_interval=10, ping_timeout=10) as ws:
                    self.connected = True
                    failures = 0
                    await self._session(ws)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                name = type(exc).__name__
                code = getattr(getattr(exc, "rcvd", None), "code", None)
                key = f"{name}:{code}" if code else name
                self.closes[key] = self.closes.get(key, 0) + 1
            self.connected = False
            self.reconnects += 1
            failures += 1
            delay = min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** (failures - 1)) * random.uniform(0.5, 1.5)
            await asyncio.sleep(delay)

    async def _session(self, ws) -> None:  # type: ignore[no-untyped-def]
        hello = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert hello["op"] == "hello", hello
        for p in self.pairs.values():
            await self._subscribe(ws, p, p.last)
        async for raw in ws:
            now = time.time()
            frame = json.loads(raw)
            op = frame.get("op")
            if op == "message":
                self._message(self.pairs[frame["topic"]], frame, now)
            elif op == "subscribed":
                p = self.pairs[frame["topic"]]
                offset = frame["offset"]
                if p.base is None:
                    p.base = offset
                if frame["ref"].endswith(":refetch"):
                    p.events.append(f"{now:.3f} refetch subscribed at {offset} (last seen {p.last})")
                    if offset_key(offset) in ((0,), (0, 0)):
                        p.origin_refetch_at = now
                    p.reset_to = offset if p.reset_to is None or offset_key(offset) > offset_key(p.reset_to) else p.reset_to
                elif frame["ref"].endswith(":since") and offset is not None:
                    p.replay_to = offset_key(offset)
                # A resume's `subscribed` names the end of its replay: `last` moves as the replay arrives.
                if not frame["ref"].endswith(":since") and offset is not None and (
                        p.last is None or offset_key(offset) > offset_key(p.last)):
                    p.last = offset
                # A first subscribe's stream starts after its offset. A refetch's does not: the
                # connection follows the topic still, and its stream goes on from where it stood
                # (docs/protocol.md), so what was published after the reset's read may follow at or
                # below that offset, once; counted a duplicate only if it comes again.
                if frame["ref"].endswith(":first") and offset is not None and p.seen is None:
                    p.seen = offset
            elif op == "reset":
                p = self.pairs[frame["topic"]]
                p.resets += 1
                p.events.append(f"{now:.3f} reset (last seen {p.last})")
                await self._subscribe(ws, p, None, refetch=True)
            elif op == "refused":
                p = self.pairs[frame["ref"].split("|")[0]]
                p.refused += 1
                asyncio.get_running_loop().call_later(1.0, lambda p=p: asyncio.ensure_future(self._retry(ws, p)))

    async def _retry(self, ws, p: Pair) -> None:  # type: ignore[no-untyped-def]
        try:
            await self._subscribe(ws, p, p.last)
        except Exception:
            pass  # the connection is gone: the reconnect resubscribes

    async def _subscribe(self, ws, p: Pair, since: str | None, refetch: bool = False) -> None:  # type: ignore[no-untyped-def]
        kind = "refetch" if refetch else ("since" if since is not None else "first")
        if since is not None and (p.seen is None or offset_key(since) > offset_key(p.seen)):
            p.seen = since  # a resume's stream starts after `since` (past what a refetch covered)
        await ws.send(json.dumps({"op": "subscribe", "topic": p.signed, "since": since, "ref": f"{p.topic}|:{kind}"}))

    def _message(self, p: Pair, frame: dict, now: float) -> None:
        key = offset_key(frame["offset"])
        if p.seen is not None and key <= offset_key(p.seen):
            p.dups += 1  # at or below what was seen: a duplicate (or out of order)
            return
        p.seen = frame["offset"]
        if p.last is None or key > offset_key(p.last):
            p.last = frame["offset"]
        data = frame["data"]
        if data.get("end"):
            p.done = True
            return
        p.ks.append(data["k"])
        if key <= p.replay_to:
            p.replayed += 1
        else:
            p.live += 1
            self.lat.append(now - data["t"])
            self.lat_t.append(data["t"])


async def run_clients(spec_path: str, out_path: str) -> None:
    """Run the clients of the spec until SIGTERM, printing `S done total connected` each second."""
    with open(spec_path) as f:
        spec = json.load(f)
    lat, lat_t = array("d"), array("d")
    clients = [Client(c["id"], c["url"], [Pair(t["topic"], t["signed"]) for t in c["topics"]], lat, lat_t)
               for c in spec["clients"]]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = []
    for c in clients:
        tasks.append(asyncio.create_task(c.run()))
        await asyncio.sleep(0.005)  # spread the first handshakes
    while not stop.is_set():
        pairs = [p for c in clients for p in c.pairs.values()]
        print(f"S {sum(p.done for p in pairs)} {len(pairs)} {sum(c.connected for c in clients)}", flush=True)
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except TimeoutError:
            pass
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    result = {
        "clients": [{"id": c.ident, "url": c.url, "reconnects": c.reconnects, "closes": c.closes, "connected": c.connected,
                     "pairs": [{k: v for k, v in vars(p).items() if k not in ("signed", "replay_to")}
                               for p in c.pairs.values()]} for c in clients],
        "lat": base64.b64encode(lat.tobytes()).decode(),
        "lat_t": base64.b64encode(lat_t.tobytes()).decode(),
    }
    with open(out_path, "w") as f:
        json.dump(result, f)
    print("DONE", flush=True)


def main() -> None:
    role = sys.argv[1]
    if role == "publisher":
        publisher(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4].split(","))
    elif role == "clients":
        try:
            import uvloop

            uvloop.run(run_clients(sys.argv[2], sys.argv[3]))
        except ImportError:
            asyncio.run(run_clients(sys.argv[2], sys.argv[3]))
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
