"""Checks that every step of every workflow run started once per job generation, and only when it
could, for the random and the kill -9 tests of workflows.

The recording: a deferred constraint trigger runs at the commit of each transaction that created a
step's job (after every statement of it, so it sees the run and its steps as that decision leaves
them) and records the run's state, the states of the steps the started one comes after, the
started step's row and any other unfinished job of the same step. A rolled-back start records
nothing, like the job it created.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tests.jobs.conftest import q

STARTS_TABLE = """
CREATE TABLE test_wf_starts (
    job_id      bigint NOT NULL,
    run_id      bigint NOT NULL,
    job_name    text NOT NULL,
    step        text,
    run_state   text,
    deps        jsonb,
    step_state  text,
    others      jsonb,
    xid         bigint NOT NULL DEFAULT txid_current()
);
CREATE FUNCTION test_record_wf_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_wf_starts (job_id, run_id, job_name, step, run_state, deps, step_state, others)
    SELECT NEW.id, NEW.workflow_id, NEW.name, st.name, w.state,
           (SELECT coalesce(jsonb_object_agg(d.name, d.state), '{}'::jsonb) FROM livepush_workflow_steps d
            WHERE d.workflow_id = NEW.workflow_id
              AND d.name IN (SELECT jsonb_array_elements_text(w.graph -> 'steps' -> st.name -> 'after'))),
           st.state,
           (SELECT coalesce(jsonb_agg(jsonb_build_object('id', o.id, 'state', o.state)), '[]'::jsonb)
            FROM livepush_jobs o
            WHERE o.workflow_id = NEW.workflow_id AND o.name = NEW.name AND o.id <> NEW.id
              AND o.state NOT IN ('succeeded', 'failed', 'cancelled'))
    FROM (SELECT NEW.workflow_id AS id) r
    LEFT JOIN livepush_workflows w ON w.id = r.id
    LEFT JOIN livepush_workflow_steps st ON st.workflow_id = r.id AND st.job_id = NEW.id;
    RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER test_record_wf_start AFTER INSERT ON livepush_jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.workflow_id IS NOT NULL)
    EXECUTE FUNCTION test_record_wf_start();
"""

DONE = ("succeeded", "skipped")


def bad_starts(url: str) -> list[str]:
    """Every step start that broke a rule, described: a job created without being its step's job at
    commit, in a run not running, before a step it comes after succeeded or was skipped, or while
    another job of the same step was unfinished."""
    problems: list[str] = []
    jobs = q(url, "SELECT id, workflow_id, name FROM livepush_jobs WHERE workflow_id IS NOT NULL")
    starts = {r[0]: r for r in q(url, """SELECT job_id, run_id, job_name, step, run_state, deps, step_state, others
                                         FROM test_wf_starts""")}
    for job_id, run_id, name in jobs:
        row = starts.get(job_id)
        if row is None:
            problems.append(f"job {job_id} ({name}, run {run_id}): created with no start recorded at its commit")
            continue
        _, _, _, step, run_state, deps, step_state, others = row
        where = f"job {job_id} ({name}, run {run_id})"
        if step is None:
            problems.append(f"{where}: at its commit no step of the run pointed at it")
        if run_state != "running":
            problems.append(f"{where}: started in a run that was {run_state!r} at commit")
        if any(state not in DONE for state in (deps or {}).values()):
            problems.append(f"{where}: started while the steps it comes after were {deps}")
        if step_state != "running":
            problems.append(f"{where}: its step was {step_state!r} at commit")
        if others:
            problems.append(f"{where}: started while other jobs of its step were unfinished: {others}")
    return problems


def step_jobs(url: str) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """Every step's jobs, oldest first: (run, job name) -> [{id, state, result}]."""
    by_step: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for job_id, run_id, name, state, result in q(url, """
            SELECT j.id, j.workflow_id, j.name, j.state, p.result
            FROM livepush_jobs j JOIN livepush_job_payloads p ON p.id = j.id
            WHERE j.workflow_id IS NOT NULL ORDER BY j.id"""):
        by_step[(run_id, name)].append({"id": job_id, "state": state, "result": result})
    return by_step


def step_pauses(url: str) -> dict[tuple[int, str], int]:
    """How many times each step paused its run itself (ctx.flow.pause, or its batch's failures), as
    the audit trail recorded: (run, step name) -> count."""
    return {(run_id, step): n for run_id, step, n in q(url, """
        SELECT workflow_id, step, count(*) FROM livepush_workflow_audit
        WHERE verb = 'pause' AND actor = 'step:' || step GROUP BY 1, 2""")}


def bad_generations(url: str) -> list[str]:
    """Steps with more than one job where an earlier job did not end by pausing the run (the one way
    a step runs again: a `pause` verb and then a resume), or with more jobs than recorded pauses."""
    problems: list[str] = []
    pauses = step_pauses(url)
    for (run_id, name), jobs in step_jobs(url).items():
        step = name.split(".", 1)[1]
        for job in jobs[:-1]:
            verb = (job["result"] or {}).get("verb") if isinstance(job["result"], dict) else None
            if job["state"] != "succeeded" or verb != "pause":
                problems.append(f"run {run_id} step {step!r}: job {job['id']} ({job['state']}, verb {verb!r}) was "
                                f"followed by another job of the step: {[j['id'] for j in jobs]}")
        if len(jobs) - 1 > pauses.get((run_id, step), 0):
            problems.append(f"run {run_id} step {step!r}: {len(jobs)} jobs {[j['id'] for j in jobs]} but "
                            f"{pauses.get((run_id, step), 0)} pauses recorded by the step")
    return problems


def bad_batches(url: str) -> list[str]:
    """Fan-out batches made more than once by one job, or whose member count is not the group's total."""
    problems: list[str] = []
    for parent_id, n in q(url, "SELECT parent_id, count(*) FROM livepush_groups WHERE parent_id IS NOT NULL "
                               "GROUP BY parent_id HAVING count(*) > 1"):
        problems.append(f"job {parent_id} made {n} batches")
    for group_id, total, members in q(url, """
            SELECT g.id, g.total, (SELECT count(*) FROM livepush_jobs j WHERE j.group_id = g.id)
            FROM livepush_groups g WHERE g.parent_id IS NOT NULL"""):
        if total != members:
            problems.append(f"batch {group_id}: total {total}, members {members}")
    return problems
