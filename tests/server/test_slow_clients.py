"""Clients that cannot keep up, through a real server and real sockets (docs/reference.md §8, slow
clients; §5, `reset`).

A client stops reading by pausing its transport, with a 4 KiB receive buffer: the kernel then
holds little for it, and what the server sends piles up in the server. On a state topic it
later gets the newest states only, ending with the final one; on a message topic, past its
topic's share, what follows is sent from history as it reads again, so it gets every message
without a `reset`; a client that stays behind is closed with 1013.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
from websockets.frames import Frame, Opcode

from livepush import jobs, metrics
from livepush.server import connection, core
from livepush.server.app import PushServer
from livepush.server.connection import Connection
from tests.server.conftest import Served, make_settings, start_served
from tests.support import pacing
from tests.support.http import upgrade_request
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient

PAD = "p" * 180  # in every checkpoint's name (at most 200 characters): ~600-byte frames


async def _same(i: int) -> int:
    return i


@jobs.job(name="t.slow.checkpoints", queue="slow-clients")
async def checkpoints(ctx: Any, n: int) -> int:
    """n checkpoints, each a new version of the job's state topic. With a reader set (pacing), each
    waits for the reader to get a frame after the one before: the server reads each version alone
    and sends it, where at its own pace it reads every few and sends the newest, more or fewer by
    the machine's load."""
    reader = pacing.READER
    for i in range(n):
        before = reader.count() if reader is not None else 0
        await ctx.checkpoint(f"step {i:04d} {PAD}", _same, i)
        if reader is not None:
            await asyncio.to_thread(reader.wait_past, before, 10.0)  # a hang guard: go on regardless
    return n


@jobs.job(name="t.slow.large_result", queue="slow-clients")
async def large_result(ctx: Any, n: int, size: int) -> str:
    """n checkpoints, then a result of `size` characters: a final state larger than a client may
    have waiting."""
    for i in range(n):
        await ctx.checkpoint(f"step {i:04d} {PAD}", _same, i)
    return "r" * size


@jobs.job(name="t.slow.member", queue="slow-clients")
async def paced_member(ctx: Any) -> None:
    """A group member. With a reader set (pacing), it first waits for the reader to get the group's
    state counting the members that ended before it: each member's end is a state of its own,
    where at its own pace the group's progress (rung at most every 100 ms) shows several at once."""
    reader = pacing.READER
    if reader is not None:
        ended = (await jobs.aget_group(ctx.group.id) or {}).get("succeeded", 0)
        if ended:
            await asyncio.to_thread(reader.wait_for, lambda data: data["group"]["succeeded"] >= ended,
                                    10.0)  # a hang guard: go on regardless


paced_flow = jobs.workflow("t_slow_flow", queue="slow-clients")


async def paced_step(ctx: Any) -> str:
    """A step that, with a reader set (pacing), waits for the reader to see it running: each step's
    start is a state of its own, where the run's steps at their own pace take milliseconds."""
    reader = pacing.READER
    if reader is not None:
        await asyncio.to_thread(reader.wait_for,
                                lambda data: data["workflow"]["steps"][ctx.step]["state"] == "running",
                                10.0)  # a hang guard: go on regardless
    return str(ctx.step)


@paced_flow.step()
async def first(ctx: Any) -> str:
    return await paced_step(ctx)


@paced_flow.step(after="first")
async def second(ctx: Any) -> str:
    return await paced_step(ctx)


@paced_flow.step(after="second")
async def third(ctx: Any) -> str:
    return await paced_step(ctx)


async def open_client(url: str, **kwargs: Any) -> WSClient:
    """A client whose socket receives into a 4 KiB buffer."""
    host, port = url.removeprefix("ws://").strip("/").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    return await WSClient.open(url, sock=sock, **kwargs)


def server_side(server: PushServer, client: WSClient) -> Connection:
    port = client.ws.local_address[1]
    return next(c for c in server.clients if c.remote_address[1] == port)


def count(action: str) -> float:
    return metrics.SLOW_CLIENT_ACTIONS.labels(action)._value.get()


# The bounds are the server's, whatever the fan-out: those tests run on the local one only; the
# resync from history runs on every fan-out (the `served` fixture's).
LOCAL_ONLY = pytest.mark.parametrize("fanout_kind", ["local"])


async def read_to_the_end(client: WSClient, counted: pacing.Frames | None = None,
                          final: str = "succeeded") -> list[dict[str, Any]]:
    """A client's frames up to a state topic's final state, the event `final` (a job's, unless
    told), each counted in `counted`."""
    frames: list[dict[str, Any]] = []
    while not frames or frames[-1]["data"].get("event") != final:
        frames.extend(await client.messages(1, timeout=30))
        if counted is not None:
            counted.got(frames[-1])
    return frames


async def slow_and_reader(url: str, signed_topic: str) -> tuple[WSClient, WSClient]:
    """Two clients subscribed to a state topic, each past its snapshot: one whose socket receives
    into a 4 KiB buffer (open_client), for a test to stop reading, and one that reads."""
    slow, reader = await open_client(url), await WSClient.open(url)
    for client in (slow, reader):
        assert (await client.subscribe(signed_topic))["op"] == "subscribed"
        assert (await client.messages(1))[0]["data"]["event"] == "snapshot"
    return slow, reader


async def drain_paced_by(reader: WSClient, final: str = "succeeded"
                         ) -> tuple[dict[str, int], asyncio.Future[list[dict[str, Any]]]]:
    """jobs.drain() of the slow-clients queue, whose jobs keep pace with `reader` (pacing), and the
    reading of its frames up to the state topic's event `final`, to await."""
    with pacing.paced() as frames:
        reading = asyncio.ensure_future(read_to_the_end(reader, frames, final))
        return await asyncio.to_thread(jobs.drain, ["slow-clients"]), reading


# The 20 s a client may miss a frame before it is closed (tested on its own above and below):
# on a loaded machine a job of 1,000 states can outlast it while the slow client does not read.
PATIENT = 300.0


async def test_a_client_that_stops_reading_on_a_job_gets_the_newest_states_then_the_final_one(
        served_jobs: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a job's state changes 1,000 times, a client that does not read falls behind; when it reads again it gets what its socket held, then only the newest states (at most 3, the older ones replaced where they waited), the last being the job's final state; versions only rise."""
    monkeypatch.setattr(connection, "BEHIND_SECONDS", PATIENT)
    handle = await checkpoints.aenqueue(1000)
    slow, reader = await slow_and_reader(served_jobs.url, handle.signed_topic)
    slow.ws.transport.pause_reading()
    conflated = count("conflated")
    metrics.TALLY.flush()
    delivered = metrics.DELIVERED._value.get()

    # The job keeps pace with the reader: the server sends about each of its 1,000 states, far
    # more than the slow client's kernel holds, whatever the load. At the server's own pace a
    # loaded machine sent 305 of them, too few to tell, and a lighter load fewer than the kernel
    # holds, with nothing left to replace.
    outcome, reading = await drain_paced_by(reader)
    assert outcome.get("succeeded") == 1, (outcome, await jobs.aget_job(handle.id))
    read = await asyncio.wait_for(reading, 30)
    await async_wait_for(lambda: count("conflated") > conflated, 10, message="the server to replace a waiting state")
    slow.ws.transport.resume_reading()
    got = await read_to_the_end(slow)

    versions = [int(f["offset"]) for f in got]
    assert versions == sorted(set(versions)), versions
    assert got[-1] == read[-1], "the final state, as the reader got it"
    assert got[-1]["data"]["job"]["state"] == "succeeded"
    # What the kernel held went out as it was; of everything after it, only the newest.
    held = next(i for i, (a, b) in enumerate(zip(got, read)) if a != b)
    print(f"a reader got {len(read)} states; the client that stopped reading got {len(got)}: {held} the "
          f"kernel held, then {len(got) - held} ({count('conflated') - conflated:.0f} replaced while waiting); "
          f"final version {versions[-1]}")
    assert len(got) - held <= 3, got[held:]
    assert len(read) - held >= 100, "too few states changed while the client did not read to tell"
    # livepush_delivered_total counts each state handed live to a connection, those a newer one
    # replaced while they waited too.
    metrics.TALLY.flush()
    replaced = count("conflated") - conflated
    assert metrics.DELIVERED._value.get() - delivered == len(read) + len(got) + replaced
    await slow.close()
    await reader.close()


async def test_a_client_a_little_behind_gets_the_final_state_of_a_job_with_a_large_result(
        served_jobs: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that fell behind by far less than 2 MiB while a job ran still gets the job's final
    state when it reads again (the final state always arrives), even when the job returned 3 MiB."""
    monkeypatch.setattr(connection, "BEHIND_SECONDS", PATIENT)
    handle = await large_result.aenqueue(1000, 3 * 1024 * 1024)
    slow, reader = await slow_and_reader(served_jobs.url, handle.signed_topic)
    slow.ws.transport.pause_reading()

    reading = asyncio.ensure_future(read_to_the_end(reader))
    outcome = await asyncio.to_thread(jobs.drain, ["slow-clients"])
    assert outcome.get("succeeded") == 1, (outcome, await jobs.aget_job(handle.id))
    read = await asyncio.wait_for(reading, 30)  # the server sent the final state to both in one turn
    slow.ws.transport.resume_reading()
    got = await read_to_the_end(slow)
    assert got[-1] == read[-1] and len(got[-1]["data"]["job"]["result"]) == 3 * 1024 * 1024
    await slow.close()
    await reader.close()


@pytest.mark.parametrize("kind", ["group", "workflow"])
async def test_a_client_that_stops_reading_on_a_group_or_a_run_gets_only_the_newest_state_the_final_one(
        served_jobs: Served, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """group:<id> and workflow:<id> are state topics as job:<id> is (the test above): a client that
    stops reading, a message larger than its socket takes waiting for it, while a group's members
    end (or a run's steps start), a state each, gets when it reads again that message, then one
    state only: the final one, as a reader that kept up got it. Every state before it was
    replaced where it waited; livepush_delivered_total counted each all the same."""
    monkeypatch.setattr(connection, "BEHIND_SECONDS", PATIENT)
    if kind == "group":
        async with jobs.agroup() as g:
            for _ in range(4):
                g.enqueue(paced_member)
        topic, signed = g.handle.topic, g.handle.signed_topic
    else:
        run = await paced_flow.astart({})
        topic, signed = run.topic, run.signed_topic
    slow, reader = await slow_and_reader(served_jobs.url, signed)
    # Behind a message larger than the socket takes, every later frame waits in the server at
    # once: a few states show here what the job's test above fills the kernel with states for.
    assert (await slow.subscribe(served_jobs.sign("room:ahead")))["op"] == "subscribed"
    slow.ws.transport.pause_reading()
    on_server = server_side(served_jobs.server, slow)
    await served_jobs.publish("room:ahead", {"pad": "x" * 900_000})
    await async_wait_for(lambda: on_server.paused, 5, message="the message to fill what the client's socket takes")
    conflated = count("conflated")
    metrics.TALLY.flush()
    delivered = metrics.DELIVERED._value.get()

    outcome, reading = await drain_paced_by(reader, final="finished")
    assert outcome == {"succeeded": 4 if kind == "group" else 3}, outcome
    read = await asyncio.wait_for(reading, 30)
    # Each member's end (each step's start) was a state of its own, then the final one.
    assert len(read) >= 4, [f["data"] for f in read]
    replaced = count("conflated") - conflated
    slow.ws.transport.resume_reading()
    got = await read_to_the_end(slow, final="finished")

    assert [f["topic"] for f in got] == ["room:ahead", topic], "what the socket held, then one state"
    assert got[-1] == read[-1], "the final state, as the reader got it"
    assert replaced == len(read) - 1, "every state before the final one was replaced where it waited"
    # Handed live: every state to the reader; to the slow client the final one and each it replaced.
    metrics.TALLY.flush()
    assert metrics.DELIVERED._value.get() - delivered == len(read) + 1 + replaced
    await slow.close()
    await reader.close()


async def offsets_read(client: WSClient, count: int) -> list[str]:
    """The offsets of the next `count` frames, each a message (no `reset`)."""
    got: list[str] = []
    while len(got) < count:
        frame = await client.recv()
        assert frame["op"] == "message", (frame, len(got))
        got.append(frame["offset"])
    return got


async def paused_past_its_share(served: Served, topic: str, count_sent: int) -> tuple[WSClient, list[str]]:
    """A client that stops reading while `count_sent` messages of 2 KB go out on `topic` (600 are
    far more than its share: live messages past its join buffer are dropped too, and the rest of
    the topic must come from history). Returns once the server reads on for it, which waits for
    it to read."""
    client = await open_client(served.url)
    assert (await client.subscribe(served.sign(topic)))["op"] == "subscribed"
    client.ws.transport.pause_reading()
    replayed = count("replayed")
    sent = [await served.publish(topic, {"n": n, "pad": "x" * 2000}) for n in range(count_sent)]
    await async_wait_for(lambda: count("replayed") > replayed, 5, message="the server to read on from history")
    return client, sent


async def test_a_client_that_stops_reading_on_a_message_topic_gets_every_message_once_it_reads_again(served: Served) -> None:
    """A client that does not read while 600 messages of 2 KB go out (more than a topic's share of what may wait for it) is neither reset nor closed: past the share, what follows waits in history; reading again within the slow-client bound, it gets every message, in order, none twice."""
    topic = "room:busy"
    slow = await open_client(served.url)
    assert (await slow.subscribe(served.sign(topic)))["op"] == "subscribed"
    slow.ws.transport.pause_reading()
    replayed = count("replayed")
    metrics.TALLY.flush()
    delivered = metrics.DELIVERED._value.get()
    sent = [await served.publish(topic, {"n": n, "pad": "x" * 2000}) for n in range(600)]
    await async_wait_for(lambda: count("replayed") > replayed, 5,
                         message="the server to send the rest from history")
    assert not server_side(served.server, slow).closing
    slow.ws.transport.resume_reading()

    assert await offsets_read(slow, len(sent)) == sent, "every message once, in order"
    metrics.TALLY.flush()
    live = metrics.DELIVERED._value.get() - delivered
    # livepush_delivered_total counts what was handed live (its share, which waited for it), not
    # what it then read from history.
    assert 1 <= live < len(sent), live
    await slow.close()


@pytest.mark.parametrize("fanout_kind", ["postgres", "redis"])
async def test_a_client_reading_promptly_gets_a_burst_past_its_topics_share_whole_without_reset(served: Served) -> None:
    """A loopback client reading as fast as it can, subscribed to a topic that gets one publish_many of 400 messages of 2 KB (more than a topic's share of what may wait for a client): it gets every message, in order, none twice, and no `reset`; past the share it read on from history."""
    topic = "room:burst"
    # Its 4 KiB receive buffer keeps the kernel from taking the burst in for it: with Linux's
    # autotuned one, a burst that reached the server in several reads could all fit, and the
    # share was then never passed.
    client = await open_client(served.url)
    assert (await client.subscribe(served.sign(topic)))["op"] == "subscribed"
    replayed = count("replayed")
    sent = await served.fanout.apublish_many([(topic, {"n": n, "pad": "x" * 2000}) for n in range(400)])

    assert await offsets_read(client, len(sent)) == sent, "every message once, in order"
    assert count("replayed") > replayed, "the burst never passed the topic's share: this test shows nothing"
    assert not server_side(served.server, client).closing
    await client.close()


def time_to_read_the_close(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that reads again after the server closed it has the socket's backed-up bytes to
    read before the close frame: given 1 s (the close timeout), a test process that a loaded
    machine stalls would find the connection aborted instead. What these tests check is the
    code the client then reads, not that timeout."""
    monkeypatch.setattr(core, "CLOSE_TIMEOUT", 15.0)


async def closed_as_too_slow(slow: WSClient, closed_before: float) -> None:
    """The server closed `slow` as too slow, once more than before, and `slow`, reading again,
    sees 1013."""
    assert count("closed") == closed_before + 1
    slow.ws.transport.resume_reading()
    assert await slow.closed_with(timeout=10) == 1013


@LOCAL_ONLY
async def test_a_client_that_stays_behind_is_closed_with_1013(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that reads nothing for longer than the server lets a frame wait (shortened to 0.5 s here) is closed with 1013 and counted; reading again, it sees the close code."""
    monkeypatch.setattr(connection, "BEHIND_SECONDS", 0.5)
    time_to_read_the_close(monkeypatch)
    topic = "room:stuck"
    slow = await open_client(served.url)
    assert (await slow.subscribe(served.sign(topic)))["op"] == "subscribed"
    slow.ws.transport.pause_reading()
    on_server = server_side(served.server, slow)
    closed = count("closed")
    for n in range(200):  # 400 KB: more than its socket holds, less than the backlog's byte bound
        await served.publish(topic, {"n": n, "pad": "x" * 2000})
    await async_wait_for(lambda: on_server.closing, 5, message="the server to close the client")
    assert count("closed") == closed + 1
    slow.ws.transport.resume_reading()
    assert await slow.closed_with(timeout=5) == 1013


@LOCAL_ONLY
async def test_a_client_with_too_much_waiting_is_closed_with_1013(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that does not read on 12 busy topics holds more than the backlog's byte bound: it is closed with 1013 at once, without waiting for the time bound."""
    time_to_read_the_close(monkeypatch)
    slow = await open_client(served.url)
    names = [f"room:many-{i}" for i in range(12)]
    for name in names:
        assert (await slow.subscribe(served.sign(name)))["op"] == "subscribed"
    slow.ws.transport.pause_reading()
    on_server = server_side(served.server, slow)
    for _ in range(6):
        for name in names:
            await served.publish(name, {"pad": "x" * 40_000})
    # Well before the time bound (BEHIND_SECONDS): the byte bound closed it.
    await async_wait_for(lambda: on_server.closing, 5, message="the server to close the client")
    assert not on_server.backlog_bytes, "what waited for it is let go"
    slow.ws.transport.resume_reading()
    assert await slow.closed_with(timeout=5) == 1013
    assert connection.BACKLOG_BYTES < 12 * 6 * 40_000


@LOCAL_ONLY
async def test_a_client_that_pings_and_does_not_read_is_closed_with_1013(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server answers a client's every ping; one that pings and never reads the pongs is
    closed with 1013 once more than the backlog's byte bound waits for it, not held for ever."""
    time_to_read_the_close(monkeypatch)
    # The frame budget reads such a client at its rate (200 pings a second: 2 MiB of pongs in
    # over a minute); set aside here, where the bound on what waits is under test.
    monkeypatch.setattr(connection, "FRAME_SECONDS", 0.0)
    monkeypatch.setattr(connection, "FRAME_BYTE_SECONDS", 0.0)
    slow = await open_client(served.url)
    slow.ws.transport.pause_reading()
    on_server = server_side(served.server, slow)
    closed = count("closed")
    pad = b"p" * 117  # 125-byte pings: the most a control frame carries
    for i in range(4 * connection.BACKLOG_BYTES // 125):  # pongs of twice the bound, and more
        if on_server.closing:
            break
        await slow.ws.ping(i.to_bytes(8, "big") + pad)
    await async_wait_for(lambda: on_server.closing, 5, message="the server to close the client")
    await closed_as_too_slow(slow, closed)


@LOCAL_ONLY
async def test_a_client_that_stops_reading_its_replay_and_pings_is_closed_with_1013(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that subscribes with `since`, reads nothing of its replay, and keeps pinging (so
    that it never looks dead) is closed with 1013 once the replay has waited for it longer than
    the server lets a frame wait (shortened to 0.5 s here), as it would be for a live frame."""
    monkeypatch.setattr(connection, "BEHIND_SECONDS", 0.5)
    time_to_read_the_close(monkeypatch)
    topic = "room:unread-replay"
    since = await served.fanout.alatest_offset(topic)
    # One message larger than the socket and the transport's high-water mark take: the replay
    # waits for the client with nothing in the connection's queue.
    await served.publish(topic, {"pad": "x" * 900_000})
    slow = await open_client(served.url)
    on_server = server_side(served.server, slow)
    slow.ws.transport.pause_reading()
    closed = count("closed")
    await slow.send({"op": "subscribe", "topic": served.sign(topic), "since": since, "ref": "r"})
    await async_wait_for(lambda: on_server.paused, 5, message="the replay to wait for the client")
    deadline = asyncio.get_running_loop().time() + 5
    while not on_server.closing and asyncio.get_running_loop().time() < deadline:
        await slow.ws.ping()  # alive: the server hears from it all along
        await asyncio.sleep(0.1)
    assert on_server.closing, "a client that never reads its replay is held for ever"
    await closed_as_too_slow(slow, closed)


@LOCAL_ONLY
async def test_a_client_that_never_reads_with_topics_past_their_share_and_a_replay_waiting_is_closed_with_1013(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that stops reading while its subscribe's replay waits for it, and two of its
    topics then pass their share (each read on from history once it reads: three waits for the
    client at once), is closed with 1013 within the time the server lets a frame wait (shortened
    to 0.5 s here), not held while the waits take turns."""
    monkeypatch.setattr(connection, "BEHIND_SECONDS", 0.5)
    time_to_read_the_close(monkeypatch)
    busy = ["room:share-a", "room:share-b"]
    replayed_topic = "room:share-replay"
    since = await served.fanout.alatest_offset(replayed_topic)
    await served.publish(replayed_topic, {"pad": "x" * 900_000})  # more than the socket takes
    slow = await open_client(served.url)
    for name in busy:
        assert (await slow.subscribe(served.sign(name)))["op"] == "subscribed"
    on_server = server_side(served.server, slow)
    slow.ws.transport.pause_reading()
    closed, replayed = count("closed"), count("replayed")
    await slow.send({"op": "subscribe", "topic": served.sign(replayed_topic), "since": since, "ref": "r"})
    await async_wait_for(lambda: on_server.paused, 5, message="the replay to wait for the client")
    stopped = asyncio.get_running_loop().time()
    for name in busy:  # 300 KB each: past a topic's share
        await served.fanout.apublish_many([(name, {"n": n, "pad": "x" * 2000}) for n in range(150)])
    await async_wait_for(lambda: count("replayed") >= replayed + 2 or on_server.closing, 5,
                         message="the topics to pass their share")
    assert count("replayed") >= replayed + 2, "the topics never passed their share: this test shows nothing"
    assert on_server.closing or all(served.server.hub.joining(on_server, name) for name in [*busy, replayed_topic])
    await async_wait_for(lambda: on_server.closing, 5, message="the server to close the client")
    took = asyncio.get_running_loop().time() - stopped
    # The bound, the sweep's period, and room for a loaded machine: far below a clock started again.
    assert took < connection.BEHIND_SECONDS + 1.5, f"closed {took:.2f} s after it stopped reading"
    await closed_as_too_slow(slow, closed)


@LOCAL_ONLY
async def test_a_client_reading_its_replay_slowly_gets_it_whole_and_is_not_closed(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client on a slow link (4 KiB read every 50 ms) takes a replay of one 300 KB message,
    several times as long as the server lets a frame wait (shortened to 0.5 s here): it is
    reading all along, so it gets the message whole and is not closed."""
    monkeypatch.setattr(connection, "BEHIND_SECONDS", 0.5)
    topic = "room:slow-link"
    since = await served.fanout.alatest_offset(topic)
    offset = await served.publish(topic, {"pad": "x" * 300_000})
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    port = served.server.port
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    try:
        writer.write(upgrade_request(port))
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 101")
        subscribe = {"op": "subscribe", "topic": served.sign(topic), "since": since, "ref": "r"}
        writer.write(Frame(Opcode.TEXT, json.dumps(subscribe).encode()).serialize(mask=True))
        got = b""
        started = asyncio.get_running_loop().time()
        while offset.encode() not in got or not got.endswith(b"}"):
            got += await asyncio.wait_for(reader.read(4096), 5)
            await asyncio.sleep(0.05)
        took = asyncio.get_running_loop().time() - started
        assert took > 2 * connection.BEHIND_SECONDS, f"read in {took:.2f} s: not slow enough to tell"
        assert got.count(b'"op":"message"') == 1 and b"x" * 300_000 in got
        assert b"\x88" not in got[:2], "closed"
    finally:
        writer.close()


@LOCAL_ONLY
async def test_an_unsubscribe_sent_during_a_replay_ends_it(served: Served) -> None:
    """A client that subscribes with `since` to a topic of 500 messages (1 MB), reads little of
    the replay and unsubscribes: the unsubscribe takes effect at once, not once the client has
    read the whole replay; the replay stops, and a ping sent after it is answered after the
    `subscribed` and at most the replay's pages already sent."""
    topic = "room:unwanted-replay"
    since = await served.fanout.alatest_offset(topic)
    for n in range(500):
        await served.publish(topic, {"n": n, "pad": "x" * 2000})
    slow = await open_client(served.url)
    on_server = server_side(served.server, slow)
    slow.ws.transport.pause_reading()
    await slow.send({"op": "subscribe", "topic": served.sign(topic), "since": since, "ref": "r"})
    await async_wait_for(lambda: on_server.paused, 5, message="the replay to wait for the client")
    await slow.send({"op": "unsubscribe", "topic": served.sign(topic)})
    await slow.send({"op": "ping", "ref": "after"})
    await async_wait_for(lambda: topic not in on_server.topics, 5,
                         message="the unsubscribe to take effect while the replay waits")
    slow.ws.transport.resume_reading()
    ops = []
    while not ops or ops[-1] != "pong":
        ops.append((await slow.recv(timeout=10))["op"])
    assert ops[0] == "subscribed" and set(ops[1:-1]) == {"message"}, ops
    assert len(ops) - 2 < 500, "the replay stopped at the unsubscribe"
    # Nor does the subscribe, once its replay stopped, join the topic's live stream.
    await served.publish(topic, {"n": "live"})
    await slow.send({"op": "ping", "ref": "later"})
    assert (await slow.recv(timeout=10)) == {"op": "pong", "ref": "later"}
    assert not on_server.closing
    await slow.close()


async def unsubscribe_during_a_history_read(served: Served, monkeypatch: pytest.MonkeyPatch, topic: str, since: str,
                                            held: int, fails: bool = False) -> tuple[WSClient, Connection]:
    """A client subscribed to `topic` from `since` whose unsubscribe, and a ping after it, are
    sent while the replay's `held`-th history read is under way, held until the unsubscribe
    has taken effect; that read then answers (or, `fails`, raises)."""
    reading, release = asyncio.Event(), asyncio.Event()
    history = served.fanout.history
    calls = 0

    async def held_history(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == held:
            reading.set()
            await asyncio.wait_for(release.wait(), 10)
            if fails:
                raise RuntimeError("the store went away")
        return await history(*args, **kwargs)

    monkeypatch.setattr(served.fanout, "history", held_history)
    client = await WSClient.open(served.url)
    on_server = server_side(served.server, client)
    await client.send({"op": "subscribe", "topic": served.sign(topic), "since": since, "ref": "r"})
    await asyncio.wait_for(reading.wait(), 10)
    await client.send({"op": "unsubscribe", "topic": topic})
    await client.send({"op": "ping", "ref": "after"})
    await async_wait_for(lambda: topic not in on_server.topics, 5,
                         message="the unsubscribe to take effect while the history is read")
    release.set()
    return client, on_server


@LOCAL_ONLY
async def test_an_unsubscribe_sent_while_the_replay_is_first_read_sends_none_of_it(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unsubscribe that comes while the replay's first page is still being read from history
    ends the replay too: the subscribe is answered (`subscribed`), then nothing more of the topic,
    not the whole replay of 500 messages the client no longer wants."""
    topic = "room:unwanted-before-read"
    since = await served.fanout.alatest_offset(topic)
    for n in range(500):
        await served.publish(topic, {"n": n, "pad": "x" * 2000})
    client, _ = await unsubscribe_during_a_history_read(served, monkeypatch, topic, since, held=1)
    ops = []
    while not ops or ops[-1] != "pong":
        ops.append((await client.recv(timeout=10))["op"])
    assert ops == ["subscribed", "pong"], f"{len(ops) - 2} frames after the unsubscribe"
    await client.close()


@LOCAL_ONLY
async def test_a_replay_that_fails_after_the_client_unsubscribed_does_not_close_the_connection(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay whose next page cannot be read fails after its `subscribed`, which closes the
    connection (1011) so that the client resumes: but not once the client has unsubscribed from
    the topic while that page was read. It wants nothing more of it, and its other topics would
    all reconnect for nothing; the connection goes on."""
    topic = "room:abandoned-replay"
    since = await served.fanout.alatest_offset(topic)
    for n in range(1200):  # more than a page of history
        await served.publish(topic, {"n": n})
    client, on_server = await unsubscribe_during_a_history_read(served, monkeypatch, topic, since, held=2, fails=True)
    frame: dict[str, Any] = {}
    while frame.get("op") != "pong":
        frame = await client.recv(timeout=10)
    assert frame == {"op": "pong", "ref": "after"}
    assert not on_server.closing
    await client.close()


async def test_an_unsubscribe_sent_while_a_snapshot_waits_for_the_client_takes_effect_at_once(
        served_jobs: Served) -> None:
    """A client that subscribes to a finished job whose state (a 3 MiB result) it does not read,
    then unsubscribes: the unsubscribe takes effect at once, as during a replay, not once the
    client has read the snapshot it no longer wants; the ping after it is answered after it."""
    handle = await large_result.aenqueue(0, 3 * 1024 * 1024)
    outcome = await asyncio.to_thread(jobs.drain, ["slow-clients"])
    assert outcome.get("succeeded") == 1, outcome
    slow = await open_client(served_jobs.url)
    on_server = server_side(served_jobs.server, slow)
    slow.ws.transport.pause_reading()
    await slow.send({"op": "subscribe", "topic": handle.signed_topic, "since": None, "ref": "r"})
    await async_wait_for(lambda: on_server.paused, 5, message="the snapshot to wait for the client")
    await slow.send({"op": "unsubscribe", "topic": handle.topic})
    await slow.send({"op": "ping", "ref": "after"})
    await async_wait_for(lambda: handle.topic not in on_server.topics, 5,
                         message="the unsubscribe to take effect while the snapshot waits")
    slow.ws.transport.resume_reading()
    ops = [(await slow.recv(timeout=20))["op"] for _ in range(3)]
    assert ops == ["subscribed", "message", "pong"], ops
    assert not on_server.closing
    await slow.close()


@LOCAL_ONLY
async def test_a_replay_to_a_client_that_fell_behind_arrives_whole_once_it_reads(served: Served) -> None:
    """A client that stopped reading (frames waiting for it on a busy topic) subscribes with `since` to a topic of 2,500 messages, more arriving live meanwhile: once it reads again it gets `subscribed`, then every message of that topic exactly once, in order; the replay's pages waited for it."""
    busy, kept = "room:busy", "room:kept"
    since = await served.fanout.alatest_offset(kept)
    sent = [await served.publish(kept, {"n": n}) for n in range(2500)]
    slow = await open_client(served.url)
    assert (await slow.subscribe(served.sign(busy)))["op"] == "subscribed"
    slow.ws.transport.pause_reading()
    on_server = server_side(served.server, slow)
    for n in range(300):
        await served.publish(busy, {"n": n, "pad": "x" * 2000})
    await async_wait_for(lambda: on_server.backlog_bytes, 5, message="frames to wait for the client")
    await slow.send({"op": "subscribe", "topic": served.sign(kept), "since": since, "ref": "kept"})
    await async_wait_for(lambda: kept in on_server.topics, 5, message="the server to take the subscribe")
    sent += [await served.publish(kept, {"n": n}) for n in range(2500, 2600)]
    slow.ws.transport.resume_reading()

    got: list[str] = []
    answered = False
    while not got or got[-1] != sent[-1]:
        frame = await slow.recv()
        if frame.get("topic") != kept:
            continue
        if frame["op"] == "subscribed":
            answered = True
            continue
        assert answered and frame["op"] == "message", frame
        got.append(frame["offset"])
    assert got == sent
    assert not on_server.closing
    await slow.close()


async def test_a_client_resuming_many_topics_at_once_gets_every_replay_and_is_not_closed(served: Served) -> None:
    """A client that comes back with `since` on 12 topics, each with ~200 KiB missed (together more than a client may have waiting), sends its subscribes at once and reads as fast as it can: it gets every missed message of every topic, in order, and is never closed as too slow; each replay waited for it to read what came before."""
    names = [f"room:resume{k}" for k in range(12)]
    since = {name: await served.fanout.alatest_offset(name) for name in names}
    sent = {name: [await served.publish(name, {"n": n, "pad": "x" * 20_000}) for n in range(10)] for name in names}
    client = await open_client(served.url)
    for name in names:
        await client.send({"op": "subscribe", "topic": served.sign(name), "since": since[name], "ref": name})
    got: dict[str, list[str]] = {name: [] for name in names}
    while any(len(got[name]) < len(sent[name]) for name in names):
        frame = await client.recv(timeout=10)
        assert frame["op"] in ("subscribed", "message"), frame
        if frame["op"] == "message":
            got[frame["topic"]].append(frame["offset"])
    assert got == sent
    assert not server_side(served.server, client).closing
    await client.close()


async def test_a_client_subscribing_to_finished_jobs_with_large_results_gets_their_snapshots(served_jobs: Served) -> None:
    """A client that subscribes at once to two finished jobs that each returned 3 MiB, and pings meanwhile, gets both final states as snapshots and its pong, and is not closed as too slow: a state a client must get does not count towards the 2 MiB, whether it waits in the server's queue or in the socket's buffer."""
    handles = [await large_result.aenqueue(0, 3 * 1024 * 1024) for _ in range(2)]
    outcome = await asyncio.to_thread(jobs.drain, ["slow-clients"])
    assert outcome.get("succeeded") == 2, outcome
    client = await open_client(served_jobs.url)
    for handle in handles:
        await client.send({"op": "subscribe", "topic": handle.signed_topic, "since": None, "ref": handle.id})
        await client.send({"op": "ping", "ref": handle.id})
    frames = [await client.recv(timeout=20) for _ in range(6)]
    assert [f["op"] for f in frames] == ["subscribed", "message", "pong"] * 2, [f["op"] for f in frames]
    snapshots = [f["data"] for f in frames if f["op"] == "message"]
    assert [s["event"] for s in snapshots] == ["snapshot", "snapshot"]
    assert [len(s["job"]["result"]) for s in snapshots] == [3 * 1024 * 1024] * 2
    assert not server_side(served_jobs.server, client).closing
    await client.close()


async def test_a_client_subscribing_to_many_finished_jobs_at_once_gets_every_snapshot_and_is_not_closed(
        served_jobs: Served) -> None:
    """A page that watches 16 finished jobs, each with a ~200 KiB result (together more than a
    client may have waiting), sends its subscribes at once and reads them as fast as its link
    allows (here 200 KiB every 20 ms): it gets every job's final state as a snapshot and is never
    closed as too slow; each snapshot waited for it to read what came before, as a replay does."""
    handles = [await large_result.aenqueue(0, 200 * 1024) for _ in range(16)]
    outcome = await asyncio.to_thread(jobs.drain, ["slow-clients"])
    assert outcome.get("succeeded") == 16, outcome
    # One frame held at a time: the client takes the next one off its socket only once it has
    # read the last, so its pace is that of its reads.
    client = await open_client(served_jobs.url, max_queue=1)
    for handle in handles:
        await client.send({"op": "subscribe", "topic": handle.signed_topic, "since": None, "ref": handle.id})
    got: dict[str, str] = {}
    while len(got) < len(handles):
        frame = await client.recv(timeout=10)
        assert frame["op"] in ("subscribed", "message"), frame
        if frame["op"] == "message":
            got[frame["topic"]] = frame["data"]["job"]["state"]
            await asyncio.sleep(0.02)
    assert got == {handle.topic: "succeeded" for handle in handles}
    assert not server_side(served_jobs.server, client).closing
    await client.close()


async def test_a_client_reading_on_after_history_expired_gets_the_messages_that_waited_without_reset(
        pg_url: str, secret: str) -> None:
    """A client past its share, whose place in history expires before it reads again, but whose
    live messages since all waited for it (fewer than a share): those cover what history no longer
    holds, so it gets every message, in order, none twice, and no `reset` (nothing to refetch)."""
    served = await start_served(make_settings("postgres", secret, pg_url, None, history_ttl=1.0))
    try:
        topic = "room:expired-read-on"
        slow = await open_client(served.url)
        assert (await slow.subscribe(served.sign(topic)))["op"] == "subscribed"
        slow.ws.transport.pause_reading()
        replayed = count("replayed")
        sent: list[str] = []
        while count("replayed") == replayed and len(sent) < 2000:
            sent.append(await served.publish(topic, {"n": len(sent), "pad": "x" * 1000}))
        await async_wait_for(lambda: count("replayed") > replayed, 5, message="the server to read on from history")
        sent += [await served.publish(topic, {"n": len(sent) + n, "pad": "x" * 1000}) for n in range(50)]

        async def expired() -> bool:
            await served.fanout.prune()
            return await served.fanout.history(topic, sent[-2]) is None  # its last message is gone too

        await async_wait_for(expired, 10, message="the topic's history to expire")

        slow.ws.transport.resume_reading()
        assert await offsets_read(slow, len(sent)) == sent, "every message once, in order, no reset"
        assert not server_side(served.server, slow).closing
        await slow.close()
    finally:
        await served.stop()
