"""Quorum options of the topology, as data (no broker)."""

from __future__ import annotations

import pytest

import ojs_anyio as ojs
from ojs_anyio.jobs import (
    TopologyError,
    delay_landing_queue_arguments,
    delay_level_queue_arguments,
    dlx_queue_arguments,
    job_queue_arguments,
    quorum_queue_arguments,
    retry_queue_arguments,
)

NAMES = ojs.Names()
QUORUM: dict[str, object] = {"queue_type": "quorum", "max_priority": None}


def test_defaults_are_unchanged_by_the_quorum_option() -> None:
    """Without options every declaration is the spec's: quorum is never silent."""
    assert job_queue_arguments(NAMES, "email") == {
        "x-dead-letter-exchange": "ojs.exchange.dlx",
        "x-dead-letter-routing-key": "email",
        "x-max-priority": 10,
    }
    retry = retry_queue_arguments(NAMES, "email", 1000)
    assert quorum_queue_arguments(retry, None) == retry
    assert quorum_queue_arguments(retry, ojs.QueueOptions()) == retry
    assert quorum_queue_arguments(retry, ojs.QueueOptions(queue_type="classic")) == retry


def test_quorum_job_queue_is_at_least_once_without_priority() -> None:
    args = job_queue_arguments(NAMES, "email", ojs.QueueOptions.quorum(delivery_limit=20))
    assert args == {
        "x-dead-letter-exchange": "ojs.exchange.dlx",
        "x-dead-letter-routing-key": "email",
        "x-queue-type": "quorum",
        "x-overflow": "reject-publish",
        "x-dead-letter-strategy": "at-least-once",
        "x-delivery-limit": 20,
    }
    assert dlx_queue_arguments(NAMES, "email", ojs.QueueOptions.quorum())["x-queue-type"] == "quorum"


@pytest.mark.parametrize(
    "args",
    [
        retry_queue_arguments(NAMES, "email", 5000),
        delay_level_queue_arguments(NAMES, 7),
        delay_landing_queue_arguments(NAMES, "email"),
    ],
    ids=["retry", "delay-level", "landing"],
)
def test_every_hop_becomes_quorum_and_at_least_once(args: dict[str, object]) -> None:
    quorum = quorum_queue_arguments(args, ojs.QueueOptions.quorum())
    assert quorum == {
        **args,
        "x-queue-type": "quorum",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }
    assert args.get("x-queue-type") is None  # the input is not modified


def test_quorum_without_at_least_once_keeps_classic_dead_lettering() -> None:
    opts = ojs.QueueOptions(queue_type="quorum", max_priority=None)
    args = quorum_queue_arguments(retry_queue_arguments(NAMES, "email", 5000), opts)
    assert args["x-queue-type"] == "quorum"
    assert "x-dead-letter-strategy" not in args
    assert "x-overflow" not in args


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue_type": "quorum"}, "no priorities"),
        ({**QUORUM, "dead_letter_strategy": "at-least-once"}, "reject-publish"),
        ({**QUORUM, "overflow": "drop-head", "dead_letter_strategy": "at-least-once"}, "reject-publish"),
        ({"dead_letter_strategy": "at-least-once", "overflow": "reject-publish"}, "quorum queues only"),
        ({"delivery_limit": 5}, "quorum queues only"),
        ({**QUORUM, "delivery_limit": -1}, "non-negative"),
    ],
)
def test_bad_combinations_are_refused_with_the_reason(options: dict[str, object], message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        ojs.QueueOptions(**options)  # type: ignore[arg-type]


def test_quorum_helper_refuses_priority() -> None:
    with pytest.raises(TopologyError, match="no priorities"):
        ojs.QueueOptions.quorum(max_priority=5)
