"""A progress bar for long dead-letter operations.

tqdm draws it when installed (the ``cli`` extra) and stderr is a terminal; otherwise a
plain line on a terminal, updated at most every half second.  Nothing is drawn when
stderr is not a terminal (logs, scripts) or with ``--json``.
"""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    def __init__(self, total: int, label: str, *, enabled: bool = True) -> None:
        self.total = total
        self.label = label
        self.enabled = enabled and sys.stderr.isatty() and total > 0
        self._bar: Any = None
        self._last = 0.0
        self._done = 0
        if self.enabled:
            try:
                from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]
            except ImportError:
                return
            self._bar = tqdm(total=total, desc=label, unit="job", file=sys.stderr, leave=True)

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(done - self._done)
        else:
            now = time.monotonic()
            if now - self._last >= 0.5 or done >= self.total:
                self._last = now
                sys.stderr.write(f"\r{self.label}: {done}/{self.total}")
                sys.stderr.flush()
        self._done = done

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        elif self._done:
            sys.stderr.write(f"\r{self.label}: {self._done}/{self.total}\n")
            sys.stderr.flush()
