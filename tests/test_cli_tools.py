"""The operator tools: `livepush token ...` and `livepush publish`, good input and bad."""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Literal

import pytest

from livepush import InvalidTopic, sessions, topics
from livepush.demo import demo_secret
from tests.support.procs import stalled_import_script
from tests.support.waiting import wait_for


def test_token_topic_prints_a_signed_topic_that_verifies(procs, livepush_env, secret) -> None:
    """`livepush token topic TOPIC --ttl S` prints a signed topic the server accepts."""
    child = procs.livepush("token", "topic", "job:42", "--ttl", "60", env=livepush_env())
    assert child.wait(20) == 0, child.output()
    assert topics.verify(child.stdout().strip(), [secret]) == "job:42"


def test_token_topic_expires_after_the_signed_topic_ttl_by_default(procs, livepush_env, secret) -> None:
    """Without --ttl, `livepush token topic` signs for LIVEPUSH_SIGNED_TOPIC_TTL seconds: the topic verifies now, not after."""
    started = time.time()
    child = procs.livepush("token", "topic", "job:42", env=livepush_env(signed_topic_ttl=120))
    assert child.wait(20) == 0, child.output()
    signed = child.stdout().strip()
    assert topics.verify(signed, [secret]) == "job:42"
    expires = int(signed.split("~")[1])
    assert started + 120 <= expires <= time.time() + 121  # whole seconds, rounded up
    with pytest.raises(InvalidTopic) as info:
        topics.verify(signed, [secret], now=expires)
    assert info.value.reason == "expired"


def test_token_topic_ttl_replaces_the_signed_topic_ttl_variable_which_is_then_not_read(procs, livepush_env,
                                                                                        secret) -> None:
    """`livepush token topic TOPIC --ttl S` stands in for LIVEPUSH_SIGNED_TOPIC_TTL, as a flag does for
    its variable: a stale, bad value left in the variable does not refuse the command."""
    child = procs.livepush("token", "topic", "job:42", "--ttl", "60", env=livepush_env(signed_topic_ttl="bad"))
    assert child.wait(20) == 0, child.output()
    assert topics.verify(child.stdout().strip(), [secret]) == "job:42"


def test_token_session_prints_a_session_token_for_the_subject(procs, livepush_env, secret) -> None:
    """`livepush token session SUBJECT` prints a token whose subject is SUBJECT."""
    child = procs.livepush("token", "session", "user-7", "--ttl", "100", env=livepush_env())
    assert child.wait(20) == 0, child.output()
    assert sessions.decode(child.stdout().strip(), [secret]).subject == "user-7"


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["token", "topic", "bad topic"], "invalid topic"),
        (["token", "topic", "a", "--ttl", "-5"], "argument --ttl: takes a positive number"),
        (["token", "session", "u", "--ttl", "0"], "argument --ttl: takes a positive number"),
        # Past a session's longest life the line names the flag, not the API's parameter, and the
        # value as its digits say it: one second past the limit is not rounded to the limit itself.
        (["token", "session", "u", "--ttl", "1e8"], "--ttl 100000000: a session token lasts at most 31622400"),
        (["token", "session", "u", "--ttl", "31622401"], "--ttl 31622401: a session token lasts at most 31622400"),
        (["token", "session", ""], "subject"),
        (["publish", "_livepush.x", "{}"], "reserved"),
        (["publish", "job:1", "{}"], "state topic"),
        # Operators' pages read runtimes' state there: an app's message would pass for one.
        (["publish", "runtimes", "{}"], "livepush's own"),
        (["publish", "runtime:3", "{}"], "livepush's own"),
        (["publish", "a", "{not json"], "JSON"),
        (["publish", "a", '{"x": NaN}'], "JSON"),
        (["publish", "a", "[" * 5000 + "]" * 5000], "nested too deeply"),
        (["nope"], "invalid choice"),
        # NaN or infinity in a heartbeat would break every runtime's rescue of dead ones; a
        # poll interval of nothing spins.
        (["jobs", "tests.jobs.sample_jobs", "--heartbeat", "nan"], "--heartbeat nan"),
        (["jobs", "tests.jobs.sample_jobs", "--heartbeat", "inf"], "--heartbeat inf"),
        (["jobs", "tests.jobs.sample_jobs", "--poll-interval", "-1"], "--poll-interval -1"),
        (["jobs", "tests.jobs.sample_jobs", "--shutdown-timeout", "nan"], "--shutdown-timeout nan"),
        # Infinity is "0 or more": the line must say what is wrong with it.
        (["jobs", "tests.jobs.sample_jobs", "--shutdown-timeout", "inf"], "--shutdown-timeout inf: use a finite"),
        (["jobs", "tests.jobs.sample_jobs", "--retention", "nan"], "--retention nan"),
        # 0 keeps finished jobs: the range the line gives must not leave it out, and writes the
        # upper bound as --help does.
        (["jobs", "tests.jobs.sample_jobs", "--retention", "-1"], "from 0.001 to 3162240000 (100 years), or 0"),
    ],
)
def test_bad_operator_input_exits_2_with_one_line(procs, livepush_env, argv, needle) -> None:
    """A mistake in what the operator typed exits 2 with a line naming it, never a traceback."""
    child = procs.livepush(*argv, env=livepush_env())
    assert child.wait(20) == 2
    err = child.stderr()
    assert "Traceback" not in err and needle in err, err


def test_a_concurrency_no_runtime_can_hold_exits_2_before_registering(procs, livepush_env, pg_url) -> None:
    """--concurrency past what a runtime's row can record (an integer) is refused by name, not
    met with the driver's traceback when the runtime registers."""
    child = procs.livepush("jobs", "tests.jobs.sample_jobs", "--concurrency", "3000000000",
                           env=livepush_env(database_url=pg_url))
    assert child.wait(20) == 2, child.output()
    err = child.stderr()
    assert "Traceback" not in err and "--concurrency 3000000000" in err, err


def test_a_retention_postgres_cannot_subtract_from_now_exits_2(procs, livepush_env, pg_url) -> None:
    """--retention past what Postgres can take from now() (a few thousand years) is refused by
    name at start, instead of a runtime that runs and fails every prune, with a warning each time."""
    child = procs.livepush("jobs", "tests.jobs.sample_jobs", "--retention", "1e12",
                           env=livepush_env(database_url=pg_url))
    assert child.wait(20) == 2, child.output()
    err = child.stderr()
    assert "Traceback" not in err and "--retention 1000000000000" in err, err


@pytest.mark.parametrize("modules", ["", ",", " , "])
def test_jobs_naming_no_module_exits_2(procs, livepush_env, pg_url, modules) -> None:
    """`livepush jobs "$MODULES"` with nothing in it is a usage error naming MODULE, not a runtime
    that serves the default queue with no job function to run."""
    child = procs.livepush("jobs", modules, env=livepush_env(database_url=pg_url))
    assert child.wait(20) == 2, child.output()
    err = child.stderr()
    assert "Traceback" not in err and "MODULE" in err, err


@pytest.mark.parametrize("queues", ["", ",", " , "])
def test_jobs_with_queues_naming_no_queue_exits_2(procs, livepush_env, pg_url, queues) -> None:
    """`livepush jobs MODULE --queues "$QUEUES"` with nothing in it is a usage error naming
    --queues, not a runtime that serves every queue of its modules, those meant for other
    runtimes too (as `--queues` left out does)."""
    child = procs.livepush("jobs", "tests.jobs.sample_jobs", "--queues", queues, env=livepush_env(database_url=pg_url))
    assert child.wait(20) == 2, child.output()
    err = child.stderr()
    assert "Traceback" not in err and "--queues" in err, err


def test_jobs_with_a_queue_no_job_of_its_modules_uses_warns_naming_it(procs, livepush_env, pg_url) -> None:
    """`--queues defualt` (a typo) started a runtime that served nothing and said only "running:
    queues defualt". A queue no job function of the modules has is served (a job enqueued there by
    name runs), with a warning naming it and the modules' own queues."""
    child = procs.livepush("jobs", "tests.jobs.sample_jobs", "--queues", "default,defualt",
                           env=livepush_env(database_url=pg_url))
    wait_for(lambda: "running: queues" in child.stderr() or not child.running, 30.0,
             message="the runtime's 'running' line")
    assert child.running, child.output()
    assert child.stop(15) == 0, child.output()
    warnings = [line for line in child.stderr().splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "--queues defualt" in warnings[0] and "second" in warnings[0], warnings


def _jobs_from(procs, folder: Path, module: str, env: dict[str, str]) -> Any:
    """`livepush jobs MODULE` run by its console script from `folder`, as a user runs it from a project."""
    script = Path(sys.executable).parent / "livepush"
    return procs.start([str(script), "jobs", module], env=env, cwd=folder, name=f"livepush jobs {module}")


@pytest.mark.parametrize("line,says", [
    ("@jobs.job(name='bad.timeout', timeout=0)", "ValueError: timeout must be a positive number"),
    ("@jobs.job(name='bad.priority', priority=1.5)", "TypeError: @jobs.job(priority=) takes an int"),
])
def test_a_job_module_that_fails_at_import_exits_2_naming_it_and_its_line(procs, livepush_env, pg_url, tmp_path,
                                                                          line, says) -> None:
    """A job module whose decorator refuses its options (or that raises anything at import) ends
    `livepush jobs` with exit 2 and one line naming the module, the line of it that raised, and
    the error: not a traceback through livepush's import machinery."""
    (tmp_path / "refused_jobs.py").write_text(f"from livepush import jobs\n\n\n{line}\nasync def f(ctx):\n    pass\n")
    child = _jobs_from(procs, tmp_path, "refused_jobs", livepush_env(database_url=pg_url))
    assert child.wait(20) == 2, child.output()
    err = child.stderr().strip().splitlines()
    assert len(err) == 1 and "Traceback" not in child.output(), child.output()
    assert "'refused_jobs'" in err[0] and "refused_jobs.py:4" in err[0] and says in err[0], err


@pytest.mark.parametrize("source,says", [
    # The module is there; what it imports is not: the module's line, not "check the name".
    ("import a_dependency_not_installed\n", "broken_jobs.py:1"),
    ("from livepush import jobs\n\n\ndef f(:\n    pass\n", "broken_jobs.py:4"),
])
def test_a_job_module_that_is_found_but_breaks_at_import_names_its_own_line(procs, livepush_env, pg_url, tmp_path,
                                                                             source, says) -> None:
    """A job module that exists but cannot be imported (a dependency missing, a syntax error) exits 2
    naming the line of that module: not "check the name", nor a line of Python's import machinery."""
    (tmp_path / "broken_jobs.py").write_text(source)
    child = _jobs_from(procs, tmp_path, "broken_jobs", livepush_env(database_url=pg_url))
    assert child.wait(20) == 2, child.output()
    err = child.stderr().strip().splitlines()
    assert len(err) == 1 and "Traceback" not in child.output(), child.output()
    assert "'broken_jobs'" in err[0] and says in err[0] and "check the name" not in err[0], err


@pytest.mark.parametrize("exits", ["sys.exit(0)", "sys.exit('FOO is not set')",
                                   "argparse.ArgumentParser().parse_args(['--not-an-option'])"])
def test_a_job_module_that_exits_at_import_exits_2_naming_its_line(procs, livepush_env, pg_url, tmp_path,
                                                                 exits: str) -> None:
    """A job module that exits when imported (a script's code left at module level: sys.exit(),
    argparse) ended the runtime as it said: with sys.exit(0), status 0 and not a word, as after a
    clean stop. It exits 2 with a line naming the module and its own line (not argparse's), and
    saying what to change."""
    (tmp_path / "exiting_jobs.py").write_text(f"import argparse\nimport sys\n\n{exits}\n")
    child = _jobs_from(procs, tmp_path, "exiting_jobs", livepush_env(database_url=pg_url))
    assert child.wait(20) == 2, child.output()
    err = child.stderr().strip().splitlines()
    assert "Traceback" not in child.output(), child.output()
    assert "'exiting_jobs'" in err[-1] and "(exiting_jobs.py:4)" in err[-1] and "__main__" in err[-1], err


def test_a_typo_in_a_job_module_path_says_to_check_the_name(procs, livepush_env, pg_url) -> None:
    """A module path with a typo in its last part exits 2 with one line naming it and what to check."""
    child = procs.livepush("jobs", "tests.jobs.sample_jbos", env=livepush_env(database_url=pg_url))
    assert child.wait(20) == 2, child.output()
    err = child.stderr().strip().splitlines()
    assert len(err) == 1 and "'tests.jobs.sample_jbos'" in err[0] and "check the name" in err[0], err


@pytest.mark.parametrize("modules", ["tests/jobs/sample_jobs.py", "./tests/jobs/sample_jobs.py",
                                     "tests.jobs.sample_jobs.py"])
def test_a_job_module_given_as_a_file_path_exits_2_naming_the_module_to_write(procs, livepush_env, pg_url,
                                                                              modules: str) -> None:
    """`livepush jobs myapp/jobs.py` (a path where a module is meant) exits 2 with one line giving
    the module's name to write instead, not "no module named" or a TypeError from importlib."""
    child = procs.livepush("jobs", modules, env=livepush_env(database_url=pg_url))
    assert child.wait(20) == 2, child.output()
    err = child.stderr().strip().splitlines()
    assert len(err) == 1 and "file path" in err[0] and err[0].endswith("e.g. tests.jobs.sample_jobs"), err


def test_job_modules_that_define_no_job_exit_2(procs, livepush_env, pg_url, tmp_path) -> None:
    """`livepush jobs` given modules that define no job function (the wrong module of the app) exits
    2 naming them, instead of a runtime that claims the default queue's jobs only to give them back."""
    (tmp_path / "settings_only.py").write_text("DEBUG = True\n")
    child = _jobs_from(procs, tmp_path, "settings_only", livepush_env(database_url=pg_url))
    assert child.wait(20) == 2, child.output()
    err = child.stderr()
    assert "Traceback" not in err and "settings_only" in err and "no job" in err, err


@pytest.mark.parametrize("queue,needle", [("\udcff", "--queues"), ("q" * 201, "--queues")])
def test_a_queue_name_no_job_can_have_exits_2(procs, livepush_env, pg_url, queue, needle) -> None:
    """--queues takes the names enqueue() accepts: one Postgres cannot store (bytes that are not
    UTF-8) or longer than any queue is one line naming --queues, not a driver traceback or a
    runtime serving a queue no job can be in."""
    child = procs.livepush("jobs", "tests.jobs.sample_jobs", "--queues", f"default,{queue}",
                           env=livepush_env(database_url=pg_url))
    assert child.wait(20) == 2, child.output()
    err = child.stderr()
    assert "Traceback" not in err and needle in err, err


@pytest.mark.parametrize("stored", ["", "short", "\n"])
def test_the_demo_replaces_a_stored_secret_it_cannot_use(tmp_path, stored) -> None:
    """A demo stopped between creating .livepush/secret and writing it leaves the file empty (or a
    person edits it): the next demo makes a new secret and keeps that one, instead of failing on
    every start with a complaint about a LIVEPUSH_SECRET nobody set."""
    from livepush.config import Settings

    (tmp_path / "secret").write_text(stored)
    value = demo_secret(tmp_path)
    assert Settings().replace(secret=value).secret == value  # a secret the settings accept
    assert (tmp_path / "secret").read_text() == value
    assert demo_secret(tmp_path) == value


def _secret_when_told(folder: Path, go: Any, out: Any) -> None:
    go.wait(10)
    out.put(demo_secret(folder))


def test_demos_starting_at_once_in_a_new_folder_all_use_the_secret_it_keeps(tmp_path) -> None:
    """Demos that make their secret at the same moment (started together in a new folder) all
    end up with the one .livepush/secret keeps, so a page's signed topics still verify after any
    of them restarts, instead of each keeping its own while only the last one written is kept."""
    context = multiprocessing.get_context("fork")
    for round_ in range(10):
        folder = tmp_path / str(round_)
        go, out = context.Event(), context.Queue()
        children = [context.Process(target=_secret_when_told, args=(folder, go, out)) for _ in range(8)]
        for child in children:
            child.start()
        go.set()
        used = [out.get(timeout=20) for _ in children]
        for child in children:
            child.join(10)
        kept = (folder / "secret").read_text()
        assert set(used) == {kept}, f"round {round_}: {len(set(used))} secrets in use, the folder keeps one"


def test_demos_starting_at_once_on_an_old_embedded_database_reset_it_once(pg_url, tmp_path, monkeypatch,
                                                                         caplog) -> None:
    """Two demos started together in one folder, after an upgrade, on an embedded database a former
    livepush made: one resets and migrates it, the other finds it migrated. Both reset it, the
    second dropping the schema the first was migrating or already served from ("no schema has
    been selected to create in", exit 1)."""
    import threading

    import psycopg

    from livepush import demo, migrate
    from livepush.config import Settings

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE livepush_schema SET checksum = 'made by a former livepush' WHERE version = 1")
    settings = Settings(database_url=pg_url)
    # Each demo's first look at the schema waits here for the other's: unfixed, both find it old.
    # Fixed, the second cannot look before the first is done, so the first waits in vain, briefly.
    both_looked = threading.Barrier(2, timeout=2)
    real = migrate.migrate_configured
    looked: set[int] = set()

    def migrate_configured(*args: Any, **kwargs: Any) -> Any:
        try:
            return real(*args, **kwargs)
        finally:
            if threading.get_ident() not in looked:
                looked.add(threading.get_ident())
                with contextlib.suppress(threading.BrokenBarrierError):
                    both_looked.wait()

    monkeypatch.setattr(migrate, "migrate_configured", migrate_configured)
    failures: list[BaseException] = []

    def start() -> None:
        try:
            demo._migrate(settings, folder=tmp_path)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)

    caplog.set_level("WARNING", logger="livepush.demo")
    demos = [threading.Thread(target=start) for _ in range(2)]
    for thread in demos:
        thread.start()
    for thread in demos:
        thread.join(30)
    assert not failures, failures
    resets = [r for r in caplog.records if "resetting it" in r.getMessage()]
    assert len(resets) == 1, [r.getMessage() for r in resets]
    assert migrate.schema_version(pg_url) == migrate.required_version()


def test_publish_without_a_shared_fan_out_exits_2_instead_of_losing_the_message(procs, livepush_env) -> None:
    """The local fan-out reaches only the process that publishes: from `livepush publish`, a
    process of its own, no server could ever receive the message. Without a database or Redis the
    command says so, naming LIVEPUSH_FANOUT, rather than printing an offset for a lost message."""
    child = procs.livepush("publish", "chat:lobby", '{"text": "hi"}', env=livepush_env())
    assert child.wait(20) == 2, child.output()
    err = child.stderr()
    assert "Traceback" not in err and "LIVEPUSH_FANOUT" in err, err
    assert child.stdout() == ""


@pytest.mark.parametrize("argv", [["serve", "--workers", "2"], ["publish", "chat:lobby", "{}"]])
def test_the_local_fan_out_chosen_beside_a_database_url_says_to_drop_that_choice(procs, livepush_env,
                                                                                argv: list[str]) -> None:
    """With a database URL set and the local fan-out chosen anyway, `serve --workers 2` and
    `publish` said to set LIVEPUSH_DATABASE_URL, which is set: they say to drop the choice of the
    local fan-out (the database's is the default then), or to run one worker."""
    env = livepush_env(database_url="postgresql://app@db.example/app", fanout="local")
    child = procs.livepush(*argv, env=env, wait_healthy=False)
    assert child.wait(20) == 2, child.output()
    err = child.stderr()
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "set LIVEPUSH_DATABASE_URL" not in err.replace("Set", "set"), err
    assert "LIVEPUSH_FANOUT (with LIVEPUSH_DATABASE_URL set the fan-out is then postgres)" in err, err


@pytest.mark.parametrize("command", [["publish", "chat:lobby", '{"text": "hi"}'], ["status"], ["demo"]])
def test_a_login_postgres_or_redis_refuses_exits_2_naming_the_setting(procs, livepush_env, pg_admin_url, pg_url,
                                                                      redis_url, command) -> None:
    """Every command that connects, not only serve, jobs and migrate, takes a login refused by a
    Postgres or Redis that is up for what it is: a setting to correct, exit 2, one line naming it
    (LIVEPUSH_DATABASE_URL, LIVEPUSH_REDIS_URL) and never the password. (`status` on Redis prints
    its report first: tests/test_status.py.)"""
    import psycopg

    from tests.support import services

    with services.pg_password_role(pg_admin_url, "s3cret-pw") as role_url:
        wrong = psycopg.conninfo.make_conninfo(services.db_url(role_url, services.dbname_of(pg_url)),
                                               password="wrong-pw")
        child = procs.livepush(*command, env=livepush_env(database_url=wrong), wait_healthy=False)
        assert child.wait(30) == 2, child.output()
        lines = child.stderr().strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in child.stderr(), child.output()
        assert "LIVEPUSH_DATABASE_URL" in lines[0] and "password authentication failed" in lines[0], lines
        assert "wrong-pw" not in child.output(), child.output()
    if command[0] == "status":
        return
    wrong = redis_url.replace("redis://", "redis://nobody:wrong-pw@", 1)
    child = procs.livepush(*command, env=livepush_env(database_url=pg_url if command[0] == "demo" else None,
                                                      redis_url=wrong, fanout="redis"), wait_healthy=False)
    assert child.wait(30) == 2, child.output()
    lines = child.stderr().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in child.stderr(), child.output()
    assert "LIVEPUSH_REDIS_URL" in lines[0] and "refused the user or password" in lines[0], lines
    assert "wrong-pw" not in child.output(), child.output()


@pytest.mark.parametrize("command", [["publish", "chat:lobby", '{"text": "hi"}'], ["status"], ["serve"]])
def test_a_redis_database_number_redis_does_not_have_exits_2_naming_the_setting(procs, livepush_env, pg_url,
                                                                                 redis_url, command) -> None:
    """A Redis that is up and has no database of the URL's number (`/99` where Redis has 16) is a
    setting to correct, as a Postgres database that does not exist is: exit 2 with one line naming
    LIVEPUSH_REDIS_URL, not 1, which a process manager or a script retries though nothing changes
    until the URL does. (`status` prints the database's report first.)"""
    base, _, _ = redis_url.rpartition("/")
    env = livepush_env(database_url=pg_url, redis_url=f"{base}/99",
                       fanout=None if command[0] == "status" else "redis")
    child = procs.livepush(*command, env=env, wait_healthy=False)
    assert child.wait(30) == 2, child.output()
    lines = child.stderr().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in child.stderr(), child.output()
    assert "LIVEPUSH_REDIS_URL" in lines[0] and "no database of the number" in lines[0], lines
    if command[0] == "status":
        assert "Queues" in child.stdout(), child.output()


def test_publish_to_a_schema_out_of_the_search_path_names_that_schema(procs, livepush_env, pg_admin_url) -> None:
    """`livepush publish` on a database whose livepush schema is in a schema the role's search_path
    misses names that schema and how to reach it, as serve and jobs do, not "lacks livepush's
    schema: run `livepush migrate`", a migrate that refuses to make a second copy."""
    from tests.support import services

    with services.pg_migrated_into_schema_app(pg_admin_url) as (url, _):
        child = procs.livepush("publish", "chat:lobby", '{"text": "hi"}', env=livepush_env(database_url=url))
        assert child.wait(30) == 2, child.output()
    lines = child.stderr().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in child.stderr(), child.output()
    assert 'in schema "app"' in lines[0] and "search_path" in lines[0], lines


# The command line's own modules' import (livepush.cli.commands: the parser, the settings, the
# logs) held up until a signal came, started as the console script does or as `python -m livepush`.
COMMAND_LINE_MODULES = "livepush.cli.commands"


@pytest.mark.parametrize("entry", ["script", "module"])
@pytest.mark.parametrize("argv,sig,status,said", [
    (["status"], signal.SIGINT, 130, "interrupted (SIGINT) before status finished"),
    (["serve"], signal.SIGTERM, 0, ""),
    (["serve"], signal.SIGINT, 0, ""),
], ids=["status-SIGINT", "serve-SIGTERM", "serve-SIGINT"])
def test_a_stop_signal_while_the_command_lines_modules_import_is_taken_as_later(
        procs, livepush_env, tmp_path: Path, entry: Literal["script", "module"], argv: list[str],
        sig: signal.Signals, status: int, said: str) -> None:
    """Ctrl-C or SIGTERM while the command line's own modules import, the first moments of every
    command, gets what it gets a moment later: `status` exits 130 with its one line, `serve` stops
    with exit 0. Both came before anything held them back: a KeyboardInterrupt traceback, or
    death by SIGTERM (143)."""
    started = tmp_path / "import-started"
    script = stalled_import_script(COMMAND_LINE_MODULES, 3, started, entry)
    child = procs.start([sys.executable, "-c", script, *argv], env=livepush_env(), name=f"livepush {argv[0]}")
    wait_for(started.exists, 20.0, message="the command line's import to start")
    child.signal(sig)
    assert child.wait(10) == status, child.output()
    assert "Traceback" not in child.stderr() and said in child.stderr(), child.output()


def test_token_without_a_secret_exits_2(procs, livepush_env) -> None:
    """Signing without LIVEPUSH_SECRET says how to set it."""
    env = livepush_env()
    env.pop("LIVEPUSH_SECRET")
    child = procs.livepush("token", "topic", "a", env=env)
    assert child.wait(20) == 2 and "LIVEPUSH_SECRET" in child.stderr()


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_a_command_started_with_its_standard_input_closed_stops_cleanly(procs, livepush_env, pg_url, command) -> None:
    """Started with descriptor 0 closed (`<&-`, as some supervisors and scripts leave it), `serve`
    and `demo` serve and stop on SIGTERM with exit 0, instead of aborting (SIGABRT) when the event
    loop closes the socket that took that descriptor."""
    env = livepush_env(database_url=pg_url)
    child = procs.start(["sh", "-c", 'exec "$@" <&-', "sh", sys.executable, "-m", "livepush", command], env=env,
                        port=int(env["LIVEPUSH_PORT"]), name=f"livepush {command} <&-")
    child.wait_healthy()
    assert child.stop(15) == 0, child.output()


def test_the_demo_serves_when_its_standard_output_cannot_take_the_url(procs, livepush_env, pg_url) -> None:
    """`livepush demo > /dev/full` (or a reader that went away): the demo serves all the same, says
    where on stderr, and stops on SIGTERM with exit 0, instead of ending with a traceback."""
    env = livepush_env(database_url=pg_url)
    child = procs.start(["sh", "-c", 'exec "$@" >/dev/full', "sh", sys.executable, "-m", "livepush", "demo"], env=env,
                        port=int(env["LIVEPUSH_PORT"]), name="livepush demo >/dev/full")
    child.wait_healthy()
    wait_for(lambda: "the demo is at http://" in child.stderr() or not child.running, timeout=15,
             message="the demo's URL on stderr")
    assert child.running, child.output()
    assert child.stop(15) == 0, child.output()
    assert "Traceback" not in child.stderr(), child.output()


@pytest.mark.parametrize("argv", [
    ["serve", "--port", "1_000"],
    ["serve", "--port", "１０００"],
    ["serve", "--drain-seconds", "1_0"],
    ["jobs", "m", "--concurrency", "١٠"],
    ["jobs", "m", "--heartbeat", "1_0"],
    ["jobs", "m", "--shutdown-timeout", "３０"],
    ["jobs", "m", "--poll-interval", "1_0"],
    ["jobs", "m", "--retention", "1_000"],
    ["jobs", "m", "--metrics-port", "9_090"],
    ["status", "--limit", "1_0"],
    ["token", "topic", "a", "--ttl", "6_0"],
])
def test_a_number_flag_takes_plain_ascii_digits_only(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A numeric flag reads what was typed as its variable would: `--port 1_000` or digits of another
    script exit 2 naming the flag, where Python's int() and float() took them as another number."""
    from livepush.cli.commands import build_parser

    with pytest.raises(SystemExit) as raised:
        build_parser().parse_args(argv)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argv[-2]}" in err and repr(argv[-1]) in err, err


@pytest.mark.parametrize("argv,example", [
    (["jobs", "myapp.jobs", "other.jobs"], "livepush jobs myapp.jobs,other.jobs"),
    (["jobs", "myapp.jobs", "--queues", "a", "b"], "--queues a,b"),
    (["serve", "--with-jobs", "myapp.jobs", "other.jobs"], "--with-jobs myapp.jobs,other.jobs"),
])
def test_a_list_given_with_spaces_is_refused_saying_to_join_it_with_commas(
        argv: list[str], example: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`livepush jobs myapp.jobs other.jobs`, as many commands take a list, answered only
    "unrecognized arguments: other.jobs". The line now says the list takes commas, as written."""
    from livepush.cli.commands import main

    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {argv[-1]}" in err and f"e.g. {example}" in err, err


def test_a_word_left_after_a_flags_value_is_not_taken_for_a_list(capsys: pytest.CaptureFixture[str]) -> None:
    """`--concurrency 3 4` is no list of modules: the line names the word alone, suggesting no commas."""
    from livepush.cli.commands import main

    with pytest.raises(SystemExit):
        main(["jobs", "myapp.jobs", "--concurrency", "3", "4"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: 4" in err and "commas" not in err, err


@pytest.mark.parametrize("argv", [["migrate", "--bogus"], ["status", "--jsno"], ["token", "topic", "a", "b"]])
def test_an_unknown_argument_to_a_command_shows_that_commands_usage(argv: list[str],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A flag or argument a command does not take exits 2 with that command's usage (what it does
    take) and the argument named, not the usage of `livepush` itself."""
    from livepush.cli.commands import main

    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: livepush {argv[0]} ") and f"unrecognized arguments: {argv[-1]}" in err, err


@pytest.mark.parametrize("argv,variable", [(["demo", "--port", "9000"], "LIVEPUSH_PORT"),
                                           (["demo", "--host=0.0.0.0"], "LIVEPUSH_HOST"),
                                           (["jobs", "x", "--port", "9000"], None)])
def test_a_serve_flag_given_to_the_demo_names_the_variable_that_sets_it(
        argv: list[str], variable: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    """`livepush demo --port 9000` is refused (the demo listens where the variables say), naming
    the variable that does what the flag would have done; a command that does not listen at all
    is pointed at no variable."""
    from livepush.cli.commands import main

    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err, err
    assert (f"{argv[0]} reads {variable} instead" in err) if variable else "instead" not in err, err


@pytest.mark.parametrize("argv", [["token", "session", "user-7"], ["status"], ["--version"], ["--help"],
                                  ["status", "--help"]])
def test_output_to_a_reader_that_went_away_ends_quietly(livepush_env, pg_url, argv: list[str]) -> None:
    """A command whose reader has gone (`livepush status | head -1` once head has its line) exits 1
    with nothing on stderr, not a BrokenPipeError traceback."""
    import subprocess

    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "livepush", *argv], stdout=write, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, env=livepush_env(database_url=pg_url), timeout=30)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr.decode()) == (1, "")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, a device every write to fails")
@pytest.mark.parametrize("argv", [["token", "session", "user-7"], ["status"], ["--version"], ["--help"],
                                  ["status", "--help"]])
def test_output_that_cannot_be_written_is_one_line_and_exit_1(livepush_env, pg_url, argv: list[str]) -> None:
    """`livepush status > file` on a full disk (here /dev/full) exits 1 with one line that says the
    output could not be written and why, not an OSError traceback."""
    import subprocess

    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "livepush", *argv], stdout=full, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, env=livepush_env(database_url=pg_url), timeout=30)
    err = done.stderr.decode()
    assert done.returncode == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "could not write" in err and "No space left on device" in err, err


def test_a_printing_command_started_with_stdout_closed_exits_2(livepush_env) -> None:
    """`livepush token ... >&-` exits 2 saying stdout is closed, instead of exit 0 with the token
    printed nowhere."""
    import subprocess

    done = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "livepush", "token", "session",
                           "user-7"], stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=livepush_env(), timeout=30)
    err = done.stderr.decode()
    assert done.returncode == 2 and "standard output is closed" in err and "Traceback" not in err, err


@pytest.mark.parametrize("shell,given,needle", [
    ('exec "$@" <&-', None, "JSON argument '-' reads the message from standard input, which is closed"),
    ('exec "$@"', b'{"text": "hi"', "JSON from standard input is not valid JSON"),
    ('exec "$@"', b"", "JSON from standard input is not valid JSON"),
    ('exec "$@"', b'{"text": "\xe9"}', "JSON from standard input is not UTF-8"),
], ids=["closed", "not JSON", "empty", "not UTF-8"])
def test_publish_reading_a_bad_message_from_standard_input_exits_2_naming_it(
        livepush_env, shell: str, given: bytes | None, needle: str) -> None:
    """`livepush publish TOPIC -` reads the message from standard input: closed, empty, not JSON or
    not UTF-8 there, it exits 2 with one line saying so, and publishes nothing."""
    import subprocess

    done = subprocess.run(["sh", "-c", shell, "sh", sys.executable, "-m", "livepush", "publish", "chat:lobby", "-"],
                          input=given, stdin=None if given is not None else subprocess.DEVNULL,
                          capture_output=True, env=livepush_env(), timeout=30)
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert needle in err, err


def test_publish_refuses_standard_input_longer_than_any_message_without_reading_it_all(livepush_env) -> None:
    """A message is at most 1 MiB of JSON, so `livepush publish TOPIC -` reads standard input only
    so far past that as whitespace and escapes could pad such a message: a larger file, or an
    endless stream (`< /dev/zero`), exits 2 saying so, not after holding all of it in memory."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "livepush", "publish", "chat:lobby", "-"],
                          input=b" " * (17 * 1024 * 1024) + b"{}", capture_output=True, env=livepush_env(), timeout=30)
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "standard input holds more than 16 MiB" in err and "1 MiB" in err, err


def test_publish_dash_at_a_terminal_says_it_reads_standard_input(livepush_env) -> None:
    """Typed at a terminal, `livepush publish TOPIC -` says on stderr that it reads the message's
    JSON from standard input and how to end it, where it would otherwise look hung."""
    import pty
    import subprocess

    master, terminal = pty.openpty()
    try:
        child = subprocess.Popen([sys.executable, "-m", "livepush", "publish", "chat:lobby", "-"], stdin=terminal,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=livepush_env())
        os.write(master, b'{"text": "hi"}\n\x04')  # a line, then Ctrl-D
        _, err = child.communicate(timeout=30)
    finally:
        os.close(master)
        os.close(terminal)
    said = err.decode()
    assert said.startswith("livepush publish: reading the message's JSON from standard input; end it with Ctrl-D\n"), said
    assert child.returncode == 2 and "LIVEPUSH_FANOUT=local" in said, said  # read whole, then the local fan-out refused


def test_a_migration_with_stdout_closed_runs_all_the_same(livepush_env, pg_url: str) -> None:
    """`livepush migrate >&-` (a deploy script that throws the report away) runs and exits 0: the
    migration, not its report, is what it gives, and its exit status says how it went."""
    import subprocess

    done = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "livepush", "migrate"],
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=livepush_env(database_url=pg_url),
                          timeout=120)
    assert done.returncode == 0, done.stderr.decode()


def test_a_flag_overrides_its_variable_even_when_the_variable_is_bad(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag of `serve` replaces its variable, which is then not read: a stale, bad LIVEPUSH_PORT
    (or host, fan-out, authenticate, drain seconds) does not refuse `--port 9000`."""
    from livepush.cli.commands import _settings, build_parser

    monkeypatch.setattr("livepush.config._current", None)  # _settings() sets the process's: undone after
    for variable in ("LIVEPUSH_HOST", "LIVEPUSH_PORT", "LIVEPUSH_FANOUT", "LIVEPUSH_AUTHENTICATE",
                     "LIVEPUSH_DRAIN_SECONDS"):
        monkeypatch.setenv(variable, " \u00a0bad")
    args = build_parser().parse_args(["serve", "--host", "127.0.0.2", "--port", "9000", "--fanout", "local",
                                      "--authenticate", "off", "--drain-seconds", "1.5"])
    settings = _settings(args)
    assert (settings.host, settings.port, settings.fanout, settings.authenticate, settings.drain_seconds) == (
        "127.0.0.2", 9000, "local", "off", 1.5)


def test_migrate_lock_timeout_overrides_its_variable_and_a_bad_one_names_both(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`migrate --lock-timeout S` replaces LIVEPUSH_MIGRATE_LOCK_TIMEOUT, which is then not read; a
    bad value there refuses a command without the flag naming the variable alone (`status` has no
    --lock-timeout to give)."""
    from livepush.cli.commands import main

    monkeypatch.setattr("livepush.config._current", None)
    monkeypatch.setenv("LIVEPUSH_MIGRATE_LOCK_TIMEOUT", "90000")
    monkeypatch.delenv("LIVEPUSH_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    for argv, said in ((["migrate", "--lock-timeout", "2"], "LIVEPUSH_DATABASE_URL is not set"),
                       (["migrate"], "LIVEPUSH_MIGRATE_LOCK_TIMEOUT=90000 (or --lock-timeout) is out of range"),
                       (["status"], "LIVEPUSH_MIGRATE_LOCK_TIMEOUT=90000 is out of range")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert main(argv) == 2
        assert said in err.getvalue(), (argv, err.getvalue())


@pytest.mark.parametrize("argv,said", [
    (["migrate", "--lock-timeout", "-1"], "livepush: --lock-timeout -1 is out of range"),
    (["serve", "--port", "70000"], "livepush: --port 70000 is out of range"),
    (["serve", "--drain-seconds", "999"], "livepush: --drain-seconds 999 is out of range"),
])
def test_a_flag_out_of_range_is_named_as_typed_not_as_its_variable(
        monkeypatch: pytest.MonkeyPatch, argv: list[str], said: str) -> None:
    """A value given by flag is refused naming the flag and the value typed: the variable it stands
    in for is not read then, and naming it (`LIVEPUSH_PORT=70000 (or --port)`) sent the operator
    looking for a setting they never made."""
    from livepush.cli.commands import main

    monkeypatch.setattr("livepush.config._current", None)
    monkeypatch.setenv("LIVEPUSH_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/nothing")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(argv) == 2
    assert err.getvalue().startswith(said) and "LIVEPUSH_" not in err.getvalue(), err.getvalue()


def test_the_choice_flags_take_any_case_as_their_variables_do() -> None:
    """LIVEPUSH_FANOUT=Redis is read as redis; `--fanout Redis` is too, not refused."""
    from livepush.cli.commands import build_parser

    args = build_parser().parse_args(["serve", "--fanout", "Redis", "--authenticate", "OFF"])
    assert (args.fanout, args.authenticate) == ("redis", "off")


@pytest.mark.parametrize("argv,variable", [
    (["serve"], "LIVEPUSH_PORT"),
    (["demo"], "LIVEPUSH_PORT"),
    (["demo"], "LIVEPUSH_HOST"),
    (["jobs", "tests.jobs.sample_jobs", "--metrics-port", "0"], "LIVEPUSH_HOST"),
], ids=["serve-port", "demo-port", "demo-host", "jobs-metrics-host"])
def test_a_socket_that_cannot_listen_names_only_settings_its_command_takes(procs, livepush_env, pg_url: str,
                                                                           argv: list[str], variable: str) -> None:
    """A port in use, or a host that is no address of this machine, exits 2 with a line naming the
    variable to change and no flag the command lacks: `livepush demo` has no --port, `jobs` no --host."""
    import re
    import socket

    from livepush.cli.commands import build_parser

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        setting = {"port": busy.getsockname()[1]} if variable == "LIVEPUSH_PORT" else {"host": "no-such-host.invalid"}
        child = procs.livepush(*argv, env=livepush_env(database_url=pg_url, **setting), wait_healthy=False)
        assert child.wait(60) == 2, child.output()
    err = child.stderr()
    assert "Traceback" not in err and variable in err, err
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    takes = {flag for action in sub.choices[argv[0]]._actions for flag in action.option_strings}
    assert set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", err)) <= takes, err


@pytest.mark.parametrize("argv,host,named", [
    (["serve", "--host", "a..b"], None, "--host"),
    (["serve"], "a..b", "LIVEPUSH_HOST"),
    (["serve", "--workers", "2"], "\u00e9" * 64, "LIVEPUSH_HOST"),
    (["jobs", "tests.jobs.sample_jobs", "--metrics-port", "0"], ".", "LIVEPUSH_HOST"),
], ids=["serve-flag", "serve-variable", "workers", "jobs-metrics"])
def test_a_host_no_resolver_can_take_exits_2_naming_it(procs, livepush_env, pg_url: str, argv: list[str],
                                                       host: str | None, named: str) -> None:
    """A listen address that is not a host name at all (an empty label, a label past 63 characters)
    exits 2 with one line naming the setting, as a host that does not resolve does, not with the
    resolver's UnicodeError traceback."""
    child = procs.livepush(*argv, env=livepush_env(database_url=pg_url, host=host), wait_healthy=False)
    assert child.wait(60) == 2, child.output()
    err = child.stderr()
    assert "Traceback" not in err and named in err, err


@pytest.mark.parametrize("argv", [["jobs", "missing_jobs"], ["serve", "--with-jobs", "missing_jobs"]],
                         ids=["jobs", "serve-with-jobs"])
def test_a_job_module_not_found_names_the_folder_searched(procs, livepush_env, pg_url, tmp_path,
                                                          argv: list[str]) -> None:
    """A job module found nowhere (`livepush jobs`, `serve --with-jobs`) exits 2 with one line naming
    the folder it was looked for in and saying to run livepush from the project's folder, as `serve
    --app` says: "check the name and PYTHONPATH" left the user to guess where it looked."""
    script = Path(sys.executable).parent / "livepush"
    child = procs.start([str(script), *argv], env=livepush_env(database_url=pg_url), cwd=tmp_path,
                        name=f"livepush {' '.join(argv)}")
    assert child.wait(30) == 2, child.output()
    err = child.stderr().strip().splitlines()
    assert len(err) == 1 and "Traceback" not in child.output(), child.output()
    assert "'missing_jobs'" in err[0] and f"searched from {tmp_path}" in err[0], err
    assert "run livepush from your project's directory" in err[0], err


def _in_a_removed_folder(procs, folder: Path, argv: list[str], env: dict[str, str], port: int | None = None) -> Any:
    """`livepush ARGV` run from `folder` after it was removed, as from a shell still standing in a
    release folder a deploy deleted."""
    folder.mkdir()
    return procs.start(["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(folder),
                        sys.executable, "-m", "livepush", *argv], env=env, port=port,
                       name=f"livepush {' '.join(argv)} (cwd gone)")


@pytest.mark.parametrize("argv", [["jobs", "tests.jobs.sample_jobs"], ["serve", "--app", "myapp:app"],
                                  ["serve", "--with-jobs", "tests.jobs.sample_jobs"], ["demo"]],
                         ids=["jobs", "serve-app", "serve-with-jobs", "demo"])
def test_a_command_run_from_a_removed_folder_exits_2_saying_so(procs, livepush_env, pg_url, tmp_path,
                                                               argv: list[str]) -> None:
    """Where modules are looked for (or the demo keeps its data) is the current folder: once it is
    removed, the command exits 2 with one line saying so, not a FileNotFoundError traceback."""
    env = livepush_env(database_url=pg_url)
    if argv == ["demo"]:
        env.pop("LIVEPUSH_SECRET")  # the demo then keeps the one it makes in its folder
    child = _in_a_removed_folder(procs, tmp_path / "release", argv, env)
    assert child.wait(60) == 2, child.output()
    err = child.stderr()
    assert "Traceback" not in err and "current folder" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_without_modules_to_import_serves_from_a_removed_folder(procs, livepush_env, pg_url, tmp_path,
                                                                      workers: str) -> None:
    """`livepush serve` imports nothing from the current folder unless --app or --with-jobs asks:
    run from a folder since removed, it serves, and stops cleanly."""
    env = livepush_env(database_url=pg_url)
    child = _in_a_removed_folder(procs, tmp_path / "release", ["serve", "--workers", workers], env,
                                 port=int(env["LIVEPUSH_PORT"]))
    child.wait_healthy()
    assert child.stop(15) == 0, child.output()


@pytest.mark.parametrize("argv,dest,joined", [
    (["jobs", "m", "--queues", "default", "--queues", "emails,reports"], "queues", "default,emails,reports"),
    (["serve", "--with-jobs", "myapp.jobs", "--with-jobs", "billing.jobs"], "with_jobs", "myapp.jobs,billing.jobs"),
])
def test_a_list_flag_given_twice_keeps_every_value(argv: list[str], dest: str, joined: str) -> None:
    """`--queues default --queues emails` serves both queues, as `--queues default,emails` does:
    argparse keeps the last alone, and the runtime left the first queue's jobs to pile up unserved
    without a word."""
    from livepush.cli.commands import build_parser

    assert getattr(build_parser().parse_args(argv), dest) == joined


def test_app_given_twice_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """A server has one App: `--app a:app --app b:app` exits 2 rather than serve under the last one's
    topic rules with the first's silently dropped."""
    from livepush.cli.commands import build_parser

    with pytest.raises(SystemExit) as raised:
        build_parser().parse_args(["serve", "--app", "base.push:app", "--app", "other.push:app"])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "argument --app" in err and "once" in err, err


def test_runtime_role_given_twice_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """`migrate --runtime-role app_a --runtime-role app_b` granted app_b alone and said so, app_a's
    runtime left without its grants to fail at its first query: it exits 2 before migrating,
    saying to give the flag once (one migrate run for each runtime role)."""
    from livepush.cli.commands import build_parser

    with pytest.raises(SystemExit) as raised:
        build_parser().parse_args(["migrate", "--runtime-role", "app_a", "--runtime-role", "app_b"])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "argument --runtime-role" in err and "app_a" in err and "once for each runtime role" in err, err


def test_serve_on_a_redis_url_where_nothing_answers_says_to_check_the_url(procs, livepush_env, pg_url) -> None:
    """A Redis URL whose port takes the connection and never answers (a paused Redis, a port that
    is not Redis'): serve exits 1 saying to check LIVEPUSH_REDIS_URL and that Redis runs, not a
    publish's advice to look at a topic's offset before publishing again, when nothing was sent."""
    import socket

    silent = socket.create_server(("127.0.0.1", 0))  # the kernel takes connections; no one answers
    try:
        port = silent.getsockname()[1]
        env = livepush_env(database_url=pg_url, redis_url=f"redis://127.0.0.1:{port}/0", fanout="redis")
        child = procs.livepush("serve", env=env, wait_healthy=False)
        assert child.wait(30) == 1, child.output()
    finally:
        silent.close()
    err = child.stderr()
    assert "Traceback" not in err and "check LIVEPUSH_REDIS_URL and that Redis is running" in err, err
    assert "publishing again" not in err, err


def test_version_prints_livepushs_version_and_the_schema_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    """`livepush --version`, which an operator types before an upgrade, printed "the following
    arguments are required: command" and exited 2. It prints the version, and the schema version
    this livepush migrates to (what `livepush migrate` reports), and exits 0."""
    from importlib.metadata import version

    from livepush import migrate
    from livepush.cli.commands import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"livepush {version('livepush')} (schema {migrate.required_version()})\n"


def test_status_on_a_redis_url_where_nothing_answers_says_to_check_the_url(procs, livepush_env, pg_url) -> None:
    """`livepush status` with a Redis URL whose port never answers prints the database's report,
    and says of Redis to check LIVEPUSH_REDIS_URL: its one call reads, so a publish's advice (look
    at a topic's offset before publishing again) has no place there."""
    import socket

    silent = socket.create_server(("127.0.0.1", 0))  # the kernel takes connections; no one answers
    try:
        env = livepush_env(database_url=pg_url, redis_url=f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
        child = procs.livepush("status", env=env)
        assert child.wait(30) == 1, child.output()
    finally:
        silent.close()
    err = child.stderr()
    assert "Traceback" not in err and "check LIVEPUSH_REDIS_URL and that Redis is running" in err, err
    assert "publishing again" not in err and "Queues" in child.stdout(), child.output()


@pytest.mark.parametrize("command", ["migrate", "serve", "jobs", "status", "demo", "publish", "token"])
def test_each_commands_help_says_what_it_does(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`livepush demo --help` (and `bin/demo --help`) listed --log-format alone: nothing said what the
    command does, nor that LIVEPUSH_PORT picks the demo's port, where --port is refused. Each
    command's help opens with the line the command list gives it; the demo's names its variables."""
    from livepush.cli.commands import build_parser, main

    summary = build_parser().commands[command].description
    assert summary, f"{command} has no description"
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert " ".join(summary.split()) in out, out
    if command == "demo":
        assert "LIVEPUSH_PORT" in out and "LIVEPUSH_HOST" in out and "LIVEPUSH_DATABASE_URL" in out, out
