"""Fixtures of the comm engine tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def native_built():
    """The C++ compression kernels, built once here, not in each spawned rank (or the fallback reason)."""
    import native_ops

    native_ops.load(build=True)  # build once here, not in each spawned rank
    if native_ops.backend() != "native":
        print(f"native_ops unavailable ({native_ops.fallback_reason()}); hooks use the torch reference")
