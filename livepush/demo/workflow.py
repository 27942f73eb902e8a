"""The workflow's endpoints: start a run of `demo_import`, learn its fan-out step's batch, approve
it, pause, resume or cancel it, read its audit trail.

Only runs of the demo's own workflow are ever read or steered here: an id that names a run of any
other workflow is answered as unknown, so the page's buttons cannot reach a run the demo did not
start. Like the durable import's endpoints, each check reads the run's row (not a list kept in
memory), so a page still works after the demo restarts.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from .. import jobs
from . import jobs as demo_jobs
from .durable import FINAL_STATES, Refused, query_id

MAX_ROWS = 500
ACTOR = "demo page"  # who the audit trail says pressed the page's buttons


def run_id(query: dict[str, list[str]]) -> int:
    """The `run` parameter as a run id; Refused (400) for anything but one canonical id."""
    return query_id(query, "run", "a workflow run")


async def start(rows: int) -> dict[str, Any]:
    """Start one run of the workflow over `rows` rows; what the page needs to follow it."""
    handle = await demo_jobs.flow.astart({"rows": rows})
    return {"run_id": handle.id, "run_topic": handle.signed_topic}


async def _run(run: int) -> dict[str, Any]:
    """The run as jobs.workflows.get() reads it; Refused (404) for a run of any other workflow."""
    # aget(), get()'s async twin, reads on the demo's loop: no worker thread held per click.
    info: dict[str, Any] | None = await jobs.workflows.aget(run)
    if info is None or info["name"] != demo_jobs.WORKFLOW:
        raise Refused(404, f"there is no workflow run {run}")
    return info


async def batch(run: int) -> dict[str, Any]:
    """The task group of the run's fan-out step, with its topic signed for the page."""
    info = await _run(run)
    group = info["steps"]["rows"]["group"]
    if not isinstance(group, int):
        state = info["steps"]["rows"]["state"]
        raise Refused(409, f"workflow run {run} has not fanned its rows out yet (its rows step is {state})")
    return {"group_id": group, "group_topic": jobs.GroupHandle(group).signed_topic}


async def approve(run: int) -> dict[str, Any]:
    """Send the run its approval; Refused (409) unless its report step waits for one now."""
    info = await _run(run)
    if info["state"] in FINAL_STATES:
        raise Refused(409, f"workflow run {run} has finished ({info['state']}): there is nothing to approve")
    if info["state"] == "paused":
        # The report would run while the run shows paused: resuming first keeps the two apart.
        raise Refused(409, f"workflow run {run} is paused: resume it before approving")
    report = info["steps"]["report"]["state"]
    if report != "waiting":
        # A signal is kept until the step waits for it; refusing early keeps one click, one approval.
        raise Refused(409, f"workflow run {run} is not waiting for approval now (its report step is {report})")
    data = {"by": ACTOR, "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        await jobs.workflows.asignal(run, demo_jobs.APPROVAL, data, actor=ACTOR)
    except jobs.WorkflowNotFound:
        raise Refused(404, f"there is no workflow run {run}") from None
    except ValueError:  # it finished, or the step stopped waiting, since the read above
        raise Refused(409, f"workflow run {run} is not waiting for approval any more") from None
    return {"run_id": run, "approved": data}


async def pause(run: int) -> dict[str, Any]:
    """Pause the run: its running steps finish, nothing new starts. Refused (409) unless it runs."""
    info = await _run(run)
    if not await jobs.workflows.apause(run, actor=ACTOR, reason="pressed Pause on the demo page"):
        raise Refused(409, f"workflow run {run} is not running (it is {info['state']}): there is nothing to pause")
    return {"run_id": run, "paused": True}


async def resume(run: int) -> dict[str, Any]:
    """Resume the paused run: the steps that are ready start. Refused (409) unless it is paused."""
    info = await _run(run)
    if not await jobs.workflows.aresume(run, actor=ACTOR, reason="pressed Resume on the demo page"):
        raise Refused(409, f"workflow run {run} is not paused (it is {info['state']}): there is nothing to resume")
    return {"run_id": run, "resumed": True}


async def cancel(run: int) -> dict[str, Any]:
    """Cancel the run: its running and parked steps' jobs are cancelled, nothing more starts.
    Refused (409) once it has finished."""
    info = await _run(run)
    if not await jobs.workflows.acancel(run, actor=ACTOR, reason="pressed Cancel on the demo page"):
        raise Refused(409, f"workflow run {run} has finished ({info['state']}): there is nothing to cancel")
    return {"run_id": run, "cancelled": True}


def _at(value: Any) -> Any:
    return value.astimezone(timezone.utc).isoformat(timespec="milliseconds") if isinstance(value, datetime) else value


async def audit(run: int) -> dict[str, Any]:
    """The run's audit trail, oldest first, and its report step's summary once it wrote one (the
    state topic carries neither: the page reads them here when the topic says something changed)."""
    info = await _run(run)
    entries = [{"verb": a["verb"], "step": a["step"], "actor": a["actor"], "reason": a["reason"], "at": _at(a["at"])}
               for a in info["audit"]]
    report = info["steps"]["report"]
    return {"run_id": run, "state": info["state"], "audit": entries,
            "summary": report["output"] if report["state"] == "succeeded" else None}
