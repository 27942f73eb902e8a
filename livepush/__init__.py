"""livepush: real-time push for Python applications."""

from __future__ import annotations

from .api import alatest_offset, apublish, latest_offset, publish, sign_topic, verify_topic
from .errors import (
    ConfigError,
    DependencyError,
    InvalidSession,
    InvalidTopic,
    ListenError,
    LivepushError,
    NotListeningError,
    PayloadTooLarge,
    SchemaError,
)
from . import sessions
from .sessions.rules import Allow, App

__all__ = [
    "Allow",
    "App",
    "ConfigError",
    "DependencyError",
    "InvalidSession",
    "InvalidTopic",
    "ListenError",
    "LivepushError",
    "NotListeningError",
    "PayloadTooLarge",
    "SchemaError",
    "alatest_offset",
    "apublish",
    "latest_offset",
    "publish",
    "sessions",
    "sign_topic",
    "verify_topic",
]
