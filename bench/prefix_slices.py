"""Would training slices that mix tasks, each row with its own task's prompt prefix, compute
fewer tokens than the trainer's slices cut task by task? Counts the tokens each layout runs
through the model (padding included) for the default run's training batches, as
``build_config("slow_surprise")`` sets them (today: 240 training examples per task, batches of 8
current examples of the task being learnt drawn uniformly, ``train.batching=uniform``, and,
every second step, 4 replayed from the earlier tasks, picked at random here). ``--batching`` and
``--n-train`` replace the config's batching and examples per task (``--batching bucketed
--n-train 120``: the default before commit a3214c0).

Layouts, each in slices of at most ``train.micro_batch_tokens`` (1024) padded tokens:
  whole rows     every row whole (``model.share_prefix=false``)
  by task        the trainer's slices: a task's rows in slices of their own, its shared
                 prefix run once per slice, when they save enough prefix tokens
                 (``MIN_SHARED_SAVING``); the other rows together, whole
  mixed tasks    rows of all tasks sorted by what follows their prefix, each slice running
                 its tasks' prefixes as one padded batch (what "multi-prefix slices" would do)
  no padding     each row's own tokens and each task's prefix once per step: the floor

Usage: cd bench && python prefix_slices.py [steps per task, default 200] [--batching uniform|bucketed] [--n-train N]
"""

from __future__ import annotations

import argparse
import random

from common import load, real_items_by_task, script

from surecl.config import build_config
from surecl.data.encode import _slices, bucketed_batches, micro_batch_positions, shared_prefix_len, uniform_batches


def by_task(rows, tasks, max_tokens) -> tuple[int, int]:
    tokens = calls = 0
    for s in micro_batch_positions(rows, max_tokens, tasks):
        part = [rows[i] for i in s]
        p = shared_prefix_len(part)
        tokens += len(part) * max(len(e) - p for e in part) + p
        calls += 2 if p else 1
    return tokens, calls


def mixed(rows, tasks, prefix, max_tokens) -> tuple[int, int]:
    rest = sorted(range(len(rows)), key=lambda i: len(rows[i]) - prefix[tasks[i]])
    tokens = calls = 0
    for s in _slices([len(rows[i]) - prefix[tasks[i]] for i in rest], max_tokens):
        own = {tasks[rest[j]] for j in s}
        tokens += len(s) * max(len(rows[rest[j]]) - prefix[tasks[rest[j]]] for j in s) + len(own) * max(prefix[t] for t in own)
        calls += 2
    return tokens, calls


def main() -> None:
    cfg = build_config("slow_surprise")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", type=int, nargs="?", default=200, help="steps per task (default 200)")
    ap.add_argument("--batching", choices=("uniform", "bucketed"), default=cfg.train.batching,
                    help=f"how the current task's batches are drawn (default: the config's, {cfg.train.batching})")
    ap.add_argument("--n-train", type=int, default=cfg.data.n_train,
                    help=f"training examples per task (default: the config's, {cfg.data.n_train})")
    args = ap.parse_args()
    steps, size, every, n_replay = args.steps, cfg.train.batch_size, cfg.replay.every, cfg.replay.batch_size
    max_tokens = cfg.train.micro_batch_tokens
    items = real_items_by_task(load("fp32").tokenizer, args.n_train, cfg.model.max_length)
    prefix = [shared_prefix_len(task) for task in items]
    rng = random.Random(0)
    print(f"embedded tasks, {args.n_train} training examples each ({[len(t) for t in items]} read), {args.batching} batches of "
          f"{size}, {n_replay} replayed every {every} steps, slices of {max_tokens} tokens; shared prefix {prefix} tokens; "
          f"{steps} steps per task")
    print(f"{'task':>4s} {'whole rows':>11s} {'by task':>16s} {'mixed tasks':>16s} {'no padding':>16s}   forward calls per step: by task, mixed")
    for t in range(1, len(items)):
        sums = [0, 0, 0, 0]
        calls = [0, 0]
        batches: list[list[int]] = []
        for step in range(steps):
            if not batches:
                if args.batching == "uniform":
                    batches = uniform_batches(len(items[t]), size, rng)
                else:
                    batches = bucketed_batches([len(e) for e in items[t]], size, rng)
            rows = [items[t][i] for i in batches.pop()]
            tasks = [t] * len(rows)
            if step % every == 0:
                for _ in range(n_replay):
                    u = rng.randrange(t)
                    rows.append(rng.choice(items[u]))
                    tasks.append(u)
            sums[0] += sum(len(s) * max(len(rows[i]) for i in s) for s in micro_batch_positions(rows, max_tokens))
            (a, ca), (b, cb) = by_task(rows, tasks, max_tokens), mixed(rows, tasks, prefix, max_tokens)
            sums[1] += a
            sums[2] += b
            sums[3] += sum(len(e) - prefix[u] for e, u in zip(rows, tasks, strict=True)) + sum(prefix[u] for u in set(tasks))
            calls[0] += ca
            calls[1] += cb
        w = sums[0]
        print(f"{t:4d} {w:11d} " + " ".join(f"{s:9d} ({s / w:.2f})" for s in sums[1:]) + f"   {calls[0] / steps:.1f}, {calls[1] / steps:.1f}")


if __name__ == "__main__":
    script(main)
