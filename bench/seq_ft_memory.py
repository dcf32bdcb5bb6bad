"""Peak RSS of sequential full fine-tuning (``seq_ft``) on SmolLM2-135M: a few training steps
at batch 8 on the longest examples of an embedded task, through the run's own step
(micro-batch slices, shared prefix), then one checkpoint; and, in a fresh process, what a
resume from that checkpoint holds. Each phase prints the peak RSS so far and the figure
computed from the parameter count (fp32 weights + gradients + two AdamW moments).

Usage (the machine otherwise idle; each mode in its own process, since the peak only grows):

    OMP_NUM_THREADS=1 python bench/seq_ft_memory.py train /tmp/seqft-mem      # steps + a checkpoint
    OMP_NUM_THREADS=1 python bench/seq_ft_memory.py resume /tmp/seqft-mem     # restore it + one step
    OMP_NUM_THREADS=1 python bench/seq_ft_memory.py train /tmp/lora-mem --config seq_lora   # the LoRA step, to compare

Options: ``--config`` (default ``seq_ft``), ``--steps`` (default 3), ``--batch`` (default 8),
then ``key=value`` overrides (default data: 64 examples of ``newsgroups``, the longest prompts
of the embedded stream). ``--config tiny,seq_ft data.tasks=[colors]`` checks the script in seconds.

``train`` writes a run folder of its own (a checkpoint outside ``surecl run``), so it refuses an
OUT that exists and is not empty, and holds the folder's run lock while it writes; ``resume``
only reads OUT. Peak RSS is ``ru_maxrss`` (KiB on Linux) in GB of 10^9 bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import time
import warnings
from pathlib import Path

from common import script

from surecl.checkpoint import LOCK, run_lock
from surecl.config import build_config
from surecl.errors import SureclError
from surecl.trainer import ContinualRun

DEFAULTS = ["data.tasks=[newsgroups]", "data.n_train=64", "data.n_test=8", "eval.before=false", "train.checkpoint_every=0"]


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # ru_maxrss: KiB on Linux


def say(what: str, since: float | None = None) -> None:
    took = f" ({time.perf_counter() - since:.1f} s)" if since is not None else ""
    print(f"{what:44s} peak RSS {peak_gb():6.2f} GB{took}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["train", "resume"])
    ap.add_argument("out", type=Path)
    ap.add_argument("--config", default="seq_ft")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_intermixed_args()
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    if args.mode == "train":  # checked before the lock too, which would write its holder into another run's lock file
        check_empty(args.out)
    # train writes checkpoints and a manifest: only into a folder of its own, under the run lock
    with run_lock(args.out) if args.mode == "train" else contextlib.nullcontext():
        measure(args)


def check_empty(out: Path) -> None:
    """Refuse an OUT holding anything (but the lock file this process took): a checkpoint written
    outside ``run()`` would prune another run's checkpoints and rewrite its manifest."""
    if out.exists() and (not out.is_dir() or any(p.name != LOCK for p in out.iterdir())):
        raise SureclError(f"{out} exists and is not an empty folder; train writes a run folder of its own: give a new OUT")


def measure(args) -> None:
    if args.mode == "train":
        check_empty(args.out)  # again inside the lock: a run may have started there since
    elif not args.out.is_dir():
        raise SureclError(f"{args.out} is not a folder: run the train mode into it first")
    say("python, torch, surecl imported")
    start = time.perf_counter()
    cfg = build_config(args.config, [*DEFAULTS, f"train.batch_size={args.batch}", *args.overrides])
    run = ContinualRun(cfg, args.out, progress=False)
    trained = sum(p.numel() for p in run.trained_params)
    base = sum(p.numel() for p in run.adapters.base_parameters().values())
    state = 4 * trained * 4  # fp32 weights, gradients, AdamW exp_avg and exp_avg_sq of what is trained
    print(
        f"{cfg.model.name}: {base / 1e6:.2f} M base parameters (tied weights once), {trained / 1e6:.2f} M trained; "
        f"base weights {4 * base / 1e9:.3f} GB, trained weights + grads + 2 moments {state / 1e9:.3f} GB"
    )
    say("run built (model, data, optimizer)", start)
    if args.mode == "resume":
        start = time.perf_counter()
        found = run.restore()
        if found is None:
            raise SureclError(f"no checkpoint under {args.out}: run the train mode into it first")
        say(f"restored {found.name}", start)
    stage = run.stage = run.stages[0]
    items = run.train_sets[0]
    longest = sorted(range(len(items)), key=lambda i: len(items[i]), reverse=True)[: args.batch]
    current = [(0, i) for i in longest]
    tokens = args.batch * max(len(items[i]) for i in longest)
    print(f"batch: the {args.batch} longest examples, {tokens} padded tokens (micro_batch_tokens={cfg.train.micro_batch_tokens})")
    run.model.train()
    steps = 1 if args.mode == "resume" else args.steps
    for k in range(steps):
        start = time.perf_counter()
        record = run.train_step(run, stage, k, steps, current, [])
        run.state.global_step = record.global_step
        say(f"step {k + 1}: loss {record.loss:.4f}", start)
    if args.mode == "train":
        run.state.batches, run.state.step = [longest], steps  # named as a mid-task checkpoint
        start = time.perf_counter()
        run.checkpoint()
        folder = max((args.out / "checkpoints").glob("stage-*"))
        size = sum(f.stat().st_size for f in folder.iterdir())
        say(f"checkpoint {folder.name}: {size / 1e9:.3f} GB on disk", start)
        print(f"  formula: 12 bytes x {trained} trained parameters = {12 * trained / 1e9:.3f} GB (+ the rest of the run's state)")


if __name__ == "__main__":
    script(main)
