"""Which phase sets the peak memory: surprise scoring (whole-sequence logits over the
vocabulary) or a training step (activations kept for the backward pass), each measured as the
peak RSS of its own process (``ru_maxrss``, KiB on Linux, printed in GB of 10^9 bytes). Scoring
takes the 32 longest of 64 real examples; the training step the 12 shortest of those 32, in
slices of at most ``micro_batch_tokens`` padded tokens (0: one batch). Each prints its rows'
lengths and padded size.

Usage: cd bench && python peak_memory.py score|train [auto|bf16|fp32] [micro_batch_tokens]
"""

from __future__ import annotations

import argparse
import resource

from common import load, real_items, script

from surecl.adapters import DualLoRA
from surecl.config import DualConfig, LoraConfig
from surecl.data.encode import collate, micro_batches
from surecl.nll import token_nll
from surecl.replay.surprise import score_examples


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # ru_maxrss: KiB on Linux


def widths(rows) -> str:
    """A batch's row count, length range and padded size (rows x longest)."""
    n = [len(e) for e in rows]
    return f"{len(n)} rows of {min(n)}-{max(n)} tokens, padded to {max(n)} ({len(n) * max(n)} padded tokens)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("phase", choices=["score", "train"])
    ap.add_argument("dtype", nargs="?", choices=["auto", "bf16", "fp32"], default="fp32")
    ap.add_argument("micro_batch_tokens", nargs="?", type=int, default=0, help="the training step's slices (0: one batch)")
    args = ap.parse_args()
    if args.micro_batch_tokens < 0:
        ap.error("micro_batch_tokens must be 0 or more")
    phase, dtype, budget = args.phase, args.dtype, args.micro_batch_tokens
    m = load(dtype)
    items = sorted(real_items(m.tokenizer, 64), key=len)[-32:]
    print(f"model loaded: peak {peak_gb():.2f} GB", flush=True)
    ad = DualLoRA(m.model, LoraConfig(), DualConfig(enabled=True), False)
    if phase == "score":
        batch, sliced = items, ""
        score_examples(ad.model, items, pad_id=m.tokenizer.pad_token_id, is_seq2seq=False, batch_size=32)
    else:
        ad.model.train()
        batch = items[:12]  # the 12 shortest of the 32 (items are sorted by length)
        n_tokens = sum(len(e.answer) for e in batch)
        parts = micro_batches(batch, budget)
        for part in parts:
            nll, _ = token_nll(ad.model, collate(part, m.tokenizer.pad_token_id, False), scope="label")
            (nll.sum() / n_tokens).backward()
        sliced = f"; slices of {', '.join(f'{len(p)} x {max(map(len, p))}' for p in parts)} padded tokens"
    print(f"{phase} ({dtype}, micro_batch_tokens={budget}): peak {peak_gb():.2f} GB; {widths(batch)}{sliced}")


if __name__ == "__main__":
    script(main)
