"""A bounded soak test: mixed load on real `livepush serve` and `livepush jobs` processes while
Postgres, Redis, the servers' LISTEN backends and the job runtimes are broken on a schedule.

    .venv/bin/python bench/soak.py --minutes 3            # quick
    .venv/bin/python bench/soak.py --minutes 30 --fanout both --keep-logs /some/dir

What runs (all child processes of this script, stopped at the end, also on Ctrl-C):
- a throwaway PostgreSQL and Redis (bench/_services.py);
- `--servers` `livepush serve` processes per fan-out (Postgres, Redis or both), each with the
  database URL too (job state topics and revocations live there);
- two `livepush jobs soak_jobs` runtimes (bench/soak_jobs.py: each run writes a row);
- one publisher process per fan-out calling livepush.publish() (`--rate` messages a second in
  all, over `--topics` topics per fan-out);
- `--clients` `websockets` clients in two processes, each on one server and two topics, that
  reconnect and resume with `since` like the JS client and refetch on `reset`;
- this process: enqueues `--jobs-rate` jobs a second, injects the faults, measures each heal with
  one probe client per server (and a probe job), and checks the ledgers at the end.

A heal is timed from the fault until every affected server answers GET /healthz 200 and a probe
message published after the fault reached that server's probe client (and, for faults that touch
jobs, a job enqueued after the fault finished, as did the jobs a killed runtime had in hand).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from collections import Counter, defaultdict
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import psycopg  # noqa: E402

from _services import Services, _as_postgres, _pg_bin, free_port, migrate  # noqa: E402

SECRET = "soak-secret-" + "x" * 32
HEAL_GOAL, HEAL_FAIL, HEAL_GIVE_UP = 5.0, 30.0, 60.0
PROBE_EVERY = 0.1
LISTENER_APP = "livepush-listener"  # the application_name of every livepush LISTEN connection
CHILDREN = os.path.join(HERE, "_soak_children.py")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- child processes --------------------------------------------------------------------
@dataclass
class Child:
    """A server or runtime process, restarted the same way after a fault."""

    name: str
    argv: list[str]
    env: dict[str, str]
    logs: str
    port: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    expected_down: bool = False
    starts: int = 0
    unexpected_exits: list[str] = field(default_factory=list)

    @property
    def log_path(self) -> str:
        return os.path.join(self.logs, f"{self.name}.log")

    def start(self) -> None:
        self.starts += 1
        with open(self.log_path, "ab") as err:
            err.write(f"\n==== soak: start #{self.starts} at {time.strftime('%H:%M:%S')} ====\n".encode())
            err.flush()
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=ROOT, stdout=err, stderr=err)

    async def wait_exit(self, timeout: float) -> int | None:
        assert self.proc is not None
        try:
            return await asyncio.to_thread(self.proc.wait, timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


async def http_status(port: int, path: str = "/healthz", timeout: float = 1.0) -> int:
    """The status of a GET, or 0 when the server does not answer."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            line = await asyncio.wait_for(reader.readline(), timeout)
            return int(line.split()[1])
        finally:
            writer.close()
    except (OSError, asyncio.TimeoutError, ValueError, IndexError):
        return 0


async def wait_healthy(children: list[Child], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = await asyncio.gather(*(http_status(c.port) for c in children))  # type: ignore[arg-type]
        if all(code == 200 for code in codes):
            return True
        await asyncio.sleep(0.1)
    return False


# -- probes: one client per server, and probe jobs ----------------------------------------
class Probe:
    """A `websockets` client on one server's probe topic; it keeps the newest probe number heard."""

    def __init__(self, server: Child, topic: str, signed: str) -> None:
        self.server = server
        self.topic = topic
        self.signed = signed
        self.newest = -1
        self.last: str | None = None
        self.heard = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        from websockets.asyncio.client import connect

        failures = 0
        while True:
            try:
                async with connect(f"ws://127.0.0.1:{self.server.port}/", open_timeout=5, close_timeout=1,
                                   compression=None, ping_interval=5, ping_timeout=5) as ws:
                    await ws.recv()  # hello
                    await ws.send(json.dumps({"op": "subscribe", "topic": self.signed, "since": self.last, "ref": 1}))
                    failures = 0
                    async for raw in ws:
                        frame = json.loads(raw)
                        if frame.get("op") == "message":
                            self.last = frame["offset"]
                            self.newest = max(self.newest, frame["data"]["n"])
                            self.heard.set()
                        elif frame.get("op") == "subscribed" and frame.get("offset"):
                            self.last = frame["offset"]
                        elif frame.get("op") == "refused":
                            await asyncio.sleep(0.5)
                            await ws.send(json.dumps({"op": "subscribe", "topic": self.signed, "since": self.last, "ref": 1}))
            except asyncio.CancelledError:
                raise
            except Exception:
                pass
            failures += 1
            await asyncio.sleep(min(5.0, 0.1 * 2 ** (failures - 1)) * random.uniform(0.5, 1.5))


@dataclass
class Fault:
    kind: str
    at: float  # time.time() of the injection
    heal: float | None = None  # seconds, None: not healed within HEAL_GIVE_UP
    parts: dict[str, float] = field(default_factory=dict)  # when each condition held, seconds after `at`
    notes: list[str] = field(default_factory=list)


# -- the soak -------------------------------------------------------------------------------
class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.services = Services()
        self.tmp = tempfile.mkdtemp(prefix="livepush-soak-")
        self.logs = os.path.join(self.tmp, "logs")
        os.makedirs(self.logs)
        self.fanouts = ["postgres", "redis"] if args.fanout == "both" else [args.fanout]
        self.servers: dict[str, list[Child]] = {}
        self.runtimes: list[Child] = []
        self.publishers: list[asyncio.subprocess.Process] = []
        self.client_procs: list[asyncio.subprocess.Process] = []
        self.client_status: dict[int, tuple[int, int, int]] = {}
        self.client_outputs: list[str] = []
        self.probes: list[Probe] = []
        self.probe_fanouts: dict[str, object] = {}
        self.probe_n = 0
        # ledgers
        # topic -> (offset, k, time of the call, time it returned)
        self.published: dict[str, list[tuple[str, int, float, float]]] = defaultdict(list)
        self.publish_raised = 0
        self.publish_errors: Counter[str] = Counter()
        self.jobs_enqueued: dict[int, int] = {}  # job id -> seq
        self.enqueue_raised = 0
        self.enqueue_errors: Counter[str] = Counter()
        self.faults: list[Fault] = []
        self.problems: list[str] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    # -- set-up -----------------------------------------------------------------------------
    def log_to_file(self) -> None:
        """This process's own log lines (psycopg_pool's warnings in an outage) go to soak.log."""
        import logging

        logging.basicConfig(level=logging.WARNING, filename=os.path.join(self.logs, "soak.log"), force=True,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEPUSH_")}
        env.update(LIVEPUSH_SECRET=SECRET, LIVEPUSH_DATABASE_URL=self.pg_url, LIVEPUSH_HISTORY_TTL="300",
                   PYTHONPATH=HERE + os.pathsep + env.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
        return env

    def fanout_env(self, fanout: str) -> dict[str, str]:
        env = self.base_env()
        env["LIVEPUSH_FANOUT"] = fanout
        if fanout == "redis":
            env["LIVEPUSH_REDIS_URL"] = self.redis_url
        return env

    async def start(self) -> None:
        a = self.args
        self.log_to_file()
        self.pg_url = self.services.start_postgres(a.pg_port, settings={"max_connections": "300"})
        self.redis_url = self.services.start_redis(a.redis_port) if "redis" in self.fanouts else ""
        # Before the first connection: livepush reads this process's settings once, on first use
        # (a connection's options are among them), and sign_topic() needs the secret in them.
        os.environ.update(LIVEPUSH_SECRET=SECRET, LIVEPUSH_DATABASE_URL=self.pg_url)
        migrate(self.pg_url)
        from soak_jobs import RUNS_TABLE

        with psycopg.connect(self.pg_url, autocommit=True) as c:
            c.execute(RUNS_TABLE)
        log(f"PostgreSQL {self.pg_url}, Redis {self.redis_url or '-'}; logs in {self.logs}")

        for fanout in self.fanouts:
            self.servers[fanout] = []
            for i in range(a.servers):
                port = free_port()
                env = {**self.fanout_env(fanout), "LIVEPUSH_PORT": str(port)}
                child = Child(f"serve-{fanout[:2]}{i}", [sys.executable, "-m", "livepush", "serve"], env, self.logs, port)
                child.start()
                self.servers[fanout].append(child)
        for i in range(a.runtimes):
            child = Child(f"jobs-{i}", [sys.executable, "-m", "livepush", "jobs", "soak_jobs", "--concurrency", "10",
                                        "--shutdown-timeout", "5"], self.base_env(), self.logs)
            child.start()
            self.runtimes.append(child)
        if not await wait_healthy(self.all_servers, 30):
            raise SystemExit("the servers did not answer /healthz 200 within 30 s: see " + self.logs)

        import livepush
        from livepush.fanout.postgres import PostgresFanOut

        self.probe_fanouts["postgres"] = PostgresFanOut(self.pg_url)
        if "redis" in self.fanouts:
            from livepush.fanout.redis import RedisFanOut

            self.probe_fanouts["redis"] = RedisFanOut(self.redis_url)
        for fanout, servers in self.servers.items():
            topic = f"soak:probe:{fanout[:2]}"
            for server in servers:
                probe = Probe(server, topic, livepush.sign_topic(topic, ttl=None))
                probe.task = asyncio.create_task(probe.run())
                self.probes.append(probe)
        await self.start_clients()

    @property
    def all_servers(self) -> list[Child]:
        return [s for servers in self.servers.values() for s in servers]

    def topics(self, fanout: str) -> list[str]:
        return [f"soak:{fanout[:2]}:{i}" for i in range(self.args.topics)]

    async def start_clients(self) -> None:
        import livepush

        signed = {t: livepush.sign_topic(t, ttl=None) for f in self.fanouts for t in self.topics(f)}
        procs: list[list[dict]] = [[] for _ in range(self.args.client_processes)]
        for i in range(self.args.clients):
            fanout = self.fanouts[i % len(self.fanouts)]
            servers = self.servers[fanout]
            server = servers[(i // len(self.fanouts)) % len(servers)]
            names = self.topics(fanout)
            chosen = {names[(i * 7) % len(names)], names[(i * 7 + 3) % len(names)]}
            procs[i % len(procs)].append({"id": i, "url": f"ws://127.0.0.1:{server.port}/",
                                          "topics": [{"topic": t, "signed": signed[t]} for t in sorted(chosen)]})
        for j, clients in enumerate(procs):
            spec = os.path.join(self.tmp, f"clients-{j}.json")
            with open(spec, "w") as f:
                json.dump({"clients": clients}, f)
            out = os.path.join(self.tmp, f"clients-{j}.out.json")
            self.client_outputs.append(out)
            err = open(os.path.join(self.logs, f"clients-{j}.log"), "wb")
            proc = await asyncio.create_subprocess_exec(sys.executable, CHILDREN, "clients", spec, out, cwd=ROOT,
                                                        stdout=asyncio.subprocess.PIPE, stderr=err, env=self.base_env())
            err.close()
            self.client_procs.append(proc)
            self._tasks.append(asyncio.create_task(self.read_client_status(j, proc)))
        deadline = time.monotonic() + 60
        pairs = connected = 0
        while time.monotonic() < deadline:
            pairs = sum(s[1] for s in self.client_status.values())
            connected = sum(s[2] for s in self.client_status.values())
            if len(self.client_status) == len(procs) and connected == self.args.clients and pairs:
                break
            await asyncio.sleep(0.2)
        else:
            raise SystemExit(f"only {connected} of {self.args.clients} clients connected within 60 s")
        await asyncio.sleep(2)  # their subscriptions are confirmed before the first publish
        log(f"{self.args.clients} clients connected, {pairs} subscriptions")

    async def read_client_status(self, j: int, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            parts = line.split()
            if parts and parts[0] == b"S":
                self.client_status[j] = (int(parts[1]), int(parts[2]), int(parts[3]))

    async def start_publishers(self) -> None:
        per = self.args.rate / len(self.fanouts)
        for i, fanout in enumerate(self.fanouts):
            err = open(os.path.join(self.logs, f"publisher-{fanout}.log"), "wb")
            proc = await asyncio.create_subprocess_exec(
                sys.executable, CHILDREN, "publisher", str(i + 1), str(per), ",".join(self.topics(fanout)), cwd=ROOT,
                stdout=asyncio.subprocess.PIPE, stderr=err, env=self.fanout_env(fanout))
            err.close()
            self.publishers.append(proc)
            self._tasks.append(asyncio.create_task(self.read_publisher(proc)))

    async def read_publisher(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            parts = line.decode().split()
            if parts[0] == "P":
                self.published[parts[1]].append((parts[2], int(parts[3]), float(parts[4]), float(parts[5])))
            elif parts[0] == "E":
                self.publish_raised += 1
                self.publish_errors[parts[3]] += 1

    # -- jobs -------------------------------------------------------------------------------
    async def enqueue_loop(self) -> None:
        from soak_jobs import work

        seq = 0
        interval = 1.0 / self.args.jobs_rate
        due = time.monotonic()
        while not self._stopping:
            seq += 1
            while not self._stopping:
                try:
                    handle = await asyncio.wait_for(work.aenqueue(seq, random.uniform(0, 0.3)), 10)
                    self.jobs_enqueued[handle.id] = seq
                    break
                except Exception as exc:
                    self.enqueue_raised += 1
                    self.enqueue_errors[type(exc).__name__] += 1
                    await asyncio.sleep(0.1)
            due = max(due + interval, time.monotonic() - 1.0)
            await asyncio.sleep(max(0.0, due - time.monotonic()))

    async def probe_job(self, deadline: float) -> float | None:
        """Enqueue a job now (retrying while Postgres is away); when it finished, or None."""
        from soak_jobs import work

        handle = None
        while handle is None and time.monotonic() < deadline:
            try:
                handle = await asyncio.wait_for(work.aenqueue(-1, 0.0), 5)
            except Exception:
                await asyncio.sleep(PROBE_EVERY)
        if handle is None:
            return None
        self.jobs_enqueued[handle.id] = -1
        return await self.jobs_finished([handle.id], deadline)

    async def jobs_finished(self, ids: list[int], deadline: float) -> float | None:
        from livepush import jobs

        left = set(ids)
        while left and time.monotonic() < deadline:
            for job_id in list(left):
                try:
                    info = await asyncio.wait_for(jobs.aget_job(job_id), 5)
                except Exception:
                    continue
                if info is not None and info.state in ("succeeded", "failed", "cancelled"):
                    left.discard(job_id)
            if left:
                await asyncio.sleep(PROBE_EVERY)
        return time.time() if not left else None

    # -- faults -----------------------------------------------------------------------------
    def schedule(self) -> list[str]:
        kinds = ["pg_restart_fast", "pg_listener_kill", "runtime_kill9", "runtime_sigterm", "server_restart"]
        if "redis" in self.fanouts:
            kinds.insert(2, "redis_restart")
        span = self.args.minutes * 60 - self.args.warmup - self.args.cooldown
        count = max(len(kinds) + 1, int(span // self.args.fault_every))
        plan = [kinds[i % len(kinds)] for i in range(count - 1)]
        plan.insert(min(len(plan), len(kinds)), "pg_restart_immediate")  # once, after one of each
        return plan

    async def run_faults(self, plan: list[str], end: float) -> None:
        gap = (end - time.monotonic()) / len(plan)
        for i, kind in enumerate(plan):
            start = time.monotonic()
            fault = await self.inject(kind, i)
            self.faults.append(fault)
            shown = f"{fault.heal:.2f} s" if fault.heal is not None else f"NOT HEALED in {HEAL_GIVE_UP:.0f} s"
            parts = ", ".join(f"{k} {v:.2f}" for k, v in fault.parts.items())
            log(f"fault {i + 1}/{len(plan)} {kind}: healed in {shown} ({parts}){' ' + '; '.join(fault.notes) if fault.notes else ''}")
            await asyncio.sleep(max(0.0, start + gap - time.monotonic()))

    async def inject(self, kind: str, i: int) -> Fault:
        victim = self.runtimes[i % len(self.runtimes)]
        # Read before the clock starts: the jobs a kill -9 will leave behind.
        rescued = await asyncio.to_thread(self.jobs_in_hand, victim.proc.pid) if kind == "runtime_kill9" else []  # type: ignore[union-attr]
        fault = Fault(kind, time.time())
        t0 = time.monotonic()
        deadline = t0 + HEAL_GIVE_UP
        servers = self.all_servers
        touches_jobs = True
        if kind.startswith("pg_restart"):
            mode = "fast" if kind.endswith("fast") else "immediate"
            await self.pg_ctl("restart", "-m", mode)
            fault.parts["restarted"] = time.monotonic() - t0
        elif kind == "redis_restart":
            servers, touches_jobs = self.servers["redis"], False
            await asyncio.to_thread(self.restart_redis)
            fault.parts["restarted"] = time.monotonic() - t0
        elif kind == "pg_listener_kill":
            n = await asyncio.to_thread(self.kill_listeners)
            fault.notes.append(f"{n} listener backends terminated")
        elif kind in ("runtime_kill9", "runtime_sigterm"):
            servers = []
            assert victim.proc is not None
            victim.expected_down = True
            pid = victim.proc.pid
            if kind == "runtime_kill9":
                victim.proc.send_signal(signal.SIGKILL)
                rc = await victim.wait_exit(5)
            else:
                victim.proc.send_signal(signal.SIGTERM)
                rc = await victim.wait_exit(20)
                if rc != 0:
                    fault.notes.append(f"runtime exited with {rc} on SIGTERM (expected 0)")
                    self.problems.append(f"{kind}: runtime exited with status {rc} on SIGTERM (expected 0)")
                    if rc is None:
                        victim.kill()
                fault.parts["exit"] = time.monotonic() - t0
            victim.start()
            victim.expected_down = False
            fault.notes.append(f"pid {pid}" + (f", {len(rescued)} jobs in hand" if rescued else ""))
        elif kind == "server_restart":
            # Not a dependency fault: a deploy. Its clients reconnect and resume with `since`.
            server = self.all_servers[i % len(self.all_servers)]
            servers, touches_jobs = [server], False
            assert server.proc is not None
            server.expected_down = True
            server.proc.send_signal(signal.SIGTERM)
            rc = await server.wait_exit(20)
            if rc != 0:
                self.problems.append(f"{kind}: {server.name} exited with status {rc} on SIGTERM (expected 0)")
                server.kill()
            fault.parts["exit"] = time.monotonic() - t0
            server.start()
            server.expected_down = False
            if await wait_healthy([server], HEAL_GIVE_UP):
                fault.parts["started"] = time.monotonic() - t0
            fault.notes.append(server.name)
        # Heal: every affected server healthy and reached by a probe published after the fault,
        # and a job enqueued after the fault finished (plus the jobs a killed runtime held).
        waits = []
        if servers:
            waits.append(self.heal_servers(servers, fault, t0, deadline))
        if touches_jobs:
            waits.append(self.heal_jobs(fault, t0, deadline, rescued))
        done = await asyncio.gather(*waits)
        if all(d is not None for d in done):
            fault.heal = max(d for d in done if d is not None)
        return fault

    async def heal_servers(self, servers: list[Child], fault: Fault, t0: float, deadline: float) -> float | None:
        """When every server in `servers` was reached by a probe published after the fault, and
        then answered /healthz 200 (seconds after the fault), or None."""
        probes = [p for p in self.probes if p.server in servers]
        fanouts = {f for f, ss in self.servers.items() if any(s in servers for s in ss)}
        first_after: dict[str, int] = {}

        def heard() -> bool:
            return all(p.topic in first_after and p.newest >= first_after[p.topic] for p in probes)

        async def publish(fanout: str) -> None:
            topic = f"soak:probe:{fanout[:2]}"
            while time.monotonic() < deadline and not heard():
                self.probe_n += 1
                n = self.probe_n
                try:  # retried while it raises: only a probe that was published counts
                    await asyncio.wait_for(self.probe_fanouts[fanout].apublish(  # type: ignore[attr-defined]
                        topic, {"t": time.time(), "n": n}), 2)
                    first_after.setdefault(topic, n)
                except Exception:
                    pass
                await asyncio.sleep(PROBE_EVERY)

        await asyncio.gather(*(publish(f) for f in fanouts))
        if not heard():
            late = [p.server.name for p in probes if p.newest < first_after.get(p.topic, 1 << 60)]
            fault.notes.append(f"servers not healed: no probe reached {late}")
            return None
        fault.parts["probe"] = time.monotonic() - t0
        codes: list[int] = []
        while time.monotonic() < deadline:
            codes = list(await asyncio.gather(*(http_status(s.port) for s in servers)))  # type: ignore[arg-type]
            if all(c == 200 for c in codes):
                fault.parts["healthz"] = time.monotonic() - t0
                return fault.parts["healthz"]
            await asyncio.sleep(PROBE_EVERY)
        fault.notes.append(f"servers not healed: /healthz answered {codes}")
        return None

    async def heal_jobs(self, fault: Fault, t0: float, deadline: float, rescued: list[int]) -> float | None:
        probe, held = await asyncio.gather(self.probe_job(deadline), self.jobs_finished(rescued, deadline))
        if probe is None or held is None:
            fault.notes.append("jobs not healed: " + ("probe job unfinished" if probe is None else "rescued jobs unfinished"))
            return None
        fault.parts["job"] = time.monotonic() - t0
        return fault.parts["job"]

    async def pg_ctl(self, *args: str) -> None:
        data = self.services.pg_data
        assert data is not None
        proc = await asyncio.create_subprocess_exec(*_as_postgres([f"{_pg_bin()}/pg_ctl", "-D", data, "-w", "-t", "60", *args]),
                                                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 90)
        if proc.returncode != 0:
            raise RuntimeError(f"pg_ctl {' '.join(args)} failed: {err.decode()[-300:]}")

    def restart_redis(self) -> None:
        assert self.services.redis_pidfile is not None
        with open(self.services.redis_pidfile) as f:
            pid = int(f.read().strip())
        os.kill(pid, signal.SIGTERM)
        for _ in range(200):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        port = int(self.redis_url.rsplit(":", 1)[1].split("/")[0])
        self.services.start_redis(port)

    def kill_listeners(self) -> int:
        with psycopg.connect(self.pg_url, autocommit=True, connect_timeout=5) as c:
            row = c.execute("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE application_name = %s", (LISTENER_APP,)).fetchone()
        return int(row[0]) if row else 0

    def jobs_in_hand(self, pid: int) -> list[int]:
        """Jobs whose newest run is on `pid` and that have not finished: what a kill leaves behind."""
        from livepush import jobs

        with psycopg.connect(self.pg_url, autocommit=True, connect_timeout=5) as c:
            ids = [r[0] for r in c.execute("SELECT DISTINCT job_id FROM soak_runs WHERE pid = %s AND at > now() - interval '2 s'",
                                           (pid,)).fetchall()]
        in_hand = []
        for job_id in ids:
            info = jobs.get_job(job_id)
            if info is not None and info.state == "running":
                in_hand.append(job_id)
        return in_hand

    async def watchdog(self) -> None:
        """A server or runtime that exits by itself is a finding: note it, start it again."""
        while not self._stopping:
            for child in [*self.all_servers, *self.runtimes]:
                if child.proc is not None and not child.expected_down and child.proc.poll() is not None:
                    note = f"{child.name} exited by itself with status {child.proc.returncode} at {time.strftime('%H:%M:%S')}"
                    child.unexpected_exits.append(note)
                    self.problems.append(note)
                    log("!! " + note + "; starting it again")
                    child.start()
            await asyncio.sleep(1.0)

    # -- the run ----------------------------------------------------------------------------
    async def run(self) -> int:
        a = self.args
        await self.start()
        t_start = time.monotonic()
        end = t_start + a.minutes * 60
        await self.start_publishers()
        self._tasks.append(asyncio.create_task(self.enqueue_loop()))
        self._tasks.append(asyncio.create_task(self.watchdog()))
        plan = self.schedule()
        log(f"load running; {len(plan)} faults from t+{a.warmup:.0f} s: {', '.join(plan)}")
        await asyncio.sleep(a.warmup)
        await self.run_faults(plan, end - a.cooldown)
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        log("stopping the load")
        return await self.finish()

    async def finish(self) -> int:
        self._stopping = True
        for proc in self.publishers:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in self.publishers:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 15)
        await asyncio.sleep(0.5)  # the readers take the publishers' last lines
        # An end marker per topic: a client is done with a topic once it arrives.
        for fanout in self.fanouts:
            for topic in self.topics(fanout):
                for _ in range(50):
                    try:
                        await self.probe_fanouts[fanout].apublish(topic, {"t": time.time(), "end": 1})  # type: ignore[attr-defined]
                        break
                    except Exception:
                        await asyncio.sleep(0.2)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all(s[0] == s[1] for s in self.client_status.values()):
                break
            await asyncio.sleep(0.2)
        for proc in self.client_procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in self.client_procs:
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except asyncio.TimeoutError:
                proc.kill()
        # Jobs: every enqueued one finishes (bounded).
        from livepush import jobs

        deadline = time.monotonic() + 60
        states: dict[int, str] = {}
        while time.monotonic() < deadline:
            pending = [i for i in self.jobs_enqueued if states.get(i) not in ("succeeded", "failed", "cancelled")]
            if not pending:
                break
            for job_id in pending:
                try:
                    info = await jobs.aget_job(job_id)
                    states[job_id] = info.state if info is not None else "missing"
                except Exception as exc:
                    states[job_id] = f"unreadable ({type(exc).__name__})"
            await asyncio.sleep(1.0)
        return self.report(states)

    # -- the summary ------------------------------------------------------------------------
    def report(self, job_states: dict[int, str]) -> int:
        from livepush.types import offset_key

        outputs = []
        for path in self.client_outputs:
            try:
                with open(path) as f:
                    outputs.append(json.load(f))
            except (OSError, ValueError):
                self.problems.append(f"a client process wrote no result ({os.path.basename(path)})")
        published_ks = {k for msgs in self.published.values() for _, k, _, _ in msgs}
        n_published = len(published_ks)
        expected = live = replayed = by_reset = lost = dups = resets = refused = 0
        stuck: list[str] = []
        extra_ks: set[int] = set()
        lost_examples: list[str] = []
        reconnects = 0
        closes: Counter[str] = Counter()
        delivered_ks: set[int] = set()
        lat: array = array("d")
        lat_t: array = array("d")
        for out in outputs:
            lat.frombytes(base64.b64decode(out["lat"]))
            lat_t.frombytes(base64.b64decode(out["lat_t"]))
            for client in out["clients"]:
                reconnects += client["reconnects"]
                closes.update(client["closes"])
                for p in client["pairs"]:
                    got = set(p["ks"])
                    delivered_ks |= got
                    extra_ks |= got - published_ks
                    live += p["live"]
                    replayed += p["replayed"]
                    dups += p["dups"]
                    resets += p["resets"]
                    refused += p["refused"]
                    if not p["done"]:
                        stuck.append(f"client {client['id']} on {p['topic']} ({client['url']})")
                    if p["base"] is None:
                        continue
                    base = offset_key(p["base"])
                    reset_to = offset_key(p["reset_to"]) if p["reset_to"] else ()
                    for offset, k, t, returned in self.published[p["topic"]]:
                        key = offset_key(offset)
                        if key <= base:
                            continue
                        expected += 1
                        if k in got:
                            continue
                        if key <= reset_to or returned < p["origin_refetch_at"]:
                            by_reset += 1
                        else:
                            lost += 1
                            if len(lost_examples) < 5:
                                lost_examples.append(f"{p['topic']} {offset} (k {k}, published {self.when(t)}) "
                                                     f"to client {client['id']}")
        # Latency: overall, and of messages published during a fault (injection to heal).
        windows = [(f.at, f.at + (f.heal if f.heal is not None else HEAL_GIVE_UP)) for f in self.faults]
        during = [v for v, t in zip(lat, lat_t) if any(a <= t <= b for a, b in windows)]
        # Jobs.
        runs: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
        with contextlib.suppress(psycopg.Error), psycopg.connect(self.pg_url, connect_timeout=5) as c:
            for job_id, seq, attempt, pid in c.execute("SELECT job_id, seq, attempt, pid FROM soak_runs ORDER BY at"):
                runs[job_id].append((seq, attempt, pid))
        finished = sum(1 for i in self.jobs_enqueued if job_states.get(i) == "succeeded")
        failed = sum(1 for i in self.jobs_enqueued if job_states.get(i) == "failed")
        unfinished = Counter(job_states.get(i, "unknown") for i in self.jobs_enqueued
                             if job_states.get(i) not in ("succeeded", "failed"))
        repeated = {i: r for i, r in runs.items() if i in self.jobs_enqueued and len(r) > 1}
        rescued_attempts = sum(1 for r in repeated.values() if len({a for _, a, _ in r}) == len(r))
        same_attempt = len(repeated) - rescued_attempts
        unknown_runs = sum(1 for i in runs if i not in self.jobs_enqueued)
        never_ran = sum(1 for i in self.jobs_enqueued if i not in runs and job_states.get(i) == "succeeded")

        print()
        print(f"==== soak summary: {self.args.minutes:g} min, fan-out {self.args.fanout}, "
              f"{len(self.all_servers)} servers, {len(self.runtimes)} runtimes, {self.args.clients} clients ====")
        print(f"messages published (publish() returned an offset): {n_published}")
        print(f"  publish() calls that raised during outages, retried and not counted as published: {self.publish_raised}"
              f" {dict(self.publish_errors) or ''}")
        print(f"  delivered although their publish() raised (committed before the error): {len(extra_ks)}")
        print(f"deliveries owed to subscribed clients: {expected}")
        print(f"  delivered live: {live}; recovered by `since` replay: {replayed}; "
              f"recovered by reset (refetch): {by_reset}; LOST: {lost}")
        if lost_examples:
            print("  lost, e.g.: " + "; ".join(lost_examples))
        print(f"  duplicates or out of order: {dups}; resets: {resets}; refused subscribes: {refused}; "
              f"client reconnects: {reconnects} {dict(closes.most_common(4)) or ''}")
        print(f"  topic subscriptions that never got the end marker (stuck): {len(stuck)}"
              + (f", e.g. {stuck[0]}" if stuck else ""))
        print(f"jobs enqueued: {len(self.jobs_enqueued)} (enqueue calls that raised, retried: {self.enqueue_raised}"
              f" {dict(self.enqueue_errors) or ''})")
        print(f"  finished: {finished} succeeded, {failed} failed; LOST (never finished): {sum(unfinished.values())}"
              + (f" {dict(unfinished)}" if unfinished else ""))
        print(f"  repeated (ran more than once): {len(repeated)}: {rescued_attempts} as a new attempt each time "
              f"(rescued or retried), {same_attempt} within one attempt; succeeded with no recorded run: {never_ran}; "
              f"runs of jobs whose enqueue raised: {unknown_runs}")
        print("heal times per fault (goal < 5 s; fail > 30 s):")
        by_kind: dict[str, list[Fault]] = defaultdict(list)
        for f in self.faults:
            by_kind[f.kind].append(f)
        worst = 0.0
        for kind, faults in by_kind.items():
            heals = [f.heal for f in faults if f.heal is not None]
            missing = len(faults) - len(heals)
            worst = max([worst, *heals, *([float("inf")] * missing)])
            over = sum(1 for h in heals if h > HEAL_GOAL)
            print(f"  {kind:22s} n={len(faults):2d}  median {statistics.median(heals) if heals else float('nan'):6.2f} s  "
                  f"max {max(heals) if heals else float('nan'):6.2f} s  over 5 s: {over}"
                  + (f"  NOT HEALED: {missing}" if missing else ""))
        print(f"publish-to-deliver latency, live deliveries: overall p50 {percentile(list(lat), 0.5) * 1000:.1f} ms, "
              f"p99 {percentile(list(lat), 0.99) * 1000:.1f} ms (n={len(lat)}); during faults p50 "
              f"{percentile(during, 0.5) * 1000:.1f} ms, p99 {percentile(during, 0.99) * 1000:.1f} ms (n={len(during)})")
        for child in [*self.all_servers, *self.runtimes]:
            text = open(child.log_path, errors="replace").read()
            blocks = text.split("Traceback (most recent call last)")[1:]
            tracebacks = sum(1 for b in blocks if "soak_jobs.py" not in b.split("\n20")[0])
            if tracebacks:
                self.problems.append(f"{child.name}: {tracebacks} tracebacks in its log")
        if self.problems:
            print("problems:")
            for p in self.problems:
                print("  - " + p)
        bad = lost > 0 or sum(unfinished.values()) > 0 or worst > HEAL_FAIL
        print("RESULT: " + ("FAIL" if bad else "ok"))
        return 1 if bad else 0

    def when(self, t: float) -> str:
        """A time as the log shows it, and the fault nearest before it."""
        before = [f for f in self.faults if f.at <= t + 1]
        near = f", {t - before[-1].at:+.2f} s from {before[-1].kind}" if before else ""
        return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}{near}"

    # -- clean-up ---------------------------------------------------------------------------
    async def close(self) -> None:
        self._stopping = True
        for task in self._tasks + [p.task for p in self.probes if p.task]:
            task.cancel()
        for proc in self.publishers + self.client_procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(proc.wait(), 5)
        for child in [*self.all_servers, *self.runtimes]:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        for child in [*self.all_servers, *self.runtimes]:
            if child.proc is not None and await child.wait_exit(10) is None:
                child.kill()
        for fanout in self.probe_fanouts.values():
            with contextlib.suppress(Exception):
                await fanout.aclose()  # type: ignore[attr-defined]

    def remove(self) -> None:
        if self.args.keep_logs:
            import shutil

            shutil.copytree(self.logs, self.args.keep_logs, dirs_exist_ok=True)
            for path in self.client_outputs:
                with contextlib.suppress(OSError):
                    shutil.copy(path, self.args.keep_logs)
            with open(os.path.join(self.args.keep_logs, "published.json"), "w") as f:
                json.dump({"published": self.published, "faults": [vars(x) for x in self.faults]}, f)
        self.services.stop()
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)


async def amain(args: argparse.Namespace) -> int:
    soak = Soak(args)
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None
    loop.add_signal_handler(signal.SIGTERM, main_task.cancel)
    try:
        return await soak.run()
    finally:
        await asyncio.shield(soak.close())
        soak.remove()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--fanout", choices=["postgres", "redis", "both"], default="both")
    p.add_argument("--servers", type=int, default=2, help="livepush serve processes per fan-out (default 2)")
    p.add_argument("--runtimes", type=int, default=2)
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--client-processes", type=int, default=2)
    p.add_argument("--topics", type=int, default=40, help="topics per fan-out (default 40)")
    p.add_argument("--rate", type=float, default=200.0, help="messages a second in all (default 200)")
    p.add_argument("--jobs-rate", type=float, default=20.0, help="jobs enqueued a second (default 20)")
    p.add_argument("--fault-every", type=float, default=25.0, help="seconds between faults (default 25)")
    p.add_argument("--warmup", type=float, default=20.0)
    p.add_argument("--cooldown", type=float, default=20.0)
    p.add_argument("--pg-port", type=int, default=0)
    p.add_argument("--redis-port", type=int, default=0)
    p.add_argument("--keep-logs", default=None, help="copy the servers' and runtimes' logs to this folder at the end")
    args = p.parse_args()
    try:
        sys.exit(asyncio.run(amain(args)))
    except KeyboardInterrupt:
        print("interrupted: everything stopped and removed", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
