"""Adoption in a worker: the task strategy that hands far-ETA tasks over, and the thread that moves them."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Optional

from kombu_ladder.plan import to_millis
from kombu_ladder.text import escape

from ..settings import LadderSettings
from .records import ADOPT, ADOPTED_HEADER, CHECK, RUN, threshold, verdict
from .transfer import Mover, Records, task_due

__all__ = ["Adopter", "AdoptionCounts", "Gate", "Job", "COUNTS", "adoption_counts"]

logger = logging.getLogger(__name__)

I_ADOPTED = "adopted %d ETA task(s) into the ladder"
I_DROPPED = "task %s: a redelivered original of a task adopted already (its copy waits in the ladder); acked, not run"
W_NOT_ADOPTED = "task %s: not adopted, the worker holds it as Celery does (%s)"
E_NO_RECORDS = ("cannot read %s to its end (%s); %d redelivered ETA task(s) are treated as never adopted: "
                "one whose adoption committed as its worker died may run twice")
E_ADOPTER = "the ladder's adoption thread failed (%s); its tasks are handed back or redelivered"
E_REFUSED = ("the broker refuses what adoption needs (%s): this worker holds ETA tasks as Celery does, and tries "
             "again in %d s; grant the adopter's permissions (kombu_ladder.permissions.adopter), and declare the "
             "control plane ('kombu-ladder declare')")

#: Jobs moved in one transaction at most.
BATCH = 100
#: Seconds the adoption thread waits for work before it reads the records that arrived.
IDLE = 0.25
#: Seconds between reconnection attempts of the adoption thread.
RETRY = 1.0
#: Attempts at a job before it is handed back to Celery (which then holds it in memory, as without the ladder).
ATTEMPTS = 5
#: Seconds a worker whose user may not adopt (ACCESS_REFUSED) hands every job back before it tries again.
REFUSED_FOR = 60.0
#: AMQP's reply code for an operation the user's permissions refuse.
ACCESS_REFUSED = 403
#: The reply codes of a refusal before anything moved: not this user's (403), or the control plane not declared
#: (404: the exchange of adoption records is missing).
REFUSALS = (ACCESS_REFUSED, 404)


@dataclass
class AdoptionCounts:
    """What the adoption of this worker process has done (read by ``inspect ladder`` and the metrics)."""

    #: ETA tasks moved into the ladder (their originals acked after the commit).
    adopted: int = 0
    #: Redelivered originals of tasks adopted already, acked without running.
    originals_dropped: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counts as a plain dict."""
        return {"adopted": self.adopted, "originals_dropped": self.originals_dropped}


#: This process's adoption counts: one worker per process, as Celery runs them.
COUNTS = AdoptionCounts()


def adoption_counts() -> dict[str, int]:
    """This process's adoption counts, as ``{name: value}``."""
    return COUNTS.as_dict()


@dataclass
class Job:
    """One task message the strategy handed to the adoption thread."""

    message: Any
    verdict: str
    eta: Any  #: the aware datetime its ``eta`` header names
    due_ms: int
    #: Celery's ack promise for the message (called as Celery calls it, with a logger and the connection errors).
    ack: Callable[..., Any]
    #: The task strategy, bound to this message: gives it to Celery as if the ladder had not looked.
    resume: Callable[[], Any]
    #: Set once it is acked, handed back or dropped.
    settled: bool = field(default=False)
    #: How many batches it was in that failed.
    failures: int = field(default=0)

    @property
    def task(self) -> tuple[str, str]:
        """(task id, eta header): what its record names."""
        headers = self.message.headers
        return str(headers.get("id")), str(headers.get("eta"))


class Adopter:
    """A thread with a connection of its own that moves the jobs into the ladder, in transactions.

    The worker's consumer never waits for the broker: its strategy hands a job over
    and goes on; this thread commits copies and records, then asks the consumer
    (``call_soon``) to ack the originals, or to give a job back to Celery.

    Arguments:
        connection: an unconnected :class:`kombu.Connection` to the worker's broker.
        settings: the app's settings (hold window, max delay, queue type).
        clock: epoch seconds (the simulator's on a ``ladder-sim://`` connection).
        call_soon: runs a function in the consumer's thread (``Consumer.call_soon``).
        connection_errors: what Celery's ack promise is given, with a logger.
    """

    def __init__(self, connection: Any, *, settings: LadderSettings, clock: Callable[[], float],
                 call_soon: Callable[..., Any], connection_errors: tuple[type, ...] = ()) -> None:
        self.connection = connection
        self.settings = settings
        self.clock = clock
        self.ahead_ms = int(threshold(settings.hold_window) * 1000)
        self._call_soon = call_soon
        self._errors = connection_errors
        self._jobs: "queue.Queue[Job]" = queue.Queue()
        self._retry: list[Job] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ladder-adopt", daemon=True)
        self._mover: Optional[Mover] = None
        self._records: Optional[Records] = None
        #: Until when (time.monotonic()) jobs are handed back without trying: the broker refused adoption.
        self._refused_until = 0.0

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread; jobs not committed stay unacked (the broker redelivers them)."""
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Hand a job over (from the consumer's thread)."""
        self._jobs.put(job)

    # -- the thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            jobs = self._retry + self._take()
            self._retry = []
            try:
                if jobs:
                    self._handle(jobs)
                elif self._records is not None:
                    self._records.poll()
            except Exception as exc:  # noqa: BLE001 - the thread outlives any one failure
                self._disconnect()
                if getattr(exc, "reply_code", None) in REFUSALS:  # refused before any commit: nothing moved
                    logger.error(E_REFUSED, escape(f"{type(exc).__name__}: {exc}"), int(REFUSED_FOR))
                    self._refused_until = time.monotonic() + REFUSED_FOR
                    for job in jobs:
                        if not job.settled:
                            self._settle(job, job.resume)
                    continue
                lost = isinstance(exc, (*self.connection.connection_errors, OSError))
                logger.error(E_ADOPTER, escape(f"{type(exc).__name__}: {exc}"), exc_info=not lost)
                # committed or not, nobody knows: the records will say (a job whose channel closed is redelivered)
                self._retry = [job for job in map(self._doubt, jobs) if not job.settled]
                self._stopping.wait(RETRY)
        self._disconnect()
        self.connection.release()

    def _take(self) -> list[Job]:
        try:
            jobs = [self._jobs.get(timeout=IDLE)]
        except queue.Empty:
            return []
        while len(jobs) < BATCH:
            try:
                jobs.append(self._jobs.get_nowait())
            except queue.Empty:
                break
        return jobs

    def _doubt(self, job: Job) -> Job:
        """A job of a failed batch: looked up again, or after :data:`ATTEMPTS` failures given back to Celery."""
        if job.settled:
            return job
        job.failures += 1
        if job.failures >= ATTEMPTS:
            logger.warning(W_NOT_ADOPTED, escape(job.task[0]), f"{job.failures} failed attempts")
            self._settle(job, job.resume)
        job.verdict = CHECK
        return job

    def _disconnect(self) -> None:
        for part in (self._mover, self._records):
            if part is not None:
                part.close()
        self._mover = None  # the records are kept: a new channel goes on from the last offset read
        try:
            self.connection.close()
        except Exception:  # noqa: BLE001 - it is dead already
            logger.debug("closing the adoption connection failed", exc_info=True)

    def _handle(self, jobs: list[Job]) -> None:
        jobs = [job for job in jobs if _still_open(job.message)]  # the others are redelivered: a job again
        if time.monotonic() < self._refused_until:  # the broker refused adoption a moment ago: Celery holds them
            for job in jobs:
                self._settle(job, job.resume)
            return
        checks = [job for job in jobs if job.verdict == CHECK]
        if checks:
            self._check(checks)
        for job in jobs:
            if job.verdict == RUN and not job.settled:
                self._settle(job, job.resume)
        adopt = [job for job in jobs if job.verdict == ADOPT and not job.settled]
        if adopt:
            self._adopt(adopt)

    def _check(self, jobs: list[Job]) -> None:
        self.connection.ensure_connection(max_retries=1)
        if self._records is None:
            self._records = Records(self.connection, clock=self.clock)
        try:
            read = self._records.catch_up()
            problem = "timed out"
        except self.connection.channel_errors as exc:  # the stream refused (permissions): relay without it
            read, problem = False, f"{type(exc).__name__}: {exc}"
            self._records.close()  # what was read is kept: the next channel goes on from its last offset
        if not read:
            logger.error(E_NO_RECORDS, "ladder.adoptions", escape(problem), len(jobs))
        now_ms = int(self.clock() * 1000)
        for job in jobs:
            if read and self._records is not None and job.task in self._records.adopted:
                COUNTS.originals_dropped += 1
                logger.info(I_DROPPED, escape(job.task[0]))
                self._settle(job, partial(job.ack, logger, self._errors))
            else:
                job.verdict = verdict(job.message.headers, redelivered=False, due_ms=job.due_ms, now_ms=now_ms,
                                      ahead_ms=self.ahead_ms)

    def _adopt(self, jobs: list[Job]) -> None:
        if self._mover is None:
            self.connection.ensure_connection(max_retries=1)
            self._mover = Mover(self.connection, settings=self.settings, clock=self.clock)
        staged = []
        for job in jobs:
            try:
                self._mover.stage(job.message, job.eta)
            except (ValueError, TypeError) as exc:  # this task cannot be copied: Celery holds it, as without us
                logger.warning(W_NOT_ADOPTED, escape(job.task[0]), escape(exc))
                self._settle(job, job.resume)
                continue
            staged.append(job)
        if not staged:
            return
        self._mover.commit()
        COUNTS.adopted += len(staged)
        logger.debug(I_ADOPTED, len(staged))
        for job in staged:
            self._settle(job, partial(job.ack, logger, self._errors))

    def _settle(self, job: Job, action: Callable[[], Any]) -> None:
        job.settled = True
        self._call_soon(action)


def _still_open(message: Any) -> bool:
    """Whether the channel ``message`` came on is open (py-amqp's ``is_open``; the simulator's ``closed``)."""
    channel = getattr(message, "channel", None)
    if channel is None:
        return False
    is_open = getattr(channel, "is_open", None)
    return bool(is_open) if is_open is not None else not getattr(channel, "closed", False)


class Gate:
    """Decides in the consumer's thread, per task message, whether it goes to Celery or to the :class:`Adopter`.

    Wraps each task strategy (:meth:`wrap`). A task Celery would discard at
    once (revoked, or expired) goes to Celery, which discards it as without
    the ladder; an adopted copy loses its :data:`~.records.ADOPTED_HEADER`
    before Celery reads it.
    """

    def __init__(self, adopter: Adopter, *, clock: Callable[[], float], timezone: Callable[[], Any],
                 revoked: Any) -> None:
        self.adopter = adopter
        self.clock = clock
        self.timezone = timezone
        self.revoked = revoked

    def wrap(self, strategy: Callable[..., Any]) -> Callable[..., Any]:
        """Return ``strategy`` with adoption in front of it."""
        gate = self

        def adopting(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any = None, **kwargs: Any) -> Any:
            job = gate.job(message, partial(strategy, message, body, ack, reject, callbacks, **kwargs), ack)
            if job is None:
                return strategy(message, body, ack, reject, callbacks, **kwargs)
            gate.adopter.submit(job)
            return None

        adopting.__wrapped__ = strategy  # type: ignore[attr-defined]
        return adopting

    def job(self, message: Any, resume: Callable[[], Any], ack: Any) -> Optional[Job]:
        """The job for ``message``, or None when it goes to Celery now."""
        headers = message.headers
        if not isinstance(headers, dict) or not headers.get("eta"):
            return None
        if ADOPTED_HEADER in headers:
            marked = headers.pop(ADOPTED_HEADER)  # never seen by Celery, never inherited by a retry
            if marked == headers.get("eta"):
                return None
        eta = task_due(headers, self.timezone())
        if eta is None or headers.get("id") in self.revoked:
            return None
        now_ms = int(self.clock() * 1000)
        expires = task_due(headers, self.timezone(), "expires")
        if expires is not None and to_millis(expires) <= now_ms:
            return None
        due_ms = to_millis(eta)
        redelivered = bool((message.delivery_info or {}).get("redelivered"))
        decided = verdict(headers, redelivered=redelivered, due_ms=due_ms, now_ms=now_ms,
                          ahead_ms=self.adopter.ahead_ms)
        return None if decided == RUN else Job(message, decided, eta, due_ms, ack, resume)
