"""Workflows (docs/workflows.md): a named graph of steps run as jobs, with outputs passed along,
fan-out steps that park on a task group, steps that wait for a signal, flow verbs inside a step
and operator verbs with an audit trail.

    flow = jobs.workflow("nightly_import", queue="imports")

    @flow.step()
    async def fetch(ctx): ...                      # ctx.input; returns its output (JSON)

    run = flow.start({"source": "..."})            # WorkflowHandle: id, topic, signed_topic
    jobs.workflows.pause(run.id, actor="ana", reason="bad data")
    jobs.workflows.get(run.id)

Modules: `definition.py` (the graph and its checks), `runner.py` (a step's job, starting runs),
`engine.py` (the decisions, exactly once under the run's lock), `operators.py` (what an operator
calls), `queries.py` (the SQL).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# jobs.workflows.<verb>: operators.py, imported when first used (operators imports the jobs API,
# which imports engine.py from here: a plain import would go round in a circle at start-up).
_OPERATORS = {
    "pause": "pause", "resume": "resume", "cancel": "cancel_run", "skip": "skip", "signal": "signal",
    "get": "get", "list": "list_runs", "apause": "apause", "aresume": "aresume", "acancel": "acancel_run",
    "askip": "askip", "asignal": "asignal_run", "aget": "aget", "alist": "alist_runs",
}


# Spelled out, not list(_OPERATORS): a type checker reads a literal __all__ only.
__all__ = ["pause", "resume", "cancel", "skip", "signal", "get", "list", "apause", "aresume", "acancel", "askip",
           "asignal", "aget", "alist"]

if TYPE_CHECKING:
    # The verbs for type checkers, which cannot follow __getattr__ (they would read every name,
    # a misspelt verb included, as its Any). `list` shadows the builtin here: hence builtins.list.
    import builtins

    from .operators import acancel_run as acancel, aget, alist_runs as alist, apause, aresume
    from .operators import asignal_run as asignal, askip, cancel_run as cancel, get, list_runs as list
    from .operators import pause, resume, signal, skip
else:
    def __getattr__(name: str) -> Any:
        if name in _OPERATORS:
            from . import operators

            return getattr(operators, _OPERATORS[name])
        # A mistyped verb: the name alone said neither where it was looked up nor what is there.
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}; its verbs are "
                             f"{', '.join(v for v in _OPERATORS if not v.startswith('a'))} and their async twins "
                             "(apause, ...)")


def __dir__() -> builtins.list[str]:
    # The verbs are looked up lazily: without this, dir() and a shell's completion missed them all.
    return sorted({*globals(), *__all__})
