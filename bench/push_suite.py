"""The push suite: livepush's WebSocket server on each fan-out against a bare `websockets`
broadcast server (the ceiling of one process) and python-socketio, measured in the same run.

Run alone: `.venv/bin/python bench/push_suite.py [--quick]` (a throwaway PostgreSQL and Redis);
`bin/bench --only push` runs it in the harness. python-socketio runs from `.venv-bench`; without
it, the figures against it say so.

Targets, each a fresh server process per measurement, the same subscribers (bench/_clients.py,
2 client processes):
- bare: `websockets.broadcast` on uvloop, compression off, no livepush. Every figure is
  compared with it.
- livepush on each fan-out: local (`PushServer` in bench/_servers.py's process, published to in
  that process), Postgres and Redis (the real `python -m livepush serve`, published to from this
  process as an application would: `fanout.apublish()` on one topic, and one
  `fanout.apublish_many()` for a message on each of several topics).
- python-socketio (`AsyncServer` with `AsyncRedisManager`, an ASGI app under uvicorn with its
  defaults, one room per topic joined with an acknowledged `join` event; the clients speak
  Engine.IO 4 over WebSocket). A publisher process emits through `AsyncRedisManager(write_only=True)`,
  so a message crosses Redis from another process, as on livepush's Redis fan-out, the one it is
  compared with.

Figures (messages carry ~200 bytes of JSON data, `"t"` first: the time just before the publish call):
1. Deliveries per second with 1 topic x 1,000 subscribers, 1 topic x 5,000 and 1,000 topics x 5:
   messages published back to back for the phase, at most IN_FLIGHT messages in flight to each
   subscriber whatever their number (on 1,000 topics, rounds of one message per topic, each
   subscriber on one topic), so every queue stays bounded. deliveries/s = messages x subscribers
   / (the last subscriber's receipt of the last message - the first publish). Goals: 0.9x bare,
   6x python-socketio; 5,000 subscribers 0.9x the 1,000-subscriber figure.
2. Server CPU per delivery (µs) in the same phase: user + system CPU of the server process and
   its children (the workers of `--workers`), from /proc, over the deliveries. The clients and
   the databases share the machine's cores, so deliveries/s partly measure them; this is the
   steadier comparison.
3. Publish-to-receive p50 and p99 over every delivery at RATE messages a second to 1,000
   subscribers, after a warm-up. Goals: p99 within 1.2x bare's (ratio 0.83), 10x python-socketio's.
   python-socketio delivers fewer than RATE x 1,000 messages a second on 2 cores, so there its
   latency is its growing backlog; the Redis fan-out and it are also compared at LOW_RATE.
4. Memory per idle connection: the server's resident memory before and after N subscribed
   connections that receive nothing, over N (20 connections opened and closed first, so one-off
   loading is not counted). Without compression (target 16 KiB), and with the upgrade offering
   `permessage-deflate; client_max_window_bits` as browsers do (target 40 KiB; on the Redis
   fan-out, against `bare-deflate` and python-socketio, which accept it). livepush never
   negotiates deflate (docs/architecture.md); the figure names what each server answered.
5. `serve --workers 1, 2, auto` on Postgres and Redis: deliveries and CPU per delivery (all
   workers) with 1 topic x 1,000 subscribers, against the bare figure; and deliveries per second
   with a core per worker (the deliveries over the CPU seconds of the busiest server process, so
   the clients' and databases' share of the 2 cores is taken out), 2 and auto against 1 (goal
   1.7x); reported as not measured when `livepush serve --help` does not list `--workers`.

The deliveries, CPU and latency figures, `--workers` ones included, are medians over rounds, the
targets interleaved in each (python-socketio's at 5,000 subscribers: one round); the memory and
low-rate figures one round. A target that fails is reported as not measured, with the reason, and the rest goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import report  # noqa: E402
from _clients import ClientPool, Dialect, livepush_dialect, raise_fd_limit  # noqa: E402
from _procstat import cpu_each, percentile, rss_kib, tree  # noqa: E402
from _servers import ROOT, ServerProcess, start_harness, start_livepush_cli  # noqa: E402
from _services import drop_db, free_port, make_db, migrate  # noqa: E402

BARE, SOCKETIO = "bare websockets", "python-socketio"
FANOUTS = {"local": "local", "postgres": "Postgres", "redis": "Redis"}
TOPIC = "bench:x"
PAD = "x" * 150  # ~200-byte messages
RATE = 20.0  # messages a second in the latency phase
# python-socketio delivers 12,000-30,000 messages a second here: at RATE its queues grow all
# phase long, so it is also compared at a rate it keeps up with.
LOW_RATE = 5.0
# Messages published and not yet received by each subscriber, at most, in the throughput phase.
# Per subscriber, not in all: a server that writes what queued for a connection in one go (as
# livepush does) would otherwise see a fifth of the batch at 5,000 subscribers that it sees at
# 1,000, and the two figures would differ by the publisher's pace rather than the subscribers'.
IN_FLIGHT = 50
SOCKETIO_PATH = "/socket.io/?EIO=4&transport=websocket"
SOCKETIO_SERVER = os.path.join(HERE, "competitors", "socketio_server.py")
# Goals, as ratios (report.Figure.ratio is above 1 when livepush wins).
GOAL_VS_BARE, GOAL_VS_SOCKETIO = 0.9, 6.0
GOAL_P99_VS_BARE, GOAL_P99_VS_SOCKETIO = 0.83, 10.0  # 0.83: a p99 within 1.2x the bare server's
GOAL_5000_VS_1000 = 0.9
# --workers 2 against 1 with the clients' CPU taken out (a core per worker): 1.7x. On 2 shared
# cores the clients need about as much CPU as the server, so deliveries/s cannot double here.
GOAL_WORKERS_PER_CORE = 1.7
TARGET_IDLE_KIB, TARGET_IDLE_DEFLATE_KIB = 16, 40


@dataclasses.dataclass(frozen=True)
class Plan:
    """How much of everything to run."""

    rounds: int  # of the deliveries, CPU and latency figures, the targets interleaved in each
    seconds: float  # each phase
    warmup: float
    idle: int  # connections of the memory figures
    idle_fanouts: tuple[str, ...]  # a connection costs the same on every fan-out: quick measures one
    big: bool  # the 5,000-connection figures and --workers

    @classmethod
    def of(cls, quick: bool) -> Plan:
        if quick:
            return cls(1, 2.0, 0.5, 1_000, ("redis",), False)
        return cls(3, 4.0, 1.0, 10_000, tuple(FANOUTS), True)


@dataclasses.dataclass
class Run:
    """What one measurement of one target gave (NaN: not measured)."""

    deliveries_per_s: float = float("nan")
    cpu_us: float = float("nan")  # the server's CPU microseconds per delivery
    # Deliveries per second were each server process on a core of its own: the deliveries over
    # the CPU seconds of the busiest process (the clients' and databases' CPU taken out).
    per_core_rate: float = float("nan")
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    kib_per_conn: float = float("nan")
    deflated: int | None = None  # connections that negotiated permessage-deflate
    error: str | None = None


# -- targets ---------------------------------------------------------------------------
class Target:
    """A server under test: started fresh for each measurement, then published to."""

    def __init__(self, name: str, start: Callable[[], Awaitable[ServerProcess]],
                 dialect: Callable[[list[str], bool], Dialect]) -> None:
        self.name = name
        self._start = start
        self.dialect = dialect
        self.server: ServerProcess | None = None

    async def __aenter__(self) -> Target:
        self.server = await self._start()
        try:
            await self.opened()
        except BaseException:
            await self.server.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        try:
            await self.closing()
        finally:
            await self.server.stop()

    async def opened(self) -> None:
        """Connect the publisher."""

    async def closing(self) -> None:
        """Disconnect the publisher."""

    def pids(self) -> list[int]:
        assert self.server is not None
        return tree(self.server.proc.pid)

    async def publish(self, topics: list[str], k: int) -> None:
        """Message k on every topic."""
        raise NotImplementedError


def data_json(k: int) -> str:
    """The data of message k, `"t"` (the time just before its publish call) first so that
    subscribers find it at once."""
    return '{"t":%.6f,"k":%d,"p":"%s"}' % (time.time(), k, PAD)


class HarnessTarget(Target):
    """bare and local: the server process publishes each line written to its control socket."""

    async def opened(self) -> None:
        assert self.server is not None
        await self.server.connect_control()

    async def publish(self, topics: list[str], k: int) -> None:
        assert self.server is not None
        for topic in topics:
            self.server.publish_line(data_json(k), topic)
        if len(topics) > 1 or k % 16 == 0:
            await self.server.drain()
        else:
            await asyncio.sleep(0)  # let the clients' reports in


class FanoutTarget(Target):
    """`python -m livepush serve` on Postgres or Redis; published to from this process as an
    application would: `fanout.apublish()` on one topic, `fanout.apublish_many()` on several."""

    def __init__(self, name: str, start: Callable[[], Awaitable[ServerProcess]],
                 dialect: Callable[[list[str], bool], Dialect], env: dict[str, str]) -> None:
        super().__init__(name, start, dialect)
        self.env = env
        self.fanout = None

    async def opened(self) -> None:
        from livepush.config import Settings
        from livepush.fanout import from_env

        self.fanout = from_env(Settings.from_env(self.env))

    async def closing(self) -> None:
        if self.fanout is not None:
            await self.fanout.aclose()

    async def publish(self, topics: list[str], k: int) -> None:
        fanout = self.fanout
        assert fanout is not None
        if len(topics) == 1:
            await fanout.apublish(topics[0], {"t": time.time(), "k": k, "p": PAD})
            return
        # A message on every topic at once: one publish_many, as an application would send it.
        now = time.time()
        await fanout.apublish_many([(t, {"t": now, "k": k, "p": PAD}) for t in topics])


class SocketioTarget(Target):
    """python-socketio under uvicorn; a publisher process emits through its Redis manager."""

    def __init__(self, name: str, start: Callable[[], Awaitable[ServerProcess]],
                 dialect: Callable[[list[str], bool], Dialect], publisher: list[str]) -> None:
        super().__init__(name, start, dialect)
        self.command = publisher
        self.proc: asyncio.subprocess.Process | None = None

    async def opened(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(*self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 30)
        if not line.startswith(b"READY"):
            raise RuntimeError(f"the socketio publisher did not start (exit {await self.proc.wait()})")

    async def closing(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    async def publish(self, topics: list[str], k: int) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        for topic in topics:
            self.proc.stdin.write(f"{topic}\t{data_json(k)}\n".encode())
        await self.proc.stdin.drain()


class Targets:
    """Makes the targets of this run: names, how each starts, how its clients subscribe."""

    def __init__(self, env: dict[str, str], workdir: str, redis_url: str, bench_python: str | None) -> None:
        self.env = env
        self.workdir = workdir
        self.redis_url = redis_url
        self.bench_python = bench_python
        self.secret = env["LIVEPUSH_SECRET"]
        self.channel = f"socketio-bench-{secrets.token_hex(4)}"

    def livepush_dialect(self, topics: list[str], deflate: bool) -> Dialect:
        from livepush import topics as signing

        return livepush_dialect([json.dumps({"op": "subscribe", "topic": signing.sign(t, [self.secret]), "since": None,
                                             "ref": 1}) for t in topics], deflate)

    def make(self, name: str, workers: str | None = None) -> Target:
        """`bare`, `bare-deflate`, `local`, `postgres`, `redis` or `socketio`."""
        log = os.path.join(self.workdir, f"{name}-{secrets.token_hex(3)}")
        if name in ("bare", "bare-deflate", "local"):
            async def start_harness_() -> ServerProcess:
                return await asyncio.to_thread(start_harness, name, free_port(), log + ".sock", self.env, TOPIC)

            if name == "local":
                return HarnessTarget(name, start_harness_, self.livepush_dialect)
            return HarnessTarget(name, start_harness_, lambda topics, deflate: Dialect(
                path="/{topic}", topics=tuple(topics), deflate=deflate))
        if name == "socketio":
            if self.bench_python is None:
                raise RuntimeError("no bench-only virtualenv with python-socketio")
            py = self.bench_python

            async def start_socketio() -> ServerProcess:
                return await asyncio.to_thread(start_command, [py, SOCKETIO_SERVER, "serve", "{port}", self.redis_url,
                                                               self.channel], log + ".log")

            return SocketioTarget(name, start_socketio, lambda topics, deflate: Dialect(
                path=SOCKETIO_PATH, steps=(("0", "40"), ("40", '421["join","{topic}"]'), ("431", None)),
                topics=tuple(topics), message_prefix='42["msg"', pong=("2", "3"), deflate=deflate),
                [py, SOCKETIO_SERVER, "publish", self.redis_url, self.channel])
        env = dict(self.env, LIVEPUSH_FANOUT=name)
        args = ("--workers", workers) if workers else ()

        async def start_cli() -> ServerProcess:
            return await asyncio.to_thread(start_livepush_cli, free_port(), env, log + ".log", args)

        return FanoutTarget(name, start_cli, self.livepush_dialect, env)


def start_command(command: list[str], log: str) -> ServerProcess:
    """A competitor's server (`{port}` in `command` filled), ready once it prints `READY`."""
    port = free_port()
    with open(log, "wb") as err:
        proc = subprocess.Popen([c.replace("{port}", str(port)) for c in command], stdout=subprocess.PIPE, stderr=err,
                                cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("READY"):
        proc.kill()
        raise RuntimeError(f"{command[1]} did not start (exit {proc.wait()}): {open(log).read()[-500:]}")
    return ServerProcess(proc, port, None, log)


def workers_available() -> str | None:
    """None when `livepush serve` has `--workers`, else why not."""
    out = subprocess.run([sys.executable, "-m", "livepush", "serve", "--help"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    return None if "--workers" in out.stdout else "livepush serve has no --workers"


# -- measurements ----------------------------------------------------------------------
async def measure_flow(target: Target, pool: ClientPool, subscribers: int, topics: list[str], plan: Plan,
                       rate: float, throughput: bool = True) -> Run:
    """Deliveries per second and server CPU per delivery; with a `rate`, p50/p99 at that many
    messages a second first (one topic). On several topics, message k is one message on every
    topic (a round)."""
    run = Run()
    async with target:
        assert target.server is not None
        dialect = target.dialect(topics, False)
        warm, measured = (max(1, int(plan.warmup * rate)), int(plan.seconds * rate)) if rate else (0, 0)
        n = await pool.open("127.0.0.1", target.server.port, subscribers, dialect=dialect,
                            lat_from=warm + 1 if rate else 0, lat_to=warm + measured)
        if n < subscribers:
            await pool.collect()
            raise RuntimeError(f"only {n} of {subscribers} subscribers connected")
        k = 0
        if rate:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            for k in range(1, warm + measured + 1):
                delay = t0 + (k - 1) / rate - loop.time()  # an absolute schedule: no drift from publish time
                if delay > 0:
                    await asyncio.sleep(delay)
                await target.publish(topics, k)
            if not await pool.wait_through(k, timeout=30):
                raise RuntimeError(f"latency phase: subscribers got only through message {pool.through} of {k}")
        if throughput:
            await measure_throughput(target, pool, topics, plan, n, k, run)
        stats = await pool.collect()
        if stats["codes"]:
            raise RuntimeError(f"subscribers were closed: {stats['codes']}")
        if rate:
            lat = sorted(stats["lat"])
            run.p50_ms, run.p99_ms = percentile(lat, 0.5) * 1000, percentile(lat, 0.99) * 1000
    return run


async def measure_throughput(target: Target, pool: ClientPool, topics: list[str], plan: Plan, n: int, k: int,
                             run: Run) -> None:
    """Fills run's deliveries per second and CPU per delivery, from message k + 1 on."""
    # Back to back, at most IN_FLIGHT messages (or rounds) in flight: every queue stays bounded,
    # so no subscriber is closed as too slow and the figure is a sustained rate.
    window = IN_FLIGHT
    first = k
    pids = target.pids()
    each0, wall0 = cpu_each(pids), time.time()
    deadline = time.monotonic() + plan.seconds
    while time.monotonic() < deadline:
        if pool.through < k - window and not await pool.wait_through(k - window, timeout=30):
            raise RuntimeError(f"throughput phase stalled at message {pool.through}")
        k += 1
        await target.publish(topics, k)
    if not await pool.wait_through(k, timeout=60):
        raise RuntimeError(f"throughput phase: subscribers got only through message {pool.through} of {k}")
    delivered = (k - first) * n
    each = {pid: c - each0[pid] for pid, c in cpu_each(pids).items()}
    run.cpu_us = sum(each.values()) / delivered * 1e6
    run.per_core_rate = delivered / max(each.values())
    run.deliveries_per_s = delivered / (pool.delivered_at(k) - wall0)


async def measure_idle(target: Target, pool: ClientPool, n: int, deflate: bool) -> Run:
    """The server's resident memory per idle subscribed connection, and how many connections
    negotiated permessage-deflate."""
    run = Run()
    async with target:
        assert target.server is not None
        dialect = target.dialect([TOPIC], deflate)
        # A first few connections, closed again, so that what the first one loads is not counted.
        await pool.open("127.0.0.1", target.server.port, 20, dialect=dialect)
        await pool.collect()
        await asyncio.sleep(0.5)
        pids = target.pids()
        before = rss_kib(pids)
        got = await pool.open("127.0.0.1", target.server.port, n, dialect=dialect)
        await asyncio.sleep(1.0)
        after = rss_kib(pids)
        stats = await pool.collect()
        if got < n:
            raise RuntimeError(f"only {got} of {n} connections opened")
        run.kib_per_conn = (after - before) / n
        run.deflated = stats["deflated"]
    return run


async def attempt(what: str, measure: Awaitable[Run]) -> Run:
    """A measurement's result, or a Run that says why it failed (the rest of the suite goes on)."""
    report.note(f"[push] {what} ...")
    t0 = time.monotonic()
    try:
        run = await measure
    except Exception as exc:
        report.note(f"[push] {what} failed: {type(exc).__name__}: {exc}")
        return Run(error=f"{type(exc).__name__}: {exc}"[:200])
    shown = {k: round(v, 2) for k, v in dataclasses.asdict(run).items() if isinstance(v, float) and v == v}
    report.note(f"[push] {what}: {shown}" + ("" if run.deflated is None else f", deflate negotiated by {run.deflated}")
                + f" ({time.monotonic() - t0:.1f} s)")
    return run


def median_run(runs: list[Run]) -> Run:
    ok = [r for r in runs if r.error is None]
    if not ok:
        return runs[0] if runs else Run(error="not run")
    out = Run()
    for field in ("deliveries_per_s", "cpu_us", "per_core_rate", "p50_ms", "p99_ms", "kib_per_conn"):
        setattr(out, field, statistics.median(getattr(r, field) for r in ok))
    return out


# -- figures ---------------------------------------------------------------------------
class Figures:
    """Turns the runs of each target into report.Figure, livepush against a baseline."""

    def __init__(self) -> None:
        self.out: list[report.Figure] = []

    def add(self, name: str, mine: Run, base: Run, field: str, unit: str, baseline: str, *,
            higher_is_better: bool, goal: float | None) -> None:
        value = getattr(mine, field)
        if mine.error:
            name += f" (not measured: {mine.error})"
        base_value = getattr(base, field)
        if base.error:
            baseline += f" (not measured: {base.error})"
        self.out.append(report.Figure(name, value, unit, baseline, None if base_value != base_value else base_value,
                                      higher_is_better, "push", goal))


async def suite(ctx: report.Context, env: dict[str, str], plan: Plan) -> list[report.Figure]:
    targets = Targets(env, ctx.workdir, ctx.redis_url, ctx.bench_python)
    names = ["bare", *FANOUTS, "socketio"]
    figs = Figures()
    pool = ClientPool(processes=2)
    await pool.start()
    try:
        async def flow(name: str, subs: int, topics: list[str], rate: float, workers: str | None = None,
                       throughput: bool = True) -> Run:
            what = (f"{name}{' --workers ' + workers if workers else ''}, {len(topics)} topic(s) x {subs // len(topics)}"
                    f"{f', {rate:g} msg/s' if rate else ''}{'' if throughput else ', latency only'}")
            try:
                target = targets.make(name, workers)
            except RuntimeError as exc:
                return Run(error=str(exc))
            return await attempt(what, measure_flow(target, pool, subs, topics, plan, rate, throughput))

        async def medians(subs: int, topics: list[str], rate: float, once: tuple[str, ...] = ()) -> dict[str, Run]:
            """Each target's median over plan.rounds rounds, the targets interleaved in each;
            those in `once` measured in the first round only."""
            per_round = [{name: await flow(name, subs, topics, rate) for name in names if i == 0 or name not in once}
                         for i in range(plan.rounds)]
            return {name: median_run([r[name] for r in per_round if name in r]) for name in names}

        # 1 topic x 1,000: latency and deliveries.
        one = [TOPIC]
        r1000 = await medians(1000, one, RATE)
        low = {name: await flow(name, 1000, one, LOW_RATE, throughput=False) for name in ("redis", "socketio")}
        shapes = [("1 topic x 1,000 subscribers", r1000)]
        if plan.big:
            # python-socketio once: its runs take 30 to 50 s here, and it is 7x to 70x behind.
            r5000 = await medians(5000, one, 0, once=("socketio",))
            many = [f"bench:{i}" for i in range(1000)]
            r_many = await medians(5000, many, 0, once=("socketio",))
            shapes += [("1 topic x 5,000 subscribers", r5000), ("1,000 topics x 5 subscribers", r_many)]
        for shape, runs in shapes:
            for fanout, label in FANOUTS.items():
                figs.add(f"deliveries/s, {shape}, {label} fan-out", runs[fanout], runs["bare"], "deliveries_per_s",
                         "deliveries/s", BARE, higher_is_better=True, goal=GOAL_VS_BARE)
                figs.add(f"server CPU per delivery, {shape}, {label} fan-out", runs[fanout], runs["bare"], "cpu_us", "µs",
                         BARE, higher_is_better=False, goal=GOAL_VS_BARE)
            figs.add(f"deliveries/s, {shape}, Redis fan-out", runs["redis"], runs["socketio"], "deliveries_per_s",
                     "deliveries/s", SOCKETIO, higher_is_better=True, goal=GOAL_VS_SOCKETIO)
            figs.add(f"server CPU per delivery, {shape}, Redis fan-out", runs["redis"], runs["socketio"], "cpu_us", "µs",
                     SOCKETIO, higher_is_better=False, goal=None)
        if plan.big:
            for fanout, label in FANOUTS.items():
                figs.add(f"deliveries/s, 5,000 against 1,000 subscribers, {label} fan-out", r5000[fanout],
                         r1000[fanout], "deliveries_per_s", "deliveries/s", "livepush, 1,000 subscribers",
                         higher_is_better=True, goal=GOAL_5000_VS_1000)
        latency = f"{RATE:g} msg/s to 1,000 subscribers"
        for fanout, label in FANOUTS.items():
            figs.add(f"p50 publish to receive, {latency}, {label} fan-out", r1000[fanout], r1000["bare"], "p50_ms", "ms",
                     BARE, higher_is_better=False, goal=None)
            figs.add(f"p99 publish to receive, {latency}, {label} fan-out", r1000[fanout], r1000["bare"], "p99_ms", "ms",
                     BARE, higher_is_better=False, goal=GOAL_P99_VS_BARE)
        for rate, runs in ((RATE, r1000), (LOW_RATE, low)):
            for pct, goal in (("p50", None), ("p99", GOAL_P99_VS_SOCKETIO)):
                figs.add(f"{pct} publish to receive, {rate:g} msg/s to 1,000 subscribers, Redis fan-out", runs["redis"],
                         runs["socketio"], f"{pct}_ms", "ms", SOCKETIO, higher_is_better=False, goal=goal)

        await idle_figures(figs, targets, pool, plan, names)
        if plan.big:
            await workers_figures(figs, flow, r1000["bare"], plan.rounds)
    finally:
        await pool.close()
    return figs.out


async def idle_figures(figs: Figures, targets: Targets, pool: ClientPool, plan: Plan, names: list[str]) -> None:
    """Memory per idle connection, plain and with the browser's deflate offer."""
    async def idle(name: str, deflate: bool) -> Run:
        what = f"{name}, {plan.idle:,} idle connections{', deflate offered' if deflate else ''}"
        try:
            target = targets.make(name)
        except RuntimeError as exc:
            return Run(error=str(exc))
        return await attempt(what, measure_idle(target, pool, plan.idle, deflate))

    n = f"{plan.idle:,} connections"
    # The deflate offer on one fan-out: what livepush answers it does not depend on the fan-out.
    for deflate, fanouts in ((False, plan.idle_fanouts), (True, ("redis",))):
        runs = {name: await idle("bare-deflate" if deflate and name == "bare" else name, deflate)
                for name in names if name not in FANOUTS or name in fanouts}
        for fanout, baseline in [(f, "bare") for f in fanouts] + [("redis", "socketio")]:
            if fanout not in runs:
                continue
            if deflate:
                what = (f"deflate offered (livepush {deflate_answer(runs[fanout])}, {baseline} "
                        f"{deflate_answer(runs[baseline])}), {n}, {FANOUTS[fanout]} fan-out")
                target = TARGET_IDLE_DEFLATE_KIB
            else:
                what, target = f"{n}, {FANOUTS[fanout]} fan-out", TARGET_IDLE_KIB
            figs.add(f"memory per idle connection, {what} (target {'<' if deflate else '<='} {target} KiB)",
                     runs[fanout], runs[baseline], "kib_per_conn", "KiB", BARE if baseline == "bare" else SOCKETIO,
                     higher_is_better=False, goal=None)


def deflate_answer(run: Run) -> str:
    """What the server did with the deflate offer."""
    if run.deflated is None:
        return "?"
    return "declines" if run.deflated == 0 else "accepts"


async def workers_figures(figs: Figures, flow: Callable[..., Awaitable[Run]], bare: Run, rounds: int) -> None:
    """Deliveries with `serve --workers N`, against the same run's bare server: medians over
    `rounds` rounds, the worker counts interleaved in each (a single round's ratio of 2 workers
    to 1 moved by 0.1 from run to run)."""
    why = await asyncio.to_thread(workers_available)
    if why:  # one line in the report, not one per figure
        figs.add("deliveries/s, 1 topic x 1,000 subscribers, --workers 1, 2, auto", Run(error=why), bare,
                 "deliveries_per_s", "deliveries/s", BARE, higher_is_better=True, goal=GOAL_VS_BARE)
        return
    for fanout in ("postgres", "redis"):
        label = FANOUTS[fanout]
        counts = ("1", "2", "auto")
        per_round = [{workers: await flow(fanout, 1000, [TOPIC], 0, workers) for workers in counts}
                     for _ in range(rounds)]
        runs = {workers: median_run([r[workers] for r in per_round]) for workers in counts}
        for workers in counts:
            run = runs[workers]
            shape = f"1 topic x 1,000 subscribers, --workers {workers}, {label} fan-out"
            figs.add(f"deliveries/s, {shape}", run, bare, "deliveries_per_s", "deliveries/s", BARE,
                     higher_is_better=True, goal=GOAL_VS_BARE)
            figs.add(f"server CPU per delivery (all workers), {shape}", run, bare, "cpu_us", "µs", BARE,
                     higher_is_better=False, goal=GOAL_VS_BARE)
        for workers in ("2", "auto"):
            figs.add(f"deliveries/s with a core per worker (busiest worker's CPU), 1 topic x 1,000 subscribers, "
                     f"--workers {workers}, {label} fan-out", runs[workers], runs["1"], "per_core_rate",
                     "deliveries/s", "--workers 1", higher_is_better=True,
                     goal=GOAL_WORKERS_PER_CORE if workers == "2" else None)


# -- entry points ----------------------------------------------------------------------
def figures(ctx: report.Context) -> list[report.Figure]:
    """The push suite's figures, on a scratch database of ctx's server and ctx's Redis."""
    raise_fd_limit()
    db = f"livepush_push_{secrets.token_hex(4)}"
    url = make_db(ctx.pg_admin_url, db)
    try:
        migrate(url)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEPUSH_") and k != "DATABASE_URL"}
        env.update(LIVEPUSH_SECRET=secrets.token_urlsafe(48), LIVEPUSH_DATABASE_URL=url, LIVEPUSH_REDIS_URL=ctx.redis_url,
                   LIVEPUSH_REDIS_PREFIX=f"pushbench-{secrets.token_hex(4)}")
        try:
            import uvloop

            return uvloop.run(suite(ctx, env, Plan.of(ctx.quick)))
        except ImportError:
            return asyncio.run(suite(ctx, env, Plan.of(ctx.quick)))
    finally:
        drop_db(ctx.pg_admin_url, db)


def main() -> None:
    from _services import Services

    p = argparse.ArgumentParser(description="The push suite alone, on a throwaway PostgreSQL and Redis.")
    p.add_argument("--quick", action="store_true", help="1 round, 2 s phases, 1,000 idle connections, no 5,000-connection figures")
    args = p.parse_args()
    services = Services()
    workdir = tempfile.mkdtemp(prefix="livepush-push-suite-")
    bench_python = os.path.join(ROOT, ".venv-bench", "bin", "python")
    try:
        ctx = report.Context(services.start_postgres(), services.start_redis(), args.quick, workdir,
                             bench_python if os.path.exists(bench_python) else None)
        t0 = time.monotonic()
        out = figures(ctx)
        print(report.table(out))
        print(f"({time.monotonic() - t0:.0f} s)")
    finally:
        services.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
