"""Per-task fine-tuning: fresh adapters per task, each task answered by its own.

The package is the method: ``method.py`` holds the class (imported on first use, it needs
torch), ``config.py`` its options; ``METHODS`` registers them (:mod:`surecl.registry`)."""

from __future__ import annotations

import importlib
from typing import Any

from surecl.registry import MethodSpec

METHODS = (
    MethodSpec("per_task", "surecl.methods.per_task.method:PerTask"),
)


def __getattr__(name: str) -> Any:
    """The method module's names (the classes, helpers), imported on first use."""
    module = importlib.import_module("surecl.methods.per_task.method")
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'surecl.methods.per_task' has no attribute {name!r}") from None
