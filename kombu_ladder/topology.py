"""Declare the ladder: the exchange, the five rungs, the control and parking queues."""

from __future__ import annotations

import logging
from typing import Any, Optional

from amqp.exceptions import AccessRefused, ChannelError, PreconditionFailed
from kombu import Exchange, Queue

from .contract import CONTROL, EXCHANGE, EXCHANGE_TYPE, PARKING, RUNGS, arguments_for, rung_name
from .controlplane import PROBE_KEY, declare_control_plane
from .errors import LadderNotDeclared, TopologyConflict
from .link import close_quietly, sibling
from .tuning import QUEUE_TYPES

__all__ = ["QUEUE_TYPES", "check_queue_type", "declare", "declare_control_plane_if_allowed", "check_writable",
           "declare_or_find", "declared_queue_type", "resolve_queue_type",
           "ladder_exchange", "ladder_queues", "parking_queue", "queue_arguments"]

logger = logging.getLogger(__name__)

E_NOT_DECLARED = ("the ladder is not declared ({missing} missing) and this user may not declare it ({reason}): "
                  "run 'kombu-ladder declare' (or 'celery ladder declare') as the ladder's operator first")

#: What the quorum profile adds to every rung: dead-lettering that cannot drop a message.
QUORUM_RUNG_ARGUMENTS: dict[str, object] = {
    "x-queue-type": "quorum",
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
}


#: What the quorum profile gives its control queue. RabbitMQ 4.0 to 4.2 give every quorum queue a
#: delivery limit of 20 (3.x: none, unless a policy sets one), and a message that a relay crash
#: or a lost connection hands back counts one delivery: past the limit, a queue without a
#: dead-letter target drops it. This one parks it (at-least-once), where an operator sees it.
QUORUM_CONTROL_ARGUMENTS: dict[str, object] = {
    "x-queue-type": "quorum",
    "x-dead-letter-exchange": "",
    "x-dead-letter-routing-key": PARKING,
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
}


def check_queue_type(queue_type: object, *, argument: str = "queue_type") -> str:
    """Return ``queue_type`` if it is ``"classic"`` or ``"quorum"``.

    Raises:
        ValueError: anything else, naming ``argument``.
    """
    if isinstance(queue_type, str) and queue_type in QUEUE_TYPES:
        return queue_type
    raise ValueError(f"{argument} must be \"classic\" (the AceMQ contract, the default) or \"quorum\" "
                     f"(replicated, off-contract), not {queue_type!r}")


def queue_arguments(seconds: float, queue_type: str = "classic") -> dict[str, object]:
    """Return the arguments of the rung of ``seconds`` in the ``queue_type`` profile.

    The classic profile's are exactly the contract's (:func:`~kombu_ladder.contract.arguments_for`).
    """
    arguments = arguments_for(seconds)
    if check_queue_type(queue_type) == "quorum":
        arguments.update(QUORUM_RUNG_ARGUMENTS)
    return arguments


def ladder_exchange() -> Exchange:
    """Return the ``acemq.schedule`` exchange: direct and durable."""
    return Exchange(EXCHANGE, type=EXCHANGE_TYPE, durable=True, auto_delete=False)


def ladder_queues(queue_type: str = "classic") -> list[Queue]:
    """Return the rung queues, longest first, then the control queue.

    Each is bound to ``acemq.schedule`` with its own name as the routing key.
    ``queue_type="quorum"`` makes them quorum queues (see :func:`declare`).
    """
    exchange = ladder_exchange()
    queues = [
        Queue(rung_name(r), exchange, routing_key=rung_name(r), durable=True,
              auto_delete=False, queue_arguments=queue_arguments(r, queue_type))
        for r in RUNGS
    ]
    control = dict(QUORUM_CONTROL_ARGUMENTS) if queue_type == "quorum" else None
    queues.append(Queue(CONTROL, exchange, routing_key=CONTROL, durable=True, auto_delete=False,
                        queue_arguments=control))
    return queues


def parking_queue() -> Queue:
    """Return the parking queue: durable, bound to nothing, read by operators."""
    return Queue(PARKING, exchange=None, durable=True, auto_delete=False, no_declare=False)


def declare(connection_or_channel: Any, queue_type: str = "classic") -> list[str]:
    """Declare the ladder's exchange and queues with exactly the contract's arguments.

    Idempotent. The parking queue (local to this library) is declared too but
    is not part of the returned list, which mirrors the AceMQ ``declare``.

    Arguments:
        connection_or_channel: a :class:`kombu.Connection` or a channel.
        queue_type: ``"classic"`` (the default) declares the contract's classic
            queues. ``"quorum"`` declares the rungs and the control queue as
            replicated quorum queues, the rungs with ``x-dead-letter-strategy:
            at-least-once`` and ``x-overflow: reject-publish`` besides the
            contract's arguments: it survives the loss of a cluster node, but
            conflicts with any peer that declares the classic contract.

    Returns:
        The queue names, longest rung first and the control queue last.

    Raises:
        TopologyConflict: a queue or the exchange exists with other arguments.
        ValueError: ``queue_type`` is neither ``"classic"`` nor ``"quorum"``.
    """
    check_queue_type(queue_type)
    if hasattr(connection_or_channel, "default_channel"):
        # A channel of our own: a PRECONDITION_FAILED closes the channel it hit,
        # and must not leave the caller's default channel dead.
        channel = connection_or_channel.channel()
        try:
            return _declare_on(channel, queue_type)
        finally:
            close_quietly(channel)
    return _declare_on(connection_or_channel, queue_type)


def check_writable(connection: Any, exchange: str) -> None:
    """Check, on a channel of its own, that this user may publish to ``exchange`` (a record kind's).

    A publish the broker refuses closes the channel it was sent on, later and without an answer:
    so one probe is published with a routing key bound to nothing (checked as a record is, stored
    nowhere), followed by a round trip that receives the refusal.

    Raises:
        the broker's channel error: 404 (the exchange does not exist) or 403 (not this user's to write).
    """
    channel = connection.channel()
    try:
        channel.basic_publish(channel.prepare_message(b"{}"), exchange=exchange, routing_key=PROBE_KEY)
        channel.basic_qos(0, 0, False)  # a round trip: a refused publish is answered before it
    finally:
        close_quietly(channel)


def declare_control_plane_if_allowed(connection_or_channel: Any) -> bool:
    """Declare the control plane (:mod:`kombu_ladder.controlplane`) on a channel of its own, if this user may.

    A user with full rights (a development broker's ``guest``, a worker the README's way) gets the
    whole topology from :func:`declare`; a least-privilege role (a relay, a producer) has no configure
    on a control-plane name and declares none of it: the operator's ``kombu-ladder declare`` does.

    Returns:
        Whether it was declared (False: this user may not).
    """
    channel = connection_or_channel.channel() if hasattr(connection_or_channel, "default_channel") \
        else sibling(connection_or_channel)
    try:
        declare_control_plane(channel)
    except AccessRefused as exc:
        logger.debug("this user may not declare the control plane (%s): the operator's 'declare' does", exc)
        return False
    finally:
        close_quietly(channel)
    return True


def declare_or_find(connection_or_channel: Any, queue_type: str = "classic") -> list[str]:
    """:func:`declare` the ladder, or, for a user who may not (no configure permission: a producer with
    the minimal permissions of :func:`kombu_ladder.permissions.producer`), find it declared.

    Returns:
        The queue names, as :func:`declare` returns them.

    Raises:
        LadderNotDeclared: the user may not declare the ladder and part of it is missing.
        TopologyConflict, ValueError: as :func:`declare`.
    """
    try:
        names = declare(connection_or_channel, queue_type)
    except AccessRefused as exc:
        missing = _missing(connection_or_channel, [EXCHANGE, *(q.name for q in [*ladder_queues(), parking_queue()])])
        if missing:
            raise LadderNotDeclared(E_NOT_DECLARED.format(missing=", ".join(missing),
                                                          reason=" ".join(str(exc).split()))) from None
        logger.debug("the ladder is declared; this user may not declare it (%s)", exc)
        return [queue.name for queue in ladder_queues(queue_type)]
    return names


def declared_queue_type(connection: Any) -> Optional[str]:
    """The profile (``"classic"`` or ``"quorum"``) the ladder is declared with on the broker, or None.

    A passive declare returns no arguments, so the first ladder queue that exists is declared
    again as each profile declares it, on a channel of its own: RabbitMQ accepts only the
    declaration that matches what exists, and an accepted one changes nothing. None when no
    ladder queue exists, when the first one matches neither profile, or when the user may not
    declare (no configure permission).

    Arguments:
        connection: a :class:`kombu.Connection`.
    """
    profiles = {queue_type: ladder_queues(queue_type) for queue_type in QUEUE_TYPES}
    for index, queue in enumerate(profiles["classic"]):
        if _missing(connection, [None, queue.name]):
            continue
        for queue_type, queues in profiles.items():
            if _accepted(connection, queues[index]):
                return queue_type
        return None
    return None


def resolve_queue_type(connection: Any, queue_type: Optional[str] = None) -> str:
    """``queue_type`` when given (checked), else the profile the ladder is declared with, else ``"classic"``.

    Raises:
        ValueError: ``queue_type`` is neither ``"classic"`` nor ``"quorum"``.
    """
    if queue_type is not None:
        return check_queue_type(queue_type)
    return declared_queue_type(connection) or "classic"


def _accepted(connection: Any, queue: Queue) -> bool:
    """Whether the broker accepts ``queue``'s declaration as it is (a channel of its own: a refusal closes it)."""
    channel = connection.channel()
    try:
        channel.queue_declare(queue.name, durable=True, auto_delete=False,
                              arguments=getattr(queue, "queue_arguments", None) or {})
    except ChannelError:
        return False
    finally:
        close_quietly(channel)
    return True


def _missing(connection_or_channel: Any, names: list[Optional[str]]) -> list[str]:
    """Which of the exchange (the first name; None: none) and the queues do not exist: passive declares,
    a channel each.

    From RabbitMQ 4.2.6 and 4.3 a passive declare needs a permission on what it names (4.3.0: configure;
    4.3.1 on: any). A producer's row (:func:`kombu_ladder.permissions.producer`) has write on the exchange
    and nothing on the rungs, so on those releases only the exchange can be found: a queue refused with
    403 is not counted missing (the operator's ``declare`` made the exchange and its rungs together).
    """
    connection = connection_or_channel if hasattr(connection_or_channel, "default_channel") \
        else connection_or_channel.connection
    missing = []
    for index, name in enumerate(names):
        if name is None:
            continue
        channel = connection.channel()
        try:
            if index == 0:
                channel.exchange_declare(name, EXCHANGE_TYPE, passive=True)
            else:
                channel.queue_declare(name, passive=True)
        except ChannelError as exc:
            code = getattr(exc, "reply_code", None)
            if code == 403 and index > 0:
                logger.debug("may not check that queue %s exists (RabbitMQ >= 4.2.6): %s", name, exc)
                continue
            if code != 404:
                raise
            missing.append(name)
        finally:
            close_quietly(channel)
    return missing


def _declare_on(channel: Any, queue_type: str) -> list[str]:
    exchange = ladder_exchange()
    try:
        exchange(channel).declare()
    except PreconditionFailed as exc:
        raise TopologyConflict(EXCHANGE, {"type": EXCHANGE_TYPE, "durable": True}, str(exc)) from exc
    names = []
    for queue in [*ladder_queues(queue_type), parking_queue()]:
        try:
            queue(channel).declare()
        except PreconditionFailed as exc:
            expected = {"durable": True, "arguments": getattr(queue, "queue_arguments", None) or {}}
            profile = queue_type if queue.name != PARKING else None
            raise TopologyConflict(queue.name, expected, str(exc), queue_type=profile) from exc
        names.append(queue.name)
    logger.debug("declared the ladder topology: %s", ", ".join(names))
    return names[:-1]
