"""The relay's hold capacity and byte budget: when full it takes a rung, never delivering early; on stop it
gives held messages back."""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from backends import declare_target, depth, get

from kombu_ladder import LadderProducer, declare
from kombu_ladder.contract import CONTROL, PARKED_REASON, PARKING
from kombu_ladder.observe import lateness_seconds
from kombu_ladder.relay import Relay, outgoing
from kombu_ladder.relay.publisher import Publisher


@contextmanager
def running(backend: Any, conn: Any, **options: Any) -> Iterator[Relay]:
    relay = Relay(conn.clone(), clock=backend.clock, **options)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    assert relay.ready.wait(20)
    try:
        yield relay
    finally:
        relay.stop()
        thread.join(15)  # real time: the relay's loop wakes at least every second
        assert not thread.is_alive()
        relay.connection.release()


def published_lateness(monkeypatch: Any) -> list[float]:
    """How late each delivery is published from now on (relay clock minus due time; negative: early)."""
    sent: list[float] = []
    transmit = Publisher._transmit

    def recording(self: Publisher, publish: Any) -> None:
        if publish.kind == "deliver":
            sent.append(lateness_seconds(publish.job.headers, self.clock()))
        transmit(self, publish)

    monkeypatch.setattr(Publisher, "_transmit", recording)
    return sent


def test_a_full_relay_falls_back_to_the_1s_rung_and_still_delivers_every_message(ladder_backend: Any) -> None:
    clock = ladder_backend.clock
    with ladder_backend.connection() as conn:
        declare(conn)
        declare_target(conn, "t.hold.full")
        with running(ladder_backend, conn, hold_capacity=2) as relay:
            producer = LadderProducer(conn.default_channel, clock=clock)
            start = clock()
            for n in range(5):
                producer.publish(b"%d" % n, routing_key="t.hold.full", countdown=4.5)
            ladder_backend.wait_until(lambda: depth(conn, "t.hold.full") == 5, 20, "five deliveries")
            ladder_backend.wait_until(lambda: relay.counters.delivered == 5, 10, "the deliveries' confirms")
            # two held from the first expiry on; the other three took 1 s hops while the relay was full
            assert relay.counters.hops >= 3
            assert clock() - start >= 4.5 - 1.0
            assert len(relay.core.held) == 0


def test_a_stopping_relay_gives_its_held_messages_back(ladder_backend: Any) -> None:
    clock = ladder_backend.clock
    with ladder_backend.connection() as conn:
        declare(conn)
        declare_target(conn, "t.hold.stop")
        with running(ladder_backend, conn, hold_window=30) as relay:
            producer = LadderProducer(conn.default_channel, clock=clock)
            for n in range(3):
                producer.publish(b"%d" % n, routing_key="t.hold.stop", countdown=20)
            ladder_backend.wait_until(lambda: len(relay.core.held) == 3, 20, "three messages held")
            assert relay.counters.delivered == 0
        # given back at once (requeued), not when the broker notices a closed channel
        assert depth(conn, CONTROL) == 3
        assert depth(conn, "t.hold.stop") == 0
        with running(ladder_backend, conn) as second:
            ladder_backend.wait_until(lambda: depth(conn, "t.hold.stop") == 3, 30, "the three delivered")
            # counted at the confirm, which may come after the queue has the message (seen on a loaded 4.3)
            ladder_backend.wait_until(lambda: second.counters.delivered == 3, 10, "the three deliveries' confirms")


def test_over_its_byte_budget_a_relay_stops_taking_messages_and_delivers_every_one_never_early(
        ladder_backend: Any, monkeypatch: Any, caplog: Any) -> None:
    """16 bodies of 64 KiB due together, a budget of 256 KiB: three are held, the relay stops taking messages
    (the rest wait in the control queue, none requeued), takes them again once the held ones are delivered."""
    sent = published_lateness(monkeypatch)
    caplog.set_level(logging.INFO, logger="kombu_ladder.relay")
    clock = ladder_backend.clock
    with ladder_backend.connection() as conn:
        declare(conn)
        declare_target(conn, "t.hold.bytes")
        with running(ladder_backend, conn, hold_bytes=256 * 1024) as relay:
            producer = LadderProducer(conn.default_channel, clock=clock)
            for n in range(16):
                producer.publish(bytes([n]) * 65536, routing_key="t.hold.bytes", countdown=4)
            ladder_backend.wait_until(lambda: relay.counters.delivered == 16, 40, "16 deliveries confirmed")
            assert depth(conn, "t.hold.bytes") == 16
            assert len(sent) == 16 and min(sent) >= -0.001, f"a delivery published early: {sorted(sent)[:3]}"
            logged = [r.getMessage() for r in caplog.records]
            assert any("takes no new messages until held ones are delivered" in m for m in logged)
            assert any("it takes new messages again" in m for m in logged)
            assert relay.core.held.bytes == 0 and not relay.core.paused
            assert relay.counters.parked == 0


def test_a_burst_ten_times_the_hold_capacity_is_delivered_with_none_early(ladder_backend: Any,
                                                                          monkeypatch: Any) -> None:
    """300 messages due in one second, a hold capacity of 30: the relay holds what it can and the rest take
    the 1 s rung or wait in the control queue: each delivery is published at or after its due time."""
    sent = published_lateness(monkeypatch)
    clock = ladder_backend.clock
    with ladder_backend.connection() as conn:
        declare(conn)
        declare_target(conn, "t.hold.burst")
        with running(ladder_backend, conn, hold_capacity=30) as relay:
            producer = LadderProducer(conn.default_channel, clock=clock)
            due = clock() + 6.0
            for n in range(300):
                producer.publish(b"%d" % n, routing_key="t.hold.burst", countdown=due + n / 300 - clock())
            ladder_backend.wait_until(lambda: relay.counters.delivered == 300, 60, "300 deliveries confirmed")
            assert depth(conn, "t.hold.burst") == 300
            assert len(sent) == 300 and min(sent) >= -0.001, f"a delivery published early: {sorted(sent)[:3]}"
            assert relay.counters.hops > 0, "more than the capacity: some took a rung"


def test_a_held_message_that_fails_at_its_due_time_is_parked_and_the_relay_goes_on(
        ladder_backend: Any, monkeypatch: Any) -> None:
    """A held delivery is encoded at its due time, outside the message's arrival: a failure then still parks
    it with the reason (nothing lost) and the other held message is delivered."""
    encode = outgoing.encode

    def failing(kind: str, props: Any, headers: Any = None, **kw: Any) -> bytes:
        if kind == "deliver" and "x-test-boom" in (headers or {}):
            raise RuntimeError("boom at the due time")
        return encode(kind, props, headers if headers is not None else {}, **kw)

    monkeypatch.setattr(outgoing, "encode", failing)
    clock = ladder_backend.clock
    with ladder_backend.connection() as conn:
        declare(conn)
        declare_target(conn, "t.hold.boom")
        with running(ladder_backend, conn) as relay:
            producer = LadderProducer(conn.default_channel, clock=clock)
            producer.publish(b"doomed", routing_key="t.hold.boom", countdown=4, headers={"x-test-boom": 1})
            producer.publish(b"kept", routing_key="t.hold.boom", countdown=4)
            ladder_backend.wait_until(lambda: len(relay.core.held) == 2, 20, "both held by the relay")
            ladder_backend.wait_until(lambda: relay.counters.parked == 1 and relay.counters.delivered == 1, 20,
                                      "one parked and one delivered at the due time")
            assert len(relay.core.held) == 0
        kept = get(conn, "t.hold.boom")
        assert kept is not None and kept.body == b"kept"
        parked = get(conn, PARKING)
        assert parked is not None and parked.body == b"doomed"
        assert parked.headers[PARKED_REASON] == ("unhandled: the relay failed on this message: RuntimeError: "
                                                 "boom at the due time")
