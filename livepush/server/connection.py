"""One client connection: websockets' sans-I/O ServerProtocol under an asyncio.Protocol.

No task and no timer of its own (but while past its frame budget, limits.FRAME_SECONDS: the
timer that reads it again). Bytes in go `data_received` -> `ServerProtocol.receive_data` ->
its events -> `protocol.parse` (once a frame) -> `PushServer.on_frame`; a subscribe (the hub reads) runs in a short-lived task
while the connection's next frames wait for it (but an unsubscribe of the topic it replays, sent
next: `PushServer.served_at_once`). Bytes out are whole frames written to the
transport: a broadcast frame is encoded once (`frames.text`) and the same bytes object goes to
every subscriber; only the close handshake goes through the protocol, so its state stays right.
Keepalive pings, the open and close timeouts and the slow-client time bound are the sweep's
(`core.ConnectionCore`).

Writes never await. While a client keeps up, its frames of one turn of the event loop are
gathered and written together at the end of that turn (`ConnectionCore.cork`): a burst of
messages costs a client one write (one system call) per CORK_BYTES, not one per frame; a lone
frame waits no longer than the loop takes to come round. Whatever else is written (a pong, a
close frame, a replay page being drained) first writes what is gathered, so frames keep their
order. Once the transport is past its high-water mark (paused), frames wait in the client's
backlog (backlog.py: a state replaces the older one of its topic, a message topic's share is
bounded: past it the client reads on from the topic's history, or gets `reset` where history
cannot serve it), which `resume_writing` empties in order. A
client whose backlog passes BACKLOG_BYTES (counting the pongs that wait in the transport for a
client that pings and does not read; not counting its largest waiting state), or that has been missing a frame for BEHIND_SECONDS
(a replay's next page, which waits in `drain()` for it to read, included), is closed with 1013. A slow client costs the others nothing: a frame for it is one append
(docs/reference.md#8-trust-boundaries-and-abuse).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Iterable
from typing import Any, Protocol

from websockets.exceptions import (ConnectionClosed, ConnectionClosedError, HeaderLineTooLong, InvalidMessage,
                                   RequestLineTooLong, TooManyHeaders)
from websockets.frames import BINARY, CONT, TEXT, CloseCode, Frame
from websockets.http11 import Response
from websockets.protocol import OPEN
from websockets.server import ServerProtocol

from .. import metrics, protocol
from . import frames, http
from .backlog import Backlog, Kind
from .limits import (FRAME_BUDGET_SECONDS, FRAME_BYTE_SECONDS, FRAME_HEAD_BYTES, FRAME_RESUME_SECONDS, FRAME_SECONDS,
                     TokenBucket)

log = logging.getLogger("livepush.server")

# The kernel's send buffer per connection (Linux doubles it). Left to autotuning it grows to
# megabytes for a client that does not read, where no frame can be replaced or dropped.
SOCKET_SEND_BUFFER = 64 * 1024
# The transport's high-water mark: past it, frames wait in the backlog (websockets' default
# write limit; the low-water mark is asyncio's, a quarter of it).
WRITE_HIGH = 32 * 1024
# Frames gathered for one write at the end of a turn of the loop, at most: past it they are
# written at once, so that a burst meets the high-water mark and the slow-client rules as before.
CORK_BYTES = 16 * 1024
# A client whose waiting frames pass this many bytes, or that has been missing a frame this
# long, is too far behind: closed with 1013.
BACKLOG_BYTES = 2 * 1024 * 1024
BEHIND_SECONDS = 20.0
# Only if serving a frame fails unexpectedly (a bug): the client reconnects rather than miss
# frames without knowing.
CLOSE_INTERNAL_ERROR = 1011

# Frames a client may send while its subscribe is being served before its reads are paused.
INBOX_FRAMES = 16

# What of a read the protocol parses at once: a read past the frame budget waits as the bytes it
# came in, not as parsed frames. A read holds up to 256 KiB, some 43,000 of the smallest frames (6
# bytes), and each waited parsed as an object of about 130 bytes for the minutes the budget took
# to serve them. At most 341 frames, fewer than the budget saves (limits.FRAME_BUDGET_SECONDS).
FEED_BYTES = 2048

# The longest unfinished request head line held back from the parser while the head is scanned
# for its end (websockets refuses a longer one whatever it holds).
LINE_KEPT = 8 * 1024

# What websockets' parser refuses a request head for with its own 414 or 431.
HEAD_TOO_LARGE = (RequestLineTooLong, HeaderLineTooLong, TooManyHeaders)

# The bytes a request line may begin with: those of a method, a token (RFC 9110 §5.6.2).
METHOD_BYTES = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


class Server(Protocol):
    """What a connection asks of the server (app.PushServer)."""

    def on_frame(self, client: Connection, cmd: protocol.Command) -> Awaitable[None] | None: ...

    def served_at_once(self, client: Connection, cmd: protocol.Command) -> bool:
        """Whether a frame that came while a subscribe is served, with none waiting before it,
        was served at once (it must not wait for that subscribe)."""

    def overflowed(self, client: Connection, topic: str) -> bool:
        """Whether the client's frames of message topic `topic`, past its share of the backlog,
        are sent from the topic's history from now on (False: the backlog queues `reset`)."""


class Core(Protocol):
    """What a connection asks of its core (core.ConnectionCore): the clock and the sweep's sets."""

    @property
    def server(self) -> Server: ...  # read only: the core's own server is more than this one

    now: float
    behind: set[Connection]

    def new_protocol(self) -> ServerProtocol: ...

    def opened_tcp(self, conn: Connection) -> None: ...

    def is_opening(self, conn: Connection) -> bool: ...

    def request_received(self, conn: Connection, events: list[Any]) -> None: ...

    def expect_close(self, conn: Connection) -> None: ...

    def lost(self, conn: Connection) -> None: ...

    def cork(self, conn: Connection) -> None:
        """Call conn.uncork() at the end of this turn of the loop."""


class Connection(asyncio.Protocol):
    """One connection's state: what cannot be derived, nothing more."""

    __slots__ = ("core", "transport", "proto", "session", "topics", "closing", "paused", "out", "backlog", "seen",
                 "ping_at", "deadline", "stalled", "busy", "inbox", "partial", "line", "lengths", "start", "early",
                 "pongs", "budget_at", "held", "unfed", "refill", "_bad", "_subscribes", "_waiter")

    def __init__(self, core: Core) -> None:
        self.core = core
        self.transport: Any = None
        self.proto = core.new_protocol()
        self.session: Any = None
        self.topics: set[str] = set()  # plain topics this client is subscribed to
        self.closing = False  # a close started or happened: nothing more is written
        self.paused = False  # the transport is over its high-water mark
        self.out: bytes | bytearray | None = None  # frames of this turn of the loop, written at its end
        self.backlog: Backlog | None = None  # frames waiting while the transport is paused
        self.seen = core.now  # the sweep's clock when data last came from the peer
        self.ping_at = 0.0  # when the sweep's unanswered ping went (0: none)
        self.deadline = 0.0  # the open or close timeout, while the sweep watches one
        # While drain() waits for the peer: since when (time.monotonic()) it has taken nothing, and
        # the bytes then waiting in the transport (None: drain() is not waiting).
        self.stalled: tuple[float, int] | None = None
        self.busy: asyncio.Task[None] | None = None  # the subscribe being served
        self.inbox: list[protocol.Command] | None = None  # frames that wait for it, parsed
        self.partial: bytearray | None = None  # a fragmented message so far (opcode in its first byte)
        self.line: bytes | None = None  # the request head's unfinished line so far (None: nothing of it yet)
        self.lengths = b""  # the request's Content-Length values (plain where lengths), each followed by a comma
        self.start = b""  # the request's first 5 bytes until it is read: `HEAD ` for a HEAD, whose answer has no body
        self.early: bytearray | None = None  # what came after the request head, until it is answered
        self.pongs = 0  # bytes flush() wrote while the transport was paused, since it last resumed
        # The frame budget (limits.FRAME_SECONDS): the loop's time at which what this client sent
        # is paid for; it may run FRAME_BUDGET_SECONDS ahead of the clock, no more.
        self.budget_at = 0.0
        self.held: list[Any] | None = None  # frames past the budget, read and not served yet
        self.unfed: bytes | None = None  # and what came after them, not parsed yet (only while held)
        self.refill: asyncio.TimerHandle | None = None  # serves them once the budget is back
        self._bad: protocol.BadFrameWindow | None = None
        self._subscribes: TokenBucket | None = None
        self._waiter: asyncio.Future[None] | None = None  # drain(): more was written

    # -- what app.py and the hub use ------------------------------------------------------------
    @property
    def subject(self) -> str | None:
        return getattr(self.session, "subject", None)

    @property
    def bad_frames(self) -> protocol.BadFrameWindow:
        if self._bad is None:
            self._bad = protocol.BadFrameWindow()
        return self._bad

    @property
    def subscribes(self) -> TokenBucket:
        if self._subscribes is None:
            self._subscribes = TokenBucket()
        return self._subscribes

    @property
    def unread(self) -> bool:
        """Whether the server has stopped reading this peer (INBOX_FRAMES wait for its subscribe,
        or frames past its budget wait for it to refill): its pongs then wait unread, and only its
        taking what is sent shows it alive."""
        return (self.held is not None or self.unfed is not None
                or (self.inbox is not None and len(self.inbox) >= INBOX_FRAMES))

    @property
    def backlog_bytes(self) -> int:
        """Bytes of the frames waiting for this client (0 while it keeps up)."""
        return self.backlog.bytes if self.backlog is not None else 0

    def behind_since(self) -> float | None:
        """Since when (time.monotonic()) this client has been missing a frame: one in its backlog,
        or a replay's next page while drain() waits for it and it takes nothing; None while it
        keeps up. A client that takes what waits in the transport, however slowly (a large state
        on a slow link), is reading: its replay's clock starts again from now."""
        since = self.backlog.behind_since() if self.backlog is not None else None
        if self.stalled is not None:
            at, unsent = self.stalled
            now_unsent = self.transport.get_write_buffer_size()
            if now_unsent < unsent:
                at = time.monotonic()
                self.stalled = (at, now_unsent)
            if since is None or at < since:
                return at
        return since

    @property
    def remote_address(self) -> Any:
        return self.transport.get_extra_info("peername") if self.transport is not None else None

    def send(self, frame: str) -> None:
        push(self, frames.text(frame.encode()))

    def overflowed(self, topic: str) -> bool:
        """The backlog's question when a message topic passes its share (Server.overflowed)."""
        return self.core.server.overflowed(self, topic)

    def close(self, code: int, reason: str = "") -> None:
        """Start the close handshake (safe from any callback on the loop); the sweep ends it
        after the close timeout if the client does not answer."""
        if self.closing:
            return
        self.uncork()  # what was sent before the close goes before the close frame
        unfed = self.unfed
        self._stop_writing()
        if unfed is not None:
            self._parse_only(unfed)
        if self.proto.state is OPEN:
            self.proto.send_close(code, reason)
            self.flush()
        elif unfed is not None:
            self.flush()  # the client's own close was among them (or a frame the protocol fails on): its answer

    async def drain(self) -> None:
        """Until the client has read what was sent to it so far, but for a little (between
        replay pages); raises ConnectionClosed once the client is being closed."""
        self.uncork()  # written now, so that the transport tells whether the client keeps up
        backlog = self.backlog
        if backlog is not None:
            place = backlog.last
            while self.backlog is backlog and not backlog.passed(place):
                await self._written()
        while self.paused and not self.closing:
            if self.stalled is None:
                # The replay's next frames wait for the peer as queued ones would, only in the
                # log: the slow-client time bound watches them too, or a client that pings and
                # never reads its replay would hold it (and its frames unread) for ever.
                self.stalled = (time.monotonic(), self.transport.get_write_buffer_size())
                self.core.behind.add(self)
            await self._written()
        self.stalled = None
        if self.closing:
            raise ConnectionClosedError(None, None)

    # -- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(WRITE_HIGH)
        bound_send_buffer(transport)
        self.core.opened_tcp(self)

    def data_received(self, data: bytes) -> None:
        self.seen = self.core.now
        self.ping_at = 0.0  # any data answers the sweep's ping
        if self.core.is_opening(self):
            if self.early is not None:  # the request is in and not answered yet
                self.early += data
                return
            if self.line is None:  # nothing of the request yet: empty lines before it are ignored
                data = data.lstrip(b"\r\n")  # (RFC 9112 §2.2)
                if not data:
                    return
                if data[0] not in METHOD_BYTES:
                    self._answer_no_request()
                    return
            data = self._up_to_request_end(data)
            proto = self.proto
            proto.receive_data(data)
            events = proto.events_received()
            if not events and not self.closing:
                if isinstance(proto.handshake_exc, InvalidMessage):
                    self._answer_unreadable(proto.handshake_exc.__cause__)
                elif isinstance(proto.handshake_exc, HEAD_TOO_LARGE):
                    self._answer_too_large(proto.handshake_exc)
            self.flush()  # a handshake refused by the parser
            if events:
                self.start = b""  # the parser read the request: only a refusal before that needs it
                self.core.request_received(self, events)
            return
        if self.held is not None:  # read before its reads paused: it comes after what waits
            self.unfed = data if self.unfed is None else self.unfed + data
            return
        self._feed(data)
        if self.held is not None:  # (not each refill of one pause: it stays paused through them)
            metrics.FRAME_BUDGET_PAUSES.inc()

    def _feed(self, data: bytes) -> None:
        """Parse and serve `data`, FEED_BYTES at a time: once a part takes the client past its
        budget, the rest waits unparsed in `unfed` until the frames held are served (_refilled)."""
        proto = self.proto
        # Bytes fed since the last part that completed a frame: charged with the next one, as a
        # read's bytes are charged whole when it holds a frame (a large frame spans many parts).
        uncharged = 0
        charged = False
        for at in range(0, len(data), FEED_BYTES):
            part = data[at:at + FEED_BYTES] if len(data) > FEED_BYTES else data
            proto.receive_data(part)
            uncharged += len(part)
            events = proto.events_received()
            self._serve_events(events, uncharged)
            if events:
                uncharged, charged = 0, True
            if self.held is not None:
                rest = data[at + FEED_BYTES:]
                if rest:
                    self.unfed = rest
                return
        if charged and uncharged:  # the start of a frame the next read ends
            self.budget_at += uncharged * FRAME_BYTE_SECONDS

    def _serve_events(self, events: list[Any], size: int) -> None:
        """Serve the frames parsed of `size` bytes the client sent, within its budget."""
        proto = self.proto
        # The messages first, then what the protocol answers (pongs, a close answered, an error's
        # close, the EOF after it): a close that came in the same read as messages ends the
        # connection after their answers. Flushed first, the EOF went before them, and the next
        # write raised: a traceback in the log for any client, and the answers lost.
        if events and not self.closing:
            # The frame budget, charged once a read (once each FEED_BYTES of it): a few operations,
            # on the sweep's clock. Only a read that takes a client past it costs more
            # (_within_budget). A client that closed gets the rest of its last read served: its
            # close is answered after them.
            now = self.core.now
            due = self.budget_at
            if due < now:
                due = now
            due += len(events) * FRAME_SECONDS + size * FRAME_BYTE_SECONDS
            if due - now > FRAME_BUDGET_SECONDS and proto.state is OPEN:
                events = self._within_budget(events, now)
            else:
                self.budget_at = due
            self.on_events(events)
        self.flush()
        if proto.state is not OPEN and not self.closing:
            self._stop_writing()  # the client closed, or sent what the protocol fails on

    def _up_to_request_end(self, data: bytes) -> bytes:
        """What the parser gets of `data`: the request head's whole lines, up to its end (its first
        empty line); what follows waits in `early` until the request is answered
        (core.ConnectionCore._handshake). Parsed at once, bytes the protocol fails on (a stray
        CRLF, a pipelined request, an unmasked frame) would end the connection before its request
        had an answer. A line is held until it ends, so that a Content-Length line reaches
        websockets in its plain spelling (`http.content_length`): it takes only `0` as no body.
        Its values are kept: only a length is a body (413); anything else is a malformed head (400)."""
        if len(self.start) < 5:
            self.start = (self.start + data)[:5]
        scan = (self.line or b"") + data
        out = bytearray()
        start = 0
        while (end := scan.find(b"\n", start) + 1) > 0:
            line = scan[start:end]
            start = end
            if line == b"\r\n":  # lstripped before, the request line is never empty: this ends the head
                self.line = b""
                self.early = bytearray(scan[start:])
                return bytes(out + line)
            if line[:15].lower() == b"content-length:" and line.endswith(b"\r\n"):
                value = line[15:-2]
                length = http.content_length(value)
                self.lengths += (value if length is None else length) + b","
                if length is not None:
                    line = line[:15] + b" " + length + b"\r\n"
            out += line  # a line that ends in a bare LF goes as it is: the parser refuses it (400)
        rest = scan[start:]
        if len(rest) > LINE_KEPT:  # too long whatever it holds: the parser says so (414 or 431)
            out += rest
            rest = b""
        self.line = rest
        return bytes(out)

    def _answer_unreadable(self, cause: BaseException | None) -> None:
        """websockets could not read the request (a body, a transfer coding, a garbled head) and
        queued only its EOF: the client would see the connection end with no status. Say why
        first; the EOF then ends the answer, and nothing more is read or written."""
        self.closing = True
        answer = http.unreadable(cause, self.lengths)
        if answer is not None:
            self.transport.write(self._for_method(answer).serialize())

    def _answer_too_large(self, cause: Exception) -> None:
        """websockets refused a request head past its limits with its own 414 or 431, worded for a
        WebSocket handshake and with a body even for a HEAD: ours goes in its place, its EOF after
        it, and nothing more is read or written."""
        self.closing = True
        queued = self.proto.data_to_send()  # websockets' answer, then its EOF
        self.transport.write(self._for_method(http.too_large(cause)).serialize())
        self._write(queued[1:])

    def _for_method(self, answer: Response) -> Response:
        """`answer` as the request's method has it: a HEAD's has no body (RFC 9110 §9.3.2)."""
        return http.for_head(answer) if self.start == b"HEAD " else answer

    def _answer_no_request(self) -> None:
        """What came is no HTTP request at all (a TLS ClientHello from a client told https:// or
        wss://, another protocol): 400 at once. The parser would wait for a line end that such
        bytes may never hold, and the client for the open timeout, to see the connection dropped."""
        self.closing = True
        answer = http.unreadable(ValueError("no request line"))
        assert answer is not None
        self.transport.write(answer.serialize())
        self.transport.close()  # after the answer is written; nothing more is read

    def eof_received(self) -> None:
        self.proto.receive_eof()
        self.flush()
        # Returning None closes the transport: livepush never writes after the peer's EOF.

    def connection_lost(self, exc: Exception | None) -> None:
        self.proto.receive_eof()
        self._stop_writing()
        if self.busy is not None:
            self.busy.cancel()
        self.inbox = None
        self._drop_held()
        self.core.lost(self)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.pongs = 0  # below the low-water mark: the pongs written while paused were taken
        self.stalled = None  # and so was what a replay waits on: it is not stuck
        # The peer took what waited for it: it is alive, which answers the sweep's ping as its
        # data would. While its subscribes are served its frames may go unread (INBOX_FRAMES),
        # and a client reading a long replay would otherwise look silent and be dropped.
        self.seen = self.core.now
        self.ping_at = 0.0
        backlog = self.backlog
        if backlog is not None:
            write = self.transport.write
            while not self.paused and not self.transport.is_closing():  # the peer gone: see flush()
                data = backlog.pop()
                if data is None:
                    self.backlog = None  # caught up: writes go straight to the transport again
                    self.core.behind.discard(self)
                    break
                write(data)
        self._wake()

    # -- inside -----------------------------------------------------------------------------------
    def uncork(self) -> None:
        """Write the frames gathered in this turn of the loop, as one write."""
        out = self.out
        if out is not None:
            self.out = None
            if self.closing:
                return
            if self.transport.is_closing():
                # A write found the peer gone (it reset the connection): connection_lost follows.
                # A replay goes on writing until then, and the transport logs a warning for each
                # write from the fifth on: any client could fill the log by resetting mid-replay.
                self._stop_writing()
                return
            self.transport.write(out)

    def flush(self) -> None:
        """Write what the protocol has to send (handshake answer, pongs, close frames, EOF)."""
        self.uncork()
        self._write(self.proto.data_to_send())
        if self.proto.close_expected():
            self.core.expect_close(self)
        elif self.paused and not self.closing:
            # Pongs bypass the backlog (they answer the client's own pings): a client that pings
            # and never reads is bounded by the pongs waiting in the transport too. Only those:
            # the rest of what the transport holds may be one large state, which must arrive.
            waiting = self.pongs + self.backlog_bytes
            if past_bound(waiting, self.backlog):
                too_slow(self, f"{waiting} bytes waiting")

    def _write(self, writes: Iterable[bytes]) -> None:
        """Write what the protocol queued: its bytes, and its EOF (an empty item)."""
        transport = self.transport
        for data in writes:
            if transport.is_closing():
                # A write found the peer gone (it reset the connection): connection_lost follows.
                # Each later write would only count against the transport, which logs a warning
                # from the fifth on, and a client sending pings then a reset could fill the log.
                break
            if data:
                transport.write(data)
                if self.paused:
                    self.pongs += len(data)
            elif transport.can_write_eof():
                try:
                    transport.write_eof()
                except OSError:
                    # The peer reset the connection right after the last write (a client that sends
                    # its request and leaves, as a browser does with a refused handshake): nothing
                    # more can go. Raised on, it left a traceback in the log for any client to cause.
                    transport.abort()
            else:
                transport.close()

    def _stop_writing(self) -> None:
        """Closing: nothing more is written, what still waits is never sent, drain() returns, and
        the frames waiting for a subscribe are never served."""
        self.closing = True
        self.out = None
        self.backlog = None
        self.core.behind.discard(self)
        if self.unread and self.transport is not None:
            # Reading was paused for those frames: the peer's answer to our close (or its EOF)
            # would go unheard, and the close end in an abort at the close timeout.
            self.transport.resume_reading()
        self.inbox = None
        self._drop_held()
        self._wake()

    def _parse_only(self, data: bytes) -> None:
        """Give the protocol `data`, the unparsed rest of a read past the budget, and drop its
        frames: a closing connection serves none, but the client's answer to the close comes
        after these bytes, and dropped unparsed they left the parser inside a frame, reading that
        answer as its middle (the close then ended at the close timeout, by an abort)."""
        proto = self.proto
        for at in range(0, len(data), FEED_BYTES):  # never more than a part's frames at once
            proto.receive_data(data[at:at + FEED_BYTES])
            proto.events_received()

    def _drop_held(self) -> None:
        self.held = None
        self.unfed = None
        if self.refill is not None:
            self.refill.cancel()
            self.refill = None

    def _within_budget(self, events: list[Any], now: float) -> list[Any]:
        """The frames of `events` the budget lets through now, charged; the rest are held, and
        this connection's reads paused, until FRAME_RESUME_SECONDS of budget are back (_refilled).
        The server stops reading rather than refusing or closing: TCP slows this client alone,
        and every frame is still answered, in order."""
        due = self.budget_at if self.budget_at > now else now
        limit = now + FRAME_BUDGET_SECONDS
        for i, event in enumerate(events):
            if due > limit:
                self.held = events[i:]
                self.transport.pause_reading()
                loop = asyncio.get_running_loop()
                self.refill = loop.call_at(due - FRAME_BUDGET_SECONDS + FRAME_RESUME_SECONDS, self._refilled)
                events = events[:i]
                break
            due += FRAME_SECONDS + (len(event.data) + FRAME_HEAD_BYTES) * FRAME_BYTE_SECONDS
        self.budget_at = due
        return events

    def _refilled(self) -> None:
        """Serve the held frames the refilled budget allows, and read again once none is held."""
        self.refill = None
        held, self.held = self.held, None
        if held is None or self.closing:
            return
        events = self._within_budget(held, asyncio.get_running_loop().time())
        if self.held is None and not self.unread:
            # Before serving them: a close they cause must hear the client's answer.
            self._read_again()
        self.on_events(events)
        self.flush()
        if self.held is None and self.unfed is not None and not self.closing:
            unfed, self.unfed = self.unfed, None
            self._feed(unfed)
            if not self.unread:  # all of it served; or a close it caused, which must hear the answer
                self._read_again()

    def _read_again(self) -> None:
        self.transport.resume_reading()
        # What the peer sent while it was not read (a pong among it) is read now: its keepalive
        # clock starts again from here.
        self.seen = self.core.now
        self.ping_at = 0.0

    def on_events(self, events: list[Any]) -> None:
        """Serve the messages among the frames the protocol parsed (it answers pings itself)."""
        for event in events:
            if not isinstance(event, Frame):
                continue
            opcode = event.opcode
            if opcode is TEXT or opcode is BINARY:
                if not event.fin:
                    self.partial = bytearray(b"\x01" if opcode is TEXT else b"\x02") + event.data
                    continue
                # Bytes: websockets makes a memoryview only of an outgoing compressed frame's data.
                self._message(opcode is TEXT, event.data)  # type: ignore[arg-type]
            elif opcode is CONT and self.partial is not None:
                self.partial += event.data
                if event.fin:
                    whole, self.partial = self.partial, None
                    self._message(whole[0] == 1, bytes(whole[1:]))
            if self.closing:
                return

    def _message(self, is_text: bool, data: bytes) -> None:
        raw: str | bytes = data
        if is_text:
            try:
                raw = data.decode()
            except UnicodeDecodeError as exc:
                self.proto.fail(CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")
                self.flush()
                self._stop_writing()
                return
        if self.closing:
            return
        # Parsed once, here: a frame that waits for a subscribe waits parsed, and is not read
        # again for served_at_once() and then for on_frame().
        cmd = protocol.parse(raw)
        if self.busy is not None:
            if not self.inbox and self.core.server.served_at_once(self, cmd):
                return
            if self.inbox is None:
                self.inbox = []
            self.inbox.append(cmd)
            if len(self.inbox) == INBOX_FRAMES:
                self.transport.pause_reading()
            return
        work = self.core.server.on_frame(self, cmd)
        if work is not None:
            self.busy = asyncio.ensure_future(self._serve(work))

    async def _serve(self, work: Awaitable[None] | None) -> None:
        """Await a subscribe, then the frames that came meanwhile, in order."""
        try:
            while work is not None:
                try:
                    await work
                except ConnectionClosed:
                    return
                work = None
                while self.inbox and work is None and not self.closing:
                    cmd = self.inbox.pop(0)
                    if len(self.inbox) == INBOX_FRAMES - 1 and self.held is None:
                        self._read_again()  # (past its budget, _refilled reads again)
                    work = self.core.server.on_frame(self, cmd)
        except asyncio.CancelledError:
            if not self.closing:  # not this connection's loss (a bug): the client reconnects, not waits
                log.error("serving a client's frame was cancelled; closing it")
                self.close(CLOSE_INTERNAL_ERROR, "internal error")
        except Exception:
            log.exception("serving a client's frame failed; closing it")
            self.close(CLOSE_INTERNAL_ERROR, "internal error")
        finally:
            self.busy = None

    async def _written(self) -> None:
        if self._waiter is None:
            self._waiter = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._waiter)

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


# -- writes ---------------------------------------------------------------------------------------
def push(conn: Connection, data: bytes, topic: str | None = None, kind: Kind | None = None) -> None:
    """Write one whole frame: at the end of this turn of the loop while the transport takes it,
    else through the backlog."""
    if conn.closing:
        return
    if conn.backlog is None and not conn.paused:
        # Bytes, never a list: a list per connection and turn is a container the garbage
        # collector counts, and enough of them made its collections a latency spike.
        out = conn.out
        if out is None:
            out = conn.out = data  # a lone frame is written as the broadcast's own bytes
            conn.core.cork(conn)
        else:
            if type(out) is bytes:
                out = conn.out = bytearray(out)
            out += data
        if len(out) >= CORK_BYTES:
            conn.uncork()  # the transport says now whether the client keeps up, as for a lone frame
        return
    backlog = conn.backlog
    if backlog is None:
        backlog = conn.backlog = Backlog(framing=frames.text, overflow=conn.overflowed)
        conn.core.behind.add(conn)
    outcome = backlog.add(data, topic, kind)
    if outcome == "conflated":
        metrics.SLOW_CLIENT_ACTIONS.labels("conflated").inc()
    elif outcome == "replayed":
        metrics.SLOW_CLIENT_ACTIONS.labels("replayed").inc()
    elif outcome == "reset":
        metrics.SLOW_CLIENT_ACTIONS.labels("reset").inc()
        metrics.RESETS.labels("slow_client").inc()
    if past_bound(backlog.bytes, backlog):
        too_slow(conn, f"{backlog.bytes} bytes waiting")


def broadcast(clients: Iterable[Connection], frame: str, topic: str | None = None, kind: Kind | None = None) -> None:
    """Encode the frame once; the same bytes object goes to every subscriber."""
    data = frames.text(frame.encode())
    for conn in clients:
        push(conn, data, topic, kind)


# -- the slow-client rules ----------------------------------------------------------------------
def bound_send_buffer(transport: Any) -> None:
    """Cap the kernel's send buffer of a connection at SOCKET_SEND_BUFFER."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_SEND_BUFFER)
        except OSError as exc:
            log.debug("could not bound a connection's socket buffer: %s", exc)


def past_bound(waiting: int, backlog: Backlog | None) -> bool:
    """Whether `waiting` bytes put a client too far behind. The largest waiting state is not
    counted: a newer state of its topic replaces it rather than adds to it, and it is one the
    client must get (a job's final state with a large result may pass the bound alone)."""
    return waiting > BACKLOG_BYTES and (backlog is None or waiting - backlog.largest_state() > BACKLOG_BYTES)


def too_slow(conn: Connection, why: str) -> None:
    """Close a client that fell too far behind with 1013, and count it."""
    log.debug("closing a client that fell too far behind (%s)", why)
    metrics.SLOW_CLIENT_ACTIONS.labels("closed").inc()
    conn.close(protocol.CLOSE_TOO_SLOW, "too slow")
