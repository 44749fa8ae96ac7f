"""serve(): run a console under uvicorn until SIGINT or SIGTERM."""

from __future__ import annotations

import logging

from .app import create_app
from .console import Console

__all__ = ["serve"]

logger = logging.getLogger("kombu_ladder.web")

I_SERVING = "ladder console on http://%s:%d/%s"


def serve(console: Console, *, log_level: str = "warning") -> None:
    """Start ``console``, serve it on its options' host and port, and stop it when the server stops."""
    import uvicorn

    options = console.options
    app = create_app(console)
    console.start()
    try:
        host = f"[{options.host}]" if ":" in options.host else options.host
        logger.warning(I_SERVING, host, options.port, " (read-only)" if options.read_only else "")
        config = uvicorn.Config(app, host=options.host, port=options.port, log_level=log_level.lower(),
                                server_header=False, proxy_headers=False, access_log=False)
        uvicorn.Server(config).run()
    finally:
        console.stop()
