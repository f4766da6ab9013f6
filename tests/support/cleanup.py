"""The queues a test created, deleted after it (the ``cleanup`` fixture of :mod:`support.fixtures`)."""

from __future__ import annotations

import anyio

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs import RETRY_LADDER_MS

from .brokers import current_url

__all__ = ["Cleanup", "ojs_queue_names"]


def ojs_queue_names(queue: str, prefix: str = "") -> list[str]:
    """Every AMQP queue an OJS queue may have: job, dead-letter, control, redelivered, death
    notes, delay landing and each retry queue of the ladder."""
    names = ojs.Names(prefix)
    return [
        names.job_queue(queue),
        names.dlx_queue(queue),
        names.control_queue(queue),
        names.redelivered_queue(queue),
        names.death_notes_queue(queue),
        names.delay_landing_queue(queue),
        *(names.retry_queue(queue, ms) for ms in RETRY_LADDER_MS),
    ]


class Cleanup:
    """Queues a test created, deleted after it (per connection URL)."""

    def __init__(self) -> None:
        self.ojs_queues: list[tuple[str, str, str]] = []  # (url, prefix, OJS queue)
        self.queues: list[tuple[str, str]] = []  # (url, AMQP queue name)

    def ojs(self, queue: str, *, prefix: str = "", url: str | None = None) -> str:
        self.ojs_queues.append((url or current_url(), prefix, queue))
        return queue

    def queue(self, name: str, *, url: str | None = None) -> str:
        self.queues.append((url or current_url(), name))
        return name

    def _names_by_url(self) -> dict[str, list[str]]:
        by_url: dict[str, list[str]] = {}
        for url, prefix, queue in self.ojs_queues:
            by_url.setdefault(url, []).extend(ojs_queue_names(queue, prefix))
        for url, name in self.queues:
            by_url.setdefault(url, []).append(name)
        return by_url

    async def run(self) -> None:
        for url, names in self._names_by_url().items():
            # Other suites restart the shared broker or close every connection now and
            # then: retry a few times rather than leak the queues.
            for attempt in range(20):
                try:
                    async with amqp.connect(url) as conn, conn.channel(confirms=False) as ch:
                        for name in names:
                            await ch.queue_delete(name)
                    break
                except (amqp.ConnectionLostError, amqp.ConnectionLevelError, amqp.ChannelClosedError):
                    if attempt == 19:
                        raise
                    await anyio.sleep(0.5)
