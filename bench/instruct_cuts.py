"""How many test inputs of the instruct stream the encoder cuts, per ``eval.answer_budget`` and
``model.max_length``: every test row of the four tasks, encoded as a run of the ``instruct``
preset encodes them (its template and prompt settings). Under ``references`` a test prompt
leaves room for its own reference; under ``train`` for the task's answer budget.

    python bench/instruct_cuts.py [max_length ...]      # default: 256 128
"""

from __future__ import annotations

import argparse

import torch
from common import at_least, script

from surecl.config import build_config
from surecl.data.embedded import default_cache_dir
from surecl.data.encode import TaskEncoder
from surecl.data.instruct import ensure_instruct_benchmark, load_instruct_stream
from surecl.model import load_model
from surecl.run_eval import encode_test


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("max_length", nargs="*", type=at_least(8, "max_length {text}: give 8 or more"), default=[256, 128])
    args = ap.parse_args()
    tasks = load_instruct_stream(ensure_instruct_benchmark(), [])
    tokenizer = load_model(build_config("instruct,seq_lora").model, torch.device("cpu"), default_cache_dir()).tokenizer
    for length in args.max_length:
        for mode in ("train", "references"):
            cfg = build_config("instruct,seq_lora", [f"eval.answer_budget={mode}", f"model.max_length={length}"])
            enc = TaskEncoder(tokenizer, length, task_prefix=cfg.data.task_prefix,
                              template=cfg.data.template, text_start=cfg.data.text_start)
            for t in tasks:
                encode_test(cfg, enc, t, enc.encode(t, t.train))
            cut = {name: f"{n_cut}/{n}" for (name, split), (n_cut, n) in enc.sentence_cut.items() if split == "test" and n_cut}
            print(f"max_length {length}, answer_budget {mode}: test inputs cut {cut or 'none'}")
    return 0


if __name__ == "__main__":
    script(main)
