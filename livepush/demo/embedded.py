"""An embedded PostgreSQL for the demo when no database URL is configured (pgserver)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DependencyError

log = logging.getLogger("livepush.demo")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# The characters, besides letters and digits, that a socket folder's path may have: pgserver
# hands it to pg_ctl as `-o "-k DIR"`, which pg_ctl puts unquoted in a shell command line (a space
# splits it), Postgres reads as a list (a comma), and puts in a URL unencoded (a percent sign).
_PLAIN = frozenset("/._-")


def start(folder: Path) -> tuple[str, Any]:
    """Start (or reattach to) a PostgreSQL whose data lives in `folder`; return (url, handle).

    The data stays inside the project's folder on purpose: run as root, pgserver opens the
    rights of every parent folder of its data directory to its own system user.

    A SIGTERM or SIGINT that arrives meanwhile is held until the start is over (pgserver cut
    short midway would leave a Postgres starting that nobody stops); then the Postgres is
    stopped again and KeyboardInterrupt raised, the stop the signal asked for.
    """
    # platformdirs (imported by pgserver) warns on stderr when this is unset (as under root)
    # or not private.
    run_dir = None
    if "XDG_RUNTIME_DIR" not in os.environ:
        run_dir = _runtime_dir(folder)
        os.environ["XDG_RUNTIME_DIR"] = str(run_dir)
    stops: list[int] = []
    held = {sig: signal.signal(sig, lambda signum, frame: stops.append(signum)) for sig in STOP_SIGNALS}
    # Ctrl-C reaches initdb and pg_ctl too, and pgserver reports their end as an error, with
    # initdb's whole output: a screenful for a stop that was asked for and that the demo makes.
    # Without a stop, its report says why the start failed and stays.
    pgserver_log = logging.getLogger("pgserver")

    def quiet(record: logging.LogRecord) -> bool:
        return not stops

    pgserver_log.addFilter(quiet)
    try:
        try:
            url, server = _start(folder)
        except DependencyError:
            if not stops:
                raise
            # Ctrl-C reaches the terminal's whole process group: it stopped pg_ctl or initdb too,
            # but not a Postgres that pg_ctl had started (it runs in a session of its own).
            _stop_unclaimed(folder)
        else:
            if run_dir is not None:
                # As root, pgserver opened it to its own system user to make the socket in it; once
                # made, only this user connects (and pgserver opens it again for the next start).
                run_dir.chmod(0o700)
            if not stops:
                return url, server
            server.cleanup()
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
        pgserver_log.removeFilter(quiet)
    raise KeyboardInterrupt


def _runtime_dir(folder: Path) -> Path:
    """A private folder for pgserver's lock and, when it cannot be in the data directory,
    Postgres' socket: `folder`/run, or for a project folder too deep for that, whose path has
    spaces or punctuation (see _socket_folder), or that other users could replace, one in /tmp.

    A Unix socket's path holds at most 107 bytes. pgserver puts the socket in the data directory
    when it fits, else in <runtime dir>/python_PostgresServer/<10 hex digits>/, which below
    `folder` would be longer still: the demo could not start at all. And platformdirs takes no
    runtime folder below a folder another user could replace (see _private_parents)."""
    run_dir = folder / "run"
    if (len(os.fsencode(_pgdata(folder) / ".s.PGSQL.5432")) > 107 or not _plain(_pgdata(folder))
            or not _private_parents(folder)):
        run_dir = Path(tempfile.gettempdir()) / f"livepush-demo-{os.geteuid()}"
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    # In a folder everyone may write to, another user may have made it first, or made it a link.
    info = os.lstat(run_dir)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise DependencyError(f"{run_dir} is not a folder of this user's: remove it, or set XDG_RUNTIME_DIR to a "
                              "private folder of yours")
    run_dir.chmod(0o700)
    return run_dir


def _private_parents(folder: Path) -> bool:
    """Whether `folder` and every folder above it belong to this user or root and no one else
    may write in them (unless sticky, as /tmp): platformdirs takes a runtime folder only there.
    Elsewhere (a group-writable project folder, another user's checkout run with sudo) it warned
    on every start, with a line of its own source, and chose a folder of its own."""
    for path in (folder.resolve(), *folder.resolve().parents):
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue  # made by this demo, for this user
        if info.st_uid not in (0, os.geteuid()) or (info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX):
            return False
    return True


def _start(folder: Path) -> tuple[str, Any]:
    try:
        import pgserver
    except ImportError:
        raise ConfigError(
            "no LIVEPUSH_DATABASE_URL is set and the embedded Postgres is not installed: "
            "run bin/demo (it installs it) or `pip install 'livepush[demo]'`, or set LIVEPUSH_DATABASE_URL"
        ) from None
    folder.mkdir(parents=True, exist_ok=True)
    pgdata = _pgdata(folder)
    try:
        if not (pgdata / "PG_VERSION").exists():
            # initdb takes seconds (more on a busy machine) before the URL is printed: say why.
            log.info("creating the embedded Postgres in %s (its first start takes a few seconds)", pgdata)
        with _pgserver_lock():
            _live_handles(pgdata)
            _postmaster(pgdata)
        with _socket_folder():
            server = pgserver.get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:  # pgserver raises plain exceptions for a failed start
        raise DependencyError(f"the embedded Postgres in {folder / 'pg'} did not start ({exc}): delete that folder and retry") from exc
    return server.get_uri(), server


def _plain(path: Path) -> bool:
    return all(c.isalnum() or c in _PLAIN for c in str(path))


@contextlib.contextmanager
def _socket_folder() -> Iterator[None]:
    """pgserver's choice of the folder of Postgres' socket, except that a data directory whose
    path has other characters than _PLAIN (a project in "My Projects/") gets it in pgserver's
    runtime folder, as a path too long for a socket does: in the data directory, Postgres did not
    start at all, or its URL named another folder (pgserver 0.1's function, swapped for the
    call)."""
    from pgserver import postgres_server

    find = postgres_server.find_suitable_socket_dir

    def choose(pgdata: Path, runtime_path: Path) -> Path:
        if _plain(pgdata):
            return find(pgdata, runtime_path)
        socket_dir = Path(runtime_path) / hashlib.sha256(os.fsencode(pgdata)).hexdigest()[:10]
        socket_dir.mkdir(parents=True, exist_ok=True)
        return socket_dir

    postgres_server.find_suitable_socket_dir = choose
    try:
        yield
    finally:
        postgres_server.find_suitable_socket_dir = find


def _pgdata(folder: Path) -> Path:
    return (folder / "pg").resolve()  # as pgserver names it, and as its postmaster's command line does


def _pgserver_lock() -> Any:
    """The lock pgserver takes to start and stop a server (pgserver 0.1's)."""
    from pgserver.postgres_server import PostgresServer

    return PostgresServer._lock


def _live_handles(pgdata: Path) -> list[int]:
    """The processes pgserver counts as using the server in `pgdata`, once the dead are forgotten.

    pgserver lists them in `.handle_pids.json` and stops the server when the last one exits: a
    pid left there by a demo killed outright (kill -9) never exits again, so every later demo
    would leave its Postgres running. Call it under `_pgserver_lock()`.
    """
    import psutil

    handles = pgdata / ".handle_pids.json"
    try:
        listed = json.loads(handles.read_text())
    except FileNotFoundError:
        return []
    except ValueError:  # cut short while pgserver rewrote it
        listed = None
    live = [pid for pid in listed or [] if psutil.pid_exists(pid)]
    if live != listed:
        handles.write_text(json.dumps(live))
    return live


def _postmaster(pgdata: Path) -> Any:
    """The running Postgres of `pgdata` (a psutil.Process), or None. Call it under `_pgserver_lock()`.

    pgserver takes a `postmaster.pid` whose pid some process has for a running server: once a
    crash left one and that number went to another program, it would hand out the URL of no
    server and, on exit, kill that program; the same when that number is a zombie. So such a
    file is removed here. (Postgres itself forgets a postmaster.pid whose process is gone.)
    """
    import psutil

    postmaster = pgdata / "postmaster.pid"
    lines: list[str] = []
    try:
        lines = postmaster.read_text().split("\n")
        process = psutil.Process(int(lines[0]))
        # A zombie is a dead Postgres that no one reaped (as under an init that does not).
        alive = process.status() != psutil.STATUS_ZOMBIE
        if alive and process.name() == "postgres" and str(pgdata) in process.cmdline():
            return process
    except psutil.ZombieProcess:
        pass
    except (OSError, ValueError, psutil.NoSuchProcess):
        return None  # no file, or its process is gone: pgserver and Postgres start afresh
    except psutil.AccessDenied:
        pass  # another user's process: this user's own Postgres would be readable
    postmaster.unlink(missing_ok=True)
    # Its socket's lock file names the same pid, and Postgres refuses a lock whose pid lives
    # ("is another postmaster using socket file"): it goes too, wherever the socket was. That is
    # the data directory, or the folder the file's fifth line names (in /tmp for a project folder
    # too deep or with spaces), where only a lock naming that same pid is taken for this one's.
    for lock in pgdata.glob(".s.PGSQL.*.lock"):
        lock.unlink(missing_ok=True)
    if len(lines) > 4 and lines[4].strip():
        for lock in Path(lines[4].strip()).glob(".s.PGSQL.*.lock"):
            with contextlib.suppress(OSError):
                if lock.read_text().split("\n", 1)[0].strip() == lines[0].strip():
                    lock.unlink()
    return None


def _stop_unclaimed(folder: Path) -> None:
    """Stop the Postgres of `folder` if it runs and no demo uses it."""
    from pgserver._commands import pg_ctl  # type: ignore[attr-defined]  # made at import, one per Postgres binary

    pgdata = _pgdata(folder)
    with _pgserver_lock():
        if _live_handles(pgdata) or _postmaster(pgdata) is None:
            return
        try:
            # As root, pgserver runs Postgres as its own system user, which pg_ctl must be too.
            pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user="pgserver" if os.geteuid() == 0 else None)
        except subprocess.CalledProcessError:
            pass  # it stopped meanwhile, or the next demo in the folder takes it over and stops it
