"""Claim limits and paused queues (docs/reference.md §4, docs/jobs.md "Limits and paused queues"),
checked with `livepush jobs` child processes: at most N running per concurrency key across
runtimes, a full key blocks nothing else, a killed runtime's job frees its slot, a start rate
holds across two runtimes, and a pause stops (and a resume restarts) every runtime's claims
within a second while enqueues are still accepted."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import json
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from livepush import jobs
from livepush.jobs import database, queries
from livepush.jobs.api.registry import REGISTRY, Registry
from livepush.jobs.runtime import limits as runtime_limits
from livepush.errors import ConfigError
from livepush.jobs import InvalidArgumentsError
from tests.jobs import limit_jobs
from tests.jobs.conftest import q, running, runtime_starter
from tests.support.procs import ChildProcess, Processes
from tests.support.waiting import async_wait_for, wait_for

MODULE = "tests.jobs.limit_jobs"


@pytest.fixture
def limits_db(jobs_db: str) -> str:
    with psycopg.connect(jobs_db, autocommit=True) as conn:
        conn.execute(limit_jobs.LIMIT_RUNS_TABLE)
    return jobs_db


@pytest.fixture
def env(limits_db: str, livepush_env: Callable[..., dict[str, str]]) -> dict[str, str]:
    return livepush_env(database_url=limits_db)


@pytest.fixture
def start_runtime(limits_db: str, procs: Processes, env: dict[str, str]) -> Callable[..., ChildProcess]:
    return runtime_starter(limits_db, MODULE, procs, env)


def count(url: str, sql: str, params: Any = None) -> int:
    return int(q(url, sql, params)[0][0])


def most_at_once(url: str, name: str) -> dict[str, int]:
    """Per key, the most runs of `name` between their start and done notes at any instant."""
    rows = q(url, "SELECT key, phase, at FROM limit_runs WHERE name = %s AND phase IN ('start', 'done') "
                  "ORDER BY at, phase DESC", (name,))  # at a tie, 'start' sorts after 'done'
    now: dict[str, int] = {}
    most: dict[str, int] = {}
    for key, phase, _at in rows:
        now[key] = now.get(key, 0) + (1 if phase == "start" else -1)
        most[key] = max(most.get(key, 0), now[key])
    return most


def set_flag(url: str, flag: str) -> None:
    q(url, "INSERT INTO job_flags (name) VALUES (%s) ON CONFLICT DO NOTHING", (flag,))


# -- the decorator ------------------------------------------------------------------------------

def test_the_options_are_checked_when_the_function_is_declared() -> None:
    """A concurrency key must name a positional parameter after ctx, with a count of at least 1; a
    rate is N/s or N/m."""
    async def f(ctx: Any, tenant: str) -> None: ...

    for bad in [("nope", 1), ("tenant", 0), ("tenant",), "tenant", ("tenant", True)]:
        with pytest.raises(ConfigError):
            jobs.job(name="t.bad", concurrency=bad)(f)
    for bad in ["100", "0/s", "-1/s", "5/h", 5]:
        with pytest.raises(ConfigError):
            jobs.job(name="t.bad", rate=bad)(f)
    assert jobs.job(name="t.ok", rate="30/m")(f)._limits.rate == 0.5


def test_the_concurrency_key_is_the_parameter_of_what_the_runtime_calls(limits_db: str) -> None:
    """A decorator's wrapper (functools.wraps) that supplies one of the wrapped function's
    arguments itself is what the runtime calls, with the job's arguments by position: the key is
    read where the wrapper takes the parameter, as the count of arguments is checked against the
    wrapper. It was read where the wrapped function takes it: every enqueue was refused as missing
    the key, and a parameter the wrapper supplies was accepted, keying the jobs by whichever
    argument sat at its place. A wrapper that takes *args passes them on as they are: the wrapped
    function's parameter is the key."""
    async def sync(ctx: Any, session: Any, tenant: str) -> None: ...

    @functools.wraps(sync)
    async def with_session(ctx: Any, tenant: str) -> None:
        await sync(ctx, None, tenant)

    @functools.wraps(sync)
    async def passing_on(*args: Any) -> None:
        await sync(*args)

    supplied = jobs.job(name="t.supplied_session", concurrency=("tenant", 1))(with_session)
    with pytest.raises(ConfigError, match="no positional parameter 'session'"):
        jobs.job(name="t.supplied_session_key", concurrency=("session", 1))(with_session)
    passed_on = jobs.job(name="t.passed_on", concurrency=("tenant", 1))(passing_on)
    a, b = supplied.enqueue("acme"), passed_on.enqueue("db", "acme")
    assert dict(q(limits_db, "SELECT id, concurrency_key FROM livepush_jobs")) == {a.id: '"acme"', b.id: '"acme"'}


async def test_a_concurrency_count_postgres_cannot_store_fails_at_declaration(limits_db: str) -> None:
    """The count is an integer column of livepush_job_limits, written when a runtime starts: 2**31
    was taken, and every runtime importing the job then failed at start with Postgres' "integer
    out of range". A ConfigError at import; the largest count Postgres stores starts a runtime."""
    async def f(ctx: Any, tenant: str) -> None: ...

    with pytest.raises(ConfigError, match="concurrency="):
        jobs.job(name="t.huge_concurrency", concurrency=("tenant", 2**31))(f)
    jobs.job(name="t.largest_concurrency", concurrency=("tenant", 2**31 - 1))(f)
    async with running(queues=["default"]):
        pass
    assert q(limits_db, "SELECT max_running FROM livepush_job_limits WHERE name = 't.largest_concurrency'") == \
        [(2**31 - 1,)]


def test_a_concurrency_key_default_json_cannot_hold_fails_at_declaration() -> None:
    """A call that leaves the key's parameter out counts under its default, stored as JSON text.
    A default JSON cannot hold (a date) was taken, and every such enqueue then failed with a bare
    TypeError that named neither the key nor the parameter. A ConfigError at the decorator."""
    async def dated(ctx: Any, tenant: Any = datetime.date(2020, 1, 1)) -> None: ...

    async def shared(ctx: Any, tenant: Any = {"org": None}) -> None: ...  # noqa: B006

    with pytest.raises(ConfigError, match="concurrency=\\('tenant', 1\\).*default"):
        jobs.job(name="t.dated_key", concurrency=("tenant", 1))(dated)
    assert jobs.job(name="t.shared_key", concurrency=("tenant", 1))(shared)._limits.key_of([]) == '{"org":null}'


@pytest.mark.parametrize("default", [float("nan"), float("inf"), -float("inf"), [1, {"org": float("nan")}]],
                         ids=["nan", "inf", "-inf", "nested-nan"])
def test_a_concurrency_key_default_that_is_no_finite_number_fails_at_declaration(
        limits_db: str, default: Any) -> None:
    """A NaN or infinite default was taken, and each call that left the parameter out stored its
    key as the text NaN or Infinity, which is no JSON: the key meant to be JSON text could not be
    read as JSON (Postgres' jsonb refuses it, as JSON.parse does), while the same value passed
    explicitly is refused at enqueue. A ConfigError at the decorator naming the parameter; a
    finite float default is stored as JSON Postgres reads."""
    async def f(ctx: Any, item: int, tenant: Any = default) -> None: ...

    async def finite(ctx: Any, item: int, tenant: Any = 2.5) -> None: ...

    with pytest.raises(ConfigError, match=r"concurrency=\('tenant', 1\).*default of 'tenant'.*finite number"):
        jobs.job(name="t.non_finite_key", concurrency=("tenant", 1))(f)
    assert "t.non_finite_key" not in REGISTRY
    h = jobs.job(name="t.finite_float_key", concurrency=("tenant", 1))(finite).enqueue(1)
    assert q(limits_db, "SELECT concurrency_key::jsonb FROM livepush_jobs WHERE id = %s", (h.id,)) == [(2.5,)]


def test_a_concurrency_key_default_postgres_cannot_store_fails_at_declaration(limits_db: str) -> None:
    """A default holding a lone surrogate (what Python makes of undecodable bytes) was taken, and
    every call that left the parameter out then failed at enqueue with a bare UnicodeEncodeError
    naming neither the key nor the parameter: Postgres stores no such text. A ConfigError at the
    decorator naming the parameter, as for a default JSON cannot hold."""
    async def undecodable(ctx: Any, tenant: str = "acme\udcff") -> None: ...

    async def nested(ctx: Any, tenant: Any = {"org\ud800": 1}) -> None: ...  # noqa: B006

    for fn in (undecodable, nested):
        with pytest.raises(ConfigError, match=r"concurrency=\('tenant', 1\).*default of 'tenant'.*lone surrogate"):
            jobs.job(name=f"t.unstorable_key_{fn.__name__}", concurrency=("tenant", 1))(fn)


def test_a_concurrency_key_default_too_large_to_index_fails_at_declaration(limits_db: str) -> None:
    """A default longer than 500 characters as JSON, or more than 2,600 bytes of UTF-8 with the
    job's name, was taken, and every call that left the parameter out was then refused at
    enqueue. A ConfigError at the decorator naming the parameter, as for a default JSON cannot
    hold; the longest default the enqueue takes is taken."""
    async def long(ctx: Any, tenant: str = "t" * 600) -> None: ...

    async def wide(ctx: Any, tenant: str = "\U0001d11e" * 498) -> None: ...  # 500 characters as JSON, 1,994 bytes

    async def longest(ctx: Any, tenant: str = "é" * 498) -> None: ...  # 500 characters as JSON, 998 bytes

    with pytest.raises(ConfigError, match=r"concurrency=\('tenant', 1\).*default of 'tenant'.*602 characters as "
                                          r"JSON, more than 500"):
        jobs.job(name="t.long_key_default", concurrency=("tenant", 1))(long)
    wide_name = "t." + "\U0001d11e" * 160  # 642 bytes: 2,636 with the default
    with pytest.raises(ConfigError, match=r"concurrency=\('tenant', 1\).*default of 'tenant'.*2636 bytes of UTF-8 "
                                          r"together with the job's name, more than 2600"):
        jobs.job(name=wide_name, concurrency=("tenant", 1))(wide)
    assert "t.long_key_default" not in REGISTRY and wide_name not in REGISTRY
    h = jobs.job(name="t.longest_key_default", concurrency=("tenant", 1))(longest).enqueue()
    assert q(limits_db, "SELECT concurrency_key FROM livepush_jobs WHERE id = %s", (h.id,)) == [('"' + "é" * 498 + '"',)]


@pytest.mark.parametrize("rate", ["1" + "0" * 400 + "/s", "1" + "0" * 400 + "/m", "100000000000/s"])
def test_a_rate_too_large_to_count_fails_at_declaration(rate: str) -> None:
    """Taken, a rate of 10**11 a second (or one of 400 digits, read as infinity) gave a bucket
    of more whole tokens than the claim's integer count holds: every claim of the function
    failed with "integer out of range" (infinity: no token at all), and none of its jobs started."""
    async def f(ctx: Any) -> None: ...

    with pytest.raises(ConfigError, match="rate="):
        jobs.job(name="t.huge_rate", rate=rate)(f)
    assert jobs.job(name="t.largest_rate", rate="1000000000/s")(f)._limits.rate == 1e9


def test_the_key_is_the_named_argument_at_enqueue(limits_db: str) -> None:
    """The key is the argument's value by the parameter's name (or its default), as JSON text."""
    @jobs.job(name="t.keyed", concurrency=("tenant", 3))
    async def keyed(ctx: Any, item: int, tenant: Any = "shared") -> None: ...

    a = keyed.enqueue(1, "acme")
    b = keyed.enqueue(2)
    c, d = jobs.enqueue_many([keyed.request(3, {"org": 7}), limit_jobs.plain.request()])
    keys = {r[0]: r[1:] for r in q(limits_db, "SELECT id, concurrency_key, limited FROM livepush_jobs")}
    assert keys == {a.id: ('"acme"', True), b.id: ('"shared"', True), c.id: ('{"org":7}', True), d.id: (None, False)}


def test_a_whole_number_float_counts_under_the_key_of_the_int_it_equals(limits_db: str) -> None:
    """Keys are compared as JSON, which has one kind of number: 7.0 (an id read from a float
    column, or a division) and 7 are one tenant, also inside a list or a dict, and -0.0 is 0.
    They were two keys ("7.0" and "7"), each with its own slots: twice the limit ran at once.
    A fraction stays a fraction, and true stays apart from 1."""
    @jobs.job(name="t.numbered", concurrency=("tenant", 1))
    async def numbered(ctx: Any, tenant: Any) -> None: ...

    values = [7, 7.0, [7, {"org": 7}], (7.0, {"org": 7.0}), 0, -0.0, 7.5, True, 1]
    handles = jobs.enqueue_many([numbered.request(v) for v in values])
    keys = dict(q(limits_db, "SELECT id, concurrency_key FROM livepush_jobs"))
    assert [keys[h.id] for h in handles] == ["7", "7", '[7,{"org":7}]', '[7,{"org":7}]', "0", "0", "7.5", "true", "1"]
    assert [r[0] for r in q(limits_db, "SELECT args FROM livepush_job_payloads ORDER BY id")] == [
        [7], [7.0], [[7, {"org": 7}]], [[7.0, {"org": 7.0}]], [0], [-0.0], [7.5], [True], [1]]


def test_a_large_whole_number_float_counts_under_the_key_of_the_int_it_equals(limits_db: str) -> None:
    """Every whole float is the int it equals, however large: from 2**53 up, 9007199254740992.0
    and 1e+20 were keys apart from 9007199254740992 and 100000000000000000000, each with its own
    slots, so an id held as a float in one caller and as an int in another ran twice the limit."""
    @jobs.job(name="t.big_numbered", concurrency=("tenant", 1))
    async def big_numbered(ctx: Any, tenant: Any) -> None: ...

    values = [2.0**53, 2**53, 1e16, 10**16, [1e20], [10**20], -1e300]
    handles = jobs.enqueue_many([big_numbered.request(v) for v in values])
    keys = dict(q(limits_db, "SELECT id, concurrency_key FROM livepush_jobs"))
    assert [keys[h.id] for h in handles] == ["9007199254740992", "9007199254740992", "10000000000000000",
                                             "10000000000000000", "[100000000000000000000]",
                                             "[100000000000000000000]", str(int(-1e300))]


def test_a_concurrency_key_too_long_to_index_is_refused_at_enqueue_and_blocks_nothing(limits_db: str) -> None:
    """The key is an index entry, as key= is: past 500 characters of JSON the enqueue is refused,
    naming the parameter, and nothing is written; the queue's other jobs run."""
    with pytest.raises(InvalidArgumentsError, match="concurrency key 'tenant' is 3002 characters"):
        limit_jobs.per_tenant.enqueue("t" * 3000, 0.0)
    with pytest.raises(InvalidArgumentsError, match="concurrency key 'tenant'"):
        jobs.enqueue_many([limit_jobs.plain.request(), limit_jobs.per_tenant.request("t" * 600, 0.0)])
    assert q(limits_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]
    longest = limit_jobs.per_tenant.enqueue("é" * 498, 0.0)  # 500 characters as JSON, 996 bytes
    assert jobs.drain() == {"succeeded": 1}
    assert jobs.get_job(longest.id).state == "succeeded"  # type: ignore[union-attr]


def test_a_concurrency_key_holding_an_int_too_long_for_json_text_is_refused_naming_the_argument(
        limits_db: str) -> None:
    """An int of more digits than Python writes as text is refused as any other argument is, an
    InvalidArgumentsError naming it, and nothing of the batch is written. As the concurrency key,
    it failed the enqueue (a single one, enqueue_many) with Python's bare ValueError, which named
    neither the argument nor the job."""
    huge = 10 ** (sys.get_int_max_str_digits() + 1)
    with pytest.raises(InvalidArgumentsError, match=r"args\[0\] is an int of more than"):
        limit_jobs.per_tenant.enqueue(huge, 0.0)
    with pytest.raises(InvalidArgumentsError, match=r"enqueue_many\(\) item 1: args\[0\]\[1\] is an int of more than"):
        jobs.enqueue_many([limit_jobs.plain.request(), limit_jobs.per_tenant.request([1, huge], 0.0)])
    assert q(limits_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]


def test_a_concurrency_key_too_large_to_index_with_its_name_is_refused_at_enqueue(limits_db: str) -> None:
    """A running job's name and concurrency key are one entry of an index (at most about 2,700
    bytes). A key of 500 characters with a name of 500, both in a script of 3 bytes a character,
    was taken at enqueue, and then every claim of its queue failed on it ("index row size exceeds
    btree maximum"): no job of the queue started again. Refused at enqueue instead, naming the
    key; the queue's other jobs run."""
    script = random.Random(7)
    name = "".join(chr(script.randrange(0x4E00, 0xA000)) for _ in range(500))
    key = "".join(chr(script.randrange(0x4E00, 0xA000)) for _ in range(498))  # 500 characters as JSON

    async def f(ctx: Any, tenant: str) -> None: ...

    wide = jobs.job(name=name, concurrency=("tenant", 1))(f)
    with pytest.raises(InvalidArgumentsError, match="concurrency key 'tenant'.*bytes"):
        wide.enqueue(key)
    plain = limit_jobs.plain.enqueue()
    narrow = wide.enqueue(key[:100])
    assert jobs.drain() == {"succeeded": 2}
    assert {jobs.get_job(h.id).state for h in (plain, narrow)} == {"succeeded"}  # type: ignore[union-attr]


def test_a_limited_function_whose_name_and_queue_are_too_large_to_index_is_refused_before_any_enqueue(
        limits_db: str) -> None:
    """A waiting job of a function with limits is one entry of the limited claim's index with its
    queue and its name (at most about 2,700 bytes). A name of 500 characters and a queue of 200,
    both in a script of 4 bytes a character, were taken at the decorator, and then every enqueue
    failed in Postgres ("index row size exceeds btree maximum"), reported as a database that
    could not run the statement. Refused with a ConfigError naming both instead: at the decorator,
    and where such a function's job is put on such a queue. Without limits they are fine."""
    script = random.Random(11)
    name = "".join(chr(script.randrange(0x1F300, 0x1F5FF)) for _ in range(500))
    queue = "".join(chr(script.randrange(0x1F300, 0x1F5FF)) for _ in range(200))

    async def f(ctx: Any) -> None: ...

    with pytest.raises(ConfigError, match="its name and queue are 2800 bytes"):
        jobs.job(name=name, queue=queue, rate="5/s")(f)
    wide = jobs.job(name=name, rate="5/s")(f)
    with pytest.raises(ConfigError, match="its name and queue are 2800 bytes"):
        wide.request(queue=queue)
    # As a durable child is enqueued on its parent's queue: a request naming no queue of its own.
    with pytest.raises(ConfigError, match="enqueue_many\\(\\) item 0: .*its name and queue are 2800 bytes"):
        jobs.enqueue_many([jobs.JobRequest(wide.name, (), queue)])
    plain = jobs.job(name=name[:-1] + "x", queue=queue)(f)
    assert plain.enqueue().id and wide.enqueue().id


def test_keyed_and_debounced_enqueues_of_a_limited_function_keep_its_limits(limits_db: str) -> None:
    """An idempotency key, a batch with keyed jobs and a debounce store the job's concurrency key
    and limited mark as a plain enqueue does; a debounce that changes the arguments moves the job
    to its new concurrency key; drain runs them all through the limited claim."""
    first = limit_jobs.per_tenant.enqueue("a", 0.0, key="k1")
    assert limit_jobs.per_tenant.enqueue("a", 0.0, key="k1").id == first.id
    batch = jobs.enqueue_many([(limit_jobs.per_tenant, ("b", 0.0), {"key": "k2"}), (limit_jobs.plain, (), {"key": "k3"})])
    debounced = limit_jobs.per_tenant.enqueue("c", 0.0, key="k4", debounce=3600)
    assert limit_jobs.per_tenant.enqueue("d", 0.0, key="k4", debounce=3600).id == debounced.id
    rows = {r[0]: r[1:] for r in q(limits_db, "SELECT id, concurrency_key, limited FROM livepush_jobs")}
    assert rows == {first.id: ('"a"', True), batch[0].id: ('"b"', True), batch[1].id: (None, False),
                    debounced.id: ('"d"', True)}
    q(limits_db, "UPDATE livepush_jobs SET run_at = now(), state = 'available' WHERE id = %s", (debounced.id,))
    assert jobs.drain() == {"succeeded": 4}


def test_a_limited_claim_skips_a_job_an_open_transaction_holds_and_the_next_claim_sees_it_as_committed(
        limits_db: str) -> None:
    """A debounce with conn= in a transaction left open (a web request's) holds the job's row: the
    limited claim skips it and claims the others, as the plain claim does, instead of stopping the
    runtime's whole claim loop until that transaction commits. The debounce moved the job to
    another key (a full one here): the next claim sees it as committed, and starts it neither
    under the full key nor with the arguments it replaced."""
    assert jobs.drain(max_jobs=0) == {}  # a runtime started: the limits are stored
    holder = limit_jobs.tenant_flag.enqueue("b", "b-go")
    moved = limit_jobs.tenant_flag.enqueue("a", "m-go", key="m")
    free = limit_jobs.tenant_flag.enqueue("c", "c-go")
    q(limits_db, "UPDATE livepush_jobs SET state = 'running' WHERE id = %s", (holder.id,))  # b's only slot
    claim = {"name": "t.tenant_flag", "queue": "default", "limit": 4, "scan": 100, "runtime_id": 1}
    with psycopg.connect(limits_db) as debounce, psycopg.connect(limits_db, autocommit=True) as claimer:
        claimer.execute("SET lock_timeout = '5s'")  # a claim that waited for the row fails here
        assert limit_jobs.tenant_flag.enqueue("b", "m-go", key="m", debounce=0, conn=debounce) == moved
        first = claimer.execute(queries.CLAIM_LIMITED, claim).fetchall()
        assert [r[1] for r in first if r[1] is not None] == [free.id]
        debounce.commit()
        second = claimer.execute(queries.CLAIM_LIMITED, claim).fetchall()
    assert [r[1] for r in second if r[1] is not None] == []
    assert jobs.get_job(moved.id).state == "available"  # type: ignore[union-attr]
    assert jobs.get_job(moved.id).args == ["b", "m-go"]  # type: ignore[union-attr]


def test_a_job_keyed_anew_while_a_limited_claim_reads_it_is_left_to_the_next_claim(limits_db: str) -> None:
    """A start that keys a function's jobs anew (MARK_LIMITED) changes a job's concurrency key
    without a new version. A limited claim that read the job under its old key (free here) before
    that committed, and locks the row after, must not start it: its new key is full, and the
    claim counted the old one. The next claim counts it under its new key."""
    assert jobs.drain(max_jobs=0) == {}  # a runtime started: the limits are stored
    holder = limit_jobs.tenant_flag.enqueue("b", "b-go")
    moved = limit_jobs.tenant_flag.enqueue("a", "m-go")
    q(limits_db, "UPDATE livepush_jobs SET state = 'running' WHERE id = %s", (holder.id,))  # b's only slot
    (version,), = q(limits_db, "SELECT version FROM livepush_jobs WHERE id = %s", (moved.id,))
    # The claim's statement calls clock_timestamp() once, after its snapshot and before its row
    # locks: a stand-in ahead of pg_catalog's in the claiming session's search_path holds it there
    # until the test's transaction, holding an advisory lock, ends.
    q(limits_db, "CREATE SCHEMA claim_pause")
    q(limits_db, """
        CREATE FUNCTION claim_pause.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            PERFORM pg_advisory_xact_lock_shared(20261207);
            RETURN pg_catalog.clock_timestamp();
        END $$""")
    claim = {"name": "t.tenant_flag", "queue": "default", "limit": 4, "scan": 100, "runtime_id": 1}
    with psycopg.connect(limits_db) as marker, psycopg.connect(limits_db, autocommit=True) as claimer:
        (schema,), = claimer.execute("SELECT current_schema()").fetchall()
        claimer.execute(f"SET search_path = claim_pause, pg_catalog, {schema}")  # type: ignore[arg-type]
        claimer.execute("SET lock_timeout = '10s'")
        marker.execute("SELECT pg_advisory_xact_lock(20261207)")
        pid = claimer.info.backend_pid
        result: dict[str, Any] = {}

        def run_claim() -> None:
            result["rows"] = claimer.execute(queries.CLAIM_LIMITED, claim).fetchall()

        thread = threading.Thread(target=run_claim)
        thread.start()
        wait_for(lambda: q(limits_db, "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,))
                 == [("advisory",)], 10.0, message="the claim to read its candidates and wait")
        # The start keys the job anew, as a deploy that keys the function by another parameter
        # does: to the full key "b".
        marked = marker.execute(queries.MARK_LIMITED, {"ids": [moved.id], "versions": [version], "keys": ['"b"']})
        assert [r[0] for r in marked.fetchall()] == [moved.id]
        marker.commit()
        thread.join(10.0)
        assert not thread.is_alive()
    assert [r[1] for r in result["rows"] if r[1] is not None] == []
    assert count(limits_db, "SELECT count(*) FROM livepush_jobs WHERE state = 'running' AND concurrency_key = %s",
                 ('"b"',)) == 1
    again = q(limits_db, queries.CLAIM_LIMITED, claim)
    assert [r[1] for r in again if r[1] is not None] == []  # "b" is full
    assert jobs.get_job(moved.id).state == "available"  # type: ignore[union-attr]


def test_drain_runs_jobs_with_limits(limits_db: str) -> None:
    """jobs.drain() takes the limited claim too: every job of a limited function runs."""
    jobs.enqueue_many([limit_jobs.per_tenant.request(t, 0.0) for t in ("a", "a", "b")])
    assert jobs.drain() == {"succeeded": 3}


def test_a_strangers_advisory_lock_does_not_stop_a_limited_functions_jobs(
        limits_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """Any login may take any advisory lock, so the limited claims take turns on their function's
    row of livepush_job_limits instead: a session holding the advisory key those claims once
    tried (the name's hash in livepush's namespace) stops none of its jobs in any runtime."""
    with psycopg.connect(limits_db, autocommit=True) as stranger:
        stranger.execute("SELECT pg_advisory_lock(1819304812, hashtext('t.per_tenant'))")
        child = start_runtime("--concurrency", "4")
        handles = jobs.enqueue_many([limit_jobs.per_tenant.request(t, 0.0) for t in ("a", "a", "b")])
        wait_for(lambda: {jobs.get_job(h.id).state for h in handles} == {"succeeded"}, 20.0,  # type: ignore[union-attr]
                 message=f"the limited jobs to run; runtime output: {child.output()}")
    assert child.stop(timeout=15) == 0, child.output()


def test_drain_runs_rate_limited_jobs_past_the_buckets_burst(limits_db: str) -> None:
    """jobs.drain() runs every due job: jobs a start rate holds back are due, and start as the
    bucket refills (10 a second here, a burst of 2), not left behind when the burst is spent."""
    handles = jobs.enqueue_many([limit_jobs.rated.request() for _ in range(5)])
    assert jobs.drain() == {"succeeded": 5}
    assert {jobs.get_job(h.id).state for h in handles} == {"succeeded"}  # type: ignore[union-attr]


async def test_two_runtimes_starting_with_opposite_limits_both_start(limits_db: str) -> None:
    """A rolling deploy moves a limit from one function to another: a runtime with the old code
    (a limited, b not) and one with the new (b limited, a not) start at once. Each writes its
    limits in one transaction, both rows locked in turn, and they must not deadlock (one runtime
    failing to start); the later start's limits win. A trigger slows each write of a limit so
    that the two transactions overlap on every run."""
    async def f(ctx: Any, tenant: str) -> None: ...

    old, new = Registry(), Registry()
    old.add(jobs.job(name="t.moved_a", concurrency=("tenant", 1))(f))
    old.add(jobs.job(name="t.moved_b")(f))
    new.add(jobs.job(name="t.moved_a")(f))
    new.add(jobs.job(name="t.moved_b", concurrency=("tenant", 1))(f))
    q(limits_db, "INSERT INTO livepush_job_limits (name, max_running) VALUES ('t.moved_a', 1), ('t.moved_b', 1)")
    q(limits_db, """CREATE FUNCTION slow_limit_write() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.max_running IS NOT NULL THEN PERFORM pg_sleep(0.3); END IF; RETURN NEW; END $$""")
    q(limits_db, "CREATE TRIGGER slow_limit_write BEFORE UPDATE ON livepush_job_limits "
                 "FOR EACH ROW EXECUTE FUNCTION slow_limit_write()")
    pool = await database.pools().aget()
    results = await asyncio.wait_for(asyncio.gather(runtime_limits.store(pool, old), runtime_limits.store(pool, new),
                                                    return_exceptions=True), 10.0)
    assert results == [None, None]
    limits = dict(q(limits_db, "SELECT name, max_running FROM livepush_job_limits WHERE name LIKE 't.moved_%%'"))
    assert limits in ({"t.moved_a": 1, "t.moved_b": None}, {"t.moved_a": None, "t.moved_b": 1})


def test_jobs_of_a_definition_that_dropped_its_limits_still_run(limits_db: str) -> None:
    """Jobs enqueued while their function had a limit run once a runtime starts with a definition
    without one: it removes the stored limit and hands them to the plain claim."""
    async def changing(ctx: Any, tenant: str) -> None: ...

    limited = jobs.job(name="t.changing", concurrency=("tenant", 1))(changing)
    jobs.enqueue_many([limited.request("a") for _ in range(3)])
    assert jobs.drain(max_jobs=0) == {}  # a runtime started: the limit is stored
    assert q(limits_db, "SELECT name, max_running FROM livepush_job_limits WHERE name = 't.changing'") == \
        [("t.changing", 1)]
    jobs.job(name="t.changing")(changing)  # redeployed without the limit
    assert jobs.drain() == {"succeeded": 3}
    # The row stays, saying "no limits", for jobs older code still marks as limited.
    assert q(limits_db, "SELECT max_running, rate FROM livepush_job_limits WHERE name = 't.changing'") == \
        [(None, None)]


def test_jobs_enqueued_before_their_function_gained_a_limit_are_held_to_it(
        limits_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """A deploy that adds a limit holds the jobs already enqueued to it too: the first runtime that
    starts with the new definition marks the waiting, scheduled and running ones with their
    concurrency keys, so they take the limited claim (a running one fills its key's slot) instead
    of running past the limit. One whose arguments lack the key is named in the log."""
    async def gaining(ctx: Any, *rest: Any) -> None: ...

    before = jobs.job(name="t.gaining")(gaining)
    waiting = [h.id for h in jobs.enqueue_many([before.request(t) for t in ("a", "a", "b")])]
    later = before.enqueue("c", wait=3600)
    running_one = before.enqueue("d")
    q(limits_db, "UPDATE livepush_jobs SET state = 'running', attempt = 1, lease = 1 WHERE id = %s", (running_one.id,))
    keyless = before.enqueue()

    async def gaining(ctx: Any, tenant: str) -> None: ...  # type: ignore[no-redef]

    jobs.job(name="t.gaining", concurrency=("tenant", 1))(gaining)  # redeployed with a limit
    with caplog.at_level("INFO", logger="livepush.jobs"):
        assert jobs.drain(max_jobs=0) == {}  # a runtime with the new definition started
    assert q(limits_db, "SELECT id, limited, concurrency_key FROM livepush_jobs ORDER BY id") == [
        (waiting[0], True, '"a"'), (waiting[1], True, '"a"'), (waiting[2], True, '"b"'),
        (later.id, True, '"c"'), (running_one.id, True, '"d"'), (keyless.id, False, None)]
    assert "1 unfinished jobs have no value for the concurrency key" in caplog.text
    # A second start finds the name limited already and reads no backlog again.
    q(limits_db, "UPDATE livepush_jobs SET limited = false, concurrency_key = NULL WHERE id = %s", (waiting[2],))
    assert jobs.drain(max_jobs=0) == {}
    assert q(limits_db, "SELECT limited FROM livepush_jobs WHERE id = %s", (waiting[2],)) == [(False,)]


def test_a_concurrency_limit_added_to_a_rate_limited_function_holds_the_jobs_enqueued_before_it(
        limits_db: str) -> None:
    """A function limited by its rate alone marks its jobs limited with no concurrency key, which
    no slot counts. A deploy that adds concurrency= to it holds those jobs to the new slots too:
    the first runtime that starts with the new definition gives each unfinished one its key (a
    running one fills its key's slot), as it does for a function that had no limit at all."""
    async def rate_then_slots(ctx: Any, tenant: str) -> None: ...

    before = jobs.job(name="t.rate_then_slots", rate="1000/s")(rate_then_slots)
    waiting = [h.id for h in jobs.enqueue_many([before.request(t) for t in ("a", "a", "b")])]
    running_one = before.enqueue("d")
    assert jobs.drain(max_jobs=0) == {}  # a runtime with the rate alone stored it
    q(limits_db, "UPDATE livepush_jobs SET state = 'running', attempt = 1, lease = 1 WHERE id = %s", (running_one.id,))
    assert q(limits_db, "SELECT DISTINCT limited, concurrency_key FROM livepush_jobs") == [(True, None)]

    # Redeployed with one slot per tenant.
    jobs.job(name="t.rate_then_slots", rate="1000/s", concurrency=("tenant", 1))(rate_then_slots)
    assert jobs.drain(max_jobs=0) == {}
    assert q(limits_db, "SELECT id, limited, concurrency_key FROM livepush_jobs ORDER BY id") == [
        (waiting[0], True, '"a"'), (waiting[1], True, '"a"'), (waiting[2], True, '"b"'), (running_one.id, True, '"d"')]


async def test_a_start_marking_running_jobs_never_deadlocks_with_their_outcomes_and_marks_them_all(
        limits_db: str) -> None:
    """The first runtime with a definition that adds a limit marks the function's running jobs,
    while the runtimes running them write their outcomes: a completer's batch locks its jobs' rows
    in the order they ended, not by id. Here one writes a retry of the later job, then of the
    earlier one, while the start marks them in id order. Neither waits for the other in a circle
    (the start failed with a deadlock, or the completer lost its batch), and the job retried while
    the start marked its backlog still comes back marked, held to the limit."""
    async def busy(ctx: Any, tenant: str) -> None: ...

    before = jobs.job(name="t.busy_gaining")(busy)
    early, late = before.enqueue("a"), before.enqueue("b")
    q(limits_db, "UPDATE livepush_jobs SET state = 'running', attempt = 1, lease = 1 WHERE id = ANY(%s)",
      ([early.id, late.id],))
    new = Registry()
    new.add(jobs.job(name="t.busy_gaining", concurrency=("tenant", 1))(busy))  # redeployed with a limit
    retry = ("UPDATE livepush_jobs SET state = 'scheduled', run_at = now() + interval '1 hour', lease = NULL, "
             "version = version + 1 WHERE id = %s")

    def marking_waits_or_marked_the_early_job() -> bool:
        return q(limits_db, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                            "AND query LIKE '%%SET limited = true%%'")[0][0] > 0 or \
            q(limits_db, "SELECT limited FROM livepush_jobs WHERE id = %s", (early.id,)) == [(True,)]

    pool = await database.pools().aget()
    with psycopg.connect(limits_db) as outcomes:
        outcomes.execute("SET lock_timeout = '10s'")
        outcomes.execute(retry, (late.id,))  # the batch's first outcome: the later job ended first
        store = asyncio.create_task(runtime_limits.store(pool, new))
        await async_wait_for(marking_waits_or_marked_the_early_job, 10.0, message="the start to mark the backlog")
        await asyncio.wait_for(asyncio.to_thread(outcomes.execute, retry, (early.id,)), 10.0)
        outcomes.commit()
        await asyncio.wait_for(store, 10.0)
    assert q(limits_db, "SELECT id, state, limited, concurrency_key FROM livepush_jobs ORDER BY id") == [
        (early.id, "scheduled", True, '"a"'), (late.id, "scheduled", True, '"b"')]


def test_jobs_enqueued_before_a_concurrency_key_moved_to_another_parameter_are_keyed_anew(limits_db: str) -> None:
    """A function that had a limit (a rate) and gains a concurrency key with a deploy, or whose key
    moves to another parameter: its unfinished jobs are keyed anew by the first runtime that starts
    with the new definition, so they count in the new key's slots instead of running past them
    (marked limited already, they were left keyless, or keyed by the old parameter)."""
    async def rekeyed(ctx: Any, tenant: str, account: str) -> None: ...

    rated = jobs.job(name="t.rekeyed", rate="100/s")(rekeyed)
    waiting = [h.id for h in jobs.enqueue_many([rated.request("a", "x"), rated.request("a", "y")])]
    running_one = rated.enqueue("b", "z")
    assert jobs.drain(max_jobs=0) == {}  # a runtime with the rate alone started
    q(limits_db, "UPDATE livepush_jobs SET state = 'running', attempt = 1, lease = 1 WHERE id = %s", (running_one.id,))
    jobs.job(name="t.rekeyed", rate="100/s", concurrency=("tenant", 1))(rekeyed)  # redeployed with a key
    assert jobs.drain(max_jobs=0) == {}
    assert q(limits_db, "SELECT id, limited, concurrency_key FROM livepush_jobs ORDER BY id") == [
        (waiting[0], True, '"a"'), (waiting[1], True, '"a"'), (running_one.id, True, '"b"')]
    jobs.job(name="t.rekeyed", rate="100/s", concurrency=("account", 1))(rekeyed)  # keyed by another parameter
    assert jobs.drain(max_jobs=0) == {}
    assert q(limits_db, "SELECT id, concurrency_key FROM livepush_jobs ORDER BY id") == [
        (waiting[0], '"x"'), (waiting[1], '"y"'), (running_one.id, '"z"')]


@pytest.mark.parametrize("stored", ["nothing", "a row without limits"])
async def test_limits_of_a_function_defined_while_a_runtime_runs_hold_there(
        limits_db: str, stored: str, caplog: pytest.LogCaptureFixture) -> None:
    """A function with limits defined in a module imported after the runtime started: its limits
    were written only at a start, so its jobs waited for ever (no row: the limited claim had
    nothing to claim by) or ran with no limit at all (a row an earlier deploy left without limits).
    The runtime now writes them as it meets the definition, and holds the jobs to them."""
    queue = "late-limits"
    # A name of its own per case: the process-wide registry keeps every definition, which the
    # next case's runtime would find at its start.
    name = f"t.defined_late.{stored.replace(' ', '_')}"
    if stored != "nothing":
        q(limits_db, "INSERT INTO livepush_job_limits (name) VALUES (%s)", (name,))
    gate = asyncio.Event()
    started: list[str] = []
    caplog.set_level("INFO", logger="livepush.jobs")
    async with running(queues=[queue], concurrency=4):
        @jobs.job(name=name, queue=queue, concurrency=("tenant", 1))
        async def defined_late(ctx: Any, tenant: str) -> None:
            started.append(tenant)
            await asyncio.wait_for(gate.wait(), 10)

        handles = [await defined_late.aenqueue(t) for t in ("a", "a", "b")]
        # b's job is last in claim order: the claim that starts it would have started the second
        # of a's with it, had nothing held that one back.
        await async_wait_for(lambda: "b" in started, 10.0, message="b's job to start")
        assert sorted(started) == ["a", "b"], started
        assert [jobs.get_job(h.id).state for h in handles] == ["running", "available", "running"]  # type: ignore[union-attr]
        gate.set()
        await async_wait_for(lambda: {jobs.get_job(h.id).state for h in handles} == {"succeeded"}, 10.0)  # type: ignore[union-attr]
    assert started == ["a", "b", "a"] or started == ["b", "a", "a"], started
    assert q(limits_db, "SELECT max_running, key_param FROM livepush_job_limits WHERE name = %s", (name,)) == \
        [(1, "tenant")]
    assert name in caplog.text, caplog.text


def test_jobs_marked_limited_after_the_limits_were_dropped_still_run(limits_db: str) -> None:
    """During a rolling deploy that removes a limit, a process still running the old definition
    enqueues jobs marked for the limited claim, and a job that was running under the limit may
    come back for a retry; a runtime with the new definition runs both."""
    async def rolling(ctx: Any, tenant: str) -> None: ...

    old = jobs.job(name="t.rolling", concurrency=("tenant", 1))(rolling)
    retried = old.enqueue("retried")
    assert jobs.drain(max_jobs=0) == {}  # a runtime with the old definition stored the limit
    q(limits_db, "UPDATE livepush_jobs SET state = 'running', attempt = 1, lease = 1 WHERE id = %s", (retried.id,))
    jobs.job(name="t.rolling")(rolling)  # the new definition, without the limit
    assert jobs.drain(max_jobs=0) == {}  # a runtime with it started: the limit is dropped
    late = old.enqueue("late")  # a web process not yet redeployed
    q(limits_db, "UPDATE livepush_jobs SET state = 'available', attempt = 1 WHERE id = %s", (retried.id,))  # back for a retry
    assert q(limits_db, "SELECT id, limited FROM livepush_jobs ORDER BY id") == [(retried.id, True), (late.id, True)]
    assert jobs.drain() == {"succeeded": 2}


def test_a_job_keyed_anew_whose_arguments_lack_the_new_key_runs_without_a_slot_as_the_log_says(
        limits_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """A deploy that reads the concurrency key from another parameter keys the unfinished jobs
    anew; one enqueued before the parameter existed has no value for it, and the log says it runs
    without the limit. So it does: it no longer holds the old parameter's key, whose slots it would
    share with jobs of the new key that happen to have that value."""
    async def moved(ctx: Any, tenant: str, *rest: Any) -> None: ...

    old = jobs.job(name="t.moved", concurrency=("tenant", 1))(moved)
    before = old.enqueue("a")
    assert jobs.drain(max_jobs=0) == {}  # a runtime with the old definition stored the limit

    async def moved(ctx: Any, tenant: str, account: str) -> None: ...  # type: ignore[no-redef]

    jobs.job(name="t.moved", concurrency=("account", 1))(moved)  # keyed by a new parameter
    with caplog.at_level("INFO", logger="livepush.jobs"):
        assert jobs.drain(max_jobs=0) == {}
    assert "1 unfinished jobs have no value for the concurrency key" in caplog.text
    assert q(limits_db, "SELECT limited, concurrency_key FROM livepush_jobs WHERE id = %s", (before.id,)) == \
        [(True, None)]


def test_a_job_that_kept_its_mark_through_a_dropped_limit_is_keyed_anew_when_a_limit_comes_back(
        limits_db: str) -> None:
    """A job running when a deploy removed its function's limit keeps its mark and its key (its
    retry comes back marked). A later deploy that limits the function again by another parameter
    keys it anew from its arguments, as every other unfinished job, so that it counts in the new
    key's slots, not in the slots of whatever value the old parameter had."""
    async def relimited(ctx: Any, tenant: str, account: str) -> None: ...

    kept = jobs.job(name="t.relimited", concurrency=("tenant", 1))(relimited).enqueue("a", "x")
    assert jobs.drain(max_jobs=0) == {}  # a runtime with the limit stored it
    q(limits_db, "UPDATE livepush_jobs SET state = 'running', attempt = 1, lease = 1 WHERE id = %s", (kept.id,))
    jobs.job(name="t.relimited")(relimited)  # redeployed without the limit
    assert jobs.drain(max_jobs=0) == {}
    q(limits_db, "UPDATE livepush_jobs SET state = 'scheduled', run_at = now() + interval '1 hour', lease = NULL "
                 "WHERE id = %s", (kept.id,))  # back for a retry, marked
    plain = jobs.job(name="t.relimited")(relimited).enqueue("b", "y")
    jobs.job(name="t.relimited", concurrency=("account", 1))(relimited)  # limited again, by account
    assert jobs.drain(max_jobs=0) == {}
    assert q(limits_db, "SELECT id, limited, concurrency_key FROM livepush_jobs ORDER BY id") == [
        (kept.id, True, '"x"'), (plain.id, True, '"y"')]


@pytest.mark.parametrize("aio", [False, True], ids=["sync", "async"])
async def test_a_failed_job_run_again_takes_the_limits_its_function_has_now(
        limits_db: str, aio: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """retry_failed() enqueues a failed job again, and is held to its function's definition as an
    enqueue is: a job that failed before its function gained a limit takes the limited claim with
    its key (a start marks only unfinished jobs); one that failed under a key read from another
    parameter counts under the new one; one whose limit a deploy since removed takes the plain
    claim. A process that does not define the function leaves the mark the job had."""
    async def redefined(ctx: Any, tenant: str, account: str) -> None: ...

    async def retry(job_id: int) -> bool:
        return await jobs.aretry_failed(job_id) if aio else await asyncio.to_thread(jobs.retry_failed, job_id)

    def fail(*ids: int) -> None:
        q(limits_db, "UPDATE livepush_jobs SET state = 'failed', attempt = 1, finished_at = now() "
                     "WHERE id = ANY(%s)", (list(ids),))

    def marks(*ids: int) -> list[tuple[bool, str | None]]:
        return [tuple(r) for r in q(limits_db, "SELECT limited, concurrency_key FROM livepush_jobs "
                                               "WHERE id = ANY(%s) ORDER BY id", (list(ids),))]

    plain = jobs.job(name="t.redefined")(redefined)
    before_limit = plain.enqueue("a", "x")
    fail(before_limit.id)
    jobs.job(name="t.redefined", concurrency=("tenant", 1))(redefined)  # redeployed with a limit
    assert await jobs.adrain(max_jobs=0) == {}  # a runtime with it started: failed jobs are not marked
    assert marks(before_limit.id) == [(False, None)]
    assert await retry(before_limit.id) is True
    assert marks(before_limit.id) == [(True, '"a"')]

    by_tenant = jobs.job(name="t.redefined", concurrency=("tenant", 1))(redefined)
    rekeyed = by_tenant.enqueue("b", "y")
    fail(rekeyed.id)
    jobs.job(name="t.redefined", concurrency=("account", 1))(redefined)  # keyed by another parameter
    assert await retry(rekeyed.id) is True
    assert marks(rekeyed.id) == [(True, '"y"')]

    dropped = by_tenant.enqueue("c", "z")
    fail(dropped.id)
    jobs.job(name="t.redefined")(redefined)  # the limit removed
    assert await retry(dropped.id) is True
    assert marks(dropped.id) == [(False, None)]

    unknown = by_tenant.enqueue("d", "w")
    fail(unknown.id)
    monkeypatch.delitem(REGISTRY._functions, "t.redefined")  # an operator's script that does not import the jobs
    assert await retry(unknown.id) is True
    assert marks(unknown.id) == [(True, '"d"')]


# -- concurrency ------------------------------------------------------------------------------------

def test_at_most_n_per_key_across_runtimes(limits_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """Three tenants, 12 jobs each, two runtimes of 4 slots (one alone cannot fill the 6 the
    limits allow): never more than 2 of a tenant run at once (by the runs' own notes, and by the
    running rows each saw as it started), and every job runs once."""
    runtimes = [start_runtime("--concurrency", "4") for _ in range(2)]
    jobs.enqueue_many([limit_jobs.per_tenant.request(t, 0.15) for _ in range(12) for t in ("a", "b", "c")])
    wait_for(lambda: count(limits_db, "SELECT count(*) FROM livepush_jobs WHERE state = 'succeeded'") == 36, 30.0,
             interval=0.1, message="36 jobs to succeed")
    assert most_at_once(limits_db, "t.per_tenant") == {"a": 2, "b": 2, "c": 2}
    assert count(limits_db, "SELECT max(running) FROM limit_runs WHERE phase = 'start'") <= 2
    assert count(limits_db, "SELECT count(DISTINCT job_id) FROM limit_runs WHERE phase = 'start'") == 36
    assert count(limits_db, "SELECT count(*) FROM limit_runs WHERE phase = 'start'") == 36
    assert count(limits_db, "SELECT count(DISTINCT pid) FROM limit_runs") == 2
    for child in runtimes:
        assert child.stop(timeout=15) == 0, child.output()


def test_a_full_key_blocks_neither_other_keys_nor_other_jobs(
        limits_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """Tenant a's jobs are first in line and a holds its one slot: tenant b's job and a plain job
    enqueued after them still run; a's second job waits for a's slot."""
    first = limit_jobs.tenant_flag.enqueue("a", "a1")
    second = limit_jobs.tenant_flag.enqueue("a", "a2")
    start_runtime("--concurrency", "4")
    start_runtime("--concurrency", "4")
    wait_for(lambda: jobs.get_job(first.id).state == "running", 10.0, message="a's first job to run")
    other_key = limit_jobs.tenant_flag.enqueue("b", "b1")
    other_job = limit_jobs.plain.enqueue()
    wait_for(lambda: jobs.get_job(other_job.id).state == "succeeded", 10.0, message="the plain job to run")
    wait_for(lambda: jobs.get_job(other_key.id).state == "running", 10.0, message="b's job to run")
    assert jobs.get_job(second.id).state == "available"
    set_flag(limits_db, "a1")
    wait_for(lambda: jobs.get_job(second.id).state == "running", 10.0, message="a's second job to take the slot")
    set_flag(limits_db, "a2")
    set_flag(limits_db, "b1")
    wait_for(lambda: {jobs.get_job(h.id).state for h in (first, second, other_key)} == {"succeeded"}, 10.0)
    assert most_at_once(limits_db, "t.tenant_flag") == {"a": 1, "b": 1}


async def test_a_slot_freed_in_the_runtime_starts_the_keys_next_job_without_waiting_for_a_poll(limits_db: str) -> None:
    """A runtime with free slots, idle because its key's only slot is taken, starts the key's
    next job as soon as the one holding the slot ends, not at its next poll (30 s here): nothing
    else rings for a slot freed in the same runtime."""
    async with running(queues=["default"], concurrency=4, poll_interval=30.0):
        first = await limit_jobs.tenant_flag.aenqueue("k", "k1")
        second = await limit_jobs.tenant_flag.aenqueue("k", "k2")
        await async_wait_for(lambda: jobs.get_job(first.id).state == "running", 10.0,
                             message="the key's first job to run")
        assert jobs.get_job(second.id).state == "available"
        set_flag(limits_db, "k1")
        await async_wait_for(lambda: jobs.get_job(second.id).state == "running", 5.0,
                             message="the key's second job to start once the first ended")
        set_flag(limits_db, "k2")
        await async_wait_for(lambda: jobs.get_job(second.id).state == "succeeded", 5.0)


async def test_a_key_with_a_long_backlog_blocks_no_other_key(limits_db: str) -> None:
    """Tenant a's 60 jobs are first in line and a has one slot: a runtime with 6 free slots starts
    a's first and tenant b's job behind them at once. One claim reads a bounded number of
    candidates in claim order (60 of a's fill it), so b's job waited for the next poll (30 s
    here) or, with a's jobs short, for a's whole backlog to drain, while 5 slots stayed idle."""
    assert jobs.drain(max_jobs=0) == {}  # a runtime started: the limits are stored
    handles = await jobs.aenqueue_many([limit_jobs.tenant_flag.request("a", "a-go") for _ in range(60)]
                                       + [limit_jobs.tenant_flag.request("b", "b-go")])
    async with running(queues=["default"], concurrency=6, poll_interval=30.0):
        await async_wait_for(lambda: jobs.get_job(handles[-1].id).state == "running", 5.0,
                             message="b's job to start beside a's first")
        assert count(limits_db, "SELECT count(*) FROM livepush_jobs WHERE state = 'running'") == 2
        set_flag(limits_db, "b-go")
        await async_wait_for(lambda: jobs.get_job(handles[-1].id).state == "succeeded", 5.0)
    assert most_at_once(limits_db, "t.tenant_flag") == {"a": 1, "b": 1}


async def test_a_function_with_limits_gets_slots_while_another_ones_backlog_waits(limits_db: str) -> None:
    """Functions with limits on one queue take turns at a runtime's free slots: a job of one of
    them starts while another's long backlog, within its limits, is still waiting. Each claim
    asked them in the order of their names, so the first one's backlog took every slot until it
    was empty, and a steady flow of its jobs kept the other's from ever starting."""
    order: list[str] = []

    @jobs.job(name="t.a_long_backlog", concurrency=("tenant", 1000))
    async def long_backlog(ctx: Any, tenant: str) -> None:
        order.append("a")

    @jobs.job(name="t.b_behind_it", concurrency=("tenant", 1000))
    async def behind_it(ctx: Any, tenant: str) -> None:
        order.append("b")

    # Turns go round every function with limits this process registered (the suite's other tests
    # register more as they run): the backlog is kept well past one round of them.
    await jobs.aenqueue_many([long_backlog.request("t") for _ in range(400)])
    await behind_it.aenqueue("t")
    async with running(queues=["default"], concurrency=1) as rt:
        turns = len(rt.limited)
        await async_wait_for(lambda: "b" in order, 20.0, message="the second function's job to run")
    assert turns < 200 and order.index("b") <= turns, (turns, order.index("b"))


async def test_functions_with_limits_are_claimed_in_the_order_of_their_priority(limits_db: str) -> None:
    """Lower priority numbers run first, among functions with limits too: a function of a lower
    priority gets a runtime's slots before another one's backlog, whatever their names."""
    order: list[str] = []

    @jobs.job(name="t.a_routine", concurrency=("tenant", 1000))
    async def routine(ctx: Any, tenant: str) -> None:
        order.append("routine")

    @jobs.job(name="t.b_urgent", concurrency=("tenant", 1000), priority=-5)
    async def urgent(ctx: Any, tenant: str) -> None:
        order.append("urgent")

    await jobs.aenqueue_many([routine.request("t") for _ in range(20)] + [urgent.request("t") for _ in range(3)])
    async with running(queues=["default"], concurrency=1):
        await async_wait_for(lambda: len(order) == 23, 20.0, message="every job to run")
    assert order[:3] == ["urgent"] * 3


def test_a_killed_runtimes_job_frees_its_slot(limits_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """kill -9 while a key's only slot is held: no job of that key starts while the dead runtime's
    row still says running; once it is rescued, exactly one of them runs at a time again."""
    held = limit_jobs.tenant_flag.enqueue("k", "k-go")
    victim = start_runtime("--concurrency", "4")
    wait_for(lambda: jobs.get_job(held.id).state == "running", 10.0)
    waiting = limit_jobs.tenant_flag.enqueue("k", "k-go")
    victim.kill()
    successor = start_runtime("--concurrency", "4")
    # The successor finds the dead process at its start, rescues its job (attempt counted) and
    # runs one of the two.
    wait_for(lambda: count(limits_db, "SELECT count(*) FROM limit_runs WHERE phase = 'start' AND pid = %s",
                           (successor.pid,)) == 1, 15.0, message="the successor to start one job of k")
    assert count(limits_db, "SELECT count(*) FROM livepush_jobs WHERE state = 'running'") == 1
    set_flag(limits_db, "k-go")
    wait_for(lambda: {jobs.get_job(h.id).state for h in (held, waiting)} == {"succeeded"}, 15.0)
    assert jobs.get_job(held.id).attempt == 2
    # The dead runtime's run never noted its end: count the running rows each run saw instead.
    assert count(limits_db, "SELECT max(running) FROM limit_runs WHERE phase = 'start'") == 1


# -- rate ---------------------------------------------------------------------------------------------

def test_a_rate_holds_across_two_runtimes(limits_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """42 jobs limited to 10 starts a second, two runtimes of 20 slots: after the first two (the
    bucket's burst), the other 40 take 4 s, within 10 %, and both runtimes start some."""
    start_runtime("--concurrency", "20")
    start_runtime("--concurrency", "20")
    jobs.enqueue_many([limit_jobs.rated.request() for _ in range(42)])
    wait_for(lambda: count(limits_db, "SELECT count(*) FROM limit_runs WHERE phase = 'start'") == 42, 15.0,
             interval=0.1, message="42 rate-limited jobs to start")
    # The times of the claims that took the tokens: each job's `started` version, written by its
    # claim (test_job_versions, at the claim's now()). The jobs' own notes come a variable while
    # later, as long as a loaded machine takes to run each job's first lines, which bunched them
    # up or spread them past the bounds below with the bucket keeping time.
    claimed = "FROM test_job_versions WHERE name = 't.rated' AND event = 'started'"
    assert count(limits_db, f"SELECT count(*) {claimed}") == 42
    span = q(limits_db, f"SELECT extract(epoch FROM max(at) - min(at))::float8 {claimed}")[0][0]
    assert 3.6 <= span <= 4.4, span
    assert count(limits_db, "SELECT count(DISTINCT pid) FROM limit_runs") == 2
    # Never ahead of the bucket: by any claim, at most the burst and 10 per second since the first.
    starts = [r[0] for r in q(limits_db, f"SELECT extract(epoch FROM at - min(at) OVER ())::float8 {claimed} "
                                         "ORDER BY at")]
    assert all(n <= 2 + 10 * t + 1 for n, t in enumerate(starts, start=1)), starts


# -- pause and resume -----------------------------------------------------------------------------------

# When t.plain jobs were claimed: each job's `started` version, written by its claim (at the claim's
# now()), which is what a pause stops and a resume lets go. A job's own note comes a variable
# while later, as long as a loaded machine takes to run its first lines.
CLAIMED_PLAIN = "FROM test_job_versions WHERE name = 't.plain' AND event = 'started'"


def started_since(url: str, at: Any) -> int:
    return count(url, f"SELECT count(*) {CLAIMED_PLAIN} AND at > %s", (at,))


def last_claimed(url: str) -> Any:
    return q(url, f"SELECT max(at) {CLAIMED_PLAIN}")[0][0]


def db_now(url: str) -> Any:
    return q(url, "SELECT clock_timestamp()")[0][0]


def test_pause_stops_every_runtime_and_resume_restarts_them(
        limits_db: str, start_runtime: Callable[..., ChildProcess], procs: Processes, env: dict[str, str]) -> None:
    """A steady flow of jobs through two runtimes: a pause stops both from starting any within a
    second while enqueues are still accepted, `livepush status` shows the queue paused, and a
    resume has them start again within a second."""
    runtimes = [start_runtime("--concurrency", "2") for _ in range(2)]
    jobs.enqueue_many([limit_jobs.plain.request(0.05) for _ in range(400)])
    wait_for(lambda: count(limits_db, "SELECT count(DISTINCT pid) FROM limit_runs") == 2, 10.0,
             message="both runtimes to run jobs")

    assert jobs.pause_queue("default") is True
    assert jobs.pause_queue("default") is False
    paused_at = db_now(limits_db)
    late = jobs.enqueue_many([limit_jobs.plain.request(0.05) for _ in range(5)])
    assert len(late) == 5
    # An observation window of 2 s: nothing may start later than 1 s after the pause.
    deadline = time.monotonic() + 2.0
    wait_for(lambda: time.monotonic() >= deadline, 3.0)
    assert (last_claimed(limits_db) - paused_at).total_seconds() < 1.0
    status = {s.queue: s for s in jobs.status().queues}
    assert status["default"].paused and status["default"].depth > 0
    child = procs.livepush("status", "--json", env=env)
    assert child.wait(30) == 0, child.output()
    shown = {s["queue"]: s for s in json.loads(child.stdout())["queues"]}
    assert shown["default"]["paused"] is True and shown["second"]["paused"] is False
    child = procs.livepush("status", env=env)
    assert child.wait(30) == 0, child.output()
    assert [line.split()[:2] for line in child.stdout().splitlines() if line.strip().startswith("default")] == \
        [["default", "paused"]]

    resumed_at = db_now(limits_db)
    assert jobs.resume_queue("default") is True
    assert jobs.resume_queue("default") is False
    wait_for(lambda: started_since(limits_db, resumed_at) > 0, 5.0, message="a start after the resume")
    first = q(limits_db, f"SELECT min(at) {CLAIMED_PLAIN} AND at > %s", (resumed_at,))[0][0]
    assert (first - resumed_at).total_seconds() < 1.0
    wait_for(lambda: count(limits_db, "SELECT count(*) FROM limit_runs WHERE at > %s", (resumed_at,)) >= 10
             and count(limits_db, "SELECT count(DISTINCT pid) FROM limit_runs WHERE at > %s", (resumed_at,)) == 2,
             10.0, message="both runtimes to start jobs again")
    for child in runtimes:
        child.kill()


async def test_a_runtime_that_misses_the_pause_ring_still_stops_within_a_second(limits_db: str) -> None:
    """The pause's ring is what stops runtimes at once; one that hears no rings (no listener)
    reads the paused set again often enough that it too starts nothing a second after the pause."""
    async with running(listen=False, queues=["default"], concurrency=2) as rt:
        await jobs.aenqueue_many([limit_jobs.plain.request(0.05) for _ in range(400)])
        await async_wait_for(lambda: count(limits_db, "SELECT count(*) FROM limit_runs") >= 4, 10.0,
                             message="the runtime to run jobs")
        assert await jobs.apause_queue("default") is True
        paused_at = db_now(limits_db)
        # An observation window of 2 s: nothing may start later than 1 s after the pause.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 2.0)
        assert (last_claimed(limits_db) - paused_at).total_seconds() < 1.0
        assert "default" in rt.paused
        resumed_at = db_now(limits_db)
        assert await jobs.aresume_queue("default") is True
        await async_wait_for(lambda: started_since(limits_db, resumed_at) > 0, 5.0, message="a start after the resume")
