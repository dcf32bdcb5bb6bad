"""Training step: a SuRe step (fast+slow LoRA, replay batch, EMA) vs a plain PEFT LoRA fp32 step.

The plain step is what a user writes with ``transformers`` + ``peft`` alone: fp32 base,
right-padded batch, HF ``labels`` loss over full logits. The SuRe step is surecl's: base in
bf16 where supported, LoRA and AdamW state in fp32, answer-only logits, one fused EMA.
Both see the same examples (current batch + replay batch). Also prints the share of the SuRe
step spent in EMA and buffer bookkeeping. Run: ``python bench/train_step.py``.
"""

from __future__ import annotations

import random
import statistics
import time

import torch
from common import load, median_time, real_items
from peft import LoraConfig, get_peft_model

from surecl.adapters import DualLoRA
from surecl.config import DualConfig
from surecl.config import LoraConfig as SureLora
from surecl.data.encode import collate
from surecl.nll import token_nll
from surecl.replay.buffer import QuotaBuffer, sample

STEPS = 5


def plain_step_fn(items, pad_id):
    loaded = load("fp32")
    model = get_peft_model(loaded.model, LoraConfig(r=8, lora_alpha=32, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    width = max(len(e) for e in items)
    ids = torch.full((len(items), width), pad_id)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for r, e in enumerate(items):
        seq = e.prompt + e.answer
        ids[r, : len(seq)] = torch.tensor(seq)
        mask[r, : len(seq)] = 1
        labels[r, len(e.prompt) : len(seq)] = torch.tensor(e.answer)
    model.train()

    def step():
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def sure_step_fn(items, pad_id, timings):
    loaded = load("auto")
    dual = DualLoRA(loaded.model, SureLora(), DualConfig(enabled=True, beta=0.995), False)
    opt = torch.optim.AdamW(dual.fast_params, lr=1e-4)
    buffer = QuotaBuffer(300)
    for t in range(10):  # a buffer that has seen 10 tasks of 1000 examples
        buffer.add_task(t, [random.random() for _ in range(1000)])
    rng = random.Random(0)
    current, n_rep = items[: len(items) * 2 // 3], len(items) - len(items) * 2 // 3
    pool = items
    dual.model.train()

    def step():
        t0 = time.perf_counter()
        replayed = sample(buffer.entries, n_rep, rng)
        batch = collate(current + [pool[e.index % len(pool)] for e in replayed], pad_id, False)
        t1 = time.perf_counter()
        nll, count = token_nll(dual.model, batch, scope="label")
        loss = nll.sum() / count.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(dual.fast_params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        dual.ema_step()
        t3 = time.perf_counter()
        timings.append((t1 - t0, t2 - t1, t3 - t2))

    return step


def main() -> None:
    probe = load("fp32")
    items = real_items(probe.tokenizer, 12)  # 8 current + 4 replayed, as batch 8 / replay 4
    del probe
    tokens = sum(len(e) for e in items)
    pad = 0
    plain = median_time(plain_step_fn(items, pad), STEPS, warmup=1)
    timings: list[tuple[float, float, float]] = []
    sure = median_time(sure_step_fn(items, pad, timings), STEPS, warmup=1)
    book = statistics.median(t[0] for t in timings[1:])
    ema = statistics.median(t[2] for t in timings[1:])
    print(f"batch of {len(items)} sequences, {tokens} tokens, median of {STEPS} steps")
    print(f"plain PEFT LoRA fp32 step   {plain:7.3f} s  {tokens / plain:8.1f} tok/s")
    print(f"SuRe step (dual, replay)    {sure:7.3f} s  {tokens / sure:8.1f} tok/s  x{plain / sure:.2f}")
    print(f"  EMA {1e3 * ema:.2f} ms + buffer sample/collate {1e3 * book:.2f} ms = {100 * (ema + book) / sure:.2f}% of the step")


if __name__ == "__main__":
    main()
