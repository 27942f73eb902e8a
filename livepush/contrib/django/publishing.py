"""`publish()` for Django code: inside `transaction.atomic()` the message goes out when the
transaction commits (`transaction.on_commit`), and never when it rolls back.

livepush's own `publish()` is unchanged: it sends at once, or in the transaction of the psycopg
connection given as `conn=`, which this one passes through.

A send at commit that fails (the fan-out's service down) is logged as an error naming the topics,
and the app's own on-commit callbacks after it still run: the transaction has committed, so an
exception there would only turn a saved change into an error page.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from collections.abc import Iterable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from ... import api
from ...fanout.base import encode_batch, encode_payload
from ...errors import LivepushError
from ...types import JSON, Offset, Topic

log = logging.getLogger("livepush.contrib")


def _at_commit(send: Callable[[], object], topics: list[Topic], using: str) -> None:
    def sent() -> None:
        try:
            send()
        except LivepushError as exc:
            shown = ", ".join(topics[:5]) + (f" and {len(topics) - 5} more" if len(topics) > 5 else "")
            log.error("livepush: a message published in a committed transaction was not sent (topics: %s): %s",
                      shown, exc)

    # robust: anything else that goes wrong is logged by Django, and later callbacks still run.
    transaction.on_commit(sent, using=using, robust=True)


def publish(topic: Topic, data: JSON, *, conn: Any = None, using: str = DEFAULT_DB_ALIAS) -> Offset | None:
    """Publish `data` on `topic`. Inside `transaction.atomic(using=using)`: once it commits (None is
    returned: the offset is not known yet); outside one: at once, returning the offset. `conn=`
    (a psycopg connection, Postgres fan-out) publishes in that connection's transaction instead,
    as livepush.publish() does. The topic and data are checked now, in both cases."""
    # Named as the caller wrote it: livepush.publish() below then finds the warning said.
    api.warn_if_on_event_loop("livepush.contrib.django.publish()", "livepush.apublish()")
    if conn is not None or not connections[using].in_atomic_block:
        return api.publish(topic, data, conn=conn)
    # Checked now, where the caller can handle a mistake, and copied: what is sent at commit is the
    # data as it was at this call.
    api.publishable(topic)
    frozen = json.loads(encode_payload(data))
    _at_commit(functools.partial(api.publish, topic, frozen), [topic], using)
    return None


def publish_many(messages: Iterable[tuple[Topic, JSON]], *, conn: Any = None,
                 using: str = DEFAULT_DB_ALIAS) -> list[Offset] | None:
    """publish_many() as publish() above does it: inside `transaction.atomic(using=using)` the batch
    goes out once it commits (None is returned), outside one at once (its offsets). Every item is
    checked now, and the data sent at commit is the data as it was at this call."""
    api.warn_if_on_event_loop("livepush.contrib.django.publish_many()", "livepush.apublish_many()")
    if conn is not None or not connections[using].in_atomic_block:
        return api.publish_many(messages, conn=conn)
    checked = api.publishable_many(messages)
    frozen = [(topic, json.loads(text)) for topic, text in encode_batch(checked)]
    _at_commit(functools.partial(api.publish_many, frozen), sorted({topic for topic, _ in frozen}), using)
    return None
