"""Throwaway PostgreSQL and Redis for the benchmarks, in a temp dir, stopped at the end.

Used when a benchmark is not given `--pg-url` / `--redis-url`. PostgreSQL refuses to run as
root, so the cluster is initialised and run as the `postgres` user. Everything lives under one temp dir that `stop()` removes.

Ports: pass explicit ones on a shared machine (a port picked by the OS comes from the
ephemeral range, where someone else's server may be about to listen).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
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


def ratio_bench_args(doc: str | None, rounds: int) -> argparse.Namespace:
    """The arguments of a benchmark that compares enqueue variants on one PostgreSQL:
    --pg-url, --rounds, --pg-no-fsync."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pg-url", help="an admin URL of a running PostgreSQL (a scratch database is made there)")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--pg-no-fsync", action="store_true", help="throwaway PostgreSQL with fsync=off (CPU cost only)")
    return ap.parse_args()


def ratio_bench_postgres(services: Services, args: argparse.Namespace) -> str:
    """The admin URL of `args.pg_url`, else of a throwaway cluster; prints its version and fsync."""
    admin = args.pg_url or services.start_postgres(0, durable=not args.pg_no_fsync)
    with psycopg.connect(admin) as c:
        version = c.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        fsync = c.execute("SHOW fsync").fetchone()[0]  # type: ignore[index]
    print(f"PostgreSQL {version} (fsync={fsync}), {os.cpu_count()} cores, {args.rounds} rounds", flush=True)
    return admin


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


@dataclass
class Postgres:
    """The server a DBOS-comparing benchmark runs on, as it describes it in its first line."""

    admin: str  # an admin URL: scratch databases are made there
    where: str
    version: str
    fsync: str
    synchronous_commit: str
    commit_timestamps: bool


def commit_timestamped_postgres(services: Services, pg_url: str | None, port: int, no_fsync: bool) -> Postgres:
    """The given server (`--pg-url`), or a throwaway one that keeps commit timestamps: the durable
    and workflow benchmarks time wake-ups and step latencies from when an outcome committed."""
    if pg_url:
        admin, where = pg_url, "given server (--pg-url): its own settings"
    else:
        admin = services.start_postgres(port, durable=not no_fsync, settings={"track_commit_timestamp": "on"})
        where = "throwaway PostgreSQL, fsync OFF (--pg-no-fsync)" if no_fsync else "throwaway PostgreSQL, durable defaults"
    with psycopg.connect(admin) as c:
        shown = [c.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                 for name in ("server_version", "fsync", "synchronous_commit", "track_commit_timestamp")]
    return Postgres(admin, where, shown[0], shown[1], shown[2], shown[3] == "on")


def dbos_version(bench_py: str) -> str:
    """The version of DBOS in the bench-only virtualenv."""
    return subprocess.run([bench_py, "-c", "import importlib.metadata as m; print(m.version('dbos'))"],
                          capture_output=True, text=True, timeout=60, check=True).stdout.strip()
