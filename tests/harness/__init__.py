"""Test harness: fault-injecting TCP proxy, TLS endpoint, broker-side control, and the
suite's private RabbitMQ node for disruptive tests."""

from .broker import (
    AMQP_PROTOCOL_HEADER,
    DEFAULT_NODE,
    DefaultBrokerGuardError,
    MemoryWatermark,
    Node,
    RabbitmqctlError,
    close_connections,
    get_memory_alarms,
    get_memory_watermark,
    list_connections,
    rabbitmqctl,
    rabbitmqctl_sync,
    read_connection_start,
    wait_broker_ready,
)
from .private_node import PrivateNode, PrivateNodeError
from .proxy import Direction, FaultProxy, ProxyStatistics, build_amqp_url, unwrap_single_exception
from .tls import TLSMaterial, TLSTerminatingProxy, make_ca_and_cert

__all__ = [
    "AMQP_PROTOCOL_HEADER",
    "DEFAULT_NODE",
    "DefaultBrokerGuardError",
    "Direction",
    "FaultProxy",
    "MemoryWatermark",
    "Node",
    "PrivateNode",
    "PrivateNodeError",
    "ProxyStatistics",
    "RabbitmqctlError",
    "TLSMaterial",
    "TLSTerminatingProxy",
    "build_amqp_url",
    "close_connections",
    "get_memory_alarms",
    "get_memory_watermark",
    "list_connections",
    "make_ca_and_cert",
    "rabbitmqctl",
    "rabbitmqctl_sync",
    "read_connection_start",
    "unwrap_single_exception",
    "wait_broker_ready",
]
