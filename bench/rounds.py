"""Round delays on the simulator with a broker that expires every rung a few ms late: placements and lateness.

No broker: :class:`kombu_ladder.simulator.SimulatedBroker` with ``expiry_lag``, one
``LadderProducer.publish(countdown=)`` per delay and our relay, in virtual time.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from kombu import Exchange, Queue

from kombu_ladder import LadderProducer, Relay, hops_for
from kombu_ladder.contract import RUNGS, rung_name
from kombu_ladder.plan import HOLD_WINDOW
from kombu_ladder.simulator import SimulatedBroker

from .common import Config, log

__all__ = ["DELAYS", "LAG_MS", "EARLIEST_MS", "LATEST_MS", "fewest_on_time", "one", "run"]

#: The round countdowns, in seconds: 120 s, 1 h, 4 h and 24 h (two minutes, the 1 h rung, a few hops, a day).
DELAYS = (120, 3600, 4 * 3600, 24 * 3600)

#: The broker's expiry lag per hop (ms): RabbitMQ's is 2.5 ms median on a quiet broker.
LAG_MS = 3

#: The targets: each arrives within EARLIEST_MS … LATEST_MS of its due time, in its theoretical placements ±1.
EARLIEST_MS, LATEST_MS = -5, 50

_START = 1_800_000_000


def fewest_on_time(delay_ms: int, lag_ms: int, hold_window_ms: int, latest_ms: int = LATEST_MS,
                   limit: int = 200) -> Optional[int]:
    """The fewest placements of ANY plan (rungs in any order) that arrives no later than ``latest_ms``.

    A plan of n rungs summing to S ms ends at S + n·lag; it is on time when that is at most
    ``latest_ms`` past the due time and less than the hold window before it (the relay holds
    the rest). Searched exhaustively over the sums n rungs can make (a bit set per n).
    """
    step = 1000  # every rung is a whole number of seconds
    top = (delay_ms + latest_ms) // step + 1
    mask = (1 << (top + 1)) - 1
    reachable = 1  # bit s: a sum of s seconds is reachable
    for n in range(1, limit + 1):
        grown = 0
        for rung in RUNGS:
            grown |= reachable << rung
        reachable = grown & mask
        for seconds in range(max(0, (delay_ms - hold_window_ms - n * lag_ms) // step), top + 1):
            end = seconds * step + n * lag_ms
            if reachable >> seconds & 1 and delay_ms - hold_window_ms < end <= delay_ms + latest_ms:
                return n
    return None


def one(delay: int, lag_ms: int = LAG_MS) -> dict[str, Any]:
    """Publish one message with ``countdown=delay`` on a simulator whose rungs expire ``lag_ms`` late."""
    broker = SimulatedBroker(start=_START, expiry_lag=lag_ms / 1000)
    relay = broker.host(Relay())
    started = time.perf_counter()
    with broker.connection() as conn:
        channel = conn.default_channel
        Queue("t.rounds", Exchange("rounds", "direct", durable=True), routing_key="t.rounds",
              durable=True)(channel).declare()
        LadderProducer(channel, clock=broker.now).publish(b"x", exchange="rounds", routing_key="t.rounds",
                                                          countdown=delay)
        broker.advance(delay + 1)
    (arrival,) = broker.arrivals("t.rounds")
    rungs = [r for r in RUNGS for _ in broker.arrivals(rung_name(r))]
    hold_ms = round(HOLD_WINDOW * 1000)
    return {
        "delay_s": delay, "lag_ms": lag_ms, "theory": len(hops_for(delay)), "placements": len(rungs),
        "rungs": {str(r): rungs.count(r) for r in RUNGS if r in rungs}, "relay_hops": relay.counters.hops,
        "lateness_ms": round((arrival.at - _START - delay) * 1000, 1),
        "fewest_on_time": fewest_on_time(delay * 1000, lag_ms, hold_ms),
        "real_s": round(time.perf_counter() - started, 2),
    }


def run(config: Config) -> dict[str, Any]:
    """Every delay of :data:`DELAYS` once (the same in full and quick runs: it is cheap)."""
    rows = []
    for delay in DELAYS:
        log(f"round delays: countdown={delay} s on the simulator, {LAG_MS} ms expiry lag per hop")
        rows.append(one(delay))
    return {"lag_ms": LAG_MS, "hold_window_s": HOLD_WINDOW, "rows": rows}


def within(row: dict[str, Any]) -> tuple[bool, bool]:
    """Whether a row met (placements within ±1 of theory, lateness within EARLIEST_MS … LATEST_MS)."""
    return (abs(row["placements"] - row["theory"]) <= 1,
            EARLIEST_MS <= row["lateness_ms"] <= LATEST_MS)


__all__.append("within")
