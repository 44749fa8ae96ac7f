"""Frames the broker sends a connection: deliveries, confirms and returns, handled in the consuming thread."""

from __future__ import annotations

from typing import Any

__all__ = ["Delivery", "Confirm", "Return", "Close", "Call"]


class Delivery:
    """basic.deliver: a message for one consumer."""

    __slots__ = ("channel", "generation", "consumer_tag", "delivery_tag", "message", "redelivered")

    def __init__(self, channel: Any, consumer_tag: str, delivery_tag: int, message: Any) -> None:
        self.channel, self.generation = channel, channel.generation
        self.consumer_tag, self.delivery_tag, self.message = consumer_tag, delivery_tag, message
        self.redelivered = message.redelivered  #: as it was when the broker sent it

    def fire(self) -> None:
        """Hand the frame to its channel."""
        self.channel._on_delivery(self)


class Confirm:
    """basic.ack or basic.nack of a publish (``multiple`` once batched)."""

    __slots__ = ("channel", "generation", "seq", "multiple", "ack")

    def __init__(self, channel: Any, seq: int, ack: bool) -> None:
        self.channel, self.generation, self.seq, self.multiple, self.ack = channel, channel.generation, seq, False, ack

    def fire(self) -> None:
        """Hand the frame to its channel."""
        self.channel._on_confirm(self)


class Return:
    """basic.return of an unroutable mandatory publish."""

    __slots__ = ("channel", "generation", "args")

    def __init__(self, channel: Any, *args: Any) -> None:
        self.channel, self.generation, self.args = channel, channel.generation, args

    def fire(self) -> None:
        """Hand the frame to its channel."""
        self.channel._on_return(self)


class Close:
    """channel.close from the broker: a publish (or other method) it refused closed the channel."""

    __slots__ = ("channel", "generation", "error")

    def __init__(self, channel: Any, error: Any) -> None:
        self.channel, self.generation, self.error = channel, channel.generation, error

    def fire(self) -> None:
        """Hand the frame to its channel."""
        self.channel._on_close(self)


class Call:
    """Not a frame: a relay's timer that came due in virtual time, run where the relay reads its frames."""

    __slots__ = ("function",)

    def __init__(self, function: Any) -> None:
        self.function = function

    def fire(self) -> None:
        """Run the timer's function."""
        self.function()
