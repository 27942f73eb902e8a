"""The demo's jobs: an "import" of N rows, each a job that reports progress; a durable import,
one job that fetches, fans its rows out as children, waits for an approval and writes a report,
parking between the steps; and the same import as a workflow, `demo_import`, whose steps are
jobs of their own (docs/workflows.md)."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

from .. import jobs

log = logging.getLogger("livepush.demo")

# How long a durable import waits for someone to press Approve before it gives up.
APPROVAL_TIMEOUT = 3600.0
APPROVAL = "approval"  # the signal's name: the page's Approve button sends it
# The import_id of the rows of an import the page started (Start import): a durable import's rows
# carry its job id, a workflow's its run id. It tells the page's own imports from those groups.
PAGE_IMPORT = 0


@jobs.job(queue="demo", max_attempts=3, timeout=60)
async def import_row(ctx: jobs.JobContext, import_id: int, row: int) -> None:
    steps = 4
    for step in range(1, steps + 1):
        await asyncio.sleep(random.uniform(0.05, 0.3))  # stands in for real work
        await ctx.progress(step, steps, f"row {row}: step {step} of {steps}")


@jobs.job(queue="demo")
async def import_finished(ctx: jobs.JobContext, import_id: int) -> None:
    """The group's on_finish callback: runs once, after every row is done."""
    g = ctx.group
    assert g is not None  # a callback's: its group's (a job enqueued on its own has none)
    log.info("import of group %s finished: %s succeeded, %s failed, %s cancelled", g.id, g.succeeded, g.failed, g.cancelled)


@jobs.job(queue="demo", max_attempts=3, timeout=60)
async def import_file(ctx: jobs.JobContext, rows: int) -> dict[str, Any]:
    """A durable import. Every parking call ends the run and a later run replays from the top,
    so everything outside the checkpoints must be safe to run again."""

    async def download() -> dict[str, Any]:
        chunks = 10
        name = f"import-{ctx.job_id}.csv"
        for chunk in range(1, chunks):
            await asyncio.sleep(0.1)  # stands in for the network
            await ctx.progress(chunk, chunks, f"downloading {name}: {chunk * 10} %")
        # The last progress stays on the page while the job waits: it says what was fetched.
        await ctx.progress(chunks, chunks, f"downloaded {name}: {rows} rows")
        return {"file": name, "rows": rows}

    fetched = await ctx.checkpoint("fetch", download)
    await ctx.run_children([import_row.request(ctx.job_id, row) for row in range(fetched["rows"])])
    try:
        approval = await ctx.wait_for_signal(APPROVAL, timeout=APPROVAL_TIMEOUT)
    except jobs.SignalTimeout:
        return {"file": fetched["file"], "rows": fetched["rows"], "approved": False, "report": None}

    async def write_report() -> str:
        await ctx.progress(0, 1, "writing the report")
        await asyncio.sleep(0.3)  # stands in for writing a file
        await ctx.progress(1, 1, "report written")
        return f"report-{ctx.job_id}.txt"

    report = await ctx.checkpoint("report", write_report)
    approved_by = approval.get("by") if isinstance(approval, dict) else None
    return {"file": fetched["file"], "rows": fetched["rows"], "approved": True, "approved_by": approved_by,
            "report": report}


# -- the workflow: fetch -> rows (a fan-out) -> report (after an approval) -----------------------

WORKFLOW = "demo_import"
flow = jobs.workflow(WORKFLOW, queue="demo")


@flow.step(name="fetch")
async def fetch_file(ctx: jobs.StepContext) -> dict[str, Any]:
    """Downloads the run's file. It takes about two seconds, so a person (or a test) can press
    Pause while it runs and see that nothing new starts after it."""
    chunks = 10
    name = f"workflow-{ctx.run_id}.csv"
    rows = int(ctx.input["rows"])
    for chunk in range(1, chunks):
        await asyncio.sleep(0.2)  # stands in for the network
        await ctx.progress(chunk, chunks, f"downloading {name}: {chunk * 10} %")
    await ctx.progress(chunks, chunks, f"downloaded {name}: {rows} rows")
    return {"file": name, "rows": rows}


@flow.fan_out(name="rows", after=["fetch"])
def import_rows(ctx: jobs.StepContext, batch: Any) -> None:
    """One import_row job per row: they run as a task group the step parks on."""
    for row in range(ctx.outputs["fetch"]["rows"]):
        batch.enqueue(import_row, ctx.run_id, row)


@flow.step(name="report", after=["rows"], wait_for=APPROVAL, wait_timeout=APPROVAL_TIMEOUT, on_timeout="cancel")
async def write_report(ctx: jobs.StepContext) -> dict[str, Any]:
    """Starts once the page's Approve sent the signal; its output is the run's summary."""
    await ctx.progress(0, 1, "writing the report")
    await asyncio.sleep(0.3)  # stands in for writing a file
    await ctx.progress(1, 1, "report written")
    fetched, batch = ctx.outputs["fetch"], ctx.outputs["rows"]
    approved_by = ctx.signal.get("by") if isinstance(ctx.signal, dict) else None
    return {"file": fetched["file"], "rows": fetched["rows"], "imported": batch["succeeded"],
            "approved_by": approved_by, "report": f"workflow-report-{ctx.run_id}.txt"}
