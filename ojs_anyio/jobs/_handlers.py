"""What a worker learns about a handler when it is registered, and the argument conversion.

A handler is ``fn(ctx, *args)``:

* an ``async def`` function (or anything whose call is a coroutine function: a bound async
  method, a ``functools.partial`` of one, an object with ``async def __call__``) runs in
  the worker's task;
* a plain ``def`` function (or bound method, or ``functools.partial`` of one) runs in a
  worker thread through ``anyio.to_thread.run_sync``, bounded by the worker's concurrency.

Anything else is refused at registration (``ojs_anyio._pipeline.check_callable``, the
rule jobs and events share).

Arguments arrive as JSON values.  When a handler's parameters after ``ctx`` are annotated,
each argument is converted to and validated against its annotation by the shared pipeline
(``datetime`` and ``UUID`` from their strings, Structs, dataclasses, TypedDicts,
``list[int]``, pydantic models…); a mismatch is an :class:`ArgumentsError` naming the
parameter, which the worker dead-letters as INVALID_ARGS.  ``Any``, ``object`` and missing
annotations are left alone.  An annotation msgspec cannot build from JSON is refused at
registration.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import _pipeline
from .._misuse import ArgumentTypeError

__all__ = ["ArgumentsError", "HandlerSpec", "inspect_handler"]

#: Annotations whose values need no conversion when the argument already has that exact type.
_PLAIN = (str, int, float, bool)


class ArgumentsError(ValueError):
    """A job's arguments do not fit the handler's parameters; the message names the parameter."""


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A registered handler, inspected once."""

    fn: Callable[..., Any]
    signature: inspect.Signature
    #: ``(min, max)`` positional arguments (ctx included; max may be infinite), or None when
    #: a keyword-only parameter without a default makes a positional call fail.
    arity: tuple[int, float] | None
    is_async: bool
    #: (parameter name, type) for each positional parameter after ctx that is annotated
    #: with something to convert to; None in a slot means "leave as it is".
    params: tuple[tuple[str, Any] | None, ...]
    #: (name, type) of ``*args`` when it is annotated, else None.
    var: tuple[str, Any] | None
    #: Whether any argument is converted at all (else :meth:`convert` returns args as they are).
    converts: bool = False
    #: ``len(params)``, worked out once.
    n_params: int = 0

    @property
    def name(self) -> str:
        return _pipeline.handler_name(self.fn)

    def convert(self, args: list[Any]) -> list[Any]:
        """``args`` converted to the annotated types; raises :class:`ArgumentsError`."""
        if not self.converts or not args:
            return args
        params, var, n_params = self.params, self.var, self.n_params
        out = list(args)
        for i, value in enumerate(args):
            slot = params[i] if i < n_params else var
            if slot is None:
                continue
            name, tp = slot
            if tp in _PLAIN and type(value) is tp:
                continue
            try:
                out[i] = _pipeline.convert(value, tp)
            except _pipeline.ConversionError as exc:
                where = f"*{name}[{i - n_params}]" if i >= n_params else name
                raise ArgumentsError(
                    f"parameter {where!r} (args[{i}]) of {self.name}: {exc} (the value was {_short(value)})"
                ) from None
        return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def inspect_handler(job_type: str, fn: Any) -> HandlerSpec:
    """Check ``fn`` as a handler for ``job_type`` and work out how to call it."""
    where = f"handler for {job_type!r}"
    is_async = _pipeline.check_callable(where, fn)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ArgumentTypeError(f"{where}: cannot read its signature ({exc})") from None
    positional = [
        p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    var_param = next((p for p in signature.parameters.values() if p.kind is p.VAR_POSITIONAL), None)
    if not positional and var_param is None:
        raise ArgumentTypeError(f"{where} takes no positional parameter: it must accept the JobContext first")
    namespace = _pipeline.namespace(fn)
    params = tuple(_slot(where, p, namespace) for p in positional[1:])
    var = _slot(where, var_param, namespace) if var_param is not None else None
    converts = var is not None or any(slot is not None for slot in params)
    return HandlerSpec(
        fn,
        signature,
        arity=_positional_arity(signature),
        is_async=is_async,
        params=params,
        var=var,
        converts=converts,
        n_params=len(params),
    )


def _slot(where: str, param: inspect.Parameter, namespace: dict[str, Any]) -> tuple[str, Any] | None:
    """What to convert ``param``'s argument to; only the parameters after ctx are looked at,
    so ctx's annotation may be anything (even a name imported under TYPE_CHECKING)."""
    tp = _pipeline.target_type(where, param.name, param.annotation, namespace)
    return None if tp is None else (param.name, tp)


def _positional_arity(signature: inspect.Signature) -> tuple[int, float] | None:
    """``(min, max)`` positional arguments a handler takes (``max`` may be infinite), or
    ``None`` when a keyword-only parameter without a default makes positional calls fail."""
    low, high = 0, 0.0
    for param in signature.parameters.values():
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            high += 1
            if param.default is param.empty:
                low += 1
        elif param.kind is param.VAR_POSITIONAL:
            high = math.inf
        elif param.kind is param.KEYWORD_ONLY and param.default is param.empty:
            return None
    return low, high
