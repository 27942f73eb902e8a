"""`client_js`: the livepush JS client served by the Django site itself, so a page's module import
is same-origin (the push server's own `/livepush.js` sends no CORS header).

    path("livepush.js", livepush.contrib.django.views.client_js)
"""

from __future__ import annotations

import functools
from importlib import resources

from django.http import HttpRequest, HttpResponse


@functools.cache
def _client() -> bytes:
    return resources.files("livepush").joinpath("static/livepush.js").read_bytes()


def client_js(request: HttpRequest) -> HttpResponse:
    """GET: the JS client of the installed livepush, as a module script."""
    response = HttpResponse(_client(), content_type="text/javascript; charset=utf-8")
    response["Cache-Control"] = "public, max-age=300"
    return response
