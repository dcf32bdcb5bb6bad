"""Multi-task learning: every task in one stage (the upper bound).

The package is the method: ``method.py`` holds the class (imported on first use, it needs
torch), ``config.py`` its options; ``METHODS`` registers them (:mod:`surecl.registry`)."""

from __future__ import annotations

from surecl.registry import MethodSpec, lazy_attributes

METHODS = (
    MethodSpec("mtl", "surecl.methods.mtl.method:MultiTask"),
)


__getattr__ = lazy_attributes(__name__, f"{__name__}.method")
