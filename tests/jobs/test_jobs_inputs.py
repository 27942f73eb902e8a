"""Bad ids and delays get a clear TypeError or ValueError at the call, never a database error."""

from __future__ import annotations

import asyncio
import functools
import math
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

from typing import Any

import pytest
from psycopg import sql

from livepush import jobs
from livepush.errors import ConfigError
from livepush.jobs import InvalidArgumentsError
from livepush.jobs.api.enqueue import EARLIEST_RUN_AT, LATEST_RUN_AT, run_at
from livepush.jobs.api.functions import JobFunction
from livepush.jobs.api.handles import NO_SUCH_ID, checked_id
from tests.jobs import sample_jobs
from tests.jobs.conftest import q


def test_checked_id() -> None:
    """Ints pass; ints no row can have become NO_SUCH_ID; anything else is a TypeError that
    names the parameter (and hints at .id for a handle)."""
    assert checked_id(42, "job_id") == 42
    assert checked_id(0, "job_id") == checked_id(-5, "job_id") == checked_id(2**70, "job_id") == NO_SUCH_ID
    for bad in ("42", 4.0, None, True):
        with pytest.raises(TypeError, match="job_id must be an int"):
            checked_id(bad, "job_id")
    with pytest.raises(TypeError, match=r"pass its \.id"):
        checked_id(jobs.JobHandle(7, "x"), "job_id")


@pytest.mark.parametrize(("wait", "error", "fragment"), [
    (-1, ValueError, "zero or more seconds"),
    (math.nan, ValueError, "finite"),
    (math.inf, ValueError, "finite"),
    (1e30, ValueError, "ends after 9999-12-30 in UTC"),
    ("5", TypeError, "a number of seconds or a timedelta, got str"),
    (True, TypeError, "a number of seconds or a timedelta, got bool"),
])
def test_bad_waits(wait: object, error: type, fragment: str) -> None:
    """wait= takes a finite, non-negative number of seconds that ends before the year 9999."""
    with pytest.raises(error, match=fragment):
        run_at(wait, None)  # type: ignore[arg-type]


def test_calls_with_bad_ids(jobs_db: str) -> None:
    """Every call that takes an id refuses a non-int with a TypeError, and answers an int no
    row can have as it answers an unknown id."""
    h = sample_jobs.record.enqueue()
    for call in (jobs.cancel, jobs.retry_failed, jobs.discard_failed, jobs.job_state, jobs.cancel_group,
                 jobs.get_group, jobs.seal_group, jobs.group_members, jobs.group_history):
        with pytest.raises(TypeError, match="_id must be an int"):
            call(str(h.id))  # type: ignore[operator]
    assert jobs.cancel(2**70) is False and jobs.job_state(2**70) is None and jobs.get_group(2**70) is None
    with pytest.raises(TypeError, match="group_id must be an int"):
        jobs.add_to_group("1", sample_jobs.record)  # type: ignore[arg-type]
    with pytest.raises(jobs.GroupNotFound):
        jobs.add_to_group(2**70, sample_jobs.record)
    with pytest.raises(ValueError, match="finite"):
        sample_jobs.record.enqueue(wait=math.nan)
    assert jobs.job_state(h.id)["state"] == "available"  # type: ignore[index]


@pytest.mark.parametrize("queue", ["", "imports\x00", "imports\udc80", "q" * 201, 7])
def test_a_queue_name_postgres_cannot_store_is_refused_at_the_call(jobs_db: str, queue: object) -> None:
    """Empty, with a NUL or a lone surrogate, longer than 200 characters, not a str: a ConfigError
    naming the queue at the call, never a database error that says Postgres cannot be reached."""
    with pytest.raises(ConfigError, match="a queue is a non-empty string of at most 200 characters"):
        jobs.pause_queue(queue)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"request\(queue=\)"):
        sample_jobs.record.request("a", queue=queue)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"@jobs.job\(queue=\)"):
        jobs.job(name="t.bad_queue", queue=queue)
    assert jobs.pause_queue("q" * 200) is True


@pytest.mark.parametrize("queue", ["reports,daily", " imports", "imports\n"])
def test_a_queue_name_livepush_jobs_queues_cannot_name_is_refused_at_the_call(jobs_db: str, queue: str) -> None:
    """`livepush jobs --queues a,b` splits at commas and strips spaces: a queue whose name has a
    comma, or a space at either end, could be enqueued to but never served by a runtime given
    --queues (it would serve "reports" and "daily"). Refused at the call, naming why."""
    with pytest.raises(ConfigError, match="with no comma and no space at either end"):
        jobs.job(name="t.bad_queue", queue=queue)
    with pytest.raises(ConfigError, match="with no comma and no space at either end"):
        sample_jobs.record.request("a", queue=queue)


@pytest.mark.parametrize("at", [
    datetime(1, 1, 1, 1, tzinfo=timezone(timedelta(hours=5))),          # 0001-12-31 20:00 BC in UTC
    datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),   # 10000-01-01 04:00 in UTC
])
def test_an_at_whose_instant_python_cannot_read_back_is_refused_at_the_call(jobs_db: str, at: datetime) -> None:
    """Postgres stores a run time before year 1 or after 9999 in UTC, but no runtime, get_job or
    status can read it back (psycopg makes datetimes): the claim of every job beside it would fail.
    A ValueError naming at=, and nothing is written."""
    with pytest.raises(ValueError, match="at="):
        sample_jobs.record.enqueue("odd", at=at)
    with pytest.raises(ValueError, match="at="):
        jobs.enqueue_many([(sample_jobs.record, ["odd"], {"at": at})])
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs")[0][0] == 0


def _session_zone(url: str, zone: str) -> None:
    """Every new session of the test's database shows times in `zone`, as a server whose TimeZone
    is not UTC does (initdb takes the machine's zone)."""
    (name,) = q(url, "SELECT current_database()")[0]
    q(url, sql.SQL("ALTER DATABASE {} SET timezone = {}").format(sql.Identifier(name), sql.Literal(zone)))


@pytest.mark.parametrize(("zone", "near_the_end"), [
    ("America/Adak", datetime(1, 1, 1, 12, tzinfo=timezone.utc)),            # year 0 as Adak shows it
    ("Pacific/Kiritimati", datetime(9999, 12, 31, 12, tzinfo=timezone.utc)),  # year 10000 in Kiritimati
])
def test_a_run_time_every_session_time_zone_can_read_back_is_all_enqueue_takes(
        jobs_db: str, zone: str, near_the_end: datetime) -> None:
    """psycopg reads a run time as the session's time zone shows it: an instant within a day of
    year 1 or 9999 in UTC is outside Python's datetimes there, and every read of its job (claim,
    get_job, state topic) would fail. at= and wait= that near are refused, naming themselves and
    writing nothing; the earliest and latest run times taken read back in that zone, and so does
    an offset with a fraction of a second (which Postgres cannot parse), as its instant."""
    _session_zone(jobs_db, zone)
    with pytest.raises(ValueError, match="at= .* outside the run times livepush stores"):
        sample_jobs.record.enqueue("odd", at=near_the_end)
    with pytest.raises(ValueError, match="at="):
        jobs.enqueue_many([(sample_jobs.record, ["odd"], {"at": near_the_end})])
    if near_the_end.year == 9999:
        with pytest.raises(ValueError, match="wait="):
            sample_jobs.record.enqueue("odd", wait=(near_the_end - datetime.now(timezone.utc)).total_seconds())
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs")[0][0] == 0
    odd_offset = datetime(2030, 1, 1, tzinfo=timezone(timedelta(microseconds=1)))
    for at in (EARLIEST_RUN_AT, LATEST_RUN_AT, odd_offset):
        info = jobs.get_job(sample_jobs.record.enqueue("edge", at=at).id)
        assert info is not None and info.run_at == at.astimezone(timezone.utc).isoformat()


@pytest.mark.parametrize(("option", "value", "error"), [
    ("priority", 1.5, TypeError), ("priority", True, TypeError), ("priority", "1", TypeError),
    ("priority", None, TypeError), ("priority", 2**31, ValueError), ("priority", -(2**31) - 1, ValueError),
    ("max_attempts", 2.5, TypeError), ("max_attempts", True, TypeError), ("max_attempts", 2**31, ValueError),
])
def test_a_priority_or_max_attempts_postgres_cannot_store_fails_at_decoration(
        jobs_db: str, option: str, value: object, error: type) -> None:
    """Both are integer columns. Taken as they came, each enqueue of the job failed in Postgres
    and raised DependencyError, the error of a database that cannot be reached (or, enqueued
    alone, 1.5 and "1" were stored rounded and parsed). An error naming the option, at import."""
    with pytest.raises(error, match=f"{option}="):
        jobs.job(name="t.bad_integer_option", **{option: value})(lambda ctx: None)
    fine = jobs.job(name="t.edge_integer_options", priority=-(2**31), max_attempts=2**31 - 1)(lambda ctx: None)
    jobs.enqueue_many([fine.request(), fine.request()])
    assert q(jobs_db, "SELECT DISTINCT priority, max_attempts FROM livepush_jobs") == [(-(2**31), 2**31 - 1)]


@pytest.mark.parametrize("never_retry", [("ValueError",), (ValueError, 3), (int,), ValueError])
def test_a_never_retry_that_is_not_exception_classes_fails_at_decoration(never_retry: object) -> None:
    """never_retry= is read only when an attempt fails: a name, a number or a class that is no
    exception made that isinstance() check raise, so the failure was never written and the job
    stayed `running`. A TypeError naming it, at import."""
    with pytest.raises(TypeError, match="never_retry="):
        jobs.job(name="t.bad_never_retry", never_retry=never_retry)(lambda ctx: None)


@pytest.mark.parametrize("backoff", [5, None, "exponential"])
def test_a_backoff_that_is_not_a_function_fails_at_decoration(backoff: object) -> None:
    """backoff= is called only when an attempt fails: a number or None was taken, and each retry
    logged its TypeError and fell back to the default delay. A TypeError naming backoff=, at import."""
    with pytest.raises(TypeError, match=r"@jobs.job\(backoff=\) takes a function"):
        jobs.job(name="t.bad_backoff", backoff=backoff)(lambda ctx: None)  # type: ignore[call-overload]


async def _async_backoff(attempt: int) -> float:
    return 1.0


async def _async_generator_backoff(attempt: int) -> AsyncIterator[float]:
    yield 1.0


def _generator_backoff(attempt: int) -> Iterator[float]:
    yield 1.0


class _AsyncCallBackoff:
    async def __call__(self, attempt: int) -> float:
        return 1.0


@pytest.mark.parametrize("backoff", [_async_backoff, _async_generator_backoff, _generator_backoff, _AsyncCallBackoff(),
                                     lambda: 5.0, lambda attempt, base: base * attempt])
def test_a_backoff_that_cannot_give_seconds_for_an_attempt_fails_at_decoration(backoff: object) -> None:
    """backoff(attempt) is called only when an attempt fails: an `async def` one (a generator, an
    object whose __call__ is `async def`) returned a coroutine or a generator, never a number, and
    one that cannot take the attempt number raised TypeError; each retry logged the error and fell
    back to the default delay. A TypeError naming backoff=, at import."""
    with pytest.raises(TypeError, match=r"@jobs.job\(backoff=\)"):
        jobs.job(name="t.bad_backoff", backoff=backoff)(lambda ctx: None)  # type: ignore[arg-type]
    assert jobs.job(name="t.bad_backoff", backoff=lambda attempt, base=2.0: base)(lambda ctx: None).backoff(1) == 2.0


@pytest.mark.parametrize(("celery", "livepush"), [
    ("delay", "enqueue(*args)"), ("apply_async", "enqueue(*args, wait=, at=)"), ("s", "request(*args)"),
    ("si", "request(*args)"), ("signature", "request(*args)"),
])
def test_a_celery_call_on_a_job_names_livepush_own(celery: str, livepush: str) -> None:
    """A team moving from Celery writes `send_receipt.delay(7)`: Python's "'JobFunction' object
    has no attribute 'delay'" named no way on. The AttributeError names the call to make."""
    with pytest.raises(AttributeError, match=re.escape(f"{sample_jobs.record.name}.{livepush}")):
        getattr(sample_jobs.record, celery)
    assert not hasattr(sample_jobs.record, "delay")


@pytest.mark.parametrize("call", ["enqueue", "aenqueue"])
def test_an_rq_style_enqueue_of_a_function_names_the_jobs_own(call: str) -> None:
    """A team moving from RQ writes `jobs.enqueue(send_receipt, 7)`, as `queue.enqueue(f, ...)`:
    Python's "module 'livepush.jobs' has no attribute 'enqueue'" named no way on."""
    with pytest.raises(AttributeError, match=re.escape(f"some_job.{call}(*args)")):
        getattr(jobs, call)
    assert not hasattr(jobs, call)


@pytest.mark.parametrize("argument", ["imports", 5, ("imports",)])
def test_a_job_decorator_given_an_option_positionally_says_to_use_keywords(argument: object) -> None:
    """@jobs.job("imports") (a queue where the function goes) raises TypeError saying options are
    keywords, instead of an AttributeError about `__module__` from inside the decorator."""
    with pytest.raises(TypeError, match=r"@jobs.job takes its options as keywords"):
        jobs.job(argument)  # type: ignore[call-overload]


@pytest.mark.parametrize("name", [5, 0, "", ("a",), "imports\x00", "imports\udc80", "n" * 501])
def test_a_job_name_postgres_cannot_store_is_refused_at_decoration(jobs_db: str, name: object) -> None:
    """The name is what the database stores and runtimes look jobs up by. Not checked, 5 was
    stored as "5", which no runtime's registry (keyed by the int) finds, so its jobs never ran; a
    NUL failed every enqueue as a database that cannot be reached; an empty name (or 0) was taken
    for no name, and the job silently named module.qualname. A ConfigError naming it."""
    with pytest.raises(ConfigError, match=r"@jobs.job\(name=\): a job name is a non-empty string"):
        jobs.job(name=name)(lambda ctx: None)  # type: ignore[arg-type]
    assert jobs.job(name="n" * 500)(lambda ctx: None).enqueue().name == "n" * 500


class _Jobs:
    def method(self, ctx: object, user_id: int) -> None: ...


def _no_ctx() -> None: ...


@pytest.mark.parametrize("func, says", [
    (_no_ctx, r"takes no parameter, but a job function is called with ctx first"),
    (_Jobs.method, r"takes `self` first: a job function is called with ctx first and no instance"),
])
def test_a_job_function_that_cannot_take_ctx_first_is_refused_at_decoration(func: Any, says: str) -> None:
    """The runtime calls a job function as func(ctx, *args). One taking no parameter was refused
    only at its first enqueue; a method decorated in its class body (its `self` would get ctx, its
    ctx the first argument) at its enqueue, with a count of arguments one more than the user
    passes, which sends them looking at the call. A ConfigError at import, saying what to do."""
    name = f"t.cannot_take_ctx.{func.__name__}"
    with pytest.raises(ConfigError, match=rf"@jobs.job: {name.replace('.', '[.]')} {says}"):
        jobs.job(name=name)(func)
    assert name not in jobs.REGISTRY


def test_a_job_kept_under_its_old_name_after_a_rename_is_registered_through_its_func(jobs_db: str) -> None:
    """docs/jobs.md says to keep a renamed job's old name registered until its jobs are gone. The
    obvious way, @jobs.job(name=old) over the job, is refused as a job decorated twice, and the
    refusal said nothing of how: it names `.func`, which registers the same function under the
    old name too, and the old name's jobs run it."""
    with pytest.raises(ConfigError, match=r"already a job .*jobs\.job\(name=\"old\.name\"\)\(fn\.func\)"):
        jobs.job(name="t.record_sync.old")(sample_jobs.record_sync)
    old = jobs.job(name="t.record_sync.old")(sample_jobs.record_sync.func)
    handle = old.enqueue("under the old name")
    assert jobs.drain() == {"succeeded": 1}
    assert q(jobs_db, "SELECT name FROM livepush_jobs WHERE id = %s", (handle.id,)) == [("t.record_sync.old",)]
    assert q(jobs_db, "SELECT key FROM job_runs WHERE phase = 'done'") == [("under the old name",)]


def test_two_functions_with_one_job_name_are_refused_at_decoration() -> None:
    """A job name is what runtimes look a job's function up by: a second function taking a name
    already taken silently ran the first one's jobs (whichever module was imported last won). A
    ConfigError naming both; the same function defined again (a re-import) takes its name back."""
    def first(ctx: object) -> str:
        return "first"

    def second(ctx: object) -> str:
        return "second"

    jobs.job(name="t.one_name")(first)
    jobs.job(name="t.one_name")(first)  # a re-import
    with pytest.raises(ConfigError, match=r"job name 't\.one_name' of function .*second in .* is taken by function .*first in "):
        jobs.job(name="t.one_name")(second)
    assert jobs.REGISTRY.get("t.one_name").func is first


def test_a_name_defined_again_elsewhere_or_with_other_options_is_warned_about(
        caplog: pytest.LogCaptureFixture) -> None:
    """The same function defined again (one qualname in one file) takes its name back, silently
    for a re-import. But a factory that gives one name= to a second function of that qualname, or
    the same function with another queue or other options, replaced the first silently, and the
    first object went on enqueueing on its own queue: one warning names the job, both places
    (file:line) and what differs."""
    caplog.set_level("WARNING", logger="livepush.jobs")
    source = "from livepush import jobs\n\n@jobs.job(name='t.reimported', backoff=lambda n: 3)\ndef tick(ctx): ...\n"
    for _ in range(2):  # a module imported again: new objects, the same places
        exec(compile(source, "/app/reimported_jobs.py", "exec"), {})
    assert not caplog.records, caplog.text

    def made(which: int) -> JobFunction:
        if which == 1:
            def run(ctx: object) -> int:
                return 1
        else:
            def run(ctx: object) -> int:
                return 2
        return jobs.job(name="t.made")(run)

    first = made(1)
    made(1)  # the same place again: no warning
    assert not caplog.records, caplog.text
    made(2)
    (record,) = caplog.records
    here = __file__
    first_line, second_line = first.func.__code__.co_firstlineno, jobs.REGISTRY.get("t.made").func.__code__.co_firstlineno
    assert record.levelname == "WARNING"
    assert "'t.made'" in record.getMessage() and f"{here}:{first_line}" in record.getMessage(), record.getMessage()
    assert f"{here}:{second_line}" in record.getMessage() and "function" in record.getMessage(), record.getMessage()
    caplog.clear()

    def sync(ctx: object) -> None: ...

    on_a = jobs.job(name="t.requeued", queue="a")(sync)
    jobs.job(name="t.requeued", queue="b", max_attempts=2)(sync)
    (record,) = caplog.records
    message = record.getMessage()
    assert "'t.requeued'" in message and "queue 'b' (was 'a')" in message and "max_attempts 2 (was 5)" in message, message
    assert on_a.queue == "a" and jobs.REGISTRY.get("t.requeued").queue == "b"


def test_a_bad_queue_name_is_named_before_the_database_is_looked_for() -> None:
    """pause_queue("a,b") in a process with no database configured names the queue, the caller's
    mistake, rather than saying that LIVEPUSH_DATABASE_URL is not set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEPUSH_") and k != "DATABASE_URL"}
    for call in ("jobs.pause_queue('a,b')", "jobs.resume_queue('a,b')",
                 "asyncio.run(jobs.apause_queue('a,b'))", "asyncio.run(jobs.aresume_queue('a,b'))"):
        done = subprocess.run([sys.executable, "-c", f"import asyncio\nfrom livepush import jobs\n{call}"],
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode != 0
        assert "ConfigError" in done.stderr and "'a,b'" in done.stderr, done.stderr[-500:]
        assert "LIVEPUSH_DATABASE_URL" not in done.stderr, done.stderr[-500:]


def test_arguments_the_function_cannot_take_are_refused_at_the_call(jobs_db: str) -> None:
    """A job runs as its function called with ctx and the arguments: more or fewer than its
    signature takes is an InvalidArgumentsError (a TypeError) at enqueue, enqueue_many and
    request(), naming the function and what it takes, and nothing of the call is written; rather
    than a job that fails every attempt in a runtime. Defaults may be left out; *args takes any
    number."""

    def some(ctx: object, first: int, second: int = 2) -> None: ...

    def any_number(ctx: object, first: int, *rest: int) -> None: ...

    with pytest.raises(InvalidArgumentsError, match=r"t\.hold takes 1 argument after ctx, got 2"):
        sample_jobs.hold.enqueue(1, 2)
    with pytest.raises(InvalidArgumentsError, match=r"t\.hold takes 1 argument after ctx, got 0"):
        sample_jobs.hold.enqueue()
    with pytest.raises(InvalidArgumentsError, match=r"t\.hold takes 1 argument after ctx, got 2"):
        jobs.enqueue_many([sample_jobs.hold.request(1), (sample_jobs.hold, [1, 2], {"key": "k"})])
    with pytest.raises(InvalidArgumentsError, match=r"t\.hold takes 1 argument after ctx, got 3"):
        sample_jobs.hold.request(1, 2, 3)
    with pytest.raises(InvalidArgumentsError, match=r"t\.some takes at most 2 arguments after ctx, got 3"):
        JobFunction(some, name="t.some").enqueue(1, 2, 3)
    with pytest.raises(InvalidArgumentsError, match=r"t\.some takes at least 1 argument after ctx, got 0"):
        JobFunction(some, name="t.some").enqueue()
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]

    many = JobFunction(any_number, name="t.any_number")
    with pytest.raises(InvalidArgumentsError, match=r"t\.any_number takes at least 1 argument after ctx, got 0"):
        many.enqueue()
    assert many.enqueue(1, 2, 3, 4).id and JobFunction(some, name="t.some").enqueue(1).id

    # What the runtime calls is the wrapper, which supplies the wrapped function's `first` itself.
    @functools.wraps(some)
    def supplied(ctx: object, second: int) -> None:
        some(ctx, 1, second)

    with pytest.raises(InvalidArgumentsError, match=r"t\.supplied takes 1 argument after ctx, got 2"):
        JobFunction(supplied, name="t.supplied").enqueue(1, 2)
    assert JobFunction(supplied, name="t.supplied").enqueue(2).id
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs") == [(3,)]


async def test_a_job_argument_given_by_keyword_is_refused_naming_its_position(jobs_db: str) -> None:
    """A job's arguments are stored as one JSON array and given to its function by position:
    enqueue(tenant="acme") raised Python's bare "unexpected keyword argument", which named no way
    out. An InvalidArgumentsError (a TypeError) names the parameter and its place after ctx; a
    keyword that is no parameter and no option names the options (queue= and priority=, which
    other job libraries take per call, say where livepush takes them); nothing is written."""

    async def sync_account(ctx: object, tenant: str, account_id: int = 0) -> None: ...

    fn = JobFunction(sync_account, name="t.sync_account")
    by_place = r"^t\.sync_account takes its arguments by position: pass account_id as argument 2 after ctx"
    with pytest.raises(InvalidArgumentsError, match=by_place):
        fn.enqueue("acme", account_id=7)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentsError, match=by_place):
        await fn.aenqueue("acme", account_id=7)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentsError, match=by_place):
        fn.request("acme", account_id=7)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentsError, match=r"^enqueue\(\) has no option delay=: its options are wait=, "):
        fn.enqueue("acme", delay=5)  # type: ignore[arg-type]
    # An enqueue option given to request(), for a batch item: the item's options dict is where it goes.
    for option in ("key", "tags", "wait", "at"):
        with pytest.raises(InvalidArgumentsError, match=rf"^request\(\) has no option {option}=: its options are "
                           rf"queue=.*\(job, \[args\], \{{'{option}': \.\.\.\}}\)"):
            fn.request("acme", **{option: None})
    with pytest.raises(InvalidArgumentsError, match=r"enqueue\(\) has no option queue=.*: "
                       r"jobs\.enqueue_many\(\[job\.request\(\.\.\., queue=\.\.\.\)\]\)"):
        fn.enqueue("acme", queue="urgent")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentsError, match=r"enqueue\(\) has no option priority=.*; "
                       r"a job's priority is its function's, @jobs\.job\(priority=\)"):
        fn.enqueue("acme", priority=1)  # type: ignore[arg-type]
    # Under a decorator whose wrapper takes *args and passes them on, the wrapped function's
    # parameters are what the arguments fill: the keyword is named as one of them, not as an option.
    @functools.wraps(sync_account)
    async def wrapper(ctx: object, *args: Any, **kwargs: Any) -> None:
        await sync_account(ctx, *args, **kwargs)

    with pytest.raises(InvalidArgumentsError, match=r"^t\.wrapped takes its arguments by position: pass "
                       r"account_id as argument 2 after ctx"):
        JobFunction(wrapper, name="t.wrapped").enqueue("acme", account_id=7)  # type: ignore[arg-type]
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]


def test_a_job_function_with_a_keyword_only_parameter_it_cannot_be_given_fails_at_decoration(jobs_db: str) -> None:
    """A runtime calls a job function with ctx and the job's arguments by position: a keyword-only
    parameter without a default could be given by no enqueue, and every attempt of every job
    would fail. A ConfigError at the decorator naming the parameter, and nothing registered; with
    a default it is fine (the job runs with it)."""

    async def send(ctx: object, user_id: int, *, template: str) -> None: ...

    async def send_default(ctx: object, user_id: int, *, template: str = "welcome") -> None: ...

    with pytest.raises(ConfigError, match=r"t\.send has keyword-only parameters without a default \(template\)"):
        jobs.job(name="t.send")(send)
    assert "t.send" not in jobs.REGISTRY
    fine = jobs.job(name="t.send_default")(send_default)
    assert fine.enqueue(1).id and jobs.drain(registry=jobs.REGISTRY) == {"succeeded": 1}


async def _send(ctx: object, to: str, template: str = "plain") -> str:
    return f"{template} to {to}"


class _AsyncCallable:
    """A job function as an object whose __call__ is async."""

    async def __call__(self, ctx: object, to: str) -> str:
        await asyncio.sleep(0)
        return f"called for {to}"


@pytest.mark.parametrize("func", [functools.partial(_send, template="welcome"), _AsyncCallable()],
                         ids=["partial", "object"])
def test_a_job_function_with_no_qualname_needs_a_name_and_says_so(func: object) -> None:
    """A job's name defaults to its function's module and qualname. A functools.partial or a
    callable object has no qualname: the decorator raised a bare AttributeError about
    `__qualname__`. A ConfigError saying to pass name=, and with a name the job runs."""
    with pytest.raises(ConfigError, match=r"@jobs\.job\(name=\) .*no __qualname__"):
        jobs.job(func)  # type: ignore[arg-type]


def test_a_job_function_defined_inside_a_function_needs_a_name_and_says_so() -> None:
    """A function defined inside another is no attribute of its module: named by its qualname
    (`...<locals>...`), it enqueued fine while no runtime importing the module ever defined it,
    and its jobs were given back for ever. Refused at decoration, saying to pass name=; with a
    name it is a job like any other."""

    def send(ctx: object, to: str) -> str:
        return f"sent to {to}"

    with pytest.raises(ConfigError, match=r"@jobs\.job\(name=\) is needed for .*<locals>\.send: it is defined "
                                          r"inside a function"):
        jobs.job(send)
    with pytest.raises(ConfigError, match=r"<locals>\.send: it is defined inside a function"):
        jobs.job(queue="default")(send)
    assert jobs.job(name="t.inner_send")(send).name == "t.inner_send"


def test_an_object_whose_call_is_async_runs_as_an_async_job(jobs_db: str) -> None:
    """A callable object whose __call__ is `async def` is an async job: it runs on the loop and
    its result is what its coroutine returns. Taken for a sync function, it ran in a thread and
    returned its coroutine unrun, and the job failed."""
    job = jobs.job(name="t.async_object")(_AsyncCallable())  # type: ignore[arg-type]
    partial = jobs.job(name="t.async_partial")(functools.partial(_send, template="welcome"))
    assert job._is_async and partial._is_async
    first, second = job.enqueue("a@example.com"), partial.enqueue("b@example.com")
    assert jobs.drain(registry=jobs.REGISTRY) == {"succeeded": 2}
    assert jobs.get_job(first.id).result == "called for a@example.com"  # type: ignore[union-attr]
    assert jobs.get_job(second.id).result == "welcome to b@example.com"  # type: ignore[union-attr]


def _rows(ctx: object, n: int) -> object:
    yield from range(n)


async def _arows(ctx: object, n: int) -> object:
    for i in range(n):
        yield i


class _GeneratorCallable:
    """A job function as an object whose __call__ has a yield."""

    def __call__(self, ctx: object, n: int) -> object:
        yield n


@pytest.mark.parametrize("func", [_rows, _arows, _GeneratorCallable()], ids=["sync", "async", "object"])
def test_a_generator_function_is_refused_as_a_job_at_decoration(func: object) -> None:
    """A job returns its result; a function with a yield returns a generator, which failed every
    attempt of every job with a result that is not JSON, found in a runtime's log. A ConfigError
    at the decorator naming the job and saying to return instead, and nothing registered."""
    with pytest.raises(ConfigError, match=r"@jobs\.job: t\.rows is a generator function: .*use return, not yield"):
        jobs.job(name="t.rows")(func)  # type: ignore[arg-type]
    assert "t.rows" not in jobs.REGISTRY


class _Importer:
    """A class whose constructor takes a job's arguments: calling it builds an instance."""

    def __init__(self, ctx: object, import_id: int) -> None:
        self.import_id = import_id


@pytest.mark.parametrize("decorate", [jobs.job, jobs.job(name="t.importer")], ids=["bare", "options"])
def test_a_class_is_refused_as_a_job_at_decoration(decorate: Any) -> None:
    """Calling a class builds an instance, no result: `@jobs.job` on one was accepted and every run
    failed on a result that is not JSON ("result is a _Importer"), found in a runtime's log. A
    ConfigError at the decorator naming the class and saying to decorate a function, and nothing
    registered."""
    with pytest.raises(ConfigError, match=r"@jobs\.job on the class .*_Importer: .*decorate a function"):
        decorate(_Importer)
    assert "t.importer" not in jobs.REGISTRY
    assert f"{__name__}._Importer" not in jobs.REGISTRY
