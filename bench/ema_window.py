"""Slow minus fast, paired, for many EMA rules on one training trajectory.

The fast adapter's trajectory does not depend on the EMA (the slow adapter never feeds back
into training), so one run can carry several slow "shadows" - each an EMA of the same fast
iterates under another beta / form - and evaluate each against the fast adapter on the same
test sets. That gives slow - fast for every rule at the cost of evaluation only.

Rules: ``plain`` (the paper's slow <- beta slow + (1-beta) fast, starting at the initial
adapter), ``bc`` (bias-corrected: the normalised geometric average of the fast iterates) and
``auto`` (bias-corrected with beta = 1 - 1/(c x steps per task), a window of c tasks).
Each shadow is evaluated on what FP and AP need: every task right after it is learned and
every task after the last.

Usage (from the repository root):
  python bench/ema_window.py OUT_DIR --benchmark ../shared/benchmarks/CL_Benchmark \
      --tasks dbpedia,amazon,agnews --n-train 120,400,1200 --seeds 0,1,2 [key.sub=value ...]
Prints one table per stream length (steps per task) and writes OUT_DIR/ema_window.json.

A rerun into the same OUT_DIR skips the (n_train, seed) pairs ema_window.json already holds and
runs the rest, each from the start (``fresh=True``: the shadows are not checkpointed, so a
stopped pair cannot resume; only what surecl wrote in the pair's folder is removed). Each record
keeps the resolved config it ran and the script's arguments; a file holding a record whose
config differs from what these arguments give for its pair (other tasks, epochs, presets, a
record from before configs were kept) is refused in one line, as its table would mix settings.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch
from common import script

from surecl.checkpoint import write_json
from surecl.config import build_config, same_config
from surecl.errors import SureclError
from surecl.trainer import ContinualRun

PLAIN_BETAS = [0.9, 0.95, 0.99, 0.995]
BC_BETAS = [0.9, 0.95, 0.99, 0.995]
AUTO_TASKS = [0.5, 1.0, 2.0, 4.0]


@dataclass
class Shadow:
    name: str
    beta: float
    bias_correction: bool
    raw: list[torch.Tensor] = field(default_factory=list)
    steps: int = 0
    acc: list[list[float | None]] = field(default_factory=list)

    def weights(self) -> list[torch.Tensor]:
        if not self.bias_correction:
            return self.raw
        return [t / (1.0 - self.beta**self.steps) for t in self.raw] if self.steps else self.raw


class ProbeRun(ContinualRun):
    """A dual run that also keeps EMA shadows of its fast adapter and evaluates them."""

    def __init__(self, cfg, out_dir: Path, **kwargs):
        super().__init__(cfg, out_dir, **kwargs)
        per_task = self.steps_in_stage(self.stages[0])
        rules = [(f"plain {b}", b, False) for b in PLAIN_BETAS] + [(f"bc {b}", b, True) for b in BC_BETAS]
        rules += [(f"auto {c:g} task(s) (beta {1 - 1 / (c * per_task):.4f})", 1 - 1 / (c * per_task), True) for c in AUTO_TASKS]
        n = len(self.tasks)
        fast = self.adapters.fast_params
        self.shadows = [
            Shadow(name, beta, bc, [torch.zeros_like(p) if bc else p.detach().clone() for p in fast], 0, [[None] * n for _ in range(n)])
            for name, beta, bc in rules
        ]
        step = self.adapters.ema_step

        def ema_step_with_shadows(n: int = 1) -> None:  # n updates at once (dual.unit=example), as DualLoRA.ema_step
            step(n)
            with torch.no_grad():
                for sh in self.shadows:
                    torch._foreach_lerp_(sh.raw, list(fast), 1.0 - sh.beta**n)
                    sh.steps += n

        self.adapters.ema_step = ema_step_with_shadows

    def run_stage(self, s: int) -> None:
        super().run_stage(s)  # trained, evaluated and checkpointed: the shadows' rows after it
        stage = self.stages[s]
        last = stage.row == len(self.tasks) - 1
        wanted = list(stage.evaluate) if last else [stage.row]
        slow = self.adapters.slow_params
        keep = [p.detach().clone() for p in slow]
        try:
            for sh in self.shadows:
                with torch.no_grad():
                    torch._foreach_copy_(slow, sh.weights())
                for j in wanted:
                    sh.acc[stage.row][j] = round(self.evaluate_task(j), 4)
        finally:
            with torch.no_grad():
                torch._foreach_copy_(slow, keep)


def fp_ap(a: list[list[float | None]]) -> tuple[float, float]:
    return statistics.fmean(a[-1]), statistics.fmean(a[j][j] for j in range(len(a)))


def pair_config(args, n_train: int, seed: int):
    """The resolved config of one (n_train, seed) pair under the script's arguments."""
    return build_config(args.config, [
        f"data.benchmark={args.benchmark}", f"data.tasks=[{args.tasks}]", f"data.n_train={n_train}",
        f"data.n_test={args.n_test}", f"seed={seed}", "dual.enabled=true", "train.checkpoint_every=0", *args.overrides,
    ])


def check_records(done: list, args, path: Path) -> None:
    """Refuse a results file holding a record these arguments would not have run as it ran."""
    if not isinstance(done, list):
        raise SureclError(f"{path}: not a list of records of this script; give another OUT")
    for r in done:
        if not isinstance(r, dict) or "config" not in r:
            raise SureclError(f"{path}: holds a record without its config (an earlier version of this script); "
                              "give another OUT to run these settings")
        if not same_config(r["config"], pair_config(args, r["n_train"], r["seed"])):
            raise SureclError(f"{path}: n_train {r['n_train']} seed {r['seed']} ran other settings ({r.get('args')}); "
                              "give another OUT, or remove that file and the pair folders to run these")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--benchmark", required=True)
    ap.add_argument("--tasks", default="dbpedia,amazon,agnews")
    ap.add_argument("--n-train", default="120,400,1200")
    ap.add_argument("--n-test", type=int, default=100)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--config", default="slow_surprise")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_intermixed_args()
    try:
        n_trains, seeds = [int(x) for x in args.n_train.split(",")], [int(x) for x in args.seeds.split(",")]
    except ValueError:
        ap.error("--n-train and --seeds take comma-separated integers")
    return measure(args, n_trains, seeds)


def measure(args, n_trains: list[int], seeds: list[int]) -> int:
    out = Path(args.out)
    results_path = out / "ema_window.json"
    try:
        done = json.loads(results_path.read_text()) if results_path.exists() else []
    except (OSError, ValueError) as exc:
        raise SureclError(f"{results_path}: unreadable ({exc}); give another OUT") from None
    check_records(done, args, results_path)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "n_train", "seeds")}
    out.mkdir(parents=True, exist_ok=True)
    for n_train in n_trains:
        for seed in seeds:
            if any(r["n_train"] == n_train and r["seed"] == seed for r in done):
                continue  # its config checked above
            cfg = pair_config(args, n_train, seed)
            probe = ProbeRun(cfg, out / f"n{n_train}-s{seed}", progress=False)
            res = probe.run(fresh=True)
            fast_fp, fast_ap = fp_ap(res["fast"]["accuracy_matrix"])
            rec = {"n_train": n_train, "seed": seed, "steps_per_task": probe.steps_in_stage(probe.stages[0]),
                   "fast": {"fp": fast_fp, "ap": fast_ap}, "wall_s": res["timing"]["total"],
                   "args": settings, "config": cfg.to_dict(),
                   "shadows": {sh.name: dict(zip(("fp", "ap"), fp_ap(sh.acc)), matrix=sh.acc) for sh in probe.shadows}}
            done.append(rec)
            write_json(results_path, done)
            print(f"n_train {n_train} seed {seed}: {rec['steps_per_task']} steps/task, fast FP {fast_fp:.1f}, {rec['wall_s']:.0f} s", flush=True)
    print_table(done)
    return 0


def print_table(done: list[dict]) -> None:
    by_len: dict[int, list[dict]] = {}
    for r in done:
        by_len.setdefault(r["steps_per_task"], []).append(r)
    for steps, recs in sorted(by_len.items()):
        print(f"\n{steps} steps per task, {len(recs)} seed(s): slow - fast, paired (mean over seeds; per seed in brackets)")
        print("| rule | FP slow-fast | AP slow-fast | FP slow |")
        print("|---|---|---|---|")
        for name in recs[0]["shadows"]:
            # auto rules carry their beta in the name, which differs by stream length: match by prefix
            d_fp = [r["shadows"][name]["fp"] - r["fast"]["fp"] for r in recs if name in r["shadows"]]
            d_ap = [r["shadows"][name]["ap"] - r["fast"]["ap"] for r in recs if name in r["shadows"]]
            fps = [r["shadows"][name]["fp"] for r in recs if name in r["shadows"]]
            per = ", ".join(f"{d:+.1f}" for d in d_fp)
            print(f"| {name} | {statistics.fmean(d_fp):+.1f} [{per}] | {statistics.fmean(d_ap):+.1f} | {statistics.fmean(fps):.1f} |")
        print(f"| (fast) | | | {statistics.fmean(r['fast']['fp'] for r in recs):.1f} |")


if __name__ == "__main__":
    script(main)
