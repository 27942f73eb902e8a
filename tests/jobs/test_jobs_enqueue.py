"""Enqueue: one, many, scheduled, inside the caller's transaction, and the handle."""

from __future__ import annotations

import contextlib
import datetime
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import psycopg.rows
import pytest
from psycopg import sql

from livepush import ConfigError, config, jobs
from livepush.jobs import InvalidArgumentsError, enqueue_many, get_job, job_state, signal
from tests.jobs import sample_jobs
from tests.jobs.conftest import events_of, over_jsonb, q


def test_enqueue_returns_a_handle_and_publishes_enqueued(jobs_db: str) -> None:
    """enqueue() stores an available job whose state topic job:<id> starts at `enqueued`."""
    handle = sample_jobs.record.enqueue("k1")
    assert handle.topic == f"job:{handle.id}"
    assert handle.signed_topic.startswith(f"job:{handle.id}~")
    state, args = q(jobs_db, "SELECT j.state, p.args FROM livepush_jobs j JOIN livepush_job_payloads p USING (id) WHERE id = %s",
                    (handle.id,))[0]
    assert (state, args) == ("available", ["k1"])
    [event] = events_of(jobs_db, handle.id)
    assert event["event"] == "enqueued"
    assert set(event["job"]) == {"id", "name", "queue", "state", "attempt", "max_attempts", "progress", "error", "run_at"}
    assert event["job"]["name"] == "t.record" and event["job"]["state"] == "available"
    assert event["job"]["progress"] == {"done": 0, "total": None, "message": None}


def test_signed_topic_without_secret_raises_on_access(jobs_db: str) -> None:
    """Without LIVEPUSH_SECRET enqueue works; reading signed_topic raises ConfigError."""
    config.set_settings(config.Settings(database_url=jobs_db, fanout="postgres", env="test"))
    handle = sample_jobs.record.enqueue()
    with pytest.raises(ConfigError):
        handle.signed_topic


def test_bad_arguments_never_reach_the_database(jobs_db: str) -> None:
    """The argument check raises at enqueue and nothing is stored."""
    with pytest.raises(InvalidArgumentsError, match=r'args\[0\]\["when"\] is a datetime'):
        sample_jobs.record.enqueue({"when": datetime.datetime.now()})
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs")[0][0] == 0


def test_wait_and_at_schedule(jobs_db: str) -> None:
    """wait= and at= store a scheduled job due at that time; a naive datetime is refused."""
    h1 = sample_jobs.record.enqueue(wait=30)
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    h2 = sample_jobs.record.enqueue(at=at)
    rows = dict(q(jobs_db, "SELECT id, state FROM livepush_jobs"))
    assert rows == {h1.id: "scheduled", h2.id: "scheduled"}
    assert q(jobs_db, "SELECT run_at FROM livepush_jobs WHERE id = %s", (h2.id,))[0][0] == at
    with pytest.raises(TypeError, match="aware datetime"):
        sample_jobs.record.enqueue(at=datetime.datetime.now())


@pytest.mark.parametrize("skew_hours", [-1, 1])
def test_a_wait_counts_its_seconds_on_the_databases_clock_whatever_the_enqueuing_machines_clock(
        jobs_db: str, monkeypatch: pytest.MonkeyPatch, skew_hours: int) -> None:
    """A job enqueued with wait=30 from a machine whose clock is an hour off (a laptop's Docker VM
    after a sleep, a VM resumed) is due 30 s after the enqueue on the database's clock, as retries,
    durable sleeps and periodic ticks are: by every way of enqueueing one, keyed or not, alone,
    in a batch or in a task group. On the machine's clock it ran at once, or an hour late."""
    from livepush.jobs.api import enqueue as enqueue_module

    real = datetime.datetime

    class Skewed(real):
        @classmethod
        def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
            return real.now(tz) + datetime.timedelta(hours=skew_hours)

    monkeypatch.setattr(enqueue_module, "datetime", Skewed)
    handles = [sample_jobs.record.enqueue("one", wait=30), sample_jobs.record.enqueue("keyed", wait=30, key="k1"),
               *enqueue_many([(sample_jobs.record, ["many"], {"wait": 30}),
                              (sample_jobs.record, ["many keyed"], {"wait": 30, "key": "k2"})])]
    with jobs.group() as g:
        g.enqueue(sample_jobs.record, "member", wait=30)
    members, _ = jobs.group_members(g.id)
    ids = [h.id for h in handles] + [m["id"] for m in members]
    rows = q(jobs_db, "SELECT id, state, extract(epoch FROM run_at - now())::float8 FROM livepush_jobs "
                      "WHERE id = ANY(%s) ORDER BY id", (ids,))
    assert len(rows) == 5
    for job_id, state, due_in in rows:
        assert state == "scheduled" and 25 < due_in <= 30, (job_id, state, due_in)


def test_conn_enqueue_follows_the_callers_transaction(jobs_db: str) -> None:
    """With conn=, a rolled-back transaction leaves no job and no event; a committed one both."""
    with psycopg.connect(jobs_db) as conn:
        gone = sample_jobs.record.enqueue("x", conn=conn)
        conn.rollback()
        kept = sample_jobs.record.enqueue("y", conn=conn)
        conn.commit()
    assert [r[0] for r in q(jobs_db, "SELECT id FROM livepush_jobs")] == [kept.id]
    assert events_of(jobs_db, gone.id) == []
    assert [e["event"] for e in events_of(jobs_db, kept.id)] == ["enqueued"]


async def test_an_enqueue_in_a_transaction_an_earlier_statement_failed_raises_as_any_statement_there(
        jobs_db: str) -> None:
    """After a statement of the caller's transaction failed (and was caught), Postgres ignores
    every statement until a rollback: an enqueue there raises psycopg's InFailedSqlTransaction,
    as the caller's next statement of its own would, not a DependencyError that reads as an
    outage; once rolled back, the same connection enqueues."""
    with psycopg.connect(jobs_db) as conn:
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("SELECT * FROM no_such_table")
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            sample_jobs.record.enqueue("x", conn=conn)
        conn.rollback()
        kept = sample_jobs.record.enqueue("y", conn=conn)
        conn.commit()
    async with await psycopg.AsyncConnection.connect(jobs_db) as aconn:
        with pytest.raises(psycopg.errors.UndefinedTable):
            await aconn.execute("SELECT * FROM no_such_table")
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            await sample_jobs.record.aenqueue("x", conn=aconn)
    assert [r[0] for r in q(jobs_db, "SELECT id FROM livepush_jobs")] == [kept.id]


def test_conn_enqueue_rings_the_doorbell_at_commit(jobs_db: str) -> None:
    """The wake-up notification is delivered only when the caller commits."""
    with psycopg.connect(jobs_db, autocommit=True) as listener:
        listener.execute("LISTEN livepush_jobs")
        with psycopg.connect(jobs_db) as conn:
            sample_jobs.record.enqueue(conn=conn)
            assert list(listener.notifies(timeout=0.2, stop_after=1)) == []
            conn.commit()
        notes = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in notes] == ["livepush_jobs"]


@pytest.mark.parametrize("factories", [{"row_factory": psycopg.rows.dict_row}, {"cursor_factory": psycopg.RawCursor}],
                         ids=["dict_rows", "raw_cursor"])
async def test_conn_takes_the_callers_connection_whatever_its_factories(
        jobs_db: str, factories: dict[str, Any]) -> None:
    """conn= takes the caller's connection as it is, one made with dict rows (as many apps
    configure theirs) or a raw cursor ($1 placeholders) too: enqueues, a group block and a signal
    run in its transaction and give the same handles as on any connection."""
    from livepush import jobs

    with psycopg.connect(jobs_db, **factories) as conn:
        one = sample_jobs.record.enqueue("x", conn=conn)
        many = enqueue_many([sample_jobs.record.request(1), sample_jobs.record.request(2)], conn=conn)
        with jobs.group(conn=conn) as g:
            g.enqueue(sample_jobs.record, 3)
        signal(one.id, "go", {"n": 1}, conn=conn)
        conn.commit()
    async with await psycopg.AsyncConnection.connect(jobs_db, **factories) as aconn:
        aone = await sample_jobs.record.aenqueue("y", conn=aconn)
        await aconn.commit()
    ids = [one.id, *(h.id for h in many), *(m.id for m in g.members), aone.id]
    assert sorted(ids) == [r[0] for r in q(jobs_db, "SELECT id FROM livepush_jobs WHERE group_id IS NULL "
                                                    "OR group_id = %s ORDER BY id", (g.id,))]


async def test_conn_on_a_sql_ascii_database_gives_handles_as_on_any_other(sql_ascii_url: str) -> None:
    """On a database in SQL_ASCII (initdb's choice under the C locale) an enqueue, a group block
    and a signal in the caller's transaction work and give handles of text, as livepush's own
    connections do: psycopg hands such a connection's text over as bytes, so a handle's name was
    b'...' and a group block failed on the bytes of what it read back."""
    from livepush import jobs
    from livepush.migrate import migrate
    from tests.support.settings import jobs_settings

    migrate(sql_ascii_url)
    with jobs_settings(sql_ascii_url):
        own = sample_jobs.record.enqueue("own")
        with psycopg.connect(sql_ascii_url) as conn:
            one = sample_jobs.record.enqueue("x", conn=conn)
            with jobs.group(conn=conn) as g:
                g.enqueue(sample_jobs.record, "ü")
            signal(one.id, "go", {"n": 1}, conn=conn)
            conn.commit()
        async with await psycopg.AsyncConnection.connect(sql_ascii_url) as aconn:
            aone = await sample_jobs.record.aenqueue("y", conn=aconn)
            async with jobs.agroup(conn=aconn) as ag:
                ag.enqueue(sample_jobs.record, "ø")
            await aconn.commit()
        await jobs.database.release_loop()
        assert [h.name for h in (one, *g.members, aone, *ag.members)] == [own.name] * 4
        assert get_job(g.members[0].id).args == ["ü"]  # type: ignore[union-attr]


async def test_conn_on_a_database_without_livepush_names_that_database(jobs_db: str, pg_admin_url: str) -> None:
    """An enqueue, a group block or a signal on a connection to a database that was never migrated
    raises SchemaError naming that database, where `livepush migrate` must run: it named the jobs'
    database, which has the schema, and sent the operator to migrate what was up to date."""
    import secrets

    from livepush import SchemaError, jobs
    from livepush.postgres.urls import redact
    from tests.support import services

    bare = f"t_{secrets.token_hex(8)}"
    url = services.create_database(pg_admin_url, bare)
    try:
        calls = [lambda conn: sample_jobs.record.enqueue("x", conn=conn),
                 lambda conn: jobs.create_group(conn=conn),
                 lambda conn: jobs.group(conn=conn).__enter__(),
                 lambda conn: signal(1, "go", conn=conn)]
        for call in calls:
            with psycopg.connect(url) as conn:
                with pytest.raises(SchemaError, match="livepush migrate") as raised:
                    call(conn)
            assert redact(url) in str(raised.value) and redact(jobs_db) not in str(raised.value), raised.value
        async with await psycopg.AsyncConnection.connect(url) as aconn:
            with pytest.raises(SchemaError, match="livepush migrate") as raised:
                await sample_jobs.record.aenqueue("y", conn=aconn)
        assert redact(url) in str(raised.value) and redact(jobs_db) not in str(raised.value), raised.value
    finally:
        services.drop_database(pg_admin_url, bare)


async def test_conn_on_another_livepush_database_is_refused_naming_both_not_lost(
        jobs_db: str, make_pg_url: Callable[[], str]) -> None:
    """An enqueue, a group or a signal on a connection to another database that has livepush's
    schema too (the app's, migrated for its own reasons) raises ArgumentValueError naming both
    databases, and writes nothing there: no runtime looks in that database, so the job would never
    run while its handle said it was enqueued."""
    from livepush import ArgumentValueError
    from tests.support import services

    other = make_pg_url()
    calls: list[Callable[[Any], Any]] = [
        lambda conn: sample_jobs.record.enqueue("x", conn=conn),
        lambda conn: enqueue_many([sample_jobs.record.request(1)], conn=conn),
        lambda conn: enqueue_many([], conn=conn),
        lambda conn: jobs.create_group(conn=conn),
        lambda conn: jobs.group(conn=conn).__enter__(),
        lambda conn: signal(1, "go", conn=conn)]
    said = []
    for call in calls:
        with psycopg.connect(other) as conn:
            with pytest.raises(ArgumentValueError, match="jobs' database") as raised:
                call(conn)
        said.append(str(raised.value))
    async with await psycopg.AsyncConnection.connect(other) as aconn:
        with pytest.raises(ArgumentValueError) as raised:
            await sample_jobs.record.aenqueue("y", conn=aconn)
        said.append(str(raised.value))
        with pytest.raises(ArgumentValueError) as raised:
            await jobs.acreate_group(conn=aconn)
        said.append(str(raised.value))
    for text in said:
        assert services.dbname_of(other) in text and services.dbname_of(jobs_db) in text, text
    assert said[0].startswith("enqueue(conn=)") and said[6].startswith("aenqueue(conn=)"), said
    with psycopg.connect(other) as conn:
        assert conn.execute("SELECT count(*) FROM livepush_jobs").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM livepush_groups").fetchone() == (0,)


async def test_conn_on_the_jobs_database_enqueues_across_a_postgres_restart(jobs_db: str) -> None:
    """conn= on the jobs' own database enqueues before and after Postgres restarts (or fails
    over), when what tells its database from another (the server's start time) has changed."""
    from tests.support import services

    with psycopg.connect(jobs_db) as conn:
        before = sample_jobs.record.enqueue("before", conn=conn)
    services.pg_restart()
    with psycopg.connect(jobs_db) as conn:
        after = sample_jobs.record.enqueue("after", conn=conn)
    async with await psycopg.AsyncConnection.connect(jobs_db) as aconn:
        async with jobs.agroup(conn=aconn) as g:
            g.enqueue(sample_jobs.record, "grouped")
    await jobs.database.release_loop()
    assert [get_job(h.id).args for h in (before, after, *g.members)] == [  # type: ignore[union-attr]
        ["before"], ["after"], ["grouped"]]


async def test_aenqueue_with_async_connection(jobs_db: str) -> None:
    """aenqueue(conn=AsyncConnection) enqueues inside that transaction."""
    async with await psycopg.AsyncConnection.connect(jobs_db) as conn:
        handle = await sample_jobs.record.aenqueue("a", conn=conn)
        await conn.commit()
    handle2 = await sample_jobs.record.aenqueue("b")
    assert job_state(handle.id)["state"] == "available"  # type: ignore[index]
    assert job_state(handle2.id)["state"] == "available"  # type: ignore[index]


async def test_a_connection_of_the_wrong_kind_is_refused_naming_the_call_and_its_twin(jobs_db: str) -> None:
    """conn= of the other kind raises TypeError naming the call that was made and the one that
    takes that connection, and writes nothing."""
    from livepush import jobs

    async with await psycopg.AsyncConnection.connect(jobs_db) as aconn:
        with pytest.raises(TypeError, match=r"^enqueue_many\(conn=\) .* use aenqueue_many\(\) with an AsyncConnection"):
            enqueue_many([sample_jobs.record.request(1)], conn=aconn)
        with pytest.raises(TypeError, match=r"^enqueue\(conn=\) .* use aenqueue\(\) with an AsyncConnection"):
            sample_jobs.record.enqueue(1, conn=aconn)
    with psycopg.connect(jobs_db) as conn:
        with pytest.raises(TypeError, match=r"^aenqueue_many\(conn=\) .* use enqueue_many\(\) with a sync Connection"):
            await jobs.aenqueue_many([sample_jobs.record.request(1)], conn=conn)
        with pytest.raises(TypeError, match=r"^aenqueue\(conn=\) .* use enqueue\(\) with a sync Connection"):
            await sample_jobs.record.aenqueue(1, conn=conn)
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]


class DatabaseWrapper:
    """Stands for a framework's connection wrapper (django.db.connection), which holds the psycopg
    connection rather than being one."""


async def test_a_conn_that_is_no_psycopg_connection_says_where_the_psycopg_one_is(jobs_db: str) -> None:
    """conn=django.db.connection (the wrapper) or a psycopg2 connection is the usual slip: the
    refusal names what it got and says where the psycopg connection is, for every jobs call that
    takes conn=, and nothing is written."""
    from livepush import jobs

    where = r"got DatabaseWrapper \([\w.]+\): pass the psycopg connection itself \(under Django, django\.db\.connection\.connection"
    with pytest.raises(TypeError, match=where):
        sample_jobs.record.enqueue(1, conn=DatabaseWrapper())
    with pytest.raises(TypeError, match=where):
        await jobs.aenqueue_many([sample_jobs.record.request(1)], conn=DatabaseWrapper())
    with pytest.raises(TypeError, match=where):
        jobs.create_group(conn=DatabaseWrapper())
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]


async def test_a_connection_its_caller_closed_is_refused_not_taken_for_postgres_being_down(jobs_db: str) -> None:
    """An enqueue after the connection's `with` block ended names conn= as the mistake (a
    ValueError), where it said Postgres could not be reached and sent an operator to a server
    that is up; nothing is written."""
    from livepush import jobs

    with psycopg.connect(jobs_db) as conn:
        pass
    with pytest.raises(ValueError, match=r"^enqueue\(conn=\) got a closed connection: pass the open connection"):
        sample_jobs.record.enqueue(1, conn=conn)
    with pytest.raises(ValueError, match="got a closed connection"):
        with jobs.group(conn=conn) as g:
            g.enqueue(sample_jobs.record, 1)
    async with await psycopg.AsyncConnection.connect(jobs_db) as aconn:
        pass
    with pytest.raises(ValueError, match=r"^aenqueue_many\(conn=\) got a closed connection"):
        await jobs.aenqueue_many([sample_jobs.record.request(1)], conn=aconn)
    with pytest.raises(ValueError, match="got a closed connection"):
        await jobs.acreate_group(conn=aconn)
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]


async def test_an_empty_enqueue_many_refuses_a_wrong_or_closed_conn_as_a_full_one_does(jobs_db: str) -> None:
    """A batch that happens to be empty (no rows to import this time) still checks conn=: a
    framework's wrapper, a connection of the other kind or a closed one went unnoticed until a
    batch first had items, often in production only."""
    from livepush import jobs

    with pytest.raises(TypeError, match=r"got DatabaseWrapper"):
        enqueue_many([], conn=DatabaseWrapper())
    with pytest.raises(TypeError, match=r"got DatabaseWrapper"):
        await jobs.aenqueue_many([], conn=DatabaseWrapper())
    async with await psycopg.AsyncConnection.connect(jobs_db) as aconn:
        with pytest.raises(TypeError, match=r"^enqueue_many\(conn=\) .* use aenqueue_many\(\)"):
            enqueue_many([], conn=aconn)
    with psycopg.connect(jobs_db) as conn:
        with pytest.raises(TypeError, match=r"^aenqueue_many\(conn=\) .* use enqueue_many\(\)"):
            await jobs.aenqueue_many([], conn=conn)
    with pytest.raises(ValueError, match=r"^enqueue_many\(conn=\) got a closed connection"):
        enqueue_many([], conn=conn)
    with psycopg.connect(jobs_db) as open_conn:
        assert enqueue_many([], conn=open_conn) == []


def test_enqueue_many_is_one_statement(jobs_db: str) -> None:
    """enqueue_many stores a whole batch with one INSERT statement and returns handles in order."""
    items = [sample_jobs.record.request(i) for i in range(500)] + [(sample_jobs.other_queue, [1], {"wait": 60})]
    handles = enqueue_many(items)
    assert len(handles) == 501
    rows = q(jobs_db, "SELECT j.id, j.queue, j.state, p.args FROM livepush_jobs j JOIN livepush_job_payloads p USING (id) ORDER BY id")
    assert [r[0] for r in rows] == [h.id for h in handles]
    assert rows[0][1:] == ("default", "available", [0])
    assert rows[-1][1:] == ("second", "scheduled", [1])
    # xact ids: a single statement means a single transaction wrote every row.
    assert q(jobs_db, "SELECT count(DISTINCT xmin::text) FROM livepush_jobs")[0][0] == 1


def test_enqueue_many_stores_every_column_exactly(jobs_db: str) -> None:
    """Each job of a batch keeps its own name, queue, max_attempts, arguments (nested, quoted,
    non-ASCII) and run_at (microseconds and a non-UTC offset kept), in item order."""
    at = datetime.datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.timezone(datetime.timedelta(hours=-3, minutes=-30)))
    tricky = {"q": 'say "hi" \\ now', "é": ["ü", 1.5, None, True, {"n": -(2 ** 62)}]}
    handles = enqueue_many([(sample_jobs.flaky, [2], {"at": at}), sample_jobs.other_queue.request(tricky),
                            sample_jobs.record.request()])
    rows = q(jobs_db, "SELECT j.id, j.name, j.queue, j.state, j.max_attempts, j.run_at, p.args "
                      "FROM livepush_jobs j JOIN livepush_job_payloads p USING (id) ORDER BY id")
    assert [r[0] for r in rows] == [h.id for h in handles]
    assert rows[0][1:] == ("t.flaky", "default", "scheduled", 3, at, [2])
    assert rows[1][1:5] == ("t.other_queue", "second", "available", 5) and rows[1][6] == [tricky]
    assert rows[2][1:5] == ("t.record", "default", "available", 5) and rows[2][6] == []


def test_the_batch_document_gives_back_every_field_of_every_item(jobs_db: str) -> None:
    """A batch travels as one compact document (what each function fixes once, rows without
    their trailing nulls); livepush_job_items(), which every enqueue statement reads it through,
    gives back each item's every field, in item order."""
    from livepush.jobs.api.enqueue import Batch
    from tests.jobs import limit_jobs

    at = datetime.datetime(2031, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc)
    batch = Batch()
    batch.add(sample_jobs.record, [])
    batch.add(sample_jobs.record, ["x", {"n": 1}], at, queue="elsewhere")
    batch.add(sample_jobs.flaky, [2], group_id=7, tags=["a", "b"], key="k")
    batch.add(sample_jobs.record, [3], key="k")
    batch.add(limit_jobs.per_tenant, ["acme"])
    with psycopg.connect(jobs_db) as conn:
        rows = conn.execute("SELECT * FROM livepush_job_items(%(batch)s::jsonb)", batch.params()).fetchall()
    # ord, name, queue, priority, at, max_attempts, group_id, args, tags, key, first, concurrency_key, limited
    assert rows == [
        (1, "t.record", "default", 0, None, 5, None, [], None, None, True, None, False),
        (2, "t.record", "elsewhere", 0, at, 5, None, ["x", {"n": 1}], None, None, True, None, False),
        (3, "t.flaky", "default", 0, None, 3, 7, [2], ["a", "b"], "k", True, None, False),
        (4, "t.record", "default", 0, None, 5, None, [3], None, "k", False, None, False),
        (5, "t.per_tenant", "default", 0, None, 5, None, ["acme"], None, None, True, '"acme"', True),
    ]


def _nodes(plan: dict) -> list[dict]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


def test_a_batch_enqueue_reads_its_document_once(jobs_db: str) -> None:
    """The enqueue statement (queries.ENQUEUE) expands its JSON document once, whatever the plan
    (custom or generic): a plan that re-read it for every row would be quadratic in the batch."""
    from livepush.jobs import queries
    from livepush.jobs.api.enqueue import many

    batch = many(sample_jobs.record.request(i) for i in range(200))
    with psycopg.connect(jobs_db) as conn:
        # A custom plan (the parameter's value known), then the generic one a prepared statement
        # may switch to (planned without it).
        custom = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + queries.ENQUEUE, batch.params(),
                              prepare=False).fetchone()[0][0]["Plan"]  # type: ignore[index]
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("PREPARE test_enqueue(jsonb) AS " + queries.ENQUEUE.replace("%(batch)s", "$1"))
        # EXECUTE takes its argument as a literal (utility statements take no bound parameters).
        execute = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE test_enqueue({})").format(
            sql.Literal(batch.params()["batch"]))
        generic = conn.execute(execute).fetchone()[0][0]["Plan"]  # type: ignore[index]
        for plan in (custom, generic):
            scans = [n for n in _nodes(plan) if n["Node Type"] == "Function Scan"]
            assert scans and all(n["Actual Loops"] == 1 for n in scans), scans
        conn.rollback()


def test_a_batch_looks_each_function_up_once_and_keeps_their_specs_apart() -> None:
    """A batch notes what each (function, queue) fixes the first time it meets it; specs that
    cannot be a dict key (a plain, unfrozen dataclass) are looked up at every job instead, and
    every job keeps its own function's name, queue, priority and attempts."""
    import dataclasses
    import json

    from livepush.jobs.api.enqueue import many

    @dataclasses.dataclass  # eq without frozen: unhashable
    class Loose:
        name: str
        queue: str
        priority: int
        max_attempts: int

    a, b = Loose("x.a", "qa", 1, 2), Loose("x.b", "qb", 3, 4)
    batch = many([(a, ()), (sample_jobs.record, [1]), (b, [2]), sample_jobs.record.request(3, queue="q2"),
                  (a, [4]), (sample_jobs.record, [5])])
    document = json.loads(batch.params()["batch"])
    assert document["specs"] == [["x.a", "qa", 1, 2, False], ["t.record", "default", 0, 5, False],
                                 ["x.b", "qb", 3, 4, False], ["t.record", "q2", 0, 5, False]]
    assert document["rows"] == [[0, []], [1, [1]], [2, [2]], [3, [3]], [0, [4]], [1, [5]]]


def test_item_options_reach_the_batch_document_whatever_mapping_carries_them() -> None:
    """enqueue_many's per-item options (a dict or any mapping) give each row its key, tags and
    run time; a key already in the batch marks the later item, which gets the earlier one's job."""
    import json
    from types import MappingProxyType

    from livepush.jobs.api.enqueue import many

    at = datetime.datetime(2031, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc)
    batch = many([(sample_jobs.record, [1], {"key": "k"}), (sample_jobs.record, [2], MappingProxyType({"key": "m"})),
                  (sample_jobs.record, [3], {"tags": ["a"]}), (sample_jobs.record, [4], {"key": "k"}),
                  (sample_jobs.record, [5], {"key": "n", "at": at}), (sample_jobs.record, [6], {})])
    assert json.loads(batch.params()["batch"])["rows"] == [
        [0, [1], "k"], [0, [2], "m"], [0, [3], None, None, None, None, ["a"]], [0, [4], "k", None, None, None, None, 1],
        [0, [5], "n", None, None, at.isoformat()], [0, [6]]]


def test_a_limited_jobs_concurrency_key_comes_from_its_checked_arguments() -> None:
    """Arguments given as any iterable are read once: the row's arguments and the concurrency
    key both come from the checked list."""
    import json

    from livepush.jobs.api.enqueue import many
    from tests.jobs import limit_jobs

    document = json.loads(many([(limit_jobs.per_tenant, iter(["acme", 0.5]))]).params()["batch"])
    assert document["rows"] == [[0, ["acme", 0.5], None, None, '"acme"']]


@pytest.mark.parametrize("args", ["acme", b"acme", {"tenant": "acme"}, None, 7])
def test_an_enqueue_many_items_arguments_that_are_not_a_list_are_refused_not_spread(jobs_db: str, args: Any) -> None:
    """(job, "acme") would enqueue the job with the arguments "a", "c", "m", "e" (a dict: with its
    keys): an InvalidArgumentsError naming what was given, and nothing of the batch is written."""
    with pytest.raises(InvalidArgumentsError, match=f"arguments .*got {type(args).__name__}"):
        enqueue_many([(sample_jobs.record, ["fine"]), (sample_jobs.record, args)])
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs")[0][0] == 0


def test_float_arguments_come_back_as_floats(jobs_db: str) -> None:
    """Arguments are plain JSON with finite floats, and a job runs with exactly those arguments:
    what get_job (and the claim, which reads the same column) gives back has the same types."""
    args = [1e16, 1.5e300, 2.5, 1e-7]
    handle = sample_jobs.record.enqueue(args)
    info = get_job(handle.id)
    assert info is not None
    assert [type(v) for v in info.args[0]] == [float, float, float, float], info.args
    assert info.args == [args]
    (batched,) = enqueue_many([(sample_jobs.record, [{"at": args}])])
    info = get_job(batched.id)
    assert info is not None and info.args == [{"at": args}]
    assert [type(v) for v in info.args[0]["at"]] == [float, float, float, float], info.args


@pytest.mark.parametrize("big", [10**4300, -(10**4300)], ids=["positive", "negative"])
def test_an_int_too_long_for_json_text_is_refused_naming_its_path(jobs_db: str, big: int) -> None:
    """Python writes and reads ints of at most 4,300 digits as text (sys.get_int_max_str_digits),
    so a longer one can be neither encoded here nor decoded by a runtime: an InvalidArgumentsError
    naming the path, not the encoder's ValueError, whose advice (raise the limit in this process)
    would leave the job undecodable by every runtime."""
    with pytest.raises(InvalidArgumentsError, match=r'args\[1\]\["n"\]'):
        sample_jobs.record.enqueue(1, {"n": big})
    with pytest.raises(InvalidArgumentsError, match=r'args\[0\]'):
        enqueue_many([(sample_jobs.record, [1]), (sample_jobs.record, [big])])
    with pytest.raises(InvalidArgumentsError, match=r'data\["n"\]'):
        signal(1, "go", {"n": big})
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs")[0][0] == 0


@pytest.mark.parametrize("url,error,needle", [
    (5, TypeError, "jobs.configure() takes a Postgres URL"),
    ("", ConfigError, "jobs.configure() was given an empty URL"),
    ("  ", ConfigError, "jobs.configure() was given an empty URL"),
    ("http://pw@example.com/jobs", ConfigError, "the URL given to jobs.configure() cannot be parsed"),
    ("postgresql://u@h:99999/jobs", ConfigError, "the URL given to jobs.configure() has a port"),
])
def test_configure_refuses_a_bad_url_at_the_call_naming_itself(jobs_db: str, url: object, error: type,
                                                               needle: str) -> None:
    """jobs.configure(url) checks the URL when it is called, raising an error that names configure()
    (not LIVEPUSH_DATABASE_URL, and not an AttributeError at the next enqueue), and keeps the database
    it had: the next enqueue still works."""
    with pytest.raises(error, match=re.escape(needle)):
        jobs.configure(url)  # type: ignore[arg-type]
    assert sample_jobs.record.enqueue("after").id > 0


@pytest.mark.parametrize("items", [None, 5])
async def test_enqueue_many_of_no_iterable_says_what_it_takes(jobs_db: str, items: object) -> None:
    """enqueue_many(None) raises TypeError saying what it takes (requests or (job, args) tuples), sync
    and async alike, not Python's bare "'NoneType' object is not iterable"."""
    with pytest.raises(TypeError, match=r"enqueue_many\(\) takes an iterable of job.request"):
        enqueue_many(items)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"enqueue_many\(\) takes an iterable of job.request"):
        await jobs.aenqueue_many(items)  # type: ignore[arg-type]


REFUSED_ITEMS: list[tuple[Any, str]] = [
    ((sample_jobs.record, [datetime.datetime.now()]), 'item 2: args[0] is a datetime'),
    ((sample_jobs.record, ["x"], {"key": 7}), "item 2: key= takes a non-empty str"),
    ((sample_jobs.record, ["x"], {"tags": ["ok", ""]}), "item 2: tags[1] is str ''"),
    ((sample_jobs.record, ["x"], {"wait": "5"}), "item 2: wait= takes a number of seconds"),
    ((sample_jobs.record, ["x"], ["key"]), "item 2: item options are a dict of"),
    # A falsy value that is no dict (an options expression that came out False or 0) is no options either.
    ((sample_jobs.record, ["x"], False), "item 2: item options are a dict of"),
    ((sample_jobs.record, ["x"], 0), "item 2: item options are a dict of"),
    ([sample_jobs.record, ["x"]], "item 2: an item is a JobRequest"),
    ((sample_jobs.hold, [1, 2, 3]), "item 2: t.hold takes 1 argument after ctx, got 3"),
]


@pytest.mark.parametrize(("bad", "says"), REFUSED_ITEMS)
async def test_a_refused_item_of_a_batch_is_named_by_its_place_in_the_batch(jobs_db: str, bad: Any,
                                                                            says: str) -> None:
    """In a batch of thousands, `args[0] is a datetime` alone does not say which item to fix: every
    call that takes a batch of items puts the refused item's place (and the call) in front of what
    was wrong with it, with the error's type unchanged, and writes nothing."""
    items = [(sample_jobs.record, ["a"], {"key": "first"}), sample_jobs.record.request("b"), bad]
    group = jobs.create_group()
    calls: list[tuple[str, Any]] = [
        ("enqueue_many()", lambda: jobs.enqueue_many(items)),
        ("aenqueue_many()", None),
        ("add_many_to_group()", lambda: jobs.add_many_to_group(group.id, items)),
        ("aadd_many_to_group()", None),
    ]
    for call, run in calls:
        with pytest.raises((TypeError, ValueError)) as refused:
            if call == "aenqueue_many()":
                await jobs.aenqueue_many(items)
            elif call == "aadd_many_to_group()":
                await jobs.aadd_many_to_group(group.id, items)
            else:
                run()
        assert str(refused.value).startswith(f"{call} {says}"), (call, str(refused.value))
    with pytest.raises((TypeError, ValueError)) as refused:
        with jobs.group() as g:
            g.enqueue_many(items)
    assert str(refused.value).startswith(f"g.enqueue_many() {says}"), str(refused.value)
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]


async def test_arguments_too_large_to_store_are_refused_naming_them(jobs_db: str) -> None:
    """Arguments past what one jsonb value holds (256 MiB), in one job or across a batch, raise
    InvalidArgumentsError naming them, and nothing is written: a DependencyError said Postgres had
    failed, for a call that fails the same however often it is tried again."""
    half = "x" * 140_000_000  # twice over the limit; one string, so the test holds it once
    with pytest.raises(InvalidArgumentsError, match="the arguments of t.record are too large for Postgres to store"):
        sample_jobs.record.enqueue(half, half)
    with pytest.raises(InvalidArgumentsError, match="pass a reference to it, or enqueue fewer jobs at a time"):
        await jobs.aenqueue_many([(sample_jobs.record, [half]), (sample_jobs.record, [half])])
    del half
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs")[0][0] == 0


REFUSED_IN_CALLERS_TRANSACTION: dict[str, Callable[[psycopg.Connection], Any]] = {
    "enqueue": lambda conn: sample_jobs.record.enqueue(over_jsonb(), conn=conn),
    "enqueue_many": lambda conn: enqueue_many([(sample_jobs.record, [over_jsonb(11_500_000)]),
                                               (sample_jobs.record, [over_jsonb(11_500_000)])], conn=conn),
}


@pytest.mark.parametrize(("call", "autocommit"), [(call, False) for call in REFUSED_IN_CALLERS_TRANSACTION]
                         + [("enqueue", True)])
def test_a_refusal_of_arguments_too_large_leaves_the_callers_transaction_usable(
        jobs_db: str, call: str, autocommit: bool) -> None:
    """A call with conn= whose data Postgres refuses as too large raises InvalidArgumentsError and
    the caller's transaction goes on, as after any refusal made in Python: the rows the caller
    wrote before and after it commit, and nothing of the call. Postgres failed the whole
    transaction, so a caller that caught the error lost its own writes unless it rolled back. So
    too in a transaction block of a connection in autocommit."""
    with psycopg.connect(jobs_db, autocommit=autocommit) as conn:
        with conn.transaction() if autocommit else contextlib.nullcontext():
            conn.execute("INSERT INTO job_flags (name) VALUES ('before')")
            with pytest.raises(InvalidArgumentsError, match="too large for Postgres to store"):
                REFUSED_IN_CALLERS_TRANSACTION[call](conn)
            conn.execute("INSERT INTO job_flags (name) VALUES ('after')")
        conn.commit()
    assert q(jobs_db, "SELECT name FROM job_flags ORDER BY name") == [("after",), ("before",)]
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]


async def test_an_async_refusal_of_arguments_too_large_leaves_the_callers_transaction_usable(jobs_db: str) -> None:
    """As for the sync calls: aenqueue and aenqueue_many with conn= leave the caller's transaction
    usable when Postgres refuses their arguments as too large."""
    calls = {
        "aenqueue": lambda aconn: sample_jobs.record.aenqueue(over_jsonb(), conn=aconn),
        "aenqueue_many": lambda aconn: jobs.aenqueue_many([(sample_jobs.record, [over_jsonb(11_500_000)]),
                                                           (sample_jobs.record, [over_jsonb(11_500_000)])], conn=aconn),
    }
    for name, call in calls.items():
        async with await psycopg.AsyncConnection.connect(jobs_db) as aconn:
            await aconn.execute("INSERT INTO job_flags (name) VALUES (%s)", (f"{name} before",))
            with pytest.raises(InvalidArgumentsError, match="too large for Postgres to store"):
                await call(aconn)
            await aconn.execute("INSERT INTO job_flags (name) VALUES (%s)", (f"{name} after",))
            await aconn.commit()
    assert [r[0] for r in q(jobs_db, "SELECT name FROM job_flags ORDER BY name")] == [
        "aenqueue after", "aenqueue before", "aenqueue_many after", "aenqueue_many before"]
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]


def test_arguments_past_one_message_to_postgres_are_refused_leaving_the_callers_transaction_usable(
        jobs_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Arguments whose JSON passes what one message to Postgres carries (1 GiB), one job's or a
    batch's together, raise InvalidArgumentsError saying they are too large, before anything is
    sent, and with conn= the caller's transaction goes on. Postgres closed the connection on such
    a message: a DependencyError after seconds, said as an outage, inviting a retry that met the same."""
    from livepush.jobs.api import args

    # The real limit, crossed once: the tests of the other call sites lower it (args.SENDABLE).
    huge = "x" * 1_100_000_000
    with pytest.raises(InvalidArgumentsError, match=r"the arguments of t.record are too large for Postgres to store "
                                                    r"\(past the 1 GiB one message to Postgres carries\)"):
        sample_jobs.record.enqueue(huge)
    del huge
    # Lowered to 10 MB for the rest: the same check, without seconds of encoding each 1.1 GB.
    monkeypatch.setattr(args, "SENDABLE", 10_000_000)
    huge = "x" * 11_000_000
    with psycopg.connect(jobs_db) as conn:
        conn.execute("INSERT INTO job_flags (name) VALUES ('before')")
        with pytest.raises(InvalidArgumentsError, match="too large for Postgres to store"):
            sample_jobs.record.enqueue(huge, conn=conn)
        # Jobs that one message takes one by one, but not together.
        part = huge[:2_500_000]
        del huge
        with pytest.raises(InvalidArgumentsError, match=r"the arguments of enqueue_many\(\)'s 5 jobs are too large .* "
                                                        "or enqueue fewer jobs at a time"):
            enqueue_many([(sample_jobs.record, [part])] * 5, conn=conn)
        del part
        conn.execute("INSERT INTO job_flags (name) VALUES ('after')")
        conn.commit()
    assert q(jobs_db, "SELECT name FROM job_flags ORDER BY name") == [("after",), ("before",)]
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]


def test_only_an_enqueue_postgres_may_refuse_as_too_large_takes_a_savepoint(jobs_db: str, tmp_path: Path) -> None:
    """The savepoint that keeps the caller's transaction usable after a refusal costs two round
    trips: an enqueue whose JSON is shorter than Postgres could ever refuse (a sixth of the limit
    at most is jsonb's measured growth) sends its one statement, as ever, seen on the wire. One
    past that length takes the savepoint, and, stored, commits with the caller's transaction."""
    from livepush.jobs.api.args import MAY_BE_TOO_LARGE

    trace = tmp_path / "trace"
    with psycopg.connect(jobs_db) as conn, trace.open("w") as traced:
        conn.execute("INSERT INTO job_flags (name) VALUES ('before')")
        sample_jobs.record.enqueue("warm", conn=conn)  # the database's identity is read at the first conn= call
        conn.pgconn.trace(traced.fileno())
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
        small = sample_jobs.record.enqueue("x" * 1000, conn=conn)
        enqueue_many([(sample_jobs.record, ["x" * 1000])] * 100, conn=conn)
        conn.pgconn.untrace()
        large = sample_jobs.record.enqueue("x" * (MAY_BE_TOO_LARGE + 1), conn=conn)
        conn.commit()
    sent = trace.read_text()
    assert "livepush_job_payloads" in sent and "SAVEPOINT" not in sent
    assert q(jobs_db, "SELECT name FROM job_flags") == [("before",)]
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE id IN (%s, %s)", (small.id, large.id)) == [(2,)]
