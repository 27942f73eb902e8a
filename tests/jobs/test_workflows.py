"""Workflows (docs/workflows.md): graphs checked at import; steps that run once when what they come
after succeeded; flow and operator verbs with an audit trail; signal waits; fan-out steps parked
on a batch; the workflow:<id> state topic."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from livepush import jobs
from livepush.errors import ArgumentTypeError
from livepush.jobs import queries as job_queries
from livepush.jobs.api.registry import REGISTRY
from livepush.jobs.groups import building
from livepush.jobs.groups.transactions import in_tx
from livepush.jobs.workflows import engine
from livepush.jobs.workflows.definition import WORKFLOWS
from livepush.jobs.workflows.runner import Batch
from tests.jobs import durable_jobs as dj
from tests.jobs import workflow_defs as wd
from tests.jobs.conftest import over_jsonb, q, read_states
from tests.jobs.conftest import running as runtime_running
from tests.support.waiting import async_wait_for


@pytest.fixture
def flows_db(jobs_db: str) -> Iterator[str]:
    q(jobs_db, dj.BODIES_TABLE)
    yield jobs_db


def running(**options: Any) -> Any:
    options.setdefault("queues", ["flows"])
    options.setdefault("poll_interval", 0.2)
    return runtime_running(**options)


async def run_state(run_id: int, want: str | set[str], timeout: float = 15.0) -> dict[str, Any]:
    wanted = {want} if isinstance(want, str) else want

    async def check() -> dict[str, Any] | None:
        got = await asyncio.to_thread(jobs.workflows.get, run_id)
        return got if got is not None and got["state"] in wanted else None

    return await async_wait_for(check, timeout, message=f"workflow run {run_id} to be {wanted}")


def step_states(run: dict[str, Any]) -> dict[str, str]:
    return {name: s["state"] for name, s in run["steps"].items()}


# -- definitions -----------------------------------------------------------------------------------

def test_a_step_after_an_unknown_step_is_refused_at_import() -> None:
    """A step may only come after steps defined above it: an unknown name is caught at once."""
    flow = jobs.workflow("t_bad_after")
    with pytest.raises(jobs.WorkflowDefinitionError, match="'b' comes after 'a', which is not a step defined above"):
        @flow.step(after=["a"])
        async def b(ctx: Any) -> None: ...


def test_a_cycle_cannot_be_written() -> None:
    """A step cannot come after itself (nor, so, after anything that comes after it)."""
    flow = jobs.workflow("t_cycle")
    with pytest.raises(jobs.WorkflowDefinitionError, match="'loop' comes after 'loop'"):
        @flow.step(after=["loop"])
        async def loop(ctx: Any) -> None: ...


def test_a_fan_out_step_with_a_signal_wait_is_refused() -> None:
    """A fan-out step takes no signal wait: the error names the step."""
    flow = jobs.workflow("t_fan_wait")
    with pytest.raises(jobs.WorkflowDefinitionError, match="fan-out step 'spread' cannot wait for a signal"):
        @flow.fan_out(wait_for="go")
        def spread(ctx: Any, batch: Any) -> None: ...


def test_a_workflow_and_step_name_that_make_a_taken_job_name_are_refused() -> None:
    """Workflow and step names may hold dots, so workflow "a.b" step "c" and workflow "a" step
    "b.c" make one job name, "a.b.c": the later definition silently ran its steps for the other's
    runs. Refused at import, naming both; so is a step whose job name a plain job holds."""
    dotted = jobs.workflow("t_dots.load")

    @dotted.step()
    async def rows(ctx: Any) -> str:
        return "t_dots.load / rows"

    plain = jobs.workflow("t_dots")
    with pytest.raises(jobs.WorkflowDefinitionError,
                       match=r"job name 't_dots\.load\.rows' of step 'load\.rows' of workflow 't_dots' .* is taken "
                             r"by step 'rows' of workflow 't_dots\.load'"):
        @plain.step(name="load.rows")
        async def other(ctx: Any) -> str:
            return "t_dots / load.rows"

    @jobs.job(name="t_dots.fetch")
    async def fetch(ctx: Any) -> None: ...

    with pytest.raises(jobs.WorkflowDefinitionError, match=r"job name 't_dots\.fetch' .* is taken by function"):
        @plain.step(name="fetch")
        async def fetch_step(ctx: Any) -> None: ...
    assert list(plain.steps) == []


def test_a_step_decorator_without_parentheses_defines_the_step() -> None:
    """`@flow.step` and `@flow.fan_out` without parentheses define the step, as `@jobs.job` does
    without them: the decorator got the function as `after=` and defined nothing, so a run skipped
    the step without a word and the module's name for the function was the decorator's."""
    flow = jobs.workflow("t_bare")

    @flow.step
    async def fetch(ctx: Any) -> str:
        return "fetched"

    @flow.fan_out
    def spread(ctx: Any, batch: Any) -> None: ...

    @flow.step(after=["fetch", "spread"])
    async def report(ctx: Any) -> None: ...

    assert list(flow.steps) == ["fetch", "spread", "report"]
    assert [flow.steps[n].kind for n in flow.steps] == ["step", "fan_out", "step"]
    assert fetch.__name__ == "fetch" and flow.steps["fetch"].fn is fetch and flow.steps["spread"].fn is spread
    assert REGISTRY.get("t_bare.fetch").queue == "default"
    with pytest.raises(jobs.WorkflowDefinitionError, match="step 'late' after= takes the names of steps, got <function"):
        @flow.step(after=fetch)  # a step's function, not its name
        async def late(ctx: Any) -> None: ...


def test_a_step_that_is_not_a_plain_function_is_refused_at_import() -> None:
    """A step is a plain function of ctx: a @jobs.job function (whose call gives back a coroutine,
    not an output) or a value that is no function is a WorkflowDefinitionError at import, not a
    step that fails every attempt once it runs."""
    flow = jobs.workflow("t_not_a_function")

    @jobs.job(name="t_not_a_function_job")
    async def fetch(ctx: Any) -> int:
        return 1

    with pytest.raises(jobs.WorkflowDefinitionError, match="step 'fetch' is a @jobs.job function"):
        flow.step()(fetch)
    with pytest.raises(jobs.WorkflowDefinitionError, match="a step is a function of ctx, got int 5"):
        flow.step(name="five")(5)
    assert flow.steps == {}


def test_a_generator_function_is_refused_as_a_step_at_import() -> None:
    """A step returns its output: a generator function (sync or async, or an object whose
    __call__ is one) gives back a generator that is no output, so it is a WorkflowDefinitionError
    at import naming the step, not a step whose every run fails with a result that is not JSON."""
    flow = jobs.workflow("t_generator_steps")
    with pytest.raises(jobs.WorkflowDefinitionError, match="step 'rows' is a generator function"):
        @flow.step
        def rows(ctx: Any) -> Any:
            yield 1
    with pytest.raises(jobs.WorkflowDefinitionError, match="step 'stream' is a generator function"):
        @flow.step()
        async def stream(ctx: Any) -> Any:
            yield 1
    with pytest.raises(jobs.WorkflowDefinitionError, match="step 'spread' is a generator function"):
        @flow.fan_out
        def spread(ctx: Any, batch: Any) -> Any:
            yield batch

    class Yields:
        def __call__(self, ctx: Any) -> Any:
            yield 1

    with pytest.raises(jobs.WorkflowDefinitionError, match="step 'obj' is a generator function"):
        flow.step(name="obj")(Yields())
    assert flow.steps == {}


def test_a_class_is_refused_as_a_step_at_import() -> None:
    """Calling a class builds an instance, no output: `@flow.step` (or `@flow.fan_out`) on one was
    accepted and every run of the step failed on a result that is not JSON. A
    WorkflowDefinitionError at import naming the step and the class and saying to decorate a
    function, as @jobs.job refuses a class, and no step or job defined."""
    flow = jobs.workflow("t_class_steps")
    with pytest.raises(jobs.WorkflowDefinitionError,
                       match=r"step 'Resize' is the class .*Resize: .*decorate a function"):
        @flow.step
        class Resize:
            def __init__(self, ctx: Any) -> None:
                self.ctx = ctx
    with pytest.raises(jobs.WorkflowDefinitionError, match=r"step 'spread' is the class .*Spread: "):
        @flow.fan_out(name="spread")
        class Spread:
            def __init__(self, ctx: Any, batch: Any) -> None:
                self.batch = batch
    assert flow.steps == {}
    assert "t_class_steps.Resize" not in REGISTRY and "t_class_steps.spread" not in REGISTRY


def test_a_step_whose_function_cannot_take_its_call_is_refused_at_import() -> None:
    """A step is called as (ctx), a fan-out step as (ctx, batch): a function that cannot take that
    call (a fan-out's function under @flow.step, or the reverse) is refused at import, naming the
    step, rather than failing every attempt when it runs."""
    flow = jobs.workflow("t_step_arity")
    with pytest.raises(jobs.WorkflowDefinitionError, match=r"step 'rows' is called as \(ctx\),.*@flow.fan_out"):
        @flow.step
        def rows(ctx: Any, batch: Any) -> None: ...
    with pytest.raises(jobs.WorkflowDefinitionError, match=r"step 'fetch' is called as \(ctx, batch\),.*@flow.step"):
        @flow.fan_out
        async def fetch(ctx: Any) -> None: ...
    assert flow.steps == {}

    @flow.step
    def flexible(*args: Any) -> None: ...

    @flow.fan_out(after="flexible")
    def spread(ctx: Any, batch: Any, extra: Any = None) -> None: ...

    assert list(flow.steps) == ["flexible", "spread"]


@pytest.mark.parametrize("name", ["", 5, "two words"])
def test_a_bad_name_option_is_refused_not_replaced_by_the_functions_name(name: Any) -> None:
    """name= given is the step's name, checked as such: an empty or non-str one is a
    WorkflowDefinitionError, not a step silently named after its function."""
    flow = jobs.workflow("t_bad_name_option")
    with pytest.raises(jobs.WorkflowDefinitionError, match=f"a step name is .*got {re.escape(repr(name))}"):
        @flow.step(name=name)
        async def fetch(ctx: Any) -> None: ...
    assert "fetch" not in flow.steps


@pytest.mark.parametrize("after", [[["fetch"]], [{"fetch"}], ["fetch", None]])
def test_after_takes_only_names_of_steps(after: Any) -> None:
    """An after= entry that is not a step's name (a list nested in the list, a set, None) is a
    WorkflowDefinitionError naming the step, not a TypeError from the lookup."""
    flow = jobs.workflow("t_after_types")

    @flow.step
    async def fetch(ctx: Any) -> None: ...

    with pytest.raises(jobs.WorkflowDefinitionError, match=r"step 'late' after= takes the names of steps \(strs\)"):
        @flow.step(after=after)
        async def late(ctx: Any) -> None: ...


@pytest.mark.parametrize("options, message", [
    ({"on_timeout": "explode", "wait_for": "x", "wait_timeout": 5}, "on_timeout='explode'"),
    # Options that mean nothing without another are refused, not silently ignored.
    ({"on_timeout": "skip", "wait_for": "x"}, "on_timeout= says what a timed-out signal wait does"),
    ({"on_timeout": "skip"}, "on_timeout= says what a timed-out signal wait does"),
    ({"on_batch_failure": "fail"}, "on_batch_failure= is for a fan-out step"),
    ({"wait_timeout": 5}, "wait_timeout= takes a positive number of seconds or a timedelta, at most 100 years, with wait_for="),
    # The step's wait could never start: infinity is no JSON, and Postgres' dates end.
    ({"wait_for": "go", "wait_timeout": float("inf")}, "at most 100 years, with wait_for=; got inf"),
    ({"wait_for": "go", "wait_timeout": 1e10}, "at most 100 years, with wait_for=; got 10000000000.0"),
    ({"wait_for": "go", "wait_timeout": float("nan")}, "got nan"),
    ({"colour": "red"}, "unknown options \\['colour'\\]"),
    # A signal name signal() and the step's wait refuse: the step's job failed every attempt and
    # failed the run, or (a NUL, which the stored graph cannot hold) every flow.start() raised
    # a DependencyError, as if Postgres had failed.
    ({"wait_for": "g" * 201}, "wait_for= takes a signal name"),
    ({"wait_for": "go\x00"}, "wait_for= takes a signal name"),
    # The job options, refused as @jobs.job refuses them, and named as the step's.
    ({"max_attempts": 0}, "step 's': .*max_attempts=\\) must be from 1"),
    ({"priority": "high"}, "step 's': .*priority=\\) takes an int"),
    ({"timeout": -1}, "step 's': timeout must be a positive number"),
    ({"never_retry": "ValueError"}, "step 's': .*never_retry=\\) takes a tuple of exception classes"),
    ({"after": 5}, "step 's' after= takes the names of steps, got 5"),
])
def test_bad_step_options_are_refused(options: dict[str, Any], message: str) -> None:
    """Every bad option names itself."""
    flow = jobs.workflow("t_bad_options")
    with pytest.raises(jobs.WorkflowDefinitionError, match=message):
        @flow.step(**options)
        async def s(ctx: Any) -> None: ...


@pytest.mark.parametrize("queue", ["", 7, "imports\x00", "q" * 201])
def test_a_queue_jobs_cannot_take_is_refused_at_import(queue: Any) -> None:
    """A workflow's queue is a queue as @jobs.job takes it: else every start raised the driver's
    error on storing its steps' jobs (a NUL), or the steps sat on a queue that no runtime's
    --queues can name (too long)."""
    with pytest.raises(jobs.WorkflowDefinitionError, match=r"jobs\.workflow\('t_bad_queue', queue=.*a queue is"):
        jobs.workflow("t_bad_queue", queue=queue)
    assert "t_bad_queue" not in WORKFLOWS


def test_jobs_workflows_lists_its_verbs_and_names_a_name_it_lacks() -> None:
    """The operator verbs of jobs.workflows are found where a user looks in a shell (dir(), tab
    completion), and a name it lacks (a mistyped verb) is refused naming the module and the verbs,
    not with a bare AttributeError of the name alone."""
    verbs = {"pause", "resume", "cancel", "skip", "signal", "get", "list",
             "apause", "aresume", "acancel", "askip", "asignal", "aget", "alist"}
    assert verbs <= set(dir(jobs.workflows))
    assert verbs <= set(jobs.workflows.__all__)
    with pytest.raises(AttributeError) as refused:
        jobs.workflows.approve  # noqa: B018 - the lookup is the test
    assert str(refused.value).startswith("module 'livepush.jobs.workflows' has no attribute 'approve'")
    assert "pause, resume, cancel, skip, signal, get, list" in str(refused.value)
    assert not hasattr(jobs.workflows, "approve")


# -- runs ------------------------------------------------------------------------------------------

async def test_a_diamond_runs_each_step_once_and_passes_outputs(flows_db: str) -> None:
    """Steps start when every step they come after succeeded, independent ones side by side, each
    once; outputs reach the steps after them; the run succeeds."""
    async with running(concurrency=4):
        run = await wd.diamond.astart({"n": 4})
        done = await run_state(run.id, "succeeded")
    assert step_states(done) == {"fetch": "succeeded", "left": "succeeded", "right": "succeeded", "join": "succeeded"}
    assert done["steps"]["join"]["output"] == {"sum": 45, "input": {"n": 4}}
    assert done["output"] is None  # only ctx.flow.finish() gives the run an output of its own
    assert q(flows_db, "SELECT count(*) FROM livepush_jobs WHERE workflow_id = %s", (run.id,)) == [(4,)]
    assert q(flows_db, "SELECT count(*) FROM durable_bodies WHERE name = 'fetch'") == [(1,)]
    assert run.topic == f"workflow:{run.id}"


async def test_get_shows_a_run_and_its_audit_trail_as_of_one_moment(flows_db: str) -> None:
    """jobs.workflows.get() reads the run and its audit trail in one snapshot: a pause committed
    between its reads is not on the audit trail of a run it shows running."""
    run = await wd.verbs.astart({})  # no runtime: the run stays running, its first step queued

    def get_waits() -> bool:
        return q(flows_db, "SELECT count(*) FROM pg_locks WHERE NOT granted "
                           "AND relation = 'livepush_workflow_audit'::regclass")[0][0] > 0

    with psycopg.connect(flows_db) as conn:
        # Held until the pause below commits: get() reads the run, then waits at the audit trail.
        conn.execute("LOCK TABLE livepush_workflow_audit IN ACCESS EXCLUSIVE MODE")
        reading = asyncio.ensure_future(asyncio.to_thread(jobs.workflows.get, run.id))
        await async_wait_for(get_waits, 10.0, message="get() to wait for the audit trail")
        assert in_tx(lambda: engine.operator(run.id, "pause", None, "ana", None), conn)[0]
        conn.commit()
    got = await asyncio.wait_for(reading, 10.0)
    assert (got["state"], [a["verb"] for a in got["audit"]]) == ("running", [])
    assert jobs.workflows.get(run.id)["audit"][0]["verb"] == "pause"


async def test_get_shows_the_input_the_run_started_with(flows_db: str) -> None:
    """jobs.workflows.get() shows the run's input, as jobs.get_job() shows a job's arguments: what
    a failed or waiting run was started for, read without a step of its own. It was left out,
    where the docs said get() reads it."""
    run = await wd.verbs.astart({"first": "hold", "file": "s3://bucket/ü.csv", "rows": [1, 2.5]})
    got = await jobs.workflows.aget(run.id)
    assert got is not None and got["input"] == {"first": "hold", "file": "s3://bucket/ü.csv", "rows": [1, 2.5]}
    assert jobs.workflows.get(wd.diamond.start().id)["input"] is None  # type: ignore[index]


async def test_get_lists_the_steps_in_their_definitions_order(flows_db: str) -> None:
    """jobs.workflows.get() lists a run's steps as the workflow defines them, as its topic does
    (the stored object keeps them in another order: jsonb sorts keys by length)."""
    run = await wd.diamond.astart({"n": 1})
    assert list(jobs.workflows.get(run.id)["steps"]) == ["fetch", "left", "right", "join"]


async def test_the_workflow_topic_shows_every_step(flows_db: str) -> None:
    """workflow:<id> reads the run with each step's state, attempt and group, steps in order."""
    async with running():
        run = await wd.diamond.astart({"n": 1})
        await run_state(run.id, "succeeded")
    state = (await asyncio.to_thread(read_states, flows_db, [run.topic]))[run.topic]
    data = json.loads(state.data_json(snapshot=True))
    assert data["event"] == "snapshot"
    assert data["workflow"]["state"] == "succeeded" and list(data["workflow"]["steps"]) == ["fetch", "left", "right",
                                                                                            "join"]
    assert data["workflow"]["steps"]["join"] == {"state": "succeeded", "attempt": 1, "group": None}


async def test_the_workflow_topic_shows_a_run_whose_outputs_are_huge(flows_db: str) -> None:
    """workflow:<id> shows each step's state, not its output: a run whose steps returned outputs
    that together pass what one jsonb value holds (255 MiB) is shown all the same, and a page's
    every version does not read them."""
    async with running():
        run = await wd.diamond.astart({"n": 1})
        await run_state(run.id, "succeeded")
    # Outputs of 100 MB each, as steps may return (written in place here: built by Postgres, they
    # cost the test no Python memory).
    q(flows_db, "UPDATE livepush_workflow_steps SET output = to_jsonb(repeat('x', 100000000)) "
                "WHERE workflow_id = %s AND name IN ('left', 'right', 'join')", (run.id,))
    state = (await asyncio.to_thread(read_states, flows_db, [run.topic]))[run.topic]
    data = json.loads(state.data_json(snapshot=True))
    assert data["workflow"]["state"] == "succeeded"
    assert data["workflow"]["steps"]["join"] == {"state": "succeeded", "attempt": 1, "group": None}


async def test_get_shows_a_run_whose_outputs_are_huge(flows_db: str) -> None:
    """get() gives each step's output whole, also when they together pass what one jsonb value
    holds (255 MiB)."""
    async with running():
        run = await wd.diamond.astart({"n": 1})
        await run_state(run.id, "succeeded")
    q(flows_db, "UPDATE livepush_workflow_steps SET output = to_jsonb(repeat('x', 100000000)) "
                "WHERE workflow_id = %s AND name IN ('left', 'right', 'join')", (run.id,))
    got = await jobs.workflows.aget(run.id)
    assert got is not None and got["state"] == "succeeded"
    assert {name: len(s["output"]) for name, s in got["steps"].items()} == {
        "fetch": 1, "left": 100_000_000, "right": 100_000_000, "join": 100_000_000}


async def test_a_step_reads_outputs_that_together_are_huge(flows_db: str) -> None:
    """ctx.outputs holds each earlier step's output whole, also when they together pass what one
    jsonb value holds (255 MiB): the step after them runs."""
    # Decoding 280 MB holds the runtime's loop for seconds on a busy machine: a heartbeat of a few
    # seconds keeps it from being taken for dead meanwhile, as docs/workflows.md advises.
    async with running(heartbeat=5.0):
        run = await wd.two_outputs.astart()
        await run_state(run.id, "waiting")
        q(flows_db, "UPDATE livepush_workflow_steps SET output = to_jsonb(repeat('x', 140000000)) "
                    "WHERE workflow_id = %s AND name IN ('one', 'two')", (run.id,))
        await jobs.workflows.asignal(run.id, "go")
        done = await run_state(run.id, {"succeeded", "failed"}, timeout=60.0)
    assert done["steps"]["sizes"]["output"] == {"one": 140_000_000, "two": 140_000_000}, done["error"]


async def test_a_value_a_fan_out_step_returns_is_named_in_the_log_not_dropped_silently(
        flows_db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A fan-out step's output is its batch's counts: a value its function returns beside filling
    the batch goes nowhere, so the log says so, naming the run and the step; the batch runs as
    filled. Returning the batch itself is no mistake and says nothing."""
    monkeypatch.setattr(REGISTRY, "_functions", dict(REGISTRY._functions))
    monkeypatch.setitem(WORKFLOWS, "t_fan_returns", None)
    flow = jobs.workflow("t_fan_returns", queue="flows")

    @flow.fan_out(max_attempts=1)
    def spread(ctx: Any, batch: Any) -> Any:
        batch.enqueue(dj.child, "x")
        return {"rows": 1}

    @flow.fan_out(max_attempts=1)
    def spread_again(ctx: Any, batch: Any) -> Any:
        batch.enqueue(dj.child, "y")
        return batch

    run = await flow.astart()
    with caplog.at_level("WARNING", logger="livepush.jobs"):
        async with running(queues=["flows", "default"]):
            done = await run_state(run.id, {"succeeded", "failed"})
    assert done["steps"]["spread"]["output"] == {"total": 1, "succeeded": 1, "failed": 0, "cancelled": 0}
    said = [r.getMessage() for r in caplog.records if "is dropped" in r.getMessage()]
    assert len(said) == 1 and f"run {run.id}, fan-out step 'spread':" in said[0] and "(dict)" in said[0], said


async def test_a_decision_about_a_run_does_not_read_its_input_nor_its_steps_outputs(flows_db: str) -> None:
    """Every decision about a run (an operator verb here; a step's end, in its runtime's completer,
    goes through the same engine) reads the run's state and its steps' states under the run's
    lock, never the run's input nor the steps' outputs: fetched at each decision, outputs of
    megabytes cost seconds and their size in memory, a step's end holding up every outcome its
    runtime was writing. Each statement of the decision is recorded with what it returned."""
    from livepush.jobs.groups import steps as steps_mod
    from livepush.jobs.workflows import operators

    async with running():
        run = await wd.two_outputs.astart()
        await run_state(run.id, "waiting")
    q(flows_db, "UPDATE livepush_workflow_steps SET output = to_jsonb(repeat('x', 1000000)) "
                "WHERE workflow_id = %s AND name IN ('one', 'two')", (run.id,))
    q(flows_db, "UPDATE livepush_workflows SET input = to_jsonb(repeat('x', 1000000)) WHERE id = %s", (run.id,))

    def recorded(made: Any, returned: list[Any]) -> Any:
        query = next(made)
        while True:
            rows = yield query
            returned.append(rows)
            try:
                query = made.send(rows)
            except StopIteration as stop:
                return stop.value

    for verb in ("pause", "resume", "cancel"):
        returned: list[Any] = []
        with psycopg.connect(flows_db) as conn:
            applied, _ = steps_mod.run(conn, recorded(operators._verb_steps(run.id, verb, None, "ana", None), returned))
        assert applied, verb
        fetched = {key for rows in returned for row in rows or () for key in row}
        assert not {"input", "output"} & fetched, (verb, sorted(fetched))
        assert max(len(json.dumps(rows, default=str)) for rows in returned) < 100_000, verb
    done = await jobs.workflows.aget(run.id)
    assert done["state"] == "cancelled"
    assert {name: len(s["output"]) for name, s in done["steps"].items() if s["output"]} == {
        "one": 1_000_000, "two": 1_000_000}


async def test_a_failed_step_fails_the_run(flows_db: str) -> None:
    """A step that fails for good fails the run, and what comes after it never starts."""
    async with running():
        run = await wd.verbs.astart({"first": "fail"})
        done = await run_state(run.id, "failed")
    assert step_states(done) == {"first": "failed", "second": "cancelled"}
    assert "step 'first' failed: ValueError: first fails" in done["error"]


async def test_retrying_the_failed_job_of_a_step_is_refused(flows_db: str) -> None:
    """The job of a step that failed for good ended its run, which does not go on: jobs.retry_failed()
    of it is refused naming the run, and the job keeps its failure. (It returned True, and the
    job, run again, ended cancelled at once without running the step: the run stayed failed and
    the job's error was lost.)"""
    async with running():
        run = await wd.verbs.astart({"first": "fail"})
        done = await run_state(run.id, "failed")
        job_id = done["steps"]["first"]["job"]
        with pytest.raises(ValueError, match=f"job {job_id} ran a step of workflow run {run.id}, which ended"):
            await asyncio.to_thread(jobs.retry_failed, job_id)
    assert q(flows_db, "SELECT j.state, p.error FROM livepush_jobs j JOIN livepush_job_payloads p USING (id) "
                       "WHERE j.id = %s", (job_id,)) == [("failed", "ValueError: first fails")]
    assert jobs.workflows.get(run.id)["state"] == "failed"


async def test_a_rolling_deploy_that_adds_a_step_runs_it_on_the_newer_runtimes(
        flows_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run started by a newer deploy reaches a step the older deploy's runtimes do not define:
    they leave its job to a runtime that defines it (as any job whose function they lack), rather
    than fail the step, and the newer runtime runs it."""
    # This test's definitions go when it ends.
    monkeypatch.setattr(REGISTRY, "_functions", dict(REGISTRY._functions))
    monkeypatch.setitem(WORKFLOWS, "t_redeployed", None)

    def deploy(with_report: bool) -> Any:
        flow = jobs.workflow("t_redeployed", queue="flows")

        @flow.step()
        async def fetch(ctx: Any) -> str:
            return "fetched"

        if with_report:
            @flow.step(after=["fetch"])
            async def report(ctx: Any) -> str:
                return "reported"

        return flow

    @jobs.job(name="t.redeploy_marker", queue="flows")
    async def marker(ctx: Any) -> None:
        return None

    run = await deploy(with_report=True).astart()
    del REGISTRY._functions["t_redeployed.report"]
    deploy(with_report=False)  # the older deploy, whose runtimes are still up
    async with running():
        await async_wait_for(lambda: q(flows_db, "SELECT state FROM livepush_jobs WHERE name = 't_redeployed.report'")
                             == [("available",)], 15.0, message="the run to reach its new step")
        # A job enqueued after the step's job ran: the older runtime's claims went past the step.
        handle = await marker.aenqueue()
        await async_wait_for(lambda: q(flows_db, "SELECT state FROM livepush_jobs WHERE id = %s", (handle.id,)) == [("succeeded",)], 15.0,
                             message="a later job to run")
    assert q(flows_db, "SELECT state, attempt FROM livepush_jobs WHERE name = 't_redeployed.report'") == [("available", 0)]
    deploy(with_report=True)  # the newer deploy's runtime
    async with running():
        done = await run_state(run.id, {"failed", "succeeded"})
    assert step_states(done) == {"fetch": "succeeded", "report": "succeeded"}


async def test_two_workflows_of_one_name_each_run_their_steps(flows_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime runs every step whose function it has, whichever definition of a workflow name
    came last: two modules that each define a workflow "t_twice" (with steps of their own names)
    both start runs that complete. (Each run's steps were left `available` for ever, claimed by
    no runtime, when only the last definition's steps were claimed.)"""
    monkeypatch.setattr(REGISTRY, "_functions", dict(REGISTRY._functions))
    monkeypatch.setitem(WORKFLOWS, "t_twice", None)

    orders = jobs.workflow("t_twice", queue="flows")

    @orders.step()
    async def charge(ctx: Any) -> str:
        return "charged"

    refunds = jobs.workflow("t_twice", queue="flows")

    @refunds.step()
    async def refund(ctx: Any) -> str:
        return "refunded"

    async with running():
        first, second = await orders.astart(), await refunds.astart()
        assert step_states(await run_state(second.id, "succeeded")) == {"refund": "succeeded"}
        assert step_states(await run_state(first.id, "succeeded", timeout=10.0)) == {"charge": "succeeded"}


async def test_a_workflow_defined_after_its_runtime_started_runs_its_steps(
        flows_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A workflow defined in a runtime's process after the runtime started (a module imported
    later) has its steps claimed by that runtime, as a plain job defined late is: its steps' names
    were read only at the start, so its runs stayed `running` with their first step `available`
    for as long as the runtime ran."""
    monkeypatch.setattr(REGISTRY, "_functions", dict(REGISTRY._functions))
    monkeypatch.setitem(WORKFLOWS, "t_late_flow", None)
    async with running(poll_interval=0.05) as rt:
        flow = jobs.workflow("t_late_flow", queue="flows")  # its module imported now

        @flow.step()
        async def fetch(ctx: Any) -> str:
            return "fetched"

        @flow.step(after=["fetch"])
        async def report(ctx: Any) -> str:
            return f"reported {ctx.outputs['fetch']}"

        run = await flow.astart()
        done = await run_state(run.id, {"failed", "succeeded"}, timeout=10.0)
        assert "t_late_flow.fetch" in rt.step_names
    assert step_states(done) == {"fetch": "succeeded", "report": "succeeded"}


@pytest.mark.parametrize("waits_at_start, waits_after_deploy", [(False, True), (True, False)])
async def test_a_deploy_that_changes_a_steps_options_leaves_the_runs_in_flight_as_they_started(
        flows_db: str, monkeypatch: pytest.MonkeyPatch, waits_at_start: bool, waits_after_deploy: bool) -> None:
    """A run follows the graph it started with, the options of its steps included: a deploy that
    adds a signal wait to a step (or drops it) changes what new runs do, not a run already in
    flight. (Otherwise its step waits for a signal that signal() refuses, the run's graph having
    none: for ever; or runs without the signal the run was given for it.)"""
    monkeypatch.setattr(REGISTRY, "_functions", dict(REGISTRY._functions))
    monkeypatch.setitem(WORKFLOWS, "t_options", None)

    def deploy(waits: bool) -> Any:
        flow = jobs.workflow("t_options", queue="flows")

        @flow.step(**({"wait_for": "approval"} if waits else {}))
        async def publish(ctx: Any) -> Any:
            return {"signal": ctx.signal}

        return flow

    run = await deploy(waits_at_start).astart()
    if waits_at_start:
        await jobs.workflows.asignal(run.id, "approval", {"by": "ana"})
    deploy(waits_after_deploy)
    async with running():
        done = await run_state(run.id, {"succeeded", "failed"})
    assert done["steps"]["publish"]["output"] == {"signal": {"by": "ana"} if waits_at_start else None}


@pytest.mark.parametrize("fan_out_at_start", [False, True])
async def test_a_deploy_that_changes_a_steps_kind_fails_the_runs_in_flight_naming_the_step(
        flows_db: str, monkeypatch: pytest.MonkeyPatch, fan_out_at_start: bool) -> None:
    """A run calls a step as the graph it started with says: a deploy that turns a plain step into
    a fan-out step under the same name (or back) fails that step in the runs in flight with a
    WorkflowDefinitionError naming the step and both kinds, and what to do, not with a TypeError
    from the call (or, for a function that takes either call, a step that silently ran the other
    way)."""
    monkeypatch.setattr(REGISTRY, "_functions", dict(REGISTRY._functions))
    monkeypatch.setitem(WORKFLOWS, "t_kinds", None)

    def deploy(fan_out: bool) -> Any:
        flow = jobs.workflow("t_kinds", queue="flows")
        if fan_out:
            @flow.fan_out(max_attempts=1)
            def spread(ctx: Any, batch: Any = None) -> None:
                return None
        else:
            @flow.step(max_attempts=1)
            def spread(ctx: Any, batch: Any = None) -> str:  # noqa: F811 - the other deploy's
                return "plain"

        return flow

    run = await deploy(fan_out_at_start).astart()
    del REGISTRY._functions["t_kinds.spread"]
    deploy(not fan_out_at_start)
    async with running():
        done = await run_state(run.id, {"succeeded", "failed"})
    kinds = ["a plain step", "a fan-out step"]
    started, now = (kinds[1], kinds[0]) if fan_out_at_start else (kinds[0], kinds[1])
    assert done["state"] == "failed"
    assert done["steps"]["spread"]["error"] == (
        f"WorkflowDefinitionError: step 'spread' of workflow run {run.id} is {started} in the graph the run "
        f"started with, and this deploy defines it as {now}: keep the step as it was under its name while "
        "runs may still reach it, and give the changed step a new name")


@pytest.mark.parametrize("verb, run_state_after, steps_after", [
    ("skip", "succeeded", {"first": "skipped", "second": "succeeded"}),
    ("cancel", "cancelled", {"first": "cancelled", "second": "cancelled"}),
    ("finish", "succeeded", {"first": "succeeded", "second": "skipped"}),
])
async def test_flow_verbs_end_the_step_at_once(flows_db: str, verb: str, run_state_after: str,
                                               steps_after: dict[str, str]) -> None:
    """ctx.flow.skip/cancel/finish end the step's body and act on the run; the audit names the step."""
    async with running():
        run = await wd.verbs.astart({"first": verb})
        done = await run_state(run.id, run_state_after)
    assert step_states(done) == steps_after
    assert [(a["verb"], a["step"], a["actor"]) for a in done["audit"]] == [(verb, "first", "step:first")]
    if verb == "finish":
        assert done["output"] == {"early": True}


@pytest.mark.parametrize("verb, steps_after", [
    ("skip", {"first": "skipped", "second": "succeeded"}),
    ("finish", {"first": "succeeded", "second": "skipped"}),
])
async def test_a_flow_verb_in_a_task_group_of_the_step_ends_the_step_as_in_its_body(
        flows_db: str, verb: str, steps_after: dict[str, str]) -> None:
    """A flow verb raised in a task of an asyncio.TaskGroup inside the step ends the step as it does
    in the step's body. (The group wraps it in a BaseExceptionGroup, which failed the attempt
    instead, and the step ran again.)"""
    async with running():
        run = await wd.verbs.astart({"first": f"{verb} in a task"})
        done = await run_state(run.id, {"succeeded", "failed", "cancelled"})
    assert (done["state"], step_states(done)) == ("succeeded", steps_after), done["error"]
    assert [(a["verb"], a["actor"]) for a in done["audit"]] == [(verb, "step:first")]


async def test_a_step_that_pauses_runs_again_on_resume(flows_db: str) -> None:
    """ctx.flow.pause pauses the run; an operator's resume runs the step again from the top."""
    async with running():
        run = await wd.verbs.astart({"first": "pause"})
        paused = await run_state(run.id, "paused")
        assert step_states(paused)["first"] == "pending"
        assert await jobs.workflows.aresume(run.id, actor="ana", reason="looked fine")
        await async_wait_for(lambda: q(flows_db, "SELECT count(*) FROM livepush_jobs WHERE workflow_id = %s",
                                       (run.id,))[0][0] == 2, 10.0, message="the step's second job")
        assert await jobs.workflows.acancel(run.id, actor="ana", reason="enough")
        done = await run_state(run.id, "cancelled")
    assert [(a["verb"], a["actor"]) for a in done["audit"]] == [("pause", "step:first"), ("resume", "ana"),
                                                                ("cancel", "ana")]


@pytest.mark.parametrize("where", ["reattempt", "reattempt in a task"])
async def test_reattempt_runs_the_step_again_later_without_spending_an_attempt(flows_db: str, where: str) -> None:
    """ctx.flow.reattempt(wait=) runs the step again after the wait, on the same attempt: also
    raised in a task of an asyncio.TaskGroup inside the step (which wraps it in a group)."""
    async with running():
        run = await wd.verbs.astart({"first": where})
        done = await run_state(run.id, {"succeeded", "failed"})
    assert done["steps"]["first"]["attempt"] == 1 and done["steps"]["first"]["output"] == "first done", done["error"]


async def test_a_reattempt_with_a_wait_it_cannot_take_fails_the_step_at_once(
        flows_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ctx.flow.reattempt(wait=-1)` is the step's code refusing itself: every attempt would make the
    same call, so the step fails on its first attempt, naming the call, as a durable ctx call given
    what it does not take does, rather than spending its retries."""
    monkeypatch.setattr(REGISTRY, "_functions", dict(REGISTRY._functions))
    monkeypatch.setitem(WORKFLOWS, "t_bad_reattempt", None)
    flow = jobs.workflow("t_bad_reattempt", queue="flows")

    @flow.step(max_attempts=3)
    async def again(ctx: Any) -> None:
        ctx.flow.reattempt(wait=-1)

    async with running():
        run = await flow.astart()
        done = await run_state(run.id, {"succeeded", "failed"})
    step = done["steps"]["again"]
    assert done["state"] == "failed" and step["attempt"] == 1, done
    assert (step["error"] or "").startswith("ArgumentValueError: ctx.flow.reattempt(wait=) takes"), step["error"]


async def test_a_reattempt_refused_in_a_task_of_the_step_fails_the_step_at_once(
        flows_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same refusal from a task of an asyncio.TaskGroup in the step, which wraps it in an
    exception group, still fails the step on its first attempt rather than spending its retries."""
    monkeypatch.setattr(REGISTRY, "_functions", dict(REGISTRY._functions))
    monkeypatch.setitem(WORKFLOWS, "t_bad_reattempt_in_task", None)
    flow = jobs.workflow("t_bad_reattempt_in_task", queue="flows")

    async def reattempt_badly(ctx: Any) -> None:
        ctx.flow.reattempt(wait=-1)

    @flow.step(max_attempts=3)
    async def again(ctx: Any) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(reattempt_badly(ctx))

    async with running():
        run = await flow.astart()
        done = await run_state(run.id, {"succeeded", "failed"})
    step = done["steps"]["again"]
    assert done["state"] == "failed" and step["attempt"] == 1, done
    assert "ctx.flow.reattempt(wait=) takes" in (step["error"] or ""), step["error"]


async def test_a_step_waiting_for_its_next_attempt_shows_running_and_a_parked_one_waiting(
        flows_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`waiting` is a step whose job is parked (its batch, a signal, a durable ctx.sleep); a step
    between two attempts (ctx.flow.reattempt(wait=), a retry's backoff) shows `running`, its job
    `scheduled`, so its run is not `waiting` (docs/workflows.md "Runs and steps"). Once the
    reattempting step is skipped, every active step is parked and the run shows `waiting`."""
    monkeypatch.setattr(REGISTRY, "_functions", dict(REGISTRY._functions))
    monkeypatch.setitem(WORKFLOWS, "t_wait_kinds", None)
    flow = jobs.workflow("t_wait_kinds", queue="flows")

    @flow.step()
    async def napping(ctx: Any) -> None:
        await ctx.sleep("nap", 60)

    @flow.step()
    async def again(ctx: Any) -> None:
        ctx.flow.reattempt(60)

    async with running():
        run = await flow.astart()
        await async_wait_for(lambda: q(flows_db, "SELECT s.name, j.state FROM livepush_workflow_steps s JOIN "
                                                 "livepush_jobs j ON j.id = s.job_id WHERE s.workflow_id = %s "
                                                 "ORDER BY s.name", (run.id,))
                             == [("again", "scheduled"), ("napping", "waiting")], 10.0,
                             message="one step to park and the other to wait for its next attempt")
        found = await jobs.workflows.aget(run.id)
        assert found is not None and found["state"] == "running"
        assert step_states(found) == {"napping": "waiting", "again": "running"}
        assert await jobs.workflows.askip(run.id, "again", actor="ana")
        waiting = await run_state(run.id, "waiting")
        assert step_states(waiting) == {"napping": "waiting", "again": "skipped"}
        assert await jobs.workflows.acancel(run.id)


async def test_operator_pause_holds_what_follows_until_resume(flows_db: str) -> None:
    """Paused while a step runs: it finishes, but the next step waits for resume; each verb is audited."""
    async with running():
        run = await wd.verbs.astart({"first": "hold", "flag": "let-first-go"})
        # Started: its job claimed (a step still queued when its run pauses waits for resume).
        await async_wait_for(lambda: jobs.workflows.get(run.id)["steps"]["first"]["attempt"] == 1, 10.0,
                             message="the first step's job to start")
        assert await jobs.workflows.apause(run.id, actor="ana", reason="bad data")
        assert not await jobs.workflows.apause(run.id, actor="ana")  # already paused
        q(flows_db, "INSERT INTO job_flags VALUES ('let-first-go')")
        await async_wait_for(lambda: step_states(jobs.workflows.get(run.id))["first"] == "succeeded", 10.0)
        assert step_states(jobs.workflows.get(run.id))["second"] == "pending"
        assert await jobs.workflows.aresume(run.id, actor="bo")
        done = await run_state(run.id, "succeeded")
    assert [(a["verb"], a["actor"], a["reason"]) for a in done["audit"]] == [("pause", "ana", "bad data"),
                                                                             ("resume", "bo", None)]


async def test_an_operators_actor_and_reason_are_kept_to_their_first_1000_characters(flows_db: str) -> None:
    """The audit trail keeps the first 1,000 characters of `actor` and `reason`, as documented."""
    run = await wd.diamond.astart({"n": 1})
    assert await jobs.workflows.apause(run.id, actor="a" * 1500, reason="r" * 1001)
    audit = jobs.workflows.get(run.id)["audit"]
    assert [(a["verb"], a["actor"], a["reason"]) for a in audit] == [("pause", "a" * 1000, "r" * 1000)]


async def test_a_step_queued_but_not_started_when_its_run_pauses_starts_on_resume(flows_db: str) -> None:
    """pause: "nothing new starts". A step whose job no runtime had claimed when the run paused has
    not started: it waits for resume, while later jobs on its queue run."""
    run = await wd.diamond.astart({"n": 1})  # no runtime yet: the first step's job is queued
    assert await jobs.workflows.apause(run.id, actor="ana", reason="bad data")

    @jobs.job(name="t.after_pause_marker", queue="flows")
    async def marker(ctx: Any) -> None:
        return None

    async with running():
        # Step jobs are claimed before plain ones: once this later job ran, the step's was passed over.
        handle = await marker.aenqueue()
        await async_wait_for(lambda: q(flows_db, "SELECT state FROM livepush_jobs WHERE id = %s", (handle.id,))
                             == [("succeeded",)], 15.0, message="a job enqueued after the pause to run")
        assert q(flows_db, "SELECT count(*) FROM durable_bodies WHERE name = 'fetch'") == [(0,)]
        assert step_states(jobs.workflows.get(run.id))["left"] == "pending"
        assert await jobs.workflows.aresume(run.id, actor="ana")
        await run_state(run.id, "succeeded")


async def test_a_step_queued_while_its_run_was_paused_starts_at_once_on_resume(flows_db: str) -> None:
    """resume() wakes the runtimes as an enqueue does: a step whose job was queued while its run was
    paused starts within moments on an idle runtime, not at its next poll (30 s here)."""
    run = await wd.diamond.astart({"n": 1})  # no runtime yet: the first step's job is queued
    assert await jobs.workflows.apause(run.id, actor="ana")

    @jobs.job(name="t.before_resume_marker", queue="flows")
    async def marker(ctx: Any) -> None:
        return None

    async with running(poll_interval=30):
        # Once this later job ran, the runtime had passed over the step's job and gone idle.
        handle = await marker.aenqueue()
        await async_wait_for(lambda: q(flows_db, "SELECT state FROM livepush_jobs WHERE id = %s", (handle.id,))
                             == [("succeeded",)], 15.0, message="a job enqueued after the pause to run")
        assert await jobs.workflows.aresume(run.id, actor="ana")
        await run_state(run.id, "succeeded", timeout=10.0)


async def test_a_paused_runs_queued_step_is_no_backlog_of_its_queue_until_the_run_resumes(flows_db: str) -> None:
    """A step's job that its run's pause holds queued (no runtime claims it until resume) is left out
    of its queue's depth and oldest age, in `livepush status` and in /metrics' gauges, which the
    backlog alert reads: a run paused on purpose for an hour is no queue falling behind. Resumed,
    it counts again."""
    from livepush import metrics
    from livepush.jobs.api.status import arefresh_metrics

    async def backlog() -> tuple[tuple[int, float | None], tuple[int, float]]:
        flows = next(s for s in (await jobs.astatus()).queues if s.queue == "flows")
        await arefresh_metrics()
        # A queue no runtime serves and with nothing to claim may be left out: no backlog either way.
        depth, oldest, _, _ = metrics.DATABASE_GAUGES.queues.get("flows", (0, 0.0, 0, False))
        return (flows.depth, flows.oldest_age), (depth, oldest)

    run = await wd.diamond.astart({"n": 1})  # no runtime: the first step's job is queued
    q(flows_db, "UPDATE livepush_jobs SET run_at = now() - interval '1 hour' WHERE workflow_id = %s", (run.id,))
    assert await jobs.workflows.apause(run.id, actor="ana", reason="looking into it")
    assert await backlog() == ((0, None), (0, 0.0))
    assert await jobs.workflows.aresume(run.id, actor="ana")
    (depth, oldest), (gauge_depth, gauge_oldest) = await backlog()
    assert depth == gauge_depth == 1 and oldest is not None and oldest > 3500 and gauge_oldest > 3500


async def test_operator_cancel_stops_the_running_step(flows_db: str) -> None:
    """cancel() cancels the running step's job and every step not started."""
    async with running():
        run = await wd.verbs.astart({"first": "hold", "flag": "never"})
        await async_wait_for(lambda: step_states(jobs.workflows.get(run.id))["first"] == "running", 10.0)
        assert await jobs.workflows.acancel(run.id, actor="ana", reason="wrong file")
        done = await run_state(run.id, "cancelled")
        job_id = done["steps"]["first"]["job"]

        async def job_cancelled() -> bool:
            found = await jobs.aget_job(job_id)
            return found is not None and found.state == "cancelled"

        await async_wait_for(job_cancelled, 10.0, message="the step's job to be cancelled")
    assert step_states(done) == {"first": "cancelled", "second": "cancelled"}
    assert not jobs.workflows.cancel(run.id, actor="ana")


async def test_jobs_cancel_of_a_steps_job_cancels_its_run_naming_the_step(flows_db: str) -> None:
    """jobs.cancel() of the job running a step ends the step cancelled, and with it the run, whose
    error names the step; no operator verb ran, so the audit trail has no line for it."""
    async with running():
        run = await wd.verbs.astart({"first": "hold", "flag": "never"})
        await async_wait_for(lambda: jobs.workflows.get(run.id)["steps"]["first"]["attempt"] == 1, 10.0,
                             message="the first step's job to start")
        assert await jobs.acancel(jobs.workflows.get(run.id)["steps"]["first"]["job"])
        done = await run_state(run.id, "cancelled")
    assert step_states(done) == {"first": "cancelled", "second": "cancelled"}
    assert done["error"] == "step 'first' was cancelled" and done["audit"] == []


async def test_operator_skip_of_a_running_step_goes_on(flows_db: str) -> None:
    """skip() of a running step cancels its job, marks it skipped, and the next step starts."""
    async with running():
        run = await wd.verbs.astart({"first": "hold", "flag": "never"})
        await async_wait_for(lambda: step_states(jobs.workflows.get(run.id))["first"] == "running", 10.0)
        assert await jobs.workflows.askip(run.id, "first", actor="ana", reason="not needed")
        done = await run_state(run.id, "succeeded")
    assert step_states(done) == {"first": "skipped", "second": "succeeded"}
    assert done["steps"]["second"]["output"] == {"after": None}
    with pytest.raises(ValueError, match="has no step 'nope'"):
        jobs.workflows.skip(run.id, "nope", actor="ana")


# -- signals ---------------------------------------------------------------------------------------

async def test_a_step_waits_for_its_signal_even_one_sent_before_it_started(flows_db: str) -> None:
    """A signal sent before its step started is kept for it; the step then runs with ctx.signal."""
    run = await wd.approval.astart()
    await jobs.workflows.asignal(run.id, "approve", {"by": "ana"}, actor="ana")
    async with running():
        done = await run_state(run.id, "succeeded")
    assert done["steps"]["publish"]["output"] == {"approved_by": "ana"}
    assert [(a["verb"], a["step"], a["reason"]) for a in done["audit"]] == [("signal", "publish", "approve")]


async def test_a_waiting_step_shows_waiting_and_a_signal_wakes_it(flows_db: str) -> None:
    """While its step waits for the signal the run shows `waiting`; the signal wakes it."""
    async with running():
        run = await wd.approval.astart()
        waiting = await run_state(run.id, "waiting")
        assert step_states(waiting) == {"prepare": "succeeded", "publish": "waiting"}
        await asyncio.to_thread(jobs.workflows.signal, run.id, "approve", {"by": "bo"})
        done = await run_state(run.id, "succeeded")
    assert done["steps"]["publish"]["output"] == {"approved_by": "bo"}
    with pytest.raises(ValueError, match="has succeeded"):
        jobs.workflows.signal(run.id, "approve", {})


async def test_a_signal_timeout_follows_on_timeout(flows_db: str) -> None:
    """on_timeout="skip": the step is skipped at its timeout and the run goes on."""
    async with running():
        run = await wd.quick_timeout.astart()
        done = await run_state(run.id, "succeeded")
    assert step_states(done) == {"maybe": "skipped", "after_maybe": "succeeded"}


async def test_two_steps_waiting_for_one_name_each_get_one_signal_sent_before_either_started(flows_db: str) -> None:
    """Two signals of a name kept for two steps that wait for it: one each, in the order sent."""
    run = await wd.two_approvals.astart({})
    await jobs.workflows.asignal(run.id, "go", {"n": 1})
    await jobs.workflows.asignal(run.id, "go", {"n": 2})
    with pytest.raises(ValueError, match="waits for signal 'go' \\(any more\\)"):
        await jobs.workflows.asignal(run.id, "go", {"n": 3})  # both steps have theirs
    async with running():
        done = await run_state(run.id, "succeeded")
    assert [done["steps"][n]["output"] for n in ("first_approval", "second_approval")] == [{"n": 1}, {"n": 2}]


async def test_a_signal_sent_straight_to_a_steps_job_is_refused(flows_db: str) -> None:
    """jobs.signal() to a step's job with the signal its wait_for= names would pass by the rule
    that each step takes one signal of it (the next one reaching the step after it): it is refused,
    naming jobs.workflows.signal, and nothing is sent. The run then gets its signals as usual."""
    run = await wd.two_approvals.astart({})
    job_id = jobs.workflows.get(run.id)["steps"]["first_approval"]["job"]
    with pytest.raises(jobs.WorkflowStepSignalError, match=f"jobs.workflows.signal\\({run.id}, 'go'"):
        jobs.signal(job_id, "go", {"n": 0})
    with pytest.raises(ValueError, match="first_approval"):
        await jobs.asignal(job_id, "go", {"n": 0}, key="k")
    assert q(flows_db, "SELECT count(*) FROM livepush_job_signals") == [(0,)]
    await jobs.workflows.asignal(run.id, "go", {"n": 1})
    await jobs.workflows.asignal(run.id, "go", {"n": 2})
    async with running():
        done = await run_state(run.id, "succeeded")
    assert [done["steps"][n]["output"] for n in ("first_approval", "second_approval")] == [{"n": 1}, {"n": 2}]


async def test_a_signal_sent_straight_to_a_finished_steps_job_says_it_has_finished(flows_db: str) -> None:
    """A step's job that has finished takes no more signals, whatever their name: jobs.signal() of
    its wait_for= signal raises JobFinishedError, as for any finished job, rather than send the
    caller to jobs.workflows.signal() of a run that has finished too; nothing is sent."""
    run = await wd.approval.astart({})
    await jobs.workflows.asignal(run.id, "approve", {"by": "ana"})
    async with running():
        done = await run_state(run.id, "succeeded")
    job_id = done["steps"]["publish"]["job"]
    with pytest.raises(jobs.JobFinishedError, match=f"job {job_id} has succeeded"):
        jobs.signal(job_id, "approve", {"by": "bo"})
    with pytest.raises(jobs.JobFinishedError, match=f"job {job_id} has succeeded"):
        await jobs.asignal(job_id, "approve", {"by": "bo"}, key="late")
    assert q(flows_db, "SELECT count(*) FROM livepush_job_signals WHERE job_id = %s", (job_id,)) == [(0,)]


async def test_a_workflow_signal_sent_again_with_its_key_is_sent_once(flows_db: str) -> None:
    """jobs.workflows.signal(key=): a send retried because its reply was lost (its first try
    committed) sends nothing again, rather than reach the next step waiting for the name; after the
    run ended, the retry is not refused either. A refused send keeps no key, and retention deletes
    the keys with their run."""
    run = await wd.two_approvals.astart({})
    await jobs.workflows.asignal(run.id, "go", {"n": 1}, actor="ana", key="go-1")
    jobs.workflows.signal(run.id, "go", {"n": 1}, actor="ana", key="go-1")  # the caller's retry
    await jobs.workflows.asignal(run.id, "go", {"n": 2}, actor="bo", key="go-2")
    async with running():
        done = await run_state(run.id, "succeeded")
    assert [done["steps"][n]["output"] for n in ("first_approval", "second_approval")] == [{"n": 1}, {"n": 2}]
    assert [(a["step"], a["actor"]) for a in done["audit"]] == [("first_approval", "ana"), ("second_approval", "bo")]
    await jobs.workflows.asignal(run.id, "go", {"n": 2}, key="go-2")  # a late retry: sent, not refused
    for _ in range(2):  # the first refusal kept no key that would pass the second for sent
        with pytest.raises(ValueError, match="has succeeded"):
            await jobs.workflows.asignal(run.id, "go", {"n": 3}, key="go-3")
    with pytest.raises(ValueError, match="key="):
        jobs.workflows.signal(run.id, "go", key="")
    q(flows_db, "UPDATE livepush_workflows SET finished_at = now() - interval '2 days' WHERE id = %s", (run.id,))
    from livepush.jobs import database
    from livepush.jobs.runtime import maintenance

    await maintenance.prune(await database.pools().aget(), 3600)
    assert q(flows_db, "SELECT count(*) FROM livepush_workflow_signal_keys") == [(0,)]


async def test_a_workflow_signal_key_reused_for_another_signal_is_refused(flows_db: str) -> None:
    """A key names one signal of a run: sent again with another signal's name, the send is
    refused, rather than dropped unsaid."""
    run = await wd.two_approvals.astart({})
    await jobs.workflows.asignal(run.id, "go", {"n": 1}, key="request-7")
    with pytest.raises(ValueError, match=f"key 'request-7' was sent to workflow run {run.id} with signal 'go', not 'stop'"):
        await jobs.workflows.asignal(run.id, "stop", key="request-7")
    found = await jobs.workflows.aget(run.id)
    assert found is not None and [a["reason"] for a in found["audit"]] == ["go"]
    await jobs.workflows.acancel(run.id)


async def test_two_sends_of_one_workflow_signal_key_at_once_send_it_once(flows_db: str) -> None:
    """Two sends of the same key at the same moment (a retry racing the first try): the second
    waits for the first and, once it committed, sends nothing; the second step still waits."""
    from livepush.jobs.workflows import operators

    run = await wd.two_approvals.astart({})
    with psycopg.connect(flows_db) as conn:
        assert in_tx(lambda: operators._signal_steps(run.id, "go", '{"n": 1}', "ana", "go-1"), conn) is None
        racing = asyncio.create_task(asyncio.to_thread(jobs.workflows.signal, run.id, "go", {"n": 2}, key="go-1"))
        await async_wait_for(lambda: q(flows_db, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                                 "current_database() AND wait_event_type = 'Lock'") != [(0,)], 10,
                             message="the second send to wait for the first's key")
        conn.commit()
    assert await asyncio.wait_for(racing, 10) is None
    found = await jobs.workflows.aget(run.id)
    assert found is not None and [a["step"] for a in found["audit"]] == ["first_approval"]
    sent = q(flows_db, "SELECT (SELECT count(*) FROM livepush_workflow_signals WHERE workflow_id = %(id)s) + "
                       "(SELECT count(*) FROM livepush_job_signals s JOIN livepush_jobs j ON j.id = s.job_id "
                       "WHERE j.workflow_id = %(id)s)", {"id": run.id})
    assert sent == [(1,)]
    await jobs.workflows.acancel(run.id)


async def test_a_signal_sent_while_a_step_that_got_its_own_runs_is_for_the_next_step(flows_db: str) -> None:
    """The first step took its signal and is running its body: the next signal of that name is
    kept for the step after it, not sent to a job that will never read it."""
    async with running():
        run = await wd.two_approvals.astart({"flag": "first-may-end"})
        await jobs.workflows.asignal(run.id, "go", {"n": 1})
        await async_wait_for(lambda: q(flows_db, "SELECT count(*) FROM livepush_job_steps WHERE kind = 'signal' "
                                                 "AND result ? 'data'") == [(1,)], 10.0,
                             message="the first step to take its signal")
        await jobs.workflows.asignal(run.id, "go", {"n": 2})
        q(flows_db, "INSERT INTO job_flags VALUES ('first-may-end')")
        done = await run_state(run.id, "succeeded")
    assert [done["steps"][n]["output"] for n in ("first_approval", "second_approval")] == [{"n": 1}, {"n": 2}]
    assert [a["step"] for a in done["audit"]] == ["first_approval", "second_approval"]


async def test_a_signal_for_a_step_that_already_got_its_own_is_refused(flows_db: str) -> None:
    """The only step waiting for the name already took its signal: another one is refused, not
    accepted and never read."""
    async with running():
        run = await wd.approval.astart()
        await run_state(run.id, "waiting")
        await jobs.workflows.asignal(run.id, "approve", {"by": "ana"})
        await run_state(run.id, "succeeded")
    run = await wd.two_approvals.astart({"flag": "never"})
    await jobs.workflows.asignal(run.id, "go", {"n": 1})
    async with running():
        await async_wait_for(lambda: q(flows_db, "SELECT count(*) FROM livepush_job_steps WHERE kind = 'signal' "
                                                 "AND result ? 'data'") == [(1,)], 10.0,
                             message="the first step to take its signal")
        await jobs.workflows.asignal(run.id, "go", {"n": 2})  # for the second step
        with pytest.raises(ValueError, match="waits for signal 'go' \\(any more\\)"):
            await jobs.workflows.asignal(run.id, "go", {"n": 3})
        await jobs.workflows.acancel(run.id)


def test_signals_nobody_waits_for_are_refused(flows_db: str) -> None:
    """A signal no step waits for, or to no run, is refused with a clear error."""
    run = wd.approval.start()
    with pytest.raises(ValueError, match="no step of workflow run .* waits for signal 'nope'"):
        jobs.workflows.signal(run.id, "nope")
    with pytest.raises(jobs.WorkflowNotFound):
        jobs.workflows.signal(987654, "approve")


async def test_verbs_on_an_id_no_run_can_have_name_that_id(flows_db: str) -> None:
    """An int past what a run's id can be (bigint) is a run that does not exist, as for any unknown
    id; WorkflowNotFound names the id the caller gave, not the stand-in the lookup used (0)."""
    huge = 2**70
    for call in (lambda: jobs.workflows.pause(huge), lambda: jobs.workflows.resume(huge),
                 lambda: jobs.workflows.cancel(huge), lambda: jobs.workflows.skip(huge, "report"),
                 lambda: jobs.workflows.signal(huge, "approve")):
        with pytest.raises(jobs.WorkflowNotFound, match=f"no workflow run {huge} "):
            call()
    for acall in (jobs.workflows.apause(huge), jobs.workflows.askip(huge, "report"),
                  jobs.workflows.asignal(huge, "approve")):
        with pytest.raises(jobs.WorkflowNotFound, match=f"no workflow run {huge} "):
            await acall


# -- fan-out ---------------------------------------------------------------------------------------

def test_a_fan_out_batch_takes_many_members_as_a_task_groups_enqueue_many_does() -> None:
    """batch.enqueue_many() takes job.request(...) values and (job, args) tuples, as a task group's
    g.enqueue_many() and jobs.enqueue_many() do (the tuples were refused as "batch.enqueue() takes a
    @jobs.job function", naming neither the call nor the item); options, which a batch's members do
    not take, are refused saying so; and a refused item adds none of the call's items."""
    batch = Batch("rows")
    batch.enqueue_many([(wd.member, [0, False]), wd.member.request(1, False), (wd.member, (2, False), None)])
    assert [(r.name, r.args) for r in batch.requests] == [
        ("t.member", (0, False)), ("t.member", (1, False)), ("t.member", (2, False))]
    with pytest.raises(ArgumentTypeError, match=r"^batch\.enqueue_many\(\) item 1: .*no enqueue options"):
        batch.enqueue_many([(wd.member, [3, False]), (wd.member, [4, False], {"key": "k"})])
    with pytest.raises(ArgumentTypeError, match=r"^batch\.enqueue_many\(\) item 1: "):
        batch.enqueue_many([(wd.member, [3, False]), (wd.member, "ab")])
    with pytest.raises(ArgumentTypeError, match=r"^batch\.enqueue_many\(\) takes an iterable"):
        batch.enqueue_many({"a": 1})
    assert len(batch) == 3


async def test_a_fan_out_step_parks_on_its_batch_and_outputs_the_counts(flows_db: str) -> None:
    """A fan-out step's jobs run as a task group; the step waits, then outputs their counts."""
    async with running(concurrency=4):
        run = await wd.fan.astart({"n": 20})
        done = await run_state(run.id, "succeeded")
    counts = done["steps"]["rows"]["output"]
    assert counts == {"total": 20, "succeeded": 20, "failed": 0, "cancelled": 0}
    assert done["steps"]["report"]["output"] == {"rows": counts}
    assert done["steps"]["rows"]["group"] is not None
    # The run's topic shows the batch's progress beside the step.
    state = (await asyncio.to_thread(read_states, flows_db, [run.topic]))[run.topic]
    assert json.loads(state.view_json)["steps"]["rows"]["batch"] == {"total": 20, "pending": 0, "succeeded": 20,
                                                                     "failed": 0, "cancelled": 0}


@pytest.mark.parametrize(("verb", "state", "output"), [
    ("skip", "skipped", None),
    ("complete", "succeeded", {"planned": 3}),
])
async def test_a_flow_verb_in_a_fan_out_function_ends_the_step_before_its_batch_is_written(
        flows_db: str, verb: str, state: str, output: Any) -> None:
    """A verb in a fan-out step's function ends the step as in any step's body: before its batch
    is written, so the members it enqueued never run (ctx.flow.skip() when there is nothing to
    fan out), and complete() gives the step its own output, not a batch's counts."""
    async with running():
        run = await wd.fan_verbs.astart({"n": 3, "verb": verb})
        done = await run_state(run.id, "succeeded")
    assert step_states(done) == {"maybe_spread": state, "after_spread": "succeeded"}
    assert done["steps"]["maybe_spread"]["group"] is None
    assert done["steps"]["after_spread"]["output"] == output
    assert q(flows_db, "SELECT count(*) FROM livepush_jobs WHERE name = %s", (wd.member.name,)) == [(0,)]


async def test_batch_failures_pause_the_run_and_resume_reruns_only_the_failed_members(flows_db: str) -> None:
    """on_batch_failure="pause": failed members pause the run; resume runs only those again."""
    async with running(concurrency=4):
        run = await wd.fan.astart({"n": 6, "failing": [1, 4]})
        paused = await run_state(run.id, "paused")
        assert paused["audit"][-1]["verb"] == "pause" and "2 failed" in paused["audit"][-1]["reason"]
        q(flows_db, "INSERT INTO job_flags VALUES ('members-ok')")
        assert await jobs.workflows.aresume(run.id, actor="ana", reason="vendor back")
        done = await run_state(run.id, "succeeded")
    assert done["steps"]["rows"]["output"] == {"total": 6, "succeeded": 6, "failed": 0, "cancelled": 0}
    members = q(flows_db, "SELECT count(*) FROM livepush_jobs WHERE name = 't.member'")
    assert members == [(8,)]  # 6, then the 2 that failed


async def test_resume_reruns_the_members_that_failed_and_those_that_were_cancelled(flows_db: str) -> None:
    """A batch whose members failed or ended cancelled pauses the run; resume runs both kinds
    again, and the step then succeeds with every member counted once."""
    async with running(concurrency=4):
        run = await wd.fan.astart({"n": 5, "failing": [1], "cancelling": [3]})
        paused = await run_state(run.id, "paused")
        assert "1 failed and 1 cancelled of 5" in paused["audit"][-1]["reason"]
        q(flows_db, "INSERT INTO job_flags VALUES ('members-ok')")
        assert await jobs.workflows.aresume(run.id, actor="ana")
        done = await run_state(run.id, "succeeded")
    assert done["steps"]["rows"]["output"] == {"total": 5, "succeeded": 5, "failed": 0, "cancelled": 0}
    assert q(flows_db, "SELECT p.args ->> 0 FROM livepush_jobs j JOIN livepush_job_payloads p USING (id) "
                       "WHERE j.name = 't.member' GROUP BY 1 HAVING count(*) = 2 ORDER BY 1") == [("1",), ("3",)]


async def test_a_fan_out_batch_past_the_member_limit_fails_naming_its_step(
        flows_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch takes at most jobs.MAX_GROUP_MEMBERS jobs: the job past it is refused as it is
    enqueued (not after all of them were built and written), with GroupLimitError naming the step,
    not a task group that was never created; nothing of the batch is written."""
    monkeypatch.setattr(building, "MAX_GROUP_MEMBERS", 5)
    async with running():
        run = await wd.fan.astart({"n": 7})

        async def refused() -> str | None:
            got = await asyncio.to_thread(jobs.workflows.get, run.id)
            job = got["steps"]["rows"]["job"] if got else None
            info = await jobs.aget_job(job) if job is not None else None
            return info.error if info is not None and info.error else None

        error = await async_wait_for(refused, 15, message="the fan-out step's first attempt to fail")
    assert error.startswith("GroupLimitError: the batch of fan-out step 'rows' takes at most 5 jobs"), error
    assert not re.search(r"task group \d", error), error
    assert q(flows_db, "SELECT count(*) FROM livepush_jobs WHERE name = 't.member'") == [(0,)]
    assert q(flows_db, "SELECT count(*) FROM livepush_groups") == [(0,)]


async def test_a_fan_out_skipped_on_its_failures_still_gives_its_counts_to_the_steps_after_it(flows_db: str) -> None:
    """A skipped step stands for one that succeeded: a fan-out step the operator skips after its
    batch failed keeps its counts, and the step after it reads them in ctx.outputs, as the docs'
    `ctx.outputs["rows"]["succeeded"]` does, rather than failing on a missing key."""
    async with running(concurrency=4):
        run = await wd.fan.astart({"n": 6, "failing": [1, 4]})
        await run_state(run.id, "paused")
        assert await jobs.workflows.askip(run.id, "rows", actor="ana", reason="two rows are bad upstream")
        assert await jobs.workflows.aresume(run.id, actor="ana", reason="go on without them")
        done = await run_state(run.id, {"succeeded", "failed"})
    assert done["state"] == "succeeded", done["error"]
    counts = {"total": 6, "succeeded": 4, "failed": 2, "cancelled": 0}
    assert step_states(done)["rows"] == "skipped" and done["steps"]["rows"]["output"] == counts
    assert done["steps"]["report"]["output"] == {"rows": counts}


async def test_a_run_paused_on_its_batch_keeps_the_failed_members_past_the_retention_time(flows_db: str) -> None:
    """A run paused on its batch's failures waits for an operator however long: the retention of
    finished jobs and groups does not take the failed members that its resume runs again (the run
    would otherwise go on as if the batch had succeeded, its failed members never run)."""
    from livepush.jobs import database
    from livepush.jobs.runtime import maintenance

    async with running(concurrency=4):
        run = await wd.fan.astart({"n": 6, "failing": [1, 4]})
        await run_state(run.id, "paused")
        # A week later: the batch, its members and the step's job finished long ago.
        q(flows_db, "UPDATE livepush_groups SET finished_at = now() - interval '8 days'")
        q(flows_db, "UPDATE livepush_jobs SET finished_at = now() - interval '8 days' WHERE finished_at IS NOT NULL")
        await maintenance.prune(await database.pools().aget(), 7 * 86400)
        q(flows_db, "INSERT INTO job_flags VALUES ('members-ok')")
        assert await jobs.workflows.aresume(run.id, actor="ana", reason="vendor back")
        done = await run_state(run.id, {"succeeded", "failed", "paused"})
    assert done["steps"]["rows"]["output"] == {"total": 6, "succeeded": 6, "failed": 0, "cancelled": 0}
    assert q(flows_db, "SELECT count(*) FROM livepush_jobs WHERE name = 't.member' AND state = 'succeeded'") == [(6,)]


async def test_list_runs_by_name_and_state_paged(flows_db: str) -> None:
    """list() pages runs newest first, by name and state."""
    handles = [wd.approval.start() for _ in range(3)]
    page, cursor = jobs.workflows.list("t_approval", "running", limit=2)
    assert [r["id"] for r in page] == [handles[2].id, handles[1].id] and cursor == handles[1].id
    page, cursor = jobs.workflows.list("t_approval", before=cursor, limit=2)
    assert [r["id"] for r in page] == [handles[0].id] and cursor is None
    assert jobs.workflows.list("t_diamond")[0] == []


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _plan_nodes(child))]


async def test_a_listing_is_planned_for_its_filters_values_however_often_it_ran(flows_db: str) -> None:
    """list() of a workflow with few runs among many reads the listing index. A prepared listing
    (the jobs' pool prepares a statement from its first run) was planned, from its sixth run on, once
    for every value (Postgres' generic plan), and that plan, blind to the name, read every run
    newest first to find that workflow's few. list() and alist() run it unprepared, so each call
    is planned for its own filters: on no connection of the pools is a listing prepared."""
    import contextlib

    from livepush.jobs import database
    from livepush.jobs.workflows import queries as wq

    q(flows_db, """INSERT INTO livepush_workflows (name, queue, state, graph, input)
                   SELECT CASE WHEN i % 500 = 0 THEN 'rare' ELSE 'common_' || (i % 10) END, 'q',
                          CASE WHEN i % 2 = 0 THEN 'succeeded' ELSE 'running' END, '{}', 'null'
                   FROM generate_series(1, 20000) i""")
    q(flows_db, "ANALYZE livepush_workflows")
    for _ in range(8):
        assert len(jobs.workflows.list("rare", limit=10)[0]) == 10
        assert len((await jobs.workflows.alist("rare", "succeeded", limit=10))[0]) == 10
    with psycopg.connect(flows_db) as conn:
        # As each call is planned: for its values, the rare name's runs through the index.
        plan = conn.execute("EXPLAIN (FORMAT JSON) " + wq.LIST_RUNS,
                            {"name": "rare", "state": None, "before": 2**63 - 1, "limit": 10},
                            prepare=False).fetchone()[0][0]["Plan"]  # type: ignore[index]
    assert any(n.get("Index Name") == "livepush_workflows_list_idx" for n in _plan_nodes(plan)), plan

    # Unprepared, with the pattern a parameter: the look itself is no prepared listing.
    look = ("SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%FROM livepush_workflows%ORDER BY id DESC%"])
    sync_pool, async_pool = database.pools().sync(), await database.pools().aget()
    with contextlib.ExitStack() as stack:  # every connection of the pool at once: each is looked at
        held = [stack.enter_context(sync_pool.connection()) for _ in range(sync_pool.get_stats()["pool_size"])]
        assert [conn.execute(*look, prepare=False).fetchall() for conn in held] == [[]] * len(held)
    async with contextlib.AsyncExitStack() as astack:
        aheld = [await astack.enter_async_context(async_pool.connection())
                 for _ in range(async_pool.get_stats()["pool_size"])]
        assert [await (await conn.execute(*look, prepare=False)).fetchall() for conn in aheld] == [[]] * len(aheld)


async def test_a_list_cursor_past_either_end_of_the_ids(flows_db: str) -> None:
    """Every run's id comes before a cursor past the largest id a run can have, so the page starts
    at the newest run (it was empty); none comes before a cursor of 1 or less."""
    handles = [wd.approval.start() for _ in range(2)]
    for past in (2**63 - 1, 2**63, 2**80):
        page, cursor = jobs.workflows.list("t_approval", before=past)
        assert [r["id"] for r in page] == [handles[1].id, handles[0].id] and cursor is None, past
    for before in (1, 0, -5, -(2**80)):
        assert jobs.workflows.list("t_approval", before=before) == ([], None), before


async def test_retention_removes_finished_runs_with_their_steps_and_audit(flows_db: str) -> None:
    """Pruning deletes a run finished longer ago than the retention time, with its steps and audit."""
    async with running():
        run = await wd.verbs.astart({"first": "skip"})
        await run_state(run.id, "succeeded")
    q(flows_db, "UPDATE livepush_workflows SET finished_at = now() - interval '2 days' WHERE id = %s", (run.id,))
    from livepush.jobs import database
    from livepush.jobs.runtime import maintenance

    pool = await database.pools().aget()
    await maintenance.prune(pool, 3600)
    assert jobs.workflows.get(run.id) is None
    assert q(flows_db, "SELECT count(*) FROM livepush_workflow_steps") == [(0,)]
    assert q(flows_db, "SELECT count(*) FROM livepush_workflow_audit") == [(0,)]


async def test_retention_works_off_a_backlog_of_finished_runs_as_it_does_jobs(flows_db: str) -> None:
    """One prune deletes up to max_batches batches of expired runs, as it does jobs: runs that
    finish faster than one batch per prune (a runtime prunes at most once a minute) are still
    deleted, rather than piling up for ever behind a single batch a minute."""
    q(flows_db, """INSERT INTO livepush_workflows (name, queue, graph, input, state, finished_at)
                   SELECT 't_old', 'flows', '{"steps": {}, "order": []}', 'null', 'succeeded',
                          now() - interval '2 days'
                   FROM generate_series(1, 250)""")
    from livepush.jobs import database
    from livepush.jobs.runtime import maintenance

    pool = await database.pools().aget()
    assert await maintenance.prune(pool, 3600, batch=100, max_batches=5) == 250
    assert q(flows_db, "SELECT count(*) FROM livepush_workflows") == [(0,)]


async def test_a_woken_step_gives_its_run_a_new_version(flows_db: str) -> None:
    """When a parked step is woken (here by its signal), workflow:<id> gets a newer version showing
    it running: a page that saw it waiting hears that it runs again."""
    async with running():
        run = await wd.approval.astart()
        await run_state(run.id, "waiting")
    before = (await asyncio.to_thread(read_states, flows_db, [run.topic]))[run.topic]
    await jobs.workflows.asignal(run.id, "approve", {"by": "ana"})
    after = (await asyncio.to_thread(read_states, flows_db, [run.topic]))[run.topic]
    assert after.version > before.version
    assert json.loads(before.view_json)["steps"]["publish"]["state"] == "waiting"
    view = json.loads(after.view_json)
    assert view["steps"]["publish"]["state"] == "running" and view["state"] == "running"


class ProcessDied(BaseException):
    """The operator's process ending at that point (killed, or its machine gone)."""


@pytest.mark.parametrize("verb", ["cancel", "skip"])
async def test_a_parked_step_is_stopped_with_the_verb_that_ends_it(flows_db: str, monkeypatch: pytest.MonkeyPatch,
                                                                  verb: str) -> None:
    """A cancel of the run (or a skip of the step) stops the job of a step parked on its signal in
    the transaction that records it: an operator's process that dies right after that commit leaves
    no job waiting for a signal that the run will never take again."""
    from livepush.jobs.workflows import operators

    async with running():
        run = await wd.approval.astart()
        await run_state(run.id, "waiting")

    async def dies(job_id: int) -> bool:
        raise ProcessDied

    monkeypatch.setattr(operators, "acancel", dies)
    with pytest.raises(ProcessDied):
        if verb == "cancel":
            await jobs.workflows.acancel(run.id, actor="ana")
        else:
            await jobs.workflows.askip(run.id, "publish", actor="ana")
    got = await asyncio.to_thread(jobs.workflows.get, run.id)
    assert got["steps"]["publish"]["state"] in {"cancelled", "skipped"}
    assert q(flows_db, "SELECT state FROM livepush_jobs WHERE id = %s", (got["steps"]["publish"]["job"],)) == [
        ("cancelled",)]


async def test_a_step_that_starts_running_gives_its_run_a_new_version(flows_db: str) -> None:
    """A version of workflow:<id> is one state: when a step's job is claimed (its attempt goes from 0
    to 1), the run's topic shows it at a newer version. Otherwise a page holding the older version
    (a live subscriber, or one resuming with `since` = that version) never hears of the attempt."""
    run = await wd.verbs.astart({"first": "hold", "flag": "attempt-shown"})
    before = (await asyncio.to_thread(read_states, flows_db, [run.topic]))[run.topic]
    assert json.loads(before.view_json)["steps"]["first"] == {"state": "running", "attempt": 0, "group": None}
    async with running():
        await async_wait_for(lambda: q(flows_db, "SELECT 1 FROM livepush_jobs WHERE workflow_id = %s AND attempt = 1",
                                       (run.id,)), 10, message="the first step's job to be claimed")
        during = (await asyncio.to_thread(read_states, flows_db, [run.topic]))[run.topic]
        q(flows_db, "INSERT INTO job_flags VALUES ('attempt-shown')")
        await run_state(run.id, "succeeded")
    assert json.loads(during.view_json)["steps"]["first"]["attempt"] == 1
    assert during.version > before.version, "the same version showed attempt 0, then attempt 1"


async def test_a_run_that_fails_cancels_the_batch_of_its_waiting_fan_out_step(flows_db: str) -> None:
    """A run that fails while a fan-out step waits for its batch stops that step, and the batch's
    members that have not run are cancelled (by the runtime's heartbeat), not run to their end."""
    async with running(concurrency=2):
        run = await wd.doomed.astart()
        failed = await run_state(run.id, "failed")
        assert failed["steps"]["many"]["state"] == "cancelled"
        group = failed["steps"]["many"]["group"]

        async def batch_cancelled() -> dict[str, Any] | None:
            found = await asyncio.to_thread(jobs.get_group, group)
            return found if found["state"] == "cancelled" and found["pending"] == 0 else None

        batch = await async_wait_for(batch_cancelled, 10.0, message="the batch to be cancelled")
    assert batch["cancelled"] > 0 and batch["succeeded"] < 40


@pytest.mark.parametrize(("end", "after"), [
    ("fail", {"run": "failed", "ender": "failed", "bystander": "cancelled"}),
    ("finish", {"run": "succeeded", "ender": "succeeded", "bystander": "skipped"}),
    ("cancel", {"run": "cancelled", "ender": "cancelled", "bystander": "cancelled"})])
async def test_a_step_whose_job_row_was_busy_when_a_sibling_ended_the_run_is_stopped_all_the_same(
        flows_db: str, end: str, after: dict[str, str]) -> None:
    """A step that ends its run (it fails, or calls ctx.flow.finish or cancel) stops the jobs of the
    steps running beside it. One whose row another transaction holds at that moment (its progress
    being written, a checkpoint) is passed over by that stop, which cannot wait for it; its runtime
    is told when the run's end commits and stops it then: not at a heartbeat (a minute here), and
    not never, as it would run on to its own end."""
    flag = f"siblings-{end}"
    async with running(concurrency=2, heartbeat=60.0):
        run = await wd.siblings.astart({"end": end, "flag": flag})

        def both_running() -> dict[str, int] | None:
            jobs_running = dict(q(flows_db, "SELECT name, id FROM livepush_jobs WHERE workflow_id = %s "
                                            "AND state = 'running'", (run.id,)))
            return jobs_running if len(jobs_running) == 2 else None

        both = await async_wait_for(both_running, 10.0, message="both steps' jobs to run")
        job = both["t_siblings.bystander"]
        with psycopg.connect(flows_db) as holder:
            holder.execute("SELECT 1 FROM livepush_jobs WHERE id = %s FOR UPDATE", (job,))
            q(flows_db, "INSERT INTO job_flags VALUES (%s)", (flag,))
            done = await run_state(run.id, after["run"])
            assert q(flows_db, "SELECT state, cancel_requested FROM livepush_jobs WHERE id = %s", (job,)) == [
                ("running", False)], "the stop did not pass over the busy row: this test shows nothing"
            # A runtime that missed the notification finds it at its heartbeat's read all the same.
            (runtime_id,) = q(flows_db, "SELECT runtime_id FROM livepush_jobs WHERE id = %s", (job,))[0]
            assert (job,) in q(flows_db, job_queries.CANCEL_REQUESTS_FOR, {"runtime_id": runtime_id, "ids": None})
            holder.commit()
        await async_wait_for(lambda: q(flows_db, "SELECT state FROM livepush_jobs WHERE id = %s", (job,))
                             == [("cancelled",)], 10.0, message="the bystander's job to be stopped")
    assert step_states(done) == {"ender": after["ender"], "bystander": after["bystander"]}
    assert step_states(jobs.workflows.get(run.id)) == step_states(done), "the stopped job's end changed its run"


async def test_a_failed_runs_final_version_is_one_state(flows_db: str) -> None:
    """The final version of workflow:<id> is one state: the batch of its fan-out step, cancelled
    after the run failed, is shown as the version showed it when the run failed, or at a newer
    version. A page holding the final version never hears of a change under it."""
    async with running(concurrency=2):
        run = await wd.doomed.astart()
        await run_state(run.id, "failed")
        final = (await asyncio.to_thread(read_states, flows_db, [run.topic]))[run.topic]
        group = json.loads(final.view_json)["steps"]["many"]["group"]

        async def batch_cancelled() -> dict[str, Any] | None:
            found = await asyncio.to_thread(jobs.get_group, group)
            return found if found["state"] == "cancelled" and found["pending"] == 0 else None

        await async_wait_for(batch_cancelled, 10.0, message="the batch to be cancelled")
    later = (await asyncio.to_thread(read_states, flows_db, [run.topic]))[run.topic]
    assert later.version > final.version or later.view_json == final.view_json, (
        f"version {final.version} showed {json.loads(final.view_json)['steps']['many']['batch']}, "
        f"then {json.loads(later.view_json)['steps']['many']['batch']}")


@pytest.mark.parametrize(("call", "error", "fragment"), [
    (lambda run: jobs.workflows.pause(run, actor="ana\x00"), ValueError, "actor contains a NUL"),
    (lambda run: jobs.workflows.cancel(run, reason="why\x00"), ValueError, "reason contains a NUL"),
    (lambda run: jobs.workflows.signal(run, "approve", {}, actor="ana\x00"), ValueError, "actor contains a NUL"),
    (lambda run: jobs.workflows.list(name=123), TypeError, "name must be a str"),
    (lambda run: jobs.workflows.list(name="a\x00"), ValueError, "name contains a NUL"),
    (lambda run: jobs.workflows.list(state=5), ValueError, "state= takes one of"),
    (lambda run: jobs.workflows.list(state="done"), ValueError, "state= takes one of"),
])
def test_operator_arguments_postgres_cannot_take_are_refused_naming_them(flows_db: str, call: Any, error: type,
                                                                       fragment: str) -> None:
    """An operator's mistake is a TypeError or ValueError naming the argument, never a database
    error (or a schema error telling them to migrate)."""
    run = wd.approval.start()
    with pytest.raises(error, match=fragment):
        call(run.id)
    assert jobs.workflows.get(run.id)["state"] == "running"  # type: ignore[index]


def test_an_input_or_signal_too_large_to_store_is_refused_naming_it(flows_db: str) -> None:
    """A run's input or a signal's data larger than one jsonb value holds (256 MiB) raises
    InvalidArgumentsError naming it, and writes nothing: a DependencyError said Postgres had
    failed, for a call that fails the same however often it is tried again."""
    huge = "x" * 270_000_000
    with pytest.raises(jobs.InvalidArgumentsError, match="input is too large for Postgres to store"):
        wd.approval.start({"file": huge})
    assert jobs.workflows.list(name="t_approval") == ([], None)
    run = wd.approval.start()
    with pytest.raises(jobs.InvalidArgumentsError, match="data is too large for Postgres to store"):
        jobs.workflows.signal(run.id, "approve", {"by": huge}, actor="ana")
    assert jobs.workflows.get(run.id)["audit"] == []  # type: ignore[index]
    jobs.workflows.signal(run.id, "approve", {"by": "ana"}, actor="ana")  # the step still takes one


def test_an_input_too_large_with_conn_leaves_the_callers_transaction_usable(flows_db: str) -> None:
    """start(conn=) with an input Postgres refuses as too large raises InvalidArgumentsError and
    the caller's transaction goes on: its own rows before and after commit, and no run exists."""
    with psycopg.connect(flows_db) as conn:
        conn.execute("INSERT INTO job_flags (name) VALUES ('before')")
        with pytest.raises(jobs.InvalidArgumentsError, match="input is too large for Postgres to store"):
            wd.approval.start({"rows": over_jsonb()}, conn=conn)
        conn.execute("INSERT INTO job_flags (name) VALUES ('after')")
        conn.commit()
    assert q(flows_db, "SELECT name FROM job_flags ORDER BY name") == [("after",), ("before",)]
    assert jobs.workflows.list(name="t_approval") == ([], None)


def test_an_input_past_one_message_to_postgres_is_refused_leaving_the_callers_transaction_usable(
        flows_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """start(conn=) with an input whose JSON passes what one message to Postgres carries (lowered
    here to 100,000 bytes) raises InvalidArgumentsError naming it before anything is sent, and the
    caller's transaction goes on: Postgres closed the connection on such a message."""
    from livepush.jobs.api import args

    monkeypatch.setattr(args, "SENDABLE", 100_000)
    with psycopg.connect(flows_db) as conn:
        conn.execute("INSERT INTO job_flags (name) VALUES ('before')")
        with pytest.raises(jobs.InvalidArgumentsError, match=r"input is too large for Postgres to store \(past the 1 GiB"):
            wd.approval.start({"rows": "x" * 150_000}, conn=conn)
        conn.execute("INSERT INTO job_flags (name) VALUES ('after')")
        conn.commit()
    assert q(flows_db, "SELECT name FROM job_flags ORDER BY name") == [("after",), ("before",)]
    assert jobs.workflows.list(name="t_approval") == ([], None)


async def test_a_decision_whose_outputs_pass_one_message_to_postgres_names_the_run_and_the_step(
        flows_db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """ctx.flow.finish(output) with an output that one message to Postgres carries (lowered here to
    100,000 bytes), but not twice over, as the decision writes it (the step's output and the run's):
    the step's job fails, and so the run, with an error (and a log line) naming the run, the step
    and what to do, not only that "the job's result" was too large (it was not, alone)."""
    from livepush.jobs.api import args

    monkeypatch.setattr(args, "SENDABLE", 100_000)
    async with running():
        run = await wd.verbs.astart({"first": "finish large", "chars": 60_000})
        done = await run_state(run.id, {"succeeded", "failed", "cancelled"})
    assert done["state"] == "failed", done["state"]
    step_job = await jobs.aget_job(done["steps"]["first"]["job"])
    assert step_job is not None
    for said in (done["error"], step_job.error):
        assert f"workflow 't_verbs' run {run.id}" in said, said
        assert "the output of step 'first' and the run's own output (ctx.flow.finish)" in said, said
        assert "past the 1 GiB one message to Postgres carries" in said, said
        assert "return a reference to it" in said, said
    assert any(f"workflow 't_verbs' run {run.id}" in r.getMessage() for r in caplog.records), caplog.text
    # livepush held the decision back before sending it: Postgres refused nothing.
    assert not any("Postgres refused" in r.getMessage() for r in caplog.records), caplog.text


async def test_a_wait_that_runs_out_while_its_run_is_paused_times_out_at_the_resume(flows_db: str) -> None:
    """A step's wait_timeout= counts while its run is paused: a wait that ran out meanwhile leaves
    the run paused, and its on_timeout= applies as soon as the run is resumed (here the run is
    cancelled), unless a signal came meanwhile, which the step then takes."""
    async with running():
        late, signalled = await wd.paused_timeout.astart(), await wd.paused_timeout.astart()
        for run in (late, signalled):
            await run_state(run.id, "waiting")
            assert await jobs.workflows.apause(run.id, actor="ana")
        step_jobs = [(await jobs.workflows.aget(r.id))["steps"]["approved"]["job"] for r in (late, signalled)]
        # Woken by their deadlines, the steps' jobs stay queued: no runtime claims a paused run's.
        await async_wait_for(lambda: q(flows_db, "SELECT bool_and(state = 'available') FROM livepush_jobs "
                                                 "WHERE id = ANY(%s)", (step_jobs,))[0][0], 10,
                             message="the steps' waits to run out")
        for run in (late, signalled):
            assert (await jobs.workflows.aget(run.id))["state"] == "paused"
        await jobs.workflows.asignal(signalled.id, "approve", {"by": "bo"}, actor="bo")
        for run in (late, signalled):
            assert await jobs.workflows.aresume(run.id, actor="ana")
        cancelled = await run_state(late.id, "cancelled")
        done = await run_state(signalled.id, "succeeded")
    assert "waited for signal 'approve'" in cancelled["error"] and "none came" in cancelled["error"]
    assert [(a["verb"], a["actor"]) for a in cancelled["audit"]] == [
        ("pause", "ana"), ("resume", "ana"), ("cancel", "step:approved")]
    assert done["steps"]["approved"]["output"] == {"by": "bo"}
