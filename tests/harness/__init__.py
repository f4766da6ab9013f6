"""Test harness: fault-injecting TCP proxy, TLS endpoint, and broker-side control."""

from .broker import (
    AMQP_PROTOCOL_HEADER,
    MemoryWatermark,
    RabbitmqctlError,
    broker_stopped,
    close_all_connections,
    close_connections,
    get_memory_alarms,
    get_memory_watermark,
    list_connections,
    lowered_memory_watermark,
    rabbitmqctl,
    rabbitmqctl_sync,
    read_connection_start,
    set_memory_watermark,
    wait_broker_ready,
)
from .proxy import Direction, FaultProxy, ProxyStatistics, build_amqp_url, unwrap_single_exception
from .tls import TLSMaterial, TLSTerminatingProxy, make_ca_and_cert

__all__ = [
    "AMQP_PROTOCOL_HEADER",
    "Direction",
    "FaultProxy",
    "MemoryWatermark",
    "ProxyStatistics",
    "RabbitmqctlError",
    "TLSMaterial",
    "TLSTerminatingProxy",
    "broker_stopped",
    "build_amqp_url",
    "close_all_connections",
    "close_connections",
    "get_memory_alarms",
    "get_memory_watermark",
    "list_connections",
    "lowered_memory_watermark",
    "make_ca_and_cert",
    "rabbitmqctl",
    "rabbitmqctl_sync",
    "read_connection_start",
    "set_memory_watermark",
    "unwrap_single_exception",
    "wait_broker_ready",
]
