"""The core of a channel: its state, and one synchronous AMQP method at a time.

A :class:`~._channel.Channel` is built in layers, one file per concern, each adding to
the one below: this core (state, ``_call``), publishing and confirms (``_publish.py``),
consuming and settling (``_consume.py``), then opening, closing, loss and recovery
(``_recovery.py``).  ``_channel.py`` adds the AMQP model methods on top.  A channel sees
its connection only through :class:`~._interfaces.ChannelLink`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ojs_codec import ChannelLevelError, MethodReply

from ._channel_state import ChannelState, Waiter
from ._errors import ChannelClosedError

if TYPE_CHECKING:
    from ._link import ChannelLink

__all__ = ["ChannelCore"]


class ChannelCore:
    """State shared by every layer of a channel, and the synchronous-method call."""

    def __init__(self, link: ChannelLink, *, confirms: bool = True, prefetch: int | None = None) -> None:
        self._link = link
        self.confirms = confirms
        self.prefetch = prefetch
        #: Set by tx_select; recovery selects tx again on the new channel.
        self.transactional = False
        #: The opening a transaction belongs to (ChannelState.openings when tx_select ran).
        self._tx_opening = 0
        #: Wire id, generation, waiters, closed: changed only through its transitions.
        self._state = ChannelState()

    def __repr__(self) -> str:
        return f"<Channel id={self._state.cid} {'closed' if self._state.closed else 'open'}>"

    @property
    def channel_id(self) -> int:
        return self._state.cid

    @property
    def is_open(self) -> bool:
        return not self._state.closed and self._state.cid != 0

    @property
    def is_closed(self) -> bool:
        """Closed for good (``aclose()``, the broker closed it, or the connection is gone
        for good).  A channel that waits for recovery is not closed, just not open."""
        return self._state.closed

    @property
    def closed_error(self) -> BaseException | None:
        return self._state.closed_error

    @property
    def _waiter(self) -> Waiter | None:
        """The synchronous call in flight (for tests and debugging)."""
        return self._state.waiter

    @property
    def _close_waiter(self) -> Waiter | None:
        """Set while aclose() waits for Close-Ok (for tests and debugging)."""
        return self._state.close_waiter

    # -------------------------------------------------- events from the reader

    def _on_reply(self, ev: object) -> None:
        waiter = self._state.take_waiter()
        if waiter is not None:
            waiter.complete(ev.method if type(ev) is MethodReply else ev)

    # ----------------------------------------------------------- plumbing

    def _closed_exc(self) -> ChannelClosedError:
        error = self._state.closed_error
        exc = ChannelClosedError(f"channel is closed: {error}")
        exc.__cause__ = error
        exc.__suppress_context__ = True
        return exc

    async def _ready(self, timeout: float | None = None) -> None:
        """Wait while the connection recovers, up to ``timeout`` (default: the connection's
        ``publish_timeout``), then raise :class:`OperationTimeoutError`."""
        if self._state.closed:
            raise self._closed_exc()
        if self._state.close_waiter is not None:
            raise ChannelClosedError("channel is closing")
        if self._state.cid == 0 or not self._link.is_connected:
            await self._link.wait_ready(timeout if timeout is not None else self._link.publish_timeout)
            if self._state.closed:
                raise self._closed_exc()

    async def _call(self, method: Any, *, internal: bool = False) -> Any:
        """Send a synchronous method and wait for its reply (``None``: Channel.Open)."""
        if not internal:
            await self._ready()
        link = self._link
        while self._state.waiter is not None:
            # An earlier call (maybe cancelled) still waits for its reply; AMQP allows one.
            await self._state.waiter.event.wait()
            if self._state.closed:
                raise self._closed_exc()
        if self._state.close_waiter is not None:
            raise ChannelClosedError("channel is closing")
        waiter = Waiter()
        self._state.waiter = waiter
        try:
            if method is not None:
                expects = link.send_method(self._state.cid, method)
                if not expects:
                    self._state.waiter = None
                    await link.flush()
                    return None
            await link.flush()
        except BaseException:
            if self._state.waiter is waiter:
                self._state.waiter = None
            raise
        await waiter.event.wait()
        if waiter.error is not None:
            err = waiter.error
            if isinstance(err, ChannelLevelError):
                raise err
            raise err
        return waiter.result
