"""`ctx.group`: what a running member or callback sees of its task group."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Never

from psycopg.rows import dict_row

from ...postgres.connect import translated
from .. import database
from ..api.enqueue import Batch, alook_for_script_runtimes, run_at
from ..api.handles import JobHandle
from ...types import Seconds, as_seconds, is_finite, shown
from ..api.registry import JobRequest, JobSpec
from ..runtime.threads import wait_on_loop
from ..errors import GroupClosedError
from ..events.views import GROUP_KEYS
from . import queries as gq
from . import steps
from .building import BLOCK_OPTIONS, add_steps, job_and_args
from ...errors import ArgumentValueError


class CallbackFields:
    """What a callback's `ctx.group` tells of the finished group, declared for type checkers: its
    values come from __getattr__ (GroupContext's), which refuses them to a member. `kind`:
    "finish", "success" or "failure"; `state`: the group's final one. Annotations only: no
    instance has these as attributes of its own."""

    kind: str
    state: str
    total: int
    pending: int
    succeeded: int
    failed: int
    cancelled: int


class GroupContext(CallbackFields):
    """`ctx.group` of a running member or callback.

    Members: `id`, and `await ctx.group.enqueue(fn, *args)` adds a member to the group, also
    after the seal, fenced by the member's claim (LeaseLostError once it lost it).
    Callbacks: also `kind` ("finish", "success" or "failure") and the group's final `state`,
    `total`, `pending`, `succeeded`, `failed`, `cancelled` (loaded before the callback runs);
    `as_dict()` gives them as its state topic does. A member reading those (`kind` too) gets AttributeError."""

    def __init__(self, ctx: Any, view: dict[str, Any] | None = None, kind: str | None = None) -> None:
        self._ctx = ctx
        job = ctx._job
        self._is_callback = job.callback_of is not None
        self.id: int = job.callback_of if self._is_callback else job.group_id
        self._kind = kind
        self._view = view or {}

    if not TYPE_CHECKING:
        # Hidden from type checkers, which would read any name, a misspelt one included, as its
        # Any: they read the names it serves from CallbackFields.
        def __getattr__(self, name: str) -> Any:
            if name == "kind":  # which callback this is: None would read to a member as a callback of no kind
                self._check_callback(name)
                return self._kind
            if name in GROUP_KEYS and name != "id":
                self._check_callback(name)
                return self._view.get(name)
            raise AttributeError(name)

    def _check_callback(self, name: str) -> None:
        """A member has no counts here (they change while it runs, and are loaded for callbacks
        only): None would read as a group that has none, so say where the current ones are."""
        if not self._is_callback and name == "kind":
            raise AttributeError("ctx.group.kind is which callback of the group runs (\"finish\", \"success\" or "
                                 "\"failure\"), known to its callbacks only: a member has none")
        if not self._is_callback:
            raise AttributeError(f"ctx.group.{name} is the finished group's, known to its callbacks only: a member "
                                 f"reads its group's current counts with `await jobs.aget_group(ctx.group.id)` "
                                 f"(jobs.get_group in a sync job)")

    def as_dict(self) -> dict[str, Any]:
        self._check_callback("as_dict()")
        return {"id": self.id, **{k: self._view.get(k) for k in GROUP_KEYS if k != "id"}}

    def __repr__(self) -> str:
        return f"<group {self.id}{' callback ' + str(self._kind) if self._is_callback else ''}>"

    async def _pool(self) -> Any:
        pool = getattr(self._ctx, "_pool", None)
        return pool if pool is not None else await database.pools().aget()

    @property
    def _url(self) -> str:
        return getattr(self._ctx, "_url", None) or database.database_url()

    def enqueue(self, fn: JobSpec | JobRequest, *args: Any, wait: Seconds | None = None,
                at: datetime | None = None, key: str | None = None,
                tags: Sequence[str] | None = None, **unknown: Never) -> Coroutine[Any, Any, JobHandle]:
        """Add a member to this job's group; returns its handle once committed. With `key=` held
        by an unfinished job, that job's handle is returned and it is not a member."""
        call = self._enqueue(fn, *args, wait=wait, at=at, key=key, tags=tags, **unknown)
        track = getattr(self._ctx, "_track", None)  # the job's ctx: it finds an add whose await was forgotten
        return track(call, "ctx.group.enqueue()") if track is not None else call

    async def _enqueue(self, fn: JobSpec | JobRequest, *args: Any, wait: Seconds | None, at: datetime | None,
                       key: str | None, tags: Sequence[str] | None, **unknown: Never) -> JobHandle:
        if self._is_callback:
            raise GroupClosedError(f"this callback runs after group {self.id} finished: it takes no more members "
                                   "(enqueue a job of your own, or start a new group)")
        fn, args, queue = job_and_args(fn, args, "ctx.group.enqueue", unknown, BLOCK_OPTIONS)
        batch = Batch()
        batch.add(fn, args, run_at(wait, at), self.id, queue, key=key, tags=tags)
        job = self._ctx._job
        publisher = getattr(self._ctx, "_group_progress", None)
        with batch.stored_whole("ctx.group.enqueue"), translated(self._url):
            async with (await self._pool()).connection() as conn:
                # With a publisher (a runtime's), it rings the add after the commit, coalesced.
                rows = await steps.arun(conn, add_steps(self.id, batch, states=["open", "sealed"],
                                                        fence=(job.id, job.lease),
                                                        ring="coalesced" if publisher is None else "later"))
        if publisher is not None:
            publisher.mark([self.id])  # after the commit: one read is enough
        # A member is enqueued as any job is: a script's job among them warns as its enqueue does.
        await alook_for_script_runtimes(batch, pool=getattr(self._ctx, "_pool", None))
        return JobHandle(rows[0]["id"], rows[0]["name"])


class SyncGroupContext(CallbackFields):
    """`ctx.group` of a sync job (in a worker thread): the same names, blocking."""

    def __init__(self, inner: GroupContext, loop: asyncio.AbstractEventLoop) -> None:
        self._inner = inner
        self._loop = loop

    if TYPE_CHECKING:
        # GroupContext's, which __getattr__ hands on.
        id: int

        def as_dict(self) -> dict[str, Any]: ...
    else:
        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    def enqueue(self, fn: JobSpec | JobRequest, *args: Any, wait: Seconds | None = None, at: datetime | None = None,
                key: str | None = None, tags: Sequence[str] | None = None, timeout: Seconds = 30.0,
                **unknown: Never) -> JobHandle:
        """GroupContext.enqueue, blocking for up to `timeout` seconds. Past it the add is called
        off on the loop (its transaction rolls back) before TimeoutError is raised, so an add the
        caller gave up on does not commit later behind its back."""
        if unknown:  # refused here, where timeout= is an option too
            job_and_args(fn, args, "ctx.group.enqueue", unknown, (*BLOCK_OPTIONS, "timeout"))
        timeout = as_seconds(timeout)
        if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                or not (is_finite(timeout) and timeout > 0)):
            raise ArgumentValueError(f"ctx.group.enqueue(timeout=) takes a positive, finite number of seconds "
                                     f"or a timedelta, got {shown(timeout, width=60)}")

        async def bounded() -> JobHandle:
            try:
                async with asyncio.timeout(timeout):
                    return await self._inner.enqueue(fn, *args, wait=wait, at=at, key=key, tags=tags)
            except TimeoutError:
                raise TimeoutError(
                    f"ctx.group.enqueue did not commit within {timeout:g} s and was called off; had it reached "
                    "its commit, the member may exist: pass key= so that a retry returns that member instead "
                    "of adding another") from None

        # Past the timeout the loop calls the add off, which waits for Postgres to end the
        # statement: wait for that as long as the loop runs, and no longer once it stopped.
        return wait_on_loop(bounded(), self._loop, "ctx.group.enqueue got no answer: the runtime's event loop "
                            "stopped while the add waited, which may have committed: pass key= so that a retry "
                            "returns that member instead of adding another")


async def load_callback_context(ctx: Any) -> GroupContext:
    """ctx.group of a callback job: the group's final state and which callback this is."""
    group = GroupContext(ctx)
    with translated(group._url):
        async with (await group._pool()).connection() as conn:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(gq.CALLBACK_CONTEXT, {"group_id": group.id, "job_id": ctx._job.id})
                row = await cur.fetchone()
    if row is None:
        return group
    return GroupContext(ctx, dict(row), row["kind"])
