"""Publish overhead: LadderProducer.publish(countdown=) vs Producer.publish, ladder vs vanilla apply_async.

Measured in CPU time per publish (``time.process_time``: user and system time of this
process), as the publish target is: on a shared machine the wall clock also counts
other processes' turns. The wall-clock rates are kept beside them.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from kombu import Producer, Queue

from kombu_ladder.producer import LadderProducer

from .celery_app import make_app
from .common import Config, Progress, Vhost, log, median, payload

__all__ = ["PAIRS", "timed", "run"]

#: (baseline, contender) per comparison.
PAIRS = (("Producer.publish", "LadderProducer.publish(countdown=3600)"),
         ("vanilla apply_async(countdown=3600)", "ladder apply_async(countdown=3600)"))


def timed(n: int, publish: Callable[[int], Any], label: str) -> tuple[float, float]:
    """Call ``publish(i)`` ``n`` times; return messages per CPU second and per wall-clock second."""
    progress = Progress(n, label)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(n):
        publish(i)
        if i % 1000 == 0:
            progress.update(i)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    rate = n / max(cpu, 1e-9)
    progress.update(n)
    progress.close(f"{rate:.0f} per CPU second ({n / wall:.0f}/s wall)")
    return rate, n / wall


def _kombu_publishers(conn: Any, channels: list[Any]) -> dict[str, Callable[[int], Any]]:
    channel = conn.channel()
    channels.append(channel)
    Queue("bench.target", durable=True)(channel).declare()
    plain = Producer(channel)
    ladder = LadderProducer(channel)
    body = payload(0, 0)
    common: dict[str, Any] = {"exchange": "", "routing_key": "bench.target", "serializer": None,
              "content_type": "application/json", "delivery_mode": 2}
    ladder.publish(body, countdown=3600, **common)  # warm up: the topology is declared once per connection
    return {
        PAIRS[0][0]: lambda i: plain.publish(body, **common),
        PAIRS[0][1]: lambda i: ladder.publish(body, countdown=3600, **common),
    }


def _celery_publishers(url: str, stack: list[Any], channels: list[Any]) -> dict[str, Callable[[int], Any]]:
    out: dict[str, Callable[[int], Any]] = {}
    for label, mode in ((PAIRS[1][0], "vanilla"), (PAIRS[1][1], "ladder")):
        app = make_app(mode, url, os.devnull)
        task = app.tasks["bench.record"]
        producer_cm = app.producer_or_acquire()
        producer = producer_cm.__enter__()
        stack.append((app, producer_cm))
        channels.append(producer.channel)
        task.apply_async((0, 0), countdown=3600, producer=producer)  # warm up (declares)
        out[label] = (lambda t, p: lambda i: t.apply_async((i, 0), countdown=3600, producer=p))(task, producer)
    return out


class _NoSocket:
    """Each channel's ``basic_publish`` replaced, while in effect, by one that encodes the message's
    properties as py-amqp's frame writer does (``_serialize_properties``) and sends nothing."""

    def __init__(self, channels: list[Any]) -> None:
        self.channels = channels
        self.saved: list[tuple[Any, Any]] = []

    @staticmethod
    def _encode_only(message: Any, *args: Any, **kwargs: Any) -> None:
        message._serialize_properties()

    def __enter__(self) -> "_NoSocket":
        for channel in self.channels:
            self.saved.append((channel, channel.__dict__.get("basic_publish")))
            channel.basic_publish = self._encode_only
        return self

    def __exit__(self, *exc: Any) -> None:
        for channel, own in self.saved:
            if own is None:
                del channel.basic_publish  # py-amqp's own, from the class, again
            else:
                channel.basic_publish = own


def run(config: Config) -> dict[str, Any]:
    """Alternate baseline and contender rounds ``config.repeats`` times; report median rates and ratios.

    Then the same rounds once more with the channels' ``basic_publish`` encoding the
    properties and sending nothing: what each publish costs before py-amqp frames it and
    the socket takes it, the part where the ladder's work differs from the baseline's.
    """
    n = config.publish_n
    rates: dict[str, list[float]] = {}  # per CPU second
    wall: dict[str, list[float]] = {}
    unsent: dict[str, list[float]] = {}  # per CPU second, nothing sent
    stack: list[Any] = []
    channels: list[Any] = []
    with Vhost("publish") as vhost, vhost.connection() as conn:
        try:
            publishers = {**_kombu_publishers(conn, channels), **_celery_publishers(vhost.url, stack, channels)}
            for repeat in range(config.repeats):
                for baseline, contender in PAIRS:
                    for label in (baseline, contender):
                        log(f"publish overhead: repeat {repeat + 1}/{config.repeats}, {label}")
                        cpu_rate, wall_rate = timed(n, publishers[label], label)
                        rates.setdefault(label, []).append(cpu_rate)
                        wall.setdefault(label, []).append(wall_rate)
            with _NoSocket(channels):
                for repeat in range(config.repeats):
                    for baseline, contender in PAIRS:
                        for label in (baseline, contender):
                            log(f"publish overhead, nothing sent: repeat {repeat + 1}/{config.repeats}, {label}")
                            cpu_rate, _ = timed(n, publishers[label], f"{label}, nothing sent")
                            unsent.setdefault(label, []).append(cpu_rate)
        finally:
            for app, producer_cm in stack:
                producer_cm.__exit__(None, None, None)
                app.close()
    medians = {label: median(values) for label, values in rates.items()}
    # Each contender round is paired with the baseline round just before it; the median of those ratios
    # is the headline (robust to load that changes between rounds), the ratio of medians is shown too.
    paired = {contender: [c / b for b, c in zip(rates[baseline], rates[contender])] for baseline, contender in PAIRS}
    ratios = {contender: median(values) for contender, values in paired.items()}
    of_medians = {contender: medians[contender] / medians[baseline] for baseline, contender in PAIRS}
    # CPU µs per publish: the whole publish, and what it costs before anything is sent (medians)
    cpu_us = {label: 1e6 / value for label, value in medians.items()}
    unsent_us = {label: 1e6 / median(values) for label, values in unsent.items()}
    return {"n": n, "repeats": config.repeats, "rates": rates, "medians": medians, "ratios": ratios,
            "paired_ratios": paired, "ratio_of_medians": of_medians, "measure": "cpu", "wall_rates": wall,
            "cpu_us": cpu_us, "unsent_cpu_us": unsent_us}
