"""The console's HTTP adapter (Starlette): routes, authentication, CSRF, templates. The pages' logic is in
:mod:`~kombu_ladder.web.views`, what they read and do in :class:`~kombu_ladder.web.console.Console`."""

from __future__ import annotations

import logging
from importlib import resources
from typing import Any, Callable, Mapping, Optional
from urllib.parse import parse_qsl

from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

from .. import __version__
from ..index import Filter
from ..times import TIME_HELP, parse_when
from .console import Console
from .preview import header_rows, preview, shown
from .security import authorized, challenge, csrf_ok, csrf_token, new_key, new_session, same_origin
from .views import (
    DEFAULT_TARGET,
    Outcome,
    ago,
    counter_table,
    day_chart,
    depth_rows,
    filter_form,
    hour_chart,
    iso,
    link,
    page_of,
    parked_groups,
    waiting_row,
)

__all__ = ["create_app", "SESSION_COOKIE", "HEADERS"]

logger = logging.getLogger("kombu_ladder.web")

#: The cookie a browser's CSRF token is bound to.
SESSION_COOKIE = "ladder_session"
#: Headers on every response: no script runs (the console has none), nothing is framed or cached, no URL leaks.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Not no-referrer: with it Chromium sends "Origin: null" on the console's own form posts, which the origin check
    # must refuse. same-origin keeps URLs (which hold message ids) from other sites, and the Origin header right.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

E_CSRF = "refused: this form is not from this console (missing or wrong CSRF token). Reload the page and try again."
E_ORIGIN = "refused: the request came from another site (Origin {origin})."
E_FORM = "refused: {field} is missing or not valid."
#: Seconds a message's page waits for the look into its queue before it is served saying "looking" (and reloads
#: itself each second, without script, until the look is done).
LOOK_WAIT = 0.3
#: The largest form body read (a form of this console is a few hundred bytes).
MAX_FORM = 64 * 1024


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("kombu_ladder.web", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.globals.update(iso=iso, ago=ago, link=link, shown=shown, version=__version__, DEFAULT_TARGET=DEFAULT_TARGET,
                       TIME_HELP=TIME_HELP)
    return env


class _Pages:
    """The route handlers, over one console."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.options = console.options
        self.env = _environment()
        self.key = new_key()
        self.css = resources.files("kombu_ladder.web").joinpath("static/console.css").read_bytes()

    def render(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        session = request.state.session
        page = self.env.get_template(template).render(
            csrf=csrf_token(self.key, session), read_only=self.options.read_only, path=request.url.path,
            index=self.console.index, now_ms=self.console.now_ms(), **context)
        return HTMLResponse(page, status_code=status)

    # -- pages ---------------------------------------------------------------------------

    def overview(self, request: Request) -> Response:
        depths, sampled_at = self.console.depths()
        by_minute, minute0 = self.console.histogram(60_000, 60)
        by_hour, hour0 = self.console.histogram(3_600_000, 24)
        counters = self.console.counters
        return self.render(
            request, "overview.html", depths=depth_rows(depths), sampled_at=sampled_at,
            refresh=self.options.refresh, charts=(hour_chart(by_minute, minute0), day_chart(by_hour, hour0)),
            waiting=self.console.count(Filter()), counters_known=self.console.counters_source is not None,
            counters=counter_table(counters) if counters is not None else None,
            counters_error=self.console.counters_error)

    def waiting(self, request: Request) -> Response:
        now = self.console.now_ms()
        form = filter_form(request.query_params, now)
        if form.errors:
            return self.render(request, "waiting.html", status=400, form=form, rows=[], page=None, found=None)
        if form.ident is not None:
            rows = self.console.find(form.ident)
            return self.render(request, "waiting.html", form=form, rows=[waiting_row(r, now) for r in rows],
                               page=None, found=form.ident)
        limit = self.options.page_size
        page = page_of(request.query_params.get("offset", "0"), limit, self.console.count(form.found))
        rows = self.console.listing(form.found, limit=limit, offset=page.offset)
        return self.render(request, "waiting.html", form=form, rows=[waiting_row(r, now) for r in rows], page=page,
                           found=None)

    def message(self, request: Request) -> Response:
        ident = request.query_params.get("id", "")
        if not ident:
            return self.render(request, "error.html", status=400, message=E_FORM.format(field="id"))
        now = self.console.now_ms()
        rows = [waiting_row(r, now) for r in self.console.find(ident)]
        due = rows[0].due_ms if rows else None
        look = self.console.look(ident, due, wait=LOOK_WAIT)
        seen, body = look.seen, None
        if seen is not None:
            headers = seen.headers
            body = preview(seen.body, content_type=str(headers.get("x-schedule-content-type") or
                                                       seen.properties.get("content_type") or ""),
                           content_encoding=seen.properties.get("content_encoding"), headers=headers,
                           limit=self.options.preview_bytes)
        properties = header_rows({k: v for k, v in (seen.properties if seen else {}).items()
                                  if k != "application_headers"})
        return self.render(request, "message.html", ident=ident, rows=rows, look=look, seen=seen, body=body,
                           headers=header_rows(seen.headers) if seen else [], properties=properties,
                           moved=self.console.moved.get(ident), look_limit=self.options.look_limit,
                           reload=None if look.done else 1)

    def parked(self, request: Request) -> Response:
        parked = self.console.parked()
        return self.render(request, "parked.html", groups=parked_groups(parked), shown_limit=self.options.parked_limit,
                           count=len(parked))

    def actions(self, request: Request) -> Response:
        return self.render(request, "actions.html", recent=list(self.console.recent))

    def css_file(self, request: Request) -> Response:
        return Response(self.css, media_type="text/css")

    # -- confirmations (GET: nothing changes) ------------------------------------------------

    def confirm(self, request: Request) -> Response:
        """The page that asks before an action: what it will do, and one button that POSTs it."""
        action = request.path_params["action"]
        q = request.query_params
        if action in ("cancel", "run-now", "reschedule"):
            ident = q.get("id", "")
            if not ident:
                return self.render(request, "error.html", status=400, message=E_FORM.format(field="id"))
            rows = [waiting_row(r, self.console.now_ms()) for r in self.console.find(ident)]
            fields: dict[str, Any] = {"id": ident}
            if action == "reschedule":
                now = self.console.now_ms()
                try:
                    due = _when(q.get("when", ""), now)
                except ValueError as exc:
                    return self.render(request, "error.html", status=400, message=str(exc))
                fields["due_ms"] = str(due)
                question = f"Make {shown(ident)} due at {iso(due)} ({ago(due, now)})?"
            else:
                question = {"cancel": f"Cancel {shown(ident)}?", "run-now": f"Run {shown(ident)} now?"}[action]
            return self.render(request, "confirm.html", action=action, question=question, fields=fields, rows=rows,
                               back=link("/message", id=ident))
        if action in ("replay", "discard"):
            parked_id, reason = q.get("parked_id"), q.get("reason")
            if action == "discard" and not parked_id or action == "replay" and not (parked_id or reason):
                return self.render(request, "error.html", status=400, message=E_FORM.format(field="parked_id"))
            fields = {"parked_id": parked_id} if parked_id else {"reason": reason}
            question = (f"Delete the parked message {shown(parked_id)}? It is gone for good." if action == "discard"
                        else f"Replay the parked message {shown(parked_id)}?" if parked_id else
                        f"Replay every message parked because: {shown(reason)}?")
            return self.render(request, "confirm.html", action=action, question=question, fields=fields, rows=[],
                               back="/parked")
        return self.render(request, "error.html", status=404, message=f"no action {action!r}")

    def bulk(self, request: Request) -> Response:
        """The bulk cancel preview: what it would touch, and the button."""
        form = filter_form(request.query_params, self.console.now_ms())
        if form.errors or not form.narrowed:
            return self.render(request, "bulk.html", status=400 if form.errors else 200, form=form, rows=[], total=0)
        rows = self.console.bulk_rows(form.found)
        now = self.console.now_ms()
        return self.render(request, "bulk.html", form=form, total=len(rows),
                           rows=[waiting_row(r, now) for r in rows[:self.options.page_size]])

    # -- actions (POST) ------------------------------------------------------------------------

    async def act(self, request: Request) -> Response:
        action = request.path_params["action"]
        form = await _form(request)
        if not same_origin(request.headers.get("origin"), request.headers.get("host")):
            return self.render(request, "error.html", status=403,
                               message=E_ORIGIN.format(origin=request.headers.get("origin")))
        if not csrf_ok(self.key, request.cookies.get(SESSION_COOKIE), form.get("csrf")):
            return self.render(request, "error.html", status=403, message=E_CSRF)
        try:
            call = self._action(action, form)
        except ValueError as exc:
            return self.render(request, "error.html", status=400, message=str(exc))
        if call is None:
            return self.render(request, "error.html", status=404, message=f"no action {action!r}")
        try:
            outcome = await run_in_threadpool(call)
        except Exception as exc:  # noqa: BLE001 - the broker refused or went away: say so, on the page
            logger.warning("console action %s failed: %s", action, exc)
            outcome = self.console.record(Outcome(False, f"{action}: failed", (f"{type(exc).__name__}: {exc}",),
                                                 at=self.console.now_ms(), action=action))
        return self.render(request, "outcome.html", status=200 if outcome.ok else 409, outcome=outcome)

    def _action(self, action: str, form: Mapping[str, str]) -> Optional[Callable[[], Outcome]]:
        console = self.console
        if action in ("cancel", "run-now", "reschedule"):
            ident = _field(form, "id")
            if action == "cancel":
                return lambda: console.cancel(ident)
            if action == "run-now":
                return lambda: console.reschedule(ident, 0)
            due = _field(form, "due_ms")
            if not due.isdigit():
                raise ValueError(E_FORM.format(field="due_ms"))
            return lambda: console.reschedule(ident, int(due))
        if action == "bulk-cancel":
            found = filter_form(form, console.now_ms())
            if found.errors or not found.narrowed:
                raise ValueError(E_FORM.format(field="task or target"))
            expected = form.get("expected", "")
            return lambda: console.bulk_cancel(found.found, expected=int(expected) if expected.isdigit() else None)
        if action == "replay":
            if form.get("parked_id"):
                return lambda: console.replay(parked_id=form["parked_id"])
            reason = _field(form, "reason")
            return lambda: console.replay(reason=reason)
        if action == "discard":
            parked_id = _field(form, "parked_id")
            return lambda: console.discard(parked_id)
        return None


def _field(form: Mapping[str, str], name: str) -> str:
    value = form.get(name, "")
    if not value:
        raise ValueError(E_FORM.format(field=name))
    return value


def _when(text: str, now_ms: int) -> int:
    """A reschedule form's new time, read as the command lines read WHEN (:mod:`kombu_ladder.times`)."""
    if not text.strip():
        raise ValueError(E_FORM.format(field="when"))
    return parse_when(text, option="when", now_ms=now_ms)


async def _form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (the console's forms send nothing else), at most
    :data:`MAX_FORM` bytes; the first value of each field."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            return {}
    out: dict[str, str] = {}
    for name, value in parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True):
        out.setdefault(name, value)
    return out


class _Guard(BaseHTTPMiddleware):
    """Authentication on every request, the session cookie CSRF tokens bind to, and the safety headers."""

    def __init__(self, app: Any, *, console: Console) -> None:
        super().__init__(app)
        self.auth = console.options.auth

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if not authorized(self.auth, request.headers.get("authorization")):
            response: Response = PlainTextResponse("authentication required", status_code=401,
                                                   headers={"WWW-Authenticate": challenge(self.auth)})
        else:
            session = request.cookies.get(SESSION_COOKIE)
            fresh = not session or len(session) > 64
            request.state.session = new_session() if fresh else session
            response = await call_next(request)
            if fresh:
                response.set_cookie(SESSION_COOKIE, request.state.session, httponly=True, samesite="strict",
                                    secure=request.url.scheme == "https")
        for name, value in HEADERS.items():
            response.headers[name] = value
        return response


def create_app(console: Console) -> Starlette:
    """The console's ASGI application over ``console`` (started and stopped by the caller).

    With ``console.options.read_only`` no action route exists: every POST is a 405 and no page shows a button.
    """
    pages = _Pages(console)
    routes = [
        Route("/", pages.overview, methods=["GET"]),
        Route("/waiting", pages.waiting, methods=["GET"]),
        Route("/message", pages.message, methods=["GET"]),
        Route("/parked", pages.parked, methods=["GET"]),
        Route("/static/console.css", pages.css_file, methods=["GET"]),
    ]
    if not console.options.read_only:
        routes += [
            Route("/actions", pages.actions, methods=["GET"]),
            Route("/bulk-cancel", pages.bulk, methods=["GET"]),
            Route("/confirm/{action}", pages.confirm, methods=["GET"]),
            Route("/act/{action}", pages.act, methods=["POST"]),
        ]
    return Starlette(routes=routes, middleware=[Middleware(_Guard, console=console)])
