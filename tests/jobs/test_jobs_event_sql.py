"""The job events built in SQL (claim, completion and enqueue publish them in their own
statement) match the ones events.job_view builds in Python."""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from livepush import jobs
from livepush.jobs.events import views as events
from livepush.jobs import queries
from tests.jobs import sample_jobs
from tests.jobs.conftest import events_of, q


def test_sql_event_equals_python_event(jobs_db: str) -> None:
    """livepush_job_event() gives the same JSON as events.job_event for the same row, with
    and without progress and error."""
    h = sample_jobs.record.enqueue("x")
    with psycopg.connect(jobs_db, autocommit=True) as conn:
        conn.execute("UPDATE livepush_job_payloads SET error = 'E: boom', progress = %s WHERE id = %s",
                     (json.dumps({"done": 2.5, "total": 10, "message": "héllo \"q\""}), h.id))
        for with_payload in (True, False):
            if not with_payload:
                conn.execute("UPDATE livepush_job_payloads SET error = NULL, progress = NULL WHERE id = %s", (h.id,))
            with conn.cursor(row_factory=dict_row) as cur:
                row = cur.execute(queries.JOB_STATE, {"id": h.id}).fetchone()
                assert row is not None
                sql_text = cur.execute(
                    "SELECT " + queries._event_sql("'started'", "j") + " AS t FROM ("
                    + queries.JOB_STATE.replace("%(id)s", str(h.id)) + ") j").fetchone()["t"]
            topic, data = events.job_event("started", row)
            assert topic == f"job:{h.id}"
            assert json.loads(sql_text) == data


def test_publish_many_keeps_order_per_topic(jobs_db: str) -> None:
    """livepush_publish_many() numbers each topic's messages in array order, like one
    livepush_publish() per message."""
    with psycopg.connect(jobs_db, autocommit=True) as conn:
        conn.execute("SELECT livepush_publish('t:b', '0')")
        conn.execute(queries.PUBLISH_MANY, {"topics": ["t:b", "t:a", "t:b", "t:a", "t:c"],
                                            "datas": ["1", "1", "2", "2", "1"]})
        rows = conn.execute("SELECT topic, seq, data FROM livepush_messages WHERE topic LIKE 't:%' "
                            "ORDER BY topic, seq").fetchall()
    assert rows == [("t:a", 1, "1"), ("t:a", 2, "2"), ("t:b", 1, "0"), ("t:b", 2, "1"), ("t:b", 3, "2"),
                    ("t:c", 1, "1")]


def test_publish_and_publish_many_ring_alike(jobs_db: str) -> None:
    """livepush_publish() (sql/0001) and livepush_publish_many() (sql/0007) write their
    notifications themselves; the enqueue statement calls livepush_notification()
    (sql/0009). All give the same text: the JSON inline while it fits, else only offset
    and topic."""
    short, long = '{"a":1}', '"' + "x" * 8000 + '"'
    with psycopg.connect(jobs_db, autocommit=True) as conn:
        conn.execute("LISTEN livepush")
        for data in (short, long):
            conn.execute("SELECT livepush_publish('t:one', %s)", (data,))
        conn.execute(queries.PUBLISH_MANY, {"topics": ["t:many", "t:many"], "datas": [short, long]})
        got = [n.payload for n in conn.notifies(timeout=5, stop_after=4)]
        want = [conn.execute("SELECT livepush_notification(t.epoch, m.seq, m.topic, m.data) FROM livepush_messages m "
                             "JOIN livepush_topics t USING (topic) WHERE m.topic = %s AND m.seq = %s",
                             (topic, seq)).fetchone()[0]  # type: ignore[index]
                for topic in ("t:one", "t:many") for seq in (1, 2)]
    assert got == want
    assert got[0].endswith("t:one\n" + short) and "\n" not in got[1]


def test_runtime_events_in_order(jobs_db: str) -> None:
    """A job run by the runtime gets enqueued, started, succeeded on its topic, in order."""
    from livepush.jobs import drain

    h = sample_jobs.record.enqueue("y")
    assert drain()["succeeded"] >= 1
    assert [e["event"] for e in events_of(jobs_db, h.id)] == ["enqueued", "started", "succeeded"]


def test_a_lone_enqueue_publishes_the_same_event_as_a_batch(jobs_db: str) -> None:
    """enqueue() of one job (ENQUEUE_ONE_PUBLISHING) and enqueue_many() publish the same
    "enqueued" event: the job as a snapshot would show it then."""
    from livepush.jobs import enqueue_many

    one = sample_jobs.record.enqueue("solo")
    many = enqueue_many([sample_jobs.record.request("a"), sample_jobs.record.request("b")])
    with psycopg.connect(jobs_db, autocommit=True) as conn, conn.cursor(row_factory=dict_row) as cur:
        for h in (one, *many):
            row = cur.execute(queries.JOB_STATE, {"id": h.id}).fetchone()
            assert events_of(jobs_db, h.id) == [events.job_event("enqueued", row)[1]]


def test_started_is_fenced_by_the_claims_lease(jobs_db: str) -> None:
    """PUBLISH_STARTED publishes "started" only for a job still running under the lease its
    claim gave: a job rescued or finished meanwhile gets nothing."""
    h = sample_jobs.record.enqueue("fenced")
    with psycopg.connect(jobs_db, autocommit=True) as conn:
        conn.execute("UPDATE livepush_jobs SET state = 'running', attempt = 1, lease = 7 WHERE id = %s", (h.id,))
        conn.execute(queries.PUBLISH_STARTED, {"started_ids": [h.id], "started_leases": [6]})
        assert [e["event"] for e in events_of(jobs_db, h.id)] == ["enqueued"]
        conn.execute(queries.PUBLISH_STARTED, {"started_ids": [h.id], "started_leases": [7]})
        started = events_of(jobs_db, h.id)[-1]
        assert started["event"] == "started" and started["job"]["state"] == "running"
        assert started["job"]["attempt"] == 1
        conn.execute("UPDATE livepush_jobs SET state = 'available', lease = NULL WHERE id = %s", (h.id,))
        conn.execute(queries.PUBLISH_STARTED, {"started_ids": [h.id], "started_leases": [7]})
        assert [e["event"] for e in events_of(jobs_db, h.id)] == ["enqueued", "started"]


def test_a_batch_of_300_outcomes_completes_every_job_once(jobs_db: str) -> None:
    """One completion statement for 300 running jobs (successes, retries with errors, final
    progress) moves each job once, keeps errors and progress, and publishes one event each."""
    from livepush.jobs import enqueue_many

    handles = enqueue_many([sample_jobs.record.request(i) for i in range(300)])
    ids = [h.id for h in handles]
    kinds = ["succeeded" if i % 3 else "retry" for i in range(300)]
    with psycopg.connect(jobs_db, autocommit=True) as conn, conn.cursor(row_factory=dict_row) as cur:
        cur.execute("UPDATE livepush_jobs SET state = 'running', attempt = 1, lease = id WHERE id = ANY(%s)", (ids,))
        rows = cur.execute(queries.COMPLETE_PUBLISHING, {
            "ids": ids, "leases": ids, "kinds": kinds,
            "errors": [None if k == "succeeded" else "E: no" for k in kinds], "delays": [60.0] * 300,
            "progress": [json.dumps({"done": i, "total": 300, "message": None}) for i in range(300)],
        }).fetchall()
        assert sorted(r["id"] for r in rows) == ids
        cur.execute("SELECT j.id, j.state, coalesce(p.error, '') AS error, p.progress->>'done' AS done "
                    "FROM livepush_jobs j JOIN livepush_job_payloads p USING (id) WHERE j.id = ANY(%s)", (ids,))
        states = {r["id"]: f"{r['state']}/{r['error']}/{r['done']}" for r in cur.fetchall()}
    for i, job_id in enumerate(ids):
        expected = f"succeeded//{i}" if kinds[i] == "succeeded" else f"scheduled/E: no/{i}"
        assert states[job_id] == expected
    last = events_of(jobs_db, ids[1])
    assert [e["event"] for e in last] == ["enqueued", "succeeded"] and last[-1]["job"]["progress"]["done"] == 1
    assert [e["event"] for e in events_of(jobs_db, ids[0])] == ["enqueued", "retrying"]


def _nodes(plan: dict) -> list[dict]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


def test_a_large_batch_reads_its_arrays_once(jobs_db: str) -> None:
    """The completer's statements over a batch larger than PREPARED_BATCH_MAX, executed as
    the completer does (planned for their size), never re-read an array parameter per row:
    the quadratic plan that made one batch of 3,570 starts take 1.5 s."""
    from livepush.jobs import enqueue_many
    from livepush.jobs.runtime.completer import PREPARED_BATCH_MAX

    n = PREPARED_BATCH_MAX * 4
    ids = [h.id for h in enqueue_many([sample_jobs.record.request(i) for i in range(n)])]
    with psycopg.connect(jobs_db) as conn:
        # A table the size where the generic plan goes wrong: its statistics say that a
        # lookup of a few ids finds one row.
        conn.execute("INSERT INTO livepush_jobs (queue, name, state) "
                     "SELECT 'default', 'old', 'succeeded' FROM generate_series(1, 20000)")
        conn.execute("ANALYZE livepush_jobs")
        conn.execute("UPDATE livepush_jobs SET state = 'running', attempt = 1, lease = id WHERE id = ANY(%s)", (ids,))
        for sql, params in (
            (queries.PUBLISH_STARTED, {"started_ids": ids, "started_leases": ids}),
            (queries.COMPLETE_PUBLISHING, {"ids": ids, "leases": ids, "kinds": ["succeeded"] * n,
                                           "errors": [None] * n, "delays": [0.0] * n, "progress": [None] * n}),
        ):
            plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params, prepare=False).fetchone()[0][0]["Plan"]
            rescans = [node for node in _nodes(plan)
                       if node["Node Type"] == "Function Scan" and node["Actual Loops"] > 1]
            assert not rescans, rescans
        conn.rollback()


def _next_job_id(conn: psycopg.Connection) -> int:
    (last,) = conn.execute("SELECT nextval('livepush_jobs_id_seq')").fetchone()  # type: ignore[misc]
    return int(last) + 1


def test_a_batch_enqueue_opens_each_jobs_topic_with_its_enqueued_event(jobs_db: str) -> None:
    """enqueue_many() on its own connection publishes each job's "enqueued" event in its own
    statement (queries.ENQUEUE_MANY_PUBLISHING_FRESH): the first message of the job's new
    topic (offset EPOCH-1), in the history as derived from the job's rows (sql/0010: no
    stored row), and rung in item order with offset and topic only, which a listening server
    reads from the history when someone watches the topic."""
    from livepush.jobs import enqueue_many

    with psycopg.connect(jobs_db, autocommit=True) as conn:
        first = _next_job_id(conn)
        conn.execute("LISTEN livepush")
        handles = enqueue_many([sample_jobs.record.request(i) for i in range(3)])
        notes = [n.payload for n in conn.notifies(timeout=5, stop_after=3)]
        assert [h.id for h in handles] == [first, first + 1, first + 2]
        topics = conn.execute("SELECT topic, epoch, last_seq, first_derived FROM livepush_topics "
                              "WHERE topic LIKE 'job:%%' ORDER BY topic").fetchall()
        (stored,) = conn.execute("SELECT count(*) FROM livepush_messages WHERE topic LIKE 'job:%%'").fetchone()  # type: ignore[misc]
    assert [(t, seq, derived) for t, _, seq, derived in topics] == [(h.topic, 1, True) for h in handles]
    assert stored == 0
    epoch = topics[0][1]
    assert notes == [f"{epoch}-1 {h.topic}" for h in handles]
    for h in handles:
        [event] = events_of(jobs_db, h.id)
        assert event["event"] == "enqueued" and event["job"]["id"] == h.id


@pytest.mark.parametrize("aio", [False, True], ids=["sync", "async"])
def test_a_batch_enqueue_numbers_its_events_after_what_a_topic_holds(jobs_db: str, aio: bool) -> None:
    """A job topic that already has messages (somebody published on job:<id> before the job
    existed) fails the fresh statement, and enqueue_many() reruns the batch with
    queries.ENQUEUE_MANY_PUBLISHING: every job is enqueued once, its event numbered after what
    the topic held and rung with the payload livepush_publish() sends."""
    from livepush.jobs import aenqueue_many, enqueue_many

    with psycopg.connect(jobs_db, autocommit=True) as conn:
        first = _next_job_id(conn)
        conn.execute("SELECT livepush_publish(%s, '\"early\"')", (f"job:{first + 1}",))
        conn.execute("LISTEN livepush")
        items = [sample_jobs.record.request(i) for i in range(3)]
        handles = asyncio.run(aenqueue_many(items)) if aio else enqueue_many(items)
        notes = [n.payload for n in conn.notifies(timeout=5, stop_after=3)]
        expected = []
        for h in handles:
            epoch, seq = conn.execute("SELECT epoch, last_seq FROM livepush_topics WHERE topic = %s",
                                      (h.topic,)).fetchone()  # type: ignore[misc]
            (data,) = conn.execute("SELECT data FROM livepush_messages WHERE topic = %s AND seq = %s",
                                   (h.topic, seq)).fetchone()  # type: ignore[misc]
            expected.append(f"{epoch}-{seq} {h.topic}\n{data}")
        (jobs,) = conn.execute("SELECT count(*) FROM livepush_jobs").fetchone()  # type: ignore[misc]
    # The failed statement took ids from the sequence and left nothing else behind.
    assert jobs == 3 and [h.id for h in handles] == sorted(h.id for h in handles) and handles[0].id > first
    assert [int(p.split(" ")[0].split("-")[1]) for p in expected] == [1, 1, 1]
    assert notes == expected
    assert [e["event"] for e in events_of(jobs_db, handles[0].id)] == ["enqueued"]
    assert [e if isinstance(e, str) else e["event"] for e in events_of(jobs_db, first + 1)] == ["early"]


def test_an_enqueue_in_the_callers_transaction_numbers_its_events_after_what_a_topic_holds(jobs_db: str) -> None:
    """In the caller's transaction a failed statement would abort it, so enqueue_many(conn=)
    takes queries.ENQUEUE_MANY_PUBLISHING at once: each event numbered after what its topic
    already holds, rung at the caller's commit with livepush_publish()'s payload."""
    from livepush.jobs import enqueue_many

    with psycopg.connect(jobs_db, autocommit=True) as listener, psycopg.connect(jobs_db) as conn:
        listener.execute("LISTEN livepush")
        first = _next_job_id(conn)
        conn.execute("SELECT livepush_publish(%s, '\"early\"')", (f"job:{first}",))
        handles = enqueue_many([sample_jobs.record.request(i) for i in range(2)], conn=conn)
        conn.commit()
        notes = [n.payload for n in listener.notifies(timeout=5, stop_after=3)]
        want = [listener.execute("SELECT livepush_notification(t.epoch, m.seq, m.topic, m.data) FROM livepush_messages m "
                                 "JOIN livepush_topics t USING (topic) WHERE m.topic = %s AND m.seq = %s",
                                 (topic, seq)).fetchone()[0]  # type: ignore[index]
                for topic, seq in ((f"job:{first}", 1), (f"job:{first}", 2), (f"job:{first + 1}", 1))]
    assert [h.id for h in handles] == [first, first + 1]
    assert notes == want and want[1].startswith(f"{want[0].split('-')[0]}-2 job:{first}\n")
    assert [e if isinstance(e, str) else e["event"] for e in events_of(jobs_db, first)] == ["early", "enqueued"]
    assert [e["event"] for e in events_of(jobs_db, first + 1)] == ["enqueued"]


@jobs.job(name='t.odd "name" \\ é\u2028', queue='q "odd" \t ü')
async def oddly_named(ctx: Any) -> None:
    pass


def test_an_enqueued_event_is_the_text_livepush_job_event_gives(jobs_db: str) -> None:
    """A new job's "enqueued" event, written by hand in the caller's transaction
    (queries._ENQUEUED_EVENT_SQL) or derived by the history view for a fresh batch
    (sql/0010), is the text livepush_job_event() (and so events.job_view) gives for the
    job's row: for names and queues that need escaping, available and scheduled jobs, in
    a session time zone other than UTC."""
    from livepush.jobs import enqueue_many

    at = datetime.datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.timezone.utc)
    items = [oddly_named.request(), (oddly_named, [], {"at": at}), sample_jobs.flaky.request(1)]
    with psycopg.connect(jobs_db) as own, psycopg.connect(jobs_db) as conn:
        conn.execute("SET TIME ZONE 'Asia/Kolkata'")
        # run_at is written in the time zone of the session that writes the text: for a
        # derived event the reader's (either session), for a stored one the caller's.
        fresh = enqueue_many(items)
        sessions = [(s, h) for h in fresh for s in (own, conn)] + [(conn, h) for h in enqueue_many(items, conn=conn)]
        conn.commit()
        for session, h in sessions:
            want = session.execute(
                "SELECT " + queries._event_sql("'enqueued'", "j") + " FROM ("
                + queries.JOB_STATE.replace("%(id)s", str(h.id)) + ") j").fetchone()[0]  # type: ignore[index]
            (got,) = session.execute("SELECT data FROM livepush_history WHERE topic = %s", (h.topic,)).fetchone()  # type: ignore[misc]
            assert got == want
            assert ("+05:30" in got) == (session is conn)
    handles = fresh + [h for _, h in sessions[len(fresh) * 2:]]
    states = [json.loads(m)["job"]["state"] for m in (q(jobs_db, "SELECT data FROM livepush_history WHERE topic = %s",
                                                          (h.topic,))[0][0] for h in handles)]
    assert states == ["available", "scheduled", "available"] * 2


def test_a_batch_enqueue_waits_out_a_concurrent_publish_on_its_topic_then_reruns(jobs_db: str) -> None:
    """Another transaction that publishes on job:<id> of the next job id, uncommitted, makes
    the fresh statement wait on that topic row; when it commits, the statement fails with a
    unique violation and the batch is rerun with ENQUEUE_MANY_PUBLISHING: no hang, no job
    lost or doubled, the other transaction's message untouched."""
    import concurrent.futures

    from livepush.jobs import enqueue_many

    with psycopg.connect(jobs_db) as other, psycopg.connect(jobs_db, autocommit=True) as watch:
        first = _next_job_id(other)
        other.execute("SELECT livepush_publish(%s, '\"early\"')", (f"job:{first}",))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(enqueue_many, [sample_jobs.record.request(i) for i in range(3)])
            for _ in range(500):  # until the enqueue waits on the other transaction's row
                waiting = watch.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                        "AND query LIKE %s", ("%livepush_jobs_id_seq%",)).fetchone()[0]  # type: ignore[index]
                if waiting or future.done():
                    break
                time.sleep(0.01)
            assert waiting == 1 and not future.done()
            other.commit()
            handles = future.result(timeout=10)
    assert len(handles) == 3 and min(h.id for h in handles) > first
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs") == [(3,)]
    for h in handles:
        assert [e["event"] for e in events_of(jobs_db, h.id)] == ["enqueued"]
    assert events_of(jobs_db, first) == ["early"]


def test_a_derived_enqueued_event_is_history_like_a_stored_one(jobs_db: str) -> None:
    """The "enqueued" event a fresh batch derives from the job's rows (sql/0010) is read back
    as the topic's first message by the fan-out's history: unchanged after the job ran and
    was rescheduled (its run_at, attempt and state rewritten), followed by the events
    published after it; gone, with `reset` and never a silent hole, once older than the
    history TTL, or after a crash emptied the (unlogged) topic table."""
    from livepush.fanout.postgres import PostgresFanOut
    from livepush.jobs import enqueue_many

    at = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=1)
    [h] = enqueue_many([(sample_jobs.flaky, [1], {"at": at}), sample_jobs.record.request(0)])[:1]
    fanout = PostgresFanOut(jobs_db, history_ttl=60)

    async def read(since: str) -> list[tuple[str, str]] | None:
        got = await fanout.history(h.topic, since)
        return None if got is None else [(m.offset, m.data_json or "") for m in got]

    async def check() -> None:
        try:
            [(offset, before)] = await read("0")  # type: ignore[misc]
            epoch = offset.split("-")[0]
            assert offset == f"{epoch}-1" and datetime.datetime.fromisoformat(json.loads(before)["job"]["run_at"]) == at
            # t.flaky fails once and is retried at once (no backoff): run_at moves on.
            assert jobs.drain() == {"retrying": 1, "succeeded": 2}
            (run_at, attempt, state) = q(jobs_db, "SELECT run_at, attempt, state FROM livepush_jobs WHERE id = %s",
                                         (h.id,))[0]
            assert (attempt, state) == (2, "succeeded") and run_at > at
            log = await read("0")
            assert log is not None and log[0] == (offset, before)
            assert [o for o, _ in log] == [f"{epoch}-{seq}" for seq in range(1, 6)]
            assert [json.loads(d)["event"] for _, d in log] == ["enqueued", "started", "retrying", "started", "succeeded"]
            assert json.loads(before)["job"]["attempt"] == 0 and json.loads(before)["job"]["state"] == "available"
            # Past the TTL: the first message is expired, the later ones are not.
            q(jobs_db, "UPDATE livepush_job_payloads SET created_at = created_at - interval '1 hour' WHERE id = %s",
              (h.id,))
            assert await read("0") is None
            assert [o for o, _ in await read(offset) or []] == [f"{epoch}-{seq}" for seq in range(2, 6)]
            # A crash resets unlogged tables: the derived event goes with the topic row.
            q(jobs_db, "TRUNCATE livepush_topics, livepush_messages")
            assert await read(offset) is None and await read("0") == []
        finally:
            await fanout.aclose()

    asyncio.run(check())
