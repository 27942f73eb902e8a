"""What the churn tests compare: the counts a long-lived process keeps, taken once it is idle and
again after rounds of work, must not have grown with that work."""

from __future__ import annotations

from collections.abc import Mapping

# A process's periodic loops (readiness, pruning, beats, keeps) each hold a loop timer while they
# sleep and none while they run, and a periodic task may be in flight: two idle moments differ by
# a few of these whatever happened between them. A leak grows with the work: hundreds.
TRANSIENT = 4


def grown(idle: Mapping[str, int], after: Mapping[str, int]) -> dict[str, tuple[int | None, int | None]]:
    """Each count of `after` above its `idle` value (timers and tasks: above it by more than
    TRANSIENT), as (idle, after). A count below its idle value is fine: something of the warm-up
    (a connection not yet collected) has gone since."""
    out: dict[str, tuple[int | None, int | None]] = {}
    for key in idle.keys() | after.keys():
        slack = TRANSIENT if key == "loop.timers" or key.startswith("task ") else 0
        if after.get(key, 0) > idle.get(key, 0) + slack:
            out[key] = (idle.get(key), after.get(key))
    return out
