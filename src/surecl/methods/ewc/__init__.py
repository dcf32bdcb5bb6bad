"""Elastic Weight Consolidation on the fast LoRA parameters (options ``ewc.*``).

The package is the method: ``method.py`` holds the class (imported on first use, it needs
torch), ``config.py`` its options; ``METHODS`` registers them (:mod:`surecl.registry`)."""

from __future__ import annotations

from surecl.methods.ewc.config import EWCConfig
from surecl.registry import MethodSpec, lazy_attributes

METHODS = (
    MethodSpec("ewc", "surecl.methods.ewc.method:EWC", EWCConfig),
)


__getattr__ = lazy_attributes(__name__, f"{__name__}.method")
