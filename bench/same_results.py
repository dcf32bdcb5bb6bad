"""Do two source trees give the same runs? Every method preset on the tiny setting, run once
with each tree's ``src`` (a subprocess per run, so nothing is shared), compared field by field:
accuracy matrices (slow and fast), before-training row, buffer contents, every ``log.jsonl``
line (loss, lr, replayed, buffer size per step) and the saved adapters' tensors, bit for bit.

    python bench/same_results.py OLD_TREE NEW_TREE [--presets seq_lora,slow_surprise] [--out runs/same]

A refactor that claims "results stay as they are" runs this with the tree before and after.
Exit status 1 when any preset differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

FIELDS = ("accuracy_matrix", "initial", "fp", "ap", "fast", "buffer", "steps", "dual_beta")


def run_tree(tree: Path, preset: str, out: Path, overrides: list[str]) -> None:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    cmd = [sys.executable, "-m", "surecl.cli", "run", "--quiet", "--fresh", "--config", f"tiny,{preset}", *overrides, "--out", str(out)]
    subprocess.run(cmd, check=True, env=env, cwd=tree)


def tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.rglob("*.safetensors")):
        for k, v in load_file(f).items():
            out[f"{f.relative_to(folder)}:{k}"] = v
    return out


def same_field(old, new) -> bool:
    """Equal, where a key the newer tree adds to a mapping (``fast.fwt``) counts only when it
    holds a value: a new metric left null (not measured) is no difference in the results."""
    if isinstance(old, dict) and isinstance(new, dict):
        added = {k: v for k, v in new.items() if k not in old}
        return all(v is None for v in added.values()) and all(same_field(v, new.get(k)) for k, v in old.items())
    return old == new


def compare(a: Path, b: Path) -> list[str]:
    import torch

    ra, rb = (json.loads((d / "results.json").read_text()) for d in (a, b))
    diffs = [f for f in FIELDS if not same_field(ra.get(f), rb.get(f))]
    if (a / "log.jsonl").read_text() != (b / "log.jsonl").read_text():
        diffs.append("log.jsonl")
    if (a / "buffer.json").read_text() != (b / "buffer.json").read_text():
        diffs.append("buffer.json")
    ta, tb = tensors(a / "adapters"), tensors(b / "adapters")
    if ta.keys() != tb.keys() or any(not torch.equal(ta[k], tb[k]) for k in ta):
        diffs.append("adapters")
    return diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--presets", default="seq_lora,slow_surprise,slow_reservoir,online_surprise,surprise_aging,label_surprise,ewc,per_task,mtl,slow_surprise_sa")
    ap.add_argument("--out", type=Path, default=Path("runs/same_results"))
    ap.add_argument("overrides", nargs="*", default=["data.tasks=[colors,animals]", "data.n_train=24", "data.n_test=8", "train.epochs=2", "eval.before=true"])
    args = ap.parse_intermixed_args()
    failed = 0
    for preset in args.presets.split(","):
        outs = [args.out.resolve() / tag / preset for tag in ("old", "new")]
        for tree, out in zip((args.old.resolve(), args.new.resolve()), outs):
            run_tree(tree, preset, out, args.overrides)
        diffs = compare(*outs)
        failed += bool(diffs)
        print(f"{preset:18s} {'same' if not diffs else 'DIFFERS: ' + ', '.join(diffs)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
