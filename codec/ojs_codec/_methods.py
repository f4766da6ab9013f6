"""AMQP 0-9-1 method ids: the one place they are defined.

A method id is the class id and the method id of a method frame as one int,
``(class_id << 16) | method_id``: the first four bytes of a method frame's payload read
as a big-endian unsigned int, and the same number as pamqp's ``Method.index``.  The
protocol's state tables, the hand-written fast path and the ``memory://`` broker all
compare against these names.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "BASIC_ACK",
    "BASIC_CANCEL",
    "BASIC_CANCEL_OK",
    "BASIC_CONSUME",
    "BASIC_CONSUME_OK",
    "BASIC_DELIVER",
    "BASIC_GET",
    "BASIC_GET_EMPTY",
    "BASIC_GET_OK",
    "BASIC_NACK",
    "BASIC_PUBLISH",
    "BASIC_QOS",
    "BASIC_QOS_OK",
    "BASIC_RECOVER",
    "BASIC_RECOVER_ASYNC",
    "BASIC_RECOVER_OK",
    "BASIC_REJECT",
    "BASIC_RETURN",
    "CHANNEL_CLOSE",
    "CHANNEL_CLOSE_OK",
    "CHANNEL_FLOW",
    "CHANNEL_FLOW_OK",
    "CHANNEL_OPEN",
    "CHANNEL_OPEN_OK",
    "CONFIRM_SELECT",
    "CONFIRM_SELECT_OK",
    "CONNECTION_BLOCKED",
    "CONNECTION_CLOSE",
    "CONNECTION_CLOSE_OK",
    "CONNECTION_OPEN",
    "CONNECTION_OPEN_OK",
    "CONNECTION_SECURE",
    "CONNECTION_SECURE_OK",
    "CONNECTION_START",
    "CONNECTION_START_OK",
    "CONNECTION_TUNE",
    "CONNECTION_TUNE_OK",
    "CONNECTION_UNBLOCKED",
    "EXCHANGE_BIND",
    "EXCHANGE_BIND_OK",
    "EXCHANGE_DECLARE",
    "EXCHANGE_DECLARE_OK",
    "EXCHANGE_DELETE",
    "EXCHANGE_DELETE_OK",
    "EXCHANGE_UNBIND",
    "EXCHANGE_UNBIND_OK",
    "QUEUE_BIND",
    "QUEUE_BIND_OK",
    "QUEUE_DECLARE",
    "QUEUE_DECLARE_OK",
    "QUEUE_DELETE",
    "QUEUE_DELETE_OK",
    "QUEUE_PURGE",
    "QUEUE_PURGE_OK",
    "QUEUE_UNBIND",
    "QUEUE_UNBIND_OK",
    "TX_COMMIT",
    "TX_COMMIT_OK",
    "TX_ROLLBACK",
    "TX_ROLLBACK_OK",
    "TX_SELECT",
    "TX_SELECT_OK",
    "method_name",
]

CONNECTION_START: Final = (10 << 16) | 10
CONNECTION_START_OK: Final = (10 << 16) | 11
CONNECTION_SECURE: Final = (10 << 16) | 20
CONNECTION_SECURE_OK: Final = (10 << 16) | 21
CONNECTION_TUNE: Final = (10 << 16) | 30
CONNECTION_TUNE_OK: Final = (10 << 16) | 31
CONNECTION_OPEN: Final = (10 << 16) | 40
CONNECTION_OPEN_OK: Final = (10 << 16) | 41
CONNECTION_CLOSE: Final = (10 << 16) | 50
CONNECTION_CLOSE_OK: Final = (10 << 16) | 51
CONNECTION_BLOCKED: Final = (10 << 16) | 60
CONNECTION_UNBLOCKED: Final = (10 << 16) | 61

CHANNEL_OPEN: Final = (20 << 16) | 10
CHANNEL_OPEN_OK: Final = (20 << 16) | 11
CHANNEL_FLOW: Final = (20 << 16) | 20
CHANNEL_FLOW_OK: Final = (20 << 16) | 21
CHANNEL_CLOSE: Final = (20 << 16) | 40
CHANNEL_CLOSE_OK: Final = (20 << 16) | 41

EXCHANGE_DECLARE: Final = (40 << 16) | 10
EXCHANGE_DECLARE_OK: Final = (40 << 16) | 11
EXCHANGE_DELETE: Final = (40 << 16) | 20
EXCHANGE_DELETE_OK: Final = (40 << 16) | 21
EXCHANGE_BIND: Final = (40 << 16) | 30
EXCHANGE_BIND_OK: Final = (40 << 16) | 31
EXCHANGE_UNBIND: Final = (40 << 16) | 40
EXCHANGE_UNBIND_OK: Final = (40 << 16) | 51

QUEUE_DECLARE: Final = (50 << 16) | 10
QUEUE_DECLARE_OK: Final = (50 << 16) | 11
QUEUE_BIND: Final = (50 << 16) | 20
QUEUE_BIND_OK: Final = (50 << 16) | 21
QUEUE_PURGE: Final = (50 << 16) | 30
QUEUE_PURGE_OK: Final = (50 << 16) | 31
QUEUE_DELETE: Final = (50 << 16) | 40
QUEUE_DELETE_OK: Final = (50 << 16) | 41
QUEUE_UNBIND: Final = (50 << 16) | 50
QUEUE_UNBIND_OK: Final = (50 << 16) | 51

BASIC_QOS: Final = (60 << 16) | 10
BASIC_QOS_OK: Final = (60 << 16) | 11
BASIC_CONSUME: Final = (60 << 16) | 20
BASIC_CONSUME_OK: Final = (60 << 16) | 21
BASIC_CANCEL: Final = (60 << 16) | 30
BASIC_CANCEL_OK: Final = (60 << 16) | 31
BASIC_PUBLISH: Final = (60 << 16) | 40
BASIC_RETURN: Final = (60 << 16) | 50
BASIC_DELIVER: Final = (60 << 16) | 60
BASIC_GET: Final = (60 << 16) | 70
BASIC_GET_OK: Final = (60 << 16) | 71
BASIC_GET_EMPTY: Final = (60 << 16) | 72
BASIC_ACK: Final = (60 << 16) | 80
BASIC_REJECT: Final = (60 << 16) | 90
BASIC_RECOVER_ASYNC: Final = (60 << 16) | 100
BASIC_RECOVER: Final = (60 << 16) | 110
BASIC_RECOVER_OK: Final = (60 << 16) | 111
BASIC_NACK: Final = (60 << 16) | 120

CONFIRM_SELECT: Final = (85 << 16) | 10
CONFIRM_SELECT_OK: Final = (85 << 16) | 11

TX_SELECT: Final = (90 << 16) | 10
TX_SELECT_OK: Final = (90 << 16) | 11
TX_COMMIT: Final = (90 << 16) | 20
TX_COMMIT_OK: Final = (90 << 16) | 21
TX_ROLLBACK: Final = (90 << 16) | 30
TX_ROLLBACK_OK: Final = (90 << 16) | 31


def method_name(method_id: int) -> str:
    """``"class.method"`` numbers of a method id, for error messages (``"60.40"``)."""
    return f"{method_id >> 16}.{method_id & 0xFFFF}"
