"""livepush.jobs: background jobs in Postgres with live progress (SPEC §4, §6, §7).

    from livepush import jobs

    @jobs.job(queue="default", max_attempts=5, timeout=60)
    async def import_row(ctx, import_id, row): ...

    handle = import_row.enqueue(1, {"a": 1})        # JobHandle(id, topic, signed_topic)

    with jobs.group(on_success=report.request(1)) as g:   # task groups (docs/groups.md)
        g.enqueue(import_row, 1, {"a": 1})

Run them with `livepush jobs MODULE` (see docs/jobs.md).
"""

from __future__ import annotations

from typing import Any

from .runtime.context import JobContext, SyncJobContext
from .api.control import acancel, acancel_group, cancel, cancel_group, discard_failed, job_state, retry_failed
from .database import configure
from .api.enqueue import aenqueue_many, enqueue_many
from .errors import (
    GroupClosedError,
    GroupError,
    GroupLimitError,
    GroupNotFound,
    InvalidArgumentsError,
    InvalidProgressError,
    JobCancelled,
    LeaseLostError,
    UnknownJobError,
)
from .groups.calls import (
    MAX_GROUP_MEMBERS,
    GroupContext,
    GroupHandle,
    aadd_to_group,
    acreate_group,
    add_many_to_group,
    add_to_group,
    agroup,
    aseal_group,
    create_group,
    get_group,
    group,
    group_history,
    group_members,
    seal_group,
)
from .api.handles import JobHandle
from .api.registry import REGISTRY, JobFunction, JobRequest, default_backoff, job
from .api.testing import adrain, clear, drain

__all__ = [
    "MAX_GROUP_MEMBERS",
    "REGISTRY",
    "GroupClosedError",
    "GroupContext",
    "GroupError",
    "GroupHandle",
    "GroupLimitError",
    "GroupNotFound",
    "LeaseLostError",
    "aadd_to_group",
    "acancel_group",
    "acreate_group",
    "add_many_to_group",
    "add_to_group",
    "agroup",
    "aseal_group",
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
    "adrain",
    "aenqueue_many",
    "cancel",
    "clear",
    "configure",
    "default_backoff",
    "discard_failed",
    "drain",
    "enqueue_many",
    "job",
    "job_state",
    "retry_failed",
]


def __getattr__(name: str) -> Any:
    if name == "Runtime":
        from .runtime.runtime import Runtime

        return Runtime
    raise AttributeError(name)
