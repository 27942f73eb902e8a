"""Topic rules, the authorize hook, and loading the --app object."""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import livepush
from livepush.errors import ConfigError
from livepush.sessions import Session
from livepush.sessions.rules import AUTHORIZE_QUEUE, AUTHORIZE_THREADS, Allow, App, load_app
from tests.support.waiting import async_wait_for

ALICE = Session(id="sid-a", subject="7", expires_at=9e9, issued_at=1.0)
BOB = Session(id="sid-b", subject="70", expires_at=9e9, issued_at=1.0)


# -- Allow ------------------------------------------------------------------------------


def test_star_matches_one_or_more_topic_characters() -> None:
    """`*` matches any run of one or more topic characters, ':' and '/' included."""
    rule = Allow("public:*", anonymous=True)
    assert rule.allows(None, "public:news")
    assert rule.allows(None, "public:news:eu/fr")
    assert not rule.allows(None, "public:")
    assert not rule.allows(None, "publicx:news")
    assert not rule.allows(None, "xpublic:news")
    middle = Allow("org:*:board")
    assert middle.allows(ALICE, "org:acme:board")
    assert not middle.allows(ALICE, "org::board")
    assert not middle.allows(ALICE, "org:acme:board:x")


def test_a_pattern_as_long_as_the_longest_topic_still_matches_it() -> None:
    """The length check refuses only patterns no topic can fill: one whose shortest match is a
    topic of 200 characters is a rule like any other."""
    assert Allow("x" * 200, anonymous=True).allows(None, "x" * 200)
    assert Allow("team:" + "x" * 193 + ":*", anonymous=True).allows(None, "team:" + "x" * 193 + ":y")


def test_literal_rule_matches_exactly() -> None:
    """A pattern without wildcards matches only itself (dots are literal)."""
    rule = Allow("news.today", anonymous=True)
    assert rule.allows(None, "news.today")
    assert not rule.allows(None, "newsXtoday")
    assert not rule.allows(None, "news.today2")


def test_subject_slot_matches_only_the_sessions_subject() -> None:
    """`user:{subject}` lets subject 7 read user:7 only: not user:70, and never anonymously."""
    rule = Allow("user:{subject}")
    assert rule.allows(ALICE, "user:7")
    assert not rule.allows(ALICE, "user:70")
    assert not rule.allows(BOB, "user:7")
    assert rule.allows(BOB, "user:70")
    assert not rule.allows(None, "user:7")


def test_subject_is_matched_literally() -> None:
    """Regex characters in a subject are plain characters: they match only themselves, never a pattern."""
    rule = Allow("user:{subject}")
    for subject, lookalikes in [("a*b", ["user:b", "user:ab", "user:aab"]), ("[a-z]+", ["user:abc", "user:a"]),
                                ("a|b", ["user:a", "user:b"]), ("(x)?", ["user:x", "user:"])]:
        session = Session("s", subject, 9e9)
        for topic in lookalikes:
            assert not rule.allows(session, topic), (subject, topic)
    plain = Session("s", "a_b-c", 9e9)
    assert rule.allows(plain, "user:a_b-c")
    assert not rule.allows(plain, "user:a_b-cd")


@pytest.mark.parametrize("subject", ["a.b", ".*", "7:x", "7/x", "7.", ":", "/", "."])
def test_a_subject_with_a_topic_separator_never_fills_a_slot(subject: str) -> None:
    """A subject holding ':', '/' or '.' matches no {subject} rule, not even its own topic: subject 7:x never enters 7's team:7:*."""
    session = Session("s", subject, 9e9)
    assert not Allow("user:{subject}").allows(session, f"user:{subject}")
    assert not Allow("team:{subject}:*").allows(session, f"team:{subject}:board")
    assert not Allow("user:{subject}").allows(session, "user:anything")
    seven_x = Session("s", "7:x", 9e9)
    assert not Allow("team:{subject}:*").allows(seven_x, "team:7:x:board"), "7:x must not reach into team:7:*"


async def test_a_refusal_caused_by_a_subject_no_slot_can_hold_is_logged_once_naming_why(
        caplog: pytest.LogCaptureFixture) -> None:
    """Subjects that can fill no {subject} slot (an email, a dotted user name, a trailing newline)
    make every subscribe a {subject} rule was written for end `forbidden`, which the JS client
    treats as final. The first such refusal is logged once per App as a warning naming the rule and
    what the subject holds, never the subject itself; a refusal any subject would get logs nothing."""
    caplog.set_level(logging.WARNING, logger="livepush.rules")
    app = App(rules=[Allow("user:{subject}")])
    assert await app.check(ALICE, "admin:1") == "forbidden"  # subject 7 fits: no warning
    assert not [r for r in caplog.records if r.name == "livepush.rules"]
    for subject in ("ana.smith", "ana@example.com", "7\n"):
        dotted = Session("s", subject, 9e9)
        assert await app.check(dotted, "user:ana") == "forbidden"
    records = [r for r in caplog.records if r.name == "livepush.rules"]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    text = records[0].getMessage()
    assert "user:{subject}" in text and "separator" in text and "ana" not in text, text
    other = App(rules=[Allow("user:{subject}")], authorize=lambda session, topic: False)
    assert await other.check(Session("s", "ana@example", 9e9), "user:ana") == "forbidden"
    records = [r for r in caplog.records if r.name == "livepush.rules"]
    assert len(records) == 2 and "a character no topic has" in records[1].getMessage()
    other.close()


@pytest.mark.parametrize(("pattern", "subject", "topic"), [
    ("{subject}:*", "job", "job:5"), ("{subject}:*", "group", "group:1"), ("{subject}:*", "workflow", "workflow:9"),
    ("*:{subject}", "5", "job:5"), ("*:{subject}", "12", "workflow:12"),
])
def test_a_subject_never_carries_a_rule_into_the_state_topics_it_does_not_name(
        pattern: str, subject: str, topic: str) -> None:
    """A {subject} rule reaches job:, group: and workflow: topics only when its pattern names the
    prefix itself: a user named "job" under {subject}:*, or user 5 under *:{subject}, reads no
    job's state; the topics the rule was written for still match."""
    assert not Allow(pattern).allows(Session("s", subject, 9e9), topic)
    assert Allow("{subject}:*").allows(Session("s", "alice", 9e9), "alice:inbox")
    assert Allow("*:{subject}").allows(Session("s", "5", 9e9), "team:5")
    assert Allow("job:{subject}").allows(Session("s", "5", 9e9), "job:5")  # named: the author meant it



@pytest.mark.parametrize(("pattern", "subject", "topic"), [
    ("{subject}:*", "runtime", "runtime:3"), ("{subject}", "runtimes", "runtimes"), ("*:{subject}", "3", "runtime:3"),
])
def test_a_subject_never_carries_a_rule_into_the_runtimes_own_topics(pattern: str, subject: str, topic: str) -> None:
    """The runtimes' own topics (runtime:<id>, runtimes: host, pid, queues, for operators' pages)
    are reached by a {subject} rule only when its pattern names them: a user named "runtime" or
    "runtimes" reads no runtime's state."""
    assert not Allow(pattern).allows(Session("s", subject, 9e9), topic)
    assert Allow("runtime:{subject}").allows(Session("s", "3", 9e9), "runtime:3")  # named: the author meant it
    assert Allow("{subject}").allows(Session("s", "runtimesheet", 9e9), "runtimesheet")

def test_subject_and_star_combine() -> None:
    """`user:{subject}:*` covers a subject's own sub-topics only."""
    rule = Allow("user:{subject}:*")
    assert rule.allows(ALICE, "user:7:inbox")
    assert not rule.allows(ALICE, "user:70:inbox")
    assert not rule.allows(ALICE, "user:7:")


@pytest.mark.parametrize(
    ("pattern", "topic"),
    [("*:{subject}:*", "team:7:x:inbox"), ("org:*:user:{subject}:*", "org:1:user:7:user:x:inbox")],
)
def test_a_slot_between_two_stars_cannot_share_a_topic_between_subjects(pattern: str, topic: str) -> None:
    """With a '*' on each side, a separator does not pin the slot: subject x would read a topic
    inside subject 7's namespace (the star before the slot swallowing '7'). Such a rule is
    refused when it is made, rather than letting two subjects match one topic."""
    seven, x = Session("s7", "7", 9e9), Session("sx", "x", 9e9)
    with pytest.raises(ValueError, match="both sides"):
        rule = Allow(pattern)
        assert not (rule.allows(seven, topic) and rule.allows(x, topic)), f"subjects 7 and x both read {topic}"


def test_a_slot_with_a_star_on_one_side_only_is_fine() -> None:
    """A star on one side and a separator between: the slot is pinned, one subject per topic."""
    rule = Allow("*:{subject}")
    assert rule.allows(ALICE, "team:a:7") and not rule.allows(Session("s", "a", 9e9), "team:a:7")
    assert Allow("*/{subject}:inbox").allows(ALICE, "org/1/7:inbox")


def test_rules_without_anonymous_need_a_session() -> None:
    """By default a rule needs a session; anonymous=True lets anyone in."""
    members = Allow("chat:*")
    assert members.allows(ALICE, "chat:lobby")
    assert not members.allows(None, "chat:lobby")
    assert Allow("chat:*", anonymous=True).allows(ALICE, "chat:lobby")


@pytest.mark.parametrize(
    ("pattern", "anonymous", "message"),
    [
        ("", False, "non-empty"),
        ("user:{subject}*", False, "separator"),
        ("*{subject}", False, "separator"),
        ("user:{id}", False, "unknown slot"),
        ("user:{subject", False, "unknown slot"),
        ("a**", False, "'\\*\\*'"),
        ("chat lobby", False, "characters"),
        ("chat~x", False, "characters"),
        ("_livepush.revocations", True, "livepush's own"),
        ("user:{subject}", True, "anonymous"),
        ("x" * 201, False, "needs 201 characters and a topic has at most 200"),
        ("team:" + "x" * 195 + ":*", False, "needs 202 characters"),
        ("user:" + "x" * 195 + ":{subject}", False, "needs 202 characters"),
    ],
)
def test_bad_patterns_are_refused_at_construction(pattern: str, anonymous: bool, message: str) -> None:
    """A pattern that could never work, or would leak, raises ValueError when the rule is made."""
    with pytest.raises(ValueError, match=message):
        Allow(pattern, anonymous=anonymous)


# -- App.check --------------------------------------------------------------------------


async def test_default_app_allows_no_plain_topic() -> None:
    """App() refuses every plain topic: only signed topics (handled by the server) get in."""
    app = App()
    assert await app.check(ALICE, "user:7") == "forbidden"
    assert await app.check(None, "public:x") == "forbidden"


async def test_an_app_without_rules_says_once_why_a_plain_topic_was_refused(caplog: pytest.LogCaptureFixture) -> None:
    """A server without --app (App()) refuses every plain topic as forbidden, which the client
    takes as final: the first refusal says in the log that only signed topics can be subscribed
    and how to allow plain ones, once per App; an App with rules says nothing of the kind."""
    caplog.set_level(logging.WARNING, logger="livepush.rules")
    app = App()
    assert await app.check(ALICE, "user:7") == "forbidden"
    assert await app.check(None, "public:x") == "forbidden"
    said = [r.getMessage() for r in caplog.records if r.name == "livepush.rules"]
    assert len(said) == 1 and "only signed topics" in said[0] and "--app" in said[0], said
    caplog.clear()
    assert await App(rules=[Allow("public:*", anonymous=True)]).check(ALICE, "user:7") == "forbidden"
    assert not [r for r in caplog.records if r.name == "livepush.rules"]


async def test_check_follows_the_rules() -> None:
    """check() returns None when a rule allows, 'forbidden' otherwise."""
    app = App(rules=[Allow("public:*", anonymous=True), Allow("user:{subject}")])
    assert await app.check(None, "public:news") is None
    assert await app.check(ALICE, "user:7") is None
    assert await app.check(ALICE, "user:70") == "forbidden"
    assert await app.check(None, "user:7") == "forbidden"


async def test_check_refuses_reserved_and_invalid_topics() -> None:
    """Reserved topics are forbidden even to a catch-all rule; malformed ones are invalid_topic."""
    app = App(rules=[Allow("*", anonymous=True)])
    assert await app.check(None, "_livepush.revocations") == "forbidden"
    assert await app.check(None, "job:1~signature") == "invalid_topic"
    assert await app.check(None, "") == "invalid_topic"
    assert await app.check(None, "x" * 201) == "invalid_topic"
    assert await app.check(None, 5) == "invalid_topic"  # type: ignore[arg-type]


async def test_sync_authorize_extends_the_rules() -> None:
    """A sync authorize is asked about topics no rule allows; exactly True allows."""
    calls: list[tuple[Session | None, str]] = []

    def authorize(session: Session | None, topic: str) -> bool:
        calls.append((session, topic))
        return topic == "team:42" and session is not None and session.subject == "7"

    app = App(rules=[Allow("public:*", anonymous=True)], authorize=authorize)
    assert await app.check(ALICE, "team:42") is None
    assert await app.check(BOB, "team:42") == "forbidden"
    assert await app.check(None, "team:42") == "forbidden"
    assert await app.check(None, "public:x") is None  # the rule answered: authorize not asked
    assert calls == [(ALICE, "team:42"), (BOB, "team:42"), (None, "team:42")]
    app.close()


async def test_async_authorize() -> None:
    """An async authorize is awaited."""

    async def authorize(session: Session | None, topic: str) -> bool:
        await asyncio.sleep(0)
        return session is not None

    app = App(authorize=authorize)
    assert await app.check(ALICE, "team:42") is None
    assert await app.check(None, "team:42") == "forbidden"


async def test_only_true_allows() -> None:
    """Truthy values that are not True (a string, 1, a list) refuse: no accidental grants."""
    for value in ("no", 1, [1], object()):
        app = App(authorize=lambda s, t, v=value: v)
        assert await app.check(ALICE, "team:42") == "forbidden"
        app.close()


async def test_an_authorize_that_answers_neither_true_nor_false_is_named_in_the_log_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """A hook that returns a row, 1 or nothing at all (a missing `return`) refuses for good, since
    the client takes `forbidden` as final: the log says once per App what it returned and that only
    True allows, rather than leaving every such subscribe refused without a word."""
    caplog.set_level(logging.WARNING, logger="livepush.rules")
    for value, named in ((None, "returned None"), (1, "returned an int"), ({"id": 7}, "returned a dict")):
        caplog.clear()
        app = App(authorize=lambda s, t, v=value: v)
        assert await app.check(ALICE, "team:42") == "forbidden"
        assert await app.check(ALICE, "team:43") == "forbidden"
        said = [r.getMessage() for r in caplog.records if "authorize()" in r.getMessage()]
        assert len(said) == 1 and named in said[0] and "True" in said[0], said
        app.close()
    caplog.clear()
    app = App(authorize=lambda s, t: False)
    assert await app.check(ALICE, "team:42") == "forbidden"
    assert not caplog.records  # False is an answer: nothing to say
    app.close()


async def test_sync_callable_returning_a_coroutine_is_awaited() -> None:
    """A sync callable that returns an awaitable (e.g. a partial of an async def) works."""

    async def inner(session: Session | None, topic: str) -> bool:
        return True

    app = App(authorize=lambda s, t: inner(s, t))
    assert await app.check(ALICE, "team:42") is None
    app.close()


async def test_raising_authorize_refuses_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    """An exception answers 'unavailable' (no answer is not a refusal), is logged once per type, and its text stays in the log."""
    caplog.set_level(logging.ERROR, logger="livepush.rules")

    def authorize(session: Session | None, topic: str) -> bool:
        if topic == "team:key":
            raise KeyError("secret-detail")
        raise ValueError("secret-detail")

    app = App(authorize=authorize)
    results = [await app.check(ALICE, "team:1") for _ in range(3)]
    results.append(await app.check(ALICE, "team:key"))
    results.append(await app.check(ALICE, "team:key"))
    assert results == ["unavailable"] * 5
    records = [r for r in caplog.records if r.name == "livepush.rules"]
    assert [r.exc_info[0] for r in records if r.exc_info] == [ValueError, KeyError]
    assert len(records) == 2
    app.close()


async def test_async_authorize_timing_out_refuses_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    """An async authorize slower than authorize_timeout answers 'unavailable', logged once."""
    caplog.set_level(logging.ERROR, logger="livepush.rules")
    never = asyncio.Event()

    async def authorize(session: Session | None, topic: str) -> bool:
        await never.wait()
        return True

    app = App(authorize=authorize, authorize_timeout=0.05)
    assert await app.check(ALICE, "team:1") == "unavailable"
    assert await app.check(ALICE, "team:2") == "unavailable"
    records = [r for r in caplog.records if r.name == "livepush.rules"]
    assert len(records) == 1
    assert "did not answer" in records[0].getMessage()


async def test_sync_authorize_timing_out_refuses_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    """A blocking sync authorize is abandoned after authorize_timeout with 'unavailable'; the loop stays responsive."""
    caplog.set_level(logging.ERROR, logger="livepush.rules")
    release = threading.Event()

    def authorize(session: Session | None, topic: str) -> bool:
        release.wait(5)
        return True

    app = App(authorize=authorize, authorize_timeout=0.05)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await app.check(ALICE, "team:1") == "unavailable"
        assert await app.check(ALICE, "team:2") == "unavailable"
        # Well under the 5 s the authorize blocks for, with room for a loaded machine.
        assert loop.time() - started < 3
        records = [r for r in caplog.records if r.name == "livepush.rules"]
        assert len(records) == 1
    finally:
        release.set()
        app.close()


async def test_an_authorize_that_raises_cancelled_error_of_its_own_answers_unavailable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A hook awaiting something another task cancelled (say a lookup shared between subscribes)
    raises CancelledError though nobody cancelled the subscribe: no answer, so 'unavailable',
    logged like any other failure; the subscribe itself is not taken for cancelled."""
    caplog.set_level(logging.ERROR, logger="livepush.rules")
    shared_lookup = asyncio.get_running_loop().create_future()
    shared_lookup.cancel()

    async def authorize(session: Session | None, topic: str) -> bool:
        return await shared_lookup

    app = App(authorize=authorize)
    assert await app.check(ALICE, "team:1") == "unavailable"
    records = [r for r in caplog.records if r.name == "livepush.rules"]
    assert len(records) == 1 and "CancelledError" in records[0].getMessage()


@pytest.mark.parametrize("shape", ["async def", "sync returning a coroutine"])
async def test_an_async_authorize_slow_to_stop_still_answers_within_its_timeout(shape: str) -> None:
    """A hook that takes its time to stop once cancelled (a database driver cancelling its query on
    the server, a clean-up that awaits) gives no answer past authorize_timeout: 'unavailable' then,
    not whenever it ends."""
    release = asyncio.Event()

    async def slow_to_stop(session: Session | None, topic: str) -> bool:
        try:
            await asyncio.Event().wait()  # never answers
        except asyncio.CancelledError:
            await release.wait()  # and stops only when let go
            raise
        return True

    app = App(authorize=slow_to_stop if shape == "async def" else (lambda s, t: slow_to_stop(s, t)),
              authorize_timeout=0.2)
    try:
        assert await asyncio.wait_for(app.check(ALICE, "team:1"), 5) == "unavailable"
    finally:
        release.set()
        app.close()


async def test_a_cancelled_subscribe_is_still_cancelled_while_authorize_runs() -> None:
    """Cancelling the subscribe (its connection closed) while the hook runs cancels the check."""
    started = asyncio.Event()

    async def authorize(session: Session | None, topic: str) -> bool:
        started.set()
        await asyncio.Event().wait()
        return True

    app = App(authorize=authorize)
    check = asyncio.ensure_future(app.check(ALICE, "team:1"))
    await asyncio.wait_for(started.wait(), 5)
    check.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(check, 5)


async def test_a_slow_spell_of_sync_authorize_leaves_its_queue_whole() -> None:
    """Calls that time out while queued for authorize()'s threads give their place back: once
    the hook answers again, a burst as large as its threads plus queue is answered, not refused
    'unavailable' for ever."""
    gate = threading.Event()

    def authorize(session: Session | None, topic: str) -> bool:
        gate.wait(5)
        return True

    app = App(authorize=authorize, authorize_timeout=0.5)
    burst = AUTHORIZE_THREADS + AUTHORIZE_QUEUE
    try:
        # Every thread blocked and the queue full: all time out, the queued ones before they ran.
        spell = await asyncio.gather(*(app.check(ALICE, f"team:{i}") for i in range(burst)))
        assert spell == ["unavailable"] * burst
        gate.set()

        async def burst_answered() -> bool:
            answers = await asyncio.gather(*(app.check(ALICE, f"team:{i}") for i in range(burst)))
            return answers == [None] * burst

        await async_wait_for(burst_answered, message="a full burst answered after the hook recovered")
    finally:
        gate.set()
        app.close()


@pytest.mark.parametrize("exit_kind", [SystemExit, KeyboardInterrupt])
async def test_a_sync_authorize_that_exits_answers_unavailable(exit_kind: type[BaseException]) -> None:
    """A sync hook runs in a thread, where sys.exit() or a stray KeyboardInterrupt ends nothing
    but the call: it is a failed answer ('unavailable'), not an exit of the server's loop."""
    def authorize(session: Session | None, topic: str) -> bool:
        raise exit_kind()

    app = App(authorize=authorize)
    try:
        assert await asyncio.wait_for(app.check(ALICE, "team:1"), 5) == "unavailable"
    finally:
        app.close()


class _LibraryTimeout(BaseException):
    """What some libraries raise for their own timeouts: a BaseException, not an Exception."""


@pytest.mark.parametrize("exit_kind", [SystemExit, KeyboardInterrupt, GeneratorExit, _LibraryTimeout])
@pytest.mark.parametrize("shape", ["async def", "sync returning a coroutine"])
async def test_an_async_authorize_that_exits_answers_unavailable(exit_kind: type[BaseException], shape: str) -> None:
    """An async hook runs as a task on the server's loop, where sys.exit() or a stray
    KeyboardInterrupt would stop the loop, and the server with it, and any other BaseException
    (but a cancellation) would go past the subscribe, left unanswered: each is a failed answer
    ('unavailable') like any other exception, and the loop goes on."""
    async def exits(session: Session | None, topic: str) -> bool:
        await asyncio.sleep(0)
        raise exit_kind()

    app = App(authorize=exits if shape == "async def" else (lambda s, t: exits(s, t)))
    try:
        assert await asyncio.wait_for(app.check(ALICE, "team:1"), 5) == "unavailable"
        assert await asyncio.wait_for(app.check(ALICE, "team:1"), 5) == "unavailable"
    finally:
        app.close()


@pytest.mark.parametrize("shape", ["sync", "async"])
async def test_a_hook_that_exits_is_logged_under_what_it_raised(shape: str, caplog: pytest.LogCaptureFixture) -> None:
    """The log names what the hook raised (SystemExit), not the RuntimeError it is carried in
    past the loop, and counts it apart: a RuntimeError of the hook's own later is logged too."""
    caplog.set_level(logging.ERROR, logger="livepush.rules")
    raised: list[BaseException] = [SystemExit(2), RuntimeError("boom")]

    def sync(session: Session | None, topic: str) -> bool:
        raise raised.pop(0)

    async def in_loop(session: Session | None, topic: str) -> bool:
        raise raised.pop(0)

    app = App(authorize=sync if shape == "sync" else in_loop)
    try:
        assert await app.check(ALICE, "team:1") == "unavailable"
        assert await app.check(ALICE, "team:1") == "unavailable"
    finally:
        app.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "livepush.rules"]
    assert len(lines) == 2 and "raised SystemExit" in lines[0] and "raised RuntimeError" in lines[1], lines


async def test_each_app_logs_its_own_first_failure(caplog: pytest.LogCaptureFixture) -> None:
    """'Once' is per App: a second App logs its first failure too."""
    caplog.set_level(logging.ERROR, logger="livepush.rules")

    async def authorize(session: Session | None, topic: str) -> bool:
        raise RuntimeError("boom")

    for app in (App(authorize=authorize), App(authorize=authorize)):
        await app.check(ALICE, "team:1")
        await app.check(ALICE, "team:1")
    assert len([r for r in caplog.records if r.name == "livepush.rules"]) == 2


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"rules": ["public:*"]}, TypeError),
        ({"authorize": "yes"}, TypeError),
        ({"authorize_timeout": 0}, ValueError),
        ({"authorize_timeout": float("inf")}, ValueError),
        ({"max_subscriptions": 0}, ValueError),
        ({"max_subscriptions": 1.5}, ValueError),
        ({"reverify_interval": -1}, ValueError),
        ({"reverify_interval": timedelta(0)}, ValueError),
        ({"authorize_timeout": timedelta(seconds=-2)}, ValueError),
    ],
)
def test_app_validates_its_arguments(kwargs: dict, error: type[Exception]) -> None:
    """App() refuses arguments that cannot work, at construction."""
    with pytest.raises(error):
        App(**kwargs)


def test_app_takes_its_seconds_as_a_timedelta_too() -> None:
    """App(authorize_timeout=, reverify_interval=) take a timedelta, as every seconds argument of
    livepush does, as its seconds: they refused one as no number of seconds."""
    app = App(authorize_timeout=timedelta(milliseconds=500), reverify_interval=timedelta(minutes=2))
    assert (app.authorize_timeout, app.reverify_interval) == (0.5, 120.0)


async def _three(request: object, session: object, topic: str) -> bool:
    return True


@pytest.mark.parametrize("authorize", [lambda session: True, lambda: True, _three],
                         ids=["one parameter", "none", "three, async"])
def test_an_authorize_that_cannot_take_session_and_topic_is_refused_at_construction(authorize: object) -> None:
    """authorize() is called with (session, topic) at each subscribe no rule allows: one that
    cannot take them raised TypeError there, every such subscribe was answered `unavailable`
    (which the JS client retries for ever) and the mistake showed only in the server's log. It is
    an ArgumentTypeError naming App(authorize=) when the app is made, where --app loads it."""
    with pytest.raises(livepush.ArgumentTypeError, match=r"App\(authorize=\.\.\.\) is called with \(session, topic\)"):
        App(authorize=authorize)  # type: ignore[arg-type]


class _Checker:
    def __call__(self, session: object, topic: str) -> bool:
        return True


@pytest.mark.parametrize("authorize", [lambda session, topic: True, lambda *args: True, _Checker(),
                                       lambda session, topic, extra=None: True])
def test_an_authorize_that_takes_session_and_topic_is_accepted(authorize: object) -> None:
    assert App(authorize=authorize).authorize is authorize  # type: ignore[arg-type]


@pytest.mark.parametrize(("rules", "message"), [
    (Allow("public:*", anonymous=True), r"takes a list of livepush.Allow rules, got a bare Allow: write rules=\[Allow\(pattern='public:\*'"),
    ("public:*", r"takes a list of livepush.Allow rules, got a bare str: write rules=\[livepush.Allow\('public:\*'\)\]"),
    (None, r"takes a list of livepush.Allow rules, got NoneType"),
])
def test_rules_given_bare_are_refused_saying_how_to_write_them(rules: object, message: str) -> None:
    """One rule (or one pattern) where the list goes is a TypeError naming App(rules=) and showing
    the list to write, not "'Allow' object is not iterable"."""
    with pytest.raises(livepush.ArgumentTypeError, match=r"App\(rules=\.\.\.\) " + message):
        App(rules=rules)  # type: ignore[arg-type]


def test_patterns_listed_without_allow_are_refused_showing_the_rule_to_write() -> None:
    """A list of patterns (rules=["public:*"], as other servers spell their channel rules) is
    refused showing the rule each should be, as a bare pattern is, not only naming its type."""
    with pytest.raises(livepush.ArgumentTypeError,
                       match=r"App\(rules=\.\.\.\): item 1 is a str, not livepush.Allow: write livepush.Allow\('user:\{subject\}'\)"):
        App(rules=[Allow("public:*", anonymous=True), "user:{subject}"])  # type: ignore[list-item]


def test_a_rule_refused_inside_a_generator_of_rules_keeps_its_own_error() -> None:
    """A rule that a generator of rules fails to make is named by its own error, not hidden as rules
    of the wrong type."""
    with pytest.raises(livepush.ArgumentTypeError, match=r"Allow\('team:\*', anonymous=\.\.\.\) must be True or False"):
        App(rules=(Allow(p, anonymous="no") for p in ["team:*"]))  # type: ignore[arg-type]


def test_app_defaults() -> None:
    """Defaults: 100 subscriptions, 2 s authorize timeout, 60 s re-verification."""
    app = App()
    assert (app.max_subscriptions, app.authorize_timeout, app.reverify_interval) == (100, 2.0, 60.0)
    assert livepush.App is App and livepush.Allow is Allow


# -- load_app ---------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary project directory on sys.path with a `pushcfg` package."""
    pkg = tmp_path / "pushcfg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "good.py").write_text(
        "import livepush\n"
        "app = livepush.App(rules=[livepush.Allow('public:*', anonymous=True)])\n"
        "class Holder:\n    app = app\n"
        "not_an_app = {'rules': []}\n"
    )
    (pkg / "broken.py").write_text("raise RuntimeError('boom at import')\n")
    (pkg / "needs_missing.py").write_text("import definitely_not_installed_xyz\n")
    (pkg / "typo.py").write_text("import livepush\n\napp = livepush.App(rules=[livepush.Alow('a:*')])\n")
    (pkg / "unparsable.py").write_text("import livepush\n\napp = livepush.App(rules=[\n")
    (pkg / "bad_rule.py").write_text("import livepush\n\napp = livepush.App(rules=[livepush.Allow('user:{subject}*')])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "pushcfg" or m.startswith("pushcfg.")]:
        del sys.modules[name]


def test_load_app_finds_the_object(project: Path) -> None:
    """MODULE:ATTR (and MODULE:OBJ.ATTR) returns the App."""
    app = load_app("pushcfg.good:app")
    assert isinstance(app, App)
    assert load_app("pushcfg.good:Holder.app") is app


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("pushcfg.good", "expected MODULE:ATTR"),
        ("pushcfg.good:", "expected MODULE:ATTR"),
        (":app", "expected MODULE:ATTR"),
        ("a:b:c", "expected MODULE:ATTR"),
        ("pushcfg.nope:app", "no module named 'pushcfg.nope'"),
        ("nopkg_xyz.push:app", "no module named 'nopkg_xyz'"),
        ("pushcfg.good:missing", "has no attribute 'missing'"),
        ("pushcfg.good:not_an_app", "is a dict, not a livepush.App"),
        # A file path where the module goes: the line gives the spec to write, as `livepush jobs` does.
        ("pushcfg/good.py:app", r"is a file path, not a module: .* e\.g\. --app pushcfg\.good:app$"),
        ("./pushcfg/good.py:app", r"is a file path, not a module: .* e\.g\. --app pushcfg\.good:app$"),
        ("pushcfg.good.py:app", r"is a file path, not a module: .* e\.g\. --app pushcfg\.good:app$"),
        ("pushcfg.broken:app", r"\(pushcfg/broken.py:1\): RuntimeError: boom at import"),
        ("pushcfg.needs_missing:app", r"importing 'pushcfg.needs_missing' failed \(pushcfg/needs_missing.py:1\)"),
        # The user's own line, not livepush's or the import machinery's, as `livepush jobs` says it.
        ("pushcfg.typo:app", r"\(pushcfg/typo.py:3\): AttributeError: .*'Alow'"),
        ("pushcfg.unparsable:app", r"\(pushcfg/unparsable.py:3\): SyntaxError: "),
        # A rule's own refusal names the rule and the line that made it, not the dataclass code between.
        ("pushcfg.bad_rule:app", r"\(pushcfg/bad_rule.py:3\): ArgumentValueError: Allow\('user:\{subject\}\*'\)"),
    ],
)
def test_load_app_errors_are_config_errors(project: Path, spec: str, message: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way --app can be wrong is a ConfigError whose message says which, and where in the
    user's module an import failed."""
    monkeypatch.chdir(project)  # where a user runs `serve --app` from: paths are named from here
    with pytest.raises(ConfigError, match=message):
        load_app(spec)


@pytest.mark.parametrize(
    ("source", "said"),
    [
        # A validation library's error (pydantic's, say) spreads over lines: each part is kept, on one line.
        ("raise RuntimeError('1 validation error for Settings\\ndsn\\n  Field required')\n",
         "RuntimeError: 1 validation error for Settings / dsn / Field required"),
        ("raise RuntimeError()\n", "RuntimeError"),
        ("raise RuntimeError('  ')\n", "RuntimeError"),
        ("raise SyntaxError\n", "SyntaxError"),  # raised, not compiled: no message at all
    ],
)
def test_an_app_module_failing_at_import_is_said_in_one_line(project: Path, source: str, said: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """What an --app module raised at import is said on the one line `serve` prints: a message of
    several lines is joined, and an empty one leaves the type alone, with no dangling colon."""
    (project / "pushcfg" / "raises.py").write_text(source)
    monkeypatch.chdir(project)
    with pytest.raises(ConfigError) as raised:
        load_app("pushcfg.raises:app")
    message = str(raised.value)
    assert "\n" not in message and message.endswith(f"(pushcfg/raises.py:1): {said}"), message


# Patterns and topics over a small alphabet, so that stars, separators and literals collide often.
_PIECES = st.sampled_from(["a", "b", ":", "ab", "a:", ":b"])
_PATTERNS = st.lists(st.one_of(_PIECES, st.just("*")), min_size=1, max_size=7).map("".join).filter(
    lambda p: "**" not in p)
_TOPICS = st.lists(st.sampled_from(["a", "b", ":"]), min_size=1, max_size=14).map("".join)


@settings(max_examples=400, deadline=None)
@given(_PATTERNS, _TOPICS)
def test_a_rule_matches_as_its_pattern_reads(pattern: str, topic: str) -> None:
    """A rule allows exactly the topics its pattern describes, '*' standing for one or more
    characters: the same answers as a regular expression of the pattern, found without one."""
    reference = re.compile("".join("[A-Za-z0-9_.:/-]+" if part == "*" else re.escape(part)
                                   for part in re.split(r"(\*)", pattern) if part))
    assert Allow(pattern, anonymous=True).allows(None, topic) == (reference.fullmatch(topic) is not None)


def test_a_rule_of_many_stars_answers_a_crafted_topic_at_once() -> None:
    """A regular expression of `*:*:*:*:x` backtracks for seconds on a topic of 199 separators:
    a client could stall the server with one subscribe. The rule answers a thousand of them
    while that regular expression would still be on its first."""
    rule = Allow("*:*:*:*:x", anonymous=True)
    crafted = ":" * 199 + "y"
    bound = time.monotonic() + 10  # a thousand times what the answers take
    for _ in range(1000):
        assert not rule.allows(None, crafted)
        assert time.monotonic() < bound, "a crafted topic still costs the rule a backtracking search"
    assert rule.allows(None, "a:b:c:d:x") and not rule.allows(None, "a:b:c:x")
