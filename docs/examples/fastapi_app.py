"""FastAPI recipe: one OJS client for the app's lifetime, opened in the lifespan.

Run:  uvicorn docs.examples.fastapi_app:app   (tests/jobs/test_recipes_broker.py runs it too)

``POST /signup?email=…`` answers 202 with the job id once the broker confirmed the job, and
503 with ``Retry-After`` when the broker is away: a push waits at most ``publish_timeout``
(5 s) for a recovering connection and ``confirm_timeout`` (5 s) for the confirm, so a
request never hangs, and uvicorn's graceful shutdown (SIGTERM) never waits on one for long.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

import ojs_anyio as ojs

QUEUE = os.environ.get("OJS_EXAMPLE_QUEUE", "email")
#: Seconds a client should wait before trying again when the broker is away.
RETRY_AFTER = "10"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # One connection and one confirm channel for every request; closed on shutdown.
    async with ojs.connect(os.environ.get("OJS_AMQP_URL")) as client:
        app.state.ojs = client
        yield


app = FastAPI(lifespan=lifespan)


@app.post("/signup", status_code=202)
async def signup(request: Request, email: str) -> JSONResponse:
    client: ojs.Client = request.app.state.ojs
    try:
        job = await client.push("email.send", [email, "welcome"], queue=QUEUE)  # returns once confirmed
    except ojs.PushNotSentError:
        # Certainly not queued: the caller may simply try again later.
        return _unavailable({"queued": False})
    except ojs.PushOutcomeUnknownError as exc:
        # Sent, but not confirmed: it may run.  Trying again may send a second email.
        return _unavailable({"queued": "unknown", "job_id": exc.job_id})
    return JSONResponse({"job_id": job.id}, status_code=202)


def _unavailable(body: dict[str, object]) -> JSONResponse:
    return JSONResponse(
        {"error": "the job queue is unavailable", **body},
        status_code=503,
        headers={"Retry-After": RETRY_AFTER},
    )
