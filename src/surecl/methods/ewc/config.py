"""EWC's options (``ewc.*``; before, ``train.ewc_lambda`` / ``train.ewc_samples``, which configs
may still write: :data:`surecl.config.RENAMED`). Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from surecl.options import Options


@dataclass
class EWCConfig(Options):
    """Elastic Weight Consolidation (``method=ewc``)."""

    lam: float = 1000.0
    """Penalty strength lambda: the loss gets ``lam/2 * sum_k F_k (theta - theta*_k)^2``. 1000 is
    not tuned (the first implementation's value): on the tiny stream nothing below 1e8 keeps the
    first task (bench/RESULTS.md §7), on SmolLM2's Standard CL orders it ended 0 to 4.5 FP above
    SeqLoRA (docs/faithfulness.md); sweep it for a comparison."""
    samples: int = 200
    """Training examples per task used to estimate the Fisher."""

    def check(self, section: str) -> None:
        super().check(section)
        self.require(self.lam >= 0, f"{section}.lam", self.lam, "must be >= 0")
        self.require(self.samples >= 1, f"{section}.samples", self.samples, "must be >= 1")
