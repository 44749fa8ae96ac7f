"""A relay in a child process: ours (``kombu_ladder.relay.Relay``) or a minimal raw py-amqp loop.

``python -m bench.relay_proc --kind ours|raw --url URL`` prints ``ready``, waits
for ``go`` on stdin, relays until it has been idle for ``--idle`` seconds and
prints one JSON line: ``{"count", "first", "last", "cpu_s", ...}`` (epoch seconds;
``cpu_s`` is this process's CPU time between its first message and its last ack).
With ``--forever`` it runs until SIGTERM instead and prints its counters.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import signal
import socket
import sys
import time
from collections import deque
from typing import Any, Optional
from urllib.parse import unquote, urlparse

import amqp
from kombu import Connection

from kombu_ladder.contract import CONTROL, EXCHANGE, rung_name
from kombu_ladder.relay import Relay

__all__ = ["TimedRelay", "raw_relay", "main"]


class TimedRelay(Relay):
    """Our relay, unchanged, plus timestamps of its first and last work and an idle stop."""

    def __init__(self, connection: Any, *, idle: Optional[float], **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self.idle = idle
        self.first: Optional[float] = None
        self.last: Optional[float] = None
        self.cpu_first = self.cpu_last = 0.0
        self._done = 0
        self._go = time.time()

    def settled(self) -> int:
        """Expired messages handled and confirmed (delivered, hopped or parked)."""
        c = self.core.counters
        return c.delivered + c.hops + c.parked

    def on_iteration(self) -> None:
        now = time.time()
        if self.first is None and self.core.counters.received:
            self.first = now
            self.cpu_first = time.process_time()
        done = self.settled()
        if done != self._done:
            self._done = done
            self.last = now
            self.cpu_last = time.process_time()
        if self.idle is not None:
            since = self.last if self.last is not None else self._go + 10 * self.idle
            if now - since > self.idle:
                self.should_stop = True


def raw_relay(url: str, *, prefetch: int, idle: float, exchange: str, routing_key: str) -> dict[str, Any]:
    """Consume the control queue, republish each message unchanged with pipelined confirms,
    ack sources (``multiple=True``) once confirmed; stop after ``idle`` idle seconds."""
    parts = urlparse(url)
    conn = amqp.Connection(host=f"{parts.hostname}:{parts.port or 5672}", userid=parts.username or "guest",
                           password=parts.password or "guest", virtual_host=unquote(parts.path[1:]) or "/")
    conn.connect()
    channel = conn.channel()
    channel.confirm_select()
    channel.basic_qos(0, prefetch, False)
    pending: deque[tuple[int, int]] = deque()  # (publish seq, source delivery tag)
    state: dict[str, Any] = {"seq": 0, "count": 0, "first": None, "last": None, "confirmed": 0,
                             "cpu_first": 0.0, "cpu_last": 0.0}

    def on_ack(tag: int, multiple: bool) -> None:
        # one destination queue: confirms arrive in publish order, multiple or not
        confirmed = state["confirmed"] = max(state["confirmed"], tag)
        last_tag = None
        while pending and pending[0][0] <= confirmed:
            last_tag = pending.popleft()[1]
            state["count"] += 1
        if last_tag is not None:
            channel.basic_ack(last_tag, multiple=True)
            state["last"] = time.time()
            state["cpu_last"] = time.process_time()

    def on_message(message: Any) -> None:
        if state["first"] is None:
            state["first"] = time.time()
            state["cpu_first"] = time.process_time()
        state["seq"] += 1
        pending.append((state["seq"], message.delivery_tag))
        channel.basic_publish(amqp.Message(message.body, **message.properties),
                              exchange=exchange, routing_key=routing_key)

    channel.events["basic_ack"].add(on_ack)
    channel.basic_consume(CONTROL, callback=on_message)
    started = time.time()
    try:
        while True:
            try:
                conn.drain_events(timeout=0.2)
            except socket.timeout:
                since = state["last"] or started + 10 * idle
                if time.time() - since > idle and not pending:
                    break
    finally:
        conn.close()
    return {"count": state["count"], "first": state["first"], "last": state["last"],
            "cpu_s": state["cpu_last"] - state["cpu_first"]}


def _ours(args: argparse.Namespace) -> dict[str, Any]:
    with Connection(args.url) as conn:
        relay = TimedRelay(conn, idle=None if args.forever else args.idle, prefetch=args.prefetch)
        if args.forever:
            signal.signal(signal.SIGTERM, lambda *_: relay.stop())
            signal.signal(signal.SIGINT, lambda *_: relay.stop())
        relay.run()
        return {"count": relay.settled(), "first": relay.first, "last": relay.last,
                "cpu_s": relay.cpu_last - relay.cpu_first, **relay.counters.as_dict()}


def main(argv: Optional[list[str]] = None) -> int:
    """Run one relay as the arguments say; print its result as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m bench.relay_proc")
    parser.add_argument("--kind", choices=("ours", "raw"), required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--prefetch", type=int, default=50)
    parser.add_argument("--idle", type=float, default=1.0)
    parser.add_argument("--forever", action="store_true", help="run until SIGTERM (no go/idle protocol)")
    parser.add_argument("--profile", metavar="FILE", help="write cProfile stats of the run to FILE")
    parser.add_argument("--exchange", default=EXCHANGE, help="the raw loop's target exchange (default: the rungs')")
    parser.add_argument("--routing-key", default=rung_name(3600), help="the raw loop's routing key (default: 1h rung)")
    args = parser.parse_args(argv)
    if not args.forever:
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 1
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    if args.kind == "ours":
        result = _ours(args)
    else:
        result = raw_relay(args.url, prefetch=args.prefetch, idle=args.idle,
                           exchange=args.exchange, routing_key=args.routing_key)
    if profiler:
        profiler.disable()
        profiler.dump_stats(args.profile)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
