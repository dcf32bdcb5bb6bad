"""I-LoRA: a plastic and a stable (EMA) LoRA with a hidden-state consistency loss on new and
replayed rows (options ``ilora.*``; EasyCL's I-LoRA, docs/faithfulness.md).

The package is the method: ``method.py`` holds the class (imported on first use, it needs
torch), ``config.py`` its options; ``METHODS`` registers them (:mod:`surecl.registry`)."""

from __future__ import annotations

from surecl.methods.ilora.config import ILoRAConfig
from surecl.registry import MethodSpec, lazy_attributes

METHODS = (MethodSpec("ilora", "surecl.methods.ilora.method:ILoRA", ILoRAConfig),)


__getattr__ = lazy_attributes(__name__, f"{__name__}.method")
