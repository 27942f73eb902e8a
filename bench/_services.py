"""Throwaway PostgreSQL and Redis for the benchmarks, in a temp dir, stopped at the end.

Used when a benchmark is not given `--pg-url` / `--redis-url`. PostgreSQL refuses to run as
root, so the cluster is initialised and run as the `postgres` user. Everything lives under one temp dir that `stop()` removes.

Ports: pass explicit ones on a shared machine (a port picked by the OS comes from the
ephemeral range, where someone else's server may be about to listen).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg


def free_port(preferred: int = 0) -> int:
    """`preferred` when it is free (0: any free port)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", preferred))
        except OSError:
            if not preferred:
                raise
            raise SystemExit(f"port {preferred} is busy: pass another one") from None
        return s.getsockname()[1]


def _pg_bin() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: [int(x) for x in p.split("/")[4].split(".")])
    if not found:
        raise SystemExit("PostgreSQL is not installed: apt-get install -y postgresql, or pass --pg-url")
    return found[-1]


def _as_postgres(args: list[str]) -> list[str]:
    return args if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--", *args]


@dataclass
class Services:
    """What `start()` brought up; `stop()` takes it all down again."""

    tmp: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="livepush-bench-"))
    pg_data: str | None = None
    pg_url: str | None = None
    redis_pidfile: str | None = None
    redis_url: str | None = None

    def start_postgres(self, port: int = 0, durable: bool = True, settings: dict[str, str] | None = None) -> str:
        """A fresh cluster. `durable`: Postgres' defaults (fsync, synchronous_commit on), so a
        commit that wrote the history log waits for its WAL flush as it would in production;
        False turns fsync off (faster, but hides that cost). `settings`: more server settings
        (`-c name=value`), for a benchmark that reads something Postgres keeps only on demand."""
        port = free_port(port)
        pg_bin = _pg_bin()
        data = os.path.join(self.tmp, "pg")
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chmod(self.tmp, 0o755)
            os.makedirs(data)
            os.chown(data, pw.pw_uid, pw.pw_gid)
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "check": True}
        subprocess.run(_as_postgres([f"{pg_bin}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"]), **quiet)
        opts = f"-p {port} -c listen_addresses=127.0.0.1 -k {data} -c max_connections=200"
        if not durable:
            opts += " -c fsync=off"
        for name, value in (settings or {}).items():
            opts += f" -c {name}={value}"
        subprocess.run(_as_postgres([f"{pg_bin}/pg_ctl", "-D", data, "-l", f"{data}/log", "-o", opts, "-w", "start"]), **quiet)
        self.pg_data = data
        self.pg_url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        return self.pg_url

    def start_redis(self, port: int = 0) -> str:
        port = free_port(port)
        server = shutil.which("redis-server")
        if server is None:
            raise SystemExit("redis-server is not installed: apt-get install -y redis-server, or pass --redis-url")
        pidfile = os.path.join(self.tmp, "redis.pid")
        subprocess.run(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--daemonize", "yes", "--pidfile", pidfile,
             "--dir", self.tmp, "--save", "", "--appendonly", "no", "--logfile", os.path.join(self.tmp, "redis.log")],
            check=True,
        )
        self.redis_pidfile = pidfile
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"redis-server on port {port} did not answer PING within 10 s")
            time.sleep(0.05)
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        return self.redis_url

    def stop(self) -> None:
        if self.pg_data is not None:
            subprocess.run(
                _as_postgres([f"{_pg_bin()}/pg_ctl", "-D", self.pg_data, "-m", "immediate", "-w", "stop"]),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
            )
            self.pg_data = None
        if self.redis_pidfile is not None:
            with contextlib.suppress(OSError, ValueError):
                with open(self.redis_pidfile) as f:
                    pid = int(f.read().strip())
                os.kill(pid, 15)
                for _ in range(100):
                    os.kill(pid, 0)
                    time.sleep(0.05)
            self.redis_pidfile = None
        shutil.rmtree(self.tmp, ignore_errors=True)


def migrate(url: str) -> None:
    from livepush.migrate import migrate as run

    run(url)


def redis_fanout_available() -> str | None:
    """None when livepush's Redis fan-out imports, else why not (reported as n/a)."""
    try:
        from livepush.fanout.redis import RedisFanOut  # noqa: F401
    except Exception as exc:  # absent or half-written: the benchmark reports n/a
        return f"{type(exc).__name__}: {exc}"
    return None


def make_db(admin: str, name: str) -> str:
    """A fresh scratch database `name` on the server of `admin`; its URL."""
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {name}")
    # A URL, not key=value: asyncpg (pgqueuer's driver) takes URLs only.
    parts = urllib.parse.urlsplit(admin)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))


def drop_db(admin: str, name: str) -> None:
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.contextmanager
def livepush_db(admin: str, name: str) -> Iterator[str]:
    """A migrated scratch database that livepush's settings and pools point at until the block
    ends; then they point nowhere and the database is dropped."""
    from livepush import config
    from livepush.jobs import database

    url = make_db(admin, name)
    migrate(url)
    config.set_settings(config.Settings(database_url=url, fanout="postgres", env="test"))
    database.configure(url)
    try:
        yield url
    finally:
        database.configure(None)
        with contextlib.suppress(psycopg.Error):
            drop_db(admin, name)
