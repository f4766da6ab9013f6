"""The root conftest: loads the suite's one fixtures plugin, :mod:`support.fixtures`.

``tests/`` is on ``sys.path`` (pytest inserts the rootdir conftest's directory), so tests
import the shared helpers as ``from support.waits import wait_until`` and the harness as
``from harness import FaultProxy``.  Every test folder is a package: a folder's own helpers
are imported relatively (``from .broker_support import running``).
"""

pytest_plugins = ["support.fixtures"]
