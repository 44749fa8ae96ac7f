"""A threaded WSGI server that bounds its connections: a read timeout, and a cap on how many are open."""

from __future__ import annotations

import collections
import logging
import socket
import sys
import threading
from socketserver import ThreadingMixIn
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

__all__ = ["BoundedServer", "READ_TIMEOUT", "MAX_CONNECTIONS", "serve"]

logger = logging.getLogger(__name__)

D_ERROR = "metrics connection from %s ended: %s"

#: Seconds a connection may stay silent while it sends its request (and a reader while it takes the
#: answer) before the server closes it.
READ_TIMEOUT = 5.0

#: Connections open at once, at the most. A new one beyond closes the oldest that has not sent its
#: request yet (an idle socket); when every open one is being answered, the new one is closed instead.
MAX_CONNECTIONS = 16


class _Handler(WSGIRequestHandler):
    """One request per connection, logged nowhere; its socket times out after :attr:`timeout` seconds."""

    server: "BoundedServer"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        """Log nothing (a scrape every few seconds is not news)."""

    def parse_request(self) -> bool:
        """Read the request line's headers; the connection is then being answered, no longer idle."""
        parsed = super().parse_request()
        self.server.answering(self.request)
        return parsed


class BoundedServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most ``max_connections`` of them, each read with a ``read_timeout``.

    Idle connections cannot pile up: each one is closed after ``read_timeout`` seconds of
    silence, and past ``max_connections`` the oldest one still waiting for its request is
    closed to make room, so a fresh scrape is answered even while idle sockets keep coming
    (and the process's file descriptors stay bounded).
    """

    daemon_threads = True
    #: Connections the kernel queues before they are accepted (each accepted one is settled at once).
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], family: int, *, read_timeout: float = READ_TIMEOUT,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        if not max_connections >= 1:
            raise ValueError(f"max_connections must be at least 1, not {max_connections!r}")
        if not read_timeout > 0:
            raise ValueError(f"read_timeout must be a positive number of seconds, not {read_timeout!r}")
        self.address_family = family
        handler = type("BoundedHandler", (_Handler,), {"timeout": read_timeout})
        super().__init__(address, handler)
        self.max_connections = max_connections
        self._lock = threading.Lock()
        #: Connections still sending their request, oldest first, and those being answered.
        self._idle: "collections.OrderedDict[Any, None]" = collections.OrderedDict()
        self._answering: set[Any] = set()
        #: Connections closed to make room (idle ones evicted, or new ones refused).
        self.closed_for_room = 0

    @property
    def open_connections(self) -> int:
        """Connections accepted and not finished."""
        with self._lock:
            return len(self._idle) + len(self._answering)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            victim = None
            if len(self._idle) + len(self._answering) >= self.max_connections:
                if not self._idle:  # every open one is being answered: no room for this one
                    self.closed_for_room += 1
                    self.shutdown_request(request)
                    return
                victim, _ = self._idle.popitem(last=False)
                self.closed_for_room += 1
            self._idle[request] = None
        if victim is not None:
            _wake(victim)  # its thread's read returns at once, and the thread closes it
        super().process_request(request, client_address)

    def answering(self, request: Any) -> None:
        """``request`` has sent its request: it is answered, and no longer closed to make room."""
        with self._lock:
            if request in self._idle:
                del self._idle[request]
                self._answering.add(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._idle.pop(request, None)
                self._answering.discard(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that timed out, was closed for room or went away: one debug line, no traceback."""
        logger.debug(D_ERROR, client_address, sys.exc_info()[1])


def _wake(request: Any) -> None:
    try:
        request.shutdown(socket.SHUT_RDWR)
    except OSError:  # gone already
        pass


def serve(app: Callable[..., Any], address: str, port: int, *, read_timeout: float = READ_TIMEOUT,
          max_connections: int = MAX_CONNECTIONS) -> tuple[BoundedServer, threading.Thread]:
    """Serve the WSGI ``app`` on ``address:port`` from a daemon thread; return the server and the thread.

    Raises:
        OSError: the address cannot be resolved or bound.
        ValueError: ``read_timeout`` or ``max_connections`` is not positive.
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                                                   flags=socket.AI_PASSIVE)[0]
    server = BoundedServer((str(sockaddr[0]), port), family, read_timeout=read_timeout,
                           max_connections=max_connections)
    server.set_app(app)
    thread = threading.Thread(target=server.serve_forever, name="ladder-metrics", daemon=True)
    thread.start()
    return server, thread
