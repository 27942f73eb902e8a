"""Building task groups (docs/reference.md#4-python-api, docs/groups.md):

    with jobs.group(on_success=report.request(1), on_failure=alert.request(1)) as g:
        for row in rows:
            g.enqueue(import_row, 1, row)      # created, filled and sealed in one transaction
    g.handle                                   # GroupHandle(id, topic, signed_topic)

Over several transactions: `create_group()`, `add_to_group()` (while open), `seal_group()`.
How counting, sealing and finishing stay exactly-once under concurrency: queries.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Generator, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Never

from ...blocking import warn_if_on_event_loop
from ...postgres.connect import cursor_on, translated, translated_on
from ...postgres.text import BIGINT_MAX
from .. import database
from ..api.args import refuse_keywords, stored_whole
from ..api.awaited import awaited
from ..api.enqueue import (NO_OPTIONS, Batch, add_items, alook_for_script_runtimes, is_spec, look_for_script_runtimes,
                           run_at)
from ..api.handles import NO_SUCH_ID, JobHandle, StateTopicHandle, checked_id
from ...types import Seconds, shown
from ..api.registry import JobRequest, JobSpec
from ..errors import GroupBlockError, GroupClosedError, GroupLimitError, GroupNotFound, LeaseLostError
from . import queries as gq
from . import steps
from .transactions import ain_tx, check_conn, in_tx
from ...errors import ArgumentTypeError, ArgumentValueError

# The options of each group path that adds one member (named when it is given another keyword).
ADD_OPTIONS = ("wait", "at", "conn", "key", "tags")
BLOCK_OPTIONS = ("wait", "at", "key", "tags")

MAX_GROUP_MEMBERS = 100_000  # members per group, whichever way they are added
DEFAULT_SHARDS = 16  # counter rows per group: outcomes of different shards never wait on each other
CHUNK = 5000  # members per insert statement


@dataclasses.dataclass(frozen=True, slots=True)
class GroupHandle(StateTopicHandle):
    """A task group: its id and the state topic a page subscribes to (`group:<id>`)."""

    id: int
    _kind = "group"

    def add(self, fn: JobSpec | JobRequest, *args: Any, wait: Seconds | None = None, at: datetime | None = None,
            conn: Any = None, key: str | None = None, tags: Sequence[str] | None = None,
            **unknown: Never) -> JobHandle:
        warn_if_on_event_loop("handle.add()", "handle.aadd()")
        if unknown:  # refused, named as this method's
            job_and_args(fn, args, "add", unknown, ADD_OPTIONS)
        return add_to_group(self.id, fn, *args, wait=wait, at=at, conn=conn, key=key, tags=tags)

    def seal(self, conn: Any = None) -> bool:
        warn_if_on_event_loop("handle.seal()", "handle.aseal()")
        return seal_group(self.id, conn=conn)

    @awaited("handle.aadd()")
    async def aadd(self, fn: JobSpec | JobRequest, *args: Any, wait: Seconds | None = None, at: datetime | None = None,
                   conn: Any = None, key: str | None = None, tags: Sequence[str] | None = None,
                   **unknown: Never) -> JobHandle:
        if unknown:  # refused, named as this method's
            job_and_args(fn, args, "aadd", unknown, ADD_OPTIONS)
        return await aadd_to_group(self.id, fn, *args, wait=wait, at=at, conn=conn, key=key, tags=tags)

    @awaited("handle.aseal()")
    async def aseal(self, conn: Any = None) -> bool:
        return await aseal_group(self.id, conn=conn)


def not_found(group_id: int) -> GroupNotFound:
    """The error for a group id with no row visible to this transaction. Creating a group with conn=
    and then adding to it without conn= is the likely mistake: say so."""
    return GroupNotFound(f"no task group {shown(group_id)}: never created, deleted after its retention time, or created in "
                         "a transaction that has not committed (pass that transaction's conn= to add to it or seal it "
                         "before it commits)")


def refused(group_id: int, row: dict[str, Any] | None, adding: int, states: Sequence[str]) -> Exception:
    """The typed error for an add that ADD_TOTAL refused, from the group's row."""
    if row is None:
        return not_found(group_id)
    if row["finished_at"] is not None or row["state"] not in states:
        how = ("only its running members can add to it (ctx.group.enqueue)" if row["state"] == "sealed"
               else "it takes no more members")
        return GroupClosedError(f"task group {group_id} is {row['state']}: {how}", group_id=group_id,
                                state=row["state"])
    return GroupLimitError(
        f"task group {group_id} has {row['total']} members and adding {adding} would pass the limit of "
        f"{MAX_GROUP_MEMBERS}: split the work over several groups")


def add_steps(group_id: int, batch: Batch, *, states: Sequence[str], seal: bool = False,
              fence: tuple[int, int] | None = None, ring: steps.Ring = "now") -> steps.Steps[list[dict[str, Any]]]:
    """Fence (ctx.group.enqueue), insert, count pending, bump total and ring as `ring` says; raise
    if refused. Returns the member rows (id, name); with ring="coalesced", records the `progress`
    event too when the add rang."""
    if fence is not None:
        ok = yield steps.Query(gq.FENCE_MEMBER, {"id": fence[0], "lease": fence[1]})
        if not ok:
            raise LeaseLostError(
                f"job {fence[0]} no longer holds its claim (rescued after its runtime was presumed dead, timed out "
                f"or given back): its additions to group {group_id} are refused; another attempt will run")
    statements, places = batch.chunks(CHUNK)
    rows, got = yield from steps.add(group_id, statements, states=states, limit=MAX_GROUP_MEMBERS, seal=seal,
                                     ring=ring)
    if got is None:
        row = yield from steps.group_row(group_id)
        raise refused(group_id, row, len(rows), states)
    if ring == "coalesced" and got["rung"]:
        # We hold the group's row lock (ADD_TOTAL): this progress is ordered with its other events.
        yield from steps.record((yield from steps.views([group_id])), "progress")
    return [rows[p] for p in places]


def _group_id(value: Any) -> int:
    """checked_id for a group to add to or seal: an int no group can have is GroupNotFound
    naming it as given (checked_id reads it as the placeholder NO_SUCH_ID)."""
    group_id = checked_id(value, "group_id")
    if group_id == NO_SUCH_ID:
        raise GroupNotFound(f"no task group {shown(value)} (group ids are from 1 to {BIGINT_MAX})")
    return group_id


def check_limit(n: int) -> None:
    if n > MAX_GROUP_MEMBERS:
        raise GroupLimitError(f"a task group takes at most {MAX_GROUP_MEMBERS} members; this one would have {n}: "
                              "split the work over several groups")


def _check_items(items: Any, what: str) -> None:
    """TypeError naming `what` unless `items` can be a list of members: iterated as they are, a
    number or None would raise Python's bare "'int' object is not iterable"."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise ArgumentTypeError(f"{what}() takes an iterable of job.request(*args) values or "
                                f"(job_function, args) tuples, got {shown(items, typed=True, width=60)}")


def _callbacks(on_finish: Any, on_success: Any, on_failure: Any) -> dict[str, str | None]:
    return {"on_finish": steps.callback_spec(on_finish, "on_finish="),
            "on_success": steps.callback_spec(on_success, "on_success="),
            "on_failure": steps.callback_spec(on_failure, "on_failure=")}


def _callback_jobs(*requests: JobRequest | None) -> list[tuple[str, str]]:
    """(name, queue) of each callback (checked by _callbacks first): enqueued when the group
    finishes, by whichever process finishes it, so a script's job among them is looked for as a
    member is (enqueue.look_for_script_runtimes)."""
    return [(r.function.name, r.queue or r.function.queue) for r in requests if r is not None]


def _shards(shards: int) -> int:
    if isinstance(shards, bool) or not isinstance(shards, int):
        raise ArgumentTypeError(f"shards= must be an int from 1 to 1024, got {shown(shards, typed=True, width=40)}")
    if not 1 <= shards <= 1024:
        raise ArgumentValueError(f"shards= must be between 1 and 1024, got {shown(shards)}")
    return shards


# -- the block: create, fill and seal in one transaction ---------------------------------------

class Added:
    """What a batch's add returns in async code (g.enqueue() of an `async with jobs.agroup()`
    block, batch.enqueue() of an async fan-out step; sync code gets None): nothing to wait for, the
    job being added to the batch at once and written with it. There one awaits (ctx.group.enqueue,
    in an async job): awaited, this says so, naming the call, rather than Python's "object NoneType
    can't be used in 'await' expression"."""

    __slots__ = ("_call", "_written")

    def __init__(self, call: str, written: str) -> None:
        self._call = call
        self._written = written  # when the batch is written: "the block ends", ...

    def __await__(self) -> Generator[Any, None, None]:
        raise ArgumentTypeError(f"{self._call} is not awaited, in async code too: it adds to the batch at once, "
                                f"which is written when {self._written}; drop the `await`")

    def __repr__(self) -> str:
        return f"<added by {self._call}>"


class GroupBuilder:
    """`with jobs.group(...) as g:` collects members with `g.enqueue(fn, *args)`; at the end of the
    block the group is created, filled and sealed in one transaction (the caller's with `conn=`).
    If the block raises, nothing is written. `g.id` and `g.handle` are known inside the block
    already (the id is reserved on entry)."""

    def __init__(self, on_finish: JobRequest | None, on_success: JobRequest | None, on_failure: JobRequest | None,
                 conn: Any, shards: int) -> None:
        self._callbacks = _callbacks(on_finish, on_success, on_failure)
        self._later = _callback_jobs(on_finish, on_success, on_failure)
        self._conn = conn
        self._shards = _shards(shards)
        self._batch = Batch()
        self._id: int | None = None
        # A builder runs one block: its members are written when that block ends, so an add
        # after it would be dropped, and a second block would write them again.
        self._entered = False
        self._ended = False
        self._written = False  # whether the block's end wrote the group (not when the block raised)
        self._async = False  # an `async with` block: its adds return Added
        self.members: list[JobHandle] = []

    @property
    def id(self) -> int:
        if self._id is None:
            raise GroupBlockError("the group's id is known once its `with` block is entered: read it, and add "
                                  "members, inside `with jobs.group(...) as g:`")
        return self._id

    @property
    def handle(self) -> GroupHandle:
        return GroupHandle(self.id)

    def _check_open(self) -> None:
        if self._ended and not self._written:
            raise GroupClosedError(f"the block of task group {self._id} raised and wrote nothing: start a new group")
        if self._ended:
            raise GroupClosedError(f"the block of task group {self._id} has ended and wrote its members: "
                                   "add within the block, or start a new group")

    def enqueue(self, fn: JobSpec | JobRequest, *args: Any, wait: Seconds | None = None,
                at: datetime | None = None, key: str | None = None, tags: Sequence[str] | None = None,
                **unknown: Never) -> Added | None:
        """Add a member (written when the block ends). Arguments are checked now. With `key=`
        held by an unfinished job, that job's handle stands in and it is not a member."""
        self._check_open()
        fn, args, queue = job_and_args(fn, args, "g.enqueue", unknown, BLOCK_OPTIONS)
        check_limit(len(self._batch) + 1)
        self._batch.add(fn, args, run_at(wait, at), self.id, queue, key=key, tags=tags)
        return Added("g.enqueue()", "the block ends") if self._async else None

    def enqueue_many(self, items: Iterable[Any]) -> Added | None:
        """Members as for jobs.enqueue_many: job.request(...) values or (job, args[, options]) tuples.
        All or nothing: an item refused adds none of the call's items."""
        self._check_open()
        _check_items(items, "g.enqueue_many")
        with self._batch.all_or_nothing():
            add_items(self._batch, items, "g.enqueue_many", self.id, lambda: check_limit(len(self._batch) + 1))
        return Added("g.enqueue_many()", "the block ends") if self._async else None

    def _steps(self) -> steps.Steps[list[dict[str, Any]]]:
        yield from steps.create(self.id, self._shards, self._callbacks)
        rows = yield from add_steps(self.id, self._batch, states=["open"], seal=True)
        views = yield from steps.views([self.id])
        yield from steps.record(views, "created")
        # No member (no item, or every item got the handle of a job outside the group that held
        # its key): nothing will ever finish, so the seal finishes it (ADD_TOTAL holds the lock).
        if not any(r.get("created", True) for r in rows):
            yield from steps.finish([self.id], locked=True)
        return rows

    def _done(self, rows: list[dict[str, Any]]) -> None:
        self.members = [JobHandle(r["id"], r["name"]) for r in rows]
        self._written = True

    def _stored(self) -> contextlib.AbstractContextManager[None]:
        """Around the block's transaction: arguments too large for Postgres (args.stored_whole) are
        the members' or the callbacks', written in the same transaction, so the error names both."""
        return stored_whole(f"the arguments of the members and callbacks of task group {self._id}", plural=True)

    def _enter(self) -> None:
        if self._entered:
            raise GroupBlockError("a jobs.group() block runs once: make a new jobs.group(...) for another group")
        self._entered = True

    def __enter__(self) -> GroupBuilder:
        self._enter()
        if self._conn is not None:
            check_conn(self._conn, "sync")  # before the id is reserved on it
        url = database.database_url()
        if self._conn is not None:
            with translated_on(url, self._conn), cursor_on(self._conn) as cur:
                database.check_on_database(self._conn, "group")
                self._id = int(cur.execute(gq.RESERVE_GROUP_ID).fetchone()[0])
        else:
            with translated(url), database.pools().sync().connection() as own:
                self._id = int(own.execute(gq.RESERVE_GROUP_ID).fetchone()[0])  # type: ignore[index]
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._ended = True
        if exc_type is not None:
            return  # nothing was written; the reserved id stays unused
        with self._stored():
            self._done(in_tx(self._steps, self._conn))
        # Members and callbacks are enqueued too (enqueue.py says why).
        look_for_script_runtimes(self._batch, self._later)

    async def __aenter__(self) -> GroupBuilder:
        self._enter()
        self._async = True
        if self._conn is not None:
            check_conn(self._conn, "async")
        url = database.database_url()
        if self._conn is not None:
            with translated_on(url, self._conn):
                await database.acheck_on_database(self._conn, "agroup")
                async with cursor_on(self._conn) as cur:
                    row = await (await cur.execute(gq.RESERVE_GROUP_ID)).fetchone()
        else:
            with translated(url):
                async with (await database.pools().aget()).connection() as own:
                    row = await (await own.execute(gq.RESERVE_GROUP_ID)).fetchone()
        self._id = int(row[0])
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._ended = True
        if exc_type is not None:
            return
        with self._stored():
            self._done(await ain_tx(self._steps, self._conn))
        await alook_for_script_runtimes(self._batch, self._later)


def group(on_finish: JobRequest | None = None, on_success: JobRequest | None = None,
          on_failure: JobRequest | None = None, *, conn: Any = None, shards: int = DEFAULT_SHARDS) -> GroupBuilder:
    """A task group built in one `with` block (see GroupBuilder). Callbacks are job requests
    (`some_job.request(*args)`): on_finish always runs once the group is finished, on_success when
    every member succeeded, on_failure otherwise (a failed or cancelled member, or the group
    cancelled: then even if every member had succeeded)."""
    return GroupBuilder(on_finish, on_success, on_failure, conn, shards)


def agroup(on_finish: JobRequest | None = None, on_success: JobRequest | None = None,
           on_failure: JobRequest | None = None, *, conn: Any = None, shards: int = DEFAULT_SHARDS) -> GroupBuilder:
    """group() for async code: `async with jobs.agroup(...) as g:`; `conn=` takes a psycopg
    AsyncConnection."""
    return GroupBuilder(on_finish, on_success, on_failure, conn, shards)


# -- separate calls ----------------------------------------------------------------------------

def _callbacks_stored() -> contextlib.AbstractContextManager[None]:
    """Around create_group()'s transaction, whose only arguments are its callbacks'."""
    return stored_whole("the arguments of the callbacks of a new task group", plural=True)


def _create_steps(callbacks: dict[str, str | None], shards: int) -> steps.Steps[GroupHandle]:
    (row,) = yield steps.Query(gq.RESERVE_GROUP_ID, {})
    group_id = int(row["nextval"])
    yield from steps.create(group_id, shards, callbacks)
    yield from steps.record((yield from steps.views([group_id])), "created")
    return GroupHandle(group_id)


def create_group(on_finish: JobRequest | None = None, on_success: JobRequest | None = None,
                 on_failure: JobRequest | None = None, *, conn: Any = None,
                 shards: int = DEFAULT_SHARDS) -> GroupHandle:
    """Create an open group, to fill with add_to_group() and close with seal_group() (in as many
    transactions as you like). It cannot finish before it is sealed."""
    warn_if_on_event_loop("jobs.create_group()", "jobs.acreate_group()")
    cbs, n = _callbacks(on_finish, on_success, on_failure), _shards(shards)
    with _callbacks_stored():
        made = in_tx(lambda: _create_steps(cbs, n), conn)
    look_for_script_runtimes(Batch(), _callback_jobs(on_finish, on_success, on_failure))
    return made


@awaited("jobs.acreate_group()")
async def acreate_group(on_finish: JobRequest | None = None, on_success: JobRequest | None = None,
                        on_failure: JobRequest | None = None, *, conn: Any = None,
                        shards: int = DEFAULT_SHARDS) -> GroupHandle:
    """create_group() for async code; `conn=` takes a psycopg AsyncConnection."""
    cbs, n = _callbacks(on_finish, on_success, on_failure), _shards(shards)
    with _callbacks_stored():
        made = await ain_tx(lambda: _create_steps(cbs, n), conn)
    await alook_for_script_runtimes(Batch(), _callback_jobs(on_finish, on_success, on_failure))
    return made


def _add_many_steps(group_id: int, batch: Batch) -> steps.Steps[list[JobHandle]]:
    rows = yield from add_steps(group_id, batch, states=["open"], ring="coalesced")
    return [JobHandle(r["id"], r["name"]) for r in rows]


def _added(batch: Batch, handles: list[JobHandle]) -> list[JobHandle]:
    """`handles` of the members `batch` added, once the script's jobs among them were looked at:
    a member is enqueued as any job is, and a runtime elsewhere would give it back for ever
    (enqueue.look_for_script_runtimes)."""
    look_for_script_runtimes(batch)
    return handles


async def _aadded(batch: Batch, handles: list[JobHandle]) -> list[JobHandle]:
    await alook_for_script_runtimes(batch)
    return handles


def _batch_of(group_id: int, items: Iterable[Any], call: str) -> Batch:
    _check_items(items, call)
    batch = Batch()
    # The limit checked per item, as the block does: an endless or huge iterable is refused at
    # the limit, not read (and held) to its end first.
    add_items(batch, items, call, group_id, lambda: check_limit(len(batch) + 1))
    return batch


def job_and_args(fn: Any, args: tuple[Any, ...], what: str, unknown: Mapping[str, Any] = NO_OPTIONS,
                 options: Sequence[str] = ()) -> tuple[JobSpec, tuple[Any, ...], str | None]:
    """The function, arguments and queue of one member given as `fn, *args` or as a
    job.request(...); a TypeError naming what was given otherwise (not an AttributeError from
    deep inside the batch). Keywords `what` does not take (`unknown`; its `options` are named)
    are refused as enqueue refuses them: a job's arguments go by position."""
    queue = None
    if isinstance(fn, JobRequest):
        if args:
            raise ArgumentTypeError(f"{what}(job.request(...)) takes no further arguments")
        fn, args, queue = fn.function, fn.args, fn.queue
    if not is_spec(fn):
        raise ArgumentTypeError(f"{what}() takes a @jobs.job function and its arguments, or job.request(...), "
                                f"got {shown(fn, typed=True, width=60)}")
    if unknown:
        refuse_keywords(getattr(fn, "func", None), fn.name, what, unknown, options)
    return fn, args, queue


def _one(group_id: int, fn: JobSpec | JobRequest, args: tuple[Any, ...], wait: Seconds | None,
         at: datetime | None, key: str | None, tags: Sequence[str] | None, call: str,
         unknown: Mapping[str, Any]) -> Batch:
    fn, args, queue = job_and_args(fn, args, call, unknown, ADD_OPTIONS)
    batch = Batch()
    batch.add(fn, args, run_at(wait, at), group_id, queue, key=key, tags=tags)
    return batch


def add_to_group(group_id: int, fn: JobSpec | JobRequest, *args: Any, wait: Seconds | None = None,
                 at: datetime | None = None, conn: Any = None, key: str | None = None,
                 tags: Sequence[str] | None = None, **unknown: Never) -> JobHandle:
    """Add one member to an open group. Raises GroupClosedError once it is sealed (running members
    can still add through ctx.group.enqueue), GroupLimitError past the member limit. With `key=`
    held by an unfinished job, that job's handle is returned and it is not a member."""
    warn_if_on_event_loop("jobs.add_to_group()", "jobs.aadd_to_group()")
    group_id = _group_id(group_id)
    batch = _one(group_id, fn, args, wait, at, key, tags, "add_to_group", unknown)
    with batch.stored_whole("add_to_group"):
        return _added(batch, in_tx(lambda: _add_many_steps(group_id, batch), conn))[0]


def add_many_to_group(group_id: int, items: Iterable[Any], *, conn: Any = None) -> list[JobHandle]:
    """Add many members in one transaction (items as for jobs.enqueue_many)."""
    warn_if_on_event_loop("jobs.add_many_to_group()", "jobs.aadd_many_to_group()")
    group_id = _group_id(group_id)
    batch = _batch_of(group_id, items, "add_many_to_group")
    with batch.stored_whole("add_many_to_group"):
        return _added(batch, in_tx(lambda: _add_many_steps(group_id, batch), conn))


@awaited("jobs.aadd_many_to_group()")
async def aadd_many_to_group(group_id: int, items: Iterable[Any], *, conn: Any = None) -> list[JobHandle]:
    """add_many_to_group() for async code."""
    group_id = _group_id(group_id)
    batch = _batch_of(group_id, items, "aadd_many_to_group")
    with batch.stored_whole("aadd_many_to_group"):
        return await _aadded(batch, await ain_tx(lambda: _add_many_steps(group_id, batch), conn))


@awaited("jobs.aadd_to_group()")
async def aadd_to_group(group_id: int, fn: JobSpec | JobRequest, *args: Any, wait: Seconds | None = None,
                        at: datetime | None = None, conn: Any = None, key: str | None = None,
                        tags: Sequence[str] | None = None, **unknown: Never) -> JobHandle:
    """add_to_group() for async code; `conn=` takes a psycopg AsyncConnection."""
    group_id = _group_id(group_id)
    batch = _one(group_id, fn, args, wait, at, key, tags, "aadd_to_group", unknown)
    with batch.stored_whole("aadd_to_group"):
        return (await _aadded(batch, await ain_tx(lambda: _add_many_steps(group_id, batch), conn)))[0]


def _seal_steps(group_id: int) -> steps.Steps[bool]:
    sealed = yield from steps.seal(group_id)
    if not sealed:
        row = yield from steps.group_row(group_id)
        if row is None:
            raise not_found(group_id)
    return sealed


def seal_group(group_id: int, *, conn: Any = None) -> bool:
    """Seal an open group: no more adds from outside; it finishes (callbacks run) once no member is
    pending, at once if none is. False if it was not open (already sealed, cancelled or finished)."""
    warn_if_on_event_loop("jobs.seal_group()", "jobs.aseal_group()")
    group_id = _group_id(group_id)
    return in_tx(lambda: _seal_steps(group_id), conn)


@awaited("jobs.aseal_group()")
async def aseal_group(group_id: int, *, conn: Any = None) -> bool:
    """seal_group() for async code; `conn=` takes a psycopg AsyncConnection."""
    group_id = _group_id(group_id)
    return await ain_tx(lambda: _seal_steps(group_id), conn)
