"""The durable import's endpoints: start one, learn the task group of its children, approve it,
cancel it.

Only jobs of the demo's own `import_file` are ever read, signalled or cancelled here: an id that names any
other job is answered as unknown, so the page's Approve cannot reach a job the demo did not start.
The check reads the job's row instead of a list kept in memory, so a page still works after the
demo restarts.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from .. import jobs
from ..postgres.text import BIGINT_MAX
from . import jobs as demo_jobs

MAX_ROWS = 500
FINAL_STATES = ("succeeded", "failed", "cancelled")
# The ids a page may send: canonical decimal, as the row's own topic spells them.
_JOB_ID = re.compile(r"[1-9][0-9]{0,18}")


class Refused(Exception):
    """A request the demo answers with a 4xx and this one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def query_id(query: dict[str, list[str]], key: str, what: str) -> int:
    """The `key` parameter as an id; Refused (400) for anything but one canonical id."""
    values = query.get(key, [])
    if len(values) != 1 or not _JOB_ID.fullmatch(values[0]) or int(values[0]) > BIGINT_MAX:
        raise Refused(400, f"{key} must be the id of {what}, a whole number from 1")
    return int(values[0])


def job_id(query: dict[str, list[str]]) -> int:
    """The `job` parameter as a job id; Refused (400) for anything but one canonical id."""
    return query_id(query, "job", "a durable import")


async def start(rows: int) -> dict[str, Any]:
    """Enqueue one durable import of `rows` rows; what the page needs to follow it."""
    handle = await demo_jobs.import_file.aenqueue(rows)
    return {"job_id": handle.id, "job_topic": handle.signed_topic}


async def _import(job: int) -> jobs.JobInfo:
    """The durable import `job` as jobs.aget_job() reads it; Refused (404) for any other job."""
    info = await jobs.aget_job(job)
    if info is None or info.name != demo_jobs.import_file.name:
        raise Refused(404, f"there is no durable import {job}")
    return info


def _waiting_for(info: jobs.JobInfo) -> dict[str, Any]:
    return info.waiting if info.state == "waiting" and info.waiting is not None else {}


async def children(job: int) -> dict[str, Any]:
    """The task group the import `job` parked on, with its topic signed for the page."""
    info = await _import(job)
    group = _waiting_for(info).get("group")
    if not isinstance(group, int):
        raise Refused(409, f"durable import {job} is not waiting for its children now (it is {info.state})")
    return {"group_id": group, "group_topic": jobs.GroupHandle(group).signed_topic}


async def cancel(job: int) -> dict[str, Any]:
    """Cancel the import `job`, its unfinished children with it; Refused (409) once it finished."""
    info = await _import(job)
    if not await jobs.acancel(job):
        raise Refused(409, f"durable import {job} has finished ({info.state}): there is nothing to cancel")
    return {"job_id": job, "cancelled": True}


async def approve(job: int) -> dict[str, Any]:
    """Send the import `job` its approval; Refused (409) unless it is waiting for one."""
    info = await _import(job)
    if info.state in FINAL_STATES:
        raise Refused(409, f"durable import {job} has finished ({info.state}): there is nothing to approve")
    waiting = _waiting_for(info)
    if waiting.get("for") != "signal" or waiting.get("name") != demo_jobs.APPROVAL:
        # A signal is kept until the job waits for it; refusing early keeps one click, one approval.
        raise Refused(409, f"durable import {job} is not waiting for approval now (it is {info.state})")
    data = {"by": "the demo page", "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        await jobs.asignal(job, demo_jobs.APPROVAL, data)
    except jobs.JobNotFound:
        raise Refused(404, f"there is no durable import {job}") from None
    except jobs.JobFinishedError:
        raise Refused(409, f"durable import {job} has finished: there is nothing to approve") from None
    return {"job_id": job, "approved": data}
