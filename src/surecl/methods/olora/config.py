"""O-LoRA's and N-LoRA's options (``olora.*``, ``nlora.*``): defaults from their reference code,
checks in :meth:`check`. Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from surecl.options import Options, per_task_values


@dataclass
class OLoRAConfig(Options):
    """O-LoRA (method ``olora``; Wang et al., 2023, "Orthogonal Subspace Learning for Language
    Model Continual Learning", code ``cmnfriend/O-LoRA``): a new LoRA per task, earlier tasks'
    LoRAs frozen and summed into every forward, and the loss of task t gets
    ``lambda_orth * sum_layers sum_{i<t} orth(A_i, A_t) + lambda_l2 * l2(theta_t)``.

    The defaults are its code's, as its scripts pair them: ``scripts/order_1.sh`` ..
    ``order_3.sh`` of ``cmnfriend/O-LoRA`` pass ``--lamda_1 0.5 --lamda_2 0`` for every task,
    and ``src/uie_trainer_lora.py`` (``training_step``, lines 91-109) weighs with them the L1
    form ``torch.abs(torch.mm(A_i, A_t.T)).sum()`` and the unsquared ``torch.norm(param, p=2)``.
    The paper's formulas (squared Frobenius norms) are ``orth_norm=fro2`` and ``l2_norm=fro2``;
    with them lambda 0.5 weighs far less (the squares of the small entries of A_i A_t^T)."""

    lambda_orth: float = 0.5
    """lambda_1: weight of the orthogonality penalty between the current task's LoRA A and
    every earlier task's (0.5 in O-LoRA's scripts)."""
    lambda_l2: float = 0.0
    """lambda_2: weight of the L2 penalty on the current task's LoRA A and B (0 in O-LoRA's
    scripts, so the term is off by default)."""
    orth_norm: str = "l1"
    """``l1`` (default): the code's ``torch.abs(torch.mm(A_i, A_t.T)).sum()`` (the sum of the
    overlap's absolute entries); ``fro2``: the paper's ``||A_i^T A_t||_F^2`` (squared Frobenius norm of the overlap of
    the two subspaces)."""
    per_task: list[str] = field(default_factory=list)
    """Per-task strengths, ``"<task>:<lambda_orth>:<lambda_l2>"`` each (e.g. ``MNLI:0.5:0``);
    a task not named takes ``lambda_orth`` / ``lambda_l2``. O-LoRA's 15-task script
    (``scripts/long.sh``) sets them per task; the ``olora_long`` preset carries its values."""
    l2_norm: str = "fro"
    """``fro`` (default): the code's ``torch.norm(param, p=2)`` summed over the LoRA tensors
    (a norm per tensor, not squared); ``fro2``: the paper's ``||theta_t||_2^2`` (sum of
    squares of the current LoRA's entries)."""



    choices: ClassVar[dict[str, tuple[str, ...]]] = {"orth_norm": ("fro2", "l1"), "l2_norm": ("fro2", "fro")}

    def check(self, section: str) -> None:
        super().check(section)
        self.require(self.lambda_orth >= 0, f"{section}.lambda_orth", self.lambda_orth, "must be >= 0")
        self.require(self.lambda_l2 >= 0, f"{section}.lambda_l2", self.lambda_l2, "must be >= 0")
        per_task_values(self.per_task, f"{section}.per_task", 2)


@dataclass
class NLoRAConfig(Options):
    """N-LoRA (method ``nlora``; Yang et al., COLING 2025, "Is Parameter Collision Hindering
    Continual Learning in LLMs?", code ``PKU-YuanGroup/N-LoRA``): O-LoRA's setting (a new
    LoRA per task, earlier ones frozen and summed into every forward) with an L1 (sparsity)
    penalty on the current task's update in place of the orthogonality term:
    ``lambda_l1 * sum_layers ||B_t A_t||_1`` (entrywise, the paper's ``||Delta W_t||_1``).

    Sources: the official repository ``PKU-YuanGroup/N-LoRA`` (``7301afe``; docs/faithfulness.md
    cites it by line): ``src/uie_trainer_lora.py`` adds
    ``lamda_1 * torch.norm(torch.mm(loranew_A, loranew_B), p=1)`` per layer and
    ``scripts_T5/order_1.sh`` passes ``--lamda_1 0.4``."""

    lambda_l1: float = 1.0e-4
    """Weight of the sparsity penalty. 0.4, the T5 script's above, belongs to the code's
    ``(r, r)`` form (``l1_of=ab``: give it with that form); the paper's form sums ``out x in``
    entries, and with it 0.4 stops all learning on SmolLM2-135M (studies/smollm2, order s1:
    every task 0 to 25.5 %, dbpedia 0.0 after training on it). 1e-4 is the strongest of 1e-3, 1e-4, 1e-5 measured there
    whose tasks were still learned within 5 points of SeqLoRA's (RESULTS.md, "The rival
    baselines"); under AdamW an L1 gradient does not fade near zero, so measure on a new
    setting before a long run."""
    per_task: list[str] = field(default_factory=list)
    """Per-task strengths, ``"<task>:<lambda_l1>"`` each; a task not named takes ``lambda_l1``."""
    l1_of: str = "delta"
    """``delta``: the paper's ``||B_t A_t||_1``, the sum of the absolute entries of the task's
    ``(out, in)`` update (without the LoRA scaling); ``ab``: the code's ``||A_t B_t||_1`` with
    PEFT's shapes (A ``(r, in)``, B ``(out, r)``): an ``(r, r)`` product, defined only where a
    module's input and output widths are equal (a run with another module stops with an
    error)."""

    choices: ClassVar[dict[str, tuple[str, ...]]] = {"l1_of": ("delta", "ab")}

    def check(self, section: str) -> None:
        super().check(section)
        self.require(self.lambda_l1 >= 0, f"{section}.lambda_l1", self.lambda_l1, "must be >= 0")
        per_task_values(self.per_task, f"{section}.per_task", 1)
