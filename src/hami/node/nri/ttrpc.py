"""ttrpc over NRI's multiplexed socket, on asyncio: the framing, requests and responses.

Two layers, both big-endian:

* **multiplex** (containerd/nri ``pkg/net/multiplex``): the socket carries frames of an
  8-byte header, ``conn id (u32) | payload length (u32)``, then the payload. Each conn id is one
  logical byte stream (NRI uses 1: the runtime calls the plugin, 2: the plugin calls the
  runtime); conn id 0 is reserved. The Go side writes a ttrpc message as one or more frames, so
  a reader must join the payloads of a conn id before cutting messages out of them.
* **ttrpc** (containerd/ttrpc ``channel.go``, PROTOCOL.md): each message is a 10-byte header,
  ``data length (u32) | stream id (u32) | type (u8) | flags (u8)``, then data of at most 4 MiB.
  Type 1 is a request (``ttrpc.Request``: service, method, payload), 2 a response
  (``ttrpc.Response``: a ``google.rpc.Status``, payload), 3 stream data (unused by NRI). The
  caller numbers its streams with odd ids, 1, 3, 5, ...; the answer carries the request's id.

A message this side writes goes out as frames of at most :data:`FRAME_MAX` bytes, each frame
holding data of one message only: the Go reader of a logical connection reads through a 4 KiB
``bufio.Reader`` and fails a frame bigger than the room it reads into.

:class:`Mux` owns the socket (one reader task; writes of one message are never interleaved);
:class:`Endpoint` is one logical connection: it serves the peer's requests with a
:data:`Handler` and makes calls (:meth:`Endpoint.call`). A peer that closes the socket ends
:meth:`Mux.run` and fails every call in flight with :class:`ConnectionClosed`.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from dataclasses import dataclass
from typing import Awaitable, Callable

from google.protobuf.message import DecodeError

from . import load

log = logging.getLogger(__name__)
tpb, _ = load()

MUX_HEADER = struct.Struct(">II")
MESSAGE_HEADER = struct.Struct(">IIBB")
#: ttrpc's limit on a message's data
MESSAGE_MAX = 4 << 20
#: the most this side puts in one multiplex frame (see the module docstring)
FRAME_MAX = 4096
#: the largest frame payload NRI's multiplexer writes (``maxPayloadSize``): a header claiming
#: more is garbage, refused before its payload is buffered
MUX_PAYLOAD_MAX = 1 << 24
#: multiplex conn id 0 is reserved
RESERVED_CONN = 0

REQUEST, RESPONSE, DATA = 0x1, 0x2, 0x3

# google.rpc.Code values ttrpc carries in a response's status
OK, UNKNOWN, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 0, 2, 8, 12, 13, 14


class ProtocolError(Exception):
    """The peer sent something this side cannot read; the connection is closed."""


class ConnectionClosed(Exception):
    """The connection ended before an answer came."""


class RemoteError(Exception):
    """A call answered with a non-OK status; raised by a handler to answer with one."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message


#: serves one request: (service, method, payload) -> the response payload
Handler = Callable[[str, str, bytes], Awaitable[bytes]]


def mux_frames(conn_id: int, data: bytes, frame_max: int = FRAME_MAX) -> bytes:
    """``data`` for ``conn_id`` as multiplex frames of at most ``frame_max`` payload bytes."""
    if conn_id == RESERVED_CONN:
        raise ValueError("multiplex conn id 0 is reserved")
    out = bytearray()
    for start in range(0, max(len(data), 1), frame_max):
        chunk = data[start : start + frame_max]
        out += MUX_HEADER.pack(conn_id, len(chunk)) + chunk
    return bytes(out)


def message(stream_id: int, kind: int, data: bytes, flags: int = 0) -> bytes:
    """One ttrpc message: header and data."""
    if len(data) > MESSAGE_MAX:
        raise ValueError(f"ttrpc message of {len(data)} bytes is over the {MESSAGE_MAX}-byte limit")
    return MESSAGE_HEADER.pack(len(data), stream_id, kind, flags) + data


@dataclass(frozen=True)
class Message:
    stream_id: int
    kind: int
    flags: int
    data: bytes
    oversized: int = 0  # the length of a message over the limit, whose data was dropped


class MessageReader:
    """Cuts ttrpc messages out of one logical connection's bytes, however they were framed."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._skip = 0  # bytes of an oversized message still to drop

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out = []
        while True:
            if self._skip:
                dropped = min(self._skip, len(self._buf))
                del self._buf[:dropped]
                self._skip -= dropped
                if self._skip:
                    return out
            if len(self._buf) < MESSAGE_HEADER.size:
                return out
            length, stream_id, kind, flags = MESSAGE_HEADER.unpack_from(self._buf)
            if length > MESSAGE_MAX:
                del self._buf[: MESSAGE_HEADER.size]
                self._skip = length
                out.append(Message(stream_id, kind, flags, b"", oversized=length))
                continue
            end = MESSAGE_HEADER.size + length
            if len(self._buf) < end:
                return out
            out.append(Message(stream_id, kind, flags, bytes(self._buf[MESSAGE_HEADER.size : end])))
            del self._buf[:end]


class Endpoint:
    """One logical ttrpc connection: answers the peer's requests, makes this side's calls."""

    def __init__(self, mux: Mux, conn_id: int, handler: Handler | None = None) -> None:
        self.mux = mux
        self.conn_id = conn_id
        self.handler = handler
        self._reader = MessageReader()
        self._next_stream = 1
        self._calls: dict[int, asyncio.Future[bytes]] = {}
        self._serving: set[asyncio.Task] = set()

    async def call(self, service: str, method: str, payload: bytes, timeout: float | None = None) -> bytes:
        """Call ``service/method``; returns the response payload, raises :class:`RemoteError`
        for a non-OK status and :class:`ConnectionClosed` when the connection ends first."""
        if self.mux.closed:
            raise ConnectionClosed(f"{service}/{method}: the connection is closed")
        stream_id, self._next_stream = self._next_stream, self._next_stream + 2
        request = tpb.Request(service=service, method=method, payload=payload)
        if timeout is not None:
            request.timeout_nano = int(timeout * 1e9)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._calls[stream_id] = future
        try:
            await self.mux.send(self.conn_id, message(stream_id, REQUEST, request.SerializeToString()))
            return await asyncio.wait_for(future, timeout)
        finally:
            self._calls.pop(stream_id, None)

    def received(self, data: bytes) -> None:
        for msg in self._reader.feed(data):
            if msg.kind == REQUEST:
                task = asyncio.get_running_loop().create_task(self._serve(msg))
                self._serving.add(task)
                task.add_done_callback(self._serving.discard)
            elif msg.kind == RESPONSE:
                self._answered(msg)
            else:
                raise ProtocolError(f"conn {self.conn_id}: ttrpc message type {msg.kind} on stream {msg.stream_id}")

    def _answered(self, msg: Message) -> None:
        future = self._calls.get(msg.stream_id)
        if future is None or future.done():
            log.debug("conn %d: answer on stream %d that no call waits for", self.conn_id, msg.stream_id)
            return
        if msg.oversized:
            future.set_exception(RemoteError(RESOURCE_EXHAUSTED, f"response of {msg.oversized} bytes over the limit"))
            return
        try:
            response = tpb.Response.FromString(msg.data)
        except DecodeError as exc:
            future.set_exception(
                ProtocolError(f"conn {self.conn_id}: unreadable response on stream {msg.stream_id}: {exc}")
            )
            return
        if response.status.code != OK:
            future.set_exception(RemoteError(response.status.code, response.status.message))
        else:
            future.set_result(response.payload)

    async def _serve(self, msg: Message) -> None:
        response = tpb.Response()
        try:
            if msg.oversized:
                raise RemoteError(RESOURCE_EXHAUSTED, f"message length {msg.oversized} over the limit {MESSAGE_MAX}")
            if msg.flags:
                raise RemoteError(UNIMPLEMENTED, "streaming requests are not served")
            request = tpb.Request.FromString(msg.data)
            if self.handler is None:
                raise RemoteError(UNIMPLEMENTED, f"{request.service}/{request.method}: nothing served here")
            response.payload = await self.handler(request.service, request.method, request.payload)
        except RemoteError as exc:
            response.status.code, response.status.message = exc.code, exc.message
        except Exception as exc:  # noqa: BLE001 - a handler's bug answers the call, never kills the connection
            log.exception("conn %d: request on stream %d failed", self.conn_id, msg.stream_id)
            response.status.code, response.status.message = INTERNAL, f"internal error: {exc}"
        try:
            await self.mux.send(self.conn_id, message(msg.stream_id, RESPONSE, response.SerializeToString()))
        except ConnectionClosed:
            log.debug("conn %d: connection closed before the answer on stream %d", self.conn_id, msg.stream_id)

    async def finish(self, timeout: float) -> bool:
        """Wait until the peer's requests being served (and any that arrive meanwhile) are
        answered, for ``timeout`` seconds at most; False when some were still out then."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self._serving:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return False
            await asyncio.wait(list(self._serving), timeout=left)
        return True

    def closed(self, reason: str) -> None:
        for future in self._calls.values():
            if not future.done():
                future.set_exception(ConnectionClosed(reason))
        for task in self._serving:
            task.cancel()


class Mux:
    """The socket: frames in (one reader, :meth:`run`), frames out (:meth:`send`)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.endpoints: dict[int, Endpoint] = {}
        self.closed = False
        self.reason = ""
        self._drain = asyncio.Lock()
        self._header: tuple[int, int] | None = None  # a frame's header read, its payload not yet

    def endpoint(self, conn_id: int, handler: Handler | None = None) -> Endpoint:
        if conn_id == RESERVED_CONN:
            raise ValueError("multiplex conn id 0 is reserved")
        ep = self.endpoints.get(conn_id)
        if ep is None:
            ep = self.endpoints[conn_id] = Endpoint(self, conn_id, handler)
        return ep

    async def send(self, conn_id: int, data: bytes) -> None:
        if self.closed:
            raise ConnectionClosed(self.reason or "the connection is closed")
        self.writer.write(mux_frames(conn_id, data))  # one call: frames of two messages never interleave
        try:
            async with self._drain:
                await self.writer.drain()
        except (ConnectionError, OSError) as exc:
            await self.close(f"write failed: {exc}")
            raise ConnectionClosed(self.reason) from None

    async def run(self) -> str:
        """Read until the peer closes or breaks the protocol; returns why it ended. A run
        cancelled may be started again: it goes on where the cancelled one stopped (a read
        cancelled while it waits takes nothing, and a frame's header read is kept)."""
        try:
            while True:
                if self._header is None:
                    self._header = MUX_HEADER.unpack(await self.reader.readexactly(MUX_HEADER.size))
                conn_id, length = self._header
                if length > MUX_PAYLOAD_MAX:
                    raise ProtocolError(f"multiplex frame of {length} bytes for conn {conn_id}, over {MUX_PAYLOAD_MAX}")
                data = await self.reader.readexactly(length) if length else b""
                self._header = None
                ep = self.endpoints.get(conn_id)
                if ep is None:
                    log.debug("multiplex frame for conn %d, which nothing reads; dropped", conn_id)
                    continue
                ep.received(data)
        except asyncio.IncompleteReadError:
            reason = "the peer closed the connection"
        except (ConnectionError, OSError) as exc:
            reason = f"read failed: {exc}"
        except ProtocolError as exc:
            reason = f"protocol error: {exc}"
        await self.close(reason)
        return reason

    async def close(self, reason: str = "closed by this side") -> None:
        if self.closed:
            return
        self.closed, self.reason = True, reason
        for ep in self.endpoints.values():
            ep.closed(reason)
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
