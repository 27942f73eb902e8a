"""`jobs.signal()` / `asignal()`: send a named signal (JSON data) to a job, in our transaction or
the caller's (`conn=`, delivered if and only if it commits)."""

from __future__ import annotations

from typing import Any

from ...types import shown
from ...blocking import warn_if_on_event_loop
from ...errors import ArgumentValueError
from ...postgres.text import unstorable
from ..api.args import encode, stored_whole
from ..api.awaited import awaited
from ..api.handles import NO_SUCH_ID, checked_id
from ..errors import InvalidArgumentsError, JobFinishedError, JobNotFound, WorkflowStepSignalError
from ..groups import steps
from ..groups.transactions import ain_tx, in_tx
from ..workflows.queries import STEP_WAITING_FOR
from . import queries as dq
from .run import MAX_NAME, check_name

_FINISHED = frozenset({"succeeded", "failed", "cancelled"})


def _send_steps(job_id: int, name: str, data: str, key: str | None) -> steps.Steps[int]:
    """Lock the job, refuse a missing or finished one (nothing written), keep the signal and wake
    the job if it is parked on this name. Returns the signal's id: with a `key` already sent to
    this job, the first one's, and nothing is sent again."""
    found = yield steps.Query(dq.SIGNAL_TARGET, {"id": job_id})
    if not found:
        raise JobNotFound(f"no job {shown(job_id)} (never enqueued, or deleted after its retention time): "
                          "the signal was not sent")
    if key is not None:
        # Before the finished check: a retry whose first send committed, and which the job then
        # took and finished with, was sent, not refused.
        sent = yield steps.Query(dq.KEYED_SIGNAL, {"id": job_id, "key": key})
        if sent:
            return _sent_before(sent[0], f"job {job_id}", name, key)
    state = found[0]["state"]
    if state in _FINISHED:
        raise JobFinishedError(f"job {job_id} has {state}: it takes no more signals; the signal was not sent")
    # After the finished check: a finished step's job takes no signal of any name (JobFinishedError,
    # as any job), and jobs.workflows.signal() could no longer give it one either.
    if found[0]["workflow_id"] is not None:
        yield from _not_a_steps_own(job_id, name)
    (row,) = yield steps.Query(dq.SEND_SIGNAL, {"id": job_id, "name": name, "data": data, "key": key})
    if row["signal_id"] is None:
        # A send of the same key committed while this one waited for it: that one is the signal.
        assert key is not None  # SEND_SIGNAL sends every unkeyed signal
        (first,) = yield steps.Query(dq.KEYED_SIGNAL, {"id": job_id, "key": key})
        return _sent_before(first, f"job {job_id}", name, key)
    return int(row["signal_id"])


def _not_a_steps_own(job_id: int, name: str) -> steps.Steps[None]:
    """Refuse the signal a workflow step's wait_for= names, sent straight to the step's job: it
    would pass by the workflow's rule that each step waiting for a name takes one signal of it
    (another sent to the run goes to the next step), and its audit trail. Other names are the
    step body's own ctx.wait_for_signal()s, sent as to any job."""
    owner = yield steps.Query(STEP_WAITING_FOR, {"id": job_id, "name": name})
    if owner:
        run_id, step = owner[0]["run_id"], owner[0]["step"]
        raise WorkflowStepSignalError(
            f"job {job_id} runs step {step!r} of workflow run {run_id}, whose wait_for= is signal {name!r}: send it "
            f"with jobs.workflows.signal({run_id}, {name!r}, data), which gives each step waiting for it one "
            "signal and records it in the run's audit trail; the signal was not sent")


def sent_name_check(sent: str, to: str, name: str, key: str) -> None:
    """A key sent before names one signal: sent again under another name, the caller reused a key
    meant for another signal, whose send would otherwise be dropped without a word."""
    if sent != name:
        raise ArgumentValueError(f"key {key!r} was sent to {to} with signal {sent!r}, not {name!r}: a key names one "
                                 f"signal; give signal {name!r} a key of its own. Nothing was sent")


def _sent_before(row: dict[str, Any], to: str, name: str, key: str) -> int:
    sent_name_check(row["name"], to, name, key)
    return int(row["signal_id"])


def check_key(key: Any, what: str) -> str | None:
    """A signal's idempotency key, as jobs.signal() and jobs.workflows.signal() take it."""
    if key is not None and (not isinstance(key, str) or not key or len(key) > MAX_NAME or unstorable(key)):
        raise ArgumentValueError(f"{what} takes None or a non-empty str of at most {MAX_NAME} characters Postgres "
                                 f"can store (one per signal you mean to send once), got {shown(key, width=80)}")
    return key


def _checked(job_id: Any, name: Any, data: Any, key: Any) -> tuple[int, str, str, str | None]:
    checked = checked_id(job_id, "job_id")
    name = check_name(name, "jobs.signal()")
    text = encode(data, "data", InvalidArgumentsError, "signal data")
    key = check_key(key, "jobs.signal(key=)")
    if checked == NO_SUCH_ID:  # an int no job can have: named as given, not as the stand-in
        raise JobNotFound(f"no job {shown(job_id)}: the signal was not sent")
    return checked, name, text, key


def signal(job_id: int, name: str, data: Any = None, *, conn: Any = None, key: str | None = None) -> int:
    """Send signal `name` with `data` (plain JSON) to a job: a `ctx.wait_for_signal(name)` gets it
    exactly once, and signals sent before the wait are kept, in order. A job parked waiting for it
    runs again. Raises JobNotFound or JobFinishedError (nothing written) when the job does not exist
    or has finished, and WorkflowStepSignalError when the job is a workflow step whose `wait_for=`
    names this signal (send that with jobs.workflows.signal()). `conn=`: in the caller's transaction. `key=`: a send of a key already sent to
    this job sends nothing (a retry after a lost reply) and returns the first one's id. Returns the
    signal's id."""
    warn_if_on_event_loop("jobs.signal()", "jobs.asignal()")
    job_id, name, text, key = _checked(job_id, name, data, key)
    with stored_whole("data"):
        return in_tx(lambda: _send_steps(job_id, name, text, key), conn)


@awaited("jobs.asignal()")
async def asignal(job_id: int, name: str, data: Any = None, *, conn: Any = None, key: str | None = None) -> int:
    """signal() for async code; `conn=` takes a psycopg AsyncConnection."""
    job_id, name, text, key = _checked(job_id, name, data, key)
    with stored_whole("data"):
        return await ain_tx(lambda: _send_steps(job_id, name, text, key), conn)
