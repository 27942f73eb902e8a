"""The decisions of a workflow run as pure code (workflows/engine.Plan): what starts, what a step's
end or an operator verb changes. No database: the transactions around them are tested in
test_workflows.py."""

from __future__ import annotations

from typing import Any

from livepush.jobs.workflows.engine import Plan


def plan(states: dict[str, str], after: dict[str, list[str]], run_state: str = "running",
         jobs: dict[str, int] | None = None) -> Plan:
    graph = {"order": list(states), "steps": {n: {"after": after.get(n, []), "job": f"w.{n}"} for n in states}}
    steps = {n: {"name": n, "state": s, "job_id": (jobs or {}).get(n), "output": None, "error": None}
             for n, s in states.items()}
    return Plan({"id": 1, "state": run_state, "graph": graph, "queue": "q", "input": None}, steps)


def ended(p: Plan, job_id: int, state: str, result: Any = None, error: str | None = None) -> None:
    p.job_ended({"id": job_id, "state": state, "result": result, "error": error})


def test_a_step_is_ready_only_when_everything_it_comes_after_succeeded_or_was_skipped() -> None:
    """Ready: pending, and every `after` step succeeded or skipped; in definition order."""
    p = plan({"a": "succeeded", "b": "skipped", "c": "pending", "d": "pending", "e": "pending"},
             {"c": ["a", "b"], "d": ["c"], "e": ["a"]})
    assert p.ready() == ["c", "e"]


def test_nothing_starts_in_a_paused_or_finished_run() -> None:
    """A paused or finished run starts nothing."""
    for state in ("paused", "succeeded", "failed", "cancelled"):
        assert plan({"a": "pending"}, {}, state).ready() == []


def test_the_last_step_succeeding_finishes_the_run() -> None:
    """When every step succeeded or was skipped, the run succeeds."""
    p = plan({"a": "succeeded", "b": "running"}, {"b": ["a"]}, jobs={"b": 7})
    ended(p, 7, "succeeded", {"verb": "complete", "output": 3})
    assert p.settle() == [] and p.state == "succeeded" and p.event == "finished"
    assert p.steps["b"]["output"] == 3


def test_a_failed_step_fails_the_run_and_cancels_what_has_not_started() -> None:
    """A step that failed for good fails the run; pending steps become cancelled, none starts."""
    p = plan({"a": "running", "b": "pending"}, {"b": ["a"]}, jobs={"a": 5})
    ended(p, 5, "failed", error="ValueError: no")
    assert p.state == "failed" and p.steps["b"]["state"] == "cancelled" and p.settle() == []
    assert "step 'a' failed: ValueError: no" in (p.error or "")


def test_a_step_ended_with_an_unknown_verb_fails_the_run() -> None:
    """A step whose result names a verb this code does not know failed, and fails its run as any
    failed step does: the run never stays running with a failed step."""
    p = plan({"a": "running", "b": "pending"}, {"b": ["a"]}, jobs={"a": 5})
    ended(p, 5, "succeeded", {"verb": "teleport"})
    assert p.steps["a"]["state"] == "failed" and "unknown flow verb 'teleport'" in p.steps["a"]["error"]
    assert p.state == "failed" and p.steps["b"]["state"] == "cancelled" and p.settle() == []


def test_an_older_job_of_a_step_changes_nothing() -> None:
    """The end of a job that no longer runs its step (rerun, skipped) is ignored."""
    p = plan({"a": "running"}, {}, jobs={"a": 9})
    ended(p, 8, "failed", error="old")
    assert p.steps["a"]["state"] == "running" and p.state == "running" and not p.changed


def test_operator_verbs_apply_only_where_they_make_sense() -> None:
    """pause only a running run, resume only a paused one, cancel only an unfinished one, skip only
    an unfinished step; cancel and skip name the jobs to stop."""
    p = plan({"a": "running", "b": "pending"}, {"b": ["a"]}, jobs={"a": 3})
    assert not p.operator("resume", None, "ana", None)
    assert p.operator("pause", None, "ana", "why") and p.state == "paused" and p.ready() == []
    assert not p.operator("pause", None, "ana", None)
    assert p.operator("skip", "a", "ana", None) and p.to_cancel == [3]
    assert p.operator("resume", None, "ana", None) and p.ready() == ["b"]
    assert p.operator("cancel", None, "bo", "enough") and p.state == "cancelled"
    assert p.steps["b"]["state"] == "cancelled" and not p.operator("cancel", None, "bo", None)
    assert [(a["verb"], a["actor"]) for a in p.audit] == [("pause", "ana"), ("skip", "ana"), ("resume", "ana"),
                                                           ("cancel", "bo")]


def test_a_pause_verb_from_a_step_makes_it_run_again_on_resume() -> None:
    """ctx.flow.pause: the step is pending again and the run paused; resume makes it ready."""
    p = plan({"a": "running"}, {}, jobs={"a": 4})
    ended(p, 4, "succeeded", {"verb": "pause", "reason": "check"})
    assert p.steps["a"]["state"] == "pending" and p.state == "paused" and p.ready() == []
    assert p.operator("resume", None, "ana", None) and p.ready() == ["a"]


def test_a_run_cancelled_by_a_step_without_a_reason_says_which_step_cancelled_it() -> None:
    """ctx.flow.cancel() with no reason still gives the cancelled run an error saying why it ended
    (the step that cancelled it), as an operator's cancel without one does; a reason given is the
    error as it was given."""
    p = plan({"a": "running", "b": "pending"}, {"b": ["a"]}, jobs={"a": 5})
    ended(p, 5, "succeeded", {"verb": "cancel", "reason": None})
    assert (p.state, p.error) == ("cancelled", "step 'a' cancelled the run")
    assert p.audit[-1]["reason"] is None, "the audit trail keeps the reason as the step gave it"
    p = plan({"a": "running"}, {}, jobs={"a": 5})
    ended(p, 5, "succeeded", {"verb": "cancel", "reason": "wrong file"})
    assert (p.state, p.error) == ("cancelled", "wrong file")
