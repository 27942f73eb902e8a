"""Errors of the job runtime.

    LivepushError
    └── InvalidArgumentsError (TypeError)  job arguments are not plain JSON; names the path
    JobCancelled (BaseException)           raised inside a job whose cancel was requested
"""

from __future__ import annotations

from ..errors import LivepushError


class InvalidArgumentsError(LivepushError, TypeError):
    """Job arguments are not plain JSON. The message names the first offending path,
    e.g. ``args[1]["when"] is a datetime``."""


class JobCancelled(BaseException):
    """Raised by `ctx.progress()` (and delivered as task cancellation to async jobs) once
    someone called `jobs.cancel()` on a running job.

    A BaseException, like asyncio.CancelledError, so a job's broad `except Exception`
    does not swallow it: let it propagate and the job ends as `cancelled`.
    """


class UnknownJobError(LivepushError, LookupError):
    """A job name this process has no function for."""
