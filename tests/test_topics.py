"""Topics (pure logic): signed topics (sign, verify, what sign() refuses) and state-topic ids."""

from __future__ import annotations

import base64
import math
from datetime import timedelta

import pytest
from itsdangerous import Signer

from livepush import InvalidTopic
from livepush.fanout.base import plain_topic
from livepush.topics import sign, state_topic_id, validate_topic, verify

SECRETS = ["s" * 40]


def test_sign_then_verify_gives_the_topic_back() -> None:
    """A signed topic verifies to its plain topic, with or without a TTL; past its TTL it is refused."""
    assert verify(sign("job:1", SECRETS), SECRETS) == "job:1"
    assert verify(sign("job:1", SECRETS, ttl=60, now=1000.0), SECRETS, now=1059.0) == "job:1"
    with pytest.raises(InvalidTopic):
        verify(sign("job:1", SECRETS, ttl=60, now=1000.0), SECRETS, now=1061.0)


@pytest.mark.parametrize("ttl", [0.5, 1, 60])
def test_a_signed_topic_lives_its_whole_ttl(ttl: float) -> None:
    """Signed late in a second, a topic is still valid just before its ttl is over: the expiry
    is never cut down to the whole second before it (a sub-second ttl would be born expired)."""
    signed_at = 1000.9
    signed = sign("job:1", SECRETS, ttl=ttl, now=signed_at)
    assert verify(signed, SECRETS, now=signed_at + ttl - 0.01) == "job:1"


@pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf, "60", True])
def test_bad_ttls_are_refused(ttl: object) -> None:
    """ttl= is a positive, finite number of seconds (or None)."""
    with pytest.raises(ValueError, match="ttl must be a positive, finite number"):
        sign("job:1", SECRETS, ttl=ttl)  # type: ignore[arg-type]


def test_a_timedelta_ttl_signs_for_its_seconds() -> None:
    """ttl= takes a timedelta too, as every seconds argument of livepush does: a topic signed for
    timedelta(minutes=1) lives that minute, as one signed for 60. It was refused, pointing at
    .total_seconds(), though the jobs API beside it took one."""
    signed = sign("job:1", SECRETS, ttl=timedelta(minutes=1), now=1000.0)
    assert signed == sign("job:1", SECRETS, ttl=60, now=1000.0)
    assert verify(signed, SECRETS, now=1059.9) == "job:1"
    with pytest.raises(InvalidTopic, match="expired"):
        verify(signed, SECRETS, now=1060.0)


@pytest.mark.parametrize("ttl", [timedelta(0), timedelta(seconds=-1), timedelta(days=-1)])
def test_a_timedelta_ttl_is_checked_as_its_seconds(ttl: timedelta) -> None:
    """A zero or negative timedelta is refused as zero or a negative number is, with the same error."""
    with pytest.raises(ValueError, match="ttl must be a positive, finite number of seconds"):
        sign("job:1", SECRETS, ttl=ttl)


@pytest.mark.parametrize("ttl", [None, 60])
def test_a_signed_topic_where_a_plain_one_goes_names_the_plain_one_and_hides_the_signature(ttl: float | None) -> None:
    """publish(), latest_offset() and sign_topic() take a plain topic: given a signed one, the error
    names the plain topic to give instead, and shows none of the signature (a capability)."""
    signed = sign("chat:room-7", SECRETS, ttl=ttl)
    signature = signed.rsplit("~", 1)[1]
    with pytest.raises(InvalidTopic, match=r"signed topic.*give the plain topic here, 'chat:room-7'") as info:
        validate_topic(signed)
    assert signature[:6] not in str(info.value) and info.value.reason == "invalid_topic"
    with pytest.raises(InvalidTopic, match="signed topic"):
        sign(signed, SECRETS)


@pytest.mark.parametrize("ttl", [1e150, 1e300, 10**400, float(2**1023)], ids=["1e150", "1e300", "10**400", "2**1023"])
def test_a_ttl_too_long_to_write_signs_a_topic_that_verifies(ttl: float) -> None:
    """A ttl of any size (10**100 meaning "never") signs the longest topic into one that verifies
    and lasts until the year 9999, instead of an expiry too long for verify() (or an OverflowError)."""
    topic = "t" * 200
    signed = sign(topic, SECRETS, ttl=ttl)
    assert verify(signed, SECRETS) == topic
    assert verify(signed, SECRETS, now=253402300798.0) == topic
    with pytest.raises(InvalidTopic, match="expired"):
        verify(signed, SECRETS, now=253402300799.0)


def test_topics_are_signed_with_hmac_sha256() -> None:
    """The signature is an HMAC-SHA-256 (32 bytes); one made with itsdangerous' SHA-1 default is refused."""
    signed = sign("job:1", SECRETS)
    topic, _, signature = signed.partition("~")
    assert topic == "job:1"
    assert len(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))) == 32
    sha1 = Signer(SECRETS[0], salt="livepush.topic", sep="~").sign("job:1").decode()
    with pytest.raises(InvalidTopic) as info:
        verify(sha1, SECRETS)
    assert info.value.reason == "invalid_signature"


@pytest.mark.parametrize("topic,ident", [("job:42", 42), ("group:7", 7), ("workflow:1", 1), ("chat:1", None),
                                          ("jobs:0001", None), ("job", None), ("user:job:01", None)])
def test_state_topic_ids_are_read_from_state_topics_only(topic: str, ident: int | None) -> None:
    """job:, group: and workflow: topics name a row by its id; other topics are no state topics."""
    assert state_topic_id(topic) == ident


@pytest.mark.parametrize("topic", ["job:0001", "job:0_1", "group:07", "job:0", "job:-1", "job:1x", "workflow:",
                                   "job:" + "9" * 20])
def test_non_canonical_state_topic_ids_are_invalid(topic: str) -> None:
    """A state topic's id is canonical decimal (no leading zero, sign or separator, at most 19 digits): anything else is invalid_topic."""
    with pytest.raises(InvalidTopic) as info:
        state_topic_id(topic)
    assert info.value.reason == "invalid_topic"


@pytest.mark.parametrize("check", [validate_topic, plain_topic], ids=["validate_topic", "plain_topic"])
def test_a_refused_topic_too_long_to_show_is_shown_cut_with_dots(check: object) -> None:
    """A topic past 200 characters is shown cut, and marked so: shown whole-looking (its first 60
    characters between quotes) it read as a valid topic that had been refused."""
    with pytest.raises(InvalidTopic) as raised:
        check("a" * 201)  # type: ignore[operator]
    shown = str(raised.value).split(":")[0]
    assert shown.endswith("...") and "a" * 40 in shown, str(raised.value)
