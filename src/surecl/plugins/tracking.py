"""Metrics to experiment trackers through ``accelerate``'s tracking API (TensorBoard, W&B, ...):
``surecl run --log-with tensorboard`` (or ``run(..., log_with=["tensorboard"])``).

A plugin like the step log: per logged optimizer step ``train/loss``, ``train/lr``,
``train/buffer`` (entries in the replay buffer) and ``train/replayed``; after each stage's
evaluation every accuracy-matrix cell of its row as ``accuracy/<task>`` (one curve per task
over training steps: where it was learned, where it was forgotten) and
``matrix/row<i>/<task>``, the fast adapter's as ``accuracy_fast/<task>``; the before-training
row at step 0; FP, AP and forgetting as ``summary/*`` at the end. The run's config is stored as
hyper-parameters. ``log.jsonl`` is written as before; trackers are extra.

TensorBoard event files go to ``<out>/tensorboard/surecl/``; with ``tensorboardX`` (the
``surecl[tensorboard]`` extra) or ``tensorboard`` installed. A resumed run appends to them
(steps after the last checkpoint are logged again, as TensorBoard shows the latest value).
"""

from __future__ import annotations

import math

from surecl.errors import SureclError
from surecl.plugins.base import Plugin, Stage, StepRecord

PROJECT = "surecl"
TRACKERS = ("tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "trackio")
"""The names ``--log-with`` takes (accelerate's trackers); ``all`` = every installed one."""


def check_trackers(names: list[str]) -> list[str]:
    """The tracker names, checked: known to accelerate and installed here (one-line error
    otherwise, before any work)."""
    from accelerate.utils import imports

    out = []
    for name in names:
        if name == "all":
            out.append(name)
            continue
        if name not in TRACKERS:
            raise SureclError(f"--log-with: unknown tracker {name!r} (choose from {', '.join(TRACKERS)}, all)")
        available = getattr(imports, f"is_{name}_available", None)
        if available is None or not available():
            extra = "surecl[tensorboard] (tensorboardX)" if name == "tensorboard" else name
            raise SureclError(f"--log-with {name}: the {name} package is not installed (pip install {extra})")
        out.append(name)
    return out


def _hparams(tree: dict, prefix: str = "") -> dict:
    """The config flattened to ``section.key`` -> bool/int/float/str (what trackers store)."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_hparams(value, f"{prefix}{key}."))
        elif isinstance(value, (bool, int, float, str)) or value is None:
            flat[f"{prefix}{key}"] = "" if value is None else value
        else:
            flat[f"{prefix}{key}"] = str(value)
    return flat


class Tracking(Plugin):
    name = "tracking"

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self.started = False

    def _start(self, ctx) -> None:
        if not self.started:
            ctx.accelerator.init_trackers(PROJECT, config=_hparams(ctx.cfg.to_dict()))
            self.started = True

    def _log(self, ctx, values: dict, step: int) -> None:
        self._start(ctx)
        clean = {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}
        if clean:
            ctx.accelerator.log(clean, step=step)

    def after_step(self, ctx, record: StepRecord) -> None:
        if record.step % ctx.cfg.log_every == 0:
            self._log(ctx, {"train/loss": record.loss, "train/lr": record.lr, "train/buffer": len(ctx.policy),
                            "train/replayed": len(record.replayed)}, record.global_step)

    def after_eval(self, ctx, stage: Stage | None) -> None:
        names = [t.name for t in ctx.tasks]
        if stage is None:
            self._log(ctx, {f"accuracy/{n}": v for n, v in zip(names, ctx.state.initial or [])}, 0)
            return
        step = ctx.state.global_step
        row = ctx.state.accuracy[stage.row]
        values = {f"accuracy/{names[j]}": row[j] for j in range(len(names))}
        values.update({f"matrix/row{stage.row}/{names[j]}": row[j] for j in range(len(names))})
        if ctx.state.accuracy_fast is not None:
            fast = ctx.state.accuracy_fast[stage.row]
            values.update({f"accuracy_fast/{names[j]}": fast[j] for j in range(len(names))})
        self._log(ctx, values, step)

    def after_run(self, ctx, results: dict) -> None:
        self._log(ctx, {f"summary/{k}": results.get(k) for k in ("fp", "ap", "forgetting", "bwt")}, ctx.state.global_step)
        ctx.accelerator.end_training()
