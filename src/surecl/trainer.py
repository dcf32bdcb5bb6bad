"""The continual loop, top to bottom: data -> buffer -> adapters -> metrics (the paper's
Algorithm 1).

For each stage (one task, or all tasks for MTL), :meth:`ContinualRun.run_stage`:

1. every plugin's ``before_task``: the optimizer's (fresh AdamW state with
   ``train.fresh_optimizer``), the method's (per-task FT: fresh adapters), the replay policy's
   (score the task's data for surprise and/or insert its selection into the buffer, depending on
   the timing variant);
2. :meth:`ContinualRun.train_stage`: optimizer steps over the stage's planned batches; a step's
   replayed examples, drawn uniformly from the buffer (``replay.ratio``'s count on every step,
   or ``replay.batch_size`` every ``replay.every``-th step), join the current batch;
   :class:`surecl.step.TrainStep` takes the step and every plugin's ``after_step`` gets its
   :class:`~surecl.plugins.base.StepRecord` (the slow adapter's EMA step, buffer insertion and
   aging, the ``log.jsonl`` line);
3. every plugin's ``after_task`` (in reverse order: the policy's after-task scoring, then the
   method's Fisher estimate or snapshot);
4. every task seen so far is evaluated inside the plugins' ``eval_context`` (the slow adapter
   if dual, a per-task snapshot, ...), filling one row of the accuracy matrix; a checkpoint of
   every component's state is written.

The run is the plugins' context (``ctx``, :class:`~surecl.plugins.base.RunContext`): it holds
the data, the model and the services plugins use (``score``, ``surprise_of_task``, ``batch``).
It is built by :func:`surecl.run_setup.build_run`; evaluation lives in :mod:`surecl.run_eval`,
the folder and its checkpoints in :mod:`surecl.run_folder`, the results in
:mod:`surecl.run_results`. A step's replayed entries come from the plugins' ``sample_replay``
hook and every input's prefix from their ``input_prefix`` hook.
The loop is written against ``accelerate.Accelerator`` so the same code runs on one CPU, a GPU
or several processes.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from pathlib import Path

import torch
from tqdm.auto import tqdm

import surecl.checkpoint as checkpoint
import surecl.run_eval as run_eval
import surecl.run_folder as run_folder
import surecl.run_results as run_results
from surecl.config import RunConfig
from surecl.data.encode import Encoded, bucketed_batches, collate, uniform_batches
from surecl.data.task import Task, _found
from surecl.errors import SureclError
from surecl.files import check_out_dir
from surecl.logs import logger
from surecl.plan import epoch_members, planned_steps, replay_count
from surecl.plugins.base import Plugin, Stage
from surecl.plugins.faults import fault_point
from surecl.processes import agreed, from_main, peers_stop_in_one_line
from surecl.replay.policies import check_scores
from surecl.replay.surprise import score_examples
from surecl.run_setup import build_run
from surecl.run_state import InputSets, RunState, release_memory

__all__ = ["ContinualRun", "InputSets", "RunState", "release_memory", "run"]


class ContinualRun:
    """One continual run: built from a config by :func:`~surecl.run_setup.build_run`, then
    :meth:`run` executes it.

    ``plugins``: extra :class:`~surecl.plugins.base.Plugin` instances taking part in the run
    (after the replay policy, before the step log), each checkpointed under ``plugin:<name>``.
    ``model`` and ``tokenizer``: a transformers model and its tokenizer built by the caller
    (both, in place of ``model.name``); ``tasks``: a list of :class:`~surecl.data.task.Task`
    (in place of ``data.benchmark`` / ``data.jsonl``; still sampled by ``data.n_train`` /
    ``n_test``). After :meth:`run`, :attr:`peft_model` is the trained model."""

    def __init__(
        self, cfg: RunConfig, out_dir: Path, *, progress: bool = True, cache_dir: Path | None = None, plugins: list[Plugin] = (),
        log_with: list[str] = (), model=None, tokenizer=None, tasks: list[Task] | None = None,
    ):
        check_arguments(cfg, out_dir, plugins, cache_dir, log_with)
        with peers_stop_in_one_line():
            build_run(self, cfg, out_dir, progress=progress, cache_dir=cache_dir, plugins=plugins, log_with=log_with, model=model,
                      tokenizer=tokenizer, tasks=tasks)

    def input_prefix(self, task: int) -> tuple[int, ...]:
        """Every plugin's input prefix for ``task`` now but the left-out ones' (none before the plugins exist)."""
        return () if self.plugins is None else self.plugins.input_prefix(self, task, skip=self.left_out)

    @property
    def peft_model(self):
        """The trained PEFT model with the adapter that answers active (slow if dual), in eval mode
        (a method's input prefix, such as Progressive Prompts' soft prompts, is not part of it)."""
        self.adapters.activate(self.adapters.eval_adapter)
        return self.accelerator.unwrap_model(self.model).eval()

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The AdamW over what the method trains (owned by :attr:`train_step`)."""
        return self.train_step.optimizer

    def reset_optimizer(self) -> None:
        self.train_step.reset()

    def steps_in_stage(self, stage: Stage) -> int:
        return planned_steps([len(self.train_sets[t]) for t in stage.tasks], self.cfg, [self.tasks[t].name for t in stage.tasks])

    def log(self, message: str) -> None:
        """A message for the user on the ``surecl`` logger (main process only): ``warning: ...``
        at WARNING, the rest at INFO (the CLI shows them as ``surecl: ...`` lines)."""
        if self.accelerator.is_main_process:
            if message.startswith("warning: "):
                logger.warning(message.removeprefix("warning: "))
            else:
                logger.info(message)

    def stage_name(self, stage: Stage) -> str:
        return "+".join(self.tasks[t].name for t in stage.tasks) if len(stage.tasks) > 1 else self.tasks[stage.tasks[0]].name

    # ------------------------------------------------------------------ services for plugins

    def sharded(self, fn, items: list) -> list:
        """``fn`` on this process's share of ``items`` (rank r: r, r+W, ...), gathered in order on every rank."""
        if self.world == 1:
            return fn(items)
        from accelerate.utils import gather_object

        parts = gather_object([fn(items[self.rank :: self.world])])
        out = [None] * len(items)
        for r, part in enumerate(parts):
            out[r :: self.world] = part
        return out

    def score(self, items: list[Encoded], scope: str | None = None, reduction: str | None = None) -> list[float]:
        """Surprise of ``items`` under the current fast adapter, without dropout or grad
        (``scope`` and ``reduction`` default to ``replay.scope`` and ``replay.reduction``)."""
        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        model.eval()
        try:
            return self.sharded(lambda part: score_examples(
                model, part, pad_id=self.tokenizer.pad_token_id, is_seq2seq=self.is_seq2seq, scope=scope or self.cfg.replay.scope,
                reduction=reduction or self.cfg.replay.reduction, batch_size=self.cfg.eval.batch_size, device=self.device,
                share_prefix=self.share_prefix, eos_id=self.tokenizer.eos_token_id), items)
        finally:
            model.train(was_training)

    def surprise_of_task(self, task: int, scope: str | None = None, reduction: str | None = None) -> list[float]:
        """Surprise of every training example of ``task`` (the policies' scorer)."""
        start = time.perf_counter()
        fault_point(f"score:{task}")
        scores = self.score(self.train_sets[task], scope, reduction)
        check_scores(scores, self.tasks[task].name, list(range(len(scores))))
        release_memory()
        self.state.seconds["score"] += time.perf_counter() - start
        return scores

    def batch(self, items: list[Encoded], shared: bool = False) -> dict[str, torch.Tensor]:
        """A collated batch on the device; ``shared``: with the rows' shared prompt prefix split
        off (when ``model.share_prefix`` is on and they share enough of one)."""
        batch = collate(items, self.tokenizer.pad_token_id, self.is_seq2seq, share_prefix=shared and self.share_prefix)
        return {k: v.to(self.device) for k, v in batch.items()}

    def evaluate_task(self, j: int, method_weights: bool = True, adapter: str | None = None) -> float:
        """Task ``j``'s score under the plugins' evaluation weights (:func:`surecl.run_eval.evaluate_task`)."""
        return run_eval.evaluate_task(self, j, method_weights, adapter)

    # ------------------------------------------------------------------ the loop

    def run(self, resume: bool = True, fresh: bool = False) -> dict:
        """Run into ``out_dir``: continue from its newest valid checkpoint (``resume``), or with
        ``fresh`` first remove what an earlier run wrote there (only files surecl writes). The
        main process holds the folder's lock throughout (:func:`checkpoint.run_lock`): a second
        process there stops with :class:`~surecl.errors.RunBusy` before it touches anything.

        An object runs once: a second call returns the folder's finished run again (its results.json,
        the learner restored from its last checkpoint); anything else (``fresh``, ``resume=False``, a
        run that stopped before its end) is one line, as the object holds the earlier run's state.
        torch's generators are the run's own while it runs, and the caller's again when it ends."""
        # a collective failing as another process stopped alone: one line, not its traceback
        with peers_stop_in_one_line(), self._own_streams():
            again = self.ran
            if again and (fresh or not resume or self.state.next_stage < len(self.stages)):
                self._ran_already(fresh)
            agree = from_main if self.world > 1 else None
            # read before the lock file is made: a folder an earlier version wrote is known by its lock file
            self.outputs = None
            agreed(self, lambda: setattr(self, "outputs", checkpoint.Manifest(self.out_dir)))
            with checkpoint.run_lock(self.out_dir, self.accelerator.is_main_process, agree):
                finished = run_folder.open_folder(self, resume, fresh)
                if finished is not None:  # this run, finished, its checkpoints removed: nothing to do
                    return finished
                if again:  # the folder does not hold this run finished (its finish stopped, or another run's)
                    self._ran_already(fresh)
                self.ran = True
                self.wall = time.perf_counter()
                # a run resumed from a checkpoint written before CPU time was counted leaves it out
                seconds = self.state.seconds
                self.cpu = time.process_time() if "cpu" in seconds or not seconds.get("total") else None
                with self.steplog.opened(self.out_dir / "log.jsonl", self.accelerator.is_main_process):
                    if run_eval.before_training(self):
                        self.checkpoint()
                    for s in range(self.state.next_stage, len(self.stages)):
                        self.run_stage(s)
                self.clock()
                return run_results.finish(self)

    def _ran_already(self, fresh: bool) -> None:
        raise SureclError(f"ContinualRun.run{'(fresh=True)' if fresh else ''}: this ContinualRun already ran into {self.out_dir} "
                          "and holds that run's state; build a new ContinualRun (on a freshly loaded base model) to "
                          + ("start over" if fresh else "run again"))

    @contextlib.contextmanager
    def _own_streams(self):
        """torch's generators as the run's own while it runs (as its build left them, then as it
        draws or a checkpoint restores them), the caller's given back when it ends however it
        ends: the caller's own seeding holds for its later draws."""
        caller = run_folder.generators(self.device)
        if getattr(self, "torch_streams", None) is not None:
            run_folder.set_generators(self.torch_streams, self.device)
        try:
            yield
        finally:
            self.torch_streams = run_folder.generators(self.device)
            run_folder.set_generators(caller, self.device)

    def clock(self) -> None:
        """Add the wall time since the last call to ``seconds["total"]`` and this process's CPU
        time (all its threads; a pause or a neighbour on the cores adds nothing) to
        ``seconds["cpu"]`` (both checkpointed)."""
        now, cpu = time.perf_counter(), time.process_time()
        self.state.seconds["total"] = self.state.seconds.get("total", 0.0) + now - self.wall
        if self.cpu is not None:
            self.state.seconds["cpu"] = self.state.seconds.get("cpu", 0.0) + cpu - self.cpu
            self.cpu = cpu
        self.wall = now

    def run_stage(self, s: int) -> None:
        """Stage ``s``: prepare it (plugins' ``before_task``, batch plan), train it, wrap it up
        (``after_task``), evaluate, checkpoint. A run resumed inside the stage skips the first part."""
        stage = self.stage = self.stages[s]
        if self.state.batches is None:  # not resuming inside this stage
            self.plugins.before_task(self, stage)
            self.state.batches, self.state.step = self.plan_batches(stage), 0
        self.train_stage(stage)
        self.state.batches, self.state.step = None, 0
        self.plugins.after_task(self, stage)
        run_eval.evaluate_stage(self, stage)
        if self.general is not None:
            run_eval.evaluate_general(self, stage)
        self.plugins.after_eval(self, stage)
        self.state.next_stage = s + 1
        fault_point(f"stage_end:{s}")
        self.checkpoint()

    def train_stage(self, stage: Stage) -> None:
        """The stage's steps from ``state.step`` on: the planned batch with the entries the
        plugins' ``sample_replay`` hook draws (``count`` by :func:`surecl.plan.replay_count`);
        one optimizer step; its record to every plugin."""
        pool, batches = self._pool(stage), self.state.batches
        total, sizes = len(batches), [len(b) for b in batches]
        self.model.train()
        bar = tqdm(total=total, initial=self.state.step, desc=f"train {self.stage_name(stage)}", disable=not self.progress or not self.accelerator.is_main_process, leave=False)
        start = time.perf_counter()
        for step in range(self.state.step, total):
            current = [pool[k] for k in batches[step]]
            replayed = self.plugins.sample_replay(self, stage, step, replay_count(step, sizes, self.cfg))
            record = self.train_step(self, stage, step, total, current, replayed)
            self.state.global_step = record.global_step
            self.plugins.after_step(self, record)
            bar.set_postfix(loss=f"{record.loss:.3f}", buf=len(self.policy))
            bar.update(1)
            self.state.step = step + 1
            if self.state.step % 16 == 0:
                release_memory()  # a few ms every 16 steps (~1 minute on CPU) against heap fragmentation
            every = self.cfg.train.checkpoint_every
            if every and self.state.step % every == 0 and self.state.step < total:
                self.state.seconds["train"] += time.perf_counter() - start
                start = time.perf_counter()
                self.checkpoint()
        bar.close()
        release_memory()
        self.state.seconds["train"] += time.perf_counter() - start

    def plan_batches(self, stage: Stage) -> list[list[int]]:
        """The stage's batches (indices into its example pool), fixed at stage start so a
        resumed run replays exactly the same order."""
        pool = self._pool(stage)
        batches: list[list[int]] = []
        # Each epoch over the tasks with epochs left (train.epochs_per_task; a stage of one task,
        # or of tasks that train alike, shuffles its whole pool every epoch)
        for members in epoch_members(self.cfg, [self.tasks[t].name for t in stage.tasks]):
            held = [stage.tasks[k] for k in members]
            index = [k for k, (t, _) in enumerate(pool) if t in held]
            if self.cfg.train.batching == "uniform":
                drawn = uniform_batches(len(index), self.cfg.train.batch_size, self.rng)
            else:
                drawn = bucketed_batches([len(self.train_sets[pool[k][0]][pool[k][1]]) for k in index], self.cfg.train.batch_size, self.rng)
            batches.extend([[index[k] for k in batch] for batch in drawn])
        return batches[: self.steps_in_stage(stage)]

    def _pool(self, stage: Stage) -> list[tuple[int, int]]:
        return [(t, i) for t in stage.tasks for i in range(len(self.train_sets[t]))]

    def checkpoint(self) -> None:
        """Checkpoint every component's state (main process) after the last finished step."""
        if self.wall is not None:
            self.clock()
        # every process's own generator states (dropout masks are drawn per process, and their
        # streams part as each process draws for its own rows), gathered for the main process to save
        self.rank_rng = run_folder.gather_rng(self) if self.world > 1 else None
        agreed(self, lambda: run_folder.save(self))  # also the processes' barrier after a save

    def restore(self) -> Path | None:
        return run_folder.restore(self)  # the newest valid checkpoint, into the run and its components


def check_arguments(cfg, out_dir, plugins, cache_dir, log_with=()) -> None:
    """Refuse, in one line before anything is built or written, what a caller in Python may pass
    that the CLI never does: a config that is no :class:`RunConfig`, an output folder the CLI
    would refuse (:func:`surecl.files.check_out_dir`: an empty one, an unset variable's, is the
    current folder), plugins that are no list of :class:`~surecl.plugins.base.Plugin`, a cache
    folder that is a file, trackers that are no list of names (a bare ``"tensorboard"`` would be
    read one letter at a time)."""
    if not isinstance(cfg, RunConfig):
        hint = f"surecl.build_config({cfg!r})" if isinstance(cfg, str) else "surecl.build_config(preset, overrides)"
        raise SureclError(f"cfg: expected a RunConfig, not {_found(cfg)}; build one with {hint}")
    for arg, value in (("out_dir", out_dir), ("cache_dir", cache_dir)):
        if not isinstance(value, (str, os.PathLike)) and (arg == "out_dir" or value is not None):
            raise SureclError(f"{arg}: expected a folder path (str or Path), not {_found(value)}")
    check_out_dir(out_dir, "out_dir")
    if cache_dir is not None:
        if not str(cache_dir).strip():
            raise SureclError("cache_dir: empty; give a folder, or None for the default cache")
        probe = Path(cache_dir).expanduser()
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if probe.exists() and not probe.is_dir():
            raise SureclError(f"cache_dir: {probe} is a file, not a directory; give a folder, or None for the default cache")
    if not isinstance(plugins, (list, tuple)):
        raise SureclError(f"plugins: expected a list of Plugin instances, not {_found(plugins)}")
    for k, plugin in enumerate(plugins):
        if not isinstance(plugin, Plugin):
            raise SureclError(f"plugins: item {k} is {_found(plugin)}, not a Plugin (an instance of a surecl.Plugin subclass)")
    if not isinstance(log_with, (list, tuple)) or not all(isinstance(name, str) for name in log_with):
        raise SureclError(f"log_with: expected a list of tracker names, e.g. [\"tensorboard\"], not {_found(log_with)}")


def run(
    cfg: RunConfig, out_dir: Path, *, resume: bool = True, fresh: bool = False, progress: bool = True, cache_dir: Path | None = None,
    plugins: list[Plugin] = (), log_with: list[str] = (), model=None, tokenizer=None, tasks: list[Task] | None = None,
) -> dict:
    """Run (or resume) one continual run into ``out_dir``; return the results dict.

    ``fresh``: start over, removing what an earlier run wrote there (see :meth:`ContinualRun.run`).
    ``plugins``: extra plugins taking part in the run (:class:`ContinualRun`). ``log_with``:
    experiment trackers (``["tensorboard"]``, ``wandb``, ...; :mod:`surecl.plugins.tracking`).
    ``model`` + ``tokenizer`` and/or ``tasks``: built by the caller, in place of ``model.name`` and
    ``data.*`` (see :class:`ContinualRun`; its ``peft_model`` is the trained model)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*use_cache=True.*")
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return ContinualRun(
            cfg, out_dir, progress=progress, cache_dir=cache_dir, plugins=plugins, log_with=log_with, model=model, tokenizer=tokenizer, tasks=tasks,
        ).run(resume=resume, fresh=fresh)
