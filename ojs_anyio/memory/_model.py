"""The broker's state and RabbitMQ 3.10's rules: vhosts, exchanges, bindings, queues, routing,
expiry, length limits, priorities, dead-lettering.  No I/O, no tasks: every operation is a
synchronous step, driven by the connections' frames (``_session.py``) and by the clock.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import secrets
import struct
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from ojs_codec import (
    BasicProperties,
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    encode_properties,
    encode_table,
)

from ._clock import Clock

if TYPE_CHECKING:
    from ._session import ChannelState

__all__ = ["AMQPFail", "Exchange", "Message", "Queue", "State", "VHost"]

log = logging.getLogger("ojs_anyio.memory")

# reply codes
CONNECTION_FORCED = 320
NO_ROUTE = 312
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

_CONNECTION_CODES = frozenset({CONNECTION_FORCED, 402, 501, 502, 503, 504, 505, 506, 530, 540, 541})
_CONTENT_HEAD = struct.Struct(">HHQ")
EXCHANGE_TYPES = frozenset({"direct", "fanout", "topic", "headers"})
#: The largest x-message-ttl / expiration RabbitMQ accepts (2**32 - 1 ms).
MAX_TTL_MS = 2**32 - 1


@dataclass(eq=False, kw_only=True)
class PublishFault:
    """A broker fault injected into the publishes that match (see ``MemoryBroker.fail_publishes``)."""

    action: Literal["nack", "close"]
    vhost: str = "/"
    exchange: str | None = None
    routing_key: str | None = None
    #: How many publishes it hits before it is removed (``None``: until removed).
    times: int | None = 1
    #: Publishes it has hit so far.
    hits: int = 0

    def matches(self, vhost: str, exchange: str, routing_key: str) -> bool:
        return (
            vhost == self.vhost
            and (self.exchange is None or exchange == self.exchange)
            and (self.routing_key is None or routing_key == self.routing_key)
        )


class AMQPFail(Exception):
    """A channel or connection exception to send, as RabbitMQ would for the same mistake."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text

    @property
    def connection_level(self) -> bool:
        return self.code in _CONNECTION_CODES


def _q(name: str, vhost: str) -> str:
    return f"queue '{name}' in vhost '{vhost}'"


def _x(name: str, vhost: str) -> str:
    return f"exchange '{name}' in vhost '{vhost}'"


class Message:
    """One message copy in one queue (copies share body and header bytes)."""

    __slots__ = (
        "body",
        "delivery_count",
        "exchange",
        "expires_at",
        "header",
        "priority",
        "props",
        "redelivered",
        "routing_key",
        "seq",
    )

    def __init__(
        self,
        body: bytes,
        header: bytes,
        props: BasicProperties,
        exchange: str,
        routing_key: str,
    ) -> None:
        self.body = body
        self.header = header  # the content header frame payload, sent back as it came
        self.props = props
        self.exchange = exchange
        self.routing_key = routing_key
        self.expires_at: float | None = None
        self.priority = 0
        self.redelivered = False
        self.delivery_count = 0
        self.seq = 0

    def copy(self) -> Message:
        m = Message(self.body, self.header, self.props, self.exchange, self.routing_key)
        return m

    def with_props(self, props: BasicProperties) -> Message:
        header = bytearray(_CONTENT_HEAD.pack(60, 0, len(self.body)))
        header += encode_properties(props)
        return Message(self.body, bytes(header), props, self.exchange, self.routing_key)


def _args_key(arguments: dict[str, Any] | None) -> bytes:
    return encode_table(arguments or {})


class Exchange:
    __slots__ = ("alternate", "arguments", "auto_delete", "bindings", "durable", "internal", "kind", "name")

    def __init__(
        self,
        name: str,
        kind: str,
        *,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.kind = kind
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = dict(arguments or {})
        alt = self.arguments.get("alternate-exchange")
        self.alternate: str | None = alt if isinstance(alt, str) and alt else None
        #: (is_queue, destination, key, arguments-bytes) -> arguments
        self.bindings: dict[tuple[bool, str, str, bytes], dict[str, Any]] = {}

    def matches(self, routing_key: str, headers: dict[str, Any] | None) -> Iterator[tuple[bool, str]]:
        kind = self.kind
        for (is_queue, dest, key, _), args in self.bindings.items():
            if kind == "direct":
                ok = key == routing_key
            elif kind == "fanout":
                ok = True
            elif kind == "topic":
                ok = topic_match(key, routing_key)
            else:
                ok = headers_match(args, headers or {})
            if ok:
                yield is_queue, dest


def topic_match(pattern: str, key: str) -> bool:
    p = pattern.split(".")
    k = key.split(".")
    n, m = len(p), len(k)
    # reach[j]: the pattern prefix matched so far can end before key word j
    reach = [False] * (m + 1)
    reach[0] = True
    for word in p:
        nxt = [False] * (m + 1)
        if word == "#":
            seen = False
            for j in range(m + 1):
                seen = seen or reach[j]
                nxt[j] = seen
        else:
            for j in range(m):
                if reach[j] and (word == "*" or word == k[j]):
                    nxt[j + 1] = True
        reach = nxt
        if not any(reach):
            return False
    return reach[m] if n else m == 0 or key == ""


def headers_match(args: dict[str, Any], headers: dict[str, Any]) -> bool:
    mode = args.get("x-match", "all")
    with_x = mode in ("all-with-x", "any-with-x")
    want_all = mode in ("all", "all-with-x")
    checked = 0
    for name, value in args.items():
        if name == "x-match" or (name.startswith("x-") and not with_x):
            continue
        checked += 1
        present = name in headers
        ok = present and (value is None or headers[name] == value)
        if want_all and not ok:
            return False
        if not want_all and ok:
            return True
    return want_all


class Consumer:
    __slots__ = ("arguments", "channel", "exclusive", "no_ack", "prefetch", "queue", "tag", "unacked")

    def __init__(
        self,
        tag: str,
        channel: ChannelState,
        queue: Queue,
        *,
        no_ack: bool,
        exclusive: bool,
        prefetch: int,
        arguments: dict[str, Any],
    ) -> None:
        self.tag = tag
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch
        self.unacked = 0
        self.arguments = arguments

    def ready(self) -> bool:
        ch = self.channel
        if not ch.session.writable:
            return False
        if self.no_ack:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        return not ch.global_prefetch or ch.unacked_count < ch.global_prefetch


class Queue:
    def __init__(
        self,
        vhost: VHost,
        name: str,
        *,
        durable: bool,
        exclusive_owner: object | None,
        auto_delete: bool,
        arguments: dict[str, Any],
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments
        a = arguments
        self.ttl: int | None = a.get("x-message-ttl")
        self.expires: int | None = a.get("x-expires")
        self.dlx: str | None = a.get("x-dead-letter-exchange")
        self.dlrk: str | None = a.get("x-dead-letter-routing-key")
        self.max_length: int | None = a.get("x-max-length")
        self.max_bytes: int | None = a.get("x-max-length-bytes")
        self.overflow: str = a.get("x-overflow", "drop-head")
        self.max_priority: int = a.get("x-max-priority") or 0
        self.sac = bool(a.get("x-single-active-consumer"))
        self.kind: str = a.get("x-queue-type", "classic")
        self.levels: list[deque[Message]] = [deque() for _ in range(self.max_priority + 1)]
        self.ready = 0
        self.ready_bytes = 0
        self.consumers: list[Consumer] = []
        self._rr = 0
        self.deleted = False
        self.had_consumers = False
        self.last_used = 0.0
        self._head_timer: float | None = None

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} ready={self.ready} consumers={len(self.consumers)}>"

    # ---------------------------------------------------------------- storage

    def head(self) -> Message | None:
        for level in reversed(self.levels):
            if level:
                return level[0]
        return None

    def pop_head(self) -> Message | None:
        for level in reversed(self.levels):
            if level:
                msg = level.popleft()
                self.ready -= 1
                self.ready_bytes -= len(msg.body)
                return msg
        return None

    def _push(self, msg: Message, front: bool = False) -> None:
        level = self.levels[min(msg.priority, self.max_priority)]
        if front:
            level.appendleft(msg)
        else:
            level.append(msg)
        self.ready += 1
        self.ready_bytes += len(msg.body)

    def _insert(self, msg: Message) -> None:
        """Back at its original position (RabbitMQ classic queues keep publish order)."""
        level = self.levels[min(msg.priority, self.max_priority)]
        seq = msg.seq
        i = 0
        for other in level:
            if other.seq > seq:
                break
            i += 1
        level.insert(i, msg)
        self.ready += 1
        self.ready_bytes += len(msg.body)

    def messages(self) -> list[Message]:
        """Ready messages in delivery order (for introspection)."""
        out: list[Message] = []
        for level in reversed(self.levels):
            out.extend(level)
        return out

    def is_full(self, extra_bytes: int) -> bool:
        return (self.max_length is not None and self.ready >= self.max_length) or (
            self.max_bytes is not None and self.ready_bytes + extra_bytes > self.max_bytes
        )

    def purge(self) -> int:
        count = self.ready
        for level in self.levels:
            level.clear()
        self.ready = 0
        self.ready_bytes = 0
        self._head_timer = None
        return count


class VHost:
    def __init__(self, name: str) -> None:
        self.name = name
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        for xname, kind in (
            ("", "direct"),
            ("amq.direct", "direct"),
            ("amq.fanout", "fanout"),
            ("amq.topic", "topic"),
            ("amq.headers", "headers"),
            ("amq.match", "headers"),
        ):
            self.exchanges[xname] = Exchange(xname, kind)
        self.exchanges["amq.rabbitmq.trace"] = Exchange("amq.rabbitmq.trace", "topic", internal=True)


def _server_name() -> str:
    return "amq.gen-" + secrets.token_urlsafe(16)[:22]


#: The queue arguments RabbitMQ 3.10 compares when a queue is declared again (found with
#: pika, declaring each one anew on a queue declared without it); any other argument may
#: differ (an unknown ``x-`` one, or one the queue type does not use) and is ignored.
CLASSIC_COMPARED_ARGUMENTS = frozenset(
    {
        "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
        "x-max-length", "x-max-length-bytes", "x-max-priority", "x-overflow", "x-single-active-consumer",
        "x-queue-mode", "x-queue-master-locator", "x-queue-version", "x-queue-type",
    }
)  # fmt: skip
QUORUM_COMPARED_ARGUMENTS = frozenset(
    {
        "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
        "x-max-length", "x-max-length-bytes", "x-overflow", "x-queue-leader-locator",
        "x-dead-letter-strategy", "x-max-in-memory-bytes", "x-max-in-memory-length", "x-delivery-limit",
        "x-quorum-initial-group-size", "x-single-active-consumer", "x-queue-type",
    }
)  # fmt: skip


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class State:
    """Everything one named broker holds, and the operations on it."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.vhosts: dict[str, VHost] = {"/": VHost("/")}
        self.users: dict[str, str] = {"guest": "guest"}
        #: Counts the frames batches clients sent (tests wait for it to stand still).
        self.activity = 0
        #: Direct reply-to: token -> the channel consuming amq.rabbitmq.reply-to.
        self.reply_to: dict[str, ChannelState] = {}
        self._timers: list[tuple[float, int, int, Queue]] = []
        self._seq = itertools.count()
        self._msg_seq = itertools.count(1)
        #: Called when the earliest timer moves earlier (the streams re-arm their waits).
        self.on_timer: Callable[[], None] = lambda: None
        #: Called for every message a publish routes (introspection for tests).
        self.publish_hooks: list[Callable[[str, Queue, Message], None]] = []
        #: Faults injected into publishes (MemoryBroker.fail_publishes), first match wins.
        self.publish_faults: list[PublishFault] = []

    def take_fault(self, vhost: str, exchange: str, routing_key: str) -> PublishFault | None:
        """The injected fault this publish meets, if any (its count goes down by one)."""
        for fault in self.publish_faults:
            if fault.matches(vhost, exchange, routing_key):
                fault.hits += 1
                if fault.times is not None and fault.hits >= fault.times:
                    self.publish_faults.remove(fault)
                return fault
        return None

    # ---------------------------------------------------------------- timers

    def next_deadline(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def _timer(self, when: float, kind: int, queue: Queue) -> None:
        earliest = self._timers[0][0] if self._timers else None
        heapq.heappush(self._timers, (when, next(self._seq), kind, queue))
        if earliest is None or when < earliest:
            self.on_timer()

    def _sched_head(self, q: Queue) -> None:
        head = q.head()
        if head is None or head.expires_at is None:
            q._head_timer = None
            return
        if q._head_timer != head.expires_at:
            q._head_timer = head.expires_at
            self._timer(head.expires_at, 0, q)

    def _touch(self, q: Queue, now: float) -> None:
        q.last_used = now
        if q.expires is not None and not q.consumers:
            self._timer(now + q.expires / 1000, 1, q)

    def run_due(self, now: float | None = None) -> bool:
        """Expire messages and queues whose time has come.  True if anything was due."""
        if now is None:
            now = self.clock.now()
        timers = self._timers
        ran = False
        while timers and timers[0][0] <= now:
            when, _, kind, q = heapq.heappop(timers)
            ran = True
            if q.deleted:
                continue
            # Each expiry happens at the time it fell due, in order, even when nothing ran
            # the timers meanwhile (no connection open): a message dead-lettered into
            # another TTL queue starts its next TTL then, as on RabbitMQ.
            if kind == 0:
                if q._head_timer == when:
                    q._head_timer = None
                self.expire_head(q, when, inclusive=True)
                self.dispatch(q, when)
            elif q.expires is not None and not q.consumers and q.last_used + q.expires / 1000 <= when:
                self.delete_queue(q, when)
        return ran

    # ---------------------------------------------------------------- queues: messages

    def expire_head(self, q: Queue, now: float, *, inclusive: bool) -> None:
        while True:
            head = q.head()
            if head is None or head.expires_at is None:
                break
            if head.expires_at > now or (head.expires_at == now and not inclusive):
                break
            q.pop_head()
            self.dead_letter(q, head, "expired", now)
        self._sched_head(q)

    def enqueue(self, q: Queue, msg: Message, now: float) -> bool:
        """Put ``msg`` in ``q``; False when x-overflow=reject-publish refused it."""
        if q.overflow != "drop-head" and q.is_full(len(msg.body)):
            if q.overflow == "reject-publish-dlx":
                self.dead_letter(q, msg, "maxlen", now)
            return False
        msg.seq = next(self._msg_seq)
        ttl = q.ttl
        expiration = msg.props.expiration
        if expiration is not None:
            try:
                per_message = int(expiration)
            except ValueError:
                per_message = None
            if per_message is not None and (ttl is None or per_message < ttl):
                ttl = per_message
        msg.expires_at = None if ttl is None else now + ttl / 1000
        if q.max_priority:
            p = msg.props.priority or 0
            msg.priority = min(p, q.max_priority)
        q._push(msg)
        if q.overflow == "drop-head":
            while q.ready and (
                (q.max_length is not None and q.ready > q.max_length)
                or (q.max_bytes is not None and q.ready_bytes > q.max_bytes)
            ):
                dropped = q.pop_head()
                assert dropped is not None
                self.dead_letter(q, dropped, "maxlen", now)
        if q.consumers:
            self.dispatch(q, now)
        if msg.expires_at is not None and msg.expires_at <= now:
            # TTL 0: delivered at once if a consumer could take it, otherwise expired.
            self.expire_head(q, now, inclusive=True)
        else:
            self._sched_head(q)
        return True

    def requeue(self, q: Queue, msgs: list[Message], now: float) -> None:
        """Put delivered messages back, in their original order, ahead of newer ones."""
        if q.deleted or not msgs:
            return
        for msg in msgs:
            msg.redelivered = True
            msg.delivery_count += 1
            q._insert(msg)
        self.expire_head(q, now, inclusive=False)
        self.dispatch(q, now)

    def dispatch(self, q: Queue, now: float) -> None:
        consumers = q.consumers
        if not consumers or not q.ready:
            return
        while q.ready:
            head = q.head()
            if head is not None and head.expires_at is not None and head.expires_at < now:
                self.expire_head(q, now, inclusive=False)
                continue
            consumer = self._pick(q)
            if consumer is None:
                break
            msg = q.pop_head()
            assert msg is not None
            consumer.channel.deliver(consumer, msg)
        self._sched_head(q)

    def _pick(self, q: Queue) -> Consumer | None:
        consumers = q.consumers
        if q.sac:
            first = consumers[0]
            return first if first.ready() else None
        n = len(consumers)
        start = self._rr_index(q, n)
        for i in range(n):
            c = consumers[(start + i) % n]
            if c.ready():
                q._rr = (start + i + 1) % n
                return c
        return None

    @staticmethod
    def _rr_index(q: Queue, n: int) -> int:
        return q._rr % n if n else 0

    def get(self, q: Queue, now: float) -> Message | None:
        self._touch(q, now)
        self.expire_head(q, now, inclusive=True)
        msg = q.pop_head()
        self._sched_head(q)
        return msg

    # ---------------------------------------------------------------- dead letters

    def dead_letter(self, q: Queue, msg: Message, reason: str, now: float) -> None:
        if q.dlx is None:
            return
        vhost = q.vhost
        exchange = vhost.exchanges.get(q.dlx)
        if exchange is None:
            return  # RabbitMQ drops it (and logs); so do we
        props = msg.props
        # RabbitMQ adds x-death to the headers as they came: keep each integer's wire width.
        headers: dict[str, Any] = _typed_headers(msg.header, props.headers)
        routing_keys: list[str] = [msg.routing_key]
        for extra in ("CC", "BCC"):
            values = headers.get(extra)
            if isinstance(values, list):
                routing_keys.extend(v for v in values if isinstance(v, str))
        headers.pop("BCC", None)
        # An x-death that is not an array (any client may write one) is replaced, as
        # RabbitMQ 3.10 does (checked: {"x-death": true} comes out as a one-entry array).
        previous = headers.get("x-death")
        deaths: list[Any] = [d for d in previous if isinstance(d, dict)] if isinstance(previous, list) else []
        target_keys = [q.dlrk] if q.dlrk is not None else routing_keys
        entry: dict[str, Any] | None = None
        for d in deaths:
            if d.get("queue") == q.name and d.get("reason") == reason:
                entry = d
                break
        for d in deaths:
            if d.get("queue") == q.name and d.get("reason") == reason:
                entry = d
                break
        if entry is not None:
            deaths.remove(entry)
            entry = dict(entry)
            entry["count"] = int(entry.get("count", 1)) + 1
            entry["time"] = datetime.now(UTC).replace(microsecond=0)
        else:
            entry = {
                "count": 1,
                "reason": reason,
                "queue": q.name,
                "time": datetime.now(UTC).replace(microsecond=0),
                "exchange": msg.exchange,
                "routing-keys": routing_keys,
            }
            if props.expiration is not None:
                entry["original-expiration"] = props.expiration
        deaths.insert(0, entry)
        # RabbitMQ writes every count as int64 (field type 'l'), whatever width it came in.
        headers["x-death"] = [
            {**d, "count": Int64(d["count"])} if _is_int(d.get("count")) else d for d in deaths
        ]
        if "x-first-death-reason" not in headers:
            headers["x-first-death-reason"] = reason
            headers["x-first-death-queue"] = q.name
            headers["x-first-death-exchange"] = msg.exchange
        new = msg.with_props(msgspec.structs.replace(props, headers=headers, expiration=None))
        new.exchange = exchange.name
        seen: set[int] = set()
        for key in target_keys:
            new.routing_key = key
            for target in self._route(vhost, exchange, key, headers):
                if id(target) in seen:
                    continue
                seen.add(id(target))
                if _is_cycle(target.name, deaths):
                    log.debug("dropping a dead-letter cycle through %r", target.name)
                    continue
                copy = new.copy()
                copy.routing_key = msg.routing_key if q.dlrk is None else key
                self.enqueue(target, copy, now)

    # ---------------------------------------------------------------- routing

    def _route(
        self, vhost: VHost, exchange: Exchange, routing_key: str, headers: dict[str, Any] | None
    ) -> list[Queue]:
        found: dict[int, Queue] = {}
        visited: set[str] = set()
        self._walk(vhost, exchange, routing_key, headers, found, visited)
        return list(found.values())

    def _walk(
        self,
        vhost: VHost,
        exchange: Exchange,
        routing_key: str,
        headers: dict[str, Any] | None,
        found: dict[int, Queue],
        visited: set[str],
    ) -> None:
        if exchange.name in visited:
            return
        visited.add(exchange.name)
        before = len(found)
        if exchange.name == "":
            q = vhost.queues.get(routing_key)
            if q is not None:
                found[id(q)] = q
        else:
            for is_queue, dest in exchange.matches(routing_key, headers):
                if is_queue:
                    q = vhost.queues.get(dest)
                    if q is not None:
                        found[id(q)] = q
                else:
                    x = vhost.exchanges.get(dest)
                    if x is not None:
                        self._walk(vhost, x, routing_key, headers, found, visited)
        if len(found) == before and exchange.alternate is not None:
            alt = vhost.exchanges.get(exchange.alternate)
            if alt is not None:
                self._walk(vhost, alt, routing_key, headers, found, visited)

    def route(self, vhost: VHost, exchange: Exchange, msg: Message) -> list[Queue]:
        headers = msg.props.headers
        keys: Iterable[str] = (msg.routing_key,)
        if headers and ("CC" in headers or "BCC" in headers):
            extra = [v for h in ("CC", "BCC") for v in (headers.get(h) or []) if isinstance(v, str)]
            keys = (msg.routing_key, *extra)
        if exchange.name == "" and not headers:
            q = vhost.queues.get(msg.routing_key)
            return [q] if q is not None else []
        found: dict[int, Queue] = {}
        for key in keys:
            for q in self._route(vhost, exchange, key, headers):
                found[id(q)] = q
        return list(found.values())

    # ---------------------------------------------------------------- entities

    def vhost(self, name: str) -> VHost | None:
        return self.vhosts.get(name)

    def declare_exchange(
        self,
        vhost: VHost,
        name: str,
        kind: str,
        *,
        passive: bool,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: dict[str, Any],
    ) -> None:
        existing = vhost.exchanges.get(name)
        if passive:
            if existing is None:
                raise AMQPFail(NOT_FOUND, f"no {_x(name, vhost.name)}")
            return
        if name == "":
            raise AMQPFail(ACCESS_REFUSED, "operation not permitted on the default exchange")
        if kind not in EXCHANGE_TYPES:
            raise AMQPFail(COMMAND_INVALID, f"unknown exchange type '{kind}'")
        if existing is None and name.startswith("amq."):
            raise AMQPFail(ACCESS_REFUSED, f"{_x(name, vhost.name)} contains reserved prefix 'amq.*'")
        if existing is not None:
            for field, have, want in (
                ("type", existing.kind, kind),
                ("durable", existing.durable, durable),
                ("auto_delete", existing.auto_delete, auto_delete),
                ("internal", existing.internal, internal),
            ):
                if have != want:
                    raise AMQPFail(
                        PRECONDITION_FAILED,
                        f"inequivalent arg '{field}' for {_x(name, vhost.name)}: "
                        f"received '{_fmt(want)}' but current is '{_fmt(have)}'",
                    )
            # RabbitMQ 3.10 compares only alternate-exchange (checked with pika): other
            # arguments may differ, and the exchange keeps the ones it was declared with.
            have_alt = existing.arguments.get("alternate-exchange")
            want_alt = arguments.get("alternate-exchange")
            if have_alt != want_alt:
                raise AMQPFail(
                    PRECONDITION_FAILED,
                    f"inequivalent arg 'alternate-exchange' for {_x(name, vhost.name)}: "
                    f"received {_typed_value(want_alt)} but current is {_typed_value(have_alt)}",
                )
            return
        alt = arguments.get("alternate-exchange")
        if alt is not None and not isinstance(alt, str):
            raise AMQPFail(
                PRECONDITION_FAILED, f"invalid arg 'alternate-exchange' for {_x(name, vhost.name)}"
            )
        vhost.exchanges[name] = Exchange(
            name, kind, durable=durable, auto_delete=auto_delete, internal=internal, arguments=arguments
        )

    def delete_exchange(self, vhost: VHost, name: str, *, if_unused: bool) -> None:
        if name == "" or name.startswith("amq."):
            raise AMQPFail(
                ACCESS_REFUSED,
                f"operation not permitted on {_x(name, vhost.name)}"
                if name
                else "operation not permitted on the default exchange",
            )
        x = vhost.exchanges.get(name)
        if x is None:
            return
        if if_unused and x.bindings:
            raise AMQPFail(PRECONDITION_FAILED, f"{_x(name, vhost.name)} in use")
        del vhost.exchanges[name]
        for other in vhost.exchanges.values():
            for key in [k for k in other.bindings if not k[0] and k[1] == name]:
                del other.bindings[key]

    def _exchange(self, vhost: VHost, name: str) -> Exchange:
        x = vhost.exchanges.get(name)
        if x is None:
            raise AMQPFail(NOT_FOUND, f"no {_x(name, vhost.name)}")
        return x

    def bind(
        self, vhost: VHost, source: str, is_queue: bool, dest: str, key: str, arguments: dict[str, Any]
    ) -> None:
        if source == "" or (not is_queue and dest == ""):
            raise AMQPFail(ACCESS_REFUSED, "operation not permitted on the default exchange")
        x = self._exchange(vhost, source)
        if not is_queue:
            self._exchange(vhost, dest)
        if x.kind == "headers":
            mode = arguments.get("x-match", "all")
            if mode not in ("all", "any", "all-with-x", "any-with-x"):
                raise AMQPFail(PRECONDITION_FAILED, f"Invalid x-match field value {mode!r}")
        x.bindings[(is_queue, dest, key, _args_key(arguments))] = dict(arguments)

    def unbind(
        self, vhost: VHost, source: str, is_queue: bool, dest: str, key: str, arguments: dict[str, Any]
    ) -> None:
        if source == "" or (not is_queue and dest == ""):
            raise AMQPFail(ACCESS_REFUSED, "operation not permitted on the default exchange")
        x = vhost.exchanges.get(source)
        if x is None:
            return
        x.bindings.pop((is_queue, dest, key, _args_key(arguments)), None)
        self._maybe_auto_delete_exchange(vhost, x)

    def _maybe_auto_delete_exchange(self, vhost: VHost, x: Exchange) -> None:
        if x.auto_delete and not x.bindings and vhost.exchanges.get(x.name) is x:
            del vhost.exchanges[x.name]
            for other in vhost.exchanges.values():
                for key in [k for k in other.bindings if not k[0] and k[1] == x.name]:
                    del other.bindings[key]

    def check_queue_arguments(
        self, vhost: VHost, name: str, args: dict[str, Any], durable: bool, exclusive: bool, auto_delete: bool
    ) -> None:
        where = _q(name, vhost.name)

        def bad(arg: str, why: str) -> AMQPFail:
            return AMQPFail(PRECONDITION_FAILED, f"invalid arg '{arg}' for {where}: {why}")

        for arg, lo, hi in (
            ("x-message-ttl", 0, MAX_TTL_MS),
            ("x-expires", 1, MAX_TTL_MS),
            ("x-max-length", 0, 2**63 - 1),
            ("x-max-length-bytes", 0, 2**63 - 1),
            ("x-max-priority", 0, 255),
        ):
            if arg in args:
                value = args[arg]
                if not _is_int(value):
                    raise bad(arg, f"{{unacceptable_type,{type(value).__name__}}}")
                if not lo <= value <= hi:
                    raise bad(arg, f"{{value_out_of_range,{value}}}")
        overflow = args.get("x-overflow")
        if overflow is not None and overflow not in ("drop-head", "reject-publish", "reject-publish-dlx"):
            raise bad("x-overflow", f"{{unknown_overflow_type,{overflow}}}")
        if "x-dead-letter-routing-key" in args and "x-dead-letter-exchange" not in args:
            raise bad("x-dead-letter-routing-key", "Key x-dead-letter-exchange should be present")
        for arg in ("x-dead-letter-exchange", "x-dead-letter-routing-key"):
            if arg in args and not isinstance(args[arg], str):
                raise bad(arg, "{unacceptable_type,not a string}")
        if "x-single-active-consumer" in args and not isinstance(args["x-single-active-consumer"], bool):
            raise bad("x-single-active-consumer", "{unacceptable_type,not a boolean}")
        kind = args.get("x-queue-type", "classic")
        if kind not in ("classic", "quorum", "stream"):
            raise bad("x-queue-type", f"{{unsupported_queue_type,{kind}}}")
        if kind == "stream":
            raise AMQPFail(PRECONDITION_FAILED, f"stream queues are not emulated by memory:// ({where})")
        if kind == "quorum":
            if not durable:
                raise AMQPFail(PRECONDITION_FAILED, f"invalid property 'non-durable' for {where}")
            if exclusive:
                raise AMQPFail(PRECONDITION_FAILED, f"invalid property 'exclusive-owner' for {where}")
            if auto_delete:
                raise AMQPFail(PRECONDITION_FAILED, f"invalid property 'auto-delete' for {where}")
            for arg in ("x-max-priority", "x-queue-mode"):
                if arg in args:
                    raise AMQPFail(PRECONDITION_FAILED, f"invalid arg '{arg}' for {where}")
            if overflow == "reject-publish-dlx":
                raise AMQPFail(PRECONDITION_FAILED, f"invalid arg 'x-overflow' for {where}")

    def declare_queue(
        self,
        vhost: VHost,
        name: str,
        owner: object,
        *,
        passive: bool,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: dict[str, Any],
    ) -> Queue:
        now = self.clock.now()
        existing = vhost.queues.get(name) if name else None
        if passive:
            if existing is None:
                raise AMQPFail(NOT_FOUND, f"no {_q(name, vhost.name)}")
            self.check_exclusive(existing, owner)
            self._touch(existing, now)
            return existing
        if name.startswith("amq.") and existing is None:
            raise AMQPFail(ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'")
        if existing is not None:
            self.check_exclusive(existing, owner)
            if (existing.owner is not None) != exclusive:
                raise AMQPFail(
                    RESOURCE_LOCKED,
                    f"cannot obtain exclusive access to locked {_q(name, vhost.name)}. It could be "
                    "originally declared on another connection or the exclusive property value does "
                    "not match that of the original declaration.",
                )
            for field, have, want in (
                ("durable", existing.durable, durable),
                ("auto_delete", existing.auto_delete, auto_delete),
            ):
                if have != want:
                    raise AMQPFail(
                        PRECONDITION_FAILED,
                        f"inequivalent arg '{field}' for {_q(name, vhost.name)}: "
                        f"received '{_fmt(want)}' but current is '{_fmt(have)}'",
                    )
            compared = QUORUM_COMPARED_ARGUMENTS if existing.kind == "quorum" else CLASSIC_COMPARED_ARGUMENTS
            for arg in sorted((set(existing.arguments) | set(arguments)) & compared):
                if existing.arguments.get(arg) != arguments.get(arg):
                    if arg == "x-queue-type" and arguments.get(arg, "classic") == existing.kind:
                        continue
                    raise AMQPFail(
                        PRECONDITION_FAILED,
                        f"inequivalent arg '{arg}' for {_q(name, vhost.name)}: received "
                        f"{_typed_value(arguments.get(arg))} but current is "
                        f"{_typed_value(existing.arguments.get(arg))}",
                    )
            self._touch(existing, now)
            return existing
        if not name:
            name = _server_name()
        self.check_queue_arguments(vhost, name, arguments, durable, exclusive, auto_delete)
        q = Queue(
            vhost,
            name,
            durable=durable,
            exclusive_owner=owner if exclusive else None,
            auto_delete=auto_delete,
            arguments=dict(arguments),
        )
        vhost.queues[name] = q
        self._touch(q, now)
        return q

    def check_exclusive(self, q: Queue, owner: object) -> None:
        if q.owner is not None and q.owner is not owner:
            raise AMQPFail(
                RESOURCE_LOCKED,
                f"cannot obtain exclusive access to locked {_q(q.name, q.vhost.name)}. It could be "
                "originally declared on another connection or the exclusive property value does "
                "not match that of the original declaration.",
            )

    def queue(self, vhost: VHost, name: str, owner: object) -> Queue:
        q = vhost.queues.get(name)
        if q is None:
            raise AMQPFail(NOT_FOUND, f"no {_q(name, vhost.name)}")
        self.check_exclusive(q, owner)
        return q

    def delete_queue(self, q: Queue, now: float | None = None) -> int:
        if q.deleted:
            return 0
        q.deleted = True
        vhost = q.vhost
        if vhost.queues.get(q.name) is q:
            del vhost.queues[q.name]
        count = q.purge()
        for c in list(q.consumers):
            c.channel.broker_cancel(c)
        q.consumers.clear()
        for x in list(vhost.exchanges.values()):
            stale = [k for k in x.bindings if k[0] and k[1] == q.name]
            for key in stale:
                del x.bindings[key]
            if stale:
                self._maybe_auto_delete_exchange(vhost, x)
        return count

    def add_consumer(self, c: Consumer, now: float) -> None:
        q = c.queue
        if q.consumers and (c.exclusive or any(o.exclusive for o in q.consumers)):
            raise AMQPFail(ACCESS_REFUSED, f"{_q(q.name, q.vhost.name)} in exclusive use")
        q.consumers.append(c)
        q.had_consumers = True
        self.dispatch(q, now)

    def remove_consumer(self, c: Consumer, now: float) -> None:
        q = c.queue
        if c in q.consumers:
            q.consumers.remove(c)
        if q.deleted:
            return
        if q.auto_delete and q.had_consumers and not q.consumers:
            self.delete_queue(q, now)
            return
        if not q.consumers:
            self._touch(q, now)
        self.dispatch(q, now)  # single active consumer: the next one takes over


def _is_cycle(queue: str, deaths: list[Any]) -> bool:
    """RabbitMQ's rule: a message that would die again in a queue it died in before is
    dropped, unless that cycle went through a rejection (a consumer's decision)."""
    for i, death in enumerate(deaths):
        if death.get("queue") == queue:
            return all(d.get("reason") != "rejected" for d in deaths[: i + 1])
    return False


def _typed_value(value: object) -> str:
    """RabbitMQ's wording: ``the value '5' of type 'signedint'`` (or ``none``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"the value '{_fmt(value)}' of type 'bool'"
    if isinstance(value, int):
        return f"the value '{value}' of type '{'signedint' if -(2**31) <= value < 2**31 else 'long'}'"
    if isinstance(value, str | bytes):
        text = value if isinstance(value, str) else value.decode(errors="replace")
        return f"the value '{text}' of type 'longstr'"
    return f"the value '{value}' of type '{type(value).__name__}'"


def _fmt(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    return str(value)


_INT_WRAPPERS: dict[int, Callable[[int], Any]] = {
    ord("b"): Int8, ord("B"): UInt8, ord("s"): Int16, ord("u"): UInt16,
    ord("I"): Int32, ord("i"): UInt32, ord("l"): Int64,
}  # fmt: skip
_FIXED_WIDTH = {ord(c): n for c, n in {"t": 1, "b": 1, "B": 1, "s": 2, "u": 2, "I": 4, "i": 4,
                                        "l": 8, "f": 4, "d": 8, "D": 5, "T": 8, "V": 0}.items()}  # fmt: skip


def _typed_headers(header: bytes, headers: dict[str, Any] | None) -> dict[str, Any]:
    """``headers`` with each top-level integer wrapped in the width it had on the wire.

    The decoded table has plain ints; re-encoding them would pick the smallest type, where
    RabbitMQ passes the client's types through.  ``header`` is the content header payload
    (class, weight, body size, flags, then the properties in order)."""
    out = dict(headers or {})
    if not out or len(header) < 14:
        return out
    flags = struct.unpack_from(">H", header, 12)[0]
    if not flags & 0x2000:
        return out
    pos = 14
    for bit in (0x8000, 0x4000):  # content-type, content-encoding: short strings before headers
        if flags & bit:
            pos += 1 + header[pos]
    try:
        end = pos + 4 + struct.unpack_from(">I", header, pos)[0]
        pos += 4
        while pos < end:
            key = header[pos + 1 : pos + 1 + header[pos]].decode("utf-8", "replace")
            pos += 1 + header[pos]
            kind = header[pos]
            pos += 1
            width = _FIXED_WIDTH.get(kind)
            if width is None:  # S, x, F, A: a 32-bit length, then the bytes
                width = 4 + struct.unpack_from(">I", header, pos)[0]
            wrap = _INT_WRAPPERS.get(kind)
            if wrap is not None and isinstance(out.get(key), int) and not isinstance(out.get(key), bool):
                out[key] = wrap(out[key])
            pos += width
    except (struct.error, IndexError):
        return dict(headers or {})  # the codec decoded it, so this cannot happen; stay safe
    return out
