"""A cron schedule in a time zone: which ticks are due at a given instant, and when the next one
comes. Parsing and stepping are croniter's; this module checks what we accept."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from ..errors import InvalidScheduleError

# Minute hour day-of-month month day-of-week, and optionally seconds as a sixth field (croniter's
# order: "* * * * * */10" is every ten seconds). A seventh (year) field is refused: it is not
# cron, and a schedule that ends makes a periodic job that silently stops.
FIELDS = (5, 6)

# croniter's random field (`R`, `R(0-30)`, `R/10`) is drawn anew each time a schedule is built,
# and we build one per round: every round and every runtime would have its own ticks.
_RANDOM = re.compile(r"r(\(\d+-\d+\))?(/\d+)?", re.IGNORECASE | re.ASCII)


def _zone(expression: str, timezone: str) -> ZoneInfo:
    if not isinstance(timezone, str) or not timezone:
        raise InvalidScheduleError(f"periodic {expression!r}: timezone= takes an IANA zone name such as "
                                   f"'UTC' or 'Europe/Paris', got {timezone!r}")
    if timezone == "localtime":
        # Found in the zone folder of most Linux machines (a link to /etc/localtime), but each
        # machine's own zone: runtimes on machines set differently would not agree on the ticks.
        raise InvalidScheduleError(f"periodic {expression!r}: timezone 'localtime' is each machine's own zone, so "
                                   "runtimes could disagree on the ticks: name the zone, such as 'Europe/Paris'")
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidScheduleError(f"periodic {expression!r}: unknown timezone {timezone!r}: use an IANA zone "
                                   "name such as 'UTC' or 'Europe/Paris'") from None


@dataclasses.dataclass(frozen=True)
class Cron:
    """A checked cron expression and its time zone (see `parse`)."""

    expression: str
    timezone: str
    zone: ZoneInfo

    def latest_due(self, now: datetime) -> datetime:
        """The newest tick at or before `now`, in the schedule's zone."""
        # Ticks fall on whole seconds, and croniter's get_prev is strictly before its start: the
        # newest tick before the next whole second is the newest one at or before `now`. The second
        # is added in UTC: arithmetic on a zoned datetime is on the wall clock and drops `fold`, so
        # in the hour a fall-back repeats it would start an hour early and miss that hour's ticks.
        start = (now.astimezone(UTC).replace(microsecond=0) + timedelta(seconds=1)).astimezone(self.zone)
        return croniter(self.expression, start).get_prev(datetime)

    def next_after(self, now: datetime) -> datetime:
        """The first tick strictly after `now`, in the schedule's zone."""
        return croniter(self.expression, now.astimezone(self.zone)).get_next(datetime)


def parse(expression: str, timezone: str = "UTC") -> Cron:
    """Check a cron expression and a zone name; InvalidScheduleError names what is wrong."""
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidScheduleError(f"periodic: a cron expression is a non-empty string such as '*/5 * * * *', "
                                   f"got {expression!r}")
    zone = _zone(expression, timezone)
    fields = expression.split()
    if not expression.strip().startswith("@") and len(fields) not in FIELDS:
        raise InvalidScheduleError(
            f"periodic {expression!r}: a cron expression has 5 fields (minute hour day month weekday) or 6 "
            f"(a sixth for seconds), got {len(fields)}")
    if any(_RANDOM.fullmatch(field) for field in fields):
        raise InvalidScheduleError(f"periodic {expression!r}: a random field (R) is drawn anew by every runtime "
                                   "and every round, so its ticks would not be the same twice: pick the value")
    try:
        croniter(expression, datetime.now(zone)).get_next(datetime)
    except (CroniterError, ValueError, KeyError) as exc:
        raise InvalidScheduleError(f"periodic {expression!r}: not a valid cron expression ({exc})") from None
    return Cron(expression, timezone, zone)
