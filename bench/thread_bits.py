"""Does torch's thread count change a run's numbers? The same short SuRe run on the embedded
default (SmolLM2-135M, base in the machine's dtype) at 1 and at 2 threads (OMP_NUM_THREADS), then
every step's loss, the score matrix, the buffer and the slow adapter's tensors compared bit for
bit. ``surecl report`` keeps a CPU run's thread count in its host key: the bits were equal on an
AVX2 host with an fp32 base (bench/RESULTS.md §15), which says nothing of the bf16 hosts.
Run: ``python bench/thread_bits.py OUT`` (two runs of a few minutes each, one after the other)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

ARGS = ["--config", "slow_surprise", "--quiet", "data.n_train=24", "data.n_test=16", "train.batch_size=8",
        "data.tasks=[tweets,reuters]"]


def last_line(done: subprocess.CompletedProcess) -> str:
    """What a failed run said last on stderr (surecl's error line), as text; or that it said
    nothing (a process killed before it could), with its exit status."""
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"it printed nothing on stderr (exit status {done.returncode})"


def run(out: Path, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, "-m", "surecl.cli", "run", "--out", str(out), "--fresh", *ARGS], env=env,
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the run at {threads} threads failed: {last_line(done)}")
    res = json.loads((out / "results.json").read_text())
    tensors = {}
    for f in sorted((out / "adapters").rglob("*.safetensors")):
        tensors.update({f"{f.relative_to(out)}:{k}": v for k, v in load_file(str(f)).items()})
    return {"threads": res["host"]["threads"], "host": res["host"], "base_dtype": res.get("base_dtype"),
            "matrix": res["accuracy_matrix"], "losses": [json.loads(x)["loss"] for x in (out / "log.jsonl").read_text().splitlines()],
            "buffer": (out / "buffer.json").read_text(), "tensors": tensors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default="/tmp/thread-bits", metavar="OUT",
                    help="folder of the two runs, OUT/t1 and OUT/t2 (default /tmp/thread-bits)")
    root = Path(ap.parse_args().out)
    a, b = run(root / "t1", 1), run(root / "t2", 2)
    print(f"host: {a['host']['cpu']} {a['host']['cpu_flags']} torch {a['host']['torch']}, base {a['base_dtype']}")
    print(f"threads recorded: {a['threads']} and {b['threads']}")
    print(f"steps: {len(a['losses'])}; losses equal bit for bit: {a['losses'] == b['losses']}")
    if a["losses"] != b["losses"]:
        first = next(i for i, (x, y) in enumerate(zip(a["losses"], b["losses"])) if x != y)
        print(f"  first difference at step {first}: {a['losses'][first]!r} vs {b['losses'][first]!r}")
    print(f"score matrix equal: {a['matrix'] == b['matrix']} ({a['matrix']})")
    print(f"buffer equal: {a['buffer'] == b['buffer']}")
    same = [k for k in a["tensors"] if k in b["tensors"] and a["tensors"][k].equal(b["tensors"][k])]
    print(f"adapter tensors equal bit for bit: {len(same)} of {len(a['tensors'])}")


if __name__ == "__main__":
    main()
