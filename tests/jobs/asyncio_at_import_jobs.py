"""A job module whose project runs async code at import (its set-up, a client's warm-up), as the
runtime must be able to load it."""

from __future__ import annotations

import asyncio

from livepush import jobs

SET_UP = asyncio.run(asyncio.sleep(0, result="set up"))


@jobs.job(name="t.asyncio_at_import")
def noop(ctx: object) -> None:
    pass
