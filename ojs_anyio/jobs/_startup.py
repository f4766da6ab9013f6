"""A worker's start-up through connection cuts: one rule for every start-up step.

A worker starts with one call after another on a connection that may drop at any moment
(a process restarted while the network blips): declaring its queues, opening the control
plane's channels, declaring and binding its broadcast queue, registering each queue's
consumers.  The AMQP layer fails a call in flight at the drop with
:class:`~ojs_anyio.amqp.ConnectionLostError` (it may or may not have happened), and a
channel whose opening was cut is spent.  So each step runs through :func:`through_cuts`:
a step lost to a cut is run again from its start (a new channel; declarations are
idempotent), and the calls of the new run wait for the recovery.  At most
:data:`STARTUP_ATTEMPTS` runs, and never past a failed recovery
(:class:`~ojs_anyio.amqp.RecoveryFailedError`) or a step that got going: once a step has
started (its consumers are registered), recovery carries it, and what it raises is not a
start-up failure.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from .. import amqp

__all__ = ["STARTUP_ATTEMPTS", "through_cuts"]

log = logging.getLogger("ojs_anyio.worker")

#: Runs of one start-up step through connection cuts (the first and the runs again).
STARTUP_ATTEMPTS = 5


async def through_cuts(
    step: Callable[[], Awaitable[None]], started: Callable[[], bool], what: str, worker_id: str
) -> None:
    """Run ``step()``; again (up to :data:`STARTUP_ATTEMPTS` runs in all) when the connection
    was lost before ``started()`` turned true.  ``what`` names the step in the warning."""
    for attempt in range(1, STARTUP_ATTEMPTS + 1):
        try:
            await step()
            return
        except (amqp.ConnectionLostError, BaseExceptionGroup) as exc:
            lost = _lost_to_a_cut(exc)
            if lost is None or started() or attempt == STARTUP_ATTEMPTS:
                raise
            log.warning(
                "worker %s: the connection was lost while %s (%s); again once it is back",
                worker_id, what, lost,
            )  # fmt: skip


def _lost_to_a_cut(exc: BaseException) -> amqp.ConnectionLostError | None:
    """The connection loss ``exc`` is, or that every error of the group ``exc`` is (the
    step's task group wraps it on Trio); None for anything else, a failed recovery, or a
    group holding a cancellation."""
    pending = [exc]
    lost: amqp.ConnectionLostError | None = None
    while pending:
        error = pending.pop()
        if isinstance(error, BaseExceptionGroup):
            pending.extend(error.exceptions)
        elif isinstance(error, amqp.ConnectionLostError) and not isinstance(error, amqp.RecoveryFailedError):
            lost = lost or error
        else:
            return None
    return lost
