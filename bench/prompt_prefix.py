"""How much of each scored sequence is a per-task shared prefix (instruction + options): the
share of tokens a shared-prefix KV cache would not recompute. Also lists rows a benchmark
folder would drop with ``data.invalid_labels=drop``.

Usage: cd bench && python prompt_prefix.py [path/to/CL_Benchmark]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import load, script

from surecl.data.cl_benchmark import load_benchmark
from surecl.data.embedded import ensure_embedded_benchmark
from surecl.data.encode import TaskEncoder
from surecl.errors import SureclError


def common_prefix(seqs: list[list[int]]) -> int:
    n = min(map(len, seqs))
    for s in seqs[1:]:
        k = 0
        while k < n and s[k] == seqs[0][k]:
            k += 1
        n = k
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("benchmarks", nargs="*", metavar="CL_Benchmark", help="benchmark folders measured after the embedded one")
    args = ap.parse_args()
    # a folder that is not there is one line before the model and the embedded tasks load
    for root in args.benchmarks:
        if not Path(root).is_dir():
            raise SureclError(f"{root}: not a folder; give a CL_Benchmark folder")
    tok = load("fp32").tokenizer
    enc = TaskEncoder(tok, 128)
    roots = [ensure_embedded_benchmark(quiet=True)] + args.benchmarks
    for root in roots:
        print(root)
        for task in load_benchmark(root, invalid_labels="drop"):
            seqs = [e.prompt + e.answer for e in enc.encode(task, task.train[:200])]
            p, mean = common_prefix(seqs), sum(map(len, seqs)) / len(seqs)
            dropped = task.meta.get("dropped", {})
            print(f"  {task.name:12s} shared prefix {p:3d} of {mean:6.1f} tokens ({p / mean:4.0%})" + (f"  dropped {dropped}" if dropped else ""))
    return 0


if __name__ == "__main__":
    script(main)
