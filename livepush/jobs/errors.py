"""Errors of the job runtime.

    LivepushError
    ├── InvalidArgumentsError (TypeError)  job arguments are not plain JSON; names the path
    ├── InvalidProgressError (ValueError)  ctx.progress() got something other than numbers
    └── GroupError                         task groups: GroupNotFound (LookupError),
                                           GroupClosedError, GroupLimitError (ValueError),
                                           LeaseLostError
    JobCancelled (BaseException)           raised inside a job whose cancel was requested
"""

from __future__ import annotations

from ..errors import LivepushError


class InvalidArgumentsError(LivepushError, TypeError):
    """Job arguments are not plain JSON. The message names the first offending path,
    e.g. ``args[1]["when"] is a datetime``."""


class InvalidProgressError(LivepushError, ValueError):
    """`ctx.progress(done, total, message)` got a `done` or `total` that is not a finite
    number (a NaN, a string, ...). Raised inside the job, at the call."""


class JobCancelled(BaseException):
    """Raised by `ctx.progress()` (and delivered as task cancellation to async jobs) once
    someone called `jobs.cancel()` on a running job.

    A BaseException, like asyncio.CancelledError, so a job's broad `except Exception`
    does not swallow it: let it propagate and the job ends as `cancelled`.
    """


class UnknownJobError(LivepushError, LookupError):
    """A job name this process has no function for."""


# -- task groups (livepush/jobs/groups/) --------------------------------------------------

class GroupError(LivepushError):
    """Base of the task-group errors below."""


class GroupNotFound(GroupError, LookupError):
    """No group with that id (never created, or deleted by retention)."""


class GroupClosedError(GroupError):
    """A member was added to a group that no longer takes members that way: sealed (only its
    running members may add, through ctx.group.enqueue), cancelled or finished."""


class GroupLimitError(GroupError, ValueError):
    """A group would have more members than the limit (jobs.MAX_GROUP_MEMBERS)."""


class LeaseLostError(GroupError):
    """ctx.group.enqueue from a job that no longer holds its claim (rescued after its runtime
    was presumed dead, timed out, or given back): the add is refused, since another attempt
    of this job may already be running."""
