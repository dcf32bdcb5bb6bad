"""Progressive Prompts: a soft prompt per task (options ``prompts.*``).

The package is the method: ``method.py`` holds the class (imported on first use, it needs
torch), ``config.py`` its options; ``METHODS`` registers them (:mod:`surecl.registry`)."""

from __future__ import annotations

import importlib
from typing import Any

from surecl.methods.progressive_prompts.config import PromptsConfig
from surecl.registry import MethodSpec

METHODS = (
    MethodSpec("progressive_prompts", "surecl.methods.progressive_prompts.method:ProgressivePrompts", PromptsConfig, section="prompts"),
)


def __getattr__(name: str) -> Any:
    """The method module's names (the classes, helpers), imported on first use."""
    module = importlib.import_module("surecl.methods.progressive_prompts.method")
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'surecl.methods.progressive_prompts' has no attribute {name!r}") from None
