"""At most the contract's prefetch of publishes wait for their confirms: what a relay crash can duplicate."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any, Optional

import pytest

from kombu_ladder.contract import PREFETCH
from kombu_ladder.envelope import Deliver, Hop
from kombu_ladder.link import Guard
from kombu_ladder.notices import Notices
from kombu_ladder.relay.counters import Counters
from kombu_ladder.relay.pending import Job
from kombu_ladder.relay.publisher import Publisher

RAW = b"\x00\x00"  # no property set


class Channel:
    def __init__(self) -> None:
        self.events: dict[str, set[Any]] = defaultdict(set)
        self.auto_decode = True
        self.channel_id = 2

    def confirm_select(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeLink:
    """A connection that takes publishes and confirms them only when the test says so."""

    frame_max = 131072

    def __init__(self) -> None:
        self.guard = Guard()
        self.published: list[tuple[bytes, str, str]] = []
        self.channel: Optional[Channel] = None

    def sibling(self) -> Channel:
        self.channel = Channel()
        return self.channel

    def publish_raw(self, channel: Any, message: Any, exchange: str, routing_key: str) -> None:
        self.published.append((message.body, exchange, routing_key))

    def confirm(self, upto: int) -> None:
        """The broker acks publishes 1..``upto`` with one ``multiple`` ack."""
        assert self.channel is not None
        for handler in list(self.channel.events["basic_ack"]):
            handler(upto, True)


def publisher(link: FakeLink, acked: list[int], cap: int) -> Publisher:
    def ack(last: Optional[int], singles: list[int]) -> None:
        acked.extend(([last] if last is not None else []) + singles)

    out = Publisher(link, counters=Counters(), notices=Notices(logging.getLogger("test")),  # type: ignore[arg-type]
                    clock=lambda: 1000.0, max_refusals=5, exchange_check=None, ack=ack, max_unconfirmed=cap)
    out.open()
    return out


def send(out: Publisher, count: int, start: int = 1) -> list[Job]:
    jobs = []
    for tag in range(start, start + count):
        job = out.track(Job(tag=tag, body=f"m{tag}".encode(), raw=RAW))
        job.headers = {}
        decision = Deliver("", "target", 1_000_000) if tag % 2 else Hop(10)
        out.send(out.prepare(job, decision))
        jobs.append(job)
    return jobs


def test_a_burst_waits_its_turn_so_at_most_the_prefetch_is_unconfirmed() -> None:
    link, acked = FakeLink(), []
    out = publisher(link, acked, PREFETCH)
    send(out, 2000)  # held messages that fell due together
    assert len(link.published) == PREFETCH, "a crash now duplicates at most the prefetch"
    assert len(out) == 2000, "the rest are still the relay's work (a clean stop waits for them)"
    seen = PREFETCH
    while seen < 2000:
        link.confirm(seen)
        assert len(link.published) - seen <= PREFETCH
        assert len(link.published) == min(2000, seen + PREFETCH)
        seen = len(link.published)
    link.confirm(seen)
    assert len(out) == 0 and max(acked) == 2000
    assert [body for body, _, _ in link.published] == [f"m{n}".encode() for n in range(1, 2001)], "in order"


def test_no_cap_publishes_everything_at_once() -> None:
    link, acked = FakeLink(), []
    out = publisher(link, acked, 0)
    send(out, 300)
    assert len(link.published) == 300


def test_what_waits_under_the_cap_is_not_sent_once_its_consuming_channel_is_gone() -> None:
    """The broker took the messages back with the channel: a publish of one now would be a duplicate."""
    link, acked = FakeLink(), []
    out = publisher(link, acked, 10)
    send(out, 30)
    out.forget_jobs()
    link.confirm(10)
    assert len(link.published) == 10 and len(out) == 0 and acked == []


@pytest.mark.parametrize("bad", [-1])
def test_a_bad_cap_is_refused_naming_it(bad: int) -> None:
    with pytest.raises(ValueError, match="max_unconfirmed"):
        publisher(FakeLink(), [], bad)
