"""SuRe in your own ``transformers.Trainer`` script: :class:`SureTrainer`.

A drop-in ``Trainer`` subclass: give it your base model, ``TrainingArguments``, data collator
and a :class:`SureArguments`, then call :meth:`SureTrainer.next_task` once per task with that
task's (tokenised) training set. Each call is one task boundary:

1. the task's examples are scored by surprise (mean NLL over the tokens your collator's
   ``labels`` mark, i.e. the tokens your loss trains on) with your model and collator under
   the fast adapter, before or after training (``score_time`` / ``insert_time``: SB-UB, SB-UA,
   SA-UA), and the task's top ``floor(S/d)`` enter the core's equal-quota buffer through the
   core's replay policy (:class:`surecl.plugins.sure.SurprisePolicy`, or ``random``; with
   ``balance="label"`` the share is spread over the labels of a ``label_column``);
2. training (one ``Trainer.train()``) draws ``a`` replayed examples per ``b`` new ones
   (``ratio="a:b"``, counted as the core's :func:`surecl.plan.replay_count`) into the same
   batches, collated by your collator, and the loss is the Trainer's own (token mean over the
   mixed batch: the core's ``replay.loss=joint``) or, with ``replay_loss="example"`` (every
   step) or ``"pair"`` (steps that replay), the paper's reference weighting over the whole
   optimizer step (the core's :func:`surecl.step.pair_weights`). Those two steps compute the
   loss themselves, so a ``compute_loss`` you override in a subclass would never be called:
   that combination is refused at construction (``joint`` calls it);
3. after every optimizer step the slow LoRA adapter follows the fast one by the core's EMA
   (:meth:`surecl.adapters.DualLoRA.ema_step`: one update per step, or beta^n for a step of n
   new examples with ``unit="example"``), and with ``aging`` the step's replayed entries take
   their surprise under the updated fast adapter;
4. ``trainer.model`` answers with the slow adapter, the result, whenever no task trains: from
   construction on, and again as soon as ``next_task`` returns (or raises), so its
   ``generate``, a pipeline over it and ``merge_and_unload()`` take the slow adapter; only a
   task's ``train()`` (its steps, and the Trainer's callbacks inside it) has the fast adapter
   active (``dual=False``: the fast adapter always). ``trainer.evaluate(...)`` and
   ``trainer.predict(...)`` answer with the slow adapter (``adapter="fast"`` for the fast one;
   for every dataset of a dict too; other keywords, such as a mixed-in ``Seq2SeqTrainer``'s
   ``max_new_tokens``, go to the parent), and ``with trainer.slow_weights(): ...`` /
   ``trainer.weights("fast")`` put one in place for your own evaluation (an ``evaluate``
   inside leaves it in place; ``next_task`` inside is refused). ``predict_with_generate=True``
   needs a ``Seq2SeqTrainer`` mixed in (``class T(SureTrainer, Seq2SeqTrainer)``): a plain
   Trainer would return teacher-forced logits, so it is refused.

``SureArguments`` parse with ``HfArgumentParser`` (``--beta auto``, ``--beta 0.995``, every
field's default when not given).

Checkpoints are the Trainer's: each task trains under ``output_dir/task-<t>/`` and every
``checkpoint-N`` folder also holds ``sure_state.json`` (task index, buffer, EMA clock, policy
random state) and ``sure_state.safetensors`` (fast and slow adapters); the end of a task is
written to ``task-<t>/sure-end/``. The Trainer's ``save_total_limit`` applies to the running
task's folder; once a task's ``sure-end`` is written, which every later resume starts from, its
``checkpoint-N`` folders are removed where ``save_total_limit`` is set (so at most that many lie
on disk, in the running task's folder); only complete checkpoints this SureTrainer wrote for
that task are removed. Rerunning the same script with
``next_task(ds, resume_from_checkpoint=True)`` skips the finished tasks (their datasets are
still needed: the buffer indexes them), and resumes the interrupted one from its last
complete checkpoint (one a kill left half-written is passed over) with the same batches,
replay draws and RNG states, so it ends where an uninterrupted run ends. A task whose
``train()`` stopped before its last step (``enable_jit_checkpoint``'s SIGTERM checkpoint, armed
for every task's ``train()``, or a callback's ``should_training_stop``) is not finished:
``next_task`` stops in one line without writing its end, and the rerun continues it. A SIGTERM
checkpoint saved inside an optimizer step (the Trainer looks at the request at a step's start and
before its update) holds the random states of the step it is named after, so its resume goes on
as the uninterrupted run does; under several processes every process takes it at the same point
(their requests are summed at each look: a SIGTERM to one process is enough). When a
task trains from its start or from a chosen mid-task checkpoint, the states of later points in
``output_dir`` (another run's, left by ``resume_from_checkpoint=<an earlier state>``) are moved
to ``output_dir/superseded-<i>/``, so ``resume_from_checkpoint=True`` cannot take them.

New examples are taken in the order ``surecl run`` takes them with ``train.batching=uniform``
and the same seed (``data_seed`` where set, else ``seed``: each task's batch order and the
replay policy's draws; one optimizer step = ``per_device_train_batch_size`` x the number of
processes x ``gradient_accumulation_steps`` = ``train.batch_size``), so with the same settings the two
train on the same batches and replay the same draws. The AdamW state starts fresh at every task (the core's
``train.fresh_optimizer=true``).

Several processes (``accelerate launch`` / torchrun, plain DDP): ``per_device_train_batch_size``
keeps its meaning, so an optimizer step is ``per_device_train_batch_size`` x W x
``gradient_accumulation_steps`` examples over the W processes. The batches are planned as one
process would plan that global batch, and each micro-batch (new rows, then replayed ones) is
split row by row as the core's :class:`surecl.step.TrainStep` splits a step: process r takes
rows r, r + W, ...; a process left without a row runs the micro-batch's first row with its
labels masked (every process runs every forward and backward, which DDP synchronises). The
Trainer divides each process's loss by the step's token count over all processes
(``average_tokens_across_devices``) and DDP averages the gradients, so the step is the
one-process step; a ``pair`` step's rows carry weights computed over the whole global step
before the split, and each process's loss is multiplied by W against DDP's average. Surprise is scored on every W-th example per process and gathered in order
on every process (the core's ``ContinualRun.sharded``), so all take the same buffer decisions;
the step's new and replayed counts are summed over processes, so with ``unit="example"`` every
replica's slow adapter takes the same EMA update; the main process alone writes SuRe's state.
Every process must be given the same rows for a task (a digest compared across them: an
unseeded shuffle stops in one line). DeepSpeed, FSDP, tensor / context / sequence parallelism, ``DataParallel`` and a loss that is
not normalised over all processes are refused in one line, and so is
``accelerator_config={"split_batches": True}``. Causal or encoder-decoder models, map-style
datasets whose rows are mappings (``datasets.Dataset``; another dataset is one line). A row
without tokens (empty ``input_ids``), or whose collated ``labels`` mark no token (all -100, or a
causal row of one token), has no surprise and trains nothing: ``next_task`` refuses the task in
one line naming the row before it scores or trains anything (one pass of your collator over the
rows), as ``surecl run`` refuses such rows; filter them out first.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import math
import random
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import Seq2SeqTrainer, Trainer, TrainerCallback, set_seed
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from surecl.adapters import FAST, SLOW, DualLoRA, resolve_beta
from surecl.checkpoint import write_json, write_tensors
from surecl.config import ALL_LINEAR, DualConfig, LoraConfig, ReplayConfig, replay_ratio
from surecl.data.encode import uniform_batches
from surecl.errors import SureclError
from surecl.logs import logger
from surecl.plan import replay_count
from surecl.processes import agreed, peers_stop_in_one_line, release_at_exit
from surecl.registry import policy_class, policy_spec
from surecl.replay.policies import check_scores
from surecl.run_setup import build_policy
from surecl.step import pair_weights

STATE_JSON = "sure_state.json"
STATE_TENSORS = "sure_state.safetensors"
END_DIR = "sure-end"
FORMAT = 1
NEW, REPLAYED, WEIGHT, PADDING_TOKENS = "sure_new", "sure_replayed", "sure_pair_weight", "sure_padding_tokens"
_MARK, _WEIGHT = "_sure_replay", "_sure_weight"
KINDS = (NEW_ROW, REPLAYED_ROW, PADDING_ROW) = (0, 1, 2)
PEER_STOPPED = ("another process stopped (its output says why); the checkpoints saved so far are intact: rerun the "
                "script with resume_from_checkpoint=True to continue")
"""The line of a process whose collective failed because another process of the script had gone
(:func:`surecl.processes.peers_stop_in_one_line`)."""
JOINT = -1.0
"""A planned row's weight in a step whose loss is the Trainer's own (``joint``, or a step
without replayed rows); a ``pair`` step's rows carry their pair weight (>= 0)."""


@dataclass
class SureArguments:
    """SuRe's settings; each maps to the core's key of the same meaning (``surecl run``)."""

    buffer_size: int = 100
    """S, the buffer's size in examples over all tasks (``replay.buffer_size``); each of the d
    tasks seen keeps floor(S/d)."""
    policy: str = "surprise"
    """``surprise`` (SuRe), ``random`` (equal quota, random share) or ``none`` (``replay.policy``)."""
    score_time: str = "before"
    insert_time: str = "before"
    reduction: str = "mean"
    """Surprise = ``mean`` (paper) or ``sum`` of the token NLL over the tokens the labels mark."""
    ratio: str = "1:2"
    """``a:b``: a replayed examples per b new ones (``replay.ratio``); ``""``: ``replay_batch_size``
    examples every ``replay_every``-th optimizer step."""
    replay_every: int = 2
    replay_batch_size: int = 4
    replay_loss: str = "joint"
    """How a step's rows are weighted (``replay.loss``): ``joint``, the Trainer's own loss (token
    mean over the mixed batch, new and replayed rows alike); ``example``, the paper's reference
    weighting on every step (a step without replayed rows: the mean of its rows' token means);
    or ``pair``, that weighting on steps with replayed rows and the Trainer's own loss on the
    others. The reference weighting (the core's :func:`surecl.step.pair_weights`): each row's loss
    is its token mean, replayed row j of the optimizer step is paired with new row j mod n_new,
    a pair (a new row and the replayed rows paired with it) has the mean of its rows' losses,
    and the step's loss is the mean over its n_new pairs; the reference code's
    ``(outputs.loss + replay_outputs.loss) / 2`` per micro-batch of one. Computed over the whole
    optimizer step (all micro-batches of all processes), so gradient accumulation and several
    processes give the one-process step. With ``pair``, a step without replayed rows is ``joint``. ``pair``
    computes the loss itself from the model's logits and your collator's ``labels``, so it
    cannot be combined with a ``compute_loss_func``, label smoothing or a ``compute_loss``
    overridden in your subclass (which its steps would never call)."""
    replacement: bool = False
    """A step's replayed rows drawn each on its own, with replacement (``replay.replacement``,
    the paper's reference code), not as one draw without replacement."""
    balance: str = "none"
    """``none`` (the paper's): a task's share is its top floor(S/d) examples whatever their
    labels; ``label`` (``replay.balance=label``): the share is spread evenly over the task's
    answer labels, each label giving its most surprising examples in turn (the core's balanced
    :class:`~surecl.replay.buffer.QuotaBuffer`). Needs ``label_column``."""
    label_column: str = ""
    """The column of each task's dataset holding the example's answer label (any value; compared
    as its ``str``), read by ``balance="label"`` before the Trainer drops the columns the model
    does not take (with ``SureSFTTrainer``, after SFTTrainer's preparation, so its
    ``shuffle_dataset`` and the rows it drops keep each label with its example)."""
    aging: bool = False
    """``replay.aging``: after every optimizer step that replays, the replayed entries' scores
    become their surprise under the fast adapter just updated (the same scorer as a task's
    surprise); entries never replayed keep the score they were selected with, and a later task's
    smaller quota ranks both together, so replayed entries, whose surprise has usually fallen,
    are dropped first. ``policy="surprise"`` only (``random`` keeps no scores)."""
    dual: bool = True
    """The slow adapter (``dual.enabled``); ``False``: the fast adapter alone answers."""
    beta: float | str | None = "auto"
    """EMA rate per update, or ``auto``: a window of ``window_tasks`` tasks of the first task's
    updates (``dual.beta``). A number given as text (``"0.995"``) is read as that number, so
    ``HfArgumentParser`` takes ``--beta 0.995`` and ``--beta auto`` (the ``None`` in the type is
    there for it alone: it reads a ``X | str | None`` field as text, as ``TrainingArguments``'
    ``dict | str | None`` ones; None itself is refused)."""
    window_tasks: float = 0.5
    bias_correction: bool = True
    unit: str = "step"
    """One EMA update per optimizer ``step``, or per new ``example`` (``dual.unit``)."""
    lora_r: int = 8
    lora_alpha: int = 32
    lora_dropout: float = 0.1
    target_modules: list[str] | str = field(default_factory=lambda: ["q_proj", "v_proj"])
    """Layer names as PEFT matches them, or ``"all-linear"``: every linear layer but the output head."""

    def __post_init__(self):
        if isinstance(self.beta, str) and self.beta != "auto":  # the command line's words; another word: check() names it
            try:
                self.beta = float(self.beta)
            except ValueError:
                pass

    def replay_config(self) -> ReplayConfig:
        return ReplayConfig(
            policy=self.policy, buffer_size=int(self.buffer_size), score_time=self.score_time, insert_time=self.insert_time,
            reduction=self.reduction, ratio=self.ratio, every=self.replay_every, batch_size=self.replay_batch_size,
            loss=self.replay_loss, balance=self.balance, aging=bool(self.aging), replacement=bool(self.replacement),
        )

    def dual_config(self) -> DualConfig:
        return DualConfig(enabled=self.dual, beta=self.beta, window_tasks=self.window_tasks, bias_correction=self.bias_correction, unit=self.unit)

    def lora_config(self) -> LoraConfig:
        return LoraConfig(r=self.lora_r, alpha=self.lora_alpha, dropout=self.lora_dropout, target_modules=self._targets())

    def _targets(self) -> list[str]:
        """:attr:`target_modules` as a list (PEFT's ``"all-linear"`` string is the list of it alone)."""
        modules = self.target_modules
        return [modules] if isinstance(modules, str) else list(modules)

    def check(self) -> None:
        """One-line errors for settings the integration cannot run: each field's type (Python
        values, not the command line's words: ``dual="no"`` is refused, not read as true), then
        the core's checks of the keys they map to (``surecl run`` refuses the same values),
        named by the field."""
        self._check_types()
        if isinstance(self.buffer_size, bool) or not isinstance(self.buffer_size, int) or self.buffer_size < 0:
            raise SureclError(f"SureArguments.buffer_size: a whole number of examples >= 0, got {self.buffer_size!r}")
        if self.policy != "none":
            try:
                policy_spec(self.policy)
            except SureclError:
                raise SureclError(f"SureArguments.policy: unknown policy {self.policy!r}; use surprise, random or none") from None
            cls = policy_class(self.policy)
            if not cls.per_task_quota or cls.online:
                raise SureclError(f"SureArguments.policy: {self.policy} is not a per-task quota policy; use surprise, random or none")
        for key, value, allowed in [
            ("score_time", self.score_time, ("before", "after")), ("insert_time", self.insert_time, ("before", "after")),
            ("reduction", self.reduction, ("mean", "sum")), ("unit", self.unit, ("step", "example")),
            ("replay_loss", self.replay_loss, ("joint", "pair", "example")), ("balance", self.balance, ("none", "label")),
        ]:
            if value not in allowed:
                raise SureclError(f"SureArguments.{key}: one of {', '.join(allowed)}, got {value!r}")
        if self.score_time == "after" and self.insert_time == "before":
            raise SureclError("SureArguments: score_time=after needs insert_time=after (a task cannot enter before it is scored)")
        if self.ratio:
            try:
                replay_ratio(self.ratio)
            except SureclError as e:
                raise SureclError(self._named(str(e))) from None
        elif self.replay_every < 1 or self.replay_batch_size < 0:
            raise SureclError("SureArguments: replay_every >= 1 and replay_batch_size >= 0")
        if self.balance == "label" and self.policy == "none":
            raise SureclError("SureArguments.balance='label' needs a replay policy (surprise or random), not policy='none'")
        if self.balance == "label" and not (isinstance(self.label_column, str) and self.label_column):
            raise SureclError("SureArguments.balance='label' needs label_column: the name of the dataset column holding each example's answer label")
        if not isinstance(self.aging, bool):
            raise SureclError(f"SureArguments.aging: True or False, got {self.aging!r}")
        if self.aging and self.policy != "none" and not policy_class(self.policy).uses_scores:
            raise SureclError(f"SureArguments.aging: policy {self.policy} keeps no scores to age; use policy='surprise'")
        if self.beta != "auto" and not (isinstance(self.beta, (int, float)) and 0 <= float(self.beta) < 1):
            raise SureclError(f"SureArguments.beta: a number in [0, 1) or 'auto', got {self.beta!r}")
        self._check_core()

    _TYPES = {
        "buffer_size": int, "replay_every": int, "replay_batch_size": int, "lora_r": int,
        "lora_alpha": (int, float), "lora_dropout": (int, float), "window_tasks": (int, float),
        "dual": bool, "bias_correction": bool, "aging": bool, "replacement": bool,
        "policy": str, "score_time": str, "insert_time": str, "reduction": str, "ratio": str, "replay_loss": str, "balance": str,
        "label_column": str, "unit": str,
    }
    _CORE_KEYS = {
        "replay.policy": "policy", "replay.buffer_size": "buffer_size", "replay.score_time": "score_time",
        "replay.insert_time": "insert_time", "replay.reduction": "reduction", "replay.ratio": "ratio", "replay.every": "replay_every",
        "replay.batch_size": "replay_batch_size", "replay.loss": "replay_loss", "replay.balance": "balance", "replay.aging": "aging",
        "replay.replacement": "replacement",
        "dual.enabled": "dual", "dual.beta": "beta", "dual.window_tasks": "window_tasks", "dual.bias_correction": "bias_correction",
        "dual.unit": "unit", "lora.r": "lora_r", "lora.alpha": "lora_alpha", "lora.dropout": "lora_dropout",
        "lora.target_modules": "target_modules",
    }

    def _check_types(self) -> None:
        words = {int: "a whole number", (int, float): "a number", bool: "True or False", str: "a string"}
        for name, typ in self._TYPES.items():
            value = getattr(self, name)
            if (isinstance(value, bool) and typ is not bool) or not isinstance(value, typ):
                raise SureclError(f"SureArguments.{name}: {words[typ]}, got {value!r}")
            if isinstance(value, float) and not math.isfinite(value):
                raise SureclError(f"SureArguments.{name}: a finite number, got {value!r}")
        if not (self.beta == "auto" or (isinstance(self.beta, (int, float)) and not isinstance(self.beta, bool) and math.isfinite(self.beta))):
            raise SureclError(f"SureArguments.beta: a number in [0, 1) or 'auto', got {self.beta!r}")
        modules = self.target_modules
        shorthand = isinstance(modules, str) and modules.lower() == ALL_LINEAR
        if not shorthand and (isinstance(modules, str) or not isinstance(modules, (list, tuple))
                              or not all(isinstance(m, str) and m for m in modules)):
            raise SureclError(f"SureArguments.target_modules: a list of module names (e.g. ['q_proj', 'v_proj']) or "
                              f"'{ALL_LINEAR}', got {modules!r}")

    def _check_core(self) -> None:
        """The core's ranges and combinations (:func:`surecl.config.validate`) on the keys these
        fields map to, its messages naming the fields. Where the integration allows more than
        ``surecl run`` (beta 0: the slow adapter is the fast one; replay_batch_size 0 without a
        ratio: no replay), the core is given an allowed stand-in."""
        from surecl.config import RunConfig, validate

        cfg = RunConfig()
        cfg.replay, cfg.dual, cfg.lora = self.replay_config(), self.dual_config(), self.lora_config()
        cfg.replay.batch_size = max(1, cfg.replay.batch_size)
        if cfg.dual.beta == 0:
            cfg.dual.beta = 0.5
        try:
            validate(cfg)
        except SureclError as e:
            raise SureclError(self._named(str(e))) from None

    def _named(self, message: str) -> str:
        """A core message with its keys named as the fields that set them."""
        for key, name in sorted(self._CORE_KEYS.items(), key=lambda kv: -len(kv[0])):
            message = message.replace(key, f"SureArguments.{name}")
        return message


class _TaskSets(torch.utils.data.Dataset):
    """Every task's training set; an item is keyed ``(task, index, kind, weight)``, kind one of
    :data:`KINDS` (new, replayed, or a padding row a process without items trains at weight 0),
    weight the row's pair weight 1 / (n_new x its pair's size) in a step the reference weighting
    covers (``replay_loss="example"``, or ``"pair"`` where it replays; :data:`JOINT` otherwise)."""

    def __init__(self, sets: list):
        self.sets = sets
        self.current = 0

    def __len__(self) -> int:
        return len(self.sets[self.current])

    def __getitem__(self, key):
        task, index, kind, weight = key
        row = self.sets[task][index]
        return {**row, _MARK: kind, _WEIGHT: weight}


class _PlannedBatches:
    """A batch sampler over a stage's precomputed micro-batches, one list per epoch (this
    process's share of each)."""

    def __init__(self, epochs: list[list[list[tuple[int, int, int, float]]]]):
        self.epochs = epochs
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.epochs[0])

    def __iter__(self):
        yield from self.epochs[min(self.epoch, len(self.epochs) - 1)]


def _takes_position_ids(model) -> bool:
    """Whether the (PEFT-, DDP-wrapped) model's forward takes ``position_ids``."""
    while hasattr(model, "module"):
        model = model.module
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "position_ids" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


class _PlannedLoader(torch.utils.data.DataLoader):
    """The stage's data loader: this process's planned micro-batches, in the plan's order.
    Not passed through ``accelerator.prepare``, which would deal whole micro-batches to
    alternate processes; every process already holds its share of every micro-batch."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


class _MarkedCollator:
    """The user's collator on the rows, plus the batch's counts of new and replayed rows and,
    in a ``pair`` step, each row's pair weight; a padding row (a process whose share of a
    micro-batch is empty runs one) has its labels masked and weight 0, so it adds no loss and
    no token to the loss's denominator; its token count goes along (``sure_padding_tokens``) for
    the trainer to take out of TRL's count of trained tokens (``num_tokens``)."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, features: list[dict]):
        kinds = [f.pop(_MARK) for f in features]
        weights = [f.pop(_WEIGHT) for f in features]
        batch = self.collate(features)
        padding = [k for k, kind in enumerate(kinds) if kind == PADDING_ROW]
        if padding:
            for key in ("labels", "shift_labels"):
                if torch.is_tensor(batch.get(key)):
                    batch[key][padding] = -100
        mask = batch.get("attention_mask")
        # the padding row's tokens, which TRL's token count would add to the trained ones
        batch[PADDING_TOKENS] = mask[padding].sum() if padding and torch.is_tensor(mask) else torch.tensor(0)
        batch[NEW] = torch.tensor(kinds.count(NEW_ROW))
        batch[REPLAYED] = torch.tensor(kinds.count(REPLAYED_ROW))
        if weights and min(weights) >= 0:  # the rows of a micro-batch are all of one step
            batch[WEIGHT] = torch.tensor(weights, dtype=torch.float64)
        return batch


class _EmaCallback(TrainerCallback):
    """After every optimizer step: the step's new and replayed examples counted over all
    processes, and the slow adapter's EMA step (the core's ``DualLoRA``; with ``unit="example"``
    one update per new example of the whole step, so every process's replica takes the same)."""

    def __init__(self, trainer: SureTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        new, replayed = t._step_counts()
        counts = t.replay_counts.setdefault(t._sets.current, [0, 0])
        counts[0] += new
        counts[1] += replayed
        t.dual.ema_step(new if t.sure.unit == "example" else 1)
        if t.sure.aging:
            t._age(state.global_step - 1)
        return control


class _JitSteps(TrainerCallback):
    """With ``enable_jit_checkpoint``: where an optimizer step starts and ends, for a SIGTERM
    checkpoint saved inside it. The Trainer saves one at a step's start or after its forward and
    backward passes (before the update), named after the last step taken, with that step's
    weights, optimizer and SuRe state, but the random states as they are then: after the step's
    dropout masks, or at an epoch's first step after the data loader's seed draw, which the
    resumed run draws again. A run resumed from it took other masks than the uninterrupted run.
    Before the update, its ``trainer_state.json`` also counted the step's micro-batches in
    ``total_flos`` and ``num_input_tokens_seen``, which the resumed run counts again. So the
    trainer keeps the random states and counters a checkpoint of the last step holds (taken
    after each step's log, save and evaluation, and where a resume restored them) and such a
    checkpoint saves those (:meth:`SureTrainer._save_rng_state`,
    :meth:`SureTrainer._save_checkpoint`). First among the callbacks: the step starts before
    any other callback's ``on_step_begin``."""

    def __init__(self, trainer: SureTrainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer._keep_step()
        self.trainer._in_step = False

    def on_step_begin(self, args, state, control, **kwargs):
        self.trainer._in_step = True

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.trainer._in_step = False


def _rng_states() -> dict:
    """The random states the Trainer's checkpoints save: Python's, NumPy's, torch's CPU one and
    the current accelerator's (one device per process)."""
    import numpy as np

    states = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def _set_rng_states(states: dict) -> None:
    import numpy as np

    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    if "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"])


def _check_fresh_base(model) -> None:
    """One line for a model that already holds LoRA layers: PEFT would fail adding ``fast`` and
    ``slow`` again (a model another SureTrainer wrapped), or SuRe would train beside a user's own."""
    from surecl.model import holds_adapter_layers

    if holds_adapter_layers(model):
        raise SureclError("SureTrainer: model= already holds LoRA adapters (a model another SureTrainer wrapped, or a PEFT model); "
                          "pass a fresh base model (from_pretrained again), or merge_and_unload() the adapters first")


class SureTrainer(Trainer):
    """``transformers.Trainer`` with SuRe: a surprise replay buffer and a slow LoRA adapter.

    ``model`` is the frozen base (a transformers model); the trainer wraps it in the core's
    :class:`~surecl.adapters.DualLoRA` (``fast`` adapter trained, ``slow`` = its EMA), so
    ``trainer.model`` is a PEFT model, answering with the slow adapter except inside a task's
    ``train()``. Every other argument is ``Trainer``'s; ``save_total_limit``
    counts the running task's ``checkpoint-N`` folders, and a finished task's are removed once its
    ``sure-end`` is written (see the module docstring)."""

    _rows_of = ""
    """What a row index in a message counts (a subclass that prepares the rows says so)."""
    _library_losses: tuple = (Trainer,)
    """The classes whose ``compute_loss`` is the library's own, not a user's override (which
    ``replay_loss="pair"`` / ``"example"`` steps would never call); ``SureSFTTrainer`` adds TRL's."""

    def __init__(self, model=None, args=None, *trainer_args, sure: SureArguments | None = None, **kwargs):
        if model is None or args is None:
            raise SureclError("SureTrainer: pass model= (the base model) and args= (TrainingArguments)")
        if sure is not None and not isinstance(sure, SureArguments):
            raise SureclError(f"SureTrainer: sure= must be a SureArguments, not {type(sure).__name__}; build one: "
                              "sure=SureArguments(buffer_size=..., ...) (from surecl.integrations.transformers; a dict d: SureArguments(**d))")
        if getattr(args, "n_gpu", 1) > 1:
            raise SureclError("SureTrainer: one GPU per process (torch.nn.DataParallel is not supported); run several GPUs with accelerate launch / torchrun")
        if getattr(args, "load_best_model_at_end", False):
            # the Trainer would look for model weights a checkpoint does not hold (SuRe's adapters are in
            # sure_state.safetensors), find none, and leave the slow adapter and buffer at the last step
            raise SureclError(
                "SureTrainer: load_best_model_at_end=True is not supported (a checkpoint's fast and slow adapters and buffer are "
                "SuRe's state, which the Trainer's best-model reload does not restore); evaluate after each task, or resume from a chosen checkpoint"
            )
        if getattr(args, "auto_find_batch_size", False):
            # after an out-of-memory error the Trainer halves its batch size and runs the training loop
            # again, on top of what the failed attempt's steps did to the adapters, the EMA and the replay counts
            raise SureclError(
                "SureTrainer: auto_find_batch_size=True is not supported (a retry after running out of memory would train the task "
                "again on top of the failed attempt's steps, EMA and replay draws); set per_device_train_batch_size to one that fits"
            )
        if getattr(args, "fp16_full_eval", False) or getattr(args, "bf16_full_eval", False):
            # the Trainer's evaluation loop casts the whole model (model.to(dtype)) and never casts it back
            raise SureclError(
                "SureTrainer: fp16_full_eval / bf16_full_eval are not supported: evaluate() would cast the whole model, the fp32 LoRA "
                "adapters and the slow adapter's EMA with it, to half precision for good; evaluate under fp16=True / bf16=True autocast instead"
            )
        if any(o is not None for o in kwargs.get("optimizers") or ()):
            # next_task builds a fresh optimizer and schedule per task (as the core does); an object given here would be dropped
            raise SureclError("SureTrainer: optimizers= is not supported (each task gets a fresh optimizer and schedule); choose one with "
                              "TrainingArguments(optim=..., lr_scheduler_type=...) or pass optimizer_cls_and_kwargs=(cls, kwargs)")
        if getattr(args, "train_sampling_strategy", "random") not in ("random", None):
            # the planned loader fixes each task's batches (a uniform shuffle per epoch, replay placed in it)
            raise SureclError(f"SureTrainer: train_sampling_strategy={args.train_sampling_strategy!r} is not supported; SuRe plans each "
                              "task's batches itself (a uniform shuffle per epoch with replayed rows placed in them): leave it 'random'")
        if getattr(getattr(args, "accelerator_config", None), "split_batches", False):
            # the plan takes per_device_train_batch_size rows per process, not a global batch split over them
            raise SureclError("SureTrainer: accelerator_config split_batches=True is not supported (SuRe plans per_device_train_batch_size rows "
                              "on each process); leave it False and set per_device_train_batch_size to each process's share")
        self.sure = sure or SureArguments()
        self.sure.check()
        _check_fresh_base(model)
        if self.sure.replay_loss in ("pair", "example") and (
            kwargs.get("compute_loss_func") is not None or getattr(args, "label_smoothing_factor", 0)
            or getattr(args, "loss_type", None) not in (None, "nll") or getattr(model.config, "output_router_logits", False)
        ):
            raise SureclError(
                f"SureArguments.replay_loss={self.sure.replay_loss!r} computes the loss itself (token NLL of the labels); it cannot be combined with "
                "compute_loss_func, label_smoothing_factor, a TRL loss_type other than 'nll' or a model's router auxiliary loss "
                "(output_router_logits)"
            )
        owner = next(c for c in type(self).__mro__ if "compute_loss" in vars(c))
        if self.sure.replay_loss in ("pair", "example") and owner not in self._library_losses:
            # those steps compute the loss in _pair_step: an override of compute_loss would silently never run
            raise SureclError(
                f"SureArguments.replay_loss={self.sure.replay_loss!r} computes each step's loss itself (token NLL of the labels), so "
                f"{owner.__qualname__}.compute_loss, your override, would never be called in training; use replay_loss='joint' (its steps "
                "call compute_loss), or remove the override (such a step's loss is the labels' token NLL alone: no other term enters it)"
            )
        if getattr(args, "predict_with_generate", False) and not isinstance(self, Seq2SeqTrainer):
            # a plain Trainer's evaluate/predict return the teacher-forced logits, not generated ids
            raise SureclError(
                f"{type(self).__name__}: predict_with_generate=True needs a Seq2SeqTrainer (a plain Trainer's evaluate and predict do not "
                f"generate); mix one in, class MyTrainer({type(self).__name__}, Seq2SeqTrainer): pass, or set predict_with_generate=False"
            )
        # from here the caller's model changes (frozen, adapters added in place): a failure below gives it back as it was
        grads = [p.requires_grad for p in model.parameters()]
        for p in model.parameters():
            p.requires_grad_(False)
        set_seed(args.seed)  # the LoRA initialisation
        is_seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))
        try:
            self.dual = DualLoRA(model, self.sure.lora_config(), self.sure.dual_config(), is_seq2seq)  # removes what it added when it fails
        except SureclError as e:
            for p, g in zip(model.parameters(), grads):
                p.requires_grad_(g)
            raise SureclError(self.sure._named(str(e))) from None
        self.is_seq2seq = is_seq2seq
        self.replay_cfg = self.sure.replay_config()
        spec = policy_spec(self.sure.policy)
        # its options set before its __init__ runs, as a run's policy has them (run_setup.build_policy)
        self.policy = build_policy(policy_class(self.sure.policy), spec.config() if spec.config is not None else None, self.replay_cfg,
                                   self.sure.buffer_size if self.sure.policy != "none" else 0, _data_seed(args))
        try:
            super().__init__(self.dual.model, args, *trainer_args, **kwargs)
            self._check_processes()
        except BaseException:
            # the caller's model as it was given: without the adapters, its parameters' requires_grad as they were
            self.dual.model.unload()
            for p, g in zip(model.parameters(), grads):
                p.requires_grad_(g)
            raise
        self.root = Path(args.output_dir)
        self.task = 0
        """The index of the task the next :meth:`next_task` call trains."""
        self.data_ids: list[dict] = []
        """Each task's training rows as trained (count and digest, :func:`_data_digest`): saved with
        SuRe's state, so a resume on other data stops in one line."""
        self._root_checked = False
        self.sets: list = []
        self.scores: dict[int, list[float]] = {}
        """Each task's surprise (the buffer's priorities), the same on every process; none where
        nothing scored it (``buffer_size=0``: a buffer that keeps nothing is not scored)."""
        self.replay_counts: dict[int, list[int]] = {}
        """Per task: [new, replayed] examples trained on."""
        self._local = [0, 0]
        """This process's new and replayed examples since the last optimizer step."""
        self._plan_policy: dict | None = None
        self._drawn: list[list] = []
        """Per optimizer step of the stage: the buffer entries it replays (what aging re-scores)."""
        self.labels: list[list[str] | None] = []
        """Each task's answer labels (``balance="label"``), else None."""
        self._resume: dict | None = None
        self.resumed_from: str | None = None
        """The checkpoint folder a ``resume_from_checkpoint`` call continued from (None: none)."""
        callbacks = self.callback_handler.callbacks
        jit = _jit_callback(callbacks)
        self._jit = getattr(jit, "jit_manager", None) is not None
        self._step_rng: dict | None = None
        """With ``enable_jit_checkpoint``: the random states a checkpoint of the last optimizer step
        holds (:class:`_JitSteps`), which a SIGTERM checkpoint saved inside a step saves."""
        self._step_logged: tuple | None = None
        """With ``enable_jit_checkpoint``: the Trainer's counters then (:meth:`_logged`), which
        that checkpoint's ``trainer_state.json`` holds."""
        self._in_step = False
        self._views = 0
        """The ``weights()`` / ``slow_weights()`` blocks open now (evaluate's own included)."""
        self.dual.activate(self.dual.eval_adapter)  # the result answers whenever no task trains (next_task)
        if jit is None:
            self.add_callback(_EmaCallback(self))
        else:  # a step's EMA and counts before the JIT checkpoint its on_step_end saves (which resumes after that step)
            callbacks.insert(callbacks.index(jit), _EmaCallback(self))
        if self._jit:
            callbacks.insert(0, _JitSteps(self))
            if self.world > 1:
                self._agree_jit(jit)

    # ------------------------------------------------------------------ processes

    @property
    def world(self) -> int:
        """The number of processes training together (``accelerate launch`` / torchrun)."""
        return max(1, self.args.world_size)

    @property
    def rank(self) -> int:
        return self.args.process_index

    def _check_processes(self) -> None:
        """One-line errors for multi-process settings whose step would not be the one-process step."""
        if self.world == 1:
            return
        release_at_exit()
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            raise SureclError("SureTrainer: DeepSpeed and FSDP are not supported (the slow adapter's EMA needs the whole fast adapter on every process); use plain DDP")
        if any(getattr(self, f"get_{kind}_size", lambda: 1)() != 1 for kind in ("tp", "cp", "sp")):
            raise SureclError("SureTrainer: tensor, context and sequence parallelism are not supported; use plain DDP")
        if not (self.args.average_tokens_across_devices and (self.model_accepts_loss_kwargs or self.compute_loss_func is not None)):
            raise SureclError(
                "SureTrainer: several processes need the loss normalised by the step's token count over all processes "
                "(average_tokens_across_devices=True and a model that takes num_items_in_batch, or a compute_loss_func)"
            )

    def _step_counts(self) -> tuple[int, int]:
        """The new and replayed examples of the optimizer step just taken, over all processes."""
        local, self._local = self._local, [0, 0]
        if self.world == 1:
            return local[0], local[1]
        total = self.accelerator.reduce(torch.tensor(local, device=self.args.device), "sum")
        return int(total[0]), int(total[1])

    def _sharded(self, fn, n: int) -> list:
        """``fn(indices)`` on this process's share of ``range(n)`` (indices rank, rank + W, ...,
        as the core's ``ContinualRun.sharded``), the results gathered in order on every process."""
        if self.world == 1:
            return fn(list(range(n)))
        from accelerate.utils import gather_object

        parts = gather_object([fn(list(range(self.rank, n, self.world)))])
        out: list = [None] * n
        for r, part in enumerate(parts):
            out[r :: self.world] = part
        return out

    # ------------------------------------------------------------------ task boundaries

    def next_task(self, train_dataset, resume_from_checkpoint: str | bool | None = None):
        """Train on the next task: score and buffer it (at its score / insert times), train one
        ``Trainer.train()`` with replay and the EMA. Returns ``train()``'s output, or None for a
        task a resumed run had already finished.

        A call that raised (an interrupt, out of memory, an error while scoring) can be made
        again for the same task: the retry replaces the failed call's dataset, labels and replay
        counts (so the next task trains on its own rows), and trains from the weights, buffer and
        EMA clock the failed call left (``resume_from_checkpoint`` continues exactly instead).

        Under several processes, a process that stopped alone (an error only it met, a signal to
        it) stops the others with one line (:data:`PEER_STOPPED`) instead of the backend's
        traceback out of a collective."""
        with peers_stop_in_one_line(PEER_STOPPED):
            return self._next_task(train_dataset, resume_from_checkpoint)

    def _next_task(self, train_dataset, resume_from_checkpoint):
        t = self.task
        if self._views:
            raise SureclError(
                "SureTrainer.next_task: called inside `with trainer.slow_weights()` or `trainer.weights(...)` (the model there is the view "
                "you evaluate, which training would change under it); call it outside the with block"
            )
        self._check_dataset(train_dataset)
        data, labels = self._prepared(train_dataset)
        ids = {"rows": len(data), "sha256": _data_digest(data)}
        self._check_same_rows(t, ids)
        if len(data) == 0:
            raise SureclError(f"SureTrainer.next_task: task {t} has no training examples")
        micro = self.args.per_device_train_batch_size * self.world
        if self.args.dataloader_drop_last and len(data) < micro:
            raise SureclError(
                f"SureTrainer.next_task: task {t} has {len(data)} training examples, fewer than one micro-batch of all processes "
                f"({self.args.per_device_train_batch_size} per device x {self.world} process{'es' if self.world > 1 else ''} = {micro}), "
                "which dataloader_drop_last=True drops: nothing would train; lower per_device_train_batch_size or unset dataloader_drop_last"
            )
        if labels is not None and len(labels) != len(data):
            raise SureclError(f"SureTrainer.next_task: task {t} has {len(labels)} labels in {self.sure.label_column!r} for {len(data)} examples after preparation")
        if not self._root_checked and not resume_from_checkpoint:
            self._check_fresh_root()
        self._root_checked = True
        del self.sets[t:], self.labels[t:], self.data_ids[t:]  # what a failed call for this task appended
        self.sets.append(data)
        self.labels.append(labels)
        self.data_ids.append(ids)
        if resume_from_checkpoint and self._resume is None:  # the main process's choice (a task's end it may be writing now)
            self._resume = agreed(self, lambda: self._find_resume(resume_from_checkpoint))
        resume = self._resume
        if resume is not None and t <= resume["task"]:
            self._check_same_data(t, resume["path"])
        if resume is not None and (t < resume["task"] or (t == resume["task"] and resume["done"])):
            if t == resume["task"]:  # the last finished task: its end state is the run's state now
                self._read_state(resume["path"])
                self._resume = None
                self.resumed_from = resume["path"]
            self.task += 1
            return None
        self._check_tokens(t, data)
        checkpoint = None
        if resume is not None and t == resume["task"]:
            if self.args.ignore_data_skip:  # the Trainer would replay the epoch from its first batch, not continue the plan
                raise SureclError(
                    f"{resume['path']}: resuming inside task {t} needs ignore_data_skip=False (with it the Trainer trains the epoch's "
                    "first batches again instead of the steps not yet taken); unset it, or resume from the task's end (task-<k>/sure-end)"
                )
            checkpoint, self._resume = resume["path"], None  # train() restores it (_load_from_checkpoint)
            self._state_meta(Path(checkpoint))  # checked now: a refused resume sets nothing aside (below)
            self.resumed_from = checkpoint
        self.args.output_dir = str(self.root / f"task-{t}")  # the Trainer's checkpoints of this task; the user's again on return
        self.optimizer, self.lr_scheduler = None, None  # fresh AdamW per task
        self._sets = _TaskSets(self.sets)
        self._sets.current = t
        set_seed(self.args.seed + t)
        self._local = [0, 0]
        if checkpoint is None:
            self.replay_counts.pop(t, None)  # a retried task counts its own training only (a checkpoint restores them)
            if t == 0:
                self.dual.beta = resolve_beta(self.sure.dual_config(), self._ema_units(len(data)))
            self.policy.at_task_start(t, len(data), self._scorer(data), *self._label_args(t))
        self._set_aside_later_states(t, checkpoint)
        self.train_dataset = data
        self._in_next_task = True
        self._arm_jit_checkpoint()
        self.dual.activate(FAST)  # the adapter the task trains; its steps and the Trainer's callbacks see it
        try:
            out = self.train(resume_from_checkpoint=checkpoint)
        finally:
            self._in_next_task = False
            # trainer.model answers with the result again: generate, a pipeline, merge_and_unload
            self.dual.activate(self.dual.eval_adapter)
            self.args.output_dir = str(self.root)  # save_model(), save_state() and a model card go where the user said
        if self.state.global_step < self.state.max_steps:  # stopped early: its end state would mark it finished for good
            raise SureclError(
                f"{type(self).__name__}.next_task: task {t} stopped at step {self.state.global_step} of {self.state.max_steps} (a SIGTERM's "
                "JIT checkpoint, or a callback's should_training_stop) and is not finished; rerun with resume_from_checkpoint=True to continue it"
            )
        self.policy.at_task_end(t, len(data), self._scorer(data), *self._label_args(t))
        self.task += 1
        # written by the main process (and another node's first with save_on_each_node); every
        # process waits for it (a later resume scan reads it)
        end = self.root / f"task-{t}" / END_DIR
        if self.args.should_save and not self.accelerator.is_main_process:
            self._end_task(end, t)
        agreed(self, lambda: self._end_task(end, t) if self.args.should_save else None)
        return out

    def _end_task(self, end: Path, t: int) -> None:
        """Write task ``t``'s end state to ``end``; then, with ``save_total_limit`` set, remove the
        task's ``checkpoint-N`` folders: nothing resumes from them once its end state is there
        (:meth:`_find_resume` takes a task's ``sure-end`` first), and the Trainer's limit counts
        only the running task's folder. Only complete checkpoints of task ``t`` this SureTrainer
        wrote (its SuRe state, ``done`` false); never a link, nor anything else in the folder."""
        self._write_state(end, done=True)
        limit = self.args.save_total_limit
        if limit and limit > 0:
            _drop_task_checkpoints(end.parent, t)

    def _check_fresh_root(self) -> None:
        """One line when a run that does not resume starts in an ``output_dir`` that already holds
        a SureTrainer's state: a later ``resume_from_checkpoint=True`` would take the newest task
        state there, which may be the earlier run's."""
        found = sorted(str(p.relative_to(self.root)) for p in self.root.glob(f"task-*/*/{STATE_JSON}"))
        if found:
            raise SureclError(
                f"SureTrainer: output_dir {str(self.root)!r} holds an earlier run's SuRe state ({found[0]}{', ...' if len(found) > 1 else ''}); "
                "pass resume_from_checkpoint=True to continue it, or give this run another output_dir (its files are left as they are)"
            )

    def _check_dataset(self, dataset) -> None:
        """One line for a task dataset SuRe cannot index: the plan, the scores and the buffer's
        (task, index) entries take rows by position, and the collator takes each row as a mapping
        of column to value. So a sized, indexable (map-style) dataset whose rows are mappings: a
        ``datasets.Dataset`` of tokenised rows, a list of dicts or a torch ``Dataset`` of dicts;
        not a streaming ``IterableDataset``, a ``DatasetDict`` or dict of columns, a list of
        strings or a tensor."""
        from collections.abc import Mapping

        got, hint = type(dataset).__name__, ""
        if isinstance(dataset, Mapping):
            hint = ": pass one split (dataset['train'])" if hasattr(dataset, "column_names") else ": make it one (datasets.Dataset.from_dict)"
        elif isinstance(dataset, torch.utils.data.IterableDataset) or not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            hint = " (rows are taken by position: load it without streaming=True)"
        elif isinstance(dataset, (str, bytes, torch.Tensor)):
            pass
        elif _is_hf_dataset(dataset) or len(dataset) == 0:  # a Dataset's rows are dicts; an empty one is refused below
            return
        else:
            row = next((r for r in (dataset if isinstance(dataset, list) else [dataset[0]]) if not isinstance(r, Mapping)), None)
            if row is None:
                return
            got = f"a {got} whose rows are {type(row).__name__}"
        raise SureclError(
            f"{type(self).__name__}.next_task: task {self.task} needs a map-style dataset whose rows are mappings of column to value "
            f"(a datasets.Dataset of tokenised rows, or a list of dicts), got {got}{hint}"
        )

    def _check_same_rows(self, t: int, ids: dict) -> None:
        """One line, on every process, when the processes were given other rows for task ``t``
        (an unseeded shuffle or split in the script): the plan, the scores gathered across the
        processes and the buffer's (task, index) entries would name other rows on each."""
        if self.world == 1:
            return
        from accelerate.utils import gather_object

        every = gather_object([ids])
        differ = [r for r, other in enumerate(every) if other != every[0]]
        if differ:
            first = every[differ[0]]
            how = (f"{first['rows']} rows against {every[0]['rows']}" if first["rows"] != every[0]["rows"]
                   else f"the same {first['rows']} rows in another order or with other content")
            raise SureclError(
                f"{type(self).__name__}.next_task: task {t}'s rows differ between processes (process{'es' if len(differ) > 1 else ''} "
                f"{', '.join(map(str, differ))} against process 0: {how}); seed your shuffles and splits, so every process passes the same rows"
            )

    def _set_aside_later_states(self, t: int, checkpoint: str | None) -> None:
        """Before task ``t`` trains (from its start, or from the mid-task ``checkpoint``): the
        states in ``output_dir`` of a later point (a complete ``checkpoint-N`` of task ``t``
        past ``checkpoint``, its ``sure-end``, every later task's) are moved to
        ``output_dir/superseded-<i>/task-<k>/``. They are another run's (one resumed from an
        earlier state by ``resume_from_checkpoint=<folder>``, or a failed attempt at this task),
        and the next ``resume_from_checkpoint=True`` would take the newest of them over this
        run's. Only folders :meth:`_find_resume` could take (no link, nothing else in the
        folder) are moved, none deleted; by the main process, which chooses the resume."""

        def later() -> list[Path]:
            after = -1 if checkpoint is None else int(json.loads((Path(checkpoint) / TRAINER_STATE_NAME).read_text(encoding="utf-8"))["global_step"])
            found = []
            for k, p in _task_folders(self.root):
                if k < t or p.is_symlink() or not p.is_dir():
                    continue
                end = p / END_DIR
                if (end / STATE_JSON).is_file() and not end.is_symlink():
                    found.append(end)
                found += [c for c in _checkpoints(p) if not c.is_symlink() and _complete(c)
                          and (k > t or int(c.name.rsplit("-", 1)[1]) > after)]
            return sorted(found)

        def move() -> None:
            found = later()
            if not found:
                return
            taken = [int(m.group(1)) for p in self.root.glob("superseded-*") if (m := re.fullmatch(r"superseded-(\d+)", p.name))]
            aside = self.root / f"superseded-{max(taken, default=0) + 1}"
            for folder in found:
                target = aside / folder.parent.name / folder.name
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    folder.rename(target)
                except OSError as exc:
                    raise SureclError(f"{type(self).__name__}: cannot move {folder} (an earlier run's state of a later point) aside to {target}: "
                                      f"{exc.strerror or exc}; move it out of output_dir yourself") from None
            logger.warning(
                "%s: task %d trains from %s; %d state(s) of later points another run left in output_dir (%s) moved to %s, so that "
                "resume_from_checkpoint=True cannot take them; remove that folder when you no longer need them",
                type(self).__name__, t, checkpoint or "its start", len(found), ", ".join(str(f.relative_to(self.root)) for f in found), aside,
            )

        agreed(self, move)

    def _agree_jit(self, jit) -> None:
        """Under several processes: the SIGTERM checkpoint is taken by every process at the same
        point. Each process's JIT manager sets its flag from a timer of its own, 3 s after its
        SIGTERM, and the Trainer looks at it at each step's start, before its update and at its
        end: processes whose timers end on either side of such a point saved at different steps
        (or one saved alone), and one that stopped left the others waiting in the next collective,
        with no complete checkpoint. Now at each of these points the flags are summed over the
        processes, and every process saves when any asked (a SIGTERM to one process is enough);
        a flag its timer sets after the sum waits for the next point."""
        manager = jit.jit_manager

        def agreed(hook):
            def check(args, state, control, **kwargs):
                asked = torch.tensor(1.0 if manager.is_checkpoint_requested else 0.0, device=self.args.device)
                if not self.accelerator.reduce(asked, "sum").item():
                    return None  # the hook is not run: a flag set since the sum is not read by this process alone
                manager.is_checkpoint_requested = True
                return hook(args, state, control, **kwargs)

            return check

        for name in ("on_step_begin", "on_pre_optimizer_step", "on_step_end", "on_epoch_end"):
            setattr(jit, name, agreed(getattr(jit, name)))

    def _arm_jit_checkpoint(self) -> None:
        """With ``enable_jit_checkpoint``: the Trainer's SIGTERM handler in place for this task's
        ``train()``. The Trainer installs it once, when it is built, and puts the handler before
        it back at the end of every ``train()``: from the second task on, a SIGTERM would end the
        job with no checkpoint."""
        import signal
        import threading

        jit = _jit_callback(self.callback_handler.callbacks)
        manager = getattr(jit, "jit_manager", None)
        if manager is None or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) != getattr(manager, "_sigterm_handler", None):
            manager.setup_signal_handler()

    def _check_same_data(self, t: int, path: str) -> None:
        """One line when task ``t``'s training rows are not those the state at ``path`` was saved
        with (another count, order or content): its buffer would point at other rows."""
        saved = json.loads((Path(path) / STATE_JSON).read_text(encoding="utf-8")).get("data")
        if not isinstance(saved, list) or t >= len(saved) or not isinstance(saved[t], dict):
            return  # a state from before the data was recorded
        now, was = self.data_ids[t], saved[t]
        if was.get("sha256") is None or now["sha256"] is None:  # a dataset without a digest: its length only
            was, now = {"rows": was.get("rows")}, {"rows": now["rows"]}
        if was != now:
            how = (f"{now['rows']} rows, saved with {was.get('rows')}" if was.get("rows") != now["rows"]
                   else f"the same {now['rows']} rows in another order or with other content")
            raise SureclError(
                f"SureTrainer.next_task: task {t}'s training data is not the data {path} was saved with ({how}); resume with the same "
                "datasets in the same order (seeded shuffles, the same preprocessing), or start afresh in another output_dir"
            )

    def _labels(self, dataset) -> list[str] | None:
        """Each example's answer label from ``label_column`` (``balance="label"``), else None."""
        if self.sure.balance != "label":
            return None
        column = self.sure.label_column
        names = getattr(dataset, "column_names", None)
        if names is not None:
            if column not in names:
                raise SureclError(f"SureArguments.label_column: task {self.task}'s dataset has no column {column!r} (its columns: {', '.join(names)})")
            return [str(v) for v in dataset[column]]
        try:
            return [str(dataset[i][column]) for i in range(len(dataset))]
        except (KeyError, TypeError, IndexError):
            raise SureclError(f"SureArguments.label_column: task {self.task}'s rows have no key {column!r}") from None

    def _label_args(self, t: int) -> tuple:
        """The policy's ``labels`` argument for a balanced buffer (nothing otherwise)."""
        return (self.labels[t],) if self.labels[t] is not None else ()

    def _prepared(self, dataset) -> tuple:
        """The dataset as the model reads it (unused columns removed, as ``Trainer`` does), and
        each example's label (:meth:`_labels`), read just before the removal: after any
        preparation a subclass ran first (``SureSFTTrainer``: SFTTrainer's, which may shuffle
        or drop rows), so the labels are in the rows' final order."""
        labels = self._labels(dataset)
        try:
            import datasets
        except ImportError:  # pragma: no cover - datasets ships with the test extra
            return dataset, labels
        if isinstance(dataset, datasets.Dataset):
            try:
                dataset = self._remove_unused_columns(dataset, description="training")
            except ValueError:  # the Trainer's refusal of a dataset none of whose columns the model takes
                raise SureclError(
                    f"{type(self).__name__}.next_task: task {self.task}'s dataset has no column the model reads (its columns: "
                    f"{', '.join(dataset.column_names)}); tokenise it first, e.g. dataset.map(lambda b: tokenizer(b['text']), batched=True)"
                ) from None
            col = self.sure.label_column
            # the Trainer keeps a column named like its label names ("label"): read above, it is dropped
            # unless the model's forward takes it (a causal LM's collator cannot batch string labels), or
            # the user keeps every column (remove_unused_columns=False: their own collator reads them)
            if labels is not None and self.args.remove_unused_columns and col in dataset.column_names and col not in self._forward_params():
                dataset = dataset.remove_columns([col])
            return dataset, labels
        return dataset, labels

    def _forward_params(self) -> set[str]:
        import inspect

        base = self.dual.model.get_base_model()
        return set(inspect.signature(base.forward).parameters)

    def _collator(self):
        if _is_hf_dataset(self.sets[0]):  # columns already removed (_prepared)
            return self.data_collator
        return self._get_collator_with_removed_columns(self.data_collator, description="training")

    # ------------------------------------------------------------------ surprise

    def _scorer(self, data):
        cache: dict[int, list[float]] = {}

        def scores(task: int) -> list[float]:
            if task not in cache:
                cache[task] = self.surprise(data)
                _check_rows(len(cache[task]), len(data), "scored")
                check_scores(cache[task], f"#{task}", list(range(len(data))))
                self.scores[task] = cache[task]
            return cache[task]

        return scores

    def surprise(self, dataset) -> list[float]:
        """Each example's surprise under the fast adapter: mean (or summed) NLL over the tokens
        the collator's ``labels`` mark, batches of ``per_device_eval_batch_size``. With several
        processes each scores every W-th example and every process receives all the scores,
        so all take the same buffer decisions."""
        return self._sharded(lambda indices: self._surprise(dataset, indices), len(dataset))

    def _surprise(self, dataset, indices: list[int]) -> list[float]:
        return self._surprise_rows([dataset[i] for i in indices])

    @torch.no_grad()
    def _surprise_rows(self, rows: list) -> list[float]:
        collate = self._collator() if self.sets else self.data_collator
        size = self.args.per_device_eval_batch_size
        out: list[float] = []
        with self.dual.evaluating(FAST) as model:
            for start in range(0, len(rows), size):
                chunk = rows[start : start + size]
                batch = {k: v.to(self.args.device) if torch.is_tensor(v) else v for k, v in collate([dict(r) for r in chunk]).items()}
                nll, count = self._row_nll(model, batch, alone=True)
                _check_rows(len(nll), len(chunk), "scored")
                values = nll / count.clamp(min=1) if self.sure.reduction == "mean" else nll
                out += values.tolist()
        return out

    def _row_nll(self, model, batch: dict, alone: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's summed NLL (fp32) over the tokens its ``labels`` mark, and their count.
        ``alone`` (surprise scoring): a causal row's value does not depend on its batch: a
        left-padded row's positions count from its first real token (where the batch brings no
        ``position_ids`` and the model takes them), and a token is scored only after a real one
        (the first real token of a left-padded row, which a collator such as
        ``DataCollatorForLanguageModeling`` labels, would be predicted from padding). Without it
        (the pair loss) the rows read as the model's own loss reads them on the other steps, so a
        row trains one way in every step of a run."""
        batch = dict(batch)
        labels = _pop_labels(batch)
        mask = batch.get("attention_mask")
        if self.is_seq2seq:
            logits = model(**batch, labels=labels).logits
        else:
            if alone and _left_padded(mask) and "position_ids" not in batch and _takes_position_ids(model):
                batch["position_ids"] = (mask.long().cumsum(1) - 1).clamp(min=0)
            logits = model(**batch).logits[:, :-1]
        labels = self._scored_labels(labels, mask, alone)
        valid = labels != -100
        lse = torch.logsumexp(logits.float(), dim=-1)
        target = logits.gather(2, labels.clamp(min=0).unsqueeze(2)).squeeze(2).float()
        return ((lse - target) * valid).sum(1), valid.sum(1)

    def _scored_labels(self, labels: torch.Tensor, mask, alone: bool) -> torch.Tensor:
        """The target of each scored logit (-100: not scored), as :meth:`_row_nll` reads them: a
        causal row's labels shifted (position k predicts token k + 1), and with ``alone`` no token
        predicted from left padding."""
        if self.is_seq2seq:
            return labels
        labels = labels[:, 1:]
        if alone and _left_padded(mask):
            labels = labels.masked_fill(mask[:, :-1] == 0, -100)
        return labels

    def _check_tokens(self, t: int, data) -> None:
        """One line, before task ``t`` scores or trains anything, for rows SuRe cannot use: a row
        without tokens (empty ``input_ids``: the model cannot run it alone), or one whose
        collated ``labels`` mark no token a row's surprise could be taken over (all -100, or a
        causal row of one token, which predicts nothing). Such a row has no surprise (a token mean
        over no tokens), and trains nothing where it is a new or a replayed row (alone in a
        micro-batch its loss is 0/0); ``surecl run`` refuses such rows when it encodes a task
        too. The rows are checked on every W-th index per process, the findings gathered."""

        def kinds(indices: list[int]) -> list[int]:
            collate, out = self._collator(), []
            for start in range(0, len(indices), _CHECK_ROWS):
                rows = _rows_at(data, indices[start : start + _CHECK_ROWS])
                empty = [not _has_tokens(r) for r in rows]
                counts = iter(self._scored_counts(collate, [r for r, e in zip(rows, empty) if not e]))
                out += [_EMPTY if e else (_UNSCORED if next(counts) == 0 else 0) for e in empty]
            return out

        found = self._sharded(kinds, len(data))
        name = type(self).__name__
        for kind, what, mend in [
            (_EMPTY, "has no tokens (empty input_ids)", "drop empty rows first, e.g. dataset.filter(lambda r: len(r['input_ids']) > 0)"),
            (_UNSCORED, "has no token its labels mark (labels all -100, or a single token, from which a causal model predicts nothing)",
             "it has no surprise to rank it by and trains nothing; drop such rows first (dataset.filter; one-token rows: "
             "lambda r: len(r['input_ids']) > 1), as SFTTrainer drops the rows its truncation leaves without a loss token"),
        ]:
            rows = [i for i, k in enumerate(found) if k == kind]
            if rows:
                more = f" (and {len(rows) - 1} more row{'s' if len(rows) > 2 else ''} like it)" if len(rows) > 1 else ""
                raise SureclError(f"{name}.next_task: task {t} row {rows[0]}{self._rows_of}{more} {what}: {mend}")

    def _scored_counts(self, collate, rows: list[dict]) -> list[int]:
        """Each row's count of scored tokens (:meth:`_scored_labels`, as its surprise takes
        them), from the rows collated together; a padding-free collator, which joins them into
        one row (and is refused only where a row is scored or weighted alone), collates each
        row alone."""
        if not rows:
            return []
        batch = collate([dict(r) for r in rows])
        labels = self._scored_labels(_pop_labels(batch), batch.get("attention_mask"), alone=True)
        if len(labels) != len(rows):
            return [count for r in rows for count in self._scored_counts(collate, [r])] if len(rows) > 1 else [int((labels != -100).sum())]
        return (labels != -100).sum(1).tolist()

    def _age(self, step: int) -> None:
        """``aging``: the entries optimizer step ``step`` of the stage replayed take their
        surprise under the fast adapter it produced (scored on every W-th entry per process and
        gathered, so every process holds the same scores)."""
        entries = self._drawn[step] if step < len(self._drawn) else []
        if not entries:
            return
        rows = [self.sets[e.task][e.index] for e in entries]
        scores = self._sharded(lambda indices: self._surprise_rows([rows[i] for i in indices]), len(rows))
        for e, v in zip(entries, scores):
            check_scores([v], f"#{e.task}", [e.index], "re-scored on replay")
        self.policy.age(entries, scores)

    # ------------------------------------------------------------------ batches with replay

    def _layout(self, n: int) -> tuple[list[list[int]], int]:
        """(micro-batch sizes of new examples per epoch, grouped per optimizer step; epochs),
        and the stage's optimizer steps, as the Trainer will take them. A micro-batch is that of
        all processes together: ``per_device_train_batch_size`` x the number of processes."""
        b, ga = self.args.per_device_train_batch_size * self.world, self.args.gradient_accumulation_steps
        batches = [b] * (n // b) + ([n % b] if n % b and not self.args.dataloader_drop_last else [])
        steps_per_epoch = math.ceil(len(batches) / ga)
        if self.args.max_steps > 0:
            total = self.args.max_steps
            epochs = math.ceil(total / steps_per_epoch)
        else:
            epochs = math.ceil(self.args.num_train_epochs)
            total = math.ceil(self.args.num_train_epochs * steps_per_epoch)  # the Trainer's count: 1.5 epochs stop mid-way
        return [batches] * epochs, total

    def _ema_units(self, n: int) -> int:
        per_epoch, total = self._layout(n)
        ga = self.args.gradient_accumulation_steps
        steps = [sum(batch[k : k + ga]) for batch in per_epoch for k in range(0, len(batch), ga)][:total]
        return sum(steps) if self.sure.unit == "example" else len(steps)

    def _orders(self, t: int) -> list[list[int]]:
        """Each epoch's order of task ``t``'s new examples: the core's uniform batches of one
        optimizer step's size (:func:`surecl.data.encode.uniform_batches` on one
        ``random.Random("batches:<seed>")`` stream drawn epoch after epoch, task after task, as
        ``surecl run`` with ``train.batching=uniform`` draws them), so the same seed gives the
        core's batches. Redrawn from the stream's start for every task (a resumed run too). The
        seed is ``data_seed`` where set (:func:`_data_seed`)."""
        rng = random.Random(f"batches:{_data_seed(self.args)}")
        step = self.args.per_device_train_batch_size * self.world * self.args.gradient_accumulation_steps
        for k in range(t + 1):
            n = len(self.sets[k])
            orders = [[i for batch in uniform_batches(n, step, rng) for i in batch] for _ in self._layout(n)[0]]
        return orders

    def _plan(self, t: int, n: int) -> list[list[list[tuple[int, int, int, float]]]]:
        """Every epoch's micro-batches of the stage (of all processes together): new examples
        in the core's order (:meth:`_orders`), and the replayed entries the policy draws for
        each optimizer step (``replay_count``), the j-th into micro-batch j mod GA. With
        ``replay_loss="example"`` every step, with ``"pair"`` a step that replays, gives each row
        its pair weight over the whole step: the step's new rows in order (micro-batch after micro-batch), then its replayed
        rows in draw order, weighted as the core's :func:`surecl.step.pair_weights` (the row's
        own token count divides it in the training step)."""
        per_epoch, total = self._layout(n)
        ga = self.args.gradient_accumulation_steps
        epochs, steps = [], []
        for sizes, perm in zip(per_epoch, self._orders(t)):
            micro, pos = [], 0
            for size in sizes:
                micro.append([(t, i, NEW_ROW, JOINT) for i in perm[pos : pos + size]])
                pos += size
            epochs.append(micro)
            steps += [micro[k : k + ga] for k in range(0, len(micro), ga)]
        sizes = [sum(len(m) for m in step) for step in steps]
        spec = SimpleNamespace(replay=self.replay_cfg)
        self._drawn = []
        for s, step in enumerate(steps[:total]):
            drawn = self.policy.sample(replay_count(s, sizes, spec)) if self.sure.policy != "none" else []
            self._drawn.append(drawn)
            if self.sure.replay_loss == "example" or (drawn and self.sure.replay_loss == "pair"):
                n_new = sizes[s]
                weights = pair_weights(n_new, [1] * (n_new + len(drawn)))  # 1 / (n_new x pair size)
                k = 0
                for micro in step:  # in place: the epoch's lists are these
                    micro[:] = [(task, i, kind, weights[k + r]) for r, (task, i, kind, _) in enumerate(micro)]
                    k += len(micro)
                for j, e in enumerate(drawn):
                    step[j % len(step)].append((e.task, e.index, REPLAYED_ROW, weights[n_new + j]))
            else:
                for j, e in enumerate(drawn):
                    step[j % len(step)].append((e.task, e.index, REPLAYED_ROW, JOINT))
        return epochs

    def _share(self, micro: list[tuple[int, int, int, float]]) -> list[tuple[int, int, int, float]]:
        """This process's rows of a micro-batch: items rank, rank + W, ... (new, then replayed,
        as the core's ``TrainStep`` splits a step); with none, its first row as padding (every
        process runs every micro-batch's forward and backward, which DDP synchronises)."""
        if self.world == 1:
            return micro
        padding = (micro[0][0], micro[0][1], PADDING_ROW, JOINT if micro[0][3] == JOINT else 0.0)
        return micro[self.rank :: self.world] or [padding]

    def get_train_dataloader(self):
        if not getattr(self, "_in_next_task", False):  # trainer.train() alone would train the last task again
            raise SureclError("SureTrainer: train with trainer.next_task(train_dataset), one call per task (not trainer.train())")
        t = self._sets.current
        self._plan_policy = self.policy.state_dict()[0]  # what a resumed run replans from
        plan = self._plan(t, len(self.sets[t]))
        sampler = _PlannedBatches([[self._share(micro) for micro in epoch] for epoch in plan])
        return _PlannedLoader(
            self._sets, batch_sampler=sampler, collate_fn=_MarkedCollator(self._collator()),
            num_workers=self.args.dataloader_num_workers, pin_memory=self.args.dataloader_pin_memory,
        )

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.dual.active != FAST:  # a step taken outside next_task (called directly) trains the fast adapter all the same
            was = self.dual.active
            self.dual.activate(FAST)
            try:
                return self.training_step(model, inputs, num_items_in_batch)
            finally:
                self.dual.activate(was)
        self._local[0] += int(inputs.pop(NEW, 0))
        self._local[1] += int(inputs.pop(REPLAYED, 0))
        weights = inputs.pop(WEIGHT, None)
        padding_tokens = inputs.pop(PADDING_TOKENS, None)
        if weights is None:
            loss = super().training_step(model, inputs, num_items_in_batch)
            if hasattr(self, "_total_train_tokens") and padding_tokens is not None and self.world > 1:  # SFTTrainer's num_tokens
                self._total_train_tokens -= int(self.accelerator.reduce(padding_tokens.to(loss.device), "sum").item())
                if isinstance(getattr(self, "_metrics", None), dict) and "train" in self._metrics:  # the value the next log reports
                    self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
            # after its backward but before the optimizer step: a NaN gradient never reaches the
            # fast adapter, nor through the EMA the slow one and a checkpoint
            self._check_finite(loss)
            return loss
        return self._pair_step(model, inputs, weights)

    def _check_finite(self, loss: torch.Tensor) -> None:
        """One line when a micro-batch's loss is NaN or infinite, on every process (a flag
        summed over them: the others would otherwise wait in the next all-reduce)."""
        bad = torch.tensor(0.0 if torch.isfinite(loss) else 1.0, device=loss.device)
        if self.world > 1:
            bad = self.accelerator.reduce(bad, "sum")
        if bad.item():
            where = f" (on {int(bad.item())} of {self.world} processes)" if self.world > 1 else f" ({loss.item()})"
            raise SureclError(f"non-finite loss{where} at task {self.task} step {self.state.global_step}: lower learning_rate (or fix the data)")

    def _pair_step(self, model, inputs, weights: torch.Tensor) -> torch.Tensor:
        """A micro-batch of a ``replay_loss="pair"`` step: loss = sum over its rows of the row's
        pair weight x its token-mean NLL, times the number of processes (DDP averages the
        gradients); the weights already divide by the step's n_new, so the micro-batches'
        losses (of all processes) add up to the step's loss, and the gradient accumulates to
        the one-process step's. Returns the loss for the Trainer's log (its sum over a step's
        micro-batches, averaged over processes, is the step's loss).

        What ``Trainer.training_step`` does around its loss is done here too: the optimizer's
        train mode (schedule-free optimizers), TRL's activation offloading context, the device
        cache emptied every ``torch_empty_cache_steps``, LOMO's learning rate passed to the
        backward, and DeepSpeed told not to divide the loss by the accumulation steps (it is
        the step's share already)."""
        from accelerate.utils import DistributedType
        from accelerate.utils.memory import clear_device_cache
        from transformers.training_args import OptimizerNames

        model.train()
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()
        inputs = self._prepare_inputs(inputs)
        with getattr(self, "maybe_activation_offload_context", None) or contextlib.nullcontext():
            with self.compute_loss_context_manager():
                nll, count = self._row_nll(model, inputs)
                _check_rows(len(nll), len(weights), "weighted")
                w = weights.to(device=nll.device, dtype=nll.dtype)
                loss = self.world * (w * nll / count.clamp(min=1)).sum()
            del inputs
            self._check_finite(loss)
            every = self.args.torch_empty_cache_steps
            if every is not None and self.state.global_step % every == 0:
                clear_device_cache()
            kwargs = {}
            if self.args.optim in (OptimizerNames.LOMO, OptimizerNames.ADALOMO):
                kwargs["learning_rate"] = self._get_learning_rate()
            if self.accelerator.distributed_type == DistributedType.DEEPSPEED:
                kwargs["scale_wrt_gas"] = False
            self.accelerator.backward(loss, **kwargs)
        return loss.detach()

    # ------------------------------------------------------------------ evaluation

    def weights(self, adapter: str | None = None) -> contextlib.AbstractContextManager:
        """Context manager: the model in eval mode answering with ``adapter`` (default: the slow
        adapter, or the fast one without the dual learner); after it, the adapter and mode in
        place before (an ``evaluate`` inside ``with trainer.slow_weights():`` leaves it slow)."""
        names = (SLOW, FAST) if self.sure.dual else (FAST,)
        if adapter is not None and adapter not in names:
            raise SureclError(f"{type(self).__name__}: adapter={adapter!r} is not one of this trainer's adapters; use "
                              f"{' or '.join(repr(n) for n in names)}{' (dual=False: there is no slow adapter)' if not self.sure.dual else ''}")
        return self._view(adapter or self.dual.eval_adapter)

    @contextlib.contextmanager
    def _view(self, adapter: str):
        """:meth:`DualLoRA.evaluating`, counted in :attr:`_views` (``next_task`` is refused inside)."""
        self._views += 1
        try:
            with self.dual.evaluating(adapter) as model:
                yield model
        finally:
            self._views -= 1

    def slow_weights(self) -> contextlib.AbstractContextManager:
        """``with trainer.slow_weights() as model:`` evaluate the slow adapter your own way."""
        return self.weights(SLOW if self.sure.dual else FAST)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval", adapter: str | None = None, **gen_kwargs):
        """``Trainer.evaluate`` on the slow adapter (``adapter="fast"``: the fast one). A dict of
        datasets (given here or as ``eval_dataset`` at construction) is evaluated one dataset at
        a time, as the Trainer does (``<prefix>_<name>_*`` metrics), but here, so that
        ``adapter`` holds for each (the Trainer's own loop calls ``evaluate`` without it). Other
        keywords go to the parent: a ``Seq2SeqTrainer`` mixed in takes ``max_new_tokens`` and the
        other generation settings."""
        sets = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(sets, dict):
            metrics: dict = {}
            for name, dataset in sets.items():  # a name selects a dataset given at construction (prepared there)
                metrics.update(self.evaluate(dataset if eval_dataset is not None else name, ignore_keys, f"{metric_key_prefix}_{name}",
                                             adapter=adapter, **gen_kwargs))
            return metrics
        with self.weights(adapter):
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix, **gen_kwargs)

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test", adapter: str | None = None, **gen_kwargs):
        """``Trainer.predict`` on the adapter ``evaluate`` answers with: the slow one
        (``adapter="fast"``: the fast one); other keywords go to the parent, as in :meth:`evaluate`."""
        with self.weights(adapter):
            return super().predict(test_dataset, ignore_keys, metric_key_prefix, **gen_kwargs)

    # ------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self, model, trial):
        folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.args.should_save:  # before the Trainer's files: a folder it lists as a checkpoint has ours
            self._write_state(folder, done=False)
        if not (self._in_step and self._step_logged is not None):
            return super()._save_checkpoint(model, trial)
        live = self._logged()  # inside a step (:class:`_JitSteps`): the last step's counters, then the live ones back
        self.state.total_flos, self.current_flos, self.state.num_input_tokens_seen = self._step_logged
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.state.total_flos, self.current_flos, self.state.num_input_tokens_seen = live

    def _logged(self) -> tuple:
        """The counters a checkpoint's ``trainer_state.json`` takes from the Trainer: ``total_flos``
        with this process's flops not yet stored (summed over processes as the save stores them)
        and ``num_input_tokens_seen``."""
        return self.state.total_flos, self.current_flos, self.state.num_input_tokens_seen

    def _save_rng_state(self, output_dir: str) -> None:
        """Inside an optimizer step (a SIGTERM checkpoint: :class:`_JitSteps`), the random states
        of the last step's end, which the checkpoint is named after; else the Trainer's."""
        if not (self._in_step and self._step_rng is not None):
            return super()._save_rng_state(output_dir)
        now = _rng_states()
        _set_rng_states(self._step_rng)
        try:
            super()._save_rng_state(output_dir)
        finally:
            _set_rng_states(now)

    def _load_rng_state(self, checkpoint) -> None:
        super()._load_rng_state(checkpoint)
        if self._jit and checkpoint is not None:  # the resumed step starts from these
            self._keep_step()

    def _maybe_log_save_evaluate(self, *args, **kwargs):
        out = super()._maybe_log_save_evaluate(*args, **kwargs)
        if self._jit:  # the states a checkpoint saved here holds: the next step starts from them
            self._keep_step()
        return out

    def _keep_step(self) -> None:
        """Keep what a checkpoint of the last optimizer step holds, for a SIGTERM checkpoint saved
        inside the next one (:class:`_JitSteps`): the random states and the logged counters."""
        self._step_rng, self._step_logged = _rng_states(), self._logged()

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        if (Path(resume_from_checkpoint) / STATE_JSON).is_file():
            self._read_state(resume_from_checkpoint)
            return
        super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _write_state(self, folder: Path, done: bool) -> None:
        dual_meta, tensors = self.dual.state_dict()
        policy = self.policy.state_dict()[0]
        if not done:  # the random state the stage's plan was drawn from (a resumed run redraws it); the buffer as now (aged scores)
            policy = {**policy, "rng": self._plan_policy["rng"]}
        meta = {
            "format": FORMAT, "task": self.task - 1 if done else self.task, "done": done, "beta": self.dual.beta,
            **dual_meta, "policy": policy, "replay_counts": {str(k): v for k, v in self.replay_counts.items()},
            "sure": asdict(self.sure), "plan": self._plan_key(), "processes": self.world, "data": self.data_ids,
        }
        folder = Path(folder)
        write_tensors(folder / STATE_TENSORS, tensors)
        write_json(folder / STATE_JSON, meta)

    def _read_state(self, folder) -> None:
        from safetensors.torch import load_file

        folder = Path(folder)
        meta = self._state_meta(folder)
        self.dual.load_state_dict(meta, load_file(str(folder / STATE_TENSORS)))
        self.dual.beta = meta["beta"]
        self.policy.load_state_dict(meta["policy"])
        self.replay_counts = {int(k): v for k, v in meta["replay_counts"].items()}

    def _state_meta(self, folder: Path) -> dict:
        """The SuRe state saved in ``folder``, refused in one line where this run cannot continue
        it (another format, another task, other settings: :meth:`_check_same_settings`)."""
        meta = json.loads((folder / STATE_JSON).read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT:
            raise SureclError(f"{folder / STATE_JSON}: format {meta.get('format')} is not {FORMAT}")
        if meta["task"] != self.task:
            raise SureclError(f"{folder}: a checkpoint of task {meta['task']}, but this is task {self.task}: call next_task once per task, in order")
        self._check_same_settings(folder, meta)
        return meta

    def _plan_key(self) -> dict:
        """What a stage's batch plan (:meth:`_plan`) is drawn from besides SuRe's settings: a
        checkpoint inside a task resumes exactly only under the same values (the Trainer skips
        the steps already taken in the plan it redraws)."""
        a = self.args
        return {"micro_batch": a.per_device_train_batch_size * self.world, "accumulation": a.gradient_accumulation_steps,
                "seed": a.seed, "data_seed": a.data_seed, "epochs": a.num_train_epochs, "max_steps": a.max_steps,
                "drop_last": a.dataloader_drop_last}

    def _check_same_settings(self, folder: Path, meta: dict) -> None:
        """One line when the run resumed from ``folder`` had other SuRe settings, or (inside a
        task) another batch plan, than this one: the resumed run would silently be another run."""
        now = json.loads(json.dumps(asdict(self.sure)))
        saved = meta.get("sure")
        if isinstance(saved, dict):  # a field newer than the state: its default, the behaviour the state was saved under
            saved = {**json.loads(json.dumps(asdict(SureArguments()))), **saved}
        if isinstance(saved, dict) and saved != now:
            keys = sorted(k for k in saved.keys() | now.keys() if saved.get(k) != now.get(k))
            changed = ", ".join(f"{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in keys)
            raise SureclError(f"{folder}: this run was saved with other SureArguments ({changed}); resume with the same settings, or start a new output_dir")
        plan, plan_now = meta.get("plan"), self._plan_key()
        # a key newer than the state (data_seed) reads None there: unset, as that run had it
        if not meta.get("done") and isinstance(plan, dict) and any(plan.get(k) != v for k, v in plan_now.items()):
            changed = ", ".join(f"{k} {plan.get(k)!r} -> {v!r}" for k, v in plan_now.items() if plan.get(k) != v)
            raise SureclError(
                f"{folder}: a checkpoint inside task {meta['task']} saved under another batch plan ({changed}; micro_batch is "
                "per_device_train_batch_size x processes); resume it with the same values, or from the task's end"
            )

    def _find_resume(self, where: str | bool) -> dict | None:
        """The state to resume from: a checkpoint folder, or with ``True`` the newest in
        ``output_dir`` (a mid-task checkpoint or a task's end); None when there is none."""
        if where is not True:
            return _given_resume(Path(where))
        for k, folder in sorted(_task_folders(self.root), reverse=True):
            if (folder / END_DIR / STATE_JSON).is_file():
                return {"task": k, "path": str(folder / END_DIR), "done": True}
            for last in _checkpoints(folder):
                if _complete(last):
                    _check_resumable(last)
                    return {"task": k, "path": str(last), "done": False}
        return None


def _data_digest(data) -> str | None:
    """SHA-256 of a task's prepared rows as the model reads them (``input_ids`` and, where the
    dataset has them, ``labels``, in order): through Arrow for a ``datasets.Dataset`` (a second
    per few million tokens), row by row for a list of dicts; None for another dataset (a torch
    ``Dataset`` may build its rows on the fly: only its length is compared)."""
    if isinstance(data, list):
        h = hashlib.sha256()
        for row in data:
            for name in ("input_ids", "labels"):
                value = row.get(name) if isinstance(row, dict) else None
                if value is not None:
                    h.update(json.dumps(value.tolist() if hasattr(value, "tolist") else value, default=str).encode())
            h.update(b"|")
        return h.hexdigest()
    if not _is_hf_dataset(data):
        return None
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    table = data.with_format("arrow")[:]
    h = hashlib.sha256()
    for name in ("input_ids", "labels"):
        if name not in table.column_names:
            continue
        col = table.column(name).combine_chunks()
        h.update(name.encode())
        try:
            if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):  # token lists: their lengths and values
                h.update(np.asarray(pc.list_value_length(col).fill_null(-1)).tobytes())
                col = col.flatten()
            h.update(np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64).tobytes())
        except (TypeError, ValueError, pa.ArrowException):  # another shape (nested lists, strings): its values as text
            h.update(json.dumps(col.to_pylist(), default=str).encode())
    return h.hexdigest()


_CHECK_ROWS = 256
"""Rows collated at a time by :meth:`SureTrainer._check_tokens` (no forward: padding only)."""
_EMPTY, _UNSCORED = 1, 2


def _rows_at(data, indices: list[int]) -> list[dict]:
    """The rows of ``data`` at ``indices``, as dicts (a ``datasets.Dataset``'s read as one batch)."""
    if _is_hf_dataset(data):
        columns = data[indices]
        return [dict(zip(columns, values)) for values in zip(*columns.values())] if columns else [{} for _ in indices]
    return [dict(data[i]) for i in indices]


def _has_tokens(row: dict) -> bool:
    """Whether a row's ``input_ids`` hold a token (a row without the column: it is not judged here)."""
    ids = row.get("input_ids", [0])
    try:
        return ids is not None and len(ids) > 0
    except TypeError:  # not a sequence (a 0-d tensor): the collator judges it
        return True


def _left_padded(mask) -> bool:
    """Whether a batch's ``attention_mask`` (rows x positions) starts a row with padding."""
    return torch.is_tensor(mask) and mask.dim() == 2 and bool((mask[:, 0] == 0).any())


def _pop_labels(batch: dict) -> torch.Tensor:
    """A collated batch's ``labels``, taken out of it (with ``shift_labels``); one line where the
    collator gave none."""
    if not torch.is_tensor(batch.get("labels")):
        raise SureclError(
            "SureTrainer: the data collator gave no labels (SuRe scores and weighs the tokens your labels mark); use one that "
            "sets them, e.g. DataCollatorForLanguageModeling(tokenizer, mlm=False) or DataCollatorForSeq2Seq"
        )
    batch.pop("shift_labels", None)
    return batch.pop("labels")


def _check_rows(rows: int, examples: int, what: str) -> None:
    """One line when the collator's batch has another number of rows than examples: a
    padding-free collator (``DataCollatorWithFlattening``) joins a batch into one row, and
    SuRe scores and weights every example by its own row."""
    if rows != examples:
        raise SureclError(
            f"SureTrainer: the data collator gave {rows} rows for {examples} examples to be {what} one by one (a padding-free "
            "collator such as DataCollatorWithFlattening joins them into one); use a padding collator (DataCollatorForLanguageModeling, DataCollatorForSeq2Seq)"
        )


def _task_folders(root: Path) -> list[tuple[int, Path]]:
    """The ``task-<k>`` folders in ``root`` with their task numbers, as SureTrainer names them
    (``task-01`` is not one)."""
    return [(int(m.group(1)), p) for p in root.glob("task-*") if (m := re.fullmatch(r"task-(0|[1-9]\d*)", p.name))]


def _checkpoints(folder: Path) -> list[Path]:
    """The Trainer's ``checkpoint-N`` folders in ``folder``, newest (largest N) first."""
    found = [(int(m.group(1)), p) for p in folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if p.is_dir() and (m := re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)", p.name))]
    return [p for _, p in sorted(found, key=lambda x: x[0], reverse=True)]


def _drop_task_checkpoints(folder: Path, task: int) -> None:
    """Remove the Trainer's ``checkpoint-N`` folders in ``folder`` (``task-<task>``) once the task's
    end state is there: only complete checkpoints (:func:`_complete`) whose SuRe state is task
    ``task``'s, inside it; never a link, another task's state, a half-written one or anything else."""
    if not (folder / END_DIR / STATE_JSON).is_file():
        return
    for checkpoint in _checkpoints(folder):
        if checkpoint.is_symlink() or not _complete(checkpoint):
            continue
        try:
            meta = json.loads((checkpoint / STATE_JSON).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("task") == task and meta.get("done") is False:
            shutil.rmtree(checkpoint, ignore_errors=True)


def _complete(folder: Path) -> bool:
    """A checkpoint the Trainer finished writing: SuRe's state (written first, atomically) and
    the Trainer's ``trainer_state.json``, which the main process writes last (after the weights,
    optimizer, scheduler and its RNG state), parsing; with the optimizer's state saved, every
    process's RNG state too (each process writes its own, unsynchronised with the main one). A
    job killed while saving leaves a folder without one of them, which a resume passes over for
    the one before."""
    if not (folder / STATE_JSON).is_file():
        return False
    try:
        json.loads((folder / TRAINER_STATE_NAME).read_text(encoding="utf-8"))
        processes = int(json.loads((folder / STATE_JSON).read_text(encoding="utf-8")).get("processes", 1))
    except (OSError, ValueError, TypeError, AttributeError):
        return False
    if _has_optimizer_state(folder):
        names = ["rng_state.pth"] if processes == 1 else [f"rng_state_{r}.pth" for r in range(processes)]
        if not all((folder / name).is_file() and (folder / name).stat().st_size > 0 for name in names):
            return False
    return True


def _has_optimizer_state(folder: Path) -> bool:
    """Whether the Trainer saved its optimizer in checkpoint ``folder`` (not with ``save_only_model``)."""
    return any(folder.glob("optimizer*"))


def _given_resume(folder: Path) -> dict:
    """``resume_from_checkpoint=<folder>``: a task's end (``task-<k>/sure-end``) or a complete
    checkpoint a SureTrainer wrote, else one line saying what the folder is not."""
    state = folder / STATE_JSON
    if not state.is_file():
        raise SureclError(
            f"resume_from_checkpoint={str(folder)!r}: no SuRe state there ({STATE_JSON}); pass a checkpoint-N or sure-end "
            "folder a SureTrainer wrote, or True for the newest in output_dir"
        )
    try:
        meta = json.loads(state.read_text(encoding="utf-8"))
        task, done = int(meta["task"]), bool(meta["done"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SureclError(f"{state}: not a SureTrainer state ({type(exc).__name__}: {exc})") from None
    if not done:
        if not _complete(folder):
            raise SureclError(
                f"{folder}: an incomplete checkpoint (the Trainer's {TRAINER_STATE_NAME} or a process's RNG state is missing or "
                "unreadable: the job stopped while saving it); pass the checkpoint before it, or True for the newest complete one"
            )
        _check_resumable(folder)
    return {"task": task, "path": str(folder), "done": done}


def _check_resumable(folder: Path) -> None:
    """A checkpoint inside a task resumes exactly only with the optimizer's state, which
    ``save_only_model=True`` leaves out (the Trainer would restart AdamW and the schedule
    silently)."""
    if not _has_optimizer_state(folder):
        raise SureclError(
            f"{folder}: a checkpoint without the optimizer's state (saved with save_only_model=True), from which a task "
            "cannot resume where it stopped; resume from the task's end (task-<k>/sure-end), or save with save_only_model=False"
        )


def _data_seed(args) -> int:
    """The seed of each task's batch order and of the replay policy's draws:
    ``TrainingArguments.data_seed`` where set, else ``seed`` (the Trainer's rule for its sampler)."""
    return args.data_seed if args.data_seed is not None else args.seed


def _jit_callback(callbacks: list):
    """The Trainer's ``JITCheckpointCallback`` among ``callbacks`` (``enable_jit_checkpoint``), else None."""
    return next((cb for cb in callbacks if type(cb).__name__ == "JITCheckpointCallback"), None)


def _is_hf_dataset(obj) -> bool:
    try:
        import datasets
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, datasets.Dataset)


__all__ = ["SureArguments", "SureTrainer"]
