"""`LivePushBackend`: Django's Tasks framework on livepush's job runtime (docs/frameworks.md, Django).

    TASKS = {"default": {"BACKEND": "livepush.contrib.django.LivePushBackend",
                         "QUEUES": ["default", "emails"],
                         "OPTIONS": {"DATABASE_URL": None, "DATABASE": "default",
                                     "ENQUEUE_ON_COMMIT": True, "MAX_ATTEMPTS": 1}}}

A task is enqueued as one livepush job, `livepush.contrib.django.run_task` with the task's module
path, args and kwargs, on the task's queue; `run_after` is its run time; its priority is negated
(Django runs higher numbers first, livepush lower ones, and both are whole numbers, so the order is
kept exactly). Inside `transaction.atomic()` on the Django database that holds livepush's tables,
the job is written in that transaction: it exists, and runs, if and only if the transaction commits.
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils import timezone
from django.utils.module_loading import import_string

from ...types import shown
from ... import jobs
from ...errors import ConfigError
from ...jobs import database as jobs_database
from ...jobs.api.functions import INT4_MAX
from ...jobs.api.options import check_queue
from ...jobs.errors import InvalidArgumentsError
from ...postgres.identity import IDENTITY
from ...postgres.urls import check_url
from .errors import TaskNotSupported, TransactionNotSupported, arguments_error, refuse_uncallable
from .execution import RUN_TASK, livepush_priority
from .groups import current_group
from .results import job_id_of, result_of
from .tasks_api import (
    BaseTaskBackend,
    Task,
    TaskResult,
    TaskResultStatus,
    set_attr,
    task_enqueued,
)

OPTIONS = frozenset({"DATABASE_URL", "DATABASE", "ENQUEUE_ON_COMMIT", "MAX_ATTEMPTS"})
# The keys of a backend's entry in TASKS that Django's Tasks framework reads.
ENTRY = frozenset({"BACKEND", "QUEUES", "OPTIONS"})

# (Django database alias, jobs' database URL) found to be one database holding livepush's tables.
# For the process, not a backend: Django makes a backend per thread, and under ASGI per request,
# which would otherwise pay the check's two reads on every request that enqueues.
_JOINABLE: set[tuple[str, str]] = set()


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """What livepush's enqueue needs of a job (jobs.api.registry.JobSpec): the runner's name with one
    task's queue and priority."""

    name: str
    queue: str
    priority: int
    max_attempts: int


class LivePushBackend(BaseTaskBackend):
    """Runs Django tasks as livepush jobs; results come from the jobs' rows."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        _check_shape(alias, params)
        super().__init__(alias, params)
        unknown = set(self.options) - OPTIONS
        if unknown:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS'] has unknown keys {sorted(unknown)}; "
                                       f"{type(self).__name__} takes {sorted(OPTIONS)}")
        for queue in self.queues:
            try:
                check_queue(queue, f"TASKS[{alias!r}]['QUEUES']")
            except ConfigError as exc:
                raise ImproperlyConfigured(str(exc)) from None
        option = f"TASKS[{alias!r}]['OPTIONS']"
        url = self.options.get("DATABASE_URL")
        _check_url(url, f"{option}['DATABASE_URL']")
        if len(options_database_urls()) > 1:
            # Each backend made would configure its own: the process's enqueues, every backend's,
            # would go to the database of the one made last.
            raise ImproperlyConfigured(
                f"{option}['DATABASE_URL']: the LivePushBackends in TASKS name different DATABASE_URLs, and a "
                "process has one jobs' database (as one runtime serves one): give every LivePushBackend the same "
                "DATABASE_URL, or none for LIVEPUSH_DATABASE_URL's database")
        # The jobs' database of this process (else LIVEPUSH_DATABASE_URL). Django makes a backend
        # per thread, and under ASGI per request: configuring the same URL again would close the
        # pools the process is using and leave each loop's pool open, a connection per request.
        if url and url != jobs_database.configured_url():
            jobs.configure(url)
        # Checked here, where Django's checks make the backend at start: an alias that is not in
        # DATABASES otherwise failed every enqueue with Django's ConnectionDoesNotExist.
        self.database = self.options.get("DATABASE", "default")
        if not isinstance(self.database, str) or self.database not in connections.settings:
            raise ImproperlyConfigured(f"{option}['DATABASE'] must name a database of DATABASES (the one whose "
                                       f"transactions an enqueue joins), got {shown(self.database, width=60)}; it has "
                                       f"{sorted(connections.settings)}")
        on_commit = self.options.get("ENQUEUE_ON_COMMIT", True)
        if not isinstance(on_commit, bool):  # "no" would read as True
            raise ImproperlyConfigured(f"{option}['ENQUEUE_ON_COMMIT'] must be True or False, got {shown(on_commit, width=60)}")
        self.enqueue_on_commit = on_commit
        attempts = self.options.get("MAX_ATTEMPTS", 1)
        # Stored in a Postgres integer: a larger "no limit" failed every enqueue with a DependencyError.
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= INT4_MAX:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']['MAX_ATTEMPTS'] must be a whole number "
                                       f"of attempts, 1 or more and at most {INT4_MAX}, got {shown(attempts, width=60)}")
        self.max_attempts = attempts
        self._specs: dict[tuple[str, int], TaskSpec] = {}
        self._valid: set[tuple[Any, ...]] = set()  # tasks (as validate_task reads them) that passed
        self._lock = threading.Lock()

    def validate_task(self, task: Task) -> None:
        """Django's checks, and livepush's: the runtime must be able to import the task by its path.
        A task without run_after that passed once passes again (its other fields are what the
        checks read, and the backend's queues do not change), so it is not checked again: the
        checks read the function's signature, which cost more than the rest of an enqueue's Python."""
        key = (task.func, task.priority, task.queue_name, task.takes_context)
        if task.run_after is None and key in self._valid:
            return
        super().validate_task(task)
        if not self.queues:
            # An empty QUEUES lets Django accept any name: livepush writes the job on the queue as
            # named, where a runtime's --queues could never name one it refuses.
            try:
                check_queue(task.queue_name, f"task {task.name}'s queue_name")
            except ConfigError as exc:
                raise TaskNotSupported(str(exc)) from None
        if task.func.__module__ == "__main__":
            raise TaskNotSupported(
                f"task {task.name} is defined in __main__, which the job runtime cannot import by its path: "
                "define it in a module of your project (e.g. myapp/tasks.py)")
        if task.run_after is None:
            with self._lock:
                self._valid.add(key)

    def spec(self, task: Task) -> TaskSpec:
        """The job spec of `task`'s queue and priority (one object per pair, made once)."""
        key = (task.queue_name, task.priority)
        found = self._specs.get(key)
        if found is None:
            found = self._specs[key] = TaskSpec(RUN_TASK, task.queue_name, livepush_priority(task.priority),
                                                self.max_attempts)
        return found

    def run_at(self, task: Task) -> datetime | None:
        """`run_after` as an aware datetime: a naive one (USE_TZ = False) is in TIME_ZONE, as Django reads it."""
        when: datetime | None = task.run_after
        if when is not None and timezone.is_naive(when):
            when = timezone.make_aware(when, timezone.get_default_timezone())
        return when

    def transaction_conn(self) -> Any:
        """The psycopg connection whose transaction an enqueue joins now, or None (our own, committed
        at once): the Django database's, while it is inside `transaction.atomic()`."""
        if not self.enqueue_on_commit:
            return None
        connection = connections[self.database]
        if not connection.in_atomic_block:
            return None
        if not self.can_join():
            raise TransactionNotSupported(
                f"a task enqueued inside transaction.atomic() on database {self.database!r} is written in that "
                "transaction, which needs PostgreSQL through psycopg 3 holding livepush's tables; set "
                "OPTIONS['DATABASE'] to such a database, or OPTIONS['ENQUEUE_ON_COMMIT'] = False to enqueue at "
                "once, outside the transaction")
        raw = connection.connection
        if (self.database, jobs_database.database_url()) not in _JOINABLE:
            self._check_tables(raw)
        # Checked for the alias, so for each connection Django makes for it (one a request, without
        # CONN_MAX_AGE): the enqueue's own check of conn= would read the same again on every one.
        jobs_database.known_on_database(raw)
        return raw

    def can_join(self) -> bool:
        """Whether the Django database's engine can hold an enqueue in its transaction: PostgreSQL
        through psycopg 3 (that it holds livepush's tables is known only once connected)."""
        return connections[self.database].vendor == "postgresql" and _is_psycopg3()

    def _check_tables(self, raw: Any) -> None:
        found, started, name = raw.execute(jobs_database.JOINABLE).fetchone()
        if not found:
            # The database's own name: under Django's test runner the alias points at the test
            # database it made, and the alias alone read as the one `livepush migrate` was run on.
            raise TransactionNotSupported(
                f"Django database {self.database!r} (database {name!r}) has no livepush tables, so a task enqueued "
                "inside its transaction cannot be written there: run `livepush migrate` on it (it must be the "
                "database of LIVEPUSH_DATABASE_URL), set OPTIONS['DATABASE'] to the one that has them, or "
                "OPTIONS['ENQUEUE_ON_COMMIT'] = False; a test database Django's test runner made has none: the "
                "tests' settings set OPTIONS['ENQUEUE_ON_COMMIT'] = False")
        # Tables are not enough: a job written in another database that has them too is where no
        # runtime looks for it, and would never run.
        with jobs_database.connection() as own:
            jobs_started, jobs_name = own.execute(IDENTITY).fetchone()  # type: ignore[misc]  # always one row
        if (started, name) != (jobs_started, jobs_name):
            raise TransactionNotSupported(
                f"Django database {self.database!r} (database {name!r}) holds livepush tables but is not the "
                f"jobs' database (database {jobs_name!r}{'' if started == jobs_started else ' on another server'}), "
                "where the runtimes look for jobs: point it and LIVEPUSH_DATABASE_URL (or OPTIONS['DATABASE_URL']) "
                "at the same database, set OPTIONS['DATABASE'] to the Django database that is it, or "
                "OPTIONS['ENQUEUE_ON_COMMIT'] = False")
        _JOINABLE.add((self.database, jobs_database.database_url()))  # a set's add is atomic

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Enqueue `task` as a livepush job (in a task group when inside `task_group()`)."""
        self.validate_task(task)
        try:
            result = TaskResult(task=task, id="", status=TaskResultStatus.READY, enqueued_at=None, started_at=None,
                                finished_at=None, last_attempted_at=None, args=args, kwargs=kwargs,
                                backend=self.alias, errors=[], worker_ids=[])
        except (TypeError, ValueError) as exc:
            raise arguments_error(args, kwargs) or exc from None
        refuse_uncallable(task, result.args, result.kwargs)
        job_args = [task.module_path, result.args, result.kwargs]
        conn = self.transaction_conn()
        group = current_group()
        try:
            if group is not None:
                handle = group.add(self.spec(task), job_args, self.run_at(task), conn)
            else:
                handle = jobs.enqueue_many([(self.spec(task), job_args, {"at": self.run_at(task)})], conn=conn)[0]
        except InvalidArgumentsError as exc:
            # What Django's normalization lets through (NaN, an int key, a NUL) was named by its
            # place in the job that runs the task, args[1][0] for the task's args[0]. Read again
            # only on this failure: the check costs nothing on an enqueue that goes through.
            raise arguments_error(result.args, result.kwargs) or exc from None
        set_attr(result, "id", str(handle.id))
        set_attr(result, "enqueued_at", timezone.now())
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task result `result_id` as the job's row says now; TaskResultDoesNotExist if none."""
        job_id = job_id_of(result_id)
        return result_of(jobs.get_job(job_id), result_id, self.alias)

    async def aget_result(self, result_id: str) -> TaskResult:
        job_id = job_id_of(result_id)
        return result_of(await jobs.aget_job(job_id), result_id, self.alias)


def livepush_backends() -> dict[str, dict[str, Any]]:
    """The entries of TASKS whose backend is a LivePushBackend, by alias."""
    found: dict[str, dict[str, Any]] = {}
    tasks = getattr(settings, "TASKS", None) or {}
    # Read at Django's start (the app's ready()), before the framework reads it: a shape it cannot
    # be failed there with an AttributeError from here, which named no setting.
    if not isinstance(tasks, dict) or not all(isinstance(params, dict) for params in tasks.values()):
        got = f"{shown(tasks, width=80)}" if isinstance(tasks, dict) else f"a {type(tasks).__name__}"
        raise ImproperlyConfigured("TASKS must be a dict of aliases to dicts, such as {'default': {'BACKEND': "
                                   f"'livepush.contrib.django.LivePushBackend'}}}}, got {got}")
    for alias, params in tasks.items():
        backend = params.get("BACKEND")
        try:
            kind = import_string(backend) if isinstance(backend, str) else backend
        except ImportError:
            continue  # another backend, not installed where the runtime runs: none of its tasks come here
        if isinstance(kind, type) and issubclass(kind, LivePushBackend):
            found[alias] = params
    return found


def options_database_urls() -> set[str]:
    """The jobs' database URLs the LivePushBackends in TASKS name in OPTIONS['DATABASE_URL'] (a
    value that is not a URL's text is left to the backend's own check, which names it)."""
    urls: set[str] = set()
    for params in livepush_backends().values():
        options = params.get("OPTIONS")
        url = options.get("DATABASE_URL") if isinstance(options, dict) else None
        if isinstance(url, str):
            urls.add(url)
    return urls


def use_options_database() -> None:
    """Make the URL the backends' OPTIONS name the jobs' database of this process now, at Django's
    start (the app's ready()), rather than when the first backend is made: Django makes one when a
    module defining a @task is imported or a task is enqueued, and until then the process's own
    jobs (`@jobs.job`, `jobs.get_job()`) went to LIVEPUSH_DATABASE_URL's database, where no runtime
    of the runner looks. A URL the backend cannot use, or backends naming two, are left to the
    checks and to the backend when it is made, which name the option."""
    urls = options_database_urls()
    if len(urls) != 1:
        return
    url = urls.pop()
    try:
        _check_url(url, "OPTIONS['DATABASE_URL']")
    except ImproperlyConfigured:
        return
    if url != jobs_database.configured_url():
        jobs.configure(url)


def _check_shape(alias: str, params: dict[str, Any]) -> None:
    """ImproperlyConfigured naming a key that is none of BACKEND, QUEUES and OPTIONS, or QUEUES or
    OPTIONS when they are not a list of names and a dict.
    Checked before the framework reads them: it takes set() of QUEUES, so "emails" became a queue
    per letter, which no task is on and which the runner would serve, and a None or a list of
    OPTIONS failed with a TypeError or AttributeError that named no setting."""
    unknown = sorted(set(params) - ENTRY, key=str)
    if unknown:
        # Read by nothing: a misspelt QUEUES left the default queue alone, a misspelt OPTIONS (or an
        # option written beside it) one attempt per task, without a word.
        moved = [key for key in unknown if key in OPTIONS]
        where = (f"; {', '.join(moved)} {'is an option' if len(moved) == 1 else 'are options'}: write "
                 + ", ".join(f"TASKS[{alias!r}]['OPTIONS'][{key!r}]" for key in moved)) if moved else ""
        raise ImproperlyConfigured(f"TASKS[{alias!r}] has unknown keys {unknown}: a LivePushBackend's entry takes "
                                   f"{sorted(ENTRY)}{where}")
    queues = params.get("QUEUES", [])
    if isinstance(queues, str) or not isinstance(queues, (list, tuple, set, frozenset)):
        raise ImproperlyConfigured(f"TASKS[{alias!r}]['QUEUES'] must be a list of queue names such as "
                                   f"['default', 'emails'], got {shown(queues, width=60)}")
    options = params.get("OPTIONS", {})
    if not isinstance(options, dict):
        raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS'] must be a dict such as {{'MAX_ATTEMPTS': 3}} "
                                   f"(or left out), got {type(options).__name__}")


def _check_url(url: object, option: str) -> None:
    """ImproperlyConfigured naming `option` (and no part of the URL: it may hold a password) unless
    `url` is None or a Postgres URL."""
    if url is None:
        return
    if not isinstance(url, str) or not url.strip():
        raise ImproperlyConfigured(f"{option} must be a Postgres URL such as postgresql://user@localhost/app, "
                                   f"or None for LIVEPUSH_DATABASE_URL's database; got a {type(url).__name__}")
    try:
        check_url(url, option)
    except ConfigError as exc:
        raise ImproperlyConfigured(str(exc)) from None


def _is_psycopg3() -> bool:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)
