"""SuRe: surprise-prioritised replay, as two replay policies with one config.

* ``surprise`` (:class:`SurprisePolicy`) - task-aware, equal quota m = floor(S/d); a task's
  share is its top-m training examples by surprise (mean token NLL under the current fast
  adapter), scored ``before`` or ``after`` training on the task and inserted ``before`` or
  ``after`` (SB-UB, SB-UA, SA-UA). With ``aging`` every replayed entry's score is replaced by
  its surprise at the step that replays it.
* ``online_surprise`` (:class:`OnlineSurprisePolicy`) - online and boundary-free: no task
  identity and no extra forward pass. Every trained example is offered with its surprise taken
  from the training step's own loss (its answer-token NLL before the update); the buffer keeps
  an equal quota per answer label seen so far (labels are known online; a text stream has one
  partition) and the most surprising examples inside each. ``aging`` re-scores replayed
  entries from the replay loss.

Both read their options from :class:`SureConfig`, a view of the ``replay`` section
(``replay.score_time``, ``insert_time``, ``reduction``, ``scope``, ``aging``, ``buffer_size``):
the user-facing keys are the config's, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from surecl.plugins.base import StepRecord
from surecl.replay.buffer import Entry, OnlineQuotaBuffer
from surecl.replay.policies import QuotaConfig, QuotaPolicy, ReplayPolicy, Scorer, check_scores


@dataclass
class SureConfig(QuotaConfig):
    """SuRe's options (a view of ``replay.*``). ``buffer_size`` is S, whose equal share
    floor(S/d) each of the d tasks (``surprise``) or answer labels (``online_surprise``) seen
    so far keeps; ``score_time`` / ``insert_time`` the timing variant (``surprise`` only)."""

    reduction: str = "mean"
    """Token reduction of the NLL: ``mean`` (paper) or ``sum``."""
    scope: str = "sequence"
    """Tokens scored: ``sequence`` (prompt + answer) or ``label`` (answer only)."""
    aging: bool = False
    """Re-score replayed entries with their surprise at the step that replays them."""


class _Sure(ReplayPolicy):
    Config = SureConfig
    uses_scores = True

    def scorer(self, ctx) -> Scorer:
        return lambda task: ctx.surprise_of_task(task, scope=self.config.scope, reduction=self.config.reduction)

    def after_step(self, ctx, record: StepRecord) -> None:
        if record.replayed and self.config.aging:
            self.age(record.replayed, self.rescore(ctx, record))
        self.observe_step(ctx, record)

    def observe_step(self, ctx, record: StepRecord) -> None:
        super().after_step(ctx, record)

    def rescore(self, ctx, record: StepRecord) -> list[float]:
        """Fresh surprise of the step's replayed entries on the scale the buffer ranks by.

        The step's forward already holds their answer-token NLL: with labels scored by a mean
        on one process (for ``online_surprise``, whose fresh entries are step losses, by a mean
        or a sum) that is taken as the new score (the surprise met on replay, before the
        step's update and with the training dropout on, so an aged entry's score is not quite
        on its fresh neighbours' eval-mode scale). Otherwise (whole sequence, sum, or several
        processes) they are re-scored with the scorer itself, after the update, in eval mode:
        so one and several processes age the buffer slightly differently (the ``surprise_aging``
        preset scores whole sequences: the scoring pass)."""
        replayed = record.replayed
        # online_surprise's fresh entries are step losses (mean or sum), so its aged ones are too
        if ctx.world == 1 and self.config.scope == "label" and (self.config.reduction == "mean" or self.online):
            offset = len(record.current)
            values = record.nll / record.tokens.clamp(min=1) if self.config.reduction == "mean" else record.nll
            scores = values[offset:].tolist()
        else:
            scores = ctx.score([ctx.train_sets[e.task][e.index] for e in replayed], scope=self.config.scope, reduction=self.config.reduction)
        for e, s in zip(replayed, scores):
            check_scores([s], ctx.tasks[e.task].name, [e.index], "re-scored on replay")
        return scores


class SurprisePolicy(_Sure, QuotaPolicy):
    name = "surprise"

    def priorities(self, task: int, n_items: int, scorer: Scorer) -> list[float]:
        return scorer(task)

    def age(self, entries: list[Entry], scores: list[float]) -> None:
        if self.config.aging:
            for e, s in zip(entries, scores):
                e.score = float(s)


class OnlineSurprisePolicy(_Sure):
    name = "online_surprise"
    needs_step_scores = True
    online = True
    per_label_quota = True

    def __init__(self, cfg, capacity: int, seed: int):
        super().__init__(cfg, capacity, seed)
        self.buffer = OnlineQuotaBuffer(capacity)

    def observe_step(self, ctx, record: StepRecord) -> None:
        """Offer the current-task examples with their training-loss surprise and label."""
        scores = self.step_scores(ctx, record)
        row, current = record.stage.row, record.current
        mine = [k for k, (t, _) in enumerate(current) if t == row]
        self.observe(row, [current[k][1] for k in mine], [scores[k] for k in mine], [ctx.train_sets[row][current[k][1]].label for k in mine])

    def step_scores(self, ctx, record: StepRecord) -> list[float]:
        """Training-loss surprise of the step's current batch, in order: their answer-token
        NLL from the step's forward (mean or sum per ``replay.reduction``). With several
        processes each holds every W-th item; the pieces are gathered."""
        n = len(record.current)
        values = record.nll / record.tokens.clamp(min=1) if self.config.reduction == "mean" else record.nll
        values = values.detach().float().cpu().tolist()
        if ctx.world == 1:
            return values[:n]
        from accelerate.utils import gather_object

        local = list(zip(record.rows, values))
        out = [0.0] * n
        for part in gather_object([local]):
            for pos, v in part:
                if pos < n:
                    out[pos] = v
        return out

    def observe(self, task: int, indices: list[int], scores: list[float] | None = None, keys: list[str] | None = None) -> None:
        assert scores is not None and keys is not None, "online_surprise needs the step's per-example losses"
        for i, s, k in zip(indices, scores, keys):
            self.buffer.offer(k, Entry(task, i, float(s)))

    def age(self, entries: list[Entry], scores: list[float]) -> None:
        if self.config.aging:
            for e, s in zip(entries, scores):
                self.buffer.rescore((e.task, e.index), s)
