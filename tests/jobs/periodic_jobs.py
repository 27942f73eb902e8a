"""A periodic job for the runtimes the periodic tests start: every second, on its own queue (so the
in-process runtimes of other tests, which serve "default" and "second", never schedule it). Once a
full run has imported it, a runtime in the test process that serves every registered queue (no
`queues` given, as `livepush jobs` and `serve --with-jobs` build it) runs it too: such a test names
the job it means. Each run records its tick in `job_runs` (key)."""

from __future__ import annotations

from typing import Any

from livepush import jobs
from tests.jobs.sample_jobs import note

QUEUE = "periodic"


@jobs.periodic("* * * * * */1", timezone="UTC", queue=QUEUE)
async def every_second(ctx: Any, tick: str) -> None:
    await note(ctx, "tick", tick)
