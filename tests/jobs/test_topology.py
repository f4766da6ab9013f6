"""Topology names and arguments, priority mapping, and the binary delay levels in a broker model."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ojs_anyio.jobs._delay_levels import (
    delay_deliver_binding,
    delay_landing_queue_arguments,
    delay_level_binding_key,
    delay_level_bindings,
    delay_level_queue_arguments,
    delay_routing_key,
)
from ojs_anyio.jobs._errors import DelayOutOfRangeError, TopologyError
from ojs_anyio.jobs._retry import RETRY_LADDER_MS
from ojs_anyio.jobs._topology import (
    DELAY_LEVELS,
    MAX_DELAY_MS,
    MAX_TTL_MS,
    Binding,
    Names,
    QueueOptions,
    control_queue_arguments,
    control_queue_binding,
    delayed_queue_binding,
    dlx_queue_arguments,
    dlx_queue_binding,
    exchanges,
    job_queue_arguments,
    job_queue_binding,
    priority_to_amqp,
    retry_queue_arguments,
    retry_queue_binding,
    strip_dead_letter_headers,
)

#: Pure test module: runs under ``pytest -m "not broker"`` (see tests/conftest.py).

NAMES = Names()

# ------------------------------------------------------------------ names


def test_names_follow_001_section_4_1() -> None:
    assert NAMES.direct_exchange == "ojs.exchange.direct"
    assert NAMES.dlx_exchange == "ojs.exchange.dlx"
    assert NAMES.retry_exchange == "ojs.exchange.retry"
    assert NAMES.delayed_exchange == "ojs.exchange.delayed"
    assert NAMES.job_queue("email") == "ojs.queue.email"
    assert NAMES.dlx_queue("email") == "ojs.queue.dlx.email"
    assert NAMES.retry_queue("email", 5000) == "ojs.queue.retry.email.5000"
    assert NAMES.retry_routing_key("email", 5000) == "email.5000"
    assert NAMES.control_queue("email") == "ojs.queue.control.email"
    assert NAMES.control_routing_key("email") == "ojs.queue.control.email"


def test_prefix_applies_to_exchanges_and_queues_not_keys() -> None:
    names = Names("tenant1.")
    assert names.job_queue("email") == "tenant1.ojs.queue.email"
    assert names.direct_exchange == "tenant1.ojs.exchange.direct"
    assert names.dlx_queue("email") == "tenant1.ojs.queue.dlx.email"
    assert names.retry_queue("email", 1000) == "tenant1.ojs.queue.retry.email.1000"
    assert names.retry_routing_key("email", 1000) == "email.1000"
    assert names.delay_queue(3) == "tenant1.ojs.queue.delay.03"
    assert names.delay_exchange(31) == "tenant1.ojs.exchange.delay.31"
    assert names.delay_entry_exchange == "tenant1.ojs.exchange.delay.31"
    assert names.delay_deliver_exchange == "tenant1.ojs.exchange.delay.deliver"
    assert names.delay_landing_queue("email") == "tenant1.ojs.queue.delay.deliver.email"
    assert job_queue_binding(names, "email") == Binding(
        "tenant1.ojs.queue.email", "tenant1.ojs.exchange.direct", "email"
    )


@pytest.mark.parametrize("prefix", ["tenant1", "a b.", " ."])
def test_bad_prefix(prefix: str) -> None:
    with pytest.raises(TopologyError, match="prefix"):
        Names(prefix)


@pytest.mark.parametrize(
    "queue",
    [
        "dlx.email",
        "retry.email.5",
        "control.x",
        "delay.03",
        "ojs.queue.x",
        "Email",
        "",
        "a b",
        "-a",
        "a" * 129,
    ],
)
def test_bad_or_colliding_queue_names(queue: str) -> None:
    with pytest.raises(TopologyError):
        NAMES.job_queue(queue)


@pytest.mark.parametrize("queue", ["dlx", "retry", "billing.invoices", "high-priority", "a" * 128, "0"])
def test_fine_queue_names(queue: str) -> None:
    assert NAMES.job_queue(queue) == f"ojs.queue.{queue}"


def test_names_over_255_bytes_are_refused() -> None:
    with pytest.raises(TopologyError, match="255 bytes"):
        Names("t" * 120 + ".").delay_landing_queue("a" * 128)


# ------------------------------------------------------------------ queue arguments


def test_default_job_queue_arguments_are_exactly_those_of_15_1() -> None:
    assert job_queue_arguments(NAMES, "email") == {
        "x-dead-letter-exchange": "ojs.exchange.dlx",
        "x-dead-letter-routing-key": "email",
        "x-max-priority": 10,
    }
    assert (
        job_queue_arguments(Names("t."), "email", QueueOptions())["x-dead-letter-exchange"]
        == "t.ojs.exchange.dlx"
    )


def test_opt_in_job_queue_arguments() -> None:
    options = QueueOptions(
        max_length=1000,
        max_length_bytes=10**6,
        overflow="reject-publish",
        message_ttl_ms=60_000,
        queue_type="classic",
    )
    assert job_queue_arguments(NAMES, "email", options) == {
        "x-dead-letter-exchange": "ojs.exchange.dlx",
        "x-dead-letter-routing-key": "email",
        "x-max-priority": 10,
        "x-max-length": 1000,
        "x-max-length-bytes": 10**6,
        "x-overflow": "reject-publish",
        "x-message-ttl": 60_000,
        "x-queue-type": "classic",
    }
    assert "x-max-priority" not in job_queue_arguments(NAMES, "email", QueueOptions(max_priority=None))


def test_quorum_with_priority_is_refused_clearly() -> None:
    with pytest.raises(
        TopologyError, match=r"quorum queues on RabbitMQ 3\.10 have no priorities.*max_priority=None"
    ):
        QueueOptions(queue_type="quorum")
    with pytest.raises(TopologyError, match="reject-publish-dlx"):
        QueueOptions(queue_type="quorum", max_priority=None, overflow="reject-publish-dlx")
    args = job_queue_arguments(NAMES, "email", QueueOptions(queue_type="quorum", max_priority=None))
    assert args == {
        "x-dead-letter-exchange": "ojs.exchange.dlx",
        "x-dead-letter-routing-key": "email",
        "x-queue-type": "quorum",
    }


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_length": -1},
        {"max_priority": 0},
        {"max_priority": 256},
        {"message_ttl_ms": MAX_TTL_MS + 1},
        {"dlq_max_length": -5},
        {"max_length": True},
    ],
)
def test_bad_queue_options(kwargs: dict[str, object]) -> None:
    with pytest.raises(TopologyError):
        QueueOptions(**kwargs)  # type: ignore[arg-type]


def test_retry_queue_arguments_are_exactly_8_2_and_match_15_3() -> None:
    assert retry_queue_arguments(NAMES, "email", 5000) == {
        "x-dead-letter-exchange": "ojs.exchange.direct",
        "x-dead-letter-routing-key": "email",
        "x-message-ttl": 5000,
    }
    assert retry_queue_binding(NAMES, "email", 5000) == Binding(
        "ojs.queue.retry.email.5000", "ojs.exchange.retry", "email.5000"
    )
    for delay in RETRY_LADDER_MS:  # every ladder rung is a legal TTL
        retry_queue_arguments(NAMES, "email", delay)
    for bad in (0, -1, MAX_TTL_MS + 1):
        with pytest.raises(DelayOutOfRangeError):
            retry_queue_arguments(NAMES, "email", bad)


def test_dead_letter_queue_is_plain_unless_limits_are_opted_into() -> None:
    # Declared exactly as the spec declares it: durable, no arguments; retention is prune's job.
    assert dlx_queue_arguments(NAMES, "email") == {}
    week = 7 * 86_400_000
    assert dlx_queue_arguments(NAMES, "email", QueueOptions(dlq_max_age_ms=week, dlq_max_length=50)) == {
        "x-message-ttl": week,
        "x-max-length": 50,
    }
    quorum = QueueOptions(queue_type="quorum", max_priority=None)
    assert dlx_queue_arguments(NAMES, "email", quorum)["x-queue-type"] == "quorum"
    assert dlx_queue_binding(NAMES, "email") == Binding("ojs.queue.dlx.email", "ojs.exchange.dlx", "email")


def test_control_queue_is_plain_unless_limits_are_opted_into() -> None:
    assert control_queue_arguments() == {}
    assert control_queue_arguments(message_ttl_ms=3_600_000, max_length=10_000) == {
        "x-message-ttl": 3_600_000,
        "x-max-length": 10_000,
    }
    assert control_queue_binding(NAMES, "email") == Binding(
        "ojs.queue.control.email", "ojs.exchange.direct", "ojs.queue.control.email"
    )


def test_exchanges() -> None:
    specs = exchanges(NAMES)
    assert specs[:3] == [
        ("ojs.exchange.direct", "direct", {}),
        ("ojs.exchange.dlx", "direct", {}),
        ("ojs.exchange.retry", "direct", {}),
    ]
    assert len(specs) == 3 + DELAY_LEVELS + 1
    assert {s.type for s in specs[3:]} == {"topic"}
    plugin = exchanges(NAMES, delayed_plugin=True)[-1]
    assert plugin == ("ojs.exchange.delayed", "x-delayed-message", {"x-delayed-type": "direct"})
    assert delayed_queue_binding(NAMES, "email") == Binding(
        "ojs.queue.email", "ojs.exchange.delayed", "email"
    )


def test_strip_dead_letter_headers() -> None:
    headers = {
        "x-death": [{}],
        "x-first-death-queue": "q",
        "x-last-death-reason": "expired",
        "x-ojs-attempt": 2,
    }
    assert strip_dead_letter_headers(headers) == {"x-ojs-attempt": 2}
    assert strip_dead_letter_headers(None) == {}


@pytest.mark.parametrize(
    ("ojs", "amqp"),
    [(0, 0), (1, 1), (5, 5), (9, 9), (10, 9), (150, 9), (10**12, 9), (-1, 0), (-100, 0), (-(10**12), 0)],
)
def test_priority_0_to_9_kept_others_clamped(ojs: int, amqp: int) -> None:
    assert priority_to_amqp(ojs) == amqp


def test_priority_must_be_an_int() -> None:
    with pytest.raises(TypeError):
        priority_to_amqp(1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("queue", "why"),
    [
        ("dlx.email", "dead-letter queue of queue 'email'"),
        ("retry.email.5", "retry delay queue"),
        ("control.x", "control queue of queue 'x'"),
        ("delay.03", "scheduling delay queues"),
    ],
)
def test_colliding_queue_names_say_why(queue: str, why: str) -> None:
    with pytest.raises(TopologyError, match=why):
        NAMES.job_queue(queue)


# ------------------------------------------------------------------ delay levels


def test_delay_range_covers_30_days() -> None:
    assert DELAY_LEVELS >= 32
    assert MAX_DELAY_MS >= 30 * 86_400_000
    assert (
        max(delay_level_queue_arguments(NAMES, k)["x-message-ttl"] for k in range(DELAY_LEVELS)) <= MAX_TTL_MS
    )


def test_delay_routing_key() -> None:
    key = delay_routing_key(5, "billing.invoices")
    assert key == "0." * 29 + "1.0.1.billing.invoices"
    assert delay_routing_key(MAX_DELAY_MS, "q") == "1." * 32 + "q"
    assert len(delay_routing_key(MAX_DELAY_MS, "a" * 128)) <= 255
    for bad in (-1, MAX_DELAY_MS + 1):
        with pytest.raises(DelayOutOfRangeError, match="scheduling delay"):
            delay_routing_key(bad, "q")
    with pytest.raises(TopologyError):
        delay_routing_key(5, "dlx.q")


def test_delay_level_shapes() -> None:
    assert delay_level_binding_key(31, "1") == "1.#"
    assert delay_level_binding_key(0, "0") == "*." * 31 + "0.#"
    assert delay_level_queue_arguments(NAMES, 0) == {
        "x-message-ttl": 1,
        "x-dead-letter-exchange": "ojs.exchange.delay.deliver",
    }
    assert delay_level_queue_arguments(NAMES, 20) == {
        "x-message-ttl": 2**20,
        "x-dead-letter-exchange": "ojs.exchange.delay.19",
    }
    assert delay_landing_queue_arguments(NAMES, "email") == {
        "x-message-ttl": 0,
        "x-dead-letter-exchange": "ojs.exchange.direct",
        "x-dead-letter-routing-key": "email",
    }
    assert len(delay_level_bindings(NAMES)) == 2 * DELAY_LEVELS
    for bad in (-1, 32):
        with pytest.raises(TopologyError):
            NAMES.delay_queue(bad)


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic matching: words split on '.', '*' is exactly one word, '#' zero or more."""
    p, k = pattern.split("."), key.split(".")

    @cache
    def match(i: int, j: int) -> bool:
        if i == len(p):
            return j == len(k)
        if p[i] == "#":
            return match(i + 1, j) or (j < len(k) and match(i, j + 1))
        return j < len(k) and p[i] in ("*", k[j]) and match(i + 1, j + 1)

    return match(0, 0)


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("*.1.#", "0.1.q", True),
        ("*.1.#", "0.1", True),
        ("*.1.#", "1.1.q", True),
        ("*.1.#", "0.0.q", False),
        ("*.*.q", "0.1.q", True),
        ("*.*.q", "0.1.a.q", False),
        ("#", "", True),
        ("a.#.b", "a.b", True),
    ],
)
def test_topic_model(pattern: str, key: str, matches: bool) -> None:
    assert topic_matches(pattern, key) is matches


class BrokerModel:
    """Exchanges, bindings and TTL/dead-letter queues, following RabbitMQ's routing rules."""

    def __init__(self, names: Names, queues: list[str]) -> None:
        self.exchange_types = {spec.name: spec.type for spec in exchanges(names)}
        self.bindings = list(delay_level_bindings(names))
        self.queue_args = {
            names.delay_queue(k): delay_level_queue_arguments(names, k) for k in range(DELAY_LEVELS)
        }
        for q in queues:
            self.queue_args[names.job_queue(q)] = job_queue_arguments(names, q)
            self.queue_args[names.dlx_queue(q)] = dlx_queue_arguments(names, q)
            self.queue_args[names.delay_landing_queue(q)] = delay_landing_queue_arguments(names, q)
            self.bindings += [
                job_queue_binding(names, q),
                dlx_queue_binding(names, q),
                delay_deliver_binding(names, q),
            ]
            for delay in RETRY_LADDER_MS:
                self.queue_args[names.retry_queue(q, delay)] = retry_queue_arguments(names, q, delay)
                self.bindings.append(retry_queue_binding(names, q, delay))
        self.by_source: dict[str, list[Binding]] = {}
        for binding in self.bindings:
            self.by_source.setdefault(binding.source, []).append(binding)
            assert binding.source in self.exchange_types
            assert (
                (binding.destination in self.exchange_types)
                if binding.to_exchange
                else (binding.destination in self.queue_args)
            )

    def route(self, exchange: str, key: str, seen: frozenset[str] = frozenset()) -> list[str]:
        assert exchange not in seen, "exchange-to-exchange loop"
        kind = self.exchange_types[exchange]
        out: list[str] = []
        for b in self.by_source.get(exchange, []):
            hit = b.routing_key == key if kind == "direct" else topic_matches(b.routing_key, key)
            if hit:
                out += self.route(b.destination, key, seen | {exchange}) if b.to_exchange else [b.destination]
        return out

    def publish(self, exchange: str, key: str) -> tuple[str, int, list[str]]:
        """Follow a message until it rests in a queue without TTL: (queue, ms waited, path)."""
        elapsed, path = 0, []
        queues = self.route(exchange, key)
        while True:
            assert len(queues) == 1, f"routed to {queues} (must be exactly one queue)"
            queue = queues[0]
            assert queue not in path, f"dead-letter cycle through {queue}"  # RabbitMQ would drop it
            path.append(queue)
            args = self.queue_args[queue]
            if "x-message-ttl" not in args:
                return queue, elapsed, path
            elapsed += args["x-message-ttl"]
            key = args.get("x-dead-letter-routing-key", key)  # kept unless the queue replaces it
            queues = self.route(args["x-dead-letter-exchange"], key)


QUEUES = ["email", "billing.invoices", "billing", "0", "a-b.c-d"]
MODEL = BrokerModel(NAMES, QUEUES)
TENANT_MODEL = BrokerModel(Names("tenant1."), QUEUES)


@settings(deadline=None)  # a walk through up to 34 queues; keep slow CI machines from flaking
@given(st.integers(0, MAX_DELAY_MS), st.sampled_from(QUEUES), st.booleans())
def test_delayed_message_waits_exactly_its_delay_and_lands_in_its_queue(
    delay: int, queue: str, tenant: bool
) -> None:
    names, model = (Names("tenant1."), TENANT_MODEL) if tenant else (NAMES, MODEL)
    final, elapsed, path = model.publish(names.delay_entry_exchange, delay_routing_key(delay, queue))
    assert final == names.job_queue(queue)
    assert elapsed == delay
    levels = [q for q in path if q.startswith(f"{names.prefix}ojs.queue.delay.") and q[-2:].isdigit()]
    assert len(levels) == bin(delay).count("1")
    assert path[-2] == names.delay_landing_queue(queue)  # the TTL-0 hop into ojs.exchange.direct


@pytest.mark.parametrize("delay", [0, 1, 2**31, MAX_DELAY_MS, 30 * 86_400_000])
def test_delay_edges(delay: int) -> None:
    final, elapsed, _ = MODEL.publish(NAMES.delay_entry_exchange, delay_routing_key(delay, "billing"))
    assert (final, elapsed) == ("ojs.queue.billing", delay)


@given(st.sampled_from(RETRY_LADDER_MS), st.sampled_from(QUEUES))
def test_retry_publish_comes_back_to_the_job_queue(delay: int, queue: str) -> None:
    final, elapsed, path = MODEL.publish(NAMES.retry_exchange, NAMES.retry_routing_key(queue, delay))
    assert (final, elapsed, path) == (NAMES.job_queue(queue), delay, [NAMES.retry_queue(queue, delay), final])


@pytest.mark.parametrize("queue", QUEUES)
def test_push_and_dead_letter_routes(queue: str) -> None:
    assert MODEL.route(NAMES.direct_exchange, queue) == [NAMES.job_queue(queue)]
    assert MODEL.route(NAMES.dlx_exchange, queue) == [NAMES.dlx_queue(queue)]
