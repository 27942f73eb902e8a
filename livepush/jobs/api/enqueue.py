"""Enqueue: one job or many, in our own transaction or the caller's (`conn=`).

Every path is one statement (queries.ENQUEUE, or ENQUEUE_ONE for a lone job; ENQUEUE_KEYED,
ENQUEUE_ONE_KEYED or ENQUEUE_DEBOUNCED when a job has an idempotency key) that also rings each new job's state topic
and the runtimes' doorbell; both are delivered at commit, so pages and idle runtimes hear only of
committed jobs. Enqueue options (key=, debounce=, tags=): docs/jobs.md "Enqueue options". In the
caller's transaction, a statement whose JSON is long enough that Postgres may refuse it as too
large runs inside a savepoint (_guarded), so that a refusal leaves that transaction usable.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import socket
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any

from ...blocking import warn_if_on_event_loop
from ...postgres.connect import cursor_on, translated, translated_on
from ...postgres.pools import aautocommitted, autocommitted
from ...postgres.savepoints import Savepoint, akept, in_callers_transaction, kept
from .. import database, queries
from .awaited import awaited
from .args import check_args, dumps, may_be_too_large, name_refused, refuse_arity, stored_whole
from .handles import JobHandle
from .limits import check_claim_entry
from .options import check_debounce, check_key, check_tags
from .registry import REGISTRY, JobRequest, JobSpec
from ...errors import ArgumentTypeError, ArgumentValueError, LivepushError
from ...types import Seconds, as_seconds, shown


log = logging.getLogger("livepush.jobs")

# The run times every livepush reader can load: psycopg makes a datetime of a timestamptz as the
# session's TimeZone shows it, up to about 16 hours off UTC (an old local mean time), and a
# datetime ends at years 1 and 9999. An instant a day inside those years reads back in any zone;
# one nearer their ends failed every claim, get_job and state read that met it, in such a zone.
EARLIEST_RUN_AT = datetime(1, 1, 2, tzinfo=timezone.utc)
LATEST_RUN_AT = datetime(9999, 12, 30, tzinfo=timezone.utc)
_RUN_AT_RANGE = f"from {EARLIEST_RUN_AT.date().isoformat()} to {LATEST_RUN_AT.date().isoformat()} in UTC"


# When a job runs, as Batch.add takes it: an instant (at=, in UTC), seconds from the enqueue
# statement on the database's clock (wait=), or None for now.
When = datetime | float | None


def run_at(wait: Seconds | None, at: datetime | None) -> When:
    """When to run, from `wait=` (seconds, counted by the database: the enqueuing machine's clock
    may be off from it, and a job due in 30 s then ran at once, or an hour late) or `at=` (an
    aware datetime), in UTC; None for now."""
    wait = as_seconds(wait)
    if wait is not None and at is not None:
        raise ArgumentTypeError("give wait= (seconds) or at= (an aware datetime), not both")
    if at is not None:
        if not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
            raise ArgumentTypeError(f"at= must be an aware datetime (e.g. datetime.now(timezone.utc)), got {shown(at, typed=True)}")
        try:
            # The same instant in UTC: an offset with a fraction of a second, which Python allows,
            # is one Postgres cannot parse.
            utc = at.astimezone(timezone.utc)
        except OverflowError:
            utc = None
        if utc is None or not EARLIEST_RUN_AT <= utc <= LATEST_RUN_AT:
            raise ArgumentValueError(f"at= {at.isoformat()} is outside the run times livepush stores, "
                                     f"{_RUN_AT_RANGE}: to run as soon as possible, leave at= out "
                                     "(a job of a lower @jobs.job(priority=) runs before others)")
        return utc
    if wait is not None:
        if isinstance(wait, bool) or not isinstance(wait, (int, float)):
            raise ArgumentTypeError(f"wait= takes a number of seconds or a timedelta, got {type(wait).__name__} "
                                    f"{shown(wait, width=60)}")
        if not wait >= 0 or wait == math.inf:  # `not >=` also catches NaN
            raise ArgumentValueError(f"wait= must be zero or more seconds, a finite number, got {shown(wait, width=60)}")
        if wait == 0:
            return None
        try:
            # Only the bound is checked on this machine's clock: a skew is nothing next to it.
            when = datetime.now(timezone.utc) + timedelta(seconds=wait)
        except OverflowError:
            when = None
        if when is None or when > LATEST_RUN_AT:
            # The value after "got", as every refusal: a long int's words ("an int of 1329 bits") read
            # oddly where a count of seconds stands.
            raise ArgumentValueError(f"wait= ends after {LATEST_RUN_AT.date().isoformat()} in UTC, the latest run time "
                                     f"livepush stores: pass a shorter delay, got {shown(wait, width=60)}")
        return float(wait)
    return None


ANY_NUMBER = (0, sys.maxsize)  # the arity of a spec that does not say (not a JobFunction)

Spec = tuple[str, str, int, int, bool]  # name, queue, priority, max_attempts, limited


def _key(row: Sequence[Any]) -> str | None:
    """The idempotency key of a Batch row."""
    return row[2] if len(row) > 2 else None


class Batch:
    """The jobs of one enqueue statement, and the JSON document it takes them as.

    The document is decoded by livepush_job_items() (sql/0003_jobs.sql), which says its layout:
    what a job's function fixes (name, queue, priority, attempts, whether it has claim limits)
    once per function in `specs`, and per job a row without its trailing nulls. One call of the
    C encoder writes it: per-job JSON texts and typed arrays, which psycopg dumps an element at
    a time in Python, cost more than the inserts they feed, and full rows made Postgres parse
    and pick apart ten times the text."""

    def __init__(self) -> None:
        self.specs: dict[Spec, int] = {}
        # [spec, args, key, group_id, concurrency_key, run_at (ISO 8601, or seconds from the
        #  statement: wait=), tags, 1 if an earlier
        #  item has the key], trailing Nones cut: the options users give most come first
        # A plain job's row is a tuple (index, args), as it came: the fewer objects a job
        # allocates, the less the collector has to go over while a big batch is alive.
        self.rows: list[Sequence[Any]] = []
        self.keyed = False
        self._keys: set[str] = set()
        # What a (function, queue) fixes for every job of it, looked up once per batch: its
        # spec's index, its schema check (or None), its claim limits (or None without any) and
        # how many arguments it takes (the fewest and the most).
        self._fns: dict[tuple[JobSpec, str | None], tuple[int, Any, Any, tuple[int, int]]] = {}

    def _fn(self, fn: JobSpec, queue: str | None) -> tuple[int, Any, Any, tuple[int, int]]:
        limits = getattr(fn, "_limits", None)  # JobFunction's claim limits; None for other specs
        limited = limits is not None and limits.any
        if limited and queue is not None and queue != fn.queue:
            # Its own queue was measured at the decorator; another (a durable child on its
            # parent's queue) is measured here, once per batch.
            check_claim_entry(fn.name, queue, f"a job of {fn.name} on another queue")
        spec: Spec = (fn.name, queue or fn.queue, fn.priority, fn.max_attempts, limited)
        index = self.specs.get(spec)
        if index is None:
            index = self.specs[spec] = len(self.specs)
        found = (index, getattr(fn, "_validate_args", None), limits if limited else None,
                 getattr(fn, "_arity", ANY_NUMBER))
        with contextlib.suppress(TypeError):  # an unhashable spec (a plain dataclass) is looked up each time
            self._fns[fn, queue] = found
        return found

    def add(self, fn: JobSpec, args: Sequence[Any], when: When = None,
            group_id: int | None = None, queue: str | None = None, *,
            key: str | None = None, tags: Sequence[str] | None = None) -> None:
        """Check one job (plain JSON, then its function's schema, if any, then its options) and add
        it; a refusal raises before anything of the batch is written, and leaves the batch as it
        was: a group block goes on after a refused g.enqueue() the caller caught."""
        items = check_args(args)
        try:
            found = self._fns.get((fn, queue))
        except TypeError:
            found = None
        index, validate, limits, takes = found or self._fn(fn, queue)
        if validate is not None:
            validate(list(items))
        if not takes[0] <= len(items) <= takes[1]:
            refuse_arity(fn.name, takes, len(items))
        # Every check before the batch records the key: a key recorded for an item that was then
        # refused marked the key's next item `later`, which has no first item to take its job from.
        if key is not None:
            key = check_key(key)
        if tags is not None:
            tags = check_tags(tags)
        ckey = limits.key_of(items, fn.name) if limits is not None else None
        # No option but perhaps a key: the row ends with the args, or with the key.
        bare = when is None and group_id is None and tags is None and limits is None
        if bare and key is None:
            self.rows.append((index, items))
            return
        later = None
        if key is not None:
            self.keyed = True
            if key in self._keys:
                later = 1
            else:
                self._keys.add(key)
                if bare:
                    self.rows.append((index, items, key))
                    return
        row = [index, items, key, group_id, ckey, when.isoformat() if isinstance(when, datetime) else when, tags,
               later]
        while row[-1] is None:
            row.pop()
        self.rows.append(row)

    @contextlib.contextmanager
    def all_or_nothing(self) -> Iterator[None]:
        """The adds made in the block stay only if none of them raised: a group block's
        g.enqueue_many() whose refusal the caller catches leaves the block's batch as it was, not
        holding the items before the refused one. (A spec recorded meanwhile stays: unused, it
        only names a function in the document.)"""
        rows, keys, keyed = len(self.rows), set(self._keys), self.keyed
        try:
            yield
        except BaseException:
            del self.rows[rows:]
            self._keys, self.keyed = keys, keyed
            raise

    def params(self, rows: list[Sequence[Any]] | None = None) -> dict[str, Any]:
        """Parameters of ENQUEUE (or ENQUEUE_KEYED) for `rows` (all of the batch's by default)."""
        rows = self.rows if rows is None else rows
        try:
            return {"batch": dumps({"specs": list(self.specs), "rows": rows})}
        except ValueError:
            name_refused(row[1] for row in rows)
            raise

    def chunks(self, size: int) -> tuple[list[tuple[str, dict[str, Any]]], list[int]]:
        """Enqueue statements and parameters for slices of about `size` jobs, and for each item
        the place of its row among the statements' results. A keyed batch is sliced in key order:
        each statement inserts in key order, and so does the transaction as a whole, so two of
        them sharing keys cannot wait for each other in a circle. Python's order of str, code
        points, is the one the statements insert in (COLLATE "C"), not the database's collation.
        The sort is stable: an item's earlier items with its key stay earlier. A slice never ends
        inside a run of one key: an item marked `later` is settled by the first item of its key in
        the same statement."""
        order = list(range(len(self.rows)))
        if self.keyed and len(self.rows) > size:
            order.sort(key=lambda i: _key(self.rows[i]) or "")
        place = [0] * len(order)
        for at, i in enumerate(order):
            place[i] = at
        sql = queries.ENQUEUE_KEYED if self.keyed else queries.ENQUEUE
        statements = []
        at = 0
        while at < len(order):
            end = min(at + size, len(order))
            if self.keyed:
                last = _key(self.rows[order[end - 1]])
                while last is not None and end < len(order) and _key(self.rows[order[end]]) == last:
                    end += 1
            statements.append((sql, self.params([self.rows[i] for i in order[at:end]])))
            at = end
        return statements, place

    def one_params(self) -> dict[str, Any]:
        """Scalar parameters for ENQUEUE_ONE (a batch of exactly one job)."""
        row = [*self.rows[0]] + [None] * (8 - len(self.rows[0]))
        _spec, args, key, group_id, ckey, when, tags, _later = row
        name, queue, priority, max_attempts, limited = next(iter(self.specs))
        try:
            text = dumps(args)
        except ValueError:
            name_refused([args])
            raise
        return {"name": name, "queue": queue, "priority": priority, "max_attempts": max_attempts,
                "run_at": when if isinstance(when, str) else None, "wait": when if isinstance(when, float) else None,
                "args": text, "group_id": group_id, "tags": tags, "key": key, "concurrency_key": ckey,
                "limited": limited}

    def statement(self, debounce: float | None = None) -> tuple[str, dict[str, Any]]:
        """The enqueue statement and its parameters: a lone job takes the scalar twin (cheaper);
        a batch with keys the keyed statement; a debounced job (one, keyed) its own."""
        if debounce is not None:
            return queries.ENQUEUE_DEBOUNCED, {**self.params(), "delay": float(debounce)}
        if len(self.rows) == 1:
            return (queries.ENQUEUE_ONE_KEYED if self.keyed else queries.ENQUEUE_ONE), self.one_params()
        return (queries.ENQUEUE_KEYED if self.keyed else queries.ENQUEUE), self.params()

    def __len__(self) -> int:
        return len(self.rows)

    def stored_whole(self, call: str, sent: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[None]:
        """args.stored_whole() around this batch's statement (`sent`: its parameters, measured
        before anything is sent): arguments too large for one jsonb value or one message to
        Postgres (one job's, or the whole document's) are refused naming the job, or the batch
        and `call`, whose jobs can also be enqueued fewer at a time."""
        if len(self.rows) == 1:
            return stored_whole(f"the arguments of {next(iter(self.specs))[0]}", plural=True, sent=sent)
        return stored_whole(f"the arguments of {call}()'s {len(self.rows)} jobs", plural=True,
                            advice=", or enqueue fewer jobs at a time", sent=sent)


ITEM_OPTIONS = frozenset({"wait", "at", "key", "tags"})
NO_OPTIONS: Mapping[str, Any] = MappingProxyType({})

# Types whose instances passed the JobSpec check: isinstance() against a runtime-checkable
# Protocol walks its attributes on every call, which was most of the Python time of an
# enqueue_many of (job, args) tuples.
_SPEC_TYPES: set[type] = set()


def is_spec(value: Any) -> bool:
    """Whether `value` is a job function (a JobSpec instance, not a class)."""
    kind = type(value)
    if kind in _SPEC_TYPES:
        return True
    if isinstance(value, JobSpec) and not isinstance(value, type):
        _SPEC_TYPES.add(kind)
        return True
    return False


def item(entry: Any) -> tuple[JobSpec, Sequence[Any], When, str | None, Mapping[str, Any]]:
    """An enqueue_many entry: a JobRequest, or (job_function, args) / (job_function, args, options).
    Returns the function, its arguments, when to run, the queue a request asked for, and the
    enqueue options (key=, tags=) as keyword arguments of Batch.add."""
    if isinstance(entry, JobRequest):
        return REGISTRY.get(entry.name), entry.args, None, entry.queue, NO_OPTIONS
    if isinstance(entry, tuple) and len(entry) in (2, 3) and is_spec(entry[0]):
        # None or an empty dict is no options; another falsy value (False, 0) is refused below.
        if len(entry) == 2 or entry[2] is None or (not entry[2] and isinstance(entry[2], Mapping)):
            return entry[0], entry[1], None, None, NO_OPTIONS
        options = entry[2]
        if type(options) is not dict and not isinstance(options, Mapping):
            raise ArgumentTypeError(f"item options are a dict of {sorted(ITEM_OPTIONS)}, "
                                    f"got {shown(options, typed=True, width=60)}")
        if not ITEM_OPTIONS.issuperset(options):  # no set built per item: most are fine
            # Ordered as text: names of mixed types (a str and an int) have no order of their own.
            unknown = sorted(set(options) - ITEM_OPTIONS, key=str)
            raise ArgumentTypeError(f"item options take {sorted(ITEM_OPTIONS)}, got {unknown}"
                                    + (" (debounce= is for a single enqueue)" if "debounce" in unknown else ""))
        if "wait" not in options and "at" not in options:
            return entry[0], entry[1], None, None, options  # key= and tags= only: Batch.add's own names
        key, tags = options.get("key"), options.get("tags")
        extra = NO_OPTIONS if key is None and tags is None else {"key": key, "tags": tags}
        return entry[0], entry[1], run_at(options.get("wait"), options.get("at")), None, extra
    raise ArgumentTypeError(
        "an item is a JobRequest (some_job.request(*args)) or a (job_function, args) or (job_function, args, "
        f"options) tuple, got {shown(entry, typed=True, width=80)}"
    )


def add_items(batch: Batch, items: Iterable[Any], call: str, group_id: int | None = None,
              before_each: Callable[[], None] | None = None) -> None:
    """Check each of `items` (as enqueue_many takes them) and add it to `batch`, `before_each()`
    first (a group's member limit). A refused item's error gets the call and the item's place in
    front of its message, its type and everything else unchanged: in a batch of thousands,
    `args[0] is a datetime` alone does not say which item to fix. Item refusals say what was wrong,
    not which call they come from: the same checks serve enqueue_many and every batch of a group."""
    for index, entry in enumerate(items):
        if before_each is not None:
            before_each()
        try:
            fn, args, when, queue, extra = item(entry)
            batch.add(fn, args, when, group_id, queue, **extra)
        except LivepushError as exc:
            if exc.args and isinstance(exc.args[0], str):
                exc.args = (f"{call}() item {index}: {exc.args[0]}", *exc.args[1:])
            raise


# Jobs defined in a script run directly are named `__main__.fn` (functions._default_name): a
# runtime started with `livepush jobs MODULE` never defines that name, and gives such jobs back
# for ever. The script's own jobs.drain() runs them, so they are not refused: the first enqueue of
# each on each queue in a process (whichever call enqueues it: enqueue, a group's member or
# callback, ctx.group.enqueue, a durable job's children) looks for live runtimes of other
# processes serving that queue, and warns. Per queue: a first enqueue on a queue nobody serves says nothing of the next one, on
# a queue that runtimes elsewhere serve.
SCRIPT_PREFIX = "__main__."
_SCRIPT_JOBS_LOOKED: set[tuple[str, str]] = set()


def _script_jobs(batch: Batch, later: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(name, queue) of the jobs of `batch` and `later` defined in a script run directly and not
    looked at yet on that queue."""
    named = itertools.chain(((spec[0], spec[1]) for spec in batch.specs), later)
    found = list(dict.fromkeys(pair for pair in named
                               if pair[0].startswith(SCRIPT_PREFIX) and pair not in _SCRIPT_JOBS_LOOKED))
    _SCRIPT_JOBS_LOOKED.update(found)
    return found


def _serving(queue: str) -> dict[str, Any]:
    return {"queue": queue, "host": socket.gethostname(), "pid": os.getpid()}


def _warn_script_job(name: str, queue: str, served: int) -> None:
    if served:
        log.warning("job %r is defined in a script run directly (its module is __main__), and %d live runtime(s) of "
                    "other processes serve its queue %r: a runtime started with `livepush jobs MODULE` does not define "
                    "%r and gives its jobs back for ever. Give it a name= (@jobs.job(name=\"myapp.%s\")) and define "
                    "it in a module those runtimes import; jobs.drain() in this process runs it as it is",
                    name, served, queue, name, name[len(SCRIPT_PREFIX):])


def look_for_script_runtimes(batch: Batch, later: Iterable[tuple[str, str]] = ()) -> None:
    """Warn once per job defined in a script run directly and queue that runtimes elsewhere serve
    (above). `later`: (name, queue) of jobs enqueued later for this batch's sake, by whichever
    process gets there (a group's callbacks, when it finishes): a runtime elsewhere would give
    them back too."""
    for name, queue in _script_jobs(batch, later):
        try:
            with database.pools().sync().connection() as own, autocommitted(own):
                (served,) = own.execute(queries.LIVE_RUNTIMES_SERVING, _serving(queue)).fetchone() or (0,)
        except Exception:  # noqa: BLE001 - a hint only: its look must not fail an enqueue that was made
            continue
        _warn_script_job(name, queue, served)


async def alook_for_script_runtimes(batch: Batch, later: Iterable[tuple[str, str]] = (),
                                    pool: Any = None) -> None:
    """look_for_script_runtimes() for async code. `pool`: a running job's (its runtime's database,
    which need not be the process's); None: the process's."""
    for name, queue in _script_jobs(batch, later):
        try:
            async with (pool or await database.pools().aget()).connection() as own, aautocommitted(own):
                (served,) = await (await own.execute(queries.LIVE_RUNTIMES_SERVING, _serving(queue))).fetchone() or (0,)
        except Exception:  # noqa: BLE001 - as in look_for_script_runtimes
            continue
        _warn_script_job(name, queue, served)


# Around an enqueue statement in the caller's transaction that Postgres may refuse as too large.
_REFUSABLE = Savepoint("livepush_enqueue")


def _guarded(conn: Any, params: dict[str, Any]) -> bool:
    """Whether the enqueue statement with `params` on the caller's `conn` needs a savepoint: its
    JSON is long enough that Postgres may refuse it as too large (args.may_be_too_large), which
    would fail the caller's transaction, whose own writes a caller that caught the
    InvalidArgumentsError then lost. Shorter, it is never refused for its size, and goes alone:
    an ordinary enqueue pays no round trip for the savepoint."""
    return may_be_too_large(params) and in_callers_transaction(conn)


def run_batch(batch: Batch, conn: Any = None, debounce: float | None = None,
              call: str = "enqueue") -> list[JobHandle]:
    """Insert a batch with a sync connection (the caller's, or ours and committed here). `call`
    is the public call, which a refused conn= names with its async twin."""
    # The caller's conn= is checked before the settings are: its mistake is the one to name. And
    # before an empty batch returns: a wrong or closed conn= went unnoticed until a batch first
    # had items, often in production only.
    if conn is not None and database.conn_kind(conn, call) != "sync":
        raise ArgumentTypeError(f"{call}(conn=) takes a sync psycopg Connection; use a{call}() with an AsyncConnection")
    url = database.database_url()
    if conn is not None:
        with translated_on(url, conn):
            database.check_on_database(conn, call)
    if not len(batch):
        return []
    sql, params = batch.statement(debounce)
    if conn is None:
        with batch.stored_whole(call, params), translated(url), database.pools().sync().connection() as own, \
                autocommitted(own):
            rows = own.execute(sql, params).fetchall()
    else:
        with batch.stored_whole(call, params), translated_on(url, conn), \
                kept(conn, _REFUSABLE) if _guarded(conn, params) else contextlib.nullcontext(), cursor_on(conn) as cur:
            rows = cur.execute(sql, params).fetchall()
    look_for_script_runtimes(batch)
    return [JobHandle(row[0], row[1]) for row in rows]


async def arun_batch(batch: Batch, conn: Any = None, debounce: float | None = None,
                     call: str = "aenqueue") -> list[JobHandle]:
    if conn is not None and database.conn_kind(conn, call) != "async":  # empty or not, as in run_batch
        raise ArgumentTypeError(f"{call}(conn=) takes a psycopg AsyncConnection; use {call[1:]}() with a sync Connection")
    url = database.database_url()
    if conn is not None:
        with translated_on(url, conn):
            await database.acheck_on_database(conn, call)
    if not len(batch):
        return []
    sql, params = batch.statement(debounce)
    if conn is None:
        with batch.stored_whole(call, params), translated(url):
            async with (await database.pools().aget()).connection() as own, aautocommitted(own):
                rows = await (await own.execute(sql, params)).fetchall()
    else:
        with batch.stored_whole(call, params), translated_on(url, conn):
            async with akept(conn, _REFUSABLE) if _guarded(conn, params) else contextlib.nullcontext(), \
                    cursor_on(conn) as cur:
                rows = await (await cur.execute(sql, params)).fetchall()
    await alook_for_script_runtimes(batch)
    return [JobHandle(row[0], row[1]) for row in rows]


def one(fn: JobSpec, args: Sequence[Any], wait: Seconds | None, at: datetime | None, key: str | None,
        debounce: Seconds | None, tags: Sequence[str] | None) -> tuple[Batch, float | None]:
    """The batch of a single enqueue and its debounce delay (checked: it needs a key, and is the
    run time, so it excludes wait= and at=)."""
    delay = check_debounce(debounce, key, wait, at)
    batch = Batch()
    batch.add(fn, args, None if delay is not None else run_at(wait, at), key=key, tags=tags)
    return batch, delay


def enqueue(fn: JobSpec, args: Sequence[Any], *, wait: Seconds | None = None, at: datetime | None = None,
            conn: Any = None, key: str | None = None, debounce: Seconds | None = None,
            tags: Sequence[str] | None = None) -> JobHandle:
    batch, delay = one(fn, args, wait, at, key, debounce, tags)
    return run_batch(batch, conn, delay)[0]


async def aenqueue(fn: JobSpec, args: Sequence[Any], *, wait: Seconds | None = None, at: datetime | None = None,
                   conn: Any = None, key: str | None = None, debounce: Seconds | None = None,
                   tags: Sequence[str] | None = None) -> JobHandle:
    batch, delay = one(fn, args, wait, at, key, debounce, tags)
    return (await arun_batch(batch, conn, delay))[0]


def enqueue_many(items: Iterable[Any], *, conn: Any = None) -> list[JobHandle]:
    """Enqueue many jobs in one statement: items are `job.request(*args)` values or `(job, args)`
    / `(job, args, options)` tuples, options a dict of wait=, at=, key=, tags=. Handles in item
    order; an item whose key an unfinished job (or an earlier item) holds gets that job's handle."""
    warn_if_on_event_loop("jobs.enqueue_many()", "jobs.aenqueue_many()")
    return run_batch(many(items, "enqueue_many"), conn, call="enqueue_many")


def many(items: Iterable[Any], call: str = "enqueue_many") -> Batch:
    """The batch of an enqueue_many (`call`), every item checked before anything is written."""
    if not isinstance(items, Iterable):
        raise ArgumentTypeError(f"{call}() takes an iterable of job.request(*args) values or (job_function, args) "
                                f"tuples, got {shown(items, typed=True, width=60)}")
    batch = Batch()
    add_items(batch, items, call)
    return batch


@awaited("jobs.aenqueue_many()")
async def aenqueue_many(items: Iterable[Any], *, conn: Any = None) -> list[JobHandle]:
    """enqueue_many() for async code; `conn=` takes a psycopg AsyncConnection."""
    return await arun_batch(many(items, "aenqueue_many"), conn, call="aenqueue_many")
