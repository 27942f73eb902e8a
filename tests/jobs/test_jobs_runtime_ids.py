"""A runtime's id is published as a JSON number (`runtime:<id>` and `runtimes`, for operators'
pages, and `livepush status --json`), which JavaScript, and jq before 1.7, read as a double: it
must be an integer a double holds exactly, while staying random (sql/0003_jobs.sql says why)."""

from __future__ import annotations

import json

from tests.jobs.conftest import q, running

SAFE = 2**53 - 1  # the largest integer every JSON reader holds exactly (RFC 8259 §6)


async def test_a_runtimes_id_is_an_integer_a_browser_reads_exactly(jobs_db: str) -> None:
    """Past 2**53 a page showed another id than the runtime's, and subscribed to a runtime:<id>
    nobody publishes on."""
    async with running(queues=["default"]) as rt:
        assert rt.id is not None and 0 < rt.id <= SAFE
        assert int(json.loads(json.dumps(rt.id), parse_int=float)) == rt.id  # as a browser reads it
    made = [row[0] for row in q(jobs_db, """
        INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat)
        SELECT 'test', g, '{default}', 1, 10 FROM generate_series(1, 2000) g RETURNING id""")]
    q(jobs_db, "DELETE FROM livepush_job_runtimes WHERE host = 'test'")
    assert max(made) <= SAFE, f"{sum(i > SAFE for i in made)} of 2000 ids past 2**53"
    # Still random over the whole range: a failover's copy never hands out a live runtime's id.
    assert len(set(made)) == len(made) and max(made) > 2**50
