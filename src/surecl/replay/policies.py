"""Replay selection policies: plugins that own the buffer and decide what enters it and when.

* ``reservoir`` - online and task-agnostic: every current-task example is offered to a
  reservoir as it is trained on (Random-O in the paper's ablations).
* ``random``    - task-aware, equal quota; a task's share is a uniform random subset
  (Random-B / Random-A depending on ``insert_time``); with ``replay.balance=label`` (either
  quota policy) the share is spread evenly over the task's labels.
* ``surprise`` and ``online_surprise`` - SuRe, in :mod:`surecl.plugins.sure`.

A policy is a :class:`~surecl.plugins.base.Plugin`: its ``before_task`` / ``after_task`` hooks
select a task's share (:meth:`ReplayPolicy.at_task_start` / :meth:`ReplayPolicy.at_task_end`
with the run's surprise scorer), its ``after_step`` hook observes the step's current batch
(:meth:`ReplayPolicy.observe`) and ages replayed entries (:meth:`ReplayPolicy.age`); the
loop draws each step's replayed examples with :meth:`ReplayPolicy.sample` (with ``replay.ratio``,
the ratio's count on every step; without it, ``replay.batch_size`` every ``replay.every``-th step).
Policies are found by name through :mod:`surecl.registry` (``register_policy`` adds yours).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from surecl.errors import SureclError
from surecl.plugins.base import Plugin, Stage, StepRecord
from surecl.replay.buffer import Entry, OnlineQuotaBuffer, QuotaBuffer, ReservoirBuffer, quota, quota_held, sample
from surecl.sections import ReplayConfig

Scorer = Callable[[int], list[float]]
"""Surprise of every training example of task ``t`` under the current fast model."""


@dataclass
class BufferConfig:
    """A policy's view of ``replay.*``: what every policy needs."""

    buffer_size: float = 0.02
    """S: below 1 a fraction of all training examples of the stream, else an absolute count."""
    replacement: bool = False
    """A step's replayed entries drawn each on its own (with replacement), not as one draw
    without replacement (``replay.replacement``)."""

    @classmethod
    def from_replay(cls, replay: ReplayConfig):
        """This view of the ``replay`` section (its fields by name)."""
        return cls(**{f: getattr(replay, f) for f in cls.__dataclass_fields__})


@dataclass
class QuotaConfig(BufferConfig):
    """The task-aware policies' options: when a task's priorities are computed and when its
    share enters the equal-quota buffer (``replay.score_time``, ``replay.insert_time``)."""

    score_time: str = "before"
    insert_time: str = "before"
    balance: str = "none"
    """``label``: a task's share is spread evenly over its labels (the top entries of each label
    in turn); ``none``: the top entries whatever their labels."""


def check_scores(scores: list[float], task: str, indices: list[int], what: str = "scored") -> None:
    """A NaN or infinite surprise would silently sort first or last in the buffer: stop."""
    for i, v in zip(indices, scores):
        if not math.isfinite(v):
            raise SureclError(
                f"surprise of task {task} training example {i} ({what}) is {v}: the model gives it a non-finite "
                "likelihood (check the data, lower train.lr, or use model.dtype=fp32); the last checkpoint is intact"
            )


def _number(value) -> float:
    """``value`` as a float: a number (a one-element tensor or array too), never a string."""
    if isinstance(value, (str, bytes)):
        raise TypeError(value)
    return float(value)


class ReplayPolicy(Plugin):
    """Base policy: an empty equal-quota buffer nothing enters (``none``).

    Built as ``cls(replay, capacity, seed)``: ``replay`` is the run's ``replay`` section (or
    an instance of the policy's ``Config``, which views it), ``capacity`` the buffer size S as
    a count, ``seed`` the run's seed (the policy's own random stream)."""

    name = "none"
    Config = BufferConfig
    uses_scores = False
    """Whether the buffer ranks by surprise. ``replay.aging`` needs it, and a policy that
    re-scores replayed entries: its own ``age`` and an ``after_step`` that calls it (surecl's
    surprise policies, ``surecl.plugins.sure``)."""
    needs_step_scores = False
    """True if ``observe`` wants each example's loss and label from the step."""
    per_task_quota = False
    """Whether the buffer keeps an equal quota floor(S/d) per task seen (``quota_warning``)."""
    per_label_quota = False
    """Whether the buffer keeps an equal quota floor(S/k) per answer label seen (``quota_warning``)."""
    online = False
    """Whether the buffer fills while a task trains (so the first task already replays)."""
    options = None
    """The policy's own option section when it registered one (``register_policy(name, cls,
    config=MyOptions)``; set by the run before its ``__init__`` runs, so ``__init__`` may read it), else None."""

    def __init__(self, cfg, capacity: int, seed: int):
        super().__init__(cfg if isinstance(cfg, self.Config) else self.Config.from_replay(cfg))
        self.capacity = capacity
        self.rng = random.Random(f"replay:{seed}")
        self.buffer: QuotaBuffer | ReservoirBuffer | OnlineQuotaBuffer = QuotaBuffer(capacity)

    # ------------------------------------------------------------------ plugin hooks

    def scorer(self, ctx) -> Scorer:
        """The surprise of a task's training set under the current fast adapter."""
        return ctx.surprise_of_task

    def before_task(self, ctx, stage: Stage) -> None:
        self.at_task_start(stage.row, len(ctx.train_sets[stage.row]), self.scorer(ctx))

    def after_task(self, ctx, stage: Stage) -> None:
        self.at_task_end(stage.row, len(ctx.train_sets[stage.row]), self.scorer(ctx))

    def after_step(self, ctx, record: StepRecord) -> None:
        """Offer the step's current-task examples to the buffer."""
        row = record.stage.row
        self.observe(row, [i for t, i in record.current if t == row])

    # ------------------------------------------------------------------ the policy itself

    def at_task_start(self, task: int, n_items: int, scorer: Scorer) -> None:
        """Called before training on ``task``."""

    def at_task_end(self, task: int, n_items: int, scorer: Scorer) -> None:
        """Called after training on ``task``."""

    def observe(self, task: int, indices: list[int], scores: list[float] | None = None, keys: list[str] | None = None) -> None:
        """Called after each optimizer step with the current-task examples it trained on (and,
        for policies that ask, their training-loss surprise and answer labels)."""

    def sample_replay(self, ctx, stage, step: int, count: int) -> list[Entry]:
        """``count`` entries drawn uniformly from the buffer (none on a step without replay)."""
        return self.sample(count) if count else []

    def sample(self, n: int) -> list[Entry]:
        return sample(self.buffer.entries, n, self.rng, self.config.replacement)

    def age(self, entries: list[Entry], scores: list[float]) -> None:
        """Give replayed entries their fresh surprise (only with ``aging``)."""

    def __len__(self) -> int:
        return len(self.buffer)

    def state_dict(self) -> tuple[dict, dict]:
        version, internal, gauss = self.rng.getstate()
        return {"buffer": self.buffer.state_dict(), "rng": [version, list(internal), gauss]}, {}

    def load_state_dict(self, meta: dict, tensors: dict | None = None) -> None:
        self.buffer.load_state_dict(meta["buffer"])
        version, internal, gauss = meta["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


class NoReplay(ReplayPolicy):
    name = "none"


class ReservoirPolicy(ReplayPolicy):
    name = "reservoir"
    online = True

    def __init__(self, cfg, capacity: int, seed: int):
        super().__init__(cfg, capacity, seed)
        self.buffer = ReservoirBuffer(capacity)
        self.offered: set[tuple[int, int]] | None = set()
        """The current task's examples offered so far: a later epoch offers none of them again,
        so the reservoir samples the task's distinct examples and never holds one twice. None
        for the rest of a task resumed from a checkpoint written before it was kept (every
        appearance offered, as that run did)."""

    def at_task_start(self, task: int, n_items: int, scorer: Scorer) -> None:
        self.offered = set()

    def at_task_end(self, task: int, n_items: int, scorer: Scorer) -> None:
        self.offered = set()  # a finished task's examples are never offered again: nothing to checkpoint

    def observe(self, task: int, indices: list[int], scores: list[float] | None = None, keys: list[str] | None = None) -> None:
        for i in indices:
            if self.offered is not None:
                if (task, i) in self.offered:
                    continue
                self.offered.add((task, i))
            self.buffer.offer(Entry(task, i), self.rng)

    def state_dict(self) -> tuple[dict, dict]:
        meta, tensors = super().state_dict()
        return {**meta, "offered": None if self.offered is None else sorted([t, i] for t, i in self.offered)}, tensors

    def load_state_dict(self, meta: dict, tensors: dict | None = None) -> None:
        super().load_state_dict(meta, tensors)
        offered = meta.get("offered")
        self.offered = None if offered is None else {(int(t), int(i)) for t, i in offered}


class QuotaPolicy(ReplayPolicy):
    """Shared timing logic of the task-aware policies: priorities at score time, entry at insert time."""

    Config = QuotaConfig
    per_task_quota = True

    def __init__(self, cfg, capacity: int, seed: int):
        super().__init__(cfg, capacity, seed)
        self.buffer = QuotaBuffer(capacity, balanced=self.config.balance == "label")
        self._pending: list[float] | None = None

    def before_task(self, ctx, stage: Stage) -> None:
        self.at_task_start(stage.row, len(ctx.train_sets[stage.row]), self.scorer(ctx), *self._labels(ctx, stage.row))

    def after_task(self, ctx, stage: Stage) -> None:
        self.at_task_end(stage.row, len(ctx.train_sets[stage.row]), self.scorer(ctx), *self._labels(ctx, stage.row))

    def _labels(self, ctx, task: int) -> tuple[list[str], ...]:
        """The answer label of each of the task's training examples, for a balanced buffer (an
        empty tuple otherwise, so a subclass's ``at_task_start(task, n_items, scorer)`` still fits)."""
        if self.buffer.balanced != (self.config.balance == "label"):
            raise SureclError(f"replay.balance={self.config.balance}: policy {self.name} replaced the balanced buffer; keep QuotaPolicy's")
        return ([e.label for e in ctx.train_sets[task]],) if self.buffer.balanced else ()

    def priorities(self, task: int, n_items: int, scorer: Scorer) -> list[float]:
        """The priority of each of the task's ``n_items`` training examples, in order: finite
        numbers (the buffer keeps each task's highest). Not asked for when the buffer's capacity
        is 0: it keeps nothing, and scoring a task is a forward pass over its training set."""
        raise NotImplementedError

    def checked_priorities(self, task: int, n_items: int, scorer: Scorer) -> list[float]:
        """:meth:`priorities` as floats, checked: one finite number per item, else a one-line
        error naming the policy (a NaN would sort anywhere in the buffer and then stop the
        checkpoint; a short list would leave examples out unseen)."""
        raw = self.priorities(task, n_items, scorer)
        expected = f"expected a list of {n_items} finite numbers, one per training example of task {task}, in order"
        where = f"replay policy {self.name!r}: priorities(task={task}, n_items={n_items})"
        try:
            if isinstance(raw, (str, bytes, dict)):
                raise TypeError
            values = [_number(v) for v in raw]
        except (TypeError, ValueError, RuntimeError):  # not iterable, or an item that is not one number
            shown = repr(raw)
            raise SureclError(f"{where} returned a {type(raw).__name__} ({shown if len(shown) <= 60 else shown[:57] + '...'}); {expected}") from None
        if len(values) != n_items:
            raise SureclError(f"{where} returned {len(values)} values; {expected}")
        bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
        if bad:
            raise SureclError(f"{where} returned {values[bad[0]]} for example {bad[0]}"
                              f"{f' (and {len(bad) - 1} more non-finite)' if len(bad) > 1 else ''}; {expected}")
        return values

    def _at(self, when: str, task: int, n_items: int, scorer: Scorer, labels: list[str] | None) -> None:
        if self.config.score_time == when:
            # a buffer of 0 keeps no entry: its task still enters (as one that keeps none), unscored
            self._pending = self.checked_priorities(task, n_items, scorer) if self.buffer.capacity > 0 else [0.0] * n_items
        if self.config.insert_time == when:
            assert self._pending is not None, "scores must exist before insertion"
            self.buffer.add_task(task, self._pending, labels)
            self._pending = None

    def at_task_start(self, task: int, n_items: int, scorer: Scorer, labels: list[str] | None = None) -> None:
        """``labels``: each example's answer label (read by a balanced buffer only)."""
        self._at("before", task, n_items, scorer, labels)

    def at_task_end(self, task: int, n_items: int, scorer: Scorer, labels: list[str] | None = None) -> None:
        self._at("after", task, n_items, scorer, labels)

    def state_dict(self) -> tuple[dict, dict]:
        meta, tensors = super().state_dict()
        return {**meta, "pending": self._pending}, tensors

    def load_state_dict(self, meta: dict, tensors: dict | None = None) -> None:
        super().load_state_dict(meta, tensors)
        self._pending = meta.get("pending")


class RandomPolicy(QuotaPolicy):
    name = "random"

    def priorities(self, task: int, n_items: int, scorer: Scorer) -> list[float]:
        return [self.rng.random() for _ in range(n_items)]


def buffer_capacity(cfg: ReplayConfig, total_train: int) -> int:
    """S as a count: a fraction of all training examples of the stream (< 1) or absolute."""
    if cfg.policy == "none":
        return 0
    fraction = getattr(cfg, "buffer_fraction", 0.0)
    # replay.buffer_fraction: a fraction in (0, 1]; 1 = a capacity of every training example, of
    # which a per-task quota policy keeps floor(S/d) per task (stream_quota_warning says how many)
    if fraction > 0:
        return int(round(fraction * total_train, 9))
    if cfg.buffer_size < 1:
        # round first: 0.29 * 100 is 28.999999999999996 in binary floating point
        return int(round(cfg.buffer_size * total_train, 9))
    return int(cfg.buffer_size)


def quota_warning(policy: type, capacity: int, n_tasks: int, n_labels: int = 0) -> str | None:
    """Why a buffer will hold less than a user expects, or None.

    The equal per-task quota is floor(S/d) after d tasks: once d > S it is 0 and every task's
    share is dropped, so the buffer empties and replay stops without an error. A per-label
    quota (``online_surprise``) is floor(S/k) over the k answer labels seen (``n_labels`` in the
    stream): once k > S the same happens."""
    if policy.per_label_quota and capacity > 0 and capacity < n_labels:
        return (
            f"replay.buffer_size gives S={capacity} entries for the stream's {n_labels} answer labels: {policy.name}'s quota per "
            f"label floor(S/k) is 0 once more than {capacity} labels are seen, and the buffer then empties "
            f"(raise replay.buffer_size to at least {n_labels})"
        )
    if not policy.per_task_quota:
        if policy is not NoReplay and capacity == 0:
            return "replay.buffer_size gives a buffer of 0 entries: nothing will be replayed"
        return None
    if capacity == 0:
        return "replay.buffer_size gives a buffer of 0 entries: nothing will be replayed"
    if capacity < n_tasks:
        return (
            f"replay.buffer_size gives S={capacity} entries for {n_tasks} tasks: the per-task quota floor(S/d) is 0 "
            f"from task {capacity + 1} on, and the buffer then empties (raise replay.buffer_size to at least {n_tasks})"
        )
    return None


def stream_quota_warning(policy: type, capacity: int, tasks) -> str | None:
    """:func:`quota_warning` for a stream of tasks (the run's and the dry run's): its answer
    labels are counted only for a policy with a per-label quota. Else, for a per-task quota,
    where the buffer ends holding fewer than S by the stream's task sizes (:func:`quota_shortfall`)."""
    labels = {ex.label for t in tasks for ex in t.train} if policy.per_label_quota else ()
    warning = quota_warning(policy, capacity, len(tasks), len(labels))
    if warning is None and policy.per_task_quota:
        warning = quota_shortfall(policy, capacity, [(t.name, len(t.train)) for t in tasks])
    return warning


def quota_shortfall(policy: type, capacity: int, sizes: list[tuple[str, int]]) -> str | None:
    """Why a per-task quota buffer of S entries ends holding fewer, after the tasks ``sizes``
    ((name, training examples) in stream order), or None: it keeps floor(S/d) of each of the d
    tasks (the paper's rule), so the remainder S - d floor(S/d) is never used, and a task with
    fewer examples than its quota leaves the rest of its share empty (``replay.buffer_fraction=1``
    with tasks of unequal sizes keeps well below every example)."""
    held = quota_held(capacity, [n for _, n in sizes])
    if not sizes or held >= capacity:
        return None
    d, m = len(sizes), quota(capacity, len(sizes))
    why = []
    if capacity - d * m:
        why.append(f"the remainder {capacity} - {d} x {m} = {capacity - d * m} is never used")
    short = [(name, n) for name, n in sizes if n < m]
    if short:
        named = ", ".join(f"{name} {n}" for name, n in short[:4]) + (" ..." if len(short) > 4 else "")
        why.append(f"{len(short)} task(s) have fewer training examples than {m} ({named}) and leave {sum(m - n for _, n in short)} "
                   "of their shares empty")
    return (f"the buffer ends holding {held} of its S={capacity} entries: {policy.name} keeps floor(S/d) = floor({capacity}/{d}) = "
            f"{m} per task (the paper's rule, whatever the tasks' sizes), so " + " and ".join(why))
