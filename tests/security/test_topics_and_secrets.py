"""Topics, sessions and secrets: handles' signed topics expire and are HMAC-SHA-256, `{subject}`
slots refuse separators, state topics take canonical ids, revocation without a shared store is
an error, weak secrets are refused, and no output holds a secret, token or password."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

import pytest
from itsdangerous import Signer

import livepush
from livepush import config, sessions, topics
from livepush.cli.commands import main as cli
from livepush.config import Settings
from livepush.errors import ConfigError, InvalidSession, InvalidTopic
from livepush.jobs import JobHandle
from livepush.jobs.groups.building import GroupHandle
from livepush.sessions import MemoryRevocations, Session
from tests.server.conftest import Served, make_settings, start_served
from tests.support.procs import Processes
from tests.support.wsclient import WSClient


@pytest.fixture
def settings(secret: str) -> AsyncIterator[Settings]:
    s = Settings(secret=secret)
    config.set_settings(s)
    yield s
    config.set_settings(None)


def test_handles_sign_topics_that_expire(settings: Settings) -> None:
    """A job's or group's signed topic expires after LIVEPUSH_SIGNED_TOPIC_TTL (a day by default); sign(ttl=) picks another lifetime."""
    now = time.time()
    for handle in (JobHandle(42), GroupHandle(7)):
        signed = handle.signed_topic
        assert topics.verify(signed, settings.secrets) == handle.topic
        expires = int(signed.split(topics.SEP)[1])
        assert now + 86400 - 5 <= expires <= now + 86400 + 5
        with pytest.raises(InvalidTopic) as late:
            topics.verify(signed, settings.secrets, now=now + 86401)
        assert late.value.reason == "expired"
        short = handle.sign(ttl=5)
        with pytest.raises(InvalidTopic):
            topics.verify(short, settings.secrets, now=now + 7)  # whole seconds, rounded up
    config.set_settings(Settings(secret=settings.secret, signed_topic_ttl=60))
    assert int(JobHandle(1).signed_topic.split(topics.SEP)[1]) <= time.time() + 61


def test_a_timedelta_ttl_signs_for_its_seconds_everywhere_a_topic_is_signed(settings: Settings) -> None:
    """sign_topic(ttl=) and a handle's sign(ttl=) take a timedelta as every seconds argument of
    livepush does, and sign for its seconds; a zero or negative one is refused as the number is."""
    for sign in (lambda ttl: livepush.sign_topic("job:42", ttl=ttl), lambda ttl: JobHandle(42).sign(ttl=ttl),
                 lambda ttl: GroupHandle(7).sign(ttl=ttl)):
        signed = sign(timedelta(minutes=10))
        expires = int(signed.split(topics.SEP)[1])
        assert time.time() + 600 - 5 <= expires <= time.time() + 600 + 1
        for bad in (timedelta(0), timedelta(minutes=-1)):
            with pytest.raises(ValueError, match="ttl must be a positive, finite number of seconds"):
                sign(bad)


@pytest.mark.parametrize("bad", [-5, timedelta(seconds=-1), "60"])
def test_a_bad_ttl_names_the_call_that_took_it_and_a_timedelta_as_its_seconds(settings: Settings,
                                                                              bad: object) -> None:
    """A ttl= no signed topic can carry is refused naming the call it was given to, as every
    argument error of livepush's does; a timedelta is shown as the seconds it was checked as,
    not as `timedelta(days=-1, seconds=86399)`."""
    for call, sign in (("sign_topic()", lambda ttl: livepush.sign_topic("job:42", ttl=ttl)),
                       ("JobHandle.sign()", lambda ttl: JobHandle(42).sign(ttl=ttl)),
                       ("GroupHandle.sign()", lambda ttl: GroupHandle(7).sign(ttl=ttl))):
        with pytest.raises(ValueError, match="ttl must be a positive, finite number of seconds") as refused:
            sign(bad)
        text = str(refused.value)
        assert text.startswith(f"{call}: "), text
        assert "days" not in text and ("-1.0" in text if isinstance(bad, timedelta) else repr(bad) in text), text


def test_a_handles_signed_topic_read_later_is_valid_for_the_full_ttl(settings: Settings,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A handle's signed_topic read two days after it was first read expires a day from that read, not with the first one."""
    for handle in (JobHandle(42), GroupHandle(7)):
        first = handle.signed_topic
        later = time.time() + 2 * 86400
        monkeypatch.setattr(time, "time", lambda: later)
        try:
            again = handle.signed_topic
            assert topics.verify(again, settings.secrets) == handle.topic, "the first read's signature, expired"
            assert later + 86400 - 5 <= int(again.split(topics.SEP)[1]) <= later + 86400 + 5
            assert handle.signed_topic == again  # and read again at once, the same value
        finally:
            monkeypatch.undo()
        assert first != again


def test_topics_are_signed_with_hmac_sha256(settings: Settings) -> None:
    """A signed topic's signature is HMAC-SHA-256 (32 bytes); one made with SHA-1 is refused."""
    signed = livepush.sign_topic("job:42", ttl=60)
    signature = signed.rsplit(topics.SEP, 1)[1]
    assert len(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))) == hashlib.sha256().digest_size
    sha1 = Signer(settings.secret, salt="livepush.topic", sep=topics.SEP, digest_method=hashlib.sha1)  # type: ignore[arg-type]
    with pytest.raises(InvalidTopic) as refused:
        topics.verify(sha1.sign("job:42").decode(), settings.secrets)
    assert refused.value.reason == "invalid_signature"
    assert hmac.compare_digest(topics.verify(signed, settings.secrets), "job:42")


async def test_a_subject_slot_never_matches_a_subject_with_a_separator() -> None:
    """Under Allow("team:{subject}:*"), subject `7:x` does not enter subject 7's `team:7:x:inbox`, nor `7/x` or `7.x` theirs."""
    app = livepush.App(rules=[livepush.Allow("team:{subject}:*"), livepush.Allow("user:{subject}")])
    seven = Session(id="a", subject="7", expires_at=9e9, issued_at=1.0)
    assert await app.check(seven, "team:7:x:inbox") is None
    for subject in ("7:x", "7/x", "7.x"):
        intruder = Session(id="b", subject=subject, expires_at=9e9, issued_at=1.0)
        assert await app.check(intruder, f"team:{subject}:inbox") == "forbidden", subject
        assert await app.check(intruder, f"user:{subject}") == "forbidden", subject


@pytest.mark.parametrize("pattern", ["user:{subject}-*", "user:{subject}_*", "user:{subject}-inbox-*", "*-{subject}",
                                     "*x-{subject}:y"])
def test_a_star_never_stretches_a_subject_slot_into_another_subjects_topics(pattern: str) -> None:
    """Allow() refuses a `{subject}` slot that no separator parts from a `*`: under
    `user:{subject}-*`, subject `7-x` would read `user:7-x-inbox`, inside subject 7's `user:7-*`."""
    with pytest.raises(ValueError, match="separator"):
        livepush.Allow(pattern)
    for fine in ("user:{subject}:*", "*:{subject}", "user:{subject}-inbox", "team-{subject}/*",
                 "user:{subject}x:*", "user:{subject}-inbox:*", "*/x-{subject}-y"):
        livepush.Allow(fine)


@pytest.fixture
async def served(secret: str) -> AsyncIterator[Served]:
    s = await start_served(make_settings("local", secret, None, None))
    try:
        yield s
    finally:
        await s.stop()


@pytest.fixture
async def served_pg(secret: str, pg_url: str) -> AsyncIterator[Served]:
    """A server with a database: the one kind that serves state topics."""
    s = await start_served(make_settings("postgres", secret, pg_url, None))
    try:
        yield s
    finally:
        await s.stop()
        config.set_settings(None)


async def test_state_topics_take_canonical_ids_only(served_pg: Served) -> None:
    """Signed `job:0001`, `job:0_1`, `group:07`, `job:-1` and an id past a bigint (no row can have it)
    are refused with invalid_topic; `job:1` and the largest bigint are subscribed."""
    served = served_pg
    client = await WSClient.open(served.url)
    for topic in ("job:0001", "job:0_1", "group:07", "job:-1", "job:1x", "workflow:0", "job:9223372036854775808",
                  "group:9999999999999999999"):
        answer = await client.subscribe(served.sign(topic))
        assert (answer["op"], answer.get("reason")) == ("refused", "invalid_topic"), (topic, answer)
    assert (await client.subscribe(served.sign("job:1")))["op"] == "subscribed"
    assert (await client.subscribe(served.sign("job:9223372036854775807")))["op"] == "subscribed"
    await client.close()
    with pytest.raises(InvalidTopic):
        livepush.publish("job:1", {"not": "allowed"})  # a state topic shows its row, nothing else


@pytest.mark.parametrize("topic", ["job:0001", "job:0_1", "group:07", "job:-1", "workflow:0", "job:9223372036854775808"])
def test_sign_topic_refuses_a_state_topic_the_server_would_refuse(settings: Settings, topic: str) -> None:
    """sign_topic() of a state topic without a canonical id raises InvalidTopic (invalid_topic), as publish() does, rather than sign what every subscribe refuses."""
    with pytest.raises(InvalidTopic) as refused:
        livepush.sign_topic(topic, ttl=60)
    assert refused.value.reason == "invalid_topic"
    assert topics.verify(livepush.sign_topic("job:1", ttl=60), settings.secrets) == "job:1"


async def test_latest_offset_of_a_state_topic_is_refused(served: Served) -> None:
    """A state topic's offset is its row's version: latest_offset("job:42") raises InvalidTopic
    (a page subscribes to it without since), rather than give a message offset that would make
    the client drop every version below it."""
    for topic in ("job:42", "group:7", "workflow:3"):
        with pytest.raises(InvalidTopic, match="state topic.*without since"):
            livepush.latest_offset(topic)
        with pytest.raises(InvalidTopic, match="state topic"):
            await livepush.alatest_offset(topic)
    assert livepush.latest_offset("chat:lobby")


async def test_publish_many_refuses_a_batch_with_a_state_or_malformed_topic_naming_the_item(served: Served) -> None:
    """livepush.publish_many checks every topic as publish() does before anything is published: a state
    topic or a malformed one fails the whole batch with InvalidTopic naming the item."""
    client = await WSClient.open(served.url)
    await client.subscribe(served.sign("mine"))
    for bad in ("job:1", "workflow:3", "has space", ""):
        with pytest.raises(InvalidTopic, match="publish_many\\(\\) item 1: "):
            livepush.publish_many([("mine", {"n": 0}), (bad, {"n": 1})])
        with pytest.raises(InvalidTopic, match="item 1"):
            await livepush.apublish_many([("mine", {"n": 0}), (bad, {"n": 1})])
    with pytest.raises(TypeError, match="pairs"):
        livepush.publish_many("mine")  # type: ignore[arg-type]
    offsets = livepush.publish_many([("mine", {"n": "a"}), ("mine", {"n": "b"})])
    got = await client.messages(2)
    assert [m["data"]["n"] for m in got] == ["a", "b"], "nothing of the refused batches came first"
    assert [m["offset"] for m in got] == offsets
    await client.close()


def test_verify_topic_without_a_secret_is_a_config_error(settings: Settings) -> None:
    """A process without LIVEPUSH_SECRET cannot tell a signed topic from a forged one: verify_topic()
    says so with ConfigError naming the setting, as sign_topic() does, not InvalidTopic (which reads
    as "forged", and which code that refuses bad topics would swallow)."""
    signed = livepush.sign_topic("doc:5", ttl=60)
    config.set_settings(Settings())
    with pytest.raises(ConfigError, match="LIVEPUSH_SECRET is not set"):
        livepush.verify_topic(signed)


def test_revoke_without_a_shared_store_is_a_config_error(settings: Settings) -> None:
    """In a process with neither a database nor Redis, revoke() and revoke_subject() raise ConfigError saying revocation needs a shared store."""
    sessions.set_default_store(None)
    token = sessions.issue("judy")
    try:
        for call in (lambda: sessions.revoke(token), lambda: sessions.revoke_subject("judy"),
                     lambda: sessions.revoke(token, store=MemoryRevocations())):
            with pytest.raises(ConfigError, match="shared store"):
                call()
        with pytest.raises(ConfigError, match="shared store"):
            asyncio.run(sessions.arevoke(token))
    finally:
        # The store made from these settings (memory only) must not outlive them: a later test's
        # revoke() would find it instead of its own settings' database.
        sessions.set_default_store(None)


def test_a_secret_that_could_not_become_a_fallback_is_refused() -> None:
    """Rotating moves LIVEPUSH_SECRET into LIVEPUSH_SECRET_FALLBACKS, which is split at commas: a
    secret with a comma would verify nothing there, signing everyone out. It is refused when set,
    naming the reason, never showing the secret."""
    secret = "0123456789,abcdefghijklmnopqrstuvwxyz"
    with pytest.raises(ConfigError, match="LIVEPUSH_SECRET_FALLBACKS") as info:
        Settings.from_env({"LIVEPUSH_SECRET": secret})
    assert secret.strip() not in str(info.value)


def _verifies(signer: Settings, verifier: Settings) -> bool:
    """Whether a session token and a signed topic that `signer` makes both verify at `verifier`."""
    config.set_settings(signer)
    token, signed = sessions.issue("user-7"), livepush.sign_topic("user:7", ttl=60)
    try:
        sessions.decode(token, verifier.secrets)
        topics.verify(signed, verifier.secrets)
    except (InvalidSession, InvalidTopic):
        return False
    finally:
        config.set_settings(None)
    return True


def test_during_each_rolling_restart_of_a_rotation_every_process_verifies_what_any_other_signs() -> None:
    """A restart is rolling: for a while some processes run the step before and some the step
    after. Through the documented rotation (new as a fallback everywhere, then new signing with old
    as the fallback, then old dropped), whatever a process of either step signs, a process of the
    other verifies. Setting new and old at once, as one step, does not: a server not yet restarted
    refuses the tokens a restarted web process signs, and the JS client stops for good on 4401."""
    old, new = "old-" + "0123456789abcdefghijklmnopqrstuv", "new-" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ987654"
    steps = [Settings(secret=old), Settings(secret=old, secret_fallbacks=(new,)),
             Settings(secret=new, secret_fallbacks=(old,)), Settings(secret=new)]
    for before, after in zip(steps, steps[1:]):
        assert _verifies(before, after) and _verifies(after, before)
    assert not _verifies(steps[2], steps[0]), "new and old set at once: a server not yet restarted refuses"


def test_a_secret_with_few_distinct_characters_is_refused(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A 32-character secret of fewer than 8 distinct characters is refused like a short one: exit 2, one line, no secret in it."""
    weak = "ab" * 20
    with pytest.raises(ConfigError, match="distinct characters"):
        Settings.from_env({"LIVEPUSH_SECRET": weak})
    with pytest.raises(ConfigError, match="LIVEPUSH_SECRET_FALLBACKS entry 1"):
        Settings.from_env({"LIVEPUSH_SECRET": "k" * 4 + "0123456789abcdefghijklmnopqrstuv", "LIVEPUSH_SECRET_FALLBACKS": weak})
    monkeypatch.setenv("LIVEPUSH_SECRET", weak)
    assert cli(["token", "session", "u1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and weak not in err


@pytest.mark.parametrize("secret", [
    "$(python3 -c 'import secrets; print(secrets.token_urlsafe(48))')",  # the docs' own command, copied into a .env
    "`python3 -c 'import secrets; print(secrets.token_urlsafe(48))'`",
    "${LIVEPUSH_SECRET_FROM_THE_VAULT_FOR_PRODUCTION}",  # a variable no one expanded
])
def test_a_secret_that_is_an_unexpanded_shell_command_or_variable_is_refused(
        secret: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A secret that is the text of a command or variable a shell would have replaced (a line of
    the docs copied into a .env file, a systemd unit or a container spec, which run no shell) is
    text anyone can read, so anyone could mint sessions with it. It is refused, as secret and as
    fallback: exit 2, one line saying what to put there, no secret in it."""
    with pytest.raises(ConfigError, match="never run") as info:
        Settings.from_env({"LIVEPUSH_SECRET": secret})
    assert secret not in str(info.value)
    with pytest.raises(ConfigError, match="LIVEPUSH_SECRET_FALLBACKS entry 1"):
        Settings.from_env({"LIVEPUSH_SECRET": "k" * 4 + "0123456789abcdefghijklmnopqrstuv",
                           "LIVEPUSH_SECRET_FALLBACKS": secret})
    monkeypatch.setenv("LIVEPUSH_SECRET", secret)
    assert cli(["token", "session", "u1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and secret not in err


def test_settings_repr_holds_no_secret_or_password(secret: str) -> None:
    """The settings' repr names neither the secret, the fallbacks nor the passwords in the URLs."""
    s = Settings(secret=secret, secret_fallbacks=(secret[::-1],), database_url="postgresql://u:pg-pass-1@h/db",
                 redis_url="redis://:redis-pass-2@h/0", fanout="postgres")
    shown = repr(s)
    for hidden in (secret, secret[::-1], "pg-pass-1", "redis-pass-2"):
        assert hidden not in shown


@pytest.mark.parametrize("url", [
    "postgresql://u:S3cr3tPw%zz@127.0.0.1/db",  # psycopg quotes the bad token
    "postgresql://postgres:S3cr3tPw@[::1/db",  # psycopg quotes the whole URI
    "postgresql://u:S3cr3tPw@127.0.0.1:1/db",  # refused connection
])
def test_a_database_url_never_shows_its_password(url: str, livepush_env: Callable[..., dict[str, str]],
                                                 procs: Processes) -> None:
    """`livepush serve` with a malformed or unreachable database URL ends with one line that does not hold the password."""
    child = procs.livepush("serve", env=livepush_env(database_url=url), wait_healthy=False)
    code = child.wait(30)
    assert code in (1, 2), child.output()
    assert "S3cr3tPw" not in child.output()
    assert "Traceback" not in child.output()


@pytest.mark.parametrize("url", [
    "postgresql://u:S3cr/3tPw@127.0.0.1/db",  # libpq would read host u, port S3cr, database 3tPw@127.0.0.1/db
    "postgresql://u:S3cr@3tPw@127.0.0.1/db",  # libpq would read password S3cr, host 3tPw@127.0.0.1
])
def test_a_password_with_an_unencoded_slash_or_at_is_not_shown_in_pieces(
        url: str, livepush_env: Callable[..., dict[str, str]], procs: Processes) -> None:
    """A database URL whose password holds an unencoded `/` or `@` ends `livepush serve` with exit 2 and one line saying to percent-encode it, holding no piece of the password."""
    child = procs.livepush("serve", env=livepush_env(database_url=url), wait_healthy=False)
    assert child.wait(30) == 2, child.output()
    assert "S3cr" not in child.output() and "3tPw" not in child.output(), child.output()
    assert "percent-encode" in child.stderr() and "Traceback" not in child.output()


@pytest.mark.parametrize("url", [
    "redis://default:12/S3cr3tPw@127.0.0.1:1/0",  # read as host default, port 12, path /S3cr3tPw@...
    "redis://default:S3cr?3tPw@127.0.0.1:1/0",  # read as a query S3cr3tPw@...
    "redis://default:12#S3cr3tPw@127.0.0.1:1/0",  # read as a fragment
])
def test_a_redis_password_with_an_unencoded_slash_question_mark_or_hash_is_not_shown(
        url: str, livepush_env: Callable[..., dict[str, str]], procs: Processes) -> None:
    """A Redis URL whose password holds an unencoded `/`, `?` or `#` ends `livepush serve` with
    exit 2 and one line saying to percent-encode it, holding no piece of the password (the URL
    parser ends the credentials there, and the rest was shown as the URL's path)."""
    child = procs.livepush("serve", env=livepush_env(redis_url=url, fanout="redis"), wait_healthy=False)
    assert child.wait(30) == 2, child.output()
    assert "S3cr" not in child.output() and "3tPw" not in child.output(), child.output()
    assert "percent-encode" in child.stderr() and "Traceback" not in child.output()


def test_a_redis_url_never_shows_its_password(livepush_env: Callable[..., dict[str, str]], procs: Processes) -> None:
    """`livepush serve` on an unreachable Redis whose URL carries `?password=` ends with exit 1 and a line without it."""
    env = livepush_env(redis_url="redis://127.0.0.1:1/0?password=S3cr3tPw", fanout="redis")
    child = procs.livepush("serve", env=env, wait_healthy=False)
    assert child.wait(30) == 1, child.output()
    assert "S3cr3tPw" not in child.output() and "Traceback" not in child.output()
    assert "password=***" in child.stderr(), child.stderr()


@pytest.mark.parametrize("topic", ["runtimes", "runtime:3"])
def test_an_app_cannot_publish_on_a_runtimes_topic(settings: Settings, topic: str) -> None:
    """Operators' pages read the runtimes' state on `runtimes` and `runtime:<id>`: publish() and
    publish_many() refuse them with InvalidTopic, so an app's message never passes for a runtime's."""
    with pytest.raises(InvalidTopic, match="livepush's own"):
        livepush.publish(topic, {"event": "started"})
    with pytest.raises(InvalidTopic, match=r"item 1: .*livepush's own"):
        livepush.publish_many([("app:a", 1), (topic, 2)])
