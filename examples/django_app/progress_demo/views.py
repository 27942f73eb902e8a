"""The page, and the POST that starts an import: the task and a notice are written in one
transaction, so neither exists unless both do."""

from django.conf import settings
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_GET, require_POST

from livepush.contrib.django import job_topic, publish, subscription

from .tasks import import_rows

try:
    from django.tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
except ImportError:  # Django 5.2 on Python 3.11: the backport
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch

NOTICES = "notices:imports"


@require_GET
@ensure_csrf_cookie
def index(request: HttpRequest) -> HttpResponse:
    notices = subscription(NOTICES)  # its offset first, then whatever the page shows
    return render(request, "progress_demo/index.html",
                  {"notices": notices, "push_url": settings.LIVEPUSH_PUBLIC_URL})


@require_POST
def start(request: HttpRequest) -> JsonResponse:
    with transaction.atomic():
        result = import_rows.enqueue(steps=5, pause=0.3)
        publish(NOTICES, {"text": f"import {result.id} started"})  # sent at commit
    return JsonResponse({"result_id": result.id, "job_topic": job_topic(result)})


@require_GET
def result(request: HttpRequest, result_id: str) -> JsonResponse:
    try:
        found = import_rows.get_result(result_id)
    except (TaskResultDoesNotExist, TaskResultMismatch):  # a mistyped or stale id, or another task's
        raise Http404("no such import") from None
    return JsonResponse({"status": str(found.status),
                         "return_value": found.return_value if found.status == "SUCCESSFUL" else None})
