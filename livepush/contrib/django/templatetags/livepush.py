"""`{% load livepush %}`: signed topics and latest offsets for the page (livepush.contrib.django.pages).

    <ul id="notices" {% livepush_subscription "notices:lobby" %}>...</ul>
    {% livepush_subscription sub %}                 a Subscription the view made before reading its data
    {% livepush_subscription "notices:lobby" as sub %}{{ sub.signed }} {{ sub.since }}
    {% livepush_signed_topic "chat:7" ttl=3600 %}   {% livepush_latest_offset "chat:7" %}
    {% livepush_job_topic result %}                 the signed job:<id> topic of a TaskResult
"""

from __future__ import annotations

import sys
from typing import Any

from django import template
from django.template import Context

from .... import api, blocking, topics
from ....errors import ArgumentValueError, InvalidTopic
from ....jobs.api.handles import signed_for_page
from ....types import Seconds
from ..pages import Subscription, made_subscription, page_since, signed_job_topic

register = template.Library()


def _given(value: Any, tag: str, what: str = "topic") -> Any:
    """`value`, unless it is the '' Django renders for a variable the context lacks: then an error
    naming the tag and that likely cause, where the checks further in said `invalid topic ''` or
    `no task result ''` of a value the template never wrote."""
    if isinstance(value, str) and not value:
        why = (f"{{% {tag} %}} got an empty {what}: a variable missing from the template's context "
               "renders as ''; check its name, or put it in the view's context")
        raise InvalidTopic(why) if what == "topic" else ArgumentValueError(why)
    return value


def _warn_if_on_event_loop(context: Context, tag: str, topic: str) -> None:
    """Once a process, when `tag` reads `topic`'s latest offset (a round trip; a state topic, or
    the local fan-out, reads nothing remote) in a template rendered on a running event loop
    (render() in an async view), whose loop waits for it, as for subscription() there. The
    warning names the template, since the tag's caller is the template engine, and what to do
    instead, since a template cannot await."""
    call = f"{{% {tag} %}}"
    if not blocking.due(call) or topics.state_topic_id(topics.validate_topic(topic)) is not None:
        return
    if api.default_fanout().name == "local":  # publishes into this process: no round trip to wait for
        return
    # The tag's node knows the template it is written in (one included or extended, the one whose
    # block it fills); the template render() renders is only the page that holds it.
    node = sys._getframe(2).f_locals.get("self")  # 0: this, 1: the tag, 2: its node's render()
    origin = (node.origin if isinstance(node, template.Node) and getattr(node, "origin", None) is not None
              else getattr(getattr(context, "template", None), "origin", None))
    where = f"template {origin.template_name or origin.name}" if origin is not None else "a template"
    # 0: say, 1: this, 2: the tag, 3: the template engine (not livepush's own code, so it is said).
    blocking.say(call, "", 3, where=where,
                 advice="make the Subscription in the view, `await sync_to_async(livepush.contrib.django."
                        "subscription)(topic)`, and pass it to the tag (`{% livepush_subscription sub %}`), or "
                        "return a TemplateResponse, which Django renders in a thread")


@register.simple_tag(takes_context=True)
def livepush_subscription(context: Context, topic: str | Subscription, ttl: Seconds | None = None) -> Subscription:
    """Renders as `data-livepush-topic="..." data-livepush-since="..."`; `as var` keeps the object.
    A topic given as text has its offset read now, after the view read its data: make the
    Subscription in the view (pages.subscription) when missing a message in between matters."""
    if isinstance(topic, Subscription):
        return topic
    _warn_if_on_event_loop(context, "livepush_subscription", _given(topic, "livepush_subscription"))
    return made_subscription(topic, ttl, call="{% livepush_subscription %}")


@register.simple_tag
def livepush_signed_topic(topic: str, ttl: Seconds | None = None) -> str:
    """`topic` signed for the page (valid `ttl` seconds, default LIVEPUSH_SIGNED_TOPIC_TTL)."""
    return signed_for_page(_given(topic, "livepush_signed_topic"), ttl, call="{% livepush_signed_topic %}")


@register.simple_tag(takes_context=True)
def livepush_latest_offset(context: Context, topic: str) -> str:
    """The offset of the newest message on `topic` (the topic's origin when none was published yet),
    for the client's `since`; "" for a state topic, whose page gets the current state."""
    _warn_if_on_event_loop(context, "livepush_latest_offset", _given(topic, "livepush_latest_offset"))
    return page_since(topic) or ""


@register.simple_tag
def livepush_job_topic(result: Any, ttl: Seconds | None = None) -> str:
    """The signed `job:<id>` topic of a task result (or result id) of LivePushBackend."""
    return signed_job_topic(_given(result, "livepush_job_topic", "task result"), ttl, call="{% livepush_job_topic %}")
