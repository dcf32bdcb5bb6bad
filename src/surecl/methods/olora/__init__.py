"""O-LoRA and N-LoRA: a new LoRA per task, earlier ones frozen (options ``olora.*``, ``nlora.*``).

The package is the method: ``method.py`` holds the class (imported on first use, it needs
torch), ``config.py`` its options; ``METHODS`` registers them (:mod:`surecl.registry`)."""

from __future__ import annotations

import importlib
from typing import Any

from surecl.methods.olora.config import NLoRAConfig, OLoRAConfig
from surecl.registry import MethodSpec

METHODS = (
    MethodSpec("olora", "surecl.methods.olora.method:OLoRA", OLoRAConfig),
    MethodSpec("nlora", "surecl.methods.olora.method:NLoRA", NLoRAConfig),
)


def __getattr__(name: str) -> Any:
    """The method module's names (the classes, helpers), imported on first use."""
    module = importlib.import_module("surecl.methods.olora.method")
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'surecl.methods.olora' has no attribute {name!r}") from None
