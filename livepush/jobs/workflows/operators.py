"""What an operator calls on workflow runs (`jobs.workflows.*`): pause, resume, cancel, skip,
signal, each recording actor, reason and time on the run's audit trail; get and list.

A verb is decided under the run's lock (engine.operator) and committed, with the jobs it must stop
(a cancelled run's active steps', a skipped step's) stopped in that transaction when their rows
are free (SKIP LOCKED: a verb never waits for a job row after the run's, queries.py: the lock
order); they are cancelled again afterwards, each in its own transaction, which reaches a job the
verb skipped and what a parked one waits for.
"""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row

from ...types import shown
from ...blocking import warn_if_on_event_loop
from .. import database
from .. import queries as job_queries
from ..api.awaited import awaited
from ..api.args import encode, stored_whole
from ..api.control import acancel, cancel
from ..groups.cancel import acancel_children, cancel_children
from ..api.handles import NO_SUCH_ID, checked_cursor, checked_id, page_of
from ...postgres.text import BIGINT_MAX, unstorable
from ..durable.run import check_name
from ..api.options import check_key as check_start_key
from ..durable.signals import check_key, sent_name_check
from ..durable import queries as dq
from ..errors import InvalidArgumentsError, WorkflowNotFound
from ..events.views import workflow_view
from ..groups import steps
from ..groups.transactions import ain_tx, in_tx
from . import engine
from . import queries as wq
from ...errors import ArgumentTypeError, ArgumentValueError, LivepushError

def _run_id(value: Any) -> int:
    """`value` as a run id; an int no run can have is WorkflowNotFound named as given (checked_id
    reads it as the stand-in NO_SUCH_ID, which the message must not show instead)."""
    run_id = checked_id(value, "run_id")
    if run_id == NO_SUCH_ID:
        raise WorkflowNotFound(f"no workflow run {shown(value)} (never started, or deleted after its retention time)")
    return run_id


def _text(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{what} must be a str or None, got {type(value).__name__}")
    bad = unstorable(value)
    if bad:
        raise ArgumentValueError(f"{what} contains {bad}, which Postgres cannot store")
    return value[:1000]


def _verb_steps(run_id: int, verb: str, step: str | None, actor: str | None, reason: str | None
                ) -> steps.Steps[tuple[bool, list[int]]]:
    try:
        applied, to_cancel, run = yield from engine.operator(run_id, verb, step, actor, reason)
    except KeyError:
        raise ArgumentValueError(f"workflow run {run_id} has no step {step!r}") from None
    if run is None:
        raise WorkflowNotFound(f"no workflow run {shown(run_id)} (never started, or deleted after its retention time)")
    return applied, to_cancel


def _verb(run_id: Any, verb: str, step: str | None, actor: Any, reason: Any) -> bool:
    run_id = _run_id(run_id)
    actor, reason = _text(actor, "actor"), _text(reason, "reason")
    applied, to_cancel = in_tx(lambda: _verb_steps(run_id, verb, step, actor, reason), None)
    for job_id in to_cancel:
        if not cancel(job_id):
            # Stopped by the verb's own transaction (engine.Plan._stop): the batch it waited for,
            # if any, is cancelled now rather than at a runtime's next heartbeat.
            cancel_children([job_id])
    return applied


async def _averb(run_id: Any, verb: str, step: str | None, actor: Any, reason: Any) -> bool:
    run_id = _run_id(run_id)
    actor, reason = _text(actor, "actor"), _text(reason, "reason")
    applied, to_cancel = await ain_tx(lambda: _verb_steps(run_id, verb, step, actor, reason), None)
    for job_id in to_cancel:
        if not await acancel(job_id):
            await acancel_children([job_id])
    return applied


def pause(run_id: int, *, actor: str | None = None, reason: str | None = None) -> bool:
    """Pause a running run: steps running now finish, nothing new starts until resume(). False if it
    was not running."""
    warn_if_on_event_loop("jobs.workflows.pause()", "jobs.workflows.apause()")
    return _verb(run_id, "pause", None, actor, reason)


def resume(run_id: int, *, actor: str | None = None, reason: str | None = None) -> bool:
    """Resume a paused run: ready steps start (a step paused by its batch's failures runs again,
    with only the members of its batch that failed or were cancelled). False if it was not paused."""
    warn_if_on_event_loop("jobs.workflows.resume()", "jobs.workflows.aresume()")
    return _verb(run_id, "resume", None, actor, reason)


def cancel_run(run_id: int, *, actor: str | None = None, reason: str | None = None) -> bool:
    """Cancel a run: its running steps' jobs are cancelled, nothing more starts. False if it had
    finished."""
    warn_if_on_event_loop("jobs.workflows.cancel()", "jobs.workflows.acancel()")
    return _verb(run_id, "cancel", None, actor, reason)


def skip(run_id: int, step: str, *, actor: str | None = None, reason: str | None = None) -> bool:
    """Skip a step that has not finished (its job, if running, is cancelled): what comes after it
    runs as if it had succeeded. False if it had finished."""
    warn_if_on_event_loop("jobs.workflows.skip()", "jobs.workflows.askip()")
    return _verb(run_id, "skip", check_name(step, "skip()"), actor, reason)


@awaited("jobs.workflows.apause()")
async def apause(run_id: int, *, actor: str | None = None, reason: str | None = None) -> bool:
    """jobs.workflows.pause() for async code."""
    return await _averb(run_id, "pause", None, actor, reason)


@awaited("jobs.workflows.aresume()")
async def aresume(run_id: int, *, actor: str | None = None, reason: str | None = None) -> bool:
    """jobs.workflows.resume() for async code."""
    return await _averb(run_id, "resume", None, actor, reason)


@awaited("jobs.workflows.acancel()")
async def acancel_run(run_id: int, *, actor: str | None = None, reason: str | None = None) -> bool:
    """jobs.workflows.cancel() for async code."""
    return await _averb(run_id, "cancel", None, actor, reason)


@awaited("jobs.workflows.askip()")
async def askip(run_id: int, step: str, *, actor: str | None = None, reason: str | None = None) -> bool:
    """jobs.workflows.skip() for async code."""
    return await _averb(run_id, "skip", check_name(step, "skip()"), actor, reason)


# -- signals ----------------------------------------------------------------------------------------

def _target(run_id: int, name: str, lock: bool) -> steps.Steps[dict[str, Any]]:
    """The first unfinished step of the run that still waits for signal `name` (its row): not one
    whose job got one already, nor a step not started that the run keeps one for."""
    runs = yield steps.Query(wq.LOCK_RUN_FOR_SIGNAL if lock else wq.RUN_OF, {"id": run_id})
    if not runs:
        raise WorkflowNotFound(f"no workflow run {shown(run_id)} (never started, or deleted after its retention time)")
    run = runs[0]
    if run["state"] in engine.RUN_FINISHED:
        raise ArgumentValueError(f"workflow run {run_id} has {run['state']}: it takes no more signals")
    rows = yield steps.Query(wq.STEPS_OF, {"ids": [run_id]})
    by_name = {r["name"]: r for r in rows}
    graph = run["graph"]
    for n in graph["order"]:
        step = by_name[n]
        if graph["steps"][n].get("wait_for") != name or step["state"] in engine.STEP_FINISHED:
            continue
        if step["state"] in engine.STEP_ACTIVE and step["job_id"] is not None:
            if (yield steps.Query(dq.AWAITS_SIGNAL, {"id": step["job_id"], "name": name}))[0]["waits"]:
                return step
            continue
        if (yield steps.Query(wq.KEPT_SIGNALS, {"id": run_id, "step": n, "name": name}))[0]["n"] == 0:
            return step
    raise ArgumentValueError(f"no step of workflow run {run_id} waits for signal {name!r} (any more)")


def _to_job(run_id: int, step: dict[str, Any], name: str, data: str) -> steps.Steps[bool]:
    """Send the signal to the step's job if the step is active and its job has not finished nor
    got its signal."""
    if step["state"] not in engine.STEP_ACTIVE or step["job_id"] is None:
        return False
    target = {"id": step["job_id"], "name": name}
    found = yield steps.Query(dq.SIGNAL_TARGET_AWAITING, target)
    if not found or found[0]["state"] in engine.STEP_FINISHED:
        return False  # it ended meanwhile
    if not found[0]["waits"]:
        return False  # it got one meanwhile (or timed out): the next look finds the step after it
    # The job's key-share lock lets another signal to it through, whose send the look above could
    # not see: both went to this job, which takes one, and the other lay unread. So signals to a
    # run take its row one at a time, after sending (the lock order: the job's row, woken by the
    # send, before the run's), and look again in a later statement, which sees a signal that the
    # one before committed, or a verb that ended the step: then this send is taken back.
    yield steps.Query(wq.SIGNAL_SAVEPOINT, {})
    (sent,) = yield steps.Query(dq.SEND_SIGNAL, {**target, "data": data, "key": None})
    yield steps.Query(wq.LOCK_RUN_FOR_SIGNAL, {"id": run_id})
    # Under the run's lock no decision runs: a step skipped or stopped meanwhile is seen here, and
    # the signal goes to the next step instead of to a job that no longer runs its step.
    runs = yield steps.Query(wq.STEP_RUNS_JOB, {"id": run_id, "name": step["name"], "job_id": step["job_id"]})
    (alone,) = yield steps.Query(dq.AWAITS_ONLY_SIGNAL, {**target, "signal_id": sent["signal_id"]})
    delivered = bool(runs) and bool(alone["waits"])
    if not delivered:
        yield steps.Query(wq.SIGNAL_UNDO, {})
    if not runs:
        # Its step ended without it while this send held the job's row: the send's wake-up (an
        # update of the row) makes that decision's stop pass the job over (it cannot wait for a job
        # row after the run's), and nothing else stops a parked job, which would wait for ever.
        # This transaction holds the row, so it stops the job (a job the decision stopped, which
        # only this send's key-share lock held, is no longer active and is left as it is).
        yield steps.Query(job_queries.STOP_JOBS, {"ids": [step["job_id"]]})
    yield steps.Query(wq.SIGNAL_RELEASE, {})
    return delivered


def _signal_steps(run_id: int, name: str, data: str, actor: str | None,
                  key: str | None = None) -> steps.Steps[LivepushError | None]:
    """One transaction: the signal reaches the first unfinished step that waits for it, and the
    audit trail says so (both, or neither). To the step's job when it is active (its row locked
    first, as jobs.signal does: the lock order is job rows before the run's; then the run's row,
    which signals to a run take one at a time: _to_job); otherwise, under that lock on the run (no
    decision meanwhile, so no job of that step starts meanwhile), the run keeps it for the step's
    next job, which takes it over when it is created. A job created between the two looks is
    locked after the run, against the order: a deadlock with that job parking is possible, and the
    transaction runs again (workflows/queries.py says so).
    A refusal is returned, for the caller to raise once the transaction committed: a job that the
    signal found parked in a step that ended without it was stopped in it (_to_job), and stays so.
    With a `key` already sent to the run, nothing is sent (CLAIM_SIGNAL_KEY)."""
    if key is not None and not (yield steps.Query(wq.CLAIM_SIGNAL_KEY, {"id": run_id, "key": key, "name": name})):
        # Sent before: this is a retry of that send, unless the key was another signal's.
        (sent,) = yield steps.Query(wq.KEYED_RUN_SIGNAL, {"id": run_id, "key": key})
        try:
            sent_name_check(sent["name"], f"workflow run {run_id}", name, key)
        except ArgumentValueError as refusal:
            return refusal
        return None
    try:
        step = yield from _target(run_id, name, lock=False)
        if not (yield from _to_job(run_id, step, name, data)):
            step = yield from _kept_or_sent(run_id, name, data)
    except (ArgumentValueError, WorkflowNotFound) as refusal:
        if key is not None:
            yield steps.Query(wq.DROP_SIGNAL_KEY, {"id": run_id, "key": key})
        return refusal
    yield steps.Query(wq.AUDIT, {"id": run_id, "verb": "signal", "step": step["name"], "actor": actor,
                                 "reason": name})
    return None


def _kept_or_sent(run_id: int, name: str, data: str) -> steps.Steps[dict[str, Any]]:
    """Under the run's lock: the signal sent to the job of the first step that waits for it, or
    kept for that step; returns that step."""
    while True:
        step = yield from _target(run_id, name, lock=True)
        if (yield from _to_job(run_id, step, name, data)):
            return step
        if step["state"] in engine.STEP_ACTIVE and step["job_id"] is not None:
            # Its job stopped waiting between the look and the send (a signal of its own, a
            # timeout): kept for the step, this signal would lie unread, since only a step's
            # next job takes a kept one. The next look passes it.
            continue
        if (yield steps.Query(wq.KEEP_SIGNAL, {"id": run_id, "step": step["name"], "name": name, "data": data})):
            return step
        # A signal sent at the same time was kept for this step first: the next look (which
        # sees it) finds the step after it, or refuses. Each turn passes a step: bounded.


def signal(run_id: int, name: str, data: Any = None, *, actor: str | None = None, key: str | None = None) -> None:
    """Send signal `name` to the run: the first unfinished step with `wait_for=name` gets it (now,
    or when it starts). Raises ValueError when no step waits for it, WorkflowNotFound for no run.
    `key=`: a send of a key already sent to this run sends nothing (a retry after a lost reply)."""
    warn_if_on_event_loop("jobs.workflows.signal()", "jobs.workflows.asignal()")
    run_id, name = _run_id(run_id), check_name(name, "signal()")
    text, actor = encode(data, "data", InvalidArgumentsError, "signal data"), _text(actor, "actor")
    key = check_key(key, "jobs.workflows.signal(key=)")
    with stored_whole("data"):
        refusal = in_tx(lambda: _signal_steps(run_id, name, text, actor, key), None)
    if refusal is not None:
        raise refusal


@awaited("jobs.workflows.asignal()")
async def asignal_run(run_id: int, name: str, data: Any = None, *, actor: str | None = None,
                      key: str | None = None) -> None:
    """jobs.workflows.signal() for async code."""
    run_id, name = _run_id(run_id), check_name(name, "signal()")
    text, actor = encode(data, "data", InvalidArgumentsError, "signal data"), _text(actor, "actor")
    key = check_key(key, "jobs.workflows.signal(key=)")
    with stored_whole("data"):
        refusal = await ain_tx(lambda: _signal_steps(run_id, name, text, actor, key), None)
    if refusal is not None:
        raise refusal


# -- reads ----------------------------------------------------------------------------------------

def _run(row: dict[str, Any], outputs: list[dict[str, Any]], audit: list[dict[str, Any]]) -> dict[str, Any]:
    view = workflow_view(row)
    output_of = {r["name"]: r["output"] for r in outputs}
    # In the view's order (the definition's), not the stored object's: jsonb orders keys by length.
    view["steps"] = {name: {k: output_of.get(name) if k == "output" else row["steps"][name].get(k)
                            for k in ("state", "attempt", "group", "batch", "output", "error", "job")}
                     for name in view["steps"]}
    return {**view, "key": row["key"], "input": row["input"], "output": row["output"], "error": row["error"],
            "created_at": row["created_at"], "finished_at": row["finished_at"], "audit": audit}


def get(run_id: int) -> dict[str, Any] | None:
    """A run: id, name, state, key (flow.start(key=), else None), input, output, error, steps (state,
    attempt, group, output, error, job) and its audit trail (verb, step, actor, reason, at), oldest
    first; None for no such run."""
    warn_if_on_event_loop("jobs.workflows.get()", "jobs.workflows.aget()")
    run_id = checked_id(run_id, "run_id")
    with database.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        cur.execute(wq.RUN_SNAPSHOT)
        cur.execute(wq.RUN_VIEWS, {"ids": [run_id]})
        row = cur.fetchone()
        if row is None:
            return None
        cur.execute(wq.STEP_OUTPUTS, {"id": run_id})
        outputs = cur.fetchall()
        cur.execute(wq.AUDIT_OF, {"id": run_id})
        return _run(row, outputs, cur.fetchall())


async def aget(run_id: int) -> dict[str, Any] | None:
    """jobs.workflows.get() for async code."""
    run_id = checked_id(run_id, "run_id")
    async with database.aconnection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(wq.RUN_SNAPSHOT)
        await cur.execute(wq.RUN_VIEWS, {"ids": [run_id]})
        row = await cur.fetchone()
        if row is None:
            return None
        await cur.execute(wq.STEP_OUTPUTS, {"id": run_id})
        outputs = await cur.fetchall()
        await cur.execute(wq.AUDIT_OF, {"id": run_id})
        return _run(row, outputs, await cur.fetchall())


def list_runs(name: str | None = None, state: str | None = None, *, before: int | None = None,
              limit: int = 100, key: str | None = None) -> tuple[list[dict[str, Any]], int | None]:
    """Runs newest first (id, name, state, created_at, finished_at, key), by name, state and the
    key they were started with (flow.start(key=)) if given: (page, cursor for the next page or None)."""
    warn_if_on_event_loop("jobs.workflows.list()", "jobs.workflows.alist()")
    statement, params = _list_params(name, state, before, limit, key)
    with database.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        cur.execute(statement, params, prepare=False)  # planned for its values: see wq.LIST_RUNS
        return page_of(cur.fetchall(), limit, "id")


async def alist_runs(name: str | None = None, state: str | None = None, *, before: int | None = None,
                     limit: int = 100, key: str | None = None) -> tuple[list[dict[str, Any]], int | None]:
    """jobs.workflows.list() for async code."""
    statement, params = _list_params(name, state, before, limit, key)
    async with database.aconnection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(statement, params, prepare=False)  # planned for its values: see wq.LIST_RUNS
        return page_of(await cur.fetchall(), limit, "id")


def _list_params(name: Any, state: Any, before: Any, limit: Any, key: Any) -> tuple[str, dict[str, Any]]:
    """The statement list() runs and its parameters, each checked. A key as flow.start(key=) takes
    it (InvalidArgumentsError otherwise): a key no start could take finds no run, whatever was meant."""
    key = check_start_key(key)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise ArgumentValueError(f"limit= takes an int from 1 to 1000, got {shown(limit)}")
    if name is not None:
        name = _text(name, "name")
    if state is not None and state not in engine.RUN_STATES:
        raise ArgumentValueError(f"state= takes one of {engine.RUN_STATES} or None, got {shown(state, width=60)}")
    cursor = checked_cursor(before, "before") if before is not None else BIGINT_MAX
    params = {"name": name, "state": state, "before": cursor, "limit": limit, "key": key}
    return (wq.LIST_RUNS if key is None else wq.LIST_KEYED_RUNS), params
