"""livepush: real-time push for Python applications."""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from .errors import *  # noqa: F403 (every error type is part of the API, see errors.__all__)
from . import errors

if TYPE_CHECKING:
    from . import sessions
    from .api import (
        alatest_offset,
        apublish,
        apublish_many,
        latest_offset,
        publish,
        publish_many,
        sign_topic,
        verify_topic,
    )
    from .sessions.rules import Allow, App

# The API is imported on first use, not with the package: `livepush jobs` and `livepush serve`
# import this package before they can take the stop signals over, and a SIGTERM in that time
# (the drivers and the fan-outs import) ended them with the default action, not a clean stop.
_LAZY = {
    **dict.fromkeys(("alatest_offset", "apublish", "apublish_many", "latest_offset", "publish", "publish_many",
                     "sign_topic", "verify_topic"), ".api"),
    "Allow": ".sessions.rules",
    "App": ".sessions.rules",
}

__all__ = [
    *errors.__all__,
    "Allow",
    "App",
    "alatest_offset",
    "apublish",
    "apublish_many",
    "latest_offset",
    "publish",
    "publish_many",
    "sessions",
    "sign_topic",
    "verify_topic",
]


if not TYPE_CHECKING:
    # Hidden from type checkers, which would read any name of the package, a misspelt one
    # included, as this function's Any: the names it serves are imported above for them.
    def __getattr__(name: str) -> Any:
        if name not in _LAZY:
            # A submodule (`livepush.sessions.issue(...)`, `livepush.fanout.from_env()` after a bare
            # `import livepush`), which the package's imports used to bring in as a side effect.
            if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is None:
                raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
            return importlib.import_module(f".{name}", __name__)
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # looked up once
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
