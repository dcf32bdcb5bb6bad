"""Per-task fine-tuning: fresh adapters per task, each task answered by its own.

The package is the method: ``method.py`` holds the class (imported on first use, it needs
torch), ``config.py`` its options; ``METHODS`` registers them (:mod:`surecl.registry`)."""

from __future__ import annotations

from surecl.registry import MethodSpec, lazy_attributes

METHODS = (
    MethodSpec("per_task", "surecl.methods.per_task.method:PerTask"),
)


__getattr__ = lazy_attributes(__name__, f"{__name__}.method")
