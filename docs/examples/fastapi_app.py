"""FastAPI recipe: one OJS client for the app's lifetime, opened in the lifespan.

Run:  uvicorn docs.examples.fastapi_app:app --workers 2
      ojs-anyio worker docs.examples.fastapi_app:worker
(tests/jobs/test_recipes_broker.py and tests/jobs/test_fastapi_uvicorn_broker.py run it too)

``POST /signup?email=…`` answers 202 with the job id once the broker confirmed the job, and
503 with ``Retry-After`` when the broker is away: a push waits at most ``publish_timeout``
(5 s) for a recovering connection and ``confirm_timeout`` (5 s) for the confirm, so a
request never hangs, and uvicorn's graceful shutdown (SIGTERM) never waits on one for long.

``POST /reports`` (a JSON :class:`ReportRequest`) pushes a typed job whose handler takes and
returns pydantic models; ``GET /reports/{job_id}?wait=5`` answers the :class:`Report`, read
from whichever worker ran it (``build_report.result``: INFO, so any uvicorn process finds
it, not only the one that pushed), validated with the model's own rules; 202 while it is
not finished within ``wait`` seconds, 409 if it failed.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import date
from decimal import Decimal

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

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


class ReportRequest(BaseModel):
    day: date
    region: str = Field(min_length=2, max_length=16, pattern=r"^[a-z-]+$")


class Report(BaseModel):
    day: date
    region: str
    orders: int = Field(ge=0)
    total: Decimal = Field(ge=0, decimal_places=2)


# The job, typed by its handler: shared by the web app (which pushes it and reads its
# result) and the worker process (``ojs-anyio worker docs.examples.fastapi_app:worker``).
worker = ojs.Worker(queues=[QUEUE])


@worker.job("report.build", queue=QUEUE)
async def build_report(ctx: ojs.JobContext, request: ReportRequest) -> Report:
    orders = len(request.region) * request.day.day  # stands in for the real query
    return Report(
        day=request.day, region=request.region, orders=orders, total=Decimal(orders) * Decimal("9.99")
    )


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


@app.post("/reports", status_code=202)
async def request_report(request: Request, body: ReportRequest) -> JSONResponse:
    client: ojs.Client = request.app.state.ojs
    try:
        job = await build_report.push(client, body)  # the model travels as its JSON form
    except ojs.PushNotSentError:
        return _unavailable({"queued": False})
    except ojs.PushOutcomeUnknownError as exc:
        return _unavailable({"queued": "unknown", "job_id": exc.job_id})
    return JSONResponse({"job_id": job.id}, status_code=202)


@app.get("/reports/{job_id}", response_model=Report)
async def get_report(request: Request, job_id: str, wait: float = Query(5.0, gt=0, le=30)) -> object:
    client: ojs.Client = request.app.state.ojs
    try:
        # Any process: the workers of the queue answer (INFO); a Report, validated.
        return await build_report.result(client, job_id, timeout=wait)
    except ojs.UsageError:  # not a job id at all
        return JSONResponse({"error": "no such job id"}, status_code=404)
    except TimeoutError:  # not finished yet (or finished longer ago than workers keep results)
        return JSONResponse(
            {"job_id": job_id, "state": "pending"}, status_code=202, headers={"Retry-After": "1"}
        )
    except ojs.JobFailedError as exc:
        return JSONResponse({"job_id": job_id, "error": exc.code, "message": exc.message}, status_code=409)


def _unavailable(body: dict[str, object]) -> JSONResponse:
    return JSONResponse(
        {"error": "the job queue is unavailable", **body},
        status_code=503,
        headers={"Retry-After": RETRY_AFTER},
    )
