"""Workflows the random interleaving test of workflows starts (tests/jobs/test_workflows_random.py).

That test plays the runtimes itself, through the statements and steps the runtime runs, so the
step functions here are never called: only the graphs (steps, what each comes after, signal
waits, fan-outs, attempts) matter. All of it runs on one queue.
"""

from __future__ import annotations

from typing import Any

from livepush import jobs

QUEUE = "wfr"
SIGNAL = "go"


def never(*args: Any) -> None:
    raise AssertionError("the random interleaving test plays every job itself: no runtime runs this")


@jobs.job(name="wfr.member", queue=QUEUE, max_attempts=1)
async def member(ctx: Any, i: int) -> None:
    never()


# a -> (b, c waiting for a signal) -> d
diamond = jobs.workflow("wfr_diamond", queue=QUEUE)
diamond.step(name="a", max_attempts=3)(never)
diamond.step(name="b", after="a", max_attempts=2)(never)
diamond.step(name="c", after="a", wait_for=SIGNAL)(never)
diamond.step(name="d", after=["b", "c"])(never)

# a -> (spread, a fan-out the failures of which pause the run -> e) and (f, beside it)
fan = jobs.workflow("wfr_fan", queue=QUEUE)
fan.step(name="a")(never)
fan.fan_out(name="spread", after="a", on_batch_failure="pause")(never)
fan.step(name="e", after="spread")(never)
fan.step(name="f", after="a", max_attempts=2)(never)

# x -> y (waits for a signal) -> z (a fan-out skipped on failures) -> w
line = jobs.workflow("wfr_line", queue=QUEUE)
line.step(name="x")(never)
line.step(name="y", after="x", wait_for=SIGNAL)(never)
line.fan_out(name="z", after="y", on_batch_failure="skip")(never)
line.step(name="w", after="z")(never)

FLOWS = {f.name: f for f in (diamond, fan, line)}
