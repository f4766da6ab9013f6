"""``memory://``: an in-process AMQP 0-9-1 broker that behaves like RabbitMQ 3.10.

``amqp.connect("memory://")`` and ``ojs_anyio.connect("memory://")`` talk to it through
an in-process byte stream instead of TCP; the client code path is the same as with
RabbitMQ.  ``memory://NAME`` names separate brokers in one process; a vhost goes in the
path (``memory://NAME/%2Fojs``).  See docs/testing.md for what is emulated and what differs.

This package knows AMQP (ojs_codec, pamqp) and anyio only, nothing about jobs.
"""

from ._broker import MemoryBroker, MemoryStream, PublishFault, get_broker, open_stream
from ._clock import Clock, LoopClock, VirtualClock

__all__ = [
    "Clock",
    "LoopClock",
    "MemoryBroker",
    "MemoryStream",
    "PublishFault",
    "VirtualClock",
    "get_broker",
    "open_stream",
]
