"""The continual loop, top to bottom: data -> buffer -> adapters -> metrics (the paper's
Algorithm 1).

For each stage (one task, or all tasks for MTL), :meth:`ContinualRun.run_stage`:

1. every plugin's ``before_task``: the optimizer's (fresh AdamW state with
   ``train.fresh_optimizer``), the method's (per-task FT: fresh adapters), the replay policy's
   (score the task's data for surprise and/or insert its selection into the buffer, depending on
   the timing variant);
2. :meth:`ContinualRun.train_stage`: optimizer steps over the stage's planned batches; every
   ``replay.every``-th step a replay batch drawn uniformly from the buffer joins the current
   batch; :class:`surecl.step.TrainStep` takes the step and every plugin's ``after_step``
   gets its :class:`~surecl.plugins.base.StepRecord` (the slow adapter's EMA step, buffer
   insertion and aging, the ``log.jsonl`` line);
3. every plugin's ``after_task`` (in reverse order: the policy's after-task scoring, then the
   method's Fisher estimate or snapshot);
4. every task seen so far is evaluated inside the plugins' ``eval_context`` (the slow adapter
   if dual, a per-task snapshot, ...), filling one row of the accuracy matrix; a checkpoint of
   every component's state is written.

The run is the plugins' context (``ctx``, :class:`~surecl.plugins.base.RunContext`): it holds
the data, the model and the services plugins use (``score``, ``surprise_of_task``, ``batch``).
The loop is written against ``accelerate.Accelerator`` so the same code runs on one CPU, a GPU
or several processes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration
from tqdm.auto import tqdm

import surecl.checkpoint as checkpoint
import surecl.metrics as metrics
from surecl.adapters import DualLoRA, beta_per_step, resolve_beta
from surecl.config import RunConfig
from surecl.data.encode import Encoded, TaskEncoder, bucketed_batches, collate, uniform_batches
from surecl.data.general import load_general_probe
from surecl.data.loading import caller_stream, caller_tasks, load_stream
from surecl.data.task import Task
from surecl.errors import SureclError
from surecl.evaluate import generate_answers, perplexity, rank_answers, task_score
from surecl.logs import logger
from surecl.model import default_cache_dir, host_info, load_model, prepare_model
from surecl.plan import ema_units, planned_steps, replay_count, stage_epochs
from surecl.plugins.base import GENERAL_PROBE, Plugin, Plugins, Stage
from surecl.plugins.faults import FaultInjection, fault_point
from surecl.plugins.steplog import StepLog
from surecl.plugins.tracking import MARK, Tracking, check_trackers
from surecl.registry import method_class, method_config, policy_class, policy_options
from surecl.replay.buffer import OnlineQuotaBuffer
from surecl.replay.policies import buffer_capacity, check_scores, quota_warning
from surecl.replay.surprise import score_examples
from surecl.step import TrainStep


@dataclass
class RunState:
    """The run's own progress, restored from a checkpoint with the components' states."""

    next_stage: int = 0
    accuracy: list[list[float | None]] = field(default_factory=list)
    global_step: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: {"train": 0.0, "score": 0.0, "eval": 0.0})
    batches: list[list[int]] | None = None
    """The running stage's batch plan (indices into its pool); None between stages."""
    step: int = 0
    """The running stage's next step (while a step runs: that step)."""
    initial: list[float] | None = None
    """Every task evaluated before any training (``eval.before``)."""
    accuracy_fast: list[list[float | None]] | None = None
    """A dual run's matrix under its fast adapter (``eval.fast``), beside the slow one's."""
    predictions: dict[str, list[str]] | None = None
    """The last stage's answers per task (its test rows, in order), under the evaluation
    adapter: ``predictions.jsonl`` (None before the last stage's evaluation)."""
    general_initial: dict[str, float] | None = None
    """The general-ability probe (``eval.general``) before any training, per part (``text``:
    perplexity, ``instruct``: its generation metric)."""
    general: list[dict[str, float] | None] | None = None
    """The probe after each stage, per row of the matrix (None where no stage ended there)."""
    general_fast: list[dict[str, float] | None] | None = None
    """The same under a dual run's fast adapter (``eval.fast``)."""
    hosts: list[dict] = field(default_factory=list)
    """Where the run ran (:func:`surecl.model.host_info`), in order: a resumed run adds the
    machine it resumes on where that differs from the last, so results name every one."""


class InputSets:
    """Per task, its encoded examples as the model reads them now: the method's input prefix
    (:meth:`surecl.methods.Method.input_prefix`, asked at every access) before each prompt.

    Indexed and iterated as the list of per-task lists it stands for. Without a prefix a
    task's list is the encoded list itself; with one, a copy carrying it, built once per
    prefix (a method whose prefix grows with each task rebuilds a task's list once per stage)."""

    def __init__(self, encoded: list[list[Encoded]], prefix_of) -> None:
        self.encoded = encoded
        """The tokenised examples without any prefix."""
        self._prefix_of = prefix_of
        self._views: dict[int, tuple[tuple[int, ...], list[Encoded]]] = {}

    def __len__(self) -> int:
        return len(self.encoded)

    def __iter__(self):
        return (self[t] for t in range(len(self.encoded)))

    def __getitem__(self, task: int) -> list[Encoded]:
        prefix = self._prefix_of(task)
        if not prefix:
            return self.encoded[task]
        view = self._views.get(task)
        if view is None or view[0] != prefix:
            head = list(prefix)
            view = self._views[task] = (prefix, [dataclasses.replace(e, prompt=head + e.prompt) for e in self.encoded[task]])
        return view[1]


def release_memory() -> None:
    """Hand freed heap memory back to the OS between phases (glibc only; a no-op elsewhere).

    The allocator keeps the arenas that a training stage's activations used; without this the
    next phase's (scoring's) peak lands on top of them: the default run peaked at 3.45 GB RSS
    with ~1.9 GB of it free but held (bench/end_to_end.sh)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None


class ContinualRun:
    """One continual run: builds everything from a config, then :meth:`run` executes it.

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
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.progress = progress
        # No buffer broadcast in DDP's forward: the base's buffers (rotary frequencies) never
        # change (full fine-tuning trains weights, not buffers), and a collective per forward
        # would deadlock the ranks, whose steps may run different numbers of forwards
        # (micro-batch slices and shared prefix passes are cut from each rank's own rows). The one collective of a step is
        # the gradient all-reduce of its last slice's backward.
        ddp = DistributedDataParallelKwargs(broadcast_buffers=False)
        trackers = self.trackers = check_trackers(list(log_with))
        self.accelerator = Accelerator(
            cpu=not torch.cuda.is_available(), kwargs_handlers=[ddp], log_with=trackers or None,
            project_config=ProjectConfiguration(project_dir=str(self.out_dir), logging_dir=str(self.out_dir / "tensorboard")),
        )
        self.device = self.accelerator.device
        self.world, self.rank = self.accelerator.num_processes, self.accelerator.process_index
        self.rng = random.Random(f"batches:{cfg.seed}")
        if tasks is not None:
            tasks = caller_tasks(tasks, cfg)  # in-memory datasets read into tasks
        self._given_fingerprints = {t.name: t.fingerprint() for t in tasks} if tasks is not None else None
        """Each task passed from Python as it was passed (before checks and sampling)."""
        self.tasks: list[Task] = load_stream(cfg, cache_dir=cache_dir) if tasks is None else caller_stream(tasks, cfg)
        for t in self.tasks:
            for split, n in t.meta.get("dropped", {}).items():
                self.log(f"{t.name}: dropped {n} {split} rows whose label is not one of {t.labels} (data.invalid_labels=drop)")
        if (model is None) != (tokenizer is None):
            raise SureclError("model and tokenizer: pass both (a model the caller built) or neither (model.name)")
        self.supplied_model, self.supplied_tasks = model is not None, tasks is not None
        """The base model / the tasks came from the caller, not from the config (:meth:`provenance`)."""
        if model is None:
            loaded = load_model(cfg.model, self.device, cache_dir or default_cache_dir())
        else:
            loaded = prepare_model(model, tokenizer, self.device)
        self.model_name_or_path = str(getattr(loaded.model.config, "_name_or_path", "") or "") if model is not None else cfg.model.name
        self.model_class = type(loaded.model).__name__
        self.tokenizer, self.is_seq2seq, self.model_path = loaded.tokenizer, loaded.is_seq2seq, loaded.path
        self.base_dtype = loaded.dtype
        self.share_prefix = cfg.model.share_prefix and not self.is_seq2seq
        if loaded.note:
            self.log(f"warning: {loaded.note}")
        if cfg.data.kind == "text" and self.is_seq2seq:
            raise SureclError(f"data.kind=text (continual pre-training) needs a causal LM; {cfg.model.name} is encoder-decoder")
        encoder = TaskEncoder(self.tokenizer, cfg.model.max_length, end_eos=self.is_seq2seq and cfg.model.encoder_eos, task_prefix=cfg.data.task_prefix,
                              template=cfg.data.template)
        for t in self.tasks:  # labels the tokenizer cannot tell apart stop here, before any training
            for warning in encoder.check_labels(t):
                if cfg.eval.mode == "generate":
                    self.log(f"warning: {warning}")
        # Tokenised once per dataset; the hot loop only indexes these lists. The run reads them
        # through InputSets, which puts the method's input prefix (if any) before each prompt.
        self.method = None
        self._method_inputs = True
        self.train_sets = InputSets([encoder.encode(t, t.train) for t in self.tasks], self._input_prefix)
        self.test_sets = InputSets([encoder.encode(t, t.test, split="test") for t in self.tasks], self._input_prefix)
        self.label_answers = [{lab: encoder.answer_ids(lab) for lab in t.labels} for t in self.tasks]
        self.general = load_general_probe(cfg.eval.general, cfg.eval.general_n, cache_dir)
        """The general-ability probe (``eval.general``; None when off): held-out parts the stream never trains on."""
        self.general_sets = [encoder.encode(t, t.test, split="test") for t in self.general.tasks] if self.general else []
        generation = [t.name for t in self.tasks if t.kind == "generate"]
        probing = any(t.kind == "generate" for t in self.general.tasks) if self.general else False
        self.stop_ids = encoder.stop_ids() if generation or probing else None
        """The tokens that end a generation task's answer (EOS, a chat template's end of turn)."""
        # Seeded right before the adapters are drawn, so a cold cache (which builds or converts
        # the base model first) gives the same LoRA init as a warm one.
        torch.manual_seed(cfg.seed)
        self.adapters = DualLoRA(loaded.model, cfg.lora, cfg.dual, self.is_seq2seq)
        self.model = self.adapters.model
        self.method = method_class(cfg.method)(method_config(cfg))
        total = sum(len(s) for s in self.train_sets)
        policy_name = cfg.replay.policy if self.method.continual else "none"
        self.policy = policy_class(policy_name)(cfg.replay, buffer_capacity(cfg.replay, total), cfg.seed)
        self.policy.options = policy_options(cfg, policy_name)
        if generation and (cfg.replay.balance == "label" or isinstance(self.policy.buffer, OnlineQuotaBuffer)):
            what = "replay.balance=label" if cfg.replay.balance == "label" else f"replay.policy={policy_name} (a quota per answer label)"
            raise SureclError(f"{what} needs labelled tasks; {', '.join(generation)} generate free text (no label set)")
        self.method.setup(self)
        self.train_step = TrainStep(TrainStep.config_from(cfg), self.method.parameters(self))
        self.trained_params = self.train_step.params
        """What the optimizer trains and gradient clipping bounds (the method's choice)."""
        self.model, self.train_step.optimizer = self.accelerator.prepare(self.model, self.train_step.optimizer)
        self.steplog = StepLog(StepLog.config_from(cfg))
        extra = {f"plugin:{p.name}": p for p in plugins}
        if len(extra) != len(plugins):
            raise ValueError(f"plugins: two plugins named alike in {[p.name for p in plugins]}")
        self.plugins = Plugins({
            "optimizer": self.train_step, "adapters": self.adapters, "method": self.method, "replay": self.policy,
            **extra, "log": self.steplog, **({"tracking": Tracking()} if trackers else {}), "faults": FaultInjection(),
        })
        self.state = RunState(accuracy=[[None] * len(self.tasks) for _ in self.tasks])
        self._wall: float | None = None  # wall clock of the running part (``_clock``)
        self.stage: Stage | None = None
        """The stage being trained or evaluated (None before the first)."""
        self.step_items: list[tuple[int, int]] = []
        """(task, index) of the step being taken (set by the step before its ``loss`` hooks)."""
        self.eval_view: str | None = None
        """While evaluating: the adapter asked to answer (None: the evaluation adapter)."""
        self._predictions: dict[int, list[str]] = {}
        """Per task, the answers of its latest evaluation under the evaluation adapter."""
        self.eval_fast = cfg.dual.enabled and cfg.eval.fast and self.method.fast_eval
        if self.eval_fast:
            self.state.accuracy_fast = [[None] * len(self.tasks) for _ in self.tasks]
        if self.general is not None:
            self.state.general = [None] * len(self.tasks)
            if self.eval_fast:
                self.state.general_fast = [None] * len(self.tasks)
        self.stages: list[Stage] = self.method.stages(len(self.tasks))
        self.adapters.beta = resolve_beta(cfg.dual, ema_units(sum(len(self.train_sets[t]) for t in self.stages[0].tasks), cfg, [self.tasks[t].name for t in self.stages[0].tasks]))
        self._warn_slow_window()
        warning = quota_warning(type(self.policy), self.policy.capacity, len(self.tasks))
        if warning:
            self.log(f"warning: {warning}")

    # ------------------------------------------------------------------ setup helpers

    def _input_prefix(self, task: int) -> tuple[int, ...]:
        """The method's input prefix for ``task`` now (none before the method exists, nor
        while the learner's own weights are evaluated: ``evaluate_task(method_weights=False)``)."""
        if self.method is None or not self._method_inputs:
            return ()
        return tuple(self.method.input_prefix(self, task))

    @property
    def peft_model(self):
        """The trained PEFT model (frozen base + adapters) with the adapter that answers active
        (slow if dual), in eval mode: call ``generate`` on it, or ``save_pretrained``. What a
        method puts before the input (Progressive Prompts' soft prompts, ``input_prefix``) is
        not part of it: plain token ids reach the base model without them; the prompts are
        exported to ``adapters/prompts`` with how to prepend them."""
        self.adapters.activate(self.adapters.eval_adapter)
        return self.accelerator.unwrap_model(self.model).eval()

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The fast adapter's AdamW (owned by :attr:`train_step`)."""
        return self.train_step.optimizer

    def reset_optimizer(self) -> None:
        self.train_step.reset()

    def steps_in_stage(self, stage: Stage) -> int:
        return planned_steps(sum(len(self.train_sets[t]) for t in stage.tasks), self.cfg, [self.tasks[t].name for t in stage.tasks])

    def _warn_slow_window(self) -> None:
        if not self.cfg.dual.enabled or self.cfg.dual.bias_correction:
            return
        step_beta = beta_per_step(self.adapters.beta, self.cfg.dual, self.cfg.train.batch_size)
        window = 1.0 / (1.0 - step_beta) if step_beta < 1 else math.inf
        first = self.steps_in_stage(self.stages[0])
        if window > first:
            self.log(
                f"warning: the slow adapter averages over ~{window:.0f} steps but the first task has {first}; "
                "it will lag far behind the fast one early on (set dual.bias_correction=true or a smaller dual.beta)"
            )

    def log(self, message: str) -> None:
        """A message for the user, on the ``surecl`` logger (main process only): ``warning: ...``
        at WARNING, the rest at INFO. The CLI shows them as ``surecl: ...`` lines (surecl.logs)."""
        if self.accelerator.is_main_process:
            if message.startswith("warning: "):
                logger.warning(message.removeprefix("warning: "))
            else:
                logger.info(message)

    def stage_name(self, stage: Stage) -> str:
        return "+".join(self.tasks[t].name for t in stage.tasks) if len(stage.tasks) > 1 else self.tasks[stage.tasks[0]].name

    # ------------------------------------------------------------------ services for plugins

    def sharded(self, fn, items: list) -> list:
        """Run ``fn`` on this process's share of ``items`` and gather the results in order.

        With one process this is ``fn(items)``; with several, rank r takes items r, r+W, ...
        and every rank receives the full result list, so buffer decisions (made from it) are
        identical on all ranks.
        """
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
            return self.sharded(
                lambda part: score_examples(
                    model, part, pad_id=self.tokenizer.pad_token_id, is_seq2seq=self.is_seq2seq,
                    scope=scope or self.cfg.replay.scope, reduction=reduction or self.cfg.replay.reduction,
                    batch_size=self.cfg.eval.batch_size, device=self.device, share_prefix=self.share_prefix,
                ),
                items,
            )
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

    # ------------------------------------------------------------------ the loop

    def run(self, resume: bool = True, fresh: bool = False) -> dict:
        """Run into ``out_dir``: continue from its newest valid checkpoint (``resume``), or with
        ``fresh`` first remove the outputs an earlier run left there (:func:`checkpoint.clear_run`:
        only files surecl writes; a directory holding others is refused). The main process holds
        the folder's lock (:func:`checkpoint.run_lock`) throughout: a second process there stops
        with :class:`~surecl.errors.RunBusy` before it touches anything."""
        agree = self._from_main if self.world > 1 else None
        # read before the lock file is made: a folder an earlier version wrote is known by its lock file
        self.outputs = checkpoint.Manifest(self.out_dir) if self.accelerator.is_main_process else None
        """The run folder's :class:`checkpoint.Manifest` (main process)."""
        with checkpoint.run_lock(self.out_dir, self.accelerator.is_main_process, agree):
            return self._run(resume, fresh)

    def _from_main(self, value):
        """The main process's ``value``, on every process."""
        from accelerate.utils import broadcast_object_list

        box = [value]
        broadcast_object_list(box, from_process=0)
        return box[0]

    def _clock(self) -> None:
        """Add the wall time since the last call to ``seconds["total"]`` (checkpointed, so a
        resumed run's total counts every finished part, not only the last)."""
        now = time.perf_counter()
        self.state.seconds["total"] = self.state.seconds.get("total", 0.0) + now - self._wall
        self._wall = now

    def planned_outputs(self) -> list[str]:
        """Every path the run writes in its folder, relative to it (the containers first)."""
        extra = (["tensorboard/surecl"] if "tensorboard" in self.trackers else []) + ([MARK] if self.trackers else [])
        return [*checkpoint.CONTAINERS, *checkpoint.RUN_FILES, *self.plugins.outputs(self), *extra]

    def _run(self, resume: bool, fresh: bool) -> dict:
        if self.accelerator.is_main_process:
            for rel in self.planned_outputs():  # a link or a user's file where the run writes: refused before anything changes
                if not (fresh and self.outputs.owns(rel)):
                    self.outputs.check(rel)
        if self.accelerator.is_main_process and not fresh:
            left = self.outputs.remove_temporaries()  # what a killed write left (checkpoints/.stage-*, .results.json.*)
            if left:
                self.log(f"removed {len(left)} temporary file(s) a killed run left: {', '.join(str(p.relative_to(self.out_dir)) for p in left[:4])}"
                         + (" ..." if len(left) > 4 else ""))
        if fresh:
            if self.accelerator.is_main_process:
                removed = self.outputs.clear()
                if removed:
                    self.log(f"--fresh: removed {', '.join(str(p.relative_to(self.out_dir)) for p in removed)} from {self.out_dir}")
            self.accelerator.wait_for_everyone()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.continuing = resume and not fresh
        """A rerun may continue what an earlier process began (its checkpoint, what it sent to trackers)."""
        if resume and not fresh:
            restored = self.restore()
            if restored:
                self.log(f"resumed from {restored} at stage {self.state.next_stage}/{len(self.stages)}")
            elif self.accelerator.is_main_process and (self.out_dir / "results.json").is_file():
                missing = ", ".join(self.outputs.missing_final() or []) or "an output"
                raise SureclError(f"{self.out_dir}: a finished run whose {missing} is missing and no checkpoint remains to "
                                  "write it again; rerun with --fresh to train it again, or choose another --out")
        if self.accelerator.is_main_process:  # after the checkpoint check: another run's config stays
            self.outputs.claim("config.yaml")
            checkpoint.write_config(self.out_dir, self.cfg, header=self.config_header())
            self.outputs.claim("log.jsonl")
            if "tensorboard" in self.trackers:
                self.outputs.claim("tensorboard/surecl")
            if self.trackers:
                self.outputs.claim(MARK)
        here = host_info(self.device)
        if not self.state.hosts or self.state.hosts[-1] != here:
            self.state.hosts.append(here)
        self._wall = time.perf_counter()
        with self.steplog.opened(self.out_dir / "log.jsonl", self.accelerator.is_main_process):
            before = self.cfg.eval.before and self.state.initial is None
            probe = self.general is not None and self.state.general_initial is None
            if before:
                self.evaluate_before()
            if probe:
                self.evaluate_general(None)
            if before:
                self.plugins.after_eval(self, None)
            if before or probe:
                self.checkpoint()
            for s in range(self.state.next_stage, len(self.stages)):
                self.run_stage(s)
        self._clock()
        return self.finish()

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
        self.evaluate_stage(stage)
        if self.general is not None:
            self.evaluate_general(stage)
        self.plugins.after_eval(self, stage)
        self.state.next_stage = s + 1
        fault_point(f"stage_end:{s}")
        self.checkpoint()

    def train_stage(self, stage: Stage) -> None:
        """The stage's steps from ``state.step`` on: the planned batch with the step's replayed
        examples from the buffer (``replay.ratio``, or ``replay.batch_size`` every
        ``replay.every``-th step: :func:`surecl.plan.replay_count`); one optimizer step; its
        record to every plugin."""
        pool, batches = self._pool(stage), self.state.batches
        total = len(batches)
        self.model.train()
        bar = tqdm(total=total, initial=self.state.step, desc=f"train {self.stage_name(stage)}", disable=not self.progress or not self.accelerator.is_main_process, leave=False)
        start = time.perf_counter()
        sizes = [len(b) for b in batches]
        for step in range(self.state.step, total):
            current = [pool[k] for k in batches[step]]
            count = replay_count(step, sizes, self.cfg)
            replayed = self.policy.sample(count) if count else []
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
        cfg = self.cfg
        lengths = [len(self.train_sets[t][i]) for t, i in self._pool(stage)]
        batches: list[list[int]] = []
        for _ in range(stage_epochs(cfg, [self.tasks[t].name for t in stage.tasks])):
            if cfg.train.batching == "uniform":
                batches.extend(uniform_batches(len(lengths), cfg.train.batch_size, self.rng))
            else:
                batches.extend(bucketed_batches(lengths, cfg.train.batch_size, self.rng))
        return batches[: self.steps_in_stage(stage)]

    def _pool(self, stage: Stage) -> list[tuple[int, int]]:
        return [(t, i) for t in stage.tasks for i in range(len(self.train_sets[t]))]

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self) -> None:
        """Checkpoint every component's state (main process) after the last finished step."""
        if self._wall is not None:
            self._clock()
        if self.accelerator.is_main_process:
            st = self.state
            name = f"stage-{st.next_stage:04d}" + (f"-step-{st.step:06d}" if st.batches is not None else "")
            components = {"run": (dataclasses.asdict(st), {}), "rng": self._rng_state(), **self.plugins.state_dicts()}
            if getattr(self, "outputs", None) is None:  # a checkpoint taken outside run() (tests, tools)
                self.outputs = checkpoint.Manifest(self.out_dir)
            self.outputs.claim(f"checkpoints/{name}")
            checkpoint.save(
                self.out_dir / "checkpoints", name, components,
                {"config": self.cfg.to_dict(), "tasks": [t.name for t in self.tasks], "data": self._fingerprints()},
                keep=self.cfg.train.keep_checkpoints,
            )
            self.outputs.forget_missing("checkpoints")
        self.accelerator.wait_for_everyone()

    def restore(self) -> Path | None:
        """Restore the newest valid checkpoint into the run and its components; say so when a
        newer one was damaged."""
        found = checkpoint.load_latest(self.out_dir / "checkpoints", self.log)
        if found is None:
            return None
        from surecl.config import same_config

        if found.meta["tasks"] != [t.name for t in self.tasks] or not same_config(found.meta["config"], self.cfg):
            raise SureclError(f"{self.out_dir}: holds a run with a different config or task stream; use another --out")
        saved = found.meta.get("data") or {}  # checkpoints written before fingerprints have none
        for name, digest in self._fingerprints().items():
            if name in saved and saved[name] != digest:
                raise SureclError(f"{self.out_dir}: the data of task {name} changed since {found.folder.name} was written (other "
                                  "sampled rows at the same config); restore that data, or rerun with --fresh to start over on this data")
        self.plugins.load_state_dicts(found.components)
        self._load_rng_state(*found.components["rng"])
        saved = found.components["run"][0]
        for f in dataclasses.fields(RunState):
            if f.name in saved:
                setattr(self.state, f.name, saved[f.name])
        return found.folder

    def provenance(self) -> dict:
        """Where the run's model and tasks came from (results.json ``provenance``): the model's
        class and ``name_or_path`` (the config's ``model.name`` unless the caller passed a
        model), each task's data fingerprint (``fingerprints``: of its sampled rows, as checkpoints
        record them; ``given``: of each task passed from Python as passed, its
        :meth:`~surecl.data.task.Task.fingerprint`), and with a model or tasks passed from Python a
        ``note`` that config.yaml alone does not rerun the run."""
        supplied = [what for what, yes in (("model", self.supplied_model), ("tasks", self.supplied_tasks)) if yes]
        out = {
            "model": {"source": "python" if self.supplied_model else "config", "name_or_path": self.model_name_or_path,
                      "class": self.model_class},
            "data": {"source": "python" if self.supplied_tasks else "config", "fingerprints": self._fingerprints()},
        }
        if self.supplied_tasks:
            out["data"]["given"] = self._given_fingerprints
        if supplied:
            out["note"] = f"{' and '.join(supplied)} {SUPPLIED_NOTE}"
        return out

    def config_header(self) -> str | None:
        """The comment config.yaml starts with when the model or tasks came from Python (None: the
        config alone reruns the run)."""
        prov = self.provenance()
        if "note" not in prov:
            return None
        lines = ["# surecl run config, resolved (presets and overrides applied)", f"# NOTE: {prov['note']}:"]
        if self.supplied_model:
            lines.append(f"#   model: a {self.model_class} with name_or_path {self.model_name_or_path or '(none: built in code)'!s}; "
                         "model.name below is not the model that ran")
        if self.supplied_tasks:
            lines.append("#   tasks (data.* below is not the data that ran), SHA-256 fingerprints (Task.fingerprint()) as passed:")
            lines += [f"#     {name}: {digest}" for name, digest in prov["data"]["given"].items()]
        return "\n".join(lines) + "\n"

    def _fingerprints(self) -> dict[str, str]:
        """Each task's :meth:`~surecl.data.task.Task.fingerprint` (computed once)."""
        if getattr(self, "_data_fingerprints", None) is None:
            self._data_fingerprints = {t.name: t.fingerprint() for t in self.tasks}
        return self._data_fingerprints

    def _rng_state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """The random streams: the batch plan's, torch's CPU generator and, on a GPU, the
        device's generator (dropout masks there), so a resumed run draws what it would have."""
        version, internal, gauss = self.rng.getstate()
        tensors = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            tensors["cuda"] = torch.cuda.get_rng_state(self.device)
        return {"batches": [version, list(internal), gauss]}, tensors

    def _load_rng_state(self, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
        torch.set_rng_state(tensors["torch"])
        if "cuda" in tensors and self.device.type == "cuda":
            torch.cuda.set_rng_state(tensors["cuda"], self.device)
        version, internal, gauss = meta["batches"]
        self.rng.setstate((version, tuple(internal), gauss))

    # ------------------------------------------------------------------ evaluation

    def evaluate_task(self, j: int, method_weights: bool = True, adapter: str | None = None) -> float:
        """Accuracy (percent) on task ``j``'s test split, or its perplexity for text streams,
        inside every plugin's ``eval_context`` (without the method's, nor its input prefix,
        when not ``method_weights``: the learner's own weights, e.g. not per-task FT's
        snapshot nor Progressive Prompts' prompts), asking for ``adapter``
        (``ctx.eval_view``; default: the evaluation adapter, slow if dual)."""
        self.eval_view = adapter
        self._method_inputs = method_weights
        try:
            with self.plugins.eval_context(self, j, skip=() if method_weights else (self.method,)):
                return self._evaluate(j)
        finally:
            self.eval_view = None
            self._method_inputs = True

    def _evaluate(self, j: int) -> float:
        return self._score(self.tasks[j], self.test_sets[j], j)

    def _score(self, task: Task, items: list[Encoded], j: int | None = None) -> float:
        """``task``'s score on its encoded test rows ``items``: perplexity for a text task, else
        its metric of the answers (``j``: the stream task's index, whose label answers ranking
        reads and whose answers ``predictions.jsonl`` records; None for the general probe)."""
        model = self.accelerator.unwrap_model(self.model)
        bs, pad = self.cfg.eval.batch_size, self.tokenizer.pad_token_id
        if task.kind == "text":
            nll = self.sharded(
                lambda part: score_examples(
                    model, part, pad_id=pad, is_seq2seq=False, scope="label", reduction="sum", batch_size=bs, device=self.device,
                    share_prefix=self.share_prefix,
                ),
                items,
            )
            return perplexity(nll, [len(e.answer) for e in items])
        if task.kind == "generate":  # free text, whatever eval.mode says of the labelled tasks
            longest = max((len(e.answer) for e in items), default=0) + 1
            new_tokens = self.cfg.eval.max_new_tokens or min(longest, self.cfg.eval.max_new_cap)
            predict = lambda part: generate_answers(  # noqa: E731
                model, self.tokenizer, part, is_seq2seq=self.is_seq2seq, max_new_tokens=new_tokens, batch_size=bs, device=self.device,
                share_prefix=self.share_prefix, stop_ids=self.stop_ids,
            )
        elif self.cfg.eval.mode == "rank":
            answers = self.label_answers[j]
            predict = lambda part: rank_answers(  # noqa: E731
                model, part, answers, pad_id=pad, is_seq2seq=self.is_seq2seq, batch_size=bs, device=self.device, share_prefix=self.share_prefix,
            )
        else:
            new_tokens = self.cfg.eval.max_new_tokens or max(len(a) for a in self.label_answers[j].values()) + 1
            predict = lambda part: generate_answers(  # noqa: E731
                model, self.tokenizer, part, is_seq2seq=self.is_seq2seq, max_new_tokens=new_tokens, batch_size=bs, device=self.device,
                share_prefix=self.share_prefix,
            )
        predictions = self.sharded(predict, items)
        if j is not None and self.eval_view is None and self._method_inputs:  # the run's evaluation adapter: what predictions.jsonl records
            self._predictions[j] = predictions
        return task_score(task.score_metric, predictions, [e.label for e in items])

    def evaluate_before(self) -> None:
        """The before-training row: every task under the initial weights (base + zero LoRA)."""
        start = time.perf_counter()
        self.state.initial = [round(self.evaluate_task(j, method_weights=False), 4) for j in range(len(self.tasks))]
        self.state.seconds["eval"] += time.perf_counter() - start
        self.log("before training: " + ", ".join(f"{t.name} {v:.1f}" for t, v in zip(self.tasks, self.state.initial)))

    def evaluate_stage(self, stage: Stage) -> None:
        start = time.perf_counter()
        row = self.state.accuracy[stage.row]
        wanted = self.evaluated(stage)
        for j in tqdm(wanted, desc="eval", disable=not self.progress or not self.accelerator.is_main_process, leave=False):
            row[j] = round(self.evaluate_task(j), 4)
        if stage is self.stages[-1] and self.cfg.eval.mode != "perplexity":
            self.state.predictions = {self.tasks[j].name: self._predictions[j] for j in wanted}
        fast = None
        if self.eval_fast:  # the same trajectory's fast adapter: the non-dual method's row
            fast = self.state.accuracy_fast[stage.row]
            for j in wanted:
                fast[j] = round(self.evaluate_task(j, adapter="fast"), 4)
        release_memory()
        self.state.seconds["eval"] += time.perf_counter() - start
        shown = ", ".join(f"{self.tasks[j].name} {row[j]:.1f}" for j in wanted)
        if fast is not None:
            shown += " (fast: " + ", ".join(f"{fast[j]:.1f}" for j in wanted) + ")"
        self.log(f"after {self.stage_name(stage)}: {shown}")

    def evaluate_general(self, stage: Stage | None) -> None:
        """The general-ability probe under the learner's weights (the evaluation adapter and the
        frozen adapters beside it; not a method's per-task snapshot nor its input prefix, which
        belong to a stream task), before any training (``stage`` None) or after ``stage``; with
        ``eval.fast`` in a dual run, under the fast adapter too."""
        start = time.perf_counter()
        values = self._probe()
        if stage is None:
            self.state.general_initial = values
        else:
            self.state.general[stage.row] = values
            if self.state.general_fast is not None:
                self.state.general_fast[stage.row] = self._probe("fast")
        release_memory()
        self.state.seconds["general"] = self.state.seconds.get("general", 0.0) + time.perf_counter() - start
        when = "before training" if stage is None else f"after {self.stage_name(stage)}"
        self.log(f"general ability {when}: " + ", ".join(f"{k} {v:.2f}" for k, v in values.items()))

    def _probe(self, adapter: str | None = None) -> dict[str, float]:
        """Each probe part's value under ``adapter`` (default: the evaluation adapter)."""
        self.eval_view = adapter
        self._method_inputs = False
        try:
            with self.plugins.eval_context(self, GENERAL_PROBE, skip=(self.method,)):
                return {t.name: round(self._score(t, items), 4) for t, items in zip(self.general.tasks, self.general_sets)}
        finally:
            self.eval_view = None
            self._method_inputs = True

    def general_results(self) -> dict | None:
        """results.json's ``general``: the probe's source, parts, their metrics and sizes, the values
        before training (``before``), after each stage (``after``, one entry per matrix row), after
        the last (``final``) and ``change`` = final - before per part (a perplexity that rose, or a
        score that fell, is what the stream cost); ``fast``: the same under the fast adapter."""
        if self.general is None:
            return None
        st = self.state

        def summary(rows: list[dict[str, float] | None]) -> dict:
            final = next((r for r in reversed(rows) if r is not None), None)
            before = st.general_initial or {}
            change = {k: round(final[k] - before[k], 4) for k in final if k in before} if final else None
            return {"after": rows, "final": final, "change": change}

        out = {"source": self.general.source, "parts": self.general.names,
               "metrics": {t.name: "perplexity" if t.kind == "text" else t.score_metric for t in self.general.tasks},
               "rows": {t.name: len(t.test) for t in self.general.tasks}, "before": st.general_initial, **summary(st.general)}
        if st.general_fast is not None:
            out["fast"] = summary(st.general_fast)
        return out

    def evaluated(self, stage: Stage) -> list[int]:
        """The tasks evaluated after ``stage``: all it names, or with ``eval.matrix=fp_ap`` only
        its own task until the last stage (the diagonal and the final row)."""
        if self.cfg.eval.matrix == "fp_ap" and stage is not self.stages[-1]:
            wanted = [j for j in stage.evaluate if j == stage.row] or list(stage.evaluate)
        else:
            wanted = list(stage.evaluate)
        ahead = stage.row + 1
        if self.cfg.eval.ahead and self.method.continual and ahead < len(self.tasks) and ahead not in wanted:
            wanted.append(ahead)  # the next task, not trained yet: forward transfer's cell
        return wanted

    def metrics_of_tasks(self) -> dict[str, str]:
        """Each task's metric, the unit of its column of the score matrix."""
        if self.cfg.eval.mode == "perplexity":
            return {t.name: "perplexity" for t in self.tasks}
        return {t.name: t.score_metric for t in self.tasks}

    def results(self) -> dict:
        a = self.state.accuracy
        lower = self.cfg.eval.mode == "perplexity"
        summary = metrics.summarise(a, higher_is_better=not lower, initial=self.state.initial)
        if not self.method.continual:
            summary.update(ap=None, forgetting=None, bwt=None, avg_incremental=None, fwt=None)
        extra = {}
        if self.state.accuracy_fast is not None:
            extra["fast"] = {"accuracy_matrix": self.state.accuracy_fast,
                             **metrics.summarise(self.state.accuracy_fast, higher_is_better=not lower, initial=self.state.initial)}
        per_task = self.metrics_of_tasks()
        kinds = set(per_task.values())
        return {
            "tasks": [t.name for t in self.tasks],
            # one name when every task shares it (accuracy, perplexity, rouge_l, exact_match), else "mixed"
            "metric": kinds.pop() if len(kinds) == 1 else "mixed",
            "metrics": per_task,
            "accuracy_matrix": a,
            "initial": self.state.initial,
            "majority": None if lower else {t.name: majority_rate(t) for t in self.tasks},
            **summary,
            **extra,
            **({"general": self.general_results()} if self.general is not None else {}),
            "buffer": {"capacity": self.policy.capacity, "size": len(self.policy), "per_task": self._buffer_counts(),
                       "labels": self._buffer_labels()},
            "config": self.cfg.to_dict(),
            "timing": {k: round(v, 3) for k, v in self.state.seconds.items()},
            "steps": self.state.global_step,
            "dual_beta": self.adapters.beta if self.cfg.dual.enabled else None,
            "model_path": self.model_path,
            "base_dtype": self.base_dtype,
            "device": str(self.device),
            "provenance": self.provenance(),
            "host": self.state.hosts[-1],  # _run added this machine before any results
            "hosts": self.state.hosts,
        }

    def _buffer_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for e in self.policy.buffer.entries:
            name = self.tasks[e.task].name
            counts[name] = counts.get(name, 0) + 1
        return counts

    def _buffer_labels(self) -> dict[str, dict[str, int]]:
        """Per task with labels, how many kept examples carry each label, in the task's label
        order (a label the buffer does not hold counts 0): what a selection rule keeps."""
        held: dict[int, dict[str, int]] = {}
        for e in self.policy.buffer.entries:
            task = self.tasks[e.task]
            if task.kind != "classify":
                continue
            counts = held.setdefault(e.task, dict.fromkeys(task.labels, 0))
            label = self.train_sets.encoded[e.task][e.index].label
            counts[label] = counts.get(label, 0) + 1
        return {self.tasks[t].name: held[t] for t in sorted(held)}

    def final_predictions(self) -> list[dict] | None:
        """``predictions.jsonl``'s rows: per task the last stage evaluated, each test row's task,
        input, prediction (the evaluation adapter's answer as decoded, or the ranked label),
        gold label and whether they match under the exact-match normalisation; None for text
        streams. A run resumed from a checkpoint written before predictions were kept evaluates
        those tasks again (every process: evaluation is sharded)."""
        if self.cfg.eval.mode == "perplexity":
            return None
        wanted = self.evaluated(self.stages[-1])
        kept = self.state.predictions or {}
        if any(self.tasks[j].name not in kept for j in wanted):
            for j in wanted:
                self.evaluate_task(j)
            kept = self.state.predictions = {self.tasks[j].name: self._predictions[j] for j in wanted}
        from surecl.evaluate import normalise, task_score

        rows = []
        for j in wanted:
            task = self.tasks[j]
            for ex, pred in zip(task.test, kept[task.name]):
                row = {"task": task.name, "input": ex.sentence, "prediction": pred, "gold": ex.label}
                if task.kind == "generate":  # the row's score in the task's metric (ROUGE-L, exact match)
                    row.update(metric=task.score_metric, score=task_score(task.score_metric, [pred], [ex.label]))
                else:
                    row["correct"] = normalise(pred) == normalise(ex.label)
                rows.append(row)
        return rows

    def finish(self) -> dict:
        from surecl.report import write_run_report

        results = self.results()
        predictions = self.final_predictions()
        if self.accelerator.is_main_process:
            # a transaction: every other final output first, results.json (the run's "finished") last, so an
            # interruption anywhere before it leaves a resumable run whose rerun writes them all again
            final = ["buffer.json", *(["predictions.jsonl"] if predictions is not None else []), *self.plugins.outputs(self),
                     "report.md", "heatmap.png", "results.json"]
            for rel in final:
                self.outputs.claim(rel)
            (self.out_dir / "results.json").unlink(missing_ok=True)  # a rerun completing a finish: unfinished until it is done
            self.outputs.set_final(None)
            checkpoint.write_json(self.out_dir / "buffer.json", self.policy.buffer.state_dict())
            if predictions is not None:
                checkpoint.write_text(self.out_dir / "predictions.jsonl",
                                      "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in predictions))
            self.plugins.export(self, results)  # the learner's adapters, a full fine-tuned model, prompts, ...
            write_run_report(self.out_dir, results)
            fault_point("finish:results")
            self.outputs.set_final([rel for rel in final if (self.out_dir / rel).exists()])
            checkpoint.write_json(self.out_dir / "results.json", results)
        self.plugins.after_run(self, results)
        return results


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


SUPPLIED_NOTE = "supplied in Python: config.yaml alone does not rerun it"
"""What results.json, config.yaml and the model cards say of a model or tasks passed to the run."""


def majority_rate(task) -> float | None:
    """The share (%) of the task's test rows whose gold label is its most frequent one: the
    accuracy of always answering that label, against which "learned" is judged."""
    if not task.test or task.kind != "classify":
        return None
    counts: dict[str, int] = {}
    for ex in task.test:
        counts[ex.label] = counts.get(ex.label, 0) + 1
    return 100.0 * max(counts.values()) / len(task.test)
