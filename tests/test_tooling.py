"""The test tooling itself: fixtures give isolated, migrated databases and a clean Redis, the
fault helpers really stop and start the servers, and child processes are waited for with bounds."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import redis

from tests.support import services
from tests.support.procs import Processes, free_port
from tests.support.waiting import async_wait_for, wait_for


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {r[0] for r in rows}


def test_pg_url_is_migrated(pg_url: str, pg_template: str) -> None:
    """A fresh test database is a clone of the migrated template, not the template itself."""
    assert "livepush_schema" in _tables(pg_url)
    with psycopg.connect(pg_url) as conn:
        name = conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        count = conn.execute("SELECT count(*) FROM livepush_schema").fetchone()[0]  # type: ignore[index]
    assert name.startswith("t_") and name != pg_template
    from livepush.migrate import bundled

    assert count == len(bundled())


def test_pg_urls_are_distinct(make_pg_url: Callable[[], str]) -> None:
    """Two databases from the fixture are separate: a table made in one is absent from the other."""
    a, b = make_pg_url(), make_pg_url()
    assert services.dbname_of(a) != services.dbname_of(b)
    with psycopg.connect(a) as conn:
        conn.execute("CREATE TABLE only_in_a (x int)")
    assert "only_in_a" in _tables(a)
    assert "only_in_a" not in _tables(b)


@pytest.mark.parametrize("round_", [1, 2])
def test_pg_url_starts_empty(pg_url: str, round_: int) -> None:
    """Whatever an earlier test wrote to its database is not in the next test's database."""
    assert "leftover" not in _tables(pg_url)
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE TABLE leftover (x int)")


@pytest.mark.parametrize("round_", [1, 2])
def test_redis_is_flushed(redis_url: str, round_: int) -> None:
    """Each test starts with an empty Redis, whatever the previous one left."""
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.dbsize() == 0
        client.set("tooling:leftover", round_)
    finally:
        client.close()


def test_redis_restart(redis_url: str) -> None:
    """redis_restart brings a new Redis up on the same port, answering, with its data gone."""
    client = redis.Redis.from_url(redis_url, socket_timeout=2)
    try:
        client.set("before", "1")
        run_id = client.info("server")["run_id"]
        services.redis_restart(redis_url)
        assert client.ping()  # the client reconnects to the same URL
        assert client.info("server")["run_id"] != run_id
        assert client.get("before") is None
        services.redis_restart(redis_url, hard=True)
        assert client.ping()
    finally:
        client.close()


def test_redis_down_refuses_then_recovers(redis_url: str) -> None:
    """Inside redis_down() connections fail; after it the server answers again."""
    client = redis.Redis.from_url(redis_url, socket_timeout=1, socket_connect_timeout=1)
    try:
        with services.redis_down(redis_url):
            with pytest.raises(redis.ConnectionError):
                client.ping()
        assert client.ping()
    finally:
        client.close()


def test_pg_terminate(pg_admin_url: str, pg_url: str) -> None:
    """pg_terminate kills exactly the backends with the given application_name."""
    victim = psycopg.connect(pg_url, autocommit=True, application_name="victim")
    bystander = psycopg.connect(pg_url, autocommit=True, application_name="bystander")
    try:
        assert services.pg_terminate(pg_admin_url, services.dbname_of(pg_url), "victim") == 1
        with pytest.raises(psycopg.OperationalError):
            victim.execute("SELECT 1")
        assert bystander.execute("SELECT 1").fetchone() == (1,)
    finally:
        victim.close()
        bystander.close()


def test_pg_restart(pg_admin_url: str, pg_url: str) -> None:
    """pg_restart drops every connection and the server accepts new ones on the same port."""
    conn = psycopg.connect(pg_url, autocommit=True)
    try:
        services.pg_restart()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    finally:
        conn.close()
    with psycopg.connect(pg_url) as fresh:
        assert fresh.execute("SELECT 1").fetchone() == (1,)


def test_livepush_env(livepush_env: Callable[..., dict[str, str]], secret: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """livepush_env sets the settings asked for, defaults the rest, and keeps the caller's LIVEPUSH_* out."""
    monkeypatch.setenv("LIVEPUSH_AUTHENTICATE", "required")
    monkeypatch.setenv("DATABASE_URL", "postgresql://elsewhere/db")
    env = livepush_env(redis_url="redis://127.0.0.1:1/0", allowed_origins="http://a.test", history_ttl=None)
    assert env["LIVEPUSH_FANOUT"] == "redis"
    assert env["LIVEPUSH_SECRET"] == secret and len(secret) == 48
    assert env["LIVEPUSH_ENV"] == "test"
    assert env["LIVEPUSH_ALLOWED_ORIGINS"] == "http://a.test"
    assert int(env["LIVEPUSH_PORT"]) > 0
    assert "LIVEPUSH_AUTHENTICATE" not in env and "DATABASE_URL" not in env
    assert "LIVEPUSH_HISTORY_TTL" not in env
    assert env["PATH"].split(":")[0].endswith("bin")
    from livepush.config import Settings

    settings = Settings.from_env(env)
    assert settings.fanout == "redis" and settings.is_test


_HEALTH_SERVER = textwrap.dedent(
    """
    import http.server, signal, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
    print("serving", flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


def test_child_process_health_and_signal(procs: Processes, free_port: int) -> None:
    """A child is waited for until /healthz answers 200, then stops on SIGTERM with its exit code."""
    child = procs.start([sys.executable, "-c", _HEALTH_SERVER, str(free_port)], port=free_port, name="health server")
    child.wait_healthy(timeout=10)
    child.signal(signal.SIGTERM)
    assert child.wait(timeout=5) == 7
    assert "serving" in child.stdout()


def test_child_that_dies_fails_with_its_stderr(procs: Processes) -> None:
    """A child that exits before it is healthy fails the wait at once, quoting its stderr."""
    child = procs.start([sys.executable, "-c", "import sys; sys.exit('boom: no database')"], port=free_port())
    with pytest.raises(AssertionError, match="boom: no database"):
        child.wait_healthy(timeout=10)


def test_child_is_killed_at_teardown() -> None:
    """close_all kills a child that ignores SIGTERM, and its own children too."""
    group = Processes()
    child = group.start([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
    group.close_all()
    assert child.returncode == -signal.SIGKILL


async def test_async_child_health(procs: Processes, free_port: int) -> None:
    """The async waits work from a running event loop."""
    child = procs.start([sys.executable, "-c", _HEALTH_SERVER, str(free_port)], port=free_port)
    await child.await_healthy(timeout=10)
    child.terminate()
    assert await child.await_exit(timeout=5) == 7


def test_wait_for_times_out_clearly() -> None:
    """wait_for returns the first truthy value, and a timeout names what was awaited."""
    values = iter([0, None, "yes"])
    assert wait_for(lambda: next(values), timeout=2, interval=0.001) == "yes"
    with pytest.raises(AssertionError, match="timed out after 0.05 s waiting for the moon"):
        wait_for(lambda: False, timeout=0.05, message="the moon")


async def test_async_wait_for() -> None:
    """async_wait_for takes sync and async predicates and fails with a message on timeout."""
    state = {"n": 0}

    async def bump() -> bool:
        state["n"] += 1
        return state["n"] >= 3

    assert await async_wait_for(bump, timeout=2, interval=0.001) is True

    async def never() -> bool:
        await asyncio.sleep(10)
        return True

    with pytest.raises(AssertionError, match="timed out after 0.05 s"):
        await async_wait_for(never, timeout=0.05)


def test_livepush_serve_child(procs: Processes, livepush_env: Callable[..., dict[str, str]], pg_url: str) -> None:
    """procs.livepush runs `python -m livepush serve` on a fresh database, waits for /healthz, and stops it."""
    child = procs.livepush("serve", env=livepush_env(database_url=pg_url))
    child.terminate()
    child.wait(timeout=10)


ROOT = Path(__file__).resolve().parents[1]


def test_bin_bench_help() -> None:
    """`bin/bench --help` answers without running a benchmark, naming its flags and every suite."""
    out = subprocess.run([str(ROOT / "bin" / "bench"), "--help"], capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL, check=False)
    assert out.returncode == 0, out.stderr
    for word in ("--quick", "--only", "--out", "--pg-port", "--redis-port", "jobs", "durable", "push"):
        assert word in out.stdout, out.stdout


def test_bin_bench_refuses_bad_arguments_before_it_installs_the_peers(tmp_path: Path) -> None:
    """`bin/bench --only nosuch` made .venv-bench and pip-installed every peer (minutes, the first
    time) before it said the suite is unknown. It refuses bad arguments first, making nothing."""
    checkout = tmp_path / "checkout"
    for part in ("bin", "bench"):
        shutil.copytree(ROOT / part, checkout / part)
    shutil.copy(ROOT / "pyproject.toml", checkout)
    (checkout / ".venv").symlink_to(ROOT / ".venv")
    # Were it to install, pip finds no index and fails at once, rather than download the peers.
    env = {**os.environ, "PIP_NO_INDEX": "1"}
    out = subprocess.run([str(checkout / "bin" / "bench"), "--only", "nosuch"], capture_output=True, text=True,
                         timeout=300, stdin=subprocess.DEVNULL, check=False, env=env)
    assert out.returncode == 2, out.stderr
    assert "unknown suite(s) nosuch" in out.stderr, out.stderr
    assert not (checkout / ".venv-bench").exists(), out.stderr


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_bin_bench_help_answers_before_any_setup(tmp_path: Path, flag: str) -> None:
    """`bin/bench --help` ran bin/setup first: on a fresh machine, as a user who is not root, it
    stopped on the missing Debian packages before it showed the help. It answers before any setup,
    without .venv (the first python3 shows it), and bin/setup never runs."""
    checkout = tmp_path / "checkout"
    for part in ("bin", "bench"):
        shutil.copytree(ROOT / part, checkout / part)
    shutil.copy(ROOT / "pyproject.toml", checkout)
    ran = tmp_path / "setup-ran"
    # A machine bin/setup cannot prepare: it says so and fails, as it does there for a user not root.
    (checkout / "bin" / "setup").write_text(f"#!/bin/sh\ntouch {ran}\necho 'bin/setup: missing Debian packages' >&2\n"
                                            "exit 1\n")
    out = subprocess.run([str(checkout / "bin" / "bench"), flag], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL, check=False)
    assert out.returncode == 0, out.stderr
    assert "--only" in out.stdout and "durable" in out.stdout, out.stdout
    assert not ran.exists() and not (checkout / ".venv").exists(), out.stderr


def _bench_report() -> object:
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "bench" / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_bench_report_shape(tmp_path: Path) -> None:
    """report.write gives a JSON list of figures with name, value, unit, baseline, baseline_value and a ratio above 1 when livepush wins either way; report.table gives a header and a row per figure."""
    report = _bench_report()
    figures = [
        report.Figure("process", 3000.0, "jobs/s", "pgqueuer", 1000.0, suite="jobs", goal=2.5),  # type: ignore[attr-defined]
        report.Figure("pickup p99", 2.0, "ms", "pgqueuer", 4.0, higher_is_better=False, suite="jobs"),  # type: ignore[attr-defined]
        report.Figure("wake", 1.5, "ms", higher_is_better=False, suite="durable"),  # type: ignore[attr-defined]
    ]
    path = tmp_path / "report.json"
    report.write(str(path), figures)  # type: ignore[attr-defined]
    got = json.loads(path.read_text())
    assert isinstance(got, list) and len(got) == 3
    for row in got:
        assert {"name", "value", "unit", "baseline", "baseline_value", "ratio", "higher_is_better", "suite",
                "goal"} <= set(row)
    assert [r["ratio"] for r in got] == [3.0, 2.0, None]
    assert got[0]["goal"] == 2.5 and got[2]["baseline"] is None
    lines = report.table(figures).splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 4
    assert lines[0].split()[:3] == ["suite", "figure", "livepush"]
    assert "3.00x" in lines[1] and ">= 2.5x" in lines[1] and "2.00x" in lines[2]


def test_bench_repeat_reports_medians_of_paired_ratios() -> None:
    """With --repeat, a figure is the median of its runs and its ratio the median of each run's own
    ratio (livepush against that run's baseline), with how many runs reached the goal; a figure
    one run lacks is combined over the runs that have it, and one name beside two baselines stays
    two figures."""
    report = _bench_report()
    Figure = report.Figure  # type: ignore[attr-defined]
    runs = [
        [Figure("process", 3000.0, "jobs/s", "pgqueuer", 1000.0, suite="jobs", goal=2.5),
         Figure("p99", 2.0, "ms", "bare", 4.0, higher_is_better=False, suite="push")],
        [Figure("process", 2000.0, "jobs/s", "pgqueuer", 1000.0, suite="jobs", goal=2.5),
         Figure("process", 2000.0, "jobs/s", "bare loop", 2000.0, suite="jobs")],
        [Figure("process", 5200.0, "jobs/s", "pgqueuer", 2000.0, suite="jobs", goal=2.5),
         Figure("p99", 3.0, "ms", "bare", 3.0, higher_is_better=False, suite="push")],
    ]
    process, p99, bare = report.combine(runs)  # type: ignore[attr-defined]
    assert bare.ratios == (1.0,) and bare.baseline == "bare loop"
    assert (process.value, process.baseline_value) == (3000.0, 1000.0)
    assert process.ratios == (3.0, 2.0, 2.6)
    assert process.ratio == 2.6  # the median ratio, where medians' ratio would say 3.0
    assert process.met == 2
    assert p99.ratios == (2.0, 1.0) and p99.ratio == 1.5 and p99.met is None
    assert process.as_json()["ratios"] == [3.0, 2.0, 2.6]
    header, first, _ = report.table([process, p99]).splitlines()  # type: ignore[attr-defined]
    assert "runs' ratios" in header and "met" in header
    assert "2.60x" in first and "2.00-3.00x" in first and "2/3" in first


def test_every_ensurepip_call_in_bin_uses_options_ensurepip_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scripts in bin/ call `python -m ensurepip` only with options it has (it has no -q, which
    exits 2 and, under `set -e`, stops the script on a venv without pip)."""
    import ensurepip

    monkeypatch.setattr(ensurepip, "_bootstrap", lambda **_: 0)  # parse the options, install nothing
    root = Path(__file__).resolve().parent.parent / "bin"
    calls = [(script.name, match.group(1).split())
             for script in sorted(root.iterdir()) if script.is_file()
             for match in re.finditer(r"-m ensurepip((?:[ \t]+-[-\w]+)*)", script.read_text())]
    assert calls, "no script in bin/ calls ensurepip: this test looks in the wrong place"
    for name, options in calls:
        try:
            ensurepip._main(options)
        except SystemExit as exc:
            raise AssertionError(f"bin/{name}: `python -m ensurepip {' '.join(options)}` exits {exc.code}") from None
