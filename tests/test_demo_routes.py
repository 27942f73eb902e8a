"""The demo's page routes, called directly: what any client can send must get an answer or fall
through to the server's own routes, never raise."""

from __future__ import annotations

from websockets.datastructures import Headers
from websockets.http11 import Request

from livepush.demo import routes


async def test_a_request_target_that_is_not_a_url_falls_through_the_demos_routes() -> None:
    """`//[x` (an unbalanced bracket where a URL has its host) is none of the demo's routes: the
    server answers it as an unknown path, not with a 500."""
    assert await routes(Request("//[x", Headers({"Host": "h"}))) is None


async def test_a_demo_action_answers_a_get_with_405() -> None:
    response = await routes(Request("/demo/workflow/audit", Headers({"Host": "h"})))
    assert response is not None and response.status_code == 405


async def test_the_demos_files_answer_get_and_head_and_refuse_other_methods_with_405() -> None:
    """The page and its files are read-only: a POST or a DELETE of them gets 405 naming GET and
    HEAD, not the page as if it were a GET."""
    for path in ("/", "/demo/page.js"):
        assert (await routes(Request(path, Headers({"Host": "h"})))).status_code == 200  # type: ignore[union-attr]
        for method in ("POST", "DELETE"):
            response = await routes(Request(path, Headers({"Host": "h"}), method=method))
            assert response is not None and (response.status_code, response.headers["Allow"]) == (405, "GET, HEAD")
