"""Publisher confirms, tracked without I/O: which publish each confirm resolves, and how.

The channel hands every confirmed publish to :meth:`ConfirmTracker.track`; when the reader
brings a Basic.Ack / Basic.Nack, :meth:`ConfirmTracker.confirmed` returns the handles it
resolves and the outcome of each (``True``, or the error to raise), in the way h2's streams
return frames for their connection to send: the channel then resolves them.  The tracker
never wakes a task, bumps a metric or touches the connection.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ojs_codec import Confirmed

from ._errors import PublishNackedError, PublishOutcomeUnknownError, UnroutableError

if TYPE_CHECKING:
    from ._publish import PublishHandle

__all__ = ["ConfirmTracker", "Outcome"]

#: A publish handle and what it resolves to: ``True`` (acked), or the error its wait raises.
Outcome = tuple["PublishHandle", "BaseException | bool"]


class ConfirmTracker:
    """The publishes of one channel that wait for their confirm, by publish tag."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: dict[int, PublishHandle] = {}

    def __len__(self) -> int:
        return len(self.pending)

    def track(self, tag: int, handle: PublishHandle) -> None:
        self.pending[tag] = handle

    def forget(self, tag: int) -> None:
        """Stop tracking ``tag`` (its publish failed before it was sent)."""
        self.pending.pop(tag, None)

    def oldest(self, tags: list[int]) -> PublishHandle | None:
        """The handle of the first of ``tags`` still pending (for latency sampling)."""
        return self.pending.get(tags[0]) if tags else None

    def confirmed(self, ev: Confirmed) -> tuple[list[PublishHandle], list[Outcome]]:
        """What a Basic.Ack / Basic.Nack resolves: the handles acked (they resolve to
        ``True``), and the others with the error each raises."""
        pending = self.pending
        acked: list[PublishHandle] = []
        failed: list[Outcome] = []
        returned = ev.returned
        for tag in ev.tags:
            handle = pending.pop(tag, None)
            if handle is None:
                continue  # given up on earlier (timeout): the late confirm is ignored
            if not ev.ack:
                failed.append(
                    (
                        handle,
                        PublishNackedError(
                            f"broker rejected the message to {handle.exchange!r}/{handle.routing_key!r} "
                            "(basic.nack: for example, the queue is full with x-overflow=reject-publish)",
                            exchange=handle.exchange,
                            routing_key=handle.routing_key,
                        ),
                    )
                )
            elif returned is not None and tag in returned:
                r = returned[tag]
                failed.append(
                    (
                        handle,
                        UnroutableError(
                            f"message to exchange {r.exchange!r} with routing key {r.routing_key!r} "
                            f"was returned: {r.reply_code} {r.reply_text}",
                            reply_code=r.reply_code,
                            reply_text=r.reply_text,
                            exchange=r.exchange,
                            routing_key=r.routing_key,
                            properties=r.properties,
                        ),
                    )
                )
            else:
                acked.append(handle)
        return acked, failed

    def fail_all(self, error: BaseException) -> list[Outcome]:
        """Every pending publish fails "outcome unknown" (the channel or connection died)."""
        pending, self.pending = self.pending, {}
        out: list[Outcome] = []
        for handle in pending.values():
            exc = PublishOutcomeUnknownError(
                f"publish to {handle.exchange!r}/{handle.routing_key!r} has no confirm: {error}"
            )
            exc.__cause__ = error
            out.append((handle, exc))
        return out

    def give_up(self, handles: Iterable[PublishHandle], timeout: float) -> list[Outcome]:
        """Stop waiting for these handles' confirms: each fails "outcome unknown" (the
        message was sent; the broker may still route it).  A confirm that comes later finds
        no pending handle and is ignored."""
        out: list[Outcome] = []
        for handle in handles:
            if self.pending.get(handle.tag) is handle:
                del self.pending[handle.tag]
            out.append((handle, _not_confirmed(handle, timeout)))
        return out

    def overdue(self, now: float) -> tuple[list[Outcome], float | None]:
        """Give up (as :meth:`give_up`) on the pending publishes whose ``confirm_by`` is
        ``now`` or earlier; also the earliest ``confirm_by`` still pending (None: none)."""
        late: list[PublishHandle] = []
        earliest: float | None = None
        for handle in self.pending.values():
            at = handle.confirm_by
            if not at:
                continue  # no deadline (a window's publish, or no confirm_timeout)
            if at <= now:
                late.append(handle)
            elif earliest is None or at < earliest:
                earliest = at
        out: list[Outcome] = []
        for handle in late:
            del self.pending[handle.tag]
            out.append((handle, _not_confirmed(handle, handle.confirm_timeout)))
        return out, earliest


def _not_confirmed(handle: PublishHandle, timeout: float) -> PublishOutcomeUnknownError:
    return PublishOutcomeUnknownError(
        f"publish to {handle.exchange!r}/{handle.routing_key!r} sent, but not confirmed within {timeout:.3g}s"
    )
