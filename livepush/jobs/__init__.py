"""livepush.jobs: background jobs in Postgres with live progress (SPEC §4, §6, §7).

    from livepush import jobs

    @jobs.job(queue="default", max_attempts=5, timeout=60)
    async def import_row(ctx, import_id, row): ...

    handle = import_row.enqueue(1, {"a": 1})        # JobHandle(id, topic, signed_topic)

Run them with `livepush jobs MODULE` (see docs/jobs.md).
"""

from __future__ import annotations

from typing import Any

from .context import JobContext, SyncJobContext
from .control import acancel, cancel, discard_failed, job_state, retry_failed
from .database import configure
from .enqueue import aenqueue_many, enqueue_many
from .errors import InvalidArgumentsError, JobCancelled, UnknownJobError
from .handles import JobHandle
from .registry import REGISTRY, JobFunction, JobRequest, default_backoff, job
from .testing import adrain, clear, drain

__all__ = [
    "REGISTRY",
    "InvalidArgumentsError",
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
        from .runtime import Runtime

        return Runtime
    raise AttributeError(name)
