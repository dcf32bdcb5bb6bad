"""I-LoRA's options (``ilora.*``), with the values of its reference code, EasyCL
(``ECNU-ICALK/EasyCL``, ``src/easycl/hparams/cl_finetuning_args.py``). Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

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
    """Weight of the consistency term added to the loss (EasyCL ``consistency_weight`` 1.0;
    the authors' ``reg_weight`` 1.0)."""
    layers: str = "-1,-2,-3"
    """Which hidden states the term compares, comma-separated indices into the model's
    ``hidden_states`` (embeddings first; -1 the last layer's output), or ``all``; each compared
    by the mean squared error over every position and feature and the layers averaged (EasyCL
    ``hidden_state_layers`` [-1, -2, -3], ``nn.MSELoss(reduction='mean')``; the authors' code,
    ``which47/LLMCL`` ``method/ILORA.py``: every hidden state)."""
    rows: str = "all"
    """Which rows of a step the term runs on: ``all`` (new and replayed, EasyCL) or
    ``replayed`` (the buffer's rows only, the authors' code)."""
    target: str = "stable"
    """What the plastic side is pulled toward: ``stable`` (the EMA adapter's hidden states,
    EasyCL) or ``max`` (their element-wise maximum with the plastic's own, the authors' code:
    ``torch.where(plastic > stable, plastic, stable)``, so only features below the stable
    model's are pulled up)."""

    def indices(self) -> list[int] | None:
        """The hidden states compared (None: all of them)."""
        if str(self.layers).strip() == "all":
            return None
        return [int(part) for part in str(self.layers).split(",") if part.strip()]

    choices: ClassVar[dict[str, tuple[str, ...]]] = {"rows": ("all", "replayed"), "target": ("stable", "max")}

    def check(self, section: str) -> None:
        super().check(section)
        self.require(self.consistency_weight >= 0, f"{section}.consistency_weight", self.consistency_weight, "must be >= 0")
        try:
            picks = self.indices()
            ok = picks is None or len(picks) > 0
        except ValueError:
            ok = False
        self.require(ok, f"{section}.layers", self.layers, "must be comma-separated whole numbers, e.g. -1,-2,-3, or all")
