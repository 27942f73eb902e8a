"""Claims commit asynchronously (queries.CLAIM): a claim a Postgres crash forgets only makes its
job run again, and the forgotten claim's worker can never finish a later attempt. A claim runs a
job with the arguments its row has when it is claimed, also when a debounce replaced them
meanwhile."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from psycopg.rows import dict_row

from livepush import jobs
from livepush.jobs import queries
from livepush.jobs.runtime.completer import complete_params
from tests.jobs import sample_jobs
from tests.jobs.conftest import q
from tests.support.waiting import wait_for


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


# Test-only hook: the claim's update of one chosen job waits for advisory lock HOLD, so the claim
# is held after its snapshot was taken and before it locks the jobs behind that one.
HOLD = 7_301_744


def _hold_claims_at(conn: psycopg.Connection, job_id: int) -> None:
    conn.execute(f"""
        CREATE FUNCTION test_hold_claim() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_advisory_xact_lock_shared({HOLD}); RETURN NEW; END $$;
        CREATE TRIGGER test_hold_claim BEFORE UPDATE ON livepush_jobs FOR EACH ROW
            WHEN (OLD.id = {int(job_id)} AND NEW.state = 'running') EXECUTE FUNCTION test_hold_claim();""")


def test_a_debounce_committed_during_a_claim_is_not_started_with_the_arguments_it_replaced(jobs_db: str) -> None:
    """A claim reads its jobs' arguments in the snapshot it started with. A debounce (debounce=0:
    the job stays available) that commits after that snapshot, before the claim reaches the job,
    replaced the arguments: the claim must not start the job with the old ones. It leaves the job
    to the next claim, which runs it with the new ones."""
    first = sample_jobs.record.enqueue("first")
    pending = sample_jobs.record.enqueue("old", key="k", debounce=0)
    with psycopg.connect(jobs_db, autocommit=True) as holder, psycopg.connect(jobs_db, autocommit=True) as claimer:
        _hold_claims_at(holder, first.id)
        holder.execute("SELECT pg_advisory_lock(%s)", (HOLD,))
        pid = claimer.info.backend_pid
        result: dict[str, Any] = {}

        def claim() -> None:
            with claimer.cursor(row_factory=dict_row) as cur:
                result["rows"] = cur.execute(queries.CLAIM, {"queue": "default", "limit": 2, "excluded": [],
                                                             "runtime_id": 1}).fetchall()

        thread = threading.Thread(target=claim)
        thread.start()
        wait_for(lambda: q(jobs_db, "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,))
                 == [("advisory",)], 10.0, message="the claim to be held at the first job")
        # The pending job is not locked yet: the debounce replaces its arguments and commits.
        assert sample_jobs.record.enqueue("new", key="k", debounce=0) == pending
        holder.execute("SELECT pg_advisory_unlock(%s)", (HOLD,))
        thread.join(10.0)
        assert not thread.is_alive()
    assert {r["id"]: r["args"] for r in result["rows"]} == {first.id: ["first"]}
    assert jobs.get_job(pending.id).state == "available"  # type: ignore[union-attr]
    assert jobs.drain() == {"succeeded": 1}  # the pending job: `first` is the held claim's
    assert q(jobs_db, "SELECT job_id, key FROM job_runs") == [(pending.id, "new")]
