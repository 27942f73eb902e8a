"""`jobs.signal()` / `asignal()`: send a named signal (JSON data) to a job, in our transaction or
the caller's (`conn=`, delivered if and only if it commits)."""

from __future__ import annotations

from typing import Any

from ..api.args import encode
from ..api.handles import NO_SUCH_ID, checked_id
from ..errors import InvalidArgumentsError, JobFinishedError, JobNotFound
from ..groups import steps
from ..groups.transactions import ain_tx, in_tx
from . import queries as dq
from .run import check_name

_FINISHED = frozenset({"succeeded", "failed", "cancelled"})


def _send_steps(job_id: int, name: str, data: str) -> steps.Steps[int]:
    """Lock the job, refuse a missing or finished one (nothing written), keep the signal and wake
    the job if it is parked on this name. Returns the signal's id."""
    found = yield steps.Query(dq.SIGNAL_TARGET, {"id": job_id})
    if not found:
        raise JobNotFound(f"no job {job_id} (never enqueued, or deleted after its retention time): "
                          "the signal was not sent")
    state = found[0]["state"]
    if state in _FINISHED:
        raise JobFinishedError(f"job {job_id} has {state}: it takes no more signals; the signal was not sent")
    (row,) = yield steps.Query(dq.SEND_SIGNAL, {"id": job_id, "name": name, "data": data})
    return int(row["signal_id"])


def _checked(job_id: Any, name: Any, data: Any) -> tuple[int, str, str]:
    checked = checked_id(job_id, "job_id")
    name = check_name(name, "jobs.signal()")
    text = encode(data, "data", InvalidArgumentsError, "signal data")
    if checked == NO_SUCH_ID:  # an int no job can have: named as given, not as the stand-in
        raise JobNotFound(f"no job {job_id}: the signal was not sent")
    return checked, name, text


def signal(job_id: int, name: str, data: Any = None, *, conn: Any = None) -> int:
    """Send signal `name` with `data` (plain JSON) to a job: a `ctx.wait_for_signal(name)` gets it
    exactly once, and signals sent before the wait are kept, in order. A job parked waiting for it
    runs again. Raises JobNotFound or JobFinishedError (nothing written) when the job does not exist
    or has finished. `conn=`: in the caller's transaction. Returns the signal's id."""
    job_id, name, text = _checked(job_id, name, data)
    return in_tx(lambda: _send_steps(job_id, name, text), conn)


async def asignal(job_id: int, name: str, data: Any = None, *, conn: Any = None) -> int:
    """signal() for async code; `conn=` takes a psycopg AsyncConnection."""
    job_id, name, text = _checked(job_id, name, data)
    return await ain_tx(lambda: _send_steps(job_id, name, text), conn)
