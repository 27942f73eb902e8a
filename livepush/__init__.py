"""livepush: real-time push for Python applications."""

from __future__ import annotations

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
from .errors import *  # noqa: F403 (every error type is part of the API, see errors.__all__)
from . import errors, sessions
from .sessions.rules import Allow, App

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
