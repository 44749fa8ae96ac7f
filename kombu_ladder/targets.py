"""Whether a target exchange can be published to, asked on a side connection and remembered."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

__all__ = ["ExchangeCheck"]

logger = logging.getLogger(__name__)

W_MISSING = "target exchange %r cannot be published to: %s"


class ExchangeCheck:
    """Ask the broker (passively) whether a target exchange exists before a delivery.

    On RabbitMQ a publish to a missing exchange is not returned: it closes the
    channel with 404 NOT_FOUND. The relay's channel would die, the expired
    message would come back, and the relay would loop on it forever. The check
    runs on a connection of its own (a clone, so no frame of the relay's
    channel is read while it waits), and an exchange found to exist is trusted
    for ``ttl`` seconds. The default exchange ``""`` always exists.

    Calling the check returns ``None`` when the exchange can be published to,
    or the broker's reason when it cannot.
    """

    #: How long (seconds) an exchange found to exist is trusted without asking again.
    TTL = 60.0

    def __init__(self, connection: Any, *, ttl: float = TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.connection = connection
        self.ttl = ttl
        self._clock = clock
        self._known: dict[str, float] = {}

    def __call__(self, exchange: str) -> Optional[str]:
        if not exchange:
            return None
        now = self._clock()
        seen = self._known.get(exchange)
        if seen is not None and now - seen < self.ttl:
            return None
        conn = self.connection
        try:
            channel = conn.channel()
        except conn.connection_errors:
            logger.warning("cannot check target exchange %r; publishing anyway", exchange, exc_info=True)
            return None
        try:
            channel.exchange_declare(exchange=exchange, type="direct", passive=True)
        except conn.channel_errors as exc:
            reason = str(getattr(exc, "reply_text", "") or exc)
            logger.warning(W_MISSING, exchange, reason)
            return reason
        except conn.connection_errors:
            logger.warning("cannot check target exchange %r; publishing anyway", exchange, exc_info=True)
            return None
        finally:
            try:
                channel.close()
            except Exception:  # noqa: BLE001 - closed by the broker already
                pass
        self._known[exchange] = now
        return None

    def forget(self) -> None:
        """Forget every exchange found to exist (after the relay's channel died, for instance)."""
        self._known.clear()

    def close(self) -> None:
        """Close the side connection; it reconnects if the check is used again."""
        try:
            self.connection.release()
        except Exception:  # noqa: BLE001 - nothing to close on a dead connection
            logger.debug("closing the exchange-check connection failed", exc_info=True)
