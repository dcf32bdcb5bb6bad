"""Training step: a SuRe step (fast+slow LoRA, replay batch, EMA) vs a plain PEFT LoRA fp32 step.

The plain step is what a user writes with ``transformers`` + ``peft`` alone: fp32 base,
right-padded batch, HF ``labels`` loss over full logits. The SuRe step is surecl's: base in
bf16 where supported, LoRA and AdamW state in fp32, answer-only logits, one fused EMA.
Both see the same examples (current batch + replay batch); the variants take their steps in
turn, one each per round, so that a drift of the machine's speed reaches all of them alike.

The SuRe step runs five ways: the whole batch at once; in the trainer's 1024-token slices;
in slices cut task by task with each task's prompt prefix run once (``model.share_prefix``,
the default: a task's rows get slices of their own when they save at least
``MIN_SHARED_SAVING`` prefix tokens, so the two replayed pairs here share one slice); that
with every task in slices of its own; and the default with PEFT's ``nn.Dropout`` in place of
surecl's ``LoraDropout``. Also prints the share of each SuRe step spent in EMA and buffer
bookkeeping. Run: ``cd bench && python train_step.py``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from common import interleaved_medians, load, real_items_by_task, script
from peft import LoraConfig, get_peft_model

from surecl.adapters import DualLoRA
from surecl.config import DualConfig
from surecl.config import LoraConfig as SureLora
from surecl.data.encode import collate, micro_batch_positions
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


def sure_model():
    """One dual-LoRA model and optimizer that every SuRe variant steps (a copy per variant
    would sit elsewhere in memory and could run at its own speed), with PEFT's ``nn.Dropout``
    modules kept beside surecl's ``LoraDropout`` ones so that a variant can switch."""
    dual = DualLoRA(load("auto").model, SureLora(), DualConfig(enabled=True, beta=0.995), False)
    dual.model.train()
    drops = {}
    for module in dual.model.modules():
        for name, d in getattr(module, "lora_dropout", {}).items():
            drops[(module.lora_dropout, name)] = (d, torch.nn.Dropout(d.p))
    return dual, torch.optim.AdamW(dual.fast_params, lr=1e-4), drops


def sure_step_fn(model, items, tasks, pad_id, timings, *, max_tokens=0, share=False, nn_dropout=False, min_saving=None):
    """surecl's step as the trainer runs it: the mixed batch in slices of at most
    ``max_tokens`` padded tokens (0: whole), cut task by task and each slice's shared prompt
    prefix run once when ``share`` (a task's rows get slices of their own when they save
    ``min_saving`` prefix tokens, default ``MIN_SHARED_SAVING``); gradient accumulation, clip,
    AdamW, EMA. ``nn_dropout`` puts PEFT's ``nn.Dropout`` back in place of ``LoraDropout``."""
    dual, opt, drops = model
    buffer = QuotaBuffer(300)
    for t in range(10):  # a buffer that has seen 10 tasks of 1000 examples
        buffer.add_task(t, [random.random() for _ in range(1000)])
    rng = random.Random(0)
    n_cur = len(items) * 2 // 3
    current, n_rep = items[:n_cur], len(items) - n_cur

    def step():
        for (modules, name), pair in drops.items():
            modules[name] = pair[1] if nn_dropout else pair[0]
        t0 = time.perf_counter()
        replayed = sample(buffer.entries, n_rep, rng)
        # the replayed examples are the batch's last third (other tasks), whatever was drawn
        rows = current + [items[n_cur + k] for k, _ in enumerate(replayed)]
        slices = micro_batch_positions(rows, max_tokens, tasks if share else None, min_saving)
        batches = []
        for pos in slices:
            part = [rows[i] for i in pos]
            batches.append(collate(part, pad_id, False, share_prefix=share))
        n_tokens = sum(len(e.answer) for e in rows)
        t1 = time.perf_counter()
        for batch in batches:
            nll, _ = token_nll(dual.model, batch, scope="label")
            (nll.sum() / n_tokens).backward()
        torch.nn.utils.clip_grad_norm_(dual.fast_params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        dual.ema_step()
        t3 = time.perf_counter()
        timings.append((t1 - t0, t2 - t1, t3 - t2))

    return step


def main() -> None:
    # no arguments: the parser answers --help and refuses any other word before the models load
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    probe = load("fp32")
    # 8 current examples of one task + 4 replayed from two others, as batch 8 / replay 4
    by_task = real_items_by_task(probe.tokenizer, 8)
    items = by_task[0][:8] + by_task[1][:2] + by_task[2][:2]
    tasks = [0] * 8 + [1] * 2 + [2] * 2
    del probe
    tokens = sum(len(e) for e in items)
    pad = 0
    variants = (
        ("SuRe step, whole batch", {}),
        ("SuRe step, 1024-token slices", {"max_tokens": 1024}),
        ("SuRe step, slices + prefix, each task", {"max_tokens": 1024, "share": True, "min_saving": 1}),
        ("SuRe step, slices + prefix, nn.Dropout", {"max_tokens": 1024, "share": True, "nn_dropout": True}),
        ("SuRe step, slices + shared prefix", {"max_tokens": 1024, "share": True}),
    )
    timings: list[list[tuple[float, float, float]]] = [[] for _ in variants]
    model = sure_model()
    fns = [plain_step_fn(items, pad)] + [sure_step_fn(model, items, tasks, pad, timings[k], **kw) for k, (_, kw) in enumerate(variants)]
    plain, *times = interleaved_medians(fns, STEPS, warmup=1)
    rows = [(name, t, timings[k]) for k, ((name, _), t) in enumerate(zip(variants, times, strict=True))]
    print(f"batch of {len(items)} sequences (8 current of one task + 2 + 2 replayed of two others), {tokens} tokens, "
          f"median of {STEPS} steps taken in turn, base {next(model[0].model.parameters()).dtype}")
    print(f"{'plain PEFT LoRA fp32 step':40s} {plain:7.3f} s  {tokens / plain:8.1f} tok/s")
    for name, t, timings in rows:
        book = statistics.median(x[0] for x in timings[1:])
        ema = statistics.median(x[2] for x in timings[1:])
        print(f"{name:40s} {t:7.3f} s  {tokens / t:8.1f} tok/s  x{plain / t:.2f}   "
              f"EMA {1e3 * ema:.2f} ms + buffer sample/collate {1e3 * book:.2f} ms = {100 * (ema + book) / t:.2f}% of the step")


if __name__ == "__main__":
    script(main)
