"""The public surface pinned to the docs: every public name of the objects a user is handed (a
job's `ctx` and `ctx.group`, a JobFunction, a workflow, the handles, a JobInfo, an App, an Allow, a
Session, `livepush.sessions.__all__`) is described in docs/, so that none of livepush's own
plumbing reads, under a public name, as supported API."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# architecture.md describes livepush's inside (its modules and classes), not what users may rely on.
USER_DOCS = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "architecture.md")
_FENCED = re.compile(r"```.*?```", re.S)
# What the docs show as code: fenced blocks and `inline spans`, where an API name is written.
CODE = "\n".join(_FENCED.findall(USER_DOCS) + re.findall(r"`[^`\n]+`", _FENCED.sub("", USER_DOCS)))


def public(obj: object) -> list[str]:
    return sorted(name for name in dir(obj) if not name.startswith("_"))


def named_in_code(name: str) -> bool:
    """Whether the docs show `name` as code: an attribute (`.name`), a keyword (`name=`), or a
    span of its own (`name`, `name()`)."""
    word = re.escape(name)
    return re.search(rf"\.{word}\b|\b{word}=|`{word}(\(.*?\))?`", CODE) is not None


def undocumented(names: list[str], named: Callable[[str], bool] = named_in_code) -> list[str]:
    return [name for name in names if not named(name)]


def test_every_name_livepush_sessions_exports_is_described_in_the_docs() -> None:
    """`from livepush.sessions import *` and the module's `__all__` offer what the docs describe
    only: its revocation stores, their constants and the default store's setters are livepush's own."""
    import livepush.sessions

    assert undocumented(list(livepush.sessions.__all__)) == []


def test_every_public_name_of_a_job_info_is_described_in_the_docs() -> None:
    """What `jobs.get_job()`, `list_failed()` and `list_tagged()` return shows its documented
    fields only: how it is made from a row is livepush's own."""
    from livepush.jobs import JobInfo

    info = JobInfo(id=1, name="myapp.job", queue="default", state="available", attempt=0, max_attempts=5,
                   result=None, error=None, progress={}, run_at=None, waiting=None)
    assert undocumented(public(info)) == []


def test_every_public_name_of_an_app_is_described_in_the_docs() -> None:
    """The `--app` object shows its documented settings and calls only: the helpers the server
    uses to read its rules are livepush's own."""
    import livepush

    app = livepush.App(rules=[livepush.Allow("public:*", anonymous=True)])
    assert undocumented(public(app)) == []


def test_every_public_name_of_a_job_function_is_described_in_the_docs() -> None:
    """What `@jobs.job` returns shows the calls and options the docs describe: the runtime's
    bookkeeping (its arity, schema check, claim limits, workflow step) is livepush's own."""
    from livepush import jobs

    def send(ctx: object, to: str) -> None: ...

    fn = jobs.JobFunction(send, name="tests.public_names.send", concurrency=("to", 1), schema={"type": "array"})
    assert undocumented(public(fn)) == []


def test_every_public_name_of_a_jobs_ctx_is_described_in_the_docs() -> None:
    """`dir(ctx)` in a job, async or sync, lists the `ctx.` names the docs describe only: the
    runtime's state (its pool, lease, progress bookkeeping) and its hooks are livepush's own."""
    from livepush.jobs import JobContext, SyncJobContext
    from livepush.jobs.runtime.context import ClaimedJob

    job = ClaimedJob(id=1, name="myapp.job", queue="default", priority=0, attempt=1, max_attempts=5, lease=1,
                     args=[], run_at=None)  # type: ignore[arg-type]
    ctx = JobContext(job, None)

    def ctx_name(name: str) -> bool:
        return re.search(rf"\bctx\.{re.escape(name)}\b", USER_DOCS) is not None

    assert undocumented(public(ctx), ctx_name) == []
    assert undocumented(public(SyncJobContext(ctx, None)), ctx_name) == []  # type: ignore[arg-type]


def test_every_public_name_of_a_jobs_ctx_group_is_described_in_the_docs() -> None:
    """`dir(ctx.group)` of a member or a callback, async or sync, lists what groups.md describes."""
    from types import SimpleNamespace

    from livepush.jobs import GroupContext
    from livepush.jobs.groups.context import SyncGroupContext

    def group_name(name: str) -> bool:  # groups.md writes `ctx.group.id`, `.kind`, ...
        return re.search(rf"\bctx\.group\.{re.escape(name)}\b|`\.{re.escape(name)}`", USER_DOCS) is not None

    member = GroupContext(SimpleNamespace(_job=SimpleNamespace(callback_of=None, group_id=5)))
    callback = GroupContext(SimpleNamespace(_job=SimpleNamespace(callback_of=5, group_id=None)), {}, "finish")
    for group in (member, callback, SyncGroupContext(member, None)):  # type: ignore[arg-type]
        assert undocumented(public(group), group_name) == []


def test_every_public_name_of_a_workflow_is_described_in_the_docs() -> None:
    """What `jobs.workflow()` returns shows the decorators and starts workflows.md describes: the
    engine that runs it and the graph a run stores are livepush's own."""
    from livepush import jobs
    from livepush.jobs.workflows.definition import WORKFLOWS

    flow = jobs.workflow("tests.public_names_flow")
    WORKFLOWS.pop(flow.name)  # defined to be looked at only: no runtime of this process serves it
    assert undocumented(public(flow)) == []


def test_every_public_name_of_a_handle_is_described_in_the_docs() -> None:
    """A job's, group's and workflow run's handle shows what the docs list for it (`JobHandle: id,
    name, topic, ...`, or `GroupHandle.aadd()`): how it builds its topic is livepush's own."""
    from livepush.jobs import GroupHandle, JobHandle, WorkflowHandle

    for handle in (JobHandle(1, "myapp.job"), GroupHandle(1), WorkflowHandle(1, "nightly")):
        kind = type(handle).__name__
        listed = " ".join(re.findall(rf"\b{kind}: ([^\n]*)", USER_DOCS))

        def handle_name(name: str, listed: str = listed, kind: str = kind) -> bool:
            word = re.escape(name)
            return re.search(rf"\b{word}\b", listed) is not None or re.search(rf"\b{kind}\.{word}\b", USER_DOCS) is not None

        assert undocumented(public(handle), handle_name) == [], kind


def test_every_public_name_of_a_rule_and_a_session_is_described_in_the_docs() -> None:
    """A `livepush.Allow` rule and the `Session` that `revoke()` and the frameworks' session
    dependencies hand back show what the docs describe."""
    import livepush
    from livepush.sessions import Session

    session = Session(id="sid", subject="7", expires_at=9e9, issued_at=1.0)
    assert undocumented(public(livepush.Allow("user:{subject}"))) == []
    assert undocumented(public(session)) == []
