"""Claims commit asynchronously (queries.CLAIM): a claim a Postgres crash forgets only makes its
job run again, and the forgotten claim's worker can never finish a later attempt."""

from __future__ import annotations

import psycopg
from psycopg.rows import dict_row

from livepush.jobs import queries
from livepush.jobs.runtime.completer import complete_params
from tests.jobs import sample_jobs


def _claim(conn: psycopg.Connection, runtime_id: int = 1) -> dict:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(queries.CLAIM, {"queue": "default", "limit": 1, "excluded": [],
                                           "runtime_id": runtime_id}).fetchall()
    assert len(rows) == 1
    return rows[0]


def _complete(conn: psycopg.Connection, job_id: int, lease: int) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(queries.COMPLETE, complete_params([(job_id, lease, "succeeded", None, 0.0, None, None)])).fetchall()


def test_a_forgotten_claims_worker_cannot_finish_the_next_attempt(jobs_db: str) -> None:
    """After a crash forgets a claim (the row is back as it was before it), the job is
    claimed again under a new lease; the first worker's outcome matches nothing and the
    second one's lands."""
    h = sample_jobs.record.enqueue("twice")
    with psycopg.connect(jobs_db, autocommit=True) as conn:
        first = _claim(conn)
        # What recovery leaves when the claim's commit never reached the disk.
        conn.execute("UPDATE livepush_jobs SET state = 'available', attempt = attempt - 1, lease = NULL, "
                     "runtime_id = NULL WHERE id = %s", (h.id,))
        second = _claim(conn, runtime_id=2)
        assert second["id"] == first["id"] == h.id and second["attempt"] == first["attempt"] == 1
        assert second["lease"] != first["lease"]
        assert _complete(conn, h.id, first["lease"]) == []
        assert [r["state"] for r in _complete(conn, h.id, second["lease"])] == ["succeeded"]


def test_leases_are_random_not_a_sequence(jobs_db: str) -> None:
    """Leases do not come from a sequence a crash could rewind: 2,000 of them are distinct
    and spread over the 62-bit range."""
    with psycopg.connect(jobs_db, autocommit=True) as conn:
        leases = [r[0] for r in conn.execute("SELECT livepush_job_lease() FROM generate_series(1, 2000)")]
    assert len(set(leases)) == 2000
    assert all(0 <= x < 2**62 for x in leases)
    assert max(leases) - min(leases) > 2**60
