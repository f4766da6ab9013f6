"""Deprecated names kept as aliases: one warning, worded once.

A job's id is ``id`` on every record *of a job* (``Job``, ``JobContext``, ``PendingResult``,
``JobInfo``, ``DeadJob``, ``JobOutcome``), as the OJS envelope names it; ``job_id`` stays for
what *refers to* a job (function parameters, exceptions, ``Fired``, wire formats).  The old
attribute names of the records warn (``DeprecationWarning``) and will be removed in a later
major version.  docs/job-api.md, "Job ids".
"""

from __future__ import annotations

import warnings

__all__ = ["warn_renamed"]


def warn_renamed(owner: str, old: str, new: str) -> None:
    """Warn that ``owner.old`` is deprecated in favour of ``owner.new`` (at the caller's caller)."""
    warnings.warn(
        f"{owner}.{old} is deprecated; use {owner}.{new} (docs/job-api.md, 'Job ids')",
        DeprecationWarning,
        stacklevel=3,
    )
