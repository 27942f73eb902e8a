"""The recording of every committed version of every job's state topic, for tests that check
what a page watching `job:<id>` could have seen."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from livepush.jobs.events.views import job_view

# The recording of job versions. A job's state topic is its row: every change bumps `version`
# and names itself in `event`. A deferred constraint trigger runs at commit, once for each row
# version the transaction wrote (NEW is that version), and reads the payload as the transaction
# leaves it, so each committed version is recorded as a page reading the row then would see it;
# a rolled-back change records nothing. Updates that keep the version (a cancel flag on a
# running job) are not versions and are not recorded.
VERSIONS_TABLE = """
CREATE TABLE test_job_versions (
    seq          bigserial PRIMARY KEY,
    id           bigint NOT NULL,
    version      bigint NOT NULL,
    event        text NOT NULL,
    name         text NOT NULL,
    queue        text NOT NULL,
    state        text NOT NULL,
    attempt      integer NOT NULL,
    max_attempts integer NOT NULL,
    run_at       timestamptz,
    progress     jsonb,
    error        text,
    xid          bigint NOT NULL DEFAULT txid_current(),
    -- The writing transaction's now(): what a retry's run_at was computed from.
    at           timestamptz NOT NULL DEFAULT now()
);
CREATE FUNCTION test_record_job_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.version = OLD.version THEN
        RETURN NULL;
    END IF;
    INSERT INTO test_job_versions (id, version, event, name, queue, state, attempt, max_attempts, run_at,
                                   progress, error)
    SELECT NEW.id, NEW.version, NEW.event, NEW.name, NEW.queue, NEW.state, NEW.attempt, NEW.max_attempts,
           nullif(NEW.run_at, 'infinity'), p.progress, p.error
    FROM (SELECT NEW.id AS id) j LEFT JOIN livepush_job_payloads p ON p.id = j.id;
    RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER test_record_job_version AFTER INSERT OR UPDATE ON livepush_jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_record_job_version();
"""


def versions_of(url: str, job_id: int) -> list[dict[str, Any]]:
    """The recorded versions of job:<id> (rows of test_job_versions), in version order."""
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM test_job_versions WHERE id = %s ORDER BY version, seq", (job_id,)).fetchall()


def events_of(url: str, job_id: int) -> list[dict[str, Any]]:
    """Every committed version of job:<id> as its state topic shows it ({"event", "job"}), in
    version order. Checks on the way that the versions are 1, 2, 3...: each change adds one,
    none is skipped or written twice."""
    rows = versions_of(url, job_id)
    assert [r["version"] for r in rows] == list(range(1, len(rows) + 1)), \
        f"job {job_id}: versions {[r['version'] for r in rows]}"
    return [{"event": r["event"], "job": job_view(r)} for r in rows]
