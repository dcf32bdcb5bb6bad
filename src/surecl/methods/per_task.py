"""Per-task fine-tuning: fresh adapters for each task; each task is evaluated with its own.

No forgetting by construction; the reference for what each task reaches alone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from surecl.methods.base import Method, Stage


class PerTask(Method):
    name = "per_task"
    fast_eval = False

    def __init__(self, run) -> None:
        super().__init__(run)
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}

    def before_task(self, stage: Stage) -> None:
        if stage.row > 0:
            self.run.adapters.reset_fast()
            self.run.reset_optimizer()
            if self.run.adapters.dual.enabled:
                self.run.adapters.sync_slow_to_fast()

    def after_task(self, stage: Stage) -> None:
        self.snapshots[stage.row] = self.run.adapters.adapter_state(self.run.adapters.eval_adapter)

    @contextlib.contextmanager
    def eval_context(self, task: int) -> Iterator[None]:
        adapters = self.run.adapters
        current = adapters.adapter_state(adapters.eval_adapter)
        adapters.load_adapter_state(self.snapshots[task])
        try:
            yield
        finally:
            adapters.load_adapter_state(current)

    def state_dict(self) -> tuple[dict, dict[str, torch.Tensor]]:
        tensors = {f"snap{t}/{k}": v for t, snap in self.snapshots.items() for k, v in snap.items()}
        return {"snapshots": sorted(self.snapshots)}, tensors

    def load_state_dict(self, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
        self.snapshots = {t: {} for t in meta.get("snapshots", [])}
        for key, value in tensors.items():
            t, name = key.split("/", 1)
            self.snapshots[int(t[4:])][name] = value
