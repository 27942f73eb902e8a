"""Servers under test, each in its own process so it has a core to itself as far as possible.

- `bare`: a `websockets` 17 broadcast server with no livepush in it (uvloop,
  `websockets.broadcast`, compression off, no keepalive pings): the ceiling. A client's topic
  is its request path without the leading `/` (`/` alone: the default topic).
  `bare-deflate` is the same with `websockets`' default compression (permessage-deflate
  accepted when the client offers it, as browsers do).
- `local`: livepush's `PushServer` with the local fan-out. That fan-out only delivers inside
  its own process, so this harness publishes for the benchmark: every line written to its
  control socket is one `fanout.publish("<topic>", data)` from the server's own loop.
- `postgres`, `redis`: the real `python -m livepush serve` (see `start_livepush_cli`); the
  benchmark publishes from its own process, as an application would.

A control line is the data JSON (published on the default topic) or `TOPIC<TAB>DATA JSON`. For
`bare`, the frame sent has the same shape as livepush's `message` frame (built by concatenation,
as livepush does), so clients cannot tell them apart.

Run as `python bench/_servers.py KIND PORT CONTROL_SOCKET [TOPIC]`; prints `READY <port>` (the local one: `READY <port> <origin>`, the default topic's offset before its first message, a `since` that replays it from the start).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


async def _control(path: str, publish) -> asyncio.AbstractServer:
    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            publish(line.rstrip(b"\n").decode())

    return await asyncio.start_unix_server(on_conn, path, limit=2**24)


def _split(line: str, default_topic: str) -> tuple[str, str]:
    """(topic, data JSON) of a control line."""
    topic, tab, data_json = line.partition("\t")
    return (topic, data_json) if tab else (default_topic, line)


async def run_bare(port: int, control: str, topic: str, compression: str | None = None) -> None:
    import websockets
    from websockets.asyncio.server import serve

    clients: dict[str, set] = {}
    offsets: dict[str, int] = {}

    async def handler(ws) -> None:
        name = ws.request.path[1:] or topic
        members = clients.setdefault(name, set())
        members.add(ws)
        try:
            await ws.wait_closed()
        finally:
            members.discard(ws)

    def publish(line: str) -> None:
        name, data_json = _split(line, topic)
        offset = offsets[name] = offsets.get(name, 0) + 1
        frame = '{"op":"message","topic":"' + name + '","offset":"' + str(offset) + '","data":' + data_json + "}"
        websockets.broadcast(clients.get(name, ()), frame)

    async with serve(handler, "127.0.0.1", port, compression=compression, ping_interval=None, max_size=2**16):
        ctl = await _control(control, publish)
        print(f"READY {port}", flush=True)
        await _until_signal()
        ctl.close()


async def run_local(port: int, control: str, topic: str) -> None:
    from livepush.config import Settings
    from livepush.fanout.local import LocalFanOut
    from livepush.server.app import PushServer

    settings = Settings(secret=os.environ["LIVEPUSH_SECRET"], fanout="local", port=port)
    fanout = LocalFanOut(history_ttl=settings.history_ttl)
    server = PushServer(settings, fanout)
    await server.start()

    def publish(line: str) -> None:
        name, data_json = _split(line, topic)
        fanout.publish(name, json.loads(data_json))  # what livepush.publish() costs in-process

    ctl = await _control(control, publish)
    # Each topic takes its epoch at its first publish: before it, the origin stands for its start.
    print(f"READY {server.port} {fanout.latest_offset(topic)}", flush=True)
    await _until_signal()
    ctl.close()
    await server.stop()


async def _until_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def main() -> None:
    sys.path.insert(0, HERE)
    from _clients import raise_fd_limit

    raise_fd_limit()
    kind, port, control = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    topic = sys.argv[4] if len(sys.argv) > 4 else "bench:x"
    import uvloop

    if kind == "local":
        uvloop.run(run_local(port, control, topic))
    else:
        uvloop.run(run_bare(port, control, topic, "deflate" if kind == "bare-deflate" else None))


# -- benchmark side --------------------------------------------------------------------
class ServerProcess:
    """A server child process; `publish_line()` feeds the harness's control socket."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, control: str | None, log: str,
                 origin: str | None = None) -> None:
        self.proc = proc
        # The local harness's default topic before its first message (a `since` that replays it
        # from the start); None for the others.
        self.origin = origin
        self.log = log
        self.port = port
        self.control = control
        self._writer: asyncio.StreamWriter | None = None

    async def connect_control(self) -> None:
        if self.control is not None:
            _, self._writer = await asyncio.open_unix_connection(self.control)

    def publish_line(self, data_json: str, topic: str | None = None) -> None:
        assert self._writer is not None
        line = data_json if topic is None else f"{topic}\t{data_json}"
        self._writer.write(line.encode() + b"\n")

    async def drain(self) -> None:
        if self._writer is not None:
            await self._writer.drain()

    async def stop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, 10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.control is not None and os.path.exists(self.control):
            os.unlink(self.control)


    def log_tail(self, lines: int = 5) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


def start_harness(kind: str, port: int, control: str, env: dict[str, str], topic: str = "bench:x") -> ServerProcess:
    """A `bare`, `bare-deflate` or `local` server process; its stderr goes to CONTROL.log."""
    log = control + ".log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "_servers.py"), kind, str(port), control, topic],
            stdout=subprocess.PIPE, stderr=err, env=env, cwd=ROOT,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("READY"):
        proc.kill()
        raise RuntimeError(f"{kind} server did not start (exit {proc.wait()}): {open(log).read()[-500:]}")
    words = line.split()
    return ServerProcess(proc, int(words[1]), control, log, words[2] if len(words) > 2 else None)


def start_livepush_cli(port: int, env: dict[str, str], log: str, args: tuple[str, ...] = ()) -> ServerProcess:
    """`python -m livepush serve [args]` (stderr to `log`), ready once /healthz answers 200 and,
    with several workers, once the supervisor says every one of them serves: the first worker to
    answer /healthz would otherwise get every subscriber that connects before the others listen."""
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "livepush", "serve", *args], env={**env, "LIVEPUSH_PORT": str(port)}, cwd=ROOT,
            stderr=err,
        )
    several = workers(args, env) > 1
    deadline = time.monotonic() + 20
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"livepush serve exited with status {proc.returncode}: {open(log).read()[-500:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                if r.status == 200 and (not several or SUPERVISOR_READY in open(log).read()):
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("livepush serve did not answer /healthz with 200 (with every worker serving) within 20 s")
        time.sleep(0.1)
    return ServerProcess(proc, port, None, log)


# What `livepush serve --workers N` logs once all N workers serve (livepush/cli/workers.py).
SUPERVISOR_READY = " workers, pids "


def workers(args: tuple[str, ...], env: dict[str, str]) -> int:
    """How many workers `serve args` runs under `env`, as the CLI counts them."""
    from livepush.cli.workers import worker_count

    return worker_count(args[args.index("--workers") + 1] if "--workers" in args else None, env)


if __name__ == "__main__":
    main()
