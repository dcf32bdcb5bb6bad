"""Metrics to experiment trackers through ``accelerate``'s tracking API (TensorBoard, W&B, ...):
``surecl run --log-with tensorboard`` (or ``run(..., log_with=["tensorboard"])``).

A plugin like the step log: per logged optimizer step ``train/loss``, ``train/lr``,
``train/buffer`` (entries in the replay buffer) and ``train/replayed``; after each stage's
evaluation every score-matrix cell of its row as ``<metric>/<task>``, the task's own metric
(``accuracy/<task>``, ``rouge_l/<task>``, ``exact_match/<task>``, ``perplexity/<task>``: one
curve per task over training steps, where it was learned, where it was forgotten) and
``matrix/row<i>/<task>``, the fast adapter's as ``<metric>_fast/<task>``; the before-training
row at step 0; the general-ability probe (``eval.general``) as ``general/<part>`` (and
``general_fast/<part>``), its before-training values at step 0, before any training step (a
tracker whose steps must rise, W&B, drops a value logged below a step it holds); FP, AP,
forgetting, BWT and the probe's change per part (``summary/general_change/<part>``) as
``summary/*`` at the end, before results.json is written (a run stopped in between is
unfinished, and its rerun sends them). The run's config is stored as hyper-parameters (once in
TensorBoard's folder; a tracker that opens a run per process gets it for each). At the end each
tracker is finished, not accelerate's ``end_training``, which also ends the process group a
program running several runs in the same processes needs. ``log.jsonl`` is written as before;
trackers are extra.

TensorBoard event files go to ``<out>/tensorboard/surecl/``; with ``tensorboardX`` (the
``surecl[tensorboard]`` extra) or ``tensorboard`` installed. A resumed run writes an event file
of its own beside the killed run's (never over it, even within the same second) and logs
nothing twice: ``<out>/tracking.json`` (:data:`MARK`) records what was sent (the last
training step, the matrix rows, the before-training row, the summary), rewritten after each
log, so the steps a killed run logged after its last checkpoint, which the resumed run trains
again, are not sent again (a run that starts over, ``--fresh`` or ``resume=False``, sends all,
and so does a rerun whose configuration, task stream, data, base model or probe differs from
the run that wrote the mark: a run killed before its first checkpoint may be rerun changed).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import unicodedata

from surecl.errors import SureclError
from surecl.metrics import task_metrics
from surecl.plugins.base import Plugin, Stage, StepRecord

PROJECT = "surecl"
MARK = "tracking.json"
"""The run folder's record of what was sent to the trackers (:class:`Tracking`)."""


def known_trackers() -> tuple[str, ...]:
    """The names ``--log-with`` takes: accelerate's trackers, TensorBoard first; ``all`` =
    every installed one."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    return ("tensorboard", *sorted(n for n in LOGGER_TYPE_TO_CLASS if n != "tensorboard"))


def tracker_names(log_with) -> list[str]:
    """``log_with`` as given to :func:`surecl.run` / :class:`~surecl.trainer.ContinualRun`: a list
    of names, one name (``"tensorboard"``, or several joined by commas) or None (no tracker)."""
    if log_with is None:
        return []
    if isinstance(log_with, str):
        return [n.strip() for n in log_with.split(",") if n.strip()]
    if not isinstance(log_with, (list, tuple)) or not all(isinstance(n, str) for n in log_with):
        raise SureclError(f"log_with: expected a list of tracker names (e.g. ['tensorboard']), got {log_with!r}")
    return list(log_with)


def check_trackers(names: list[str]) -> list[str]:
    """The tracker names, checked: known to accelerate and installed here (one-line error
    otherwise, before any work). ``all`` is every installed one, by name (the run folder records
    what each writes, e.g. ``tensorboard/surecl``)."""
    from accelerate.utils import imports

    TRACKERS = known_trackers()

    def installed(name: str) -> bool:
        available = getattr(imports, f"is_{name}_available", None)
        return available is not None and bool(available())

    out = []
    for name in names:
        if name == "all":
            found = [n for n in TRACKERS if installed(n) and n not in out]
            if not found and not out:
                raise SureclError(f"--log-with all: none of the trackers is installed ({', '.join(TRACKERS)})")
            out += found
            continue
        if name in out:
            continue
        if name not in TRACKERS:
            raise SureclError(f"--log-with: unknown tracker {name!r} (choose from {', '.join(TRACKERS)}, all)")
        if not installed(name):
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
        self.sent = {"train": 0, "rows": [], "initial": False, "general_initial": False, "summary": False, "hparams": False}
        """What was sent to the trackers (saved as :data:`MARK`): the last training step, the
        matrix rows, whether the before-training row, the probe's before-training values, the
        summary and TensorBoard's hyper-parameters were."""

    def _start(self, ctx) -> None:
        if not self.started:
            ctx.accelerator.init_trackers(PROJECT, config=None, init_kwargs=_writer_kwargs())
            self.started = True
            for tracker in ctx.accelerator.trackers:
                _count_events(tracker)
            if getattr(ctx, "continuing", False):  # a rerun into the same folder: what an earlier process sent stays sent
                mark = _read_mark(ctx.out_dir / MARK)
                if mark and not _same_run(mark, ctx):
                    # an earlier process of another configuration, task stream, data, base model or
                    # probe (killed before its first checkpoint, so nothing refused the change): this run's steps are new
                    mark = {}
                    ctx.log("tracking: the earlier process logged another configuration, task stream or data; this run logs "
                            "every step again (the earlier event files stay beside this run's)")
                self.sent.update({k: v for k, v in mark.items() if k in self.sent})
            self.sent.update(_identity(ctx))
            # the hyper-parameters: a W&B / MLflow / ... run of this process is a new run there and
            # needs them; TensorBoard's folder holds them once (a resumed run does not add a session)
            hparams = _hparams(ctx.cfg.to_dict())
            for tracker in ctx.accelerator.trackers:
                if not (tracker.name == "tensorboard" and self.sent["hparams"]):
                    tracker.store_init_configuration(hparams)
            if any(t.name == "tensorboard" for t in ctx.accelerator.trackers) and not self.sent["hparams"]:
                self._sent(ctx, "hparams", True)

    def _log(self, ctx, values: dict, step: int) -> None:
        clean = {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}
        if clean:
            ctx.accelerator.log(clean, step=step)

    def _sent(self, ctx, key: str, value) -> None:
        """Record ``value`` under ``key`` as sent, in memory and in :data:`MARK` (main process)."""
        if key == "rows":
            self.sent["rows"] = sorted({*self.sent["rows"], value})
        else:
            self.sent[key] = value
        if ctx.accelerator.is_main_process:
            _settle(ctx.accelerator.trackers)
            _write_mark(ctx.out_dir / MARK, self.sent)

    def after_step(self, ctx, record: StepRecord) -> None:
        if record.step % ctx.cfg.log_every == 0:
            self._start(ctx)
            if record.global_step <= self.sent["train"]:
                return  # logged before this run resumed from an earlier checkpoint
            self._log(ctx, {"train/loss": record.loss, "train/lr": record.lr, "train/buffer": len(ctx.policy),
                            "train/replayed": len(record.replayed)}, record.global_step)
            self._sent(ctx, "train", record.global_step)

    def before_task(self, ctx, stage: Stage) -> None:
        # the probe's before-training values at step 0 before any step is logged: a tracker whose
        # steps must rise (W&B) drops a value logged at a step below one it already holds
        self._start(ctx)
        self._general_initial(ctx)

    def after_eval(self, ctx, stage: Stage | None) -> None:
        self._start(ctx)
        names = [t.name for t in ctx.tasks]
        metric_of = task_metrics(ctx.tasks, ctx.cfg.eval.mode)
        keys = [f"{metric_of[name]}/{name}" for name in names]
        self._general_initial(ctx)
        if stage is None:
            if not self.sent["initial"]:
                self._log(ctx, dict(zip(keys, ctx.state.initial or [])), 0)
                self._sent(ctx, "initial", True)
            return
        if stage.row in self.sent["rows"]:
            return
        step = ctx.state.global_step
        row = ctx.state.accuracy[stage.row]
        values = {keys[j]: row[j] for j in range(len(names))}
        values.update({f"matrix/row{stage.row}/{names[j]}": row[j] for j in range(len(names))})
        if ctx.state.accuracy_fast is not None:
            fast = ctx.state.accuracy_fast[stage.row]
            values.update({_fast(keys[j]): fast[j] for j in range(len(names))})
        for prefix, rows in (("general", ctx.state.general), ("general_fast", ctx.state.general_fast)):
            if rows is not None and rows[stage.row] is not None:
                values.update({f"{prefix}/{part}": v for part, v in rows[stage.row].items()})
        self._log(ctx, values, step)
        self._sent(ctx, "rows", stage.row)

    def _general_initial(self, ctx) -> None:
        """The probe's before-training values at step 0, once (with or without ``eval.before``)."""
        initial = getattr(ctx.state, "general_initial", None)
        if initial and not self.sent["general_initial"]:
            self._log(ctx, {f"general/{part}": v for part, v in initial.items()}, 0)
            self._sent(ctx, "general_initial", True)

    def export(self, ctx, results: dict) -> None:
        # the summary before results.json is written (export runs on the main process just
        # before it): a run stopped in between is unfinished, and its rerun sends it
        self._start(ctx)
        if not self.sent["summary"]:
            values = {f"summary/{k}": results.get(k) for k in ("fp", "ap", "forgetting", "bwt")}
            values.update({f"summary/general_change/{part}": v for part, v in ((results.get("general") or {}).get("change") or {}).items()})
            self._log(ctx, values, ctx.state.global_step)
            self._sent(ctx, "summary", True)

    def after_run(self, ctx, results: dict) -> None:
        # each tracker closed; not accelerate's end_training, which also ends the process group
        # that a program running a second run in the same processes still needs
        for tracker in ctx.accelerator.trackers:
            tracker.finish()


def _writer_kwargs() -> dict:
    """The TensorBoard writer's options: an event file name of its own for every process.
    tensorboardX names the file ``events.out.tfevents.<whole seconds>.<host>`` and opens it for
    writing, so a rerun started within the same second as the killed run it resumes would
    truncate that run's events; a suffix of the start time in nanoseconds and the process id
    keeps the files apart and in the order they were started (TensorBoard reads a folder's
    event files in name order)."""
    return {"tensorboard": {"filename_suffix": f".{time.time_ns():020d}.{os.getpid()}"}}


def _fast(key: str) -> str:
    """``accuracy/<task>`` -> ``accuracy_fast/<task>`` (the fast adapter's curve of a cell)."""
    metric, _, name = key.partition("/")
    return f"{metric}_fast/{name}"


def _event_writer(tracker):
    """A TensorBoard tracker's tensorboardX ``EventFileWriter`` (None for other trackers)."""
    inner = getattr(tracker, "tracker", None)
    return getattr(getattr(inner, "file_writer", None), "event_writer", None)


def _count_events(tracker) -> None:
    """Count the events a tensorboardX writer is given and those its worker thread has written
    (the writer hands them over through a ``multiprocessing.Queue``, whose ``empty()`` says
    nothing of an event still on its way), so :func:`_settle` can wait for exactly these."""
    writer = _event_writer(tracker)
    record = getattr(writer, "_ev_writer", None)
    if writer is None or record is None or getattr(writer, "_surecl_events", None) is not None:
        return
    events = {"given": {}, "written": 0}  # the events given and not yet written, by their bytes (the queue pickles them)
    add, write = writer.add_event, record.write_event

    def key(event):
        try:
            return event.SerializeToString()
        except Exception:
            return None

    def add_event(event):
        k = key(event)
        if k is not None:
            events["given"][k] = events["given"].get(k, 0) + 1
        add(event)

    def write_event(event):
        write(event)
        k = key(event)
        left = events["given"].get(k, 0)
        if left > 1:
            events["given"][k] = left - 1
        elif left == 1:
            del events["given"][k]
        events["written"] += 1

    writer.add_event, record.write_event = add_event, write_event
    writer._surecl_events = events


SETTLE_SECONDS = 30.0
"""The longest :func:`_settle` waits for a writer's worker thread (a loaded machine is slow)."""


def _settle(trackers) -> None:
    """Let each tracker write what it was given before :data:`MARK` says it was sent: a
    TensorBoard writer (tensorboardX) hands events to a worker thread, which a stopped process
    loses; wait (at most :data:`SETTLE_SECONDS`) until the worker has written every event given
    to it (:func:`_count_events`), then flush the file."""
    for tracker in trackers:
        events = getattr(_event_writer(tracker), "_surecl_events", None)
        if events is not None:
            deadline = time.monotonic() + SETTLE_SECONDS
            while events["given"] and time.monotonic() < deadline:
                time.sleep(0.001)
        flush = getattr(getattr(tracker, "tracker", None), "flush", None)
        if callable(flush):
            with contextlib.suppress(Exception):
                flush()


def _read_mark(path) -> dict:
    """:data:`MARK`'s content ({} when missing or unreadable: everything is sent again); with the
    config and task names of the run that wrote it where it recorded them."""
    from surecl.data.task import composed_keys

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        out = {"train": int(data["train"]), "rows": [int(r) for r in data["rows"]], "initial": bool(data["initial"]),
               "general_initial": bool(data.get("general_initial", False)), "summary": bool(data["summary"]),
               "hparams": bool(data.get("hparams", False))}
        if isinstance(data.get("config"), dict) and isinstance(data.get("tasks"), list):
            out["config"], out["tasks"] = data["config"], [unicodedata.normalize("NFC", str(t)) for t in data["tasks"]]
        for key in ("data", "base", "general"):  # marks since these were recorded (task names as read now: NFC)
            if key in data:
                out[key] = composed_keys(data[key])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return {}
    return out


def _identity(ctx) -> dict:
    """What makes a rerun the same run, as a checkpoint's resume checks it: the config, the task
    names, each task's data fingerprint, the base model's and the probe's."""
    from surecl.run_results import fingerprints, probe_fingerprints

    return {"config": ctx.cfg.to_dict(), "tasks": [t.name for t in ctx.tasks], "data": fingerprints(ctx),
            "base": getattr(ctx, "base_fingerprint", None), "general": probe_fingerprints(ctx)}


def _same_run(mark: dict, ctx) -> bool:
    """Whether :data:`MARK` was written by a run of this configuration, task stream, data, base
    model and probe (as a checkpoint's resume checks them, :func:`surecl.config.same_config`); a
    mark from before marks recorded one of them is compared on what it recorded."""
    from surecl.config import same_config

    if "config" not in mark:
        return True
    if mark["tasks"] != [t.name for t in ctx.tasks] or not same_config(mark["config"], ctx.cfg):
        return False
    now = _identity(ctx)
    return all(mark[key] == now[key] for key in ("data", "base", "general") if key in mark)


def _write_mark(path, sent: dict) -> None:
    """Replace :data:`MARK` (a temporary renamed into place, without fsync: it is rewritten
    after every log, and a lost update only means a step logged twice)."""
    from surecl.files import file_mode

    tmp = path.with_name(f".{path.name}.surecl-{os.getpid():08d}")  # a temporary Manifest.temporaries knows
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, file_mode())
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(sent, f)
    os.replace(tmp, path)
