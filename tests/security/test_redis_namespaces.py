"""Deployments on one Redis stay apart: every channel and key starts with `{P}:`, P being
LIVEPUSH_REDIS_PREFIX (default `livepush:<db number>`), so two deployments on databases 11 and 12
of one server hear neither each other's messages nor each other's revocations, and a prefix that
extends another (`prod`, `prod:h`) shares none of its keys. The ACL docs/security.md shows is
the one these tests give a deployment's Redis user."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis

from livepush import sessions
from livepush.config import Settings
from livepush.errors import ConfigError
from livepush.fanout.redis import RedisFanOut
from livepush.sessions.revocations import RedisRevocations
from tests.server.conftest import Served, make_settings, start_served
from tests.support.fanouts import Collector
from tests.support.redis_acl import DOCUMENTED_PREFIX, documented_user
from tests.support.wsclient import WSClient


def on_db(url: str, db: int) -> str:
    return url.rsplit("/", 1)[0] + f"/{db}"


@pytest.fixture
def acl_user(redis_url: str) -> Iterator[Callable[[str], str]]:
    """`make(prefix)`: the test Redis's URL (database 12) as a user with the ACL docs/security.md
    gives a deployment with that prefix. Users are deleted at teardown."""
    with contextlib.ExitStack() as stack:
        yield lambda prefix: stack.enter_context(documented_user(on_db(redis_url, 12), prefix))


@pytest.fixture
async def two_deployments(redis_url: str, secret: str) -> AsyncIterator[tuple[Served, Served]]:
    a = await start_served(make_settings("redis", secret, None, on_db(redis_url, 11)))
    b = await start_served(make_settings("redis", secret, None, on_db(redis_url, 12)))
    try:
        yield a, b
    finally:
        await a.stop()
        await b.stop()


async def test_a_deployment_does_not_hear_another_ones_messages(two_deployments: tuple[Served, Served]) -> None:
    """A message published by deployment 11 reaches its own subscriber and not deployment 12's, on the same topic."""
    a, b = two_deployments
    ours, theirs = await WSClient.open(a.url), await WSClient.open(b.url)
    for client, served in ((ours, a), (theirs, b)):
        assert (await client.subscribe(served.sign("room:shared")))["op"] == "subscribed"
    await a.publish("room:shared", {"from": "deployment 11"})
    assert (await ours.messages(1))[0]["data"] == {"from": "deployment 11"}
    await b.publish("room:shared", {"from": "deployment 12"})
    (got,) = await theirs.messages(1)
    assert got["data"] == {"from": "deployment 12"}  # the first thing 12 heard is its own
    await ours.close()
    await theirs.close()


async def test_a_deployment_does_not_revoke_another_ones_sessions(two_deployments: tuple[Served, Served]) -> None:
    """revoke_subject() on deployment 11 closes its session of that subject and leaves deployment 12's open."""
    a, b = two_deployments
    token = sessions.issue("dave")
    ours = await WSClient.open(a.url, additional_headers={"Cookie": f"livepush_session={token}"})
    theirs = await WSClient.open(b.url, additional_headers={"Cookie": f"livepush_session={token}"})
    store = RedisRevocations(a.settings.redis_url)  # type: ignore[arg-type]
    try:
        await store.aadd_subject("dave", time.time())
    finally:
        await store.aclose()
    assert await ours.closed_with() == 4403  # well before the 60 s re-check, had the ring been lost
    await theirs.send({"op": "ping", "ref": 1})
    assert await theirs.recv() == {"op": "pong", "ref": 1}
    await theirs.close()


def test_every_key_and_channel_is_under_the_prefix(redis_url: str) -> None:
    """After a publish and a revocation, every key in Redis starts with the deployment's prefix, and the pub/sub channel does too."""
    fanout = RedisFanOut(on_db(redis_url, 11))
    store = RedisRevocations(on_db(redis_url, 11))
    assert fanout.prefix == store.prefix == "livepush:11"
    fanout.publish("room:keys", {"n": 1})
    store.add_session("sid", time.time() + 60)
    store.add_subject("erin", time.time())
    raw = redis.Redis.from_url(on_db(redis_url, 11))
    keys = [k.decode() for k in raw.keys("*")]
    raw.close()
    fanout.close()
    assert keys and all(k.startswith("{livepush:11}:") for k in keys), keys
    assert fanout.channel.startswith("{livepush:11}:") and store.channel.startswith("{livepush:11}:")
    custom = RedisFanOut(redis_url, prefix="staging")
    assert custom.channel == "{staging}:pub" and custom.key_prefix == "{staging}:h:"




async def test_a_server_runs_as_the_redis_user_the_docs_show(acl_user: Callable[[str], str], secret: str) -> None:
    """A deployment whose Redis user has exactly the ACL docs/security.md shows works: a publish
    reaches a subscriber, history replays it, prune() runs, the topics it watches are kept from
    being forgotten as idle, and a revocation closes a session."""
    url = acl_user(DOCUMENTED_PREFIX)
    served = await start_served(make_settings("redis", secret, None, url))
    token = sessions.issue("frank")
    client = await WSClient.open(served.url, additional_headers={"Cookie": f"livepush_session={token}"})
    store = RedisRevocations(url)
    try:
        assert served.fanout.prefix == DOCUMENTED_PREFIX  # type: ignore[attr-defined]
        assert (await client.subscribe(served.sign("room:acl")))["op"] == "subscribed"
        origin = await served.fanout.alatest_offset("room:acl")
        offset = await served.publish("room:acl", {"as": "the documented user"})
        (message,) = await client.messages(1)
        assert message["offset"] == offset and message["data"] == {"as": "the documented user"}
        page = await served.fanout.history("room:acl", origin)
        assert page is not None and [m.offset for m in page.messages] == [offset]
        await served.fanout.prune()
        await served.fanout.keep_chains(["room:acl"])
        await store.aadd_subject("frank", time.time())
        assert await client.closed_with() == 4403  # well before the 60 s re-check, had the ring been lost
    finally:
        await client.close()
        await store.aclose()
        await served.stop()


async def test_a_redis_user_reaches_nothing_of_a_prefix_that_extends_its_own(acl_user: Callable[[str], str],
                                                                             redis_url: str) -> None:
    """Deployment `prod`'s user, made as docs/security.md says, publishes and reads history under
    its own prefix, and can neither touch a key of deployment `prod:h` nor publish on its channels."""
    url = acl_user("prod")
    theirs = RedisFanOut(on_db(redis_url, 12), prefix="prod:h")
    their_store = RedisRevocations(on_db(redis_url, 12), prefix="prod:h")
    ours = RedisFanOut(url, prefix="prod")
    as_ours = redis.Redis.from_url(url)
    raw = redis.Redis.from_url(on_db(redis_url, 12))
    try:
        theirs.publish("room", {"n": 1})
        their_store.add_session("sid", time.time() + 60)
        their_keys = raw.keys("*")
        origin = ours.latest_offset("room")
        offset = ours.publish("room", {"n": 2})
        page = await ours.history("room", origin)
        assert page is not None and [m.offset for m in page.messages] == [offset]
        assert len(their_keys) == 4, their_keys  # their topic's stream, their two origins, their revocation
        for key in their_keys:
            with pytest.raises(redis.exceptions.NoPermissionError):
                as_ours.type(key)
        for channel in (theirs.channel, their_store.channel):
            with pytest.raises(redis.exceptions.NoPermissionError):
                as_ours.publish(channel, "*")
    finally:
        for client in (as_ours, raw):
            client.close()
        theirs.close()
        await ours.aclose()


@pytest.mark.parametrize("prefix", ["prod}", "{prod", "a b"])
def test_a_prefix_that_could_end_early_is_refused(prefix: str, redis_url: str) -> None:
    """LIVEPUSH_REDIS_PREFIX with a brace (which ends the prefix in every key) or a space is refused at start, naming the setting."""
    with pytest.raises(ConfigError, match="LIVEPUSH_REDIS_PREFIX"):
        Settings.from_env({"LIVEPUSH_REDIS_URL": redis_url, "LIVEPUSH_FANOUT": "redis", "LIVEPUSH_REDIS_PREFIX": prefix})
    with pytest.raises(ConfigError, match="LIVEPUSH_REDIS_PREFIX"):
        RedisFanOut(redis_url, prefix=prefix)


async def test_a_deployment_whose_prefix_is_not_ascii_listens(redis_url: str) -> None:
    """A prefix Redis would not take in a client name (`café`) still names its listener: the fan-out listens and hears its own publish."""
    fanout = RedisFanOut(redis_url, prefix="café")
    got = Collector()
    try:
        await fanout.listen()
        fanout.register(got)
        offset = await fanout.apublish("room:cafe", {"n": 1})
        assert [m.offset for m in await got.wait_count("room:cafe", 1)] == [offset]
    finally:
        await fanout.aclose()


OTHER_TENANT_LIBRARY = "#!lua name=other_tenant\nredis.register_function('other_tenant_ping', function() return 1 end)"


def test_a_redis_user_can_neither_disturb_nor_list_other_tenants(acl_user: Callable[[str], str],
                                                                  redis_url: str) -> None:
    """The user docs/security.md shows for one deployment cannot flush, delete, replace or kill
    what other tenants of the Redis keep server-wide (functions, scripts), switch to another
    deployment's database, or list other tenants' channels; the other tenant's library survives."""
    admin = redis.Redis.from_url(redis_url)
    admin.execute_command("FUNCTION", "LOAD", "REPLACE", OTHER_TENANT_LIBRARY)
    neighbour = RedisFanOut(on_db(redis_url, 11))
    as_ours = redis.Redis.from_url(acl_user(DOCUMENTED_PREFIX))
    try:
        neighbour.publish("room:neighbour", {"n": 1})
        as_ours.ping()
        for command in (("FUNCTION", "FLUSH"), ("FUNCTION", "DELETE", "other_tenant"),
                        ("FUNCTION", "LOAD", "REPLACE", OTHER_TENANT_LIBRARY), ("FUNCTION", "KILL"),
                        ("SCRIPT", "FLUSH"), ("SCRIPT", "KILL"), ("SELECT", "11"), ("PUBSUB", "CHANNELS"),
                        ("FCALL", "other_tenant_ping", "0")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                as_ours.execute_command(*command)
        assert admin.fcall("other_tenant_ping", 0) == 1
    finally:
        with contextlib.suppress(redis.exceptions.ResponseError):  # gone if a FUNCTION FLUSH got through
            admin.execute_command("FUNCTION", "DELETE", "other_tenant")
        for client in (as_ours, admin):
            client.close()
        neighbour.close()


@pytest.mark.parametrize("path", ["/abc", "/1l", "/-1", "/1.5", "/0x1", "/1/2", "/%2D1", "/?db=-3"])
def test_a_redis_url_whose_database_is_no_number_is_refused_naming_it(path: str) -> None:
    """A Redis URL names its database by number: `/abc` (or a typo such as `/1l`) was taken as
    database 0, so a deployment meant to be apart joined database 0's namespace (`livepush:0`)
    and heard its messages and revocations. It is a ConfigError naming the URL, as a bad port is."""
    url = "redis://127.0.0.1:6379" + path
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"LIVEPUSH_FANOUT": "redis", "LIVEPUSH_REDIS_URL": url})
    assert "LIVEPUSH_REDIS_URL" in str(info.value) and "database" in str(info.value)


@pytest.mark.parametrize("path,db", [("", 0), ("/", 0), ("/0", 0), ("/12", 12), ("/?db=3", 3)])
def test_a_redis_url_with_a_database_number_or_none_is_accepted(path: str, db: int) -> None:
    url = "redis://127.0.0.1:6379" + path
    settings = Settings.from_env({"LIVEPUSH_FANOUT": "redis", "LIVEPUSH_REDIS_URL": url})
    assert RedisFanOut(settings.redis_url).prefix == f"livepush:{db}"  # type: ignore[arg-type]


@pytest.mark.parametrize("url,says", [
    ("redis+sentinel://:s3cret@127.0.0.1:26379/mymaster/0", "Sentinel"),
    ("sentinel://:s3cret@127.0.0.1:26379", "Sentinel"),
    ("redis-sentinel://:s3cret@127.0.0.1:26379/mymaster", "Sentinel"),
    ("redis+cluster://:s3cret@127.0.0.1:7000/0", "Cluster"),
    ("rediss+cluster://:s3cret@127.0.0.1:7000/0", "Cluster"),
])
def test_a_sentinel_or_cluster_url_is_refused_saying_what_livepush_connects_to(url: str, says: str) -> None:
    """A URL written for another client's Sentinel or Cluster support was refused as "not a Redis
    URL", which left the user to guess whether livepush takes Sentinel at all. It says that
    livepush takes neither scheme and what to give it instead (docs/reference.md)."""
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"LIVEPUSH_FANOUT": "redis", "LIVEPUSH_REDIS_URL": url})
    said = str(info.value)
    assert said.startswith("LIVEPUSH_REDIS_URL") and f"Redis {says}" in said and "s3cret" not in said, said
    assert "redis://" in said and ("primary" in said if says == "Sentinel" else "standalone" in said), said


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/2?db=5", "redis://127.0.0.1:6379/?db=1&db=2",
                                 "unix:///run/redis.sock?db=1&db=2"])
def test_a_redis_url_naming_two_databases_is_refused_naming_both(url: str) -> None:
    """`redis://host/2?db=5` names two databases: the connection silently used the parameter's,
    and so did the deployment's default prefix, where the user who wrote /2 expected database 2.
    Which one was meant only the user knows: it is a ConfigError naming both."""
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"LIVEPUSH_FANOUT": "redis", "LIVEPUSH_REDIS_URL": url})
    said = str(info.value)
    assert said.startswith("LIVEPUSH_REDIS_URL") and "two databases" in said, said


def test_a_redis_url_naming_one_database_twice_alike_is_accepted() -> None:
    url = "redis://127.0.0.1:6379/3?db=3"
    settings = Settings.from_env({"LIVEPUSH_FANOUT": "redis", "LIVEPUSH_REDIS_URL": url})
    assert RedisFanOut(settings.redis_url).prefix == "livepush:3"  # type: ignore[arg-type]


@pytest.mark.parametrize("url,path", [("unix://run/redis/redis.sock?db=1", "/run/redis/redis.sock"),
                                      ("unix://:s3cret@var/run/redis.sock", "/var/run/redis.sock")])
def test_a_unix_url_with_two_slashes_is_refused_showing_the_three_it_needs(url: str, path: str) -> None:
    """`unix://run/redis/redis.sock` (two slashes, as in redis://) reads `run` as a host name,
    which a socket URL has no use for: the connection went to /redis/redis.sock and failed with
    "No such file or directory" on a socket the user could see was there. It is a ConfigError at
    start showing the URL as it must be written, without the password."""
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"LIVEPUSH_FANOUT": "redis", "LIVEPUSH_REDIS_URL": url})
    said = str(info.value)
    assert said.startswith("LIVEPUSH_REDIS_URL") and f"unix://{path}" in said and "s3cret" not in said, said


def test_a_unix_url_with_three_slashes_is_accepted() -> None:
    for url in ("unix:///run/redis/redis.sock?db=1", "unix://:s3cret@/run/redis.sock"):
        assert Settings.from_env({"LIVEPUSH_FANOUT": "redis", "LIVEPUSH_REDIS_URL": url}).redis_url == url


@pytest.mark.parametrize("query,named", [("ssl_cert_reqs=none", "ssl_cert_reqs"), ("sockettimeout=5", "sockettimeout")])
def test_a_redis_url_parameter_connections_do_not_take_is_refused_naming_it(query: str, named: str) -> None:
    """A query parameter redis-py passes to its connections and they do not take (a TLS option on
    a redis:// URL, a misspelling) is a ConfigError at start naming it and never the password, not
    a TypeError traceback at the first connect."""
    url = f"redis://:s3cret@127.0.0.1:6379/0?{query}"
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"LIVEPUSH_FANOUT": "redis", "LIVEPUSH_REDIS_URL": url})
    said = str(info.value)
    assert said.startswith("LIVEPUSH_REDIS_URL") and f"parameter {named!r}" in said and "s3cret" not in said, said


def test_a_rediss_url_with_tls_options_is_accepted() -> None:
    """The same TLS option on a rediss:// URL, whose connections take it, is a setting like any other."""
    url = "rediss://127.0.0.1:6379/0?ssl_cert_reqs=none"
    assert Settings.from_env({"LIVEPUSH_FANOUT": "redis", "LIVEPUSH_REDIS_URL": url}).redis_url == url
