"""The job runtime's errors and the handler's verdicts, importable from here as before.

Every error of the job layer now lives in :mod:`ojs_anyio.jobs._errors`, grouped by
meaning; this module re-exports all of them.
"""

from __future__ import annotations

from ._errors import *  # noqa: F403
from ._errors import __all__ as __all__
