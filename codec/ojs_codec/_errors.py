"""One error hierarchy for AMQP 0-9-1.

Every reply code of the protocol maps to one exception class, split by level:

* :class:`ConnectionLevelError` — the whole connection is gone (320, 402, 501-506,
  530, 540, 541, and 403 when the broker refuses a login or a vhost).
* :class:`ChannelLevelError` — only one channel is gone (311, 312, 313, 403, 404,
  405, 406).

The same classes serve both directions.  When the broker closes us, the error is
built from its Close method and has ``remote=True``.  When *we* detect a protocol
violation in the bytes the broker sent (a bad frame-end octet, an oversized frame),
the codec raises the class of the reply code it will send back, with
``remote=False``.  :class:`ProtocolError` is the base of every "the peer broke the
protocol" class (the 50x codes and 540), so callers that feed bytes into the codec
can catch exactly one type.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AMQPError",
    "AccessRefused",
    "AuthenticationError",
    "ChannelLevelError",
    "ChannelProtocolError",
    "CommandInvalid",
    "ConnectionForced",
    "ConnectionLevelError",
    "ContentTooLarge",
    "FrameError",
    "InternalError",
    "InvalidPath",
    "NoConsumers",
    "NoRoute",
    "NotAllowed",
    "NotFound",
    "NotImplementedByPeer",
    "PreconditionFailed",
    "ProtocolError",
    "ProtocolSyntaxError",
    "ProtocolVersionMismatch",
    "ResourceError",
    "ResourceLocked",
    "UnexpectedFrame",
    "UsageError",
    "channel_error_for",
    "connection_error_for",
]


class AMQPError(Exception):
    """Base class of every error raised by ``ojs_codec`` and ``ojs_anyio``."""


class UsageError(AMQPError, ValueError):
    """Local misuse of the API (wrong state, bad argument).  Nothing was sent.

    The one misuse error of every layer.  It is also a :class:`ValueError`, so code that
    caught the ``ValueError`` some checks raised before keeps working."""


class _ReplyError(AMQPError):
    """An error that carries an AMQP reply code and the method that caused it."""

    reply_code: ClassVar[int] = 0
    reply_name: ClassVar[str] = ""

    def __init__(
        self,
        reply_text: str = "",
        *,
        reply_code: int | None = None,
        class_id: int = 0,
        method_id: int = 0,
        remote: bool = True,
    ) -> None:
        self.reply_text = reply_text
        if reply_code is not None:
            # Only used for codes without a dedicated class; the instance keeps the
            # exact code the broker sent.
            self.code = reply_code
        else:
            self.code = type(self).reply_code
        self.class_id = class_id
        self.method_id = method_id
        self.remote = remote
        super().__init__(self._message())

    @property
    def method_name(self) -> str | None:
        """Name of the AMQP method that caused the error (``"Queue.Declare"``), if any."""
        return method_name(self.class_id, self.method_id)

    def _message(self) -> str:
        where = f" (caused by {self.method_name})" if self.method_name else ""
        who = "broker" if self.remote else "client"
        name = self.reply_name or "REPLY"
        return f"{self.code} {name}: {self.reply_text or 'no reply text'}{where} [closed by {who}]"


class ConnectionLevelError(_ReplyError):
    """The connection was closed (by the broker, or by us on a protocol violation)."""

    reply_name = "CONNECTION_ERROR"


class ChannelLevelError(_ReplyError):
    """One channel was closed by the broker; the connection and other channels carry on."""

    reply_name = "CHANNEL_ERROR"

    def __init__(
        self,
        reply_text: str = "",
        *,
        reply_code: int | None = None,
        class_id: int = 0,
        method_id: int = 0,
        remote: bool = True,
        channel_id: int = 0,
    ) -> None:
        self.channel_id = channel_id
        super().__init__(
            reply_text, reply_code=reply_code, class_id=class_id, method_id=method_id, remote=remote
        )


# --- connection level ------------------------------------------------------


class ConnectionForced(ConnectionLevelError):
    """320: an operator closed the connection, or the broker is shutting down."""

    reply_code = 320
    reply_name = "CONNECTION_FORCED"


class InvalidPath(ConnectionLevelError):
    """402: the virtual host does not exist."""

    reply_code = 402
    reply_name = "INVALID_PATH"


class AuthenticationError(ConnectionLevelError):
    """403 at login: wrong credentials, or no access to the virtual host.

    RabbitMQ reports this with Connection.Close because we advertise the
    ``authentication_failure_close`` capability.
    """

    reply_code = 403
    reply_name = "ACCESS_REFUSED"


class ProtocolError(ConnectionLevelError):
    """The peer broke the AMQP protocol.  The base of the 50x and 540 classes."""

    reply_name = "PROTOCOL_ERROR"


class FrameError(ProtocolError):
    """501: a malformed frame (bad size, bad frame-end octet, oversized frame)."""

    reply_code = 501
    reply_name = "FRAME_ERROR"


class ProtocolSyntaxError(ProtocolError):
    """502: a frame whose fields could not be decoded."""

    reply_code = 502
    reply_name = "SYNTAX_ERROR"


class CommandInvalid(ProtocolError):
    """503: a method that is not valid in the current state."""

    reply_code = 503
    reply_name = "COMMAND_INVALID"


class ChannelProtocolError(ProtocolError):
    """504: a frame on a channel that is not open, or a bad channel number."""

    reply_code = 504
    reply_name = "CHANNEL_ERROR"


class UnexpectedFrame(ProtocolError):
    """505: a frame of the wrong type for the channel's content-assembly state."""

    reply_code = 505
    reply_name = "UNEXPECTED_FRAME"


class ResourceError(ConnectionLevelError):
    """506: the broker lacks the resources to complete the request."""

    reply_code = 506
    reply_name = "RESOURCE_ERROR"


class NotAllowed(ConnectionLevelError):
    """530: the operation is forbidden (for example, a reused channel number)."""

    reply_code = 530
    reply_name = "NOT_ALLOWED"


class NotImplementedByPeer(ProtocolError):
    """540: the peer does not implement the requested functionality."""

    reply_code = 540
    reply_name = "NOT_IMPLEMENTED"


class InternalError(ConnectionLevelError):
    """541: the broker hit an internal error."""

    reply_code = 541
    reply_name = "INTERNAL_ERROR"


class ProtocolVersionMismatch(ProtocolError):
    """The broker answered our protocol header with its own: it does not speak 0-9-1."""

    reply_code = 501
    reply_name = "PROTOCOL_VERSION_MISMATCH"

    def __init__(self, header: bytes) -> None:
        self.header = bytes(header)
        version = ".".join(str(b) for b in self.header[4:8]) if len(self.header) >= 8 else "?"
        self.server_version = version
        super().__init__(
            f"broker rejected AMQP 0-9-1 and offered protocol header {self.header!r} (version {version})",
            remote=True,
        )


# --- channel level ---------------------------------------------------------


class ContentTooLarge(ChannelLevelError):
    """311: the message is too large for the broker to accept."""

    reply_code = 311
    reply_name = "CONTENT_TOO_LARGE"


class NoRoute(ChannelLevelError):
    """312: a mandatory message could not be routed (also the Basic.Return code)."""

    reply_code = 312
    reply_name = "NO_ROUTE"


class NoConsumers(ChannelLevelError):
    """313: an immediate message had no consumer to take it."""

    reply_code = 313
    reply_name = "NO_CONSUMERS"


class AccessRefused(ChannelLevelError):
    """403: the user may not use this resource."""

    reply_code = 403
    reply_name = "ACCESS_REFUSED"


class NotFound(ChannelLevelError):
    """404: the exchange or queue does not exist."""

    reply_code = 404
    reply_name = "NOT_FOUND"


class ResourceLocked(ChannelLevelError):
    """405: the resource is exclusively used by another connection."""

    reply_code = 405
    reply_name = "RESOURCE_LOCKED"


class PreconditionFailed(ChannelLevelError):
    """406: for example, a redeclare with other arguments, or an unknown delivery tag."""

    reply_code = 406
    reply_name = "PRECONDITION_FAILED"


_CONNECTION_CLASSES: dict[int, type[ConnectionLevelError]] = {
    cls.reply_code: cls
    for cls in (
        ConnectionForced,
        InvalidPath,
        AuthenticationError,
        FrameError,
        ProtocolSyntaxError,
        CommandInvalid,
        ChannelProtocolError,
        UnexpectedFrame,
        ResourceError,
        NotAllowed,
        NotImplementedByPeer,
        InternalError,
    )
}

_CHANNEL_CLASSES: dict[int, type[ChannelLevelError]] = {
    cls.reply_code: cls
    for cls in (
        ContentTooLarge,
        NoRoute,
        NoConsumers,
        AccessRefused,
        NotFound,
        ResourceLocked,
        PreconditionFailed,
    )
}


def connection_error_for(
    reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0, *, remote: bool = True
) -> ConnectionLevelError:
    """Build the connection-level exception for a Connection.Close."""
    cls = _CONNECTION_CLASSES.get(reply_code)
    if cls is None:
        return ConnectionLevelError(
            reply_text, reply_code=reply_code, class_id=class_id, method_id=method_id, remote=remote
        )
    return cls(reply_text, class_id=class_id, method_id=method_id, remote=remote)


def channel_error_for(
    reply_code: int,
    reply_text: str,
    class_id: int = 0,
    method_id: int = 0,
    *,
    channel_id: int = 0,
    remote: bool = True,
) -> ChannelLevelError:
    """Build the channel-level exception for a Channel.Close."""
    cls = _CHANNEL_CLASSES.get(reply_code)
    if cls is None:
        return ChannelLevelError(
            reply_text,
            reply_code=reply_code,
            class_id=class_id,
            method_id=method_id,
            remote=remote,
            channel_id=channel_id,
        )
    return cls(reply_text, class_id=class_id, method_id=method_id, remote=remote, channel_id=channel_id)


_CLASS_NAMES = {
    10: "Connection",
    20: "Channel",
    40: "Exchange",
    50: "Queue",
    60: "Basic",
    85: "Confirm",
    90: "Tx",
}
_METHOD_NAMES: dict[tuple[int, int], str] = {
    (10, 10): "Start", (10, 11): "StartOk", (10, 20): "Secure", (10, 21): "SecureOk",
    (10, 30): "Tune", (10, 31): "TuneOk", (10, 40): "Open", (10, 41): "OpenOk",
    (10, 50): "Close", (10, 51): "CloseOk", (10, 60): "Blocked", (10, 61): "Unblocked",
    (20, 10): "Open", (20, 11): "OpenOk", (20, 20): "Flow", (20, 21): "FlowOk",
    (20, 40): "Close", (20, 41): "CloseOk",
    (40, 10): "Declare", (40, 11): "DeclareOk", (40, 20): "Delete", (40, 21): "DeleteOk",
    (40, 30): "Bind", (40, 31): "BindOk", (40, 40): "Unbind", (40, 51): "UnbindOk",
    (50, 10): "Declare", (50, 11): "DeclareOk", (50, 20): "Bind", (50, 21): "BindOk",
    (50, 30): "Purge", (50, 31): "PurgeOk", (50, 40): "Delete", (50, 41): "DeleteOk",
    (50, 50): "Unbind", (50, 51): "UnbindOk",
    (60, 10): "Qos", (60, 11): "QosOk", (60, 20): "Consume", (60, 21): "ConsumeOk",
    (60, 30): "Cancel", (60, 31): "CancelOk", (60, 40): "Publish", (60, 50): "Return",
    (60, 60): "Deliver", (60, 70): "Get", (60, 71): "GetOk", (60, 72): "GetEmpty",
    (60, 80): "Ack", (60, 90): "Reject", (60, 100): "RecoverAsync", (60, 110): "Recover",
    (60, 111): "RecoverOk", (60, 120): "Nack",
    (85, 10): "Select", (85, 11): "SelectOk",
    (90, 10): "Select", (90, 11): "SelectOk", (90, 20): "Commit", (90, 21): "CommitOk",
    (90, 30): "Rollback", (90, 31): "RollbackOk",
}  # fmt: skip


def method_name(class_id: int, method_id: int) -> str | None:
    """``"Queue.Declare"`` for (50, 10); ``None`` for (0, 0)."""
    if not class_id:
        return None
    cls = _CLASS_NAMES.get(class_id, f"Class{class_id}")
    meth = _METHOD_NAMES.get((class_id, method_id), f"Method{method_id}")
    return f"{cls}.{meth}"
