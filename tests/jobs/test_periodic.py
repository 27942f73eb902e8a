"""Periodic jobs in this process: the decorator's checks at import, and the scheduler's rounds on a
real database (a new job starts from its next tick, missed ticks are enqueued once, many rounds at
once enqueue a tick once, the tick is ISO 8601 in the job's zone)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import zoneinfo
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from livepush import jobs
from livepush.errors import ConfigError
from livepush.jobs import database
from livepush.jobs.periodic import queries
from livepush.jobs.periodic.cron import parse
from livepush.jobs.periodic.decorator import SCHEDULES, Schedule
from livepush.jobs.periodic.scheduler import Scheduler
from livepush.jobs.api.registry import REGISTRY
from livepush.jobs.runtime.runtime import Runtime
from tests.support.waiting import async_wait_for
from tests.jobs.conftest import q, running

_names = itertools.count()


def declare(cron: str, timezone: str = "UTC") -> Schedule:
    """A fresh periodic job on a queue no runtime serves, and its schedule."""

    def tick_job(ctx: Any, tick: str) -> None:
        pass

    fn = jobs.periodic(cron, timezone=timezone, queue="periodic-in-process",
                       name=f"tests.periodic.job_{next(_names)}")(tick_job)
    return Schedule(fn, parse(cron, timezone))


@pytest.fixture
async def pool(jobs_db: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    try:
        yield await database.pools().aget()
    finally:
        await database.release_loop()


def last_tick(url: str, name: str) -> datetime | None:
    rows = q(url, "SELECT last_tick FROM livepush_periodic WHERE name = %s", (name,))
    return rows[0][0] if rows else None


def db_now(url: str) -> datetime:
    return q(url, "SELECT clock_timestamp()")[0][0]


def five_minutes_far_from_a_tick(url: str) -> str:
    """"*/5 * * * *" moved by whole minutes so that the database's clock is two minutes or more
    from a tick either side: a round and the checks after it see the same newest due tick, whatever
    minute the test runs in (a tick falling between them made the checks expect a newer one)."""
    return f"{(db_now(url).minute + 3) % 5}-59/5 * * * *"


def jobs_of(url: str, name: str) -> list[tuple[int, Any]]:
    return q(url, """SELECT j.id, p.args FROM livepush_jobs j JOIN livepush_job_payloads p ON p.id = j.id
                     WHERE j.name = %s ORDER BY j.id""", (name,))


def refused(cron: str, says: str) -> str:
    """The message of the InvalidScheduleError that declaring `cron` raises; it names the expression."""
    with pytest.raises(jobs.InvalidScheduleError, match=says) as caught:
        declare(cron)
    assert repr(cron) in str(caught.value)
    return str(caught.value)


# -- at import --------------------------------------------------------------------------------------

@pytest.mark.parametrize("cron, says", [
    ("*/5 * * *", "5 fields"),
    ("61 * * * *", "not a valid cron expression"),
    ("0 0 30 2 *", "matches no date"),
    ("0 0 31 4,6 *", "matches no date"),
    ("every five minutes", "5 fields"),
    ("* * * * * * 2030", "5 fields"),
    ("", "non-empty string"),
])
def test_a_bad_cron_expression_fails_at_decoration_naming_it(cron: str, says: str) -> None:
    with pytest.raises(jobs.InvalidScheduleError, match=says) as caught:
        declare(cron)
    assert repr(cron) in str(caught.value)
    assert isinstance(caught.value, ConfigError) and isinstance(caught.value, ValueError)


@pytest.mark.parametrize("cron, field, takes", [
    ("0 9 * * MONDAY", "day-of-week field 'MONDAY'", "MON"), ("0 9 1 JANUARY *", "month field 'JANUARY'", "JAN"),
    ("0 9 * * 1,2,", "day-of-week field '1,2,'", "0-7"), ("61 * * * *", "minute field '61'", "0-59"),
    ("0 0 0 * *", "day-of-month field '0'", "1-31"), ("0 0 * * * 60", "second field '60'", "0-59"),
    ("0 24 * * *", "hour field '24'", "0-23"), ("0 0 1W,15 * *", "day-of-month field '1W,15'", "single day"),
])
def test_a_field_croniter_refuses_is_named_with_what_it_takes(cron: str, field: str, takes: str) -> None:
    """croniter's "[0 9 * * monday] is not acceptable" named no field: with five or six of them,
    a user looked for the wrong one. The field is named, with the values it takes."""
    message = refused(cron, "not a valid cron expression")
    assert field in message and takes in message and "is not acceptable" not in message


@pytest.mark.parametrize("cron", ["R * * * *", "0 R(0-5) * * *", "r/10 * * * *", "* * * * * R", "0 0 * * R"])
def test_a_random_field_fails_at_decoration(cron: str) -> None:
    """croniter draws an `R` field anew for every schedule it builds: each round (and each runtime)
    would have its own ticks, and the job would be enqueued many times per period, not once."""
    with pytest.raises(jobs.InvalidScheduleError, match="random") as caught:
        declare(cron)
    assert repr(cron) in str(caught.value)


@pytest.mark.parametrize("cron", ["H * * * *", "0 H(0-5) * * *", "h/15 * * * *", "* * * * * H"])
def test_a_hashed_field_fails_at_decoration_saying_to_write_the_value(cron: str) -> None:
    """croniter's `H` needs an id livepush never passes: the user is told what to write instead,
    not about croniter's missing argument."""
    with pytest.raises(jobs.InvalidScheduleError, match=r"hashed field \(H\).*write the value") as caught:
        declare(cron)
    assert repr(cron) in str(caught.value) and "hash_id" not in str(caught.value)


@pytest.mark.parametrize("cron", ["0 0 */2 * 1", "0 0 1 * */2", "0 0 */2 * MON-FRI", "0 0 */3 * 1 30"])
def test_both_day_fields_set_with_a_star_first_fail_at_decoration(cron: str) -> None:
    """System cron reads a day-of-month or day-of-week that starts with `*` beside the other set
    as both (odd days that are Mondays), croniter as either (odd days, and Mondays): one crontab
    line would run on other days here, so the expression is refused, saying how to write either."""
    with pytest.raises(jobs.InvalidScheduleError, match=r"either.*1-31/2") as caught:
        declare(cron)
    assert repr(cron) in str(caught.value)


@pytest.mark.parametrize("cron", ["0 */5 * * * *", "0 0 * * * *", "30 9 * * 1 *", "0 0 12 * * ?", "0 0/5 * * * ?",
                                  "0 15 10 ? * MON-FRI", "0 0 9 * * mon"])
def test_a_seconds_first_expression_fails_at_decoration(cron: str) -> None:
    """The sixth field is seconds, last (croniter's order). Written seconds first, as Quartz and
    Spring order them, "every 5 minutes" ("0 */5 * * * *") reads as every second of minute 0 of
    every fifth hour: 60 runs in a burst. A `*` in the seconds field beside a set minute is that
    mistake, and so is a `?` or a weekday there (Quartz's "0 0 12 * * ?", Spring's
    "0 0 9 * * MON-FRI"), which croniter refused talking of question marks or of an expression
    "not acceptable": all are refused saying where the seconds go, with the expression that way."""
    with pytest.raises(jobs.InvalidScheduleError, match=r"seconds.*last") as caught:
        declare(cron)
    fields = cron.split()
    rewritten = " ".join([*fields[1:], fields[0]])
    assert repr(cron) in str(caught.value) and repr(rewritten) in str(caught.value)
    declare(rewritten)


@pytest.mark.parametrize("cron", ["* * * * * *", "*/5 * * * * 0", "0 */5 * * * 0", "* * * * * */10"])
def test_a_seconds_field_in_croniters_order_is_accepted(cron: str) -> None:
    declare(cron)


@pytest.mark.parametrize("cron, step, field", [
    ("*/90 * * * *", 90, "minute"), ("0 */36 * * *", 36, "hour"), ("0 0 */45 * *", 45, "day-of-month"),
    ("0 0 1 */18 *", 18, "month"), ("0 0 * * */10", 10, "day-of-week"), ("* * * * * */75", 75, "second"),
    ("5-59/90 * * * *", 90, "minute"), ("0 0 * * 1,*/8", 8, "day-of-week"),
])
def test_a_step_longer_than_its_field_fails_at_decoration(cron: str, step: int, field: str) -> None:
    """Cron counts a step within its field, anew each hour (or day, ...): "*/90 * * * *" is
    minute 0 of every hour, not every 90 minutes, and "0 0 * * */10" every Sunday. Such a step
    was accepted and the job ran on another period than the one written."""
    refused(cron, rf"step of {step} in the {field} field")


@pytest.mark.parametrize("cron", ["*/60 * * * *", "0 */24 * * *", "0 0 * * */7", "0 0 1 */12 *", "*/59 * * * *",
                                  "* * * * * */60", "0 0 */31 * *"])
def test_a_step_as_long_as_its_field_is_accepted(cron: str) -> None:
    """One step of the whole field ("*/60": hourly) is the period it names."""
    declare(cron)


@pytest.mark.parametrize("cron, ticks", [
    ("0 22-2 * * *", ["01-01 Tue 01:00", "01-01 Tue 02:00", "01-01 Tue 22:00", "01-01 Tue 23:00", "01-02 Wed 00:00"]),
    ("0 0 * * FRI-MON", ["01-04 Fri 00:00", "01-05 Sat 00:00", "01-06 Sun 00:00", "01-07 Mon 00:00", "01-11 Fri 00:00"]),
    ("0 0 31 * *", ["01-31 Thu 00:00", "03-31 Sun 00:00", "05-31 Fri 00:00", "07-31 Wed 00:00", "08-31 Sat 00:00"]),
    ("0 0 L * *", ["01-31 Thu 00:00", "02-28 Thu 00:00", "03-31 Sun 00:00", "04-30 Tue 00:00", "05-31 Fri 00:00"]),
])
def test_wrapping_ranges_and_month_ends_run_as_documented(cron: str, ticks: list[str]) -> None:
    """docs/jobs.md's reading of a range past its field's end (croniter wraps it; system cron
    refuses it) and of the 31st and `L`, pinned so that a croniter upgrade that reads them
    otherwise is seen."""
    schedule, at, seen = parse(cron), datetime(2030, 1, 1, 0, 30, tzinfo=ZoneInfo("UTC")), []
    for _ in ticks:
        at = schedule.next_after(at)
        assert schedule.latest_due(at) == at
        seen.append(at.strftime("%m-%d %a %H:%M"))
    assert seen == ticks


@pytest.mark.parametrize("cron", ["0 0 * * 5L", "0 0 * * FRIL", "0 0 * * LFRI", "0 0 * * L", "0 0 ? * 6L"])
def test_a_last_weekday_written_otherwise_than_croniter_fails_saying_how_to_write_it(cron: str) -> None:
    """croniter writes the last Friday of the month `L5`; Quartz's `5L` (or `FRIL`, or `L` alone)
    was refused as "not acceptable", which did not say what to write."""
    assert "not acceptable" not in refused(cron, r"last .* of the month is written 'L5'")


@pytest.mark.parametrize("cron, says", [("0 12 1 * JUL", "day-of-week field 'JUL' is not valid"),
                                        ("0 0 12 ? JUL *", "seconds.*last")])
def test_a_month_name_in_the_day_of_week_is_not_taken_for_a_last_weekday(cron: str, says: str) -> None:
    """JUL holds an 'l' but is no last weekday: a month name where the day of the week goes (or
    Quartz's month, there in its seconds-first order) is refused for what it is."""
    assert "last weekday" not in refused(cron, says)


@pytest.mark.parametrize("cron", ["0 0 1 * MON#1", "0 0 15W * 1", "0 0 1-7 * 5#2", "0 0 25 * L5", "0 0 1 * L5"])
def test_a_day_of_month_that_croniter_would_ignore_fails_at_decoration(cron: str) -> None:
    """croniter ignores the other day field beside an nth weekday (`MON#1`), a last weekday of the
    month (`L5`) or a nearest weekday (`15W`): the day-of-month (or day-of-week) the user wrote
    would never count ("0 0 25 * L5" ran on every last Friday, the 22nd too; "0 0 1 * L5" was
    refused as matching no date)."""
    with pytest.raises(jobs.InvalidScheduleError, match=r"ignore") as caught:
        declare(cron)
    assert repr(cron) in str(caught.value)


@pytest.mark.parametrize("cron", ["0 0 1,15 * 1", "0 0 1-31/2 * 1", "0 0 */2 * *", "0 0 * * */2", "0 0 ? * MON#1",
                                  "0 0 * * MON#1", "0 0 15W * *", "0 0 L * 1", "0 0 ? * L5"])
def test_day_fields_read_alike_by_cron_and_croniter_are_accepted(cron: str) -> None:
    declare(cron)

@pytest.mark.parametrize("cron", ["@reboot", "@every 5m", "@fortnightly"])
def test_an_unknown_nickname_fails_at_decoration_naming_the_known_ones(cron: str) -> None:
    """A nickname croniter does not read is named as one, with those it does, not as a count of
    columns that includes a seventh livepush refuses."""
    with pytest.raises(jobs.InvalidScheduleError, match="unknown nickname: use one of @yearly") as caught:
        declare(cron)
    assert repr(cron) in str(caught.value) and "7 columns" not in str(caught.value)


@pytest.mark.parametrize("cron", ["@hourly", "@DAILY", "@midnight", "@annually"])
def test_a_known_nickname_is_accepted(cron: str) -> None:
    declare(cron)


@pytest.mark.parametrize("cron", [" @hourly", "@daily\n", "*/5 * * * *\n"])
def test_an_expression_read_with_whitespace_around_it_is_the_expression(cron: str) -> None:
    """An expression from a config file or an environment variable often ends in a newline: cron
    fields took it, while a nickname failed with croniter's count of columns."""
    at = datetime(2030, 1, 1, 12, 7, tzinfo=ZoneInfo("UTC"))
    assert declare(cron).cron.next_after(at) == parse(cron.strip()).next_after(at)


def test_periodic_stacked_on_job_says_to_use_periodic_alone() -> None:
    """@jobs.periodic over @jobs.job is refused as one job decorated twice, not as a clash between
    two definitions the user would go looking for."""
    with pytest.raises(jobs.InvalidScheduleError, match=r"already a job .*use it alone") as caught:
        jobs.periodic("*/5 * * * *")(jobs.job(name=f"tests.periodic.job_{next(_names)}")(lambda ctx, tick: None))
    assert "two definitions" not in str(caught.value)


def test_job_stacked_on_periodic_says_to_use_one_decorator() -> None:
    """@jobs.job over @jobs.periodic (or over @jobs.job) names the mistake and the way out."""
    # On declare()'s queue: a periodic job stays defined for the rest of the run, and one on
    # "default" was scheduled by the other job tests' runtimes (`running()`), which serve it.
    fn = jobs.periodic("*/5 * * * *", queue="periodic-in-process",
                       name=f"tests.periodic.job_{next(_names)}")(lambda ctx, tick: None)
    with pytest.raises(ConfigError, match=r"already a job .*use one decorator") as caught:
        jobs.job(queue="elsewhere")(fn)
    assert "two definitions" not in str(caught.value)


@pytest.mark.parametrize("inner", ["periodic", "job"])
def test_a_bare_job_decorator_stacked_on_a_job_says_to_use_one_decorator(inner: str) -> None:
    """`@jobs.job` without parentheses over @jobs.periodic or @jobs.job names the mistake as the
    form with options does, not as a clash with a second definition the user would look for."""
    name = f"tests.periodic.job_{next(_names)}"
    declare = (jobs.periodic("*/5 * * * *", queue="periodic-in-process", name=name) if inner == "periodic"
               else jobs.job(name=name))
    fn = declare(lambda ctx, tick: None)
    with pytest.raises(ConfigError, match=r"already a job .*use one decorator") as caught:
        jobs.job(fn)
    assert "two definitions" not in str(caught.value)


@pytest.mark.parametrize("option", ["tags", "key", "wait"])
def test_an_unknown_option_is_named_by_periodic_with_the_ones_it_takes(option: str) -> None:
    """An enqueue option given to @jobs.periodic is refused by @jobs.periodic, naming the options it
    takes, not by the @jobs.job the user never wrote."""
    with pytest.raises(TypeError, match=rf"unknown options \['{option}'\]: @jobs.periodic takes") as caught:
        jobs.periodic("*/5 * * * *", **{option: ["x"]})
    assert "queue" in str(caught.value) and "@jobs.job()" not in str(caught.value)


def test_an_unknown_timezone_fails_at_decoration_naming_it() -> None:
    with pytest.raises(jobs.InvalidScheduleError, match="unknown timezone 'Mars/Olympus'") as caught:
        declare("*/5 * * * *", timezone="Mars/Olympus")
    assert "'*/5 * * * *'" in str(caught.value)


@pytest.mark.parametrize(("typed", "zone"), [("europe/paris", "Europe/Paris"), ("AMERICA/NEW_YORK", "America/New_York")])
def test_a_zone_name_in_the_wrong_case_fails_at_decoration_naming_the_right_one(typed: str, zone: str) -> None:
    """Zone names are case-sensitive on Linux (files in a folder), not on macOS: a module that
    imports on a laptop fails on the server. The error names the spelling that works everywhere."""
    with pytest.raises(jobs.InvalidScheduleError, match=f"unknown timezone '{typed}'.*'{zone}'"):
        declare("0 9 * * *", timezone=typed)


def test_the_posixrules_zone_fails_at_decoration() -> None:
    """`posixrules` is a file some machines' zone folders hold (a copy of one zone, which one
    depends on the machine), as the `posix/` copies are: runtimes could disagree on the ticks."""
    with pytest.raises(jobs.InvalidScheduleError, match="posixrules"):
        declare("0 9 * * *", timezone="posixrules")

@pytest.mark.parametrize("variant, zone", [("right/UTC", "UTC"), ("posix/Europe/Paris", "Europe/Paris")])
def test_a_system_only_zone_variant_fails_at_decoration_naming_the_zone_to_use(variant: str, zone: str) -> None:
    """`right/` and `posix/` zones exist in some machines' zone folders only (not in the tzdata
    package): a module using one would import on one machine and fail on another."""
    with pytest.raises(jobs.InvalidScheduleError, match=f"use '{zone}'"):
        declare("0 9 * * *", timezone=variant)


@pytest.mark.parametrize("region", ["Europe", "America", "America/Argentina"])
def test_a_region_without_its_city_fails_at_decoration_as_an_unknown_timezone(region: str) -> None:
    """A region is a folder of zones, not a zone: the error names it, it is no OS error."""
    with pytest.raises(jobs.InvalidScheduleError, match=f"unknown timezone '{region}'"):
        declare("0 9 * * *", timezone=region)


@pytest.mark.parametrize(("zone", "means", "meant"), [
    ("Etc/GMT+5", "UTC-05:00", "'Etc/GMT-5'"),
    ("Etc/GMT-3", "UTC+03:00", "'Etc/GMT+3'"),
    ("EST", "UTC-05:00", "'America/New_York'"),
    ("MST", "UTC-07:00", "'America/Denver'"),
])
def test_a_zone_that_is_seldom_what_was_meant_is_warned_about_once_naming_what_it_means(
        zone: str, means: str, meant: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """`Etc/GMT+5` is UTC-5 (the Etc names reverse the sign, as POSIX does), and `EST`/`MST` are
    fixed offsets with no daylight saving: each imports, and its ticks come an hour or more from
    where the author meant them half the year or all year. A warning at import names what the
    zone means and the zone usually meant, once a process for each zone."""
    from livepush.jobs.periodic import cron

    monkeypatch.setattr(cron, "_WARNED", set())
    with caplog.at_level("WARNING", logger="livepush.jobs"):
        declare("0 9 * * *", timezone=zone)
        declare("0 10 * * *", timezone=zone)
    lines = [r.getMessage() for r in caplog.records if zone in r.getMessage()]
    assert len(lines) == 1, lines
    assert means in lines[0] and meant in lines[0], lines[0]


@pytest.mark.parametrize("zone", ["UTC", "Etc/GMT", "Etc/GMT+0", "America/New_York", "EST5EDT", "Pacific/Honolulu"])
def test_a_zone_that_says_what_it_means_is_not_warned_about(
        zone: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from livepush.jobs.periodic import cron

    monkeypatch.setattr(cron, "_WARNED", set())
    with caplog.at_level("WARNING", logger="livepush.jobs"):
        declare("0 9 * * *", timezone=zone)
    assert not [r for r in caplog.records if zone in r.getMessage()]


@pytest.fixture
def no_zone_database(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process as on a machine without a time zone database: no system zone folder and no
    tzdata package (Windows, Alpine and other slim images)."""
    # An import of it fails, of its zone folder too (imported already once a zone was read from it).
    for module in ["tzdata", *(m for m in sys.modules if m.startswith("tzdata."))]:
        monkeypatch.setitem(sys.modules, module, None)
    zoneinfo.reset_tzpath(to=[])
    zoneinfo.ZoneInfo.clear_cache()  # a zone opened earlier would be answered from the cache
    try:
        yield
    finally:
        zoneinfo.reset_tzpath()
        zoneinfo.ZoneInfo.clear_cache()


def test_without_a_zone_database_the_error_says_to_install_one(no_zone_database: None) -> None:
    """Even 'UTC' cannot be read there: the error says what is missing and how to get it, rather
    than calling a correct zone name unknown."""
    for zone in ("UTC", "Europe/Paris"):
        with pytest.raises(jobs.InvalidScheduleError, match="no time zone database.*tzdata") as caught:
            declare("*/5 * * * *", timezone=zone)
        assert "unknown" not in str(caught.value)


def test_the_machines_own_zone_is_refused_at_decoration() -> None:
    """"localtime" opens as a zone on most Linux machines (a link to /etc/localtime) but means each
    machine's own zone: runtimes on machines set to different zones would each enqueue their own
    ticks, not one per tick. It is not an IANA name."""
    with pytest.raises(jobs.InvalidScheduleError, match="'localtime'"):
        declare("0 9 * * *", timezone="localtime")


def test_a_function_that_takes_no_tick_fails_at_decoration_without_advice_for_other_parameters() -> None:
    """A function with no place for the tick has no other parameter to give a default: the advice
    for one that takes the tick and more ("give any other parameter a default") does not fit it."""
    for func in (lambda ctx: None, lambda: None):
        with pytest.raises(jobs.InvalidScheduleError, match=r"must take \(ctx, tick\)") as caught:
            jobs.periodic("* * * * *", queue="periodic-in-process")(func)
        assert "default" not in str(caught.value), caught.value


def test_a_function_with_a_parameter_the_tick_leaves_unfilled_fails_naming_it() -> None:
    """A function that takes (ctx, tick) and more is called with the tick alone: the error names
    what is left unfilled and how to fix it, not only the (ctx, tick) it does take."""

    def sweep(ctx: Any, tick: str, region: str) -> None:
        pass

    with pytest.raises(jobs.InvalidScheduleError, match=r"must take \(ctx, tick\).*'region'.*default"):
        jobs.periodic("* * * * *", queue="periodic-in-process", name="tests.periodic.unfilled")(sweep)


def test_job_options_are_checked_as_jobs_job_checks_them() -> None:
    with pytest.raises(TypeError, match="unknown options"):
        jobs.periodic("* * * * *", colour="blue")
    with pytest.raises(ValueError, match="max_attempts"):
        jobs.periodic("* * * * *", max_attempts=0, name="tests.periodic.bad_attempts")(lambda ctx, tick: None)


def test_a_schema_that_refuses_the_tick_fails_at_decoration() -> None:
    """A periodic job's one argument is its tick, an ISO 8601 string. A schema refusing it would
    refuse every tick when the round enqueues it: the round raises, the other schedules of the
    runtime go unscheduled, and after ten such rounds the runtime stops."""
    with pytest.raises(jobs.InvalidScheduleError, match=r"'\* \* \* \* \*'.*rule 'type'"):
        jobs.periodic("* * * * *", queue="periodic-in-process", name="tests.periodic.int_tick",
                      schema={"type": "array", "prefixItems": [{"type": "integer"}]})(lambda ctx, tick: None)
    fine = jobs.periodic("* * * * *", queue="periodic-in-process", name="tests.periodic.str_tick",
                         schema={"type": "array", "prefixItems": [{"type": "string"}], "items": False})
    assert fine(lambda ctx, tick: None).name == "tests.periodic.str_tick"


def test_a_refused_periodic_declaration_registers_no_job_under_its_name() -> None:
    """A declaration its schema= or concurrency= refuses leaves nothing behind: no runtime or
    drain() runs the refused job, and its name stays free for the corrected declaration (another
    function, as a notebook's next cell is), which was refused as taken by the refused one."""

    def sweep(ctx: Any, tick: str) -> None:
        pass

    def corrected(ctx: Any, tick: str) -> None:
        pass

    for options in ({"schema": {"type": "array", "prefixItems": [{"type": "integer"}]}},
                    {"concurrency": ("tick", 1)}):
        with pytest.raises(jobs.InvalidScheduleError):
            jobs.periodic("*/5 * * * *", queue="periodic-in-process", name="tests.periodic.refused",
                          **options)(sweep)
        assert jobs.REGISTRY.find("tests.periodic.refused") is None
    fixed = jobs.periodic("*/5 * * * *", queue="periodic-in-process", name="tests.periodic.refused")(corrected)
    assert jobs.REGISTRY.find("tests.periodic.refused") is fixed


def test_a_concurrency_keyed_on_the_tick_fails_at_decoration_saying_how_to_run_one_at_a_time() -> None:
    """Each tick is its own value, so concurrency= on it never holds a run back: a user who meant
    "one at a time" got overlapping runs and no word. A parameter with a default keys them all alike."""
    with pytest.raises(jobs.InvalidScheduleError, match=r"limits nothing.*concurrency=\('only', 1\)"):
        jobs.periodic("*/5 * * * *", queue="periodic-in-process", name="tests.periodic.tick_keyed",
                      concurrency=("when", 1))(lambda ctx, when: None)

    def one_at_a_time(ctx: Any, tick: str, only: str = "sweep") -> None:
        pass

    fn = jobs.periodic("*/5 * * * *", queue="periodic-in-process", name="tests.periodic.one_at_a_time",
                       concurrency=("only", 1))(one_at_a_time)
    assert fn._limits.max_running == 1


def test_a_periodic_job_is_a_registered_job_with_its_options() -> None:
    schedule = declare("*/5 * * * *")
    assert schedule.function.queue == "periodic-in-process"
    assert jobs.REGISTRY.get(schedule.name) is schedule.function
    assert SCHEDULES.served_by(jobs.REGISTRY, ["periodic-in-process"])[-1].function is schedule.function
    assert schedule not in SCHEDULES.served_by(jobs.REGISTRY, ["default"])


async def test_a_runtime_names_the_periodic_jobs_it_leaves_to_runtimes_of_other_queues(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """A periodic job on a queue the runtime does not serve (a --queues that left it out) is not
    scheduled there; were no runtime to serve that queue, it would never run, nor be listed by
    `livepush status`: the runtime's start names it, with its queue."""
    schedule = declare("*/5 * * * *")
    with caplog.at_level("INFO", logger="livepush.jobs"):
        async with running(queues=["default"]):
            pass
    assert f"{schedule.name} (queue periodic-in-process)" in caplog.text
    assert last_tick(jobs_db, schedule.name) is None  # not scheduled there


async def test_a_periodic_job_declared_while_a_runtime_runs_is_said_to_wait_for_its_next_start(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """A runtime reads its periodic jobs once, at its start: one declared in a module imported
    later, on a queue it serves, was silently never scheduled. Its declaration now logs a warning
    naming it and saying it is scheduled from the next start; one on a queue the runtime does not
    serve, or one declared once the runtime stopped, says nothing."""
    queue = f"periodic-late-{next(_names)}"
    caplog.set_level("WARNING", logger="livepush.jobs")
    async with running(queues=[queue]):
        late = jobs.periodic("*/5 * * * *", queue=queue, name=f"tests.periodic.job_{next(_names)}")(
            lambda ctx, tick: None)
        jobs.periodic("*/5 * * * *", queue=f"{queue}-elsewhere", name=f"tests.periodic.job_{next(_names)}")(
            lambda ctx, tick: None)
        (record,) = [r for r in caplog.records if "periodic" in r.getMessage()]
        assert record.levelname == "WARNING"
        assert late.name in record.getMessage() and "next" in record.getMessage(), record.getMessage()
    caplog.clear()
    jobs.periodic("*/5 * * * *", queue=queue, name=f"tests.periodic.job_{next(_names)}")(lambda ctx, tick: None)
    assert not caplog.records, caplog.text


async def test_a_periodic_job_declared_on_a_new_queue_while_a_runtime_of_every_queue_runs_is_said_to_wait(
        jobs_db: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime started without `queues` serves the queue of a job defined after its start, but
    reads its periodic jobs once, at its start: one declared later on a queue no earlier job used
    was never scheduled, and said nothing, since the runtime did not serve that queue when it
    started. Its declaration now logs the warning of a periodic job declared late."""
    # The process-wide registry as if this process defined one job alone: a runtime of every
    # queue would otherwise serve (and schedule) what every other test defined.
    monkeypatch.setattr(REGISTRY, "_functions", {})
    monkeypatch.setattr(REGISTRY, "_queues", set())
    queue = f"periodic-new-queue-{next(_names)}"
    jobs.job(name=f"tests.periodic.job_{next(_names)}", queue=f"{queue}-first")(lambda ctx: None)
    caplog.set_level("WARNING", logger="livepush.jobs")
    async with running(queues=None):
        late = jobs.periodic("*/5 * * * *", queue=queue, name=f"tests.periodic.job_{next(_names)}")(
            lambda ctx, tick: None)
        (record,) = [r for r in caplog.records if "periodic" in r.getMessage()]
        assert record.levelname == "WARNING"
        assert late.name in record.getMessage() and "next" in record.getMessage(), record.getMessage()


@contextlib.asynccontextmanager
async def scheduling(queue: str) -> AsyncIterator[Runtime]:
    """A runtime serving `queue` and scheduling its periodic jobs (`running()` refuses those)."""
    runtime = Runtime(REGISTRY, install_signals=False, queues=[queue], heartbeat=0.2)
    task = asyncio.create_task(runtime.run())
    try:
        await runtime.wait_started()
        yield runtime
    finally:
        runtime.stop(now=True)
        await asyncio.wait_for(task, 10)


async def test_a_periodic_job_declared_again_with_another_schedule_is_warned_about(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """The same function declared periodic again (a module imported again, a second decorator
    call) with another expression or time zone replaced the first schedule silently, and a running
    runtime kept the first until its next start. One WARNING now names the job and both schedules,
    and says so of a running runtime; declared again with the same schedule, it is silent."""
    queue = f"periodic-again-{next(_names)}"
    name = f"tests.periodic.job_{next(_names)}"

    def sweep(ctx: Any, tick: str) -> None: ...

    caplog.set_level("WARNING", logger="livepush.jobs")
    jobs.periodic("*/5 * * * *", queue=queue, name=name)(sweep)
    jobs.periodic("*/5  * * * *", queue=queue, name=name)(sweep)  # the same schedule, written apart
    assert not caplog.records, caplog.text
    jobs.periodic("*/10 * * * *", queue=queue, name=name)(sweep)
    (record,) = caplog.records
    assert record.levelname == "WARNING"
    message = record.getMessage()
    assert name in message and "*/5 * * * *" in message and "*/10 * * * *" in message, message
    caplog.clear()
    async with scheduling(queue):
        jobs.periodic("*/10 * * * *", timezone="Europe/Paris", queue=queue, name=name)(sweep)
        (record,) = caplog.records
        message = record.getMessage()
        assert name in message and "UTC" in message and "Europe/Paris" in message, message
        assert "until its next start" in message, message
    caplog.clear()
    jobs.periodic("*/10 * * * *", timezone="Europe/Paris", queue=queue, name=name)(sweep)
    assert not caplog.records, caplog.text


def test_ticks_with_a_seconds_field_and_in_a_zone() -> None:
    every_10s = parse("* * * * * */10")
    at = datetime(2030, 1, 1, 12, 0, 25, 500_000, tzinfo=ZoneInfo("UTC"))
    assert every_10s.latest_due(at).isoformat() == "2030-01-01T12:00:20+00:00"
    assert every_10s.next_after(at).isoformat() == "2030-01-01T12:00:30+00:00"
    exact = at.replace(second=20, microsecond=0)
    assert every_10s.latest_due(exact) == exact  # a tick exactly now is due
    paris = parse("0 9 * * *", "Europe/Paris")
    assert paris.latest_due(at).isoformat() == "2030-01-01T09:00:00+01:00"
    # 07:00 UTC is 09:00 in Paris in summer (UTC+2): the tick is due at that instant.
    assert paris.latest_due(datetime(2030, 7, 1, 7, 0, tzinfo=ZoneInfo("UTC"))).isoformat() == \
        "2030-07-01T09:00:00+02:00"


@pytest.mark.parametrize("cron", ["*/30 * * * *", "30 2 * * *", "0 * * * *", "* * * * * */20"])
def test_the_tick_the_scheduler_sleeps_until_is_due_at_that_instant_across_a_fall_back(cron: str) -> None:
    """Paris sets its clocks back at 03:00 CEST on 2030-10-27 (01:00 UTC): 02:00-03:00 comes twice.
    Whatever next_after announces (the runtime sleeps until it) must be what latest_due finds due at
    that instant, and what is due never moves back in time, so the round that wakes for a tick of
    the repeated hour enqueues it then."""
    paris = parse(cron, "Europe/Paris")
    utc = ZoneInfo("UTC")  # instants compared in UTC: within one zone, Python's comparison ignores fold
    now = datetime(2030, 10, 26, 23, 50, tzinfo=utc)
    end = datetime(2030, 10, 27, 2, 10, tzinfo=utc)
    newest = paris.latest_due(now).astimezone(utc)
    while now < end:
        tick = paris.next_after(now).astimezone(utc)
        assert tick > now
        due = paris.latest_due(tick).astimezone(utc)
        assert due == tick, f"woken at {tick} for its tick, the round finds {due} due"
        assert due > newest
        newest, now = due, tick


@pytest.mark.parametrize(("cron", "zone", "start", "expected"), [
    # New York sets its clocks back at 02:00 EDT on 2030-11-03 (06:00 UTC): 01:45 comes twice.
    ("45 * * * *", "America/New_York", datetime(2030, 11, 3, 4), [
        "2030-11-03T00:45:00-04:00", "2030-11-03T01:45:00-04:00", "2030-11-03T01:45:00-05:00",
        "2030-11-03T02:45:00-05:00"]),
    # And forward at 02:00 EST on 2030-03-10 (07:00 UTC): the skipped 02:45 comes at 03:00.
    ("45 * * * *", "America/New_York", datetime(2030, 3, 10, 5), [
        "2030-03-10T00:45:00-05:00", "2030-03-10T01:45:00-05:00", "2030-03-10T03:00:00-04:00",
        "2030-03-10T03:45:00-04:00"]),
    # Chatham goes back an hour at 03:45 (14:00 UTC) on 2030-04-07: 03:00 and 03:30 come twice.
    ("*/30 * * * *", "Pacific/Chatham", datetime(2030, 4, 6, 13), [
        "2030-04-07T03:00:00+13:45", "2030-04-07T03:30:00+13:45", "2030-04-07T03:00:00+12:45",
        "2030-04-07T03:30:00+12:45"]),
    # Lord Howe Island goes forward half an hour at 02:00 (15:30 UTC) on 2030-10-06.
    ("0 * * * *", "Australia/Lord_Howe", datetime(2030, 10, 5, 14), [
        "2030-10-06T01:00:00+10:30", "2030-10-06T02:30:00+11:00", "2030-10-06T03:00:00+11:00"]),
])
def test_every_tick_next_to_a_clock_change_is_announced_and_then_found_due(
        cron: str, zone: str, start: datetime, expected: list[str]) -> None:
    """A time the clocks repeat is a tick at each UTC offset, and one they skip comes at the end of
    the gap: the runtime sleeps until each (next_after) and its round finds that very tick due
    (latest_due), so none is lost."""
    schedule = parse(cron, zone)
    utc = ZoneInfo("UTC")
    now = start.replace(tzinfo=utc)
    seen = []
    for _ in expected:
        tick = schedule.next_after(now)
        assert schedule.latest_due(tick).astimezone(utc) == tick.astimezone(utc)
        assert schedule.latest_due(tick.astimezone(utc) + timedelta(seconds=30)).astimezone(utc) == tick.astimezone(utc)
        seen.append(tick.isoformat())
        now = tick
    assert seen == expected


@pytest.mark.parametrize(("cron", "zone", "start", "expected"), [
    # New York sets its clocks back at 02:00 EDT on 2030-11-03 (06:00 UTC): 01:00-02:00 comes twice.
    # A job at a fixed time runs at its first pass only, as in cron.
    ("30 1 * * *", "America/New_York", datetime(2030, 11, 3, 4), [
        "2030-11-03T01:30:00-04:00", "2030-11-04T01:30:00-05:00"]),
    ("15,45 1 * * *", "America/New_York", datetime(2030, 11, 3, 4), [
        "2030-11-03T01:15:00-04:00", "2030-11-03T01:45:00-04:00", "2030-11-04T01:15:00-05:00"]),
    ("0 1 * * * 0,30", "America/New_York", datetime(2030, 11, 3, 4), [
        "2030-11-03T01:00:00-04:00", "2030-11-03T01:00:30-04:00", "2030-11-04T01:00:00-05:00"]),
    # Paris sets its clocks back at 03:00 CEST on 2030-10-27 (01:00 UTC): 02:00-03:00 comes twice.
    ("30 2 * * *", "Europe/Paris", datetime(2030, 10, 26, 22), [
        "2030-10-27T02:30:00+02:00", "2030-10-28T02:30:00+01:00"]),
    ("0 2,3 * * *", "Europe/Paris", datetime(2030, 10, 26, 22), [
        "2030-10-27T02:00:00+02:00", "2030-10-27T03:00:00+01:00", "2030-10-28T02:00:00+01:00"]),
    # A minute or an hour field that starts with '*' makes a wildcard job, as in cron: it runs
    # in both passes of the repeated hour.
    ("*/20 1 * * *", "America/New_York", datetime(2030, 11, 3, 4), [
        "2030-11-03T01:00:00-04:00", "2030-11-03T01:20:00-04:00", "2030-11-03T01:40:00-04:00",
        "2030-11-03T01:00:00-05:00", "2030-11-03T01:20:00-05:00", "2030-11-03T01:40:00-05:00"]),
    ("0 * * * *", "Europe/Paris", datetime(2030, 10, 26, 23, 30), [
        "2030-10-27T02:00:00+02:00", "2030-10-27T02:00:00+01:00", "2030-10-27T03:00:00+01:00"]),
    ("@hourly", "America/New_York", datetime(2030, 11, 3, 4, 30), [
        "2030-11-03T01:00:00-04:00", "2030-11-03T01:00:00-05:00", "2030-11-03T02:00:00-05:00"]),
    # Spring forward is unchanged: a fixed time the clocks skip comes once, at the end of the gap
    # (New York: 02:00 EST on 2030-03-10 is 03:00 EDT).
    ("30 2 * * *", "America/New_York", datetime(2030, 3, 10, 5), [
        "2030-03-10T03:00:00-04:00", "2030-03-11T02:30:00-04:00"]),
])
def test_a_fixed_time_in_the_repeated_hour_runs_once_and_a_wildcard_hour_runs_in_both(
        cron: str, zone: str, start: datetime, expected: list[str]) -> None:
    """Cron's rule when the clocks go back: a job at a fixed time (neither its minute nor its hour
    field starts with '*') runs once, at the first pass of the repeated hour, and a wildcard job
    (`*/15 * * * *`, `0 * * * *`) at each pass. Announced that way (next_after, which the
    runtime sleeps until) and found due that way by rounds every few seconds (latest_due, which
    the scheduler enqueues when it is newer than the last tick)."""
    schedule = parse(cron, zone)
    utc = ZoneInfo("UTC")
    now = start.replace(tzinfo=utc)
    announced = []
    for _ in expected:
        now = schedule.next_after(now).astimezone(utc)
        announced.append(now.astimezone(ZoneInfo(zone)).isoformat())
    assert announced == expected
    end = datetime.fromisoformat(expected[-1]).astimezone(utc)
    now = start.replace(tzinfo=utc)
    last = schedule.latest_due(now).astimezone(utc)
    enqueued = []
    while now < end:
        # Rounds 7 s apart, whenever they fall, over the hours next to the change; then straight
        # to the last tick (a day later for the fixed times).
        now = now + timedelta(seconds=7) if now < start.replace(tzinfo=utc) + timedelta(hours=5) else end
        due = schedule.latest_due(now).astimezone(utc)
        assert due >= last, f"at {now} the newest due tick went back to {due}"
        if due > last:
            enqueued.append(schedule.latest_due(now).isoformat())
            last = due
    assert enqueued == expected


# -- rounds on the database --------------------------------------------------------------------------

async def test_a_new_periodic_job_starts_from_its_next_tick(jobs_db: str, pool: AsyncConnectionPool[Any]) -> None:
    """No row yet: the newest due tick is recorded as done, nothing is enqueued."""
    schedule = declare(five_minutes_far_from_a_tick(jobs_db))
    first = await Scheduler([schedule]).round(pool)
    assert first.enqueued == [] and jobs_of(jobs_db, schedule.name) == []
    assert last_tick(jobs_db, schedule.name) == schedule.cron.latest_due(db_now(jobs_db))
    assert 0 < first.wait <= 300
    assert (await Scheduler([schedule]).round(pool)).enqueued == []


async def test_ticks_missed_while_no_runtime_ran_are_enqueued_once(jobs_db: str,
                                                                   pool: AsyncConnectionPool[Any]) -> None:
    """A day of missed five-minute ticks: one job, for the newest due tick; then nothing until the next."""
    schedule = declare(five_minutes_far_from_a_tick(jobs_db))
    q(jobs_db, "INSERT INTO livepush_periodic (name, last_tick) VALUES (%s, now() - interval '1 day')",
      (schedule.name,))
    done = await Scheduler([schedule]).round(pool)
    newest = schedule.cron.latest_due(db_now(jobs_db))
    assert [(e.name, e.tick) for e in done.enqueued] == [(schedule.name, newest.isoformat())]
    assert jobs_of(jobs_db, schedule.name) == [(done.enqueued[0].job_id, [newest.isoformat()])]
    assert last_tick(jobs_db, schedule.name) == newest
    assert (await Scheduler([schedule]).round(pool)).enqueued == []
    info = jobs.get_job(done.enqueued[0].job_id)
    assert info is not None and info.args == [newest.isoformat()] and info.queue == "periodic-in-process"


async def test_a_paused_queues_periodic_job_is_still_enqueued_at_its_tick(jobs_db: str,
                                                                         pool: AsyncConnectionPool[Any]) -> None:
    """A pause stops the claims, not the schedule: the tick's job is enqueued and waits for the
    resume, its argument naming the tick it was for."""
    schedule = declare(five_minutes_far_from_a_tick(jobs_db))
    q(jobs_db, "INSERT INTO livepush_periodic (name, last_tick) VALUES (%s, now() - interval '1 hour')",
      (schedule.name,))
    assert jobs.pause_queue("periodic-in-process")
    done = await Scheduler([schedule]).round(pool)
    newest = schedule.cron.latest_due(db_now(jobs_db)).isoformat()
    assert [e.tick for e in done.enqueued] == [newest]
    info = jobs.get_job(done.enqueued[0].job_id)
    assert info is not None and info.state == "available" and info.args == [newest]


async def test_many_rounds_at_once_enqueue_a_tick_once(jobs_db: str, pool: AsyncConnectionPool[Any]) -> None:
    """Twenty rounds of separate schedulers at the same moment (as many runtimes would): one job per tick."""
    schedules = [declare("* * * * * */1"), declare("*/5 * * * *")]
    for s in schedules:
        q(jobs_db, "INSERT INTO livepush_periodic (name, last_tick) VALUES (%s, now() - interval '1 hour')", (s.name,))
    rounds = await asyncio.gather(*(Scheduler(schedules).round(pool) for _ in range(20)))
    enqueued = [e for r in rounds for e in r.enqueued]
    for s in schedules:
        mine = [e for e in enqueued if e.name == s.name]
        # One winner for the first due tick, and at most one more for a newer tick that came due
        # while the rounds ran (the every-second schedule): never two jobs for one tick.
        assert 1 <= len(mine) <= 2 and len({e.tick for e in mine}) == len(mine), mine
        assert [a for _, a in jobs_of(jobs_db, s.name)] == [[e.tick] for e in sorted(mine, key=lambda e: e.job_id)]


async def test_a_tick_its_schema_refuses_is_logged_and_the_other_schedules_go_on(
        jobs_db: str, pool: AsyncConnectionPool[Any], caplog: pytest.LogCaptureFixture) -> None:
    """A schema that took the tick checked at import but refuses a later one (a pattern tied to
    one UTC offset, across a clock change): that tick is not enqueued and is logged once, naming
    the job; the round goes on to the other schedules, and the runtime with it."""
    refusing = Schedule(jobs.job(name=f"tests.periodic.job_{next(_names)}", queue="periodic-in-process",
                                 schema={"type": "array", "prefixItems": [{"pattern": "^never"}]})(
        lambda ctx, tick: None), parse(five_minutes_far_from_a_tick(jobs_db), "UTC"))
    fine = declare(five_minutes_far_from_a_tick(jobs_db))
    for s in (refusing, fine):
        q(jobs_db, "INSERT INTO livepush_periodic (name, last_tick) VALUES (%s, now() - interval '1 day')", (s.name,))
    before = last_tick(jobs_db, refusing.name)
    scheduler = Scheduler([refusing, fine])
    with caplog.at_level("ERROR", logger="livepush.jobs"):
        rounds = [await scheduler.round(pool) for _ in range(2)]
    assert [e.name for e in rounds[0].enqueued] == [fine.name] and rounds[1].enqueued == []
    assert jobs_of(jobs_db, refusing.name) == [] and last_tick(jobs_db, refusing.name) == before
    refusals = [r.getMessage() for r in caplog.records if refusing.name in r.getMessage()]
    assert len(refusals) == 1 and "was not enqueued for tick" in refusals[0], refusals


async def test_the_tick_is_iso_8601_in_the_jobs_zone(jobs_db: str, pool: AsyncConnectionPool[Any]) -> None:
    schedule = declare("0 9 * * *", timezone="America/New_York")
    q(jobs_db, "INSERT INTO livepush_periodic (name, last_tick) VALUES (%s, now() - interval '3 days')",
      (schedule.name,))
    done = await Scheduler([schedule]).round(pool)
    (entry,) = done.enqueued
    tick = datetime.fromisoformat(entry.tick)
    assert (tick.hour, tick.minute, tick.second) == (9, 0, 0)
    assert tick.utcoffset() == tick.astimezone(ZoneInfo("America/New_York")).utcoffset()
    assert tick.utcoffset() in (timedelta(hours=-5), timedelta(hours=-4))
    assert db_now(jobs_db) - timedelta(days=1) < tick <= db_now(jobs_db)
    info = jobs.get_job(entry.job_id)
    assert info is not None and info.args == [entry.tick]


async def test_runtimes_of_an_old_and_a_new_expression_each_enqueue_their_own_ticks_once(
        jobs_db: str, pool: AsyncConnectionPool[Any]) -> None:
    """A rolling deploy that changes a job's expression: the runtimes still on the old code go on
    enqueueing its ticks beside the new ones' ticks, each once, and never a tick older than the
    newest enqueued."""
    minute = db_now(jobs_db).minute
    # Five-minute ticks, the newest a minute or more ago and the next 3 minutes or more ahead.
    old = declare(f"{(minute + 3) % 5}-59/5 * * * *")
    new = Schedule(old.function, parse(f"{(minute + 4) % 5}-59/5 * * * *"))  # the same job
    q(jobs_db, "INSERT INTO livepush_periodic (name, last_tick) VALUES (%s, now() - interval '1 day')", (old.name,))
    first = await Scheduler([old]).round(pool)
    second = await Scheduler([new]).round(pool)
    again = await Scheduler([old]).round(pool)
    ticks = [e.tick for e in first.enqueued + second.enqueued + again.enqueued]
    now = db_now(jobs_db)
    assert ticks == [old.cron.latest_due(now).isoformat(), new.cron.latest_due(now).isoformat()]
    assert [a for _, a in jobs_of(jobs_db, old.name)] == [[t] for t in ticks]


async def test_jobs_clear_forgets_the_ticks_so_a_periodic_job_starts_afresh(jobs_db: str,
                                                                            pool: AsyncConnectionPool[Any]) -> None:
    """After jobs.clear() (between tests) a periodic job starts from its next tick, as in a fresh
    database: a tick recorded before the clear is not taken as missed and run at once."""
    schedule = declare("*/5 * * * *")
    q(jobs_db, "INSERT INTO livepush_periodic (name, last_tick) VALUES (%s, now() - interval '1 day')",
      (schedule.name,))
    await asyncio.to_thread(jobs.clear)
    assert last_tick(jobs_db, schedule.name) is None
    assert (await Scheduler([schedule]).round(pool)).enqueued == []
    assert jobs_of(jobs_db, schedule.name) == []


async def test_a_runtime_that_stops_mid_advance_holds_the_others_up_for_seconds_only(
        jobs_db: str, pool: AsyncConnectionPool[Any]) -> None:
    """A runtime whose machine pauses or vanishes between moving a tick forward and committing keeps
    that row locked, and every other runtime's round waits on it (a vanished machine's connection
    lingers until TCP keepalive gives up: hours without periodic jobs). Postgres ends such an idle
    transaction after a few seconds, so another runtime's round enqueues the tick."""
    schedule = declare("*/5 * * * *")
    q(jobs_db, "INSERT INTO livepush_periodic (name, last_tick) VALUES (%s, now() - interval '1 day')",
      (schedule.name,))
    due = schedule.cron.latest_due(db_now(jobs_db))
    stopped = await psycopg.AsyncConnection.connect(jobs_db)
    try:
        # The stopped runtime's statement, in its open transaction; then it never speaks again.
        advanced = await stopped.execute(queries.ADVANCE, {"name": schedule.name, "tick": due})
        assert advanced.rowcount == 1
        done = await asyncio.wait_for(Scheduler([schedule]).round(pool), 30.0)
        with pytest.raises(psycopg.Error):  # when it comes back, its transaction is gone
            await stopped.execute("COMMIT")
    finally:
        await stopped.close()
    assert [e.name for e in done.enqueued] == [schedule.name]
    assert [a for _, a in jobs_of(jobs_db, schedule.name)] == [[done.enqueued[0].tick]]


@contextlib.asynccontextmanager
async def frozen_clock_in_zone(url: str, zone: str) -> AsyncIterator[tuple[AsyncConnectionPool[Any], Any]]:
    """A pool whose sessions speak `zone` (Postgres takes the machine's zone as its TimeZone at
    initdb) and whose clock_timestamp() reads a stored instant; and a setter of that instant."""
    q(url, "CREATE SCHEMA frozen_clock")
    q(url, "CREATE TABLE frozen_clock.instant (at timestamptz NOT NULL)")
    q(url, "INSERT INTO frozen_clock.instant VALUES (now())")
    q(url, "CREATE FUNCTION frozen_clock.clock_timestamp() RETURNS timestamptz LANGUAGE sql "
           "AS 'SELECT at FROM frozen_clock.instant'")
    # Listed before pg_catalog, the schema's clock_timestamp() is the one the statements call.
    options = f"-c search_path=frozen_clock,pg_catalog,public -c TimeZone={zone}"
    async with AsyncConnectionPool(url, kwargs={"options": options}, min_size=1, max_size=2, open=False) as frozen:
        yield frozen, lambda at: q(url, "UPDATE frozen_clock.instant SET at = %s", (at,))


async def test_the_repeated_hours_ticks_come_twice_on_a_database_that_speaks_the_jobs_zone(jobs_db: str) -> None:
    """Paris sets its clocks back at 03:00 CEST on 2030-10-27 (01:00 UTC): 02:00-03:00 comes
    twice. A database whose TimeZone is Europe/Paris hands its instants back in the job's own zone,
    where Python compares and subtracts on the wall clock: the second 02:00 looked older than the
    first 02:45 and was never enqueued, and the round before it slept 0 s, over and over."""
    schedule = declare("*/15 * * * *", timezone="Europe/Paris")
    utc = ZoneInfo("UTC")
    q(jobs_db, "INSERT INTO livepush_periodic (name, last_tick) VALUES (%s, %s)",
      (schedule.name, datetime(2030, 10, 27, 0, 45, tzinfo=utc)))  # 02:45 CEST, the first pass
    async with frozen_clock_in_zone(jobs_db, "Europe/Paris") as (frozen, set_clock):
        set_clock(datetime(2030, 10, 27, 0, 50, tzinfo=utc))  # 02:50 CEST
        before = await Scheduler([schedule]).round(frozen)
        assert before.enqueued == [] and before.wait == 600.0  # until 02:00 CET, 01:00 UTC
        set_clock(datetime(2030, 10, 27, 1, 0, 5, tzinfo=utc))  # 02:00:05 CET
        done = await Scheduler([schedule]).round(frozen)
    assert [e.tick for e in done.enqueued] == ["2030-10-27T02:00:00+01:00"]
    assert [a for _, a in jobs_of(jobs_db, schedule.name)] == [["2030-10-27T02:00:00+01:00"]]
    assert done.wait == 895.0



async def test_a_fixed_time_job_is_not_enqueued_again_in_the_second_pass_of_the_repeated_hour(jobs_db: str) -> None:
    """Paris sets its clocks back at 03:00 CEST on 2030-10-27 (01:00 UTC). A daily 02:30 job ran at
    02:30 CEST: the rounds of the second pass (02:30 CET and past it) enqueue nothing, and sleep
    until the next day's 02:30, as cron's job at a fixed time runs once."""
    schedule = declare("30 2 * * *", timezone="Europe/Paris")
    utc = ZoneInfo("UTC")
    q(jobs_db, "INSERT INTO livepush_periodic (name, last_tick) VALUES (%s, %s)",
      (schedule.name, datetime(2030, 10, 27, 0, 30, tzinfo=utc)))  # 02:30 CEST, the first pass
    async with frozen_clock_in_zone(jobs_db, "Europe/Paris") as (frozen, set_clock):
        rounds = []
        for at in (datetime(2030, 10, 27, 1, 30, 5, tzinfo=utc), datetime(2030, 10, 27, 1, 59, tzinfo=utc)):
            set_clock(at)  # 02:30:05 CET, then 02:59 CET
            rounds.append(await Scheduler([schedule]).round(frozen))
    assert [r.enqueued for r in rounds] == [[], []] and jobs_of(jobs_db, schedule.name) == []
    assert rounds[1].wait == (datetime(2030, 10, 28, 1, 30, tzinfo=utc) - datetime(2030, 10, 27, 1, 59, tzinfo=utc)
                              ).total_seconds()

@pytest.mark.parametrize(("cron", "zone", "start", "expected"), [
    # Paris goes forward at 02:00 CET on 2030-03-31 (01:00 UTC): 02:00:30 and 02:30:30 never come.
    ("0 2 * * * 30", "Europe/Paris", datetime(2030, 3, 30, 23, 30), ["2030-03-31T03:00:00+02:00"]),
    ("30 2 * * * 30", "Europe/Paris", datetime(2030, 3, 30, 23, 30), ["2030-03-31T03:00:00+02:00"]),
    ("0 2 * * * 30", "America/New_York", datetime(2030, 3, 10, 5, 30), ["2030-03-10T03:00:00-04:00"]),
])
def test_a_tick_with_seconds_the_clocks_skip_comes_once_at_the_end_of_the_gap(
        cron: str, zone: str, start: datetime, expected: list[str]) -> None:
    """A round every second across a spring-forward, as a runtime's scheduler would make them: the
    skipped tick is enqueued once, at the end of the gap, not again at the wall time past it that
    has the tick's seconds (a daily job ran twice that day)."""
    schedule = parse(cron, zone)
    utc = ZoneInfo("UTC")
    now = start.replace(tzinfo=utc)
    last = schedule.latest_due(now).astimezone(utc)
    enqueued = []
    for _ in range(3 * 3600):
        now += timedelta(seconds=1)
        due = schedule.latest_due(now).astimezone(utc)
        if due > last:
            enqueued.append(schedule.latest_due(now).isoformat())
            last = due
    assert enqueued == expected
    # Announced as such from the day before too, when the runtime sleeps until it.
    assert schedule.next_after(start.replace(tzinfo=utc) - timedelta(hours=12)).isoformat() == expected[0]


def test_drain_enqueues_no_tick_and_runs_one_enqueued_by_hand(jobs_db: str) -> None:
    """What docs/jobs.md's Tests section says: only runtimes schedule periodic jobs, so drain()
    runs nothing of a periodic job until a test enqueues its tick by hand, which it then runs as
    the scheduler's own."""
    from tests.jobs import periodic_jobs

    assert jobs.drain(queues=[periodic_jobs.QUEUE]) == {}
    periodic_jobs.every_second.enqueue("2030-01-01T12:05:00+00:00")
    assert jobs.drain(queues=[periodic_jobs.QUEUE]) == {"succeeded": 1}
    assert q(jobs_db, "SELECT key FROM job_runs WHERE phase = 'tick'") == [("2030-01-01T12:05:00+00:00",)]


# -- forgetting a periodic job removed from the code ---------------------------------------------------

async def test_forget_periodic_forgets_a_job_no_runtime_schedules(jobs_db: str,
                                                                 pool: AsyncConnectionPool[Any]) -> None:
    """A periodic job removed from the code keeps its newest tick, listed by `livepush status` for
    ever as scheduled by no runtime: forget_periodic() deletes it, and the job, should it come
    back, starts from its next tick as a new one does."""
    schedule = declare("*/5 * * * *")
    await Scheduler([schedule]).round(pool)
    assert schedule.name in [p.name for p in jobs.status().periodic]
    jobs.forget_periodic(schedule.name)
    assert last_tick(jobs_db, schedule.name) is None
    assert schedule.name not in [p.name for p in jobs.status().periodic]
    assert (await Scheduler([schedule]).round(pool)).enqueued == []
    assert last_tick(jobs_db, schedule.name) == schedule.cron.latest_due(db_now(jobs_db))
    await jobs.aforget_periodic(schedule.name)
    assert last_tick(jobs_db, schedule.name) is None


async def test_forget_periodic_refuses_a_name_it_has_no_tick_of(jobs_db: str) -> None:
    """A name with no tick (a typo, or one forgotten already) is refused, saying where the names are."""
    with pytest.raises(jobs.PeriodicNotFound, match=r"no periodic job named 'tests.periodic.nothing' has a tick to "
                                                    r"forget: `livepush status` lists those"):
        jobs.forget_periodic("tests.periodic.nothing")
    with pytest.raises(LookupError):
        await jobs.aforget_periodic("tests.periodic.nothing")


@pytest.mark.parametrize("name, error", [(None, TypeError), (3, TypeError), ("", ValueError)])
def test_forget_periodic_refuses_what_is_no_name(name: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"forget_periodic\(\) takes a periodic job's name"):
        jobs.forget_periodic(name)


async def test_forget_periodic_refuses_a_name_a_live_runtime_schedules(jobs_db: str) -> None:
    """A runtime registers the periodic jobs it schedules: while it runs, forgetting one of them is
    refused naming it (it would start the job again from its next tick); once it stopped, the
    name is forgotten."""
    queue = f"periodic-forget-{next(_names)}"
    fn = jobs.periodic("*/5 * * * *", queue=queue, name=f"tests.periodic.job_{next(_names)}")(lambda ctx, tick: None)
    runtime = Runtime(REGISTRY, install_signals=False, queues=[queue], heartbeat=0.2)
    task = asyncio.create_task(runtime.run())
    try:
        await runtime.wait_started()
        await async_wait_for(lambda: last_tick(jobs_db, fn.name) is not None, 10,
                             message="the runtime to schedule its periodic job")
        with pytest.raises(jobs.PeriodicStillScheduled, match=rf"periodic job '{fn.name}' is still scheduled by live "
                                                              rf"job runtimes: {runtime.id} \("):
            jobs.forget_periodic(fn.name)
        with pytest.raises(jobs.PeriodicStillScheduled):
            await jobs.aforget_periodic(fn.name)
        assert last_tick(jobs_db, fn.name) is not None
    finally:
        runtime.stop(now=True)
        await asyncio.wait_for(task, 10)
    jobs.forget_periodic(fn.name)
    assert last_tick(jobs_db, fn.name) is None


def test_forget_periodic_refuses_a_name_a_runtime_that_may_still_live_schedules(jobs_db: str) -> None:
    """A runtime's row that beat within three of its beats counts as live; a silent one does not
    (it is dead, and its jobs are released by the next runtime to beat)."""
    q(jobs_db, "INSERT INTO livepush_periodic (name, last_tick) VALUES ('tests.periodic.elsewhere', now())")
    q(jobs_db, """INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat, heartbeat_at, periodic)
                  VALUES ('silent', 1, '{q}', 1, 1, now() - interval '10 seconds', '{tests.periodic.elsewhere}')""")
    jobs.forget_periodic("tests.periodic.elsewhere")
    q(jobs_db, "INSERT INTO livepush_periodic (name, last_tick) VALUES ('tests.periodic.elsewhere', now())")
    q(jobs_db, """INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat, periodic)
                  VALUES ('beating', 2, '{q}', 1, 5, '{tests.periodic.elsewhere}')""")
    with pytest.raises(jobs.PeriodicStillScheduled, match=r"\(beating, pid 2\)"):
        jobs.forget_periodic("tests.periodic.elsewhere")
