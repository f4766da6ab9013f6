"""A foreign OJS client: plain pika, following the OJS AMQP binding's §15 examples.

This is "the other implementation" on the shared broker.  It knows nothing of ojs_anyio:
its declarations are §15.1 (exchanges, job queue) and §15.3 (retry topology) verbatim,
plus the two entities §4 names without an example, declared the plain way §4.2 describes
them (durable, no arguments): ``ojs.queue.dlx.{q}`` and ``ojs.queue.control.{q}``.  It
publishes as §15.1, consumes as §15.2 (without the example's ack-then-nack of one
delivery tag, a bug: RabbitMQ closes the channel), retries as §15.4, and sends CANCEL /
INFO as §5.6 / §5.8 describe.

pika is blocking: the tests run each call in a worker thread (``anyio.to_thread``).  Every
call has a deadline, so a broken interop fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pika
import uuid6
from support.brokers import OJS_VHOST, RABBITMQ_HOST, RABBITMQ_PORT, SPEC_RETRY_DELAYS_MS

__all__ = ["SPEC_RETRY_DELAYS_MS"]


def _connect() -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(host=RABBITMQ_HOST, port=RABBITMQ_PORT, virtual_host=OJS_VHOST)
    )


# fmt: off
def declare_job_topology(queue_name: str) -> None:
    """§15.1's declarations, then the dead-letter queue and its binding (§4.2), plain."""
    conn = _connect()
    ch = conn.channel()
    ch.exchange_declare(exchange='ojs.exchange.direct', exchange_type='direct', durable=True)
    ch.exchange_declare(exchange='ojs.exchange.dlx', exchange_type='direct', durable=True)
    ch.queue_declare(queue=f'ojs.queue.{queue_name}', durable=True, arguments={
        'x-dead-letter-exchange': 'ojs.exchange.dlx',
        'x-dead-letter-routing-key': queue_name,
        'x-max-priority': 10,
    })
    ch.queue_bind(queue=f'ojs.queue.{queue_name}', exchange='ojs.exchange.direct', routing_key=queue_name)
    ch.queue_declare(queue=f'ojs.queue.dlx.{queue_name}', durable=True)
    ch.queue_bind(queue=f'ojs.queue.dlx.{queue_name}', exchange='ojs.exchange.dlx', routing_key=queue_name)
    conn.close()


def declare_retry_topology(queue_name: str) -> None:
    """§15.3 verbatim (but the queue name)."""
    conn = _connect()
    ch = conn.channel()
    ch.exchange_declare(exchange='ojs.exchange.retry', exchange_type='direct', durable=True)
    for delay in SPEC_RETRY_DELAYS_MS:
        retry_queue = f'ojs.queue.retry.{queue_name}.{delay}'
        ch.queue_declare(queue=retry_queue, durable=True, arguments={
            'x-dead-letter-exchange': 'ojs.exchange.direct',
            'x-dead-letter-routing-key': queue_name,
            'x-message-ttl': delay,
        })
        ch.queue_bind(queue=retry_queue, exchange='ojs.exchange.retry',
                      routing_key=f'{queue_name}.{delay}')
    conn.close()


def declare_control_topology(queue_name: str) -> None:
    """``ojs.queue.control.{q}`` (§4.1), durable and plain, bound to the direct exchange with
    its own name as key (§5.6: CANCEL goes to the direct exchange, key = control queue)."""
    conn = _connect()
    ch = conn.channel()
    ch.exchange_declare(exchange='ojs.exchange.direct', exchange_type='direct', durable=True)
    ch.queue_declare(queue=f'ojs.queue.control.{queue_name}', durable=True)
    ch.queue_bind(queue=f'ojs.queue.control.{queue_name}', exchange='ojs.exchange.direct',
                  routing_key=f'ojs.queue.control.{queue_name}')
    conn.close()


def declare_everything(queue_name: str) -> None:
    declare_job_topology(queue_name)
    declare_retry_topology(queue_name)
    declare_control_topology(queue_name)


def publish(queue_name: str, job_type: str = 'email.send', args: list[Any] | None = None,
            *, max_attempts: int = 5, priority: int | None = None) -> str:
    """§15.1's publish (a uuid7 from uuid6, since uuid.uuid7 needs Python 3.14); the job id."""
    args = args if args is not None else ['user@example.com', 'welcome']
    return publish_many(queue_name, [(job_type, args)], max_attempts=max_attempts, priority=priority)[0]


def publish_many(queue_name: str, jobs: list[tuple[str, list[Any]]], *, max_attempts: int = 5,
                 priority: int | None = None) -> list[str]:
    conn = _connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ids = []
    for job_type, args in jobs:
        job_id = str(uuid6.uuid7())
        job = {
            "id": job_id, "type": job_type, "queue": queue_name, "args": args,
            "created_at": datetime.now(UTC).isoformat(),
        }
        ch.basic_publish(
            exchange='ojs.exchange.direct', routing_key=queue_name,
            body=json.dumps(job), mandatory=True,
            properties=pika.BasicProperties(
                message_id=job_id, type=job_type,
                content_type='application/openjobspec+json', content_encoding='utf-8',
                delivery_mode=2, app_id='ojs', priority=priority,
                timestamp=int(datetime.now(UTC).timestamp()),
                headers={'x-ojs-queue': queue_name, 'x-ojs-attempt': 1, 'x-ojs-max-attempts': max_attempts},
            ),
        )
        ids.append(job_id)
    conn.close()
    return ids


def retry_publish(channel: Any, job: dict[str, Any], original_props: Any, next_attempt: int,
                  delay_ms: int) -> None:
    """§15.4 verbatim."""
    headers = dict(original_props.headers or {})
    headers['x-ojs-attempt'] = next_attempt
    channel.basic_publish(
        exchange='ojs.exchange.retry',
        routing_key=f"{headers['x-ojs-queue']}.{delay_ms}",
        body=json.dumps(job), mandatory=True,
        properties=pika.BasicProperties(
            message_id=original_props.message_id, type=original_props.type,
            content_type='application/openjobspec+json', content_encoding='utf-8',
            delivery_mode=2, app_id='ojs',
            timestamp=original_props.timestamp, headers=headers,
        ),
    )
# fmt: on


def publish_retry_of(queue_name: str, job_id: str, job_type: str, args: list[Any], *, attempt: int) -> None:
    """A retry as §15.4 makes it, of a job that failed ``attempt - 1`` times: 1000 ms."""
    conn = _connect()
    ch = conn.channel()
    ch.confirm_delivery()
    job = {
        "id": job_id,
        "type": job_type,
        "queue": queue_name,
        "args": args,
        "created_at": datetime.now(UTC).isoformat(),
    }
    props = pika.BasicProperties(
        message_id=job_id,
        type=job_type,
        timestamp=int(time.time()),
        headers={"x-ojs-queue": queue_name, "x-ojs-attempt": attempt - 1, "x-ojs-max-attempts": 5},
    )
    retry_publish(ch, job, props, attempt, 1000)
    conn.close()


class RetryableError(Exception):
    pass


@dataclass
class Consumed:
    """What the §15.2 consumer saw: one entry per execution."""

    runs: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)  # (id, attempt, headers)
    lock: threading.Lock = field(default_factory=threading.Lock)


def consume(
    queue_name: str,
    process: Callable[[dict[str, Any], int], None],
    stop: threading.Event,
    consumed: Consumed,
    *,
    deadline: float = 60.0,
    prefetch: int = 5,
) -> None:
    """§15.2's consumer, until ``stop`` is set (or ``deadline`` seconds, then it raises).

    ``process(job, attempt)`` raises :class:`RetryableError` for a retryable failure,
    anything else to discard.  Retries go through §15.4 with §15.2's delay formula;
    exhausted and discarded jobs are Nacked without requeue (one settle per delivery).
    """
    conn = _connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_qos(prefetch_count=prefetch)

    def on_message(ch: Any, method: Any, properties: Any, body: bytes) -> None:
        job = json.loads(body)
        attempt = properties.headers.get("x-ojs-attempt", 1)
        with consumed.lock:
            consumed.runs.append((job["id"], attempt, dict(properties.headers or {})))
        try:
            process(job, attempt)
            ch.basic_ack(delivery_tag=method.delivery_tag)  # ACK
        except RetryableError:
            max_attempts = properties.headers.get("x-ojs-max-attempts", 3)
            if attempt < max_attempts:
                delay_ms = min(1000 * (2 ** (attempt - 1)), 60000)
                retry_publish(ch, job, properties, attempt + 1, delay_ms)  # Republish with delay
                ch.basic_ack(delivery_tag=method.delivery_tag)  # Ack original
            else:
                ch.basic_nack(delivery_tag=method.delivery_tag, requeue=False)  # DLX
        except Exception:
            ch.basic_nack(delivery_tag=method.delivery_tag, requeue=False)  # Discard → DLX

    ch.basic_consume(queue=f"ojs.queue.{queue_name}", on_message_callback=on_message)
    give_up = time.monotonic() + deadline
    try:
        while not stop.is_set():
            if time.monotonic() > give_up:
                raise TimeoutError(f"foreign consumer still running after {deadline}s")
            conn.process_data_events(time_limit=0.05)
    finally:
        conn.close()


def send_control(
    queue_name: str, kind: str, body: dict[str, Any], *, via: str = "default", **props: Any
) -> None:
    """A control message to ``ojs.queue.control.{q}``: through the default exchange (key =
    the queue's name) or through ``ojs.exchange.direct`` (key = the control queue name)."""
    conn = _connect()
    ch = conn.channel()
    ch.confirm_delivery()
    exchange = "" if via == "default" else "ojs.exchange.direct"
    ch.basic_publish(
        exchange=exchange,
        routing_key=f"ojs.queue.control.{queue_name}",
        body=json.dumps(body),
        mandatory=True,
        properties=pika.BasicProperties(type=kind, content_type="application/json", **props),
    )
    conn.close()


def cancel(queue_name: str, job_id: str, *, via: str = "default") -> None:
    """CANCEL (§5.6): type ``ojs.control.cancel``, body ``{"job_id": ...}``."""
    send_control(queue_name, "ojs.control.cancel", {"job_id": job_id}, via=via)


def info(queue_name: str, job_id: str, *, timeout: float = 10.0) -> tuple[dict[str, Any], str, str]:
    """INFO (§5.8): exclusive auto-delete reply queue, ``reply_to`` and a unique
    ``correlation_id``; returns (the answer, its correlation id, ours)."""
    conn = _connect()
    try:
        ch = conn.channel()
        reply = ch.queue_declare(queue="", exclusive=True, auto_delete=True).method.queue
        correlation_id = uuid.uuid4().hex
        ch.confirm_delivery()
        ch.basic_publish(
            exchange="",
            routing_key=f"ojs.queue.control.{queue_name}",
            body=json.dumps({"job_id": job_id}),
            mandatory=True,
            properties=pika.BasicProperties(
                type="ojs.control.info",
                content_type="application/json",
                reply_to=reply,
                correlation_id=correlation_id,
            ),
        )
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            method, props, body = ch.basic_get(queue=reply, auto_ack=True)
            if method is None:
                conn.process_data_events(time_limit=0.05)
                continue
            if props.correlation_id == correlation_id:
                return json.loads(body), props.correlation_id, correlation_id
        raise TimeoutError(f"no INFO answer for {job_id} within {timeout}s")
    finally:
        conn.close()


def basic_get(queue: str) -> tuple[Any, Any, bytes]:
    """One message from the AMQP queue ``queue`` (Basic.Get, then ack)."""
    conn = _connect()
    try:
        ch = conn.channel()
        method, properties, body = ch.basic_get(queue=queue, auto_ack=False)
        assert method is not None, f"{queue} is empty"
        ch.basic_ack(delivery_tag=method.delivery_tag)
        return method, properties, body
    finally:
        conn.close()
