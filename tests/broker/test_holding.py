"""The relay's hold capacity: when full it falls back to the 1 s rung; on stop it gives held messages back."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

from backends import declare_target, depth

from kombu_ladder import LadderProducer, declare
from kombu_ladder.contract import CONTROL
from kombu_ladder.relay import Relay


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
            assert second.counters.delivered == 3
