"""What the application declared, so recovery can declare it again, in the same order.

Declarations are recorded after the broker confirmed them, keyed by identity, in
insertion order: an exchange is always recorded before a binding that uses it, so
replaying in order respects dependencies (exchange-to-exchange bindings included).
Deleting an entity forgets it and the bindings that referenced it; so does cancelling
the last consumer of an auto-delete queue (the broker deletes it then).  Server-named
queues get a new name on each replay: the records and the user's :class:`QueueInfo`
are updated in place, and :meth:`TopologyRecorder.current_name` maps an old name to the
current one.

This module is a leaf: pure data plus :meth:`TopologyRecorder.replay`, which takes the
function that sends one declaration (the recovery code passes one that uses a private
"scratch" channel, see ``_recovery.py``).  A declaration the broker refuses (for example
406 because someone re-created a queue with other arguments while we were away) fails
only that call: the failure is reported as a :class:`TopologyRecoveryFailed` event,
remembered for :meth:`TopologyRecorder.failure` (so consumers of that queue get the typed
error), and the replay goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pamqp import commands

from ojs_codec import ChannelLevelError

from ._events import RecoveryEvent, TopologyRecoveryFailed

__all__ = ["QueueInfo", "TopologyRecorder"]

log = logging.getLogger("ojs_anyio.amqp")


class QueueInfo:
    """Result of ``queue_declare``.  For a server-named queue, ``name`` follows the queue
    across reconnections (the broker gives it a new name each time)."""

    __slots__ = ("consumer_count", "message_count", "name")

    def __init__(self, name: str, message_count: int, consumer_count: int) -> None:
        self.name = name
        self.message_count = message_count
        self.consumer_count = consumer_count

    def __repr__(self) -> str:
        return (
            f"QueueInfo(name={self.name!r}, message_count={self.message_count}, "
            f"consumer_count={self.consumer_count})"
        )


class TopologyRecorder:
    def __init__(self) -> None:
        self._records: dict[tuple[Any, ...], Any] = {}
        self._server_named: dict[tuple[Any, ...], QueueInfo] = {}
        self._renamed: dict[str, str] = {}
        #: Queue name -> why re-declaring it failed during the last replay.
        self._failed_queues: dict[str, ChannelLevelError] = {}

    def __len__(self) -> int:
        return len(self._records)

    def record(self, key: tuple[Any, ...], method: Any) -> None:
        self._records[key] = method

    def forget(self, key: tuple[Any, ...]) -> None:
        self._records.pop(key, None)

    def record_queue(self, info: QueueInfo, method: Any) -> None:
        key = ("queue", info.name)
        self._records[key] = method
        self._failed_queues.pop(info.name, None)
        if not method.queue:
            self._server_named[key] = info

    def forget_queue(self, name: str) -> None:
        name = self.current_name(name)
        for key in [k for k in self._records if k[0] in ("queue", "bind") and k[1] == name]:
            del self._records[key]
            self._server_named.pop(key, None)
        self._failed_queues.pop(name, None)

    def forget_exchange(self, name: str) -> None:
        for key in [
            k
            for k in self._records
            if (k[0] == "exchange" and k[1] == name)
            or (k[0] == "bind" and k[2] == name)
            or (k[0] == "e2e" and name in (k[1], k[2]))
        ]:
            del self._records[key]

    def consumer_gone(self, queue: str, still_consumed: Callable[[str], bool]) -> None:
        """The application cancelled a consumer of ``queue``: if that was the last one on
        this connection (``still_consumed(queue)`` is false) and the queue is auto-delete,
        the broker deletes it, so forget it (replaying it would leave an auto-delete queue
        that nobody ever consumes)."""
        queue = self.current_name(queue)
        method = self._records.get(("queue", queue))
        if method is None or not method.auto_delete:
            return
        if still_consumed(queue):
            return
        self.forget_queue(queue)

    def current_name(self, name: str) -> str:
        seen = set()
        while name in self._renamed and name not in seen:
            seen.add(name)
            name = self._renamed[name]
        return name

    def failure(self, queue: str) -> ChannelLevelError | None:
        """Why re-declaring ``queue`` failed in the last replay (None: it didn't)."""
        return self._failed_queues.get(queue)

    async def replay(
        self, call: Callable[[Any], Awaitable[Any]], emit: Callable[[RecoveryEvent], None]
    ) -> None:
        """Declare everything again, in recorded order, with ``call(method) -> reply``.  A
        channel-level failure (404/405/406) is reported through ``emit`` and the replay
        goes on.  ``call`` is not called at all when nothing was recorded."""
        self._failed_queues.clear()
        for key, method in list(self._records.items()):
            method = self._rewrite(method)
            try:
                reply = await call(method)
            except ChannelLevelError as exc:
                what = _describe(key, method)
                log.error("recovery: re-declaring %s failed: %s", what, exc)
                if key[0] == "queue":
                    self._failed_queues[key[1]] = exc
                emit(TopologyRecoveryFailed(what=what, error=exc))
                continue
            if key in self._server_named and reply is not None and reply.queue != key[1]:
                self._rename(key[1], reply.queue)

    def _rename(self, old: str, new: str) -> None:
        """A server-named queue came back as ``new``: update its QueueInfo, its record and
        its bindings' records, keeping their places in the replay order."""
        self._renamed[old] = new
        for source, target in list(self._renamed.items()):
            if target == old:
                self._renamed[source] = new  # keep chains one step long
        records: dict[tuple[Any, ...], Any] = {}
        for key, method in self._records.items():
            if key[0] in ("queue", "bind") and key[1] == old:
                new_key = (key[0], new, *key[2:])
                if key[0] == "bind":
                    method = self._rewrite(method)
                else:
                    info = self._server_named.pop(key)
                    info.name = new
                    self._server_named[new_key] = info
                records[new_key] = method
            else:
                records[key] = method
        self._records = records

    def _rewrite(self, method: Any) -> Any:
        if isinstance(method, commands.Queue.Bind) and method.queue in self._renamed:
            return commands.Queue.Bind(
                queue=self.current_name(method.queue),
                exchange=method.exchange,
                routing_key=method.routing_key,
                arguments=method.arguments,
            )
        return method


def _describe(key: tuple[Any, ...], method: Any) -> str:
    kind = key[0]
    if kind == "exchange":
        return f"exchange {key[1]!r}"
    if kind == "queue":
        return f"queue {method.queue or key[1]!r}"
    if kind == "bind":
        return f"binding of queue {method.queue!r} to exchange {key[2]!r} ({key[3]!r})"
    return f"binding of exchange {key[1]!r} to exchange {key[2]!r} ({key[3]!r})"
