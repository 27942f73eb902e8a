"""The demo's page routes, called directly: what any client can send must get an answer or fall
through to the server's own routes, never raise."""

from __future__ import annotations

from typing import Any

import pytest
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


async def test_a_demo_action_needs_the_signs_of_its_own_page_not_only_no_sign_of_another_site() -> None:
    """Work starts only on a POST that shows it comes from the demo's own page
    (`Sec-Fetch-Site: same-origin`, or an `Origin` equal to its host; docs/security.md): one with
    neither, with another `Sec-Fetch-Site`, or with `Sec-Fetch-Site: same-origin` beside another
    site's Origin, gets 403 before the action reads its parameters; the page's own POST gets to
    them (here a 400: no `job`)."""
    action = "/demo/durable/approve"  # refuses a missing `job` parameter without the database

    async def post(**headers: str) -> int:
        sent = Headers({"Host": "127.0.0.1:8765", **{k.replace("_", "-"): v for k, v in headers.items()}})
        response = await routes(Request(action, sent, method="POST"))
        assert response is not None
        return response.status_code

    assert await post() == 403
    assert await post(Sec_Fetch_Site="same-origin", Origin="https://evil.example") == 403
    for site in ("cross-site", "same-site", "none"):  # another site's sign, even with no Origin beside it
        assert await post(Sec_Fetch_Site=site) == 403, site
    assert await post(Sec_Fetch_Site="same-origin") == 400
    assert await post(Origin="http://127.0.0.1:8765") == 400


async def test_the_demo_reads_a_workflow_run_on_its_loop_with_aget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workflow endpoints read the run with jobs.workflows.aget() on the demo's loop: they read
    it with the sync get() in a worker thread, on a comment's word that get() had no async twin."""
    from livepush.demo import jobs as demo_jobs
    from livepush.demo import workflow
    from livepush.jobs.workflows import operators

    def sync_get(run_id: int) -> None:
        raise AssertionError("the demo called the sync jobs.workflows.get()")

    async def aget(run_id: int) -> dict[str, Any]:
        return {"id": run_id, "name": demo_jobs.WORKFLOW}

    monkeypatch.setattr(operators, "get", sync_get)
    monkeypatch.setattr(operators, "aget", aget)
    assert await workflow._run(7) == {"id": 7, "name": demo_jobs.WORKFLOW}


async def test_every_module_the_demo_page_imports_is_served_as_javascript_with_the_names_imported() -> None:
    """The page's modules import one another by URL: each `/demo/*.js` they import is one the demo
    serves (GET 200, text/javascript, or the browser refuses the module and the whole page stops),
    and it exports every name imported from it."""
    import re
    from importlib import resources

    folder = resources.files("livepush.demo")
    html = folder.joinpath("page.html").read_text()
    [entry] = re.findall(r'<script type="module" src="(/demo/[\w.]+\.js)"></script>', html)
    seen, todo = set(), [entry]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        response = await routes(Request(path, Headers({"Host": "h"})))
        assert response is not None and response.status_code == 200, path
        assert response.headers["Content-Type"].startswith("text/javascript"), path
        source = response.body.decode()
        for names, imported in re.findall(r'import \{([^}]*)\} from "(/demo/[\w.]+\.js)";', source):
            target = folder.joinpath(imported.removeprefix("/demo/")).read_text()
            exported = set(re.findall(r"^export (?:async function|function|const) ([\w$]+)", target, re.M))
            missing = {n.strip() for n in names.split(",")} - exported
            assert not missing, f"{path} imports {sorted(missing)} from {imported}, which does not export them"
            todo.append(imported)
    assert {"/demo/page.js", "/demo/durable.js", "/demo/workflow.js"} <= seen
