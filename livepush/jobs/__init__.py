"""livepush.jobs: background jobs in Postgres with live progress (docs/jobs.md, docs/reference.md#4-python-api).

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

from .api.control import acancel, cancel, discard_failed, job_state, retry_failed
from .api.enqueue import aenqueue_many, enqueue_many
from .api.functions import JobFunction, default_backoff, job
from .api.handles import JobHandle
from .api.registry import REGISTRY, JobRequest
from .api.testing import adrain, clear, drain
from .database import configure
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
from .groups.building import (
    MAX_GROUP_MEMBERS,
    GroupHandle,
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
from .groups.reads import get_group, group_history, group_members
from .runtime.context import JobContext, SyncJobContext

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
