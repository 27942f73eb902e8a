"""Django's Tasks framework on livepush (docs/frameworks.md, Django): enqueue, results and their
states, errors with their exception class, enqueues inside a transaction that commit or roll back
with it, run_after, priorities, queues, context, progress, task groups, and what is refused."""

from __future__ import annotations

import asyncio
import copy
import importlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from livepush import jobs
from livepush.errors import ArgumentTypeError
from livepush.jobs import database
from livepush.contrib.django import (
    RUN_TASK,
    LivePushBackend,
    TaskNotSupported,
    request,
    task_group,
)
from livepush.contrib.django.execution import run_task as RUN_TASK_JOB
from livepush.contrib.django.tasks_api import MODULE as tasks_module
from livepush.contrib.django.tasks_api import (
    InvalidTask,
    Task,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
)
from tests.support import services
from tests.test_docs import example
from tests.support.waiting import wait_for

pytestmark = pytest.mark.usefixtures("django_site")


@pytest.fixture
def t(django_site: str) -> Any:
    """The sample tasks (importable once Django is set up: @task reads settings.TASKS), none run yet."""
    module = importlib.import_module("tests.contrib.sample_django_tasks")
    module.RAN.clear()
    return module


def test_enqueue_then_run_gives_a_successful_result_with_its_return_value(t: Any) -> None:
    """A task enqueued is READY, runs once on the runtime, and its result reads SUCCESSFUL with the value."""
    result = t.add.enqueue(2, b=3)
    assert result.status == TaskResultStatus.READY
    assert result.id.isdigit() and result.args == [2] and result.kwargs == {"b": 3}
    assert jobs.get_job(int(result.id)).name == RUN_TASK
    assert t.add.get_result(result.id).status == TaskResultStatus.READY

    assert jobs.drain() == {"succeeded": 1}
    assert t.RAN == ["add:2+3"]
    done = t.add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.is_finished
    assert done.return_value == 5 and done.errors == [] and done.attempts == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5


def test_a_task_that_raises_fails_with_its_exception_class_and_message(t: Any) -> None:
    """A task that raises is FAILED; its error names the exception's class (importable) and message."""
    result = t.decline.enqueue("card declined")
    assert jobs.drain() == {"failed": 1}
    failed = t.decline.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError):
        failed.return_value  # noqa: B018
    (error,) = failed.errors
    assert error.exception_class is t.Declined
    assert error.exception_class_path == "tests.contrib.sample_django_tasks.Declined"
    assert "card declined" in error.traceback
    # What pages watching job:<id> see: the class path and the message, never a traceback.
    assert jobs.get_job(int(result.id)).error == "tests.contrib.sample_django_tasks.Declined: card declined"


def test_a_failed_tasks_error_is_the_message_python_shows(t: Any) -> None:
    """The message in a failed task's error is str() of the exception, as Python shows it under a
    traceback: an exception with a __str__ of its own reads as that, not as its args, and a
    KeyError keeps the quotes around its key."""
    own = t.reserve.enqueue("ab-1")
    key = t.look_up.enqueue("missing")
    assert jobs.drain() == {"failed": 2}
    assert jobs.get_job(int(own.id)).error == "tests.contrib.sample_django_tasks.OutOfStock: ab-1 is out of stock (0 left)"
    assert t.reserve.get_result(own.id).errors[0].exception_class is t.OutOfStock
    assert jobs.get_job(int(key.id)).error == "KeyError: 'missing'"
    assert t.look_up.get_result(key.id).errors[0].exception_class is KeyError


def test_a_builtin_exception_is_read_back_as_its_builtin_class(t: Any) -> None:
    """A task that raises a built-in (TypeError for a bad argument) fails with that class."""
    result = t.add.enqueue("x", b=1)
    assert jobs.drain() == {"failed": 1}
    (error,) = t.add.get_result(result.id).errors
    assert error.exception_class is TypeError


def test_enqueue_inside_a_transaction_that_rolls_back_never_runs(t: Any, django_site: str) -> None:
    """Inside transaction.atomic() the job is written in that transaction: rolled back, it never existed."""
    with pytest.raises(RuntimeError), transaction.atomic():
        result = t.record.enqueue("rolled back")
        with psycopg.connect(django_site) as other:  # not visible outside the transaction yet
            assert other.execute("SELECT count(*) FROM livepush_jobs").fetchone() == (0,)
        raise RuntimeError("roll back")
    assert jobs.drain() == {}
    with pytest.raises(TaskResultDoesNotExist):
        t.record.get_result(result.id)
    assert t.RAN == []


def test_enqueue_inside_a_transaction_that_commits_runs_once(t: Any) -> None:
    """A task enqueued in a transaction that commits exists from the commit and runs once."""
    with transaction.atomic():
        result = t.record.enqueue("committed")
    assert t.record.get_result(result.id).status == TaskResultStatus.READY
    assert jobs.drain() == {"succeeded": 1}
    assert t.RAN == ["committed"]


def test_enqueue_inside_a_transaction_with_use_tz_off_joins_it(t: Any) -> None:
    """With USE_TZ = False (Django's connection then reads timestamps naive) an enqueue inside
    transaction.atomic() is still written in that transaction, task groups too: the check that
    Django's database is the jobs' one does not depend on how a connection reads timestamps."""
    from livepush.contrib.django import backend as backend_module

    backend_module._JOINABLE.clear()  # the check runs again, on a connection made with USE_TZ off
    connection.close()
    try:
        with override_settings(USE_TZ=False):
            with pytest.raises(RuntimeError), transaction.atomic():
                t.record.enqueue("rolled back")
                raise RuntimeError("roll back")
            with transaction.atomic():
                t.record.enqueue("committed")
                with task_group(on_success=request(t.record, "callback")):
                    t.record.enqueue("member")
    finally:
        connection.close()  # the next test's connection reads timestamps as USE_TZ says again
    jobs.drain()
    assert sorted(t.RAN) == ["callback", "committed", "member"]


def test_enqueue_inside_a_transaction_on_another_database_than_the_jobs_is_refused(
        t: Any, django_site: str, pg_url: str) -> None:
    """A Django database that holds livepush's tables but is not the jobs' database (a second
    database someone also migrated) would take the job where no runtime looks for it: it would
    never run, and its result would not exist. The enqueue is refused instead, nothing written."""
    backend = LivePushBackend("default", {"QUEUES": ["default"], "OPTIONS": {"DATABASE_URL": pg_url}})
    try:
        with transaction.atomic():
            with pytest.raises(TaskNotSupported, match="not the jobs' database"):
                backend.enqueue(t.record, ["lost"], {})
            assert connection.connection.execute("SELECT count(*) FROM livepush_jobs").fetchone() == (0,)
    finally:
        database.configure(django_site)


@pytest.fixture
def test_runner_database(pg_admin_url: str) -> Iterator[str]:
    """The name of a database without livepush tables, as the test database Django's test runner
    (and pytest-django) creates is, behind the Django alias "tests" with `default`'s settings."""
    from django.db import connections

    name = f"test_{uuid.uuid4().hex[:12]}"
    services.create_database(pg_admin_url, name)
    connections.settings["tests"] = {**connections.settings["default"], "NAME": name}
    try:
        yield name
    finally:
        connections["tests"].close()
        del connections["tests"]
        del connections.settings["tests"]
        services.drop_database(pg_admin_url, name)


def test_enqueue_inside_a_transaction_on_a_database_without_livepush_tables_is_refused_naming_it(
        t: Any, test_runner_database: str) -> None:
    """An enqueue inside atomic() on a Django database without livepush's tables (the test
    database Django's test runner made) is refused naming that database, so the one at fault is
    seen, not only the alias that points at it, and the option that lets such tests enqueue."""
    backend = LivePushBackend("default", {"QUEUES": ["default"], "OPTIONS": {"DATABASE": "tests"}})
    with transaction.atomic(using="tests"):
        with pytest.raises(TaskNotSupported, match=rf"database {test_runner_database!r}\) has no livepush tables"
                                                   r"(.|\n)*test runner(.|\n)*ENQUEUE_ON_COMMIT"):
            backend.enqueue(t.record, ["lost"], {})
    assert jobs.drain() == {}


def test_enqueue_on_commit_off_writes_at_once_outside_the_transaction(t: Any) -> None:
    """With ENQUEUE_ON_COMMIT = False an enqueue inside a transaction is committed at once, rollback or not."""
    backend = LivePushBackend("default", {"QUEUES": ["default"], "OPTIONS": {"ENQUEUE_ON_COMMIT": False}})
    with pytest.raises(RuntimeError), transaction.atomic():
        result = backend.enqueue(t.record, ["kept"], {})
        raise RuntimeError("roll back")
    assert jobs.drain() == {"succeeded": 1}
    assert t.RAN == ["kept"] and backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_run_after_is_respected(t: Any) -> None:
    """A task with run_after does not run before that time, and runs once it has passed."""
    when = timezone.now() + timedelta(seconds=1.5)
    result = t.record.using(run_after=when).enqueue("later")
    assert jobs.drain() == {}
    assert t.record.get_result(result.id).status == TaskResultStatus.READY
    wait_for(lambda: jobs.drain() == {"succeeded": 1}, timeout=10, interval=0.1)
    assert timezone.now() >= when
    assert t.RAN == ["later"]


def test_higher_django_priority_runs_first(t: Any) -> None:
    """Django's higher priority runs first: livepush gets the priority negated."""
    t.record.using(priority=-50).enqueue("low")
    t.record.enqueue("normal")
    t.record.using(priority=100).enqueue("high")
    assert jobs.drain() == {"succeeded": 3}
    assert t.RAN == ["high", "normal", "low"]


def test_a_result_read_back_has_the_priority_its_task_was_enqueued_with(t: Any) -> None:
    """get_result() gives the task with the priority it was enqueued with, as Django's own
    backends do, not the task's default; jobs.get_job() shows livepush's (negated) priority."""
    high = t.record.using(priority=50).enqueue("high")
    plain = t.record.enqueue("plain")
    assert t.record.get_result(high.id).task.priority == 50
    assert t.record.get_result(plain.id).task.priority == t.record.priority
    assert jobs.get_job(int(high.id)).priority == -50


def test_a_task_enqueued_through_another_livepush_backend_reads_back_through_it(t: Any) -> None:
    """A task enqueued with .using(backend=...) on a second LivePushBackend, on a queue only that
    backend lists, reads back through it (get_result(), refresh()) with that backend and queue,
    also once the queue has left its QUEUES: a read shows what was enqueued, and is not refused
    as an enqueue on the task's default backend would be."""
    bulk = {"BACKEND": "livepush.contrib.django.LivePushBackend", "QUEUES": ["bulk"]}
    default = {"BACKEND": "livepush.contrib.django.LivePushBackend", "QUEUES": ["default", "second"]}
    with override_settings(TASKS={"default": default, "bulk": bulk}):
        result = t.add.using(backend="bulk", queue_name="bulk").enqueue(1, b=2)
        read = task_backends["bulk"].get_result(result.id)
        assert (read.backend, read.task.backend, read.task.queue_name) == ("bulk", "bulk", "bulk")
        assert jobs.drain(["bulk"]) == {"succeeded": 1}
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 3
    with override_settings(TASKS={"default": default, "bulk": {**bulk, "QUEUES": ["imports"]}}):
        assert task_backends["bulk"].get_result(result.id).task.queue_name == "bulk"


def test_queue_name_is_the_livepush_queue(t: Any) -> None:
    """A task's queue_name is its job's queue, and results read it back."""
    result = t.on_second.enqueue("q")
    assert jobs.get_job(int(result.id)).queue == "second"
    assert jobs.drain(queues=["default"]) == {}
    assert jobs.drain(queues=["second"]) == {"succeeded": 1}
    assert t.on_second.get_result(result.id).task.queue_name == "second"


def test_a_task_that_takes_context_sees_its_result_id_and_attempt(t: Any) -> None:
    """takes_context=True: the task gets a TaskContext whose result id is the job's and attempt 1."""
    result = t.with_context.enqueue("ctx")
    jobs.drain()
    assert t.with_context.get_result(result.id).return_value == {"label": "ctx", "id": result.id, "attempt": 1}


def test_progress_is_stored_on_the_job(t: Any) -> None:
    """progress() inside a task is the job's progress, on its job:<id> topic."""
    result = t.in_steps.enqueue(3)
    jobs.drain()
    info = jobs.get_job(int(result.id))
    assert info.progress == {"done": 3, "total": 3, "message": "step 3"}
    assert info.result == {"job_id": int(result.id), "group": None}


def test_an_async_task_runs(t: Any) -> None:
    """An async task runs (supports_async_task) and reports progress too."""
    result = t.async_double.enqueue(21)
    assert jobs.drain() == {"succeeded": 1}
    assert t.async_double.get_result(result.id).return_value == 42
    assert jobs.get_job(int(result.id)).progress["message"] == "async"


async def test_aenqueue_and_aget_result(t: Any) -> None:
    """aenqueue() and aget_result() work from async code."""
    result = await t.add.aenqueue(1, b=1)
    await jobs.adrain()
    assert (await t.add.aget_result(result.id)).return_value == 2


def test_tasks_enqueued_in_a_task_group_are_its_members_and_its_callback_runs_once(t: Any) -> None:
    """Inside task_group() every task enqueued joins the group; on_success runs once after all succeed."""
    with task_group(on_success=request(t.record, "all done")) as group:
        first = t.in_steps.enqueue(1)
        t.record.enqueue("member")
    counts = jobs.drain()
    assert counts == {"succeeded": 3}, counts
    assert jobs.get_group(group.id)["state"] == "finished"
    assert t.RAN == ["member", "all done"]
    assert t.in_steps.get_result(first.id).return_value["group"] == group.id


def test_the_frameworks_page_task_group_example_runs_inside_a_view(t: Any) -> None:
    """docs/frameworks.md's task-group block pasted into a view as a reader would (its imports at
    the top of views.py, the rest in the view's body) runs there: a name `request` imported at the
    top is hidden by every view's own `request` parameter, which failed the view with
    "'WSGIRequest' object is not callable"."""
    from django.test import RequestFactory

    code, where = example("docs/frameworks.md", "with task_group(")
    lines = code.splitlines()
    imports = [line for line in lines if line.startswith(("from ", "import "))]
    body = [line for line in lines if line not in imports]
    views = "\n".join([*imports, "def start_import(request):", *(f"    {line}" for line in body), "    return group"])
    namespace: dict[str, Any] = {"send_report": t.record, "alert": t.record, "import_row": t.add, "import_id": 3,
                                 "rows": [1, 2]}
    exec(compile(views, f"{where} (pasted into a view)", "exec"), namespace)  # noqa: S102 -- the repository's own docs
    group = namespace["start_import"](RequestFactory().post("/imports/"))
    assert jobs.drain() == {"succeeded": 3}  # two rows and on_success
    assert jobs.get_group(group.id)["state"] == "finished"
    assert sorted(t.RAN[:-1]) == ["add:3+1", "add:3+2"] and t.RAN[-1] == 3  # the members, then send_report


def test_a_task_group_whose_block_raised_inside_a_transaction_is_undone_where_the_error_is_caught(t: Any) -> None:
    """Inside atomic(), a task_group() block that raises takes its group and its tasks back even
    when the caller catches the error and commits the rest of its transaction: nothing is left
    open that could never finish."""
    with transaction.atomic():
        t.record.enqueue("outside the group")
        try:
            with task_group(on_failure=request(t.record, "group failed")) as group:
                t.record.enqueue("member of a failed block")
                raise RuntimeError("the import failed half way")
        except RuntimeError:
            pass
    assert jobs.drain() == {"succeeded": 1}
    assert jobs.get_group(group.id) is None
    assert t.RAN == ["outside the group"]


def test_a_task_cancelled_before_it_ran_reads_failed_with_job_cancelled(t: Any) -> None:
    """A cancelled job reads as FAILED with livepush's JobCancelled as its error, also when it was
    cancelled before any attempt ran (its row then holds no error at all), and when an attempt
    had failed before the cancel: the cancel is what ended it."""
    queued = t.record.enqueue("never runs")
    later = t.record.using(run_after=timezone.now() + timedelta(hours=1)).enqueue("not yet")
    assert jobs.cancel(int(queued.id)) and jobs.cancel(int(later.id))
    backend = LivePushBackend("default", {"QUEUES": ["default"], "OPTIONS": {"MAX_ATTEMPTS": 2}})
    retrying = backend.enqueue(t.decline, ["first attempt"], {})
    assert jobs.drain() == {"retrying": 1}
    assert jobs.cancel(int(retrying.id))
    for result in (queued, later, retrying):
        read = backend.get_result(result.id)
        assert read.status == TaskResultStatus.FAILED
        (error,) = read.errors
        assert error.exception_class is jobs.JobCancelled, error
    assert t.RAN == []


def test_a_task_cancelled_while_it_runs_sends_task_finished_as_failed(t: Any) -> None:
    """A running task that a cancel ends (JobCancelled from progress()) sends the framework's
    task_finished, FAILED as it reads back, after its task_started: receivers that pair the two
    (tasks in flight, a span per task) see it end."""
    from livepush.contrib.django.tasks_api import task_finished, task_started

    seen: list[tuple[str, str, Any]] = []

    def started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(("started", task_result.id, task_result.status))

    def finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(("finished", task_result.id, task_result.status))

    task_started.connect(started)
    task_finished.connect(finished)
    try:
        result = t.cancel_itself.enqueue()
        assert jobs.drain() == {"cancelled": 1}
    finally:
        task_started.disconnect(started)
        task_finished.disconnect(finished)
    assert t.RAN == []
    assert seen == [("started", result.id, TaskResultStatus.RUNNING), ("finished", result.id, TaskResultStatus.FAILED)]
    assert t.cancel_itself.get_result(result.id).status == TaskResultStatus.FAILED


def signals_of(task: Any, *args: Any) -> tuple[Any, list[tuple[str, Any]]]:
    """Enqueue `task` with `args`, run it, and return its result read back with the statuses the
    framework's task_started and task_finished were sent with meanwhile."""
    from livepush.contrib.django.tasks_api import task_finished, task_started

    seen: list[tuple[str, Any]] = []

    def started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(("started", task_result.status))

    def finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(("finished", task_result.status))

    task_started.connect(started)
    task_finished.connect(finished)
    try:
        result = task.enqueue(*args)
        jobs.drain()
    finally:
        task_started.disconnect(started)
        task_finished.disconnect(finished)
    return task.get_result(result.id), seen


def test_a_task_that_calls_sys_exit_fails_and_sends_task_finished(t: Any) -> None:
    """A task that raises SystemExit (sys.exit() in code it calls), which is no Exception, fails
    its job as any failure does, reads back FAILED with SystemExit, and sends task_finished after
    its task_started: receivers that pair the two (tasks in flight, a span per task) saw it start
    and never end."""
    read, seen = signals_of(t.exits, 3)
    assert seen == [("started", TaskResultStatus.RUNNING), ("finished", TaskResultStatus.FAILED)]
    assert read.status == TaskResultStatus.FAILED and read.errors[0].exception_class is SystemExit


def test_a_task_whose_return_value_no_job_result_can_hold_sends_task_finished_as_failed(t: Any) -> None:
    """A task returning what Django's normalization lets through but no job result holds (NaN)
    fails its job: task_finished says FAILED, as the result reads back, not SUCCESSFUL, and the
    error names the return value."""
    read, seen = signals_of(t.returns_nan)
    assert seen == [("started", TaskResultStatus.RUNNING), ("finished", TaskResultStatus.FAILED)]
    assert read.status == TaskResultStatus.FAILED
    assert read.errors[0].exception_class is jobs.InvalidResultError and "nan" in read.errors[0].traceback


def test_unknown_results_do_not_exist(t: Any) -> None:
    """An id that is not a Django task's job (unknown, malformed, or another job) does not exist."""
    for bad in ("999999", "abc", "-1", "0", ""):
        with pytest.raises(TaskResultDoesNotExist):
            t.add.get_result(bad)


def test_backend_options_are_checked(t: Any) -> None:
    """An unknown option, or MAX_ATTEMPTS below 1, is refused when the backend is made."""
    with pytest.raises(ImproperlyConfigured, match="unknown keys"):
        LivePushBackend("x", {"OPTIONS": {"ENQUEUE_ON_COMIT": True}})
    with pytest.raises(ImproperlyConfigured, match="MAX_ATTEMPTS"):
        LivePushBackend("x", {"OPTIONS": {"MAX_ATTEMPTS": 0}})


def test_a_max_attempts_postgres_cannot_store_is_refused_when_the_backend_is_made(t: Any) -> None:
    """MAX_ATTEMPTS past Postgres' integer (a "no limit" 10**10) is ImproperlyConfigured naming it
    when the backend is made, not a DependencyError from Postgres at every enqueue."""
    with pytest.raises(ImproperlyConfigured, match=r"\['MAX_ATTEMPTS'\] must be .* at most 2147483647"):
        LivePushBackend("x", {"OPTIONS": {"MAX_ATTEMPTS": 10**10}})
    assert LivePushBackend("x", {"OPTIONS": {"MAX_ATTEMPTS": 2**31 - 1}}).max_attempts == 2**31 - 1


@pytest.mark.parametrize(("option", "value"), [
    ("DATABASE", "nope"),                        # no such alias in DATABASES
    ("DATABASE_URL", "mysql://app@db/app"),      # not a Postgres URL
    ("DATABASE_URL", 5),                         # not a URL at all
    ("ENQUEUE_ON_COMMIT", "no"),                 # a string is not a bool (and "no" would read as True)
])
def test_an_option_the_backend_cannot_use_is_refused_when_it_is_made_naming_it(t: Any, django_site: str,
                                                                              option: str, value: Any) -> None:
    """A DATABASE that is no Django database, a DATABASE_URL that is no Postgres URL or an
    ENQUEUE_ON_COMMIT that is no bool: ImproperlyConfigured naming the option, when the backend is
    made (Django's checks make it at start), never another error at each enqueue."""
    with pytest.raises(ImproperlyConfigured, match=rf"TASKS\['x'\]\['OPTIONS'\]\['{option}'\]"):
        LivePushBackend("x", {"QUEUES": ["default"], "OPTIONS": {option: value}})
    assert database.configured_url() == django_site  # a refused URL changed nothing


@pytest.mark.parametrize("queue", ["emails,sms", " emails", "emails ", ""])
def test_queue_names_no_runtime_can_serve_are_refused(t: Any, queue: str) -> None:
    """A queue name `livepush jobs --queues` cannot name (a comma, a space at either end, empty)
    would take jobs no runtime ever runs: in QUEUES it is an ImproperlyConfigured naming the
    setting; with an empty QUEUES (any name) a task on it is refused at the enqueue, nothing written."""
    with pytest.raises(ImproperlyConfigured, match=r"TASKS\['x'\]\['QUEUES'\]"):
        LivePushBackend("x", {"QUEUES": ["default", queue]})
    backend = LivePushBackend("x", {"QUEUES": []})
    task = copy.copy(t.record)
    object.__setattr__(task, "queue_name", queue)  # as Task(...) made for such a backend would have it
    with pytest.raises(InvalidTask, match="queue"):
        backend.enqueue(task, ["lost"], {})
    assert jobs.drain() == {}


def test_max_attempts_option_retries_a_failing_task(t: Any) -> None:
    """With MAX_ATTEMPTS = 2 a failing task is READY again after its first attempt (livepush's retry)."""
    backend = LivePushBackend("default", {"QUEUES": ["default"], "OPTIONS": {"MAX_ATTEMPTS": 2}})
    result = backend.enqueue(t.decline, ["again"], {})
    assert jobs.drain() == {"retrying": 1}
    again = backend.get_result(result.id)
    assert again.status == TaskResultStatus.READY and again.attempts == 1
    assert again.errors[0].exception_class is t.Declined


def test_a_task_defined_in_main_is_refused(t: Any) -> None:
    """A task the runtime could not import by its path (defined in __main__) is refused with TaskNotSupported."""
    def main_func() -> None: ...

    main_func.__module__ = "__main__"
    main_func.__qualname__ = "main_func"
    with pytest.raises(TaskNotSupported, match="__main__") as refused:
        Task(func=main_func)
    assert isinstance(refused.value, InvalidTask)  # caught where Django code catches a refused task


def test_backend_capabilities(t: Any) -> None:
    """The backend says what it supports: defer, async tasks, results, priority."""
    backend = task_backends["default"]
    assert isinstance(backend, LivePushBackend)
    assert backend.supports_defer and backend.supports_async_task
    assert backend.supports_get_result and backend.supports_priority


def test_arguments_that_are_not_plain_json_are_refused_at_enqueue(t: Any) -> None:
    """Arguments that are not JSON are refused at the enqueue call, and nothing is written."""
    with pytest.raises(TypeError):
        t.record.enqueue(object())
    with pytest.raises(jobs.InvalidArgumentsError):
        t.record.enqueue(float("nan"))
    assert jobs.drain() == {}


def test_an_argument_django_cannot_normalize_is_refused_naming_where_it_is(t: Any) -> None:
    """A date or a Decimal among a task's arguments is livepush's InvalidArgumentsError naming the
    argument, not a bare TypeError that says only which type; nothing is written."""
    with pytest.raises(jobs.InvalidArgumentsError, match=r"args\[1\] is a date"):
        t.add.enqueue(1, date(2026, 1, 2))
    with pytest.raises(jobs.InvalidArgumentsError, match=r'kwargs\["b"\] is a Decimal'):
        t.add.enqueue(1, b=Decimal("1.5"))
    assert jobs.drain() == {}


def refusals_of_add(t: Any, args: tuple[Any, ...], kwargs: dict[str, Any], said: str) -> list[tuple[str, Any]]:
    """The InvalidArgumentsError matching `said` that `add` with these arguments raises each way it can
    be given them: enqueued alone, enqueued in a task group, and as a group's callback."""
    def in_a_group() -> None:
        with task_group():
            t.add.enqueue(*args, **kwargs)

    calls = {"enqueue": lambda: t.add.enqueue(*args, **kwargs),
             "callback": lambda: request(t.add, *args, **kwargs), "member": in_a_group}
    found = []
    for name, call in calls.items():
        with pytest.raises(jobs.InvalidArgumentsError, match=said) as caught:
            call()
        found.append((name, caught))
    return found


@pytest.mark.parametrize("args, kwargs, said", [
    ((float("nan"),), {}, r"args\[0\] is nan"),
    ((1,), {"b": float("inf")}, r'kwargs\["b"\] is inf'),
    (({1: 2},), {}, r"args\[0\] has the key 1"),
    (("a\x00b",), {}, r"args\[0\] contains a NUL"),
], ids=["nan", "infinity", "int-key", "nul"])
def test_an_argument_json_or_postgres_cannot_hold_is_refused_naming_the_tasks_own_argument(
        t: Any, args: tuple[Any, ...], kwargs: dict[str, Any], said: str) -> None:
    """NaN, an infinity, a key that is not a string or a NUL among a task's arguments (values
    Django's normalization lets through) is InvalidArgumentsError naming the task's own argument,
    args[0] or kwargs["b"], as for a date: not its place among the arguments of the job that runs
    the task (args[1][0]), nor the enqueue_many() the backend calls; alone, in a task group or as
    a group's callback; nothing is written."""
    for name, caught in refusals_of_add(t, args, kwargs, said):
        assert "enqueue_many" not in str(caught.value) and "[1][" not in str(caught.value), (name, caught.value)
    assert jobs.drain() == {}


@pytest.mark.parametrize("args, kwargs, said", [
    ((), {}, r"missing a required argument: 'a'"),
    ((1, 2, 3), {}, r"too many positional arguments"),
    ((1,), {"c": 3}, r"unexpected keyword argument 'c'"),
], ids=["too-few", "too-many", "unknown-keyword"])
def test_arguments_the_task_cannot_take_are_refused_at_the_enqueue_naming_the_task(
        t: Any, args: tuple[Any, ...], kwargs: dict[str, Any], said: str) -> None:
    """Arguments the task's function cannot be called with are InvalidArgumentsError (a TypeError)
    naming the task, at the enqueue call, alone, in a task group or as a group's callback, as
    livepush's own jobs refuse them: nothing is written, where the job written failed at each run;
    a takes_context task is called with its context first, which the caller does not pass."""
    for name, caught in refusals_of_add(t, args, kwargs, said):
        assert "tests.contrib.sample_django_tasks.add" in str(caught.value), (name, caught.value)
    with pytest.raises(jobs.InvalidArgumentsError, match="too many positional arguments"):
        t.with_context.enqueue("ctx", "more")
    assert jobs.drain() == {}
    t.with_context.enqueue("ctx")
    assert jobs.drain() == {"succeeded": 1}


def test_a_callback_argument_django_cannot_normalize_is_refused_naming_where_it_is(t: Any) -> None:
    """request(task, ...) for a group's callback names the argument that is not plain JSON, as an
    enqueue does, instead of the framework's bare TypeError."""
    with pytest.raises(jobs.InvalidArgumentsError, match=r"args\[0\] is a date"):
        request(t.record, date(2026, 1, 2))
    with pytest.raises(jobs.InvalidArgumentsError, match=r'kwargs\["tag"\] is a Decimal'):
        request(t.record, tag=Decimal("1"))


def test_a_group_callback_that_is_not_a_django_task_request_is_an_error_saying_how_to_write_it(t: Any) -> None:
    """request() takes a Django @task: given a livepush job, the task's plain function or its path,
    it raises ArgumentTypeError naming what it got, not an AttributeError; a task given as a
    callback without request() is refused naming request(task, ...), and no group is made."""
    for wrong in (RUN_TASK_JOB, t.record.func, "tests.contrib.sample_django_tasks.record"):
        with pytest.raises(ArgumentTypeError, match=r"request\(\) takes a Django @task"):
            request(wrong, "x")
    with pytest.raises(ArgumentTypeError, match=r"on_success=request\(record, \.\.\.\)"):
        with task_group(on_success=t.record):
            raise AssertionError("the block ran")
    assert jobs.drain() == {}


def test_a_runtime_process_runs_django_tasks(t: Any, django_db_url: str, livepush_env, procs) -> None:  # type: ignore[no-untyped-def]
    """`livepush jobs livepush.contrib.django.runner` with DJANGO_SETTINGS_MODULE runs enqueued tasks."""
    from tests.contrib.conftest import EXAMPLE

    env = livepush_env(database_url=django_db_url, extra={
        "DJANGO_SETTINGS_MODULE": "demo_site.settings", "PYTHONPATH": f"{EXAMPLE}:{procs_pythonpath()}"})
    child = procs.livepush("jobs", "livepush.contrib.django.runner", "--queues", "default,second", env=env)
    result = t.in_steps.enqueue(2)
    other = t.on_second.enqueue("there")
    done = wait_for(lambda: t.in_steps.get_result(result.id).is_finished or None, timeout=20, interval=0.05,
                    message=f"the task to finish; runtime output: {child.output()}")
    assert done and t.in_steps.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    wait_for(lambda: t.on_second.get_result(other.id).status == TaskResultStatus.SUCCESSFUL, timeout=10)
    assert child.stop() == 0


def test_under_djangos_test_runner_tasks_enqueued_as_the_docs_say_run(pg_url: str, livepush_env) -> None:  # type: ignore[no-untyped-def]
    """`manage.py test` runs a project's tests on a test database of its own, without livepush
    tables: with ENQUEUE_ON_COMMIT off in the tests' settings, a task enqueued in a TestCase and
    one enqueued inside atomic() in a TransactionTestCase both run under jobs.drain()."""
    from tests.contrib.conftest import EXAMPLE, ROOT

    env = {**os.environ, **livepush_env(database_url=pg_url, extra={
        "LIVEPUSH_ENV": "test", "PYTHONPATH": f"{EXAMPLE}:{procs_pythonpath()}"})}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    ran = subprocess.run([sys.executable, "-m", "django", "test", "tests.contrib.django_runner_cases", "--noinput",
                          "--settings", "tests.contrib.django_settings_test_runner"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and "Ran 2 tests" in ran.stderr, ran.stdout + ran.stderr


def test_a_runtime_process_serves_the_database_the_backends_options_name(  # type: ignore[no-untyped-def]
        t: Any, django_db_url: str, pg_url: str, livepush_env, procs) -> None:
    """OPTIONS['DATABASE_URL'] sets the jobs' database of every process the backend is made in:
    the runner's too, so its runtime claims the tasks the web process enqueued there, though
    LIVEPUSH_DATABASE_URL names another database (where it found nothing, and said nothing)."""
    from tests.contrib.conftest import EXAMPLE

    env = livepush_env(database_url=pg_url, extra={
        "DJANGO_SETTINGS_MODULE": "tests.contrib.django_settings_jobs_url", "DJANGO_JOBS_DATABASE_URL": django_db_url,
        "PYTHONPATH": f"{EXAMPLE}:{procs_pythonpath()}"})
    child = procs.livepush("jobs", "livepush.contrib.django.runner", "--queues", "default", env=env)
    result = t.in_steps.enqueue(2)
    wait_for(lambda: t.in_steps.get_result(result.id).is_finished or None, timeout=20, interval=0.05,
             message=f"the task to finish; runtime output: {child.output()}")
    assert t.in_steps.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    assert child.stop() == 0


def test_a_web_process_uses_the_database_the_backends_options_name_from_its_start(  # type: ignore[no-untyped-def]
        django_db_url: str, pg_url: str, livepush_env) -> None:
    """A web process whose backend's OPTIONS name DATABASE_URL enqueues its own livepush jobs
    there from its first request, before any task made the backend: in LIVEPUSH_DATABASE_URL's
    database no runtime of the runner would ever claim them."""
    from tests.contrib.conftest import EXAMPLE

    key = f"web-start:{uuid.uuid4().hex}"
    env = {**os.environ, **livepush_env(database_url=pg_url, extra={
        "DJANGO_SETTINGS_MODULE": "tests.contrib.django_settings_jobs_url", "DJANGO_JOBS_DATABASE_URL": django_db_url,
        "PYTHONPATH": f"{EXAMPLE}:{procs_pythonpath()}"})}
    web = ("from django.core.wsgi import get_wsgi_application\n"
           "get_wsgi_application()\n"  # what a WSGI server does at its start
           "from examples.fastapi_app.tasks import build_report\n"
           f"build_report.enqueue('ana', 1, key={key!r})\n")
    ran = subprocess.run([sys.executable, "-c", web], env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr

    def jobs_with_key(url: str) -> int:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM livepush_jobs WHERE key = %s", (key,)).fetchone()
        assert row is not None
        return int(row[0])

    assert (jobs_with_key(django_db_url), jobs_with_key(pg_url)) == (1, 0)


def test_serve_with_jobs_runs_the_tasks_of_every_queue_of_the_backend(t: Any, django_db_url: str, livepush_env,  # type: ignore[no-untyped-def]
                                                                       procs) -> None:
    """`livepush serve --with-jobs livepush.contrib.django.runner`, which has no --queues, runs the
    tasks of every queue in the backends' QUEUES (here default and second), not the default
    queue only: a task on another queue would wait for ever."""
    from tests.contrib.conftest import EXAMPLE

    env = livepush_env(database_url=django_db_url, extra={
        "DJANGO_SETTINGS_MODULE": "demo_site.settings", "PYTHONPATH": f"{EXAMPLE}:{procs_pythonpath()}"})
    server = procs.livepush("serve", "--with-jobs", "livepush.contrib.django.runner", env=env)
    first, second = t.record.enqueue("on default"), t.on_second.enqueue("on second")
    wait_for(lambda: t.record.get_result(first.id).status == TaskResultStatus.SUCCESSFUL, timeout=20, interval=0.05,
             message=f"the default queue's task to succeed; server output: {server.output()}")
    wait_for(lambda: t.on_second.get_result(second.id).status == TaskResultStatus.SUCCESSFUL, timeout=10,
             interval=0.05, message=f"the second queue's task to succeed; server output: {server.output()}")


def procs_pythonpath() -> str:
    from tests.contrib.conftest import ROOT

    return str(ROOT)


def test_a_backend_made_per_request_leaves_the_jobs_pools_alone(t: Any, django_site: str, pg_admin_url: str) -> None:
    """Django makes a task backend per thread, and under ASGI per request: making one whose OPTIONS
    name DATABASE_URL must not close the pools the process already uses, nor drop a loop's pool
    with its connections still open. Five requests that each read a result leave the connections
    as the first left them."""
    from tests.contrib.conftest import connections

    result = t.add.enqueue(1)
    params = {"QUEUES": ["default"], "OPTIONS": {"DATABASE_URL": django_site}}

    async def requests() -> list[int]:
        seen = []
        for _ in range(5):
            backend = LivePushBackend("default", params)  # what Django does in each request's context
            assert (await backend.aget_result(result.id)).status == TaskResultStatus.READY
            seen.append(connections(pg_admin_url, django_site))
        await database.release_loop()
        return seen

    seen = asyncio.run(requests())
    assert seen == [seen[0]] * 5, f"connections open after each request: {seen}"


def test_a_task_group_on_a_backend_that_is_not_livepush_is_refused_naming_it(t: Any) -> None:
    """task_group() needs livepush's backend: on another (the immediate backend tests often
    swap in) it raises TaskNotSupported naming the backend, not an AttributeError."""
    other = {"BACKEND": f"{tasks_module}.backends.immediate.ImmediateBackend"}
    with override_settings(TASKS={"default": {"BACKEND": "livepush.contrib.django.LivePushBackend"}, "other": other}):
        with pytest.raises(TaskNotSupported, match="ImmediateBackend"):
            with task_group(backend="other"):
                raise AssertionError("the block ran")
