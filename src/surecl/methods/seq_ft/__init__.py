"""SeqFT: full fine-tuning of the base model, task after task.

The package is the method: ``method.py`` holds the class (imported on first use, it needs
torch), ``config.py`` its options; ``METHODS`` registers them (:mod:`surecl.registry`)."""

from __future__ import annotations

from surecl.registry import MethodSpec, lazy_attributes

METHODS = (
    MethodSpec("seq_ft", "surecl.methods.seq_ft.method:SeqFT"),
)


__getattr__ = lazy_attributes(__name__, f"{__name__}.method")
