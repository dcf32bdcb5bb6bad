"""Progressive Prompts: a soft prompt per task (options ``prompts.*``).

The package is the method: ``method.py`` holds the class (imported on first use, it needs
torch), ``config.py`` its options; ``METHODS`` registers them (:mod:`surecl.registry`)."""

from __future__ import annotations

from surecl.methods.progressive_prompts.config import PromptsConfig
from surecl.registry import MethodSpec, lazy_attributes

METHODS = (
    MethodSpec("progressive_prompts", "surecl.methods.progressive_prompts.method:ProgressivePrompts", PromptsConfig, section="prompts"),
)


__getattr__ = lazy_attributes(__name__, f"{__name__}.method")
