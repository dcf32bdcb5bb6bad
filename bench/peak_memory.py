"""Which phase sets the peak memory: surprise scoring (whole-sequence logits over the
vocabulary) or a training step (activations kept for the backward pass), each measured as the
peak RSS of its own process on the 32 longest of 64 real examples.

Usage: cd bench && python peak_memory.py score|train [dtype] [micro_batch_tokens]
"""

from __future__ import annotations

import resource
import sys

from common import load, real_items

from surecl.adapters import DualLoRA
from surecl.config import DualConfig, LoraConfig
from surecl.data.encode import collate, micro_batches
from surecl.nll import token_nll
from surecl.replay.surprise import score_examples


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def main() -> None:
    phase = sys.argv[1]
    dtype = sys.argv[2] if len(sys.argv) > 2 else "fp32"
    budget = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    m = load(dtype)
    items = sorted(real_items(m.tokenizer, 64), key=len)[-32:]
    print(f"model loaded: peak {peak_gb():.2f} GB", flush=True)
    ad = DualLoRA(m.model, LoraConfig(), DualConfig(enabled=True), False)
    if phase == "score":
        score_examples(ad.model, items, pad_id=m.tokenizer.pad_token_id, is_seq2seq=False, batch_size=32)
    else:
        ad.model.train()
        batch = items[:12]
        n_tokens = sum(len(e.answer) for e in batch)
        for part in micro_batches(batch, budget):
            nll, _ = token_nll(ad.model, collate(part, m.tokenizer.pad_token_id, False), scope="label")
            (nll.sum() / n_tokens).backward()
    print(f"{phase} ({dtype}, micro_batch_tokens={budget}): peak {peak_gb():.2f} GB, longest {max(map(len, items))} tokens")


if __name__ == "__main__":
    main()
