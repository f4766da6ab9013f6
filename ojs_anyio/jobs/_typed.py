"""Typed job handles: a handler registered once, pushed with arguments mypy checks.

::

    @worker.job("email.send", queue="email")
    async def send_email(ctx: ojs.JobContext, to: str, template: str = "welcome") -> None: ...

    await send_email.push(client, "a@b.c", template="welcome")   # checked against the handler
    await send_email.options(delay=30, priority=5).push(client, "a@b.c")

The handle's parameter list is the handler's, less the leading :class:`JobContext`
(``ParamSpec`` + ``Concatenate``), so a wrong argument type, a missing argument or a typo'd
keyword is a type error at the call site instead of an ``INVALID_ARGS`` dead letter.

OJS carries a job's arguments as a positional JSON array, so keyword arguments are bound to
their positions with the handler's signature (defaults of skipped parameters filled in).
Handlers of typed jobs therefore cannot have keyword-only or ``**kwargs`` parameters: that
is refused when the handler is registered.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, cast, overload

import msgspec

from .._pipeline import model_json, result_converter
from ._durations import DurationLike
from ._errors import ArgumentTypeError
from ._retry import RetryPolicy

if TYPE_CHECKING:
    from ._client import Client
    from ._context import JobContext
    from ._envelope import Job
    from ._results import PendingResult
    from ._sync import SyncClient, SyncPendingResult

__all__ = ["JobDecorator", "JobHandle", "PushOptions"]

P = ParamSpec("P")
R = TypeVar("R")

#: The push options a handle carries (the keyword arguments of :meth:`Client.push`).
_OPTION_NAMES = frozenset(
    {
        "queue",
        "priority",
        "timeout",
        "retry",
        "meta",
        "scheduled_at",
        "delay",
        "expires_at",
        "idempotency_key",
    }
)


class PushOptions(dict[str, Any]):
    """The keyword arguments a :class:`JobHandle` passes to :meth:`Client.push`."""


class JobHandle(Generic[P, R]):
    """A job type bound to its handler: ``push()`` takes exactly the handler's arguments.

    Calling the handle calls the handler itself (useful in unit tests).
    """

    __slots__ = ("_positional", "_signature", "fn", "push_options", "type")

    def __init__(
        self,
        job_type: str,
        fn: Callable[Concatenate[JobContext, P], Any],
        push_options: PushOptions,
        *,
        _signature: inspect.Signature | None = None,
    ) -> None:
        self.type = job_type
        self.fn = fn
        self.push_options = push_options
        signature = _signature if _signature is not None else inspect.signature(fn)
        check_typed_signature(job_type, signature)
        self._signature = signature
        self._positional = [p.name for p in list(signature.parameters.values())[1:]]

    def __repr__(self) -> str:
        return f"<JobHandle {self.type!r} queue={self.push_options.get('queue', 'default')!r}>"

    def __call__(self, ctx: JobContext, *args: P.args, **kwargs: P.kwargs) -> Any:
        return self.fn(ctx, *args, **kwargs)

    def options(
        self,
        *,
        queue: str | None = None,
        priority: int | None = None,
        timeout: int | None = None,
        retry: RetryPolicy | None = None,
        meta: dict[str, Any] | None = None,
        scheduled_at: datetime | None = None,
        delay: timedelta | float | str | None = None,
        expires_at: datetime | None = None,
        idempotency_key: str | None = None,
    ) -> JobHandle[P, R]:
        """A copy of this handle whose pushes use these options (over the handle's own)."""
        given = {
            "queue": queue,
            "priority": priority,
            "timeout": timeout,
            "retry": retry,
            "meta": meta,
            "scheduled_at": scheduled_at,
            "delay": delay,
            "expires_at": expires_at,
            "idempotency_key": idempotency_key,
        }
        merged = PushOptions(self.push_options)
        merged.update({k: v for k, v in given.items() if v is not None})
        return JobHandle(self.type, self.fn, merged, _signature=self._signature)

    def args_for(self, *args: Any, **kwargs: Any) -> list[Any]:
        """The OJS ``args`` array for a call: keywords bound to their positions, each value
        in the JSON form the worker turns back into the parameter's annotated type (see
        :func:`json_form`)."""
        try:
            bound = self._signature.bind(None, *args, **kwargs)
        except TypeError as exc:
            raise ArgumentTypeError(f"job {self.type!r}: {exc}") from None
        bound.apply_defaults()
        names = list(self._signature.parameters)[1:]
        return [
            json_form(value, f"{names[i]} of job {self.type!r}") for i, value in enumerate(bound.args[1:])
        ]

    @overload
    def push(self, client: SyncClient, *args: P.args, **kwargs: P.kwargs) -> Job: ...
    @overload
    def push(self, client: Client, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, Job]: ...
    def push(self, client: Client | SyncClient, *args: P.args, **kwargs: P.kwargs) -> Any:
        """PUSH this job with these arguments; returns the job once the broker confirmed it.

        ``await handle.push(client, ...)`` with a :class:`Client`; ``handle.push(sync_client,
        ...)`` blocks with a :class:`SyncClient` (Django, scripts)."""
        return client.push(self.type, self.args_for(*args, **kwargs), **self.push_options)

    @overload
    def push_for_result(
        self, client: SyncClient, *args: P.args, **kwargs: P.kwargs
    ) -> SyncPendingResult[R]: ...
    @overload
    def push_for_result(
        self, client: Client, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, PendingResult[R]]: ...
    def push_for_result(self, client: Client | SyncClient, *args: P.args, **kwargs: P.kwargs) -> Any:
        """PUSH it asking for its result: ``await (await h.push_for_result(c, ...)).result()``,
        or ``h.push_for_result(sync_client, ...).result(timeout=30)`` with a :class:`SyncClient`.

        The result is converted to the handler's return annotation (a ``datetime``, a
        Struct, a dataclass with msgspec; a pydantic model, or a type holding one, validated
        with pydantic's own rules), so it comes back typed as the handler said."""
        options = dict(self.push_options)
        key = options.pop("idempotency_key", None)
        job = client.build(self.type, self.args_for(*args, **kwargs), **options)
        return client.push_job_for_result(job, idempotency_key=key, convert=self._result_converter())

    @overload
    def result(self, client: SyncClient, job_id: str, *, timeout: DurationLike = 30.0) -> R: ...
    @overload
    def result(
        self, client: Client, job_id: str, *, timeout: DurationLike = 30.0
    ) -> Coroutine[Any, Any, R]: ...
    def result(self, client: Client | SyncClient, job_id: str, *, timeout: DurationLike = 30.0) -> Any:
        """The result of job ``job_id`` of this type, from any process (:meth:`Client.result`,
        asking the workers of the handle's queue), converted to the handler's return
        annotation as :meth:`push_for_result` converts it: a pydantic model is validated with
        its own rules.  ``await h.result(client, job_id)``, or ``h.result(sync_client,
        job_id)``, which blocks."""
        queue = self.push_options.get("queue") or "default"
        convert = self._result_converter()
        got = client.result(job_id, queue=queue, timeout=timeout)
        if not inspect.isawaitable(got):
            return got if convert is None else convert(got)

        async def converted() -> R:
            value = await got
            return cast(R, value) if convert is None else convert(value)

        return converted()

    def _result_converter(self) -> Callable[[Any], R] | None:
        try:
            wanted = typing.get_type_hints(self.fn).get("return", Any)
        except Exception:  # an annotation that does not resolve: hand back the JSON as is
            return None
        return cast("Callable[[Any], R] | None", result_converter(wanted))


def json_form(value: Any, where: str) -> Any:
    """``value`` as JSON values, the way the worker's conversion by annotation reads it back:
    ``date``/``datetime``/``time`` as ISO 8601, ``UUID`` and ``Decimal`` as strings, msgspec
    Structs, dataclasses and pydantic models as objects, enums as their values, tuples and
    sets as arrays.  Plain JSON values pass unchanged."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    try:
        return msgspec.to_builtins(value, enc_hook=model_json)
    except (NotImplementedError, TypeError) as exc:
        raise ArgumentTypeError(f"argument {where}: {exc}") from None


def check_typed_signature(job_type: str, signature: inspect.Signature) -> None:
    """Refuse handler signatures whose arguments cannot travel as a positional array."""
    params = list(signature.parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise ArgumentTypeError(
            f"job {job_type!r}: the handler's first parameter must take the JobContext positionally"
        )
    for p in params[1:]:
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD):
            raise ArgumentTypeError(
                f"job {job_type!r}: parameter {p.name!r} is keyword-only; OJS job arguments are a "
                "positional array, so a typed job's parameters must be positional (drop the '*')"
            )


def validate_options(options: dict[str, Any]) -> PushOptions:
    unknown = set(options) - _OPTION_NAMES
    if unknown:
        raise ArgumentTypeError(f"unknown push option(s): {', '.join(sorted(unknown))}")
    return PushOptions({k: v for k, v in options.items() if v is not None})


class JobDecorator(Protocol):
    """What ``Worker.job(...)`` returns: turns a handler into a :class:`JobHandle`."""

    @overload
    def __call__(self, fn: Callable[Concatenate[JobContext, P], Awaitable[R]], /) -> JobHandle[P, R]: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[JobContext, P], R], /) -> JobHandle[P, R]: ...
