"""Import ``module:attribute`` the way uvicorn and celery do: the current directory first."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any, TypeVar

from ._common import EXIT_APP, EXIT_USAGE, CLIError

T = TypeVar("T")


def load_object(spec: str, kind: type[T], *, show_traceback: bool = False) -> T:
    """The ``kind`` instance named by ``spec`` (``module:attribute``; ``attribute`` may be
    dotted, and may be a factory called with no arguments).

    The current directory goes first on ``sys.path``, so ``ojs-anyio worker app:worker``
    works from the app's own directory.
    """
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise CLIError(f"expected module:attribute (e.g. myapp.jobs:worker), got {spec!r}", EXIT_USAGE)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise CLIError(
                f"cannot import {module_name!r} (from {spec}): no module named {exc.name!r} "
                f"in {cwd} or on the Python path",
                EXIT_APP,
            ) from None
        raise _import_error(spec, exc, show_traceback) from None
    except Exception as exc:
        raise _import_error(spec, exc, show_traceback) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CLIError(f"module {module_name!r} has no attribute {attr!r}", EXIT_APP) from None
    if callable(obj) and not isinstance(obj, kind) and not isinstance(obj, type):
        try:
            obj = obj()
        except Exception as exc:
            raise _import_error(spec, exc, show_traceback, calling=True) from None
    if not isinstance(obj, kind):
        raise CLIError(
            f"{spec} is a {type(obj).__name__}, "
            f"not an ojs_anyio.{kind.__name__} (or a function returning one)",
            EXIT_APP,
        )
    return obj


def _import_error(spec: str, exc: BaseException, show: bool, calling: bool = False) -> CLIError:
    if show:
        traceback.print_exception(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    what = "calling" if calling else "importing"
    return CLIError(
        f"{what} {spec} raised {type(exc).__name__}: {exc}{where} (--traceback shows the traceback)", EXIT_APP
    )
