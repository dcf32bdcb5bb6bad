"""The continual loop, top to bottom: data -> buffer -> adapters -> metrics.

For each stage (one task, or all tasks for MTL):

1. ``method.before_task`` and ``policy.before_task`` (score the task's data for surprise and/or
   insert its selection into the buffer, depending on the timing variant);
2. optimizer steps over length-bucketed batches of the task; every ``replay.every``-th step a
   replay batch drawn uniformly from the buffer joins the current batch; after each step the
   slow adapter takes one EMA step toward the fast one and the policy observes the batch;
3. ``policy.after_task`` and ``method.after_task``;
4. every task seen so far is evaluated with the evaluation adapter (slow if dual), filling
   one row of the accuracy matrix; a checkpoint is written.

The loop is written against ``accelerate.Accelerator`` so the same code runs on one CPU, a GPU
or several processes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs
from tqdm.auto import tqdm

from surecl import checkpoint, metrics
from surecl.adapters import DualLoRA, resolve_beta
from surecl.config import RunConfig
from surecl.data.encode import Encoded, TaskEncoder, bucketed_batches, collate, micro_batch_positions, uniform_batches
from surecl.data.loading import load_stream
from surecl.data.task import Task
from surecl.errors import SureclError
from surecl.evaluate import accuracy, generate_answers, perplexity, rank_answers
from surecl.logs import logger
from surecl.methods import METHODS, Stage
from surecl.model import default_cache_dir, load_model
from surecl.nll import token_nll
from surecl.plan import planned_steps
from surecl.replay.policies import POLICIES, buffer_capacity, quota_warning
from surecl.replay.surprise import score_examples


@dataclass
class RunState:
    """Everything a checkpoint must restore besides tensors."""

    next_stage: int = 0
    accuracy: list[list[float | None]] = field(default_factory=list)
    global_step: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: {"train": 0.0, "score": 0.0, "eval": 0.0})
    batches: list[list[int]] | None = None
    """The running stage's batch plan (indices into its pool); None between stages."""
    step: int = 0
    """Next step of the running stage."""
    log_bytes: int = 0
    """Length of log.jsonl when the checkpoint was taken (a resumed run truncates to it)."""
    initial: list[float] | None = None
    """Every task evaluated before any training (``eval.before``)."""
    accuracy_fast: list[list[float | None]] | None = None
    """A dual run's matrix under its fast adapter (``eval.fast``), beside the slow one's."""


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


def check_scores(scores: list[float], task: str, indices: list[int], what: str = "scored") -> None:
    """A NaN or infinite surprise would silently sort first or last in the buffer: stop."""
    for i, v in zip(indices, scores):
        if not math.isfinite(v):
            raise SureclError(
                f"surprise of task {task} training example {i} ({what}) is {v}: the model gives it a non-finite "
                "likelihood (check the data, lower train.lr, or use model.dtype=fp32); the last checkpoint is intact"
            )


def fault_point(name: str) -> None:
    """Fault injection for the crash tests: ``SURECL_KILL_AT=name`` SIGKILLs the process here."""
    if os.environ.get("SURECL_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


class ContinualRun:
    """One continual run: builds everything from a config, then :meth:`run` executes it."""

    def __init__(self, cfg: RunConfig, out_dir: Path, *, progress: bool = True, cache_dir: Path | None = None):
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.progress = progress
        # No buffer broadcast in DDP's forward: the base is frozen and its buffers (rotary
        # frequencies) never change, and a collective per forward would deadlock the ranks,
        # whose steps may run different numbers of forwards (micro-batch slices and shared
        # prefix passes are cut from each rank's own rows). The one collective of a step is
        # the gradient all-reduce of its last slice's backward.
        ddp = DistributedDataParallelKwargs(broadcast_buffers=False)
        self.accelerator = Accelerator(cpu=not torch.cuda.is_available(), kwargs_handlers=[ddp])
        self.device = self.accelerator.device
        self.world, self.rank = self.accelerator.num_processes, self.accelerator.process_index
        self.rng = random.Random(f"batches:{cfg.seed}")
        self.tasks: list[Task] = load_stream(cfg, cache_dir=cache_dir)
        for t in self.tasks:
            for split, n in t.meta.get("dropped", {}).items():
                self.log(f"{t.name}: dropped {n} {split} rows whose label is not one of {t.labels} (data.invalid_labels=drop)")
        loaded = load_model(cfg.model, self.device, cache_dir or default_cache_dir())
        self.tokenizer, self.is_seq2seq, self.model_path = loaded.tokenizer, loaded.is_seq2seq, loaded.path
        self.base_dtype = loaded.dtype
        self.share_prefix = cfg.model.share_prefix and not self.is_seq2seq
        if loaded.note:
            self.log(f"warning: {loaded.note}")
        if cfg.data.kind == "text" and self.is_seq2seq:
            raise SureclError(f"data.kind=text (continual pre-training) needs a causal LM; {cfg.model.name} is encoder-decoder")
        encoder = TaskEncoder(self.tokenizer, cfg.model.max_length)
        # Tokenised once per dataset; the hot loop only indexes these lists.
        self.train_sets: list[list[Encoded]] = [encoder.encode(t, t.train) for t in self.tasks]
        self.test_sets: list[list[Encoded]] = [encoder.encode(t, t.test) for t in self.tasks]
        self.label_answers = [{lab: encoder.answer_ids(lab) for lab in t.labels} for t in self.tasks]
        # Seeded right before the adapters are drawn, so a cold cache (which builds or converts
        # the base model first) gives the same LoRA init as a warm one.
        torch.manual_seed(cfg.seed)
        self.adapters = DualLoRA(loaded.model, cfg.lora, cfg.dual, self.is_seq2seq)
        self.model = self.adapters.model
        self.method = METHODS[cfg.method](self)
        total = sum(len(s) for s in self.train_sets)
        policy_name = cfg.replay.policy if self.method.continual else "none"
        self.policy = POLICIES[policy_name](cfg.replay, buffer_capacity(cfg.replay, total), cfg.seed)
        self.optimizer = self._new_optimizer()
        self.model, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)
        self.state = RunState(accuracy=[[None] * len(self.tasks) for _ in self.tasks])
        self.eval_fast = cfg.dual.enabled and cfg.eval.fast and self.method.fast_eval
        if self.eval_fast:
            self.state.accuracy_fast = [[None] * len(self.tasks) for _ in self.tasks]
        self.stages: list[Stage] = self.method.stages(len(self.tasks))
        self.adapters.beta = resolve_beta(cfg.dual, self.steps_in_stage(self.stages[0]))
        self._warn_slow_window()
        warning = quota_warning(policy_name, self.policy.capacity, len(self.tasks))
        if warning:
            self.log(f"warning: {warning}")

    # ------------------------------------------------------------------ setup helpers

    def _new_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.adapters.fast_params, lr=self.cfg.train.lr, weight_decay=self.cfg.train.weight_decay)

    def reset_optimizer(self) -> None:
        self.optimizer.state.clear()

    def steps_in_stage(self, stage: Stage) -> int:
        return planned_steps(sum(len(self.train_sets[t]) for t in stage.tasks), self.cfg)

    def _warn_slow_window(self) -> None:
        if not self.cfg.dual.enabled or self.cfg.dual.bias_correction:
            return
        window = 1.0 / (1.0 - self.adapters.beta)
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

    def _lr_at(self, step: int, total: int) -> float:
        """The learning rate of ``step`` (0-based) in a stage of ``total`` steps: transformers'
        schedule ``train.scheduler`` with ``train.warmup_steps``, restarted every stage. A pure
        function of the step, so a run resumed inside a stage continues on the same curve."""
        return self.cfg.train.lr * self._schedule(total)(step)

    def _schedule(self, total: int):
        """The multiplier ``get_scheduler`` builds for a stage of ``total`` steps (cached per length)."""
        cache = self.__dict__.setdefault("_schedules", {})
        if total not in cache:
            from transformers import get_scheduler

            name, warm = self.cfg.train.scheduler, self.cfg.train.warmup_steps
            if name == "constant" and warm:  # warmup_steps always meant warming up: keep that
                name = "constant_with_warmup"
            probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)  # the schedule needs an optimizer to wrap
            cache[total] = get_scheduler(name, probe, num_warmup_steps=warm, num_training_steps=max(1, total)).lr_lambdas[0]
        return cache[total]

    # ------------------------------------------------------------------ scoring

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

    def _score(self, items: list[Encoded]) -> list[float]:
        """Surprise of ``items`` under the current fast adapter, without dropout or grad."""
        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        model.eval()
        try:
            return self.sharded(
                lambda part: score_examples(
                    model, part, pad_id=self.tokenizer.pad_token_id, is_seq2seq=self.is_seq2seq,
                    scope=self.cfg.replay.scope, reduction=self.cfg.replay.reduction,
                    batch_size=self.cfg.eval.batch_size, device=self.device, share_prefix=self.share_prefix,
                ),
                items,
            )
        finally:
            model.train(was_training)

    def surprise_of_task(self, task: int) -> list[float]:
        """Surprise of every training example of ``task`` (the policies' scorer)."""
        start = time.perf_counter()
        fault_point(f"score:{task}")
        scores = self._score(self.train_sets[task])
        check_scores(scores, self.tasks[task].name, list(range(len(scores))))
        release_memory()
        self.state.seconds["score"] += time.perf_counter() - start
        return scores

    # ------------------------------------------------------------------ training

    def _batch(self, items: list[Encoded], shared: bool = False) -> dict[str, torch.Tensor]:
        """A collated batch on the device; ``shared``: with the rows' shared prompt prefix split
        off (when ``model.share_prefix`` is on and they share enough of one)."""
        batch = collate(items, self.tokenizer.pad_token_id, self.is_seq2seq, share_prefix=shared and self.share_prefix)
        return {k: v.to(self.device) for k, v in batch.items()}

    def plan_batches(self, stage: Stage) -> list[list[int]]:
        """The stage's batches (indices into its example pool), fixed at stage start so a
        resumed run replays exactly the same order."""
        cfg = self.cfg
        lengths = [len(self.train_sets[t][i]) for t, i in self._pool(stage)]
        batches: list[list[int]] = []
        for _ in range(cfg.train.epochs):
            if cfg.train.batching == "uniform":
                batches.extend(uniform_batches(len(lengths), cfg.train.batch_size, self.rng))
            else:
                batches.extend(bucketed_batches(lengths, cfg.train.batch_size, self.rng))
        return batches[: self.steps_in_stage(stage)]

    def _pool(self, stage: Stage) -> list[tuple[int, int]]:
        return [(t, i) for t in stage.tasks for i in range(len(self.train_sets[t]))]

    def train_stage(self, stage: Stage, log_file) -> None:
        cfg = self.cfg
        pool = self._pool(stage)
        batches = self.state.batches
        total = len(batches)
        self.model.train()
        bar = tqdm(total=total, initial=self.state.step, desc=f"train {self._stage_name(stage)}", disable=not self.progress or not self.accelerator.is_main_process, leave=False)
        start = time.perf_counter()
        for step in range(self.state.step, total):
            fault_point(f"step:{stage.row}:{step}")
            batch_idx = batches[step]
            current = [pool[k] for k in batch_idx]
            replayed = self.policy.sample(cfg.replay.batch_size) if step % cfg.replay.every == 0 else []
            items = [self.train_sets[t][i] for t, i in current] + [self.train_sets[e.task][e.index] for e in replayed]
            # The loss is the token mean over the whole mixed batch. With W processes each
            # takes every W-th item and scales by W / (all answer tokens), so DDP's gradient
            # average equals the single-process gradient.
            n_tokens = sum(len(e.answer) for e in items)
            local = items[self.rank :: self.world] if self.world > 1 else items
            weight = float(self.world) if local else 0.0
            for group in self.optimizer.param_groups:
                group["lr"] = self._lr_at(step, total)
            # Gradient accumulation over slices of the batch: each slice's share of the token
            # mean is backpropagated at once, so only one slice's activations are alive. With
            # a shared prefix the slices are cut task by task, and each runs its task's prompt
            # prefix once; the per-item results are put back in the items' order.
            rows = local or items[:1]
            tasks = None
            if self.share_prefix:
                tasks = [t for t, _ in current] + [e.task for e in replayed]
                tasks = tasks[self.rank :: self.world] if local else tasks[:1]
            slices = micro_batch_positions(rows, cfg.train.micro_batch_tokens, tasks)
            parts, loss_total = [], 0.0
            for k, positions in enumerate(slices):
                part = [rows[i] for i in positions]
                sync = self.accelerator.no_sync(self.model) if k < len(slices) - 1 else contextlib.nullcontext()
                with sync:
                    nll_k, count_k = token_nll(self.model, self._batch(part, shared=True), scope="label", is_seq2seq=self.is_seq2seq)
                    loss = weight * nll_k.sum() / n_tokens
                    if k == 0:
                        loss = self.method.loss(loss)  # a method's penalty enters once per step
                    if os.environ.get("SURECL_NAN_AT") == f"{stage.row}:{step}":  # fault injection (tests)
                        loss = loss * float("nan")
                    if not torch.isfinite(loss):
                        raise SureclError(
                            f"non-finite loss ({loss.item()}) at task {self._stage_name(stage)} step {step}; the last checkpoint "
                            "is intact: lower train.lr (or fix the data) and rerun the same command to resume"
                        )
                    self.accelerator.backward(loss)
                loss_total = loss_total + loss.detach()
                parts.append((nll_k.detach(), count_k.detach()))
            back = torch.tensor([i for positions in slices for i in positions]).argsort()
            nll, count = torch.cat([p[0] for p in parts])[back], torch.cat([p[1] for p in parts])[back]
            if self.world > 1:
                shown = self.accelerator.reduce(loss_total, "sum") / self.world
            else:
                shown = loss_total
            if cfg.train.grad_clip:
                self.accelerator.clip_grad_norm_(self.adapters.fast_params, cfg.train.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.adapters.ema_step()
            self.state.global_step += 1
            if replayed and cfg.replay.aging:
                self.policy.age(replayed, self._rescore(replayed, nll, count, len(current)))
            if self.policy.needs_step_scores:
                scores = self._step_scores(nll, count, len(current), bool(local))
                mine = [k for k, (t, _) in enumerate(current) if t == stage.row]
                self.policy.observe(
                    stage.row, [current[k][1] for k in mine], [scores[k] for k in mine], [self.train_sets[stage.row][current[k][1]].label for k in mine]
                )
            else:
                self.policy.observe(stage.row, [i for t, i in current if t == stage.row])
            self.method.after_step()
            if log_file is not None and step % cfg.log_every == 0:
                log_file.write(json.dumps({"stage": stage.row, "step": step, "global_step": self.state.global_step, "loss": round(shown.item(), 6), "replayed": len(replayed), "buffer": len(self.policy), "lr": self.optimizer.param_groups[0]["lr"]}) + "\n")
            bar.set_postfix(loss=f"{shown.item():.3f}", buf=len(self.policy))
            bar.update(1)
            self.state.step = step + 1
            if self.state.step % 16 == 0:
                release_memory()  # a few ms every 16 steps (~1 minute on CPU) against heap fragmentation
            every = cfg.train.checkpoint_every
            if every and self.state.step % every == 0 and self.state.step < total:
                self.state.seconds["train"] += time.perf_counter() - start
                start = time.perf_counter()
                self._checkpoint(log_file)
        bar.close()
        release_memory()
        self.state.seconds["train"] += time.perf_counter() - start

    def _step_scores(self, nll: torch.Tensor, count: torch.Tensor, n: int, has_local: bool) -> list[float]:
        """Training-loss surprise of the step's first ``n`` items (the current batch), in order:
        their answer-token NLL from this step's forward (mean or sum per ``replay.reduction``).
        With several processes each holds every W-th item; the pieces are gathered."""
        values = nll / count.clamp(min=1) if self.cfg.replay.reduction == "mean" else nll
        values = values.detach().float().cpu().tolist()
        if self.world == 1:
            return values[:n]
        from accelerate.utils import gather_object

        local = [(self.rank + k * self.world, v) for k, v in enumerate(values)] if has_local else []
        out = [0.0] * n
        for part in gather_object([local]):
            for pos, v in part:
                if pos < n:
                    out[pos] = v
        return out

    def _rescore(self, replayed, nll: torch.Tensor, count: torch.Tensor, offset: int) -> list[float]:
        """Fresh surprise of replayed entries on the scale the buffer ranks by.

        The step's forward already holds their answer-token NLL; that is the score when the
        policy scores labels with a mean. Otherwise (whole sequence, or sum) they are re-scored
        with the scorer itself, so aged and fresh entries stay comparable.
        """
        if self.world == 1 and self.cfg.replay.scope == "label" and self.cfg.replay.reduction == "mean":
            scores = (nll / count.clamp(min=1)).detach()[offset:].tolist()
        else:
            scores = self._score([self.train_sets[e.task][e.index] for e in replayed])
        for e, s in zip(replayed, scores):
            check_scores([s], self.tasks[e.task].name, [e.index], "re-scored on replay")
        return scores

    # ------------------------------------------------------------------ evaluation

    def evaluate_task(self, j: int, method_weights: bool = True, adapter: str | None = None) -> float:
        """Accuracy (percent) on task ``j``'s test split, or its perplexity for text streams,
        under ``adapter`` (default: the evaluation adapter, slow if dual)."""
        items = self.test_sets[j]
        gold = [e.label for e in items]
        context = self.method.eval_context(j) if method_weights else contextlib.nullcontext()
        with self.adapters.evaluating(adapter), context:
            model = self.accelerator.unwrap_model(self.model)
            bs = self.cfg.eval.batch_size
            if self.cfg.eval.mode == "perplexity":
                nll = self.sharded(
                    lambda part: score_examples(
                        model, part, pad_id=self.tokenizer.pad_token_id, is_seq2seq=False, scope="label", reduction="sum", batch_size=bs, device=self.device,
                        share_prefix=self.share_prefix,
                    ),
                    items,
                )
                return perplexity(nll, [len(e.answer) for e in items])
            if self.cfg.eval.mode == "rank":
                answers = self.label_answers[j]
                predict = lambda part: rank_answers(  # noqa: E731
                    model, part, answers, pad_id=self.tokenizer.pad_token_id, is_seq2seq=self.is_seq2seq, batch_size=bs, device=self.device,
                    share_prefix=self.share_prefix,
                )
            else:
                new_tokens = self.cfg.eval.max_new_tokens or max(len(a) for a in self.label_answers[j].values()) + 1
                predict = lambda part: generate_answers(  # noqa: E731
                    model, self.tokenizer, part, is_seq2seq=self.is_seq2seq, max_new_tokens=new_tokens, batch_size=bs, device=self.device,
                    share_prefix=self.share_prefix,
                )
            preds = self.sharded(predict, items)
        return accuracy(preds, gold)

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
        self.log(f"after {self._stage_name(stage)}: {shown}")

    def evaluated(self, stage: Stage) -> list[int]:
        """The tasks evaluated after ``stage``: all it names, or with ``eval.matrix=fp_ap`` only
        its own task until the last stage (the diagonal and the final row)."""
        if self.cfg.eval.matrix == "fp_ap" and stage is not self.stages[-1]:
            return [j for j in stage.evaluate if j == stage.row] or list(stage.evaluate)
        return list(stage.evaluate)

    def _stage_name(self, stage: Stage) -> str:
        return "+".join(self.tasks[t].name for t in stage.tasks) if len(stage.tasks) > 1 else self.tasks[stage.tasks[0]].name

    # ------------------------------------------------------------------ the loop

    def run(self, resume: bool = True, fresh: bool = False) -> dict:
        """Run into ``out_dir``: continue from its newest valid checkpoint (``resume``), or with
        ``fresh`` first remove the outputs an earlier run left there (:func:`checkpoint.clear_run`:
        only files surecl writes; a directory holding others is refused)."""
        if fresh:
            if self.accelerator.is_main_process:
                removed = checkpoint.clear_run(self.out_dir)
                if removed:
                    self.log(f"--fresh: removed {', '.join(p.name for p in removed)} from {self.out_dir}")
            self.accelerator.wait_for_everyone()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if resume and not fresh:
            restored = checkpoint.load_latest(self)
            if restored:
                self.log(f"resumed from {restored} at stage {self.state.next_stage}/{len(self.stages)}")
        if self.accelerator.is_main_process:  # after the checkpoint check: another run's config stays
            checkpoint.write_config(self.out_dir, self.cfg)
        wall = time.perf_counter()
        log_path = self.out_dir / "log.jsonl"
        if self.accelerator.is_main_process and log_path.exists() and self.state.log_bytes < log_path.stat().st_size:
            with open(log_path, "r+b") as f:  # drop lines of steps after the checkpoint
                f.truncate(self.state.log_bytes)
        # Only the main process logs; the others write to the null device.
        with open(log_path if self.accelerator.is_main_process else os.devnull, "a", encoding="utf-8") as log_file:
            if self.cfg.eval.before and self.state.initial is None:
                self.evaluate_before()
                self._checkpoint(log_file)
            for s in range(self.state.next_stage, len(self.stages)):
                stage = self.stages[s]
                if self.state.batches is None:  # not resuming inside this stage
                    if self.cfg.train.fresh_optimizer:
                        self.reset_optimizer()
                    self.method.before_task(stage)
                    self.policy.before_task(stage.row, len(self.train_sets[stage.row]), self.surprise_of_task)
                    self.state.batches, self.state.step = self.plan_batches(stage), 0
                self.train_stage(stage, log_file)
                self.state.batches, self.state.step = None, 0
                self.policy.after_task(stage.row, len(self.train_sets[stage.row]), self.surprise_of_task)
                self.method.after_task(stage)
                self.evaluate_stage(stage)
                self.state.next_stage = s + 1
                fault_point(f"stage_end:{s}")
                self._checkpoint(log_file)
        self.state.seconds["total"] = self.state.seconds.get("total", 0.0) + time.perf_counter() - wall
        return self.finish()

    def _checkpoint(self, log_file) -> None:
        log_file.flush()
        self.state.log_bytes = log_file.tell()
        checkpoint.save(self)
        self.accelerator.wait_for_everyone()

    def results(self) -> dict:
        a = self.state.accuracy
        lower = self.cfg.eval.mode == "perplexity"
        summary = metrics.summarise(a, higher_is_better=not lower)
        if not self.method.continual:
            summary.update(ap=None, forgetting=None, bwt=None, avg_incremental=None)
        extra = {}
        if self.state.accuracy_fast is not None:
            extra["fast"] = {"accuracy_matrix": self.state.accuracy_fast, **metrics.summarise(self.state.accuracy_fast, higher_is_better=not lower)}
        return {
            "tasks": [t.name for t in self.tasks],
            "metric": "perplexity" if lower else "accuracy",
            "accuracy_matrix": a,
            "initial": self.state.initial,
            **summary,
            **extra,
            "buffer": {"capacity": self.policy.capacity, "size": len(self.policy), "per_task": self._buffer_counts()},
            "config": self.cfg.to_dict(),
            "timing": {k: round(v, 3) for k, v in self.state.seconds.items()},
            "steps": self.state.global_step,
            "dual_beta": self.adapters.beta if self.cfg.dual.enabled else None,
            "model_path": self.model_path,
            "base_dtype": self.base_dtype,
            "device": str(self.device),
        }

    def _buffer_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for e in self.policy.buffer.entries:
            name = self.tasks[e.task].name
            counts[name] = counts.get(name, 0) + 1
        return counts

    def finish(self) -> dict:
        from surecl.report import write_run_report

        results = self.results()
        if self.accelerator.is_main_process:
            checkpoint.write_json(self.out_dir / "results.json", results)
            checkpoint.write_json(self.out_dir / "buffer.json", self.policy.buffer.state_dict())
            adapters_dir = self.out_dir / "adapters"
            names = ["fast", "slow"] if self.cfg.dual.enabled else ["fast"]
            from surecl import __version__
            from surecl.card import model_card, portable_base

            base_model, note = portable_base(self.cfg.model.name, self.model_path)
            for name in names:
                card = model_card(results, name, base_model, note, __version__)
                checkpoint.save_adapter(self.adapters, adapters_dir, name, base_model=base_model, card=card)
            write_run_report(self.out_dir, results)
        return results


def run(cfg: RunConfig, out_dir: Path, *, resume: bool = True, fresh: bool = False, progress: bool = True, cache_dir: Path | None = None) -> dict:
    """Run (or resume) one continual run into ``out_dir``; return the results dict.

    ``fresh``: start over, removing what an earlier run wrote there (see :meth:`ContinualRun.run`)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*use_cache=True.*")
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return ContinualRun(cfg, out_dir, progress=progress, cache_dir=cache_dir).run(resume=resume, fresh=fresh)
