"""What a page embeds to follow a topic live: the topic signed (its own permission to subscribe)
and its latest offset, read *before* the page reads what it renders, so that the client, subscribing
with that offset as `since`, gets everything published after it and misses nothing in between
(docs/reference.md#4-python-api)."""

from __future__ import annotations

import dataclasses

from django.utils.html import format_html
from django.utils.safestring import SafeString

from ... import api, topics
from ...jobs import JobHandle
from ...jobs.api.handles import signed_for_page
from ...types import Seconds


@dataclasses.dataclass(frozen=True)
class Subscription:
    """A topic as a page subscribes to it: `signed` (the topic signed) and `since` (its latest offset)."""

    topic: str
    signed: str
    since: str | None

    def attrs(self) -> SafeString:
        """`data-livepush-topic="..." data-livepush-since="..."`, escaped, for an element's tag."""
        return format_html('data-livepush-topic="{}" data-livepush-since="{}"', self.signed, self.since or "")

    def __html__(self) -> str:  # how templates render it: the attributes, already escaped
        html: str = self.attrs()  # a SafeString, a str
        return html

    def __str__(self) -> str:
        html: str = self.attrs()
        return html


def subscription(topic: str, ttl: Seconds | None = None) -> Subscription:
    """`topic`'s latest offset, then the topic signed for `ttl` seconds or a timedelta (default
    LIVEPUSH_SIGNED_TOPIC_TTL). Call it in the view before reading the data the page shows."""
    if topics.state_topic_id(topics.validate_topic(topic)) is None:  # a state topic reads nothing
        # Named here, as the caller wrote it: the latest_offset() below is livepush's own call,
        # which warns of nothing, and Django has no async twin of this one to name.
        api.warn_if_on_event_loop("livepush.contrib.django.subscription()", "sync_to_async(subscription)(topic)")
    return made_subscription(topic, ttl, call="subscription()")


def made_subscription(topic: str, ttl: Seconds | None, *, call: str) -> Subscription:
    """subscription() for `call`, the name a bad `ttl` is refused under: the template tags' own,
    since a template calls no subscription() its author could look for."""
    since = page_since(topic)
    return Subscription(topic, signed_for_page(topic, ttl, call=call), since)


def page_since(topic: str) -> str | None:
    """The offset a page subscribes to `topic` from: its latest offset, or None for a state topic
    (job:<id>, group:<id>, workflow:<id>), whose offset is its row's version: the page gets the
    current state. A message offset there would make the client drop every version below it."""
    if topics.state_topic_id(topics.validate_topic(topic)) is not None:
        return None
    return api.latest_offset(topic)


def job_topic(result: object, ttl: Seconds | None = None) -> str:
    """The signed `job:<id>` topic of a TaskResult enqueued through LivePushBackend (or of its id)."""
    return signed_job_topic(result, ttl, call="job_topic()")


def signed_job_topic(result: object, ttl: Seconds | None, *, call: str) -> str:
    """job_topic() for `call`, the name a bad `ttl` is refused under, not the JobHandle.sign() the
    caller never wrote."""
    # Imported here: results needs the Tasks framework, which the rest of this module (and the
    # template tags that import it) does without, on a site that has none.
    from .errors import TaskNotSupported
    from .results import job_id_of
    from .tasks_api import TaskResult, task_backends

    if isinstance(result, TaskResult):
        backend = task_backends[result.backend]
        # As task_group() tells it: the backend module imports this one, so no isinstance().
        if not callable(getattr(backend, "transaction_conn", None)):
            # Its id is another backend's (a random string): "no task result" of a result in hand
            # sent the user looking for a missing row, not at the backend a test swapped in.
            raise TaskNotSupported(
                f"{call} follows a livepush job, and this result's backend, TASKS[{result.backend!r}], is "
                f"{type(backend).__module__}.{type(backend).__qualname__}, which runs no livepush job: enqueue "
                "through livepush.contrib.django.LivePushBackend (in tests too: ENQUEUE_ON_COMMIT False and "
                "livepush.jobs.drain())")
    job_id = job_id_of(getattr(result, "id", result))
    return signed_for_page(JobHandle(job_id).topic, ttl, call=call)
