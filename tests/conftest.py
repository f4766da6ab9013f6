"""Shared fixtures for the whole test suite.

``tests/`` is on ``sys.path`` (pytest inserts a rootdir conftest's directory), so test modules
import the harness as ``from harness import FaultProxy``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.tls import TLSMaterial, make_ca_and_cert

# ---------------------------------------------------------------------- async backends
# Every @pytest.mark.anyio test runs on asyncio (in debug mode) and on Trio.


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"debug": True}), id="asyncio"),
        pytest.param("trio", id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


# ---------------------------------------------------------------------- TLS material


@pytest.fixture(scope="session")
def tls_material(tmp_path_factory: pytest.TempPathFactory) -> TLSMaterial:
    """A CA, a server cert (localhost, 127.0.0.1) and a client cert, written to a temp dir."""
    directory: Path = tmp_path_factory.mktemp("tls")
    return make_ca_and_cert("localhost", directory)
