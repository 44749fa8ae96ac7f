"""serve(): run a console under uvicorn until SIGINT or SIGTERM, then stop it and return."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from .app import create_app
from .console import Console

__all__ = ["serve"]

logger = logging.getLogger("kombu_ladder.web")

I_SERVING = "ladder console on http://%s:%d/%s"
I_STOPPED = "ladder console stopped"

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
        host = f"[{options.host}]" if ":" in options.host else options.host
        logger.warning(I_SERVING, host, options.port, " (read-only)" if options.read_only else "")
        config = uvicorn.Config(app, host=options.host, port=options.port, log_level=log_level.lower(),
                                server_header=False, proxy_headers=False, access_log=False)
        uvicorn.Server(config).run()
    except _Stopped:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        console.stop()
        logger.warning(I_STOPPED)
