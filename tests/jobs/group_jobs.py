"""Job functions of the task-group tests, in this process and in child runtimes.

Members note their runs in `job_runs` (tests/jobs/sample_jobs.py); callbacks note theirs,
with what ctx.group showed them, in `group_callback_runs` (created by `groups_db`).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import psycopg

from livepush import jobs
from livepush.jobs import database
from tests.jobs.sample_jobs import _pool, note, note_sync, until_flag

CALLBACK_RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS group_callback_runs (
    job_id   bigint NOT NULL,
    tag      text,
    kind     text,
    group_id bigint,
    view     jsonb,
    args     jsonb,
    pid      integer NOT NULL
)
"""


@jobs.job(name="g.member")
async def member(ctx: Any, key: Any = None) -> None:
    await note(ctx, "done", key)


@jobs.job(name="g.member_sync")
def member_sync(ctx: Any, key: Any = None) -> None:
    note_sync(ctx, "done", key)


@jobs.job(name="g.flaky", max_attempts=3, backoff=lambda attempt: 0.0)
async def flaky(ctx: Any, fail_times: int, key: Any = None) -> None:
    await note(ctx, "start", key)
    if ctx.attempt <= fail_times:
        raise RuntimeError(f"boom on attempt {ctx.attempt}")
    await note(ctx, "done", key)


@jobs.job(name="g.fail", never_retry=(ValueError,))
async def fail(ctx: Any, key: Any = None) -> None:
    await note(ctx, "start", key)
    raise ValueError("bad input")


@jobs.job(name="g.spawner")
async def spawner(ctx: Any, n: int, key: Any = None) -> None:
    """Adds n members to its own group, then finishes."""
    for i in range(n):
        await ctx.group.enqueue(member, f"{key}.{i}")
    await note(ctx, "done", key)


@jobs.job(name="g.spawn_too_large", max_attempts=1)
async def spawn_too_large(ctx: Any) -> None:
    """Adds to its own group a member whose arguments are past what one jsonb value holds."""
    half = "x" * 140_000_000
    await ctx.group.enqueue(callback, "too large", half, half)


@jobs.job(name="g.spawn_unfit", max_attempts=3, backoff=lambda attempt: 0.0)
async def spawn_unfit(ctx: Any) -> None:
    """Adds to its own group a member whose arguments are not JSON (a set), after noting each run."""
    await note(ctx, "between", "unfit")
    await ctx.group.enqueue(member, {1, 2})


@jobs.job(name="g.spawner_sync")
def spawner_sync(ctx: Any, n: int, key: Any = None) -> None:
    for i in range(n):
        ctx.group.enqueue(member_sync, f"{key}.{i}")
    note_sync(ctx, "done", key)


@jobs.job(name="g.keyed_spawner")
async def keyed_spawner(ctx: Any, n: int, key: str) -> None:
    """Adds n members to its own group under one idempotency key: the first holds it, so one is added."""
    handles = {await ctx.group.enqueue(member, f"{key}.{i}", key=key, tags=[key]) for i in range(n)}
    await note(ctx, "done", f"{key}:{len(handles)}")


@jobs.job(name="g.keyed_spawner_sync")
def keyed_spawner_sync(ctx: Any, n: int, key: str) -> None:
    handles = {ctx.group.enqueue(member_sync, f"{key}.{i}", key=key) for i in range(n)}
    note_sync(ctx, "done", f"{key}:{len(handles)}")


@jobs.job(name="g.wait_flag", timeout=120)
async def wait_flag(ctx: Any, flag: str) -> None:
    await note(ctx, "start", flag)
    await until_flag(flag, interval=0.02)
    await note(ctx, "done", flag)


@jobs.job(name="g.callback")
async def callback(ctx: Any, tag: str, *extra: Any) -> None:
    """Notes that it ran, with its exact args and what ctx.group showed."""
    group = ctx.group
    pool = await _pool()
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO group_callback_runs (job_id, tag, kind, group_id, view, args, pid) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (ctx.job_id, tag, group.kind, group.id, json.dumps(group.as_dict()), json.dumps([tag, *extra]), os.getpid()))


def callback_runs(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT tag, kind, group_id, view, args FROM group_callback_runs ORDER BY job_id").fetchall()


__all__ = ["callback", "callback_runs", "database", "fail", "flaky", "member", "member_sync", "spawner",
           "spawner_sync", "wait_flag"]


@jobs.job(name="g.slow", timeout=60)
async def slow(ctx: Any, seconds: float, key: Any = None) -> None:
    await asyncio.sleep(seconds)
    await note(ctx, "done", key)


@jobs.job(name="g.spawner_sync_held")
def spawner_sync_held(ctx: Any, key: str) -> None:
    """Adds a member while another transaction holds its group's counts: the add waits past its
    timeout. The lock is let go only after the TimeoutError, when an add left running would commit."""
    with psycopg.connect(database.database_url(), autocommit=False) as held:
        held.execute("SELECT 1 FROM livepush_group_shards WHERE group_id = %s FOR UPDATE", (ctx.group.id,))
        try:
            ctx.group.enqueue(member_sync, f"{key}.late", timeout=0.3)
        except TimeoutError as exc:
            note_sync(ctx, "timeout", str(exc))
    note_sync(ctx, "done", key)


TIMEOUTS: dict[str, Any] = {"a str": "soon", "negative": -1, "zero": 0, "nan": float("nan"), "inf": float("inf"),
                            "a bool": True}


@jobs.job(name="g.spawner_sync_timeout")
def spawner_sync_timeout(ctx: Any, timeout: str) -> None:
    """Adds a member with the timeout= the test names; notes the error it raised, if any."""
    try:
        ctx.group.enqueue(member_sync, "added", timeout=TIMEOUTS[timeout])
    except Exception as exc:
        note_sync(ctx, "refused", f"{type(exc).__name__}: {exc}")
        return
    note_sync(ctx, "done", "added")


@jobs.job(name="g.callback_adds", max_attempts=3, backoff=lambda attempt: 0.0)
async def callback_adds(ctx: Any) -> None:
    """A callback that adds to its own group, which has finished: GroupClosedError."""
    await ctx.group.enqueue(member, "too late")


@jobs.job(name="g.adds_to", max_attempts=3, backoff=lambda attempt: 0.0)
def adds_to(ctx: Any, group_id: int) -> None:
    """Adds to a group from outside it (add_to_group), as any job may."""
    jobs.add_to_group(group_id, member_sync, "from outside")


def _counts_read(group: Any) -> str:
    """What reading the finished-group fields of ctx.group gave: the values, or the error."""
    try:
        return json.dumps([group.total, group.pending, group.state, group.as_dict()])
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


@jobs.job(name="g.reads_counts")
async def reads_counts(ctx: Any) -> None:
    """Notes what ctx.group's counts gave a member (phase "read"), and whether hasattr saw them."""
    await note(ctx, "read", _counts_read(ctx.group))
    await note(ctx, "hasattr", hasattr(ctx.group, "total"))


@jobs.job(name="g.reads_counts_sync")
def reads_counts_sync(ctx: Any) -> None:
    note_sync(ctx, "read", _counts_read(ctx.group))


@jobs.job(name="g.waits_then_adds", max_attempts=3, backoff=lambda attempt: 0.0)
async def waits_then_adds(ctx: Any, flag: str) -> None:
    """Runs until `flag` is set, then adds a member to its own group."""
    await note(ctx, "start", flag)
    await until_flag(flag)
    await ctx.group.enqueue(member, f"{flag}.added")
    await note(ctx, "done", flag)


@jobs.job(name="g.cancels_own_group")
async def cancels_own_group(ctx: Any) -> None:
    """Cancels its own group (the cancel tells this member to stop, too)."""
    await note(ctx, "start", "cancels")
    await jobs.acancel_group(ctx.group.id)
    await note(ctx, "done", "cancels")


async def _add_member(ctx: Any, key: str) -> int:
    return int((await ctx.group.enqueue(member, key)).id)


@jobs.job(name="g.durable_adds", max_attempts=1)
async def durable_adds(ctx: Any, in_checkpoint: bool) -> None:
    """A durable member that adds a member, then parks on a child: its code between durable calls
    runs again when it wakes, so the add repeats unless it is made in a checkpoint."""
    if in_checkpoint:
        await ctx.checkpoint("add", _add_member, ctx, "added")
    else:
        await _add_member(ctx, "added")
    await ctx.run_children([member.request("child")])
