"""`livepush serve` as a process: bad configuration, dependencies down, clean shutdown."""

from __future__ import annotations

import asyncio
import json
import resource
import signal
import sys
import time
from pathlib import Path

import psycopg
import pytest

from livepush import topics
from tests.support.procs import free_port, stop_while_connecting
from tests.support.waiting import async_wait_for, wait_for
from tests.support.wsclient import WSClient


def assert_one_line_no_traceback(stderr: str, *needles: str) -> None:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(
    "settings,needle",
    [
        ({"secret": ""}, "LIVEPUSH_SECRET"),
        ({"secret": "short"}, "LIVEPUSH_SECRET"),
        ({"fanout": "carrier-pigeon"}, "LIVEPUSH_FANOUT"),
        ({"authenticate": "maybe"}, "LIVEPUSH_AUTHENTICATE"),
        ({"port": "eighty"}, "LIVEPUSH_PORT"),
        ({"history_ttl": "-3"}, "LIVEPUSH_HISTORY_TTL"),
        # Past a year the stores' time arithmetic overflows: nothing would be delivered.
        ({"history_ttl": "inf"}, "LIVEPUSH_HISTORY_TTL"),
        ({"history_ttl": "1e12"}, "LIVEPUSH_HISTORY_TTL"),
        ({"fanout": "redis"}, "LIVEPUSH_REDIS_URL"),
        ({"secret": "ab" * 24}, "LIVEPUSH_SECRET"),  # long enough, but too few distinct characters
        ({"allowed_origins": "https://ok.example,app.example.com"}, "app.example.com"),
        ({"max_connections": "0"}, "LIVEPUSH_MAX_CONNECTIONS"),
        # What libpq refuses in a URL before it connects is the URL's fault, not a database down.
        ({"database_url": "postgresql://livepush@127.0.0.1:abc/app"}, "LIVEPUSH_DATABASE_URL"),
        ({"database_url": "postgresql://livepush@127.0.0.1:99999/app"}, "LIVEPUSH_DATABASE_URL"),
        ({"database_url": "postgresql://livepush@127.0.0.1/app?sslmode=sometimes"}, "LIVEPUSH_DATABASE_URL"),
        ({"database_url": "postgresql://livepush@127.0.0.1/app", "listen_database_url":
          "postgresql://livepush@127.0.0.1:0x10/app"}, "LIVEPUSH_LISTEN_DATABASE_URL"),
    ],
)
def test_bad_configuration_exits_2_with_one_line_naming_the_setting(procs, livepush_env, settings, needle) -> None:
    """A bad setting ends `serve` at once with status 2 and one stderr line that names it."""
    env = livepush_env(**settings)
    if settings.get("secret") == "":
        env.pop("LIVEPUSH_SECRET", None)
    child = procs.livepush("serve", env=env, wait_healthy=False, port=1)
    assert child.wait(15) == 2
    assert_one_line_no_traceback(child.stderr(), needle)


def test_an_empty_host_flag_is_refused_rather_than_listening_everywhere(procs, livepush_env) -> None:
    """`--host ""` (a shell variable that was not set) means no address, as an empty LIVEPUSH_HOST
    does: it must not bind every interface of the machine, as an empty bind address would."""
    child = procs.livepush("serve", "--host", "", env=livepush_env(), wait_healthy=False)
    assert child.wait(15) == 2, child.output()
    assert_one_line_no_traceback(child.stderr(), "--host")


@pytest.mark.parametrize("flag,value", [("--with-jobs", ""), ("--with-jobs", " , "), ("--app", "")])
def test_an_empty_with_jobs_or_app_flag_is_refused_rather_than_ignored(procs, livepush_env, flag, value) -> None:
    """`--with-jobs "$MODULES"` or `--app "$APP"` with the variable unset named nothing: the
    server ran without its job runtime (jobs queued for ever) or without its rules, and said
    nothing. As `livepush jobs ""` and `--host ""` are, it is refused: exit 2, one line naming
    the flag."""
    child = procs.livepush("serve", flag, value, env=livepush_env(), wait_healthy=False)
    assert child.wait(15) == 2, child.output()
    assert_one_line_no_traceback(child.stderr(), flag)


def test_with_jobs_and_no_database_exits_2_before_it_serves(procs, livepush_env) -> None:
    """`--with-jobs` runs jobs, which live in Postgres: without a database URL it is a bad setting,
    refused with one line naming LIVEPUSH_DATABASE_URL before the server takes its port and logs that
    it is serving (a process manager or a load balancer saw it up, then gone)."""
    child = procs.livepush("serve", "--with-jobs", "tests.jobs.sample_jobs", env=livepush_env(), wait_healthy=False)
    assert child.wait(15) == 2, child.output()
    assert_one_line_no_traceback(child.stderr(), "LIVEPUSH_DATABASE_URL")
    assert "serving" not in child.output(), child.output()


@pytest.mark.parametrize("name,value", [
    ("LIVEPUSH_HOST", "\udcff"),
    ("LIVEPUSH_SECRET", "abcdefghijklmnopqrstuvwxyz0123456789\udcff"),
    ("LIVEPUSH_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/caf\udce9"),
])
def test_a_setting_that_is_not_utf8_exits_2_naming_it(procs, livepush_env, name, value) -> None:
    """A variable holding bytes that are not UTF-8 (an environment file saved as Latin-1) is a bad
    setting like any other: one line naming it and exit 2, not a codec traceback (or a secret that
    breaks each handshake later)."""
    child = procs.livepush("serve", env=livepush_env(extra={name: value}), wait_healthy=False)
    assert child.wait(15) == 2, child.output()
    assert_one_line_no_traceback(child.stderr(), name)


def test_with_jobs_imports_job_modules_from_the_current_directory(procs, livepush_env, pg_url, tmp_path) -> None:
    """`livepush serve --with-jobs MODULE`, run by its console script from the project's directory,
    finds MODULE there, as `livepush jobs MODULE` and `--app` do."""
    (tmp_path / "cwd_only_jobs.py").write_text(
        "from livepush import jobs\n\n\n@jobs.job(name='cwd_only.hello')\nasync def hello(ctx):\n    return 1\n")
    env = livepush_env(database_url=pg_url)
    script = Path(sys.executable).parent / "livepush"  # what a user runs; `python -m` adds the cwd itself
    child = procs.start([str(script), "serve", "--with-jobs", "cwd_only_jobs"], env=env, cwd=tmp_path,
                        port=int(env["LIVEPUSH_PORT"]), name="livepush serve --with-jobs (console script)")
    child.wait_healthy()
    assert child.stop(15) == 0, child.output()


def test_a_bad_port_flag_is_named_as_the_flag(procs, livepush_env) -> None:
    """`--port 70000` is named as --port, the flag the operator typed, not only as LIVEPUSH_PORT."""
    child = procs.livepush("serve", "--port", "70000", env=livepush_env(), wait_healthy=False)
    assert child.wait(15) == 2, child.output()
    assert_one_line_no_traceback(child.stderr(), "--port")


def test_a_fan_out_flag_without_its_url_is_named_as_the_flag(procs, livepush_env) -> None:
    """`serve --fanout redis` with no LIVEPUSH_REDIS_URL names --fanout redis, which chose it, not
    LIVEPUSH_FANOUT, which is not read when the flag is given."""
    child = procs.livepush("serve", "--fanout", "redis", env=livepush_env(), wait_healthy=False)
    assert child.wait(15) == 2, child.output()
    assert_one_line_no_traceback(child.stderr(), "--fanout redis needs LIVEPUSH_REDIS_URL")
    assert "LIVEPUSH_FANOUT" not in child.stderr(), child.stderr()


@pytest.mark.parametrize("command, variable, value, flag", [
    (["demo"], "LIVEPUSH_PORT", "70000", "--port"),
    (["jobs", "tests.jobs.sample_jobs"], "LIVEPUSH_PORT", "70000", "--port"),
    (["demo"], "LIVEPUSH_DRAIN_SECONDS", "-1", "--drain-seconds"),
])
def test_a_bad_setting_on_a_command_without_its_flag_names_the_variable_alone(
        procs, livepush_env, command: list[str], variable: str, value: str, flag: str) -> None:
    """A command that has no `--port` (demo, jobs) names only LIVEPUSH_PORT, the one way to set it
    there: a hint at a flag it would refuse as usage sends the operator the wrong way."""
    env = livepush_env()
    env[variable] = value
    child = procs.livepush(*command, env=env, wait_healthy=False)
    assert child.wait(15) == 2, child.output()
    assert_one_line_no_traceback(child.stderr(), f"{variable}={value} is out of range")
    assert flag not in child.stderr(), child.stderr()


def test_rules_that_allow_nothing_without_sessions_are_said_naming_the_flag_that_turned_them_off(
        procs, livepush_env) -> None:
    """`serve --authenticate off` with rules that need a session: the start's warning names the flag
    that turned sessions off, not LIVEPUSH_AUTHENTICATE, which is not read when the flag is given."""
    child = procs.livepush("serve", "--authenticate", "off", "--app", "tests.support.security_app:app",
                           env=livepush_env(authenticate="optional"))
    said = [line for line in child.stderr().splitlines() if "makes every connection anonymous" in line]
    assert len(said) == 1 and "--authenticate off makes" in said[0] and "LIVEPUSH_AUTHENTICATE" not in said[0], said
    child.stop()


async def test_what_an_app_module_publishes_at_import_on_the_local_fan_out_is_in_the_servers_history(
        procs, livepush_env, tmp_path) -> None:
    """On the local fan-out the server is the process that publishes: a message the --app module
    publishes when imported (before the server is made) goes into the server's own history, so a
    client resuming from its offset gets what followed, not a reset; and the start does not warn
    that the server "is another process"."""
    (tmp_path / "greets_at_import.py").write_text(
        "import json, os\nimport livepush\n\n"
        "offsets = [livepush.publish('news', {'n': n}) for n in range(2)]\n"
        "with open(os.environ['OFFSETS_FILE'], 'w') as f:\n    json.dump(offsets, f)\n"
        "app = livepush.App(rules=[livepush.Allow('news', anonymous=True)])\n")
    offsets_file = tmp_path / "offsets.json"
    env = livepush_env(fanout="local", authenticate="optional", extra={"OFFSETS_FILE": str(offsets_file)})
    child = procs.start([sys.executable, "-m", "livepush", "serve", "--app", "greets_at_import:app"], env=env,
                        cwd=tmp_path, port=int(env["LIVEPUSH_PORT"]), name="livepush serve --app greets_at_import:app")
    child.wait_healthy()
    first, second = json.loads(offsets_file.read_text())
    client = await WSClient.open(f"ws://127.0.0.1:{env['LIVEPUSH_PORT']}/")
    try:
        assert (await client.subscribe("news", since=first))["op"] == "subscribed"
        (replayed,) = await client.messages(1)
        assert replayed["op"] == "message" and replayed["data"] == {"n": 1} and replayed["offset"] == second, replayed
    finally:
        await client.close()
    assert child.stop(15) == 0, child.output()
    assert "another process" not in child.stderr(), child.stderr()


def test_missing_app_module_exits_2(procs, livepush_env) -> None:
    """--app naming a module that does not exist exits 2 with one line."""
    child = procs.livepush("serve", "--app", "no_such_module_xyz:app", env=livepush_env(), wait_healthy=False)
    assert child.wait(15) == 2
    assert_one_line_no_traceback(child.stderr(), "no_such_module_xyz")


@pytest.mark.parametrize("exits", ["sys.exit(0)", "sys.exit(3)",
                                   "argparse.ArgumentParser().parse_args(['--not-an-option'])"])
def test_an_app_module_that_exits_at_import_exits_2_naming_its_line(procs, livepush_env, tmp_path,
                                                                    exits: str) -> None:
    """An --app module that exits when imported (a script's code left at module level: sys.exit(),
    argparse reading serve's own arguments) ended the server as it said: sys.exit(0) with status 0
    and not a word, as after a clean stop, so a supervisor would not restart it. It exits 2 with a
    line naming the module, its own line (not argparse's) and what to change, as a job module does."""
    (tmp_path / "exiting_app.py").write_text(f"import argparse\nimport sys\n\n{exits}\n")
    env = livepush_env()
    child = procs.start([sys.executable, "-m", "livepush", "serve", "--app", "exiting_app:app"], env=env,
                        cwd=tmp_path, name="livepush serve --app exiting_app:app")
    assert child.wait(20) == 2, child.output()
    err = child.stderr().strip().splitlines()
    assert "Traceback" not in child.output(), child.output()
    assert "'exiting_app'" in err[-1] and "(exiting_app.py:4)" in err[-1] and "__main__" in err[-1], err


def test_unreachable_postgres_exits_1(procs, livepush_env) -> None:
    """A database that cannot be reached at boot exits 1 naming LIVEPUSH_DATABASE_URL."""
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nope"
    child = procs.livepush("serve", env=livepush_env(database_url=url), wait_healthy=False)
    assert child.wait(20) == 1
    assert_one_line_no_traceback(child.stderr(), "LIVEPUSH_DATABASE_URL")


@pytest.mark.parametrize("command", [["serve"], ["jobs", "tests.jobs.sample_jobs"], ["migrate"]])
def test_a_login_postgres_refuses_exits_2_naming_the_setting(procs, livepush_env, pg_admin_url, pg_url,
                                                             command) -> None:
    """A wrong password, none where Postgres asks for one, an unknown role or a database that does
    not exist exited 1, "a dependency is down", which a process manager retries in a loop that
    never ends: Postgres is up and a setting is wrong. Each exits 2 with one line naming
    LIVEPUSH_DATABASE_URL and what the server said, never the password; a database refusing
    connections for a while (ALLOW_CONNECTIONS false) still exits 1."""
    from tests.support import services

    with services.pg_password_role(pg_admin_url, "s3cret-pw") as role_url:
        on_db = services.db_url(role_url, services.dbname_of(pg_url))
        refused = {
            "password authentication failed": psycopg.conninfo.make_conninfo(on_db, password="wrong-pw"),
            "asked for a password": on_db,
            'role "lp_no_such_role" does not exist': psycopg.conninfo.make_conninfo(pg_url, user="lp_no_such_role"),
            'database "lp_no_such_db" does not exist': services.db_url(pg_url, "lp_no_such_db"),
        }
        for said, url in refused.items():
            child = procs.livepush(*command, env=livepush_env(database_url=url), wait_healthy=False)
            assert child.wait(20) == 2, child.output()
            assert_one_line_no_traceback(child.stderr(), "LIVEPUSH_DATABASE_URL", said)
            assert "wrong-pw" not in child.output(), child.output()
        if command[0] != "migrate":
            # The LISTEN connection's own URL, refused, is named as its own setting.
            env = livepush_env(database_url=pg_url, listen_database_url=refused["password authentication failed"])
            child = procs.livepush(*command, env=env, wait_healthy=False)
            assert child.wait(20) == 2, child.output()
            assert_one_line_no_traceback(child.stderr(), "LIVEPUSH_LISTEN_DATABASE_URL", "password authentication")
    with services.pg_refusing_connections(pg_admin_url, services.dbname_of(pg_url)):
        child = procs.livepush(*command, env=livepush_env(database_url=pg_url), wait_healthy=False)
        assert child.wait(20) == 1, child.output()
        assert_one_line_no_traceback(child.stderr(), "LIVEPUSH_DATABASE_URL")


@pytest.mark.parametrize("command", [["serve"], ["jobs", "tests.jobs.sample_jobs"]])
def test_unreachable_listen_database_exits_1_naming_its_own_setting(procs, livepush_env, pg_url, command) -> None:
    """When only LIVEPUSH_LISTEN_DATABASE_URL cannot be reached, the line names that setting: the
    operator is not sent to check a LIVEPUSH_DATABASE_URL that works."""
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nope"
    child = procs.livepush(*command, env=livepush_env(database_url=pg_url, listen_database_url=url),
                           wait_healthy=False)
    assert child.wait(20) == 1, child.output()
    assert_one_line_no_traceback(child.stderr(), "LIVEPUSH_LISTEN_DATABASE_URL")


@pytest.mark.parametrize("command", [["serve"], ["jobs", "tests.jobs.sample_jobs"]])
def test_a_listen_database_url_of_another_database_exits_2_naming_both_settings(procs, livepush_env, make_pg_url,
                                                                               command) -> None:
    """LIVEPUSH_LISTEN_DATABASE_URL naming another database than LIVEPUSH_DATABASE_URL (a pooler's
    alias copied as the database's name) would LISTEN where nothing is ever rung: a server that
    delivers nothing live and a runtime that hears no enqueue or cancel, with nothing said. It
    exits 2 at start, naming both settings and both databases."""
    url, other = make_pg_url(), make_pg_url()
    child = procs.livepush(*command, env=livepush_env(database_url=url, listen_database_url=other),
                           wait_healthy=False)
    assert child.wait(20) == 2, child.output()
    assert_one_line_no_traceback(child.stderr(), "LIVEPUSH_LISTEN_DATABASE_URL", "LIVEPUSH_DATABASE_URL",
                                 other.rsplit("/", 1)[1], url.rsplit("/", 1)[1])


def test_a_listen_database_url_of_the_same_database_serves(procs, livepush_env, pg_url) -> None:
    """The same database by another URL (here another host name for the server, as a direct URL
    beside a pooler's would be) is what the setting is for: the server starts and is ready."""
    other = pg_url.replace("127.0.0.1", "localhost")
    assert other != pg_url
    child = procs.livepush("serve", env=livepush_env(database_url=pg_url, listen_database_url=other),
                           wait_healthy=False)
    child.wait_healthy(path="/readyz")  # its canary went round: it listens where it publishes


def test_unreachable_redis_exits_1(procs, livepush_env) -> None:
    """A Redis that cannot be reached at boot exits 1 naming LIVEPUSH_REDIS_URL."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    child = procs.livepush("serve", env=livepush_env(redis_url=url), wait_healthy=False)
    assert child.wait(20) == 1
    assert_one_line_no_traceback(child.stderr(), "LIVEPUSH_REDIS_URL")


def test_a_redis_refusing_the_urls_password_exits_2_naming_the_setting(procs, livepush_env, pg_url,
                                                                      redis_url) -> None:
    """A Redis URL whose password Redis refuses made `serve` exit 1, "a dependency is down", which
    a process manager restarts for ever: Redis is up and the setting is wrong. It exits 2 with one
    line naming LIVEPUSH_REDIS_URL, never the password."""
    wrong = redis_url.replace("redis://", "redis://nobody:wrong-pw@", 1)
    child = procs.livepush("serve", env=livepush_env(database_url=pg_url, redis_url=wrong, fanout="redis"),
                           wait_healthy=False)
    assert child.wait(20) == 2, child.output()
    assert_one_line_no_traceback(child.stderr(), "LIVEPUSH_REDIS_URL", "refused the user or password")
    assert "wrong-pw" not in child.output(), child.output()


def test_a_redis_whose_acl_refuses_a_command_the_server_needs_exits_2_naming_the_rule(procs, livepush_env, pg_url,
                                                                                     redis_url) -> None:
    """A Redis user one rule short of the ACL docs/security.md shows (here +subscribe) made `serve`
    exit 1, "a dependency is down", which a process manager restarts for ever: Redis is up, and
    its ACL is the setting to correct. It exits 2 with one line naming the rule to add."""
    from tests.support.redis_acl import documented_user

    with documented_user(redis_url, "livepush:0", without="+subscribe") as as_app:
        child = procs.livepush("serve", env=livepush_env(database_url=pg_url, redis_url=as_app, fanout="redis"),
                               wait_healthy=False)
        assert child.wait(20) == 2, child.output()
    assert_one_line_no_traceback(child.stderr(), "lacks +subscribe", "docs/security.md")


def test_schema_older_than_needed_exits_2(procs, livepush_env, pg_admin_url) -> None:
    """`serve` refuses an unmigrated database and says to run `livepush migrate`."""
    from tests.support import services

    name = f"empty_{int(time.time() * 1000)}"
    url = services.create_database(pg_admin_url, name)
    try:
        child = procs.livepush("serve", env=livepush_env(database_url=url), wait_healthy=False)
        assert child.wait(20) == 2
        assert_one_line_no_traceback(child.stderr(), "livepush migrate")
    finally:
        services.drop_database(pg_admin_url, name)


def test_port_in_use_exits_2(procs, livepush_env) -> None:
    """A port another server holds is a configuration error naming LIVEPUSH_PORT."""
    env = livepush_env()
    first = procs.livepush("serve", env=env)
    second = procs.livepush("serve", env=env, wait_healthy=False)
    assert second.wait(15) == 2
    assert "LIVEPUSH_PORT" in second.stderr() and "Traceback" not in second.stderr()
    first.stop()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_in_use_given_by_flag_is_named_as_the_flag(procs, livepush_env, pg_url, workers) -> None:
    """`serve --port N` with N in use: the one line says to change --port, which chose it, not
    LIVEPUSH_PORT, which is not read when the flag is given (under --workers too, where the
    supervisor holds the port)."""
    env = livepush_env(database_url=pg_url)  # several workers need a shared fan-out
    first = procs.livepush("serve", env=env)
    taken = env["LIVEPUSH_PORT"]
    second = procs.livepush("serve", "--workers", workers, "--port", taken,
                            env={**env, "LIVEPUSH_PORT": "0"}, wait_healthy=False)
    assert second.wait(15) == 2, second.output()
    assert_one_line_no_traceback(second.stderr(), f":{taken}", "set --port to a free port")
    assert "LIVEPUSH_PORT" not in second.stderr(), second.stderr()
    first.stop()


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("host", ["no-such-host.invalid", "192.0.2.1"])
def test_a_host_it_cannot_listen_on_exits_2_naming_the_host_not_the_port(procs, livepush_env, pg_url, host,
                                                                         workers) -> None:
    """A name that does not resolve, or an address that is not this machine's, is the host's
    fault: the one line names LIVEPUSH_HOST (or --host), not a port that was never the problem,
    and under --workers (where the supervisor holds the port) it is that line, not a traceback."""
    env = livepush_env(host=host, database_url=pg_url)  # several workers need a shared fan-out
    child = procs.livepush("serve", "--workers", workers, env=env, wait_healthy=False)
    assert child.wait(30) == 2, child.output()
    assert_one_line_no_traceback(child.stderr(), "LIVEPUSH_HOST", host)
    assert "LIVEPUSH_PORT" not in child.stderr()


def test_an_ipv6_host_written_in_brackets_is_told_to_drop_them(procs, livepush_env) -> None:
    """`--host [::1]`, as a URL writes it: the one line says to write the address without the
    brackets, rather than call `[::1]` a name that does not resolve."""
    child = procs.livepush("serve", env=livepush_env(host="[::1]"), wait_healthy=False)
    assert child.wait(15) == 2, child.output()
    assert_one_line_no_traceback(child.stderr(), "LIVEPUSH_HOST", "without the brackets", "::1")
    assert "[[" not in child.stderr()


@pytest.mark.parametrize("host", ["http://localhost", "ws://localhost:8765"])
def test_a_host_written_as_a_url_is_told_to_drop_its_scheme(procs, livepush_env, host: str) -> None:
    """`LIVEPUSH_HOST=http://localhost`, copied from where the page's URL is set: the one line says
    to write the host alone, rather than call `[http://localhost]` (bracketed as if an IPv6
    address) a name that does not resolve."""
    child = procs.livepush("serve", env=livepush_env(host=host), wait_healthy=False)
    assert child.wait(15) == 2, child.output()
    assert_one_line_no_traceback(child.stderr(), "LIVEPUSH_HOST", "without its scheme", ": localhost")
    assert f"[{host}]" not in child.stderr()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_second_signal_while_it_exits_still_exits_0(procs, livepush_env, sig) -> None:
    """Ctrl-C twice, a process manager that signals twice, or a closing terminal (the shell and the
    kernel each send SIGHUP): the second signal may come after the server has stopped and while
    Python tears down (a tenth of a second or so). The stop it asks for is done already: the exit
    status stays 0, not death by that signal."""
    from tests.support.waiting import wait_for

    child = procs.livepush("serve", env=livepush_env())
    child.signal(sig)
    wait_for(lambda: "stopping" in child.stderr() or not child.running, 10.0, message="the stop to begin")
    child.signal(sig)
    assert child.wait(15) == 0, child.output()


async def test_a_hangup_drains_serve_as_sigterm_does(procs, livepush_env) -> None:
    """SIGHUP (the terminal `livepush serve` runs in closed, its ssh session dropped): its clients
    are closed with 1001 and a `retry=` reason over --drain-seconds, and it exits 0, as on SIGTERM.
    Left at its default, SIGHUP killed it where it stood: no close frame, every client back in
    the same second."""
    env = livepush_env(drain_seconds="1")
    child = await procs.alivepush("serve", env=env)
    clients = await asyncio.gather(*(WSClient.open(f"ws://127.0.0.1:{env['LIVEPUSH_PORT']}/") for _ in range(5)))
    child.signal(signal.SIGHUP)
    frames = await asyncio.gather(*(c.close_frame(timeout=10) for c in clients))
    assert [f.code if f else None for f in frames] == [1001] * 5, child.output()
    assert all(f.reason.startswith("retry=") for f in frames), [f.reason for f in frames]
    assert await child.await_exit(15) == 0, child.output()
    assert "Traceback" not in child.stderr(), child.output()


async def test_a_second_hangup_does_not_cut_the_drain_short(procs, livepush_env) -> None:
    """A closing terminal sends SIGHUP twice (the shell passes its own on, and the kernel sends
    one as the shell exits): that is one stop asked for, not a second signal that hurries it.
    Every client still gets its `retry=` reason over --drain-seconds."""
    env = livepush_env(drain_seconds="2")
    child = await procs.alivepush("serve", env=env)
    clients = await asyncio.gather(*(WSClient.open(f"ws://127.0.0.1:{env['LIVEPUSH_PORT']}/") for _ in range(10)))
    child.signal(signal.SIGHUP)
    await async_wait_for(lambda: "stopping" in child.stderr() or not child.running, timeout=10,
                         message="the stop to begin")
    child.signal(signal.SIGHUP)
    frames = await asyncio.gather(*(c.close_frame(timeout=10) for c in clients))
    assert all(f is not None and f.reason.startswith("retry=") for f in frames), (frames, child.output())
    assert await child.await_exit(15) == 0, child.output()
    assert "second signal" not in child.stderr(), child.output()


async def test_serve_started_with_nohup_keeps_serving_after_a_hangup(procs, livepush_env) -> None:
    """Under `nohup`, which asked for SIGHUP to be ignored, a hangup leaves the server serving its
    clients; SIGTERM stops it as always, with exit 0."""
    env = livepush_env()
    port = int(env["LIVEPUSH_PORT"])
    child = procs.start(["nohup", sys.executable, "-m", "livepush", "serve"], env=env, port=port,
                        name="nohup livepush serve")
    await child.await_healthy()
    client = await WSClient.open(f"ws://127.0.0.1:{port}/")
    child.signal(signal.SIGHUP, group=True)
    await child.await_healthy(5.0)  # a round trip through the process, which a handled signal would stop
    assert child.running and "stopping" not in child.stderr(), child.output()
    child.signal(signal.SIGTERM)
    assert (await client.close_frame(timeout=10)).code == 1001
    assert await child.await_exit(15) == 0, child.output()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_shutdown_closes_1000_connections_with_1001_within_2_seconds(procs, livepush_env, pg_url, secret, sig) -> None:
    """SIGTERM or SIGINT: stop accepting, close all 1,000 connections with 1001, exit 0, within 2 s."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    env = livepush_env(database_url=pg_url)
    child = await procs.alivepush("serve", env=env)
    url = f"ws://127.0.0.1:{env['LIVEPUSH_PORT']}/"
    signed = topics.sign("room:big", [secret])
    clients = []
    for batch in range(10):
        clients += await asyncio.gather(*(WSClient.open(url) for _ in range(100)))
    await clients[0].subscribe(signed)
    started = time.monotonic()
    child.signal(sig)
    codes = await asyncio.gather(*(c.closed_with(timeout=5) for c in clients))
    status = await child.await_exit(5)
    elapsed = time.monotonic() - started
    assert status == 0, child.output()
    assert codes.count(1001) == 1000, {c: codes.count(c) for c in set(codes)}
    assert elapsed < 2.0, elapsed
    assert "Traceback" not in child.stderr()


async def test_serve_with_jobs_closes_connections_before_draining(procs, livepush_env, pg_url, secret) -> None:
    """With a job in hand, SIGTERM still closes connections with 1001 within 2 s; the runtime
    then finishes the job and the process exits 0."""
    from tests.support.slow_jobs import started_slow_job

    env = livepush_env(database_url=pg_url)
    child = await procs.alivepush("serve", "--with-jobs", "tests.support.slow_jobs", env=env)
    state = await started_slow_job(pg_url, 3.0)
    client = await WSClient.open(f"ws://127.0.0.1:{env['LIVEPUSH_PORT']}/")
    started = time.monotonic()
    child.signal(signal.SIGTERM)
    assert await client.closed_with(timeout=5) == 1001
    assert time.monotonic() - started < 2.0
    assert await child.await_exit(15) == 0, child.output()
    assert state() == "succeeded"


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
async def test_serve_with_jobs_a_second_signal_gives_the_jobs_back_at_once(procs, livepush_env, pg_url,
                                                                         second) -> None:
    """With --with-jobs the runtime stops as `livepush jobs` does: a second signal while it
    drains gives the jobs in hand back at once (attempt not spent) and the process exits 0,
    rather than waiting out the runtime's 30 s shutdown timeout."""
    from tests.support.slow_jobs import started_slow_job

    env = livepush_env(database_url=pg_url)
    child = await procs.alivepush("serve", "--with-jobs", "tests.support.slow_jobs", env=env)
    state = await started_slow_job(pg_url, 120.0)
    child.signal(signal.SIGTERM)
    await async_wait_for(lambda: "draining: waiting up to" in child.stderr(), 10, message="the runtime to drain")
    child.signal(second)
    assert await child.await_exit(10) == 0, child.output()
    assert state() == "available"


async def test_serve_with_jobs_exits_without_waiting_for_a_sync_job_it_gave_back(procs, livepush_env,
                                                                                 pg_url) -> None:
    """A sync job's thread cannot be stopped: once the runtime beside the server has given the
    job back (here on a second signal), the process exits 0 without waiting for the thread, as
    `livepush jobs` does, rather than for as long as the job's function runs."""
    from tests.support.slow_jobs import slow_sync, started_slow_job

    env = livepush_env(database_url=pg_url)
    child = await procs.alivepush("serve", "--with-jobs", "tests.support.slow_jobs", env=env)
    state = await started_slow_job(pg_url, 120.0, slow_sync)
    child.signal(signal.SIGTERM)
    await async_wait_for(lambda: "draining: waiting up to" in child.stderr(), 10, message="the runtime to drain")
    child.signal(signal.SIGTERM)
    assert await child.await_exit(10) == 0, child.output()
    assert state() == "available"


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_on_an_ipv6_host_the_serving_line_is_a_url_a_client_connects_to(procs, livepush_env, pg_url,
                                                                               workers) -> None:
    """`--host ::1`: the `serving on` line writes the address in brackets (ws://[::1]:PORT), as a
    URL must for the port to be told from the address, and a client given that URL gets hello."""
    import re
    import socket
    from urllib.parse import urlsplit

    from tests.support.waiting import async_wait_for

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    child = procs.livepush("serve", "--host", "::1", "--workers", workers,
                           env=livepush_env(database_url=pg_url, port=0), wait_healthy=False)
    pattern = r"serving on (ws://\S+)" + (" with" if workers != "1" else r" \(")
    found = await async_wait_for(lambda: re.search(pattern, child.stderr()) or not child.running, timeout=30,
                                 message="the 'serving on' line")
    assert isinstance(found, re.Match), child.output()
    url = found.group(1)
    assert urlsplit(url).hostname == "::1" and urlsplit(url).port, url
    client = await WSClient.open(url + "/")
    assert client.hello["op"] == "hello"
    await client.close()
    assert child.stop(15) == 0, child.output()


def test_sigterm_while_it_starts_is_a_clean_stop(procs, livepush_env) -> None:
    """SIGTERM while `serve` is still starting (here, waiting on a database that accepted the
    connection and says nothing) stops it at once with exit 0, as a stop once it serves does."""
    child = stop_while_connecting(lambda url: procs.livepush("serve", env=livepush_env(database_url=url),
                                                             wait_healthy=False))
    assert child.returncode == 0, child.output()
    assert "Traceback" not in child.stderr(), child.output()



def test_with_jobs_imports_a_module_that_runs_asyncio_at_import(procs, livepush_env, pg_url: str) -> None:
    """`serve --with-jobs` imports its job modules outside the event loop, as `livepush jobs` does:
    a module that calls asyncio.run() at import is loaded and its runtime starts."""
    child = procs.livepush("serve", "--with-jobs", "tests.jobs.asyncio_at_import_jobs",
                           env=livepush_env(database_url=pg_url))
    wait_for(lambda: "running: queues" in child.stderr() or not child.running, 20.0, message="the runtime to start")
    assert child.stop(15) == 0, child.output()
