"""Every argument of the jobs and workflows API that takes seconds takes a `datetime.timedelta`
too, as its seconds, and refuses a negative one as it refuses a negative number (docs/jobs.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from livepush import ArgumentValueError, jobs
from livepush.jobs.api.registry import REGISTRY, Registry
from livepush.jobs.errors import Reattempt
from livepush.jobs.runtime.executor import retry_delay
from livepush.jobs.runtime.runtime import Runtime
from livepush.jobs.workflows.runner import Flow
from tests.jobs.conftest import q
from tests.jobs.conftest import running
from tests.support.waiting import async_wait_for

QUEUE = "seconds-test"


@jobs.job(name="sec.noop", queue=QUEUE, timeout=timedelta(minutes=2),
          backoff=lambda attempt: timedelta(seconds=7 * attempt))
async def noop(ctx: Any) -> None:
    pass


@jobs.job(name="sec.durable", queue=QUEUE, max_attempts=1)
async def durable(ctx: Any) -> str:
    await ctx.sleep("nap", timedelta(milliseconds=200))
    try:
        await ctx.wait_for_signal("go", timeout=timedelta(milliseconds=200))
    except jobs.SignalTimeout:
        return "timed out"
    return "signalled"


flow = jobs.workflow("t_seconds", queue=QUEUE)


@flow.step(wait_for="go", wait_timeout=timedelta(hours=1), timeout=timedelta(seconds=90))
async def approved(ctx: Any) -> None:
    pass


def _due_in(url: str, job_id: int) -> float:
    return float(q(url, "SELECT extract(epoch FROM run_at - now()) FROM livepush_jobs WHERE id = %s", (job_id,))[0][0])


def test_enqueue_options_take_a_timedelta(jobs_db: str) -> None:
    """wait= (of enqueue and of an enqueue_many item) and debounce= count a timedelta's seconds."""
    waited = noop.enqueue(wait=timedelta(seconds=30))
    (item,) = jobs.enqueue_many([(noop, [], {"wait": timedelta(minutes=1)})])
    debounced = noop.enqueue(key="k", debounce=timedelta(seconds=20))
    assert 25 < _due_in(jobs_db, waited.id) <= 30
    assert 55 < _due_in(jobs_db, item.id) <= 60
    assert 15 < _due_in(jobs_db, debounced.id) <= 20
    for call in (lambda: noop.enqueue(wait=timedelta(seconds=-1)),
                 lambda: noop.enqueue(key="k", debounce=timedelta(seconds=-1))):
        with pytest.raises(ArgumentValueError, match="zero or more seconds"):
            call()


def test_job_step_and_runtime_options_take_a_timedelta() -> None:
    """timeout=, wait_timeout=, a backoff= that returns one, reattempt(wait=) and a runtime's
    seconds are the timedelta's seconds; a negative one is refused with the option's error."""
    assert noop.timeout == 120.0
    assert retry_delay(noop, 1, 2) == 14.0
    assert flow.steps["approved"].wait_timeout == 3600.0
    assert REGISTRY.get("t_seconds.approved").timeout == 90.0
    with pytest.raises(Reattempt) as reattempt:
        Flow().reattempt(wait=timedelta(seconds=2))
    assert reattempt.value.seconds == 2.0
    rt = Runtime(Registry(), queues=[QUEUE], install_signals=False, heartbeat=timedelta(seconds=5),
                 poll_interval=timedelta(milliseconds=500), shutdown_timeout=timedelta(seconds=3),
                 retention=timedelta(days=1))
    assert (rt.heartbeat, rt.poll_interval, rt.shutdown_timeout, rt.retention) == (5.0, 0.5, 3.0, 86400.0)
    with pytest.raises(ValueError, match="timeout"):
        jobs.job(name="sec.negative", timeout=timedelta(seconds=-1))(noop.func)
    with pytest.raises(jobs.WorkflowDefinitionError, match="wait_timeout"):
        jobs.workflow("t_seconds_negative").step(wait_for="go", wait_timeout=timedelta(seconds=-1))(approved)
    with pytest.raises(ValueError, match="reattempt"):
        Flow().reattempt(wait=timedelta(seconds=-1))


async def test_a_durable_sleep_and_signal_timeout_take_a_timedelta(jobs_db: str) -> None:
    """ctx.sleep() and ctx.wait_for_signal(timeout=) count a timedelta's seconds."""
    h = await durable.aenqueue()
    async with running(queues=[QUEUE]):
        async def done() -> Any:
            found = await jobs.aget_job(h.id)
            return found if found is not None and found.state in ("succeeded", "failed") else None

        finished = await async_wait_for(done, 15.0, message=f"job {h.id} to finish")
    assert (finished.state, finished.result) == ("succeeded", "timed out"), finished.error


async def test_waiting_for_a_runtime_to_start_takes_a_timedelta() -> None:
    """Runtime.wait_started(timeout=) counts a timedelta's seconds: a runtime never run times out
    after them (TimeoutError), rather than the timedelta being refused as no number."""
    rt = Runtime(Registry(), queues=[QUEUE], install_signals=False)
    with pytest.raises(TimeoutError):
        await rt.wait_started(timeout=timedelta(milliseconds=50))


@pytest.mark.parametrize("timeout", ["5", -1, timedelta(seconds=-1), float("nan"), float("inf"), True])
async def test_waiting_for_a_runtime_to_start_refuses_a_timeout_that_is_no_number_of_seconds(timeout: Any) -> None:
    """wait_started(timeout=) refuses what is no bound at once, naming the argument and what it
    takes (None for no bound), as the other seconds arguments do: a str raised a bare TypeError
    from inside asyncio, and a negative number timed out at once as if the runtime had not started."""
    rt = Runtime(Registry(), queues=[QUEUE], install_signals=False)
    with pytest.raises((ArgumentValueError, TypeError), match=r"wait_started\(timeout=\)"):
        await rt.wait_started(timeout=timeout)


# The parameters of the jobs API that take seconds, by name (backoff=: what its function returns).
SECONDS_PARAMETERS = {"timeout", "wait", "seconds", "debounce", "wait_timeout", "heartbeat", "poll_interval",
                      "shutdown_timeout", "retention", "backoff", "ttl"}


def test_the_signatures_a_type_checker_reads_take_a_timedelta_where_seconds_go() -> None:
    """Each seconds parameter of what livepush.jobs exports (and of @jobs.job's typed overloads,
    which editors and mypy read) is annotated `Seconds`, a number or a timedelta: a user whose
    timedelta the code takes is not told by the type checker that it is wrong."""
    import inspect
    import typing

    def signatures(obj: Any) -> list[inspect.Signature]:
        found = []
        for f in ([obj, *typing.get_overloads(obj)] if inspect.isfunction(obj) else
                  [obj.__init__, *(v for n, v in vars(obj).items() if not n.startswith("_") and inspect.isfunction(v))]
                  if inspect.isclass(obj) and not issubclass(obj, BaseException) else []):
            try:
                found.append(inspect.signature(f))
            except (TypeError, ValueError):
                pass
        return found

    wrong = [f"{name}({p.name}: {p.annotation})" for module in (jobs,) for name in module.__all__
             for signature in signatures(getattr(module, name)) for p in signature.parameters.values()
             if p.name in SECONDS_PARAMETERS and "Seconds" not in str(p.annotation)]
    assert not wrong, wrong


async def test_a_number_of_seconds_no_float_holds_is_refused_as_out_of_range() -> None:
    """An int past what a float holds (10**400) passes a comparison with infinity, and asyncio and
    Python's timedelta then failed on it with a bare OverflowError: wait_started(timeout=),
    ctx.group.enqueue(timeout=) and ctx.flow.reattempt(wait=) refuse it at the call, as the
    infinity it stands for, naming the argument."""
    from livepush.jobs.groups.context import SyncGroupContext

    rt = Runtime(Registry(), queues=[QUEUE], install_signals=False)
    with pytest.raises(ArgumentValueError, match=r"wait_started\(timeout=\)"):
        await rt.wait_started(timeout=10**400)
    with pytest.raises(ArgumentValueError, match=r"ctx\.group\.enqueue\(timeout=\)"):
        SyncGroupContext(None, None).enqueue(noop, timeout=10**400)  # type: ignore[arg-type]
    with pytest.raises(ArgumentValueError, match=r"reattempt\(wait=\)"):
        Flow().reattempt(wait=10**400)
