"""The handler pipeline that jobs and events share: one copy of each rule.

* **Registration** (:func:`check_callable`): a handler is an ``async def`` function (or
  anything whose call is a coroutine function: a bound async method, a
  ``functools.partial`` of one, an object with ``async def __call__``), which runs in the
  caller's task, or a plain ``def`` function (or bound method, or partial of one), which
  runs in a worker thread (:func:`call`).  Anything else (a class, a generator function,
  an object with a plain ``__call__``, something not callable) is refused with an
  :class:`ArgumentTypeError` that says what to write instead.
* **Conversion by annotation** (:func:`target_type`, :func:`convert`,
  :func:`json_decoder`): JSON values become what a parameter is annotated with:
  ``msgspec`` for Structs, dataclasses, TypedDicts, ``datetime``, ``UUID`` and
  containers; pydantic models when pydantic is installed (an optional dependency: nothing
  here imports it; a class derived from ``pydantic.BaseModel`` means it is loaded).
  ``Any``, ``object`` and missing annotations are left alone.  A value that does not fit
  is a :class:`ConversionError` whose message names the field.
* **Calls** (:func:`call`): a coroutine function is awaited; a plain function runs in a
  worker thread bounded by a capacity limiter, and returning an awaitable from it is an
  error (it was meant to be ``async def``).
* **Logging rules** (:func:`log_failed_attempt`, :func:`log_dead_letter`): each failed
  attempt at WARNING with the traceback, each dead letter at ERROR with it, both with the
  caller's ``extra``.
* **Metrics** (:func:`duration_histogram`): the duration buckets both layers record.
* **Middleware** (:func:`check_middleware`, :func:`hooks`, :func:`around_chain`,
  :func:`context_chain`): each layer has its own ``Middleware`` base class whose hooks pass
  straight through; the chains are built from the hooks a middleware overrides only (the
  first middleware is the outermost), so a hook left alone costs nothing, and with no hook
  at all a layer calls its publish or its handler directly.
* **Timeouts**: the one wording of "an attempt ran past its timeout", whatever enforced it,
  is ``_attempts.timeout_reason`` (pure, so the job layer's ``decide()`` can use it).

No AMQP, no jobs, no events: both layers build on it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar, cast

import anyio.to_thread
import msgspec
from opentelemetry import metrics

from ._misuse import ArgumentTypeError

__all__ = [
    "DURATION_BUCKETS",
    "ConversionError",
    "around_chain",
    "call",
    "check_callable",
    "check_middleware",
    "context_chain",
    "convert",
    "duration_histogram",
    "error_text",
    "handler_name",
    "hooks",
    "json_decoder",
    "log_dead_letter",
    "log_failed_attempt",
    "model_json",
    "namespace",
    "result_converter",
    "target_type",
    "unwrap_partial",
]

#: How much of an error's text goes into a reason, a header or a log line.
MAX_ERROR_TEXT: Final = 1000


class ConversionError(ValueError):
    """A value does not fit the annotated type; the message names the field."""


def error_text(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, capped at :data:`MAX_ERROR_TEXT` characters."""
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_TEXT]


# ---------------------------------------------------------------- registration


def unwrap_partial(fn: Any) -> Any:
    """The function that will actually run: through ``functools.partial`` layers."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def check_callable(where: str, fn: Any) -> bool:
    """Check ``fn`` as a handler; return whether it is a coroutine function (else it runs
    in a thread).  ``where`` starts the error message (``"handler for 'email.send'"``)."""
    if not callable(fn):
        raise ArgumentTypeError(
            f"{where} must be an async def or def function, not {type(fn).__name__} ({fn!r})"
        )
    target = unwrap_partial(fn)
    if isinstance(target, type):
        raise ArgumentTypeError(
            f"{where} is the class {target.__qualname__}: a handler must be a function; "
            "register a function (or a method of an instance) instead"
        )
    if inspect.isasyncgenfunction(target) or inspect.isgeneratorfunction(target):
        raise ArgumentTypeError(
            f"{where} ({getattr(target, '__qualname__', target)!r}) is a generator function: "
            "a handler must return (or raise), not yield"
        )
    if inspect.iscoroutinefunction(fn):
        return True
    if inspect.isfunction(target) or inspect.ismethod(target) or inspect.isbuiltin(target):
        return False
    if inspect.iscoroutinefunction(getattr(type(target), "__call__", None)):  # noqa: B004
        return True
    raise ArgumentTypeError(
        f"{where} ({fn!r}) is neither a coroutine function (async def) nor a plain function (def); "
        "wrap it in an `async def` or a `def` function"
    )


def namespace(fn: Any) -> dict[str, Any]:
    """The globals that string annotations (``from __future__ import annotations``) refer to."""
    target = unwrap_partial(fn)
    if not (inspect.isfunction(target) or inspect.ismethod(target)):
        target = getattr(type(target), "__call__", target)  # noqa: B004
    target = inspect.unwrap(getattr(target, "__func__", target))
    return dict(getattr(target, "__globals__", {}))


# ---------------------------------------------------------------- conversion


def _pydantic_model(tp: Any) -> bool:
    """Whether ``tp`` is a pydantic model class (pydantic is loaded if one exists)."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(tp, type) and issubclass(tp, pydantic.BaseModel)


def model_json(value: Any) -> Any:
    """msgspec's ``enc_hook`` for what it does not know: a pydantic model as its JSON form
    (``model_dump(mode="json")``, the model's own serialisation rules); anything else is
    refused with ``NotImplementedError`` (msgspec's signal)."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and hasattr(type(value), "model_fields"):
        return dump(mode="json")
    raise NotImplementedError(f"{type(value).__name__} has no JSON form")


def result_converter(tp: Any) -> Callable[[Any], Any] | None:
    """A function turning a job's JSON result back into ``tp`` (a handler's return
    annotation), or None for ``Any``/``None``/a type variable.  pydantic models, and types
    that hold them (``list[Model]``), are validated with pydantic's own rules (a
    ``pydantic.ValidationError`` when the value breaks them); other types with msgspec,
    lax about strings for numbers and dates as JSON is (``msgspec.ValidationError``)."""
    if tp in (Any, None, type(None)) or isinstance(tp, TypeVar):
        return None
    if _pydantic_model(tp):
        return cast(Callable[[Any], Any], tp.model_validate)
    if _holds_model(tp):
        return cast(Callable[[Any], Any], sys.modules["pydantic"].TypeAdapter(tp).validate_python)
    try:
        msgspec.json.Decoder(tp)
    except TypeError:
        return None  # a type msgspec cannot build: the JSON value as it came
    return lambda value: msgspec.convert(value, tp, strict=False)


def _holds_model(tp: Any, depth: int = 0) -> bool:
    """Whether ``tp`` is or holds a pydantic model (``list[Model]``, ``dict[str, Model]``,
    ``Model | None``…)."""
    if _pydantic_model(tp):
        return True
    return depth < 10 and any(_holds_model(arg, depth + 1) for arg in typing.get_args(tp))


def target_type(where: str, name: str, annotation: Any, globalns: Mapping[str, Any]) -> Any | None:
    """What a parameter's value is converted to, or None (leave it as it is).

    A string annotation is resolved in ``globalns``; one that cannot be, or a type that
    cannot be built from a JSON value, is refused with :class:`ArgumentTypeError`."""
    tp = annotation
    if tp is inspect.Parameter.empty:
        return None
    if isinstance(tp, str):
        try:
            tp = eval(tp, dict(globalns))
        except Exception as exc:
            raise ArgumentTypeError(
                f"{where}: the annotation {annotation!r} of parameter {name!r} cannot be resolved "
                f"({type(exc).__name__}: {exc}); values are converted to the annotated types, so the "
                "name must exist at module level when the handler is registered (or annotate it Any)"
            ) from None
    if tp is Any or tp is object:
        return None
    if _pydantic_model(tp):
        return tp
    try:
        msgspec.json.Decoder(tp)  # refuses types msgspec cannot build
    except TypeError as exc:
        raise ArgumentTypeError(
            f"{where}: parameter {name!r} is annotated {tp!r}, which cannot be built from a JSON value "
            f"({exc}); annotate it with a JSON-compatible type (str, int, datetime, UUID, a msgspec "
            "Struct, a dataclass, a TypedDict, a pydantic model…) or Any"
        ) from None
    return tp


def _pydantic_reason(exc: Any) -> str:
    """A pydantic ``ValidationError`` as ``field: message; …`` (the fields named)."""
    parts = []
    for error in exc.errors()[:10]:
        where = ".".join(str(part) for part in error.get("loc", ())) or "$"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts)


def convert(value: Any, tp: Any) -> Any:
    """``value`` (a JSON value) as ``tp``; raises :class:`ConversionError` naming the field."""
    if _pydantic_model(tp):
        try:
            return tp.model_validate(value)
        except sys.modules["pydantic"].ValidationError as exc:
            raise ConversionError(_pydantic_reason(exc)) from None
    try:
        return msgspec.convert(value, tp)
    except msgspec.ValidationError as exc:
        raise ConversionError(str(exc)) from None


def json_decoder(tp: Any) -> Callable[[bytes], Any]:
    """A function decoding JSON bytes into ``tp``; every failure (not JSON, not UTF-8,
    nested too deep, a field that does not fit) is a :class:`ConversionError` whose text
    names the problem (``ValidationError: Expected `int`, got `str` - at `$.age```)."""
    if _pydantic_model(tp):
        validate = tp.model_validate_json
        pydantic_error = sys.modules["pydantic"].ValidationError

        def decode_model(body: bytes) -> Any:
            try:
                return validate(body)
            except pydantic_error as exc:
                raise ConversionError(f"ValidationError: {_pydantic_reason(exc)}"[:MAX_ERROR_TEXT]) from None
            except (UnicodeDecodeError, RecursionError) as exc:
                raise ConversionError(error_text(exc)) from None

        return decode_model
    decode = msgspec.json.Decoder(tp).decode

    def decode_struct(body: bytes) -> Any:
        try:
            return decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError) as exc:
            raise ConversionError(error_text(exc)) from None

    return decode_struct


# ---------------------------------------------------------------- calls


def _in_thread(name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Runs in the worker thread: the handler, and a check that it returned no awaitable."""
    result = fn(*args)
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never awaited: don't leave a "never awaited" warning behind
        raise ArgumentTypeError(
            f"handler {name} is a plain function that returned an awaitable "
            f"({type(result).__name__}); declare it `async def` so it is awaited"
        )
    return result


def handler_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


async def call(
    fn: Callable[..., Any], is_async: bool, args: tuple[Any, ...], limiter: anyio.CapacityLimiter | None
) -> Any:
    """Call a handler checked by :func:`check_callable`: await a coroutine function, run a
    plain function in a worker thread (at most ``limiter``'s tokens at once).  A thread
    cannot be interrupted: a cancellation waits for it to return."""
    if is_async:
        return await fn(*args)
    return await anyio.to_thread.run_sync(_in_thread, handler_name(fn), fn, args, limiter=limiter)


# ---------------------------------------------------------------- logging and metrics


def log_failed_attempt(
    logger: logging.Logger, exc: BaseException | None, extra: Mapping[str, Any], msg: str, *args: Any
) -> None:
    """A failed attempt that will be tried again: WARNING, with the traceback of ``exc``."""
    logger.warning(msg, *args, exc_info=exc, extra=dict(extra))


def log_dead_letter(
    logger: logging.Logger, exc: BaseException | None, extra: Mapping[str, Any], msg: str, *args: Any
) -> None:
    """A dead letter (no more attempts): ERROR, with the traceback of ``exc`` when there is one."""
    logger.error(msg, *args, exc_info=exc, extra=dict(extra))


#: Bucket bounds for handler durations, in seconds (the SDK's default bounds suit
#: milliseconds: every handler under 5 s would share one bucket).
DURATION_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
)  # fmt: skip


def duration_histogram(meter: metrics.Meter, name: str, description: str) -> metrics.Histogram:
    """A histogram of handler durations in seconds, with :data:`DURATION_BUCKETS`."""
    try:
        return meter.create_histogram(
            name, unit="s", description=description, explicit_bucket_boundaries_advisory=DURATION_BUCKETS
        )
    except TypeError:  # opentelemetry-api before 1.23 has no bucket advice
        return meter.create_histogram(name, unit="s", description=description)


# ---------------------------------------------------------------- middleware

T = TypeVar("T")
R = TypeVar("R")
C = TypeVar("C")
M = TypeVar("M")

#: ``hook(value, call_next)``: an around-hook that passes ``value`` (or another) on.
AroundHook = Callable[[T, Callable[[T], Awaitable[R]]], Awaitable[R]]
#: ``hook(ctx, call_next)``: an around-hook whose ``call_next`` takes nothing.
ContextHook = Callable[[C, Callable[[], Awaitable[R]]], Awaitable[R]]
#: ``run(ctx, call_handler)``: every :data:`ContextHook` of a chain around ``call_handler``.
ContextChain = Callable[[C, Callable[[], Awaitable[R]]], Awaitable[R]]


def check_middleware(middleware: Sequence[M] | None, base: type[M], public_name: str) -> tuple[M, ...]:
    """Validate a ``middleware=`` argument: a list of ``base`` instances (``public_name``,
    as users import it, goes into the error)."""
    if middleware is None:
        return ()
    if isinstance(middleware, base) or not isinstance(middleware, Sequence):
        raise ArgumentTypeError(f"middleware must be a list of {public_name} instances")
    for mw in middleware:
        if not isinstance(mw, base):
            hint = " (an instance, not the class)" if isinstance(mw, type) else ""
            raise ArgumentTypeError(f"middleware items must be {public_name} instances{hint}, got {mw!r}")
    return tuple(middleware)


def overrides(mw: object, base: type, name: str) -> bool:
    """Whether ``mw`` overrides ``base``'s hook ``name`` (hooks left alone cost nothing)."""
    return getattr(type(mw), name) is not getattr(base, name)


def hooks(middleware: Sequence[object], base: type, name: str) -> list[Any]:
    """The bound hook ``name`` of each middleware that overrides ``base``'s, in order."""
    default = getattr(base, name)
    return [getattr(mw, name) for mw in middleware if getattr(type(mw), name) is not default]


def around_chain(
    chain_hooks: Sequence[AroundHook[T, R]], inner: Callable[[T], Awaitable[R]]
) -> Callable[[T], Awaitable[R]]:
    """``inner`` wrapped by every hook (the first is the outermost); ``inner`` itself when
    there is no hook."""
    chain = inner
    for hook in reversed(chain_hooks):
        chain = _around_link(hook, chain)
    return chain


def _around_link(hook: AroundHook[T, R], inner: Callable[[T], Awaitable[R]]) -> Callable[[T], Awaitable[R]]:
    async def link(value: T) -> R:
        return await hook(value, inner)

    return link


def context_chain(chain_hooks: Sequence[ContextHook[C, R]]) -> ContextChain[C, R] | None:
    """A function ``(ctx, call_handler) -> result`` running every hook around
    ``call_handler`` (the first is the outermost), or None when there is no hook: call the
    handler directly."""
    if not chain_hooks:
        return None
    ordered = tuple(reversed(chain_hooks))

    async def run(ctx: C, call_handler: Callable[[], Awaitable[R]]) -> R:
        call = call_handler
        for hook in ordered:
            call = _context_link(hook, ctx, call)
        return await call()

    return run


def _context_link(
    hook: ContextHook[C, R], ctx: C, inner: Callable[[], Awaitable[R]]
) -> Callable[[], Awaitable[R]]:
    def link() -> Awaitable[R]:
        return hook(ctx, inner)

    return link
