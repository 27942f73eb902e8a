"""A cron schedule in a time zone: which ticks are due at a given instant, and when the next one
comes. Parsing and stepping are croniter's; this module checks what we accept."""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import CroniterBadDateError, CroniterError, croniter

from ..errors import InvalidScheduleError

log = logging.getLogger("livepush.jobs")

# Minute hour day-of-month month day-of-week, and optionally seconds as a sixth field (croniter's
# order: "* * * * * */10" is every ten seconds). A seventh (year) field is refused: it is not
# cron, and a schedule that ends makes a periodic job that silently stops.
FIELDS = (5, 6)

# How far from an instant a clock change is looked for: beyond every zone's change of offset (an
# hour in most, 30 minutes on Lord Howe Island), so every tick a change moves is in reach.
CHANGE_WINDOW = timedelta(hours=3)

# croniter's random field (`R`, `R(0-30)`, `R/10`) is drawn anew each time a schedule is built,
# and we build one per round: every round and every runtime would have its own ticks.
_RANDOM = re.compile(r"r(\(\d+-\d+\))?(/\d+)?", re.IGNORECASE | re.ASCII)

# croniter's hashed field (`H`, `H(0-29)`, `H/15`) needs an id to hash that we do not pass: croniter
# refuses it with an error about an argument the user never sees, so it is named here instead.
_HASHED = re.compile(r"h(\(\d+-\d+\))?(/\d+)?", re.IGNORECASE | re.ASCII)

# Zones that import fine but seldom mean what their author meant: `Etc/GMT+5` is UTC-5 (the Etc
# names reverse the sign, as POSIX does), and `EST` and `MST` are fixed offsets, with no daylight
# saving, where a place's time was mostly meant. Their ticks would come an hour or more from
# where they were wanted, so a warning names what the zone means (once a process per zone).
_ETC_OFFSET = re.compile(r"Etc/GMT([+-])(\d{1,2})", re.ASCII)
_FIXED_US = {"EST": ("UTC-05:00", "'America/New_York' for US Eastern time"),
             "MST": ("UTC-07:00", "'America/Denver' for US Mountain time ('America/Phoenix' for Arizona's, "
                                  "which has none)")}
_WARNED: set[str] = set()

# Each field's name, how many values it holds, what it starts again with and the values it takes
# (besides '*', lists, ranges and steps), in croniter's order.
_FIELD_SPANS = (("minute", 60, "hour", "0-59"), ("hour", 24, "day", "0-23"),
                ("day-of-month", 31, "month", "1-31, L (the last day) or 15W (the weekday nearest the 15th)"),
                ("month", 12, "year", "1-12 or JAN-DEC"),
                ("day-of-week", 7, "week", "0-7 (0 and 7 are Sunday) or SUN-SAT, MON#1 (the first Monday) or L5 "
                                           "(the last Friday)"),
                ("second", 60, "minute", "0-59"))
# croniter's errors start with the whole expression, lower-cased, then what it found wrong.
_CRONITER_PREFIX = re.compile(r"^\[[^\]]*\]\s*(is not acceptable)?[\s.,]*")
_STEP = re.compile(r"/(\d+)$", re.ASCII)

# The nicknames croniter reads (its `@reboot` and others are not: they name no tick).
NICKNAMES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")


def _zone(expression: str, timezone: str) -> ZoneInfo:
    if not isinstance(timezone, str) or not timezone:
        raise InvalidScheduleError(f"periodic {expression!r}: timezone= takes an IANA zone name such as "
                                   f"'UTC' or 'Europe/Paris', got {timezone!r}")
    if timezone in ("localtime", "posixrules"):
        # Found in the zone folder of most Linux machines (a link to /etc/localtime), but each
        # machine's own zone: runtimes on machines set differently would not agree on the ticks.
        # 'posixrules' is a copy of one zone, which one depending on the machine.
        raise InvalidScheduleError(f"periodic {expression!r}: timezone {timezone!r} is each machine's own zone, so "
                                   "runtimes could disagree on the ticks: name the zone, such as 'Europe/Paris'")
    variant = timezone.split("/", 1)
    if len(variant) == 2 and variant[0] in ("posix", "right"):
        # Copies of every zone that only some machines' zone folders hold (not the tzdata
        # package), 'right/' ones counting leap seconds: a module would import on one machine
        # and fail on the next, or tick some 27 s off.
        raise InvalidScheduleError(f"periodic {expression!r}: timezone {timezone!r} is a variant that only some "
                                   f"machines have: use {variant[1]!r}")
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        pass
    except OSError:
        # A region such as 'Europe' is a folder of zones: opening it raises IsADirectoryError.
        pass
    else:
        _check_spelling(expression, timezone)
        _warn_if_seldom_meant(expression, timezone)
        return zone
    if not available_timezones():
        # No zone at all, 'UTC' included: the machine has no time zone database (Windows, Alpine and
        # other slim images), and calling every name unknown would send the user after a typo.
        raise InvalidScheduleError(f"periodic {expression!r}: timezone {timezone!r} cannot be read: this machine "
                                   "has no time zone database; install the tzdata package (pip install tzdata) "
                                   "or the system's tzdata") from None
    _check_spelling(expression, timezone)
    raise InvalidScheduleError(f"periodic {expression!r}: unknown timezone {timezone!r}: use an IANA zone "
                               "name such as 'UTC' or 'Europe/Paris'") from None


def _warn_if_seldom_meant(expression: str, timezone: str) -> None:
    """A warning naming what `timezone` means, for the zones that seldom mean what was meant."""
    if timezone in _WARNED:
        return
    etc = _ETC_OFFSET.fullmatch(timezone)
    if etc is not None and int(etc[2]) != 0:
        sign, hours = etc[1], int(etc[2])
        real = "-" if sign == "+" else "+"
        means = f"UTC{real}{hours:02d}:00"
        other = f"Etc/GMT{real}{hours}"
        write = f"write '{other}' for UTC{sign}{hours:02d}:00, or" if other in _zone_names()[0] else "use"
        hint = f"the Etc names reverse the sign, as POSIX does: {write} a place's zone (such as 'Europe/Paris')"
    elif timezone in _FIXED_US:
        means, place = _FIXED_US[timezone]
        hint = f"a place's local time, with its daylight saving, is its zone's: {place}"
    else:
        return
    _WARNED.add(timezone)
    log.warning("periodic %r: timezone %r is %s all year, with no daylight saving; %s", expression, timezone,
                means, hint)


def _check_spelling(expression: str, timezone: str) -> None:
    """Zone names are file names: a case-insensitive file system (macOS) reads 'europe/paris', and
    a module imported there failed on Linux. Refused everywhere, naming the spelling that works."""
    names, lowered = _zone_names()
    if timezone in names:
        return
    spelled = lowered.get(timezone.lower())
    if spelled is not None:
        raise InvalidScheduleError(f"periodic {expression!r}: unknown timezone {timezone!r}: zone names are "
                                   f"case-sensitive: use {spelled!r}") from None


@functools.cache
def _zone_names() -> tuple[frozenset[str], dict[str, str]]:
    """Every zone name, and each one by its lower case (read once: walking the zone folders takes
    tens of milliseconds, and a module may declare many periodic jobs)."""
    names = frozenset(available_timezones())
    return names, {n.lower(): n for n in names}


@dataclasses.dataclass(frozen=True)
class Cron:
    """A checked cron expression and its time zone (see `parse`)."""

    expression: str
    timezone: str
    zone: ZoneInfo
    # Cron's wildcard job: its minute or hour field starts with '*' (`*/15 * * * *`, `0 * * * *`,
    # `@hourly`). When the clocks go back it runs at both passes of the repeated hour, as it does
    # every hour; a job at a fixed time (`30 1 * * *`) runs at the first pass only, as in cron,
    # where a daily job run twice in one night was the surprise (docs/jobs.md).
    wildcard: bool

    def latest_due(self, now: datetime) -> datetime:
        """The newest tick at or before `now`, in the schedule's zone."""
        return self._first_pass_only(self._latest_due(now), self._latest_due, newest=True)

    def next_after(self, now: datetime) -> datetime:
        """The first tick strictly after `now`, in the schedule's zone."""
        return self._first_pass_only(self._next_after(now), self._next_after, newest=False)

    def _first_pass_only(self, tick: datetime, find: Callable[[datetime], datetime], *, newest: bool) -> datetime:
        """`tick`, unless it is a fixed-time job's tick in the second pass of a repeated hour, whose
        wall time the first pass ran: then what `find` finds next to that second pass, the newest
        tick before it (`newest`) or the first after it."""
        if self.wildcard or tick.astimezone(self.zone).fold == 0:
            return tick
        first = tick.astimezone(self.zone).replace(fold=0).astimezone(UTC)  # the first pass's instant
        later = tick.astimezone(UTC)
        # The second pass runs from the change of the clocks until they show again what they
        # showed at it: as long as the clocks went back.
        start = self._change(first, later)
        return find((start if newest else start + (later - first)) - timedelta(seconds=1))

    def _latest_due(self, now: datetime) -> datetime:
        """latest_due counting every pass of a repeated hour (a wildcard job's ticks)."""
        # Ticks fall on whole seconds, and croniter's get_prev is strictly before its start: the
        # newest tick before the next whole second is the newest one at or before `now`. The second
        # is added in UTC: arithmetic on a zoned datetime is on the wall clock and drops `fold`.
        start = (now.astimezone(UTC).replace(microsecond=0) + timedelta(seconds=1)).astimezone(self.zone)
        found: datetime = croniter(self.expression, start).get_prev(datetime).astimezone(UTC)
        # croniter steps zoned times on the wall clock, and across a change of the clocks it can
        # step over a tick: for "45 * * * *" the 02:45 a spring-forward skips never came (it
        # comes at the end of the gap, docs/jobs.md), while "30 2 * * *"'s did. Each side of a
        # change has one UTC offset, so there the ticks are plain wall-clock ticks shifted by it
        # (_around), and the newest of both is the tick.
        around = self._around(now.astimezone(UTC), newest=True)
        if self._pushed_past_a_gap(found):
            # Its own tick comes at the gap's end, next to the change just before that answer:
            # _around from there has it, and croniter is right about what follows.
            return max([*around, *self._around(found, newest=True)]).astimezone(self.zone)
        return max([found, *around]).astimezone(self.zone)

    def _next_after(self, now: datetime) -> datetime:
        """next_after counting every pass of a repeated hour (a wildcard job's ticks)."""
        found: datetime = croniter(self.expression, now.astimezone(self.zone)).get_next(datetime).astimezone(UTC)
        around = self._around(now.astimezone(UTC), newest=False)
        if self._pushed_past_a_gap(found):
            # As in latest_due: the ticks next to the change just before that answer, those still
            # to come; none when that change is past (the gap's tick with it): then the next.
            later = [t for t in self._around(found - CHANGE_WINDOW, newest=False) if t > now]
            if not [*around, *later]:
                return self._next_after(found)
            return min([*around, *later]).astimezone(self.zone)
        return min([found, *around]).astimezone(self.zone)

    def _pushed_past_a_gap(self, found: datetime) -> bool:
        """Whether croniter's answer is a tick the clocks skipped, moved on by their jump ("0 2 *
        * * 30" answered as 03:00:30 on a spring-forward day): its wall time matches nothing, and
        a change of the clocks lies just before it. Taken as a tick, it would run a second time
        after the gap's own tick at its end (docs/jobs.md)."""
        return (self._offset(found - CHANGE_WINDOW) != self._offset(found)
                and not croniter.match(self.expression, found.astimezone(self.zone).replace(tzinfo=None)))

    def _offset(self, at: datetime) -> timedelta:
        offset = at.astimezone(self.zone).utcoffset()
        assert offset is not None
        return offset

    def _change(self, lo: datetime, hi: datetime) -> datetime:
        """The instant of the one change of the clocks in (lo, hi] (UTC, to the second; zones change
        on whole seconds): the offset is lo's up to it and hi's from it on."""
        before = self._offset(lo)
        lo = lo.replace(microsecond=0)
        while hi - lo > timedelta(seconds=1):
            mid = lo + timedelta(seconds=(hi - lo).total_seconds() // 2)
            if self._offset(mid) == before:
                lo = mid
            else:
                hi = mid
        return hi.replace(microsecond=0)

    def _prev_wall(self, wall: datetime) -> datetime:
        """The newest wall-clock tick strictly before `wall` (naive: no zone, no clock change)."""
        tick: datetime = croniter(self.expression, wall).get_prev(datetime)
        return tick

    def _next_wall(self, wall: datetime) -> datetime:
        tick: datetime = croniter(self.expression, wall).get_next(datetime)
        return tick

    def _around(self, now: datetime, *, newest: bool) -> list[datetime]:
        """The ticks next to a clock change within CHANGE_WINDOW of `now` (UTC), found one UTC
        offset at a time: with `newest`, those at or before `now` (the newest on each side of the
        change, and the change itself when a skipped wall time was a tick); else those after it.
        Empty when the offset does not change in that window (croniter is right there)."""
        sign = -1 if newest else 1
        far = now + sign * CHANGE_WINDOW
        if self._offset(far) == self._offset(now):
            return []
        lo, hi = (far, now) if newest else (now, far)
        before, after = self._offset(lo), self._offset(hi)
        change = self._change(lo, hi)

        def wall(at: datetime, offset: timedelta) -> datetime:
            return (at + offset).replace(tzinfo=None)

        found: list[datetime] = []
        # A clock that goes forward skips the wall times [change+before, change+after): a tick
        # among them comes at the change (docs/jobs.md).
        gap_tick = after > before and self._prev_wall(wall(change, after)) >= wall(change, before)
        if newest:
            # After the change (offset `after`): the newest tick at or before now, if it is past
            # the change.
            t = (self._prev_wall(wall(now.replace(microsecond=0) + timedelta(seconds=1), after))
                 .replace(tzinfo=UTC) - after)
            if change <= t <= now:
                found.append(t)
            if gap_tick and change <= now:
                found.append(change)
            # Before the change (offset `before`).
            t = self._prev_wall(wall(change, before)).replace(tzinfo=UTC) - before
            if t <= now:
                found.append(t)
        else:
            t = self._next_wall(wall(now, before)).replace(tzinfo=UTC) - before
            if now < t < change:
                found.append(t)
            if gap_tick and change > now:
                found.append(change)
            t = self._next_wall(wall(change, after) - timedelta(seconds=1)).replace(tzinfo=UTC) - after
            if t > now:
                found.append(t)
        return found


# Quartz's spellings of a last weekday: `5L`, `FRIL`, `LFRI`, and `L` alone (its Saturday). A
# month name such as JUL, written where the weekday goes, is none of them.
_QUARTZ_LAST_WEEKDAY = re.compile(r"([0-7]|[a-z]{3})l|l[a-z]{3}|l", re.IGNORECASE | re.ASCII)
# croniter's own: `L5`, the last Friday.
_LAST_WEEKDAY = re.compile(r"l[0-7]", re.IGNORECASE | re.ASCII)


def _check_last_weekday(expression: str, dow: str) -> None:
    """croniter writes the last Friday of the month `L5`, and refuses Quartz's `5L` (or `FRIL`, or
    `L` alone) as "not acceptable": said here with the spelling it takes."""
    if any(_QUARTZ_LAST_WEEKDAY.fullmatch(part) for part in dow.split(",")):
        raise InvalidScheduleError(f"periodic {expression!r}: the last weekday of the month is written 'L5' (the "
                                   f"last Friday: 'L' then the day's number, 0-7), not {dow!r}")


def _check_day_fields(expression: str, dom: str, dow: str) -> None:
    """Refuse day fields that system cron and croniter read differently. With both set, cron runs
    on a day that matches either, as croniter does, unless one of them starts with `*`: then cron
    wants both, and croniter still either. And beside an nth weekday (`MON#1`), a last weekday of
    the month (`L5`) or a nearest weekday (`15W`) croniter ignores the other field."""
    if dom in ("*", "?") or dow in ("*", "?"):
        return
    if dom.startswith("*") or dow.startswith("*"):
        raise InvalidScheduleError(
            f"periodic {expression!r}: with both day fields set, a day that matches either one runs, but system "
            f"cron reads a field that starts with '*' as both: write it without the '*' to mean either (1-31/2 "
            f"for every other day of the month, 0-6/2 for every other weekday), or set one day field to '*' and "
            f"check the other day in the job")
    if "#" in dow:
        ignored, beside = "month", "an nth weekday (#)"
    elif any(_LAST_WEEKDAY.fullmatch(part) for part in dow.split(",")):
        ignored, beside = "month", "a last weekday of the month (L)"
    elif "w" in dom.lower():
        ignored, beside = "week", "a nearest weekday (W)"
    else:
        return
    raise InvalidScheduleError(f"periodic {expression!r}: croniter would ignore the day of the {ignored} beside "
                               f"{beside}: set that field to '*'")


def _check_steps(expression: str, fields: list[str]) -> None:
    """Refuse a step longer than its field: cron counts it within the field, anew each hour (or
    day, ...), so "*/90" is minute 0 of every hour, never every 90 minutes, and croniter (as
    system cron did) takes it without a word. A step of the whole field ("*/60") is the period
    it names, and accepted."""
    for (name, span, unit, _), field in zip(_FIELD_SPANS, fields):
        for part in field.split(","):
            step = _STEP.search(part)
            if step is not None and int(step[1]) > span:
                raise InvalidScheduleError(
                    f"periodic {expression!r}: a step of {step[1]} in the {name} field matches only its first "
                    f"value: cron counts steps within the field, starting again each {unit}, so a period longer "
                    f"than a {unit} cannot be written as a step; run the job more often (a step that divides the "
                    f"{unit}) and let it check the time since its last run")


def _field_refused(fields: list[str]) -> str | None:
    """What croniter refuses in the first field it refuses alone (the others '*'), and the values
    that field takes; None when it refuses no field alone. Its own error names the expression, not
    the field, and with five or six of them the user looked for the wrong one."""
    for index, ((name, _, _, takes), field) in enumerate(zip(_FIELD_SPANS, fields)):
        probe = ["*"] * len(fields)
        probe[index] = field
        try:
            croniter(" ".join(probe))
        except (CroniterError, ValueError, KeyError) as exc:
            detail = _CRONITER_PREFIX.sub("", str(exc)).split("Cron:")[0]
            detail = re.sub(r" in field \d+", "", detail).strip(" .,")
            return (f"the {name} field {field!r} is not valid{f' ({detail})' if detail else ''}: it takes {takes}, "
                    f"'*', a list (1,15), a range (1-5) or a step (*/15)")
    return None


def _check_seconds_last(expression: str, fields: list[str]) -> None:
    """Refuse a six-field expression written seconds first, as Quartz and Spring order them."""
    if fields[5] == "*" and fields[0] != "*":
        # Their "every 5 minutes", "0 */5 * * * *", read in this order is every second of minute
        # 0 of every fifth hour: 60 runs in a burst.
        why = "so '*' there runs the job every second of each minute the first field names"
    elif "?" in fields[5] or any(c.isalpha() for c in fields[5]):
        # Their day-of-week comes last ("0 0 12 * * ?", "0 0 9 * * MON-FRI"): croniter's own
        # error spoke of question marks or of an expression "not acceptable".
        why = f"so {fields[5]!r} there, a day of the week in Quartz or Spring, is no second"
    else:
        return
    raise InvalidScheduleError(
        f"periodic {expression!r}: the sixth field is the seconds, last (not first, as in Quartz or Spring), "
        f"{why}: write the seconds last ('{' '.join([*fields[1:], fields[0]])}' if they came first), or drop "
        f"the sixth field")


def parse(expression: str, timezone: str = "UTC") -> Cron:
    """Check a cron expression and a zone name; InvalidScheduleError names what is wrong."""
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidScheduleError(f"periodic: a cron expression is a non-empty string such as '*/5 * * * *', "
                                   f"got {expression!r}")
    # Read from a config file or an environment variable, it may end in a newline: croniter
    # splits fields on whitespace, but takes a nickname only bare.
    expression = expression.strip()
    zone = _zone(expression, timezone)
    fields = expression.split()
    if expression.startswith("@"):
        if expression.lower() not in NICKNAMES:
            raise InvalidScheduleError(f"periodic {expression!r}: unknown nickname: use one of {', '.join(NICKNAMES)}, "
                                       "or cron fields such as '*/5 * * * *'")
    elif len(fields) not in FIELDS:
        raise InvalidScheduleError(
            f"periodic {expression!r}: a cron expression has 5 fields (minute hour day month weekday) or 6 "
            f"(a sixth for seconds), got {len(fields)}")
    if any(_RANDOM.fullmatch(field) for field in fields):
        raise InvalidScheduleError(f"periodic {expression!r}: a random field (R) is drawn anew by every runtime "
                                   "and every round, so its ticks would not be the same twice: pick the value")
    if any(_HASHED.fullmatch(field) for field in fields):
        raise InvalidScheduleError(f"periodic {expression!r}: a hashed field (H) is not supported: write the value "
                                   "it stands for (such as '7' for a minute)")
    if not expression.startswith("@"):
        if len(fields) == 6:
            # First: in the seconds-first order the fields before it are not the ones named here.
            _check_seconds_last(expression, fields)
        _check_last_weekday(expression, fields[4])
        _check_day_fields(expression, fields[2], fields[4])
        _check_steps(expression, fields)
    try:
        croniter(expression, datetime.now(zone)).get_next(datetime)
    except CroniterBadDateError:
        # croniter looks some fifty years ahead before it gives up: the fields are valid, but
        # their days never meet (30 February, 31 April).
        raise InvalidScheduleError(f"periodic {expression!r}: matches no date (a day of the month that none of the "
                                   "months it names has, such as 30 February): the job would never run") from None
    except (CroniterError, ValueError, KeyError) as exc:
        refused = None if expression.startswith("@") else _field_refused(fields)
        raise InvalidScheduleError(f"periodic {expression!r}: not a valid cron expression: "
                                   f"{refused or exc}") from None
    wildcard = expression.lower() == "@hourly" if expression.startswith("@") else \
        fields[0].startswith("*") or fields[1].startswith("*")
    return Cron(expression, timezone, zone, wildcard)
