"""Cancellations: memory per live cancellation, relay start time with them, hop throughput with them."""

from __future__ import annotations

import argparse
import gc
import json
import math
import threading
import time
import tracemalloc
import uuid
from typing import Any

import amqp

from kombu_ladder.cancellation.records import STREAM, LiveSet, encode
from kombu_ladder.contract import CONTROL
from kombu_ladder.controlplane import CANCEL, declare_control_plane
from kombu_ladder.controlplane.codec import decode
from kombu_ladder.relay import Relay
from kombu_ladder.relay.cancelwatch import READ_BACK_MS
from kombu_ladder.topology import declare

from .common import Vhost, log

__all__ = ["memory", "start_time", "start_bounded", "hop_ratio", "run"]


def memory(n: int) -> dict[str, Any]:
    """Bytes the pure live set takes per cancellation (36-character UUID ids, as Celery's task ids)."""
    now = int(time.time() * 1000)
    records = [decode(encode(str(uuid.uuid4()), at=now, due=now + 3_600_000), CANCEL.exchange).each()[0]
               for _ in range(n)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    live = LiveSet()
    for record in records:
        live.add(record, now)
    # The ids are shared with the records here; a relay keeps the id strings alone, so count them.
    ids = sum(len(r.id) + 49 for r in records)  # sys.getsizeof of a 36-char ASCII str is 85 = 36 + 49
    used = tracemalloc.get_traced_memory()[0] - before + ids
    tracemalloc.stop()
    assert len(live) == n
    return {"n": n, "bytes": used, "bytes_per_id": round(used / n, 1), "mib": round(used / 2 ** 20, 1)}


def _fill(url: str, n: int, *, due_in_ms: int, ahead_ms: int = 0) -> None:
    """Append ``n`` cancellations to the stream, confirms pipelined, waited for at the end (written, in their
    ``at``, ``ahead_ms`` after the broker appends them)."""
    connection = amqp.Connection(url.split("//", 1)[1].split("/", 1)[0].split("@")[-1], userid="guest",
                                 password="guest", virtual_host=url.rsplit("/", 1)[1].replace("%2F", "/"))
    connection.connect()
    channel = connection.channel()
    declare_control_plane(channel)
    channel.confirm_select()
    acked = [0]
    channel.events["basic_ack"].add(lambda tag, multiple: acked.__setitem__(0, tag))
    now = int(time.time() * 1000) + ahead_ms
    for i in range(n):
        channel.basic_publish(amqp.Message(encode(str(uuid.uuid4()), at=now, due=now + due_in_ms), delivery_mode=2),
                              CANCEL.exchange, STREAM)
        if i % 5000 == 4999:
            while acked[0] < i - 20000:
                connection.drain_events(timeout=10)
    while acked[0] < n:
        connection.drain_events(timeout=30)
    connection.close()


def _relay(url: str, clock: Any = None) -> tuple[Relay, threading.Thread, Any]:
    from kombu import Connection

    conn = Connection(url)
    relay = Relay(conn) if clock is None else Relay(conn, clock=clock)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    return relay, thread, conn


def _started(url: str, clock: Any = None) -> tuple[float, int]:
    """Start a relay; return the seconds until it consumes the control queue and the live cancellations it kept."""
    started = time.monotonic()
    relay, thread, conn = _relay(url, clock)
    if not relay.ready.wait(1800):
        raise TimeoutError("the relay did not catch up within 30 min")
    seconds = time.monotonic() - started
    live = len(relay.core.cancels.live) if relay.core.cancels is not None else 0
    relay.stop()
    thread.join(30)
    conn.release()
    return seconds, live


def start_time(n: int) -> dict[str, Any]:
    """Seconds from a relay's start until it consumes the control queue, with ``n`` records to read first."""
    with Vhost("cancel-start") as vhost:
        started = time.monotonic()
        _fill(vhost.url, n, due_in_ms=7 * 24 * 3600 * 1000)
        log(f"cancellations: {n} records written in {time.monotonic() - started:.0f}s")
        seconds, live = _started(vhost.url)
    return {"n": n, "seconds": round(seconds, 2), "records_per_s": round(n / seconds), "live": live}


def start_bounded(old: int, live: int) -> dict[str, Any]:
    """Seconds from a relay's start until it consumes the control queue, when ``old`` records were written before
    the horizon it reads back to (:data:`~kombu_ladder.relay.cancelwatch.READ_BACK_MS`) and ``live`` after it:
    a relay starting after a year of revokes.

    The broker's append times, which the relay's start offset is about, are real, so the relay's clock is set
    ahead: its horizon falls between the two batches, two seconds apart. The ``live`` records say (in their
    ``at``) that they were written that much later too, so that they are live to it.
    """
    with Vhost("cancel-bounded") as vhost:
        started = time.monotonic()
        _fill(vhost.url, old, due_in_ms=7 * 24 * 3600 * 1000)
        time.sleep(1.5)  # a gap between the batches: append times are compared in whole seconds
        horizon = math.ceil(time.time())
        while time.time() < horizon + 1.5:
            time.sleep(0.1)
        ahead_s = horizon + READ_BACK_MS / 1000 - time.time()
        _fill(vhost.url, live, due_in_ms=7 * 24 * 3600 * 1000, ahead_ms=int(ahead_s * 1000))
        log(f"cancellations: {old:,} records before the horizon and {live:,} after, written in "
            f"{time.monotonic() - started:.0f}s")
        ahead_s = horizon + READ_BACK_MS / 1000 - time.time()
        seconds, kept = _started(vhost.url, clock=lambda: time.time() + ahead_s)
    return {"old": old, "live": live, "seconds": round(seconds, 2), "kept": kept}


def _hops(vhost: Vhost, k: int) -> float:
    """Hops per second of one relay through ``k`` expired messages due in 2 h (each hops into the 1 h rung)."""
    with vhost.connection() as conn:
        declare(conn)
        channel = conn.channel()
        channel.queue_purge(CONTROL)
        channel.queue_purge("acemq.schedule.1h")
        due = int(time.time() * 1000) + 7_200_000
        headers = {"x-schedule-exchange": "", "x-schedule-routing-key": "bench.target", "x-schedule-due-at": due,
                   "x-schedule-content-type": "application/octet-stream"}
        for _ in range(k):
            channel.basic_publish(channel.prepare_message(b"x" * 600, headers=headers, priority=0,
                                                          properties={"message_id": str(uuid.uuid4())}),
                                  exchange="", routing_key=CONTROL)
        channel.close()
    relay, thread, conn = _relay(vhost.url)
    try:
        if not relay.ready.wait(600):
            raise TimeoutError("the relay did not start")
        started = time.monotonic()
        while relay.counters.hops < k:
            if time.monotonic() - started > 600:
                raise TimeoutError(f"only {relay.counters.hops} of {k} hops in 600 s")
            time.sleep(0.01)
        return k / (time.monotonic() - started)
    finally:
        relay.stop()
        thread.join(30)
        conn.release()


def hop_ratio(live: int, k: int, repeats: int = 5) -> dict[str, Any]:
    """Hop throughput with ``live`` cancellations (none matching) as a ratio to none.

    Two vhosts, one with the records and one without, measured in turn (``repeats``
    rounds each, medians compared), so that drift in the machine's load hits both alike.
    """
    with Vhost("cancel-none") as plain, Vhost("cancel-live") as loaded:
        _fill(loaded.url, live, due_in_ms=7 * 24 * 3600 * 1000)
        rounds: dict[str, list[float]] = {"none": [], "live": []}
        for _ in range(repeats):
            rounds["none"].append(_hops(plain, k))
            rounds["live"].append(_hops(loaded, k))
    none, some = (sorted(rounds[key])[repeats // 2] for key in ("none", "live"))
    return {"live": live, "messages": k, "hops_per_s_none": round(none), "hops_per_s_live": round(some),
            "ratio": round(some / none, 3), "rounds": {key: [round(v) for v in vals] for key, vals in rounds.items()}}


def run(config: Any = None, *, quick: bool = False) -> dict[str, Any]:
    """Every cancellation figure; a quick run (``config.name == "quick"``) uses a tenth of the sizes."""
    scale = 10 if quick or getattr(config, "name", "full") == "quick" else 1
    return {"memory": memory(1_000_000 // scale), "start": start_time(1_000_000 // scale),
            "bounded": start_bounded(990_000 // scale, 10_000 // scale),
            "hops": hop_ratio(100_000 // scale, 20_000 // scale)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("memory", "start", "bounded", "hops"))
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    if args.only == "memory":
        print(json.dumps(memory(1_000_000 // scale)))
    elif args.only == "start":
        print(json.dumps(start_time(1_000_000 // scale)))
    elif args.only == "bounded":
        print(json.dumps(start_bounded(990_000 // scale, 10_000 // scale)))
    elif args.only == "hops":
        print(json.dumps(hop_ratio(100_000 // scale, 20_000 // scale)))
    else:
        print(json.dumps(run(quick=args.quick)))
