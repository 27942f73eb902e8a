"""Signed topics (pure logic): sign, verify, and what sign() refuses."""

from __future__ import annotations

import math

import pytest

from livepush import InvalidTopic
from livepush.topics import sign, verify

SECRETS = ["s" * 40]


def test_sign_then_verify_gives_the_topic_back() -> None:
    """A signed topic verifies to its plain topic, with or without a TTL; past its TTL it is refused."""
    assert verify(sign("job:1", SECRETS), SECRETS) == "job:1"
    assert verify(sign("job:1", SECRETS, ttl=60, now=1000.0), SECRETS, now=1059.0) == "job:1"
    with pytest.raises(InvalidTopic):
        verify(sign("job:1", SECRETS, ttl=60, now=1000.0), SECRETS, now=1061.0)


@pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf, "60", True])
def test_bad_ttls_are_refused(ttl: object) -> None:
    """ttl= is a positive, finite number of seconds (or None)."""
    with pytest.raises(ValueError, match="ttl must be a positive, finite number"):
        sign("job:1", SECRETS, ttl=ttl)  # type: ignore[arg-type]
