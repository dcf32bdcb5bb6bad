"""SeqFT: full fine-tuning of the base model, task after task.

The package is the method: ``method.py`` holds the class (imported on first use, it needs
torch), ``config.py`` its options; ``METHODS`` registers them (:mod:`surecl.registry`)."""

from __future__ import annotations

import importlib
from typing import Any

from surecl.registry import MethodSpec

METHODS = (
    MethodSpec("seq_ft", "surecl.methods.seq_ft.method:SeqFT"),
)


def __getattr__(name: str) -> Any:
    """The method module's names (the classes, helpers), imported on first use."""
    module = importlib.import_module("surecl.methods.seq_ft.method")
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'surecl.methods.seq_ft' has no attribute {name!r}") from None
