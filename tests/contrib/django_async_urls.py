"""A URLconf for the event-loop tests: an async view that calls the sync publish() on the
request's loop (the mistake), an async view that calls it through sync_to_async, and a sync view
(which Django runs in a thread under ASGI)."""

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse
from django.urls import path

from livepush.contrib.django import publish, publish_many

TOPIC = "notices:async"


async def on_the_loop(request: HttpRequest) -> JsonResponse:
    if request.GET.get("many"):
        return JsonResponse({"offsets": publish_many([(TOPIC, {"on": "the loop"})])})
    return JsonResponse({"offset": publish(TOPIC, {"on": "the loop"})})


async def through_a_thread(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"offset": await sync_to_async(publish)(TOPIC, {"on": "a thread"})})


def sync_view(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"offset": publish(TOPIC, {"on": "a sync view"})})


urlpatterns = [path("loop/", on_the_loop), path("thread/", through_a_thread), path("sync/", sync_view)]
