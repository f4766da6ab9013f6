"""Django recipe: a blocking producer shared by every request thread.

A single-file Django project (settings, one URL, one view) so the recipe runs as it is;
in a real project the ``get_client()`` part lives in your app's module and ``close_client``
is wired to process shutdown the same way.

``SyncClient`` keeps one connection in a background event loop and is safe to call from
every request thread; ``push`` returns once the broker confirmed the job.  The view answers
202 with the job id, or 503 with ``Retry-After`` when the broker is away: a push waits at
most ``publish_timeout`` (5 s) for a recovering connection and ``confirm_timeout`` (5 s)
for the confirm, and connecting at most ``connection_timeout`` (10 s), so a request thread
never hangs.
"""

from __future__ import annotations

import atexit
import os
import threading

import django
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.urls import path

import ojs_anyio as ojs

QUEUE = os.environ.get("OJS_EXAMPLE_QUEUE", "email")
#: Seconds a client should wait before trying again when the broker is away.
RETRY_AFTER = "10"

_client: ojs.SyncClient | None = None
_client_lock = threading.Lock()


def get_client() -> ojs.SyncClient:
    """The process's producer, connected on first use."""
    global _client
    with _client_lock:
        if _client is None or _client.closed:
            _client = ojs.SyncClient(os.environ.get("OJS_AMQP_URL"))
        return _client


def close_client() -> None:
    with _client_lock:
        if _client is not None:
            _client.close()


atexit.register(close_client)


def signup(request: HttpRequest) -> JsonResponse:
    email = request.POST["email"]
    try:
        job = get_client().push("email.send", [email, "welcome"], queue=QUEUE)
    except (ojs.PushNotSentError, ojs.amqp.ConnectionLostError):
        # Certainly not queued (not sent, or no connection could be made to send it): the
        # caller may simply try again later.
        return _unavailable({"queued": False})
    except ojs.PushOutcomeUnknownError as exc:
        # Sent, but not confirmed: it may run.  Trying again may send a second email.
        return _unavailable({"queued": "unknown", "job_id": exc.job_id})
    return JsonResponse({"job_id": job.id}, status=202)


def _unavailable(body: dict[str, object]) -> JsonResponse:
    response = JsonResponse({"error": "the job queue is unavailable", **body}, status=503)
    response["Retry-After"] = RETRY_AFTER
    return response


urlpatterns = [path("signup", signup)]

if not settings.configured:
    settings.configure(
        DEBUG=False,
        ROOT_URLCONF=__name__,
        ALLOWED_HOSTS=["*"],
        SECRET_KEY="example-only",
        MIDDLEWARE=[],
        INSTALLED_APPS=[],
    )
    django.setup()
