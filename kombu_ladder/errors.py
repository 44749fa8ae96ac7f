"""Exceptions raised by kombu_ladder."""

from __future__ import annotations

from typing import Optional

__all__ = ["LadderError", "TopologyConflict", "LadderNotDeclared", "CancellationsUnavailable", "missing_extra"]


def missing_extra(what: str, extra: str, missing: str, requirement: Optional[str] = None) -> str:
    """The one-line hint for a missing extra, in the install form the README gives (from a clone: kombu-ladder
    is not on the package index yet), the same in every hint."""
    brings = f", which brings {requirement}" if requirement else ""
    return (f"{what} needs the [{extra}] extra ({missing} is not installed): pip install \".[{extra}]\" from the "
            f"root of a kombu-ladder clone{brings}")


class LadderError(Exception):
    """Base class for every error kombu_ladder raises on purpose."""


class LadderNotDeclared(LadderError):
    """The ladder is missing and the user may not declare it (a producer with its minimal permissions)."""


class CancellationsUnavailable(LadderError):
    """No cancellation can be recorded: the exchange is not set up and the stream cannot be written otherwise."""


#: Arguments only the quorum profile declares: a conflict on one of them is a conflict of profiles.
_PROFILE_ARGUMENTS = ("x-queue-type", "x-overflow", "x-dead-letter-strategy")


class TopologyConflict(LadderError):
    """A ladder queue or exchange exists on the broker with other settings."""

    def __init__(self, name: str, expected: object, detail: str, *, queue_type: Optional[str] = None) -> None:
        self.name = name
        self.expected = expected
        self.detail = detail
        #: The profile this side declared ("classic" or "quorum"), None for the exchange and parking queue.
        self.queue_type = queue_type
        if queue_type is not None and any(f"inequivalent arg '{arg}'" in detail for arg in _PROFILE_ARGUMENTS):
            other = "classic" if queue_type == "quorum" else "quorum"
            super().__init__(
                f"{name!r} already exists on the broker as declared by the {other} profile, and this side "
                f"declares the {queue_type} profile (queue_type={queue_type!r}): {expected!r}. The quorum profile is "
                f"replicated but off-contract, so a peer declaring the AceMQ contract's classic queues "
                f"(another AceMQ library, or ladder with the default queue_type) conflicts with it. Choose one "
                f"profile for everything sharing this vhost: queue_type=\"classic\" (the contract, the "
                f"default) or queue_type=\"quorum\" (ladder_queue_type / CELERY_LADDER_QUEUE_TYPE in Celery, "
                f"--queue-type on the relay commands); to switch, move the waiting messages out, delete the "
                f"ladder's queues and declare again. Broker said: {detail}"
            )
            return
        super().__init__(
            f"{name!r} already exists on the broker with settings other than the AceMQ "
            f"contract's. The ladder needs {expected!r}. These names are shared with the "
            f"other AceMQ scheduler libraries (Java, Go, .NET, Ruby), so the settings cannot "
            f"differ: delete the queue or exchange once it is empty (or fix whatever declared "
            f"it) and declare again. Broker said: {detail}"
        )
