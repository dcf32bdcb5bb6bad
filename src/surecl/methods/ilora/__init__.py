"""I-LoRA: a plastic and a stable (EMA) LoRA with a hidden-state consistency loss on new and
replayed rows (options ``ilora.*``; EasyCL's I-LoRA, docs/faithfulness.md).

The package is the method: ``method.py`` holds the class (imported on first use, it needs
torch), ``config.py`` its options; ``METHODS`` registers them (:mod:`surecl.registry`)."""

from __future__ import annotations

import importlib
from typing import Any

from surecl.methods.ilora.config import ILoRAConfig
from surecl.registry import MethodSpec

METHODS = (MethodSpec("ilora", "surecl.methods.ilora.method:ILoRA", ILoRAConfig),)


def __getattr__(name: str) -> Any:
    """The method module's names (the class, helpers), imported on first use."""
    module = importlib.import_module("surecl.methods.ilora.method")
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'surecl.methods.ilora' has no attribute {name!r}") from None
