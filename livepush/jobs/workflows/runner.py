"""Running a workflow's steps (the job side) and starting runs: the `Engine` every Workflow uses.

A step's job (args [run id]) reads the run's input and the outputs so far, waits for its signal
if it has one (a durable wait: parked, no slot held), runs the step's function, and returns what
happened as its result: {"verb": "complete" | "finish" | "skip" | "cancel" | "pause", "output",
"reason"}. The transaction that records the job's end records it on the run and starts what
follows (engine.steps_ended). A fan-out step adds its jobs to a batch and parks on it as a task
group (durable children); its output is the group's counts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any, overload

from psycopg.rows import dict_row

from ...postgres.pools import aautocommitted
from ...postgres.text import storable_text
from ..api.args import check_args, check_json, encode, stored_whole
from ..api.functions import is_async_callable
from ..api.handles import WorkflowHandle
from ..api.options import check_key
from ...types import Seconds, as_seconds, is_finite, shown
from ..api.registry import JobRequest, JobSpec
from ..errors import (GroupLimitError, InvalidArgumentsError, InvalidResultError, JobCancelled, Reattempt,
                      SignalTimeout, WorkflowDefinitionError, WorkflowStepWaitError, durable_call_refusal)
from ..groups import building, steps
from ..groups.transactions import ain_tx, in_tx
from ..runtime.context import LEFT_OUT, SyncJobContext
from ..runtime.executor import first_raised, refuse_coroutine
from ..runtime.threads import call_in_thread
from . import engine
from . import queries as wq
from .definition import StepSpec, Workflow
from ...errors import ArgumentTypeError, ArgumentValueError, LivepushError

log = logging.getLogger("livepush.jobs")


class FlowVerb(BaseException):
    """Ends a step's body at once (ctx.flow.*). A BaseException, so a step's `except Exception`
    does not swallow it."""

    def __init__(self, verb: str, output: Any = None, reason: str | None = None) -> None:
        super().__init__(verb)
        self.verb, self.output, self.reason = verb, output, reason


def _reason(reason: Any) -> str | None:
    """A flow verb's reason as the audit keeps it. Often text taken from the data: a character
    Postgres cannot store (a NUL) failed the writing of the step's end, and with it the run."""
    if reason is None:
        return None
    return storable_text(str(reason))[:1000]


def _kind(kind: str) -> str:
    """A step's kind as an error names it."""
    return {"step": "a plain step", "fan_out": "a fan-out step"}.get(kind, f"a step of kind {kind!r}")


def _as_started(spec: StepSpec, stored: dict[str, Any] | None) -> StepSpec:
    """`spec` (this deploy's step) with the kind and options that the run's graph stores for it: a
    run follows the graph it started with, whatever a later deploy changed (docs/workflows.md)."""
    if not stored:
        return spec
    return dataclasses.replace(
        spec, kind=stored.get("kind", spec.kind), wait_for=stored.get("wait_for"),
        wait_timeout=stored.get("wait_timeout"), on_timeout=stored.get("on_timeout", spec.on_timeout),
        on_batch_failure=stored.get("on_batch_failure", spec.on_batch_failure))


def _verb_result(spec: StepSpec, verb: FlowVerb) -> dict[str, Any]:
    """The step job's result for a flow verb. An output that is a coroutine unrun (a forgotten
    `await` inside ctx.flow.complete(...) or finish(...)) is refused naming the step and the fix,
    as a step that returns one is, not as a result "that is not JSON" whose advice is no fix."""
    if inspect.iscoroutine(verb.output):
        verb.output.close()  # never to run: no "never awaited" warning later
        workflow = spec.job.removesuffix(f".{spec.name}")  # the job's name is <workflow>.<step>
        raise InvalidResultError(f"step {spec.name!r} of workflow {workflow!r} passed ctx.flow.{verb.verb}() a "
                                 f"coroutine it did not await: write `ctx.flow.{verb.verb}(await ...)`")
    return {"verb": verb.verb, "output": verb.output, "reason": verb.reason}


class Flow:
    """`ctx.flow` inside a step: each verb ends the step's body at once."""

    def complete(self, output: Any = None) -> None:
        """The step succeeded with `output`."""
        raise FlowVerb("complete", output)

    def finish(self, output: Any = None) -> None:
        """The whole run succeeds now, with `output` (steps not started never start)."""
        raise FlowVerb("finish", output)

    def skip(self, reason: str | None = None) -> None:
        """The step is skipped: what comes after it runs as if it had succeeded."""
        raise FlowVerb("skip", reason=_reason(reason))

    def cancel(self, reason: str | None = None) -> None:
        """The run is cancelled."""
        raise FlowVerb("cancel", reason=_reason(reason))

    def pause(self, reason: str | None = None) -> None:
        """The run pauses; this step runs again (from the top) when an operator resumes it."""
        raise FlowVerb("pause", reason=_reason(reason))

    def reattempt(self, wait: Seconds = 0.0) -> None:
        """Run this step again in `wait` seconds (or a timedelta), its attempt not spent."""
        wait = as_seconds(wait)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not (is_finite(wait) and wait >= 0):
            # The step's own code would make the same call again: it fails at once, as a durable
            # ctx call given what it does not take does, rather than spending its attempts.
            raise durable_call_refusal(ArgumentValueError(
                f"ctx.flow.reattempt(wait=) takes a finite number of seconds from 0, or a timedelta, got {shown(wait, width=60)}"))
        raise Reattempt(float(wait))


class Batch:
    """What a fan-out step's function fills: `batch.enqueue(job, *args)`; each job runs on its own
    queue unless `job.request(..., queue=)` names another."""

    def __init__(self, step: str, is_async: bool = False) -> None:
        self.step = step
        self.requests: list[JobRequest] = []
        # An async function's calls return building.Added, whose `await` says to drop it; a sync
        # one's return None, as ever (an Added is awaitable to inspect.isawaitable()).
        self._is_async = is_async

    def enqueue(self, fn: JobSpec | JobRequest, *args: Any) -> building.Added | None:
        # Refused as it comes (as add_many_to_group stops reading at the limit): past it the task
        # group would refuse the whole batch, and only after it was built and written.
        if len(self.requests) >= building.MAX_GROUP_MEMBERS:
            raise GroupLimitError(f"the batch of fan-out step {self.step!r} takes at most {building.MAX_GROUP_MEMBERS} "
                                  "jobs (a task group's limit): split the work over several steps or runs")
        if isinstance(fn, JobRequest):
            if args:
                raise ArgumentTypeError("batch.enqueue(job.request(...)) takes no further arguments")
            request = fn
        elif isinstance(fn, JobSpec) and not isinstance(fn, type) and hasattr(fn, "request"):
            request = fn.request(*args)
        else:
            raise ArgumentTypeError(f"batch.enqueue() takes a @jobs.job function and its arguments, got {shown(fn, width=80)}")
        fn_queue = request.function.queue
        self.requests.append(dataclasses.replace(request, queue=request.queue or fn_queue))
        return building.Added("batch.enqueue()", "the step's function returns") if self._is_async else None

    def enqueue_many(self, items: Any) -> building.Added | None:
        """Members as a task group's g.enqueue_many() takes them: job.request(...) values or (job,
        args) tuples, but no enqueue options (a member of a fan-out batch is a durable job's child,
        which takes none). All or nothing: a refused item adds none of the call's items, and its
        error names the call and the item's place, as jobs.enqueue_many()'s does."""
        if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
            raise ArgumentTypeError("batch.enqueue_many() takes an iterable of job.request(*args) values or "
                                    f"(job_function, args) tuples, got {shown(items, typed=True, width=60)}")
        before = len(self.requests)
        try:
            for index, entry in enumerate(items):
                try:
                    self._enqueue_item(entry)
                except LivepushError as exc:
                    if exc.args and isinstance(exc.args[0], str):
                        exc.args = (f"batch.enqueue_many() item {index}: {exc.args[0]}", *exc.args[1:])
                    raise
        except BaseException:
            del self.requests[before:]
            raise
        return building.Added("batch.enqueue_many()", "the step's function returns") if self._is_async else None

    def _enqueue_item(self, entry: Any) -> None:
        if not isinstance(entry, tuple) or len(entry) not in (2, 3):
            self.enqueue(entry)  # a job.request(...), or refused naming what it got
            return
        if len(entry) == 3 and entry[2]:
            raise ArgumentTypeError("a member of a fan-out batch takes no enqueue options (wait=, at=, key=, "
                                    f"tags=): give (job_function, args), got options {shown(entry[2], width=60)}")
        self.enqueue(entry[0], *check_args(entry[1]))

    def __len__(self) -> int:
        return len(self.requests)


class StepContext:
    """`ctx` of a workflow step: the job's ctx (progress, checkpoint, job_id, ...) plus `input`
    (the run's), `outputs` (of the steps that succeeded), `flow` (the verbs), `signal` (the data
    of the signal a `wait_for=` step waited for), `run_id` and `step`."""

    def __init__(self, job_ctx: Any, run_id: int, step: str, input: Any, outputs: dict[str, Any], *,
                 wait_for: str | None = None) -> None:
        self._job_ctx = job_ctx
        self.run_id = run_id
        self.step = step
        self.input = input
        self.outputs = outputs
        self.signal: Any = None
        self.flow = Flow()
        self._wait_for = wait_for  # the step's wait_for= in the run's graph

    def __getattr__(self, name: str) -> Any:
        return getattr(self._job_ctx, name)

    @overload
    def wait_for_signal(self, name: str, timeout: float | None = None) -> Any: ...
    @overload
    def wait_for_signal(self, name: str, timeout: timedelta) -> Any: ...

    def wait_for_signal(self, name: Any = LEFT_OUT, timeout: Seconds | None = None) -> Any:
        """The job's ctx.wait_for_signal (awaited in an async step, blocking in a sync one), but
        for the step's own wait_for= signal: no second one can reach this job (jobs.workflows.signal
        gives each step one, jobs.signal refuses the name), so the wait is refused at once instead
        of lasting until its timeout. A name left out is the job's ctx's to refuse, as in a job."""
        if self._wait_for is not None and name == self._wait_for:
            raise WorkflowStepWaitError(
                f"step {self.step!r} of workflow run {self.run_id} waits in its code for signal {name!r}, the one its "
                f"wait_for= names: the step took that signal before its code ran, and no second one can reach it "
                f"(jobs.workflows.signal gives each step waiting for {name!r} one). Read its data from ctx.signal; "
                "to wait for a further signal in the step, give it another name")
        return self._job_ctx.wait_for_signal(name, timeout)


class Runner:
    """The Engine of every workflow (definition.Engine)."""

    async def run_step(self, flow: Workflow, step: str, ctx: Any, run_id: int) -> Any:
        spec = flow.steps.get(step)
        if spec is None:
            raise WorkflowDefinitionError(f"workflow {flow.name!r} has no step {step!r} in this deploy: "
                                          "keep a step defined while runs may still reach it")
        # One read in autocommit: no BEGIN and COMMIT round trips on the path between two steps.
        async with ctx._pool.connection() as conn, aautocommitted(conn), conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(wq.STEP_INPUTS, {"id": run_id, "step": step})
            row = await cur.fetchone()
        if (row is None or row["state"] in engine.RUN_FINISHED or row["step_job"] != ctx.job_id
                or row["step_state"] not in engine.STEP_ACTIVE):
            # The run ended, or this step was skipped or cancelled, after this job was made: it
            # ends as cancelled without running the step.
            raise JobCancelled(f"workflow run {run_id} no longer runs step {step!r} with job {ctx.job_id}")
        # The step's function is this deploy's; its kind and options are the run's graph's.
        deployed, spec = spec, _as_started(spec, row["spec"])
        if spec.kind != deployed.kind:
            # Called the other way, the function failed every attempt with a TypeError, or (one
            # that takes either call) silently ran as the kind the run did not start with.
            raise WorkflowDefinitionError(
                f"step {step!r} of workflow run {run_id} is {_kind(spec.kind)} in the graph the run started "
                f"with, and this deploy defines it as {_kind(deployed.kind)}: keep the step as it was under its "
                "name while runs may still reach it, and give the changed step a new name")
        outputs = dict(zip(row["output_names"] or (), row["outputs"] or ()))
        sctx = StepContext(ctx, run_id, step, row["input"], outputs, wait_for=spec.wait_for)
        try:
            if spec.wait_for is not None:
                try:
                    sctx.signal = await ctx.wait_for_signal(spec.wait_for, spec.wait_timeout)
                except SignalTimeout as exc:
                    if spec.on_timeout == "fail":
                        raise
                    return {"verb": spec.on_timeout, "reason": str(exc)}
            if spec.kind == "fan_out":
                return await self._fan_out(spec, sctx, row)
            output = await self._call(spec, sctx, ctx)
            return {"verb": "complete", "output": output}
        except FlowVerb as verb:
            return _verb_result(spec, verb)
        except BaseExceptionGroup as group:
            # A verb raised in a task of an asyncio.TaskGroup inside the step comes wrapped: it
            # ends the step as in its body, when verbs are all the group holds (the first one
            # counts; a reattempt goes on to the runtime bare). A group holding anything else
            # fails the attempt, as an error would.
            verbs, rest = group.split((FlowVerb, Reattempt))
            if verbs is None or rest is not None:
                raise
            first = first_raised(verbs)  # however deeply nested (task groups in task groups)
            if isinstance(first, FlowVerb):
                return _verb_result(spec, first)
            raise first from None  # a Reattempt, the split's only other kind

    def refused_output(self, flow: Workflow, step: str, result: Any) -> Exception | None:
        """For a result of run_step() the runtime's JSON check refused: the error naming the step and
        what of its output is not plain JSON (the check named `result["output"]`, the step job's
        wrapper, and "job results"). None when the output passes: the check's own error stands."""
        if not isinstance(result, dict):
            return None
        try:
            check_json(result.get("output"), "output", InvalidResultError, "outputs")
        except InvalidResultError as exc:
            # Only a flow verb's result holds a reason: the step handed the output to that verb.
            how = f"passed ctx.flow.{result.get('verb')}()" if "reason" in result else "returned"
            said, who = str(exc), f"step {step!r} of workflow {flow.name!r} {how}"
            if said.startswith("output is "):  # the output itself: "returned a set: outputs are plain JSON ..."
                return InvalidResultError(f"{who} {said.removeprefix('output is ')}")
            return InvalidResultError(f"{who} an output that is not plain JSON: {said}")
        return None

    async def _call(self, spec: StepSpec, sctx: StepContext, ctx: Any, *extra: Any) -> Any:
        is_async = is_async_callable(spec.fn)  # as @jobs.job tells an async function from a sync one
        if is_async:
            value = await spec.fn(sctx, *extra)
        else:
            # A sync step runs with the blocking ctx in one of the runtime's threads, like a sync
            # job: the loop's default pool has a few threads, and the steps beyond them waited there
            # with their slots held and their timeouts running. Called as a sync job is: a
            # StopIteration carried from the thread as it was never reached the step's job, which
            # never ended.
            loop = asyncio.get_running_loop()
            sync_ctx = StepContext(SyncJobContext(ctx, loop), sctx.run_id, sctx.step, sctx.input, sctx.outputs,
                                   wait_for=sctx._wait_for)
            sync_ctx.signal = sctx.signal
            value = await call_in_thread(ctx._threads, spec.fn, sync_ctx, *extra)
        if inspect.iscoroutine(value):
            # A forgotten `await` (or a sync wrapper around an async function): refused as a job's
            # is, naming the step, not as an output that is not JSON.
            workflow = spec.job.removesuffix(f".{spec.name}")  # the job's name is <workflow>.<step>
            refuse_coroutine(f"step {spec.name!r} of workflow {workflow!r}", is_async, value)
        return value

    async def _fan_out(self, spec: StepSpec, sctx: StepContext, row: dict[str, Any]) -> dict[str, Any]:
        ctx = sctx._job_ctx

        async def earlier_batch() -> dict[str, Any] | None:
            """The batch of an earlier job of this step, paused on its failures and now resumed
            (its id, and how many of the step's members succeeded so far): its members that failed
            or were cancelled run again. Read once, as a checkpoint: later runs of this job see the
            step's new batch in the row. Not those members themselves: a copy of their arguments
            passed what one jsonb value holds for a large batch (and the resume failed the run),
            and was read again at every replay of this job. make() reads them."""
            if row["group_id"] is None or row["group_parent"] == ctx.job_id:
                return None
            # What succeeded so far: the counts the step output when it paused (every batch before
            # this one, added up), else its first batch's.
            earlier_counts = row["step_output"] if isinstance(row["step_output"], dict) else {}
            return {"group": row["group_id"], "succeeded": earlier_counts.get("succeeded", row["group_succeeded"])}

        earlier = await ctx.checkpoint("livepush.earlier_batch", earlier_batch)

        async def make() -> list[JobRequest]:
            if earlier:
                # Called until the new batch is written, on a replay too: the earlier batch has
                # finished, so its members' rows read the same each time.
                async with ctx._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                    await cur.execute(wq.FAILED_MEMBERS, {"group_id": earlier["group"]})
                    failed = await cur.fetchall()
                return [JobRequest(r["name"], tuple(r["args"]), r["queue"]) for r in failed]
            batch = Batch(spec.name, is_async_callable(spec.fn))
            returned = await self._call(spec, sctx, ctx, batch)
            if returned is not None and returned is not batch:
                # The step's output is its batch's counts: what the function returns goes nowhere,
                # and whoever wrote it expected it somewhere. Said, not refused: the batch is good.
                log.warning("workflow run %s, fan-out step %r: the value its function returned (%s) is dropped: "
                            "a fan-out step's output is its batch's counts; return nothing, and keep what later "
                            "steps need in an earlier step's output", sctx.run_id, spec.name, type(returned).__name__)
            return batch.requests

        def remember(group_id: int) -> steps.Steps[None]:
            yield steps.Query(wq.SET_STEP_GROUP, {"id": sctx.run_id, "name": spec.name, "group_id": group_id})

        counts = await ctx._durable_calls.fan_out(make, remember)
        if earlier:
            counts["succeeded"] += earlier["succeeded"]
            counts["total"] += earlier["succeeded"]
        if counts["failed"] or counts["cancelled"]:
            reason = f"{counts['failed']} failed and {counts['cancelled']} cancelled of {counts['total']} in its batch"
            verb = {"pause": "pause", "cancel": "cancel", "skip": "skip"}[spec.on_batch_failure]
            return {"verb": verb, "output": counts, "reason": reason}
        return {"verb": "complete", "output": counts}

    # -- starting runs --------------------------------------------------------------------------
    @staticmethod
    def _input(flow: Workflow, input: Any) -> str:
        text = encode(input, "input", InvalidArgumentsError, "workflow inputs")
        if not flow.steps:
            raise WorkflowDefinitionError(f"workflow {flow.name!r} has no steps: define them before starting it")
        return text

    def start(self, flow: Workflow, input: Any, conn: Any, key: str | None = None) -> WorkflowHandle:
        text, key = self._input(flow, input), check_key(key)
        with stored_whole("input"):
            run_id = in_tx(lambda: engine.start_run(flow.name, flow.queue, flow._graph(), text, key), conn)
        return WorkflowHandle(run_id, flow.name)

    async def astart(self, flow: Workflow, input: Any, conn: Any, key: str | None = None) -> WorkflowHandle:
        text, key = self._input(flow, input), check_key(key)
        with stored_whole("input"):
            run_id = await ain_tx(lambda: engine.start_run(flow.name, flow.queue, flow._graph(), text, key), conn)
        return WorkflowHandle(run_id, flow.name)


ENGINE = Runner()


def workflow(name: str, queue: str = "default") -> Workflow:
    """A new workflow named `name`, whose steps run on `queue` (docs/workflows.md)."""
    return Workflow(name, queue, ENGINE)

