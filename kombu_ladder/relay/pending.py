"""Bookkeeping of the relay's work in flight: taken messages, unconfirmed publishes, exact return keys (no I/O)."""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

__all__ = ["Job", "Publish", "Pending", "Key"]

#: What identifies a publish exactly: exchange, routing key, encoded properties and body.
#: RabbitMQ returns a message with the very bytes it was published with.
Key = tuple[str, str, bytes, bytes]


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

    @property
    def key(self) -> Key:
        """What identifies it exactly among publishes in flight (see :data:`Key`)."""
        return (self.exchange, self.routing_key, self.raw, self.job.body)


@dataclass
class Pending:
    """Taken messages in consumption order, and the publishes in flight on the current channel.

    Two publishes with the same :data:`Key` are never in flight together: the
    second is held until the first is confirmed, so a ``basic.return`` (which
    carries no sequence number) always names exactly one publish.
    """

    jobs: "OrderedDict[int, Job]" = field(default_factory=OrderedDict)
    sent: dict[int, Publish] = field(default_factory=dict)
    _keys: dict[Key, Publish] = field(default_factory=dict)
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
        """Give ``publish`` the next sequence number and return True, or hold it (False) behind its twin."""
        key = publish.key
        if key in self._keys:
            self._held.setdefault(key, deque()).append(publish)
            return False
        self._seq += 1
        publish.seq = self._seq
        self.sent[self._seq] = publish
        self._keys[key] = publish
        return True

    def confirmed(self, tag: int, multiple: bool) -> list[Publish]:
        """Remove and return the publishes a broker ack or nack covers, in sequence order."""
        if multiple:  # ``sent`` is in sequence order: stop at the first one past ``tag``, not scan a big window
            seqs = list(itertools.takewhile(lambda s: s <= tag, self.sent))
        else:
            seqs = [tag] if tag in self.sent else []
        out = []
        for seq in seqs:
            publish = self.sent.pop(seq)
            if self._keys.get(publish.key) is publish:
                del self._keys[publish.key]
            out.append(publish)
        return out

    def unhold(self, key: Key) -> Optional[Publish]:
        """Return the next publish held behind ``key``, now free, or None."""
        held = self._held.get(key)
        if not held:
            return None
        publish = held.popleft()
        if not held:
            del self._held[key]
        return publish

    def returned(self, exchange: str, routing_key: str, raw: bytes, body: bytes) -> Optional[Publish]:
        """Return the publish in flight that a ``basic.return`` with these bytes is about, or None."""
        publish = self._keys.get((exchange, routing_key, raw, body))
        return publish if publish is not None and publish.returned is None else None

    def lose_channel(self) -> tuple[list[Publish], list[Publish]]:
        """The publishing channel is gone: forget its numbering; return (unconfirmed, held) publishes, in order."""
        lost = [self.sent[s] for s in sorted(self.sent)]
        held = [p for q in self._held.values() for p in q]
        self.sent.clear()
        self._keys.clear()
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
