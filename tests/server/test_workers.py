"""`livepush serve --workers N`: N processes on one port, one signal stops them all, a dead
worker comes back (docs/reference.md#3-commands, #9-operations)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import psycopg
import pytest

from livepush import topics
from livepush.cli.workers import WorkerRole, cpu_count, stop_bound, supervise
from livepush.config import Settings
from livepush.errors import ConfigError
from livepush.fanout import from_env
from livepush.server.supervisor import READY_LINE, RestartPolicy, StopBound, Supervisor
from tests.support.procs import ChildProcess, Processes, free_port
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient

BOOT = 30.0  # seconds for N workers to boot on a busy test machine


# -- looking at the processes from outside ----------------------------------------------------
async def readyz(port: int) -> dict:
    """GET /readyz on a new connection (the kernel picks the worker that answers)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    try:
        writer.write(f"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    return json.loads(raw.partition(b"\r\n\r\n")[2])


async def metric(port: int, name: str) -> float:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    try:
        writer.write(f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        text = (await asyncio.wait_for(reader.read(), 5)).decode()
    finally:
        writer.close()
    found = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert found, f"{name} not in /metrics:\n{text[:2000]}"
    return float(found.group(1))


async def workers_by_index(port: int, count: int) -> dict[int, int]:
    """{worker index: pid}, from /readyz answers, once every one of `count` workers has answered."""
    seen: dict[int, int] = {}

    async def all_answered() -> bool:
        for _ in range(8):
            worker = (await readyz(port))["worker"]
            seen[worker["index"]] = worker["pid"]
        return len(seen) == count

    await async_wait_for(all_answered, timeout=10, message=f"/readyz answers from {count} workers")
    return seen


def children_of(pid: int) -> set[int]:
    """The live processes whose parent is `pid`."""
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rpartition(")")[2].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.add(int(entry.name))
    return out


def workers_of(supervisor: int) -> set[int]:
    """Every live worker process started by `supervisor`, wherever it was reparented."""
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"--supervised-as" in argv and argv[argv.index(b"--supervised-as") + 1].endswith(
                    f",parent={supervisor}".encode()) and alive(int(entry.name)):
                out.add(int(entry.name))
    return out


def environ_of(pid: int) -> dict[str, str]:
    text = (Path("/proc") / str(pid) / "environ").read_text()
    return dict(entry.split("=", 1) for entry in text.split("\0") if "=" in entry)


def alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def holder_of(client: WSClient, server_port: int, pids: set[int]) -> int | None:
    """Which of `pids` holds the server side of `client`'s connection (read from /proc)."""
    client_port = client.ws.local_address[1]
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1].split(":")[1], fields[2].split(":")[1]
        if int(local, 16) == server_port and int(remote, 16) == client_port:
            inode = fields[9]
    for pid in pids:
        try:
            fds = list((Path("/proc") / str(pid) / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


def serving_port(child: ChildProcess) -> int:
    found = re.search(r"serving on ws://[^:]+:(\d+) with", child.stderr())
    return int(found.group(1)) if found else 0


async def start_workers(procs: Processes, env: dict[str, str], *args: str) -> tuple[ChildProcess, int]:
    """`serve --workers ARGS` with `env`, once it says it serves; (the supervisor, its port)."""
    child = procs.livepush("serve", *args, env=env, wait_healthy=False)
    await async_wait_for(lambda: serving_port(child) or not child.running, timeout=BOOT,
                         message="the supervisor's 'serving on' line")
    assert child.running, child.output()
    return child, serving_port(child)


async def open_clients(url: str, count: int, topic: str) -> list[WSClient]:
    clients = await asyncio.gather(*(WSClient.open(url) for _ in range(count)))
    for answer in await asyncio.gather(*(c.subscribe(topic) for c in clients)):
        assert answer["op"] == "subscribed", answer
    return list(clients)


@pytest.fixture
async def publisher(request: pytest.FixtureRequest, secret: str) -> AsyncIterator[Callable[..., object]]:
    """publish(kind, url, topic, data) through a fan-out of its own, as another process would."""
    fanouts = []

    async def publish(kind: str, url: str, topic: str, data: object) -> str:
        settings = Settings(fanout=kind, secret=secret, database_url=url if kind == "postgres" else None,
                            redis_url=url if kind == "redis" else None)
        fanout = from_env(settings)
        fanouts.append(fanout)
        return await fanout.apublish(topic, data)

    yield publish
    for fanout in fanouts:
        await fanout.aclose()


# -- N workers on one port --------------------------------------------------------------------
async def test_two_workers_serve_one_port_and_name_themselves(procs, livepush_env, pg_url) -> None:
    """--port 0 with 2 workers: one concrete port, both workers answer on it, each names itself
    in /readyz and in its JSON log lines; the supervisor's lines carry its pid."""
    child, port = await start_workers(procs, livepush_env(database_url=pg_url, port=0),
                                      "--workers", "2", "--log-format", "json")
    assert port > 0
    workers = await workers_by_index(port, 2)
    assert set(workers) == {1, 2}
    assert set(workers.values()) == children_of(child.pid)
    lines = [json.loads(line) for line in child.stderr().splitlines() if line.startswith("{")]
    serving = [line for line in lines if line["message"].startswith("livepush serving on")]
    # The supervisor's line has a pid and no worker index.
    assert sorted((line.get("worker", 0), line["pid"]) for line in serving) == sorted(
        [(1, workers[1]), (2, workers[2]), (0, child.pid)]), serving
    assert child.stop(15) == 0, child.output()


@pytest.mark.parametrize("kind", ["postgres", "redis"])
async def test_a_publish_reaches_clients_on_every_worker(procs, livepush_env, pg_url, redis_url, secret,
                                                         publisher, kind) -> None:
    """Clients spread over both workers all get one publish through the fan-out; /metrics on
    either worker counts the connections and deliveries of both."""
    url = pg_url if kind == "postgres" else redis_url
    env = livepush_env(database_url=pg_url if kind == "postgres" else None,
                       redis_url=redis_url if kind == "redis" else None)
    child, port = await start_workers(procs, env, "--workers", "2")
    pids = set((await workers_by_index(port, 2)).values())
    topic = topics.sign("room:workers", [secret])
    clients = await open_clients(f"ws://127.0.0.1:{port}/", 24, topic)
    holders = {holder_of(c, port, pids) for c in clients}
    assert holders == pids, holders  # both workers hold some

    await publisher(kind, url, "room:workers", {"n": 1})
    for frames in await asyncio.gather(*(c.messages(1) for c in clients)):
        assert frames[0]["data"] == {"n": 1}
    assert await metric(port, "livepush_connections") == 24
    await async_wait_for(lambda: metric_is(port, "livepush_delivered_total", 24), timeout=5)
    for c in clients:
        await c.close()
    assert child.stop(15) == 0, child.output()


async def test_workers_import_what_livepush_needs_not_the_projects_modules_of_the_same_name(
        procs, livepush_env, pg_url, tmp_path: Path) -> None:
    """Run from a project whose folder holds a `redis.py` and a `websockets.py` of its own, the
    workers start as one `livepush serve` does: the project's modules are found for `--app`, and
    never in place of the libraries livepush imports."""
    for name in ("redis", "websockets"):
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the project own {name}.py was imported')\n")
    (tmp_path / "project_push.py").write_text("import livepush\napp = livepush.App(rules=[])\n")
    console_script = Path(sys.executable).with_name("livepush")  # as a user runs it: not `python -m`
    env = livepush_env(database_url=pg_url, port=0)
    child = procs.start([str(console_script), "serve", "--workers", "2", "--app", "project_push:app"],
                        env=env, cwd=tmp_path)
    await async_wait_for(lambda: serving_port(child) or not child.running, timeout=BOOT,
                         message="the supervisor's 'serving on' line")
    assert child.running and "the project own" not in child.stderr(), child.output()
    assert set(await workers_by_index(serving_port(child), 2)) == {1, 2}
    assert child.stop(15) == 0, child.output()



async def test_started_with_stdout_closed_every_process_holds_dev_null_on_it(procs, livepush_env, pg_url) -> None:
    """`serve --workers 2 >&-`: the supervisor and its workers hold /dev/null on descriptor 1, not
    the first file one of them opened (a worker's metrics file), which a subprocess started by
    the worker's code would write its output into; and they stop with exit 0."""
    env = livepush_env(database_url=pg_url, port=0)
    child = procs.start(["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "livepush", "serve", "--workers",
                         "2"], env=env, name="livepush serve --workers 2 >&-")
    await async_wait_for(lambda: serving_port(child) or not child.running, timeout=BOOT,
                         message="the supervisor's 'serving on' line")
    assert child.running, child.output()
    pids = set((await workers_by_index(serving_port(child), 2)).values())
    assert {pid: os.readlink(f"/proc/{pid}/fd/1") for pid in {child.pid, *pids}} == dict.fromkeys(
        {child.pid, *pids}, os.devnull)
    assert child.stop(15) == 0, child.output()

# -- stopping -----------------------------------------------------------------------------------
@pytest.mark.parametrize("sig,drain", [(signal.SIGTERM, "0"), (signal.SIGINT, "0"), (signal.SIGTERM, "1"),
                                       (signal.SIGHUP, "1")])
async def test_one_signal_stops_every_worker(procs, livepush_env, pg_url, secret, sig, drain) -> None:
    """SIGTERM or SIGINT to the supervisor, or SIGHUP (its terminal closed): every client on every
    worker is closed with 1001 (with a `retry=` reason under a paced drain), the supervisor exits
    0, no worker outlives it, and the metrics files are gone."""
    child, port = await start_workers(procs, livepush_env(database_url=pg_url, drain_seconds=drain),
                                      "--workers", "2")
    pids = set((await workers_by_index(port, 2)).values())
    metrics_dir = environ_of(min(pids))["PROMETHEUS_MULTIPROC_DIR"]
    assert os.listdir(metrics_dir)
    clients = await open_clients(f"ws://127.0.0.1:{port}/", 20, topics.sign("room:stop", [secret]))
    assert {holder_of(c, port, pids) for c in clients} == pids

    child.signal(sig)
    frames = await asyncio.gather(*(c.close_frame(timeout=10) for c in clients))
    assert [f.code if f else None for f in frames] == [1001] * 20
    if drain != "0":
        assert all(f.reason.startswith("retry=") for f in frames), [f.reason for f in frames]
    assert await child.await_exit(15) == 0, child.output()
    await async_wait_for(lambda: not workers_of(child.pid), timeout=5, message="every worker gone")
    assert not any(alive(p) for p in pids)
    assert not os.path.exists(metrics_dir)
    assert "Traceback" not in child.stderr(), child.output()


async def test_workers_started_with_nohup_keep_serving_after_a_hangup(procs, livepush_env, pg_url) -> None:
    """Under `nohup`, which asked for SIGHUP to be ignored, a hangup to the supervisor or to a
    worker stops nothing and restarts nothing: the same workers serve on; SIGTERM then stops them
    all with exit 0."""
    env = livepush_env(database_url=pg_url)
    child = procs.start(["nohup", sys.executable, "-m", "livepush", "serve", "--workers", "2"], env=env,
                        name="nohup livepush serve --workers 2")
    await async_wait_for(lambda: serving_port(child) or not child.running, timeout=BOOT,
                         message="the supervisor's 'serving on' line")
    port = serving_port(child)
    workers = await workers_by_index(port, 2)
    for pid in (child.pid, *workers.values()):
        os.kill(pid, signal.SIGHUP)
    # Every worker answers, the same processes: none of them heard the hangup.
    assert await workers_by_index(port, 2) == workers
    assert child.running and "stopping" not in child.stderr() and "restarting" not in child.stderr(), child.output()
    assert child.stop(15) == 0, child.output()


async def test_a_signal_while_the_workers_boot_stops_them_too(procs, livepush_env, pg_url) -> None:
    """SIGTERM to the supervisor while its first worker is still booting: it stops, the
    supervisor exits 0, and no worker is left."""
    child = procs.livepush("serve", "--workers", "2", env=livepush_env(database_url=pg_url), wait_healthy=False)
    await async_wait_for(lambda: workers_of(child.pid) or not child.running, timeout=BOOT,
                         message="the first worker's process")
    child.signal(signal.SIGTERM)
    assert await child.await_exit(15) == 0, child.output()
    await async_wait_for(lambda: not workers_of(child.pid), timeout=5, message="every worker gone")
    assert "[worker 2 " not in child.stderr(), child.output()


async def test_killing_the_supervisor_outright_stops_its_workers(procs, livepush_env, pg_url) -> None:
    """kill -9 of the supervisor: its workers hear SIGTERM (they die with it) and exit."""
    child, port = await start_workers(procs, livepush_env(database_url=pg_url), "--workers", "2")
    pids = set((await workers_by_index(port, 2)).values())
    assert workers_of(child.pid) == pids
    os.kill(child.pid, signal.SIGKILL)
    await async_wait_for(lambda: not workers_of(child.pid), timeout=10, message="every worker gone")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGUSR1], ids=lambda s: s.name)
async def test_the_workers_of_a_supervisor_killed_outright_drain_as_on_one_sigterm(procs, livepush_env, pg_url,
                                                                                   secret, sig) -> None:
    """A supervisor killed outright (kill -9, the OOM killer, a signal it does not handle) leaves
    each worker one SIGTERM: it drains over --drain-seconds, every client closed with 1001 and a
    `retry=` reason. The kernel sends that SIGTERM each time a worker changes parent, and one that
    was first handed to another thread of the supervisor (a thread waiting for each worker) got a
    second one, which cut its drain short: every client back in the same second."""
    child, port = await start_workers(procs, livepush_env(database_url=pg_url, drain_seconds="2"), "--workers", "2")
    pids = set((await workers_by_index(port, 2)).values())
    clients = await open_clients(f"ws://127.0.0.1:{port}/", 20, topics.sign("room:orphans", [secret]))
    assert {holder_of(c, port, pids) for c in clients} == pids
    os.kill(child.pid, sig)
    frames = await asyncio.gather(*(c.close_frame(timeout=10) for c in clients))
    assert [f.code if f else None for f in frames] == [1001] * 20, child.output()
    assert all(f.reason.startswith("retry=") for f in frames), ([f.reason for f in frames], child.output())
    await async_wait_for(lambda: not workers_of(child.pid), timeout=10, message="every worker gone")
    assert "second signal" not in child.stderr(), child.output()


async def test_the_metrics_folder_of_a_supervisor_killed_outright_is_removed_by_the_next_one(
        procs, livepush_env, pg_url) -> None:
    """kill -9 of a supervisor and its workers (a process manager's last resort) removes nothing,
    and each such kill used to leave a folder of metrics files in the temporary folder for good.
    The next supervisor to start removes it, and leaves alone the folder of one that still runs."""

    async def folder_of(port: int) -> str:
        return environ_of(min((await workers_by_index(port, 2)).values()))["PROMETHEUS_MULTIPROC_DIR"]

    live, live_port = await start_workers(procs, livepush_env(database_url=pg_url, port=0), "--workers", "2")
    killed, killed_port = await start_workers(procs, livepush_env(database_url=pg_url, port=0), "--workers", "2")
    live_folder, abandoned = await folder_of(live_port), await folder_of(killed_port)
    workers = workers_of(killed.pid)
    for pid in {killed.pid, *workers}:
        os.kill(pid, signal.SIGKILL)
    await async_wait_for(lambda: not any(alive(p) for p in {killed.pid, *workers}), timeout=10,
                         message="the killed supervisor and its workers gone")
    assert os.listdir(abandoned)

    nxt, _ = await start_workers(procs, livepush_env(database_url=pg_url, port=0), "--workers", "2")
    assert not os.path.exists(abandoned), nxt.output()
    assert os.listdir(live_folder)
    assert "Traceback" not in live.stderr(), live.output()
    for child in (nxt, live):
        assert child.stop(15) == 0, child.output()


# -- a worker that dies ---------------------------------------------------------------------------
async def test_a_killed_worker_is_restarted_and_its_clients_come_back(procs, livepush_env, pg_url, secret,
                                                                      publisher) -> None:
    """kill -9 of one worker: the supervisor starts another in its place; the clients it held
    reconnect (to either worker) and get later messages; the others never noticed."""
    child, port = await start_workers(procs, livepush_env(database_url=pg_url), "--workers", "2")
    workers = await workers_by_index(port, 2)
    topic = topics.sign("room:restart", [secret])
    url = f"ws://127.0.0.1:{port}/"
    clients = await open_clients(url, 20, topic)
    victim = workers[1]
    on_victim = [c for c in clients if holder_of(c, port, set(workers.values())) == victim]
    others = [c for c in clients if c not in on_victim]
    assert on_victim and others

    os.kill(victim, signal.SIGKILL)
    for frame in await asyncio.gather(*(c.close_frame(timeout=5) for c in on_victim)):
        assert frame is None  # the process died: no close frame
    await async_wait_for(lambda: "worker 1 (pid %d) was killed by SIGKILL; restarting" % victim in child.stderr(),
                         timeout=5, message="the supervisor's restart line")

    async def replaced() -> bool:
        return (await workers_by_index(port, 2))[1] != victim

    await async_wait_for(replaced, timeout=BOOT, message="a new worker 1")
    # The dead worker's connections left the gauge with it; counters would not.
    await async_wait_for(lambda: metric_is(port, "livepush_connections", len(others)), timeout=5)
    back = await open_clients(url, len(on_victim), topic)  # what the JS client does by itself

    await publisher("postgres", pg_url, "room:restart", {"after": "restart"})
    for frames in await asyncio.gather(*(c.messages(1) for c in back + others)):
        assert frames[0]["data"] == {"after": "restart"}
    assert child.running
    assert child.stop(15) == 0, child.output()


async def test_a_worker_started_again_writes_on_in_the_metrics_files_of_the_one_it_replaces(
        procs, livepush_env, pg_url) -> None:
    """A worker started in a dead one's place (a crash; an --app whose boot fails, every 10 s for
    as long as that lasts) counts on in its predecessor's files: the folder holds as many files
    after restarts as before (each restart left two more, and every scrape read them all, in the
    event loop of a worker that serves), and the counters go on from where they were."""
    child, port = await start_workers(procs, livepush_env(database_url=pg_url), "--workers", "2")
    workers = await workers_by_index(port, 2)
    folder = environ_of(workers[1])["PROMETHEUS_MULTIPROC_DIR"]
    files = sorted(os.listdir(folder))
    published = await metric(port, "livepush_published_total")
    for _ in range(2):
        victim = workers[1]
        os.kill(victim, signal.SIGKILL)

        async def replaced() -> bool:
            return (await workers_by_index(port, 2))[1] != victim

        # A connection the kernel gave the dead worker is reset: ask again.
        await async_wait_for(replaced, timeout=BOOT, message="a new worker 1", ignore=(ConnectionResetError,))
        workers = await workers_by_index(port, 2)
    assert sorted(os.listdir(folder)) == files
    assert await metric(port, "livepush_published_total") >= published
    assert child.stop(15) == 0, child.output()


async def test_a_stop_while_a_killed_worker_waits_for_its_restart_is_a_clean_stop(procs, livepush_env,
                                                                                   pg_url) -> None:
    """SIGTERM while a worker that died waits to be started again: every worker left stops
    cleanly, so the supervisor exits 0; the earlier death was reported when it happened."""
    child, port = await start_workers(procs, livepush_env(database_url=pg_url), "--workers", "2")
    victim = (await workers_by_index(port, 2))[2]
    os.kill(victim, signal.SIGKILL)
    await async_wait_for(lambda: f"worker 2 (pid {victim}) was killed by SIGKILL; restarting" in child.stderr(),
                         timeout=5, message="the supervisor's restart line")
    assert child.stop(15) == 0, child.output()
    assert "while stopping" not in child.stderr()


async def test_a_second_signal_after_the_workers_stopped_still_exits_0(procs, livepush_env, pg_url) -> None:
    """Ctrl-C twice: the second signal may reach the supervisor once its workers are gone, while
    it exits. The stop is done: the supervisor still exits 0, not by the signal."""
    child, port = await start_workers(procs, livepush_env(database_url=pg_url), "--workers", "2")
    pids = set((await workers_by_index(port, 2)).values())
    child.signal(signal.SIGTERM)
    await async_wait_for(lambda: not any(alive(p) for p in pids), timeout=15, message="the workers to exit")
    child.signal(signal.SIGTERM)
    assert await child.await_exit(15) == 0, child.output()


# An --app module whose worker 2 never finishes its stop: a thread the user's code started, not a
# daemon, which the interpreter waits for as the process exits, for ever. Worker 1 stops as usual.
_WEDGED_APP = (
    "import sys, threading\n"
    "import livepush\n"
    "app = livepush.App(rules=[])\n"
    "if any(arg.startswith('index=2,') for arg in sys.argv):\n"
    "    threading.Thread(target=threading.Event().wait, name='never-ends').start()\n"
)


async def test_a_worker_that_outlives_its_stop_is_killed_and_the_supervisor_exits_1(
        procs, livepush_env, pg_url, tmp_path: Path) -> None:
    """A worker stuck in its stop kept `serve --workers N` from ever exiting. Once it outlives its
    bound (here the closes and a margin made short), the supervisor kills it with SIGKILL, logs an
    error naming it, its pid and why, and exits 1; the worker that stopped in time is not killed."""
    (tmp_path / "wedged_push.py").write_text(_WEDGED_APP)
    env = livepush_env(database_url=pg_url, port=0, worker_stop_margin="0.5")
    child, port = await start_app_workers(procs, env, tmp_path, "wedged_push")
    workers = await workers_by_index(port, 2)
    try:
        child.signal(signal.SIGTERM)
        assert await child.await_exit(20) == 1, child.output()
    finally:
        for pid in workers.values():  # without the fix, worker 2 outlives the test
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    killed = [line for line in child.stderr().splitlines() if "SIGKILL" in line]
    assert len(killed) == 1, child.output()
    assert re.search(rf"worker 2 \(pid {workers[2]}\) did not stop within [\d.]+ s of the stop signal "
                     r"\(.+\): killed it with SIGKILL", killed[0]), killed[0]
    await async_wait_for(lambda: not any(alive(p) for p in workers.values()), timeout=5,
                         message="both workers gone")


async def test_a_worker_whose_paced_drain_outlasts_the_margin_is_not_killed(procs, livepush_env, pg_url,
                                                                          secret) -> None:
    """The bound counts --drain-seconds: workers draining their clients over 2 s, four times the
    margin, stop in time, are never killed, and the supervisor exits 0."""
    env = livepush_env(database_url=pg_url, drain_seconds="2", worker_stop_margin="0.5")
    child, port = await start_workers(procs, env, "--workers", "2")
    pids = set((await workers_by_index(port, 2)).values())
    clients = await open_clients(f"ws://127.0.0.1:{port}/", 20, topics.sign("room:drain", [secret]))
    assert {holder_of(c, port, pids) for c in clients} == pids
    child.signal(signal.SIGTERM)
    frames = await asyncio.gather(*(c.close_frame(timeout=10) for c in clients))
    assert [f.code if f else None for f in frames] == [1001] * 20
    assert await child.await_exit(15) == 0, child.output()
    assert "SIGKILL" not in child.stderr(), child.output()


async def metric_is(port: int, name: str, expected: float) -> bool:
    return await metric(port, name) == expected


async def scrape_text(port: int) -> str:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    try:
        writer.write(f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        return (await asyncio.wait_for(reader.read(), 5)).decode()
    finally:
        writer.close()


async def test_a_queue_gone_from_the_database_leaves_the_scrape_of_every_worker(procs, livepush_env,
                                                                              pg_url) -> None:
    """The queue gauges are the answering worker's fresh read of the database, under --workers
    as with one process: once a queue no runtime serves has no job left, its series leave
    /metrics, whichever worker answers, instead of showing its last depth and age for ever (and
    firing the backlog alert for ever)."""
    import psycopg

    from livepush import jobs
    from tests.jobs import sample_jobs
    from tests.support.settings import jobs_settings

    child, port = await start_workers(procs, livepush_env(database_url=pg_url), "--workers", "2")
    await workers_by_index(port, 2)
    with jobs_settings(pg_url):
        await asyncio.to_thread(jobs.enqueue_many, [sample_jobs.other_queue.request(i) for i in range(3)])
    series = 'livepush_queue_depth{queue="second"}'

    async def every_worker_shows(expected: str | None) -> bool:
        for _ in range(6):  # the kernel picks the worker: six answers in a row must agree
            found = re.search(rf"^{re.escape(series)} (\S+)$", await scrape_text(port), re.M)
            if (found.group(1) if found else None) != expected:
                return False
        return True

    await async_wait_for(lambda: every_worker_shows("3.0"), timeout=10, message="depth 3 on every worker")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DELETE FROM livepush_jobs WHERE queue = 'second'")
    await async_wait_for(lambda: every_worker_shows(None), timeout=10, message="the queue gone from /metrics")
    assert child.stop(15) == 0, child.output()


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_metrics_of_another_app_in_an_inherited_multiprocess_folder_stay_out_of_the_scrape(
        procs, livepush_env, pg_url, tmp_path: Path, workers: str) -> None:
    """A PROMETHEUS_MULTIPROC_DIR livepush inherited (a web app's multiprocess mode, set for the
    whole container) is not its own: /metrics answers with livepush's figures, never that app's,
    which its own scrape already counts (both scraped, every sum would count them twice)."""
    import subprocess

    shared = tmp_path / "web-app-metrics"
    shared.mkdir()
    subprocess.run([sys.executable, "-c", "from prometheus_client import Counter\n"
                    "Counter('web_app_requests', 'Requests the web app served.').inc(5)"],
                   env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(shared)}, check=True, timeout=60)
    env = livepush_env(database_url=pg_url, port=0, extra={"PROMETHEUS_MULTIPROC_DIR": str(shared)})
    child = procs.livepush("serve", "--workers", workers, env=env, wait_healthy=False)
    # The lone server's line, or the supervisor's once every worker serves.
    serving = re.compile(r"livepush serving on ws://\S+:(\d+) " + (r"\(fan-out" if workers == "1" else "with"))
    await async_wait_for(lambda: serving.search(child.stderr()) or not child.running, timeout=BOOT,
                         message="the 'serving on' line")
    assert child.running, child.output()
    port = int(serving.search(child.stderr()).group(1))
    for _ in range(4):  # whichever worker answers
        text = await scrape_text(port)
        assert "livepush_connections" in text and "web_app_requests" not in text, text[:2000]
    assert child.stop(15) == 0, child.output()


async def test_metrics_the_projects_modules_make_in_a_worker_stay_out_of_the_scrape(
        procs, livepush_env, pg_url, tmp_path: Path) -> None:
    """An --app (or --with-jobs) module with prometheus_client metrics of its own, imported in
    every worker: /metrics answers with livepush's figures only, under --workers as with one
    process, where the project's figures never were in it (summed over the workers, they would
    be counted again beside the project's own scrape)."""
    (tmp_path / "project_push.py").write_text(
        "import livepush\nfrom prometheus_client import Counter\n"
        "Counter('project_requests', 'Requests the project served.').inc(5)\n"
        "app = livepush.App(rules=[])\n")
    child, port = await start_app_workers(procs, livepush_env(database_url=pg_url, port=0), tmp_path, "project_push")
    for _ in range(4):  # whichever worker answers
        text = await scrape_text(port)
        assert "livepush_connections" in text and "project_requests" not in text, text[:2000]
    assert child.stop(15) == 0, child.output()


async def start_app_workers(procs: Processes, env: dict[str, str], folder: Path,
                            module: str) -> tuple[ChildProcess, int]:
    """`serve --workers 2 --app MODULE:app` run in `folder` (where the module is), once it serves."""
    child = procs.start([sys.executable, "-m", "livepush", "serve", "--workers", "2", "--app", f"{module}:app"],
                        env=env, cwd=folder)
    await async_wait_for(lambda: serving_port(child) or not child.running, timeout=BOOT,
                         message="the supervisor's 'serving on' line")
    assert child.running, child.output()
    return child, serving_port(child)


async def test_a_worker_whose_restarts_fail_leaves_the_serving_gauge_one_short(
        procs, livepush_env, pg_url, tmp_path: Path) -> None:
    """livepush_serving_processes counts the workers that serve. A worker killed whose every restart
    fails (its --app broken by a deploy in place) is restarted at the backoff's pace for as long
    as that lasts, while the other worker serves on; the gauge stays one short meanwhile, which an
    alert on it catches."""
    module = tmp_path / "short_push.py"
    module.write_text("import livepush\napp = livepush.App(rules=[])\n")
    child, port = await start_app_workers(procs, livepush_env(database_url=pg_url, port=0), tmp_path, "short_push")
    await async_wait_for(lambda: metric_is(port, "livepush_serving_processes", 2), timeout=10,
                         message="both workers counted as serving")
    workers = await workers_by_index(port, 2)
    module.write_text("raise RuntimeError('broken by a deploy in place')\n")
    os.kill(workers[2], signal.SIGKILL)
    await async_wait_for(lambda: child.stderr().count("broken by a deploy in place") >= 2, timeout=BOOT,
                         message="two failed restarts of worker 2")
    assert child.running, child.output()
    for _ in range(4):  # whichever worker answers: the one that serves
        assert await metric(port, "livepush_serving_processes") == 1
    assert child.stop(15) == 0, child.output()

# -- how many -------------------------------------------------------------------------------------
async def test_workers_auto_runs_one_per_core(procs, livepush_env, pg_url) -> None:
    """--workers auto starts one worker per core this process may use (its CPU limit included)."""
    cores = cpu_count()
    if cores == 1:
        pytest.skip("one core: auto is one worker, a lone server")
    child, port = await start_workers(procs, livepush_env(database_url=pg_url), "--workers", "auto")
    assert len(await workers_by_index(port, cores)) == cores
    assert len(children_of(child.pid)) == cores
    assert child.stop(15) == 0, child.output()


def fake_cgroups(root: Path, membership: str, limits: dict[str, str]) -> tuple[Path, Path]:
    """A cgroup tree under `root` with `limits` ({file under the tree: its text}), and a
    /proc/self/cgroup saying `membership`: (the tree, that file)."""
    tree = root / "sys-fs-cgroup"
    tree.mkdir()
    for name, text in limits.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    own = root / "proc-self-cgroup"
    own.write_text(membership)
    return tree, own


@pytest.mark.parametrize("membership,limits,expected", [
    # cgroup v2, a Kubernetes pod's limit of 1 CPU (its quota per period), or of half of one.
    ("0::/pod/app\n", {"pod/app/cpu.max": "100000 100000\n"}, 1),
    ("0::/pod/app\n", {"pod/app/cpu.max": "50000 100000\n"}, 1),
    # The limit of a parent group bounds its children's.
    ("0::/pod/app\n", {"pod/cpu.max": "100000 100000\n", "pod/app/cpu.max": "max 100000\n"}, 1),
    # Inside a container the path is the host's and the tree is the container's own: its root holds the limit.
    ("0::/kubepods/pod/abc\n", {"cpu.max": "100000 100000\n"}, 1),
    # cgroup v1: the cpu controller's quota and period.
    ("4:memory:/x\n1:cpu,cpuacct:/docker/abc\n",
     {"cpu,cpuacct/cpu.cfs_quota_us": "100000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 1),
    ("1:cpuacct,cpu:/\n", {"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),
])
def test_auto_counts_no_more_cores_than_the_cpu_limit_allows(tmp_path: Path, membership: str,
                                                           limits: dict[str, str], expected: int) -> None:
    """In a container limited to a CPU or less, `--workers auto` ran one worker per core of the
    machine (its CPU affinity spans them all): each with its own database connections, sharing
    one core. It counts the cores the cgroup's CPU limit allows, rounded up, when that is fewer."""
    tree, own = fake_cgroups(tmp_path, membership, limits)
    assert cpu_count(cgroup_root=tree, own_cgroup=own) == expected


@pytest.mark.parametrize("membership,limits", [
    ("0::/\n", {"cpu.max": "max 100000\n"}),
    ("0::/app\n", {}),
    ("1:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}),
    ("0::/app\n", {"app/cpu.max": "garbage\n"}),
])
def test_auto_without_a_cpu_limit_counts_the_cores_it_may_run_on(tmp_path: Path, membership: str,
                                                                 limits: dict[str, str]) -> None:
    tree, own = fake_cgroups(tmp_path, membership, limits)
    assert cpu_count(cgroup_root=tree, own_cgroup=own) == len(os.sched_getaffinity(0))
    assert cpu_count(cgroup_root=tmp_path / "none", own_cgroup=tmp_path / "none") == len(os.sched_getaffinity(0))


async def test_the_workers_variable_is_the_flags_twin(procs, livepush_env, pg_url) -> None:
    """LIVEPUSH_WORKERS=2 does what --workers 2 does."""
    child, port = await start_workers(procs, livepush_env(database_url=pg_url, workers="2"))
    assert len(await workers_by_index(port, 2)) == 2
    assert child.stop(15) == 0, child.output()


@pytest.mark.parametrize("flag,variable", [("0", None), ("two", None), ("1.5", None), ("", None), (" ", None),
                                           (None, "-1")])
def test_a_bad_workers_value_exits_2_naming_the_flag(procs, livepush_env, flag, variable) -> None:
    """--workers (or LIVEPUSH_WORKERS) that is not a whole number from 1, nor auto: exit 2, one line
    naming it as given: the flag as typed (its variable is not read then), else the variable with
    the flag beside it. An empty flag too (`--workers "$N"` with N unset), which would run one
    process where many were meant."""
    args = ["serve"] + (["--workers", flag] if flag is not None else [])
    child = procs.livepush(*args, env=livepush_env(workers=variable), wait_healthy=False)
    assert child.wait(15) == 2
    lines = child.stderr().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in child.stderr(), child.output()
    if variable is not None:
        assert f"LIVEPUSH_WORKERS={variable!r} (or --workers)" in lines[0], lines[0]
    elif flag.strip():
        assert f"--workers {flag!r}" in lines[0] and "LIVEPUSH_WORKERS" not in lines[0], lines[0]
    else:
        assert f"--workers {flag!r} is empty" in lines[0], lines[0]


@pytest.mark.parametrize("args", [(), ("--workers", "1")])
async def test_one_worker_runs_no_supervisor(procs, livepush_env, pg_url, args) -> None:
    """By default, and with --workers 1, `serve` is one process as before: no child, no worker
    in /readyz, and its port is its own (no SO_REUSEPORT)."""
    env = livepush_env(database_url=pg_url)
    child = await procs.alivepush("serve", *args, env=env)
    port = int(env["LIVEPUSH_PORT"])
    assert "worker" not in await readyz(port)
    assert children_of(child.pid) == set()
    second = procs.livepush("serve", "--workers", "2", env=env, wait_healthy=False)
    assert second.wait(15) == 2 and "LIVEPUSH_PORT" in second.stderr(), second.output()
    assert child.stop(15) == 0


async def test_a_second_supervisor_on_a_port_a_first_one_serves_exits_2(procs, livepush_env, pg_url) -> None:
    """A port in use exits 2 with --workers too. Both supervisors bind with SO_REUSEPORT, which
    would let the second join the first's port: the kernel would then split new connections
    between two deployments (an old one not yet stopped, two configurations) without a word."""
    first, port = await start_workers(procs, livepush_env(database_url=pg_url, port=0), "--workers", "2")
    second = procs.livepush("serve", "--workers", "2", env=livepush_env(database_url=pg_url, port=port),
                            wait_healthy=False)
    assert second.wait(BOOT) == 2, second.output()
    lines = second.stderr().strip().splitlines()
    assert len(lines) == 1 and f":{port}" in lines[0] and "LIVEPUSH_PORT" in lines[0], second.output()
    assert len(workers_of(first.pid)) == 2
    assert first.stop(15) == 0, first.output()


async def test_a_worker_that_cannot_boot_stops_the_supervisor_with_its_status(procs, livepush_env) -> None:
    """A boot failure (here, a database that cannot be reached) is said by the first worker
    alone, and the supervisor exits with its status (1) without starting the others."""
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nope"
    child = procs.livepush("serve", "--workers", "3", env=livepush_env(database_url=url), wait_healthy=False)
    assert child.wait(30) == 1, child.output()
    stderr = child.stderr()
    assert "LIVEPUSH_DATABASE_URL" in stderr and "Traceback" not in stderr, child.output()
    assert "[worker 2 " not in stderr and "worker 1 (pid" in stderr, child.output()
    # The worker's own last line says which process gave up, as its log lines do.
    assert re.search(r"^livepush: \[worker 1 pid \d+\] .*LIVEPUSH_DATABASE_URL", stderr, re.M), child.output()


@pytest.mark.parametrize("how", [("--workers", "2"), ("--workers", "auto"), ("LIVEPUSH_WORKERS", "3")])
def test_workers_with_the_local_fan_out_exit_2_before_any_worker_starts(procs, livepush_env, pg_url, how) -> None:
    """The local fan-out reaches only the process that publishes: with several workers, what one
    publishes (its jobs, the app's hooks) would reach only its own clients, silently. It is
    refused at start, naming both settings, and no worker is started."""
    if how == ("--workers", "auto") and len(os.sched_getaffinity(0)) == 1:
        pytest.skip("one core: auto is one worker, which the local fan-out serves whole")
    flag = list(how) if how[0] == "--workers" else []
    # With a database (the jobs' state topics come from it): only the fan-out is at fault.
    env = livepush_env(database_url=pg_url, fanout="local", workers=how[1] if not flag else None)
    child = procs.livepush("serve", *flag, "--with-jobs", "tests.jobs.sample_jobs", env=env, wait_healthy=False)
    assert child.wait(15) == 2, child.output()
    lines = [line for line in child.stderr().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in child.stderr(), child.output()
    assert "LIVEPUSH_FANOUT=local" in lines[0] and "--workers" in lines[0], lines[0]
    assert "serving on" not in child.stderr() and "[worker" not in child.stderr()


# -- the supervisor on its own ----------------------------------------------------------------------
_FAKE_WORKER = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "os.write(int(sys.argv[1]), {ready!r}); os.close(int(sys.argv[1]))\n"
    "while True: signal.pause()\n"
).format(ready=READY_LINE)


async def test_a_restart_storm_makes_the_supervisor_give_up() -> None:
    """Each killed worker comes back after a backoff, until more exits than the policy allows
    within its window: then the supervisor stops every worker and returns 1."""
    exited: list[int] = []
    supervisor = Supervisor(2, lambda index, fd: [sys.executable, "-c", _FAKE_WORKER, str(fd)],
                            policy=RestartPolicy(first_delay=0.01, max_delay=0.05, window=60, limit=3),
                            on_exit=exited.append)
    served: list[list[int]] = []
    run = asyncio.create_task(supervisor.run(ready=served.append))
    await async_wait_for(lambda: served, timeout=BOOT, message="both fake workers ready")
    first_pids = set(served[0])
    for kill in range(4):
        await async_wait_for(lambda: len(supervisor.pids) == 2, timeout=5, message="two workers")
        before = set(supervisor.pids)
        victim = supervisor.slots[0].process
        assert victim is not None
        os.kill(victim.pid, signal.SIGKILL)
        if kill < 3:
            await async_wait_for(lambda: len(set(supervisor.pids) - before) == 1, timeout=5,
                                 message=f"restart {kill + 1}")
    assert await asyncio.wait_for(run, 10) == 1
    assert not any(alive(p) for p in first_pids | set(exited))
    assert len(exited) == 5  # four kills of worker 1, then worker 2 stopped


# Says it serves only once it gets SIGUSR1: a worker still booting for as long as a test wants.
_GATED_WORKER = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1, signal.SIGTERM])\n"
    "open(sys.argv[2], 'w').close()\n"
    "if signal.sigwait([signal.SIGUSR1, signal.SIGTERM]) == signal.SIGTERM: sys.exit(0)\n"
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])\n"
    "os.write(int(sys.argv[1]), {ready!r}); os.close(int(sys.argv[1]))\n"
    "while True: signal.pause()\n"
).format(ready=READY_LINE)


async def test_a_worker_that_served_and_dies_while_the_others_boot_is_restarted(tmp_path: Path) -> None:
    """Only a worker that exits before it serves is a boot failure that stops the supervisor.
    Worker 1, which served, dying while worker 2 still boots is started again as any worker
    that served, and the supervisor goes on to serve with both."""
    # Made by worker 2 once SIGUSR1 is blocked: sent before, its default action kills the worker.
    waiting = tmp_path / "worker-2-waits"

    def command(index: int, fd: int) -> list[str]:
        if index == 1:
            return [sys.executable, "-c", _FAKE_WORKER, str(fd)]
        return [sys.executable, "-c", _GATED_WORKER, str(fd), str(waiting)]

    supervisor = Supervisor(2, command, policy=RestartPolicy(first_delay=0.01, max_delay=0.05))
    served: list[list[int]] = []
    run = asyncio.create_task(supervisor.run(ready=served.append))
    first, second = supervisor.slots
    await async_wait_for(lambda: first.ready.is_set() and second.process is not None, timeout=BOOT,
                         message="worker 1 serving, worker 2 booting")
    assert first.process is not None and second.process is not None
    killed = first.process.pid
    os.kill(killed, signal.SIGKILL)
    await async_wait_for(lambda: run.done() or (first.ready.is_set() and first.process.pid != killed), timeout=10,
                         message="worker 1 started again and serving")
    assert not run.done(), f"the supervisor stopped with {run.result()}"
    await async_wait_for(waiting.exists, timeout=BOOT, message="worker 2 waiting for its signal to serve")
    os.kill(second.process.pid, signal.SIGUSR1)  # worker 2 serves now
    await async_wait_for(lambda: served, timeout=10, message="both workers serving")
    assert len(served[0]) == 2 and killed not in served[0]
    os.kill(os.getpid(), signal.SIGTERM)  # heard by the supervisor's handler while it runs
    assert await asyncio.wait_for(run, 10) == 0


async def test_a_worker_stopped_on_purpose_while_it_boots_is_restarted(tmp_path: Path) -> None:
    """A worker that an operator's SIGTERM stops before it served exits 0: a stop, not a boot
    failure. It is started again as a worker that ends after it served, and the supervisor goes
    on to serve, then exits 0 on its own SIGTERM (it ended with status 1)."""
    waiting = tmp_path / "worker-2-waits"
    starts: list[int] = []

    def command(index: int, fd: int) -> list[str]:
        starts.append(index)
        if index == 2 and starts.count(2) == 1:  # its first process boots until the test stops it
            return [sys.executable, "-c", _GATED_WORKER, str(fd), str(waiting)]
        return [sys.executable, "-c", _FAKE_WORKER, str(fd)]

    supervisor = Supervisor(2, command, policy=RestartPolicy(first_delay=0.01, max_delay=0.05))
    served: list[list[int]] = []
    run = asyncio.create_task(supervisor.run(ready=served.append))
    second = supervisor.slots[1]
    await async_wait_for(waiting.exists, timeout=BOOT, message="worker 2 booting")
    assert second.process is not None
    stopped = second.process.pid
    os.kill(stopped, signal.SIGTERM)  # the operator's, to the worker alone
    await async_wait_for(lambda: run.done() or served, timeout=10, message="worker 2 started again and serving")
    assert not run.done(), f"the supervisor stopped with {run.result()}"
    assert len(served[0]) == 2 and stopped not in served[0]
    os.kill(os.getpid(), signal.SIGTERM)  # heard by the supervisor's handler while it runs
    assert await asyncio.wait_for(run, 10) == 0


# Ignores SIGTERM: a worker that never stops on its own.
_DEAF_WORKER = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "os.write(int(sys.argv[1]), {ready!r}); os.close(int(sys.argv[1]))\n"
    "while True: signal.pause()\n"
).format(ready=READY_LINE)


async def test_a_second_signal_brings_the_kill_of_a_worker_that_does_not_stop_closer(
        caplog: pytest.LogCaptureFixture) -> None:
    """The first signal's bound is long (a minute here); a second signal hurries the stop, so a
    worker that still runs is killed once the hurried bound and the margin have passed."""
    supervisor = Supervisor(2, lambda index, fd: [sys.executable, "-c", _FAKE_WORKER if index == 1 else _DEAF_WORKER,
                                                  str(fd)],
                            stop_bound=StopBound(seconds=60, hurried=0.1, margin=0.2, hurried_why="a test's bound"))
    served: list[list[int]] = []
    run = asyncio.create_task(supervisor.run(ready=served.append))
    await async_wait_for(lambda: served, timeout=BOOT, message="both fake workers ready")
    deaf = served[0][1]
    os.kill(os.getpid(), signal.SIGTERM)  # heard by the supervisor's handler while it runs
    await async_wait_for(lambda: supervisor.pids == [deaf], timeout=5, message="worker 1 stopped")
    assert not run.done()
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(run, 5) == 1
    assert not alive(deaf)
    killed = [r.getMessage() for r in caplog.records if "SIGKILL" in r.getMessage()]
    assert len(killed) == 1 and f"worker 2 (pid {deaf}) did not stop" in killed[0], killed
    assert "of the second stop signal (a test's bound): killed it with SIGKILL" in killed[0], killed


async def test_an_operators_signal_after_the_supervisor_stopped_its_workers_is_named_as_such(
        caplog: pytest.LogCaptureFixture) -> None:
    """A boot failure makes the supervisor stop the workers itself; an operator's signal then is
    their second, which hurries them, but the operator's first: the kill it brings names it so."""
    supervisor = Supervisor(2, lambda index, fd: [sys.executable, "-c",
                                                  _DEAF_WORKER if index == 1 else "import sys; sys.exit(3)", str(fd)],
                            stop_bound=StopBound(seconds=60, hurried=0.1, margin=0.2, hurried_why="a test's bound"))
    run = asyncio.create_task(supervisor.run())
    await async_wait_for(lambda: "before it served: stopping" in caplog.text, timeout=BOOT,
                         message="worker 2's boot failure")
    os.kill(os.getpid(), signal.SIGTERM)  # heard by the supervisor's handler while it runs
    assert await asyncio.wait_for(run, 5) == 3
    killed = [r.getMessage() for r in caplog.records if "SIGKILL" in r.getMessage()]
    assert len(killed) == 1 and "worker 1 (pid" in killed[0], killed
    assert "of a stop signal after the supervisor's own SIGTERM (a test's bound)" in killed[0], killed


@pytest.mark.parametrize("drain,with_jobs,seconds", [(0, False, 5), (60, False, 65), (0, True, 35), (60, True, 65)])
def test_a_workers_stop_is_bounded_by_its_drain_and_its_runtimes_shutdown_timeout(drain: float, with_jobs: bool,
                                                                                 seconds: float) -> None:
    """The bound the supervisor gives a worker's stop: the longer of --drain-seconds and, with
    --with-jobs, the runtime's 30 s shutdown timeout, plus 5 s for the closes; after a second
    signal, the closes alone; each plus LIVEPUSH_WORKER_STOP_MARGIN."""
    bound = stop_bound(Settings(drain_seconds=drain, worker_stop_margin=2.5), with_jobs=with_jobs)
    assert (bound.seconds, bound.hurried, bound.margin) == (seconds, 5, 2.5)
    assert "LIVEPUSH_WORKER_STOP_MARGIN's 2.5 s" in bound.why and f"LIVEPUSH_DRAIN_SECONDS={drain:g}" in bound.why
    assert ("shutdown timeout of 30 s" in bound.why) == with_jobs


def test_a_workers_stop_bound_names_the_drain_as_the_operator_gave_it() -> None:
    """The bound's reason, in the line of a worker killed for outliving it, names the drain's
    setting as it was given: LIVEPUSH_DRAIN_SECONDS when the variable set it, not a --drain-seconds
    the operator never typed."""
    flags = {"drain_seconds": "--drain-seconds"}
    by_variable = Settings.from_env({"LIVEPUSH_DRAIN_SECONDS": "60"}, flags=flags)
    assert "LIVEPUSH_DRAIN_SECONDS=60 (or --drain-seconds)" in stop_bound(by_variable, with_jobs=False).why
    by_flag = Settings.from_env({}, flags=flags).replace(drain_seconds=60.0)
    why = stop_bound(by_flag, with_jobs=False).why
    assert "--drain-seconds 60" in why and "LIVEPUSH_DRAIN_SECONDS" not in why, why


def test_a_worker_whose_supervisor_is_gone_when_it_serves_says_ready_to_no_one_without_failing() -> None:
    """A supervisor killed outright while a worker boots leaves that worker's "ready" with no
    reader. Its parent-death SIGTERM stops the worker; saying ready must not fail first, which
    ended the server with a traceback and without closing the connections it already held."""
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # the supervisor's end, gone with it
    WorkerRole(1, write_fd, os.getpid()).tell_ready()
    with pytest.raises(OSError):
        os.fstat(write_fd)  # closed all the same


def test_workers_with_no_writable_temporary_folder_are_refused_naming_tmpdir(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, secret: str) -> None:
    """The workers' metrics live in a folder the supervisor makes in the temporary folder. Where
    none can be made (a container whose root is read-only, with no volume on /tmp), `serve
    --workers N` stopped with a traceback; it is refused with one line naming TMPDIR instead."""
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setattr("tempfile.tempdir", str(not_a_folder))
    settings = Settings(fanout="postgres", database_url="postgresql://unused/db", secret=secret, host="127.0.0.1",
                        port=0)
    with pytest.raises(ConfigError, match="TMPDIR") as refused:
        supervise(2, ["serve", "--workers", "2"], settings)
    assert str(not_a_folder) in str(refused.value)


async def test_a_deploys_sigterm_lets_every_workers_runtime_finish_the_job_in_hand(procs, livepush_env,
                                                                                 pg_url) -> None:
    """serve --workers 2 --with-jobs, SIGTERM to the supervisor (a deploy) while a worker runs a
    3 s job: that worker's runtime finishes it before the worker exits, the supervisor exits 0,
    and the job succeeded on its one attempt, neither given back nor left running."""
    from tests.support.slow_jobs import started_slow_job

    env = livepush_env(database_url=pg_url, port=0)
    child, port = await start_workers(procs, env, "--workers", "2", "--with-jobs", "tests.support.slow_jobs")
    await workers_by_index(port, 2)
    job = await started_slow_job(pg_url, 3.0)
    child.signal(signal.SIGTERM)
    assert await child.await_exit(30) == 0, child.output()
    assert (job(), attempt_of(pg_url, job.id)) == ("succeeded", 1)

async def test_the_job_a_killed_worker_ran_runs_again_on_the_worker_started_in_its_place_at_once(
        procs, livepush_env, pg_url) -> None:
    """serve --workers 2 --with-jobs, kill -9 of the worker running a job: nothing is lost. The
    worker started in its place runs on the same machine, so its runtime finds the dead process at
    its start and gives the job back at once (attempt counted), not after three of the 10 s beats
    the surviving worker would wait; the job runs again and succeeds."""
    from tests.support.slow_jobs import started_slow_job

    env = livepush_env(database_url=pg_url, port=0)
    child, port = await start_workers(procs, env, "--workers", "2", "--with-jobs", "tests.support.slow_jobs")
    workers = await workers_by_index(port, 2)
    job = await started_slow_job(pg_url, 3.0)

    def holder() -> int:
        with psycopg.connect(pg_url) as conn:
            row = conn.execute("SELECT r.pid FROM livepush_jobs j JOIN livepush_job_runtimes r ON r.id = j.runtime_id "
                               "WHERE j.id = %s", (job.id,)).fetchone()
        assert row is not None, "the running job names a registered runtime"
        return int(row[0])

    victim = holder()
    assert victim in workers.values()
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    await async_wait_for(lambda: job() == "running" and attempt_of(pg_url, job.id) == 2, timeout=15, interval=0.05,
                         message="the job to run again")
    # Well within the three 10 s beats a rescue by the surviving worker alone would take.
    assert time.monotonic() - killed_at < 15
    await async_wait_for(lambda: job() == "succeeded", timeout=15, message="the job to succeed")
    assert child.running
    assert child.stop(15) == 0, child.output()


def attempt_of(pg_url: str, job_id: int) -> int:
    with psycopg.connect(pg_url) as conn:
        return int(conn.execute("SELECT attempt FROM livepush_jobs WHERE id = %s", (job_id,)).fetchone()[0])
