"""Per-task fine-tuning: fresh adapters for each task; each task is evaluated with its own.

No forgetting by construction; the reference for what each task reaches alone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from surecl.adapters import task_seed
from surecl.methods.base import Method, Stage


class PerTask(Method):
    name = "per_task"
    answers = "own"  # each task's snapshot answers (eval_context); no fast row in a dual run
    state = ("each task's adapter snapshot",)
    fresh_optimizer = True  # a fresh adapter per task, fresh AdamW state with it

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}

    def before_task(self, ctx, stage: Stage) -> None:
        if stage.row > 0:
            ctx.adapters.reset_fast(task_seed(ctx.streams_seed, stage.row, 2))
            ctx.reset_optimizer()
            if ctx.adapters.dual.enabled:
                ctx.adapters.sync_slow_to_fast()

    def after_task(self, ctx, stage: Stage) -> None:
        self.snapshots[stage.row] = ctx.adapters.adapter_state(ctx.adapters.eval_adapter)

    @contextlib.contextmanager
    def eval_context(self, ctx, task: int) -> Iterator[None]:
        """Task ``task``'s own adapter answers (before any training, e.g. the ``eval.before``
        row, there is none yet and the weights stay as they are)."""
        if task not in self.snapshots:
            yield
            return
        adapters = ctx.adapters
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
