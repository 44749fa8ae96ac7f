"""SimulatedLink: the simulator's transport as the relay holds it, on the broker's virtual clock."""

from __future__ import annotations

from typing import Any, Optional

from ..link import Guard, RawMessage, Schedule

__all__ = ["SimulatedLink"]


class SimulatedLink:
    """The :class:`~kombu_ladder.link.Link` of one simulated connection (see ``Transport.ladder_link``).

    Its clock is the broker's virtual one, and its timers fire in virtual time:
    ``advance()`` stops at the time asked and runs the callback where the
    connection is drained, as a timer in a real relay's event loop would. The
    guard is the transport's: its channels hand it what py-amqp's frame reader
    would (see :class:`~kombu_ladder.simulator.inbound.Inbound`).
    """

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.guard: Guard = transport.guard
        self.clock = self.monotonic = transport.broker.now

    @property
    def frame_max(self) -> int:
        """The largest frame, as RabbitMQ negotiates it by default."""
        return self.transport.frame_max

    def sibling(self) -> Any:
        """Open another channel on the connection."""
        return self.transport.create_channel(self.transport)

    def publish_raw(self, channel: Any, message: RawMessage, exchange: str, routing_key: str) -> None:
        """Publish ``message`` (mandatory); the confirm comes as a frame, as on RabbitMQ."""
        type(channel).basic_publish(channel, message, exchange=exchange, routing_key=routing_key, mandatory=True)

    def discard(self, channel: Any) -> None:
        """Let go of a channel the broker closed."""
        channel.discard()

    def set_prefetch(self, channel: Any, count: int) -> None:
        """Set the prefetch of ``channel``'s next consumers (the simulator answers no frames)."""
        channel.basic_qos(0, count, False)

    def forget_consumer(self, channel: Any, tag: str) -> None:
        """Drop consumer ``tag``'s callback (the simulator's cancel already has)."""
        channel.callbacks.pop(tag, None)

    def timers(self) -> Optional[Schedule]:
        """``schedule(seconds, callback)`` in virtual time, on this connection."""
        transport, broker = self.transport, self.transport.broker
        return lambda seconds, callback: broker.call_later(transport, seconds, callback)
