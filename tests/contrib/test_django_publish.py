"""livepush.contrib.django.publish (docs/frameworks.md, Django): inside transaction.atomic() a
message goes out when the transaction commits and never when it rolls back; outside one, or with
conn=, it behaves as livepush.publish()."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from django.db import connection, transaction
from django.test import Client, override_settings

import livepush
import livepush.fanout
from livepush.config import get_settings
from livepush.contrib.django import publish, publish_many

pytestmark = pytest.mark.usefixtures("django_site")

TOPIC = "notices:django"


def published_since(offset: str) -> list[object]:
    """The data of the messages on TOPIC after `offset`, read from its history as a server would."""
    async def read() -> list[object]:
        fanout = livepush.fanout.from_env(get_settings())
        try:
            page = await fanout.history(TOPIC, offset)
            return [json.loads(m.data_json) for m in page.messages if m.data_json] if page else []
        finally:
            await fanout.aclose()

    return asyncio.run(read())


def test_outside_a_transaction_it_publishes_at_once() -> None:
    """Outside transaction.atomic() publish() sends at once and returns the offset."""
    before = livepush.latest_offset(TOPIC)
    offset = publish(TOPIC, {"n": 1})
    assert offset is not None and offset != before
    assert livepush.latest_offset(TOPIC) == offset


def test_inside_a_transaction_it_publishes_on_commit() -> None:
    """Inside transaction.atomic() nothing is sent until the commit, then the message is."""
    before = livepush.latest_offset(TOPIC)
    with transaction.atomic():
        assert publish(TOPIC, {"n": 2}) is None
        assert livepush.latest_offset(TOPIC) == before
    assert livepush.latest_offset(TOPIC) != before


def test_inside_a_transaction_that_rolls_back_nothing_is_delivered() -> None:
    """A message published in a transaction that rolls back is never sent."""
    before = livepush.latest_offset(TOPIC)
    with pytest.raises(RuntimeError), transaction.atomic():
        publish(TOPIC, {"n": 3})
        raise RuntimeError("roll back")
    assert livepush.latest_offset(TOPIC) == before


def test_a_savepoint_rolled_back_drops_its_messages_only() -> None:
    """A nested atomic() that rolls back drops its own messages; the outer one's go out at commit."""
    before = livepush.latest_offset(TOPIC)
    with transaction.atomic():
        publish(TOPIC, {"outer": True})
        with pytest.raises(RuntimeError), transaction.atomic():
            publish(TOPIC, {"inner": True})
            raise RuntimeError("roll back the savepoint")
    assert published_since(before) == [{"outer": True}]


def test_the_data_sent_is_the_data_at_the_call() -> None:
    """What is sent at commit is the data as it was when publish() was called."""
    before = livepush.latest_offset(TOPIC)
    data = {"v": "at the call"}
    with transaction.atomic():
        publish(TOPIC, data)
        data["v"] = "changed later"
    assert published_since(before) == [{"v": "at the call"}]


def test_mistakes_raise_at_the_call_not_at_commit() -> None:
    """A bad topic or data raises at publish(), inside the transaction, not when it commits."""
    with transaction.atomic():
        with pytest.raises(livepush.InvalidTopic):
            publish("bad topic!", {})
        with pytest.raises(TypeError):
            publish(TOPIC, {"x": object()})


def test_a_state_topic_is_refused_at_the_call_inside_a_transaction() -> None:
    """publish() on a state topic raises InvalidTopic at the call inside atomic(), as outside it, never at commit."""
    before = livepush.latest_offset(TOPIC)
    with transaction.atomic():
        with pytest.raises(livepush.InvalidTopic, match="state topic"):
            publish("job:1", {})
        with pytest.raises(livepush.InvalidTopic, match="item 1"):
            publish_many([(TOPIC, {"n": 0}), ("group:2", {})])
    assert livepush.latest_offset(TOPIC) == before


def test_publish_many_inside_a_transaction_goes_out_whole_on_commit_with_the_data_at_the_call() -> None:
    """publish_many() inside atomic() sends the whole batch at commit (None returned), the data as it
    was at the call; outside one it sends at once and returns the offsets; a rollback sends nothing."""
    before = livepush.latest_offset(TOPIC)
    data = {"v": "at the call"}
    with transaction.atomic():
        assert publish_many([(TOPIC, data), (TOPIC, {"n": 2})]) is None
        data["v"] = "changed later"
        assert livepush.latest_offset(TOPIC) == before
    assert published_since(before) == [{"v": "at the call"}, {"n": 2}]
    middle = livepush.latest_offset(TOPIC)
    with pytest.raises(RuntimeError), transaction.atomic():
        publish_many([(TOPIC, {"n": 3})])
        raise RuntimeError("roll back")
    assert livepush.latest_offset(TOPIC) == middle
    offsets = publish_many([(TOPIC, {"n": 4})])
    assert offsets == [livepush.latest_offset(TOPIC)]


def test_conn_publishes_in_that_connections_transaction() -> None:
    """conn= (a psycopg connection, here Django's own) publishes in its transaction, as the core does."""
    before = livepush.latest_offset(TOPIC)
    with pytest.raises(RuntimeError), transaction.atomic():
        assert publish(TOPIC, {"n": 4}, conn=connection.connection) is not None
        raise RuntimeError("roll back")
    assert livepush.latest_offset(TOPIC) == before


@pytest.mark.parametrize("many", [False, True], ids=["publish", "publish_many"])
def test_a_send_at_commit_that_fails_is_logged_and_the_apps_own_callbacks_still_run(
        many: bool, caplog: pytest.LogCaptureFixture) -> None:
    """The fan-out's service is down when the transaction commits: the commit stands, the block
    exits without an exception, the app's on-commit callbacks after it run, and an error names
    the topic whose message was not sent."""
    from livepush import api
    from livepush.fanout.postgres import PostgresFanOut
    from tests.support.procs import free_port

    api.set_default_fanout(PostgresFanOut(f"postgresql://nobody@127.0.0.1:{free_port()}/none?connect_timeout=2"))
    ran: list[str] = []
    with caplog.at_level("ERROR", logger="livepush.contrib"), transaction.atomic():
        if many:
            publish_many([(TOPIC, {"n": 1}), ("notices:other", {"n": 2})])
        else:
            publish(TOPIC, {"n": 1})
        transaction.on_commit(lambda: ran.append("the app's own"))
    assert ran == ["the app's own"]
    lost = [r.getMessage() for r in caplog.records if r.name == "livepush.contrib"]
    assert len(lost) == 1 and TOPIC in lost[0] and "not sent" in lost[0], lost


def test_inside_a_django_testcase_it_is_sent_only_when_the_on_commit_callbacks_run() -> None:
    """Django's TestCase runs each test inside an atomic() that never commits, so publish() there
    sends nothing, unless TestCase.captureOnCommitCallbacks(execute=True) runs the callbacks
    registered in its block."""
    from django.test import TestCase

    before = livepush.latest_offset(TOPIC)
    with transaction.atomic():  # what TestCase wraps each test in
        publish(TOPIC, {"n": 1})
        with TestCase.captureOnCommitCallbacks(execute=True):
            publish(TOPIC, {"n": 2})
        assert published_since(before) == [{"n": 2}]
        transaction.set_rollback(True)  # as TestCase ends a test
    assert published_since(before) == [{"n": 2}]


@pytest.fixture
def atomic_requests() -> Iterator[Client]:
    """A client of a site with ATOMIC_REQUESTS: each view runs in one transaction."""
    settings_dict = connection.settings_dict
    before = settings_dict["ATOMIC_REQUESTS"]
    settings_dict["ATOMIC_REQUESTS"] = True  # read at each request (BaseHandler.make_view_atomic)
    try:
        with override_settings(ROOT_URLCONF="tests.contrib.django_atomic_urls"):
            yield Client(raise_request_exception=False)
    finally:
        settings_dict["ATOMIC_REQUESTS"] = before


def test_a_request_that_fails_under_atomic_requests_enqueues_and_publishes_nothing(atomic_requests: Client) -> None:
    """With ATOMIC_REQUESTS a view that raises after enqueueing and publishing rolls back: no job
    exists and no message is sent; the same view that succeeds commits both."""
    from livepush import jobs
    from tests.contrib.django_atomic_urls import TOPIC as REQUESTS

    before = livepush.latest_offset(REQUESTS)
    assert atomic_requests.get("/orders/", {"fail": "1"}).status_code == 500
    assert jobs.drain() == {} and livepush.latest_offset(REQUESTS) == before
    answer = atomic_requests.get("/orders/")
    assert answer.status_code == 200
    assert livepush.latest_offset(REQUESTS) != before
    assert jobs.drain() == {"succeeded": 1}


def loop_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "livepush" and "event loop" in r.getMessage()]


def warned_by_async_views(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, right: tuple[str, ...],
                          wrong: str, params: dict[str, str] | None = None) -> list[str]:
    """The event-loop warnings of tests.contrib.django_async_urls' views, as an ASGI site calls
    them: the `right` ones (a call through a thread, a sync view) say nothing, then `wrong` (the
    sync call on the request's loop) is requested twice."""
    from django.test import AsyncClient

    from livepush import blocking

    monkeypatch.setattr(blocking, "_said", set())  # this process may have warned already

    async def requests() -> None:
        client = AsyncClient()
        for path in right:
            assert (await client.get(path)).status_code == 200
        assert loop_warnings(caplog) == []
        for _ in range(2):
            assert (await client.get(wrong, params or {})).status_code == 200

    with override_settings(ROOT_URLCONF="tests.contrib.django_async_urls"), \
            caplog.at_level("WARNING", logger="livepush"):
        asyncio.run(requests())
    return loop_warnings(caplog)


@pytest.mark.parametrize("many", [False, True], ids=["publish", "publish_many"])
def test_a_sync_publish_in_an_async_view_warns_once_naming_the_call_and_apublish(
        many: bool, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """publish() in an async view works, but the request's event loop waits for its round trip and
    serves no other request meanwhile: one WARNING per process names the call, where it was made,
    and `await livepush.apublish()`, as Django refuses its sync ORM there. The same call through
    sync_to_async, or in a sync view (a thread under ASGI), is right and says nothing."""
    call, instead = ("publish_many()", "apublish_many()") if many else ("publish()", "apublish()")
    said = warned_by_async_views(caplog, monkeypatch, ("/thread/", "/sync/"), "/loop/", {"many": "1"} if many else {})
    assert len(said) == 1, said
    assert f"livepush.contrib.django.{call}" in said[0] and f"await livepush.{instead}" in said[0], said
    assert "django_async_urls.py" in said[0], said


def test_a_subscription_made_in_an_async_view_warns_once_naming_the_call_and_a_thread(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """subscription() reads the topic's latest offset, a round trip: in an async view the request's
    loop waits for it, as for publish(). One WARNING per process names subscription(), where it
    was called, and sync_to_async to call it through; a thread, or a sync view, says nothing. The
    latest_offset() it calls is livepush's own call, so nothing was said."""
    said = warned_by_async_views(caplog, monkeypatch, ("/page/thread/", "/page/sync/"), "/page/loop/")
    assert len(said) == 1, said
    assert "livepush.contrib.django.subscription()" in said[0] and "sync_to_async(subscription)" in said[0], said
    assert "django_async_urls.py" in said[0], said


def test_template_tags_reading_an_offset_on_the_loop_warn_once_each_naming_the_template_and_the_way_out(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """{% livepush_subscription "topic" %} and {% livepush_latest_offset %} read the topic's latest
    offset, a round trip: in a template rendered on the request's loop (render() in an async view)
    the loop waits for it. One WARNING per process for each tag names it and the template (the
    tag's caller is the template engine), and says to make the Subscription in the view through
    sync_to_async or return a TemplateResponse; a TemplateResponse, rendered in a thread, and a
    sync view say nothing."""
    said = warned_by_async_views(caplog, monkeypatch, ("/tags/response/", "/tags/sync/"), "/tags/loop/")
    assert len(said) == 2, said
    for tag, line in zip(("{% livepush_subscription %}", "{% livepush_latest_offset %}"), said):
        assert line.startswith(f"livepush: {tag} was called on a running event loop, at template notices.html "), line
        assert "`await sync_to_async(livepush.contrib.django.subscription)(topic)`" in line, line
        assert "TemplateResponse" in line, line


@pytest.mark.parametrize("page,where", [
    ("page.html", "notices.html"), ("extending.html", "notices_base.html"), ("child.html", "child.html"),
], ids=["included", "extended", "in-a-block-of-an-extending-template"])
def test_the_template_tags_warning_names_the_template_the_tag_is_written_in(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, page: str, where: str) -> None:
    """The warning of a tag rendered on the loop names the template file the tag is in, where its
    author finds it: the one a page includes or extends, or the extending one whose block has
    it: not the page that render() was called on, nor the template that page extends."""
    said = warned_by_async_views(caplog, monkeypatch, (), f"/tags/file/{page}")
    assert len(said) == 2, said
    for line in said:
        assert f" was called on a running event loop, at template {where} " in line, line


def test_a_task_group_in_an_async_view_warns_once_naming_it_and_a_thread(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task_group() block creates its group and seals it, two round trips the request's loop
    waits for, and has no async twin: one WARNING per process names task_group(), the line of the
    `with`, and sync_to_async; a block in a thread, or in a sync view, says nothing. The group
    calls it makes are livepush's own, so nothing was said."""
    said = warned_by_async_views(caplog, monkeypatch, ("/group/thread/", "/group/sync/"), "/group/loop/")
    assert len(said) == 1, said
    assert "livepush.contrib.django.task_group()" in said[0] and "sync_to_async" in said[0], said
    assert "django_async_urls.py" in said[0], said
