"""`--log-format json`: one JSON object a line, and never a token, secret or password in the
output, whatever format (docs/reference.md#9-operations)."""

from __future__ import annotations

import json
import logging
import sys
import time

import psycopg
import psycopg.sql
import pytest
from redis.exceptions import AuthenticationError

from livepush import sessions
from livepush.cli import logs
from livepush.repeats import Repeats
from tests.jobs.conftest import registered
from tests.support import services
from tests.support.waiting import wait_for
from tests.support.wsclient import WSClient


def test_scrub_removes_passwords_tokens_and_secrets() -> None:
    line = ("connecting to postgresql://app:hunter2@db.internal:5432/app?sslmode=require "
            "and redis://:s3cret@cache:6379/0 with password='p w' token=abc.def secret=xyz")
    scrubbed = logs.scrub(line)
    for secret in ("hunter2", "s3cret", "p w", "abc.def", "xyz"):
        assert secret not in scrubbed
    assert "postgresql://app:***@db.internal:5432/app" in scrubbed


@pytest.mark.parametrize("line, secret", [
    # What a library quotes of a request (httpx's errors name the URL, query string included).
    ("Client error '401 Unauthorized' for url 'https://api.example.com/v1/me?access_token=Zq81xW'", "Zq81xW"),
    ("POST https://auth.example.com/token?client_secret=Hy7u2k&refresh_token=Kp02mv", "Hy7u2k"),
    ("POST https://auth.example.com/token?client_secret=Hy7u2k&refresh_token=Kp02mv", "Kp02mv"),
    # Settings a job or a module quotes as it fails (an environment, a .env line).
    ("LIVEPUSH_SECRET=k3J9sQ2vX8nR5tW1yZ4bC7dF0gH6jL2m is not used here", "k3J9sQ2vX8nR5tW1yZ4bC7dF0gH6jL2m"),
    ("PGPASSWORD=Wb4tYu DB_PASSWORD=Wb4tYu", "Wb4tYu"),
    # A password with an unencoded '@' (redis-py takes it: the userinfo ends at the last '@'), and
    # a user name holding one (Azure's user@server).
    ("Error connecting to redis://:p@ss9Q@cache:6379/0", "ss9Q"),
    ("cannot reach postgresql://app@srv:Tq4x8m@db.example.com/app", "Tq4x8m"),
])
def test_a_secret_is_scrubbed_whatever_its_names_prefix_or_the_characters_of_its_password(
        line: str, secret: str) -> None:
    assert secret not in logs.scrub(line)
    assert secret not in logs.JsonLines().format(logging.makeLogRecord({"msg": line}))


def test_the_placeholder_of_livepushs_own_hints_is_kept_and_real_passwords_are_not() -> None:
    """A hint such as "use redis://:PASSWORD@HOST:PORT/DB" printed as "redis://:***@HOST...": the
    scrubber took the placeholder for a password, and the hint said to write `***`. The word
    PASSWORD, alone between the colon and the last '@', is kept; anything else there is a password
    and is scrubbed, a password that begins with the word too."""
    from livepush.postgres.urls import malformed
    from livepush.redis.client import _auth_remedy

    hints = [str(malformed("postgresql://u:pw@[::1/db")), _auth_remedy("redis://h:6379/0", AuthenticationError()),
             "use redis://[:PASSWORD@]HOST:PORT/DB"]
    for hint in hints:
        assert hint and "PASSWORD@" in hint, hint
        assert logs.scrub(hint) == hint
        assert logs.error_line(hint) == f"livepush: {hint}"
        assert json.loads(logs.error_line(hint, "json"))["message"] == hint
    for line, secret in (("redis://:PASSWORDx@cache:6379/0", "PASSWORDx"), ("redis://:PASSWORD@x1@cache/0", "x1"),
                         ("postgresql://app:password@db/app", "password"), ("redis://:PASSWORD9@cache", "PASSWORD9")):
        assert secret not in logs.scrub(line), line


def test_a_session_token_anywhere_in_a_message_is_scrubbed(monkeypatch) -> None:
    monkeypatch.setenv("LIVEPUSH_SECRET", "k3J9sQ2vX8nR5tW1yZ4bC7dF0gH6jL2mN9pQ3rS5tU8v")
    from livepush import config

    config.set_settings(config.Settings.from_env())
    try:
        token = sessions.issue("alice", ttl=60)
    finally:
        config.set_settings(None)
    assert token not in logs.scrub(f"GET /?token={token} and {token} alone")


def test_json_lines_are_one_object_each_with_the_error_and_its_traceback() -> None:
    try:
        raise RuntimeError("boom at postgresql://u:pw@h/db")
    except RuntimeError:
        record = logging.LogRecord("livepush.x", logging.ERROR, __file__, 1, "failed: %s", ("it",), sys.exc_info())
    line = logs.JsonLines().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "error" and entry["logger"] == "livepush.x" and entry["message"] == "failed: it"
    assert entry["error"].startswith("RuntimeError: boom") and "pw@" not in entry["traceback"]
    assert entry["time"].endswith("+00:00")


FORGED = "2026-01-01 00:00:00,000 ERROR livepush.server: forged"


def test_in_text_a_record_is_one_line_whatever_the_data_it_quotes() -> None:
    """A job's error quoting its arguments (a newline, a terminal escape) forges no log line and
    drives no terminal, and a traceback's lines stay indented under their record."""
    formatter = logs.Scrubbed(logs.TEXT_FORMAT)
    error = ValueError(f"bad row\n{FORGED}\x1b[2J")
    record = logging.LogRecord("livepush.jobs", logging.WARNING, __file__, 1, "job %s (%s): %s",
                               (7, "import_row", error), None)
    line = formatter.format(record)
    assert "\n" not in line and "\x1b" not in line
    assert line.endswith("bad row\\n" + FORGED + "\\x1b[2J")
    try:
        raise error
    except ValueError:
        record = logging.LogRecord("livepush.jobs", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    head, *traceback = formatter.format(record).split("\n")
    assert head.endswith("livepush.jobs: failed") and traceback
    assert all(line.startswith(logs.CONTINUED) for line in traceback), traceback
    assert "\x1b" not in "".join(traceback)


async def test_serve_logs_json_lines_without_the_tokens_clients_sent(procs, livepush_env, pg_url, secret) -> None:
    env = livepush_env(database_url=pg_url, authenticate="required")
    server = procs.livepush("serve", "--log-format", "json", env=env)
    base = f"ws://127.0.0.1:{server.port}/"
    bad = "WzEsInlfNDRMU3dGdWQyOXZ6WmduVF9mMXciLCJhbGljZSJd.RC8Y3T84kY1SR0o54rmOpXQiadLuO2HT-Zqx-GzEoU8"
    client = await WSClient.open(base + "?token=" + bad, hello=False)
    assert await client.closed_with() == 4401
    assert server.stop(timeout=15) == 0, server.output()
    lines = [line for line in server.stderr().splitlines() if line.strip()]
    assert lines, "serve logged nothing"
    for line in lines:
        entry = json.loads(line)
        assert {"time", "level", "logger", "message"} <= set(entry), line
    assert bad not in server.stderr() and secret not in server.stderr()


@pytest.mark.parametrize("argv,settings,status,needle", [
    (["serve"], {"fanout": "bogus"}, 2, "LIVEPUSH_FANOUT"),
    (["serve", "--workers", "many"], {}, 2, "--workers"),
    (["serve"], {"database_url": "postgresql://livepush@127.0.0.1:1/nothing_listens_here"}, 1, "127.0.0.1:1"),
    (["jobs", "tests.jobs.sample_jobs", "--heartbeat", "nan"], {}, 2, "--heartbeat"),
    (["demo"], {"authenticate": "sometimes"}, 2, "LIVEPUSH_AUTHENTICATE"),
    (["serve", "--port", "eighty"], {}, 2, "--port"),  # refused by the parser, before the format is read
])
def test_with_json_logs_the_line_a_command_ends_on_is_json_too(procs, livepush_env, argv, settings, status,
                                                              needle) -> None:
    """`--log-format json` holds to the last line: a command that cannot start (bad setting,
    database down) ends with its one error line as a JSON object, which a log collector reads
    like every other line, not as plain text."""
    child = procs.livepush(*argv, "--log-format", "json", env=livepush_env(**settings), wait_healthy=False)
    assert child.wait(30) == status, child.output()
    lines = [line for line in child.stderr().splitlines() if line.strip()]
    assert lines, child.output()
    for line in lines:
        assert line.startswith("{"), f"not a JSON line: {line!r}"
        entry = json.loads(line)
        assert {"time", "level", "logger", "message"} <= set(entry), line
    last = json.loads(lines[-1])
    assert last["level"] == "error" and needle in last["message"] and "Traceback" not in child.stderr()


@pytest.mark.parametrize("spelling", [["--log-format=json"], ["--log-form", "json"], ["--log=json"]])
def test_a_usage_error_is_one_json_line_however_the_parser_took_log_format_json(
        spelling: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`--log-format json` in any spelling the parser accepts (`=json`, or the flag shortened)
    makes a usage error one JSON line too, not the usage text."""
    from livepush.cli.commands import main

    with pytest.raises(SystemExit) as raised:
        main(["jobs", "some.module", *spelling, "--concurrency", "x"])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    entry = json.loads(err)
    assert entry["level"] == "error" and "--concurrency" in entry["message"], entry


@pytest.mark.parametrize("log_format", ["text", "json"])
@pytest.mark.parametrize("argv", [["serve", "--app", "leaky_module:app"], ["jobs", "leaky_module"]])
def test_the_line_a_command_ends_on_is_scrubbed_in_either_format(procs, livepush_env, tmp_path, argv,
                                                                 log_format: str) -> None:
    """A module whose import fails with a URL and its password in the message: the one line the
    command ends on names the failure, with the password replaced, in text as in JSON."""
    (tmp_path / "leaky_module.py").write_text(
        'raise RuntimeError("cannot reach postgresql://app:hunter2pw@db.internal/app")\n')
    child = procs.start([sys.executable, "-m", "livepush", *argv, "--log-format", log_format],
                        env=livepush_env(), cwd=tmp_path)
    assert child.wait(30) == 2, child.output()
    err = child.stderr()
    assert "postgresql://app:***@db.internal/app" in err and "hunter2pw" not in err, err


@pytest.mark.parametrize("argv", [["serve", "--app", "escaping_module:app"], ["jobs", "escaping_module"],
                                  ["serve", "--workers", "2", "--app", "escaping_module:app"]])
def test_in_text_the_line_a_command_ends_on_drives_no_terminal_and_forges_no_line(procs, livepush_env, tmp_path,
                                                                                   request, argv) -> None:
    """The line a command ends on quotes what failed: a module's error (a terminal escape in it),
    a setting's value (a newline in a URL). Written as their escapes, as in every other text line,
    it stays one line that cannot clear the operator's screen or pass for a line of its own."""
    (tmp_path / "escaping_module.py").write_text(f'raise RuntimeError("cannot start {FORGED}\\x1b[2J")\n')
    # Workers need a fan-out that reaches them all.
    url = request.getfixturevalue("pg_url") if "--workers" in argv else None
    child = procs.start([sys.executable, "-m", "livepush", *argv], env=livepush_env(database_url=url), cwd=tmp_path)
    assert child.wait(30) == 2, child.output()
    err = child.stderr()
    assert "\x1b" not in err and "cannot start " + FORGED + "\\x1b[2J" in err, err
    line = logs.error_line("cannot reach Postgres at db\n" + FORGED + "@h:5432", "text")
    assert line == "livepush: cannot reach Postgres at db\\n" + FORGED + "@h:5432"


@pytest.mark.parametrize("flag", ["--app", "--with-jobs"])
def test_serve_logs_json_even_when_the_apps_module_configures_logging_at_import(procs, livepush_env, pg_url,
                                                                               tmp_path, flag: str) -> None:
    """A module `serve` imports (`--app`, `--with-jobs`) that calls logging.basicConfig() at its top,
    as scripts do: `--log-format json` still makes every line of the server a scrubbed JSON object,
    as `livepush jobs` does, rather than the module's plain handler writing livepush's lines."""
    (tmp_path / "configures_logging.py").write_text(
        "import logging\nimport livepush\nfrom livepush import jobs\n"
        "logging.basicConfig(level=logging.INFO)\napp = livepush.App(rules=[])\n"
        "@jobs.job(name='t.configures_logging')\nasync def noop(ctx):\n    pass\n")
    env = livepush_env(database_url=pg_url)
    target = "configures_logging:app" if flag == "--app" else "configures_logging"
    child = procs.start([sys.executable, "-m", "livepush", "serve", flag, target, "--log-format", "json"],
                        env=env, cwd=tmp_path)
    wait_for(lambda: "serving on" in child.stderr() or not child.running, 30, message="the server to serve")
    assert child.stop(timeout=15) == 0, child.output()
    lines = [line for line in child.stderr().splitlines() if line.strip()]
    assert any("serving on" in line for line in lines), child.output()
    for line in lines:
        assert line.startswith("{"), f"not a JSON line: {line!r}"


# A Django project's LOGGING as its docs show it, without "disable_existing_loggers" (dictConfig's
# default then disables every logger that exists and that it does not name).
PROJECT_LOGGING = """
import logging.config
from livepush import jobs
logging.config.dictConfig({
    "version": 1,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"project": {"handlers": ["console"], "level": "INFO"}},
})
@jobs.job(name="t.project_logging")
async def noop(ctx):
    pass
"""


@pytest.mark.parametrize("command", ["jobs", "serve"])
def test_livepush_keeps_its_log_lines_when_a_module_it_loads_configures_logging_with_dictconfig(
        procs, livepush_env, pg_url, tmp_path, command: str) -> None:
    """A job module (`django.setup()` in livepush.contrib.django.runner does it) runs the project's
    dictConfig, which disables every logger that exists and that it does not name: in the web
    process livepush's loggers come after it, but `livepush jobs` and `serve --with-jobs` made
    theirs before loading the module, and every line of theirs was lost, a job failed for good
    included. They still write their lines, in the format asked for."""
    (tmp_path / "project_logging.py").write_text(PROJECT_LOGGING)
    argv = ["jobs", "project_logging"] if command == "jobs" else ["serve", "--with-jobs", "project_logging"]
    child = procs.start([sys.executable, "-m", "livepush", *argv, "--log-format", "json"],
                        env=livepush_env(database_url=pg_url), cwd=tmp_path)
    registered(pg_url, child)
    # Said once it runs, a moment after it registered: lost, it never comes.
    wait_for(lambda: "running: queues" in child.stderr() or not child.running, 15, message="the runtime's line")
    assert child.stop(timeout=15) == 0, child.output()
    lines = [json.loads(line) for line in child.stderr().splitlines() if line.strip()]
    assert any(line["logger"] == "livepush.jobs" and "running: queues" in line["message"] for line in lines), \
        child.output()


def test_under_workers_a_workers_json_error_line_names_it_like_its_other_lines(procs, livepush_env) -> None:
    """Under `serve --workers N` every JSON line names its process: the error line a worker that
    cannot start ends on carries its `worker` and `pid` too, before the supervisor's own line."""
    env = livepush_env(database_url="postgresql://livepush@127.0.0.1:1/nothing_listens_here")
    child = procs.livepush("serve", "--workers", "2", "--log-format", "json", env=env, wait_healthy=False)
    assert child.wait(30) == 1, child.output()
    entries = [json.loads(line) for line in child.stderr().splitlines() if line.strip()]
    failed = [e for e in entries if "127.0.0.1:1" in e["message"]]
    assert failed and failed[0]["worker"] == 1 and isinstance(failed[0]["pid"], int), entries
    assert all("pid" in e for e in entries), entries


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_under_workers_an_app_that_cannot_be_loaded_is_said_by_the_worker_named(procs, livepush_env, pg_url,
                                                                               log_format: str) -> None:
    """A worker whose `--app` cannot be loaded ends on a line that names it, in either format,
    as its other lines do: the operator sees which process gave up, not an unnamed line."""
    child = procs.livepush("serve", "--workers", "2", "--app", "no_such_module_here:app", "--log-format",
                           log_format, env=livepush_env(database_url=pg_url), wait_healthy=False)
    assert child.wait(30) == 2, child.output()
    lines = [line for line in child.stderr().splitlines() if "no_such_module_here" in line]
    assert len(lines) == 1, child.output()
    if log_format == "json":
        entry = json.loads(lines[0])
        assert entry["worker"] == 1 and isinstance(entry["pid"], int), entry
    else:
        assert lines[0].startswith("livepush: [worker 1 pid "), lines[0]


def test_a_workers_lines_name_it_and_its_pid_in_both_formats() -> None:
    """Under `serve --workers N`, text lines say `[worker I pid P]` (`[supervisor pid P]` for the
    parent) and JSON lines carry `worker` and `pid`; a lone server's lines are as before."""
    record = logging.LogRecord("livepush.server", logging.INFO, __file__, 1, "serving", (), None)

    def formatted(log_format: str, **role: object) -> str:
        root = logging.getLogger()
        saved = root.handlers[:]
        root.handlers.clear()
        try:
            logs.setup(log_format, **role)  # type: ignore[arg-type]
            handler = root.handlers[0]
            handler.filter(record)
            return handler.format(record)
        finally:
            root.handlers[:] = saved
            for attr in ("livepush_process", "livepush_worker"):
                record.__dict__.pop(attr, None)

    pid = record.process
    assert f"[worker 2 pid {pid}] livepush.server: serving" in formatted("text", worker=2)
    assert f"[supervisor pid {pid}] livepush.server: serving" in formatted("text", supervisor=True)
    assert "[" not in formatted("text")
    assert {k: v for k, v in json.loads(formatted("json", worker=2)).items() if k in ("worker", "pid")} == {
        "worker": 2, "pid": pid}
    supervisor = json.loads(formatted("json", supervisor=True))
    assert supervisor["pid"] == pid and "worker" not in supervisor
    assert not {"worker", "pid"} & set(json.loads(formatted("json")))


# What a runtime's background loops say when an attempt fails.
LOOP_FAILURES = ("claim failed", "heartbeat failed", "housekeeping failed", "promoting scheduled jobs failed")


def _sessions_read_only(admin_url: str, url: str, on: bool) -> None:
    """New sessions of the database take no writes (a failover's standby), and open ones end."""
    dbname = services.dbname_of(url)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = {}").format(
            psycopg.sql.Identifier(dbname), psycopg.sql.SQL("on" if on else "off")))
    services.pg_terminate(admin_url, dbname)


def test_a_runtimes_loops_say_each_failure_at_most_once_a_minute_while_the_database_refuses_them(
        procs, livepush_env, pg_url, pg_admin_url) -> None:
    """A database that refuses every write at once (a standby not yet promoted) fails each of the
    runtime's loops several times a second: each kind of failure is one line, not hundreds a
    minute that hide the line that matters; the runtime runs on."""
    # --retention 3: housekeeping prunes every 0.3 s (a tenth of it), so it writes, and fails, at
    # each round; at a week's retention it prunes once a minute, maybe only before the switch.
    child = procs.livepush("jobs", "tests.jobs.sample_jobs", "--heartbeat", "0.3", "--poll-interval", "0.05",
                           "--retention", "3", env=livepush_env(database_url=pg_url), wait_healthy=False)
    registered(pg_url, child)
    _sessions_read_only(pg_admin_url, pg_url, True)
    try:
        wait_for(lambda: all(kind in child.stderr() for kind in LOOP_FAILURES) or not child.running, 15.0,
                 message="each loop to fail")
        time.sleep(3.0)  # ten beats, sixty polls: the window in which each failure would be said again
        said = {kind: child.stderr().count(kind) for kind in LOOP_FAILURES}
    finally:
        _sessions_read_only(pg_admin_url, pg_url, False)
    assert said == dict.fromkeys(LOOP_FAILURES, 1), child.output()
    assert child.running and child.stop(timeout=15) == 0, child.output()


def test_a_failure_said_again_after_a_minute_says_how_many_were_not_said(caplog) -> None:
    """The line that ends a minute of silence counts the failures of its kind left unsaid."""
    now = [0.0]
    repeats = Repeats(logging.getLogger("livepush.jobs"), clock=lambda: now[0])
    caplog.set_level(logging.WARNING, "livepush.jobs")
    for second in range(0, 61, 5):
        now[0] = float(second)
        repeats.warning("claim failed (%s)", "read-only")
        repeats.warning("heartbeat failed (%s)", "read-only")
    assert [r.getMessage() for r in caplog.records] == [
        "claim failed (read-only)", "heartbeat failed (read-only)",
        "claim failed (read-only) (11 more like it in the last 60 s, said at most once a minute)",
        "heartbeat failed (read-only) (11 more like it in the last 60 s, said at most once a minute)"]


async def test_history_pruning_through_an_outage_is_one_warning_not_one_each_cycle(
        secret, monkeypatch, caplog) -> None:
    """A server's pruning fails every cycle while its store is away: the first failure of a run is
    a WARNING, the rest of the run debug lines, as the server's other reads say an outage; a cycle
    that prunes ends the run, and the next outage is said anew."""
    import asyncio

    from livepush.errors import DependencyError
    from livepush.fanout.local import LocalFanOut
    from livepush.server import app as server_app
    from tests.server.conftest import make_settings, start_served
    from tests.support.waiting import async_wait_for

    outcomes = [DependencyError("cannot reach Redis")] * 5 + [0] + [DependencyError("cannot reach Redis")] * 3
    calls = 0

    async def scripted_prune(self: LocalFanOut) -> int:
        nonlocal calls
        outcome = outcomes[min(calls, len(outcomes) - 1)]
        calls += 1
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(server_app, "PRUNE_EVERY_SECONDS", 0.01)
    monkeypatch.setattr(LocalFanOut, "prune", scripted_prune)
    caplog.set_level(logging.DEBUG, "livepush.server")
    served = await start_served(make_settings("local", secret, None, None))
    try:
        await async_wait_for(lambda: calls >= len(outcomes), 10, 0.01, message="every scripted prune cycle")
        await asyncio.sleep(0)
    finally:
        await served.stop()
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "pruning" in r.getMessage()]
    assert [level for level, _ in said if level == "WARNING"] == ["WARNING", "WARNING"], said
    assert all("cannot reach Redis" in message for _, message in said), said
