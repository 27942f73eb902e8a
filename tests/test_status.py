"""`livepush status` and `jobs.status()`: queues, runtimes, groups and workflow runs in progress,
as the database shows them, in a report for people and as JSON; an unreachable database or a bad
argument gives one line and the exit status of every command."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from livepush import jobs, migrate
from livepush.cli.status import render
from livepush.errors import DependencyError, SchemaBusyError
from livepush.jobs.api.status import GroupStatus, PeriodicStatus, QueueStatus, RuntimeStatus, Status, WorkflowStatus
from livepush.migrate import MIGRATION_LOCK_KEY
from tests.support import services
from tests.support.procs import Processes
from tests.support.redis_acl import documented_user
from tests.support.settings import jobs_settings
from tests.support.waiting import wait_for

# The jobs and the workflow the report describes: defined at import, as a user's module would.


@jobs.job(name="status.ok", queue="status_a")
async def ok(ctx: Any, n: int) -> None:
    return None


@jobs.job(name="status.fails", queue="status_work", max_attempts=1)
async def fails(ctx: Any) -> None:
    raise ValueError("fails on purpose")


@jobs.job(name="status.parked", queue="status_work")
async def parked(ctx: Any) -> None:
    await ctx.wait_for_signal("go", timeout=3600)


flow = jobs.workflow("status_flow", queue="status_work")


@flow.step()
async def fetch(ctx: Any) -> Any:
    return {"rows": 3}


@flow.step(after=["fetch"], wait_for="approval", wait_timeout=3600, on_timeout="cancel")
async def report(ctx: Any) -> Any:
    return "reported"


@flow.step(after=["report"])
async def publish(ctx: Any) -> Any:
    return "published"


@jobs.job(name="status.per_tenant", queue="status_limits", concurrency=("tenant", 1))
async def per_tenant(ctx: Any, tenant: str) -> None:
    return None


@jobs.job(name="status.rated", queue="status_limits", rate="1/m")
async def rated(ctx: Any, n: int) -> None:
    return None


def q(url: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


@pytest.fixture
def status_db(pg_url: str) -> Iterator[str]:
    """A fresh database as the jobs' (this process enqueues and drains there), on a Postgres up
    for longer than three beats of the stalled runtimes below (one a second): no beat can land
    while Postgres is down, so a runtime is overdue only once Postgres has run for three of its
    beats, and the suite's own may have started a moment ago (the tests here then saw no runtime
    overdue when they ran first)."""
    wait_for(lambda: q(pg_url, "SELECT pg_postmaster_start_time() < now() - interval '3.5 seconds'")[0][0], 10.0,
             message="Postgres up for more than three beats of a second")
    with jobs_settings(pg_url):
        yield pg_url


@pytest.fixture
def busy_db(status_db: str) -> dict[str, Any]:
    """Jobs in every state, an open and a sealed group, a workflow run whose second step waits for a
    signal, a runtime holding a job and one that stopped beating. Returns the ids."""
    url = status_db
    fails.enqueue()
    parked.enqueue()
    run = flow.start({"source": "test"})
    # Runs the failing job (failed), parks the durable one (waiting), runs `fetch` and parks `report`.
    jobs.drain(["status_work"])

    first = ok.enqueue(1, tags=["import:7"])
    held = ok.enqueue(2, tags=["import:7", "vip"])
    ok.enqueue(3, wait=3600, tags=["import:7"])
    q(url, "UPDATE livepush_jobs SET run_at = now() - interval '90 seconds' WHERE id = %s", (first.id,))
    open_group = jobs.create_group()
    with jobs.group() as g:
        for n in (10, 11, 12):
            g.enqueue(ok, n)

    live = q(url, """INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat)
                     VALUES ('status-host', 4242, '{status_a}', 4, 10) RETURNING id""")[0][0]
    q(url, """UPDATE livepush_jobs SET state = 'running', attempt = 1, runtime_id = %s, lease = 7
              WHERE id = %s""", (live, held.id))
    stalled = q(url, """INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat, state,
                                                         heartbeat_at)
                        VALUES ('stalled-host', 4343, '{status_b}', 2, 1, 'draining', now() - interval '30 seconds')
                        RETURNING id""")[0][0]
    return {"url": url, "run": run.id, "open_group": open_group.id, "sealed_group": g.handle.id,
            "live": live, "stalled": stalled}


def run_status(procs: Processes, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    child = procs.livepush("status", *args, env=env)
    code = child.wait(30)
    return code, child.stdout(), child.stderr()


def test_the_report_names_each_queue_runtime_group_and_workflow(
        busy_db: dict[str, Any], procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """The plain report has a section for each part, names what is in it, and says how a server
    is asked whether it is ready."""
    code, out, err = run_status(procs, livepush_env(database_url=busy_db["url"]))
    assert code == 0, err
    assert "Traceback" not in err
    for needle in ("Queues (3)", "status_a", "status_b", "status_work",
                   "Runtimes (2)", "status-host", "stalled-host", "draining", "OVERDUE", "1/4",
                   "Groups in progress (2)", "sealed", "open",
                   "Workflows in progress (1)", "status_flow", "waiting",
                   "fetch:succeeded report:waiting publish:pending",
                   "Tags on unfinished jobs (2)", "import:7",
                   "Servers listening (0)", "GET /readyz"):
        assert needle in out, f"{needle!r} not in:\n{out}"
    lines = out.splitlines()
    group_lines = _section(lines, "Groups in progress")
    assert [line.split()[0] for line in group_lines[1:]] == [str(busy_db["sealed_group"]), str(busy_db["open_group"])]
    queue_lines = {line.split()[0]: line.split() for line in _section(lines, "Queues")[1:]}
    # QUEUE STATE DEPTH OLDEST HELD SCHEDULED RUNNING WAITING FAILED
    assert queue_lines["status_a"][1:3] == ["active", "4"] and queue_lines["status_a"][4:] == ["0", "1", "1", "0", "0"]
    assert queue_lines["status_work"][1:] == ["active", "0", "-", "0", "0", "0", "2", "1"]
    assert queue_lines["status_b"][1:] == ["active", "0", "-", "0", "0", "0", "0", "0"]


def _section(lines: list[str], title: str) -> list[str]:
    """The lines of a report section (its table's header first), up to the blank line after it."""
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    end = lines.index("", start)
    return [line for line in lines[start + 1:end]]


def test_json_has_the_figures(busy_db: dict[str, Any], procs: Processes,
                              livepush_env: Callable[..., dict[str, str]]) -> None:
    """--json prints one document with the same data: counts per queue, each runtime, the groups
    and runs in progress with their counts, and the servers listening (none here)."""
    code, out, err = run_status(procs, livepush_env(database_url=busy_db["url"]), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) == {"at", "queues", "runtimes", "groups", "groups_in_progress", "workflows",
                        "workflows_in_progress", "limit", "servers", "tags", "tags_carried", "periodic"}
    assert doc["periodic"] == []
    assert doc["tags"] == {"import:7": 3, "vip": 1} and doc["tags_carried"] == 2
    assert doc["servers"] == []
    queues = {qu["queue"]: qu for qu in doc["queues"]}
    assert {k: v for k, v in queues["status_a"].items() if k != "oldest_age"} == {
        "queue": "status_a", "paused": False, "depth": 4, "held": 0, "scheduled": 1, "running": 1, "waiting": 0,
        "failed": 0}
    assert 90 <= queues["status_a"]["oldest_age"] < 120
    assert queues["status_work"] == {"queue": "status_work", "paused": False, "depth": 0, "oldest_age": None, "held": 0,
                                     "scheduled": 0, "running": 0, "waiting": 2, "failed": 1}
    assert queues["status_b"]["depth"] == 0

    runtimes = {r["id"]: r for r in doc["runtimes"]}
    live, stalled = runtimes[busy_db["live"]], runtimes[busy_db["stalled"]]
    assert (live["host"], live["pid"], live["queues"], live["concurrency"], live["state"], live["in_hand"],
            live["overdue"]) == ("status-host", 4242, ["status_a"], 4, "running", 1, False)
    assert live["since_heartbeat"] < 10
    assert (stalled["state"], stalled["in_hand"], stalled["overdue"]) == ("draining", 0, True)
    assert stalled["since_heartbeat"] >= 30

    assert doc["groups_in_progress"] == 2 and doc["limit"] == 20
    sealed, opened = doc["groups"]
    assert (sealed["id"], sealed["state"], sealed["total"], sealed["pending"], sealed["succeeded"],
            sealed["failed"], sealed["cancelled"]) == (busy_db["sealed_group"], "sealed", 3, 3, 0, 0, 0)
    assert (opened["id"], opened["state"], opened["total"]) == (busy_db["open_group"], "open", 0)
    assert sealed["created_at"].endswith("+00:00")

    assert doc["workflows_in_progress"] == 1
    (run,) = doc["workflows"]
    assert (run["id"], run["name"], run["state"]) == (busy_db["run"], "status_flow", "waiting")
    assert run["steps"] == {"fetch": "succeeded", "report": "waiting", "publish": "pending"}
    assert list(run["steps"]) == ["fetch", "report", "publish"]


def test_limit_shows_the_newest_and_counts_all(busy_db: dict[str, Any], procs: Processes,
                                               livepush_env: Callable[..., dict[str, str]]) -> None:
    """--limit N shows the newest N groups and runs; the count is of all of them."""
    code, out, err = run_status(procs, livepush_env(database_url=busy_db["url"]), "--limit", "1")
    assert code == 0, err
    assert "Groups in progress (2, newest 1 shown)" in out
    group_lines = _section(out.splitlines(), "Groups in progress")
    assert [line.split()[0] for line in group_lines[1:]] == [str(busy_db["sealed_group"])]


def test_tags_past_the_limit_are_counted_in_the_title(status_db: str, procs: Processes,
                                                     livepush_env: Callable[..., dict[str, str]]) -> None:
    """With more distinct tags than --limit shows, the section's title counts them all and says how
    many of the most carried it shows, as the groups' title does: never the shown rows as the total."""
    jobs.enqueue_many([(ok, [n], {"tags": [f"batch:{n}"] + ["common"] * (n % 2), "wait": 3600})
                       for n in range(25)])
    code, out, err = run_status(procs, livepush_env(database_url=status_db), "--limit", "5")
    assert code == 0, err
    assert "Tags on unfinished jobs (26, most carried 5 shown)" in out, out
    tag_lines = _section(out.splitlines(), "Tags on unfinished jobs")
    assert len(tag_lines) == 1 + 5 and tag_lines[1].split() == ["common", "12"], out
    got = jobs.status(limit=5)
    assert (len(got.tags), got.tags_carried) == (5, 26)
    assert jobs.status().tags_carried == 26


def test_each_periodic_job_is_shown_with_its_last_tick_and_its_age(
        status_db: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """A periodic job whose last tick keeps ageing past its period is one no runtime schedules: the
    report lists every periodic job with its newest tick and how long ago that was."""
    q(status_db, """INSERT INTO livepush_periodic (name, last_tick) VALUES
                    ('reports.nightly', date_trunc('second', now()) - interval '3 hours'),
                    ('cleanup.sweep', date_trunc('second', now()) - interval '5 minutes')""")
    code, out, err = run_status(procs, livepush_env(database_url=status_db))
    assert code == 0, err
    lines = _section(out.splitlines(), "Periodic jobs (2)")
    assert lines[0].split() == ["NAME", "LAST", "TICK", "AGE"]
    rows = [line.split() for line in lines[1:]]
    assert [r[0] for r in rows] == ["cleanup.sweep", "reports.nightly"]
    assert rows[0][2].startswith("5m") and rows[1][2].startswith("3h0"), out
    assert rows[1][1].endswith("+00:00")
    code, out, err = run_status(procs, livepush_env(database_url=status_db), "--json")
    assert code == 0, err
    (sweep, nightly) = json.loads(out)["periodic"]
    assert (sweep["name"], nightly["name"]) == ("cleanup.sweep", "reports.nightly")
    assert 300 <= sweep["since_last_tick"] < 400 and 3 * 3600 <= nightly["since_last_tick"] < 3 * 3600 + 100
    assert datetime.fromisoformat(nightly["last_tick"]).utcoffset() == timedelta(0)
    assert [p.name for p in jobs.status().periodic] == ["cleanup.sweep", "reports.nightly"]


def test_the_python_api_returns_the_same_data(busy_db: dict[str, Any]) -> None:
    """jobs.status() and jobs.astatus() return the report's data; a bad limit is refused."""
    got = jobs.status(limit=1)
    assert isinstance(got, jobs.Status)
    assert (got.groups_in_progress, [g.id for g in got.groups]) == (2, [busy_db["sealed_group"]])
    assert got.workflows[0].summary == "fetch:succeeded report:waiting publish:pending"
    again = asyncio.run(jobs.astatus())
    assert [qu.queue for qu in again.queues] == ["status_a", "status_b", "status_work"]
    for bad in (0, 1001):
        with pytest.raises(ValueError, match="limit"):
            jobs.status(limit=bad)
    for wrong in ("5", True, 5.0):  # a mistake of type is a TypeError, as the reference's rule says
        with pytest.raises(TypeError, match="limit"):
            jobs.status(limit=wrong)  # type: ignore[arg-type]


def test_an_empty_database_says_none_in_each_section(pg_url: str, procs: Processes,
                                                      livepush_env: Callable[..., dict[str, str]]) -> None:
    code, out, err = run_status(procs, livepush_env(database_url=pg_url))
    assert code == 0, err
    for title in ("Queues (0)", "Runtimes (0)", "Groups in progress (0)", "Workflows in progress (0)",
                  "Periodic jobs (0)"):
        assert _section(out.splitlines(), title) == ["  none"], out
    code, out, err = run_status(procs, livepush_env(database_url=pg_url), "--json")
    assert code == 0, err
    assert json.loads(out)["queues"] == []


def test_tags_and_queue_names_cannot_write_control_characters_to_the_terminal(
        status_db: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """Tags and queue names are the application's data (a tag may carry a user's file name): the
    plain report shows their control characters escaped, so that none can forge a line of the
    report or send an escape sequence to the operator's terminal; --json keeps them as they are."""
    forged = "x\nRuntimes (0)\n  none"
    ok.enqueue(1, wait=3600, tags=[forged, "\x1b[2J\x1b[31mred"])
    # A carriage return inside the name (at its end, a queue name is refused: --queues strips it).
    jobs.pause_queue("q\x1b]0;title\x07\rq")
    code, out, err = run_status(procs, livepush_env(database_url=status_db))
    assert code == 0, err
    assert not any(c in out for c in "\x1b\x07\r"), repr(out)
    assert [line for line in out.splitlines() if line.startswith("Runtimes (")] == ["Runtimes (0)"], out
    tag_lines = _section(out.splitlines(), "Tags on unfinished jobs")
    assert any(line.split()[0] == "x\\nRuntimes" for line in tag_lines), out
    assert any(line.split()[0] == "\\x1b[2J\\x1b[31mred" for line in tag_lines), out
    code, out, err = run_status(procs, livepush_env(database_url=status_db), "--json")
    assert code == 0, err
    assert json.loads(out)["tags"] == {forged: 1, "\x1b[2J\x1b[31mred": 1}


def test_a_schema_behind_or_out_of_the_search_path_is_named_as_serve_and_jobs_name_it(
        pg_url: str, pg_admin_url: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """A database whose livepush schema is one migration behind, or in a schema the role's
    search_path misses, exits 2 with the line serve and jobs give (the version it is at; the
    schema and how to reach it), not "lacks livepush's schema: run `livepush migrate`", which
    for the second sends the operator to a migrate that cannot help."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # As before the periodic jobs' migration, 0009, ran.
        conn.execute("DELETE FROM livepush_schema WHERE version = 9")
        conn.execute("DROP TABLE livepush_periodic")
    code, out, err = run_status(procs, livepush_env(database_url=pg_url))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"schema is at version 8 but livepush status needs {migrate.required_version()}" in err, err

    with services.pg_migrated_into_schema_app(pg_admin_url) as (url, _):
        code, out, err = run_status(procs, livepush_env(database_url=url))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert 'has livepush\'s schema in schema "app"' in err and "search_path" in err, err


def test_an_unreachable_database_exits_1_with_one_line(procs: Processes, free_port: int,
                                                       livepush_env: Callable[..., dict[str, str]]) -> None:
    url = f"postgresql://postgres:hunter2secret@127.0.0.1:{free_port}/nowhere"
    code, out, err = run_status(procs, livepush_env(database_url=url))
    assert code == 1
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "cannot reach Postgres" in err and "LIVEPUSH_DATABASE_URL" in err
    assert "Traceback" not in err and "hunter2secret" not in err


def test_an_unreachable_database_read_from_database_url_is_named_so(
        procs: Processes, free_port: int, livepush_env: Callable[..., dict[str, str]]) -> None:
    """Read from DATABASE_URL (LIVEPUSH_DATABASE_URL unset), the URL is named by that variable:
    told to check LIVEPUSH_DATABASE_URL, which is not set, the operator looks in the wrong place."""
    env = livepush_env()
    env.pop("LIVEPUSH_DATABASE_URL", None)
    env["DATABASE_URL"] = f"postgresql://postgres@127.0.0.1:{free_port}/nowhere"
    code, out, err = run_status(procs, env)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "cannot reach Postgres" in err and "check DATABASE_URL" in err, err


def test_a_migration_holding_the_schema_makes_status_give_up_with_exit_75_saying_to_try_again(
        status_db: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """While `livepush migrate` holds its locks (its advisory lock, and a table its DDL alters),
    `livepush status` gives up within its lock timeout with exit 75 and one line saying that a
    schema change holds the tables and to try again, instead of waiting for as long as the
    migration runs; `jobs.status()` and `astatus()` raise SchemaBusyError, a DependencyError, saying
    the same."""
    with psycopg.connect(status_db) as migrating:
        migrating.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        migrating.execute("LOCK TABLE livepush_jobs IN ACCESS EXCLUSIVE MODE")  # what an ALTER TABLE takes
        code, out, err = run_status(procs, livepush_env(database_url=status_db))
        with pytest.raises(SchemaBusyError, match="try again") as raised:
            jobs.status()
        with pytest.raises(SchemaBusyError, match="try again"):
            asyncio.run(jobs.astatus())
        migrating.rollback()
    assert code == 75, err
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert "livepush migrate" in err and "try again" in err and "Traceback" not in err
    assert isinstance(raised.value, DependencyError)
    code, _, err = run_status(procs, livepush_env(database_url=status_db))
    assert code == 0, err


@pytest.mark.parametrize("argv,needle", [
    (["--limit", "0"], "--limit"),
    (["--limit", "many"], "--limit"),
    (["--jsn"], "unrecognized"),
])
def test_bad_usage_exits_2(procs: Processes, livepush_env: Callable[..., dict[str, str]], argv: list[str],
                           needle: str) -> None:
    code, _, err = run_status(procs, livepush_env(database_url="postgresql://postgres@127.0.0.1:1/x"), *argv)
    assert code == 2
    assert needle in err and "Traceback" not in err


def test_without_a_database_url_exits_2_naming_the_setting(procs: Processes,
                                                           livepush_env: Callable[..., dict[str, str]]) -> None:
    code, _, err = run_status(procs, livepush_env())
    assert code == 2
    assert "LIVEPUSH_DATABASE_URL" in err and "Traceback" not in err


def test_servers_listening_on_the_database_and_on_redis_are_listed(
        pg_url: str, redis_url: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """A server on the Redis fan-out with a database holds one listener on each: both are listed."""
    env = livepush_env(database_url=pg_url, redis_url=redis_url, fanout="redis")
    procs.livepush("serve", env=env)
    code, out, err = run_status(procs, env, "--json")
    assert code == 0, err
    servers = json.loads(out)["servers"]
    assert sorted(s["via"] for s in servers) == ["postgres", "redis"], servers
    assert all(s["address"] == "127.0.0.1" for s in servers), servers
    code, out, err = run_status(procs, env)
    assert code == 0 and "Servers listening (2)" in out, out + err


def test_a_servers_since_is_an_iso_instant_like_every_other_time_in_the_json(
        pg_url: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """A script reads every time of `--json` one way: the server's `since` is ISO 8601 in UTC,
    as the report's `at` and a runtime's `started_at` are, not Python's str() of a datetime."""
    env = livepush_env(database_url=pg_url, fanout="postgres")
    procs.livepush("serve", env=env)
    code, out, err = run_status(procs, env, "--json")
    assert code == 0, err
    report = json.loads(out)
    [server] = report["servers"]
    since = datetime.fromisoformat(server["since"])
    assert server["since"] == since.isoformat() and since.utcoffset() == timedelta(0), server
    assert since <= datetime.fromisoformat(report["at"]), report


def test_a_server_listening_on_redis_has_its_since_as_an_iso_instant_too(
        pg_url: str, redis_url: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """Every server of `--json` says since when it listens the same way, on the database as on
    Redis: a script that reads each one's `since` does not fail on the Redis fan-out's listeners."""
    env = livepush_env(database_url=pg_url, redis_url=redis_url, fanout="redis")
    procs.livepush("serve", env=env)
    code, out, err = run_status(procs, env, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert sorted(s["via"] for s in report["servers"]) == ["postgres", "redis"], report["servers"]
    at = datetime.fromisoformat(report["at"])
    for server in report["servers"]:
        since = datetime.fromisoformat(server["since"])
        assert server["since"] == since.isoformat() and since.utcoffset() == timedelta(0), server
        assert at - timedelta(minutes=5) <= since <= at + timedelta(seconds=1), (server, report["at"])


def test_servers_of_another_deployment_on_the_same_redis_are_not_listed(
        pg_url: str, redis_url: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """A server of another deployment on the same Redis (its own LIVEPUSH_REDIS_PREFIX) is not one of ours: our report lists only ours."""
    theirs = livepush_env(redis_url=redis_url, fanout="redis") | {"LIVEPUSH_REDIS_PREFIX": "other"}
    procs.livepush("serve", env=theirs)
    ours = livepush_env(database_url=pg_url, redis_url=redis_url, fanout="redis")
    code, out, err = run_status(procs, ours, "--json")
    assert code == 0, err
    assert json.loads(out)["servers"] == [], "another deployment's server is listed as ours"
    procs.livepush("serve", env=ours)
    code, out, err = run_status(procs, ours, "--json")
    assert code == 0, err
    assert sorted(s["via"] for s in json.loads(out)["servers"]) == ["postgres", "redis"], out


def test_the_report_is_printed_as_the_redis_user_the_docs_show(
        pg_url: str, redis_url: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """As the Redis user docs/security.md shows (which may not list Redis' clients), status exits 0 with the report and the servers on the database, and says on stderr that it could not list those on Redis."""
    with documented_user(redis_url, "livepush:0") as as_app:
        env = livepush_env(database_url=pg_url, redis_url=as_app, fanout="redis")
        procs.livepush("serve", env=env)
        code, out, err = run_status(procs, env, "--json")
        assert code == 0, err
        assert [s["via"] for s in json.loads(out)["servers"]] == ["postgres"], out
        assert "Traceback" not in err and "CLIENT LIST" in err, err


def test_the_report_is_printed_when_redis_is_down(pg_url: str, procs: Processes,
                                                   livepush_env: Callable[..., dict[str, str]]) -> None:
    """With Redis down, status still prints the jobs' report and the servers on the database, says
    on stderr that those on Redis are missing, and exits 1 (a dependency failed)."""
    import socket

    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    env = livepush_env(database_url=pg_url, redis_url=f"redis://127.0.0.1:{closed}/0", fanout="postgres")
    code, out, err = run_status(procs, env, "--json")
    assert code == 1, err
    assert json.loads(out)["queues"] == [] and "Traceback" not in err and "Redis" in err, err


@pytest.mark.parametrize("as_json", [False, True])
def test_a_redis_refusing_the_urls_password_exits_2_after_the_report(
        pg_url: str, redis_url: str, procs: Processes, livepush_env: Callable[..., dict[str, str]],
        as_json: bool) -> None:
    """A Redis URL whose password Redis refuses was taken for Redis down: the report, then exit 1,
    which a monitoring script reads as "retry later", though nothing will change until the setting
    is corrected. The report is printed all the same, then one line names LIVEPUSH_REDIS_URL, never
    the password, and status exits 2 (bad configuration), as a refused Postgres login does."""
    wrong = redis_url.replace("redis://", "redis://nobody:wrong-pw@", 1)
    env = livepush_env(database_url=pg_url, redis_url=wrong, fanout="postgres")
    code, out, err = run_status(procs, env, *(["--json"] if as_json else []))
    assert code == 2, err
    assert (json.loads(out)["queues"] == []) if as_json else ("Queues (0)" in out), out
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "LIVEPUSH_REDIS_URL" in err and "refused the user or password" in err, err
    assert "wrong-pw" not in out + err, out + err


def test_listing_the_servers_on_a_redis_that_answers_nothing_gives_up_within_its_bound(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Redis that takes connections and answers nothing (a hung server, a network dropping
    packets) made `livepush status` wait for ever under redis-py 5 to 7, whose clients have no
    read timeout by default (8's wait 5 s): the client listing the servers had none of its own.
    It has, whatever redis-py's default: the call raises DependencyError saying Redis did not
    answer in time, which status prints beside the jobs' report (exit 1)."""
    from redis import Redis

    from livepush.redis import subscriber
    from tests.support.services import redis_frozen

    made = Redis.from_url.__func__  # type: ignore[attr-defined]

    def as_before_8(cls: type[Redis], url: str, **kwargs: Any) -> Redis:
        kwargs.setdefault("socket_timeout", None)  # redis-py 5-7's default: no limit
        return made(cls, url, **kwargs)

    monkeypatch.setattr(Redis, "from_url", classmethod(as_before_8))
    # Redis is continued before the pool waits for its thread: that ends a call left hanging.
    with concurrent.futures.ThreadPoolExecutor(1) as pool, redis_frozen(redis_url):
        call = pool.submit(subscriber.subscribed_clients, redis_url, "livepush-listener")
        try:
            error = call.exception(timeout=15)  # the bound, 5 s, and a margin
        except TimeoutError:
            pytest.fail("listing the servers on a Redis that answers nothing did not give up within 15 s")
    assert isinstance(error, DependencyError), error
    assert "did not answer in time" in str(error), error


def test_a_runtime_silent_only_while_the_database_was_down_is_neither_overdue_nor_dead(status_db: str) -> None:
    """A beat cannot land while Postgres is down: a runtime whose last beat came before the
    server (re)started is no more overdue than the pruning of dead runtimes takes it to be, until
    three of its beats have passed since the start. status() and the runtimes-alive gauge used to
    call every runtime overdue (and none alive) after any outage longer than three beats, which
    fired the "no runtime" alert for runtimes that were fine."""
    from livepush import metrics
    from livepush.jobs.api.status import arefresh_metrics, status

    waited = q(status_db, """INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat, heartbeat_at)
                             VALUES ('outage-host', 4444, '{status_a}', 2, 3600,
                                     pg_postmaster_start_time() - interval '4 hours') RETURNING id""")[0][0]
    stalled = q(status_db, """INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat, heartbeat_at)
                              VALUES ('stalled-host', 4545, '{status_a}', 2, 1, now() - interval '30 seconds')
                              RETURNING id""")[0][0]
    runtimes = {r.id: r for r in status().runtimes}
    assert runtimes[waited].overdue is False
    assert runtimes[stalled].overdue is True
    asyncio.run(arefresh_metrics())
    assert metrics.DATABASE_GAUGES.runtimes_alive == 1


def test_jobs_their_limits_hold_back_are_counted_apart_from_the_backlog(status_db: str) -> None:
    """Jobs that `concurrency=` or `rate=` hold back on purpose are no backlog: adding runtimes
    would not start them. The queue's depth and oldest age (and their gauges, which the backlog
    alert reads) count only the jobs a runtime could start now; the held ones are counted apart,
    in `held` and `livepush_queue_held`. Counted as backlog, a tenant's queue of jobs waiting for
    its one slot fired the backlog alert and told the operator to add runtimes."""
    from livepush import metrics
    from livepush.jobs.api.status import arefresh_metrics, status

    url = status_db
    runtime = q(url, """INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat)
                        VALUES ('limits-host', 4646, '{status_limits}', 4, 10) RETURNING id""")[0][0]
    # Each function's limits, as a runtime that defines it writes them as it starts: one slot per
    # tenant, and a bucket holding one token (at one a minute, it holds one for the whole test).
    q(url, """INSERT INTO livepush_job_limits (name, max_running, key_param) VALUES ('status.per_tenant', 1, 'tenant')""")
    q(url, """INSERT INTO livepush_job_limits (name, rate, burst, tokens, refilled_at)
              VALUES ('status.rated', 1.0 / 60, 2, 1.2, now())""")
    acme = [per_tenant.enqueue("acme") for _ in range(3)]
    per_tenant.enqueue("globex")  # its tenant's slot is free: a runtime could start it now
    for n in range(3):
        rated.enqueue(n)  # the bucket's one token starts the first; the other two wait for tokens
    q(url, "UPDATE livepush_jobs SET state = 'running', attempt = 1, runtime_id = %s, lease = 7 WHERE id = %s",
      (runtime, acme[0].id))
    # acme's two waiting jobs, held for its slot, have waited ten minutes.
    q(url, "UPDATE livepush_jobs SET run_at = now() - interval '10 minutes' WHERE id = ANY(%s)",
      ([h.id for h in acme[1:]],))
    assert q(url, "SELECT count(*) FROM livepush_jobs WHERE limited AND state = 'available'")[0][0] == 6

    (queue,) = [queue for queue in status().queues if queue.queue == "status_limits"]
    assert (queue.depth, queue.held, queue.running) == (2, 4, 1), queue
    assert queue.oldest_age is not None and queue.oldest_age < 60, queue

    asyncio.run(arefresh_metrics())
    scraped = {(s.name, tuple(s.labels.items())): s.value
               for family in text_string_to_metric_families(asyncio.run(metrics.render()).decode())
               for s in family.samples}
    labels = (("queue", "status_limits"),)
    assert scraped["livepush_queue_depth", labels] == 2
    assert scraped["livepush_queue_held", labels] == 4
    assert scraped["livepush_queue_oldest_age_seconds", labels] < 60


def _shape(value: Any) -> Any:
    """The keys of a JSON document, at every level (a list by its first item; a dict whose keys
    are data, such as `tags` and a workflow's `steps`, is left as a dict)."""
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    return None


def test_the_json_has_the_keys_the_jobs_page_documents(busy_db: dict[str, Any], procs: Processes,
                                                       livepush_env: Callable[..., dict[str, str]]) -> None:
    """A script reads `livepush status --json` by the keys docs/jobs.md shows, at every level:
    each queue, runtime, group, workflow, periodic job and server has exactly those."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "jobs.md").read_text()
    (documented,) = [json.loads(block) for block in re.findall(r"^```json\n(.*?)^```", page, re.M | re.S)
                     if '"servers"' in block]
    q(busy_db["url"], """INSERT INTO livepush_periodic (name, last_tick) VALUES ('status.sweep', now())""")
    env = livepush_env(database_url=busy_db["url"], fanout="postgres")
    procs.livepush("serve", env=env)
    code, out, err = run_status(procs, env, "--json")
    assert code == 0, err
    printed = json.loads(out)
    for data in ("tags",):  # keys that are data, not names
        printed[data], documented[data] = {}, {}
    for doc in (printed, documented):
        for run in doc["workflows"]:
            run["steps"] = {}
    assert _shape(printed) == _shape(documented)


def test_the_jobs_pages_example_report_is_what_the_command_prints_for_its_figures() -> None:
    """docs/jobs.md's example of `livepush status` is the report the command prints for the
    figures it shows, line for line: a server's address is the host alone, as the database
    (`host(client_addr)`) and Redis (its `addr` less the port) give it."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "jobs.md").read_text()
    documented = page.split("```\n$ livepush status\n", 1)[1].split("```", 1)[0].rstrip("\n")
    at = datetime(2030, 1, 1, 12, tzinfo=timezone.utc)
    report = Status(
        at=at.isoformat(),
        queues=[QueueStatus("default", False, 0, None, 40, 2, 3, 0, 1),
                QueueStatus("imports", True, 120, 245.0, 0, 0, 16, 2, 0)],
        runtimes=[RuntimeStatus(7, "web-1", 4121, ["imports", "default"], 16, "running", 16, 10.0, 2.1, False,
                                at.isoformat()),
                  RuntimeStatus(8, "web-2", 4388, ["default"], 10, "draining", 3, 10.0, 45.0, True, at.isoformat())],
        groups=[GroupStatus(31, "sealed", 500, 136, 364, 0, 0, at.isoformat(), 252.0)], groups_in_progress=1,
        workflows=[WorkflowStatus(5, "nightly_import", "waiting",
                                  {"fetch": "succeeded", "rows": "waiting", "report": "pending"},
                                  at.isoformat(), 260.0)],
        workflows_in_progress=1, limit=20, tags={"import:7": 136}, tags_carried=1,
        periodic=[PeriodicStatus("myapp.jobs.sweep", at.isoformat(), 0.0)])
    servers = [{"via": "postgres", "pid": 5120, "address": "10.0.0.21", "since": at - timedelta(hours=3, minutes=2)},
               {"via": "postgres", "pid": 5121, "address": "10.0.0.22", "since": at - timedelta(hours=3, minutes=1)}]
    assert render(report, "app@db-1:5432", servers) == documented
