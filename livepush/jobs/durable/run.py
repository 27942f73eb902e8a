"""What a durable job calls during one run: `ctx.checkpoint`, `ctx.run_child`, `ctx.run_children`,
`ctx.wait_for_signal` and `ctx.sleep` (docs/durable.md).

Replay: every run starts at the top. A call finds what an earlier run stored under its key and
returns it, or does its work and stores it. Keys: a checkpoint's or a sleep's name (unique within
a job); the n-th children call of the run; the n-th wait for a signal of a name. So code between
steps must be deterministic in the order of its durable calls (it is run again on replay).

Parking (children not finished, no signal yet, a sleep not over) happens in one transaction that
locks the job's row first (queries.FENCE), re-reads what it waits for, stores the step and moves
the job to `waiting`; then `Parked` ends the run and its slot is free. What it waits for makes it
available again (the group's finish, jobs.signal, or the promoter at its time) and it replays.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import difflib
import heapq
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

import psycopg
from psycopg.rows import dict_row

from ...postgres.connect import translated
from ...postgres.pools import aautocommitted
from ...postgres.text import unstorable
from ..api.args import PAST_ONE_MESSAGE, check_sendable, dumps, encode, stored_whole
from ..api.awaited import iscoroutinefunction
from ..api.enqueue import Batch, alook_for_script_runtimes
from ...types import as_seconds, shown
from ..api.registry import REGISTRY, JobRequest
from ..errors import (
    CheckpointInputConflict,
    ChildFailed,
    DuplicateStepError,
    InvalidResultError,
    JobCancelled,
    MessageTooLarge,
    Parked,
    ReplayMismatch,
    RunAbandoned,
    SignalTimeout,
    durable_call_checks,
    durable_call_refusal,
)
from ..groups import building
from ..groups import queries as gq
from ..groups import steps
from ..runtime.threads import call_in_thread
from . import queries as dq
from .fingerprint import NO_INPUT, fingerprint_of
from ...errors import ArgumentTypeError, ArgumentValueError, DependencyError



class RunContext(Protocol):
    """What the durable calls need of a running job's context (runtime/context.JobContext)."""

    _job: Any  # its ClaimedJob: id, lease, has_steps
    _pool: Any  # the runtime's connection pool
    _threads: Any  # the runtime's threads for sync work (None: the loop's default pool)
    _url: str | None
    _latest: dict[str, Any] | None  # the newest progress, written with the park
    _dirty: bool
    _cancel_requested: bool
    _released: bool  # handed back by the runtime: its lease is gone
    _timed_out: bool  # the attempt failed by its timeout (a sync job's thread runs on)

    @property
    def job_id(self) -> int: ...

    @property
    def queue(self) -> str: ...

    def _check_cancelled(self) -> None: ...

MAX_NAME = 200  # characters of a checkpoint, sleep or signal name
_RETRIES = 5  # a parking transaction Postgres broke (deadlock) is run again
_CONFLICTS = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


def check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME or unstorable(name):
        raise ArgumentValueError(f"{what} takes a name: a non-empty str of at most {MAX_NAME} characters Postgres can "
                                 f"store, got {shown(name, width=80)}")
    return name


def check_callable(name: Any, fn: Any, keywords: Mapping[str, Any]) -> None:
    """Checked before the lookup, on every run: a replay would hide the mistake until the first run
    that stores, where Python's own TypeError names neither the call nor the checkpoint. Keywords
    for `fn` (as asyncio.to_thread passes them) are refused here too, rather than by Python's
    TypeError, which a retry would meet again after running the code between steps."""
    if not callable(fn):
        raise durable_call_refusal(ArgumentTypeError(f"ctx.checkpoint({shown(name, width=80)}, fn, *args) takes a function "
                                                     f"to call, got {shown(fn, typed=True, width=60)}"))
    if keywords:
        misspelt = difflib.get_close_matches("input", keywords, n=1, cutoff=0.75)
        if misspelt:
            # Most likely the checkpoint's own input= misspelt (inputs=), which partial would pass to fn.
            raise durable_call_refusal(ArgumentTypeError(
                f"ctx.checkpoint({shown(name, width=80)}, fn, *args) takes input= (its fingerprint is compared on a "
                f"replay), got {misspelt[0]}=; a keyword for fn goes in functools.partial(fn, {misspelt[0]}=...)"))
        got = ", ".join(f"{k}=" for k in keywords)
        given = ", ".join(f"{k}=..." for k in keywords)
        raise durable_call_refusal(ArgumentTypeError(
            f"ctx.checkpoint({shown(name, width=80)}, fn, *args) passes fn its arguments by position only, got {got}: "
            f"pass functools.partial(fn, {given}) as fn"))


def children_asked(requests: Any) -> list[JobRequest]:
    """The requests of a run_children() call as a list; ArgumentTypeError naming what was given
    otherwise (iterated as it is, a number or a single request raised Python's bare "... is not
    iterable"). What iterating `requests` raises (the job's own generator) is the job's own error."""
    if isinstance(requests, JobRequest):
        raise durable_call_refusal(ArgumentTypeError("ctx.run_children() takes a list of job requests: for one "
                                                     "child use ctx.run_child(request), or pass [request]"))
    if isinstance(requests, (str, bytes)) or not isinstance(requests, Iterable):
        raise durable_call_refusal(ArgumentTypeError(
            f"ctx.run_children() takes a list of job requests (some_job.request(*args)), got "
            f"{shown(requests, typed=True, width=60)}"))
    asked = list(requests)
    for r in asked:
        if not isinstance(r, JobRequest):
            raise durable_call_refusal(ArgumentTypeError(
                f"ctx.run_children() takes job requests (some_job.request(*args)), got {shown(r, width=80)}"))
    return asked


def child_asked(request: Any) -> JobRequest:
    if not isinstance(request, JobRequest):
        raise durable_call_refusal(ArgumentTypeError(f"ctx.run_child() takes a job request "
                                                     f"(some_job.request(*args)), got {type(request).__name__} "
                                                     f"{shown(request, width=60)}"))
    return request


# A wait longer than this ends after any date Postgres and Python share.
MAX_SECONDS = 100 * 366 * 24 * 3600.0


def _seconds(value: Any, what: str) -> float:
    with durable_call_checks():
        value = as_seconds(value)
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0
                or not value <= MAX_SECONDS):
            raise ArgumentValueError(f"{what} takes a number of seconds (or a timedelta) from 0 to 100 years, "
                                     f"got {shown(value, width=60)}")
    return float(value)


def _after(now: datetime, seconds: float) -> datetime:
    """`seconds` after `now`, in UTC. psycopg gives `now` in the session's time zone, and adding to
    such a datetime adds to its wall-clock time: across a daylight-saving change the sleep or
    timeout would end an hour early or late."""
    return now.astimezone(timezone.utc) + timedelta(seconds=seconds)


def _when(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _too_large(name: str, said: str) -> InvalidResultError:
    """A result larger than a jsonb value may be (a string or the whole value past 256 MB), or
    than one message to Postgres carries (1 GiB, `said` names which): every retry would run the
    checkpoint's body again and meet the same refusal, so the job fails at once, as for a result
    that is not JSON."""
    return InvalidResultError(f"checkpoint {name!r} result is too large for Postgres to store "
                              f"({said}): keep checkpoint results small (ids, counts, "
                              "short texts); write large data to your tables inside the checkpoint and return its id")


def _failure(job_id: int, name: str, state: str, error: str | None) -> str:
    """One child in ChildFailed's message. A cancelled one has no error to show: said so, not as a
    failure whose error went missing."""
    if state == "cancelled" and not error:
        return f"job {job_id} ({name}) was cancelled"
    return f"job {job_id} ({name}) {state}: {error or 'no error recorded'}"


class _Lost(Exception):
    """FENCE found the job no longer ours."""


# Set while a checkpoint's body runs: a durable call made from inside one must not wait for the
# bodies running in its run to end (its own caller is one of them).
_IN_BODY: contextvars.ContextVar[bool] = contextvars.ContextVar("livepush_durable_in_body", default=False)


class DurableRun:
    """The durable calls of one run of one job. Made by the job's context on first use."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self._stored: dict[tuple[str, str], dict[str, Any]] | None = None
        # A store failed with Postgres (its commit may or may not have happened): the next lookup
        # reads the stored steps again, so a retry of that checkpoint returns what was stored.
        self._reload = False
        # Held while the stored steps are read: durable calls side by side (asyncio.gather) that
        # need them at once wait for the one read instead of each making its own.
        self._loading = asyncio.Lock()
        self._used: set[tuple[str, str]] = set()  # checkpoint and sleep names this run
        # Positions of children calls ("children") and of waits for each signal name ("signal:NAME"):
        # the next one, and those given back by a call that lost Postgres (taken again first).
        self._positions: collections.Counter[str] = collections.Counter()
        self._given_back: dict[str, list[int]] = collections.defaultdict(list)
        # Checkpoints run side by side with a parking call (asyncio.gather): a park holds `_gate`
        # until it committed, and first waits for the bodies running (`_bodies`) to store their
        # results; a body that had not stored when the run parked would run again on the replay.
        self._gate = asyncio.Lock()
        self._bodies = 0
        self._no_bodies = asyncio.Event()
        self._no_bodies.set()
        self._parked = False
        self._ended = False  # settle(): the run's function returned or raised

    # -- what earlier runs stored ---------------------------------------------------------------
    async def _steps(self) -> dict[tuple[str, str], dict[str, Any]]:
        if self._stored is None or self._reload:
            async with self._loading:
                if self._stored is None or self._reload:
                    stored: dict[tuple[str, str], dict[str, Any]] = {}
                    if self.ctx._job.has_steps or self._reload:
                        for row in await self._read(dq.LOAD_STEPS, {"id": self.ctx.job_id}):
                            stored[(row["kind"], row["name"])] = row
                    # What this run knew stands (stored by it, or read before): a store that
                    # committed during the read may be missing from it.
                    self._stored = {**stored, **(self._stored or {})}
                    self._reload = False
        return self._stored

    def _connection(self) -> Any:
        return self.ctx._pool.connection()

    async def _read(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """One read of the durable calls; psycopg's errors become livepush's (DependencyError), as
        around every other call a job makes through ctx, so that a job catches the one it knows."""
        with translated(self.ctx._url or ""):
            async with self._connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(sql, params)
                rows: list[dict[str, Any]] = await cur.fetchall()
                return rows

    def _unique(self, kind: str, name: str) -> tuple[str, str]:
        key = (kind, name)
        if key in self._used:
            # Most often a loop that gives every item's step one name: say how to name them.
            raise DuplicateStepError(f"a second {kind} named {name!r} in one run of job {self.ctx.job_id}: "
                                     f"{kind} names find stored results on replay, so each must be unique in a job. "
                                     "Give each call its own name: in a loop, put the item's id or the loop's index "
                                     f"in it (f\"{name}-{{i}}\")")
        self._used.add(key)
        return key

    # -- checkpoints ----------------------------------------------------------------------------
    async def lookup(self, name: Any, input: Any) -> tuple[bool, Any, str | None]:
        """(found, stored value, input fingerprint) for checkpoint `name`; raises
        CheckpointInputConflict when both fingerprints exist and differ."""
        with durable_call_checks():
            checked = check_name(name, "ctx.checkpoint()")
            # Named as a result is (`checkpoint 'x' result[0]`): in a job of many checkpoints,
            # "input" alone does not say which one was given it.
            fingerprint = None if input is NO_INPUT else fingerprint_of(input, f"checkpoint {checked!r} input")
        stored = await self._steps()  # before the name is taken: a read that lost Postgres takes none
        key = self._unique("checkpoint", checked)
        row = stored.get(key)
        if row is None:
            return False, None, fingerprint
        self._check_input(checked, row["fingerprint"], fingerprint)
        return True, row["result"]["value"], fingerprint

    def _check_input(self, name: str, stored: str | None, given: str | None) -> None:
        """CheckpointInputConflict when both fingerprints exist and differ."""
        if given is not None and stored is not None and given != stored:
            # The way on, and its cost: a renamed checkpoint runs its body again (a charge made twice).
            raise CheckpointInputConflict(
                f"checkpoint {name!r} of job {self.ctx.job_id} was stored for another input (fingerprint "
                f"{stored[:12]}…, now {given[:12]}…): its stored result would be wrong for this input. "
                "Rename the checkpoint if the step really changed (its body then runs again, for this input), or "
                f"restore the input; then jobs.retry_failed({self.ctx.job_id}) runs the job on from this step")

    async def store(self, name: str, value: Any, fingerprint: str | None) -> Any:
        """Store a checkpoint's result (fenced by the run's lease); returns it as a replay will."""
        text = encode(value, f"checkpoint {name!r} result", InvalidResultError, "checkpoint results")
        self.ctx._check_cancelled()
        params = {"id": self.ctx.job_id, "lease": self.ctx._job.lease, "name": name, "result": f'{{"value":{text}}}',
                  "fingerprint": fingerprint}
        try:
            check_sendable(params)
        except MessageTooLarge as exc:
            raise _too_large(name, PAST_ONE_MESSAGE) from exc
        # One statement in autocommit: one round trip (queries.SAVE_CHECKPOINT).
        try:
            with translated(self.ctx._url or ""):
                async with self._connection() as conn, aautocommitted(conn), conn.cursor() as cur:
                    try:
                        await cur.execute(dq.SAVE_CHECKPOINT, params)
                    except psycopg.errors.ProgramLimitExceeded as exc:
                        raise _too_large(name, exc.diag.message_primary or str(exc)) from exc
                    stored = await cur.fetchone()
                    saved = None if stored is None else stored[1]
                    if stored is not None and not stored[2]:
                        # Stored already (a store that lost its connection committed after all): that
                        # result is the one every replay returns, so this run returns it too.
                        await cur.execute(dq.STORED_CHECKPOINT, {"id": self.ctx.job_id, "name": name})
                        found = await cur.fetchone()
                        assert found is not None  # the row it met; a running job's steps are never deleted
                        saved, earlier = found
                        self._check_input(name, earlier, fingerprint)
                        fingerprint = earlier
        except DependencyError:
            # Stored or not, the job may call the checkpoint again (its own retry): that call reads
            # the stored steps again and returns the result if this store committed after all.
            self.unstored("checkpoint", name, maybe_stored=True)
            raise
        if stored is None:
            raise self._lost(f"its checkpoint {name!r} was not stored")
        # What the database stored, not json.loads(text): jsonb reorders keys and writes -0.0 as
        # 0.0, and a replay returns its spelling; code after the checkpoint must see the same
        # value on every run.
        self._steps_cache(("checkpoint", name), {"value": saved}, fingerprint)
        return saved

    def unstored(self, kind: str, name: str, maybe_stored: bool = False) -> None:
        """Checkpoint (or sleep) `name` raised before its result was surely stored: the job may call it again in this run
        (its own retry of a flaky call) without DuplicateStepError. A replay then meets the stored
        result at the first call of the name, and returns it there. `maybe_stored`: a write that
        lost Postgres, which may have committed all the same: the next lookup reads the stored
        steps again. Sync, so that a sync job's thread calls it also once the runtime's loop is
        gone."""
        self._used.discard((kind, name))
        self._reload = self._reload or maybe_stored

    async def checkpoint(self, name: Any, fn: Callable[..., Any], *args: Any, input: Any = NO_INPUT,
                         **keywords: Any) -> Any:
        check_callable(name, fn, keywords)
        found, value, fingerprint = await self.lookup(name, input)
        if found:
            return value
        if iscoroutinefunction(fn):  # other_job.aenqueue too: before 3.12 only asyncio sees its mark (api/awaited.py)
            async with self._body():
                try:
                    result = await fn(*args)
                except BaseException:
                    self.unstored("checkpoint", name)
                    raise
                return await self.store(name, result, fingerprint)
        # A sync function runs on in its thread when the task awaiting it is cancelled (a sibling
        # in an asyncio.TaskGroup failed): its own task still stores its result, counted as a body
        # running (settle() waits for it), so that the replay does not run it a second time.
        return await asyncio.shield(asyncio.ensure_future(self._sync_body(name, fn, args, fingerprint)))

    async def _sync_body(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                         fingerprint: str | None) -> Any:
        async with self._body():
            # A sync function may block (a request, a file): not on the loop the runtime's jobs
            # share, and in the runtime's threads, as sync jobs run (the loop's default pool has
            # only a few). call_in_thread: a StopIteration it raises would never reach us through
            # a bare run_in_executor (an asyncio future refuses it), and the job would hang.
            try:
                result = await call_in_thread(self.ctx._threads, fn, *args)
                if inspect.isawaitable(result):
                    result = await result
            except BaseException:
                self.unstored("checkpoint", name)
                raise
            return await self.store(name, result, fingerprint)

    @contextlib.asynccontextmanager
    async def _body(self) -> AsyncIterator[None]:
        """A checkpoint's body and the store of its result, counted as running. One begun once the
        run parked or ended does not run: nobody could store its result."""
        if not _IN_BODY.get():
            async with self._gate:  # a park under way decides first whether the run goes on
                pass
        self._refuse_late_body()
        self._bodies += 1
        self._no_bodies.clear()
        token = _IN_BODY.set(True)
        try:
            yield
        finally:
            _IN_BODY.reset(token)
            self._bodies -= 1
            if not self._bodies:
                self._no_bodies.set()

    def _refuse_late_body(self) -> None:
        if self._parked:
            raise Parked()
        if self._ended:
            raise RunAbandoned(f"job {self.ctx.job_id}: a checkpoint started after its run had ended; the next run "
                               "will replay it")

    async def sync_body_may_start(self) -> None:
        """Before a sync job's checkpoint body runs in its thread: not once the run parked or ended
        (a `finally` around a parking call), nor once its attempt ended by its timeout or was handed
        back (the thread runs on): its result could not be stored, and the body would run again on
        the replay."""
        self._refuse_late_body()
        if self.ctx._released or self.ctx._timed_out:
            raise RunAbandoned(f"job {self.ctx.job_id}: a checkpoint started after its attempt had ended; the next "
                               "run will replay it")

    async def settle(self) -> None:
        """At the end of the run's function (it returned, raised or parked): no checkpoint body
        starts any more, and those still running beside it (asyncio.gather does not stop them when
        one raises) store their results before the run's outcome ends its claim, so that the next
        run replays them instead of running them again. Not for a run cancelled or past its
        timeout: it ends now (a sync function that runs on in its thread stores what it can)."""
        self._ended = True
        if self.ctx._cancel_requested or self.ctx._timed_out:
            return
        await self._no_bodies.wait()

    @contextlib.asynccontextmanager
    async def _parking(self) -> AsyncIterator[None]:
        """Around a parking transaction: no new checkpoint body starts, and the running ones have
        stored their results, before it parks; a second parking call (asyncio.gather) ends with
        the run once the first parked, instead of finding the claim gone."""
        if self.ctx._timed_out or self.ctx._released:
            # Its lease holds until the runtime writes the attempt's outcome (batched): parked
            # meanwhile, the job would wait, and the timeout's failure be fenced off and lost.
            raise RunAbandoned(f"job {self.ctx.job_id}: a parking call after its attempt had ended (past its "
                               "timeout, or given back); it does not park")
        async with contextlib.AsyncExitStack() as stack:
            # From inside a checkpoint's body, waiting for the bodies would wait for itself.
            if not _IN_BODY.get():
                await stack.enter_async_context(self._gate)
                if self._parked:
                    raise Parked()
                await self._no_bodies.wait()
                # The run may have returned or raised while this waited for the bodies (gather
                # lets the others run on): parked now, it would create children (or take a
                # signal) after the run ended, and its park would swallow the run's outcome.
                if self._ended:
                    raise RunAbandoned(f"job {self.ctx.job_id}: a parking call went on after its run had ended; "
                                       "the next run will replay it")
            try:
                yield
            except Parked:
                self._parked = True
                raise

    # -- positions -------------------------------------------------------------------------------
    def _position(self, of: str) -> int:
        """The position of this run's next call of `of` (children calls, or waits for one signal):
        a position given back first, lowest first, so that the calls keep the order a replay
        makes them in."""
        given_back = self._given_back[of]
        if given_back:
            return heapq.heappop(given_back)
        self._positions[of] += 1
        return self._positions[of] - 1

    @contextlib.asynccontextmanager
    async def _positioned(self, of: str, position: int) -> AsyncIterator[None]:
        """Around a call at `position`: when it loses Postgres (DependencyError) the job may call it
        again (its own retry), which takes the same position and reads the stored steps again
        (what it wrote may have committed all the same). Taking the next one instead, the retry
        stored its step under a position that no replay reaches: the replay's call found nothing
        at its own, and waited again for a signal already taken."""
        try:
            yield
        except DependencyError:
            heapq.heappush(self._given_back[of], position)
            self._reload = True
            raise

    # -- parking --------------------------------------------------------------------------------
    def _lost(self, what: str) -> RunAbandoned:
        return RunAbandoned(f"job {self.ctx.job_id} no longer holds its claim (rescued, cancelled or given back): "
                            f"{what}; another run will replay it")

    async def _park_tx(self, body: Callable[[datetime], steps.Steps[Any]]) -> Any:
        """Run `body(db_now)` after FENCE in one transaction, retried when Postgres broke a
        deadlock. `body` returns what the call returns, or raises Parked after its PARK."""
        async with self._parking():
            return await self._park_tx_now(body)

    async def _park_tx_now(self, body: Callable[[datetime], steps.Steps[Any]]) -> Any:
        ctx = self.ctx

        def tx() -> steps.Steps[Any]:
            fenced = yield steps.Query(dq.FENCE, {"id": ctx.job_id, "lease": ctx._job.lease})
            if not fenced:
                raise _Lost()
            if fenced[0]["cancel_requested"]:
                ctx._cancel_requested = True
                raise JobCancelled(f"job {ctx.job_id} was cancelled")
            return (yield from body(fenced[0]["now"]))

        with translated(ctx._url or ""):
            for attempt in range(_RETRIES):
                try:
                    async with self._connection() as conn:
                        try:
                            return await steps.arun(conn, tx())
                        except Parked:
                            await conn.commit()  # the park and what it stored
                            raise
                except _Lost:
                    raise self._lost("it cannot park") from None
                except _CONFLICTS:
                    if attempt == _RETRIES - 1:
                        raise
        raise AssertionError("unreachable")

    def _park(self, waiting: dict[str, Any], until: datetime | None = None,
              then: steps.Steps[None] | None = None) -> steps.Steps[None]:
        """PARK (then `then`, in the same transaction), and end the run with Parked."""
        ctx = self.ctx
        progress = dumps(ctx._latest) if ctx._latest is not None else None
        moved = yield steps.Query(dq.PARK, {"id": ctx.job_id, "lease": ctx._job.lease, "until": until,
                                            "waiting": dumps(waiting), "progress": progress})
        if not moved:
            raise _Lost()
        if moved[0]["run_touched"] < 0:
            # A workflow step whose run ended meanwhile: roll the park back and end as cancelled.
            ctx._cancel_requested = True
            raise JobCancelled(f"job {ctx.job_id}: its workflow run has ended; it does not wait")
        if then is not None:
            yield from then
        ctx._dirty = False
        raise Parked()

    def _save(self, kind: str, name: str, result: dict[str, Any]) -> steps.Steps[None]:
        yield steps.Query(dq.SAVE_STEP, {"id": self.ctx.job_id, "kind": kind, "name": name, "result": dumps(result)})

    # -- children -------------------------------------------------------------------------------
    async def run_children(self, requests: Iterable[JobRequest]) -> list[Any]:
        requests = children_asked(requests)
        if requests:
            building.check_limit(len(requests))

        async def given() -> list[JobRequest]:
            return requests

        position = self._position("children")
        async with self._positioned("children", position):
            found = await self._children(str(position), given)
            if found is None:
                return []
            return await self._results(*found, asked=requests)

    async def fan_out(self, make: Callable[[], Awaitable[list[JobRequest]]],
                      on_group: Callable[[int], steps.Steps[None]] | None = None) -> dict[str, int]:
        """Children that `make()` returns (called only on the run that creates them), as a task group
        this job parks on; returns the group's counts once it finished, whatever its members' outcomes.
        `on_group(group_id)`: more steps in the transaction that creates the group."""
        position = self._position("children")
        async with self._positioned("children", position):
            return await self._counts(await self._children(str(position), make, on_group))

    async def _counts(self, found: tuple[int, int] | None) -> dict[str, int]:
        if found is None:
            return {"total": 0, "succeeded": 0, "failed": 0, "cancelled": 0}
        views = await self._read(gq.GROUP_VIEWS, {"ids": [found[0]]})
        view = views[0] if views else None
        if view is None:
            raise ChildFailed(f"the task group {found[0]} of job {self.ctx.job_id}'s children is gone (deleted after "
                              "its retention time): their counts cannot be read", [])
        return {k: int(view[k]) for k in ("total", "succeeded", "failed", "cancelled")}

    async def _children(self, call: str, make: Callable[[], Awaitable[list[JobRequest]]],
                        on_group: Callable[[int], steps.Steps[None]] | None = None) -> tuple[int, int] | None:
        """The children call at position `call` of the run: its group (id, children asked for) once
        finished, or None when it asked for none; parks until then. Creates the children the first
        time only."""
        stored = (await self._steps()).get(("children", call))
        if stored is None:
            requests = await make()
            if not requests:
                return None
            # Children whose arguments one jsonb value cannot hold: InvalidArgumentsError naming
            # them (args.stored_whole), not an outage that a retry would meet again.
            many = f"{len(requests)} children" if len(requests) > 1 else "child"
            try:
                with stored_whole(f"the arguments of job {self.ctx.job_id}'s {many}", plural=True):
                    await self._park_tx(lambda now: self._spawn(call, requests, on_group))
            except Parked:
                # The children are enqueued (committed with the park): a script's job among them
                # warns as its enqueue does, on the queue _spawn put it on.
                await alook_for_script_runtimes(Batch(), [(r.name, r.queue or self.ctx.queue) for r in requests],
                                                pool=self.ctx._pool)
                raise
            raise AssertionError("unreachable: _spawn parks")
        group_id, count = stored["result"]["group"], stored["result"]["count"]
        if not await self._finished(group_id):
            waiting = {"for": "children", "name": f"group:{group_id}", "group": group_id}

            def recheck(now: datetime) -> steps.Steps[None]:
                rows = yield steps.Query(dq.GROUP_FINISHED, {"group_id": group_id})
                if rows and rows[0]["finished"]:
                    return
                yield from self._park(waiting)

            await self._park_tx(recheck)
        return group_id, count

    def _spawn(self, call: str, requests: Sequence[JobRequest],
               on_group: Callable[[int], steps.Steps[None]] | None) -> steps.Steps[None]:
        """Under FENCE: the children as a sealed task group on the parent's queue (unless a request
        names one) whose finish wakes the parent, the step that remembers it, and the park."""
        ctx = self.ctx
        (row,) = yield steps.Query(gq.RESERVE_GROUP_ID, {})
        group_id = int(row["nextval"])
        batch = Batch()
        for r in requests:
            batch.add(REGISTRY.get(r.name), r.args, None, group_id, r.queue or ctx.queue)
        yield from steps.create(group_id, building.DEFAULT_SHARDS, {"on_finish": None, "on_success": None,
                                                                      "on_failure": None}, parent_id=ctx.job_id)
        yield from building.add_steps(group_id, batch, states=["open"], seal=True)
        yield from steps.record((yield from steps.views([group_id])), "created")
        yield from self._save("children", call, {"group": group_id, "count": len(requests)})
        # on_group after the park: the park touches a workflow step's run row, and whatever on_group
        # locks of that run (its step's row) comes after it, as in every decision about the run.
        yield from self._park({"for": "children", "name": f"group:{group_id}", "group": group_id},
                              then=on_group(group_id) if on_group is not None else None)

    async def _finished(self, group_id: int) -> bool:
        rows = await self._read(dq.GROUP_FINISHED, {"group_id": group_id})
        row = rows[0] if rows else None
        if row is None:
            raise ChildFailed(f"the task group {group_id} of job {self.ctx.job_id}'s children is gone (deleted after "
                              "its retention time): its children's results cannot be read", [])
        return bool(row["finished"])

    async def _results(self, group_id: int, count: int, asked: Sequence[JobRequest]) -> list[Any]:
        rows = await self._read(dq.CHILDREN, {"group_id": group_id, "count": count})
        self._check_same_children(group_id, asked, [r["name"] for r in rows[:count]], count)
        if len(rows) < count:
            raise ChildFailed(f"{count - len(rows)} of {count} children of job {self.ctx.job_id} are gone (deleted "
                              "after their retention time): their results cannot be read", [])
        failed = [(r["id"], r["name"], r["state"], r["error"]) for r in rows if r["state"] != "succeeded"]
        if failed:
            shown = "; ".join(_failure(*f) for f in failed[:5])
            more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
            raise ChildFailed(f"{len(failed)} of {count} children of job {self.ctx.job_id} did not succeed: "
                              f"{shown}{more}", failed)
        return [r["result"] for r in rows]

    def _check_same_children(self, group_id: int, asked: Sequence[JobRequest], stored: list[str],
                             count: int) -> None:
        """ReplayMismatch when this call asks for other jobs (or another number) than the children
        its position found: children calls are found by position, so a redeploy that moved or
        changed one before the point a parked run reached would otherwise hand this call the
        results of children made for another."""
        names = [r.name for r in asked]
        if len(names) == count and (len(stored) < count or names == stored):
            return  # the same call (children deleted by retention are reported by the caller)

        def shown(listed: list[str], n: int) -> str:
            return f"{n} {'child' if n == 1 else 'children'} [{', '.join(listed[:5])}{', ...' if n > 5 else ''}]"

        raise ReplayMismatch(
            f"a children call of job {self.ctx.job_id} asks for {shown(names, len(names))}, but an earlier run made "
            f"it with {shown(stored, count)} (task group {group_id}): the code changed before the point that run had "
            "reached. Children calls are found by their position: deploy such a change under a new job name and let "
            "the old runs finish under the old one")

    # -- signals --------------------------------------------------------------------------------
    async def wait_for_signal(self, name: Any, timeout: Any = None) -> Any:
        with durable_call_checks():
            name = check_name(name, "ctx.wait_for_signal()")
        limit = None if timeout is None else _seconds(timeout, "ctx.wait_for_signal(timeout=)")
        position = self._position(f"signal:{name}")
        async with self._positioned(f"signal:{name}", position):
            return await self._wait_at(f"{position}:{name}", name, limit)

    async def _wait_at(self, key: str, name: str, limit: float | None) -> Any:
        stored = (await self._steps()).get(("signal", key))
        if stored is not None:
            result = stored["result"]
            if "data" in result:
                return result["data"]
            if result.get("timeout"):
                raise self._timeout(name, result)

        def tx(now: datetime) -> steps.Steps[Any]:
            taken = yield steps.Query(dq.TAKE_SIGNAL, {"id": self.ctx.job_id, "name": name})
            if taken:
                data = taken[0]["data"]
                yield from self._save("signal", key, {"data": data})
                return {"data": data}
            # The wait's own deadline and timeout: fixed when a run first reached it, whatever
            # timeout= the code gives now (a deploy may have changed it under a parked run).
            if stored is not None:
                wait = {"deadline": stored["result"].get("deadline"), "seconds": stored["result"].get("seconds")}
            else:
                until = None if limit is None else _after(now, limit)
                wait = {"deadline": until.isoformat() if until else None, "seconds": limit}
            deadline = _when(wait["deadline"])
            if deadline is not None and deadline <= now:
                # Kept with the timeout, so that every later run's SignalTimeout names them too.
                yield from self._save("signal", key, {"timeout": True, **wait})
                return {"timeout": True, **wait}
            if stored is None:
                yield from self._save("signal", key, wait)
            yield from self._park({"for": "signal", "name": name}, deadline)

        result = await self._park_tx(tx)
        self._steps_cache(("signal", key), result)
        if "data" in result:
            return result["data"]
        raise self._timeout(name, result)

    def _timeout(self, name: str, stored: dict[str, Any]) -> SignalTimeout:
        """The timeout of a wait, named by what the wait stored, not by the code's timeout= now. A
        step stored by an older livepush lacks them: then it says what it can."""
        seconds, deadline = stored.get("seconds"), stored.get("deadline")
        # .15g: every digit a user's timeout= has (:g wrote 30 days as 2.592e+06).
        took = f" (timeout={seconds:.15g} s, fixed when a run first reached the wait)" if seconds is not None else ""
        until = f" until {deadline}" if deadline is not None else ""
        if not took and not until:
            return SignalTimeout(f"job {self.ctx.job_id}: its wait for signal {name!r} timed out")
        return SignalTimeout(f"job {self.ctx.job_id} waited for signal {name!r}{until}{took} and none came")

    def _steps_cache(self, key: tuple[str, str], result: dict[str, Any], fingerprint: str | None = None) -> None:
        if self._stored is not None:
            self._stored[key] = {"result": result, "fingerprint": fingerprint}

    # -- durable sleep --------------------------------------------------------------------------
    async def sleep(self, name: Any, seconds: Any) -> None:
        with durable_call_checks():
            checked = check_name(name, "ctx.sleep()")
        wanted = _seconds(seconds, "ctx.sleep()")
        found = await self._steps()  # before the name is taken: a read that lost Postgres takes none
        key = self._unique("sleep", checked)
        try:
            await self._sleep(checked, wanted, found.get(key))
        except DependencyError:
            # As for a checkpoint's store: the job may call it again, which reads the steps again.
            self.unstored("sleep", checked, maybe_stored=True)
            raise

    async def _sleep(self, name: str, wanted: float, stored: dict[str, Any] | None) -> None:
        stored_until = _when(stored["result"]["until"]) if stored is not None else None
        # Ended by Postgres' clock when the steps were read: it has ended now. Otherwise the
        # transaction decides, by Postgres' clock too; the app's clock may be ahead of it.
        read_at = stored.get("read_at") if stored is not None else None
        if stored_until is not None and read_at is not None and stored_until <= read_at:
            return

        def tx(now: datetime) -> steps.Steps[None]:
            until = stored_until if stored_until is not None else _after(now, wanted)
            if stored is None:
                yield from self._save("sleep", name, {"until": until.isoformat()})
            if until <= now:
                return
            yield from self._park({"for": "sleep", "name": name}, until)

        await self._park_tx(tx)
