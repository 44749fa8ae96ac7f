"""Frames in bulk (kombu_ladder.frames) on a socket pair, and the publish frames AmqpLink builds itself."""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any, Iterator

import pytest
from amqp import spec
from amqp.exceptions import UnexpectedFrame
from amqp.method_framing import frame_writer
from amqp.serialization import dumps
from amqp.transport import TCPTransport

from kombu_ladder import frames
from kombu_ladder.frames import CHUNK, KEEP_BYTES, BulkFrames, read_in_bulk
from kombu_ladder.link import AmqpLink, RawMessage

pytestmark = pytest.mark.unit


def frame(kind: int, channel: int, payload: bytes, end: bytes = b"\xce") -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + end


class Connection:
    """What BulkFrames needs of py-amqp's Connection: a transport, blocking_read, on_inbound_frame."""

    def __init__(self, sock: socket.socket) -> None:
        transport = TCPTransport.__new__(TCPTransport)
        transport.sock = sock
        transport.connected = True
        transport.raise_on_initial_eintr = False
        transport._setup_transport()
        self.transport = transport
        self.frames: list[tuple[int, int, bytes]] = []
        self.handle: Any = None  # called with each frame as it is handled

    def blocking_read(self, timeout: Any = None) -> Any:  # py-amqp's, replaced by install()
        raise AssertionError("BulkFrames should read")

    def on_inbound_frame(self, frame: tuple[int, int, bytes]) -> bool:
        self.frames.append(frame)
        if self.handle is not None:
            self.handle(frame)
        return True


@pytest.fixture()
def pair() -> Iterator[tuple[Connection, BulkFrames, socket.socket]]:
    ours, theirs = socket.socketpair()
    ours.settimeout(5)
    connection = Connection(ours)
    bulk = BulkFrames(connection).install()
    yield connection, bulk, theirs
    ours.close()
    theirs.close()


def test_frames_come_out_whole_and_in_order_whatever_the_reads_cut(pair: Any) -> None:
    connection, bulk, broker = pair
    wanted = [(1, 1, b"m" * 20), (2, 1, b"h" * 13), (3, 1, b""), (3, 2, b"b" * (3 * CHUNK + 5)), (8, 0, b"")]
    data = b"".join(frame(*f) for f in wanted)
    sent = 0
    for size in (3, 1, 4, 9, 17, 40_000, len(data)):  # cut across headers, payloads and end octets
        broker.sendall(data[sent:sent + size])
        sent = min(len(data), sent + size)
    for _ in wanted:
        connection.blocking_read(timeout=5)
    assert connection.frames == wanted
    assert all(isinstance(payload, bytes) for _, _, payload in connection.frames)


def test_many_frames_cost_one_recv(pair: Any) -> None:
    connection, bulk, broker = pair
    calls = []
    recv = bulk._recv
    bulk._recv = lambda n: calls.append(n) or recv(n)
    broker.sendall(b"".join(frame(1, 1, b"%d" % i) for i in range(50)))
    for _ in range(50):
        connection.blocking_read(timeout=5)
    assert [p for _, _, p in connection.frames] == [b"%d" % i for i in range(50)]
    assert len(calls) == 1


def test_a_timeout_in_the_middle_of_a_frame_keeps_what_arrived(pair: Any) -> None:
    connection, bulk, broker = pair
    whole = frame(1, 3, b"payload")
    broker.sendall(whole[:9])
    with pytest.raises(socket.timeout):
        connection.blocking_read(timeout=0.05)
    broker.sendall(whole[9:])
    connection.blocking_read(timeout=5)
    assert connection.frames == [(1, 3, b"payload")]


def test_a_wrong_frame_end_is_refused(pair: Any) -> None:
    connection, _bulk, broker = pair
    broker.sendall(frame(1, 1, b"x", end=b"\x00"))
    with pytest.raises(UnexpectedFrame):
        connection.blocking_read(timeout=5)


def test_a_closed_socket_marks_the_connection_down(pair: Any) -> None:
    connection, _bulk, broker = pair
    broker.sendall(frame(1, 1, b"x")[:4])
    broker.close()
    with pytest.raises(OSError, match="unexpectedly closed"):
        connection.blocking_read(timeout=5)
    assert connection.transport.connected is False


def test_writes_made_while_frames_wait_are_sent_together_and_in_order(pair: Any) -> None:
    connection, bulk, broker = pair
    sends: list[bytes] = []
    sendall = bulk._sendall
    bulk._sendall = lambda data: sends.append(bytes(data)) or sendall(data)
    view = memoryview(bytearray(b"reused"))  # py-amqp writes from a buffer it reuses

    def handle(frame: tuple[int, int, bytes]) -> None:
        connection.transport.write(view)
        view[:] = b"REUSED"
        connection.transport.write(b"ack%s" % frame[2])

    connection.handle = handle
    broker.sendall(b"".join(frame(1, 1, b"%d" % i) for i in range(3)))
    for _ in range(3):
        connection.blocking_read(timeout=5)
    # the first two frames' writes waited for the third, whose handling ended with none left: one sendall
    assert sends == [b"reusedack0REUSEDack1REUSEDack2"]
    connection.handle = None
    connection.transport.write(b"alone")  # outside the handling of a frame: at once
    assert sends[-1] == b"alone"
    broker.settimeout(5)
    received = b""
    while len(received) < len(b"reusedack0REUSEDack1REUSEDack2alone"):
        received += broker.recv(4096)
    assert received == b"reusedack0REUSEDack1REUSEDack2alone"


def test_big_writes_during_a_frames_handling_go_out_at_once_in_order(pair: Any) -> None:
    """A confirm that releases many big publishes: past KEEP_BYTES nothing more is kept (nor copied, nor
    joined); what was kept goes first, and the small writes after it are kept again."""
    connection, bulk, broker = pair
    sends: list[bytes] = []
    sendall = bulk._sendall
    bulk._sendall = lambda data: sends.append(bytes(data)) or sendall(data)
    big = bytes(KEEP_BYTES // 2 + 1)
    written = [b"ack", big, big, b"small"]

    def handle(frame: tuple[int, int, bytes]) -> None:
        for data in written:
            connection.transport.write(data)
        assert bulk._kept <= KEEP_BYTES

    connection.handle = handle
    broker.sendall(frame(1, 1, b"x") + frame(1, 1, b"y"))
    received = bytearray()
    broker.settimeout(5)
    expected = 2 * sum(map(len, written))

    def read() -> None:  # the broker's side reads as it comes (a socket pair's buffer is small)
        while len(received) < expected:
            received.extend(broker.recv(1 << 20))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    connection.blocking_read(timeout=5)  # "x" handled while "y" waits
    # the second big write would pass KEEP_BYTES: what was kept, then it, went out; "small" is kept
    assert sends == [b"ack" + big, big]
    assert bulk._out == [b"small"]
    connection.blocking_read(timeout=5)  # "y": the same, and nothing left after it
    assert sends[2:] == [b"small" + b"ack" + big, big, b"small"]
    reader.join(5)
    assert bytes(received) == 2 * b"".join(written)


def test_what_waits_is_sent_before_a_write_made_elsewhere_and_before_the_next_recv(pair: Any) -> None:
    connection, bulk, broker = pair
    sends: list[bytes] = []
    sendall = bulk._sendall
    bulk._sendall = lambda data: sends.append(bytes(data)) or sendall(data)
    connection.handle = lambda f: connection.transport.write(b"<%s>" % f[2])
    broker.sendall(frame(1, 1, b"a") + frame(1, 1, b"b"))
    connection.blocking_read(timeout=5)  # "a" handled while "b" waits: its write is kept
    assert sends == []
    connection.handle = None
    connection.transport.write(b"elsewhere")
    assert sends == [b"<a>elsewhere"]
    connection.blocking_read(timeout=5)  # "b", written nothing
    bulk._out.append(b"kept")
    with pytest.raises(socket.timeout):
        connection.blocking_read(timeout=0.05)  # nothing buffered: what was kept goes out before the recv
    assert sends[-1] == b"kept"


def test_only_a_plain_tcp_py_amqp_connection_reads_in_bulk() -> None:
    assert read_in_bulk(None) is None
    assert read_in_bulk(object()) is None

    class Other:
        transport = object()

    assert read_in_bulk(Other()) is None
    ours, theirs = socket.socketpair()
    try:
        connection = Connection(ours)
        bulk = read_in_bulk(connection)
        assert isinstance(bulk, BulkFrames)
        assert read_in_bulk(connection) is bulk  # once
        assert connection.blocking_read == bulk.blocking_read
    finally:
        ours.close()
        theirs.close()


class _Recorder:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))


class _AmqpConnection:
    frame_max = 131072

    def __init__(self) -> None:
        self.transport = _Recorder()
        self.bytes_sent = 0


class _Channel:
    channel_id = 7

    def __init__(self, connection: _AmqpConnection) -> None:
        self.connection = connection
        self.sent: list[Any] = []

    def send_method(self, *args: Any) -> None:
        self.sent.append(args)


@pytest.mark.parametrize("body", [b"", b"body", b"x" * 5000])
@pytest.mark.parametrize("target", [("", "a.queue"), ("acemq.schedule", "acemq.schedule.3600"), ("é", "ü" * 3)])
def test_a_publish_is_the_frames_py_amqp_writes(body: bytes, target: tuple[str, str]) -> None:
    raw = b"\x90\x00\x10application/json\x02"  # content type and delivery mode
    theirs = _AmqpConnection()
    write = frame_writer(theirs, theirs.transport)
    write(1, 7, spec.Basic.Publish, dumps("Bssbb", (0, *target, True, False)), RawMessage(body, raw))
    ours = _AmqpConnection()
    link = AmqpLink.__new__(AmqpLink)
    link._methods = {}
    for _ in range(2):  # the second from the kept method frame
        link.publish_raw(_Channel(ours), RawMessage(body, raw), *target)
    assert ours.transport.written == theirs.transport.written * 2
    assert ours.bytes_sent == 2


def test_a_publish_too_big_for_one_frame_is_py_amqps_to_split() -> None:
    ours = _AmqpConnection()
    channel = _Channel(ours)
    link = AmqpLink.__new__(AmqpLink)
    link._methods = {}
    link.publish_raw(channel, RawMessage(b"x" * ours.frame_max, b"\x00\x00"), "", "q")
    assert ours.transport.written == []
    assert channel.sent and channel.sent[0][0] == spec.Basic.Publish


def test_the_module_names_what_it_exports() -> None:
    assert set(frames.__all__) == {"CHUNK", "KEEP_BYTES", "BulkFrames", "read_in_bulk"}
