"""`jobs.forget_periodic(name)`: forget the newest tick of a periodic job removed from the code, so
that `livepush status` stops listing it as scheduled by no runtime (docs/jobs.md, "Periodic jobs")."""

from __future__ import annotations

from typing import Any

from ...types import shown
from ...blocking import warn_if_on_event_loop
from ...errors import ArgumentTypeError, ArgumentValueError
from ..api.awaited import awaited
from .. import database
from .. import queries as job_queries
from ..errors import PeriodicNotFound, PeriodicStillScheduled
from . import queries


def _checked(name: Any) -> str:
    if not isinstance(name, str):
        raise ArgumentTypeError(f"forget_periodic() takes a periodic job's name (a str, as `livepush status` lists "
                                f"it), got {shown(name, typed=True, width=60)}")
    if not name:
        raise ArgumentValueError("forget_periodic() takes a periodic job's name, as `livepush status` lists it, got ''")
    return name


def _refusal(name: str, live: list[tuple[Any, ...]]) -> PeriodicStillScheduled:
    where = ", ".join(f"{runtime_id} ({host}, pid {pid})" for runtime_id, host, pid in live)
    return PeriodicStillScheduled(
        f"periodic job {name!r} is still scheduled by live job runtimes: {where}. Forgotten now, they would "
        "start it again from its next tick: remove it from the code they import and restart them (or stop "
        "them), then forget it")


def _not_found(name: str) -> PeriodicNotFound:
    return PeriodicNotFound(f"no periodic job named {name!r} has a tick to forget: `livepush status` lists those "
                            "that do, by the name to give (the job's name, module included)")


def forget_periodic(name: str) -> None:
    """Delete the newest tick of periodic job `name`, which no live runtime schedules any more.
    Raises PeriodicStillScheduled when one does, PeriodicNotFound when there is no such tick."""
    warn_if_on_event_loop("jobs.forget_periodic()", "jobs.aforget_periodic()")
    name = _checked(name)
    with database.connection() as conn:
        live = conn.execute(job_queries.LIVE_RUNTIMES_SCHEDULING, {"name": name}).fetchall()
        if live:
            raise _refusal(name, live)
        if not conn.execute(queries.FORGET, {"name": name}).fetchall():
            raise _not_found(name)


@awaited("jobs.aforget_periodic()")
async def aforget_periodic(name: str) -> None:
    """forget_periodic() for async code."""
    name = _checked(name)
    async with database.aconnection() as conn:
        live = await (await conn.execute(job_queries.LIVE_RUNTIMES_SCHEDULING, {"name": name})).fetchall()
        if live:
            raise _refusal(name, live)
        if not await (await conn.execute(queries.FORGET, {"name": name})).fetchall():
            raise _not_found(name)
