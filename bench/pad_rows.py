"""Fully masked pad rows and non-finite gradients: a left-padded batch without a shared prefix
(a replay step's mixed slice) through a SmolLM2-135M-shaped model (random weights, no download),
forward and backward, with the plain 2D padding mask and with ``nll.pad_self_mask`` (each pad
position attends to itself alone). Counts the trials whose loss, and whose q_proj/v_proj
gradient, are non-finite, per mask. On the CPU both should count 0; RESULTS.md §9 has what a
GPU gave.

    python bench/pad_rows.py [--seconds 60] [--rows 96] [--dtype bf16] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from surecl.checkpoint import write_text  # noqa: E402
from surecl.data.encode import Encoded, collate  # noqa: E402
from surecl.nll import token_nll  # noqa: E402


def smollm2_shaped(dtype: torch.dtype, device: torch.device, seed: int):
    """SmolLM2-135M's shape (30 layers, width 576, 9 query / 3 key-value heads, vocabulary
    49,152) with random weights; q_proj and v_proj train, as LoRA's targets do."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                      tie_word_embeddings=True, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).to(device=device, dtype=dtype)
    for name, p in model.named_parameters():
        p.requires_grad_(name.endswith(("q_proj.weight", "v_proj.weight")))
    model.train()
    return model


def mixed_rows(rng: random.Random, n: int, longest: int) -> list[Encoded]:
    """Rows of several "tasks": lengths from 20 to ``longest`` tokens, answers of 1-6 tokens."""
    rows = []
    for _ in range(n):
        length = rng.randint(20, longest)
        answer = rng.randint(1, 6)
        ids = [rng.randrange(1, 49152) for _ in range(length)]
        rows.append(Encoded(prompt=ids[: length - answer], answer=ids[length - answer :], label="x"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="time for the trials, both masks together")
    ap.add_argument("--rows", type=int, default=96)
    ap.add_argument("--longest", type=int, default=512)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.out is not None and (args.out.is_dir() or not args.out.parent.is_dir()):
        # checked before the trials, not found after them
        ap.error(f"--out {args.out}: {'is a folder' if args.out.is_dir() else 'its folder does not exist'}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = smollm2_shaped(dtype, device, args.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    rng = random.Random(args.seed)
    counts = {m: {"trials": 0, "loss_nonfinite": 0, "grad_nonfinite": 0} for m in ("plain", "pads_self")}
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        batch = {k: v.to(device) for k, v in collate(mixed_rows(rng, args.rows, args.longest), 0, False).items()}
        for mode in counts:  # the same batch under both masks
            for p in params:
                p.grad = None
            nll, count = token_nll(model, batch, scope="label", pads_self=(mode == "pads_self"))
            loss = nll.sum() / count.sum()
            loss.backward()
            c = counts[mode]
            c["trials"] += 1
            c["loss_nonfinite"] += int(not bool(torch.isfinite(loss)))
            c["grad_nonfinite"] += int(not all(bool(torch.isfinite(p.grad).all()) for p in params))
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine(),
              "torch": torch.__version__, "dtype": args.dtype, "rows": args.rows, "longest": args.longest, "counts": counts}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        write_text(args.out, text + "\n")  # atomic: a stopped write leaves no half file


if __name__ == "__main__":
    main()
