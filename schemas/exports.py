"""Lazy re-exports for the packages' `__init__.py`: `from engine import run_replay` works, and importing a
package does not import its modules (an executor importing `engine.groups` must not pull in MLflow)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` (PEP 562) resolving each exported name from its module on first use."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
