"""Where the time goes: ``torch.profiler`` over surecl's scoring and training step, the top
operators by self CPU time, and the achieved matmul FLOP/s against a matmul measured in the
same process (SmolLM2-135M, embedded tasks, the base in the dtype ``model.dtype=auto`` picks).

Usage: cd bench && python profile_step.py [score|train] [rows]   (default: both; 32 rows to
score; a training batch of 8 + 2 + 2 rows of three tasks, the first rows of a draw of 32 per
task: 1230 tokens, where train_step.py's batch of the same shape, drawn from 8 per task, has 1338)
"""

from __future__ import annotations

import sys
import time

import torch
from common import load, matmul_rate, n_matmul_params, real_items_by_task, script
from torch.profiler import ProfilerActivity, profile

from surecl.adapters import DualLoRA
from surecl.config import DualConfig
from surecl.config import LoraConfig as SureLora
from surecl.data.encode import collate, micro_batch_positions, shared_prefix_len
from surecl.nll import token_nll
from surecl.replay.surprise import score_examples


def table(prof, n: int = 12) -> None:
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    for e in events[:n]:
        print(f"  {e.key:42s} {100 * e.self_cpu_time_total / total:5.1f} %")


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "both"
    m = load("auto")
    dtype = next(m.model.parameters()).dtype
    by_task = real_items_by_task(m.tokenizer, 32)
    pad = m.tokenizer.pad_token_id
    per_token = 2 * n_matmul_params(m.model)  # the layers' forward FLOPs per token (a tied head is not counted)
    head = 2 * m.model.get_output_embeddings().weight.numel()
    peak = matmul_rate(dtype)
    print(f"base {dtype}; matmul rate {peak / 1e9:.1f} GFLOP/s (1024^3, this process)")
    if which in ("both", "score"):
        rows = by_task[0][: int(sys.argv[2]) if len(sys.argv) > 2 else 32]
        score_examples(m.model, rows, pad_id=pad, is_seq2seq=False, batch_size=32)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            score_examples(m.model, rows, pad_id=pad, is_seq2seq=False, batch_size=32)
            t = time.perf_counter() - start
        n = sum(len(e) for e in rows)
        ran = n - (len(rows) - 1) * shared_prefix_len(rows)
        flops = ran * (per_token + head)  # whole-sequence surprise needs the head at every position
        print(f"scoring {len(rows)} rows of one task, {n} tokens ({ran} computed with the shared prefix) in {t:.2f} s "
              f"(under the profiler): {flops / t / 1e9:.1f} GFLOP/s of layer + head matmuls on the computed tokens = "
              f"{100 * flops / t / peak:.0f} % of the matmul rate")
        table(prof)
    if which in ("both", "train"):
        items = by_task[0][:8] + by_task[1][:2] + by_task[2][:2]
        tasks = [0] * 8 + [1] * 2 + [2] * 2
        dual = DualLoRA(m.model, SureLora(), DualConfig(enabled=True), False)
        opt = torch.optim.AdamW(dual.fast_params, lr=1e-4)
        dual.model.train()
        n_answer = sum(len(e.answer) for e in items)

        def step():
            for pos in micro_batch_positions(items, 1024, tasks):
                part = [items[i] for i in pos]
                nll, _ = token_nll(dual.model, collate(part, pad, False, share_prefix=True), scope="label")
                (nll.sum() / n_answer).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            dual.ema_step()

        step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            step()
            t = time.perf_counter() - start
        n = sum(len(e) for e in items)
        # forward through the layers + backward for the activations only (the base is frozen):
        # about twice the forward's matmul FLOPs; the head runs at the answer positions only.
        flops = 2 * n * per_token
        print(f"training step, {len(items)} rows, {n} tokens (before prefix sharing) in {t:.2f} s (under the profiler): "
              f"~{flops / t / 1e9:.1f} GFLOP/s counting every token = {100 * flops / t / peak:.0f} % of the matmul rate")
        table(prof)


if __name__ == "__main__":
    script(main)
