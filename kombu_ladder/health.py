"""Is the ladder healthy: its topology as the contract says, a relay consuming, a short backlog."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from .cancellation.records import STREAM
from .contract import CONTROL, EXCHANGE, EXCHANGE_TYPE, PARKING
from .controlplane import KINDS, STREAMS
from .depths import QueueDepth
from .topology import ladder_queues, parking_queue

__all__ = ["Finding", "DEFAULT_MAX_BACKLOG", "topology_findings", "queue_findings", "cancellation_findings",
           "relay_count", "healthy"]

#: Messages waiting in acemq.schedule.due above which ``check`` fails: relays that keep up hold it
#: near 0; a release of many messages due at once may pass this briefly.
DEFAULT_MAX_BACKLOG = 1000

T_MISSING = "{names} (run 'kombu-ladder declare')"
T_DIFFERS = "{name} exists with settings other than the {profile}'s: {reason}"
T_TOPOLOGY_OK = "topology as the {profile} says"
#: How the findings name each queue profile.
PROFILES = {"classic": "contract", "quorum": "quorum profile"}
T_NO_RELAY = "no relay consumes {queue}"
T_FEW_RELAYS = "{count} relay(s) consume {queue}, fewer than {minimum}"
T_RELAYS_OK = "{count} relay(s) consuming"
T_BACKLOG = "{count} message(s) wait in {queue}, not under {maximum}: the relays do not keep up"
T_BACKLOG_OK = "backlog {count} (under {maximum})"
T_PARKED = "{count} message(s) are parked in {queue}, more than {maximum}"
T_PARKED_OK = "{count} parked"
T_STREAM_OK = "the control plane is declared, {stream} included"
T_STREAM_NOT_YET = "{stream} not declared yet (run 'kombu-ladder declare')"
T_STREAM_MISSING = ("{stream} not declared while {count} relay(s) consume {queue}: cancellations recorded now reach "
                    "none of them (run 'kombu-ladder declare', then restart the relays)")
T_STREAM_DIFFERS = ("{stream} is not the cancellation stream ({reason}): NO relay enforces cancellations, a "
                    "cancelled message is delivered; delete it, run 'kombu-ladder declare' and restart the relays")


@dataclass(frozen=True)
class Finding:
    """One aspect of the ladder's health."""

    #: ``topology``, ``relays``, ``backlog``, ``parked`` or ``cancellations``.
    check: str
    ok: bool
    #: One line saying what was found.
    detail: str


def _reason(exc: BaseException) -> str:
    return " ".join(str(getattr(exc, "reply_text", None) or exc).split())


def _probe(connection: Any, passive: Any, active: Any) -> tuple[bool, Optional[str]]:
    """Whether the entity exists (``passive`` succeeds), and why ``active`` (the contract's declaration) failed."""
    for call in (passive, active):
        channel = connection.channel()
        try:
            call(channel)
        except connection.channel_errors as exc:
            return call is active, _reason(exc)
        finally:
            try:
                channel.close()
            except Exception:  # noqa: BLE001 - closed by the broker on the error above
                pass
    return True, None


def _exchange(*, passive: bool) -> Callable[[Any], Any]:
    return _declare_exchange(EXCHANGE, EXCHANGE_TYPE, passive=passive)


def _declare_exchange(name: str, kind: str, *, passive: bool) -> Callable[[Any], Any]:
    return lambda channel: channel.exchange_declare(name, kind, passive=passive, durable=True, auto_delete=False)


def _queue(name: str, arguments: dict[str, Any], *, passive: bool) -> Callable[[Any], Any]:
    return lambda channel: channel.queue_declare(name, passive=passive, durable=True, auto_delete=False,
                                                 arguments=arguments)


def topology_findings(connection: Any, *, queue_type: str = "classic") -> list[Finding]:
    """Check that the exchange and every queue exist with exactly the contract's settings (or, with
    ``queue_type="quorum"``, the quorum profile's: see :func:`kombu_ladder.topology.declare`).

    Each is first declared passively (nothing is created); one that exists is then
    declared as the contract says, which RabbitMQ refuses when its settings differ and
    which changes nothing otherwise. Bindings cannot be read over AMQP and are not checked.

    Returns:
        One :class:`Finding` per problem, or a single passing one.
    """
    missing: list[str] = []
    problems: list[Finding] = []
    queues = [*ladder_queues(queue_type), parking_queue()]
    probes = [(EXCHANGE, _exchange(passive=True), _exchange(passive=False))]
    for queue in queues:
        arguments = dict(getattr(queue, "queue_arguments", None) or {})
        probes.append((queue.name, _queue(queue.name, arguments, passive=True),
                       _queue(queue.name, arguments, passive=False)))
    for name, passive, active in probes:
        exists, reason = _probe(connection, passive, active)
        if not exists:
            missing.append(name)
        elif reason is not None:
            problems.append(Finding("topology", False, T_DIFFERS.format(name=name, reason=reason,
                                                                        profile=PROFILES[queue_type])))
    if missing:
        problems.insert(0, Finding("topology", False, T_MISSING.format(
            names="the ladder is not declared" if len(missing) == len(probes) else ", ".join(missing) + " missing")))
    return problems or [Finding("topology", True, T_TOPOLOGY_OK.format(profile=PROFILES[queue_type]))]


def relay_count(depths: Sequence[QueueDepth]) -> int:
    """How many relays consume the control queue, from its depth row (0 when it is missing)."""
    control = next((row for row in depths if row.queue == CONTROL), None)
    return (control.consumers or 0) if control is not None and control.messages is not None else 0


def queue_findings(depths: Sequence[QueueDepth], *, min_relays: int = 1, max_backlog: int = DEFAULT_MAX_BACKLOG,
                   max_parked: Optional[int] = None) -> list[Finding]:
    """Judge the control queue's consumers and backlog (and, if asked, the parking queue) from their depths."""
    rows = {row.queue: row for row in depths}
    findings = []
    control = rows.get(CONTROL)
    if control is not None and control.messages is not None:
        consumers = control.consumers or 0
        if consumers < min_relays:
            text = T_NO_RELAY if consumers == 0 else T_FEW_RELAYS
            findings.append(Finding("relays", False, text.format(count=consumers, queue=CONTROL, minimum=min_relays)))
        else:
            findings.append(Finding("relays", True, T_RELAYS_OK.format(count=consumers, queue=CONTROL)))
        ok = control.messages < max_backlog
        findings.append(Finding("backlog", ok, (T_BACKLOG_OK if ok else T_BACKLOG).format(
            count=control.messages, queue=CONTROL, maximum=max_backlog)))
    parked = rows.get(PARKING)
    if max_parked is not None and parked is not None and parked.messages is not None:
        ok = parked.messages <= max_parked
        findings.append(Finding("parked", ok, (T_PARKED_OK if ok else T_PARKED).format(
            count=parked.messages, queue=PARKING, maximum=max_parked)))
    return findings


def cancellation_findings(connection: Any, *, relays: int = 0) -> list[Finding]:
    """Check the control plane (:mod:`kombu_ladder.controlplane`): every stream with exactly its arguments,
    every record kind's exchange declared.

    A queue of a stream's name declared otherwise first (a classic queue, a stream with a short
    ``x-max-age`` or a size limit) makes every reader refuse it. Checked as :func:`topology_findings`
    checks the ladder: a passive declare, then the table's own declaration, which RabbitMQ refuses
    when the settings differ and which changes nothing otherwise. A policy (``max-age``,
    ``max-length-bytes``) cannot be seen over AMQP, nor can bindings.

    Arguments:
        connection: a :class:`kombu.Connection`.
        relays: how many relays consume the control queue: a missing control plane is a problem only
            then (a relay cannot read the cancellations, nor write its marker, without it).

    Returns:
        One :class:`Finding` (check ``cancellations``).
    """
    missing: list[str] = []
    for stream in STREAMS:
        arguments = dict(stream.arguments)
        exists, reason = _probe(connection, _queue(stream.name, arguments, passive=True),
                                _queue(stream.name, arguments, passive=False))
        if not exists:
            missing.append(stream.name)
        elif reason is not None:
            return [Finding("cancellations", False, T_STREAM_DIFFERS.format(stream=stream.name, reason=reason))]
    for kind in KINDS:
        exists, _ = _probe(connection, _declare_exchange(kind.exchange, kind.type, passive=True),
                           _declare_exchange(kind.exchange, kind.type, passive=True))
        if not exists:
            missing.append(kind.exchange)
    if not missing:
        return [Finding("cancellations", True, T_STREAM_OK.format(stream=STREAM))]
    missing = ["the control plane"] if len(missing) == len(STREAMS) + len(KINDS) else missing
    if relays:
        return [Finding("cancellations", False, T_STREAM_MISSING.format(stream=", ".join(missing), count=relays,
                                                                        queue=CONTROL))]
    return [Finding("cancellations", True, T_STREAM_NOT_YET.format(stream=", ".join(missing)))]


def healthy(findings: Sequence[Finding]) -> bool:
    """Whether every finding passed."""
    return all(finding.ok for finding in findings)
