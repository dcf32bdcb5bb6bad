"""What the ``instruct`` preset costs against the default run, on a machine too busy to time
either end to end: per-row costs of a training step, surprise scoring and greedy evaluation,
measured on both streams in turns in one process (so both see the same load), times each run's
counts (its rows, its evaluations: the full matrix, the before-training row, the fast
adapter's with ``eval.fast``, and the general probe's before and after each task).

    SURECL_CACHE=... OMP_NUM_THREADS=1 python bench/instruct_cost.py --reps 3

Prints the per-row means after each round, then each run's estimated seconds per phase and the
ratio instruct / default. An estimate: replay is counted as 25 % more training rows (4 replayed
every 2nd step of 8), and per-task overheads (checkpoints, model load) are left out.
"""

from __future__ import annotations

import argparse
import random
import statistics as st
import time

import torch
from common import script

from surecl.adapters import DualLoRA
from surecl.config import build_config
from surecl.data.encode import TaskEncoder, collate
from surecl.data.general import load_general_probe
from surecl.data.loading import load_stream
from surecl.evaluate import generate_answers
from surecl.model import default_cache_dir, load_model
from surecl.nll import token_nll
from surecl.replay.surprise import score_examples

CPU = torch.device("cpu")


def stream(cfg, tok, cache):
    enc = TaskEncoder(tok, cfg.model.max_length, template=cfg.data.template)
    tasks = load_stream(cfg, cache)
    probe = load_general_probe(cfg.eval.general, cfg.eval.general_n, cache)
    return {
        "cfg": cfg, "tasks": tasks, "stop": enc.stop_ids(),
        "train": [enc.encode(t, t.train) for t in tasks], "test": [enc.encode(t, t.test, split="test") for t in tasks],
        "probe": [enc.encode(t, t.test, split="test") for t in probe.tasks] if probe else [],
        "labels": [[enc.answer_ids(lab) for lab in t.labels] for t in tasks],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    cache = default_cache_dir()
    runs = {"default": build_config("slow_surprise"), "instruct": build_config("instruct")}
    loaded = load_model(runs["instruct"].model, CPU, cache)
    torch.manual_seed(0)
    model = DualLoRA(loaded.model, runs["default"].lora, runs["default"].dual, False).model
    tok = loaded.tokenizer
    data = {name: stream(cfg, tok, cache) for name, cfg in runs.items()}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    cost = {name: {"train": [], "score": [], "gen": []} for name in data}
    rng = random.Random(0)
    for rep in range(args.reps):
        for name, d in data.items():
            t = rng.randrange(len(d["tasks"]))
            model.train()
            rows = rng.sample(d["train"][t], 12)
            start = time.perf_counter()
            nll, count = token_nll(model, collate(rows, tok.pad_token_id, False), scope="label")
            (nll.sum() / count.sum()).backward()
            opt.step()
            opt.zero_grad()
            cost[name]["train"].append((time.perf_counter() - start) / len(rows))
            model.eval()
            rows = rng.sample(d["train"][t], 32)
            start = time.perf_counter()
            score_examples(model, rows, pad_id=tok.pad_token_id, is_seq2seq=False, scope="sequence", reduction="mean", batch_size=32, device=CPU)
            cost[name]["score"].append((time.perf_counter() - start) / len(rows))
            rows, task = d["test"][t][:32], d["tasks"][t]
            if task.kind == "generate":
                new, stop = min(max(len(e.answer) for e in d["test"][t]) + 1, d["cfg"].eval.max_new_cap), d["stop"]
            else:
                new, stop = max(len(a) for a in d["labels"][t]) + 1, None
            start = time.perf_counter()
            generate_answers(model, tok, rows, is_seq2seq=False, max_new_tokens=new, batch_size=32, device=CPU, stop_ids=stop)
            cost[name]["gen"].append((time.perf_counter() - start) / len(rows))
        print(rep, {name: {k: round(st.mean(v), 4) for k, v in c.items()} for name, c in cost.items()}, flush=True)
    totals = {}
    for name, d in data.items():
        cfg, n = d["cfg"], len(d["tasks"])
        unit = {k: st.mean(v) for k, v in cost[name].items()}
        n_train = sum(len(x) for x in d["train"])
        fast = 2 if cfg.dual.enabled and cfg.eval.fast else 1
        evaluations = n * (n + 1) // 2 * fast + (n if cfg.eval.before else 0)
        phases = {
            "train": unit["train"] * n_train * 1.25,
            "score": unit["score"] * n_train,
            "eval": unit["gen"] * evaluations * cfg.data.n_test,
            "general": sum(len(p) for p in d["probe"][:1]) * unit["score"] * (1 + n * fast)
            + sum(len(p) for p in d["probe"][1:]) * unit["gen"] * (1 + n * fast),
        }
        totals[name] = sum(phases.values())
        print(name, {k: round(v) for k, v in phases.items()}, "total", round(totals[name]))
    print(f"instruct / default = {totals['instruct'] / totals['default']:.2f}")


if __name__ == "__main__":
    script(main)
