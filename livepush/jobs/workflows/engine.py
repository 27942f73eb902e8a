"""The decisions of workflow runs, written once as sans-I/O steps (groups/steps.py runs them).

Every decision locks the run (queries.LOCK_RUNS), reads its steps, computes what changes with a
`Plan` (pure: tests call it directly), and writes it: step states, the jobs of steps that became
ready, the run's state and a new version of its topic, the audit trail. queries.py says why a
step therefore starts exactly once.

- `start_run`: a new run and its first steps (or, with a key, the unfinished run holding it).
- `steps_ended`: jobs of steps ended (called in the transaction that ended them, by every path
  that ends a job: groups/outcomes.py).
- `operator`: pause, resume, cancel, skip (operators.py calls it, then cancels the jobs it names
  in later transactions).
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ...errors import LivepushError
from .. import queries as job_queries
from ..api.args import PAST_ONE_MESSAGE, check_sendable, dumps
from ..errors import MessageTooLarge, OutputsTooLarge
from ..groups.steps import Query, Steps
from . import queries as wq

# The states a run's row holds (sql/0006_workflows.sql), and those it ends in.
RUN_STATES = ("running", "paused", "succeeded", "failed", "cancelled")
RUN_FINISHED = frozenset({"succeeded", "failed", "cancelled"})
STEP_DONE = frozenset({"succeeded", "skipped"})
STEP_ACTIVE = frozenset({"running", "waiting"})
STEP_FINISHED = frozenset({"succeeded", "skipped", "failed", "cancelled"})


@dataclasses.dataclass
class Plan:
    """What one decision does to one run: built from the run and its steps as read under the lock."""

    run: dict[str, Any]
    steps: dict[str, dict[str, Any]]
    changed: set[str] = dataclasses.field(default_factory=set)
    state: str = ""
    event: str | None = None
    output: Any = None
    error: str | None = None
    audit: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    to_cancel: list[int] = dataclasses.field(default_factory=list)  # jobs to cancel after commit
    to_stop: list[int] = dataclasses.field(default_factory=list)  # jobs to stop now, if not busy

    def _stop(self, job_id: int) -> None:
        """An operator verb ended the step of this job: the job is stopped in the verb's own
        transaction (a queued or parked one cancelled, a running one told), so an operator's
        process that dies right after the commit leaves no job waiting for a run that will never
        take it again; and cancelled once more after the commit (which also stops what a parked
        one waits for, and tells a busy one that the transaction skipped)."""
        self.to_stop.append(job_id)
        self.to_cancel.append(job_id)

    def __post_init__(self) -> None:
        self.state = self.run["state"]
        self.graph = self.run["graph"]

    @property
    def id(self) -> int:
        return int(self.run["id"])

    def _set(self, name: str, state: str, *, output: Any = None, error: str | None = None) -> None:
        step = self.steps[name]
        step["state"] = state
        if output is not None:
            step["output"] = output
        step["error"] = error
        self.changed.add(name)

    def _finish(self, state: str, event: str, *, error: str | None = None, output: Any = None) -> None:
        self.state, self.event = state, event
        if error is not None:
            self.error = error
        if output is not None:
            self.output = output
        for name, step in self.steps.items():
            if step["state"] == "pending":  # what has not started never will
                self._set(name, "cancelled" if state != "succeeded" else "skipped")
            elif step["state"] in STEP_ACTIVE:
                # A step still running beside the one that ended the run: its job is stopped (a
                # parked one would otherwise wait for ever) and what it does no longer counts.
                self._set(name, "skipped" if state == "succeeded" else "cancelled", error=f"the run {state} first")
                if step["job_id"] is not None:
                    self.to_stop.append(int(step["job_id"]))

    def _note(self, verb: str, step: str | None, actor: str | None, reason: str | None) -> None:
        self.audit.append({"id": self.id, "verb": verb, "step": step, "actor": actor, "reason": reason})

    # -- a step's job ended -------------------------------------------------------------------
    def job_ended(self, job: dict[str, Any]) -> None:
        """Record how the job running a step ended (its row from the ending statement)."""
        name = next((n for n, s in self.steps.items() if s["job_id"] == job["id"]), None)
        if name is None or self.steps[name]["state"] not in STEP_ACTIVE:
            return  # an older job of a step that was rerun, skipped or cancelled meanwhile
        state, result = job["state"], job.get("result") or {}
        if state == "succeeded":
            self._verb(name, result)
        elif state == "failed":
            self._set(name, "failed", error=job.get("error"))
            if self.state not in RUN_FINISHED:
                self._finish("failed", "finished", error=f"step {name!r} failed: {job.get('error')}")
        else:  # cancelled: by an operator's cancel of the run (already recorded) or of the job itself
            self._set(name, "cancelled", error=job.get("error"))
            if self.state not in RUN_FINISHED:
                self._finish("cancelled", "cancelled", error=f"step {name!r} was cancelled")
        self.event = self.event or "step"

    def _verb(self, name: str, result: dict[str, Any]) -> None:
        verb, reason, actor = result.get("verb", "complete"), result.get("reason"), f"step:{name}"
        output = result.get("output")
        if verb == "complete":
            self._set(name, "succeeded", output=output)
        elif verb == "finish":
            self._set(name, "succeeded", output=output)
            self._note("finish", name, actor, reason)
            if self.state not in RUN_FINISHED:
                self._finish("succeeded", "finished", output=output)
        elif verb == "skip":
            self._set(name, "skipped", output=output, error=reason)
            self._note("skip", name, actor, reason)
        elif verb == "cancel":
            self._set(name, "cancelled", output=output, error=reason)
            self._note("cancel", name, actor, reason)
            if self.state not in RUN_FINISHED:
                # The run's error says why it ended (docs/workflows.md), reason given or not.
                self._finish("cancelled", "cancelled", error=reason or f"step {name!r} cancelled the run")
        elif verb == "pause":
            # The step runs again (a new job) when the run is resumed.
            self._set(name, "pending", output=output, error=reason)
            self._note("pause", name, actor, reason)
            if self.state == "running":
                self.state, self.event = "paused", "paused"
        else:
            # A result this code does not know (written by another deploy): the step failed, and
            # so the run, as any failed step ends it; left running, the run would wait for ever.
            error = f"unknown flow verb {verb!r}: run every runtime on one release of livepush"
            self._set(name, "failed", error=error)
            if self.state not in RUN_FINISHED:
                self._finish("failed", "finished", error=f"step {name!r} failed: {error}")

    # -- operators ----------------------------------------------------------------------------
    def operator(self, verb: str, step: str | None, actor: str | None, reason: str | None) -> bool:
        """Apply an operator verb; False when it does not apply to the run as it is."""
        if verb == "pause":
            if self.state != "running":
                return False
            self.state, self.event = "paused", "paused"
        elif verb == "resume":
            if self.state != "paused":
                return False
            self.state, self.event = "running", "resumed"
        elif verb == "cancel":
            if self.state in RUN_FINISHED:
                return False
            for name, s in self.steps.items():
                if s["state"] in STEP_ACTIVE:
                    self._set(name, "cancelled", error=reason or "cancelled")
                    self._stop(int(s["job_id"]))
            self._finish("cancelled", "cancelled", error=reason or "cancelled")
        elif verb == "skip":
            assert step is not None
            s = self.steps[step]
            if self.state in RUN_FINISHED or s["state"] in STEP_FINISHED:
                return False
            if s["state"] in STEP_ACTIVE and s["job_id"] is not None:
                self._stop(int(s["job_id"]))
            self._set(step, "skipped", error=reason)
            self.event = "step"
        else:
            raise ValueError(verb)
        self._note(verb, step, actor, reason)
        return True

    # -- what follows -------------------------------------------------------------------------
    def ready(self) -> list[str]:
        """Pending steps whose every `after` step succeeded or was skipped, in definition order.
        A step skipped before what it comes after finished counts as done only once that is done
        too: it stands for a step that succeeded, which it could not have before them (an
        operator may skip a step that has not started)."""
        if self.state != "running":
            return []
        specs = self.graph["steps"]
        done: dict[str, bool] = {}
        for n in self.graph["order"]:  # a topological order: what a step comes after is decided first
            state = self.steps[n]["state"]
            done[n] = state == "succeeded" or (state == "skipped" and all(done[d] for d in specs[n]["after"]))
        return [n for n in self.graph["order"] if self.steps[n]["state"] == "pending"
                and all(done[d] for d in specs[n]["after"])]

    def settle(self) -> list[str]:
        """The steps to start now; finishes the run when nothing is left to do."""
        ready = self.ready()
        if not ready and self.state == "running" and all(s["state"] in STEP_DONE for s in self.steps.values()):
            self._finish("succeeded", "finished")
        return ready


def _plans(runs: Sequence[dict[str, Any]], steps: Sequence[dict[str, Any]]) -> dict[int, Plan]:
    by_run: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for s in steps:
        by_run[s["workflow_id"]][s["name"]] = dict(s)
    return {r["id"]: Plan(dict(r), by_run[r["id"]]) for r in runs}


def _load(ids: Sequence[int]) -> Steps[dict[int, Plan]]:
    runs = yield Query(wq.LOCK_RUNS, {"ids": sorted(set(ids))})
    if not runs:
        return {}
    # A later statement than the lock: it sees every earlier decision's commit.
    steps = yield Query(wq.STEPS_OF, {"ids": [r["id"] for r in runs]})
    return _plans(runs, steps)


def _write(plan: Plan) -> Steps[None]:
    """Write what the plan decided and start the steps that are ready: one statement (DECIDE)."""
    ready = plan.settle()
    specs = plan.graph["steps"]
    if ready:
        plan.changed -= set(ready)
        plan.event = plan.event or "step"
    if plan.to_stop:
        yield Query(job_queries.STOP_JOBS, {"ids": sorted(plan.to_stop)})
    if not ready and not plan.changed and not plan.audit and plan.event is None:
        return  # nothing changed (the end of a job that no longer runs its step)
    if plan.event is not None and any(s.get("group_id") is not None for s in plan.steps.values()):
        # The new version shows the batches' counts as they are now (and a finished run keeps
        # them), not as the last ring of their progress left them.
        yield Query(wq.RECORD_BATCHES, {"id": plan.id})
    names = sorted(plan.changed)
    audit = plan.audit
    # Outputs come back from jsonb as the step returned them; written again with json.dumps, a
    # float from 1e16 up ("1e+16") would be stored as the int it equals (api/args.py: dumps).
    params = {
        "id": plan.id, "queue": plan.run["queue"],
        "start": ready, "jobs": [specs[n]["job"] for n in ready],
        "priorities": [specs[n].get("priority", 0) for n in ready],
        "max_attempts": [specs[n].get("max_attempts", 5) for n in ready],
        "wait_for": [specs[n].get("wait_for") for n in ready],
        "names": names, "states": [plan.steps[n]["state"] for n in names],
        "outputs": [None if plan.steps[n].get("output") is None else dumps(plan.steps[n]["output"])
                    for n in names],
        "errors": [plan.steps[n].get("error") for n in names],
        "verbs": [a["verb"] for a in audit], "verb_steps": [a["step"] for a in audit],
        "actors": [a["actor"] for a in audit], "reasons": [a["reason"] for a in audit],
        "state": plan.state, "event": plan.event, "error": plan.error, "wake": plan.event == "resumed",
        "output": None if plan.output is None else dumps(plan.output)}
    try:
        # Checked here as well as where the statement is sent (groups/steps.py), which cannot say
        # whose outputs they are: outputs each within the limit may pass it together.
        check_sendable(params)
    except MessageTooLarge as exc:
        raise OutputsTooLarge(_outputs_too_large(plan, names)) from exc
    yield Query(wq.DECIDE, params)
    for name in ready:
        plan.steps[name]["state"] = "running"


def _outputs_too_large(plan: Plan, names: Sequence[str]) -> str:
    """OutputsTooLarge's text: the run, the outputs its decision writes, and what to do."""
    stepped = [n for n in names if plan.steps[n].get("output") is not None]
    said = [f"the output of step {stepped[0]!r}"] if len(stepped) == 1 else (
        [f"the outputs of steps {', '.join(map(repr, stepped))}"] if stepped else [])
    if plan.output is not None:
        said.append("the run's own output (ctx.flow.finish)")
    what = " and ".join(said) or "what one decision about it writes"
    verb = "is" if len(stepped) + (plan.output is not None) <= 1 else "are together"
    return (f"workflow {plan.run['name']!r} run {plan.id}: {what} {verb} {PAST_ONE_MESSAGE}: keep large "
            f"data elsewhere (a table, a file) and return a reference to it from the step{'s' * (len(stepped) > 1)}")


def start_run(name: str, queue: str, graph: dict[str, Any], input_json: str, key: str | None = None) -> Steps[int]:
    """Insert a run and start its first steps, in the caller's transaction. Returns its id. With a
    `key`, the id of the unfinished run of the workflow holding it, if any, and nothing written."""
    params = {"name": name, "queue": queue, "graph": json.dumps(graph), "input": input_json,
              "steps": list(graph["order"]), "key": key}
    # Each round either inserts, finds the holder, or saw the holder finish in between (the key
    # is free then, so the next insert takes it): a few rounds at most, as a keyed enqueue's.
    for _ in range(100):
        inserted = yield Query(wq.INSERT_RUN, params)
        if inserted:
            break
        held = yield Query(wq.KEYED_RUN, {"name": name, "key": key})
        if held:
            return int(held[0]["id"])
    else:
        raise LivepushError(f"the start of workflow {name!r} with key {key!r} lost 100 races in a row "
                            "to other starts and ends of runs with that key: start it again")
    (row,) = inserted
    plans = yield from _load([row["id"]])
    plan = plans[row["id"]]
    plan.event = "started"
    yield from _write(plan)
    return int(row["id"])


def steps_ended(rows: Sequence[dict[str, Any]]) -> Steps[None]:
    """In the transaction that ended them: record how the jobs of workflow steps among `rows`
    ended (rows with a `workflow_id`), and start what follows."""
    by_run: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("workflow_id") is not None:
            by_run[int(r["workflow_id"])].append(r)
    if not by_run:
        return
    plans = yield from _load(list(by_run))
    for run_id, plan in sorted(plans.items()):
        for job in by_run[run_id]:
            plan.job_ended(job)
        yield from _write(plan)


def operator(run_id: int, verb: str, step: str | None, actor: str | None, reason: str | None
             ) -> Steps[tuple[bool, list[int], dict[str, Any] | None]]:
    """An operator verb on a run: (applied, jobs to cancel after commit, the run as read), or the
    run None when there is no such run."""
    plans = yield from _load([run_id])
    plan = plans.get(run_id)
    if plan is None:
        return False, [], None
    if step is not None and step not in plan.steps:
        raise KeyError(step)
    if not plan.operator(verb, step, actor, reason):
        return False, [], plan.run
    yield from _write(plan)
    return True, plan.to_cancel, plan.run
