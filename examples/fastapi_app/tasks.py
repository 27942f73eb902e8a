"""The example's job: a report built in a few steps, each reported as progress; when it is done
it leaves a notice on its user's topic. Run it with `livepush jobs examples.fastapi_app.tasks`
(or `livepush serve --with-jobs examples.fastapi_app.tasks`)."""

from __future__ import annotations

import asyncio

import livepush
from livepush import jobs

QUEUE = "reports"
STEP_SECONDS = 0.4  # each step stands in for real work


def notices_topic(subject: str) -> str:
    """The topic of one user's notices."""
    return f"user:{subject}"


@jobs.job(queue=QUEUE, max_attempts=3, timeout=60)
async def build_report(ctx: jobs.JobContext, subject: str, steps: int) -> dict[str, int]:
    await ctx.progress(0, steps, "starting")
    for step in range(1, steps + 1):
        await asyncio.sleep(STEP_SECONDS)
        await ctx.progress(step, steps, f"step {step} of {steps}")
    await livepush.apublish(notices_topic(subject), {"text": f"report {ctx.job_id} is ready"})
    return {"steps": steps}
