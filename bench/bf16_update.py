"""Why SeqFT refuses a bf16 base (README, "SeqFT"): how many of SmolLM2-135M's weights a
full fine-tuning update of about the learning rate (5e-5, the ``seq_ft`` preset's) cannot move
in bf16. A bf16 weight of magnitude at least 2^-6 is at least 2^-6 * 2^-7 = 1.2e-4 from its
neighbours, so adding 5e-5 rounds back to it. Prints the share of all weight-matrix elements
at or above 2^-6 in magnitude, and for layer 10's ``down_proj`` the share left unchanged by
adding +5e-5 in bf16.

Run: ``python bench/bf16_update.py`` (the embedded SmolLM2-135M, fp32 on load; a few seconds).
"""

from __future__ import annotations

import torch
from common import script

from surecl.model import load_model
from surecl.sections import ModelConfig


def main() -> None:
    loaded = load_model(ModelConfig(name="smollm2-135m", dtype="fp32"), torch.device("cpu"))
    large = total = 0
    for p in loaded.model.parameters():
        if p.dim() < 2:
            continue  # norms' weights: not what a full fine-tuning update of a matrix is about
        w = p.detach()
        large += int((w.abs() >= 2.0**-6).sum())
        total += w.numel()
    print(f"weight-matrix elements with |w| >= 2^-6: {large / total:.1%} of {total:,}")
    down = dict(loaded.model.named_parameters())["model.layers.10.mlp.down_proj.weight"].detach().to(torch.bfloat16)
    moved = (down + torch.tensor(5e-5, dtype=torch.bfloat16)) != down
    print(f"layer 10 down_proj in bf16, + 5e-5: {1 - moved.float().mean().item():.1%} of its weights unchanged")


if __name__ == "__main__":
    script(main)
