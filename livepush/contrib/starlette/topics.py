"""Signed topics for a page to render: the topic signed (its own permission to subscribe) and the
offset the page subscribes from, so that nothing published after the page's data was read is
missed (docs/reference.md#4-python-api, the JS client's `since`).

Signing is granting: call these only where the request may see the topic (behind your own
checks), as you would render the data itself."""

from __future__ import annotations

import inspect
import string
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.requests import Request

from ... import api, topics
from ...jobs.api.handles import signed_for_page
from ...errors import ArgumentTypeError, ArgumentValueError, InvalidTopic
from ...types import Seconds
from ...sessions.rules import SEPARATORS
from ...usercode import cannot_take


@dataclass(frozen=True)
class PageTopic:
    """What a page needs to follow a topic: `signed` to subscribe with, and `since`, the offset
    to subscribe from (None for a state topic such as job:<id>: the page gets its current state)."""

    topic: str
    signed: str
    since: str | None

    def as_dict(self) -> dict[str, str | None]:
        """For a JSON answer or a template: {"topic": signed, "since": since}."""
        return {"topic": self.signed, "since": self.since}


async def page_topic(topic: str, /, *, ttl: Seconds | None = None) -> PageTopic:
    """`topic` signed for `ttl` seconds or a timedelta (LIVEPUSH_SIGNED_TOPIC_TTL unless given) and its latest
    offset. Call it before reading what the page shows: a message published in between then
    reaches the page twice (render idempotently) rather than never."""
    # `topic` is positional-only so that `Depends(page_topic)`, written by mistake, fails every
    # request (FastAPI passes a dependency's arguments by keyword) rather than signing whatever
    # topic the query string names.
    # A state topic's offset is its version: without one the page gets the current state.
    state = topics.state_topic_id(topics.validate_topic(topic)) is not None
    since = None if state else await api.alatest_offset(topic)
    signed = signed_for_page(topic, ttl, call="page_topic()")
    return PageTopic(topic, signed, since)


TopicOf = Callable[[Request], str | Awaitable[str]]  # names a route's topic, sync or async


def _slots(template: str) -> tuple[str, ...]:
    """The path parameters `template` names; ValueError when no request could fill it: malformed,
    a slot that is not a plain name (positional, `.attr`, `[i]`, a conversion or format spec),
    two slots with no separator between them, or text no topic has. Checked where the route is written, not at each request."""
    def refused(why: str) -> ArgumentValueError:
        return ArgumentValueError(f"SignedTopic({template!r}) {why}: write a topic with plain path parameter "
                                  "names in braces, such as 'chat:{room}'")

    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise refused(f"is not a template ({exc})") from None
    slots = tuple(dict.fromkeys(name for _, name, _, _ in parts if name is not None))
    for _, name, spec, conversion in parts:
        if name is not None and (not name.isidentifier() or spec or conversion):
            written = name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            raise refused(f"has the slot {{{written}}}")
    # A slot's value never holds a separator, so one between two slots pins where the first ends;
    # without one, room:{org}-{repo} fills room:a-b-c for org a-b and for org a alike, and whoever
    # may see one pair would get the other's topic signed.
    previous = None
    for literal, name, _, _ in parts:
        if name is None:
            break  # the text after the last slot
        if previous is not None and name != previous and SEPARATORS.isdisjoint(literal):
            raise ArgumentValueError(
                f"SignedTopic({template!r}) has {{{previous}}} and {{{name}}} with no separator "
                f"({', '.join(sorted(SEPARATORS))}) between them, so two pairs of values could fill one topic: "
                f"put one there, e.g. {{{previous}}}:{{{name}}}")
        previous = name
    try:
        topics.validate_topic(template.format_map(dict.fromkeys(slots, "1")))
    except InvalidTopic as exc:
        raise refused(f"cannot make a topic ({exc})") from None
    return slots


def _a(value: object) -> str:
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _check_takes_a_request(fn: Callable[..., object]) -> None:
    """An ArgumentTypeError unless `fn(request)` can be called: it is called at each request of
    the route, where its TypeError was a 500 for every visitor, found only in the server's log."""
    why = cannot_take(fn, None)
    if why is not None:
        name = getattr(fn, "__qualname__", type(fn).__qualname__)
        raise ArgumentTypeError(f"SignedTopic({name}) is called with the request alone, but it cannot take it "
                                f"({why}): e.g. def topic(request): return f\"chat:{{request.path_params['room']}}\"")


class SignedTopic:
    """A dependency that gives a route its PageTopic: `Depends(SignedTopic("chat:{room}"))` fills
    the template from the path parameters, or `SignedTopic(fn)` asks `fn(request)` (sync or
    async). A path parameter that fills a slot with a topic separator (`:`, `/`, `.`), or a name
    that is not a topic, gets 404: a slot never reaches into another namespace (`chat:{room}`
    never signs `chat:admin:x`). Two slots need a separator between them (`room:{org}:{repo}`,
    not `room:{org}-{repo}`, where orgs `a-b` and `a` could both fill `room:a-b-c`)."""

    def __init__(self, topic: str | TopicOf, *, ttl: Seconds | None = None) -> None:
        if not isinstance(topic, str) and not callable(topic):
            raise ArgumentTypeError(f"SignedTopic() takes a template such as 'chat:{{room}}' or a function of the "
                                    f"request, got {type(topic).__name__}")
        if not isinstance(topic, str):
            _check_takes_a_request(topic)
        if ttl is not None:  # checked here, where the route is written, not at each of its requests
            ttl = topics.check_ttl(ttl, none_means=topics.PAGE_TTL_DEFAULT, call="SignedTopic()")
        self.slots = _slots(topic) if isinstance(topic, str) else ()  # the path parameters it fills
        self.topic = topic
        self.ttl: float | None = ttl

    async def _name(self, request: Request) -> str:
        if callable(self.topic):
            name = self.topic(request)
            name = await name if inspect.isawaitable(name) else name
            if not isinstance(name, str):
                # The app's mistake (an int path parameter, a forgotten return): a 404 would read
                # as a topic that does not exist, and send the developer looking at the URL.
                fn = getattr(self.topic, "__qualname__", type(self.topic).__qualname__)
                raise ArgumentTypeError(f"SignedTopic({fn}) returned {'None' if name is None else _a(name)}: the "
                                        "function must return the topic as a str, such as f'chat:{room}' (raise "
                                        "HTTPException to refuse a request)")
            return name
        values = {k: str(v) for k, v in request.path_params.items()}
        missing = [slot for slot in self.slots if slot not in values]
        if missing:  # the route's mistake, not the request's: a 404 would read as a missing topic
            raise ArgumentValueError(f"SignedTopic({self.topic!r}) fills {missing[0]!r} from the route's path "
                                     f"parameters, and this route has {sorted(values) or 'none'}: name the slot "
                                     "as the route's path names it")
        # Only what fills a slot: another parameter of the route (a file name with a dot) is not the topic's.
        if any(not SEPARATORS.isdisjoint(values[slot]) for slot in self.slots):
            raise HTTPException(404, "no such topic")
        return self.topic.format_map(values)

    async def __call__(self, request: Request) -> PageTopic:
        name = await self._name(request)
        try:
            return await page_topic(name, ttl=self.ttl)
        except InvalidTopic:
            raise HTTPException(404, "no such topic") from None
