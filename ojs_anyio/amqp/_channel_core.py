"""The core of a channel: its state, and one synchronous AMQP method at a time.

A :class:`~._channel.Channel` is built in layers, one file per concern, each adding to
the one below: this core (state, ``_call``), publishing and confirms (``_publish.py``),
consuming and settling (``_consume.py``), then opening, closing, loss and recovery
(``_recovery.py``).  ``_channel.py`` adds the AMQP model methods on top.  A channel sees
its connection only through :class:`~._interfaces.ChannelLink`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from ojs_codec import ChannelLevelError, ChannelOpened, GetOk, MethodReply

from ._errors import ChannelClosedError

if TYPE_CHECKING:
    from ._link import ChannelLink

__all__ = ["ChannelCore"]


class _Waiter:
    __slots__ = ("error", "event", "result")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class ChannelCore:
    """State shared by every layer of a channel, and the synchronous-method call."""

    def __init__(self, link: ChannelLink, *, confirms: bool = True, prefetch: int | None = None) -> None:
        self._link = link
        self.confirms = confirms
        self.prefetch = prefetch
        #: Set by tx_select; recovery selects tx again on the new channel.
        self.transactional = False
        #: Times the channel was opened on a transport; a transaction belongs to one.
        self._openings = 0
        self._tx_opening = 0
        self._cid = 0
        self._generation = 0
        self._opened_once = False
        self._closed = False
        self._closed_error: BaseException | None = None
        self._waiter: _Waiter | None = None
        self._internal = False
        #: While recovery re-opens it, a broker close only resets it (see _on_closed).
        self._recovering = False
        #: Set while aclose() waits for Close-Ok (and the waiter it waits on).
        self._close_waiter: _Waiter | None = None

    def __repr__(self) -> str:
        return f"<Channel id={self._cid} {'closed' if self._closed else 'open'}>"

    @property
    def channel_id(self) -> int:
        return self._cid

    @property
    def is_open(self) -> bool:
        return not self._closed and self._cid != 0

    @property
    def is_closed(self) -> bool:
        """Closed for good (``aclose()``, the broker closed it, or the connection is gone
        for good).  A channel that waits for recovery is not closed, just not open."""
        return self._closed

    @property
    def closed_error(self) -> BaseException | None:
        return self._closed_error

    # -------------------------------------------------- events from the reader

    def _on_reply(self, ev: object) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is None:
            return
        if type(ev) is GetOk:
            waiter.result = ev
        elif type(ev) is MethodReply:
            waiter.result = ev.method
        elif type(ev) is ChannelOpened:
            waiter.result = ev
        waiter.event.set()

    # ----------------------------------------------------------- plumbing

    async def _ready(self, timeout: float | None = None) -> None:
        """Wait while the connection recovers, up to ``timeout`` (default: the connection's
        ``publish_timeout``), then raise :class:`OperationTimeoutError`."""
        if self._closed:
            raise ChannelClosedError(f"channel is closed: {self._closed_error}") from self._closed_error
        if self._close_waiter is not None:
            raise ChannelClosedError("channel is closing")
        if self._cid == 0 or not self._link.is_connected:
            await self._link.wait_ready(timeout if timeout is not None else self._link.publish_timeout)
            if self._closed:
                raise ChannelClosedError(f"channel is closed: {self._closed_error}") from self._closed_error

    async def _call(self, method: Any, *, internal: bool = False) -> Any:
        """Send a synchronous method and wait for its reply (``None``: Channel.Open)."""
        if not internal:
            await self._ready()
        link = self._link
        while self._waiter is not None:
            # An earlier call (maybe cancelled) still waits for its reply; AMQP allows one.
            await self._waiter.event.wait()
            if self._closed:
                raise ChannelClosedError(f"channel is closed: {self._closed_error}") from self._closed_error
        if self._close_waiter is not None:
            raise ChannelClosedError("channel is closing")
        waiter = _Waiter()
        self._waiter = waiter
        try:
            if method is not None:
                expects = link.send_method(self._cid, method)
                if not expects:
                    self._waiter = None
                    await link.flush()
                    return None
            await link.flush()
        except BaseException:
            if self._waiter is waiter:
                self._waiter = None
            raise
        await waiter.event.wait()
        if waiter.error is not None:
            err = waiter.error
            if isinstance(err, ChannelLevelError):
                raise err
            raise err
        return waiter.result
