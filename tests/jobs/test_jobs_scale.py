"""Operator reads and retention beside the finished jobs retention keeps: each reads the rows it
answers with (through an index), never the whole of livepush_jobs, however many finished jobs
it holds."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
import pytest

from livepush.jobs import queries
from livepush.jobs.groups import queries as gq
from livepush.jobs.workflows import queries as wq

FINISHED = 100_000  # jobs within their retention: enough that the planner prefers an index
FAILED = FINISHED // 4  # every 4th of them failed, the others succeeded
UNFINISHED = 30

# One statement each, as a runtime leaves them: the succeeded jobs finished over the last day, the
# failed ones interleaved with them (every 4th job), a small live tail of unfinished jobs.
BUILD = f"""
INSERT INTO livepush_jobs (queue, name, state, attempt, finished_at, event, version, tags)
SELECT 'default', 'app.work', CASE WHEN i % 4 = 0 THEN 'failed' ELSE 'succeeded' END, 1,
       now() - interval '1 day' + i * interval '100 ms', CASE WHEN i % 4 = 0 THEN 'failed' ELSE 'succeeded' END, 3,
       CASE WHEN i % 2 = 0 THEN ARRAY['tenant:' || (i % 7)] END
FROM generate_series(1, {FINISHED}) i;
INSERT INTO livepush_jobs (queue, name, state, tags)
SELECT 'default', 'app.work', (ARRAY['available', 'scheduled', 'running'])[1 + i % 3], ARRAY['import:7']
FROM generate_series(1, {UNFINISHED}) i;
INSERT INTO livepush_job_payloads (id, args) SELECT id, '[]' FROM livepush_jobs;
ANALYZE livepush_jobs; ANALYZE livepush_job_payloads;
"""


@pytest.fixture
def kept(jobs_db: str) -> str:
    """A database holding FINISHED finished jobs, FAILED of them failed, and a few unfinished, analyzed."""
    with psycopg.connect(jobs_db, autocommit=True) as conn:
        conn.execute(BUILD)
    return jobs_db


def _scans(node: Mapping[str, Any], table: str) -> Iterator[Mapping[str, Any]]:
    if node.get("Relation Name") == table:
        yield node
    for child in node.get("Plans", ()):
        yield from _scans(child, table)


def rows_read(url: str, sql: str, params: Mapping[str, Any], table: str = "livepush_jobs") -> int:
    """The rows of `table` the statement's plan read (returned or filtered out, every loop), run
    by EXPLAIN ANALYZE in a transaction that is rolled back; a sequential scan fails the test, and
    so does a plan costly enough that Postgres compiled it (JIT: seconds for a read of milliseconds)."""
    with psycopg.connect(url) as conn:
        cur = psycopg.ClientCursor(conn)
        (plan,), = cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchall()
        conn.rollback()
    plan = plan if isinstance(plan, list) else json.loads(plan)
    assert "JIT" not in plan[0], f"compiled: {plan[0]['JIT']}"
    read = 0
    for scan in _scans(plan[0]["Plan"], table):
        assert scan["Node Type"] != "Seq Scan", f"a sequential scan of {table}, filtered by {scan.get('Filter')}"
        read += (scan["Actual Rows"] + scan.get("Rows Removed by Filter", 0)
                 + scan.get("Rows Removed by Index Recheck", 0)) * scan["Actual Loops"]
    return read


def test_retention_with_nothing_due_reads_no_kept_job(kept: str) -> None:
    """A prune whose cutoff no job has passed reads none of the finished jobs it keeps."""
    assert rows_read(kept, gq.PRUNE_JOBS, {"retention": 7 * 86400, "limit": 1000}) == 0


def test_list_failed_reads_the_failed_jobs_only(kept: str) -> None:
    """jobs.list_failed() of a queue without failures reads the failed jobs, none of the
    succeeded ones around them."""
    params = {"before": 2**63 - 1, "queue": "elsewhere", "name": None, "limit": 100}
    assert rows_read(kept, queries.FAILED_JOBS, params) <= FAILED


def test_status_reads_the_unfinished_and_failed_jobs_only(kept: str) -> None:
    """`livepush status` counts its queues and tags from the unfinished and failed jobs, none of
    the succeeded ones retention keeps."""
    assert rows_read(kept, queries.QUEUE_STATUS, {}) <= UNFINISHED + FAILED
    assert rows_read(kept, queries.TAG_STATUS, {"limit": 20}) <= UNFINISHED


def test_status_lists_the_groups_and_runs_in_progress_without_reading_the_finished_ones(jobs_db: str) -> None:
    """`livepush status` finds the unfinished task groups and workflow runs it lists and counts
    through an index, beside the finished ones retention keeps."""
    with psycopg.connect(jobs_db, autocommit=True) as conn:
        conn.execute(f"""
            INSERT INTO livepush_groups (state, shards, finished_at)
            SELECT CASE WHEN i <= {UNFINISHED} THEN 'sealed' ELSE 'finished' END, 1,
                   CASE WHEN i > {UNFINISHED} THEN now() END
            FROM generate_series(1, {FINISHED}) i;
            INSERT INTO livepush_workflows (name, queue, state, graph, input, finished_at)
            SELECT 'app.flow', 'default', CASE WHEN i <= {UNFINISHED} THEN 'running' ELSE 'succeeded' END,
                   '{{"order": []}}', '{{}}', CASE WHEN i > {UNFINISHED} THEN now() END
            FROM generate_series(1, {FINISHED}) i;
            ANALYZE livepush_groups; ANALYZE livepush_workflows""")
    assert rows_read(jobs_db, gq.GROUPS_IN_PROGRESS, {"limit": 20}, "livepush_groups") <= UNFINISHED
    assert rows_read(jobs_db, wq.RUNS_IN_PROGRESS, {"limit": 20}, "livepush_workflows") <= UNFINISHED
