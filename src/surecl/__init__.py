"""surecl: continual learning of language models with surprise-prioritised replay (SuRe) and
a fast/slow dual LoRA learner.

The public face::

    import surecl
    cfg = surecl.build_config("tiny,slow_surprise", ["replay.buffer_size=20"])
    results = surecl.run(cfg, "runs/api")          # or surecl.ContinualRun(cfg, out).run()
    from surecl.config import TrainConfig
    cfg = surecl.RunConfig(train=TrainConfig(lr=1e-4))  # validated on construction: SureclError

    class Frozen(surecl.Method): ...                  # plugin hooks: surecl.plugins.base
    surecl.register_method("frozen", Frozen)          # now method=frozen (and replay.policy= via register_policy)

Names are imported on first use (PEP 562): ``run`` and ``ContinualRun`` pull in torch,
transformers and peft (about 5 s on a 2-core CPU), which ``surecl --help`` and
``surecl list`` need not pay for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "ContinualRun", "Example", "Method", "MethodSpec", "Options", "Plugin", "PolicySpec", "QuotaPolicy", "ReplayPolicy", "RunConfig", "Stage", "StepRecord", "SureclError", "Task", "__version__",
    "build_config", "register_method", "register_policy", "run",
]

_LAZY = {
    "run": "surecl.trainer",
    "ContinualRun": "surecl.trainer",
    "RunConfig": "surecl.config",
    "build_config": "surecl.config",
    "SureclError": "surecl.errors",
    "Task": "surecl.data.task",
    "Example": "surecl.data.task",
    "register_method": "surecl.registry",
    "register_policy": "surecl.registry",
    "MethodSpec": "surecl.registry",
    "PolicySpec": "surecl.registry",
    "Options": "surecl.options",
    "Plugin": "surecl.plugins.base",
    "Stage": "surecl.plugins.base",
    "StepRecord": "surecl.plugins.base",
    "Method": "surecl.methods.base",
    "ReplayPolicy": "surecl.replay.policies",
    "QuotaPolicy": "surecl.replay.policies",
}

if TYPE_CHECKING:  # for type checkers and IDEs; at run time these load on first use
    from surecl.config import RunConfig, build_config
    from surecl.errors import SureclError
    from surecl.methods.base import Method
    from surecl.options import Options
    from surecl.plugins.base import Plugin, Stage, StepRecord
    from surecl.registry import MethodSpec, PolicySpec, register_method, register_policy
    from surecl.replay.policies import QuotaPolicy, ReplayPolicy
    from surecl.trainer import ContinualRun, run


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from surecl._version import version

        value = version()
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'surecl' has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
