"""`livepush serve --workers N` (docs/reference.md#3-commands): how many processes, the port they
share, and how a worker learns it is one.

With N > 1 this process becomes the supervisor (livepush/server/supervisor.py) and each worker
is `livepush serve` again, run as is (its own fan-out listener, sessions and rules) on the same
port: every worker binds its own socket with SO_REUSEPORT and the kernel spreads new connections
over them. The supervisor holds the port too (bound, never listening, so it gets no connection):
`--port 0` becomes one concrete port that every worker, and every restarted one, binds.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..types import shown
from .. import metrics
from ..config import MAX_WORKERS, Settings, named_setting, read_number
from ..errors import ConfigError

if TYPE_CHECKING:
    from ..server.supervisor import StopBound

log = logging.getLogger("livepush.workers")

WORKERS_VARIABLE = "LIVEPUSH_WORKERS"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# The workers' metrics folder, in the temporary folder, and the file in it that the supervisor and
# each of its workers hold locked (shared) for as long as they live: a folder whose lock anyone
# can take alone is one nobody uses. Not a `.db` file, which prometheus_client reads as metrics.
_FOLDER_PREFIX = "livepush-metrics-"
_FOLDER_LOCK = "held.lock"
_held_folder: int | None = None  # a worker's hold on it: open until the process exits


def cpu_count(cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
              own_cgroup: str | os.PathLike[str] = "/proc/self/cgroup") -> int:
    """The cores this process may use: those it may run on (its affinity, not the machine's
    total), or fewer when its cgroup's CPU limit allows fewer (a container's `limits.cpu`: its
    affinity still spans every core of the machine), rounded up."""
    counted = getattr(os, "process_cpu_count", None)  # Python 3.13
    if counted is not None:
        cores = counted() or 1
    else:
        try:
            cores = len(os.sched_getaffinity(0)) or 1
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
    limit = _cgroup_cpu_limit(Path(cgroup_root), Path(own_cgroup))
    return min(cores, limit) if limit is not None else cores


def _cgroup_cpu_limit(root: Path, own_cgroup: Path) -> int | None:
    """The cores the CPU quota of this process's cgroup and its ancestors allows (quota over
    period, rounded up), None when none is set or none can be read. cgroup v2 (`cpu.max`) and
    v1 (`cpu.cfs_quota_us` over `cpu.cfs_period_us`). Inside a container the path the process
    names is the host's, which the container's tree lacks: its root, read too, holds the limit."""
    try:
        lines = own_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    files: tuple[str, ...]
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2: one tree
            trees, files = [root], ("cpu.max",)
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own tree
            trees, files = [root / controllers, root / "cpu"], ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        else:
            continue
        for tree in trees:
            folder = tree / path.strip("/")
            for ancestor in (folder, *folder.parents):
                limit = _cpu_quota(ancestor, files)
                if limit is not None:
                    limits.append(limit)
                if ancestor == tree:
                    break
    return min(limits) if limits else None


def _cpu_quota(folder: Path, files: tuple[str, ...]) -> int | None:
    """The cores one cgroup's quota allows, None without one (`max`, -1, no file, unreadable)."""
    try:
        if len(files) == 1:
            quota, period = (folder / files[0]).read_text().split()[:2]
        else:
            quota, period = ((folder / name).read_text().strip() for name in files)
        if quota in ("max", "-1"):
            return None
        return max(1, -(-int(quota) // int(period)))  # rounded up: half a core is one worker
    except (OSError, ValueError, ZeroDivisionError):
        return None


def worker_count(flag: str | None, environ: Mapping[str, str] | None = None) -> int:
    """The number of workers `--workers` (else LIVEPUSH_WORKERS, else 1) asks for."""
    env = os.environ if environ is None else environ
    if flag is not None and not flag.strip():
        # `--workers "$N"` with N unset: one process where many were meant, and nothing said.
        # (An empty LIVEPUSH_WORKERS is unset, as every empty setting is.)
        raise ConfigError(f"--workers {shown(flag, width=40)} is empty: give a whole number from 1 to {MAX_WORKERS}, or auto "
                          f"(one per core), or leave the flag out ({WORKERS_VARIABLE} then says, else one process)")
    text = (flag if flag is not None else env.get(WORKERS_VARIABLE, "")).strip() or "1"
    if text.lower() == "auto":
        return cpu_count()
    try:
        count = int(read_number(text, int))
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_WORKERS:
        raise ConfigError(f"{workers_named(flag, env, lambda text: shown(text, width=40))} is not a number of processes: use a whole "
                          f"number from 1 to {MAX_WORKERS}, or auto (one per core)")
    return count


def workers_named(flag: str | None, environ: Mapping[str, str] | None = None,
                  shown: Callable[[str], str] = str) -> str:
    """The worker count as the operator gave it, for an error: the flag, whose variable is then
    not read, else the variable with the flag beside it (as Settings.named() does)."""
    env = os.environ if environ is None else environ
    text = flag if flag is not None else env.get(WORKERS_VARIABLE, "")
    return named_setting("workers", shown(text.strip()), "--workers", given_by_flag=flag is not None)


@dataclass(frozen=True)
class WorkerRole:
    """What the supervisor tells a worker on its command line (a hidden flag)."""

    index: int
    ready_fd: int  # the pipe on which it says "ready" once it serves
    parent: int  # the supervisor's pid

    def __str__(self) -> str:
        return f"index={self.index},ready_fd={self.ready_fd},parent={self.parent}"

    @classmethod
    def parse(cls, text: str) -> WorkerRole:
        try:
            fields = dict(part.split("=", 1) for part in text.split(","))
            return cls(int(fields["index"]), int(fields["ready_fd"]), int(fields["parent"]))
        except (ValueError, KeyError):
            raise ConfigError(f"--supervised-as {text!r}: only `serve --workers` sets this flag") from None

    def start(self) -> None:
        """Die with the supervisor: if it is killed outright, its workers get SIGTERM and stop."""
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != self.parent:  # it died before the line above took effect
            raise SystemExit(0)

    def hold_metrics_folder(self) -> None:
        """Hold the metrics folder for this worker's life: a supervisor killed outright leaves its
        workers stopping, and the next one to start must not take their folder for abandoned."""
        global _held_folder
        folder = os.environ.get(metrics.MULTIPROCESS_DIR_VARIABLE)
        if not folder:
            return
        import fcntl  # here: a process that serves without workers needs no POSIX file locks
        try:
            fd = os.open(os.path.join(folder, _FOLDER_LOCK), os.O_RDWR)
        except OSError:  # no lock there: nothing to hold
            return
        fcntl.flock(fd, fcntl.LOCK_SH)
        _held_folder = fd

    def tell_ready(self, _server: object = None) -> None:
        """Say "ready" on the supervisor's pipe: this worker serves."""
        from ..server.supervisor import READY_LINE

        try:
            os.write(self.ready_fd, READY_LINE)
        except BrokenPipeError:
            # The supervisor was killed outright while this worker booted: its parent-death
            # SIGTERM stops the worker with a drain, which a failure here would have cut short.
            log.info("the supervisor is gone: no one to tell that worker %d serves", self.index)
        finally:
            os.close(self.ready_fd)


def reserve_port(settings: Settings) -> tuple[list[socket.socket], int]:
    """Bind (never listen) the settings' host and port with SO_REUSEPORT on each of the host's
    addresses; with port 0, the first address's pick is the port of all. The sockets hold it
    while workers come and go."""
    from ..server.run import listen_error

    host, port = settings.host, settings.port
    held: list[socket.socket] = []
    try:
        # Inside the try: a host that does not resolve is the operator's to fix, not a traceback.
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in dict.fromkeys(infos):
            # First without SO_REUSEPORT, which would let this supervisor join the port of another
            # `serve --workers` (any process of this user that set it): the kernel would split the
            # connections between the two without a word. A port in use is an error, as for one
            # process. (SO_REUSEADDR as asyncio sets it: a stopped server's TIME_WAIT is no user.)
            with _bound_socket(family, kind, proto, (address[0], port, *address[2:]), reuse_port=False) as probe:
                port = probe.getsockname()[1]
            held.append(_bound_socket(family, kind, proto, (address[0], port, *address[2:]), reuse_port=True))
    except OSError as exc:
        for sock in held:
            sock.close()
        raise listen_error(host, port, exc, host_setting=settings.named("host"),
                           port_setting=settings.named("port")) from None
    return held, port


def _bound_socket(family: int, kind: int, proto: int, address: tuple[Any, ...], *, reuse_port: bool) -> socket.socket:
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:  # as asyncio binds: one family per socket
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def make_metrics_folder() -> tuple[str, int]:
    """A new folder for the workers' metrics files, and the fd of this supervisor's hold on it
    (close it once the folder is removed). The folders of supervisors that were killed outright
    (SIGKILL runs no clean-up) are removed first: without it each such kill left one behind."""
    import fcntl  # here: a process that serves without workers needs no POSIX file locks

    base = tempfile.gettempdir()
    _remove_abandoned_folders(base)
    folder = tempfile.mkdtemp(prefix=_FOLDER_PREFIX, dir=base)
    # Locked under another name, then renamed: a supervisor that starts meanwhile sees either no
    # lock (and leaves the folder alone) or a lock already held, never one it could take.
    fd = os.open(os.path.join(folder, _FOLDER_LOCK + ".new"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.rename(os.path.join(folder, _FOLDER_LOCK + ".new"), os.path.join(folder, _FOLDER_LOCK))
    return folder, fd


def _remove_abandoned_folders(base: str) -> None:
    """Remove every metrics folder whose lock no supervisor or worker holds any more. One with no
    lock (another user's, an older livepush's) is never judged."""
    import fcntl

    for folder in glob.glob(os.path.join(glob.escape(base), _FOLDER_PREFIX + "*")):
        try:
            fd = os.open(os.path.join(folder, _FOLDER_LOCK), os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # taken alone: no process uses it
            shutil.rmtree(folder, ignore_errors=True)
            log.info("removed %s, the metrics folder of a supervisor killed outright", folder)
        except BlockingIOError:
            pass  # a live supervisor's, or its workers' that are still stopping
        finally:
            os.close(fd)


def _interpreter_options() -> list[str]:
    """`-P`: a worker's imports do not start in the current folder, as the console script's do not
    (`python -m` would put it first, and a project's own redis.py or websockets.py would be
    imported in place of the library); its --app and --with-jobs modules are found there all the
    same (usercode.importable_from_cwd). Without it only when livepush itself is found there: run from its
    own checkout, where that folder holds livepush and nothing else to mistake."""
    package_root = Path(__file__).resolve().parents[2]
    try:
        here = Path.cwd().resolve()
    except FileNotFoundError:
        return ["-P"]  # a removed folder holds no livepush, and `python -m` could not add it
    return [] if package_root == here else ["-P"]


def stop_bound(settings: Settings, *, with_jobs: bool) -> StopBound:
    """How long a worker's stop may take (docs/reference.md#3-commands): the longer of its paced
    drain and, with --with-jobs, its runtime's shutdown timeout, plus the closes (the close
    handshakes, then the loop's wait for tasks that run on); after a second signal, which ends
    both at once, the closes alone. Each plus LIVEPUSH_WORKER_STOP_MARGIN."""
    from ..loops import SETTLE_SECONDS
    from ..server.core import STOP_SECONDS
    from ..server.supervisor import StopBound

    closes = STOP_SECONDS + SETTLE_SECONDS
    # As the operator gave it: a LIVEPUSH_DRAIN_SECONDS named as --drain-seconds sent them to a flag they never typed.
    why = settings.named("drain_seconds", f"{settings.drain_seconds:g}")
    longest = settings.drain_seconds
    if with_jobs:
        from ..jobs.runtime.runtime import DEFAULT_SHUTDOWN_TIMEOUT

        why = f"the longer of {why} and the job runtime's shutdown timeout of {DEFAULT_SHUTDOWN_TIMEOUT:g} s"
        longest = max(longest, DEFAULT_SHUTDOWN_TIMEOUT)
    margin = f"plus LIVEPUSH_WORKER_STOP_MARGIN's {settings.worker_stop_margin:g} s"
    return StopBound(seconds=longest + closes, hurried=closes, margin=settings.worker_stop_margin,
                     why=f"{why}, plus {closes:g} s for the closes, {margin}",
                     hurried_why=f"which hurries its stop: {closes:g} s for the closes, {margin}")


def supervise(count: int, argv: Sequence[str], settings: Settings, *, with_jobs: bool = False) -> int:
    """Run `count` workers of `livepush serve ARGV` on one port until a signal; the exit status."""
    import asyncio

    from ..server.run import host_port
    from ..server.supervisor import Supervisor

    if not sys.platform.startswith("linux"):
        raise ConfigError("--workers above 1 needs Linux (the kernel's SO_REUSEPORT balancing): run one "
                          "`livepush serve` per port instead")
    held, port = reserve_port(settings)
    # Every worker's metrics go to files here; /metrics on any worker adds them up (livepush/metrics.py).
    try:
        metrics_dir, hold = make_metrics_folder()
    except OSError as exc:
        # A container whose root is read-only, with no volume on /tmp: one process serves there,
        # and N need a place for their shared metrics.
        for sock in held:
            sock.close()
        raise ConfigError(f"--workers {count} keeps the workers' metrics in a folder it makes in the temporary "
                          f"folder, and could not make one ({exc}): set TMPDIR to a folder this user may write "
                          "(with a read-only root, mount a writable volume, e.g. on /tmp), or run one worker") from None
    parent = os.getpid()

    def command(index: int, ready_fd: int) -> list[str]:
        role = WorkerRole(index, ready_fd, parent)
        return [sys.executable, *_interpreter_options(), "-m", "livepush", *argv,
                "--workers", "1", "--port", str(port), "--supervised-as", str(role)]

    def serving(pids: list[int]) -> None:
        log.info("livepush serving on ws://%s with %d workers, pids %s (fan-out: %s)", host_port(settings.host, port),
                 count, ", ".join(map(str, pids)), settings.fanout)

    def exited(pid: int) -> None:
        # A worker's files are named by its index (metrics.add_up_workers): find the slot it held.
        for slot in supervisor.slots:
            if slot.process is not None and slot.process.pid == pid:
                metrics.forget_worker(slot.index, metrics_dir)

    supervisor = Supervisor(count, command, env={**os.environ, metrics.MULTIPROCESS_DIR_VARIABLE: metrics_dir},
                            on_exit=exited, stop_bound=stop_bound(settings, with_jobs=with_jobs))
    try:
        _watch_workers_without_threads()
        return asyncio.run(supervisor.run(ready=serving))
    finally:
        for sock in held:
            sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
        os.close(hold)


def _watch_workers_without_threads() -> None:
    """Keep the supervisor to one thread. A worker's parent-death SIGTERM (WorkerRole.start) is
    sent each time the kernel gives it a new parent: a supervisor killed outright whose main thread
    dies first hands its workers to another of its threads, then to init, and the second SIGTERM
    cuts each worker's drain short. Python 3.11's default child watcher runs a thread per worker;
    from 3.12 on asyncio watches a child through a pidfd, with no thread, by itself."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    import asyncio

    try:
        # A kernel before 5.3, or a container's seccomp profile, refuses pidfds: keep the default.
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return
    asyncio.get_event_loop_policy().set_child_watcher(asyncio.PidfdChildWatcher())
