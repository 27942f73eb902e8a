"""A real PgBouncer in front of the test PostgreSQL, for the tests of livepush behind a pooler.

`start_pgbouncer(admin_url, pool_mode=...)` writes a config into a temp dir, starts `pgbouncer`
on a free port (as the `postgres` user when run as root: PgBouncer refuses to run as root), waits
until it answers, and returns a `PgBouncer` whose `url(dbname)` points a client at any database
of the test PostgreSQL through it. `stop()` ends it and removes the dir.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from .procs import free_port
from .services import process_gone
from .waiting import wait_for

START_TIMEOUT = 10.0


def pgbouncer_binary() -> str:
    """The pgbouncer executable, or skip the test saying how to get it."""
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None)
    if found is None:
        pytest.skip("pgbouncer is not installed: run bin/setup (or apt-get install -y pgbouncer)")
    return found


def pgbouncer_version() -> str:
    """`PgBouncer 1.18.0` or whatever the installed one says on its first line."""
    done = subprocess.run([pgbouncer_binary(), "--version"], capture_output=True, text=True, timeout=10, check=False)
    return (done.stdout or done.stderr).splitlines()[0].strip()


@dataclass
class PgBouncer:
    """A running PgBouncer: `url(dbname)` connects through it; `log()` is what it wrote."""

    port: int
    pool_mode: str
    folder: Path
    process: subprocess.Popen[bytes]
    user: str

    def url(self, dbname: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def log(self) -> str:
        try:
            return (self.folder / "pgbouncer.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def servers(self, dbname: str) -> list[int]:
        """The backend pids of the server connections the pooler holds to `dbname`, from its admin
        console (which takes only the simple query protocol)."""
        with psycopg.connect(self.url("pgbouncer"), autocommit=True, cursor_factory=psycopg.ClientCursor) as admin:
            cur = admin.execute("SHOW SERVERS")
            names = [column.name for column in cur.description or ()]
            return [row[names.index("remote_pid")] for row in cur.fetchall() if row[names.index("database")] == dbname]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        shutil.rmtree(self.folder, ignore_errors=True)


def _config(pg_host: str, pg_port: int, port: int, pool_mode: str, folder: Path, user: str,
            max_prepared_statements: int | None, max_client_conn: int, pool_size: int,
            query_wait_timeout: int | None) -> str:
    lines = [
        "[databases]",
        # Any database name a client asks for goes to the same name on the test PostgreSQL.
        f"* = host={pg_host} port={pg_port}",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "auth_type = trust",
        f"auth_file = {folder / 'userlist.txt'}",
        f"admin_users = {user}",
        f"pool_mode = {pool_mode}",
        f"max_client_conn = {max_client_conn}",
        f"default_pool_size = {pool_size}",
        f"logfile = {folder / 'pgbouncer.log'}",
        f"pidfile = {folder / 'pgbouncer.pid'}",
    ]
    if max_prepared_statements is not None:
        lines.append(f"max_prepared_statements = {max_prepared_statements}")
    if query_wait_timeout is not None:
        lines.append(f"query_wait_timeout = {query_wait_timeout}")
    return "\n".join(lines) + "\n"


def start_pgbouncer(admin_url: str, *, pool_mode: str = "transaction",
                    max_prepared_statements: int | None = None, max_client_conn: int = 500,
                    pool_size: int = 20, query_wait_timeout: int | None = None) -> PgBouncer:
    """PgBouncer in `pool_mode` (transaction or session) in front of the PostgreSQL at `admin_url`,
    on a free port, taking at most `max_client_conn` clients at once, with `pool_size` server
    connections per database and user, for which a query waits `query_wait_timeout` seconds at
    most (PgBouncer's default, 120, when None); returns once a client can run a query through it."""
    binary = pgbouncer_binary()
    info = psycopg.conninfo.conninfo_to_dict(admin_url)
    user = str(info.get("user") or "postgres")
    base = os.environ.get("LIVEPUSH_TEST_TMP") or None
    folder = Path(tempfile.mkdtemp(prefix="pgbouncer-", dir=base))
    port = free_port()
    (folder / "pgbouncer.ini").write_text(_config(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432),
                                                  port, pool_mode, folder, user, max_prepared_statements,
                                                  max_client_conn, pool_size, query_wait_timeout))
    (folder / "userlist.txt").write_text(f'"{user}" ""\n')
    cmd = [binary, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root: it switches to the postgres user, which must own its files.
        owner = pwd.getpwnam("postgres")
        for path in (folder, *folder.iterdir()):
            os.chown(path, owner.pw_uid, owner.pw_gid)
        cmd[1:1] = ["-u", "postgres"]
    process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bouncer = PgBouncer(port, pool_mode, folder, process, user)
    dbname = str(info.get("dbname") or "postgres")

    def answers() -> bool:
        if process_gone(process.pid):
            raise AssertionError(f"pgbouncer exited at start ({process.poll()}):\n{bouncer.log()}")
        with psycopg.connect(bouncer.url(dbname), autocommit=True, connect_timeout=2) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)

    try:
        wait_for(answers, START_TIMEOUT, interval=0.05, ignore=(psycopg.OperationalError,),
                 message=f"pgbouncer on port {port} to answer")
    except BaseException:
        log = bouncer.log()
        bouncer.stop()
        if isinstance(log, str) and log:
            print(log)
        raise
    return bouncer
