"""serve(): run a console under uvicorn until SIGINT or SIGTERM, then stop it and return."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any, Optional

from .app import create_app
from .console import Console

__all__ = ["serve"]

logger = logging.getLogger("kombu_ladder.web")

#: The one line printed on stdout once the console listens (as uvicorn and Flower print theirs): the URL to open.
I_SERVING = "ladder console on http://{host}:{port}/{read_only}"
I_STOPPED = "ladder console stopped"


def serving_line(address: Any, *, read_only: bool) -> str:
    """The line naming the URL to open, from the listening socket's address (the port bound, for --port 0)."""
    host, port = address[0], address[1]
    host = f"[{host}]" if ":" in host else host
    return I_SERVING.format(host=host, port=port, read_only=" (read-only)" if read_only else "")

#: The signals that stop the console (uvicorn shuts down gracefully on each, then raises it again).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Stopped(Exception):
    """A stop signal arrived (raised by the handler :func:`serve` installs)."""


def _stop(signum: int, frame: Any) -> None:
    raise _Stopped(signum)


def serve(console: Console, *, log_level: str = "warning") -> None:
    """Start ``console``, serve it on its options' host and port until SIGINT or SIGTERM, and stop it.

    uvicorn shuts down gracefully on either signal and then raises it again for the handler it found; the one
    installed here turns that into a normal return, so the command exits 0 as ``relay`` does.
    """
    import uvicorn

    options = console.options
    app = create_app(console)
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, _stop) for sig in STOP_SIGNALS} if main else {}
    try:
        console.start()
        config = uvicorn.Config(app, host=options.host, port=options.port, log_level=log_level.lower(),
                                server_header=False, proxy_headers=False, access_log=False)

        class Server(uvicorn.Server):  # type: ignore[misc]  # uvicorn is untyped where mypy runs without the extra
            async def startup(self, sockets: Optional[list[Any]] = None) -> None:
                await super().startup(sockets)
                if self.started:  # listening: say where, once, on stdout
                    address = self.servers[0].sockets[0].getsockname()
                    print(serving_line(address, read_only=options.read_only), file=sys.stdout, flush=True)

        Server(config).run()
    except _Stopped:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        console.stop()
        logger.info(I_STOPPED)
