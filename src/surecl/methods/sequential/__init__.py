"""Sequential LoRA fine-tuning (SeqLoRA; with a replay policy and/or the dual learner: ER, SuRe, Slow SuRe).

The package is the method: ``method.py`` holds the class (imported on first use, it needs
torch), ``config.py`` its options; ``METHODS`` registers them (:mod:`surecl.registry`)."""

from __future__ import annotations

from surecl.registry import MethodSpec, lazy_attributes

METHODS = (
    MethodSpec("sequential", "surecl.methods.sequential.method:Sequential"),
)


__getattr__ = lazy_attributes(__name__, f"{__name__}.method")
