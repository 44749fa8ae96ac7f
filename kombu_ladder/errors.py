"""Exceptions raised by kombu_ladder."""

from __future__ import annotations

__all__ = ["LadderError", "TopologyConflict"]


class LadderError(Exception):
    """Base class for every error kombu_ladder raises on purpose."""


class TopologyConflict(LadderError):
    """A ladder queue or exchange exists on the broker with other settings."""

    def __init__(self, name: str, expected: object, detail: str) -> None:
        self.name = name
        self.expected = expected
        self.detail = detail
        super().__init__(
            f"{name!r} already exists on the broker with settings other than the AceMQ "
            f"contract's. The ladder needs {expected!r}. These names are shared with the "
            f"other AceMQ scheduler libraries (Java, Go, .NET, Ruby), so the settings cannot "
            f"differ: delete the queue or exchange once it is empty (or fix whatever declared "
            f"it) and declare again. Broker said: {detail}"
        )
