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


def test_runtime_events_in_order(jobs_db: str) -> None:
    """A job run by the runtime gets enqueued, started, succeeded on its topic, in order."""
    from livepush.jobs import drain

    h = sample_jobs.record.enqueue("y")
    assert drain()["succeeded"] >= 1
    assert [e["event"] for e in events_of(jobs_db, h.id)] == ["enqueued", "started", "succeeded"]
