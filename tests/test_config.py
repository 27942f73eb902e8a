"""Settings.from_env(): every LIVEPUSH_* variable, and the one line a bad value gets."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from livepush import ConfigError
from livepush.config import ENVIRONMENT, Settings


@pytest.mark.parametrize("url,needle", [
    ("mysql://app@db.example/app", "cannot be parsed"),
    ("postgresql://app@db.example:99999/app", "port"),
    ("postgresql://app@db.example/app?sslmode=sometimes", "sslmode"),
    ("postgresql://app@db.example/app?keepalives=yes", "keepalives that is not a whole number"),
    ("postgresql://app@db.example/app?keepalives_idle=30s", "keepalives_idle that is not a whole number"),
    ("postgresql://app@db.example/app?tcp_user_timeout=", "tcp_user_timeout that is not a whole number"),
    ("postgresql://app@db.example/app?tcp_user_timeout=99999999999", "tcp_user_timeout that is not a whole number"),
    ("postgresql://app@db.example/app?keepalives_count=-2147483649", "keepalives_count that is not a whole number"),
    ("postgresql://app@db.example/app?keepalives_idle=" + "9" * 5000, "keepalives_idle that is not a whole number"),
])
def test_a_bad_database_url_fallback_is_named_as_database_url(url: str, needle: str) -> None:
    """A bad DATABASE_URL, read because LIVEPUSH_DATABASE_URL is not set, gets an error that names
    DATABASE_URL: naming LIVEPUSH_DATABASE_URL, which is not set, sent the operator to the wrong place."""
    with pytest.raises(ConfigError, match=needle) as raised:
        Settings.from_env({"DATABASE_URL": url})
    assert str(raised.value).startswith("DATABASE_URL "), raised.value
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"LIVEPUSH_DATABASE_URL": url, "DATABASE_URL": "postgresql://app@db.example/app"})
    assert str(raised.value).startswith("LIVEPUSH_DATABASE_URL "), raised.value


def test_integer_options_libpq_takes_are_accepted() -> None:
    """libpq's integer options as it reads them (a sign, spaces around) pass the check."""
    url = ("postgresql://app@db.example/app?keepalives=1&keepalives_idle=%2030%20&keepalives_count=+3&connect_timeout=7"
           "&tcp_user_timeout=2147483647&connect_timeout=99999999999")
    assert Settings.from_env({"LIVEPUSH_DATABASE_URL": url}).database_url == url


def test_a_database_url_that_cannot_be_parsed_gets_one_plain_line() -> None:
    """A URL libpq cannot parse is named by its variable, with the form to use and no part of it."""
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"LIVEPUSH_DATABASE_URL": "notaurl s3cret"})
    assert str(raised.value).startswith("LIVEPUSH_DATABASE_URL cannot be parsed as a Postgres URL: use "
                                        "postgresql://USER:PASSWORD@HOST:PORT/DBNAME"), raised.value
    assert "s3cret" not in str(raised.value) and "((" not in str(raised.value)


@pytest.mark.parametrize("query,named", [
    ("schema=public", "schema"),
    ("sslmode=require&pgbouncer=true&connection_limit=1", "pgbouncer, connection_limit"),
])
def test_a_database_url_with_another_clients_parameter_names_the_parameter(query: str, named: str) -> None:
    """A DATABASE_URL shared with another client (Prisma's `?schema=public`) is refused naming the
    parameter libpq does not know, not as a URL that cannot be parsed, whose fix (percent-encode
    the password) sent the operator after a password that was fine; the password is never said."""
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"DATABASE_URL": f"postgresql://app:s3cret@db.example/app?{query}"})
    said = str(raised.value)
    assert said.startswith("DATABASE_URL ") and f"has the parameter {named}, which Postgres does not know" in said, said
    assert "s3cret" not in said and "percent-encoded" not in said, said
    # A '?' left unencoded in a password: what follows it is the password's, never named.
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"DATABASE_URL": f"postgresql://app:s3?cret=x@db.example/app?{query}"})
    assert "cret" not in str(raised.value), raised.value


def test_database_url_is_read_when_livepush_database_url_is_unset_or_empty() -> None:
    """DATABASE_URL stands in for an unset or empty LIVEPUSH_DATABASE_URL, and the fan-out defaults to postgres."""
    for env in ({"DATABASE_URL": "postgresql://app@db.example/app"},
                {"LIVEPUSH_DATABASE_URL": " ", "DATABASE_URL": "postgresql://app@db.example/app"}):
        settings = Settings.from_env(env)
        assert (settings.database_url, settings.fanout) == ("postgresql://app@db.example/app", "postgres")


@pytest.mark.parametrize("text", ["1_000", "٨٠٨٠", "８０"])
def test_a_number_setting_takes_plain_ascii_digits_only(text: str) -> None:
    """LIVEPUSH_PORT=1_000 or digits of another script are refused with the one line naming the
    variable: Python's int() takes them, an operator does not mean them."""
    with pytest.raises(ConfigError, match=rf"LIVEPUSH_PORT={text!r} is not a number"):
        Settings.from_env({"LIVEPUSH_PORT": text})
    with pytest.raises(ConfigError, match="LIVEPUSH_HISTORY_TTL"):
        Settings.from_env({"LIVEPUSH_HISTORY_TTL": text})
    assert Settings.from_env({"LIVEPUSH_PORT": "8080"}).port == 8080


@pytest.mark.parametrize("value", ["test", "TEST", "Test", " test "])
def test_livepush_env_test_is_read_in_any_case(value: str) -> None:
    """LIVEPUSH_ENV=TEST unlocks the test-only helpers as test does, like every word-valued setting
    (LIVEPUSH_FANOUT=Redis, LIVEPUSH_QUERY_TOKENS=OFF) is read in any case."""
    assert Settings.from_env({"LIVEPUSH_ENV": value}).is_test
    assert not Settings.from_env({"LIVEPUSH_ENV": "production"}).is_test
    assert not Settings.from_env({}).is_test


NUMBER_VARIABLES = ["LIVEPUSH_PORT", "LIVEPUSH_HISTORY_TTL", "LIVEPUSH_MAX_CONNECTIONS", "LIVEPUSH_SIGNED_TOPIC_TTL",
                    "LIVEPUSH_DRAIN_SECONDS", "LIVEPUSH_MIGRATE_LOCK_TIMEOUT", "LIVEPUSH_WORKER_STOP_MARGIN"]


@pytest.mark.parametrize("name", NUMBER_VARIABLES)
@pytest.mark.parametrize("text", ["1_0", "１０", "٨"])
def test_every_number_variable_takes_plain_ascii_digits_only(name: str, text: str) -> None:
    """Each numeric LIVEPUSH_* setting refuses separators and other scripts' digits with the one line
    naming it and its value, not only LIVEPUSH_PORT."""
    with pytest.raises(ConfigError, match=rf"^{name}={text!r} is not a number: set "):
        Settings.from_env({name: text})


def test_a_setting_is_named_as_the_operator_gave_it() -> None:
    """An error names a setting the way this command's operator could have set it: the flag that
    gave the value (its variable is not read then), else the variable, with the command's flag
    beside it only on a command that has that flag."""
    plain = Settings.from_env({"LIVEPUSH_PORT": "70000"}, validate=False)
    assert plain.named("port", 70000) == "LIVEPUSH_PORT=70000" and plain.named("host") == "LIVEPUSH_HOST"
    serve = Settings.from_env({}, flags={"port": "--port", "host": "--host"})
    assert serve.named("port", 8765) == "LIVEPUSH_PORT=8765 (or --port)"
    given = serve.replace(port=9000)
    assert given.named("port", 9000) == "--port 9000" and given.named("port") == "--port"
    assert given.named("host") == "LIVEPUSH_HOST (or --host)", "only the flags given are named alone"
    with pytest.raises(ConfigError, match=r"^LIVEPUSH_PORT=70000 \(or --port\) is out of range"):
        Settings.from_env({"LIVEPUSH_PORT": "70000"}, flags={"port": "--port"})
    with pytest.raises(ConfigError, match=r"^LIVEPUSH_PORT=70000 is out of range"):
        Settings.from_env({"LIVEPUSH_PORT": "70000"})
    with pytest.raises(ConfigError, match=r"^LIVEPUSH_PORT='80a' \(or --port\) is not a number"):
        Settings.from_env({"LIVEPUSH_PORT": "80a"}, flags={"port": "--port"})


def test_a_fan_out_that_needs_a_url_is_named_as_the_operator_gave_it() -> None:
    """`serve --fanout redis` without LIVEPUSH_REDIS_URL names --fanout, which chose it: naming
    LIVEPUSH_FANOUT, which is not read when the flag is given, sent the operator to a variable
    that was never set. Given by the variable, it is named with the flag beside it."""
    serve = Settings.from_env({}, flags={"fanout": "--fanout", "authenticate": "--authenticate"})
    with pytest.raises(ConfigError, match=r"^--fanout redis needs LIVEPUSH_REDIS_URL"):
        serve.replace(fanout="redis")
    with pytest.raises(ConfigError, match=r"^--fanout postgres needs LIVEPUSH_DATABASE_URL"):
        serve.replace(fanout="postgres")
    flags = {"fanout": "--fanout", "authenticate": "--authenticate"}
    with pytest.raises(ConfigError, match=r"^LIVEPUSH_FANOUT=redis \(or --fanout\) needs LIVEPUSH_REDIS_URL"):
        Settings.from_env({"LIVEPUSH_FANOUT": "redis"}, flags=flags)
    with pytest.raises(ConfigError, match=r"^LIVEPUSH_FANOUT='bogus' \(or --fanout\) is unknown"):
        Settings.from_env({"LIVEPUSH_FANOUT": "bogus"}, flags=flags)
    with pytest.raises(ConfigError, match=r"^LIVEPUSH_AUTHENTICATE='bogus' \(or --authenticate\) is unknown"):
        Settings.from_env({"LIVEPUSH_AUTHENTICATE": "bogus"}, flags=flags)
    with pytest.raises(ConfigError, match=r"^LIVEPUSH_FANOUT=redis needs LIVEPUSH_REDIS_URL"):
        Settings.from_env({"LIVEPUSH_FANOUT": "redis"})


@pytest.mark.parametrize("text", ["-1", "3601", "inf", "nan"])
def test_a_worker_stop_margin_out_of_range_is_refused(text: str) -> None:
    """LIVEPUSH_WORKER_STOP_MARGIN takes 0 to 3600 seconds (default 10); anything else exits 2 with
    its range, rather than a supervisor that kills at once or never."""
    with pytest.raises(ConfigError, match=r"^LIVEPUSH_WORKER_STOP_MARGIN=.* is out of range: use 0 to 3600"):
        Settings.from_env({"LIVEPUSH_WORKER_STOP_MARGIN": text})
    assert Settings.from_env({}).worker_stop_margin == 10
    assert Settings.from_env({"LIVEPUSH_WORKER_STOP_MARGIN": "0.5"}).worker_stop_margin == 0.5


@pytest.mark.parametrize("name,text,limit", [
    ("LIVEPUSH_HISTORY_TTL", "31622401", "31622400"),
    ("LIVEPUSH_MIGRATE_LOCK_TIMEOUT", "86400.01", "86400"),
    ("LIVEPUSH_DRAIN_SECONDS", "300.0001", "300"),
    ("LIVEPUSH_WORKER_STOP_MARGIN", "3600.001", "3600"),
])
def test_a_number_just_past_its_limit_is_said_with_every_digit(name: str, text: str, limit: str) -> None:
    """The line says the value as written and the limit in full: rounded to six digits, a value just
    past the limit read as the limit itself ("3.16224e+07 is out of range: ... to 3.16224e+07")."""
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({name: text})
    said = str(raised.value)
    assert said.startswith(f"{name}={text} "), said
    assert f" {limit} " in said and "e+" not in said, said


@pytest.mark.parametrize("url,needle", [
    ("redis://127.0.0.1:6379?db=abc", "names database 'abc', which is not a database number"),
    ("redis://127.0.0.1:6379/0?socket_timeout=abc",
     "its socket_timeout parameter has a value Redis connections do not take"),
    ("redis://127.0.0.1:99999/0", "its port is not a number from 0 to 65535"),
    ("redis://127.0.0.1:s3cret-pw/0", "its port is not a number from 0 to 65535"),
])
def test_a_redis_url_that_cannot_be_read_names_the_part_to_fix(url: str, needle: str) -> None:
    """A LIVEPUSH_REDIS_URL redis-py cannot read says which part is wrong, as one with a database
    path that is no number does, rather than only "is not a Redis URL"; never what sits where the
    port goes (a password written there)."""
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"LIVEPUSH_REDIS_URL": url})
    said = str(raised.value)
    assert said.startswith("LIVEPUSH_REDIS_URL ") and needle in said, said
    assert "s3cret" not in said, said


@pytest.mark.parametrize("parameter,takes", [
    ("health_check_interval=-1", "seconds, 0 or more"),
    ("socket_timeout=-1", "seconds above 0"),
    ("socket_connect_timeout=0", "seconds above 0"),
    ("socket_timeout=nan", "seconds above 0"),
    ("max_connections=0", "a whole number above 0"),
])
def test_a_redis_url_parameter_out_of_range_is_a_setting_to_fix(parameter: str, takes: str) -> None:
    """A number Redis' client reads from the URL without a range (a negative timeout or check interval)
    is refused when the settings are read, naming the parameter and what it takes: it failed only at
    the first connect or PING, and was told as Redis being down (exit 1 rather than 2)."""
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"LIVEPUSH_REDIS_URL": f"redis://127.0.0.1:6379/0?{parameter}"})
    said = str(raised.value)
    assert said.startswith("LIVEPUSH_REDIS_URL ") and parameter.split("=")[0] in said and takes in said, said
    assert Settings.from_env({"LIVEPUSH_REDIS_URL": "redis://127.0.0.1:6379/0?health_check_interval=0"})


def test_workers_takes_plain_ascii_digits_only() -> None:
    """LIVEPUSH_WORKERS=1_0 (or --workers ١٠) is refused, not read as ten processes."""
    from livepush.cli.workers import worker_count

    for text in ("1_0", "１０", "٨"):
        with pytest.raises(ConfigError, match="LIVEPUSH_WORKERS"):
            worker_count(None, {"LIVEPUSH_WORKERS": text})
        with pytest.raises(ConfigError, match="--workers"):
            worker_count(text, {})
    assert worker_count(None, {"LIVEPUSH_WORKERS": "3"}) == 3


@pytest.mark.parametrize("name,text", [
    ("LIVEPUSH_HISTORY_TTL", "1e-300"),
    ("LIVEPUSH_HISTORY_TTL", "0.5"),
    ("LIVEPUSH_SIGNED_TOPIC_TTL", "1e-300"),
    ("LIVEPUSH_SIGNED_TOPIC_TTL", "0.2"),
])
def test_a_ttl_under_a_second_is_refused(name: str, text: str) -> None:
    """A TTL under a second is refused with its allowed range: a history of 1e-300 s was trimmed as it
    was written (Redis counts whole milliseconds) and a signed topic expired before its page loaded."""
    with pytest.raises(ConfigError, match=rf"^{name}=.* is out of range: set seconds.* 1 ") as raised:
        Settings.from_env({name: text})
    assert "e.g." in str(raised.value)
    assert Settings.from_env({name: "1"}) is not None


@pytest.mark.parametrize("environ", [
    {},  # serve or token with no secret at all
    {"LIVEPUSH_SECRET": "short"},
    {"LIVEPUSH_SECRET": "a" * 40},  # long, but not random
    {"LIVEPUSH_SECRET": "abcdefghijklmnopqrstuvwxyz,0123456789"},  # a comma
])
def test_the_command_a_secret_error_gives_makes_a_secret_on_a_machine_whose_python_is_python3(
        environ: dict[str, str], tmp_path: Path) -> None:
    """The command a secret's error line gives runs as written where the only Python is `python3`
    (Debian and Ubuntu name no `python`), and prints a secret the settings take."""
    (tmp_path / "python3").symlink_to(sys.executable)
    with pytest.raises(ConfigError) as raised:
        Settings.from_env(environ).require_secret()
    command = re.search(r"`([^`]*secrets[^`]*)`", str(raised.value))
    assert command, raised.value
    made = subprocess.run(["/bin/sh", "-c", command.group(1)], capture_output=True, text=True, timeout=30,
                          env={"PATH": str(tmp_path)})
    assert made.returncode == 0, (command.group(1), made.stderr)
    assert Settings.from_env({"LIVEPUSH_SECRET": made.stdout.strip()}).secret == made.stdout.strip()


@pytest.mark.parametrize("pooled", [False, True])
def test_a_connect_timeout_in_the_database_url_is_the_one_livepush_waits(pooled: bool) -> None:
    """`?connect_timeout=2` in the URL bounds how long livepush waits for a server that takes the
    connection but never answers, as libpq's own option says; livepush's 5 s is only the default.
    A serverless Postgres that wakes slowly needs a longer one, a fail-fast check a shorter one."""
    import asyncio
    import socket
    import time

    from livepush.errors import DependencyError
    from livepush.postgres.connect import connect
    from livepush.postgres.pools import LoopPools

    with socket.socket() as mute:  # the kernel completes the handshake; nothing ever answers
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        url = f"postgresql://app@127.0.0.1:{mute.getsockname()[1]}/app?connect_timeout=2"
        started = time.monotonic()
        with pytest.raises(DependencyError):
            if pooled:
                async def use_pool() -> None:
                    pools = LoopPools(url, name="timeout-test")
                    try:
                        await pools.aget()
                    finally:
                        await pools.aclose()

                asyncio.run(asyncio.wait_for(use_pool(), 30))
            else:
                connect(url).close()
        took = time.monotonic() - started
    assert took < 4.5, f"waited {took:.1f} s, not the URL's 2 s"


class _Reads(dict):  # type: ignore[type-arg]
    """An environment that records every variable asked for."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.asked: set[str] = set()

    def get(self, name: str, default: object = None) -> object:  # type: ignore[override]
        self.asked.add(name)
        return super().get(name, default)


def test_the_list_of_environment_settings_is_every_variable_settings_read() -> None:
    """config.ENVIRONMENT (which the Django checks use to name a livepush setting written in
    settings.py) holds exactly what Settings.from_env() reads: a variable added to one and not the
    other would be silently ignored when written in the wrong place, or warned of wrongly."""
    bare, full = _Reads(), _Reads({"LIVEPUSH_DATABASE_URL": "postgresql://db.example/app",
                                   "LIVEPUSH_MAX_CONNECTIONS": "10"})
    Settings.from_env(bare)
    Settings.from_env(full)
    assert bare.asked | full.asked == ENVIRONMENT


@pytest.mark.parametrize("entry", ["https://*.com", "https://*.COM", "http://*.dev:8000", "https://*.internal"])
def test_a_wildcard_over_a_whole_top_level_domain_is_refused(entry: str) -> None:
    """`https://*.com` would admit every site under .com, which no deployment means: it ends the
    command at start, naming the entry. One's own domain, or localhost's subdomains, still pass."""
    with pytest.raises(ConfigError, match=re.escape(repr(entry)) + ".*every site"):
        Settings.from_env({"LIVEPUSH_ALLOWED_ORIGINS": f"https://app.example.com,{entry}"})
    Settings.from_env({"LIVEPUSH_ALLOWED_ORIGINS": "https://*.example.com,http://*.localhost:3000,https://*.co.example"})


@pytest.mark.parametrize("entry", ["https://bücher.example.com", "https://*.bücher.example.com", "https://app.пример.рф:8443"])
def test_an_allowed_origin_with_a_host_browsers_never_send_is_refused_at_start(entry: str) -> None:
    """A browser sends a host that is not ASCII in its ASCII form (`https://xn--bcher-kva.example.com`),
    so an entry written with the Unicode host would refuse every page of that site with 403, and
    say so only at DEBUG: it ends the command at start, naming the entry and the form to write."""
    with pytest.raises(ConfigError, match=re.escape(repr(entry)) + ".*ASCII.*xn--"):
        Settings.from_env({"LIVEPUSH_ALLOWED_ORIGINS": f"https://app.example.com,{entry}"})
    Settings.from_env({"LIVEPUSH_ALLOWED_ORIGINS": "https://xn--bcher-kva.example.com,https://*.xn--bcher-kva.example.com"})


def test_every_database_connection_probes_a_silent_server_within_a_minute_unless_the_url_says_otherwise(
        pg_url: str) -> None:
    """A server gone without closing its connections (a failover whose old primary vanished) is
    found by TCP keepalives after about a minute of silence, not the kernel's two hours: livepush
    sets them on every connection, pooled or not, and a URL's own keepalives_* win."""
    from livepush.postgres.connect import connect
    from livepush.postgres.pools import LoopPools

    def keepalives(conn: Any) -> tuple[str | None, ...]:
        given = conn.info.get_parameters()
        return tuple(given.get(k) for k in ("keepalives_idle", "keepalives_interval", "keepalives_count"))

    with connect(pg_url) as conn:
        assert keepalives(conn) == ("30", "10", "3")
    sep = "&" if "?" in pg_url else "?"
    with connect(f"{pg_url}{sep}keepalives_idle=7") as conn:
        assert keepalives(conn) == ("7", "10", "3")
    pools = LoopPools(pg_url, name="keepalive-test")
    try:
        with pools.sync().connection() as conn:
            assert keepalives(conn) == ("30", "10", "3")
    finally:
        pools.close()


def test_the_secret_is_the_same_whether_its_loader_kept_a_trailing_newline_or_spaces() -> None:
    """A secret mounted from a file (a Kubernetes secret keeps its trailing newline) and the same
    secret from a .env file (whose loader drops it) sign alike, as fallbacks always did: else the
    web app's tokens and signed topics were refused by the servers, and a secret moved into the
    fallbacks at rotation stopped verifying what it had signed."""
    secret = "k3Yq9-rT7pW2xZ8vN4bL6mC1dF5gH0jS"
    for loaded in (secret + "\n", f"  {secret}\t", secret):
        assert Settings.from_env({"LIVEPUSH_SECRET": loaded}).secret == secret
    assert Settings.from_env({"LIVEPUSH_SECRET_FALLBACKS": secret + "\n"}).secret_fallbacks == (secret,)


def test_a_postgres_url_is_shown_as_its_host_port_and_database_never_its_user_or_password() -> None:
    """Messages name a Postgres URL as `host:port/dbname`: the user and the password are never
    said, and `dbname@host:port` read as a user at a host (a message about a missing role named
    the database as if it were that role)."""
    from livepush.postgres.urls import redact

    assert redact("postgresql://ana:s3cret@db.internal:6432/shop") == "db.internal:6432/shop"
    assert redact("postgresql://ana@[::1]/shop") == "[::1]:5432/shop"
    assert redact("host=/var/run/postgresql dbname=shop user=ana password=s3cret") == "unix socket:5432/shop"
    assert redact("postgresql://ana@db.internal") == "db.internal:5432/ana"  # libpq's default database: the user's name
