"""A job module for `livepush serve --with-jobs` whose runtime has a part that fails for good:
its promoter raises on every run (a bug no restart fixes), and restarts come quickly."""

from __future__ import annotations

import functools
from typing import Any

from livepush import jobs, tasks
from livepush.jobs.runtime import maintenance, runtime


async def _broken(*_args: Any, **_kwargs: Any) -> int:
    raise RuntimeError("a bug in the promoter")


maintenance.promote = _broken  # type: ignore[assignment]
runtime.supervise = functools.partial(tasks.supervise, backoff=(0.01, 0.02), give_up=3)  # type: ignore[assignment]


@jobs.job(name="t.failing.noop", queue="failing")
async def noop(ctx: Any) -> None:
    pass
