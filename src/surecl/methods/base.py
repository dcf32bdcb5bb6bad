"""The method hooks: what a continual-learning method may change in the one training loop.

A method is a small class with these hooks (all optional), called by :mod:`surecl.trainer`:

* ``stages(n)``          - which tasks each training stage covers (sequential: one each;
  MTL: all at once). Stage ``s`` fills row ``row`` of the accuracy matrix.
* ``before_task``        - e.g. fresh adapters (per-task FT), a new LoRA head (O-LoRA).
* ``loss``               - add a penalty to the step loss (EWC, O-LoRA orthogonality).
* ``after_step``         - per-step bookkeeping (online boundary-free scoring).
* ``after_task``         - e.g. Fisher estimate (EWC), snapshot an adapter (per-task FT).
* ``eval_context``       - which weights answer for task ``j`` at evaluation.
* ``state_dict`` / ``load_state_dict`` - JSON + tensors for checkpoints.

Replay policies and the dual learner are orthogonal to the method and combine with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Stage:
    tasks: tuple[int, ...]
    """Task indices whose training data this stage trains on."""
    row: int
    """Accuracy-matrix row filled after the stage."""
    evaluate: tuple[int, ...]
    """Task indices evaluated after the stage."""


class Method:
    name = "base"
    continual = True
    """False for MTL: no intermediate rows, no forgetting to measure."""
    fast_eval = True
    """Whether a dual run may also evaluate its fast adapter (``eval.fast``): False where
    the method swaps the evaluation weights itself (per-task FT)."""

    def __init__(self, run) -> None:
        self.run = run

    def stages(self, n_tasks: int) -> list[Stage]:
        return [Stage((t,), t, tuple(range(t + 1))) for t in range(n_tasks)]

    def before_task(self, stage: Stage) -> None:
        pass

    def loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def after_step(self) -> None:
        pass

    def after_task(self, stage: Stage) -> None:
        pass

    @contextlib.contextmanager
    def eval_context(self, task: int) -> Iterator[None]:
        yield

    def state_dict(self) -> tuple[dict, dict[str, torch.Tensor]]:
        return {}, {}

    def load_state_dict(self, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
        pass
