"""The misuse errors every layer above ``amqp`` raises: a leaf (no project module but the
AMQP layer's public ``UsageError``), so jobs, events and the shared handler pipeline raise
the same classes."""

from __future__ import annotations

from ojs_anyio.amqp import UsageError

__all__ = ["ArgumentTypeError", "UsageError"]


class ArgumentTypeError(UsageError, TypeError):
    """An argument has the wrong type (a :class:`UsageError` and a ``TypeError``)."""
