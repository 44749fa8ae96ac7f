"""QueueSampler: the ladder's queue depths, sampled on a timer on a connection of its own."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from .depths import QueueDepth, queue_depths

__all__ = ["QueueSampler", "DEFAULT_INTERVAL"]

logger = logging.getLogger(__name__)

W_SAMPLE_FAILED = "could not sample the ladder's queue depths (%s); the queue metrics are absent until the next sample"
I_SAMPLE_BACK = "sampling the ladder's queue depths again"

#: Seconds between two samples: one passive declare per ladder queue each time, whatever the scrape rate.
DEFAULT_INTERVAL = 15.0


class QueueSampler:
    """Reads :func:`~kombu_ladder.depths.queue_depths` every ``interval`` seconds, in a daemon thread.

    Readers (a metrics scrape) get the last sample and never touch the broker, so
    a scrape storm costs the broker nothing. A failed sample clears the depths
    (stale numbers are never shown) and is counted in :attr:`errors`; the
    connection is re-established for the next one.

    Arguments:
        connection: a :class:`kombu.Connection` the sampler owns (pass a clone) and closes on :meth:`stop`.
        interval: seconds between samples.
        clock: returns the time stamped on a sample, in epoch seconds.
    """

    def __init__(self, connection: Any, *, interval: float = DEFAULT_INTERVAL,
                 clock: Callable[[], float] = time.time) -> None:
        if not isinstance(interval, (int, float)) or isinstance(interval, bool) or not interval > 0:
            raise ValueError(f"interval must be a positive number of seconds, not {interval!r}")
        self.connection = connection
        self.interval = float(interval)
        self.clock = clock
        #: The last sample, in :data:`~kombu_ladder.depths.LADDER_QUEUES` order; empty when it failed.
        self.depths: tuple[QueueDepth, ...] = ()
        #: When the last successful sample was taken (epoch seconds), or None.
        self.sampled_at: Optional[float] = None
        #: Samples taken, and samples that failed.
        self.samples = 0
        self.errors = 0
        self._failing = False
        self._stopped = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def sample(self) -> None:
        """Take one sample now (the timer thread calls this); never raises."""
        try:
            self.connection.ensure_connection(max_retries=1)
            depths = tuple(queue_depths(self.connection))
        except Exception as exc:  # noqa: BLE001 - any broker failure: report it, sample again later
            self.errors += 1
            self.depths = ()
            if not self._failing:
                logger.warning(W_SAMPLE_FAILED, exc)
            self._failing = True
            self._reset()
            return
        if self._failing:
            logger.info(I_SAMPLE_BACK)
        self._failing = False
        self.depths, self.sampled_at = depths, self.clock()
        self.samples += 1

    def start(self) -> None:
        """Take the first sample at once (so the first scrape has it), then one every ``interval``."""
        self.sample()
        self._thread = threading.Thread(target=self._run, name="ladder-queue-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        """Stop sampling and close the connection."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 10)
        self._reset()

    def _reset(self) -> None:
        try:
            self.connection.close()
        except Exception:  # noqa: BLE001 - closing a dead connection
            logger.debug("closing the sampler's connection failed", exc_info=True)
