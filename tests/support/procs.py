"""Child processes for tests: start one, wait until it serves /healthz, signal it, wait for its
exit (always with a bound), and kill it at teardown whatever happened.

Output goes to files, not pipes: a chatty child can never block on a full pipe, and a failure
message can quote what it printed. Each child runs in its own session so a kill reaches the
processes it started too.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import random
import select
import shutil
from signal import SIGINT, SIGKILL, SIGTERM
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

REPO_ROOT = Path(__file__).resolve().parents[2]

HEALTH_TIMEOUT = 15.0
POLL_INTERVAL = 0.02


# Ports handed out by this run: a child may not have bound its port yet when the next is asked for.
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, for a child to bind.

    Drawn below the kernel's ephemeral range: a port the kernel picks for `bind(0)` is one it
    also gives to outgoing connections, so under a test's client traffic another socket could
    take it between this check and the child's bind ("address already in use")."""
    high = _ephemeral_low()
    low = max(1024, high - 12000)
    for _ in range(200):
        port = random.randrange(low, high)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free TCP port on 127.0.0.1 in {low}-{high - 1} after 200 tries")


def fork_running(body: Callable[[], object]) -> int:
    """Fork: the child runs `body` and exits 0 when it returns, 1 when it raises, never returning
    into pytest; the parent gets the child's pid (for forked_exit_status())."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            body()
            status = 0
        finally:
            os._exit(status)
    return pid


def forked_exit_status(pid: int, timeout: float) -> int:
    """The exit status of forked child `pid` once it exits within `timeout` seconds (its pidfd
    becomes readable when it does); else it is killed (it must not outlive the test) and
    AssertionError says it hung."""
    exited = os.pidfd_open(pid)
    try:
        if not select.select([exited], [], [], timeout)[0]:
            os.kill(pid, SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the forked child {pid} did not exit within {timeout} s: killed")
    finally:
        os.close(exited)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def stop_while_connecting(start: Callable[[str], ChildProcess], timeout: float = 10.0) -> ChildProcess:
    """Start a command on a database URL whose server accepts the connection and says nothing,
    send it SIGTERM once it is connecting (its start-up under way), and wait for it to exit within
    `timeout`: the process, for its exit code and output."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        child = start(f"postgresql://postgres@127.0.0.1:{silent.getsockname()[1]}/app?connect_timeout=60")
        silent.settimeout(20)
        peer, _ = silent.accept()
        try:
            child.signal(SIGTERM)
            child.wait(timeout)
        finally:
            peer.close()
    return child


# The child's source: a finder placed first on sys.meta_path holds the named module's import up,
# once, after creating the marker file that tells the test the stall has begun.
_STALLED_IMPORT = """
import importlib.abc, runpy, sys, time

class Stall(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            open({started!r}, "w").close()
            time.sleep({stall!r})
        return None

sys.meta_path.insert(0, Stall())
sys.argv[0] = "livepush"
{entry}
"""

# How the command line is started: as the console script does, or as `python -m livepush`.
_ENTRIES = {
    "script": "from livepush.cli import main\nsys.exit(main())",
    "module": 'runpy.run_module("livepush", run_name="__main__", alter_sys=True)',
}


def stalled_import_script(module: str, stall: float, started: Path,
                          entry: Literal["script", "module"] = "module") -> str:
    """Source for `python -c SOURCE ARGS...` that runs `livepush ARGS...` from `entry` with the
    import of `module` held up `stall` seconds; the file `started` appears as the stall begins,
    so a test can send a signal at that moment of the start."""
    return _STALLED_IMPORT.format(module=module, started=str(started), stall=stall, entry=_ENTRIES[entry])


class ChildProcess:
    """One child process whose stdout and stderr are captured to files."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        name: str | None = None,
        port: int | None = None,
    ) -> None:
        self.args = [str(a) for a in args]
        self.name = name or " ".join(self.args[:4])
        self.port = port
        self._dir = Path(tempfile.mkdtemp(prefix="livepush-proc-"))
        self._stdout = open(self._dir / "stdout", "wb")  # noqa: SIM115 -- closed in close()
        self._stderr = open(self._dir / "stderr", "wb")  # noqa: SIM115
        self.popen = subprocess.Popen(
            self.args,
            env=dict(env) if env is not None else None,
            cwd=str(cwd or REPO_ROOT),
            stdin=subprocess.DEVNULL,
            stdout=self._stdout,
            stderr=self._stderr,
            start_new_session=True,
        )

    # ---- state and output ---------------------------------------------------------------------

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    def stdout(self) -> str:
        return self._read("stdout")

    def stderr(self) -> str:
        return self._read("stderr")

    def _read(self, which: str) -> str:
        try:
            return (self._dir / which).read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def output(self, limit: int = 6000) -> str:
        """The end of stderr and stdout, for an assertion message."""

        def tail(text: str) -> str:
            text = text.strip()
            return text if len(text) <= limit else "...\n" + text[-limit:]

        return f"--- stderr of {self.name} ---\n{tail(self.stderr())}\n--- stdout ---\n{tail(self.stdout())}"

    def _fail(self, what: str) -> AssertionError:
        code = self.returncode
        state = "still running" if code is None else f"exited with {code}"
        return AssertionError(f"{self.name} (pid {self.pid}, {state}): {what}\n{self.output()}")

    # ---- health -------------------------------------------------------------------------------

    def _health_port(self, port: int | None) -> int:
        port = port or self.port
        if not port:
            raise ValueError(f"{self.name}: no port to check: pass port= when starting or waiting")
        return port

    def wait_healthy(self, timeout: float = HEALTH_TIMEOUT, *, port: int | None = None, path: str = "/healthz") -> None:
        """Block until GET http://127.0.0.1:PORT/healthz answers 200; fail with the child's output."""
        port = self._health_port(port)
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while True:
            if not self.running:
                raise self._fail(f"exited before GET {path} on port {port} answered 200 ({last})")
            status = _http_status(port, path)
            if status == 200:
                return
            last = f"last answer: {status}" if isinstance(status, int) else f"last error: {status}"
            if time.monotonic() >= deadline:
                raise self._fail(f"GET {path} on port {port} did not answer 200 within {timeout:g} s ({last})")
            time.sleep(POLL_INTERVAL)

    async def await_healthy(
        self, timeout: float = HEALTH_TIMEOUT, *, port: int | None = None, path: str = "/healthz"
    ) -> None:
        """`wait_healthy` for async tests: polls without blocking the event loop."""
        port = self._health_port(port)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last = "no answer yet"
        while True:
            if not self.running:
                raise self._fail(f"exited before GET {path} on port {port} answered 200 ({last})")
            status = await _async_http_status(port, path)
            if status == 200:
                return
            last = f"last answer: {status}" if isinstance(status, int) else f"last error: {status}"
            if loop.time() >= deadline:
                raise self._fail(f"GET {path} on port {port} did not answer 200 within {timeout:g} s ({last})")
            await asyncio.sleep(POLL_INTERVAL)

    # ---- signals and exit ---------------------------------------------------------------------

    def signal(self, sig: int = SIGTERM, *, group: bool = False) -> None:
        """Send `sig` to the child (or, with group=True, to every process it started as well)."""
        if not self.running:
            return
        try:
            if group:
                os.killpg(self.pid, sig)
            else:
                self.popen.send_signal(sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        self.signal(SIGTERM)

    def interrupt(self) -> None:
        self.signal(SIGINT)

    def wait(self, timeout: float = 10.0) -> int:
        """The exit code, once the child exits within `timeout` s; else AssertionError with its output."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise self._fail(f"did not exit within {timeout:g} s") from None

    async def await_exit(self, timeout: float = 10.0) -> int:
        """`wait` for async tests."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.popen.poll() is None:
            if loop.time() >= deadline:
                raise self._fail(f"did not exit within {timeout:g} s")
            await asyncio.sleep(POLL_INTERVAL)
        return self.popen.returncode

    def stop(self, timeout: float = 10.0, sig: int = SIGTERM) -> int:
        """Signal and wait: the exit code of a graceful stop."""
        self.signal(sig)
        return self.wait(timeout)

    def kill(self) -> None:
        """SIGKILL the child and everything it started; waits (bounded) for it to be reaped."""
        try:
            os.killpg(self.pid, SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """Kill whatever is left (the child's process group included) and drop the output files."""
        self.kill()
        self._stdout.close()
        self._stderr.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> ChildProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ChildProcess {self.name!r} pid={self.pid} returncode={self.returncode}>"


def _http_status(port: int, path: str) -> int | str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        return conn.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        return repr(exc)
    finally:
        conn.close()


async def _async_http_status(port: int, path: str) -> int | str:
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1.0)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 1.0)
        parts = line.decode("latin-1").split()
        if len(parts) >= 2 and parts[1].isdigit():
            return int(parts[1])
        return f"bad status line {line!r}"
    except (OSError, asyncio.TimeoutError) as exc:
        return repr(exc)
    finally:
        if writer is not None:
            writer.close()


class Processes:
    """Every child a test starts; `close_all()` (the `procs` fixture's teardown) kills them all."""

    def __init__(self) -> None:
        self.children: list[ChildProcess] = []

    def start(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        name: str | None = None,
        port: int | None = None,
    ) -> ChildProcess:
        child = ChildProcess(args, env=env, cwd=cwd, name=name, port=port)
        self.children.append(child)
        return child

    def livepush(
        self,
        *args: str,
        env: Mapping[str, str],
        port: int | None = None,
        wait_healthy: bool | None = None,
        timeout: float = HEALTH_TIMEOUT,
        name: str | None = None,
    ) -> ChildProcess:
        """Run `python -m livepush ARGS` with `env` (see the `livepush_env` fixture).

        The port defaults to env["LIVEPUSH_PORT"]. `serve` is waited for until /healthz answers
        200 unless wait_healthy=False; other commands are not waited for unless wait_healthy=True.
        """
        if port is None and env.get("LIVEPUSH_PORT"):
            port = int(env["LIVEPUSH_PORT"])
        child = self.start(
            [sys.executable, "-m", "livepush", *args], env=env, port=port, name=name or f"livepush {' '.join(args)}"
        )
        if wait_healthy is None:
            wait_healthy = bool(args) and args[0] == "serve"
        if wait_healthy:
            child.wait_healthy(timeout)
        return child

    async def alivepush(
        self,
        *args: str,
        env: Mapping[str, str],
        port: int | None = None,
        wait_healthy: bool | None = None,
        timeout: float = HEALTH_TIMEOUT,
        name: str | None = None,
    ) -> ChildProcess:
        """`livepush` for async tests: waits for /healthz without blocking the event loop."""
        child = self.livepush(*args, env=env, port=port, wait_healthy=False, name=name)
        if wait_healthy is None:
            wait_healthy = bool(args) and args[0] == "serve"
        if wait_healthy:
            await child.await_healthy(timeout)
        return child

    def close_all(self) -> None:
        for child in reversed(self.children):
            child.close()
        self.children.clear()
