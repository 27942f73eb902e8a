"""Where a user's own module failed at import, or was not found, for the one line `serve --app` and
`livepush jobs` print instead of a traceback; and the folder those modules are looked for in."""

from __future__ import annotations

import inspect
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from .errors import ConfigError

_OURS = os.path.dirname(os.path.abspath(__file__))


def current_folder() -> str:
    """The current folder, where `--app`, `--with-jobs` and `livepush jobs` modules are looked for
    (and the demo keeps its data). A shell can stand in a folder a deploy has since removed: the
    command then says so in one line, where os.getcwd() would end it with a traceback."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise ConfigError("the current folder has been removed (a release folder deleted since the shell entered "
                          "it, say), and livepush looks for your modules there (the demo keeps its data there): cd "
                          "into your project's folder and run the command again") from None


def importable_from_cwd() -> None:
    """Make modules in the current folder importable, as `python -m` would: the console script's
    own path is its bin folder, not the project a user runs it from."""
    cwd = current_folder()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def is_a_path(name: str) -> bool:
    """Whether `name`, given where a module goes, is a file path or a relative name (`myapp/jobs.py`,
    `./jobs`): importlib would say "No module named 'myapp/jobs'", or raise a TypeError about
    packages, where the fix is to write the module's name."""
    return name.startswith(".") or "/" in name or os.sep in name


def as_module(path: str) -> str:
    """The module a file path names, as Python imports it: `myapp/jobs.py` is `myapp.jobs`."""
    return path.removeprefix("./").removesuffix(".py").replace(os.sep, ".").replace("/", ".").strip(".")


def names_the_module(exc: ImportError, name: str) -> bool:
    """Whether `exc` says the module `name` itself (or a package on its path) is not found, rather
    than something the module imports: then its name or the folder is wrong, not its code."""
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    return missing is not None and (name == missing or name.startswith(missing + "."))


def not_found(missing: str) -> str:
    """What to say of a user's module (or package) `missing` that Python found nowhere: the folder
    it was looked for in, the current one when it is importable (the commands make it so, as
    `python -m` does), and what to do; else (a program of the user's that put it off the path)
    the import path to check."""
    cwd = current_folder()
    if cwd in sys.path or "" in sys.path:
        return (f"no module named {missing!r} (searched from {cwd}): check the name and run livepush from your "
                "project's directory")
    return f"no module named {missing!r} (searched on the import path): check the name and PYTHONPATH"


def where_raised(exc: BaseException, *, top_level: bool = False) -> str:
    """"file:line" of the innermost frame of `exc` outside livepush and the import machinery; for
    a SyntaxError, the line the compiler names (no frame of the module is in its traceback).
    `top_level`: of the frames running a module's top level only (the line of the module that
    called, say, argparse, rather than argparse's own)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{os.path.relpath(exc.filename)}:{exc.lineno}"
    where = generated = "unknown line"
    for frame, line in traceback.walk_tb(exc.__traceback__):
        path = frame.f_code.co_filename
        if path.startswith((_OURS + os.sep, "<frozen")) or (top_level and frame.f_code.co_name != "<module>"):
            continue
        if path.startswith("<"):
            # Code made at run time (a dataclass's __init__, "<string>:5", calling livepush.Allow's
            # checks) is no line the user can open: the file line that called it is.
            generated = f"{path}:{line}"
        else:
            where = f"{os.path.relpath(path)}:{line}"
    return where if where != "unknown line" else generated


def what_raised(exc: BaseException) -> str:
    """The exception as one line: its type and message (a SyntaxError's message without the
    location, which where_raised() gives). A message of several lines (a validation library's)
    is joined with " / ": printed as it was, it broke the one line the commands promise."""
    message = (exc.msg or "") if isinstance(exc, SyntaxError) else str(exc)  # a bare `raise SyntaxError` has none
    text = " / ".join(line.strip() for line in message.splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def cannot_take(fn: Callable[..., Any], *args: Any) -> str | None:
    """Why `fn(*args)` cannot be called, as binding its signature says; None when it can, or when
    Python cannot read its signature (some builtins: the call itself finds out). For hooks a user
    hands livepush, checked where they are given rather than at each call."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*args)
    except TypeError as exc:
        return str(exc)
    return None
