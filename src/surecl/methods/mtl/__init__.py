"""Multi-task learning: every task in one stage (the upper bound).

The package is the method: ``method.py`` holds the class (imported on first use, it needs
torch), ``config.py`` its options; ``METHODS`` registers them (:mod:`surecl.registry`)."""

from __future__ import annotations

import importlib
from typing import Any

from surecl.registry import MethodSpec

METHODS = (
    MethodSpec("mtl", "surecl.methods.mtl.method:MultiTask"),
)


def __getattr__(name: str) -> Any:
    """The method module's names (the classes, helpers), imported on first use."""
    module = importlib.import_module("surecl.methods.mtl.method")
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'surecl.methods.mtl' has no attribute {name!r}") from None
