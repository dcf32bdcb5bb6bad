"""O-LoRA and N-LoRA: a new LoRA per task, the earlier tasks' LoRAs frozen and summed into
every forward, and a penalty on the current task's LoRA; no task id at test time.

* **O-LoRA** (``olora``; Wang et al., 2023, "Orthogonal Subspace Learning for Language Model
  Continual Learning"; code ``cmnfriend/O-LoRA``): the paper's loss of task t gets
  ``lambda_orth * sum_layers sum_{i<t} ||A_i^T A_t||_F^2 + lambda_l2 * ||theta_t||_2^2``, the
  first term pushing the rows of the current A (the input directions the new LoRA reads) to
  be orthogonal to every earlier task's. By default surecl takes the reference code's forms,
  as O-LoRA's numbers were made with them: the entrywise L1 norm of ``A_i A_t^T`` in the first
  term (``olora.orth_norm=l1``) and each tensor's unsquared norm in the second
  (``olora.l2_norm=fro``); ``fro2`` gives the paper's squared forms.
  Options and their sources: :class:`surecl.methods.olora.config.OLoRAConfig` (``olora.*``).
* **N-LoRA** (``nlora``; Yang et al., COLING 2025, "Is Parameter Collision Hindering
  Continual Learning in LLMs?"; code ``PKU-YuanGroup/N-LoRA``): the same setting with
  ``lambda_l1 * sum_layers ||B_t A_t||_1`` (entrywise L1 of the task's update, a sparsity
  penalty) in place of the orthogonality term (:class:`surecl.methods.olora.config.NLoRAConfig`, ``nlora.*``,
  with the form its code takes as an option).

How the LoRAs are kept (shared by both, :class:`TaskLoRAs`): the learner's ``fast`` adapter is
the current task's LoRA, the only one trained. ``setup`` adds a frozen adapter ``past`` of rank
``r * (T - 1)`` for a stream of T tasks, all zeros, with ``lora_alpha = alpha * (T - 1)`` so
that its scaling equals the fast adapter's, kept active beside ``fast`` in every forward
(training, surprise scoring, evaluation, generation, the shared-prefix path;
:meth:`surecl.adapters.DualLoRA.add_frozen_adapter`). When task t > 0 starts, ``before_task``
copies the fast A into rows ``(t-1)r .. tr`` of past's A and the fast B into the same columns
of past's B, so past's update is ``sum_{i<t} B_i A_i`` exactly as the stacked ``lora_A`` /
``lora_B`` of O-LoRA's code; then it draws a fresh fast adapter (random A, zero B) with fresh
AdamW state (O-LoRA runs one process per task). Past's LoRA has no dropout (O-LoRA's code
applies the one dropout mask of the layer input to old and new LoRA alike; in expectation the
same). The saved ``adapters/fast`` is fast and past summed into one PEFT adapter of rank
``r * T`` (:meth:`~surecl.adapters.DualLoRA.save_pretrained`): the weights every task was
evaluated with, loadable with plain ``PeftModel.from_pretrained``.

Replay policies combine with both (the fast LoRA then also trains on replayed examples); the
dual learner does not (each task's LoRA is frozen as trained; an EMA of a LoRA that restarts
every task has no meaning here), and a run asking for it stops with a one-line error.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from surecl.adapters import adaptable_layers, layer_widths, meta_model, names_layer, resolve_targets, task_seed
from surecl.errors import SureclError
from surecl.methods.base import Method, Stage
from surecl.methods.olora.config import NLoRAConfig, OLoRAConfig
from surecl.options import per_task_values

PAST = "past"


def orth_penalty(past_a: torch.Tensor, new_a: torch.Tensor, norm: str = "fro2") -> torch.Tensor:
    """The overlap of the current LoRA's A (``new_a``, PEFT's ``(r, in)``) with the stacked A's
    of earlier tasks (``past_a``, ``(k * r, in)``): the entries of ``past_a @ new_a.T`` are the
    inner products of their rows, the paper's ``A_i^T A_t`` with A as ``(in, r)`` columns.
    ``fro2``: the sum of their squares, ``sum_i ||A_i^T A_t||_F^2`` (the paper); ``l1``: the sum
    of their absolute values (O-LoRA's code). Zero exactly when every row of ``new_a`` is
    orthogonal to every row of ``past_a``."""
    overlap = past_a @ new_a.T
    return overlap.pow(2).sum() if norm == "fro2" else overlap.abs().sum()


def l2_penalty(params: list[torch.Tensor], norm: str = "fro2") -> torch.Tensor:
    """``fro2``: the sum of squares of every entry (the paper's ``||theta_t||_2^2``); ``fro``: the
    Frobenius norm of each tensor, summed (O-LoRA's code, ``torch.norm(param, p=2)``)."""
    if norm == "fro2":
        return sum(p.pow(2).sum() for p in params)
    return sum(torch.linalg.vector_norm(p) for p in params)


class _L1OfProduct(torch.autograd.Function):
    """``||B A||_1`` (entrywise) whose backward recomputes ``B A`` instead of keeping it: the
    ``(out, in)`` product of every layer would otherwise stay alive from the loss to the
    backward (gigabytes for an 8B model's attention projections)."""

    @staticmethod
    def forward(ctx, b: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(b, a)
        return (b @ a).abs().sum()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, a = ctx.saved_tensors
        sign = (b @ a).sign_().mul_(grad)  # d|x|/dx = sign(x), 0 at 0 (as torch.abs)
        return sign @ a.T, b.T @ sign


def l1_of_delta(b: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """``||B A||_1``: the sum of the absolute entries of a LoRA's update (without its scaling),
    N-LoRA's ``||Delta W_t||_1``. Its gradient moves every entry of ``B A`` toward zero."""
    return _L1OfProduct.apply(b, a)


@dataclass
class _Layer:
    """One LoRA-wrapped module: the fast (current task's) A and B, and past's stacked ones."""

    name: str
    fast_a: torch.nn.Parameter
    fast_b: torch.nn.Parameter
    past_a: torch.nn.Parameter | None
    past_b: torch.nn.Parameter | None


class TaskLoRAs(Method):
    """A LoRA per task, earlier ones frozen in the always-on ``past`` adapter (see the module
    docstring); subclasses add their penalty in :meth:`penalty`."""

    name = "task_loras"
    state = ("the earlier tasks' LoRAs (the always-on past adapter)",)
    fresh_optimizer = True  # a fresh LoRA per task, fresh AdamW state with it

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self.layers: list[_Layer] = []
        self.rank = 0
        self.filled = 0
        """Tasks whose LoRA is in the past store (blocks ``0 .. filled - 1``)."""

    @classmethod
    def validate_config(cls, cfg) -> None:
        if cfg.dual.enabled:
            raise SureclError(
                f"dual.enabled: method {cls.name} freezes each task's LoRA as trained and sums them; "
                "it does not combine with the slow (EMA) adapter: set dual.enabled=false"
            )

    def setup(self, ctx) -> None:
        self.validate_config(ctx.cfg)
        from peft.tuners.lora import LoraLayer

        from surecl.adapters import FAST

        n_tasks, r, alpha = len(ctx.tasks), ctx.cfg.lora.r, ctx.cfg.lora.alpha
        if n_tasks > 1:
            ctx.adapters.add_frozen_adapter(PAST, r * (n_tasks - 1), alpha * (n_tasks - 1))
        self.rank = r
        for name, module in ctx.adapters.model.named_modules():
            if isinstance(module, LoraLayer) and FAST in module.lora_A:
                past = PAST in module.lora_A
                self.layers.append(
                    _Layer(
                        name,
                        module.lora_A[FAST].weight,
                        module.lora_B[FAST].weight,
                        module.lora_A[PAST].weight if past else None,
                        module.lora_B[PAST].weight if past else None,
                    )
                )

    @torch.no_grad()
    def before_task(self, ctx, stage: Stage) -> None:
        """From the second task on: the previous task's LoRA (fast) into its block of the past
        store, then a fresh fast LoRA and fresh AdamW state."""
        if stage.row == 0:
            return
        lo, hi = (stage.row - 1) * self.rank, stage.row * self.rank
        for layer in self.layers:
            layer.past_a[lo:hi].copy_(layer.fast_a)
            layer.past_b[:, lo:hi].copy_(layer.fast_b)
        self.filled = stage.row
        ctx.adapters.reset_fast(task_seed(ctx.streams_seed, stage.row, 2))
        ctx.reset_optimizer()

    def penalty(self, ctx) -> torch.Tensor | None:
        """The method's penalty on the current LoRA (None: none this step)."""
        return None

    def loss(self, ctx, loss: torch.Tensor) -> torch.Tensor:
        penalty = self.penalty(ctx)
        return loss if penalty is None else loss + penalty

    def state_dict(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """The filled blocks of the past store, by module name (``<module>/A``, ``<module>/B``)."""
        n = self.filled * self.rank
        tensors = {}
        if n:
            for layer in self.layers:
                tensors[f"{layer.name}/A"] = layer.past_a[:n].detach().cpu().clone()
                tensors[f"{layer.name}/B"] = layer.past_b[:, :n].detach().cpu().clone()
        return {"filled": self.filled}, tensors

    @torch.no_grad()
    def load_state_dict(self, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
        self.filled = meta.get("filled", 0)
        n = self.filled * self.rank
        for layer in self.layers:
            if layer.past_a is None:
                continue
            layer.past_a.zero_()
            layer.past_b.zero_()
            if n:
                layer.past_a[:n].copy_(tensors[f"{layer.name}/A"])
                layer.past_b[:, :n].copy_(tensors[f"{layer.name}/B"])


PEFT_PREFIX = "base_model.model."
"""What PEFT's model puts before the wrapped model's module names."""


def stage_values(ctx, entries: list[str], key: str, default: tuple[float, ...]) -> tuple[float, ...]:
    """The per-task values ``entries`` (``"<task>:<v1>[:<v2>]"``) give the first task of the stage
    being trained that they name, else ``default`` (also outside a run's stage)."""
    stage = getattr(ctx, "stage", None)
    if not entries or stage is None:
        return default
    own = per_task_values(entries, key, len(default))
    for t in stage.tasks:
        if ctx.tasks[t].name in own:
            return own[ctx.tasks[t].name]
    return default


class OLoRA(TaskLoRAs):
    """O-LoRA: orthogonality between the current and every earlier task's A, plus L2 on the
    current LoRA (``olora.*``)."""

    name = "olora"
    Config = OLoRAConfig

    def strengths(self, ctx) -> tuple[float, float]:
        """(lambda_orth, lambda_l2) of the task being trained (``olora.per_task``, else the defaults)."""
        c = self.config
        return stage_values(ctx, c.per_task, "olora.per_task", (c.lambda_orth, c.lambda_l2))

    def penalty(self, ctx) -> torch.Tensor | None:
        c, terms = self.config, []
        lambda_orth, lambda_l2 = self.strengths(ctx)
        if lambda_orth and self.filled:  # the first task has no earlier A
            n = self.filled * self.rank
            terms.append(lambda_orth * sum(orth_penalty(layer.past_a[:n], layer.fast_a, c.orth_norm) for layer in self.layers))
        if lambda_l2:
            terms.append(lambda_l2 * l2_penalty([p for layer in self.layers for p in (layer.fast_a, layer.fast_b)], c.l2_norm))
        return sum(terms) if terms else None


class NLoRA(TaskLoRAs):
    """N-LoRA: L1 (sparsity) on the current task's update ``B_t A_t`` (``nlora.*``; with
    ``nlora.l1_of=ab`` on the code's ``A_t B_t``)."""

    name = "nlora"
    Config = NLoRAConfig

    def setup(self, ctx) -> None:
        super().setup(ctx)
        if self.config.l1_of == "ab":
            self.refuse_unsquare((layer.name.removeprefix(PEFT_PREFIX), layer.fast_a.shape[1], layer.fast_b.shape[0]) for layer in self.layers)

    def check_run_model(self, cfg, config, seq2seq: bool) -> None:
        """``nlora.l1_of=ab`` against the layers ``lora.target_modules`` names in a meta-device
        copy of the model built from its ``config`` (no weights): the dry run's line, the one
        :meth:`setup` says after the model is loaded."""
        super().check_run_model(cfg, config, seq2seq)
        if self.config.l1_of != "ab" or config is None:
            return
        try:
            model = meta_model(config, seq2seq, cfg.model.trust_remote_code)
        except (OSError, ValueError):  # (the dry run's model line says why the model cannot be built)
            return
        targets = resolve_targets(model, list(cfg.lora.target_modules))
        self.refuse_unsquare((name, *layer_widths(module)) for name, module in adaptable_layers(model) if any(names_layer(name, t) for t in targets))

    @staticmethod
    def refuse_unsquare(layers) -> None:
        """One line for the first of ``layers`` (``(name, in width, out width)``, in the model's
        order) that is not square: the code's ``A_t B_t`` is ``(r, in) @ (out, r)``."""
        for name, in_width, out_width in layers:
            if out_width != in_width:
                raise SureclError(
                    f"nlora.l1_of: 'ab' multiplies A (r x in) by B (out x r), which needs in == out, but {name} maps "
                    f"{in_width} to {out_width}; use nlora.l1_of=delta or square lora.target_modules"
                )

    def strength(self, ctx) -> float:
        """lambda_l1 of the task being trained (``nlora.per_task``, else ``nlora.lambda_l1``)."""
        return stage_values(ctx, self.config.per_task, "nlora.per_task", (self.config.lambda_l1,))[0]

    def penalty(self, ctx) -> torch.Tensor | None:
        lam = self.strength(ctx)
        if not lam:
            return None
        if self.config.l1_of == "ab":
            return lam * sum((layer.fast_a @ layer.fast_b).abs().sum() for layer in self.layers)
        return lam * sum(l1_of_delta(layer.fast_b, layer.fast_a) for layer in self.layers)
