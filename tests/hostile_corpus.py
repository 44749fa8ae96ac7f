"""The hostile corpus: messages that once crashed, stalled, looped or fooled a relay, and what must become of each.

Data shared by three runs: the standalone relay on RabbitMQ, a ``celery worker -P
ladder`` on RabbitMQ, and the simulator. Each case is the bytes a publisher puts on
``acemq.schedule.due`` (encoded here by hand, not with the code under test) and its
expected fate: delivered (exactly once, bytes unchanged) to a queue, or parked with a
reason. Valid messages are interleaved with the cases and must each arrive exactly once.
"""

from __future__ import annotations

import functools
import hashlib
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Optional

from amqp import spec
from amqp.basic_message import Message as AmqpMessage
from amqp.channel import Channel as AmqpChannel
from amqp.serialization import decode_properties_basic

from kombu_ladder import wire
from kombu_ladder.contract import CONTENT_TYPE, CONTROL, DUE_AT, PARKING, TARGET_EXCHANGE, TARGET_ROUTING_KEY
from kombu_ladder.link import RawMessage, link_for

__all__ = [
    "Case", "cases", "valid", "declare_targets", "publish", "take_raw", "decoded", "relayed", "WRITE_PERMISSION",
    "VALID_QUEUE", "PASS_QUEUE", "HEADERS_QUEUE", "FANOUT_OK", "FANOUT_FULL", "FORBIDDEN", "TARGET_QUEUES",
    "MARKUP", "MARKUP_SIGNS",
]

#: Where valid messages go (through the default exchange).
VALID_QUEUE = "hostile.valid"
#: Where the messages that are odd but deliverable go (bytes passed through untouched).
PASS_QUEUE = "hostile.passthrough"
#: A headers exchange with one queue bound on ``route=yes``.
HEADERS_EXCHANGE, HEADERS_QUEUE = "hostile.headers", "hostile.headers.yes"
#: A fanout with two queues, one of them full (``x-max-length: 1``, ``reject-publish``).
FANOUT, FANOUT_OK, FANOUT_FULL = "hostile.fanout", "hostile.fanout.ok", "hostile.fanout.full"
#: An exchange that exists but that the relay's user may not write to.
FORBIDDEN = "hostile.forbidden"
#: The vhost's write permission: everything but the forbidden exchange.
WRITE_PERMISSION = r"^(?!hostile\.forbidden$).*$"
#: Every queue a case may reach.
TARGET_QUEUES = (VALID_QUEUE, PASS_QUEUE, HEADERS_QUEUE, FANOUT_OK, FANOUT_FULL)

#: Strings a message may carry (ids, task names, headers, bodies, parked reasons) that a page would run or
#: misread if it did not escape them: the web console must show each as the text it is.
MARKUP = (
    "<script>window.ladderPwned = 1</script>",
    "\"><img src=x onerror=\"window.ladderPwned=2\">",
    "'><svg onload=window.ladderPwned=3>",
    "javascript:window.ladderPwned=4",
    "</textarea></pre></code><b>bold</b>",
    "{{ 7 * 7 }}{% raw %}",
    "&lt;already&gt; &amp; escaped",
    "\u202eevil\u202c right-to-left",
    "nul\x00 bell\x07 esc\x1b[31m red",
    "<style>body{display:none}</style>",
)
#: What must never appear in a page's HTML, unescaped, once the strings above are on it (case-insensitive).
MARKUP_SIGNS = ("<script", "<img", "<svg onload", "<style>body", "<b>bold", "onerror=\"", "\u202e")

#: How big the compression bomb inflates (it is passed on compressed, never inflated).
BOMB = 256 * 1024 * 1024


# -- encoding by hand (AMQP 0-9-1 field tables and basic properties) ------------------------

def _short(data: bytes) -> bytes:
    return bytes((len(data),)) + data


def text(value: Any) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode()
    return b"S" + struct.pack(">I", len(data)) + data


def long64(value: int) -> bytes:
    return b"l" + struct.pack(">q", value)


def table(items: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(_short(name) + item for name, item in items)


def ftable(items: list[tuple[bytes, bytes]]) -> bytes:
    body = table(items)
    return b"F" + struct.pack(">I", len(body)) + body


def farray(items: list[bytes]) -> bytes:
    body = b"".join(items)
    return b"A" + struct.pack(">I", len(body)) + body


_FLAGS = {"content_type": (0x8000, "s"), "content_encoding": (0x4000, "s"), "headers": (0x2000, "F"),
          "delivery_mode": (0x1000, "o"), "priority": (0x0800, "o"), "correlation_id": (0x0400, "s"),
          "reply_to": (0x0200, "s"), "expiration": (0x0100, "s"), "message_id": (0x0080, "s"),
          "timestamp": (0x0040, "T"), "type": (0x0020, "s"), "user_id": (0x0010, "s"), "app_id": (0x0008, "s")}


def properties(headers: Optional[list[tuple[bytes, bytes]]] = None, **fields: Any) -> bytes:
    """Encode a basic property list by hand: short strings given as bytes or str, ``headers`` as items."""
    values = dict(fields, headers=headers)
    flags, out = 0, []
    for name, (bit, kind) in _FLAGS.items():
        value = values.get(name)
        if value is None:
            continue
        flags |= bit
        if kind == "s":
            out.append(_short(value if isinstance(value, bytes) else value.encode()))
        elif kind == "o":
            out.append(bytes((value,)))
        elif kind == "T":
            out.append(struct.pack(">Q", value))
        else:
            body = table(value)
            out.append(struct.pack(">I", len(body)) + body)
    return struct.pack(">H", flags) + b"".join(out)


def schedule(now_ms: int, *, exchange: Any = "", routing_key: Any = VALID_QUEUE,
             content_type: Any = "text/plain", due: Any = None) -> list[tuple[bytes, bytes]]:
    """The four x-schedule-* headers of a message due a second ago (each overridable with raw items)."""
    def item(value: Any) -> bytes:
        return value if isinstance(value, bytes) and value[:1] in (b"S", b"l", b"F", b"A", b"T") else text(value)
    return [(TARGET_EXCHANGE.encode(), item(exchange)), (TARGET_ROUTING_KEY.encode(), item(routing_key)),
            (DUE_AT.encode(), due if due is not None else long64(now_ms - 1000)),
            (CONTENT_TYPE.encode(), item(content_type))]


def nested(depth: int, kind: str) -> bytes:
    item = text("bottom")
    for _ in range(depth):
        item = ftable([(b"d", item)]) if kind == "F" else farray([item])
    return item


@functools.lru_cache(maxsize=1)
def bomb() -> bytes:
    """zlib of BOMB zero bytes (kombu's ``application/x-gzip`` codec), built without holding them."""
    packer = zlib.compressobj(9)
    chunk = bytes(1024 * 1024)
    return b"".join([*(packer.compress(chunk) for _ in range(BOMB // len(chunk))), packer.flush()])


# -- the cases ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One message put on the control queue, and its fate."""

    name: str
    #: Its encoded properties.
    raw: bytes
    body: bytes
    #: The queue it is delivered to (exactly once, same body), or ``"park"``.
    expect: str
    #: Text the ``x-ladder-parked-reason`` must contain (for ``"park"``).
    reason: str = ""
    #: Queues that receive copies besides (a fanout's other queue): name -> how many.
    copies: dict[str, int] = field(default_factory=dict)


def valid(n: int, now_ms: int) -> Case:
    """A valid message, due, for :data:`VALID_QUEUE`."""
    return Case(f"valid {n}", properties(schedule(now_ms) + [(b"n", long64(n))], content_type="text/plain",
                                         delivery_mode=2), f"valid-{n}".encode(), VALID_QUEUE)


def cases(now_ms: int, release: tuple[int, ...] = (3, 10)) -> list[Case]:
    """Every hostile message, as bytes, with what must become of it on the RabbitMQ ``release`` it goes through."""
    def msg(name: str, headers: Optional[list[tuple[bytes, bytes]]], expect: str, reason: str = "",
            body: Optional[bytes] = None, copies: Optional[dict[str, int]] = None, **fields: Any) -> Case:
        fields.setdefault("delivery_mode", 2)
        return Case(name, properties(headers, **fields), body if body is not None else name.encode(), expect, reason,
                    copies or {})

    sched = functools.partial(schedule, now_ms)
    passing = functools.partial(sched, routing_key=PASS_QUEUE)
    return [
        # Crashes: each once killed every relay that took it (struct.error, zlib.error, KeyError,
        # RecursionError, OverflowError, UnicodeDecodeError, TypeError).
        msg("routing key of 256 bytes", sched(routing_key="k" * 256), "park", "x-schedule-routing-key"),
        msg("routing key of 129 two-byte characters", sched(routing_key="é" * 129), "park", "258 bytes"),
        msg("exchange name of 256 bytes", sched(exchange="x" * 256), "park", "x-schedule-exchange"),
        msg("content type header of 256 bytes", sched(content_type="t" * 256), "park", "x-schedule-content-type"),
        msg("content type header not UTF-8", sched(content_type=text(b"text/\xff")), "park", "not valid UTF-8"),
        msg("compression header on a body not compressed", passing() + [(b"compression", text("application/x-gzip"))],
            PASS_QUEUE, body=b"not compressed at all"),
        msg("unknown compression codec", passing() + [(b"compression", text("application/x-unheard-of"))], PASS_QUEUE),
        msg("compression bomb", passing() + [(b"compression", text("application/x-gzip"))], PASS_QUEUE, body=bomb()),
        msg("header table nested 500 deep", sched() + [(b"deep", nested(500, "F"))], "park", "nested deeper"),
        msg("header table nested 2,000 deep", sched() + [(b"deep", nested(2000, "F"))], "park", "nested deeper"),
        msg("header array nested 2,000 deep", sched() + [(b"deep", nested(2000, "A"))], "park", "nested deeper"),
        msg("timestamp header of 2^64-1", sched() + [(b"when", b"T" + struct.pack(">Q", 2**64 - 1))], "park",
            "timestamp"),
        msg("content_type property not UTF-8", sched(), "park", "content_type is not valid UTF-8",
            content_type=b"bad/\xff\xfe"),
        msg("header name not UTF-8", sched() + [(b"\xffname", text("v"))], "park", "header name is not valid UTF-8"),
        # Silent loss: the same body twice to a headers exchange, one routable, one not.
        msg("headers exchange, route=yes", sched(exchange=HEADERS_EXCHANGE, routing_key="") + [(b"route", text("yes"))],
            HEADERS_QUEUE, body=b"same"),
        msg("headers exchange, route=no", sched(exchange=HEADERS_EXCHANGE, routing_key="") + [(b"route", text("no"))],
            "park", "NO_ROUTE", body=b"same"),
        # Loops: targets that close the channel.
        msg("internal exchange", sched(exchange="amq.rabbitmq.trace", routing_key="k"), "park", "internal"),
        msg("exchange the relay may not write", sched(exchange=FORBIDDEN, routing_key="k"), "park", "ACCESS_REFUSED"),
        msg("fanout with one full queue", sched(exchange=FANOUT, routing_key="k"), "park", "refused",
            copies={FANOUT_OK: 2}),
        msg("missing exchange", sched(exchange="hostile.missing", routing_key="k"), "park", "NOT_FOUND"),
        msg("missing exchange with ANSI escapes in its name", sched(exchange="hostile.\x1b[31mred\x1b[0m",
                                                                  routing_key="k"), "park", "\\x1b[31mred"),
        # Ambiguity and bulk.
        # RabbitMQ 4.x keeps the first of two equal header names before any consumer sees the message
        # (measured on 4.0.5): there the relay meets one due time, the first, and delivers.
        msg("x-schedule-due-at given twice", sched() + [(DUE_AT.encode(), long64(now_ms + 10**9))],
            *(("park", "more than once") if release < (4, 0) else (VALID_QUEUE,))),
        msg("due-at of 5,000 digits", sched(due=text("9" * 5000)), "park", "more)"),
        msg("target exchange given as a table", sched(exchange=ftable([(b"a", text("b"))])), "park", "not a string"),
        msg("no headers at all", None, "park", "no headers"),
        msg("expiring malformed message", [(b"x-schedule-due-at", text("soon"))], "park", "x-schedule-due-at",
            expiration="60000"),
        # Odd but deliverable: passed on with their bytes.
        # RabbitMQ refuses a publish whose user_id is not the publisher's own (406 closes the channel):
        # a relay republishing the publisher's user_id under another user would lose its channel.
        msg("user_id set by its publisher", passing(), PASS_QUEUE, user_id="guest"),
        msg("float32, int16 and byte-array headers", passing() + [(b"f", b"f" + struct.pack(">f", 1.5)),
                                                                  (b"s", b"s" + struct.pack(">h", -2)),
                                                                  (b"x", b"x" + struct.pack(">I", 2) + b"\x00\xff")],
            PASS_QUEUE),
        msg("forged x-death and junk delivery mode", passing() + [(b"x-death", farray([text("forged")])),
                                                                  (b"x-ladder-delivery-mode", text("junk"))],
            PASS_QUEUE),
        msg("priority 255 and a content encoding no codec knows", passing(), PASS_QUEUE, priority=255,
            content_encoding="x-no-such-codec", body=b"\xff\xfe raw"),
    ]


# -- the broker side ---------------------------------------------------------------------

def declare_targets(channel: Any) -> None:
    """Declare (and empty) the corpus's exchanges and queues; fill the fanout's full queue."""
    for name in TARGET_QUEUES:
        arguments = {"x-max-length": 1, "x-overflow": "reject-publish"} if name == FANOUT_FULL else None
        channel.queue_declare(queue=name, durable=True, auto_delete=False, arguments=arguments)
        channel.queue_purge(queue=name)
    channel.exchange_declare(HEADERS_EXCHANGE, "headers", durable=True, auto_delete=False)
    channel.queue_bind(HEADERS_QUEUE, HEADERS_EXCHANGE, "", arguments={"x-match": "all", "route": "yes"})
    channel.exchange_declare(FANOUT, "fanout", durable=True, auto_delete=False)
    channel.exchange_declare(FORBIDDEN, "fanout", durable=True, auto_delete=False)
    for queue in (FANOUT_OK, FANOUT_FULL):
        channel.queue_bind(queue, FANOUT, "")
    channel.basic_publish(AmqpMessage(b"filler"), exchange="", routing_key=FANOUT_FULL)


def publish(channel: Any, case: Case) -> None:
    """Put ``case`` on the control queue, as a rung's expiry would (its properties sent as encoded here)."""
    message = RawMessage(case.body, case.raw)
    if isinstance(channel, AmqpChannel):
        channel.send_method(spec.Basic.Publish, "Bssbb", (0, "", CONTROL, False, False), message)
    else:
        channel.basic_publish(message, exchange="", routing_key=CONTROL)


def take_raw(channel: Any, queue: str) -> list[tuple[bytes, bytes]]:
    """Take every message from ``queue`` as (encoded properties, body): nothing decoded, nothing inflated
    (read through the relay's own frame guard)."""
    guard = link_for(channel).guard
    guard.watch(channel, lambda *args: None)
    out = []
    try:
        while True:
            message = channel.basic_get(queue=queue, no_ack=True)
            if message is None:
                return out
            out.append((guard.take(channel) or b"\x00\x00", bytes(message.body)))
    finally:
        guard.unwatch(channel)


def interleaved(now_ms: int, release: tuple[int, ...] = (3, 10)) -> tuple[list[Case], list[Case]]:
    """The corpus with a valid message before, between and after its cases: (everything in order, the valid ones)."""
    hostile = cases(now_ms, release)
    valids = [valid(n, now_ms) for n in range(len(hostile) + 1)]
    ordered = [valids[0]]
    for case, after in zip(hostile, valids[1:]):
        ordered += [case, after]
    return ordered, valids


def expected_depths(ordered: list[Case]) -> dict[str, int]:
    """How many messages each queue holds once the relay is done with ``ordered``."""
    depths = {queue: 0 for queue in (*TARGET_QUEUES, PARKING)}
    depths[FANOUT_FULL] = 1  # the filler: the full queue never takes more
    for case in ordered:
        depths[PARKING if case.expect == "park" else case.expect] += 1
        for queue, count in case.copies.items():
            depths[queue] += count
    return depths


def check_outcomes(channel: Any, ordered: list[Case]) -> list[str]:
    """Take every target and the parking queue empty, and check each case's fate exactly.

    Valid and passed-through messages arrive once each with their body and the
    headers they were sent with (bar the schedule and death headers); every
    parked message decodes with py-amqp, carries its reason (escaped, bounded,
    naming the case's problem) and never an expiration. Returns the parking reasons.
    """
    seen = {queue: take_raw(channel, queue) for queue in (*TARGET_QUEUES, PARKING)}
    by_queue: dict[str, list[Case]] = {}
    for case in ordered:
        by_queue.setdefault(PARKING if case.expect == "park" else case.expect, []).append(case)
    for queue in (VALID_QUEUE, PASS_QUEUE, HEADERS_QUEUE):
        got = sorted(body for _, body in seen[queue])
        want = sorted(case.body for case in by_queue.get(queue, []))
        assert got == want, f"{queue}: {[fingerprint(b) for b in got]} != {[fingerprint(b) for b in want]}"
        for raw, body in seen[queue]:
            headers = decoded(raw).get("application_headers") or {}
            assert not any(k.startswith(("x-schedule-", "x-ladder-", "x-death")) for k in headers), (body[:40], headers)
            assert "user_id" not in decoded(raw), "a republish with another user's user_id closes the channel"
    passed = {body: raw for raw, body in seen[PASS_QUEUE]}
    typed = next(c for c in ordered if c.name.startswith("float32"))
    for item in (b"\x01ff" + struct.pack(">f", 1.5), b"\x01ss" + struct.pack(">h", -2),
                 b"\x01xx" + struct.pack(">I", 2) + b"\x00\xff"):
        assert item in passed[typed.body], "a header's type or bytes changed on the way"
    parked = seen[PARKING]
    assert len(parked) == len(by_queue[PARKING]), [decoded(r)["application_headers"].get("x-ladder-parked-reason")
                                                   for r, _ in parked]
    reasons: dict[bytes, list[str]] = {}
    for raw, body in parked:
        props = decoded(raw)
        assert "expiration" not in props, "a parked message must never expire"
        reason = props["application_headers"]["x-ladder-parked-reason"]
        assert reason.isprintable() and len(reason) <= 1100, reason
        reasons.setdefault(body, []).append(reason)
    all_reasons = [r for rs in reasons.values() for r in rs]
    for case in by_queue[PARKING]:
        reason = reasons[case.body].pop()
        assert case.reason in reason, f"{case.name}: {reason!r} does not say {case.reason!r}"
    for queue, count in expected_depths(ordered).items():
        if queue in (FANOUT_OK, FANOUT_FULL):
            assert len(seen[queue]) == count, f"{queue}: {len(seen[queue])} copies, not {count}"
    return all_reasons


def _amqp_reads_int16() -> bool:
    """Whether the installed py-amqp reads a header of type ``s`` as RabbitMQ's int16.

    py-amqp before 5.2 read it as the spec's short string (celery/kombu#2354), so it cannot
    decode a message with such a header at all, whoever republished it.
    """
    raw = struct.pack(">H", 0x2000) + struct.pack(">I", 5) + b"\x01ss" + struct.pack(">h", -2)
    try:
        return decode_properties_basic(raw, 0)[0].get("application_headers") == {"s": -2}
    except (UnicodeDecodeError, struct.error, ValueError):
        return False


AMQP_READS_INT16 = _amqp_reads_int16()


def decoded(raw: bytes) -> dict[str, Any]:
    """Decode encoded properties as py-amqp does (every message the relay publishes must allow it).

    With a py-amqp that predates int16 headers, a message carrying one is read with the
    relay's own wire reader instead: no release of that client could read it, as sent.
    """
    props = wire.read_properties(raw)
    if not AMQP_READS_INT16 and any(item[:1] == b"s" for _, item in props.headers or ()):
        fields: dict[str, Any] = {k: v.decode() if isinstance(v, bytes) else v for k, v in props.fields.items()}
        fields["application_headers"] = {k.decode(): wire.decode(item) for k, item in props.headers or ()}
        return fields
    return decode_properties_basic(raw, 0)[0]


def relayed(kind: str, headers: dict[str, Any], properties: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the relay publishes for an expired message with ``headers`` and ``properties`` (a ``"deliver"`` or a
    ``"hop"``), read back as a client reads it: (its headers, its other properties)."""
    from kombu_ladder.relay import outgoing

    raw = AmqpMessage(b"", application_headers=headers, **properties)._serialize_properties()
    props = wire.read_properties(raw)
    view, _ = outgoing.views(props)
    out = decoded(outgoing.encode(kind, props, view or {}))
    return out.pop("application_headers", None) or {}, out


def fingerprint(body: bytes) -> str:
    """A short digest, to compare big bodies in assertion messages."""
    return hashlib.sha256(body).hexdigest()[:16]


__all__ += ["PARKING", "nested", "bomb", "properties", "schedule", "fingerprint", "interleaved",
            "expected_depths", "check_outcomes"]
