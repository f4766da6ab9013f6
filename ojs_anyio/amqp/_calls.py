"""A channel's synchronous methods: one AMQP call at a time, and waiting until ready.

:class:`Calls` is the part of a :class:`~._channel.Channel` that sends a method and waits
for its reply (``call``), and that waits while the connection recovers (``ready``).  It
shares the channel's :class:`~._channel_state.ChannelState` with the other parts and sees
the connection only through the :class:`~._link.ChannelLink` verbs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ojs_codec import MethodReply

from ._channel_state import ChannelState
from ._errors import ChannelClosedError

if TYPE_CHECKING:
    from ._link import ChannelLink

__all__ = ["Calls"]


class Calls:
    """One synchronous AMQP method at a time on one channel (see the module docstring)."""

    __slots__ = ("link", "state")

    def __init__(self, state: ChannelState, link: ChannelLink) -> None:
        self.state = state
        self.link = link

    # -------------------------------------------------- events from the reader

    def on_reply(self, ev: object) -> None:
        waiter = self.state.take_waiter()
        if waiter is not None:
            waiter.complete(ev.method if type(ev) is MethodReply else ev)

    # ----------------------------------------------------------- plumbing

    def closed_exc(self) -> ChannelClosedError:
        error = self.state.closed_error
        exc = ChannelClosedError(f"channel is closed: {error}")
        exc.__cause__ = error
        exc.__suppress_context__ = True
        return exc

    async def ready(self, timeout: float | None = None) -> None:
        """Wait while the connection recovers, up to ``timeout`` (default: the connection's
        ``publish_timeout``), then raise :class:`OperationTimeoutError`."""
        state = self.state
        if state.closed:
            raise self.closed_exc()
        if state.close_waiter is not None:
            raise ChannelClosedError("channel is closing")
        if state.cid == 0 or not self.link.is_connected:
            await self.link.wait_ready(timeout if timeout is not None else self.link.publish_timeout)
            if state.closed:
                raise self.closed_exc()

    async def call(self, method: Any, *, internal: bool = False) -> Any:
        """Send a synchronous method and wait for its reply (``None``: Channel.Open)."""
        if not internal:
            await self.ready()
        state = self.state
        link = self.link
        while state.waiter is not None:
            # An earlier call (maybe cancelled) still waits for its reply; AMQP allows one.
            await state.waiter.event.wait()
            if state.closed:
                raise self.closed_exc()
        if state.close_waiter is not None:
            raise ChannelClosedError("channel is closing")
        waiter = state.begin_call()
        try:
            if method is not None:
                expects = link.send_method(state.cid, method)
                if not expects:
                    state.drop_waiter(waiter)
                    await link.flush()
                    return None
            await link.flush()
        except BaseException:
            state.drop_waiter(waiter)
            raise
        await waiter.event.wait()
        if waiter.error is not None:
            raise waiter.error
        return waiter.result
