"""I-LoRA's options (``ilora.*``), with the values of its reference code, EasyCL
(``ECNU-ICALK/EasyCL``, ``src/easycl/hparams/cl_finetuning_args.py``). Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from surecl.options import Options


@dataclass
class ILoRAConfig(Options):
    """I-LoRA (``method=ilora``; Ren et al., 2024, "Analyzing and Reducing Catastrophic Forgetting
    in Parameter Efficient Tuning"): a plastic LoRA trained by SGD, a stable LoRA that follows it
    by EMA (surecl's fast and slow adapters: the ``ilora`` preset sets ``dual.beta=0.75`` per
    step, EasyCL's ``ema_alpha`` 0.25 weighting the plastic side), and a consistency loss pulling
    the plastic model's hidden states toward the stable one's on every row of a step, new and
    replayed."""

    consistency_weight: float = 1.0
    """Weight of the consistency term added to the loss (EasyCL ``consistency_weight`` 1.0)."""
    layers: str = "-1,-2,-3"
    """Which hidden states the term compares, comma-separated indices into the model's
    ``hidden_states`` (embeddings first; -1 the last layer's output), each compared by the mean
    squared error over every position and feature and the layers averaged (EasyCL
    ``hidden_state_layers`` [-1, -2, -3], ``nn.MSELoss(reduction='mean')``)."""

    def indices(self) -> list[int]:
        return [int(part) for part in str(self.layers).split(",") if part.strip()]

    def check(self, section: str) -> None:
        super().check(section)
        self.require(self.consistency_weight >= 0, f"{section}.consistency_weight", self.consistency_weight, "must be >= 0")
        try:
            ok = len(self.indices()) > 0
        except ValueError:
            ok = False
        self.require(ok, f"{section}.layers", self.layers, "must be comma-separated whole numbers, e.g. -1,-2,-3")
