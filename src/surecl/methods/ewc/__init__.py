"""Elastic Weight Consolidation on the fast LoRA parameters (options ``ewc.*``).

The package is the method: ``method.py`` holds the class (imported on first use, it needs
torch), ``config.py`` its options; ``METHODS`` registers them (:mod:`surecl.registry`)."""

from __future__ import annotations

import importlib
from typing import Any

from surecl.methods.ewc.config import EWCConfig
from surecl.registry import MethodSpec

METHODS = (
    MethodSpec("ewc", "surecl.methods.ewc.method:EWC", EWCConfig),
)


def __getattr__(name: str) -> Any:
    """The method module's names (the classes, helpers), imported on first use."""
    module = importlib.import_module("surecl.methods.ewc.method")
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'surecl.methods.ewc' has no attribute {name!r}") from None
