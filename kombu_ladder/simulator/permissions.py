"""The simulated user's permissions: configure, write and read regexps, checked where RabbitMQ 3.10 checks them."""

from __future__ import annotations

import re
from typing import Any

from amqp.exceptions import AccessRefused

__all__ = ["Permissions"]

#: How the default exchange ``""`` is named in permissions and in RabbitMQ's error texts.
DEFAULT_EXCHANGE = "amq.default"


class Permissions:
    """One user's permissions in the vhost (the simulator has one user, ``guest``).

    Like RabbitMQ, a regexp matches anywhere in a name unless it is anchored,
    and a refusal is ``403 ACCESS_REFUSED`` with RabbitMQ's text, which closes
    the channel. Checked: *write* on the exchange of a publish and on the
    destination of a (un)bind, *read* on the source of a (un)bind and on a
    queue consumed or read, *configure* on what is declared or deleted.
    """

    def __init__(self, vhost: str, configure: str = ".*", write: str = ".*", read: str = ".*",
                 user: str = "guest", *, names_rights: bool = False) -> None:
        self.vhost = vhost
        self.user = user
        self.rules = {"configure": re.compile(configure), "write": re.compile(write), "read": re.compile(read)}
        #: Whether a refusal names the right (``configure access to queue ...``: RabbitMQ 4.x) or not (3.x).
        self.names_rights = names_rights

    def check(self, right: str, kind: str, name: str, method: Any) -> None:
        """Raise RabbitMQ's ``ACCESS_REFUSED`` unless ``right`` covers resource ``kind`` ``name``.

        Raises:
            AccessRefused: the right does not cover the name.
        """
        shown = name or (DEFAULT_EXCHANGE if kind == "exchange" else name)
        if self.rules[right].search(shown) is None:
            self._refuse(right, kind, shown, method)

    def check_any(self, kind: str, name: str, method: Any) -> None:
        """Raise ``ACCESS_REFUSED`` (naming configure, as RabbitMQ 4.3 does) unless some right covers ``name``:
        what 4.3.1 and later ask of a passive declare.

        Raises:
            AccessRefused: no right covers the name.
        """
        shown = name or (DEFAULT_EXCHANGE if kind == "exchange" else name)
        if all(rule.search(shown) is None for rule in self.rules.values()):
            self._refuse("configure", kind, shown, method)

    def _refuse(self, right: str, kind: str, shown: str, method: Any) -> None:
        named = f"{right} " if self.names_rights else ""
        raise AccessRefused(
            f"ACCESS_REFUSED - {named}access to {kind} '{shown}' in vhost '{self.vhost}' refused for user "
            f"'{self.user}'", method, reply_code=403)
