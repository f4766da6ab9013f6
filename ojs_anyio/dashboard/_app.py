"""The dashboard's ASGI application (Starlette): pages, their live regions, and actions.

Safe by default (docs/dashboard.md, "Security"):

* **Host check.**  A request whose ``Host`` is not one this server answers for (loopback
  names, the address it listens on, ``--allow-host``) gets 421: a page of another site
  cannot reach it by pointing a name of its own at 127.0.0.1 (DNS rebinding).
* **Actions** (cancel, requeue, purge) are ``POST`` requests with a JSON body and are
  refused, in this order: on a read-only dashboard (403); without a configured token
  (403); from another origin (403: the ``Origin`` header must be this server's, and
  ``Sec-Fetch-Site``, when sent, ``same-origin``); without ``Content-Type:
  application/json`` (415); without the token in ``Authorization: Bearer …`` (401).
  A cross-site form cannot send that header or that content type, and a cross-site
  script's request is refused by the origin check before anything is done.
* Every response says ``Content-Security-Policy`` (this server's own files only, no
  framing), ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer`` and
  ``Cache-Control: no-store``.
* Passwords: the page shows the broker URL as ``AMQPURL.redacted()`` gives it.
  Backtraces only with ``show_backtraces``.  Errors of the dashboard itself are a bare
  500 (the traceback goes to the server's log, not to the page).
"""

from __future__ import annotations

import hmac
import json
import logging
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import JobInfo, QueueNotFoundError, amqp
from ._html import (
    Frame,
    cron_fragment,
    dead_controls,
    dead_fragment,
    job_fragment,
    overview_fragment,
    page,
    workers_fragment,
)
from ._state import Observer

__all__ = ["LOOPBACK_NAMES", "Settings", "create_app"]

log = logging.getLogger("ojs_anyio.dashboard")

#: Host names a dashboard listening on a loopback address answers for.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
#: The largest action body read (a requeue of many ids fits well within it).
MAX_BODY = 64 * 1024
#: At most this many job ids in one requeue.
MAX_IDS = 1000
#: Dead jobs listed on a dead-letter page.
DEAD_LISTED = 50

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


@dataclass(frozen=True, slots=True)
class Settings:
    """How the dashboard behaves (``ojs-anyio dashboard``'s options)."""

    #: Actions need ``Authorization: Bearer <token>``; None: actions are refused.
    token: str | None = None
    #: Actions are removed (and refused).
    read_only: bool = False
    #: Error backtraces are shown (job page, dead letters).
    show_backtraces: bool = False
    #: Host names (``Host`` header, without the port) this server answers for.
    allowed_hosts: frozenset[str] = field(default_factory=lambda: LOOPBACK_NAMES)
    #: The broker as the page shows it (``AMQPURL.redacted()``).
    broker: str = ""
    #: How long the job page waits for an INFO answer, per queue asked.
    info_timeout: float = 1.0

    @property
    def actions(self) -> str:
        if self.read_only:
            return "read-only"
        return "on" if self.token else "off"


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _host_name(header: str) -> str:
    """``Host`` without its port, lower case (``[::1]:8080`` gives ``::1``)."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class _Guard:
    """ASGI middleware: the Host check, and the security headers on every response."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
        if _host_name(host) not in self.allowed:
            response = Response(
                "unknown host: start the dashboard with --allow-host NAME to answer for it\n",
                status_code=421,
                media_type="text/plain",
            )
            await response(scope, receive, self._secured(send))
            return
        await self.app(scope, receive, self._secured(send))

    @staticmethod
    def _secured(send: Send) -> Send:
        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        return secured


def create_app(observer: Observer, settings: Settings, *, prefix: str = "") -> ASGIApp:
    """The dashboard as an ASGI application over ``observer``."""
    frame = Frame(settings.broker, prefix, settings.actions, observer.refresh)
    names = observer.client.names

    def queue_arg(value: Any) -> str:
        if not isinstance(value, str):
            raise _Refused(400, "queue: give the OJS queue name as a string")
        try:
            names.job_queue(value)
        except amqp.UsageError as exc:  # TopologyError: no OJS queue has that name
            raise _Refused(400, str(exc)) from None
        return value

    def respond(request: Request, title: str, section: str, live: str, extra: str = "") -> Response:
        if request.query_params.get("fragment"):
            return HTMLResponse(live)
        source = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return HTMLResponse(page(frame, title, section, live, source=source, extra=extra))

    async def overview(request: Request) -> Response:
        return respond(request, "Overview", "/", overview_fragment(observer.overview()))

    async def workers(request: Request) -> Response:
        ov = observer.overview()
        return respond(
            request,
            "Workers and running jobs",
            "/workers",
            workers_fragment(ov.workers, ov.error, frame.actions),
        )

    async def cron(request: Request) -> Response:
        ov = observer.overview()
        return respond(request, "Cron schedules", "/cron", cron_fragment(ov.schedulers, ov.error))

    async def dead(request: Request) -> Response:
        try:
            queue = queue_arg(request.path_params["queue"])
        except _Refused as exc:
            return Response(str(exc), status_code=404, media_type="text/plain")
        try:
            total, rows = await observer.dead_jobs(queue, DEAD_LISTED)
        except amqp.UsageError:
            raise
        except amqp.AMQPError as exc:
            live = f'<p class="error" role="alert">cannot read the dead letters: {_text(exc)}</p>'
        else:
            live = dead_fragment(
                queue, names.dlx_queue(queue), total, rows, frame.actions, settings.show_backtraces
            )
        return respond(request, f"Dead letters of {queue}", "", live, dead_controls(queue, frame.actions))

    async def job(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        queue = request.query_params.get("queue") or None
        error = None
        info = JobInfo(id=job_id, state="unknown")
        try:
            if queue is not None:
                queue_arg(queue)
            queue, info = await observer.info(job_id, queue, timeout=settings.info_timeout)
        except _Refused as exc:
            error = str(exc)
        except QueueNotFoundError as exc:
            error = str(exc)
        except amqp.UsageError as exc:  # InvalidJobError: not a lowercase UUIDv7
            error = str(exc)
        except amqp.AMQPError as exc:
            error = f"cannot ask the workers: {exc}"
        live = job_fragment(job_id, queue, info, frame.actions, settings.show_backtraces, error)
        return respond(request, f"Job {job_id}", "", live)

    async def find_job(request: Request) -> Response:
        job_id = (request.query_params.get("id") or "").strip()
        if not job_id:
            return RedirectResponse("/", status_code=303)
        return RedirectResponse(f"/jobs/{quote(job_id, safe='')}", status_code=303)

    async def action(request: Request) -> Response:
        try:
            body = await _authorised_body(request, settings)
            message = await _act(request.path_params["name"], body)
        except _Refused as exc:
            return JSONResponse({"ok": False, "error": str(exc)}, status_code=exc.status)
        except QueueNotFoundError as exc:
            return JSONResponse({"ok": False, "error": str(exc)}, status_code=404)
        except amqp.NotFound as exc:
            return JSONResponse({"ok": False, "error": f"not found: {exc}"}, status_code=404)
        except amqp.UsageError as exc:  # a bad job id, queue name...
            return JSONResponse({"ok": False, "error": str(exc)}, status_code=400)
        except amqp.AMQPError as exc:  # the broker refused it, or is unreachable
            return JSONResponse({"ok": False, "error": _text(exc)}, status_code=502)
        log.info("dashboard action %s: %s", request.path_params["name"], message)
        return JSONResponse({"ok": True, "message": message})

    async def _act(name: str, body: dict[str, Any]) -> str:
        if name == "cancel":
            queue = queue_arg(body.get("queue"))
            job_id = body.get("job_id")
            if not isinstance(job_id, str):
                raise _Refused(400, "job_id: give the job id as a string")
            await observer.cancel(job_id, queue)
            return f"cancel sent to the workers of {queue} for job {job_id}"
        if name == "requeue":
            queue = queue_arg(body.get("queue"))
            ids = body.get("ids")
            if ids is not None and (
                not isinstance(ids, list) or len(ids) > MAX_IDS or not all(isinstance(i, str) for i in ids)
            ):
                raise _Refused(400, f"ids: a list of at most {MAX_IDS} job ids, or null for every dead job")
            reset = body.get("reset_attempts", True)
            if not isinstance(reset, bool):
                raise _Refused(400, "reset_attempts: true or false")
            moved = await observer.requeue(queue, ids, reset_attempts=reset)
            missing = "" if ids is None or moved == len(set(ids)) else f" ({len(set(ids)) - moved} not found)"
            return f"requeued {moved} dead job(s) to {names.job_queue(queue)}{missing}"
        if name == "purge":
            queue = queue_arg(body.get("queue"))
            purged = await observer.purge(queue)
            return f"purged {purged} dead job(s) from {names.dlx_queue(queue)}"
        raise _Refused(404, f"no action {name!r}")

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        media = _STATIC.get(name)
        if media is None:
            return Response("not found\n", status_code=404, media_type="text/plain")
        data = resources.files(__package__).joinpath("static", name).read_bytes()
        return Response(data, media_type=media)

    routes = [
        Route("/", overview),
        Route("/workers", workers),
        Route("/cron", cron),
        Route("/dead/{queue}", dead),
        Route("/jobs", find_job),
        Route("/jobs/{job_id}", job),
        Route("/api/{name}", action, methods=["POST"]),
        Route("/static/{name}", static),
    ]
    return _Guard(Starlette(routes=routes), settings.allowed_hosts)


_STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}


async def _authorised_body(request: Request, settings: Settings) -> dict[str, Any]:
    """The JSON body of an action, once every check of the module docstring passed."""
    if settings.read_only:
        raise _Refused(403, "this dashboard is read-only: actions are not available")
    if not settings.token:
        raise _Refused(403, "actions are off: start the dashboard with --token (or $OJS_DASHBOARD_TOKEN)")
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    if origin is None or origin.lower() != own.lower():
        raise _Refused(403, "cross-site request refused: the Origin header is not this dashboard's")
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site != "same-origin":
        raise _Refused(403, f"cross-site request refused (Sec-Fetch-Site: {fetch_site})")
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        raise _Refused(415, "actions take a JSON body (Content-Type: application/json)")
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), settings.token.encode()):
        raise _Refused(401, "token missing or wrong: enter the action token")
    size = request.headers.get("content-length")
    if size is not None and (not size.isdigit() or int(size) > MAX_BODY):
        raise _Refused(413, f"the body is larger than {MAX_BODY} bytes")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY:
            raise _Refused(413, f"the body is larger than {MAX_BODY} bytes")
    try:
        body = json.loads(data or b"{}")
    except ValueError:
        raise _Refused(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise _Refused(400, "the body must be a JSON object")
    return body


def _text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
