"""Bookkeeping of the relay's work in flight: taken messages, unconfirmed publishes, returns matched (no I/O)."""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from .. import wire

__all__ = ["Job", "Publish", "Pending", "Key"]

#: What a ``basic.return`` names of its publish: exchange, routing key and body. The properties
#: it carries may be re-encoded by the broker (RabbitMQ 4.x does; see :func:`wire.normal_form`).
Key = tuple[str, str, bytes]


@dataclass(eq=False)
class Job:
    """One message taken from the control queue, until it is acked."""

    #: Its delivery tag on the consuming channel.
    tag: int
    body: bytes
    #: Its encoded properties as they arrived.
    raw: bytes
    #: Its parsed properties (a :class:`kombu_ladder.wire.Properties`), once read.
    props: Any = None
    #: Its header table, decoded on demand (see :func:`kombu_ladder.relay.outgoing.views`).
    headers: Any = None
    #: The publish that will settle it (a delivery, hop, retry or park).
    publish: Optional["Publish"] = None
    #: Why it is parked (its ``x-ladder-parked-reason``); counted by reason once confirmed.
    park_reason: str = ""
    #: Failed attempts of its current publish (nacked parks or hops), for the back-off.
    attempts: int = 0
    _done: bool = field(default=False, repr=False)
    #: The :class:`Pending` that tracks it: told when it finishes, so that a release finds it at once.
    _owner: Optional["Pending"] = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        """Its publish was confirmed (or it was dropped): it may be acked."""
        return self._done

    @done.setter
    def done(self, value: bool) -> None:
        if value and not self._done and self._owner is not None:
            self._owner._finished.append(self)
        self._done = value


@dataclass(eq=False)
class Publish:
    """One publish on the relay's publishing channel."""

    job: Job
    #: "deliver", "hop", "retry" (a refused delivery sent back into a rung) or "park".
    kind: str
    exchange: str
    routing_key: str
    #: The encoded properties it carries.
    raw: bytes
    #: Its confirm sequence number on the publishing channel; None until sent.
    seq: Optional[int] = None
    #: The broker returned it (unroutable): why. Its replacement settles the job.
    returned: Optional[str] = None
    #: When (relay clock, seconds) a publish waiting for its back-off may be sent again.
    due: float = 0.0
    _normal: Any = field(default=False, repr=False)

    @property
    def key(self) -> Key:
        """What a return of it names (see :data:`Key`)."""
        return (self.exchange, self.routing_key, self.job.body)

    @property
    def normal(self) -> Optional[bytes]:
        """Its properties' :func:`~kombu_ladder.wire.normal_form` (None: malformed), worked out once."""
        if self._normal is False:
            self._normal = wire.normal_form(self.raw)
        return self._normal  # type: ignore[no-any-return]


class _Flight:
    """The unconfirmed publishes that share one :data:`Key`, in sequence order.

    They can be told apart when a return comes back: either their properties are
    the same bytes (identical messages, interchangeable: a return may be credited
    to any of them), or their normal forms differ. :meth:`admits` keeps it so.
    While every publish in flight has the same encoding (nearly always one publish:
    bodies differ), no normal form is worked out: it costs a decode and an encode.
    """

    __slots__ = ("publishes", "_only", "_raws")

    def __init__(self) -> None:
        self.publishes: list[Publish] = []
        #: The one encoding in flight, while every publish has it (None: none in flight, or see ``_raws``).
        self._only: Optional[bytes] = None
        #: Once encodings differ: normal form -> the one encoding in flight with it (malformed: None -> its bytes).
        self._raws: Optional[dict[Optional[bytes], bytes]] = None

    def _table(self) -> dict[Optional[bytes], bytes]:
        """The normal forms in flight, worked out when a second encoding joins."""
        if self._raws is None:
            self._raws = {self.publishes[0].normal: self.publishes[0].raw} if self.publishes else {}
        return self._raws

    def admits(self, publish: Publish) -> bool:
        """Whether ``publish`` can fly with these and still be named exactly by a return."""
        if not self.publishes:
            return True
        if self._raws is None and publish.raw == self._only:
            return True  # twins: the common case costs no decoding
        raws = self._table()
        if len(raws) == 1 and publish.raw in raws.values():
            return True
        normal = publish.normal
        if normal is None or None in raws:
            return False  # malformed properties are told apart by nothing but their being alone
        return raws.get(normal, publish.raw) == publish.raw

    def add(self, publish: Publish) -> None:
        if not self.publishes:
            self._only, self._raws = publish.raw, None
        elif self._raws is not None or publish.raw != self._only:
            raws = self._table()
            if publish.raw not in raws.values():
                raws[publish.normal] = publish.raw
        self.publishes.append(publish)

    def remove(self, publish: Publish) -> None:
        self.publishes.remove(publish)
        if not self.publishes:
            self._only, self._raws = None, None
        elif self._raws is not None and not any(p.raw == publish.raw for p in self.publishes):
            self._raws = {raw_normal: raw for raw_normal, raw in self._raws.items() if raw != publish.raw}

    def returned(self, raw: bytes) -> Optional[Publish]:
        """The publish a return carrying properties ``raw`` names: the first such not returned yet."""
        open_ = [p for p in self.publishes if p.returned is None]
        if not open_:
            return None
        if len({p.raw for p in open_}) == 1:
            return open_[0]  # one encoding in flight: it is this one (or its identical twin)
        normal = wire.normal_form(raw)
        return next((p for p in open_ if normal is not None and p.normal == normal), None)


@dataclass
class Pending:
    """Taken messages in consumption order, and the publishes in flight on the current channel.

    A ``basic.return`` carries no sequence number. RabbitMQ sends it before the
    confirm of the same publish (on 3.10 and 4.0 alike), so the publish it names
    is still unconfirmed; it names the exchange, routing key and body exactly,
    and the properties up to the broker's re-encoding (:func:`wire.normal_form`).
    Publishes sharing a :data:`Key` fly together only when that tells them apart
    or they are identical (then any one may take the return: parking one of two
    identical messages and delivering the other is what happened); otherwise the
    later one is held until the earlier is confirmed.
    """

    jobs: "OrderedDict[int, Job]" = field(default_factory=OrderedDict)
    sent: dict[int, Publish] = field(default_factory=dict)
    _flights: dict[Key, _Flight] = field(default_factory=dict)
    _held: dict[Key, "deque[Publish]"] = field(default_factory=dict)
    _seq: int = 0
    #: Jobs finished since the last :meth:`release`, in the order they finished.
    _finished: list[Job] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.sent) + sum(len(q) for q in self._held.values())

    def track(self, job: Job) -> Job:
        """Record ``job``, just taken from the control queue."""
        job._owner = self
        self.jobs[job.tag] = job
        return job

    def submit(self, publish: Publish) -> bool:
        """Give ``publish`` the next sequence number and return True, or hold it (False) until a return
        could not mistake it for a publish in flight (see the class)."""
        key = publish.key
        flight = self._flights.get(key)
        if flight is None:
            flight = self._flights[key] = _Flight()
        elif key in self._held or not flight.admits(publish):
            self._held.setdefault(key, deque()).append(publish)
            return False
        self._fly(publish, flight)
        return True

    def _fly(self, publish: Publish, flight: _Flight) -> None:
        self._seq += 1
        publish.seq = self._seq
        self.sent[self._seq] = publish
        flight.add(publish)

    def confirmed(self, tag: int, multiple: bool) -> list[Publish]:
        """Remove and return the publishes a broker ack or nack covers, in sequence order."""
        if multiple:  # ``sent`` is in sequence order: stop at the first one past ``tag``, not scan a big window
            seqs = list(itertools.takewhile(lambda s: s <= tag, self.sent))
        else:
            seqs = [tag] if tag in self.sent else []
        out = []
        for seq in seqs:
            publish = self.sent.pop(seq)
            flight = self._flights[publish.key]
            flight.remove(publish)
            if not flight.publishes and publish.key not in self._held:
                del self._flights[publish.key]
            out.append(publish)
        return out

    def unhold(self, key: Key) -> list[Publish]:
        """Return the publishes held behind ``key`` that may fly now, in order (they are submitted)."""
        held = self._held.get(key)
        if not held:
            return []
        flight = self._flights[key]  # kept while publishes are held behind it
        out: list[Publish] = []
        while held and flight.admits(held[0]):
            publish = held.popleft()
            self._fly(publish, flight)
            out.append(publish)
        if not held:
            del self._held[key]
        return out

    def returned(self, exchange: str, routing_key: str, raw: bytes, body: bytes) -> Optional[Publish]:
        """Return the unconfirmed publish that a ``basic.return`` with these fields names, or None."""
        flight = self._flights.get((exchange, routing_key, body))
        return flight.returned(raw) if flight is not None else None

    def lose_channel(self) -> tuple[list[Publish], list[Publish]]:
        """The publishing channel is gone: forget its numbering; return (unconfirmed, held) publishes, in order."""
        lost = [self.sent[s] for s in sorted(self.sent)]
        held = [p for q in self._held.values() for p in q]
        self.sent.clear()
        self._flights.clear()
        self._held.clear()
        self._seq = 0
        return lost, held

    def forget_jobs(self) -> None:
        """The consuming channel is gone: the broker took its messages back, so none may be acked."""
        self.jobs.clear()
        self._finished.clear()

    def release(self) -> tuple[Optional[int], list[int]]:
        """Remove every finished job; return the tag to ack with ``multiple`` and the tags to ack alone.

        The finished jobs at the front (in consumption order) are acked with one
        ``multiple`` ack; finished jobs behind an unfinished one (a park waiting
        for its back-off, say) are acked one by one, so that they do not wait.
        It costs what was finished since the last release, not the window: a relay
        holding 2,000 messages at the front settles a hop without walking past them.
        """
        jobs = self.jobs
        finished, self._finished = self._finished, []
        last = None
        while jobs:
            job = next(iter(jobs.values()))
            if not job.done:
                break
            jobs.popitem(last=False)
            last = job.tag
        singles = []
        for job in finished:  # the finished ones the front did not take: behind an unfinished job
            if job.done and jobs.get(job.tag) is job:
                del jobs[job.tag]
                singles.append(job.tag)
        singles.sort()  # consumption order (delivery tags grow on a channel)
        return last, singles

    def waiting(self) -> Iterator[Job]:
        """The jobs not finished yet, in consumption order."""
        return (job for job in self.jobs.values() if not job.done)
