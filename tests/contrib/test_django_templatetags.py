"""`{% load livepush %}` (docs/frameworks.md, Django): a signed topic and its latest offset beside
what the page rendered, and the signed job topic of a task result."""

from __future__ import annotations

import html
import importlib
import re

import pytest
from django.template import Context, Template
from django.test import override_settings

import livepush
from livepush.contrib.django import Subscription, TaskNotSupported, job_topic, subscription
from livepush.contrib.django.tasks_api import MODULE as tasks_module
from livepush.contrib.django.tasks_api import TaskResultDoesNotExist
from livepush.errors import ArgumentValueError, InvalidTopic

pytestmark = pytest.mark.usefixtures("django_site")

TOPIC = "notices:tags"


def render(source: str, **context: object) -> str:
    return Template("{% load livepush %}" + source).render(Context(context))


def test_subscription_renders_the_signed_topic_and_latest_offset_as_attributes() -> None:
    """{% livepush_subscription topic %} renders data-livepush-topic (signed) and data-livepush-since."""
    livepush.publish(TOPIC, {"n": 1})
    out = render("<ul {% livepush_subscription topic %}></ul>", topic=TOPIC)
    signed, since = re.fullmatch(r'<ul data-livepush-topic="([^"]*)" data-livepush-since="([^"]*)"></ul>', out).groups()
    assert livepush.verify_topic(html.unescape(signed)) == TOPIC
    assert since == livepush.latest_offset(TOPIC)


def test_a_subscription_made_in_the_view_keeps_the_offset_read_before_the_data() -> None:
    """A Subscription made in the view keeps its offset: a message published after it is after `since`."""
    sub = subscription(TOPIC)
    livepush.publish(TOPIC, {"n": 2})  # published between the view's read and the render
    out = render("{% livepush_subscription sub as s %}{{ s.since }}|{{ s.signed }}", sub=sub)
    since, signed = out.split("|")
    assert since == sub.since != livepush.latest_offset(TOPIC)
    assert livepush.verify_topic(html.unescape(signed)) == TOPIC


def test_signed_topic_and_latest_offset_tags() -> None:
    """{% livepush_signed_topic %} and {% livepush_latest_offset %} render each value alone."""
    livepush.publish(TOPIC, {"n": 3})
    signed = html.unescape(render('{% livepush_signed_topic "notices:tags" ttl=60 %}'))
    assert livepush.verify_topic(signed) == TOPIC
    assert render('{% livepush_latest_offset "notices:tags" %}') == livepush.latest_offset(TOPIC)


def test_job_topic_of_a_task_result() -> None:
    """{% livepush_job_topic result %} is the task's job:<id> topic, signed."""
    tasks = importlib.import_module("tests.contrib.sample_django_tasks")
    result = tasks.add.enqueue(1)
    signed = html.unescape(render("{% livepush_job_topic result %}", result=result))
    assert livepush.verify_topic(signed) == f"job:{result.id}"


def test_values_are_escaped() -> None:
    """What the tags render is escaped for an HTML attribute, whatever the values hold."""
    out = render("<ul {% livepush_subscription sub %}>", sub=Subscription("t", 'a"><script>', "1&2"))
    assert out == '<ul data-livepush-topic="a&quot;&gt;&lt;script&gt;" data-livepush-since="1&amp;2">'


@pytest.mark.parametrize("topic", ["job:42", "group:7", "workflow:9"])
def test_a_state_topic_is_subscribed_without_an_offset(topic: str) -> None:
    """A state topic's offset is its row's version, never a message offset: subscription(), {% livepush_subscription %} and {% livepush_latest_offset %} give no `since`, so the page gets the current state (a message offset there made the client drop every version below it)."""
    assert subscription(topic).since is None
    out = render("<b {% livepush_subscription topic %}></b>", topic=topic)
    signed, since = re.fullmatch(r'<b data-livepush-topic="([^"]*)" data-livepush-since="([^"]*)"></b>', out).groups()
    assert livepush.verify_topic(html.unescape(signed)) == topic
    assert since == ""
    assert render("{% livepush_latest_offset topic %}", topic=topic) == ""


def test_job_topic_of_an_id_no_job_can_have_does_not_exist() -> None:
    """job_topic() of a result id past the largest job id (a forged URL parameter) raises
    TaskResultDoesNotExist, as get_result() does, so a view handles both alike, not InvalidTopic."""
    for forged in ("9223372036854775808", "9999999999999999999"):
        with pytest.raises(TaskResultDoesNotExist):
            job_topic(forged)
    assert job_topic("9223372036854775807")  # the largest id is a topic



@pytest.mark.parametrize(("source", "named"), [
    ('{% livepush_subscription "notices:tags" ttl="1h" %}', "{% livepush_subscription %}"),
    ('{% livepush_signed_topic "notices:tags" ttl="3600" %}', "{% livepush_signed_topic %}"),
    ('{% livepush_job_topic result ttl="3600" %}', "{% livepush_job_topic %}"),
])
def test_a_ttl_the_tag_cannot_use_is_refused_naming_the_tag(source: str, named: str) -> None:
    """A ttl written in quotes in a template is text, not seconds: the error names the tag the
    template wrote, where it named subscription() or JobHandle.sign(), calls the template has not."""
    tasks = importlib.import_module("tests.contrib.sample_django_tasks")
    with pytest.raises(ArgumentValueError) as refused:
        render(source, result=tasks.add.enqueue(1))
    assert str(refused.value).startswith(named), refused.value


@pytest.mark.parametrize(("source", "error"), [
    ("{% livepush_subscription topik %}", InvalidTopic),
    ("{% livepush_signed_topic topik %}", InvalidTopic),
    ("{% livepush_latest_offset topik %}", InvalidTopic),
    ("{% livepush_job_topic reslt %}", ArgumentValueError),
])
def test_a_variable_missing_from_the_context_is_named_as_such(source: str, error: type[Exception]) -> None:
    """A misspelt variable renders as '' in Django: the error names the tag and says a variable
    may be missing, where it said `invalid topic ''` or `no task result ''`, values the template
    never wrote."""
    tag = source.split()[1]
    with pytest.raises(error, match=rf"^\{{% {tag} %\}} got an empty .*variable missing from the template's context"):
        render(source, topic=TOPIC)


def test_job_topic_given_a_ttl_it_cannot_use_is_refused_naming_it() -> None:
    """job_topic(result, ttl=...) refuses a bad ttl naming job_topic(), the caller's call."""
    tasks = importlib.import_module("tests.contrib.sample_django_tasks")
    with pytest.raises(ArgumentValueError, match=r"^job_topic\(\): ttl"):
        job_topic(tasks.add.enqueue(1), ttl=0)


def test_job_topic_of_a_result_from_another_backend_is_refused_naming_the_backend() -> None:
    """A TaskResult of another backend (the immediate backend tests often swap in) has no livepush
    job to follow: job_topic() and {% livepush_job_topic %} raise TaskNotSupported naming the
    backend and its alias, where they said `no task result '<its id>'` of a result that exists."""
    tasks = importlib.import_module("tests.contrib.sample_django_tasks")
    with override_settings(TASKS={"default": {"BACKEND": f"{tasks_module}.backends.immediate.ImmediateBackend"}}):
        result = tasks.add.enqueue(1)
        for make in (lambda: job_topic(result), lambda: render("{% livepush_job_topic result %}", result=result)):
            with pytest.raises(TaskNotSupported, match=r"TASKS\['default'\].*ImmediateBackend"):
                make()
