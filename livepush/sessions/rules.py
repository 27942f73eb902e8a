"""Who may subscribe to which plain topic (docs/reference.md#5-wire-protocol): the `--app` object.

    # myapp/push.py, served with: livepush serve --app myapp.push:app
    import livepush
    app = livepush.App(rules=[
        livepush.Allow("public:*", anonymous=True),   # anyone, with a session or not
        livepush.Allow("user:{subject}"),             # only the session whose subject fills the slot
    ], authorize=can_see)                             # anything the rules cannot express

A signed topic is its own permission and never reaches these rules (the server verifies
it). A plain topic is allowed when a rule allows it, or else when `authorize` returns
True; otherwise it is refused with ``forbidden``. With no rules and no `authorize`
(`App()`), only signed topics can be subscribed.

Pattern syntax:
- literal characters from the topic alphabet ``A-Z a-z 0-9 _ . : / -`` match themselves;
- ``*`` matches ONE OR MORE topic characters, any of them, ``:`` and ``/`` included (like
  Phoenix's ``"room:*"``): ``public:*`` matches ``public:news`` and ``public:news:eu``
  but not ``public:``;
- ``{subject}`` matches exactly the session's subject; a rule with it never matches an
  anonymous connection, nor a subject that holds a topic separator (``:``, ``/`` or ``.``:
  subject ``7:x`` must not enter subject ``7``'s ``team:7:*``). It may not touch a ``*``
  (``user:{subject}*`` would let subject ``7`` read ``user:70``), and a separator must stand
  between it and any ``*`` (under ``user:{subject}-*`` subject ``7-x`` would read
  ``user:7-x-inbox``): e.g. ``user:{subject}:*`` or ``user:{subject}-inbox:*``. A ``*`` may
  stand on one side of it only (under ``*:{subject}:*`` subject ``x`` would read
  ``team:7:x:inbox``). It reaches a state topic (``job:``, ``group:``, ``workflow:``) only when
  the pattern begins with that prefix itself (under ``{subject}:*`` subject ``job`` would read
  every job).
A pattern must match the whole topic, so one whose shortest match is longer than a topic can be
is refused when the rule is made.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import inspect
import logging
import math
import re
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from ..errors import ArgumentTypeError, ArgumentValueError, ConfigError
from .tokens import Session
from ..topics import MAX_TOPIC_LENGTH, RESERVED_PREFIX, TOPIC_RE, livepush_owned
from ..types import Seconds, as_seconds, shown
from ..usercode import (as_module, cannot_take, importable_from_cwd, is_a_path, names_the_module, not_found, what_raised,
                        where_raised)

log = logging.getLogger("livepush.rules")

Authorize: TypeAlias = Callable[[Session | None, str], bool | Awaitable[bool]]

SUBJECT_SLOT = "{subject}"
# A subject with one of these could reach into another subject's namespace through a slot.
SEPARATORS = frozenset(":/.")
# Sync authorize() calls waiting for a thread, at most, per App: past it a subscribe is
# answered `unavailable` at once rather than queued behind calls that may never return.
AUTHORIZE_THREADS = 8
AUTHORIZE_QUEUE = 32
_LITERAL_RE = re.compile(r"[A-Za-z0-9_.:/-]+")
_TOKEN_RE = re.compile(r"\{[^{}]*\}|\*|[^{}*]+|[{}]")


def _glob(chunks: tuple[str, ...], topic: str) -> bool:
    """Whether `topic` (a valid topic) is chunks[0], then for each later chunk one or more
    characters (a '*') and that chunk. Each middle chunk is placed at its first fit, which leaves
    the most room for the rest: linear in the topic per chunk, where a backtracking regex took
    seconds for `*:*:*:*:x` on a crafted 200-character topic."""
    first = chunks[0]
    if len(chunks) == 1:
        return topic == first
    last = chunks[-1]
    end = len(topic) - len(last)  # where the last chunk must start
    if not topic.startswith(first) or end < len(first) or topic[end:] != last:
        return False
    at = len(first)
    for chunk in chunks[1:-1]:
        found = topic.find(chunk, at + 1, end - 1)
        if found < 0:
            return False
        at = found + len(chunk)
    return end >= at + 1


def _pinned(tokens: list[str], kinds: list[str]) -> bool:
    """Whether the literals from a {subject} slot up to the next '*' (in the order given) hold a
    separator: true too when no '*' follows."""
    for token, kind in zip(tokens, kinds):
        if kind == "*":
            return False
        if kind == "literal" and any(c in SEPARATORS for c in token):
            return True
    return True


@dataclass(frozen=True)
class Allow:
    """Allow subscribing to plain topics matching `pattern` (see the module docstring).

    `anonymous=True` also allows connections without a session; by default a session is
    required. A `{subject}` rule is always for sessions only.
    """

    pattern: str
    anonymous: bool = False
    # The literal runs between the pattern's '*'s ("\0" standing for the subject), first and
    # last included, "" when the pattern starts or ends with '*'.
    _chunks: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _has_subject: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str) or not self.pattern:
            raise ArgumentValueError(f"Allow() needs a non-empty pattern string, got {shown(self.pattern)}")
        if self.pattern.startswith(RESERVED_PREFIX):
            raise ArgumentValueError(f"Allow({self.pattern!r}): topics starting with {RESERVED_PREFIX!r} are "
                                     "livepush's own")
        if not isinstance(self.anonymous, bool):
            # Any truthy value would open the topics to everyone: "no" or "false" read from a
            # setting as text among them.
            raise ArgumentTypeError(f"Allow({self.pattern!r}, anonymous=...) must be True or False, "
                                    f"got {self.anonymous!r}")
        parts: list[str] = []
        kinds: list[str] = []
        tokens = _TOKEN_RE.findall(self.pattern)
        for token in tokens:
            if token == "*":
                if kinds and kinds[-1] == "*":
                    raise ArgumentValueError(f"Allow({self.pattern!r}): '**' means nothing more than '*': use one")
                parts.append("*")
                kinds.append("*")
            elif token == SUBJECT_SLOT:
                parts.append("\0")  # filled with the escaped subject at match time
                kinds.append("subject")
            elif token.startswith("{") or token in ("{", "}"):
                raise ArgumentValueError(f"Allow({self.pattern!r}): unknown slot {token!r}; the only slot is {{subject}}")
            elif not _LITERAL_RE.fullmatch(token):
                raise ArgumentValueError(
                    f"Allow({self.pattern!r}): {token!r} has characters a topic never has; "
                    "use A-Z a-z 0-9 _ . : / - plus * and {subject}"
                )
            else:
                parts.append(token)
                kinds.append("literal")
        for a, b in zip(kinds, kinds[1:]):
            if {a, b} == {"*", "subject"}:
                raise ArgumentValueError(
                    f"Allow({self.pattern!r}): '*' next to {{subject}} would let one subject match another's "
                    "topics (subject 7 reading user:70): put a literal separator between them, e.g. user:{subject}:*"
                )
        for i, kind in enumerate(kinds):
            if kind != "subject":
                continue
            # A subject never holds a separator, so the first separator after the slot (or the
            # last before it) pins where the subject ends; without one between the slot and a '*',
            # the subject's end floats: under user:{subject}-*, subject 7-x would read
            # user:7-x-inbox, inside subject 7's user:7-*.
            after = not _pinned(tokens[i + 1:], kinds[i + 1:])
            before = not _pinned(tokens[:i][::-1], kinds[:i][::-1])
            # A separator pins the slot only when one side of it is anchored: with a '*' on each
            # side (which crosses separators), the slot may fall on any segment, and under
            # *:{subject}:* subject x would read team:7:x:inbox, inside subject 7's *:7:*.
            if "*" in kinds[:i] and "*" in kinds[i + 1:]:
                raise ArgumentValueError(
                    f"Allow({self.pattern!r}): a '*' on both sides of {{subject}} lets the slot fall on any "
                    f"segment (subject x reading team:7:x:inbox under *:{{subject}}:*): keep the '*' to one "
                    f"side, e.g. team:{{subject}}:* or *:{{subject}}"
                )
            if after or before:
                raise ArgumentValueError(
                    f"Allow({self.pattern!r}): a '*' could stretch {{subject}} into another subject's topics "
                    f"(subject 7-x reading user:7-x-inbox under user:{{subject}}-*): put a separator "
                    f"({', '.join(sorted(SEPARATORS))}) between {{subject}} and the '*' "
                    f"{'after' if after else 'before'} it, e.g. user:{{subject}}:*"
                )
        has_subject = "subject" in kinds
        if has_subject and self.anonymous:
            raise ArgumentValueError(
                f"Allow({self.pattern!r}, anonymous=True): a {{subject}} rule needs a session, so it can never "
                "match an anonymous connection; drop anonymous=True"
            )
        # The shortest topic it matches: each literal, a character per '*' and per slot. Longer
        # than any topic, the rule would refuse everything, silently, at every subscribe.
        shortest = sum(len(t) if k == "literal" else 1 for t, k in zip(tokens, kinds))
        if shortest > MAX_TOPIC_LENGTH:
            raise ArgumentValueError(
                f"Allow({self.pattern[:60]!r}...): it matches no topic, since it needs {shortest} characters and "
                f"a topic has at most {MAX_TOPIC_LENGTH}: shorten the pattern"
            )
        # A literal never holds '*' (checked above), so the joined parts split back into the runs.
        object.__setattr__(self, "_chunks", tuple("".join(parts).split("*")))
        object.__setattr__(self, "_has_subject", has_subject)

    def allows(self, session: Session | None, topic: str) -> bool:
        """Does this rule allow `session` (None: anonymous) to subscribe to plain `topic`?"""
        if session is None and not self.anonymous:
            return False
        if not isinstance(topic, str) or not TOPIC_RE.fullmatch(topic):
            return False
        chunks = self._chunks
        if self._has_subject:
            assert session is not None  # a {subject} rule is never anonymous (checked above)
            if not SEPARATORS.isdisjoint(session.subject):
                return False
            # livepush's own topics (a job's, a group's or a workflow's state, the runtimes') are
            # reached only by a rule that names them itself: under {subject}:* subject "job" read
            # every job, and under *:{subject} subject 5 read job 5, which the rule's author never
            # meant to allow.
            owned = livepush_owned(topic)
            if owned is not None and not chunks[0].startswith(owned):
                return False
            # The subject is matched literally: "." or "*" in it are plain characters.
            chunks = tuple(c.replace("\0", session.subject) for c in chunks)
        return _glob(chunks, topic)


def _unfit(subject: str) -> str | None:
    """What keeps `subject` out of every {subject} slot, or None when it can fill one."""
    if not SEPARATORS.isdisjoint(subject):
        return f"a topic separator ({', '.join(sorted(SEPARATORS))})"
    if not _LITERAL_RE.fullmatch(subject):
        return "a character no topic has"
    return None


def _a(noun: str) -> str:
    """`noun` with its article, for a log line read as English: "an int", "a dict"."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _positive(name: str, value: object) -> float:
    seconds = math.nan
    given = as_seconds(value)  # a timedelta is checked as its seconds, as every seconds argument is
    if isinstance(given, (int, float)) and not isinstance(given, bool):
        try:
            seconds = float(given)
        except OverflowError:  # an int past a float's range (10**400): no timeout a loop can arm
            pass
    if not 0 < seconds < math.inf:
        raise ArgumentValueError(f"App({name}=...) must be a positive, finite number of seconds or a timedelta, "
                                 f"got {shown(value, width=60)}")
    return seconds


def _rules(rules: object) -> tuple[Allow, ...]:
    """`rules` as a tuple. One rule or one pattern given bare is the likely slip: tuple() read a
    str as its characters and refused a bare Allow with "'Allow' object is not iterable"."""
    if isinstance(rules, (Allow, str)):
        hint = repr(rules) if isinstance(rules, Allow) else f"livepush.Allow({rules!r})"
        raise ArgumentTypeError(f"App(rules=...) takes a list of livepush.Allow rules, got a bare "
                                f"{type(rules).__name__}: write rules=[{hint:.100}]")
    try:
        items = iter(rules)  # type: ignore[call-overload]
    except TypeError:
        raise ArgumentTypeError(f"App(rules=...) takes a list of livepush.Allow rules, got {type(rules).__name__}") from None
    return tuple(items)


class _Escaped(RuntimeError):
    """A BaseException the hook raised (SystemExit, KeyboardInterrupt, ...), carried past the
    server's loop as an ordinary failure; the log names the hook's own exception, its cause."""


async def _contained(answer: Awaitable[Any]) -> Any:
    """Await an async authorize()'s answer. It runs as a task, and a SystemExit or
    KeyboardInterrupt raised in a task leaves the event loop: the whole server would stop. Here
    they end only this call, a failed answer, as they do for a sync hook in its thread. So does
    any other BaseException but a cancellation (GeneratorExit, a library's own timeout class):
    passed on, it went past every handler of the subscribe, which was then never answered."""
    try:
        return await answer
    except (Exception, asyncio.CancelledError):
        raise
    except BaseException as exc:
        raise _Escaped(f"authorize() raised {type(exc).__name__}") from exc


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _check_authorize(authorize: Callable[..., Any]) -> None:
    """An ArgumentTypeError unless `authorize(session, topic)` can be called: it is called only at
    a subscribe no rule allows, where its TypeError answered `unavailable`, which the JS client
    retries for ever, and the mistake showed only in the server's log."""
    why = cannot_take(authorize, None, "topic")
    if why is not None:
        raise ArgumentTypeError(f"App(authorize=...) is called with (session, topic), the session None for "
                                f"an anonymous connection, but {shown(authorize, width=60)} cannot take them ({why}): "
                                "e.g. def authorize(session, topic): ...")


class App:
    """The user's configuration object for `livepush serve --app MODULE:ATTR`.

    `rules`: Allow rules for plain topics. `authorize(session, topic)`: an optional
    callable (sync or async; session is None for anonymous) asked about plain topics that
    no rule allows; only a return value of exactly True allows (anything but a bool is
    named in a warning, once per App). It is bounded by
    `authorize_timeout` seconds; a timeout, an exception or a full thread pool answers
    ``unavailable`` (the client retries later), is
    logged once per exception type, and never reaches the client. A sync `authorize`
    runs in a small thread pool of its own, so it may block (e.g. on a database query);
    a call that times out keeps its thread until it returns. An async one that times out is
    cancelled and left to stop on its own: the answer does not wait for it.
    `max_subscriptions`: per connection; beyond it the server refuses with ``limit``.
    `reverify_interval`: seconds between the server's re-checks of open sessions for
    expiry and revocation. Both durations take a timedelta too.

    Semantics chosen: rules are a fast allow-list (no I/O); `authorize` extends them,
    like a Centrifugo subscribe proxy for channels that have no permission option. It
    cannot veto a rule: to restrict a topic, do not cover it with a rule and decide in
    `authorize` instead.
    """

    def __init__(
        self,
        rules: Iterable[Allow] = (),
        authorize: Authorize | None = None,
        authorize_timeout: Seconds = 2.0,
        max_subscriptions: int = 100,
        reverify_interval: Seconds = 60.0,
    ) -> None:
        self.rules: tuple[Allow, ...] = _rules(rules)
        for i, rule in enumerate(self.rules):
            if not isinstance(rule, Allow):
                # A pattern as text is the likely slip (other servers list channel rules so): show its rule.
                hint = f": write livepush.Allow({shown(rule, width=100)})" if isinstance(rule, str) else ""
                raise ArgumentTypeError(f"App(rules=...): item {i} is a {type(rule).__name__}, not livepush.Allow{hint}")
        if authorize is not None and not callable(authorize):
            raise ArgumentTypeError(f"App(authorize=...) must be callable(session, topic), got {type(authorize).__name__}")
        if authorize is not None:
            _check_authorize(authorize)
        self.authorize = authorize
        self.authorize_timeout = _positive("authorize_timeout", authorize_timeout)
        if isinstance(max_subscriptions, bool) or not isinstance(max_subscriptions, int) or max_subscriptions < 1:
            raise ArgumentValueError(f"App(max_subscriptions=...) must be a positive int, got {shown(max_subscriptions)}")
        self.max_subscriptions = max_subscriptions
        self.reverify_interval = _positive("reverify_interval", reverify_interval)
        self._authorize_is_async = authorize is not None and _is_async(authorize)
        self._logged: set[type[BaseException]] = set()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._waiting = 0  # sync calls submitted and not yet returned
        self._waiting_lock = threading.Lock()
        self._stopping: set[asyncio.Future[Any]] = set()  # async calls given up on, not yet stopped
        self._slot_rules = tuple(rule.pattern for rule in self.rules if rule._has_subject)
        self._told_unfit = False  # whether a subject no slot can hold was logged
        self._told_not_bool = False  # whether an authorize() answer that is no bool was logged
        self._told_signed_only = False  # whether a plain topic refused for want of any rule was logged

    def __repr__(self) -> str:
        return f"App(rules={list(self.rules)!r}, authorize={self.authorize!r}, max_subscriptions={self.max_subscriptions})"

    def _session_rules(self) -> tuple[str, ...]:
        """The patterns of the rules that need a session (not anonymous=True): on a server that
        ignores tokens (LIVEPUSH_AUTHENTICATE=off), where every connection is anonymous, they
        allow nothing. The server's own, to warn so as it starts: not API."""
        return tuple(rule.pattern for rule in self.rules if not rule.anonymous)

    def _allowed_by_rules(self, session: Session | None, topic: str) -> bool:
        # The rules' part of check(), which is the answer users may rely on.
        return any(rule.allows(session, topic) for rule in self.rules)

    async def check(self, session: Session | None, topic: str) -> str | None:
        """None when `session` (None: anonymous) may subscribe to plain `topic`, else the wire
        reason: ``invalid_topic`` (not a plain topic), ``forbidden``, or ``unavailable`` when
        `authorize` could not answer (it timed out, raised, or its threads are all busy): a
        transient answer the client retries later, never a final refusal."""
        if not isinstance(topic, str) or not TOPIC_RE.fullmatch(topic):
            return "invalid_topic"
        if topic.startswith(RESERVED_PREFIX):
            return "forbidden"
        if self._allowed_by_rules(session, topic):
            return None
        if self.authorize is None:
            if not self.rules:
                self._say_signed_only(topic)
            return self._forbidden(session)
        answer = await self._ask(session, topic)
        if answer is None:
            return "unavailable"
        return None if answer else self._forbidden(session)

    def _say_signed_only(self, topic: str) -> None:
        """Say once per App why a plain topic was refused when there is nothing to allow one: a
        server started without --app answered every plain subscribe `forbidden`, which the client
        takes as final, and nothing anywhere said that only signed topics could be subscribed."""
        if self._told_signed_only:
            return
        self._told_signed_only = True
        log.warning("a subscribe to the plain topic %r was refused: this App has no rules and no authorize (a "
                    "server started without --app), so only signed topics can be subscribed. Serve with --app "
                    "MODULE:ATTR naming a livepush.App(rules=[livepush.Allow(...)]), or give the page "
                    "livepush.sign_topic(topic, ttl=...). Logged once per App.", topic)

    def _forbidden(self, session: Session | None) -> str:
        """`forbidden`, said once per App in the log when the session's subject can fill no
        {subject} slot: an email or a dotted user name as subject made every subscribe its rules
        were written for a final refusal, and nothing anywhere said why."""
        if not self._told_unfit and session is not None and self._slot_rules:
            why = _unfit(session.subject)
            if why is not None:
                self._told_unfit = True
                log.warning("a session whose subject holds %s was refused a topic: such a subject never fills "
                            "{subject} in %s, so those rules allow it nothing. Issue sessions with subjects "
                            "of A-Z a-z 0-9 _ - only (the user's id). Logged once per App.",
                            why, ", ".join(f"Allow({p!r})" for p in self._slot_rules[:3]))
        return "forbidden"

    async def _ask(self, session: Session | None, topic: str) -> bool | None:
        """authorize()'s answer (True: exactly True was returned), or None when it gave none."""
        assert self.authorize is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.authorize_timeout
        try:
            if self._authorize_is_async:
                result: Any = await self._bounded(self.authorize(session, topic), deadline)  # type: ignore[arg-type]
            else:
                if self._waiting >= AUTHORIZE_THREADS + AUTHORIZE_QUEUE:
                    self._log_once(OverflowError("every authorize() thread is busy"), topic)
                    return None
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(
                        max_workers=AUTHORIZE_THREADS, thread_name_prefix="livepush-authorize"
                    )
                with self._waiting_lock:
                    self._waiting += 1
                try:
                    future = self._executor.submit(self._call_sync, session, topic)
                except BaseException:
                    self._done_waiting(None)
                    raise
                # A call counts until it is done: a call that times out in a thread keeps its thread,
                # and counts, until it returns; one that times out (or whose connection closes)
                # while still queued is cancelled there and no thread ever runs it, so its end too
                # must give its place back, or each slow spell would shrink the queue for good.
                future.add_done_callback(self._done_waiting)
                result = await asyncio.wait_for(asyncio.wrap_future(future), self.authorize_timeout)
            if inspect.isawaitable(result):  # a sync callable that returned a coroutine
                result = await self._bounded(result, deadline)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the subscribe was cancelled (its connection closed): so is this check
            # The hook's own: it awaited something another task cancelled (say a lookup shared
            # between subscribes). That is no answer, not a cancelled subscribe.
            self._log_once(exc, topic)
            return None
        except Exception as exc:  # TimeoutError included
            self._log_once(exc, topic)
            return None
        if not isinstance(result, bool):
            self._not_an_answer(result, topic)
        return result is True

    def _not_an_answer(self, result: object, topic: str) -> None:
        """Say once per App that authorize() returned something other than True or False. Only
        True allows, and the client takes `forbidden` as final: a hook returning a row, 1, or
        nothing (a missing `return`) refused every such subscribe for good without a word."""
        if self._told_not_bool:
            return
        self._told_not_bool = True
        log.warning("authorize() returned %s, not True or False (topic %r): only True allows, so the subscribe "
                    "was refused as forbidden. Return a bool, e.g. bool(row). Logged once per App.",
                    "None (a missing return?)" if result is None else _a(type(result).__name__), topic)

    async def _bounded(self, answer: Awaitable[Any], deadline: float) -> Any:
        """An async hook's answer, or TimeoutError at `deadline` (the loop's clock). Not through
        wait_for(), which after cancelling the hook waits for it to stop: a hook slow to stop (a
        database driver cancelling its query on the server, a clean-up that awaits) held the
        subscribe, and the connection's next frames, past authorize_timeout."""
        task = asyncio.ensure_future(_contained(answer))
        try:
            done, _ = await asyncio.wait({task}, timeout=max(deadline - asyncio.get_running_loop().time(), 0.001))
        except asyncio.CancelledError:
            self._let_go(task)
            raise
        if not done:
            self._let_go(task)
            raise TimeoutError
        return task.result()

    def _let_go(self, task: asyncio.Future[Any]) -> None:
        """Cancel a hook's task without waiting for it to stop; it is kept (the loop holds tasks
        weakly) until it does, and its late error, which no one asked for, is read and dropped."""
        task.cancel()
        self._stopping.add(task)
        task.add_done_callback(self._stopped)

    def _stopped(self, task: asyncio.Future[Any]) -> None:
        self._stopping.discard(task)
        if not task.cancelled():
            task.exception()

    def _call_sync(self, session: Session | None, topic: str) -> Any:
        try:
            return self.authorize(session, topic)  # type: ignore[misc]
        except Exception:
            raise
        except BaseException as exc:
            # In a thread, sys.exit() or a stray KeyboardInterrupt ends only this call; passed on
            # as they are, they would leave the server's event loop.
            raise _Escaped(f"authorize() raised {type(exc).__name__}") from exc

    def _done_waiting(self, _future: concurrent.futures.Future[Any] | None) -> None:
        with self._waiting_lock:
            self._waiting -= 1

    def _log_once(self, exc: BaseException, topic: str) -> None:
        # Named and counted as what the hook raised: under its carrier, a sys.exit() read as a
        # RuntimeError, and the hook's own RuntimeErrors after it were never logged.
        kind = type(exc.__cause__) if isinstance(exc, _Escaped) and exc.__cause__ is not None else type(exc)
        if kind in self._logged:
            return
        self._logged.add(kind)
        if isinstance(exc, TimeoutError):
            log.error(
                "authorize() did not answer within %.3gs (topic %r); answering 'unavailable'. "
                "Make it faster or raise App(authorize_timeout=...). Logged once per App.",
                self.authorize_timeout,
                topic,
            )
        elif isinstance(exc, OverflowError):
            log.error("authorize() has %d calls waiting for its %d threads (topic %r); answering 'unavailable'. "
                      "Logged once per App.", AUTHORIZE_QUEUE, AUTHORIZE_THREADS, topic)
        else:
            log.error(
                "authorize() raised %s (topic %r); answering 'unavailable'. "
                "Logged once per App and exception type.",
                kind.__name__,
                topic,
                exc_info=exc,
            )

    def close(self) -> None:
        """Release the thread pool of a sync `authorize` (the server calls it at shutdown)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


def _a_path(spec: str, module_name: str, attr_path: str) -> ConfigError:
    """--app's module given as a file path, with the spec to write instead (as `livepush jobs` says it)."""
    return ConfigError(f"--app {spec!r}: {module_name!r} is a file path, not a module: name the module as Python "
                       f"imports it, e.g. --app {as_module(module_name) or 'myapp.push'}:{attr_path}")


def load_app(spec: str) -> App:
    """The App named by `spec` ("package.module:attr"), for `serve --app`.

    The current directory is importable, as with `python -m`. Raises ConfigError with
    a message naming what is wrong: the spec's shape, a missing module, an import that
    failed, a missing attribute, or an object that is not a livepush.App.
    """
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ConfigError(f"--app {spec!r}: expected MODULE:ATTR, e.g. --app myapp.push:app")
    module_name, attr_path = (part.strip() for part in spec.split(":"))
    if not module_name or not attr_path:
        raise ConfigError(f"--app {spec!r}: expected MODULE:ATTR, e.g. --app myapp.push:app")
    if is_a_path(module_name):
        raise _a_path(spec, module_name, attr_path)
    importable_from_cwd()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if names_the_module(exc, module_name):
            if module_name.endswith(".py"):  # only when not found: `pkg.py` may be a module named py
                raise _a_path(spec, module_name, attr_path) from None
            raise ConfigError(f"--app {spec!r}: {not_found(exc.name or module_name)}") from None
        raise ConfigError(f"--app {spec!r}: importing {module_name!r} failed ({where_raised(exc)}): "
                          f"{what_raised(exc)}") from exc
    except Exception as exc:
        raise ConfigError(f"--app {spec!r}: importing {module_name!r} failed ({where_raised(exc)}): "
                          f"{what_raised(exc)}") from exc
    except SystemExit as exc:
        # A script's code left at module level (sys.exit(), argparse reading serve's arguments):
        # it ended the server as it said, sys.exit(0) with status 0, as if it had stopped cleanly.
        raise ConfigError(f"--app {spec!r}: {module_name!r} exited at import ({where_raised(exc, top_level=True)}): "
                          f"sys.exit({exc.code!r}); the server imports it, so it must not exit: move that code "
                          "under `if __name__ == \"__main__\":`") from exc
    obj: Any = module
    for name in attr_path.split("."):
        if not hasattr(obj, name):
            raise ConfigError(
                f"--app {spec!r}: module {module_name!r} has no attribute {attr_path!r}: "
                f"define e.g. `{attr_path} = livepush.App(rules=[...])` there"
            )
        obj = getattr(obj, name)
    if not isinstance(obj, App):
        raise ConfigError(f"--app {spec!r} is a {type(obj).__name__}, not a livepush.App: set it to livepush.App(rules=[...])")
    return obj


__all__ = ["Allow", "App", "Authorize", "load_app"]
