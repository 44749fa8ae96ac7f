"""Cancellations: memory per live cancellation, relay start time with them, hop throughput with them."""

from __future__ import annotations

import argparse
import gc
import json
import math
import socket
import sys
import threading
import time
import uuid
from typing import Any, Callable, Optional

import amqp

from kombu_ladder.cancellation.records import STREAM, LiveSet, encode
from kombu_ladder.contract import CONTROL
from kombu_ladder.controlplane import CANCEL, declare_control_plane
from kombu_ladder.controlplane.codec import Cancel, decode
from kombu_ladder.controlplane.snapshots import EVERY_RECORDS, MAX_JITTER, Policy
from kombu_ladder.link import link_for
from kombu_ladder.relay import Relay
from kombu_ladder.relay.cancelwatch import READ_BACK_MS, CancelWatch
from kombu_ladder.topology import declare

from .common import Vhost, log

__all__ = ["memory", "start_time", "start_bounded", "snapshot_start", "hop_ratio", "run"]


def _deep_size(root: Any) -> int:
    """Bytes of ``root`` and of every object it reaches (``sys.getsizeof``, each object once; classes not followed)."""
    seen: set[int] = set()
    todo, total = [root], 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        todo.extend(gc.get_referents(obj))
    return total


def memory(n: int) -> dict[str, Any]:
    """Bytes the pure live set keeps per cancellation (36-character UUID ids, as Celery's task ids).

    The records are decoded as a relay decodes them and added; once the set is pruned (as a relay prunes
    once it has read the records it starts from), what it holds is measured: every object it reaches, its id
    strings included when it keeps them (``tracemalloc`` would trace each add: minutes for a million).
    """
    now = int(time.time() * 1000)
    live = LiveSet()
    for _ in range(n):
        record = decode(encode(str(uuid.uuid4()), at=now, due=now + 3_600_000), CANCEL.exchange)
        assert isinstance(record, Cancel)
        live.add(record.each()[0], now)
    live.prune(now, force=True)
    assert len(live) == n
    used = _deep_size(live)
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


def _relay(url: str, clock: Any = None, prepare: Optional[Callable[[Relay], None]] = None
           ) -> tuple[Relay, threading.Thread, Any]:
    from kombu import Connection

    conn = Connection(url)
    relay = Relay(conn) if clock is None else Relay(conn, clock=clock)
    if prepare is not None:
        prepare(relay)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    return relay, thread, conn


def _started(url: str, clock: Any = None, prepare: Optional[Callable[[Relay], None]] = None) -> tuple[float, int]:
    """Start a relay; return the seconds until it consumes the control queue and the live cancellations it kept."""
    started = time.monotonic()
    relay, thread, conn = _relay(url, clock, prepare)
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


class _NeverWrites(Policy):
    """The default policy (the same start windows), but never due: every start of a series finds the same state."""

    def due(self, *, records: Optional[int], since_ms: Optional[int], live: int = 0) -> bool:
        return False


def _writes_none(relay: Relay) -> None:
    """A measured relay writes no snapshot."""
    relay.core.cancels.policy = _NeverWrites()


def _reads_back(relay: Relay) -> None:
    """The start before snapshots: the relay ignores the snapshot stream and reads the last day and hour back."""
    _writes_none(relay)
    relay.core.cancels.snapshots_unreadable = "the bench measures the start without snapshots"


def _resumes(url: str, repeats: int) -> list[float]:
    """Seconds a relay's cancellations take to be caught up again on a new connection (a reconnect), each time."""
    from kombu import Connection

    watch = CancelWatch(clock=time.time, policy=_NeverWrites())
    ready: list[bool] = []
    seconds = []
    for attempt in range(repeats + 1):
        conn = Connection(url)
        ready.clear()
        started = time.monotonic()
        channel = conn.channel()
        watch.start(channel, link_for(channel).guard, lambda: ready.append(True))
        while not ready:
            if time.monotonic() - started > 600:
                raise TimeoutError("the cancellations were not caught up within 600 s")
            try:
                conn.drain_events(timeout=0.1)
            except socket.timeout:
                watch.tick()
        if attempt:  # the first is a cold start (it loads the snapshot)
            seconds.append(time.monotonic() - started)
        watch.close()
        conn.release()
    return seconds


def snapshot_start(records: int, live: int, repeats: int = 5) -> dict[str, Any]:
    """A relay's start, and its reconnect, with ``records`` cancellation records written in the last hour (``live``
    of them live, the rest for messages due days ago: a bulk cancel of old work), against the start before
    snapshots in the same run.

    A relay runs while they are written, as in production, writing snapshots by its policy. Once it has sealed the
    one after the burst, it stops, and records are added until the bound's count follows that snapshot
    (:data:`~kombu_ladder.controlplane.snapshots.EVERY_RECORDS` times ``1 + MAX_JITTER``): the worst moment
    between two snapshots. Then ``repeats`` relays start in turn (median), a relay reconnects ``repeats`` times
    (median), and one relay starts as relays did before snapshots (reading every record of the last day back).
    """
    with Vhost("cancel-snapshots") as vhost:
        writer, thread, conn = _relay(vhost.url)
        if not writer.ready.wait(600):
            raise TimeoutError("the writing relay did not start")
        started = time.monotonic()
        _fill(vhost.url, live, due_in_ms=7 * 24 * 3600 * 1000)
        _fill(vhost.url, records - live, due_in_ms=-3 * 24 * 3600 * 1000)
        written_s = time.monotonic() - started
        watch = writer.core.cancels
        bound = int(EVERY_RECORDS * (1 + MAX_JITTER))
        deadline = time.monotonic() + 600
        while watch._known is None or watch.position is None or watch._known.covers < records - bound:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no snapshot after the burst within 600 s ({watch._known})")
            time.sleep(0.2)
        covers, snapshots_written = watch._known.covers, watch.written
        writer.stop()
        thread.join(30)
        conn.release()
        behind = records - 1 - covers
        if bound > behind:
            _fill(vhost.url, bound - behind, due_in_ms=-3 * 24 * 3600 * 1000)
        log(f"cancellations: {records:,} records ({live:,} live) written in {written_s:.0f}s, "
            f"{snapshots_written} snapshot(s) by the running relay; {max(bound, behind):,} records after the last")
        starts = [_started(vhost.url, prepare=_writes_none) for _ in range(repeats)]
        log(f"cancellations: starts from the snapshot {[round(s, 2) for s, _ in starts]} s")
        resumes = _resumes(vhost.url, repeats)
        log(f"cancellations: reconnects {[round(s, 2) for s in resumes]} s")
        old, old_live = _started(vhost.url, prepare=_reads_back)
        log(f"cancellations: the start reading back, without snapshots: {old:.2f} s")
    seconds = sorted(s for s, _ in starts)
    return {"records": records, "live": live, "after_snapshot": max(bound, behind), "written_s": round(written_s),
            "snapshots_written": snapshots_written, "start_s": round(seconds[repeats // 2], 2),
            "starts_s": [round(s, 2) for s in seconds], "kept": starts[0][1],
            "reconnect_s": round(sorted(resumes)[repeats // 2], 2), "reconnects_s": [round(s, 2) for s in resumes],
            "old_start_s": round(old, 2), "old_kept": old_live}


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
            "snapshots": snapshot_start(1_000_000 // scale, 10_000 // scale),
            "hops": hop_ratio(100_000 // scale, 20_000 // scale)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("memory", "start", "bounded", "snapshots", "hops"))
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    if args.only == "memory":
        print(json.dumps(memory(1_000_000 // scale)))
    elif args.only == "start":
        print(json.dumps(start_time(1_000_000 // scale)))
    elif args.only == "bounded":
        print(json.dumps(start_bounded(990_000 // scale, 10_000 // scale)))
    elif args.only == "snapshots":
        print(json.dumps(snapshot_start(1_000_000 // scale, 10_000 // scale)))
    elif args.only == "hops":
        print(json.dumps(hop_ratio(100_000 // scale, 20_000 // scale)))
    else:
        print(json.dumps(run(quick=args.quick)))
