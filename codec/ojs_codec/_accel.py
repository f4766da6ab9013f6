"""Whether the optional C extension :mod:`ojs_codec._speedups` is in use.

It is used when it was built (``setup.py`` builds it when a C compiler is available)
and the environment variable ``OJS_CODEC_PURE`` is not ``1``.  Otherwise the
pure-Python code runs; it is also the reference the C code is tested against.
"""

from __future__ import annotations

import os


def _load() -> bool:
    if os.environ.get("OJS_CODEC_PURE") == "1":
        return False
    try:
        from . import _speedups  # noqa: F401
    except ImportError:
        return False
    return True


SPEEDUPS: bool = _load()
"""True when the hot path runs in C."""
