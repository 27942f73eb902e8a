"""A module whose periodic job has the cron expression and zone of the environment variables
PERIODIC_TEST_CRON and PERIODIC_TEST_TIMEZONE: importing it with bad ones must fail."""

from __future__ import annotations

import os
from typing import Any

from livepush import jobs


@jobs.periodic(os.environ.get("PERIODIC_TEST_CRON", "* * * * *"),
               timezone=os.environ.get("PERIODIC_TEST_TIMEZONE", "UTC"), queue="periodic-bad")
def configured(ctx: Any, tick: str) -> None:
    pass
