"""Replay selection policies, one class each, behind one registry.

A policy decides which training examples enter the buffer and when:

* ``reservoir`` - online and task-agnostic: every current-task example is offered to a
  reservoir as it is trained on (Random-O in the paper's ablations).
* ``random``    - task-aware, equal quota; a task's share is a uniform random subset
  (Random-B / Random-A depending on ``insert_time``).
* ``surprise``  - task-aware, equal quota; a task's share is its top-m by surprise (SuRe),
  scored ``before`` or ``after`` training on the task and inserted ``before`` or ``after``.
  With ``aging`` every replayed entry's score is replaced by its loss on the replay step.
* ``online_surprise`` - online and boundary-free SuRe: no task identity and no extra forward
  pass. Every trained example is offered with its surprise taken from the training step's own
  loss (its answer-token NLL before the update); the buffer keeps an equal quota per answer
  label seen so far (labels are known online; a text stream has one partition) and the most
  surprising examples inside each. ``aging`` re-scores replayed entries from the replay loss.

Hooks (called by the trainer): ``before_task``, ``observe`` (after each step, with the current
batch), ``after_task``; ``sample`` draws a replay batch.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from surecl.config import ReplayConfig
from surecl.replay.buffer import Entry, OnlineQuotaBuffer, QuotaBuffer, ReservoirBuffer, sample

Scorer = Callable[[int], list[float]]
"""Surprise of every training example of task ``t`` under the current fast model."""


class ReplayPolicy:
    name = "none"
    uses_scores = False

    def __init__(self, cfg: ReplayConfig, capacity: int, seed: int):
        self.cfg = cfg
        self.capacity = capacity
        self.rng = random.Random(f"replay:{seed}")
        self.buffer: QuotaBuffer | ReservoirBuffer | OnlineQuotaBuffer = QuotaBuffer(capacity)

    def before_task(self, task: int, n_items: int, scorer: Scorer) -> None:
        """Called before training on ``task``."""

    def after_task(self, task: int, n_items: int, scorer: Scorer) -> None:
        """Called after training on ``task``."""

    needs_step_scores = False
    """True if ``observe`` wants each example's loss and label from the step."""

    def observe(self, task: int, indices: list[int], scores: list[float] | None = None, keys: list[str] | None = None) -> None:
        """Called after each optimizer step with the current-task examples it trained on (and,
        for policies that ask, their training-loss surprise and answer labels)."""

    def sample(self, n: int) -> list[Entry]:
        return sample(self.buffer.entries, n, self.rng)

    def age(self, entries: list[Entry], scores: list[float]) -> None:
        """Give replayed entries their fresh surprise (only with ``aging``)."""

    def __len__(self) -> int:
        return len(self.buffer)

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {"buffer": self.buffer.state_dict(), "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state["buffer"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


class NoReplay(ReplayPolicy):
    name = "none"


class ReservoirPolicy(ReplayPolicy):
    name = "reservoir"

    def __init__(self, cfg: ReplayConfig, capacity: int, seed: int):
        super().__init__(cfg, capacity, seed)
        self.buffer = ReservoirBuffer(capacity)

    def observe(self, task: int, indices: list[int], scores: list[float] | None = None, keys: list[str] | None = None) -> None:
        for i in indices:
            self.buffer.offer(Entry(task, i), self.rng)


class QuotaPolicy(ReplayPolicy):
    """Shared timing logic of the task-aware policies: priorities at score time, entry at insert time."""

    def __init__(self, cfg: ReplayConfig, capacity: int, seed: int):
        super().__init__(cfg, capacity, seed)
        self._pending: list[float] | None = None

    def priorities(self, task: int, n_items: int, scorer: Scorer) -> list[float]:
        raise NotImplementedError

    def _at(self, when: str, task: int, n_items: int, scorer: Scorer) -> None:
        if self.cfg.score_time == when:
            self._pending = self.priorities(task, n_items, scorer)
        if self.cfg.insert_time == when:
            assert self._pending is not None, "scores must exist before insertion"
            self.buffer.add_task(task, self._pending)
            self._pending = None

    def before_task(self, task: int, n_items: int, scorer: Scorer) -> None:
        self._at("before", task, n_items, scorer)

    def after_task(self, task: int, n_items: int, scorer: Scorer) -> None:
        self._at("after", task, n_items, scorer)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "pending": self._pending}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._pending = state.get("pending")


class RandomPolicy(QuotaPolicy):
    name = "random"

    def priorities(self, task: int, n_items: int, scorer: Scorer) -> list[float]:
        return [self.rng.random() for _ in range(n_items)]


class SurprisePolicy(QuotaPolicy):
    name = "surprise"
    uses_scores = True

    def priorities(self, task: int, n_items: int, scorer: Scorer) -> list[float]:
        return scorer(task)

    def age(self, entries: list[Entry], scores: list[float]) -> None:
        if self.cfg.aging:
            for e, s in zip(entries, scores):
                e.score = float(s)


class OnlineSurprisePolicy(ReplayPolicy):
    name = "online_surprise"
    uses_scores = True
    needs_step_scores = True

    def __init__(self, cfg: ReplayConfig, capacity: int, seed: int):
        super().__init__(cfg, capacity, seed)
        self.buffer = OnlineQuotaBuffer(capacity)

    def observe(self, task: int, indices: list[int], scores: list[float] | None = None, keys: list[str] | None = None) -> None:
        assert scores is not None and keys is not None, "online_surprise needs the step's per-example losses"
        for i, s, k in zip(indices, scores, keys):
            self.buffer.offer(k, Entry(task, i, float(s)))

    def age(self, entries: list[Entry], scores: list[float]) -> None:
        if self.cfg.aging:
            for e, s in zip(entries, scores):
                self.buffer.rescore((e.task, e.index), s)


POLICIES: dict[str, type[ReplayPolicy]] = {
    p.name: p for p in (NoReplay, ReservoirPolicy, RandomPolicy, SurprisePolicy, OnlineSurprisePolicy)
}


def buffer_capacity(cfg: ReplayConfig, total_train: int) -> int:
    """S as a count: a fraction of all training examples of the stream (< 1) or absolute."""
    if cfg.policy == "none":
        return 0
    if cfg.buffer_size < 1:
        # round first: 0.29 * 100 is 28.999999999999996 in binary floating point
        return int(round(cfg.buffer_size * total_train, 9))
    return int(cfg.buffer_size)


def quota_warning(policy: str, capacity: int, n_tasks: int) -> str | None:
    """Why a task-aware buffer will hold less than a user expects, or None.

    The equal per-task quota is floor(S/d) after d tasks: once d > S it is 0 and every task's
    share is dropped, so the buffer empties and replay stops without an error."""
    if policy not in ("random", "surprise"):
        if policy != "none" and capacity == 0:
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
