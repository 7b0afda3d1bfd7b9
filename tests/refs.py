"""The reference libraries the tests compare against: torchvision and timm (test-only).

torchvision's PyPI wheel is a CUDA build; installed with ``--no-deps`` beside the CPU torch
its pure-Python parts (transforms v2 and their functional ops) import once the module that
registers its C++ ops' meta kernels is stubbed. timm imports on top of it. Neither is a
fastload dependency: the Makefile installs them for the tests and benchmarks.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest


def stub_meta_registrations() -> None:
    """Lets ``import torchvision`` succeed without its compiled ops (idempotent)."""
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))


def torchvision() -> Any:
    """torchvision, or the test skipped with the reason."""
    stub_meta_registrations()
    return pytest.importorskip("torchvision", reason="torchvision (test-only) is not installed: make test installs it")


def timm() -> Any:
    """timm, or the test skipped with the reason."""
    stub_meta_registrations()
    return pytest.importorskip("timm", reason="timm (test-only) is not installed: make test installs it")
