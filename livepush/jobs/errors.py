"""Errors of the job runtime.

    LivepushError
    ├── ArgumentTypeError (TypeError) > InvalidArgumentsError  job arguments are not plain JSON;
    │                                      names the path; > MessageTooLarge (internal) JSON text
    │                                      past one message to Postgres, named by the call;
    │                                      > OutputsTooLarge (internal) a workflow decision's
    │                                      outputs together, naming the run and the steps
    ├── InvalidProgressError (ValueError)  ctx.progress() got something other than numbers
    ├── InvalidResultError (TypeError)     a job's or a checkpoint's result is not plain JSON
    ├── UnknownJobError (LookupError)      a job name this process has no function for
    ├── JobNotFound (LookupError)          no job with that id (jobs.signal)
    ├── JobFinishedError                   the job has finished (jobs.signal)
    ├── RuntimeStoppedError                a sync job's ctx call: the runtime's loop stopped
    ├── WorkflowNotFound (LookupError)     no workflow run with that id
    ├── PeriodicNotFound (LookupError)     no periodic job of that name (jobs.forget_periodic)
    ├── PeriodicStillScheduled             a live runtime schedules it (jobs.forget_periodic)
    ├── ArgumentValueError (ValueError) > WorkflowStepSignalError  jobs.signal() of a step's
    │                                      wait_for= signal straight to its job
    ├── DurableError                       durable jobs: CheckpointInputConflict,
    │                                      DuplicateStepError (ValueError), ChildFailed,
    │                                      ReplayMismatch, SignalTimeout (TimeoutError),
    │                                      WorkflowStepWaitError (ValueError)
    └── GroupError                         task groups: GroupNotFound (LookupError),
                                           GroupClosedError, GroupBlockError (RuntimeError),
                                           GroupLimitError (ValueError),
                                           LeaseLostError
    ConfigError > WorkflowDefinitionError  a workflow's graph is wrong (raised at import)
    ConfigError > InvalidScheduleError (ValueError)  a periodic job's cron or zone is wrong (at import)
    JobCancelled (BaseException)           raised inside a job whose cancel was requested
    Parked (BaseException)                 ends a durable job's run when it parks (internal)
    Reattempt (BaseException)              ends a step's run to run again later (internal)
    RunAbandoned (BaseException)           a durable call in a run that lost its job
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import TypeVar

from ..errors import ArgumentTypeError, ArgumentValueError, ConfigError, LivepushError


class InvalidArgumentsError(ArgumentTypeError):
    """Job arguments are not plain JSON. The message names the first offending path,
    e.g. ``args[1]["when"] is a datetime``."""


class MessageTooLarge(InvalidArgumentsError):
    """JSON text of one statement longer than one message to Postgres carries (api/args.py:
    check_sendable), raised before anything is sent. The calls that store it name what was too
    large (args.stored_whole); a job's result and a checkpoint's are said as InvalidResultError."""


class OutputsTooLarge(MessageTooLarge):
    """The outputs one workflow decision writes (workflows/engine.py) together past one message to
    Postgres. The message names the run and the steps; the job whose end took the decision fails
    with it (runtime/completer.py), as InvalidResultError, since its output is what to change."""


class InvalidProgressError(LivepushError, ValueError):
    """`ctx.progress(done, total, message)` got a `done` or `total` that is not a finite
    number (a NaN, a string, ...). Raised inside the job, at the call."""


class JobCancelled(BaseException):
    """Raised by `ctx.progress()` (and delivered as task cancellation to async jobs) once
    someone called `jobs.cancel()` on a running job. A job raises it itself to give up on purpose
    (its work no longer wanted): it ends `cancelled`, not retried, as a cancelled job does.

    A BaseException, like asyncio.CancelledError, so a job's broad `except Exception`
    does not swallow it: let it propagate and the job ends as `cancelled`.
    """


class UnknownJobError(LivepushError, LookupError):
    """A job name this process has no function for."""


class InvalidResultError(LivepushError, TypeError):
    """A job function returned, or a checkpoint's function returned, something that is not plain
    JSON, or a checkpoint's result too large for Postgres to store. The message names the
    checkpoint (or "result") and the first offending path; the job fails without a retry (the
    same code would return the same thing)."""


class JobNotFound(LivepushError, LookupError):
    """No job with that id (never enqueued, or deleted after its retention time)."""


class JobFinishedError(LivepushError):
    """The job has finished (succeeded, failed or cancelled): it takes no more signals."""


class RuntimeStoppedError(LivepushError):
    """A sync job's blocking ctx call (checkpoint, run_child, wait_for_signal, sleep,
    ctx.group.enqueue, ...) got no answer: the runtime's event loop, which runs the call, stopped
    while the job's thread waited (the runtime shut down under it). The run ends there: its job was
    given back or will be rescued, and runs again as its retries allow. Not a TimeoutError: a job's
    own `except TimeoutError:` (a signal that did not come in time) must not run on a shutdown.
    A ctx.group.enqueue that raises it may have reached its commit: pass key= to its retry."""


# -- durable jobs (livepush/jobs/durable/) -----------------------------------------------------

class DurableError(LivepushError):
    """Base of the durable-job errors below. Each is raised inside the job; unless the job catches
    it, the job fails without a retry (a replay would meet the same stored facts again)."""


class CheckpointInputConflict(DurableError):
    """`ctx.checkpoint(name, fn, input=...)` was given an input whose fingerprint differs from the
    one stored with the checkpoint's result: the code or the data changed under a stored result.
    Raised before `fn` runs."""


class DuplicateStepError(DurableError, ValueError):
    """Two checkpoints (or two sleeps) with one name in one run: names find stored results on
    replay, so each must be unique within a job."""


class ChildFailed(DurableError):
    """A child of `ctx.run_child` / `ctx.run_children` failed or was cancelled. `failures` lists
    (child job id, its name, its state, its error)."""

    def __init__(self, message: str, failures: list[tuple[int, str, str, str | None]]) -> None:
        super().__init__(message)
        self.failures = failures

    def __reduce__(self) -> tuple[type, tuple[str, list[tuple[int, str, str, str | None]]]]:
        # Pickle rebuilds an exception from its args alone, which lack `failures`: a job run in a
        # process pool, or a framework that pickles errors, got a TypeError instead of this.
        return (type(self), (str(self), self.failures))


class ReplayMismatch(DurableError):
    """A replayed `ctx.run_child` / `ctx.run_children` call asks for other jobs, or another number
    of them, than the children the same call (found by its position) stored on an earlier run: the
    code changed before a point a parked or failed run had reached. Returning the stored children's
    results as this call's would be silently wrong."""


class SignalTimeout(DurableError, TimeoutError):
    """`ctx.wait_for_signal(name, timeout=...)` passed its timeout with no signal."""


# The argument errors durable ctx calls raised for their own arguments (durable/run.py marks them).
# The same code makes the same call on every attempt, so the runtime fails the job at once instead
# of retrying it and running the code between its steps again. Marked rather than subclassed: the
# job's error still names the ArgumentValueError or ArgumentTypeError the call is documented to raise.
_REFUSED_DURABLE_CALLS: weakref.WeakSet[BaseException] = weakref.WeakSet()
_Refusal = TypeVar("_Refusal", bound=ArgumentValueError | ArgumentTypeError)


def durable_call_refusal(exc: _Refusal) -> _Refusal:
    """`exc`, marked as a durable ctx call's refusal of its own arguments (refused_durable_call)."""
    _REFUSED_DURABLE_CALLS.add(exc)
    return exc


@contextlib.contextmanager
def durable_call_checks() -> Iterator[None]:
    """Marks the ArgumentValueError or ArgumentTypeError raised inside (by a check a durable ctx
    call shares with other calls) as that call's refusal of its own arguments, and lets it through."""
    try:
        yield
    except (ArgumentValueError, ArgumentTypeError) as exc:
        raise durable_call_refusal(exc)


def refused_durable_call(exc: BaseException) -> bool:
    """Whether `exc` is a durable ctx call's refusal of its own arguments (durable_call_checks)."""
    return exc in _REFUSED_DURABLE_CALLS


class RunAbandoned(BaseException):
    """Raised by a durable call in a run that no longer holds its job (rescued after its runtime
    was presumed dead, timed out, given back): whatever it does now would be fenced off, and
    another run replays the job. A BaseException so that a job's `except Exception` does not keep
    a run going whose checkpoints can no longer be stored."""


# -- workflows (livepush/jobs/workflows/) -----------------------------------------------------

class WorkflowDefinitionError(ConfigError):
    """A workflow's graph is wrong (an unknown step, a step defined twice, a fan-out step with a
    signal wait, a bad option): raised when the module defining it is imported."""


# -- periodic jobs (livepush/jobs/periodic/) ----------------------------------------------------

class InvalidScheduleError(ConfigError, ValueError):
    """A periodic job's cron expression or time zone is wrong; the message names it. Raised when
    the module defining the job is imported."""


class PeriodicNotFound(LivepushError, LookupError):
    """jobs.forget_periodic(name): no periodic job of that name has a newest tick to forget."""


class PeriodicStillScheduled(LivepushError):
    """jobs.forget_periodic(name): a live job runtime still schedules that periodic job."""


class WorkflowNotFound(LivepushError, LookupError):
    """No workflow run with that id (never started, or deleted after its retention time)."""


class WorkflowStepSignalError(ArgumentValueError):
    """`jobs.signal()` straight to a workflow step's job with the signal its `wait_for=` names:
    such a signal goes through `jobs.workflows.signal()`, which gives each waiting step one. Nothing
    was sent."""


class WorkflowStepWaitError(DurableError, ValueError):
    """A workflow step's own code called `ctx.wait_for_signal(name)` with the signal its
    `wait_for=` names. The step took that signal before its body ran (its data is `ctx.signal`),
    and no second one can reach its job: `jobs.workflows.signal()` gives each step one, and
    `jobs.signal()` refuses the name. Raised at the call, instead of a wait until its timeout."""


class Reattempt(BaseException):
    """Ends a run to be run again after `seconds`, its attempt not spent (a workflow step's
    ctx.flow.reattempt). Internal: the executor turns it into a release with that delay."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"run again in {seconds:g} s")
        self.seconds = seconds

    def __reduce__(self) -> tuple[type, tuple[float]]:
        return (type(self), (self.seconds,))  # its args hold the message, not the seconds


class Parked(BaseException):
    """Ends a durable job's run once it parked (its children, signal or sleep are stored and its
    state is `waiting`). A BaseException so that a job's `except Exception` lets it through; the
    executor turns it into "nothing to write"."""


# -- task groups (livepush/jobs/groups/) --------------------------------------------------

class GroupError(LivepushError):
    """Base of the task-group errors below."""


class GroupNotFound(GroupError, LookupError):
    """No group with that id (never created, or deleted by retention)."""


class GroupClosedError(GroupError):
    """A member was added to a group that no longer takes members that way: sealed (only its
    running members may add, through ctx.group.enqueue), cancelled or finished. `group_id` and
    `state`: the group that refused and its state then, when a group's row refused the add."""

    def __init__(self, message: str, *, group_id: int | None = None, state: str | None = None) -> None:
        super().__init__(message)
        self.group_id = group_id
        self.state = state


class GroupBlockError(GroupError, RuntimeError):
    """A jobs.group() builder used outside its one `with` block: its id read or a member added
    before the block, or the block entered a second time."""


class GroupLimitError(GroupError, ValueError):
    """A group would have more members than the limit (jobs.MAX_GROUP_MEMBERS)."""


class LeaseLostError(GroupError):
    """ctx.group.enqueue (or a durable step) from a job that no longer holds its claim (rescued
    after its runtime was presumed dead, timed out, or given back): the write is refused, since
    another attempt of this job may already be running."""
