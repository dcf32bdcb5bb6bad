"""Elastic Weight Consolidation (Kirkpatrick et al., 2017) on the fast LoRA parameters.

After each task the diagonal (empirical) Fisher information of the adapter parameters is
estimated from squared per-example gradients of the task's loss (``ewc.samples``
examples); while later tasks train, the loss gets
``lambda/2 * sum_k F_k (theta - theta*_k)^2`` summed over past tasks, merged into one running
Fisher-weighted anchor so the per-step cost does not grow with the number of tasks.
"""

from __future__ import annotations

import torch

from surecl.methods.base import Method, Stage
from surecl.methods.ewc.config import EWCConfig
from surecl.nll import token_nll


class EWC(Method):
    name = "ewc"
    state = ("the Fisher information", "the anchor weights")
    Config = EWCConfig

    def __init__(self, config: EWCConfig | None = None) -> None:
        super().__init__(config)
        self.fisher: list[torch.Tensor] = []
        self.anchor: list[torch.Tensor] = []

    def loss(self, ctx, loss: torch.Tensor) -> torch.Tensor:
        if not self.fisher:
            return loss
        params = ctx.adapters.fast_params
        if self.fisher[0].device != params[0].device:  # restored from a checkpoint (CPU tensors)
            self.fisher = [f.to(params[0].device) for f in self.fisher]
            self.anchor = [a.to(params[0].device) for a in self.anchor]
        penalty = sum((f * (p - a) ** 2).sum() for f, p, a in zip(self.fisher, params, self.anchor))
        return loss + 0.5 * self.config.lam * penalty

    def after_task(self, ctx, stage: Stage) -> None:
        params = ctx.adapters.fast_params
        fisher = [torch.zeros_like(p) for p in params]
        items = ctx.train_sets[stage.row][: self.config.samples]
        # Empirical Fisher: the mean of *per-example* squared gradients, with dropout off. The
        # square of a batch-mean gradient is no estimate of it: once a task is learned the
        # per-example gradients are small and cancel, and that square is orders of magnitude
        # smaller (bench/ewc_lambda.py on the tiny stream: no effect on forgetting up to lambda = 1e6).
        was_training = ctx.model.training
        ctx.model.eval()
        try:
            for item in items:
                nll, count = token_nll(ctx.model, ctx.batch([item]), scope="label", is_seq2seq=ctx.is_seq2seq)
                grads = torch.autograd.grad(nll.sum() / count.sum().clamp(min=1), params, allow_unused=True)
                for f, g in zip(fisher, grads):
                    if g is not None:
                        f.add_(g.detach() ** 2)
        finally:
            ctx.model.train(was_training)
        fisher = [f / max(len(items), 1) for f in fisher]
        current = [p.detach().clone() for p in params]
        if not self.fisher:
            self.fisher, self.anchor = fisher, current
            return
        # One quadratic with the same gradient as the sum of both: F = F1 + F2,
        # anchor = (F1 a1 + F2 a2) / F.
        total = [f1 + f2 for f1, f2 in zip(self.fisher, fisher)]
        self.anchor = [(f1 * a1 + f2 * a2) / t.clamp(min=1e-12) for f1, a1, f2, a2, t in zip(self.fisher, self.anchor, fisher, current, total)]
        self.fisher = total

    def state_dict(self) -> tuple[dict, dict[str, torch.Tensor]]:
        tensors = {f"fisher/{i}": f for i, f in enumerate(self.fisher)}
        tensors.update({f"anchor/{i}": a for i, a in enumerate(self.anchor)})
        return {"n": len(self.fisher)}, tensors

    def load_state_dict(self, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
        n = meta.get("n", 0)
        self.fisher = [tensors[f"fisher/{i}"] for i in range(n)]
        self.anchor = [tensors[f"anchor/{i}"] for i in range(n)]
