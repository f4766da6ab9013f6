"""FastAPI recipe: one OJS client for the app's lifetime, opened in the lifespan.

Run:  uvicorn docs.examples.fastapi_app:app   (tests/jobs/test_recipes_broker.py runs it too)
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request

import ojs_anyio as ojs

QUEUE = os.environ.get("OJS_EXAMPLE_QUEUE", "email")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # One connection and one confirm channel for every request; closed on shutdown.
    async with ojs.connect(os.environ.get("OJS_AMQP_URL")) as client:
        app.state.ojs = client
        yield


app = FastAPI(lifespan=lifespan)


@app.post("/signup")
async def signup(request: Request, email: str) -> dict[str, str]:
    client: ojs.Client = request.app.state.ojs
    job = await client.push("email.send", [email, "welcome"], queue=QUEUE)  # returns once confirmed
    return {"job_id": job.id}
