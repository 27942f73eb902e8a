"""What the state topics of jobs and groups show (docs/reference.md#6-events-on-state-topics),
built from their rows in one place:

    job:<id>    {"event": ..., "job": {"id", "name", "queue", "state", "attempt", "max_attempts",
                                       "progress": {"done", "total", "message"}, "error", "run_at"}}
                and "result" once succeeded; for durable jobs, "waiting": {"for", "name"} while
                waiting, "checkpoint": NAME on a `checkpoint` event
    group:<id>  {"event": ..., "group": {"id", "state", "total", "pending", "succeeded", "failed",
                                         "cancelled"}}

    workflow:<id>  {"event": ..., "workflow": {"id", "name", "state",
                                              "steps": {NAME: {"state", "attempt", "group"}}}}
                   (a fan-out step also has "batch": {"total", "pending", "succeeded", "failed",
                   "cancelled"}, its batch's progress)

The event is the row's last change ("snapshot" for a new subscriber's first message), and the
offset is the row's version.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from ...types import State
from ..api.args import dumps

EMPTY_PROGRESS = {"done": 0, "total": None, "message": None}
GROUP_KEYS = ("id", "state", "total", "pending", "succeeded", "failed", "cancelled")
# A running job or a group changes its progress on its topic at most this often (seconds):
# about ten updates a second are what a page can show, and a busy job costs Postgres little.
PROGRESS_INTERVAL = 0.1


def iso(value: Any) -> Any:
    """A timestamp as ISO 8601 in UTC (whatever the session's time zone), else the value as is."""
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat()
    return value


def progress_view(stored: Mapping[str, Any] | None, attempt: int) -> dict[str, Any] | None:
    """The `progress` object of a job at `attempt` from what its payload stores (the attempt that
    reported it beside done, total and message); None when this attempt reported none."""
    if stored is None or stored.get("attempt", attempt) < attempt:
        # None yet, or reported by an earlier attempt: a retried job starts again from nothing,
        # and showing how far the failed attempt got as the new one's (up to its final state,
        # when it reports none) would be stale state shown as current. A later attempt's is the
        # same run's: parking gives the attempt back until the run wakes and replays. (The
        # statements that give an attempt back for a run that starts over clear its progress.)
        return None
    return {"done": stored.get("done"), "total": stored.get("total"), "message": stored.get("message")}


def job_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """The `job` object from a row of queries.VIEW_COLUMNS."""
    view = {
        "id": row["id"],
        "name": row["name"],
        "queue": row["queue"],
        "state": row["state"],
        "attempt": row["attempt"],
        "max_attempts": row["max_attempts"],
        "progress": progress_view(row.get("progress"), row["attempt"]) or dict(EMPTY_PROGRESS),
        "error": row.get("error"),
        "run_at": iso(row["run_at"]),
    }
    # Keys that only some states have, so that a plain job's view stays as it always was.
    if row["state"] == "succeeded":
        view["result"] = row.get("result")
    elif row["state"] == "waiting":
        waiting = row.get("waiting") or {}
        view["waiting"] = {k: waiting[k] for k in ("for", "name", "group") if k in waiting}
    if row["event"] == "checkpoint":
        view["checkpoint"] = row.get("checkpoint")
    return view


def group_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """The `group` object from a row of groups.queries.GROUP_VIEWS."""
    return {k: row[k] for k in GROUP_KEYS}


def job_state(row: Mapping[str, Any]) -> State:
    return State(int(row["version"]), row["event"], "job", dumps(job_view(row)))


def group_state(row: Mapping[str, Any]) -> State:
    return State(int(row["version"]), row["event"], "group", dumps(group_view(row)))


def group_event(row: Mapping[str, Any], event: str | None = None) -> dict[str, Any]:
    """The message a group row shows, as recorded for jobs.group_history(): `event`, unless the
    group is cancelled or finished, whose topic shows that label for every change from then on
    (the history holds what the topic showed)."""
    label = row["event"] if row["event"] in ("cancelled", "finished") else event or row["event"]
    return {"event": label, "group": group_view(row)}


def workflow_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """The `workflow` object from a row of workflows.queries.TOPIC_VIEWS (or RUN_VIEWS). A running
    run whose active steps all wait (for their batch, a signal, a sleep) shows as `waiting`; a
    fan-out step shows its batch's counts."""
    steps = {name: {"state": s["state"], "attempt": s["attempt"], "group": s["group"],
                    **({"batch": s["batch"]} if s.get("batch") else {})}
             for name, s in row["steps"].items()}
    state = row["state"]
    active = [s["state"] for s in steps.values() if s["state"] in ("running", "waiting")]
    if state == "running" and active and all(a == "waiting" for a in active):
        state = "waiting"
    order = (row.get("graph") or {}).get("order") or list(steps)
    return {"id": row["id"], "name": row["name"], "state": state,
            "steps": {name: steps[name] for name in order if name in steps}}


def workflow_state(row: Mapping[str, Any]) -> State:
    return State(int(row["version"]), row["event"], "workflow", dumps(workflow_view(row)))
