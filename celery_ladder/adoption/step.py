"""LadderAdopt: the consumer bootstep that puts adoption in front of the worker's task strategies."""

from __future__ import annotations

from typing import Any

from celery import bootsteps
from celery.worker import state

from kombu_ladder.link import clock_of

from ..settings import LadderSettings
from .worker import Adopter, Gate

__all__ = ["LadderAdopt", "Strategies"]


class Strategies(dict):  # type: ignore[type-arg]
    """The consumer's task strategies, each handed out with adoption in front of it (see :class:`Gate`).

    It replaces ``consumer.strategies``, which Celery fills again when it reloads
    the tasks (``pool_restart``) and when the consumer restarts: a strategy set
    later is wrapped as well, the first time it is handed out.
    """

    def __init__(self, gate: Gate, strategies: Any) -> None:
        super().__init__(strategies)
        self._gate = gate
        self._wrapped: dict[str, Any] = {}

    def use(self, gate: Gate) -> None:
        """Wrap every strategy with ``gate`` from now on."""
        self._gate = gate
        self._wrapped = {}

    def __setitem__(self, name: str, strategy: Any) -> None:
        super().__setitem__(name, strategy)
        self._wrapped.pop(name, None)

    def __getitem__(self, name: str) -> Any:
        wrapped = self._wrapped.get(name)
        if wrapped is None:
            wrapped = self._wrapped[name] = self._gate.wrap(super().__getitem__(name))
        return wrapped


class LadderAdopt(bootsteps.StartStopStep):
    """Move ETA tasks sent without the ladder into it, instead of holding them in memory.

    Included when ``ladder_adopt`` says so (by default: when the worker runs the
    relay). Started after Celery's task consumer, whose strategies it wraps; the
    consumer reads no message before every step has started.
    """

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        c.ladder_adopt = None
        self.settings = LadderSettings.from_conf(c.app.conf)
        self.adopter: Any = None
        super().__init__(c, **kwargs)

    def include_if(self, c: Any) -> bool:
        return self.settings.adopts(relay_runs=self.settings.runs_relay(getattr(c, "pool", None)))

    def start(self, c: Any) -> None:
        clock = clock_of(c.connection)
        self.adopter = Adopter(c.connection.clone(), settings=self.settings, clock=clock, call_soon=c.call_soon,
                               connection_errors=tuple(c.connection_errors))
        gate = Gate(self.adopter, clock=clock, timezone=lambda: c.app.conf.timezone, revoked=state.revoked)
        if isinstance(c.strategies, Strategies):  # a restart (reconnect): the same table, a new gate
            c.strategies.use(gate)
        else:
            c.strategies = Strategies(gate, c.strategies)
        self.adopter.start()
        c.ladder_adopt = self

    def stop(self, c: Any) -> None:
        if self.adopter is not None:
            self.adopter.stop()
            self.adopter = None

    shutdown = stop
