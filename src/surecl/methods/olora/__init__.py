"""O-LoRA and N-LoRA: a new LoRA per task, earlier ones frozen (options ``olora.*``, ``nlora.*``).

The package is the method: ``method.py`` holds the class (imported on first use, it needs
torch), ``config.py`` its options; ``METHODS`` registers them (:mod:`surecl.registry`)."""

from __future__ import annotations

from surecl.methods.olora.config import NLoRAConfig, OLoRAConfig
from surecl.registry import MethodSpec, lazy_attributes

METHODS = (
    MethodSpec("olora", "surecl.methods.olora.method:OLoRA", OLoRAConfig),
    MethodSpec("nlora", "surecl.methods.olora.method:NLoRA", NLoRAConfig),
)


__getattr__ = lazy_attributes(__name__, f"{__name__}.method")
