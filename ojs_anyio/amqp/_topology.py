"""What the application declared, so recovery can declare it again, in the same order.

Declarations are recorded after the broker confirmed them, keyed by identity, in
insertion order: an exchange is always recorded before a binding that uses it, so
replaying in order respects dependencies (exchange-to-exchange bindings included).
Deleting an entity forgets it and the bindings that referenced it.  Server-named
queues get a new name on each replay; :meth:`TopologyRecorder.current_name` maps an old
name to the current one and the user's :class:`QueueInfo` is updated in place.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pamqp import commands

from codec import AMQPError, ChannelLevelError

from ._events import TopologyRecoveryFailed

if TYPE_CHECKING:
    from ._channel import QueueInfo
    from ._connection import Connection

__all__ = ["TopologyRecorder"]

log = logging.getLogger("ojs_anyio.amqp")


class TopologyRecorder:
    def __init__(self) -> None:
        self._records: dict[tuple[Any, ...], Any] = {}
        self._server_named: dict[tuple[Any, ...], QueueInfo] = {}
        self._renamed: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._records)

    def record(self, key: tuple[Any, ...], method: Any) -> None:
        self._records[key] = method

    def forget(self, key: tuple[Any, ...]) -> None:
        self._records.pop(key, None)

    def record_queue(self, info: QueueInfo, method: Any) -> None:
        key = ("queue", info.name)
        self._records[key] = method
        if not method.queue:
            self._server_named[key] = info

    def forget_queue(self, name: str) -> None:
        for key in [k for k in self._records if (k[0] == "queue" and k[1] == name) or (k[0] == "bind" and k[1] == name)]:
            del self._records[key]
            self._server_named.pop(key, None)

    def forget_exchange(self, name: str) -> None:
        for key in [
            k
            for k in self._records
            if (k[0] == "exchange" and k[1] == name)
            or (k[0] == "bind" and k[2] == name)
            or (k[0] == "e2e" and name in (k[1], k[2]))
        ]:
            del self._records[key]

    def current_name(self, name: str) -> str:
        seen = set()
        while name in self._renamed and name not in seen:
            seen.add(name)
            name = self._renamed[name]
        return name

    async def replay(self, conn: Connection) -> None:
        """Declare everything again on a private channel.  A channel-level failure (404/406)
        is reported as an event and the replay continues on a fresh channel."""
        if not self._records:
            return
        from ._channel import Channel

        ch = Channel(conn, confirms=False)
        ch._internal = True
        await ch._open_on_wire(internal=True)
        try:
            for key, method in list(self._records.items()):
                method = self._rewrite(method)
                try:
                    reply = await ch._call(method, internal=True)
                except ChannelLevelError as exc:
                    log.error("recovery: re-declaring %s failed: %s", _describe(key), exc)
                    conn._events.emit(TopologyRecoveryFailed(what=_describe(key), error=exc))
                    ch = Channel(conn, confirms=False)
                    ch._internal = True
                    await ch._open_on_wire(internal=True)
                    continue
                if key in self._server_named and reply is not None:
                    info = self._server_named.pop(key)
                    old = info.name
                    info.name = reply.queue
                    self._renamed[old] = reply.queue
                    del self._records[key]
                    new_key = ("queue", reply.queue)
                    self._records[new_key] = method
                    self._server_named[new_key] = info
        finally:
            if ch._cid and not ch._closed:
                try:
                    conn._proto.close_channel(ch._cid)
                    await conn._flush()
                except AMQPError:
                    pass  # transport died; the supervisor handles it

    def _rewrite(self, method: Any) -> Any:
        if isinstance(method, commands.Queue.Bind) and method.queue in self._renamed:
            return commands.Queue.Bind(
                queue=self.current_name(method.queue),
                exchange=method.exchange,
                routing_key=method.routing_key,
                arguments=method.arguments,
            )
        return method


def _describe(key: tuple[Any, ...]) -> str:
    kind = key[0]
    if kind == "exchange":
        return f"exchange {key[1]!r}"
    if kind == "queue":
        return f"queue {key[1]!r}"
    if kind == "bind":
        return f"binding of queue {key[1]!r} to exchange {key[2]!r} ({key[3]!r})"
    return f"binding of exchange {key[1]!r} to exchange {key[2]!r} ({key[3]!r})"
