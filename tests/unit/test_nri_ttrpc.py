"""hami.node.nri.ttrpc: the multiplex and ttrpc framing, byte for byte, and calls both ways over
a socket pair (one side a fake peer written here from the wire format, not from the module)."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest

from hami.node.nri import load
from hami.node.nri.ttrpc import (
    FRAME_MAX,
    INTERNAL,
    MESSAGE_MAX,
    REQUEST,
    RESOURCE_EXHAUSTED,
    RESPONSE,
    UNIMPLEMENTED,
    ConnectionClosed,
    MessageReader,
    Mux,
    ProtocolError,
    RemoteError,
    message,
    mux_frames,
)

tpb, _ = load()


# ------------------------------------------------------------------------------- bytes


def test_ttrpc_header_is_length_stream_type_flags_big_endian():
    assert message(5, REQUEST, b"abc", flags=0) == bytes([0, 0, 0, 3, 0, 0, 0, 5, 1, 0]) + b"abc"
    assert message(7, RESPONSE, b"") == bytes([0, 0, 0, 0, 0, 0, 0, 7, 2, 0])


def test_mux_header_is_conn_id_then_length_big_endian():
    assert mux_frames(2, b"xy") == bytes([0, 0, 0, 2, 0, 0, 0, 2]) + b"xy"


def test_mux_frames_split_a_long_message_and_never_use_conn_zero():
    data = bytes(range(256)) * 40  # 10240 bytes
    out = mux_frames(1, data)
    sizes, offset = [], 0
    while offset < len(out):
        conn, size = struct.unpack_from(">II", out, offset)
        assert conn == 1
        sizes.append(size)
        offset += 8 + size
    assert sizes == [FRAME_MAX, FRAME_MAX, 10240 - 2 * FRAME_MAX]
    with pytest.raises(ValueError, match="reserved"):
        mux_frames(0, b"x")


def test_message_over_the_limit_is_refused_on_write():
    with pytest.raises(ValueError, match="over the"):
        message(1, REQUEST, b"\0" * (MESSAGE_MAX + 1))


@pytest.mark.parametrize("cut", [1, 3, 10, 11, 4096])
def test_reader_joins_messages_however_the_bytes_are_cut(cut):
    stream = message(1, REQUEST, b"first") + message(3, REQUEST, b"") + message(5, RESPONSE, b"x" * 5000)
    reader, got = MessageReader(), []
    for start in range(0, len(stream), cut):
        got += reader.feed(stream[start : start + cut])
    assert [(m.stream_id, m.kind, m.data[:5], len(m.data)) for m in got] == [
        (1, REQUEST, b"first", 5),
        (3, REQUEST, b"", 0),
        (5, RESPONSE, b"xxxxx", 5000),
    ]


def test_reader_drops_an_oversized_message_and_reads_on():
    big = MESSAGE_MAX + 10
    stream = struct.pack(">IIBB", big, 9, REQUEST, 0) + b"\0" * big + message(11, REQUEST, b"ok")
    reader, got = MessageReader(), []
    for start in range(0, len(stream), 1 << 20):
        got += reader.feed(stream[start : start + (1 << 20)])
    assert [(m.stream_id, m.oversized, m.data) for m in got] == [(9, big, b""), (11, 0, b"ok")]


# ------------------------------------------------------------------------------- a fake peer


class Peer:
    """The far end of the socket, speaking the wire format with its own code."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = {1: b"", 2: b""}

    async def connect(self):
        self.reader, self.writer = await asyncio.open_unix_connection(sock=self.sock)
        return self

    def send_message(self, conn: int, stream: int, kind: int, data: bytes, flags: int = 0, frame: int = 1 << 30):
        raw = struct.pack(">IIBB", len(data), stream, kind, flags) + data
        for start in range(0, len(raw), frame):
            chunk = raw[start : start + frame]
            self.writer.write(struct.pack(">II", conn, len(chunk)) + chunk)

    async def read_message(self, conn: int) -> tuple[int, int, bytes]:
        while True:
            if len(self.buf[conn]) >= 10:
                length, stream, kind, _ = struct.unpack_from(">IIBB", self.buf[conn])
                if len(self.buf[conn]) >= 10 + length:
                    data = self.buf[conn][10 : 10 + length]
                    self.buf[conn] = self.buf[conn][10 + length :]
                    return stream, kind, data
            cid, size = struct.unpack(">II", await self.reader.readexactly(8))
            assert size <= FRAME_MAX, "this side never writes a frame over FRAME_MAX"
            self.buf[cid] += await self.reader.readexactly(size)


async def make_pair() -> tuple[Mux, Peer]:
    """A Mux on one end of a socket pair, the fake peer on the other (in the test's loop)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    reader, writer = await asyncio.open_unix_connection(sock=a)
    return Mux(reader, writer), await Peer(b).connect()


async def test_a_request_is_served_and_answered_on_its_stream():
    mux, peer = await make_pair()
    seen = []

    async def handler(service, method, payload):
        seen.append((service, method, payload))
        return b"answer:" + payload

    mux.endpoint(1, handler)
    running = asyncio.create_task(mux.run())
    req = tpb.Request(service="svc", method="M", payload=b"p" * 6000)
    peer.send_message(1, 3, REQUEST, req.SerializeToString(), frame=777)  # cut into odd frames
    stream, kind, data = await peer.read_message(1)
    assert (stream, kind) == (3, RESPONSE)
    resp = tpb.Response.FromString(data)
    assert resp.status.code == 0 and resp.payload == b"answer:" + b"p" * 6000
    assert seen == [("svc", "M", b"p" * 6000)]
    running.cancel()


@pytest.mark.parametrize(
    "raised, code, text",
    [
        (RemoteError(UNIMPLEMENTED, "no such method"), UNIMPLEMENTED, "no such method"),
        (KeyError("boom"), INTERNAL, "internal error: 'boom'"),
    ],
)
async def test_a_failing_handler_answers_with_a_status_and_keeps_serving(raised, code, text):
    mux, peer = await make_pair()
    calls = 0

    async def handler(service, method, payload):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise raised
        return b"fine"

    mux.endpoint(1, handler)
    running = asyncio.create_task(mux.run())
    for stream in (1, 3):
        peer.send_message(1, stream, REQUEST, tpb.Request(service="s", method="m").SerializeToString())
    answers = [await peer.read_message(1) for _ in range(2)]
    by_stream = {s: tpb.Response.FromString(d) for s, _, d in answers}
    assert (by_stream[1].status.code, by_stream[1].status.message) == (code, text)
    assert by_stream[3].status.code == 0 and by_stream[3].payload == b"fine"
    assert not running.done()
    running.cancel()


async def test_an_oversized_request_is_answered_resource_exhausted():
    mux, peer = await make_pair()
    mux.endpoint(1, lambda *a: asyncio.sleep(0, b""))
    running = asyncio.create_task(mux.run())
    peer.send_message(1, 5, REQUEST, b"\0" * (MESSAGE_MAX + 1))
    stream, kind, data = await peer.read_message(1)
    assert (stream, kind, tpb.Response.FromString(data).status.code) == (5, RESPONSE, RESOURCE_EXHAUSTED)
    running.cancel()


async def test_calls_use_odd_streams_and_get_their_own_answers():
    mux, peer = await make_pair()
    ep = mux.endpoint(2)
    running = asyncio.create_task(mux.run())
    first = asyncio.create_task(ep.call("rt", "A", b"1"))
    second = asyncio.create_task(ep.call("rt", "B", b"2"))
    got = [await peer.read_message(2) for _ in range(2)]
    streams = {tpb.Request.FromString(d).method: s for s, k, d in got}
    assert sorted(streams.values()) == [1, 3]
    # answer out of order; the second one with an error status
    peer.send_message(
        2, streams["B"], RESPONSE, tpb.Response(status=tpb.Status(code=9, message="no")).SerializeToString()
    )
    peer.send_message(2, streams["A"], RESPONSE, tpb.Response(payload=b"one").SerializeToString())
    assert await first == b"one"
    with pytest.raises(RemoteError) as err:
        await second
    assert (err.value.code, err.value.message) == (9, "no")
    running.cancel()


async def test_an_unreadable_response_fails_its_call_and_the_connection_lives_on():
    mux, peer = await make_pair()
    ep = mux.endpoint(2)
    running = asyncio.create_task(mux.run())
    bad = asyncio.create_task(ep.call("rt", "A", b""))
    stream, _, _ = await peer.read_message(2)
    peer.send_message(2, stream, RESPONSE, b"\xff\xff\xff")  # not a ttrpc.Response
    with pytest.raises(ProtocolError, match="unreadable response"):
        await bad
    good = asyncio.create_task(ep.call("rt", "B", b""))
    stream, _, _ = await peer.read_message(2)
    peer.send_message(2, stream, RESPONSE, tpb.Response(payload=b"ok").SerializeToString())
    assert await good == b"ok" and not running.done()
    running.cancel()


async def test_a_peer_that_closes_fails_calls_in_flight_and_ends_run():
    mux, peer = await make_pair()
    ep = mux.endpoint(2)
    running = asyncio.create_task(mux.run())
    call = asyncio.create_task(ep.call("rt", "A", b""))
    await peer.read_message(2)
    peer.writer.close()
    assert await running == "the peer closed the connection"
    with pytest.raises(ConnectionClosed):
        await call
    with pytest.raises(ConnectionClosed):
        await ep.call("rt", "again", b"")


async def test_an_unknown_message_type_is_a_protocol_error_that_ends_the_connection():
    mux, peer = await make_pair()
    mux.endpoint(1, lambda *a: asyncio.sleep(0, b""))
    running = asyncio.create_task(mux.run())
    peer.send_message(1, 1, 7, b"")
    reason = await running
    assert reason.startswith("protocol error") and "type 7" in reason
    assert mux.closed


async def test_frames_for_a_conn_nobody_reads_are_dropped():
    mux, peer = await make_pair()
    mux.endpoint(1, lambda s, m, p: asyncio.sleep(0, b"ok"))
    running = asyncio.create_task(mux.run())
    peer.writer.write(struct.pack(">II", 9, 3) + b"zzz")
    peer.send_message(1, 1, REQUEST, tpb.Request(service="s", method="m").SerializeToString())
    stream, _, data = await peer.read_message(1)
    assert stream == 1 and tpb.Response.FromString(data).payload == b"ok"
    running.cancel()
