"""The job runtime's errors and the handler's verdicts, importable from here as before.

Every error of the job layer lives in :mod:`ojs_anyio.jobs._errors`, grouped by meaning,
and the verdicts in :mod:`ojs_anyio.jobs._verdicts`; this module re-exports both.
"""

from __future__ import annotations

from ._errors import *  # noqa: F403
from ._errors import __all__ as _errors_all
from ._verdicts import *  # noqa: F403
from ._verdicts import __all__ as _verdicts_all

__all__ = [*_errors_all, *_verdicts_all]
