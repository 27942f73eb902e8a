"""The job events built in SQL (claim, completion and enqueue publish them in their own
statement) match the ones events.job_view builds in Python."""

from __future__ import annotations

import json

import psycopg
from psycopg.rows import dict_row

from livepush.jobs import events, queries
from tests.jobs import sample_jobs
from tests.jobs.conftest import events_of


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
    from livepush.jobs.completer import PREPARED_BATCH_MAX

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


def test_a_batch_enqueue_numbers_logs_and_rings_like_publish(jobs_db: str) -> None:
    """enqueue_many() publishes each job's "enqueued" event in its own statement
    (queries.ENQUEUE_MANY_PUBLISHING): numbered after whatever its topic already holds, logged,
    and rung in item order with the payload livepush_publish() sends."""
    from livepush.jobs import enqueue_many

    with psycopg.connect(jobs_db, autocommit=True) as conn:
        (last,) = conn.execute("SELECT nextval('livepush_jobs_id_seq')").fetchone()  # type: ignore[misc]
        # Somebody already published on the second job's topic: its event comes after that.
        conn.execute("SELECT livepush_publish(%s, '\"early\"')", (f"job:{last + 2}",))
        conn.execute("LISTEN livepush")
        handles = enqueue_many([sample_jobs.record.request(i) for i in range(3)])
        notes = [n.payload for n in conn.notifies(timeout=5, stop_after=3)]
        assert [h.id for h in handles] == [last + 1, last + 2, last + 3]
        expected = []
        for h in handles:
            epoch, seq = conn.execute("SELECT epoch, last_seq FROM livepush_topics WHERE topic = %s",
                                      (h.topic,)).fetchone()  # type: ignore[misc]
            (data,) = conn.execute("SELECT data FROM livepush_messages WHERE topic = %s AND seq = %s",
                                   (h.topic, seq)).fetchone()  # type: ignore[misc]
            assert json.loads(data)["event"] == "enqueued"
            expected.append(f"{epoch}-{seq} {h.topic}\n{data}")
        assert [int(p.split(" ")[0].split("-")[1]) for p in expected] == [1, 2, 1]
    assert notes == expected
    assert [e["event"] if isinstance(e, dict) else e for e in events_of(jobs_db, handles[1].id)] == ["early", "enqueued"]
