"""Surprise scoring: surecl's scorer vs the ways users would otherwise write it.

1. per-example fp32 loop (the reference code's way: one sequence at a time, full precision);
2. padded batched fp32 loop (plain ``transformers``: right-padded batches, HF ``labels`` loss);
3. surecl: ``score_examples`` (length-sorted batches, ``inference_mode``, base in bf16 where
   the CPU supports it), without and with (the default) each batch's shared prompt prefix
   run once.

Prints tokens/s, the ratios, and achieved FLOP/s as a fraction of a matmul rate measured in
the same process. The four paths are timed in rounds, each once per round in turn after one
warm-up run each (``common.interleaved_medians``), and their medians compared, so a drift of
the machine's speed reaches all of them alike.
Run: ``python bench/scoring.py [n_examples] [rounds]`` (default 96 examples, 3 rounds).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from common import at_least, interleaved_medians, load, matmul_rate, n_matmul_params, real_items_by_task, script

from surecl.data.encode import shared_prefix_len
from surecl.replay.surprise import score_examples


def per_example(model, items):
    with torch.no_grad():
        for e in items:
            ids = torch.tensor([e.prompt + e.answer])
            logits = model(input_ids=ids).logits[0, :-1].float()
            F.cross_entropy(logits, ids[0, 1:])


def padded_batched(model, items, pad_id, bs=32):
    with torch.no_grad():
        for s in range(0, len(items), bs):
            chunk = items[s : s + bs]
            width = max(len(e) for e in chunk)
            ids = torch.full((len(chunk), width), pad_id)
            mask = torch.zeros_like(ids)
            for r, e in enumerate(chunk):
                seq = e.prompt + e.answer
                ids[r, : len(seq)] = torch.tensor(seq)
                mask[r, : len(seq)] = 1
            labels = ids.masked_fill(mask == 0, -100)
            model(input_ids=ids, attention_mask=mask, labels=labels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # a quarter of the examples from each of the four tasks: below 4 a task's share is 0, which
    # reads as every row (hours); 0 rounds leave no time to take a median of
    ap.add_argument("n_examples", type=at_least(4, "{text} examples: give 4 or more (a quarter from each of the four tasks)"), nargs="?", default=96, help="examples scored, a quarter from each embedded task (default 96)")
    ap.add_argument("rounds", type=at_least(1, "{text}: give 1 or more"), nargs="?", default=3, help="timed rounds of the four paths (default 3)")
    args = ap.parse_args()
    n, rounds = args.n_examples, args.rounds
    fp32 = load("fp32")
    fast = load("auto")
    # scored task by task, as the trainer does (a task's examples share its prompt prefix)
    by_task = real_items_by_task(fp32.tokenizer, n // 4)
    items = [e for part in by_task for e in part]

    def surecl(share):
        for part in by_task:
            score_examples(fast.model, part, pad_id=pad, is_seq2seq=False, batch_size=32, share_prefix=share)

    tokens = sum(len(e) for e in items)
    # tokens the shared-prefix scorer runs: per batch (as score_examples cuts them), the
    # prefix once and every row's remainder
    computed = 0
    for part in by_task:
        ordered = sorted(part, key=len)
        for b in range(0, len(ordered), 32):
            batch = ordered[b : b + 32]
            computed += sum(len(e) for e in batch) - (len(batch) - 1) * shared_prefix_len(batch)
    pad = fp32.tokenizer.pad_token_id
    # every path computes the output layer at every position (whole-sequence surprise), so
    # the FLOPs per token are the layers' matmuls plus the (tied) 49 152 x 576 head
    flop_per_token = 2 * n_matmul_params(fp32.model) + 2 * fp32.model.get_output_embeddings().weight.numel()
    dtype = next(fast.model.parameters()).dtype
    paths = [
        ("per-example fp32 loop", lambda: per_example(fp32.model, items)),
        ("padded batched fp32 (bs 32)", lambda: padded_batched(fp32.model, items, pad)),
        (f"surecl, no shared prefix ({dtype})", lambda: surecl(False)),
        (f"surecl score_examples ({dtype})", lambda: surecl(True)),
    ]
    # one warm-up run each, then rounds of all four in turn: every ratio compares medians of
    # runs seconds apart, the per-example baseline's included
    medians = interleaved_medians([fn for _, fn in paths], rounds, warmup=1)
    rows = [(name, t) for (name, _), t in zip(paths, medians)]
    peak = matmul_rate(dtype)
    peak32 = matmul_rate(torch.float32)
    print(f"{n} examples, {tokens} tokens; median of {rounds} rounds (the paths in turn, one warm-up run each); matmul rate {peak / 1e9:.1f} GFLOP/s ({dtype}, 1024^3, same process), "
          f"fp32 {peak32 / 1e9:.1f} GFLOP/s")
    print(f"ceiling if every FLOP ran at the {dtype} matmul rate: x{peak / peak32:.2f} over an fp32 loop at the fp32 matmul rate")
    base = rows[0][1]
    for k, (name, t) in enumerate(rows):
        rate = tokens / t
        ran = computed if k == 3 else tokens
        print(f"{name:40s} {t:8.2f} s {rate:9.1f} tok/s  x{base / t:5.2f} vs per-example  "
              f"{ran / t * flop_per_token / 1e9:7.1f} GFLOP/s ({100 * ran / t * flop_per_token / peak:5.1f}% of matmul)")
    print(f"surecl vs padded batched fp32: x{rows[1][1] / rows[3][1]:.2f}; shared prefix vs none: x{rows[2][1] / rows[3][1]:.2f}")
    print(f"(tok/s count every token of every sequence; GFLOP/s the tokens computed, layers + output layer: with the "
          f"shared prefix {computed} of {tokens})")


if __name__ == "__main__":
    script(main)
