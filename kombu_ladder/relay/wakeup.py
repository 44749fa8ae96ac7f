"""The standalone relay's consume loop: kombu's ConsumerMixin loop, waking when a held message is due."""

from __future__ import annotations

import socket
from itertools import count
from typing import Any, Iterator, Optional

__all__ = ["consume"]


def consume(mixin: Any, core: Any, limit: Optional[int] = None, timeout: Optional[float] = None,
            safety_interval: float = 1.0, **kwargs: Any) -> Iterator[None]:
    """Run ``mixin``'s consumers as ``ConsumerMixin.consume`` does, firing ``core``'s held messages on time.

    The only difference from kombu's loop: each wait for frames ends when the
    earliest held message is due (:meth:`RelayCore.next_wakeup`), and due
    messages are published (:meth:`RelayCore.fire`) before the next wait.
    """
    elapsed = 0.0
    with mixin.consumer_context(**kwargs) as (conn, _channel, _consumers):
        for _ in limit and range(limit) or count():
            if mixin.should_stop:
                break
            mixin.on_iteration()
            if len(core.held):
                core.fire()
            wait = core.next_wakeup()
            interval = safety_interval if wait is None else min(safety_interval, wait)
            try:
                conn.drain_events(timeout=interval)
            except socket.timeout:
                conn.heartbeat_check()
                elapsed += interval
                if timeout and elapsed >= timeout:
                    raise
            except OSError:
                if not mixin.should_stop:
                    raise
            else:
                yield
                elapsed = 0.0
