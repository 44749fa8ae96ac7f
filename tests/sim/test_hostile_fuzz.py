"""Property-based fuzz of the envelope, the header/property handling and the relay itself (hypothesis).

Whatever bytes a publisher sends: the parser either reads them or says why not,
the deciding never raises, what the relay publishes decodes as the dict-level
rules below say it should, and on the simulator every message ends delivered or parked,
exactly once, with the relay still running.
"""

from __future__ import annotations

import struct
from collections import Counter
from typing import Any

import hostile_corpus as corpus
from amqp.basic_message import Message as AmqpMessage
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kombu_ladder import Relay, declare, readable, wire
from kombu_ladder.carry import CARRIED_PROPERTIES
from kombu_ladder.contract import (
    CONTENT_TYPE,
    CONTROL,
    DUE_AT,
    MESSAGE_TYPE,
    PARKING,
    SCHEDULE_HEADERS,
    TARGET_EXCHANGE,
    TARGET_ROUTING_KEY,
)
from kombu_ladder.envelope import (
    LOCAL_HEADERS,
    Deliver,
    Hop,
    Park,
    decide,
    delivered_content_type,
    delivered_mode,
    strip_death,
)
from kombu_ladder.relay import outgoing
from kombu_ladder.simulator import SimulatedBroker

NOW = 1_800_000_000_000


def strip_for_delivery(headers: dict[str, Any]) -> dict[str, Any]:
    """The dict-level rule: the application headers alone (no x-schedule-*, local or death headers)."""
    return {k: v for k, v in strip_death(headers).items() if k not in (*SCHEDULE_HEADERS, *LOCAL_HEADERS)}


def delivery_properties(headers: dict[str, Any], properties: dict[str, Any]) -> dict[str, Any]:
    """The dict-level rule: the carried properties, the content type and delivery mode the publisher chose,
    and a ``type`` of the publisher's own."""
    out = {k: properties[k] for k in CARRIED_PROPERTIES if properties.get(k) is not None}
    content_type = delivered_content_type(headers)
    if content_type is not None:
        out["content_type"] = content_type
    out["delivery_mode"] = delivered_mode(headers)
    if properties.get("type") not in (None, MESSAGE_TYPE):
        out["type"] = properties["type"]
    return out

# -- encoded header values, well formed but hostile -----------------------------------------

scalars = st.one_of(
    st.binary(max_size=40).map(corpus.text),
    st.text(max_size=20).map(lambda t: corpus.text(t.encode("utf-8", "surrogatepass"))),
    st.integers(-(2**63), 2**63 - 1).map(corpus.long64),
    st.integers(0, 2**64 - 1).map(lambda n: b"T" + struct.pack(">Q", n)),
    st.integers(-128, 127).map(lambda n: b"b" + struct.pack(">b", n)),
    st.integers(-(2**15), 2**15 - 1).map(lambda n: b"s" + struct.pack(">h", n)),
    st.integers(-(2**31), 2**31 - 1).map(lambda n: b"I" + struct.pack(">i", n)),
    st.floats(width=32, allow_nan=False).map(lambda f: b"f" + struct.pack(">f", f)),
    st.floats(allow_nan=False).map(lambda f: b"d" + struct.pack(">d", f)),
    st.booleans().map(lambda b: b"t" + bytes((b,))),
    st.just(b"V"),
    st.binary(max_size=20).map(lambda b: b"x" + struct.pack(">I", len(b)) + b),
)
names = st.one_of(st.binary(max_size=12), st.sampled_from([b"x-death", b"x-first-death-queue",
                                                           b"x-ladder-delivery-mode", b"x-ladder-refusals",
                                                           b"compression", b"route"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(st.tuples(names, inner), max_size=3).map(corpus.ftable),
    st.lists(inner, max_size=3).map(corpus.farray)), max_leaves=8)
deep = st.tuples(st.integers(90, 300), st.sampled_from("FA")).map(lambda d: corpus.nested(*d))


@st.composite
def schedule_headers(draw: Any) -> list[tuple[bytes, bytes]]:
    """The schedule headers: valid, missing, of the wrong type, or hostile values, in any order."""
    valid = {TARGET_EXCHANGE: corpus.text(""), TARGET_ROUTING_KEY: corpus.text(draw(st.sampled_from(
                 ["fz.a", "fz.b", "fz.nowhere", "k" * 256]))),
             DUE_AT: corpus.long64(NOW + draw(st.sampled_from([-5000, -1, 0, 1500, 12_000]))),
             CONTENT_TYPE: corpus.text(draw(st.sampled_from(["text/plain", "t" * 256])))}
    hostile = draw(st.booleans())  # else mostly valid: the relay must deliver those
    items = []
    for name, item in valid.items():
        choice = draw(st.integers(0, 9))
        if hostile and choice == 0:
            continue
        items.append((name.encode(), draw(values) if hostile and choice < 3 else item))
    extra = st.tuples(names, st.one_of(values, deep)) if hostile else st.tuples(st.sampled_from([b"a", b"b"]), scalars)
    items += draw(st.lists(extra, max_size=4))
    return draw(st.permutations(items))


fields = st.fixed_dictionaries({}, optional={
    "content_type": st.binary(max_size=30), "content_encoding": st.binary(max_size=10),
    "delivery_mode": st.integers(0, 255), "priority": st.integers(0, 255), "correlation_id": st.binary(max_size=10),
    "message_id": st.binary(max_size=10), "timestamp": st.integers(0, 2**64 - 1),
    "type": st.sampled_from([b"ScheduledMessage", b"app.type", b"\xff"]), "user_id": st.just(b"guest"),
    "expiration": st.just(b"60000"), "app_id": st.binary(max_size=10),
})
sane_fields = st.fixed_dictionaries({"delivery_mode": st.sampled_from([1, 2])}, optional={
    "content_type": st.sampled_from([b"text/plain", b"application/json"]), "priority": st.integers(0, 9),
    "correlation_id": st.sampled_from([b"c1", b"c2"]), "type": st.sampled_from([b"ScheduledMessage", b"t"]),
})


@st.composite
def hostile_properties(draw: Any) -> bytes:
    headers = draw(st.one_of(st.none(), schedule_headers(), schedule_headers(), schedule_headers()))
    return corpus.properties(headers, **draw(st.one_of(fields, sane_fields, sane_fields)))


# -- the parser and the rules -----------------------------------------------------------

@given(st.binary(max_size=300))
def test_any_bytes_are_read_or_refused_with_a_wire_error(raw: bytes) -> None:
    try:
        props = wire.read_properties(raw)
    except wire.WireError:
        return
    assert wire.write_properties(props) == raw
    problem = readable.problem(props)
    assert problem is None or problem.isprintable()


@given(hostile_properties())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_hostile_properties_round_trip_byte_for_byte_and_are_judged_without_raising(raw: bytes) -> None:
    props = wire.read_properties(raw)
    assert wire.write_properties(props) == raw
    if readable.problem(props) is not None:
        return
    headers, _ = outgoing.views(props)
    decision = decide(headers, NOW)
    assert isinstance(decision, (Deliver, Hop, Park))
    if isinstance(decision, Park):
        assert decision.reason.split(":")[0] in ("malformed", "unroutable", "refused")


@given(st.dictionaries(st.text(max_size=10), st.one_of(st.none(), st.integers(), st.text(), st.binary(),
                                                      st.floats(), st.booleans(), st.lists(st.integers())),
                       max_size=8),
       st.dictionaries(st.sampled_from([TARGET_EXCHANGE, TARGET_ROUTING_KEY, DUE_AT, CONTENT_TYPE]),
                       st.one_of(st.none(), st.integers(), st.text(), st.binary(), st.floats(), st.booleans())))
def test_decide_never_raises_and_its_reasons_are_printable_and_bounded(extra: dict[str, Any],
                                                                      schedule: dict[str, Any]) -> None:
    decision = decide({**extra, **schedule}, NOW)
    if isinstance(decision, Park):
        assert decision.reason.isprintable() and len(decision.reason) < 1500


@given(st.dictionaries(st.text(min_size=1, max_size=10).filter(lambda k: not k.startswith("x-")),
                       st.one_of(st.integers(-(2**31), 2**31 - 1), st.text(max_size=10), st.booleans(),
                                 st.lists(st.integers(0, 9), max_size=3)), max_size=6),
       st.sampled_from(["text/plain", "application/json"]), st.sampled_from([1, 2, None]))
def test_the_raw_delivery_decodes_as_the_dict_rules_say(app: dict[str, Any], content_type: str,
                                                        mode: Any) -> None:
    """The bytes the relay delivers read back (with py-amqp) exactly as strip_for_delivery and
    delivery_properties compute from the decoded message."""
    headers = {**app, TARGET_EXCHANGE: "", TARGET_ROUTING_KEY: "q", DUE_AT: NOW, CONTENT_TYPE: content_type,
               "x-death": [{"count": 1}], **({"x-ladder-delivery-mode": mode} if mode else {})}
    message = AmqpMessage(b"", application_headers=headers, content_type="application/octet-stream",
                          correlation_id="c", type="ScheduledMessage", delivery_mode=2, expiration="5")
    raw = message._serialize_properties()
    props = wire.read_properties(raw)
    view, fields = outgoing.views(props)
    delivered = corpus.decoded(outgoing.encode("deliver", props, view or {}))
    decoded = corpus.decoded(raw)
    assert delivered.pop("application_headers") == strip_for_delivery(decoded["application_headers"])
    assert delivered == delivery_properties(decoded["application_headers"], decoded)


# -- the relay, end to end on the simulator -------------------------------------------------

@given(st.lists(st.tuples(hostile_properties(), st.binary(max_size=30)), min_size=1, max_size=12))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_every_hostile_message_is_delivered_or_parked_exactly_once(messages: list[tuple[bytes, bytes]]) -> None:
    broker = SimulatedBroker(start=NOW / 1000)
    try:
        with broker.connection() as conn:
            channel = conn.channel()
            declare(channel)
            for queue in ("fz.a", "fz.b"):
                channel.queue_declare(queue=queue, durable=True, auto_delete=False)
            relay = broker.host(Relay())
            for n, (raw, body) in enumerate(messages):
                corpus.publish(channel, corpus.Case(str(n), raw, b"%d:" % n + body, ""))
            for _ in range(40):
                broker.advance(1)
            seen = Counter(body for queue in ("fz.a", "fz.b", PARKING) for _, body in corpus.take_raw(channel, queue))
            assert seen == Counter(b"%d:" % n + body for n, (_, body) in enumerate(messages))
            assert broker.depth(CONTROL) == 0 and not relay.core.publisher.pending.jobs
            counters = relay.counters
            assert counters.delivered + counters.parked == len(messages)
            event(f"delivered: {counters.delivered > 0}, parked: {counters.parked > 0}, hopped: {counters.hops > 0}")
    finally:
        broker.close()
