"""A URLconf for the request-transaction tests: a view that enqueues a task and publishes a
notice, then fails when asked (ATOMIC_REQUESTS then rolls the whole request back)."""

from django.http import HttpRequest, JsonResponse
from django.urls import path

from livepush.contrib.django import publish
from tests.contrib.sample_django_tasks import add

TOPIC = "notices:requests"


def enqueue_and_publish(request: HttpRequest) -> JsonResponse:
    result = add.enqueue(1, 2)
    publish(TOPIC, {"job": result.id})
    if request.GET.get("fail"):
        raise RuntimeError("the view failed after enqueueing and publishing")
    return JsonResponse({"job": result.id})


urlpatterns = [path("orders/", enqueue_and_publish)]
