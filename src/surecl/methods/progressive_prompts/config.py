"""Progressive Prompts' options (``prompts.*``): defaults from its reference code, checks in
:meth:`check`. Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from surecl.options import Options


@dataclass
class PromptsConfig(Options):
    """Progressive Prompts (``method=progressive_prompts``; Razdaibiedina et al., ICLR 2023): a
    new soft prompt of ``length`` vectors per task, trained with the prompts of the earlier
    tasks (frozen) before it and the base model frozen. Defaults are those of the paper's
    public code (arazd/ProgressivePrompts, ``T5_codebase/train_t5_cl.py``): its T5 setting.
    The paper has no decoder-only model; the same values serve one here (README)."""

    length: int = 10
    """Soft-prompt vectors per task (reference ``--prefix_len 10``, T5 and BERT). After task
    t every input carries t x length virtual tokens, on top of ``model.max_length``."""
    lr: float = 0.3
    """Learning rate of the prompt (and its MLP): replaces ``train.lr`` for this method and
    follows ``train.scheduler`` as ``train.lr`` would (reference ``--lr 0.3``, T5, after
    Lester et al.'s prompt tuning; its BERT runs trained prompts at 3e-5 for 50 epochs)."""
    mlp: bool = False
    """Residual reparameterisation: the prompt the model reads is P + MLP(P), with MLP =
    Linear(d, mlp_hidden) -> ReLU -> Linear(mlp_hidden, d), a fresh one per task trained at
    ``lr`` with it (the reference's ``mlp_lr`` defaults to ``lr``); after the task P + MLP(P)
    is kept (frozen) and the MLP dropped. The reference's ``ResMLP`` of type ``MLP1`` with its
    skip connection, as its BERT codebase builds it (the T5 codebase's ``MLP1`` branch reads
    a ``layer_norm`` flag its constructor does not take; ``MLP2`` is not offered). Off by
    default there (``--prefix_MLP None``)."""
    mlp_hidden: int = 800
    """The MLP's bottleneck width (reference ``--bottleneck_size 800``)."""
    eval: str = "all"
    """Which prompts answer at test time: ``all`` (every prompt learned so far, for every
    task: no task id needed) or ``own`` (task j reads the prompts up to its own,
    [P_j; ...; P_1], as right after it was learned: the task id chooses them; the accuracy
    the paper reports per task, measured right after learning it)."""



    choices: ClassVar[dict[str, tuple[str, ...]]] = {"eval": ("all", "own")}

    def check(self, section: str) -> None:
        super().check(section)
        self.require(self.length >= 1, f"{section}.length", self.length, "must be >= 1")
        self.require(self.lr > 0, f"{section}.lr", self.lr, "must be > 0")
        self.require(self.mlp_hidden >= 1, f"{section}.mlp_hidden", self.mlp_hidden, "must be >= 1")
