"""Pure tests of the relay's bookkeeping (kombu_ladder.relay.pending): no broker."""

from __future__ import annotations

import struct
from typing import Any

from kombu_ladder import wire
from kombu_ladder.relay.pending import Job, Pending, Publish


def job(tag: int, body: bytes = b"x") -> Job:
    return Job(tag=tag, body=body, raw=b"\x00\x00")


def deliver(j: Job, routing_key: str = "q", raw: bytes = b"\x00\x00") -> Publish:
    return Publish(j, "deliver", "", routing_key, raw)


def sent(pending: Pending, *publishes: Publish) -> list[int]:
    for publish in publishes:
        pending.track(publish.job)
        assert pending.submit(publish)
    return [p.seq for p in publishes]  # type: ignore[misc]


def test_release_acks_the_finished_front_with_multiple_and_the_rest_one_by_one() -> None:
    pending = Pending()
    jobs = [job(tag) for tag in (1, 2, 3, 4)]
    for j in jobs:
        pending.track(j)
    jobs[1].done = jobs[3].done = True
    assert pending.release() == (None, [2, 4]), "tag 1 is unfinished: 2 and 4 are acked alone"
    jobs[0].done = True
    assert pending.release() == (1, [])
    jobs[2].done = True
    assert pending.release() == (3, [])
    assert not pending.jobs


def test_a_multiple_confirm_covers_every_publish_up_to_its_tag_in_order() -> None:
    pending = Pending()
    seqs = sent(pending, *(deliver(job(tag), routing_key=f"q{tag}") for tag in (1, 2, 3)))
    assert seqs == [1, 2, 3]
    assert [p.seq for p in pending.confirmed(2, multiple=True)] == [1, 2]
    assert pending.confirmed(2, multiple=False) == [], "already confirmed"
    assert [p.seq for p in pending.confirmed(3, multiple=False)] == [3]
    assert len(pending) == 0


def test_confirms_out_of_order_remove_exactly_what_they_cover() -> None:
    """RabbitMQ confirms an unroutable publish at once and a routed one later: acks come out of order."""
    pending = Pending()
    sent(pending, *(deliver(job(tag), routing_key=f"q{tag}") for tag in (1, 2, 3)))
    assert [p.seq for p in pending.confirmed(3, multiple=False)] == [3]
    assert [p.seq for p in pending.confirmed(2, multiple=True)] == [1, 2]


def props(message_id: bytes, *headers: tuple[bytes, bytes]) -> bytes:
    return wire.write_properties(wire.Properties(fields={"message_id": message_id}, headers=list(headers) or None))


#: A 64-bit integer as py-amqp writes it (``L``) and as RabbitMQ 4.x writes it back (``l``).
LONG_L, LONG_l = b"L" + struct.pack(">q", 7), b"l" + struct.pack(">q", 7)


def test_a_return_names_exactly_one_publish_even_among_identical_bodies() -> None:
    pending = Pending()
    routed = deliver(job(1, b"same"), raw=props(b"route-yes"))
    unroutable = deliver(job(2, b"same"), raw=props(b"route-no"))
    sent(pending, routed, unroutable)
    assert pending.returned("", "q", props(b"route-no"), b"same") is unroutable
    assert pending.returned("", "q", props(b"route-yes"), b"same") is routed
    assert pending.returned("", "elsewhere", props(b"route-no"), b"same") is None


def test_a_return_re_encoded_as_rabbitmq_4_does_still_names_its_publish() -> None:
    """RabbitMQ 4.0 returns the header table sorted, first of equal names kept, ``L`` written ``l`` (measured)."""
    pending = Pending()
    published = props(b"a", (b"zz", LONG_L), (b"aa", b"A" + struct.pack(">I", 9) + LONG_L), (b"zz", LONG_l))
    other = props(b"b", (b"zz", LONG_L))
    first, second = deliver(job(1, b"same"), raw=published), deliver(job(2, b"same"), raw=other)
    sent(pending, first, second)
    as_4_0_returns_it = props(b"a", (b"aa", b"A" + struct.pack(">I", 9) + LONG_l), (b"zz", LONG_l))
    assert as_4_0_returns_it != published
    assert pending.returned("", "q", as_4_0_returns_it, b"same") is first
    assert pending.returned("", "q", props(b"b", (b"zz", LONG_l)), b"same") is second
    assert pending.returned("", "q", props(b"c"), b"same") is None, "properties that match neither"


def test_identical_publishes_fly_together_and_a_return_takes_exactly_one() -> None:
    """Twins are interchangeable: no waiting for each other's confirm; each return is credited once."""
    pending = Pending()
    twins = [deliver(job(tag, b"twin"), raw=props(b"m")) for tag in (1, 2, 3)]
    assert sent(pending, *twins) == [1, 2, 3]
    assert pending.returned("", "q", props(b"m"), b"twin") is twins[0]
    twins[0].returned = "unroutable"
    assert pending.returned("", "q", props(b"m"), b"twin") is twins[1], "the returned one is not taken twice"
    twins[1].returned = "unroutable"
    assert [p.seq for p in pending.confirmed(3, multiple=True)] == [1, 2, 3]
    assert pending.returned("", "q", props(b"m"), b"twin") is None, "confirmed: no longer in flight"


def test_publishes_a_return_could_confuse_wait_for_the_earlier_ones_confirm() -> None:
    """Same exchange, routing key and body, and properties either malformed or equal up to re-encoding."""
    pending = Pending()
    first = deliver(job(1, b"b"), raw=props(b"m", (b"x", LONG_L)))
    same_once_re_encoded = deliver(job(2, b"b"), raw=props(b"m", (b"x", LONG_l)))
    malformed = deliver(job(3, b"b"), raw=b"\xff\xff")
    behind = deliver(job(4, b"b"), raw=props(b"other"))
    sent(pending, first)
    for publish in (same_once_re_encoded, malformed, behind):
        pending.track(publish.job)
        assert not pending.submit(publish), "held"
    assert len(pending) == 4
    (confirmed,) = pending.confirmed(1, multiple=False)
    assert confirmed is first
    assert pending.unhold(first.key) == [same_once_re_encoded]
    pending.confirmed(same_once_re_encoded.seq, multiple=False)  # type: ignore[arg-type]
    assert pending.unhold(first.key) == [malformed], "malformed properties fly alone"
    assert pending.returned("", "q", b"\xff\xff", b"b") is malformed
    pending.confirmed(malformed.seq, multiple=False)  # type: ignore[arg-type]
    assert pending.unhold(first.key) == [behind]
    assert pending.unhold(first.key) == [] and behind.seq == 4


def test_losing_the_channel_returns_the_unconfirmed_in_order_and_numbers_from_one_again() -> None:
    pending = Pending()
    a, b, c = deliver(job(1), "a"), deliver(job(2), "b"), deliver(job(3), "a")
    sent(pending, a, b)
    pending.track(c.job)
    held = deliver(job(4), "a", raw=b"\xff\xff")  # malformed: waits for a's confirm
    pending.track(held.job)
    assert not pending.submit(held)
    pending.confirmed(1, multiple=False)
    lost, kept = pending.lose_channel()
    assert lost == [b] and kept == [held]
    assert len(pending) == 0
    assert pending.submit(c) and c.seq == 1


def test_forgetting_the_jobs_leaves_nothing_to_ack() -> None:
    pending = Pending()
    j = pending.track(job(7))
    j.done = True
    pending.forget_jobs()
    assert pending.release() == (None, [])


def test_a_release_costs_what_finished_since_the_last_not_the_window(monkeypatch: Any) -> None:
    """Issue 14: held messages sit unfinished at the front; settling a hop behind them must not walk past them."""
    reads = 0
    plain = Job.done

    def counted(j: Job) -> bool:
        nonlocal reads
        reads += 1
        return plain.fget(j)  # type: ignore[attr-defined, no-any-return]

    monkeypatch.setattr(Job, "done", property(counted, plain.fset))  # type: ignore[attr-defined]
    pending = Pending()
    for tag in range(1, 2001):  # held: unfinished for seconds
        pending.track(job(tag))
    hops = [pending.track(job(tag)) for tag in range(2001, 2101)]
    for hop in hops:
        hop.done = True
        reads = 0
        assert pending.release() == (None, [hop.tag])
        assert reads <= 3, f"{reads} reads of Job.done for one settled hop"
    assert len(pending.jobs) == 2000


def test_a_job_finished_twice_or_unfinished_again_is_acked_once_and_only_when_done() -> None:
    pending = Pending()
    a, b, c = (pending.track(job(tag)) for tag in (1, 2, 3))
    c.done = True
    c.done = True
    b.done = True
    b.done = False  # not finished after all (no caller does this; release must still not ack it)
    assert pending.release() == (None, [3])
    assert pending.release() == (None, [])
    a.done = b.done = True
    assert pending.release() == (2, [])
    assert not pending.jobs
