"""Scoring and greedy evaluation time against the batch size, with and without the shared
prompt prefix, task by task as the trainer runs them (SmolLM2-135M, embedded tasks).

On a 2-core CPU a bigger batch is not automatically faster: one ~100-token sequence already
fills both cores, and a batch's activations outgrow the caches. This prints the time per
batch size so the defaults can be chosen from a measurement. Every cell (batch size x path) is
timed in rounds, all cells in turn in each round after one warm-up run each, median of 3
rounds, so a drift of the machine's speed reaches every cell alike.
Usage: cd bench && python batch_size.py [examples_per_task] [batch sizes ...]   (default 16; 4 8 16 32)
"""

from __future__ import annotations

import argparse

from common import at_least, interleaved_medians, load, real_items_by_task, script

from surecl.evaluate import generate_answers
from surecl.replay.surprise import score_examples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # 0 examples would read as every row of a task (data.n_train's rule): hours of timing; a batch
    # size of 0 would stop the scorer after the model loads
    ap.add_argument("examples_per_task", type=at_least(1, "examples per task {text}: give 1 or more"), nargs="?", default=16, help="training examples of each embedded task (default 16)")
    ap.add_argument("sizes", type=at_least(1, "batch size {text}: give 1 or more"), nargs="*", metavar="batch_size", help="batch sizes to time (default 4 8 16 32)")
    args = ap.parse_args()
    n = args.examples_per_task
    sizes = args.sizes or [4, 8, 16, 32]
    m = load("auto")
    by_task = real_items_by_task(m.tokenizer, n)
    pad = m.tokenizer.pad_token_id
    tokens = sum(len(e) for part in by_task for e in part)
    prompt_tokens = sum(len(e.prompt) for part in by_task for e in part)

    def score(bs, share):
        for part in by_task:
            score_examples(m.model, part, pad_id=pad, is_seq2seq=False, batch_size=bs, share_prefix=share)

    def generate(bs, share):
        for part in by_task:
            generate_answers(m.model, m.tokenizer, part, is_seq2seq=False, max_new_tokens=4, batch_size=bs, device="cpu", share_prefix=share)

    print(f"{len(by_task)} tasks x {n} examples: {tokens} tokens scored, {prompt_tokens} prompt tokens generated from; "
          f"base {next(m.model.parameters()).dtype}; median of 3 rounds, every cell in turn, one warm-up run each", flush=True)
    cells = [lambda f=fn, b=bs, s=share: f(b, s) for bs in sizes for fn in (score, generate) for share in (False, True)]
    medians = interleaved_medians(cells, 3, warmup=1)
    print(f"{'batch':>5s} {'score, whole rows':>18s} {'score, shared':>14s} {'generate, whole':>16s} {'generate, shared':>17s}")
    for k, bs in enumerate(sizes):
        t = medians[4 * k : 4 * k + 4]
        print(f"{bs:5d} {t[0]:16.2f} s {t[1]:12.2f} s {t[2]:14.2f} s {t[3]:15.2f} s")


if __name__ == "__main__":
    script(main)
