"""A URLconf for the event-loop tests: an async view that calls the sync publish() on the
request's loop (the mistake), an async view that calls it through sync_to_async, and a sync view
(which Django runs in a thread under ASGI); and the same for subscription(), which reads the
topic's latest offset, for a task_group() block, which creates and seals its group, and for the
template tags that read a latest offset, rendered on the loop, by a TemplateResponse (which Django
renders in a thread) and in a sync view, and a page that has them from a template it includes
or extends, or in a block it fills in the one it extends."""

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template import Context, Engine, Origin, Template, engines
from django.template.response import TemplateResponse
from django.urls import path

from livepush.contrib.django import publish, publish_many, subscription, task_group
from tests.contrib.sample_django_tasks import add

TOPIC = "notices:async"


async def on_the_loop(request: HttpRequest) -> JsonResponse:
    if request.GET.get("many"):
        return JsonResponse({"offsets": publish_many([(TOPIC, {"on": "the loop"})])})
    return JsonResponse({"offset": publish(TOPIC, {"on": "the loop"})})


async def through_a_thread(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"offset": await sync_to_async(publish)(TOPIC, {"on": "a thread"})})


def sync_view(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"offset": publish(TOPIC, {"on": "a sync view"})})


async def page_on_the_loop(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"since": subscription(TOPIC).since})


async def page_through_a_thread(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"since": (await sync_to_async(subscription)(TOPIC)).since})


def sync_page(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"since": subscription(TOPIC).since})


async def group_on_the_loop(request: HttpRequest) -> JsonResponse:
    with task_group() as group:
        await add.aenqueue(1)
    return JsonResponse({"group": group.id})


def _group() -> int:
    with task_group() as group:
        add.enqueue(1)
    return group.id


async def group_through_a_thread(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"group": await sync_to_async(_group)()})


def sync_group(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"group": _group()})


PAGE = '{% load livepush %}<ul {% livepush_subscription "notices:async" %}></ul>{% livepush_latest_offset "notices:async" %}'


def _page() -> Template:
    """PAGE as a site's template file would be: named, as the warning names it."""
    return Template(PAGE, origin=Origin("notices.html", template_name="notices.html"))


async def tags_on_the_loop(request: HttpRequest) -> HttpResponse:
    return HttpResponse(_page().render(Context()))


async def tags_in_a_template_response(request: HttpRequest) -> TemplateResponse:
    return TemplateResponse(request, engines["django"].from_string(PAGE))


def sync_tags(request: HttpRequest) -> HttpResponse:
    return HttpResponse(_page().render(Context()))


# A site's template files: the tags in a template another includes, and in a block of one that extends another.
FILES = Engine(libraries={"livepush": "livepush.contrib.django.templatetags.livepush"}, loaders=[
    ("django.template.loaders.locmem.Loader", {
        "notices.html": PAGE, "page.html": '<main>{% include "notices.html" %}</main>',
        "base.html": "<main>{% block body %}{% endblock %}</main>",
        "child.html": '{% extends "base.html" %}{% block body %}' + PAGE + "{% endblock %}",
        "notices_base.html": PAGE + "{% block body %}{% endblock %}", "extending.html": '{% extends "notices_base.html" %}'})])


async def tags_in_a_template_file(request: HttpRequest, name: str) -> HttpResponse:
    return HttpResponse(FILES.get_template(name).render(Context()))


urlpatterns = [path("loop/", on_the_loop), path("thread/", through_a_thread), path("sync/", sync_view),
               path("page/loop/", page_on_the_loop), path("page/thread/", page_through_a_thread),
               path("page/sync/", sync_page), path("group/loop/", group_on_the_loop),
               path("group/thread/", group_through_a_thread), path("group/sync/", sync_group),
               path("tags/loop/", tags_on_the_loop), path("tags/response/", tags_in_a_template_response),
               path("tags/sync/", sync_tags), path("tags/file/<str:name>", tags_in_a_template_file)]
