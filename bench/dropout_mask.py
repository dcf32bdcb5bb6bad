"""LoRA dropout on the CPU: PEFT's ``nn.Dropout`` (one Bernoulli draw per element) vs surecl's
``LoraDropout`` (four 16-bit uniforms from each 64-bit random word), forward and backward on
one activation the size of a training slice's (1230 tokens x 576), with the drop rate each one
gave: median of 50 rounds, the two masks in turn in each (after 5 warm-up runs each), so a drift
of the machine's speed reaches both alike.

Usage: cd bench && python dropout_mask.py
"""

from __future__ import annotations

import torch
from common import interleaved_medians

from surecl.adapters import LoraDropout


def main() -> None:
    x = torch.randn(1230, 576, requires_grad=True)
    print(f"mask over {x.shape[0]} x {x.shape[1]}, p 0.1, {torch.get_num_threads()} threads, median of 50 rounds, the masks in turn")
    drops = {"nn.Dropout": torch.nn.Dropout(0.1), "LoraDropout": LoraDropout(0.1)}
    for drop in drops.values():
        drop.train()
    medians = interleaved_medians([lambda d=drop: d(x).sum().backward() for drop in drops.values()], 50, warmup=5)
    times = dict(zip(drops, medians))
    for name, drop in drops.items():
        with torch.no_grad():
            rate = (drop(x) == 0).float().mean().item()
        print(f"{name:12s} {1e3 * times[name]:7.3f} ms forward + backward   dropped {rate:.4f}")
    print(f"LoraDropout x{times['nn.Dropout'] / times['LoraDropout']:.2f}")


if __name__ == "__main__":
    main()
