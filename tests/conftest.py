"""Fixtures every livepush test can use, sync or async.

Servers: `bin/test` starts a private PostgreSQL and Redis and exports LIVEPUSH_TEST_PG_ADMIN_URL
and LIVEPUSH_TEST_REDIS_URL; without them the tests that need a server are skipped with a
message saying to run `bin/test`. Running the whole suite, `bin/test` starts one pytest process
per core (pytest-xdist) and a PostgreSQL and Redis for each; a process takes its own from the
file `bin/test` wrote for it, before any fixture reads them.

- `pg_admin_url` (session)  the admin URL (database `postgres`, trust auth).
- `pg_template` (session)   name of a database migrated once with `livepush.migrate.migrate()`.
- `pg_url`                  URL of a fresh database cloned from the template, dropped afterwards.
- `make_pg_url`             factory: `make_pg_url()` -> one more fresh database URL per call.
- `redis_url`               the test Redis, FLUSHALLed before the test.
- `free_port`               a free TCP port on 127.0.0.1.
- `secret`                  a random 48-character LIVEPUSH_SECRET.
- `livepush_env`            factory: `livepush_env(database_url=..., fanout=..., ...)` -> env dict
                            for a child process.
- `procs`                   starts child processes (`procs.livepush("serve", env=...)`) and kills
                            them all at teardown.

Helpers for fault tests (restart Redis, stop PostgreSQL, terminate backends) are in
`tests/support/services.py`; bounded waits in `tests/support/waiting.py`.
"""

from __future__ import annotations

import faulthandler
import os
import secrets as _secrets
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO

import psycopg
import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent
# `from tests.support... import` works from any test folder, whatever pytest's import mode.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _take_own_servers() -> None:
    """Under several pytest processes, point this one's variables at the servers started for it
    (LIVEPUSH_TEST_TMP/gwN/env): a test that restarts or flushes its Redis, or stops its
    PostgreSQL, then reaches no other process' tests."""
    worker, tmp = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("LIVEPUSH_TEST_TMP")
    if not worker or not tmp:
        return
    count = len(list(Path(tmp).glob("gw*/env")))
    if not count:
        return  # one set of servers, given from outside or started for a single process
    # A process xdist starts in place of one that crashed gets a number past the last: it shares
    # a set of servers rather than having none.
    own = Path(tmp) / f"gw{int(worker.removeprefix('gw')) % count}" / "env"
    for line in own.read_text().splitlines():
        name, _, value = line.partition("=")
        os.environ[name] = value


_take_own_servers()

from tests.support import services  # noqa: E402
from tests.support.procs import Processes  # noqa: E402
from tests.support.procs import free_port as _free_port  # noqa: E402

# Started in the background by a shell (`.ci/run &`), this process has SIGINT ignored, and so
# does every child it starts: an ignored signal stays ignored across exec, and a Python child
# then has no KeyboardInterrupt, so a test's Ctrl-C never reached it. Caught here instead (a
# caught signal is reset to its default at exec), children start as a terminal's foreground
# command does.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# Likewise SIGHUP under `nohup bin/test`: every livepush child would keep its documented nohup
# behaviour (a hangup ignored) and the tests of a hangup's drain would fail. Caught by a handler
# that does nothing, this process still outlives a hangup, as nohup meant, and children start
# with the default.
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, lambda signum, frame: None)


@pytest.fixture(autouse=True)
def _stop_signals_as_they_were() -> Iterator[None]:
    """A test that runs a command or a runtime in this process leaves SIGINT and SIGTERM as their
    stop left them, ignored (stopsignals.py): every child a later test starts then inherited that,
    and a migrate it interrupted never heard Ctrl-C. SIGHUP too, which `livepush jobs` turns into
    a SIGTERM. Put back after each test."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


# ---- A bound on every test ----------------------------------------------------------------------
# A test that hangs would otherwise hold CI until its overall limit. Past LIVEPUSH_TEST_TIMEOUT
# seconds (setup, call and teardown together; 0 disables) faulthandler writes every thread's stack
# to a file and ends pytest; bin/test prints that file. The file is emptied after each test, so
# whatever it holds after pytest ended names the test that was running when pytest died.
TEST_TIMEOUT = float(os.environ.get("LIVEPUSH_TEST_TIMEOUT") or 300)
_hang_report: IO[str] | None = None


def _hang_report_file() -> IO[str]:
    global _hang_report
    if _hang_report is None:
        folder = os.environ.get("LIVEPUSH_TEST_TMP") or tempfile.gettempdir()
        _hang_report = open(Path(folder) / f"pytest-hang-{os.getpid()}.txt", "w")  # noqa: SIM115 -- lives as long as pytest
    return _hang_report


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if TEST_TIMEOUT <= 0:
        yield
        return
    report = _hang_report_file()
    report.seek(0)
    report.truncate()
    report.write(
        f"pytest died while running {item.nodeid}; if it hung, it ran over LIVEPUSH_TEST_TIMEOUT={TEST_TIMEOUT:g} s"
        " and these are the stacks of its threads:\n"
    )
    report.flush()
    faulthandler.dump_traceback_later(TEST_TIMEOUT, exit=True, file=report)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        report.seek(0)
        report.truncate()
        report.flush()


def _utf8(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test's report crosses to pytest-xdist's main process as UTF-8: a lone surrogate in what a
    test logged or printed (tests of text Postgres cannot store log one) would crash the process
    that ran it. Such characters are written as escapes instead."""
    outcome = yield
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    report.sections = [(title, _utf8(content)) for title, content in report.sections]
    if report.longrepr is not None:
        text = str(report.longrepr)
        if _utf8(text) != text:
            report.longrepr = _utf8(text)


def pytest_unconfigure(config: pytest.Config) -> None:
    # Reached only when pytest ends normally: nothing to report then.
    global _hang_report
    if _hang_report is not None:
        _hang_report.close()
        Path(_hang_report.name).unlink(missing_ok=True)
        _hang_report = None


def pytest_report_header(config: pytest.Config) -> list[str]:
    pg = os.environ.get("LIVEPUSH_TEST_PG_ADMIN_URL") or "not set (run bin/test)"
    rd = os.environ.get("LIVEPUSH_TEST_REDIS_URL") or "not set (run bin/test)"
    return [f"livepush test servers: postgres {pg}, redis {rd}"]


# ---- PostgreSQL ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    """Admin URL of the test PostgreSQL (database `postgres`)."""
    return services.env_or_skip("LIVEPUSH_TEST_PG_ADMIN_URL")


@pytest.fixture(scope="session")
def pg_template(pg_admin_url: str) -> Iterator[str]:
    """A database with every migration in sql/ applied, once per session: tests clone it."""
    from livepush.migrate import migrate

    name = f"livepush_tpl_{uuid.uuid4().hex[:12]}"
    url = services.create_database(pg_admin_url, name)
    try:
        migrate(url)
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            # No connections allowed: one left open would make every clone fail.
            conn.execute(f'ALTER DATABASE "{name}" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false')  # type: ignore[arg-type]
        yield name
    finally:
        try:
            with psycopg.connect(pg_admin_url, autocommit=True) as conn:
                conn.execute(f'ALTER DATABASE "{name}" WITH IS_TEMPLATE false')  # type: ignore[arg-type]
            services.drop_database(pg_admin_url, name)
        except psycopg.Error:
            pass  # the throwaway cluster goes anyway; don't mask the real failure


@pytest.fixture
def make_pg_url(pg_admin_url: str, pg_template: str) -> Iterator[Callable[[], str]]:
    """Factory of fresh migrated databases (`t_<random>`); each is dropped after the test."""
    made: list[str] = []

    def make() -> str:
        name = f"t_{uuid.uuid4().hex[:16]}"
        url = services.create_database(pg_admin_url, name, template=pg_template)
        made.append(name)
        return url

    yield make
    for name in made:
        services.drop_database(pg_admin_url, name)


@pytest.fixture
def pg_url(make_pg_url: Callable[[], str]) -> str:
    """URL of a fresh, migrated database of this test's own."""
    return make_pg_url()


@pytest.fixture
def sql_ascii_url(pg_admin_url: str) -> Iterator[str]:
    """An empty database in SQL_ASCII (what initdb makes under the C locale): Postgres checks no
    encoding there, so a NOTIFY may carry any byte, and text comes back as whatever bytes were sent."""
    name = f"t_ascii_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE \"{name}\" ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' "  # type: ignore[arg-type]
                     "TEMPLATE template0")
    try:
        yield services.db_url(pg_admin_url, name)
    finally:
        services.drop_database(pg_admin_url, name)


# ---- Redis --------------------------------------------------------------------------------------


@pytest.fixture
def redis_url() -> str:
    """URL of the test Redis, emptied (FLUSHALL) before the test."""
    url = services.env_or_skip("LIVEPUSH_TEST_REDIS_URL")
    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        client.flushall()
    finally:
        client.close()
    return url


# ---- Processes and settings ---------------------------------------------------------------------


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (call tests.support.procs.free_port() for more)."""
    return _free_port()


@pytest.fixture
def secret() -> str:
    """A random 48-character secret, valid as LIVEPUSH_SECRET."""
    return _secrets.token_urlsafe(36)


@pytest.fixture
def livepush_env(secret: str) -> Callable[..., dict[str, str]]:
    """Factory of environments for a livepush child process.

    `livepush_env(database_url=None, redis_url=None, fanout=None, port=None, secret=<fixture>,
    extra=None, **settings)`: each keyword in `settings` becomes LIVEPUSH_<NAME> (e.g.
    authenticate="off" -> LIVEPUSH_AUTHENTICATE=off; None leaves it unset); `extra` is merged
    last, as is. The fan-out defaults to postgres with a database, else redis with a Redis URL,
    else local; the port to a fresh free one. The caller's own LIVEPUSH_* and DATABASE_URL
    never leak in; the LIVEPUSH_TEST_* variables do.
    """
    default_secret = secret

    def make(
        *,
        database_url: str | None = None,
        redis_url: str | None = None,
        fanout: str | None = None,
        port: int | None = None,
        secret: str | None = None,
        extra: Mapping[str, str] | None = None,
        **settings: object,
    ) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not (k.startswith("LIVEPUSH_") and not k.startswith("LIVEPUSH_TEST_")) and k != "DATABASE_URL"
        }
        venv_bin = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"  # output reaches the capture files as it happens
        if fanout is None:
            fanout = "postgres" if database_url else "redis" if redis_url else "local"
        values: dict[str, object] = {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "FANOUT": fanout,
            "PORT": port if port is not None else _free_port(),
            "SECRET": secret if secret is not None else default_secret,
            "ENV": "test",
        }
        values.update({k.upper(): v for k, v in settings.items()})
        for key, value in values.items():
            if value is not None:
                env[f"LIVEPUSH_{key}"] = str(value)
        env.update(extra or {})
        return env

    return make


@pytest.fixture
def procs() -> Iterator[Processes]:
    """Starts child processes for the test (`procs.livepush("serve", env=...)`, `procs.start([...])`)
    and kills every one of them at teardown, whatever state they are in."""
    group = Processes()
    try:
        yield group
    finally:
        group.close_all()
