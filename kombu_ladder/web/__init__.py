"""The web console (``kombu-ladder web``, ``celery ladder web``): what waits, what was parked, and the actions.

The pure parts (:mod:`.options`, :mod:`.security`, :mod:`.views`, :mod:`.preview`)
import nothing beyond the standard library and the ladder; :func:`create_app` and
:func:`serve` need the ``[web]`` extra (Starlette, Jinja2, uvicorn).
"""

from __future__ import annotations

from typing import Any

from .options import DEFAULT_HOST, DEFAULT_PORT, ConsoleOptions
from .security import Auth

__all__ = ["ConsoleOptions", "Auth", "DEFAULT_HOST", "DEFAULT_PORT", "Console", "create_app", "serve"]


def __getattr__(name: str) -> Any:
    """The names that need the extra, imported when first used."""
    if name == "Console":
        from .console import Console

        return Console
    if name == "create_app":
        from .app import create_app

        return create_app
    if name == "serve":
        from .serve import serve

        return serve
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
