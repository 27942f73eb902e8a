"""The module-level Python API (docs/reference.md#4-python-api): publish from any process, sign
topics. Its fan-out is this process's default, made from the settings on first use; a process
that serves in-process (the local fan-out) has the wiring install the server's own."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from typing import Any

from . import blocking, topics
from .config import get_settings
from .errors import InvalidTopic
from .fanout import FanOut, from_env
from .fanout.base import batch_pairs
from .types import JSON, Offset, Seconds, Topic

log = logging.getLogger("livepush")

_lock = threading.Lock()
_default: FanOut | None = None
# Whether this process still has to be told that its local fan-out reaches no server: said once,
# by default_fanout() or by an integration that says it in its own words at its start.
_local_warning_due = True


def _after_fork() -> None:
    """In a forked child: a thread of the parent may have held the lock at the fork, and no
    thread of the child would ever release it. (The fan-out sets its own connections aside.)"""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def default_fanout() -> FanOut:
    """The process-wide publishing fan-out, created on first use. It never listens."""
    global _default
    with _lock:
        if _default is None:
            settings = get_settings()
            _default = from_env(settings)
            if settings.fanout == "local":
                # A web or job process left without the servers' URL publishes into itself, and
                # every publish() returns an offset: without a word, its messages just vanish.
                _warn_local_fanout()
        return _default


def _warn_local_fanout() -> None:
    global _local_warning_due
    if _local_warning_due:
        _local_warning_due = False
        log.warning("livepush: this process publishes on the local fan-out (LIVEPUSH_FANOUT=local, or neither "
                    "LIVEPUSH_DATABASE_URL nor LIVEPUSH_FANOUT set), so what it publishes reaches no "
                    "`livepush serve`, which is another process: give it the servers' LIVEPUSH_DATABASE_URL "
                    "(or LIVEPUSH_FANOUT=redis and LIVEPUSH_REDIS_URL)")


def local_fanout_explained() -> None:
    """An integration told the user, in its own words, that the local fan-out reaches no server:
    default_fanout() need not say it again."""
    global _local_warning_due
    _local_warning_due = False


def local_default() -> FanOut | None:
    """The local fan-out publish() already made in this process, if any: a server on the local
    fan-out serves that one, whose history holds what the process published before it was made."""
    with _lock:
        return _default if _default is not None and _default.name == "local" else None


def set_default_fanout(fanout: FanOut | None) -> None:
    """Install the fan-out publish() uses (the wiring, for a server in the same process)."""
    global _default
    with _lock:
        old, _default = _default, fanout
    if old is not None and old is not fanout:
        old.close()


async def release_loop() -> None:
    """Close what the publishing fan-out opened on the running loop, before that loop ends."""
    fanout = _default
    if fanout is not None:
        await fanout.release_loop()


def _message_topic(topic: Topic, why: str) -> Topic:
    """`topic`, checked: a valid topic, and not a state topic (InvalidTopic saying `why`)."""
    topics.validate_topic(topic)
    if topics.state_topic_id(topic) is not None:
        raise InvalidTopic(f"{topic!r} is a state topic: {why}")
    return topic


def publishable(topic: Topic) -> Topic:
    """`topic`, checked as publish() checks it: a valid topic, neither a state topic nor a runtime's."""
    _message_topic(topic, "what it shows is its job's, group's or workflow's state, which changes with "
                          "the row; publish on a topic of your own")
    if topics.livepush_owned(topic) is not None:
        # Operators' pages read a runtime's state there: a message of the app's would pass for it.
        raise InvalidTopic(f"{topic!r} is livepush's own: job runtimes publish their state on runtime:<id> and "
                           "runtimes; publish on a topic of your own")
    return topic


def warn_if_on_event_loop(call: str, instead: str) -> None:
    """Warn, once a process, when the sync publishing `call` runs on a running event loop
    (blocking.py), except on the local fan-out: it publishes into this process, with no round trip
    for the loop to wait for."""
    if blocking.due(call) and default_fanout().name != "local":
        blocking.say(call, instead, 3)  # 0: say, 1: this, 2: `call`, 3: its caller


def publish(topic: Topic, data: JSON, *, conn: Any = None) -> Offset:
    """Publish `data` on `topic`; returns its offset. With `conn=` (a psycopg connection, Postgres
    fan-out only) it is delivered if and only if conn's transaction commits."""
    warn_if_on_event_loop("livepush.publish()", "livepush.apublish()")
    return default_fanout().publish(publishable(topic), data, conn=conn)


async def apublish(topic: Topic, data: JSON, *, conn: Any = None) -> Offset:
    """Async publish(); `conn=` takes a psycopg AsyncConnection."""
    return await default_fanout().apublish(publishable(topic), data, conn=conn)


def publish_many(messages: Iterable[tuple[Topic, JSON]], *, conn: Any = None) -> list[Offset]:
    """Publish a batch of (topic, data) pairs in one go; their offsets, in batch order. A topic's
    messages of one batch are delivered in batch order. Every item is checked before anything
    is published. Postgres: one transaction (conn's, with `conn=`) of one statement per 1,000
    messages or about 8 MiB; Redis: a script call per 1,000 messages or 4 MiB."""
    warn_if_on_event_loop("livepush.publish_many()", "livepush.apublish_many()")
    return default_fanout().publish_many(publishable_many(messages), conn=conn)


async def apublish_many(messages: Iterable[tuple[Topic, JSON]], *, conn: Any = None) -> list[Offset]:
    """Async publish_many(); `conn=` takes a psycopg AsyncConnection."""
    return await default_fanout().apublish_many(publishable_many(messages), conn=conn)


def publishable_many(messages: Iterable[tuple[Topic, JSON]]) -> list[tuple[Topic, JSON]]:
    """The pairs of a publish_many, each topic checked as publish() checks one; errors name the item."""
    items = batch_pairs(messages)
    for i, (topic, _) in enumerate(items):
        try:
            publishable(topic)
        except InvalidTopic as exc:
            raise InvalidTopic(f"publish_many() item {i}: {exc}", exc.reason) from None
    return items


# A message offset there would make the client drop every version below it.
_NO_OFFSET = ("its offset is its row's version, not a message's; a page subscribes to it without since and "
              "gets its current state")


def latest_offset(topic: Topic) -> Offset:
    """The offset of the newest message on `topic`, to embed beside what a page rendered; the
    client subscribes with it as `since` and misses nothing published in between. Read it before
    the page's data: read after, it may count a message the data lacks, which is never sent."""
    warn_if_on_event_loop("livepush.latest_offset()", "livepush.alatest_offset()")
    return default_fanout().latest_offset(_message_topic(topic, _NO_OFFSET))


async def alatest_offset(topic: Topic) -> Offset:
    """latest_offset() for async code."""
    return await default_fanout().alatest_offset(_message_topic(topic, _NO_OFFSET))


def sign_topic(topic: Topic, ttl: Seconds | None = None) -> str:
    """A signed topic, safe to embed in a page: it is its own permission to subscribe, for `ttl`
    seconds (or a timedelta; None: it never expires)."""
    settings = get_settings()
    settings.require_secret()
    # The server refuses a state topic whose id is not canonical (job:0001): say so now, not
    # with a signature no subscribe can use.
    topics.validate_topic(topic)
    topics.check_state_topic(topic)
    return topics.sign(topic, settings.secrets, ttl)


def verify_topic(signed: str) -> Topic:
    """The plain topic inside `signed`, or raises InvalidTopic; ConfigError when this process has
    no secret to verify with."""
    secrets = get_settings().secrets
    if not secrets:
        # As sign_topic() says: an InvalidTopic here read as "forged" for every topic, and code
        # that answers a bad topic with 403 hid the missing setting behind it.
        get_settings().require_secret()
    return topics.verify(signed, secrets)
