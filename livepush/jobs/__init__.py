"""livepush.jobs: background jobs in Postgres with live progress (docs/jobs.md, docs/reference.md#4-python-api).

    from livepush import jobs

    @jobs.job(queue="default", max_attempts=5, timeout=60)
    async def import_row(ctx, import_id, row): ...

    handle = import_row.enqueue(1, {"a": 1})        # JobHandle(id, topic, signed_topic)
    jobs.get_job(handle.id)                          # JobInfo: state, attempt, result, error, ...

    with jobs.group(on_success=report.request(1)) as g:   # task groups (docs/groups.md)
        g.enqueue(import_row, 1, {"a": 1})

    @jobs.periodic("*/5 * * * *", timezone="UTC")   # once per cron tick across every runtime
    async def sweep(ctx, tick: str): ...             # tick: ISO 8601 with its offset

Durable jobs (checkpoints, children, signals, durable sleep) are in docs/durable.md. Run them
with `livepush jobs MODULE` (see docs/jobs.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .api.control import (
    acancel,
    acancel_tagged,
    adiscard_failed,
    ajob_state,
    apause_queue,
    aresume_queue,
    aretry_failed,
    cancel,
    cancel_tagged,
    discard_failed,
    job_state,
    pause_queue,
    resume_queue,
    retry_failed,
)
from .api.reads import JobInfo, aget_job, alist_failed, alist_tagged, get_job, list_failed, list_tagged
from .api.enqueue import aenqueue_many, enqueue_many
from .api.functions import JobFunction, default_backoff, job
from .api.handles import JobHandle, WorkflowHandle
from .api.registry import REGISTRY, JobRequest
from .api.status import Status, astatus, status
from .api.testing import aclear, adrain, clear, drain
from .database import configure
from .durable.fingerprint import input_fingerprint
from .durable.signals import asignal, signal
from .errors import (
    CheckpointInputConflict,
    ChildFailed,
    DurableError,
    DuplicateStepError,
    GroupBlockError,
    GroupClosedError,
    GroupError,
    GroupLimitError,
    GroupNotFound,
    InvalidArgumentsError,
    InvalidProgressError,
    InvalidResultError,
    InvalidScheduleError,
    JobCancelled,
    WorkflowDefinitionError,
    WorkflowNotFound,
    WorkflowStepSignalError,
    WorkflowStepWaitError,
    JobFinishedError,
    JobNotFound,
    LeaseLostError,
    PeriodicNotFound,
    PeriodicStillScheduled,
    ReplayMismatch,
    RuntimeStoppedError,
    SignalTimeout,
    UnknownJobError,
)
from .groups.building import (
    MAX_GROUP_MEMBERS,
    GroupHandle,
    aadd_many_to_group,
    aadd_to_group,
    acreate_group,
    add_many_to_group,
    add_to_group,
    agroup,
    aseal_group,
    create_group,
    group,
    seal_group,
)
from .groups.cancel import acancel_group, cancel_group
from .groups.context import GroupContext
from .groups.reads import aget_group, agroup_history, agroup_members, get_group, group_history, group_members
from .periodic.decorator import periodic
from .periodic.forget import aforget_periodic, forget_periodic
from .runtime.context import JobContext, SyncJobContext
from .workflows.definition import Workflow
from .workflows.runner import StepContext, workflow
from . import workflows  # jobs.workflows.<verb>: bound by name for type checkers (pyright)

__all__ = [
    "MAX_GROUP_MEMBERS",
    "REGISTRY",
    "CheckpointInputConflict",
    "ChildFailed",
    "DurableError",
    "DuplicateStepError",
    "InvalidResultError",
    "InvalidScheduleError",
    "JobFinishedError",
    "JobInfo",
    "JobNotFound",
    "PeriodicNotFound",
    "PeriodicStillScheduled",
    "ReplayMismatch",
    "RuntimeStoppedError",
    "SignalTimeout",
    "StepContext",
    "Workflow",
    "WorkflowDefinitionError",
    "WorkflowHandle",
    "WorkflowNotFound",
    "WorkflowStepSignalError",
    "WorkflowStepWaitError",
    "workflow",
    "workflows",
    "aget_job",
    "asignal",
    "get_job",
    "input_fingerprint",
    "signal",
    "GroupBlockError",
    "GroupClosedError",
    "GroupContext",
    "GroupError",
    "GroupHandle",
    "GroupLimitError",
    "GroupNotFound",
    "LeaseLostError",
    "aadd_many_to_group",
    "aadd_to_group",
    "acancel_group",
    "acreate_group",
    "add_many_to_group",
    "add_to_group",
    "agroup",
    "aseal_group",
    "aget_group",
    "agroup_history",
    "agroup_members",
    "cancel_group",
    "create_group",
    "get_group",
    "group",
    "group_history",
    "group_members",
    "seal_group",
    "InvalidArgumentsError",
    "InvalidProgressError",
    "JobCancelled",
    "JobContext",
    "JobFunction",
    "JobHandle",
    "JobRequest",
    "Runtime",
    "SyncJobContext",
    "UnknownJobError",
    "acancel",
    "acancel_tagged",
    "adiscard_failed",
    "aclear",
    "adrain",
    "ajob_state",
    "aretry_failed",
    "apause_queue",
    "aresume_queue",
    "pause_queue",
    "resume_queue",
    "alist_failed",
    "alist_tagged",
    "aenqueue_many",
    "cancel",
    "cancel_tagged",
    "clear",
    "configure",
    "default_backoff",
    "discard_failed",
    "drain",
    "enqueue_many",
    "job",
    "job_state",
    "list_failed",
    "list_tagged",
    "periodic",
    "forget_periodic",
    "aforget_periodic",
    "retry_failed",
    "Status",
    "astatus",
    "status",
]


if TYPE_CHECKING:
    from .runtime.runtime import Runtime
else:
    # Hidden from type checkers, which would read any name of the module (jobs.enqueue included)
    # as this function's Any; Runtime is imported above for them.
    def __getattr__(name: str) -> Any:
        if name == "Runtime":
            from .runtime.runtime import Runtime

            return Runtime
        if name in ("enqueue", "aenqueue"):
            # RQ's queue.enqueue(f, *args), written as jobs.enqueue(f, *args): say where the call is.
            raise AttributeError(f"module {__name__!r} has no {name}(): a job enqueues itself, "
                                 f"some_job.{name}(*args), and jobs.{name}_many([some_job.request(*args), ...]) "
                                 "enqueues several")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
