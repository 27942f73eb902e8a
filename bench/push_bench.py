#!/usr/bin/env python
"""Push benchmark: 1,000 subscribers on one topic, each fan-out against a bare
`websockets` broadcast server measured in the same run as the ceiling.

    .venv/bin/python bench/push_bench.py [--subscribers 1000] [--seconds 5]
        [--fanouts local,postgres,redis] [--pg-url URL] [--redis-url URL]

For every target (bare first, then each fan-out) on a fresh server process:
1. latency: messages at `--rate` a second (default 20, i.e. 20,000 deliveries a second to
   1,000 subscribers) for `--seconds`, after `--warmup` seconds not counted. Each message
   carries `time.time()` taken just before the publish call; a subscriber subtracts it from
   the clock read when the frame arrived. p50/p99/max are over every delivery.
2. throughput: messages published back to back for `--seconds`, with at most `--window`
   messages in flight (published, not yet received by every subscriber) so no queue grows
   without bound and no subscriber is dropped as too slow. deliveries/s = messages x
   subscribers / (last subscriber's receipt of the last message - first publish).

Where the publisher runs: bare and local publish inside the server process (the local
fan-out cannot cross processes; the benchmark hands each message to the server over a Unix
socket, so both carry the same extra hop). postgres and redis run the real
`python -m livepush serve`, and the benchmark publishes with `fanout.apublish()` from its
own process, as an application would. Messages are ~200 bytes of JSON data.

Without --pg-url / --redis-url, a throwaway PostgreSQL and Redis are started in a temp dir
and stopped at the end. On a shared machine pass explicit --pg-port/--redis-port/--ws-port.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _clients import ClientPool, raise_fd_limit  # noqa: E402
from _services import Services, free_port, migrate, redis_fanout_available  # noqa: E402
from _servers import ServerProcess, start_harness, start_livepush_cli  # noqa: E402

TOPIC = "bench:x"
GOAL_DELIVERIES = 0.9  # of the ceiling's deliveries per second
GOAL_P99 = 1.2  # times the ceiling's p99


@dataclass
class Result:
    name: str
    error: str | None = None
    subscribers: int = 0
    deliveries_per_s: float = 0.0
    messages_per_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    samples: int = 0
    lost: int = 0
    closed: dict = field(default_factory=dict)
    server_cpu: float = 0.0  # server process CPU seconds per wall second, throughput phase
    cpu_us_per_delivery: float = 0.0  # server process CPU per delivery, throughput phase


def data_json(k: int, pad: str) -> str:
    """~200 bytes of JSON; "t" first so subscribers find it at once."""
    return '{"t":%.6f,"k":%d,"p":"%s"}' % (time.time(), k, pad)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class Publisher:
    """Publishes one message, wherever the target wants it published."""

    def __init__(self, server: ServerProcess, fanout=None) -> None:
        self.server = server
        self.fanout = fanout
        self.count = 0

    async def publish(self, k: int, pad: str) -> None:
        if self.fanout is None:
            self.server.publish_line(data_json(k, pad))
            if k % 16 == 0:
                await self.server.drain()
            else:
                await asyncio.sleep(0)  # let the clients' reports in
        else:
            await self.fanout.apublish(TOPIC, json.loads(data_json(k, pad)))

    async def aclose(self) -> None:
        if self.fanout is not None:
            await self.fanout.aclose()


async def run_target(kind: str, args: argparse.Namespace, pool: ClientPool, port: int, env: dict[str, str], logdir: str) -> Result:
    from livepush import topics
    from livepush.config import Settings
    from livepush.fanout import from_env

    result = Result(kind)
    secret = env["LIVEPUSH_SECRET"]
    pad = "x" * max(0, args.size - 50)
    if kind in ("bare", "local"):
        server = start_harness(kind, port, os.path.join(logdir, f"{kind}.sock"), env, TOPIC)
        await server.connect_control()
        publisher = Publisher(server)
    else:
        child_env = dict(env, LIVEPUSH_FANOUT=kind)
        server = await asyncio.to_thread(start_livepush_cli, port, child_env, os.path.join(logdir, f"{kind}.log"))
        settings = Settings(secret=secret, fanout=kind, database_url=env.get("LIVEPUSH_DATABASE_URL"), redis_url=env.get("LIVEPUSH_REDIS_URL"))
        publisher = Publisher(server, from_env(settings))
    try:
        subscribe = None
        if kind != "bare":
            subscribe = json.dumps({"op": "subscribe", "topic": topics.sign(TOPIC, [secret]), "since": None, "ref": 1})
        warm = max(1, int(args.warmup * args.rate))
        measured = int(args.seconds * args.rate)
        n = await pool.open("127.0.0.1", server.port, args.subscribers, subscribe=subscribe, lat_from=warm + 1, lat_to=warm + measured)
        result.subscribers = n
        if n == 0:
            raise RuntimeError("no subscriber could connect")

        # 1. latency at a fixed rate, on an absolute schedule (no drift from publish time).
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for k in range(1, warm + measured + 1):
            delay = t0 + (k - 1) / args.rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await publisher.publish(k, pad)
        last = warm + measured
        if not await pool.wait_through(last, timeout=30):
            raise RuntimeError(f"latency phase: subscribers got only through message {pool.through} of {last}")

        # 2. throughput: back to back, at most `window` messages in flight.
        first = last
        cpu0 = cpu_seconds(server.proc.pid)
        wall0 = time.time()
        deadline = time.monotonic() + args.seconds
        k = first
        while time.monotonic() < deadline:
            if pool.through < k - args.window and not await pool.wait_through(k - args.window, timeout=30):
                raise RuntimeError(f"throughput phase stalled at message {pool.through}")
            k += 1
            await publisher.publish(k, pad)
        await server.drain()
        if not await pool.wait_through(k, timeout=60):
            raise RuntimeError(f"throughput phase: subscribers got only through message {pool.through} of {k}")
        wall = pool.delivered_at(k) - wall0
        cpu = cpu_seconds(server.proc.pid) - cpu0
        result.server_cpu = cpu / (time.time() - wall0)
        result.cpu_us_per_delivery = cpu / ((k - first) * n) * 1e6
        result.messages_per_s = (k - first) / wall
        result.deliveries_per_s = (k - first) * n / wall

        stats = await pool.collect()
        result.lost = n * k - stats["frames"]
        result.closed = stats["codes"]
        lat = sorted(stats["lat"])
        result.samples = len(lat)
        result.p50_ms = percentile(lat, 0.50) * 1000
        result.p99_ms = percentile(lat, 0.99) * 1000
        result.max_ms = lat[-1] * 1000 if lat else float("nan")
        return result
    finally:
        await publisher.aclose()
        await server.stop()


def median_result(name: str, runs: list[Result]) -> Result:
    ok = [r for r in runs if not r.error]
    if not ok:
        return runs[-1] if runs else Result(name, error="not run")
    med = Result(name, subscribers=min(r.subscribers for r in ok))
    for attr in ("deliveries_per_s", "messages_per_s", "p50_ms", "p99_ms", "max_ms", "server_cpu", "cpu_us_per_delivery"):
        setattr(med, attr, statistics.median(getattr(r, attr) for r in ok))
    med.lost = sum(r.lost for r in ok)
    for r in ok:
        for code, count in r.closed.items():
            med.closed[code] = med.closed.get(code, 0) + count
    if len(ok) < len(runs):
        med.error = None
        med.name = f"{name}*"
    return med


def round_ratios(rounds: list[dict[str, Result]], name: str) -> tuple[float, float] | None:
    """Median over rounds of (deliveries, p99) relative to the same round's bare ceiling."""
    pairs = [(r[name], r["bare"]) for r in rounds if name in r and "bare" in r and not r[name].error and not r["bare"].error]
    if not pairs:
        return None
    return (statistics.median(a.deliveries_per_s / b.deliveries_per_s for a, b in pairs),
            statistics.median(a.p99_ms / b.p99_ms for a, b in pairs))


def print_row(r: Result, ratios: tuple[float, float] | None, ceiling: bool) -> None:
    if r.error:
        print(f"{r.name:<10} {'n/a':>5}  {r.error}")
        return
    verdict = ""
    if ceiling:
        rd, rp, verdict = "1.00x", "1.00x", "ceiling"
    elif ratios is None:
        rd = rp = "-"
    else:
        ratio_d, ratio_p = ratios
        rd, rp = f"{ratio_d:.2f}x", f"{ratio_p:.2f}x"
        misses = [x for x, bad in (("deliveries", ratio_d < GOAL_DELIVERIES), ("p99", ratio_p > GOAL_P99)) if bad]
        verdict = "MISSES " + " and ".join(misses) if misses else "meets goals"
    extra = f"  (lost {r.lost} frames, close codes {r.closed})" if r.lost or r.closed else ""
    print(f"{r.name:<10} {r.subscribers:>5} {r.deliveries_per_s:>13,.0f} {r.messages_per_s:>7.1f} {rd:>8} "
          f"{r.p50_ms:>7.1f} {r.p99_ms:>7.1f} {r.max_ms:>7.1f} {rp:>11} {r.server_cpu:>6.0%} {r.cpu_us_per_delivery:>7.1f}  {verdict}{extra}")


HEADER = (f"{'target':<10} {'subs':>5} {'deliveries/s':>13} {'msg/s':>7} {'vs bare':>8} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'max ms':>7} {'p99 vs bare':>11} {'srv cpu':>7} {'us/dlv':>7}  verdict")


def print_table(rounds: list[dict[str, Result]], targets: list[str], args: argparse.Namespace) -> None:
    print()
    print(f"{args.subscribers} subscribers on one topic, {args.size}-byte messages; latency at {args.rate:g} msg/s "
          f"({args.rate * args.subscribers:,.0f} deliveries/s); {args.seconds:g} s per phase; window {args.window}; "
          f"{len(rounds)} round(s), targets interleaved")
    if len(rounds) > 1:
        print("\nper round:")
        print(HEADER)
        for i, rnd in enumerate(rounds, 1):
            for name in targets:
                if name in rnd:
                    r = rnd[name]
                    print_row(Result(**{**r.__dict__, "name": f"{name}#{i}"}),
                              round_ratios([rnd], name) if name != "bare" else None, name == "bare")
        print("\nmedian over rounds (ratios: median of each round's ratio to that round's bare):")
    print(HEADER)
    print("-" * len(HEADER))
    for name in targets:
        med = median_result(name, [rnd[name] for rnd in rounds if name in rnd])
        print_row(med, round_ratios(rounds, name) if name != "bare" else None, name == "bare")
    print(f"goals: deliveries/s >= {GOAL_DELIVERIES}x bare, p99 <= {GOAL_P99}x bare's. srv cpu: server process CPU "
          "during the throughput phase (100% = one core); us/dlv: its CPU microseconds per delivery.")


async def run_round(
    round_no: int, targets: list[str], skipped: dict[str, str], args: argparse.Namespace,
    pool: ClientPool, env: dict[str, str], logdir: str,
) -> dict[str, Result]:
    results: dict[str, Result] = {}
    for i, kind in enumerate(targets):
        if kind in skipped:
            results[kind] = Result(kind, error=skipped[kind])
            continue
        port = free_port(args.ws_port + i if args.ws_port else 0)
        print(f"[round {round_no}, {kind}] on port {port} ...", file=sys.stderr, flush=True)
        # A target that fails (e.g. the Redis fan-out still in the works) is reported, not fatal.
        try:
            result = await run_target(kind, args, pool, port, env, logdir)
        except Exception as exc:
            result = Result(kind, error=f"{type(exc).__name__}: {exc}")
            log = os.path.join(logdir, f"{kind}.sock.log" if kind in ("bare", "local") else f"{kind}.log")
            if os.path.exists(log):
                print(f"[{kind}] server log tail:\n" + "".join(open(log, errors="replace").readlines()[-8:]), file=sys.stderr)
            with contextlib.suppress(Exception):
                await pool.collect()
        results[kind] = result
        if not result.error:
            print(f"  {result.deliveries_per_s:,.0f} deliveries/s, p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms",
                  file=sys.stderr, flush=True)
    return results


async def amain(args: argparse.Namespace) -> int:
    raise_fd_limit()
    fanouts = [f.strip() for f in args.fanouts.split(",") if f.strip()]
    unknown = set(fanouts) - {"local", "postgres", "redis"}
    if unknown:
        raise SystemExit(f"unknown fan-outs {sorted(unknown)}: use local, postgres, redis")
    services = Services()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEPUSH_") and k != "DATABASE_URL"}
    env["LIVEPUSH_SECRET"] = secrets.token_urlsafe(48)
    env["LIVEPUSH_CORE"] = args.core
    rounds: list[dict[str, Result]] = []
    skipped: dict[str, str] = {}
    pool = ClientPool(args.processes, source=args.client_source or None)
    logdir = tempfile.mkdtemp(prefix="livepush-push-bench-")
    try:
        if "redis" in fanouts:
            why = redis_fanout_available()
            if why:
                skipped["redis"] = f"livepush's Redis fan-out is not available ({why})"
            else:
                env["LIVEPUSH_REDIS_URL"] = args.redis_url or services.start_redis(args.redis_port)
        if "postgres" in fanouts:
            url = args.pg_url or services.start_postgres(args.pg_port, durable=not args.pg_no_fsync)
            await asyncio.to_thread(migrate, url)
            env["LIVEPUSH_DATABASE_URL"] = url
        await pool.start()
        targets = ["bare", *fanouts]
        for round_no in range(1, args.rounds + 1):
            rounds.append(await run_round(round_no, targets, skipped, args, pool, env, logdir))
        print_table(rounds, targets, args)
    finally:
        await pool.close()
        services.stop()
        for name in os.listdir(logdir):
            os.unlink(os.path.join(logdir, name))
        os.rmdir(logdir)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--subscribers", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=5.0, help="length of each phase (latency, throughput)")
    p.add_argument("--fanouts", default="local,postgres,redis", help="comma-separated; the bare ceiling always runs")
    p.add_argument("--pg-url", help="a migrated-or-migratable database (default: a throwaway cluster)")
    p.add_argument("--redis-url", help="default: a throwaway redis-server")
    p.add_argument("--pg-no-fsync", action="store_true",
                   help="run the throwaway PostgreSQL with fsync=off (default: Postgres' durable defaults)")
    p.add_argument("--pg-port", type=int, default=0, help="port for the throwaway PostgreSQL (0: any free)")
    p.add_argument("--redis-port", type=int, default=0, help="port for the throwaway Redis (0: any free)")
    p.add_argument("--ws-port", type=int, default=0, help="first WebSocket server port; targets use consecutive ports")
    p.add_argument("--core", choices=("classic", "lean"), default="classic",
                   help="the connection core of the livepush targets (LIVEPUSH_CORE)")
    p.add_argument("--rounds", type=int, default=3, help="rounds over all targets, interleaved against drift")
    p.add_argument("--rate", type=float, default=20.0, help="messages per second in the latency phase")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds at --rate before latency is recorded")
    p.add_argument("--window", type=int, default=50, help="messages in flight in the throughput phase")
    p.add_argument("--size", type=int, default=200, help="bytes of JSON data per message")
    p.add_argument("--processes", type=int, default=2, help="client processes the subscribers are spread over")
    p.add_argument("--client-source", default="127.0.0.2",
                   help="source address of the subscribers' sockets, so their ports never clash with servers on 127.0.0.1")
    return p.parse_args(argv)


def main() -> int:
    args = parse_args()
    try:
        import uvloop

        return uvloop.run(amain(args))
    except ImportError:
        return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
