"""RabbitMQ release profiles: what a 4.0 or 4.3 broker does differently from 3.10 (measured on 4.0.5 and 4.3.6)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from amqp import spec
from amqp.exceptions import InternalError, PreconditionFailed

from .. import wire

__all__ = ["Profile", "PROFILES", "DEFAULT", "profile_for"]

#: The profile a SimulatedBroker uses unless told otherwise: the RabbitMQ this repository is tested on.
DEFAULT = "3.10"

#: 4.3's text for a transient non-exclusive queue (rabbit_deprecated_features' warning, shortened).
E_TRANSIENT_NONEXCL = (
    "INTERNAL_ERROR - Feature `transient_nonexcl_queues` is deprecated. By default, this feature is not "
    "permitted anymore. Use durable queues, transient exclusive queues, or durable queues with a queue TTL."
)


@dataclass(frozen=True)
class Profile:
    """What one RabbitMQ release refuses or treats differently (only what the ladder can meet)."""

    #: The release, as given to ``SimulatedBroker(rabbitmq=...)``.
    name: str
    #: ``basic.qos(global=true)`` limits the whole channel (3.x); from 4.3 (deprecated feature
    #: ``global_qos`` denied by default) the broker quietly applies it per consumer instead.
    global_qos: bool = True
    #: Declaring a queue with ``x-queue-mode`` (any value) or ``x-queue-version=1`` works (3.x);
    #: 4.3 removed classic queues v1 and refuses both.
    cqv1_arguments: bool = True
    #: A non-durable, non-exclusive queue can be declared (3.x); 4.3 refuses it by default
    #: (deprecated feature ``transient_nonexcl_queues``) and closes the connection.
    transient_nonexclusive: bool = True
    #: What a consumer or a ``basic.return`` receives: the properties as published (3.x), or with
    #: the header table re-encoded (4.x: see :func:`kombu_ladder.wire.normal_form`).
    reencodes_headers: bool = False
    #: Dead-lettering also writes ``x-last-death-reason``, ``-queue`` and ``-exchange`` (4.x).
    last_death_headers: bool = False
    #: Queue arguments read back (``rabbitmqctl list_queues arguments``) name ``x-queue-type``
    #: on every queue, a classic one declared without it included (4.x).
    reports_queue_type: bool = False
    #: An ``ACCESS_REFUSED`` text names the right refused (``configure access to queue ...``: 4.x).
    names_rights: bool = False
    #: A passive ``queue.declare`` or ``exchange.declare`` needs some permission on what it names, checked
    #: before whether it exists (4.2.6 and 4.3.0: configure; 4.3.1 on: any of the three); 3.x and 4.0 need none.
    passive_needs_permission: bool = False

    def check_queue_declare(self, name: str, vhost: str, *, durable: bool, exclusive: bool,
                            arguments: dict[str, Any], new: bool = True) -> None:
        """Raise what this release answers to a declaration it refuses (nothing for one it accepts).

        ``new``: no such queue exists yet. 4.3.6 refuses a transient non-exclusive queue only then: declared
        again with ``durable=False``, an existing durable queue is inequivalent, as on 3.10.
        """
        method = spec.Queue.Declare
        if not self.cqv1_arguments:
            if "x-queue-mode" in arguments:
                raise PreconditionFailed(
                    f"PRECONDITION_FAILED - invalid arg 'x-queue-mode' for queue '{name}' in vhost '{vhost}': "
                    "classic queue v1 (queue modes) was removed in RabbitMQ 4.3", method, reply_code=406)
            if arguments.get("x-queue-version") == 1:
                raise PreconditionFailed(
                    f"PRECONDITION_FAILED - invalid arg 'x-queue-version' for queue '{name}' in vhost "
                    f"'{vhost}': unsupported queue version '1'", method, reply_code=406)
        if new and not self.transient_nonexclusive and not durable and not exclusive:
            raise InternalError(E_TRANSIENT_NONEXCL, method, reply_code=541)

    def qos_is_global(self, a_global: bool) -> bool:
        """Whether a ``basic.qos`` with this ``global`` flag limits the whole channel."""
        return a_global and self.global_qos

    def outgoing(self, raw: bytes) -> bytes:
        """The encoded properties a consumer or a return receives of a message stored as ``raw``."""
        if not self.reencodes_headers:
            return raw
        normal = wire.normal_form(raw)
        return raw if normal is None else normal

    def read_back(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """A queue's arguments as this release reports them."""
        if self.reports_queue_type and "x-queue-type" not in arguments:
            return {**arguments, "x-queue-type": "classic"}
        return dict(arguments)


#: What 4.0 does differently from 3.10, measured on 4.0.5 (tests/broker/test_simulator_fidelity.py
#: runs the same scenarios on both brokers and on these profiles).
_FOUR = {"reencodes_headers": True, "last_death_headers": True, "reports_queue_type": True, "names_rights": True}

#: Every profile by name. "3.10" is what the repository's real broker runs; "4.0" the other one it
#: runs (``make test-rabbitmq4``); "4.3" is 4.0 plus 4.3's refusals and its permission check on passive
#: declares, measured on 4.3.6 (``make test-rabbitmq43``).
PROFILES: dict[str, Profile] = {
    "3.10": Profile("3.10"),
    "4.0": Profile("4.0", **_FOUR),
    "4.3": Profile("4.3", global_qos=False, cqv1_arguments=False, transient_nonexclusive=False,
                   passive_needs_permission=True, **_FOUR),
}


def profile_for(name: str) -> Profile:
    """Return the profile called ``name``.

    Raises:
        ValueError: no such profile, naming the argument and the known ones.
    """
    try:
        return PROFILES[str(name)]
    except KeyError:
        raise ValueError(f"rabbitmq={name!r} is not a simulator profile; known: {sorted(PROFILES)}") from None
