"""`jobs.status()`: what the database says about the job runtime now, for `livepush status`.

Queues (paused or not, depth, the oldest available job's age, scheduled, running, waiting, failed), registered
runtimes (state, jobs in hand, last beat, overdue), the newest task groups and workflow runs in
progress, the tags most carried, and each periodic job's newest tick. Every figure comes from one read-only snapshot (queries.STATUS_SNAPSHOT), so the
report is consistent with itself: a job counted running in its queue is in hand of a runtime
in the same report. The statements are their owners' (queries.py, groups/queries.py,
workflows/queries.py); this module only gathers them.

Servers are not here: they register nowhere. `livepush status` adds the listening connections
the database and Redis show (cli/status.py); each server's own view is GET /readyz on its port.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg

from ...types import shown
from ...blocking import warn_if_on_event_loop
from ... import metrics
from .. import queries
from ..events.views import iso, workflow_view
from ..groups import queries as group_queries
from ..groups import steps
from ..groups.transactions import ain_tx, in_tx
from ..periodic import queries as periodic_queries
from ..workflows import queries as workflow_queries
from ...errors import ArgumentTypeError, ArgumentValueError, DependencyError, SchemaBusyError

DEFAULT_LIMIT = 20
MAX_LIMIT = 1000
# How long the report waits for a lock on livepush's tables: only a schema change holds one its
# reads wait for, and a migration can hold it for minutes, so the report gives up and says so.
LOCK_TIMEOUT = 5.0


@dataclasses.dataclass(frozen=True)
class QueueStatus:
    """One queue. `paused`: no runtime claims from it (jobs.pause_queue()); `depth`: jobs available
    now that a runtime could start; `oldest_age`: seconds since the oldest of them was due (None
    when none is available); `held`: available jobs their function's `concurrency=` or `rate=`
    holds back now, on purpose, and so no part of the backlog."""

    queue: str
    paused: bool
    depth: int
    oldest_age: float | None
    held: int
    scheduled: int
    running: int
    waiting: int
    failed: int


@dataclasses.dataclass(frozen=True)
class RuntimeStatus:
    """One registered runtime. `in_hand`: the jobs it holds now; `overdue`: silent for more than
    three of its `heartbeat`s (dead or stalled: the next runtime to beat releases its jobs)."""

    id: int
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    state: str  # running | draining
    in_hand: int
    heartbeat: float
    since_heartbeat: float
    overdue: bool
    started_at: str


@dataclasses.dataclass(frozen=True)
class GroupStatus:
    """A task group not finished yet; `age`: seconds since it was created."""

    id: int
    state: str  # open | sealed | cancelled (members still ending)
    total: int
    pending: int
    succeeded: int
    failed: int
    cancelled: int
    created_at: str
    age: float


@dataclasses.dataclass(frozen=True)
class WorkflowStatus:
    """A workflow run not finished yet, as its `workflow:<id>` topic shows it: `state` is
    running, waiting (every active step waits) or paused; `steps` maps each step, in the graph's
    order, to its state."""

    id: int
    name: str
    state: str
    steps: dict[str, str]
    created_at: str
    age: float

    @property
    def summary(self) -> str:
        """The steps on one line: "fetch:succeeded rows:waiting report:pending"."""
        return " ".join(f"{name}:{state}" for name, state in self.steps.items())


@dataclasses.dataclass(frozen=True)
class PeriodicStatus:
    """A periodic job (@jobs.periodic) some runtime has scheduled: its newest enqueued tick and
    `since_last_tick`, seconds since that tick. Growing past the job's period: no runtime
    schedules it now."""

    name: str
    last_tick: str
    since_last_tick: float


@dataclasses.dataclass(frozen=True)
class Status:
    """The report. `groups` and `workflows` are the newest `limit` in progress;
    `groups_in_progress` and `workflows_in_progress` count all of them. `at`: the instant the
    snapshot describes (the database's clock, UTC)."""

    at: str
    queues: list[QueueStatus]
    runtimes: list[RuntimeStatus]
    groups: list[GroupStatus]
    groups_in_progress: int
    workflows: list[WorkflowStatus]
    workflows_in_progress: int
    limit: int
    # The `limit` tags most carried by unfinished jobs, with how many carry each, most first;
    # `tags_carried` counts all the distinct tags they carry.
    tags: dict[str, int] = dataclasses.field(default_factory=dict)
    tags_carried: int = 0
    # Every periodic job a runtime has scheduled, by name.
    periodic: list[PeriodicStatus] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON types only (what `livepush status --json` prints)."""
        return dataclasses.asdict(self)


def checked_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ArgumentTypeError(f"limit takes an int from 1 to {MAX_LIMIT}, got {shown(limit, typed=True, width=60)}")
    if not 1 <= limit <= MAX_LIMIT:
        raise ArgumentValueError(f"limit takes an int from 1 to {MAX_LIMIT}, got {shown(limit)}")
    return limit


def _age(at: datetime, then: datetime) -> float:
    return max((at - then).total_seconds(), 0.0)


def _reads(limit: int) -> steps.Steps[Status]:
    yield steps.Query(queries.STATUS_SNAPSHOT, {})
    yield steps.Query(queries.STATUS_LOCK_TIMEOUT, {"ms": f"{round(LOCK_TIMEOUT * 1000)}ms"})
    at: datetime = (yield steps.Query(queries.STATUS_NOW, {}))[0]["at"]
    queue_rows = yield steps.Query(queries.QUEUE_STATUS, {})
    runtime_rows = yield steps.Query(queries.RUNTIME_STATUS, {})
    group_rows = yield steps.Query(group_queries.GROUPS_IN_PROGRESS, {"limit": limit})
    run_rows = yield steps.Query(workflow_queries.RUNS_IN_PROGRESS, {"limit": limit})
    tag_rows = yield steps.Query(queries.TAG_STATUS, {"limit": limit})
    periodic_rows = yield steps.Query(periodic_queries.PERIODIC_STATUS, {})

    runtimes = [RuntimeStatus(
        id=r["id"], host=r["host"], pid=r["pid"], queues=list(r["queues"]), concurrency=r["concurrency"],
        state=r["state"], in_hand=r["in_hand"], heartbeat=r["heartbeat"], since_heartbeat=r["since_heartbeat"],
        overdue=r["overdue"], started_at=iso(r["started_at"])) for r in runtime_rows]
    groups = [GroupStatus(
        id=g["id"], state=g["state"], total=g["total"], pending=g["pending"], succeeded=g["succeeded"],
        failed=g["failed"], cancelled=g["cancelled"], created_at=iso(g["created_at"]),
        age=_age(at, g["created_at"])) for g in group_rows]
    workflows = []
    for w in run_rows:
        # The run's topic view decides `waiting` and the step order: status shows what pages show.
        view = workflow_view(w)
        workflows.append(WorkflowStatus(
            id=w["id"], name=w["name"], state=view["state"],
            steps={name: s["state"] for name, s in view["steps"].items()},
            created_at=iso(w["created_at"]), age=_age(at, w["created_at"])))
    return Status(
        at=iso(at),
        queues=[QueueStatus(**q) for q in queue_rows],
        runtimes=runtimes,
        groups=groups,
        groups_in_progress=group_rows[0]["in_progress"] if group_rows else 0,
        workflows=workflows,
        workflows_in_progress=run_rows[0]["in_progress"] if run_rows else 0,
        tags={r["tag"]: r["unfinished"] for r in tag_rows},
        tags_carried=tag_rows[0]["carried"] if tag_rows else 0,
        periodic=[PeriodicStatus(name=p["name"], last_tick=iso(p["last_tick"]), since_last_tick=p["since_last_tick"])
                  for p in periodic_rows],
        limit=limit,
    )


@contextlib.contextmanager
def _lock_bounded() -> Iterator[None]:
    """Around the report's transaction: its lock wait given up (STATUS_LOCK_TIMEOUT) said as what
    it is, not as a statement some timeout of the role's cancelled."""
    try:
        yield
    except DependencyError as exc:
        if not isinstance(exc.__cause__, psycopg.errors.LockNotAvailable):
            raise
        raise SchemaBusyError(
            f"the job runtime's tables were locked for more than {LOCK_TIMEOUT:g} s: a schema change holds them "
            "(a `livepush migrate` under way, or another DDL); try again once it has finished") from exc


def status(limit: int = DEFAULT_LIMIT) -> Status:
    """The job runtime as the database shows it now: queues, runtimes, and the newest `limit`
    (1 to 1000) task groups and workflow runs in progress, with counts of all of them. Raises
    SchemaBusyError when a schema change holds the tables for more than LOCK_TIMEOUT seconds."""
    warn_if_on_event_loop("jobs.status()", "jobs.astatus()")
    limit = checked_limit(limit)
    with _lock_bounded():
        return in_tx(lambda: _reads(limit), None)


async def astatus(limit: int = DEFAULT_LIMIT) -> Status:
    """status() for async code."""
    limit = checked_limit(limit)
    with _lock_bounded():
        return await ain_tx(lambda: _reads(limit), None)


def _gauges() -> steps.Steps[None]:
    queue_rows = yield steps.Query(queries.QUEUE_GAUGES, {})
    alive = (yield steps.Query(queries.RUNTIMES_ALIVE, {}))[0]["alive"]
    metrics.set_queue_gauges({r["queue"]: (r["depth"], r["oldest_age"], r["held"], r["paused"]) for r in queue_rows},
                             alive)


async def arefresh_metrics() -> None:
    """Refresh the queue and runtime gauges of /metrics from the database (metrics.render()
    calls this, at most once a second)."""
    await ain_tx(_gauges, None)
