"""``web``: the console's options and the command body both command lines run."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import click

from ..errors import missing_extra
from ..tuning import CONSOLE
from ..web.options import DEFAULT_HOST, ConsoleOptions
from ..web.security import Auth, check_secret
from .commands import BadUsage, CommandError
from .options import Number
from .options import shared_option as _option

__all__ = ["PASSWORD_ENV", "TOKEN_ENV", "E_EXTRA", "web_options", "console_options", "require_extra",
           "relay_metrics_option", "relay_scraper", "serve"]

#: The environment variables that hold the console's secrets when no file is given.
PASSWORD_ENV = "KOMBU_LADDER_WEB_PASSWORD"
TOKEN_ENV = "KOMBU_LADDER_WEB_TOKEN"

E_EXTRA = missing_extra("the web console", "web", "{missing}")

host_option = _option("--host", default=DEFAULT_HOST, show_default=True, metavar="ADDRESS",
                      help="The address to listen on. Anything but loopback needs --password-file or --token-file.")
read_only_option = _option("--read-only", is_flag=True,
                           help="No actions: no cancel, reschedule, run-now, replay or delete, and no POST route.")
user_option = _option("--user", default="admin", show_default=True, metavar="NAME",
                      help="The HTTP basic user name (with --password-file).")
password_file_option = _option(
    "--password-file", type=click.Path(exists=True, dir_okay=False), default=None, metavar="PATH",
    help=f"Require HTTP basic authentication with the password in this file [default: ${PASSWORD_ENV}, if set].")
token_file_option = _option(
    "--token-file", type=click.Path(exists=True, dir_okay=False), default=None, metavar="PATH",
    help=f"Require 'Authorization: Bearer' with the token in this file [default: ${TOKEN_ENV}, if set].")
port_option, refresh_option, page_size_option, look_limit_option = (
    _option(t.option, type=Number(min=t.least, max=t.most, integer=t.kind == "count", duration=t.kind == "seconds"),
            default=t.default, show_default=True, metavar=t.metavar, help=t.help)
    for t in (CONSOLE["port"], CONSOLE["refresh"], CONSOLE["page_size"], CONSOLE["look_limit"]))

#: ``kombu-ladder web --relay-metrics URL`` (repeatable).
relay_metrics_option = _option(
    "--relay-metrics", "relay_metrics", multiple=True, metavar="URL",
    help="A standalone relay's /metrics URL (kombu-ladder relay --metrics-port), whose counters the overview shows "
         "(repeatable).")


def web_options(cls: Optional[type] = None, **extra: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Every ``web`` option, for ``kombu-ladder web`` (``cls`` None) and ``celery ladder web`` (``CeleryOption``)."""
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        for option in (look_limit_option, page_size_option, refresh_option, token_file_option, password_file_option,
                       user_option, read_only_option, port_option, host_option):
            f = option(**({"cls": cls, **extra} if cls is not None else {}))(f)
        return f

    return decorate


def _secret(path: Optional[str], env: str, option: str) -> Optional[str]:
    import os

    if path is not None:
        with open(path, encoding="utf-8") as file:
            return check_secret(file.read(), option=option)
    value = os.environ.get(env)
    return check_secret(value, option=f"${env}") if value else None


def console_options(*, host: str, port: int, read_only: bool, user: str, password_file: Optional[str],
                    token_file: Optional[str], refresh: float, page_size: int, look_limit: int) -> ConsoleOptions:
    """The options as a :class:`~kombu_ladder.web.ConsoleOptions`.

    Raises:
        BadUsage: naming the option at fault (a non-loopback --host without credentials, a short secret).
    """
    try:
        auth = Auth(user=user, password=_secret(password_file, PASSWORD_ENV, "--password-file"),
                    token=_secret(token_file, TOKEN_ENV, "--token-file"))
        return ConsoleOptions(host=host, port=port, auth=auth, read_only=read_only, refresh=refresh,
                              page_size=page_size, look_limit=look_limit)
    except ValueError as exc:
        raise BadUsage(str(exc)) from None


def require_extra() -> None:
    """Fail with one line naming the extra when Starlette, Jinja2 or uvicorn is missing.

    Raises:
        CommandError: one of them cannot be imported.
    """
    for module in ("starlette", "jinja2", "uvicorn"):
        try:
            __import__(module)
        except ModuleNotFoundError:
            raise CommandError(E_EXTRA.format(missing=module)) from None


def relay_scraper(urls: Sequence[str]) -> Optional[Callable[[], Any]]:
    """What reads the counters of the relays at ``urls`` (None: no URL given)."""
    if not urls:
        return None
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise BadUsage(f"--relay-metrics: {url!r} is not an http:// or https:// URL")
    from ..web.console import scrape_relays

    return lambda: scrape_relays(list(urls))


def serve(connection: Any, options: ConsoleOptions, *, index_path: str,
          counters: Optional[Callable[[], Any]] = None, log_level: str = "WARNING") -> None:
    """Run the console on ``connection``'s broker until SIGINT or SIGTERM."""
    from ..web.console import Console
    from ..web.serve import serve as run

    run(Console(connection, options=options, index_path=index_path, counters=counters), log_level=log_level)
