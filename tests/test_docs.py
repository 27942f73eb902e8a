"""The docs are a contract (docs/reference.md): every Python example in them is Python and the
ones a reader would copy run as written against a real Postgres; every setting, command, flag,
metric, error and name they give exists in the code, and the code has none they leave out; every
test they cite exists; and they point at nothing outside the repository."""

from __future__ import annotations

import ast
import asyncio
import os
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import livepush
from livepush import jobs, metrics
from livepush.cli.commands import build_parser
from tests.support.settings import jobs_settings

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "client_js" / "README.md"]
# Hosts an example may name: they stand for the reader's own.
EXAMPLE_HOSTS = re.compile(r"^(localhost|127\.0\.0\.1|10\.\d+\.\d+\.\d+|([\w-]+\.)*example\.com|livepush)$")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(page: Path, language: str = "python") -> Iterator[tuple[int, str]]:
    """(line, code) of each fenced block of `language` in `page`."""
    text = page.read_text()
    for match in FENCE.finditer(text):
        if match.group(1) == language:
            yield text.count("\n", 0, match.start()) + 2, match.group(2)


def example(page: str, containing: str) -> tuple[str, str]:
    """The one Python block of `page` (a path from the root) holding `containing`, and its place."""
    found = [(line, code) for line, code in blocks(ROOT / page) if containing in code]
    assert len(found) == 1, f"{page}: {len(found)} Python blocks hold {containing!r}"
    line, code = found[0]
    return code, f"{page}:{line}"


async def run(code: str, where: str, namespace: dict[str, Any]) -> dict[str, Any]:
    """Run a docs example as a reader would paste it (top-level `await` included) in `namespace`.
    A block's line numbers map onto its page, so a failure points at the docs."""
    path, _, line = where.partition(":")
    tree = ast.parse(code, path)
    ast.increment_lineno(tree, int(line) - 1)
    compiled = compile(tree, path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace.setdefault("__name__", "docs_examples." + Path(path).stem)
    result = eval(compiled, namespace)  # noqa: S307 -- the repository's own docs
    if asyncio.iscoroutine(result):
        await result
    return namespace


def section(page: str, heading: str) -> str:
    """The text of `page` under the heading that starts with `heading`, to the next of its level."""
    text = (ROOT / page).read_text()
    start = re.search(rf"^(#+) {re.escape(heading)}.*$", text, re.M)
    assert start, f"{page}: no heading {heading!r}"
    level = len(start.group(1))
    end = re.compile(rf"^#{{1,{level}}} ", re.M).search(text, start.end())
    return text[start.end():end.start() if end else len(text)]


# ---- What the docs show is Python, and what they name exists -----------------------------------


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_example_is_python(page: Path) -> None:
    """Each ```python block of the page compiles (top-level `await` allowed), not only parses: a
    reader can paste it (a `return` outside a function parses, and fails when run)."""
    for line, code in blocks(page):
        try:
            compile(code, str(page), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
        except SyntaxError as exc:
            pytest.fail(f"{page.relative_to(ROOT)}:{line + (exc.lineno or 1) - 1}: {exc.msg}")


def _table_settings(text: str) -> set[str]:
    return {name for row in re.findall(r"^\| (`LIVEPUSH_[^|]*)\|", text, re.M)
            for name in re.findall(r"`(LIVEPUSH_[A-Z_]+)`", row)}


def test_the_settings_tables_name_every_setting_livepush_reads_and_no_other() -> None:
    """README's table and reference §2 list the same variables, exactly those the package reads
    (the Django integration's own settings, documented in frameworks.md, aside)."""
    readme = _table_settings((ROOT / "README.md").read_text())
    reference = _table_settings(section("docs/reference.md", "2. Configuration"))
    read = set()
    for source in (ROOT / "livepush").rglob("*.py"):
        if "contrib/django" not in source.as_posix():
            read |= set(re.findall(r"[\"'](LIVEPUSH_[A-Z_]+)[\"']", source.read_text()))
    assert readme == reference, (readme ^ reference)
    assert reference == read, (f"documented, never read: {sorted(reference - read)}; "
                               f"read, not documented: {sorted(read - reference)}")


def test_every_livepush_variable_the_pages_name_is_one_something_reads() -> None:
    """A `LIVEPUSH_*` name anywhere in the pages (prose, examples, comments; not only the tables
    above) is read by livepush (its Django settings included) or by a script of bin/ (`bin/test`'s
    `LIVEPUSH_TEST_WORKERS`): a reader who sets one the page misspells, or one renamed since,
    changes nothing and is told nothing. A name quoted as what a warning says of a misspelling
    (`LIVEPUSH_SESSION_TIMEOUT: did you mean ...`) is the example of one."""
    sources = [*(ROOT / "livepush").rglob("*.py"), *(p for p in (ROOT / "bin").iterdir() if p.is_file())]
    read = {name for source in sources for name in re.findall(r"\b(LIVEPUSH_[A-Z_]*[A-Z])\b", source.read_text())}
    unread = []
    for page in [*PAGES, *sorted((ROOT / "examples").glob("*/README.md"))]:
        text = page.read_text()
        for name in re.finditer(r"\b(LIVEPUSH_[A-Z_]*[A-Z])\b(?!: did you mean)", text):
            if name.group(1) not in read:
                unread.append(f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, name.start()) + 1}: {name.group(1)}")
    assert not unread, unread


def test_frameworks_gives_every_setting_the_django_integration_reads_and_its_ttls_default() -> None:
    """The Django settings livepush reads (its only settings not in the environment, so not in the
    tables above) are each named in frameworks.md, which names no other, and the session TTL's
    default there is the code's."""
    pytest.importorskip("django")
    from livepush.contrib.django.sessions import DEFAULT_TTL

    read = set()
    for source in (ROOT / "livepush" / "contrib" / "django").rglob("*.py"):
        read |= set(re.findall(r"[\"'](LIVEPUSH_[A-Z_]+)[\"']", source.read_text()))
    page = (ROOT / "docs" / "frameworks.md").read_text()
    named = set(re.findall(r"`(LIVEPUSH_SESSION_[A-Z_]+)`", page))
    assert read == named, f"read, not in frameworks.md: {sorted(read - named)}; named, never read: {sorted(named - read)}"
    assert f"`LIVEPUSH_SESSION_TTL` (seconds or a `timedelta`, default {DEFAULT_TTL:g})" in page


def _table_rows(text: str) -> dict[str, list[str]]:
    """The cells of each settings-table row of `text`, by each variable the row's first cell names."""
    rows = {}
    for row in re.findall(r"^\| (`LIVEPUSH_.*)\|\s*$", text, re.M):
        cells = [cell.strip() for cell in row.split("|")]
        for name in re.findall(r"`(LIVEPUSH_[A-Z_]+)`", cells[0]):
            rows[name] = cells
    return rows


def _code_defaults() -> dict[str, list[str]]:
    """What the code does for each variable left unset, as the tables' default column words it: a
    backticked value, `none` (nothing set), or the phrase that says what happens instead."""
    from livepush import migrate
    from livepush.cli.workers import worker_count
    from livepush.config import Settings
    from livepush.redis.client import deployment_prefix

    unset = Settings.from_env({})
    with_database = Settings.from_env({"LIVEPUSH_DATABASE_URL": "postgresql://app@db.example/app"})

    def word(value: Any) -> str:
        if value is None or value == ():
            return "none"
        if isinstance(value, bool):
            return "`on`" if value else "`off`"
        return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"

    db = 3  # the default prefix follows the URL's database number
    return {
        "LIVEPUSH_DATABASE_URL": [word(unset.database_url)],
        "LIVEPUSH_REDIS_URL": [word(unset.redis_url)],
        "LIVEPUSH_FANOUT": [word(unset.fanout), word(with_database.fanout)],
        "LIVEPUSH_SECRET": [word(unset.secret)],
        "LIVEPUSH_SECRET_FALLBACKS": [word(unset.secret_fallbacks)],
        "LIVEPUSH_AUTHENTICATE": [word(unset.authenticate)],
        "LIVEPUSH_ALLOWED_ORIGINS": ["same-origin only" if unset.allowed_origins is None else word(unset.allowed_origins)],
        "LIVEPUSH_HOST": [word(unset.host)],
        "LIVEPUSH_PORT": [word(unset.port)],
        "LIVEPUSH_HISTORY_TTL": [word(unset.history_ttl)],
        "LIVEPUSH_ENV": [word(unset.env)],
        "LIVEPUSH_REDIS_PREFIX": [word(deployment_prefix(f"redis://h/{db}", unset.redis_prefix)
                                       .replace(str(db), "<db number>"))],
        "LIVEPUSH_MAX_CONNECTIONS": [word(unset.max_connections)],
        "LIVEPUSH_SIGNED_TOPIC_TTL": [word(unset.signed_topic_ttl)],
        "LIVEPUSH_QUERY_TOKENS": [word(unset.query_tokens)],
        "LIVEPUSH_WORKERS": [word(worker_count(None, {}))],
        "LIVEPUSH_DRAIN_SECONDS": [word(unset.drain_seconds)],
        "LIVEPUSH_WORKER_STOP_MARGIN": [word(unset.worker_stop_margin)],
        "LIVEPUSH_LISTEN_DATABASE_URL": ["`LIVEPUSH_DATABASE_URL`" if with_database.listen_url == with_database.database_url
                                         else "a URL of its own"],
        "LIVEPUSH_PREPARED_STATEMENTS": [word(unset.prepared_statements)],
        "LIVEPUSH_MIGRATE_LOCK_TIMEOUT": ["`lock_timeout`" if unset.migrate_lock_timeout is None
                                          else word(unset.migrate_lock_timeout), word(migrate.DEFAULT_LOCK_TIMEOUT)],
    }


@pytest.mark.parametrize("page,heading", [("README.md", "Configuration"), ("docs/reference.md", "2. Configuration")])
def test_the_settings_tables_give_the_defaults_the_code_has(page: str, heading: str) -> None:
    """Each variable's default in the table is what the code does when it is unset."""
    rows = _table_rows(section(page, heading))
    defaults = _code_defaults()
    assert set(rows) == set(defaults), set(rows) ^ set(defaults)
    wrong = []
    for name, words in defaults.items():
        cell = rows[name][-1]
        for w in words:
            if not (cell.startswith(w) if w == "none" else w in cell):
                wrong.append(f"{name}: the code's default is {w}, the table says {cell!r}")
    assert not wrong, wrong


def test_the_reference_gives_the_bounds_of_the_publish_calls_the_code_has() -> None:
    """Reference §4's numbers for publish() and publish_many() (a batch's statements and script
    calls, a message's size, the Redis calls' pool and timeouts) are the code's: it said a
    Postgres batch went in one round trip per 1,000 messages, and it also splits at 8 MiB."""
    from livepush.fanout import base, postgres, redis
    from livepush.redis import client

    text = " ".join(section("docs/reference.md", "4. Python API").split())
    said = [f"one statement per {postgres.MANY_CHUNK:,} messages or about {postgres.MANY_CHUNK_BYTES >> 20} MiB of data",
            f"one script call per {redis.PUBLISH_CHUNK:,} messages or {redis.PUBLISH_CHUNK_BYTES >> 20} MiB of data",
            f"plain JSON of at most {base.MAX_PAYLOAD_BYTES >> 20} MiB",
            f"gives no answer within {redis.CALL_TIMEOUT:g} s",
            f"share up to {client.POOL_CONNECTIONS} connections",
            f"waits up to {client.POOL_WAIT_SECONDS:g} s for one of them"]
    missing = [words for words in said if words not in text]
    assert not missing, f"reference §4 does not say {missing}"


def test_the_reference_gives_the_limits_of_a_connection_the_code_has() -> None:
    """Reference §3, §5 and §8 give each bound the server puts on one connection (its frames,
    subscribes, frame budget, send queue, the closes 1008 and 1013, its keepalive) as the number
    the code uses: a client author sizes a page's subscribes and bursts by these."""
    import inspect

    from livepush import protocol
    from livepush.server import app, backlog, connection, core, limits

    def spaced(heading: str) -> str:
        return " ".join(section("docs/reference.md", heading).split())

    said = {
        "3. Commands": [f"(`hello`'s `heartbeat`, {app.HEARTBEAT_SECONDS:g} s)"],
        "Limits": [f"A client frame is at most {protocol.MAX_FRAME_BYTES >> 10} KiB",
                   f"more than {protocol.BAD_FRAMES_PER_MINUTE} bad frames in a minute is closed with {protocol.CLOSE_POLICY}"],
        "8. Trust boundaries": [
            f"at most {limits.SUBSCRIBES_PER_SECOND:g} times a second (bursts of {limits.SUBSCRIBE_BURST:g})",
            f"`App(max_subscriptions={inspect.signature(livepush.App).parameters['max_subscriptions'].default})`",
            f"{limits.FRAMES_PER_SECOND} frames a second or {limits.FRAME_BYTES_PER_SECOND >> 10} KiB of frames a second",
            f"with up to {limits.FRAME_BUDGET_SECONDS:g} seconds saved",
            f"capped at {connection.SOCKET_SEND_BUFFER >> 10} KiB",
            f"Past {connection.WRITE_HIGH >> 10} KiB unsent",
            f"at most {backlog.TOPIC_FRAMES:,} messages or {backlog.TOPIC_BYTES >> 10} KiB wait",
            f"more than {connection.BACKLOG_BYTES >> 20} MiB waiting",
            f"missing a frame for {connection.BEHIND_SECONDS:g} s, is closed with {protocol.CLOSE_TOO_SLOW}",
            f"(at least {core.DESCRIPTOR_RESERVE} files)",
            f"backlog is {core.LISTEN_BACKLOG}"],
    }
    assert limits.FRAME_RESUME_SECONDS == 0.25 and "until a quarter of a second of budget is back" in spaced("8. Trust boundaries")
    missing = [f"{heading}: {words}" for heading, all_words in said.items() for words in all_words
               if words not in spaced(heading)]
    assert not missing, missing


def test_the_docs_give_the_lengths_and_counts_the_jobs_api_keeps_and_takes() -> None:
    """What the jobs API cuts (a failed job's error, a progress message) and what it refuses past
    a bound (tags, keys, queue and job names, a page of jobs, a group's members, a durable name)
    is the code's number in reference §4 and jobs.md: a job's error was cut to its first 4,000
    characters, which no page said."""
    from livepush.jobs.api import limits, options, reads
    from livepush.jobs.durable import run
    from livepush.jobs.groups import building
    from livepush.jobs.runtime import completer, context

    reference = " ".join(section("docs/reference.md", "4. Python API").split())
    jobs_page = " ".join((ROOT / "docs" / "jobs.md").read_text().split())
    durable = " ".join((ROOT / "docs" / "durable.md").read_text().split())
    said = [
        (jobs_page, f"keeps its last error, its first {completer.MAX_ERROR:,} characters"),
        (jobs_page, f"The message is kept to {context.MAX_MESSAGE:,} characters"),
        (reference, f"up to {options.MAX_TAGS} distinct strings of 1 to {options.MAX_TAG_LENGTH} characters"),
        (reference, f"({options.MAX_KEY_LENGTH} characters, {limits.MAX_NAME_AND_KEY_BYTES:,} bytes of UTF-8"),
        (jobs_page, f"Keys are strings of 1 to {options.MAX_KEY_LENGTH} characters"),
        (jobs_page, f"a string of at most {options.MAX_NAME_LENGTH} characters"),
        (jobs_page, f"most {options.MAX_QUEUE_LENGTH} characters with no comma"),
        (reference, f"at most {reads.MAX_LISTED:,} a call"),
        (reference, f"at most `MAX_GROUP_MEMBERS` ({building.MAX_GROUP_MEMBERS:,}) members"),
        (durable, f"Names are non-empty strings of at most {run.MAX_NAME} characters"),
    ]
    missing = [words for text, words in said if words not in text]
    assert not missing, missing


def test_the_reference_and_help_give_each_range_the_code_checks() -> None:
    """Where the code refuses a setting outside a range, reference §2 states that range; where
    `livepush jobs` refuses a flag outside one, reference §3, --help and jobs.md's list of the
    ranges state it: jobs.md gave `--retention` as any positive number, and none but jobs.md gave
    `--shutdown-timeout`'s."""
    from livepush import config
    from livepush.cli.workers import MAX_WORKERS
    from livepush.jobs.runtime import runtime
    from livepush.redis.client import PREFIX_MAX

    settings = {
        "LIVEPUSH_SECRET": f"at least {config.MIN_SECRET_LENGTH} characters",
        "LIVEPUSH_HISTORY_TTL": f"from {config.MIN_HISTORY_TTL:g} to a year: {config.MAX_HISTORY_TTL:.0f}",
        "LIVEPUSH_SIGNED_TOPIC_TTL": f"({config.MIN_SIGNED_TOPIC_TTL:g} or more)",
        "LIVEPUSH_WORKERS": f"from 1 to {MAX_WORKERS}",
        "LIVEPUSH_DRAIN_SECONDS": f"from 0 to {config.MAX_DRAIN_SECONDS:g}",
        "LIVEPUSH_WORKER_STOP_MARGIN": f"from 0 to {config.MAX_WORKER_STOP_MARGIN:g}",
        "LIVEPUSH_MIGRATE_LOCK_TIMEOUT": f"from 0 to {config.MAX_MIGRATE_LOCK_TIMEOUT:g}",
        "LIVEPUSH_REDIS_PREFIX": f"1 to {PREFIX_MAX} printable characters",
    }
    flags = {
        "--concurrency": f"from 1 to {runtime.MAX_CONCURRENCY}",
        "--heartbeat": f"from {runtime.MIN_BEAT:g} to {runtime.MAX_HEARTBEAT:g}",
        "--poll-interval": f"from {runtime.MIN_BEAT:g} to {runtime.MAX_HEARTBEAT:g}",
        "--retention": f"at most {runtime.MAX_RETENTION:.0f}",
        "--shutdown-timeout": "0 or more",
    }
    rows = _table_rows(section("docs/reference.md", "2. Configuration"))
    wrong = [f"reference §2, {name}: not {said!r}" for name, said in settings.items() if said not in " ".join(rows[name])]
    commands = " ".join(section("docs/reference.md", "3. Commands").split())
    actions = {flag: a for a in _parsers()["jobs"]._actions for flag in a.option_strings}
    for flag, said in flags.items():
        # The flag's parenthesis: "`--heartbeat` seconds (default 10; from 0.01 to 86400)".
        stated = re.search(rf"`{flag}`[^`(]*\([^)]*\)", commands)
        if not stated or said not in stated.group(0):
            wrong.append(f"reference §3, {flag}: not {said!r}")
        if said not in " ".join((actions[flag].help or "").split()):
            wrong.append(f"livepush jobs --help, {flag}: not {said!r}")
    ranges = re.search(r"^- `--heartbeat` and `--poll-interval` take seconds (.*?) exits 2",
                       (ROOT / "docs" / "jobs.md").read_text(), re.M | re.S)
    assert ranges, "docs/jobs.md: no list of the ranges `livepush jobs` takes"
    listed = " ".join(ranges.group(1).split())
    wrong += [f"jobs.md, {flag}: not {said!r}" for flag, said in flags.items() if flag != "--concurrency" and said not in listed]
    assert not wrong, wrong


def test_each_commands_help_gives_the_range_the_code_checks_for_its_flags() -> None:
    """`livepush serve`, `migrate`, `token` and `status --help` state the range each of their
    flags is refused outside of, as `livepush jobs --help` does (above) and the reference does: a
    reader of --help learned `--drain-seconds 600` was too many only from the refusal."""
    from livepush import config, sessions
    from livepush.cli.workers import MAX_WORKERS
    from livepush.jobs.api.status import MAX_LIMIT

    ranges = [("serve", "--drain-seconds", f"from 0 to {config.MAX_DRAIN_SECONDS:g}"),
              ("serve", "--workers", f"from 1 to {MAX_WORKERS}"),
              ("migrate", "--lock-timeout", f"from 0 to {config.MAX_MIGRATE_LOCK_TIMEOUT:g}"),
              ("token", "--ttl", f"for a session, which lasts at most {sessions.MAX_TTL / 86400:.0f} days"),
              ("status", "--limit", f"from 1 to {MAX_LIMIT}")]
    parsers = _parsers()
    wrong = []
    for command, flag, said in ranges:
        action = next(a for a in parsers[command]._actions if flag in a.option_strings)
        if said not in " ".join((action.help or "").split()):
            wrong.append(f"livepush {command} --help, {flag}: not {said!r}: {action.help!r}")
    assert not wrong, wrong


def _parsers() -> dict[str, Any]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return dict(sub.choices)


def _flags(parser: Any) -> set[str]:
    return {s for a in parser._actions if a.help != "==SUPPRESS==" for s in a.option_strings} - {"-h", "--help"}


def test_each_command_the_reference_describes_has_the_flags_it_gives_and_no_other() -> None:
    """Every `livepush CMD [--flag ...]` synopsis in reference §3 names the command's own flags,
    all of them; and every command `livepush --help` lists is described there."""
    commands = section("docs/reference.md", "3. Commands")
    parsers = _parsers()
    described = set()
    for synopsis in re.findall(r"^- `livepush (.*?)`(?=[\s,:])", commands, re.M):
        name = synopsis.split()[0]
        described.add(name)
        assert name in parsers, f"reference §3 describes `livepush {name}`, which is no command"
        assert set(re.findall(r"--[a-z-]+", synopsis)) == _flags(parsers[name]), synopsis
    # publish and token share one line: `livepush publish TOPIC JSON`, `livepush token session ...`.
    described |= set(re.findall(r"`livepush (publish|token) ", commands))
    assert described == set(parsers), set(parsers) ^ described


def test_the_protocol_page_gives_every_close_code_the_reference_does() -> None:
    """protocol.md's "Limits and close codes" names each close code of reference §5's table, and no
    other: a client author reading either page learns of the same closes."""
    table = section("docs/reference.md", "Close codes")
    reference = set(re.findall(r"^\| (\d{4}) \|", table, re.M))
    protocol = set(re.findall(r"\*\*(\d{4})\*\*", section("docs/protocol.md", "Limits and close codes")))
    assert reference and protocol == reference, f"protocol.md lacks {sorted(reference - protocol)}, " \
                                                f"reference lacks {sorted(protocol - reference)}"


def test_the_protocol_page_says_what_a_client_does_after_every_close_and_refused_handshake() -> None:
    """protocol.md's "What a client keeps" says what a client does after each close code of
    reference §5's table, after the two a client meets without this server sending them (1006, a
    connection lost with no close frame; 1012, a proxy restarting), and after each status the
    server refuses an upgrade with, 503's `Retry-After` included: a client written from the page
    alone must not guess which of them to retry."""
    table = section("docs/reference.md", "Close codes")
    codes = set(re.findall(r"^\| (\d{4}) \|", table, re.M)) | {"1006", "1012"}
    said = section("docs/protocol.md", "What a client keeps")
    missing = sorted(code for code in codes if not re.search(rf"\b{code}\b", said))
    assert not missing, f"protocol.md does not say what a client does after close {missing}"
    for status in ("400", "403", "503", "Retry-After"):
        assert status in said, f"protocol.md does not say what a client does after a handshake's {status}"


def test_every_exit_status_of_the_commands_is_in_the_reference_the_readme_and_help() -> None:
    """Reference §3's exit-status table, README's sentence on it and `livepush --help` give each
    status the `livepush` command exits with (its EXIT_ constants), and no other: a deploy script
    that tells a migrate to try again (75) from a database that is down (1) learns of both from
    any of them."""
    import livepush.cli.commands

    codes = {str(value) for name, value in vars(sys.modules["livepush.cli.commands"]).items() if name.startswith("EXIT_")}
    table = set(re.findall(r"^\| (\d+) \|", section("docs/reference.md", "3. Commands"), re.M))
    sentence = re.search(r"^Exit status of every command:(.*?)(?:\n\n|\Z)",
                         (ROOT / "README.md").read_text(), re.M | re.S)
    assert sentence, "README.md: no \"Exit status of every command:\" paragraph"
    readme = set(re.findall(r"\b(\d+)\b", re.sub(r"\[.*?\]\(.*?\)", "", sentence.group(1))))  # not §3
    assert table == codes, f"reference §3's table lacks {sorted(codes - table)}, has more: {sorted(table - codes)}"
    assert readme == codes, f"README lacks {sorted(codes - readme)}, has more: {sorted(readme - codes)}"
    usage = " ".join(build_parser().format_help().split())
    said = re.search(r"exit status: (.*)", usage)
    assert said, f"livepush --help says nothing of its exit status: {usage}"
    helped = set(re.findall(r"\b(\d+)\b", said.group(1)))
    assert helped == codes, f"livepush --help lacks {sorted(codes - helped)}, has more: {sorted(helped - codes)}"


def test_exit_status_1_names_a_supervisor_whose_stop_failed_beside_a_dependency_down() -> None:
    """`serve --workers N` exits 1 when it killed a worker that outlived its stop's bound (or a
    worker failed to stop cleanly, or restarts stormed): reference §3's table, README's sentence
    and `livepush --help` say so where they give status 1, lest an operator whose deploy ended in
    1 look for a Postgres or Redis outage that never was."""
    row = re.search(r"^\| 1 \|(.*)$", section("docs/reference.md", "3. Commands"), re.M)
    assert row, "reference §3: no row for exit status 1"
    sentence = re.search(r"^Exit status of every command:(.*?)(?:\n\n|\Z)",
                         (ROOT / "README.md").read_text(), re.M | re.S)
    assert sentence, "README.md: no \"Exit status of every command:\" paragraph"
    said = re.search(r"exit status: (.*)", " ".join(build_parser().format_help().split()))
    assert said, "livepush --help says nothing of its exit status"
    for where, text in (("reference §3", row.group(1)), ("README.md", sentence.group(1)),
                        ("livepush --help", said.group(1))):
        text = " ".join(text.split())
        assert "--workers" in text and "killed" in text, f"{where} gives status 1 as a dependency down only: {text}"

def test_the_pages_list_where_a_token_comes_from_in_the_order_the_server_takes_them() -> None:
    """Reference §5's handshake list and security.md's numbered list give the places a session token
    comes from in the order the server counts them (the first valid one is the session): a list
    read top to bottom is read as that order."""
    from livepush.sessions.handshake import extract_tokens

    headers = [("Cookie", "livepush_session=from-cookie"),
               ("Sec-WebSocket-Protocol", "livepush, livepush.token.from-subprotocol")]
    places = {"from-cookie": "cookie", "from-subprotocol": "Sec-WebSocket-Protocol", "from-query": "query parameter"}
    counted = [places[token] for token in extract_tokens(headers, "/?token=from-query")]

    def listed(text: str) -> list[str]:
        order = []
        for item in re.findall(r"^(?:-|\d+\.) (.*(?:\n(?!-|\d+\.|\n).*)*)", text, re.M):
            found = [(item.find(word), word) for word in places.values() if word in item]
            if found:
                order.append(min(found)[1])
        return order

    assert listed(section("docs/reference.md", "Handshake")) == counted
    assert listed(section("docs/security.md", "Where the token travels")) == counted


def test_every_metric_the_reference_lists_is_served() -> None:
    """The metrics table of reference §9 names exactly the families /metrics serves, each with the
    type and the labels the code gives it: an alert written from the table (`sum by (queue)`, a
    `rate()` of a counter) selects what a scrape has."""
    table = section("docs/reference.md", "9. Operations")
    listed = {re.sub(r"_total$", "", name): (kind, set(labels.split(",")) - {""})
              for name, labels, kind in re.findall(r"^\s*\| `(livepush_[a-z_]+)(?:\{([a-z_,]*)\})?` \| (\w+) \|", table, re.M)}
    import prometheus_client

    # The labels of each family: a metric object's own, and for the gauges read from the database
    # those of the samples a read with one queue and one runtime gives (a fresh collector's).
    labels = {metric._name: set(metric._labelnames) for metric in vars(metrics).values()  # noqa: SLF001
              if isinstance(metric, prometheus_client.metrics.MetricWrapperBase)}
    gauges = metrics._DatabaseGauges()  # noqa: SLF001
    gauges.queues, gauges.runtimes_alive = {"q": (1, 0.0, 0, False)}, 1
    for family in gauges.collect():
        labels[family.name] = {label for sample in family.samples for label in sample.labels}
    served = {family.name: (family.type, labels[family.name]) for family in metrics.REGISTRY.collect()}
    assert set(listed) == set(served), set(listed) ^ set(served)
    wrong = {name: (listed[name], served[name]) for name in served if listed[name] != served[name]}
    assert not wrong, f"reference §9 (type, labels) against the code's: {wrong}"


def test_the_reference_gives_each_field_and_status_of_the_health_and_readiness_bodies() -> None:
    """The JSON bodies of `/healthz` and `/readyz`, which probes and scripts read, are shown in
    reference §5's routes and §9 with each field and `status` word the server writes, ready or
    not: a probe written from the page that matched `"status":"ready"` alone learned of
    `"unavailable"` only from an outage."""
    import json

    from livepush.fanout.local import LocalFanOut
    from livepush.server import http
    from livepush.server.readiness import Readiness

    said = section("docs/reference.md", "HTTP routes") + section("docs/reference.md", "9. Operations")
    said = re.sub(r'"\s*:\s*', '":', " ".join(said.split()))  # `"status": "ready"` is `"status":"ready"`
    bodies = [json.loads(http.healthz(up, "postgres").body) for up in (True, False)]
    ready = Readiness(LocalFanOut(), away=lambda: "x", draining=lambda: True, full=lambda: "x", worker=1)
    bodies.append(json.loads(ready.report()[1]))
    wrong = []
    for body in bodies:
        for key, value in body.items():
            if f'"{key}":' not in said:
                wrong.append(f"field {key}")
            if key == "status" and f'"status":"{value}"' not in said:
                wrong.append(f"status {value}")
    assert not wrong, f"reference §5 and §9 do not show the bodies' {sorted(set(wrong))}"


def test_the_metrics_table_names_each_label_value_the_code_counts() -> None:
    """Each label value a counter of reference §9 can take is named in its row: those made at 0
    from the start, and the handshake's `session_<reason>` refusals, which only said `<reason>`:
    an operator who alerts on revoked sessions had to guess `session_revoked`."""
    from livepush.sessions import handshake

    table = section("docs/reference.md", "9. Operations")
    rows = {name: row for name, row in re.findall(r"^\s*\| `(livepush_[a-z_]+?)(?:_total)?(?:\{[a-z_,]*\})?` \|(.*)$", table, re.M)}
    values = {counter._name: set(labels) for counter, labels in metrics._KNOWN_LABELS}  # noqa: SLF001
    values[metrics.REFUSALS._name] |= {f"session_{reason}" for reason in handshake.REASONS}  # noqa: SLF001
    missing = [f"{name}: {value}" for name, named in values.items() for value in sorted(named)
               if not re.search(rf"`{value}`", rows[name]) and not (
                   value.startswith("session_") and f"`{value.removeprefix('session_')}`" in rows[name]
                   and "`session_<reason>`" in rows[name])]
    assert not missing, missing


def test_the_reference_says_which_passing_readiness_check_still_gives_a_detail() -> None:
    """§9 says a check has `detail` when not ok; a passing check that has one all the same is
    named there with it: a probe that took any `detail` for a failure read the `schema` check of a
    server without a database (ok, "no database") as one."""
    import json

    from livepush.fanout.local import LocalFanOut
    from livepush.server.readiness import Readiness

    said = " ".join(section("docs/reference.md", "9. Operations").split())
    body = json.loads(Readiness(LocalFanOut(), away=lambda: None, draining=lambda: False).report()[1])
    unsaid = [f"{name}: {check['detail']!r}" for name, check in body["checks"].items()
              if check["ok"] and "detail" in check and f"`{check['detail']}`" not in said]
    assert not unsaid, f"reference §9 does not give these ok checks' detail: {unsaid}"


def test_the_reference_names_every_key_of_a_json_log_line() -> None:
    """Each key `--log-format json` writes (a worker's line with an exception: every key there is)
    is named in reference §9's logs: a collector's parser is written from that list."""
    import json
    import logging

    from livepush.cli.logs import JsonLines

    try:
        raise ValueError("bad input")
    except ValueError:
        record = logging.LogRecord("livepush", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    record.livepush_process, record.livepush_worker = "worker 1", 1
    keys = set(json.loads(JsonLines().format(record)))
    logs = re.search(r"^- \*\*Logs\*\*:(.*?)(?=^- \*\*|\Z)", section("docs/reference.md", "9. Operations"), re.M | re.S)
    assert logs, "reference §9: no **Logs** item"
    missing = sorted(key for key in keys if f"`{key}`" not in logs.group(1))
    assert not missing, f"reference §9's logs do not name {missing}"


def test_every_series_the_docs_select_by_label_is_one_a_scrape_has() -> None:
    """A `livepush_...{label="value"}` in the docs is a query an operator copies: it names a series
    as /metrics writes it (a counter's with `_total`). `livepush_resets{cause="slow_client"}`
    named the counter's family, which no scrape has a series of: the query matched nothing."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    series = {family.name + suffix for family in metrics.REGISTRY.collect()
              for suffix in suffixes.get(family.type, ("",))}
    wrong = [f"{page.relative_to(ROOT)}: {name}" for page in PAGES
             for name in re.findall(r"\b(livepush_\w+)\{", page.read_text()) if name not in series]
    assert not wrong, wrong


def test_an_alert_that_fires_on_none_fires_too_when_no_process_exports_the_gauge() -> None:
    """An alert of operations.md that fires when a gauge reads 0 ("no runtime": none alive) fires
    too when the series is absent: the runtimes may be the only processes that export
    `livepush_runtimes_alive`, and with none running there is no series for `== 0` to match, so
    the alert stayed silent exactly when nothing ran jobs."""
    table = section("docs/operations.md", "What to watch")
    rules = re.findall(r"^\| [^|]+ \| `([^`]+)` \|", table, re.M)
    on_none = [rule for rule in rules if re.search(r"== 0\b", rule)]
    assert on_none, "no alert of operations.md fires on a gauge at 0"
    for rule in on_none:
        for gauge in set(re.findall(r"\b(livepush_[a-z_]+)\b", rule)):
            assert f"absent({gauge})" in rule, f"{rule!r} stays silent while no process exports {gauge}"


def _frame_keys(text: str) -> dict[str, set[str]]:
    """The keys of each `{"op":NAME,...}` frame a section of the reference shows, by NAME; a key
    whose value is an object adds that object's keys as `key.inner`."""
    frames: dict[str, set[str]] = {}
    for frame in re.findall(r'`(\{"op":"\w+".*?\})`', text):
        name = re.match(r'\{"op":"(\w+)"', frame).group(1)  # type: ignore[union-attr]
        keys = set(re.findall(r'[{,]"(\w+)":', re.sub(r"(?<=.)\{[^{}]*\}", "", frame))) - {"op"}
        keys |= {f"{outer}.{inner}" for outer, body in re.findall(r'"(\w+)":\{([^{}]*)\}', frame)
                 for inner in re.findall(r'"(\w+)":', body)}
        frames[name] = keys
    return frames


def _keys_of(frame: dict[str, Any]) -> set[str]:
    return {key for key in frame if key != "op"} | {f"{key}.{inner}" for key, value in frame.items()
                                                    if isinstance(value, dict) for inner in value}


def test_each_frame_the_reference_shows_has_the_fields_the_server_sends_and_reads() -> None:
    """Reference §5 shows every frame the server sends, each with the fields the code writes, and
    every op a client sends, with the fields the server reads: a client author who codes against
    the page meets no field it lacks and misses none."""
    import json

    from livepush import protocol

    sent = {"hello": protocol.hello("user-7", 25), "subscribed": protocol.subscribed("r", "t", "1"),
            "refused": protocol.refused("r", "limit"), "message": protocol.message("t", "1", "{}"),
            "reset": protocol.reset("t", "r"), "pong": protocol.pong("r"), "error": protocol.error("bad_frame", "d")}
    built = {name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")
             and getattr(value, "__module__", None) == protocol.__name__ and name.islower() and name != "parse"}
    assert built == set(sent), f"protocol.py builds frames this test does not know: {sorted(built ^ set(sent))}"
    shown = _frame_keys(section("docs/reference.md", "Server to client"))
    code = {name: _keys_of(json.loads(frame)) for name, frame in sent.items()}
    assert shown == code, {name: (sorted(shown.get(name, ())), sorted(code.get(name, ())))
                           for name in set(shown) | set(code) if shown.get(name) != code.get(name)}
    # What the client sends: each op the reference shows parses as that op, its fields read.
    commands = {"subscribe": protocol.Subscribe, "unsubscribe": protocol.Unsubscribe, "ping": protocol.Ping}
    shown = _frame_keys(section("docs/reference.md", "Client to server"))
    assert set(shown) == set(commands), set(shown) ^ set(commands)
    for op, command in commands.items():
        read = {field for field in command.__dataclass_fields__}  # type: ignore[attr-defined]
        assert shown[op] == read, f"reference §5 shows {op} with {sorted(shown[op])}; the server reads {sorted(read)}"
        frame = {"op": op, **{field: "x" if field != "since" else None for field in shown[op]}}
        assert isinstance(protocol.parse(json.dumps(frame)), command), frame


def _checked(migration: str, table: str, column: str) -> set[str]:
    """The values the CHECK of `column` of `table` allows, as the migration creating it writes them."""
    text = (ROOT / "sql" / migration).read_text()
    create = re.search(rf"CREATE TABLE {table} \((.*?)\n\);", text, re.S)
    assert create, f"sql/{migration}: no CREATE TABLE {table}"
    check = re.search(rf"CHECK \({column} IN \(([^)]*)\)", create.group(1), re.S)
    assert check, f"sql/{migration}: {table}.{column} has no CHECK ... IN"
    return set(re.findall(r"'(\w+)'", check.group(1)))


def _quoted_after(text: str, lead: str) -> set[str]:
    """The backticked words of the sentence of `text` that starts with `lead`, its asides in
    parentheses left out."""
    found = re.search(rf"{re.escape(lead)}(.*?)\.(?:\s|$)", re.sub(r"\([^()]*\)", "", " ".join(text.split())))
    assert found, f"no {lead!r}"
    return set(re.findall(r"`(\w+)`", found.group(1)))


def test_the_state_topics_show_the_events_states_and_fields_the_reference_gives() -> None:
    """Reference §6 (and its workflows part) give each state topic's events, its object's fields and
    its states as the migrations allow them and livepush.jobs.events.views builds them: a page that
    switches on `event` or `state` by the reference handles every value a topic shows."""
    from livepush.jobs.events import views

    events = section("docs/reference.md", "6. Events on state topics")
    workflows = section("docs/reference.md", "Workflows")

    def shape(text: str, topic: str) -> tuple[set[str], set[str]]:
        block = re.search(r'\{"event":((?:"\w+"\|?)+),\s*"' + topic + r'":\{(.*?)\}\}\s*$', text, re.S | re.M)
        assert block, f"reference: no {topic}:<id> shape"
        body = re.sub(r"\{[^{}]*\}", "", block.group(2))  # the nested objects' own keys aside
        return set(re.findall(r'"(\w+)"', block.group(1))), set(re.findall(r'"(\w+)"', body))

    row = {"id": 1, "name": "n", "queue": "q", "state": "running", "attempt": 1, "max_attempts": 3,
           "progress": None, "error": None, "run_at": None, "event": "started"}
    job_events, job_keys = shape(events, "job")
    assert job_events == _checked("0003_jobs.sql", "livepush_jobs", "event")
    assert job_keys == set(views.job_view(row)), job_keys ^ set(views.job_view(row))
    assert _quoted_after(events, "Job states:") == _checked("0003_jobs.sql", "livepush_jobs", "state")

    group_events, group_keys = shape(events, "group")
    # A finished or cancelled group shows that label for every change from then on (views.group_event).
    shown = _checked("0004_groups.sql", "livepush_groups", "event") | {"finished", "cancelled"}
    assert group_events == shown, group_events ^ shown
    assert group_keys == set(views.GROUP_KEYS), group_keys ^ set(views.GROUP_KEYS)
    assert _quoted_after(events, "Group states:") == _checked("0004_groups.sql", "livepush_groups", "state")

    run_events, run_keys = shape(workflows, "workflow")
    assert run_events == _checked("0006_workflows.sql", "livepush_workflows", "event")
    run = {"id": 1, "name": "n", "state": "running", "steps": {}}
    assert run_keys == set(views.workflow_view(run)), run_keys ^ set(views.workflow_view(run))
    # `waiting` is shown, not stored: a running run whose active steps all wait (views.workflow_view).
    states = _quoted_after(workflows, "Run states:")
    assert states == _checked("0006_workflows.sql", "livepush_workflows", "state") | {"waiting"}, states
    assert _quoted_after(workflows, "Step states:") == _checked("0006_workflows.sql", "livepush_workflow_steps", "state")


def _resolve(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return False


def test_every_livepush_name_the_docs_use_exists() -> None:
    """`livepush.X`, `livepush.jobs.X` and `jobs.X` in the docs (errors, functions, constants)
    are attributes the package has (the Django integration, which needs Django's settings to
    import, aside)."""
    missing = set()
    for page in PAGES:
        text = page.read_text()
        names = set(re.findall(r"\b(livepush(?:\.[A-Za-z_]\w*)+)", text))
        names |= {"livepush.jobs" + m for m in re.findall(r"(?<![\w.])jobs((?:\.[A-Za-z_]\w*)+)", text)}
        for name in names:
            if name.startswith(("livepush.contrib.django", "livepush.token.")) or name.endswith((".md", ".py", ".js", ".ts")):
                continue
            if name in ("livepush.session", "livepush.token", "livepush.websockets"):  # a salt, a subprotocol, a logger
                continue
            if re.fullmatch(r"livepush\.[EW]\d{3}", name):  # the id of a Django system check
                continue
            if not _resolve(name):
                missing.add(f"{page.relative_to(ROOT)}: {name}")
    assert not missing, sorted(missing)


def test_the_readme_and_reference_say_which_schemas_migrate_refuses_and_what_to_do(pg_url: str) -> None:
    """A database migrated by another build before 1.0 (a migration file that has changed since) is
    refused by `migrate`, `serve` and `jobs`: the README and reference §3 say so, with the way out
    the refusal itself gives, and in the terms `livepush --version` uses (the README once named the
    refused schemas "an earlier version (0.1)", which a reader running 0.1.0 took for not theirs)."""
    from livepush import migrate

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE livepush_schema SET checksum = 'from an earlier build' WHERE version = 3")
    with pytest.raises(livepush.SchemaError) as refused:
        migrate.migrate(pg_url)
    said = str(refused.value)
    way_out = re.search(r"use a new database, or drop livepush's tables and functions \(livepush_\*\)", said)
    assert way_out, said
    readme = " ".join(section("README.md", "Using it").split())
    commands = " ".join(section("docs/reference.md", "3. Commands").split())
    for where, text in (("README.md", readme), ("reference §3", commands)):
        assert "use a new database, or drop livepush's tables and functions (`livepush_*`)" in text, where
        assert "differ from this version's" in text, where
    assert "earlier version (0.1)" not in readme


def _js_options(code: str, call: str) -> Iterator[tuple[str, str]]:
    """(call, key) for each key of the options object an example passes as the last argument of
    `call(` (`new LivePush`, `.subscribe`, `bindProgress`): the object's top-level keys, shorthand
    (`{token}`) included, whatever functions its values hold."""
    for start in (m.end() for m in re.finditer(rf"{re.escape(call)}\(", code)):
        depth, i = 1, start
        while i < len(code) and depth:  # to the call's closing parenthesis
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(code[i], 0)
            i += 1
        args = code[start:i - 1].rstrip().rstrip(",")
        if not args.endswith("}"):
            continue
        depth, open_at = 0, len(args)
        for j in range(len(args) - 1, -1, -1):  # back to the options object's opening brace
            depth += {")": 1, "]": 1, "}": 1, "(": -1, "[": -1, "{": -1}.get(args[j], 0)
            if depth == 0:
                open_at = j
                break
        body, depth, part, parts = re.sub(r"//[^\n]*", "", args[open_at + 1:-1]), 0, "", []
        for ch in body:  # split on the commas between keys
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
            if ch == "," and depth == 0:
                parts.append(part)
                part = ""
            else:
                part += ch
        parts.append(part)
        for item in filter(str.strip, parts):
            key = re.match(r"\s*([A-Za-z_$][\w$]*)", item)
            if key:
                yield call, key.group(1)


def test_every_option_the_docs_give_the_js_client_is_one_it_takes() -> None:
    """The option names a page's code passes to `new LivePush(url, {...})`, `subscribe(topic, fn,
    {...})` and `bindProgress(lp, topic, element, {...})` in the docs' examples and prose are the
    client's own: a reader who copies `{ token }` or `onRefused:` gets what the page says, not the
    client's refusal of an unknown option."""
    source = (ROOT / "client_js" / "livepush.js").read_text()

    def names(constant: str) -> set[str]:
        found = re.search(rf"const {constant} = Object\.freeze\(\[(.*?)\]\)", source, re.S)
        assert found, constant
        return set(re.findall(r"'(\w+)'", found.group(1)))

    takes = {"new LivePush": names("LIVEPUSH_OPTIONS"), ".subscribe": names("SUBSCRIBE_OPTIONS"),
             "bindProgress": names("BIND_PROGRESS_OPTIONS")}
    wrong, checked = [], 0
    for page in PAGES:
        text = page.read_text()
        for call, allowed in takes.items():
            for _, key in _js_options(text, call):
                checked += 1
                if key not in allowed:
                    wrong.append(f"{page.relative_to(ROOT)}: {call}(..., {{{key}}})")
    assert checked > 10 and not wrong, (checked, wrong)
    # A page that tells a reader to pass the token to the client shows how, beside it.
    for page in PAGES:
        text = " ".join(page.read_text().split())
        for said in re.finditer(r"pass the token to the (?:JS )?client", text):
            assert "token" in {key for _, key in _js_options(text[said.end():said.end() + 80], "new LivePush")}, \
                f"{page.relative_to(ROOT)}: {text[said.start():said.end() + 80]}"


def test_every_file_of_the_repository_the_docs_name_exists() -> None:
    """A path the docs give in their text (`livepush/jobs/periodic/queries.py`, `sql/0009_periodic.sql`,
    `bin/demo`, `examples/fastapi_app/tasks.py`) is a file or folder of the repository: a reader sent
    there to see why something holds finds it, also after a module moved."""
    # What a command writes, named as its output: not in the repository until it runs.
    written = {"bench/report.json"}
    missing = []
    for page in [*PAGES, ROOT / "bench" / "README.md", *sorted((ROOT / "examples").glob("*/README.md"))]:
        text = page.read_text()
        for path in re.findall(r"(?<![\w./-])((?:livepush|sql|bench|bin|client_js|examples)/[\w./*-]*\w)", text):
            if path not in written and not list(ROOT.glob(path)):
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert not missing, missing


def _argparse_defaults(script: Path) -> dict[str, Any]:
    """Each flag a script's argparse takes (those hidden from --help aside), with its default:
    read from its source, since importing a bench script would start its work. A default written
    as a module constant (`default=MINUTES`) or a negative number is read as its value; one no
    literal gives (`os.path.join(...)`) is its source text, which no number equals."""
    tree = ast.parse(script.read_text())
    constants = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                 for target in node.targets if isinstance(target, ast.Name)}
    flags = {}
    for call in ast.walk(tree):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"
                and call.args and isinstance(call.args[0], ast.Constant) and str(call.args[0].value).startswith("--")):
            keywords = {k.arg: k.value for k in call.keywords}
            if "help" in keywords and "SUPPRESS" in ast.unparse(keywords["help"]):
                continue
            default = keywords.get("default")
            if isinstance(default, ast.Name):
                default = constants.get(default.id, default)
            try:
                flags[call.args[0].value] = None if default is None else ast.literal_eval(default)
            except ValueError:
                flags[call.args[0].value] = ast.unparse(default)
    return flags


def test_the_bench_page_gives_the_suites_and_flags_of_bin_bench_and_the_soak() -> None:
    """bench/README.md's table of suites is `bench/harness.py`'s SUITES, each with its module; the
    flags it gives `bin/bench` are the harness's; its list of `bench/soak.py`'s flags is the
    soak's, all of them, each with its default where the list gives a number; and the modules it
    names are in bench/: bench/README.md is no page the checks above read."""
    page = (ROOT / "bench" / "README.md").read_text()
    harness = ast.parse((ROOT / "bench" / "harness.py").read_text())
    suites = next(ast.literal_eval(node.value) for node in harness.body if isinstance(node, ast.Assign)
                  and any(isinstance(target, ast.Name) and target.id == "SUITES" for target in node.targets))
    table = dict(re.findall(r"^\| `(\w+)` \| `(\w+)\.py` \|", page, re.M))
    assert table == suites, f"bench/README.md's suites {table}; bench/harness.py's {suites}"

    wrong = []
    bench = _argparse_defaults(ROOT / "bench" / "harness.py")
    for line in re.findall(r"^bin/bench(.*)$", page, re.M):
        wrong += [f"bin/bench {flag}" for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", line.split("#")[0])
                  if flag not in bench]
    soak = _argparse_defaults(ROOT / "bench" / "soak.py")
    listed = re.search(r"^Flags: (.*?)\.\n", page, re.M | re.S)
    assert listed, "bench/README.md: no \"Flags: ...\" list of soak.py's flags"
    given = dict(re.findall(r"`(--[a-z-]+)(?: ([^`]*))?`", listed.group(1)))
    if set(given) != set(soak):
        wrong.append(f"soak.py's flags: the page lists {sorted(given)}, soak.py takes {sorted(soak)}")
    for flag, value in given.items():
        if re.fullmatch(r"[\d.]+", value) and flag in soak and float(value) != soak[flag]:
            wrong.append(f"soak.py {flag}: the page gives {value}, its default is {soak[flag]}")
    # Its modules, named from bench/ (`_clients.py`, `competitors/*_driver.py`): files there.
    wrong += [f"bench/{name}" for name in re.findall(r"`([\w/*]+\.py)`", page)
              if not name.startswith("bench/") and not list((ROOT / "bench").glob(name))]
    assert not wrong, wrong


def test_the_architecture_layout_names_every_module_of_each_folder_it_lists() -> None:
    """architecture.md's layout of livepush/ ("each folder is one part, each module one role")
    names every module, and every package, of each folder it lists the contents of, and none
    that is gone: a newcomer looking for where a role lives (`repeats.py`, `postgres/savepoints.py`,
    both left out of it) reads that layout first."""
    tree = re.search(r"^```\n(livepush/\n.*?)^```", (ROOT / "docs" / "architecture.md").read_text(), re.M | re.S)
    assert tree, "docs/architecture.md: no layout of livepush/"
    listed: dict[str, set[str]] = {}
    folder: str | None = None
    for line in tree.group(1).splitlines()[1:]:
        if not line.startswith(" "):  # sql/, client_js/: outside livepush/
            folder = None
            continue
        named = re.match(r"^  (\w+)/(.*)$", line)
        if named:
            folder, rest = named.groups()
        elif re.match(r"^  \w+\.py", line):  # livepush/'s own modules
            folder, rest = "", line
        else:  # a folder's line that goes on
            rest = line
        if folder is not None:
            listed.setdefault(folder, set()).update(re.findall(r"(?<![\w/])(\w+\.py|\w+/)(?=\s|$)", rest))
    wrong = []
    for name, names in listed.items():
        if not names:  # demo/: a folder described, not listed
            continue
        where = ROOT / "livepush" / name
        have = {p.name for p in where.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
        if name:
            have |= {p.name + "/" for p in where.iterdir() if (p / "__init__.py").is_file()}
        wrong += [f"livepush/{name}/{module}: not in the layout".replace("//", "/") for module in sorted(have - names)]
        wrong += [f"livepush/{name}/{module}: in the layout, not in livepush/".replace("//", "/") for module in sorted(names - have)]
    assert len(listed) > 5 and not wrong, wrong


def test_every_topic_the_examples_sign_for_a_page_expires() -> None:
    """A `sign_topic()` call in an example (what a reader copies into a page's view) passes a `ttl`:
    security.md says always to, since a signed topic without one is a capability for ever."""
    unbounded = []
    for page in PAGES:
        for line, code in blocks(page):
            for call in re.findall(r"sign_topic\(([^)]+)\)", code):
                if not re.search(r"\bttl=(?!None\b)", call):
                    unbounded.append(f"{page.relative_to(ROOT)}:{line}: sign_topic({call})")
    assert not unbounded, unbounded


def test_every_livepush_command_line_the_docs_show_parses() -> None:
    """Each `livepush ...` line of a ```sh block (a reader pastes these) is a command `livepush`
    takes, with flags it knows and values it accepts: a renamed flag or command is caught here,
    not by a reader's exit 2. Synopses with `[...]` are reference §3's, checked above."""
    import shlex

    wrong, checked = [], 0
    for page in [*PAGES, *sorted((ROOT / "examples").glob("*/README.md"))]:
        for line_no, code in blocks(page, "sh"):
            for offset, line in enumerate(code.splitlines()):
                for command in re.split(r"&&|;", line.split(" #")[0]):
                    found = re.match(r"^\s*(?:[A-Z_]+=\S*\s+)*livepush\s+(.*?)\s*&?\s*$", command)
                    if not found or re.search(r"\[|\.\.\.", found.group(1)):
                        continue
                    checked += 1
                    try:
                        build_parser().parse_args(shlex.split(found.group(1)))
                    except SystemExit:
                        wrong.append(f"{page.relative_to(ROOT)}:{line_no + offset}: livepush {found.group(1)}")
    assert checked > 15 and not wrong, wrong


def _all_flags(parser: Any) -> set[str]:
    """Every option string `parser` takes, its subcommands' included (`token session --ttl`)."""
    flags = set()
    for action in parser._actions:
        flags |= set(action.option_strings)
        if action.__class__.__name__ == "_SubParsersAction":
            for sub in action.choices.values():
                flags |= _all_flags(sub)
    return flags


def test_every_flag_the_prose_gives_a_livepush_command_is_one_it_takes() -> None:
    """A `livepush CMD ... --flag` the prose writes (`livepush status --json`, `livepush jobs
    myapp.jobs --concurrency 16`) names a flag CMD itself takes: the check of ```sh blocks
    above reads no inline code, where a flag given to the wrong command (`status --workers`)
    would only show as a reader's exit 2."""
    parsers = _parsers()
    wrong, checked = [], 0
    for page in [*PAGES, *sorted((ROOT / "examples").glob("*/README.md"))]:
        text = FENCE.sub("", page.read_text())
        for span in re.finditer(r"`livepush ([a-z]+)((?: [^`]*)?)`", text):
            command, rest = span.groups()
            if command not in parsers:  # a log line (`livepush serving on ...`), not a command
                continue
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest):
                checked += 1
                if flag not in _all_flags(parsers[command]):
                    wrong.append(f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, span.start()) + 1}: {span.group(0)}")
    assert checked > 30 and not wrong, wrong


def test_every_table_function_and_channel_the_docs_name_is_livepushs() -> None:
    """A `livepush_*` name in the docs (a table, an SQL function, a notification channel, a metric)
    is one the migrations or the code define, or a metric family /metrics serves: an operator who
    queries, grants or listens by the docs' name finds it."""
    defined = "\n".join(p.read_text() for p in [*(ROOT / "sql").glob("*.sql"), *(ROOT / "livepush").rglob("*.py")])
    served = {family.name for family in metrics.REGISTRY.collect()}
    missing = []
    for page in PAGES:
        text = page.read_text()
        aliases = set(re.findall(r"\bas (livepush_\w+)", text))  # a reader's own name in an import
        for name in set(re.findall(r"\b(livepush_\w+)", text)) - aliases:
            if re.sub(r"_(total|bucket|sum|count|created)$", "", name) in served:
                continue
            if not re.search(rf"\b{name}\b", defined):
                missing.append(f"{page.relative_to(ROOT)}: {name}")
    assert not missing, missing


def test_every_redis_key_and_channel_the_docs_name_is_one_livepush_uses() -> None:
    """A Redis key or channel in the docs (`{P}:...`, P the deployment's prefix) starts as the
    code's do, prefix in braces (an ACL written from `P:...` would match another deployment's),
    and names a key or channel of the fan-out or the revocation store."""
    from livepush.fanout.redis import RedisFanOut
    from livepush.sessions.revocations import RedisRevocations

    fanout, store = RedisFanOut("redis://localhost/0", prefix="P"), RedisRevocations("redis://localhost/0", prefix="P")
    used = [fanout.key_prefix, fanout.origin_key, f"{fanout.origin_key}:prev", fanout.channel, store.channel,
            store.session_prefix, store.subject_prefix]
    wrong = []
    for page in PAGES:
        for name in re.findall(r"`(\{?P\}?:[^`]*)`", page.read_text()):
            stem = name.rstrip("*")
            if not (name.startswith("{P}:") and (stem == "{P}:" or any(u.startswith(stem) for u in used))):
                wrong.append(f"{page.relative_to(ROOT)}: {name}")
    assert not wrong, wrong


def test_the_reference_names_everything_livepush_and_livepush_jobs_export() -> None:
    """Each name in `livepush.__all__` and `livepush.jobs.__all__` is in reference.md as code (a
    `span` or a code block): the public API has nothing the reference leaves out. A word of the
    prose is not the name: `jobs.Runtime`, in the reference nowhere, passed on "Runtime dependencies"."""
    text = (ROOT / "docs" / "reference.md").read_text()
    fenced = [match.group(2) for match in FENCE.finditer(text)]
    code = "\n".join([*fenced, *re.findall(r"`([^`]+)`", FENCE.sub("", text))])
    missing = [f"{module.__name__}.{name}" for module in (livepush, jobs) for name in module.__all__
               if not re.search(rf"\b{name}\b", code)]
    assert not missing, missing


def test_the_reference_gives_each_keyword_of_the_classes_an_application_makes_with_its_default() -> None:
    """`livepush.App`, `livepush.Allow` and `jobs.Runtime` are made by the application: reference
    writes each of their keywords `name=default`, as the code has it (the function check above
    does not look at classes; App's defaults were only in security.md). Runtime's other
    keywords are livepush's own wiring, which the reference says it keeps out of the contract."""
    import inspect

    text = " ".join((ROOT / "docs" / "reference.md").read_text().split())
    wiring = {"modules", "flush_delay", "listener", "listen", "publisher", "listen_url", "option_names"}

    def written(value: Any) -> str:
        return f"{value:g}" if isinstance(value, float) else repr(value)

    missing = []
    for cls in (livepush.App, livepush.Allow, jobs.Runtime):
        for parameter in inspect.signature(cls).parameters.values():
            if parameter.default is parameter.empty or (cls is jobs.Runtime and parameter.name in wiring):
                continue
            if f"{parameter.name}={written(parameter.default)}" not in text:
                missing.append(f"{cls.__name__}({parameter.name}={written(parameter.default)})")
    assert not missing, missing


def test_the_reference_names_every_field_of_a_job_info() -> None:
    """Reference §4's `jobs.get_job(id)` sentence names each field a `JobInfo` has (what
    `get_job()`, `list_failed()` and `list_tagged()` return): a script that reads a failed job's
    `max_attempts` or a scheduled job's `run_at` learns of them there."""
    import dataclasses

    said = re.search(r"`jobs\.get_job\(id\)` returns a `JobInfo`: (.*?)\.\n", section("docs/reference.md", "Jobs"), re.S)
    assert said, "reference §4: no \"`jobs.get_job(id)` returns a `JobInfo`: ...\" sentence"
    missing = [field.name for field in dataclasses.fields(jobs.JobInfo) if not re.search(rf"\b{field.name}\b", said.group(1))]
    assert not missing, f"reference §4's JobInfo lacks {missing}"


def test_the_reference_names_what_each_handle_has() -> None:
    """The comments of reference §4 that say what a `JobHandle`, `GroupHandle` and
    `WorkflowHandle` has name each of its public attributes and methods (an async twin by its sync
    name; `kind` is the prefix `topic` already shows): `handle.name` and `handle.sign(ttl=)` were
    left out."""
    text = (ROOT / "docs" / "reference.md").read_text()
    missing = []
    for cls in (jobs.JobHandle, jobs.GroupHandle, jobs.WorkflowHandle):
        said = re.search(rf"# {cls.__name__}: (.*)$", text, re.M)
        assert said, f"reference.md: no \"# {cls.__name__}: ...\" comment"
        names = {name for name in dir(cls) if not name.startswith("_") and name != "kind"}
        names -= {name for name in names if name.startswith("a") and name[1:] in names}  # aadd beside add
        missing += [f"{cls.__name__}.{name}" for name in sorted(names) if not re.search(rf"\b{name}\b", said.group(1))]
    assert not missing, missing


def test_the_error_trees_name_every_error_their_module_defines() -> None:
    """livepush.errors' and livepush.jobs.errors' docstrings, the trees a reader goes to for what to
    catch, name every exception class their module defines."""
    import inspect

    from livepush.jobs import errors as job_errors

    missing = [f"{module.__name__}.{name}" for module in (livepush.errors, job_errors)
               for name, value in vars(module).items()
               if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__
               and not re.search(rf"\b{name}\b", module.__doc__ or "")]
    assert not missing, missing


def test_every_function_of_the_public_api_says_what_it_does() -> None:
    """Each function `livepush`, `livepush.jobs` and `jobs.workflows` export has a docstring, an
    async twin's naming its sync one: `help(jobs.acancel)` and an editor's hover said nothing,
    where `help(jobs.aretry_failed)` said whose twin it was."""
    import inspect

    bare = [f"{module.__name__}.{name}" for module in (livepush, jobs, jobs.workflows) for name in module.__all__
            if inspect.isfunction(function := getattr(module, name)) and not inspect.getdoc(function)]
    assert not bare, bare
    # `apublish`'s "Async publish()" and `aget_job`'s "get_job() for async code" both name it.
    unnamed = [f"{module.__name__}.{name}" for module in (livepush, jobs, jobs.workflows) for name in module.__all__
               if name.startswith("a") and name[1:] in module.__all__ and inspect.isfunction(getattr(module, name))
               and f"{name[1:]}()" not in (inspect.getdoc(getattr(module, name)) or "").split("\n")[0]]
    assert not unnamed, f"async twins whose docstring's first line names no sync one: {unnamed}"


def test_every_keyword_of_the_public_functions_is_in_the_docs() -> None:
    """Each optional argument of a function `livepush` or `livepush.jobs` exports is written
    `name=` somewhere in the docs: a caller can learn of every argument the code takes."""
    import inspect

    text = "".join(page.read_text() for page in PAGES)
    missing = []
    for module in (livepush, jobs):
        for name in module.__all__:
            function = getattr(module, name)
            if not inspect.isfunction(function):
                continue
            for parameter in inspect.signature(function).parameters.values():
                if (parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
                        and parameter.default is not parameter.empty
                        and not re.search(rf"\b{parameter.name}=", text)):
                    missing.append(f"{module.__name__}.{name}({parameter.name}=)")
    assert not missing, missing


def test_the_reference_gives_every_option_of_the_job_decorator_and_of_an_enqueue() -> None:
    """`@jobs.job(...)` and `.enqueue(...)` take their options as `**options`, which no signature
    shows to the check above: reference §4 writes each of them `name=`, as the code takes them.
    `backoff=` was only in jobs.md."""
    from livepush.jobs.api import functions

    text = (ROOT / "docs" / "reference.md").read_text()
    options = functions.OPTIONS | set(functions.ENQUEUE_OPTIONS) | set(functions.REQUEST_OPTIONS)
    missing = sorted(option for option in options if not re.search(rf"\b{option}=", text))
    assert not missing, f"reference.md does not give {missing}"


def _call_arguments(text: str, start: int) -> str:
    """The top level of the arguments of the call whose `(` ends at `start`: nested brackets
    (a list, a dict, another call) left out."""
    depth, end = 1, start
    while end < len(text) and depth:
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        end += 1
    depth, top = 0, []
    for ch in text[start:end - 1]:
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        if depth == 0 and ch not in ")]}":
            top.append(ch)
    return "".join(top)


def test_every_keyword_the_docs_pass_to_a_livepush_function_is_one_it_takes() -> None:
    """A `livepush.f(name=...)` or `jobs.f(name=...)` the docs write (a reader copies it) passes
    only keywords f takes (`@jobs.job` and `@jobs.periodic` take the job options): the check
    above goes from the code to the docs; this one goes back, so a renamed keyword fails here
    rather than with a reader's TypeError."""
    import inspect

    from livepush.jobs.api import functions

    wrong, checked = [], 0
    for page in PAGES:
        text = page.read_text()
        for call in re.finditer(r"(?<![\w.])((?:livepush|jobs)(?:\.\w+)+)\(", text):
            dotted = re.sub(r"^jobs\.", "livepush.jobs.", call.group(1))
            if not _resolve(dotted):
                continue
            obj: Any = livepush
            for part in dotted.split(".")[1:]:
                obj = getattr(obj, part)
            try:
                parameters = inspect.signature(obj).parameters
            except (TypeError, ValueError):
                continue
            takes = set(parameters)
            if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
                takes |= functions.OPTIONS
            for keyword in re.findall(r"(?<![\w.=<>!])([a-z_]\w*)=(?!=)", _call_arguments(text, call.end())):
                checked += 1
                if keyword not in takes:
                    wrong.append(f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, call.start()) + 1}: "
                                 f"{dotted}({keyword}=)")
    assert checked > 100 and not wrong, (checked, wrong)


def test_each_error_the_docs_give_a_base_class_is_one() -> None:
    """Where the docs write "`SomeError` (a `ValueError`...)", SomeError is a subclass of it: code
    that catches the base, as the docs say it may, catches the error."""
    import builtins

    import livepush.contrib.starlette
    from livepush.jobs import errors as job_errors
    from starlette.exceptions import HTTPException

    homes = (livepush, livepush.errors, jobs, job_errors, livepush.contrib.starlette, builtins)

    def resolve(name: str) -> Any:
        short = name.rsplit(".", 1)[-1]
        if short == "HTTPException":
            return HTTPException
        return next((getattr(home, short) for home in homes if hasattr(home, short)), None)

    said = re.compile(r"`((?:livepush\.)?(?:jobs\.)?[A-Z]\w+)`\s+\((?:an?\s+)?`([A-Z]\w+)`(?:,\s+`([A-Z]\w+)`)?")
    wrong, checked = [], 0
    for page in PAGES:
        for claim in said.finditer(page.read_text()):
            error, *bases = claim.groups()
            for base in filter(None, bases):
                checked += 1
                cls, base_cls = resolve(error), resolve(base)
                if not (isinstance(cls, type) and isinstance(base_cls, type) and issubclass(cls, base_cls)):
                    wrong.append(f"{page.relative_to(ROOT)}: {error} is said to be a {base}")
    assert checked > 10 and not wrong, wrong


def test_every_test_the_docs_cite_exists() -> None:
    """A test function or file the docs name as the proof of a claim is in tests/."""
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    files = {p.stem for p in (ROOT / "tests").rglob("test_*.py")}
    missing = []
    for page in PAGES:
        text = page.read_text()
        for path in re.findall(r"\btests/[\w/*.]+\.py", text):
            if not list(ROOT.glob(path)):
                missing.append(f"{page.relative_to(ROOT)}: {path}")
        for name in set(re.findall(r"\b(test_\w+)", text)):
            if name not in files and not re.search(rf"def {name}\b", sources) and not name.endswith("_"):
                missing.append(f"{page.relative_to(ROOT)}: {name}")
    # jobs.md's example of a user's own test is not one of ours.
    assert missing == ["docs/jobs.md: test_signup_sends_mail"], missing


def _anchors(page: Path) -> set[str]:
    """The anchors of `page`'s headings, as GitHub makes them (`## 3. Commands` is `3-commands`)."""
    prose = FENCE.sub("", page.read_text())
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", prose, re.M)}


def test_the_docs_point_at_nothing_outside_the_repository() -> None:
    """Links are to files (and headings) of the repository; a URL names only a host that stands
    for the reader's own (example.com, localhost)."""
    wrong = []
    for page in PAGES:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path, _, anchor = target.partition("#")
            if re.match(r"\w+:", path):
                wrong.append(f"{page.relative_to(ROOT)}: links to {target}")
                continue
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                wrong.append(f"{page.relative_to(ROOT)}: {target} is no file")
            elif anchor and anchor not in _anchors(file):
                wrong.append(f"{page.relative_to(ROOT)}: {target} names no heading")
        for host in re.findall(r"\b(?:https?|wss?)://(?:[^@/\s]*@)?([\w.-]+)", text):
            if not EXAMPLE_HOSTS.match(host) and host not in ("host", "HOST"):
                wrong.append(f"{page.relative_to(ROOT)}: {host}")
    assert not wrong, wrong


def test_every_page_and_heading_the_code_and_docs_name_in_words_exists() -> None:
    """A `docs/<page>.md#<heading>` written as text, not as a link (a docstring or comment sending a
    reader to the page that explains it, `docs/architecture.md#the-connection-core`; a page
    naming another in prose or in a table), names a page and a heading it has: the link check
    above reads only links, and only the docs."""
    sources = [*PAGES, ROOT / "bench" / "README.md",
               *(p for folder in ("livepush", "tests", "bench", "client_js", "examples") for p in (ROOT / folder).rglob("*")
                 if p.suffix in (".py", ".js", ".ts", ".md", ".html") and "node_modules" not in p.parts),
               *(p for p in (ROOT / "bin").iterdir() if p.is_file())]
    wrong, checked = [], 0
    for source in sources:
        text = source.read_text()
        for named in re.finditer(r"(?<![\w/.-])((?:docs/)?[\w-]+\.md|client_js/README\.md)#([\w-]+)", text):
            path, anchor = named.groups()
            page = next((p for p in (ROOT / path, ROOT / "docs" / path, source.parent / path) if p.is_file()), None)
            checked += 1
            if page is None or anchor not in _anchors(page):
                wrong.append(f"{source.relative_to(ROOT)}:{text.count(chr(10), 0, named.start()) + 1}: {named.group(0)}")
    assert checked > 100 and not wrong, wrong


# ---- The examples a reader copies run as written ------------------------------------------------


@pytest.fixture
def docs_db(pg_url: str) -> Iterator[str]:
    """This process's settings on a fresh database, as a reader's would be."""
    with jobs_settings(pg_url):
        yield pg_url


async def test_the_readme_and_reference_publish_examples_run(docs_db: str) -> None:
    """README's "Using it" and reference §4's first block publish, sign, read offsets and issue and
    revoke a session, with every offset where the docs say it is."""
    sync_conn = psycopg.connect(docs_db)
    async_conn = await psycopg.AsyncConnection.connect(docs_db)
    try:
        for page, marker in (("README.md", "livepush.publish_many"), ("docs/reference.md", "livepush.publish_many")):
            code, where = example(page, marker)
            ns = await run(code, where, {"data": {"n": 1}, "a": {"n": 2}, "b": {"n": 3},
                                         "pairs": [("user:9", {"n": 4})],
                                         "psycopg_conn": sync_conn, "async_conn": async_conn})
            sync_conn.commit()
            await async_conn.commit()
            assert livepush.verify_topic(ns["signed"]) == "job:42"
            assert ns["since"] == livepush.latest_offset("chat:lobby")
    finally:
        sync_conn.close()
        await async_conn.close()


def test_the_quickstarts_first_commands_migrate_in_a_new_shell_after_bin_demo(pg_url: str) -> None:
    """quickstart.md's first shell block of "Your own application", pasted into a new shell in the
    livepush folder once bin/demo has run (no venv on the PATH, as a new terminal has), migrates the
    database: it does not stop at "livepush: command not found"."""
    (code,) = [code for _, code in blocks(ROOT / "docs/quickstart.md", "sh") if "livepush migrate" in code]
    code = re.sub(r"^export LIVEPUSH_DATABASE_URL=\S+", f"export LIVEPUSH_DATABASE_URL='{pg_url}'", code, flags=re.M)
    venvs = {str(Path(sys.executable).parent), str(ROOT / ".venv" / "bin")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEPUSH_") and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p not in venvs)
    shell = subprocess.run(["bash", "-e", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert shell.returncode == 0 and "schema at version" in shell.stdout, (shell.returncode, shell.stdout, shell.stderr)


async def test_the_quickstart_publishes_in_the_callers_transaction_and_renders_an_offset(docs_db: str) -> None:
    """quickstart.md's post_comment() publishes only as its transaction commits, and render_doc()
    reads the offset the page then subscribes with."""
    with psycopg.connect(docs_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE comments (doc_id int, text text)")
        ns = await run(*(example("docs/quickstart.md", "def post_comment")), {"livepush": livepush})
        ns = await run(*(example("docs/quickstart.md", "def render_doc")), ns)
        before = livepush.latest_offset("doc:5")
        ns["post_comment"](conn, 5, "first")
        rendered: dict[str, Any] = {}
        ns.update(load_comments=lambda doc_id: ["first"], template=type("T", (), {"render": staticmethod(
            lambda **kw: rendered.update(kw))}))
        ns["render_doc"](5)
    assert rendered["since"] == livepush.latest_offset("doc:5") != before
    assert livepush.verify_topic(rendered["topic"]) == "doc:5"


async def test_the_quickstarts_jobs_module_enqueues_nothing_and_its_web_process_enqueues_one(
    docs_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """quickstart.md's myapp/jobs.py, which `livepush jobs myapp.jobs` imports at every start (and
    the web process too), only defines its job: an enqueue in it would add a job at each start of
    either. The web process's enqueue is a block of its own, and enqueues one job."""

    def count() -> int:
        with psycopg.connect(docs_db) as conn:
            return conn.execute("SELECT count(*) FROM livepush_jobs WHERE name = 'myapp.jobs.import_row'").fetchone()[0]

    module = types.ModuleType("myapp.jobs")
    ns = await run(*example("docs/quickstart.md", "# myapp/jobs.py"), module.__dict__)
    assert "import_row" in ns and count() == 0
    monkeypatch.setitem(sys.modules, "myapp", types.ModuleType("myapp"))
    monkeypatch.setitem(sys.modules, "myapp.jobs", module)
    ns = await run(*example("docs/quickstart.md", "from myapp.jobs import import_row"), {})
    assert ns["handle"].signed_topic and count() == 1


async def _stub(ctx: Any, *args: Any) -> Any:
    return list(args)


@jobs.job(name="docs_examples.import_row")
async def import_row(ctx: Any, *args: Any) -> Any:
    return list(args)


@jobs.job(name="docs_examples.report")
async def report(ctx: Any, *args: Any) -> None:
    return None


@jobs.job(name="docs_examples.build_report")
async def build_report(ctx: Any, import_id: int) -> dict[str, int]:
    return {"report": import_id}


@jobs.job(name="docs_examples.resize")
def resize(ctx: Any, row: int) -> int:
    return row * 10


async def test_the_jobs_page_enqueue_examples_run(docs_db: str) -> None:
    """jobs.md's "Enqueueing" and "Enqueue options" blocks enqueue what they say, and the jobs run."""
    rows = [{"n": 1}, {"n": 2}]
    ns: dict[str, Any] = {"jobs": jobs, "import_row": import_row, "sync_search": import_row, "rows": rows,
                          "row": rows[0], "user_id": 7}
    await run(*(example("docs/jobs.md", "handle = await import_row.aenqueue")), ns)
    await run(*(example("docs/jobs.md", "key=\"import:7:row:3\"")), ns)
    assert jobs.get_job(ns["tagged"].id).tags == ("import:7", "tenant:3")
    assert jobs.get_job(ns["tagged"].id).state == "cancelled"  # by cancel_tagged
    assert await jobs.adrain() == {"succeeded": 6}  # what is due: not the waits, the debounce or the tagged one
    with pytest.raises(jobs.InvalidArgumentsError, match="rule 'required'"):
        ns["invite"].enqueue(3, {"name": "no e-mail"})


async def test_the_jobs_page_defines_its_jobs_and_they_run_as_its_comments_say(docs_db: str) -> None:
    """jobs.md's "Defining jobs", "Periodic jobs" and "Limits and paused queues" blocks, pasted into
    one module, define jobs that run: the bare `@jobs.job` takes the defaults its comment gives, the
    sync job's progress is recorded, a tick enqueued by hand runs (as "Tests" says to), and the
    queue the block pauses is running again after it."""
    module = types.ModuleType("docs_examples.jobs_page")
    for marker in ("# myapp/jobs.py", "@jobs.periodic(", "@jobs.job(concurrency="):
        await run(*example("docs/jobs.md", marker), module.__dict__)
    ns = module.__dict__
    resize = ns["resize"]
    assert (resize.queue, resize.priority, resize.max_attempts, resize.timeout) == ("default", 0, 5, 60)
    handles = [ns["import_row"].enqueue(1, {"a": 1}), ns["resize"].enqueue(3),
               ns["sweep"].enqueue("2030-01-01T12:05:00+00:00"), ns["sync_account"].enqueue("acme", 7),
               ns["call_partner_api"].enqueue({"q": 1})]
    assert await jobs.adrain() == {"succeeded": 5}
    assert jobs.get_job(handles[1].id).progress == {"done": 1, "total": 2, "message": "resizing"}
    assert jobs.get_job(handles[2].id).queue == "maintenance"
    assert jobs.resume_queue("imports") is False  # the block paused the queue, and resumed it


async def test_the_jobs_page_enqueues_in_the_callers_transaction(docs_db: str) -> None:
    """jobs.md's "In your transaction" block enqueues its job in the reader's transaction: it is
    there once the `with` block committed, and not when that block raised."""

    @jobs.job(name="docs_examples.send_receipt")
    def send_receipt(ctx: Any, order_id: int) -> None:
        return None

    def count() -> int:
        with psycopg.connect(docs_db) as conn:
            return conn.execute("SELECT count(*) FROM livepush_jobs WHERE name = 'docs_examples.send_receipt'").fetchone()[0]

    code, where = example("docs/jobs.md", "send_receipt.enqueue(order_id, conn=conn)")
    await run(code, where, {"psycopg": psycopg, "url": docs_db, "send_receipt": send_receipt,
                            "create_order": lambda conn: 1})
    assert count() == 1

    class Refused(Exception):
        pass

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise Refused

    with pytest.raises(Refused):  # the order fails after the enqueue: both are rolled back
        await run(code + "    refuse()\n", where, {"psycopg": psycopg, "url": docs_db, "send_receipt": send_receipt,
                                                    "create_order": lambda conn: 2, "refuse": refuse})
    assert count() == 1


async def test_the_jobs_page_failed_job_calls_answer_as_their_comments_say(docs_db: str) -> None:
    """jobs.md's "Retries and failures" block, run on a failed job: it is listed, run again, then
    cancelled, and each read answers as its comment says."""

    @jobs.job(name="docs_examples.fails", max_attempts=1)
    def fails(ctx: Any) -> None:
        raise ValueError("bad input")

    job_id = fails.enqueue().id
    assert await jobs.adrain() == {"failed": 1}
    code, where = example("docs/jobs.md", "jobs.list_failed(queue=None")
    # Each line's value, as the reader sees it in a console: the block is a list of calls.
    tree = ast.parse(code)
    values = [ast.unparse(node.value) for node in tree.body if isinstance(node, ast.Expr)]
    ns: dict[str, Any] = {"jobs": jobs, "job_id": job_id}
    got = [eval(value, ns) for value in values]  # noqa: S307 -- the repository's own docs
    listed, retried, discarded, cancelled, state, info = got
    assert [j.id for j in listed] == [job_id] and listed[0].error == "ValueError: bad input"
    assert (retried, discarded, cancelled) == (True, False, True)  # discard: no longer failed once retried
    assert state["state"] == info.state == "cancelled"


async def test_the_groups_page_builds_a_group_across_transactions(docs_db: str) -> None:
    """groups.md's block that builds a group over several calls adds two members (one with a key),
    seals it, and its on_finish runs once they have."""
    ns = await run(*(example("docs/groups.md", "h = jobs.create_group(")),
                   {"jobs": jobs, "report": report, "import_row": import_row, "row": {"n": 1}})
    assert await jobs.adrain() == {"succeeded": 3}  # two members and on_finish
    group = jobs.get_group(ns["h"].id)
    assert group is not None and (group["state"], group["total"]) == ("finished", 2)


@pytest.mark.parametrize("page", ["docs/quickstart.md", "docs/reference.md"])
async def test_the_rules_of_the_pages_app_allow_what_they_say(page: str) -> None:
    """The `--app` object of the quickstart and of reference §5 lets anyone follow `public:*`, and
    a session follow only the `user:` topic of its own subject."""
    from livepush.sessions import Session

    ns = await run(*(example(page, "# myapp/push.py")), {})
    app = ns["app"]
    seven = Session(id="sid", subject="7", expires_at=9e9, issued_at=1.0)
    assert await app.check(None, "public:news") is None and await app.check(seven, "public:news") is None
    assert await app.check(seven, "user:7") is None
    assert await app.check(seven, "user:8") == "forbidden" and await app.check(None, "user:7") == "forbidden"


async def test_the_groups_page_example_runs_its_callbacks(docs_db: str) -> None:
    """groups.md's first block builds, fills and seals a group whose callbacks run when it finishes."""
    ns = await run(*(example("docs/groups.md", "with jobs.group(on_finish")),
                   {"jobs": jobs, "report": report, "notify": report, "alert": report, "import_row": import_row,
                    "import_id": 7, "rows": [1, 2, 3]})
    assert await jobs.adrain() == {"succeeded": 5}  # three members, on_finish and on_success
    assert jobs.get_group(ns["g"].handle.id)["state"] == "finished"


async def test_the_groups_page_crawl_adds_members_from_inside_a_group_it_starts_in(docs_db: str) -> None:
    """groups.md's crawl, started in a group as the page shows, adds each link it finds to that
    group from inside; outside a group it would have no ctx.group to add to."""

    async def links(url: str) -> list[str]:
        return [f"{url}{n}/" for n in range(2)] if url.count("/") < 4 else []

    ns = await run(*(example("docs/groups.md", "async def crawl")),
                   {"jobs": jobs, "links": links, "__name__": "docs_examples"})
    assert await jobs.adrain() == {"succeeded": 3}  # the first page and its two links
    assert jobs.get_group(ns["g"].handle.id)["total"] == 3


async def test_the_durable_example_runs_to_its_durable_sleep(docs_db: str) -> None:
    """durable.md's import_file runs its checkpoints, parks on its child and its children, takes the
    approval sent before its wait, and parks again on its hour of durable sleep."""
    ns = await run(*(example("docs/durable.md", "async def import_file")),
                   {"fetch_rows": lambda import_id: [1, 2], "charge": lambda cents: {"cents": cents},
                    "build_report": build_report, "resize": resize})
    await jobs.adrain()
    info = jobs.get_job(ns["handle"].id)
    assert (info.state, info.waiting) == ("waiting", {"for": "sleep", "name": "cool-down"}), info
    assert jobs.cancel(ns["handle"].id)


async def test_the_workflow_example_runs_to_its_report(docs_db: str) -> None:
    """workflows.md's nightly_import fetches, fans out its rows, waits for the approval it was
    sent and reports, as the page describes."""

    async def load(source: str) -> list[int]:
        return [1, 2, 3]

    ns = await run(*(example("docs/workflows.md", "flow = jobs.workflow(")),
                   {"load": load, "import_row": import_row})
    await jobs.adrain()
    run_ = jobs.workflows.get(ns["run"].id)
    assert run_["state"] == "succeeded", run_
    assert run_["steps"]["report"]["output"] == {"by": "ana", "imported": 3}


async def test_the_reference_jobs_block_runs_as_written(docs_db: str) -> None:
    """Reference §4's jobs block runs line by line (its names for the reader's own values given),
    and its last line, which forgets a periodic job removed from the code, raises
    PeriodicNotFound as that section says for a name no tick was recorded for."""
    from datetime import datetime, timedelta, timezone

    code, where = example("docs/reference.md", "@jobs.periodic(")
    # Its periodic job stays declared for the whole process: on a queue of its own, so that a later
    # test's runtime of "default" does not find it among the jobs it would schedule.
    assert 'queue="default")' in code
    code = code.replace('queue="default")', 'queue="docs-reference-periodic")')
    *body, last = code.rstrip().splitlines()
    assert last.startswith("jobs.forget_periodic("), last
    ns = await run("\n".join(body) + "\n", where,
                   {"__name__": "docs_examples.reference_jobs", "report": report, "alert": report, "rows": [{"n": 1}],
                    "datetime_utc": datetime.now(timezone.utc) + timedelta(hours=1), "job_id": 1, "group_id": 1})
    assert ns["g"].handle.topic.startswith("group:") and ns["handle"].topic.startswith("job:")
    with pytest.raises(jobs.PeriodicNotFound, match="myapp.jobs.old_sweep"):
        await run(last + "\n", f"docs/reference.md:{int(where.split(':')[1]) + len(body)}", ns)


async def test_the_reference_durable_block_runs_as_written(docs_db: str) -> None:
    """Reference §4's durable block defines a job that runs to its durable sleep, and its calls
    signal a job, read it and fingerprint an input as their comments say."""
    waiting = build_report.enqueue(1, wait=3600)
    code, where = example("docs/reference.md", "jobs.input_fingerprint(")
    ns = await run(code.replace("def import_file", "def import_file_reference"), where,
                   {"__name__": "docs_examples", "jobs": jobs, "job_id": waiting.id, "fetch_rows": lambda import_id: [1, 2],
                    "charge": lambda cents: {"cents": cents}, "build_report": build_report, "resize": resize})
    handle = ns["import_file_reference"].enqueue(7)
    jobs.signal(handle.id, "approval", {"by": "ana"})
    await jobs.adrain()
    info = jobs.get_job(handle.id)
    assert (info.state, info.waiting) == ("waiting", {"for": "sleep", "name": "cool-down"}), info
    assert jobs.signal(waiting.id, "approval", {"by": "ana"}, key="once") == jobs.signal(waiting.id, "approval", key="once")
    assert re.fullmatch(r"[0-9a-f]{64}", jobs.input_fingerprint({"cents": 1250}))


async def test_the_reference_workflow_block_runs_its_verbs_as_written(docs_db: str) -> None:
    """Reference §4's workflow block starts a run and applies each operator verb to it in the order
    written, the cancel last, each recorded on the audit trail. Renamed, so that its steps' job
    names do not meet workflows.md's, which this process defines too."""

    async def load(source: str) -> list[int]:
        return [1, 2]

    code, where = example("docs/reference.md", "flow = jobs.workflow(")
    ns = await run(code.replace('"nightly_import"', '"nightly_import_reference"'), where,
                   {"jobs": jobs, "load": load, "import_row": import_row})
    run_ = jobs.workflows.get(ns["run"].id)
    assert run_["state"] == "cancelled", run_
    assert [entry["verb"] for entry in run_["audit"]][-1] == "cancel", run_["audit"]


# Each default reference §3 states: how --help says it, and how the reference does.
DEFAULTS = [
    ("jobs", "--concurrency", "default 10", "default 10"),
    ("jobs", "--shutdown-timeout", "default 30", "default 30"),
    ("jobs", "--heartbeat", "default 10", "default 10"),
    ("jobs", "--poll-interval", "default 1", "default 1"),
    ("jobs", "--retention", "default 604800", "default 604800"),
    ("serve", "--drain-seconds", "default 0", "`0` (the default)"),
    ("serve", "--workers", "default 1", "`1` (the default)"),
    ("status", "--limit", "default 20", "default 20"),
    ("migrate", "--lock-timeout", "default: the role's lock_timeout, else 5", "when one is set, else 5 s"),
    ("token", "--ttl", "86400 for a session", "a day (86400 s)"),
    ("token", "--ttl", "LIVEPUSH_SIGNED_TOPIC_TTL for a topic", "a signed topic `LIVEPUSH_SIGNED_TOPIC_TTL`"),
]


@pytest.mark.parametrize("command,flag,in_help,in_reference", DEFAULTS)
def test_each_commands_help_gives_the_defaults_the_reference_gives(command: str, flag: str, in_help: str,
                                                                   in_reference: str) -> None:
    """`livepush CMD --help` and reference §3 say the same default for each flag."""
    commands = " ".join(section("docs/reference.md", "3. Commands").split())
    assert in_reference in commands, f"reference §3 does not say {flag}'s default: {in_reference}"
    action = next(a for a in _parsers()[command]._actions if flag in a.option_strings)
    assert in_help in " ".join((action.help or "").split()), f"livepush {command} --help: {flag}: {action.help!r}"


def test_each_commands_usage_names_its_values_as_the_reference_does() -> None:
    """Where reference §3 writes a flag's value (`--concurrency N`, `--ttl S`) or a command's
    arguments (`livepush publish TOPIC JSON`), `livepush CMD --help` writes the same words."""
    commands = section("docs/reference.md", "3. Commands")
    parsers = _parsers()
    for synopsis in re.findall(r"`livepush ((?:jobs|serve|status|migrate|publish|token) [^`]*)`", commands):
        name, *words = synopsis.split()
        usage = " ".join(parsers[name].format_usage().split())
        for flag, value in re.findall(r"\[(--[a-z-]+) ([A-Z][A-Z:]*)\]", synopsis):
            assert f"{flag} {value}" in usage, f"reference: `{flag} {value}`; livepush {name} --help: {usage}"
        for word in words:
            if word.isupper() and word.isalpha():  # a positional argument: TOPIC, JSON, SUBJECT
                assert re.search(rf"(?<![-\w]){word}\b", usage), f"reference: `{synopsis}`; --help: {usage}"


# The flags reference §3 gives a variable for: their --help names it too.
VARIABLES = [("serve", "--drain-seconds", "LIVEPUSH_DRAIN_SECONDS"), ("serve", "--workers", "LIVEPUSH_WORKERS"),
             ("serve", "--host", "LIVEPUSH_HOST"), ("serve", "--port", "LIVEPUSH_PORT"),
             ("migrate", "--lock-timeout", "LIVEPUSH_MIGRATE_LOCK_TIMEOUT")]


@pytest.mark.parametrize("command,flag,variable", VARIABLES)
def test_a_flag_with_a_variable_names_it_in_help(command: str, flag: str, variable: str) -> None:
    """`livepush CMD --help` says which variable a flag stands in for, as the reference does."""
    assert variable in section("docs/reference.md", "3. Commands") + section("README.md", "Configuration")
    action = next(a for a in _parsers()[command]._actions if flag in a.option_strings)
    assert variable in (action.help or ""), f"livepush {command} --help: {flag}: {action.help!r}"


def test_each_command_has_help_for_each_of_its_arguments() -> None:
    """Every argument of every command says what it is in `livepush CMD --help`."""
    bare = [f"{name} {a.dest}" for name, parser in _parsers().items() for a in parser._actions if not a.help]
    assert not bare, bare


def test_the_reference_lists_exactly_the_runtime_dependencies() -> None:
    """Reference §1's table of runtime dependencies names what pyproject.toml requires, no more."""
    import tomllib

    table = section("docs/reference.md", "1. Layout")
    listed = {name.lower() for row in re.findall(r"^\| (`[^|]*)\|", table, re.M) for name in re.findall(r"`([\w-]+)`", row)}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    required = {re.match(r"[\w-]+", spec).group(0).lower() for spec in project}  # type: ignore[union-attr]
    assert listed == required, listed ^ required
