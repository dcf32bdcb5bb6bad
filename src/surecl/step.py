"""The training step: one optimizer step on a mixed batch, as its own unit.

:class:`TrainStep` owns the AdamW optimizer of what the method trains (the fast adapter by
default, the base weights for full fine-tuning, the prompts for prompt tuning, each param
group at its own learning rate) and the learning-rate schedule, and is the
run's ``optimizer`` plugin (``before_task`` clears the AdamW state with
``train.fresh_optimizer``; its state is the optimizer's). Calling it takes one step:

1. the batch = the current examples, then the replayed entries; with W processes each takes
   every W-th item, and the loss is the token mean over the *whole* mixed batch, scaled by W so
   DDP's gradient average equals the one-process gradient;
2. forward and backward over micro-batch slices of at most ``train.micro_batch_tokens`` padded
   tokens (gradient accumulation: only one slice's activations are alive). With a shared
   prefix the slices are cut task by task and each runs its task's prompt prefix once;
   the plugins' ``loss`` hooks act on the first slice's share (a penalty enters once);
3. gradient clip, AdamW step;
4. a :class:`~surecl.plugins.base.StepRecord` of what it did, per-item NLL put back in the
   items' order.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from surecl.data.encode import micro_batch_positions
from surecl.errors import SureclError, start_over
from surecl.nll import token_nll
from surecl.plugins.base import Plugin, Stage, StepRecord
from surecl.replay.buffer import Entry


@dataclass
class StepConfig:
    """The step's options, a view of ``train.*``."""

    lr: float = 2e-3
    weight_decay: float = 0.0
    scheduler: str = "constant"
    warmup_steps: int = 0
    fresh_optimizer: bool = False
    grad_clip: float = 1.0
    micro_batch_tokens: int = 1024
    replay_loss: str = "joint"
    """``replay.loss``: ``joint`` (token mean over the mixed batch) or ``pair`` (:func:`pair_weights`)."""


WEIGHTS = "weights"
"""The key prefix of the trained tensors in :class:`TrainStep`'s checkpointed state."""


class TrainStep(Plugin):
    name = "optimizer"
    Config = StepConfig

    @classmethod
    def config_from(cls, cfg) -> StepConfig:
        fields = [f for f in StepConfig.__dataclass_fields__ if f != "replay_loss"]
        return StepConfig(**{f: getattr(cfg.train, f) for f in fields}, replay_loss=cfg.replay.loss)

    def __init__(self, config: StepConfig, params: list) -> None:
        super().__init__(config)
        self.optimizer: torch.optim.Optimizer = torch.optim.AdamW(list(params), lr=config.lr, weight_decay=config.weight_decay)
        self.params: list[torch.nn.Parameter] = [p for group in self.optimizer.param_groups for p in group["params"]]
        """The parameters it trains (the method's :meth:`~surecl.methods.Method.parameters`:
        tensors, or param groups whose own ``lr`` replaces ``train.lr``)."""
        self.base_lrs = [group["lr"] for group in self.optimizer.param_groups]
        """Each param group's learning rate before the schedule (``train.lr`` unless the group set its own)."""
        self.keep_weights = False
        """Checkpoint the trained tensors themselves (``weights/<i>``, in :attr:`params`' order)
        beside the optimizer's moments: set by the run for a method that trains the base's weights
        or modules of its own (``trains`` not ``"fast"``, whose adapter the learner checkpoints), so
        a resumed run continues from them whatever the method's own ``state_dict`` holds."""
        self._schedules: dict = {}

    # ------------------------------------------------------------------ schedule

    def lr_at(self, step: int, total: int, base: float | None = None) -> float:
        """The learning rate of ``step`` (0-based) in a stage of ``total`` steps: transformers'
        schedule ``train.scheduler`` with ``train.warmup_steps``, restarted every stage, times
        ``base`` (default ``train.lr``; a param group's own lr). A pure function of the step,
        so a run resumed inside a stage continues on the same curve."""
        return (self.config.lr if base is None else base) * self._schedule(total)(step)

    def _schedule(self, total: int):
        """The multiplier ``get_scheduler`` builds for a stage of ``total`` steps (cached per length)."""
        if total not in self._schedules:
            from transformers import get_scheduler

            name, warm = self.config.scheduler, self.config.warmup_steps
            if name == "constant" and warm:  # warmup_steps always meant warming up: keep that
                name = "constant_with_warmup"
            probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)  # the schedule needs an optimizer to wrap
            self._schedules[total] = get_scheduler(name, probe, num_warmup_steps=warm, num_training_steps=max(1, total)).lr_lambdas[0]
        return self._schedules[total]

    # ------------------------------------------------------------------ plugin hooks

    def reset(self) -> None:
        """Fresh AdamW state (moment estimates and step counts)."""
        self.optimizer.state.clear()

    def before_task(self, ctx, stage: Stage) -> None:
        if self.config.fresh_optimizer:
            self.reset()

    def state_dict(self) -> tuple[dict, dict[str, torch.Tensor]]:
        sd = self.optimizer.state_dict()
        tensors = {}
        for idx, slots in sd["state"].items():
            for key, value in slots.items():
                tensors[f"{idx}/{key}"] = (value if torch.is_tensor(value) else torch.tensor(value)).cpu()
        if self.keep_weights:  # the live tensors, not copies: the checkpoint writes them out before training goes on
            tensors.update({f"{WEIGHTS}/{i}": p.detach() for i, p in enumerate(self.params)})
        groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in sd["param_groups"]]  # betas: as JSON reads it back
        return {"param_groups": groups}, tensors

    @torch.no_grad()
    def load_state_dict(self, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
        state: dict[int, dict[str, torch.Tensor]] = {}
        weights = {}
        for key, value in tensors.items():
            idx, slot = key.split("/", 1)
            if idx == WEIGHTS:
                weights[int(slot)] = value
            else:
                state.setdefault(int(idx), {})[slot] = value
        if weights:  # (a checkpoint from before they were kept has none: the method's own state restores them, or nothing did)
            if sorted(weights) != list(range(len(self.params))) or any(weights[i].shape != p.shape for i, p in enumerate(self.params)):
                raise SureclError(f"checkpoint: its {len(weights)} trained tensors do not fit this run's {len(self.params)} "
                                  f"(another method or model); use another --out, or {start_over()}")
            for i, p in enumerate(self.params):
                p.copy_(weights[i])
        self.optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})

    # ------------------------------------------------------------------ the step

    def __call__(self, ctx, stage: Stage, step: int, total: int, current: list[tuple[int, int]], replayed: list[Entry]) -> StepRecord:
        """One optimizer step on ``current`` + ``replayed`` (step ``step`` of ``total`` in ``stage``)."""
        accelerator, world, rank = ctx.accelerator, ctx.world, ctx.rank
        items = [ctx.train_sets[t][i] for t, i in current] + [ctx.train_sets[e.task][e.index] for e in replayed]
        ctx.step_items = list(current) + [(e.task, e.index) for e in replayed]  # what the loss hooks may read
        ctx.step_new = len(current)
        n_tokens = sum(e.scored for e in items)
        local = items[rank::world] if world > 1 else items
        weight = float(world) if local else 0.0
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = self.lr_at(step, total, base)
        rows = local or items[:1]  # a rank without items runs one at weight 0 (DDP needs every rank's backward)
        step_items = ctx.step_items[rank::world] if local else ctx.step_items[:1]
        tasks = None
        if ctx.share_prefix:
            tasks = [t for t, _ in current] + [e.task for e in replayed]
            tasks = tasks[rank::world] if local else tasks[:1]
        slices = micro_batch_positions(rows, self.config.micro_batch_tokens, tasks)
        coef = None
        # "example": the reference's per-example weighting on every step; "pair": on steps that
        # replay only (a step without replay keeps the joint token mean)
        if self.config.replay_loss == "example" or (self.config.replay_loss == "pair" and replayed):
            coef = pair_weights(len(current), [e.scored for e in items])
            coef = coef[rank::world] if local else coef[:1]
        parts, loss_total, bad_loss = [], 0.0, None
        for k, positions in enumerate(slices):
            sync = accelerator.no_sync(ctx.model) if k < len(slices) - 1 else contextlib.nullcontext()
            with sync:
                nll_k, count_k = token_nll(ctx.model, ctx.batch([rows[i] for i in positions], shared=True), scope="label", is_seq2seq=ctx.is_seq2seq)
                if coef is None:
                    loss = weight * nll_k.sum() / n_tokens
                else:
                    loss = weight * (nll_k * torch.tensor([coef[i] for i in positions], dtype=nll_k.dtype, device=nll_k.device)).sum()
                if k == 0:
                    loss = ctx.plugins.loss(ctx, loss)  # a penalty enters once per step
                if not torch.isfinite(loss) and bad_loss is None:
                    bad_loss = (f"non-finite loss ({loss.item()}) at task {ctx.stage_name(stage)} step {step} "
                                f"({nonfinite_where(self.params, nll_k, [rows[i] for i in positions], [step_items[i] for i in positions])}"
                                f"{f', on process {rank}' if world > 1 else ''})")
                    if world == 1:  # with several processes every one runs its backward first (DDP's collectives), then all stop
                        self.optimizer.zero_grad(set_to_none=True)
                        raise SureclError(f"{bad_loss}; {nonfinite_rerun()}")
                accelerator.backward(loss)
            loss_total = loss_total + loss.detach()
            parts.append((nll_k.detach(), count_k.detach()))
        back = torch.tensor([i for positions in slices for i in positions]).argsort()
        nll, count = torch.cat([p[0] for p in parts])[back], torch.cat([p[1] for p in parts])[back]
        grads = [p.grad for p in self.params if p.grad is not None]
        grad_bad = bool(grads) and not bool(torch.isfinite(torch.nn.utils.get_total_norm(grads)))
        if world > 1:  # one collective decides for every process: the summed loss and whether any gradient is non-finite
            flags = accelerator.reduce(torch.stack([torch.as_tensor(loss_total, device=nll.device, dtype=torch.float32).reshape(()),
                                                    torch.tensor(float(grad_bad), device=nll.device)]), "sum")
            shown, grad_bad = flags[0] / world, bool(flags[1] > 0)
        else:
            shown = torch.as_tensor(loss_total)
        if not bool(torch.isfinite(shown)):
            self.optimizer.zero_grad(set_to_none=True)
            raise SureclError(f"{bad_loss or f'non-finite loss at task {ctx.stage_name(stage)} step {step} on another process'}; {nonfinite_rerun()}")
        if grad_bad:
            # a finite loss whose gradient is not: stop before the update spreads it into every
            # weight (clipping by a NaN norm would), so the weights and the checkpoint stay finite
            where = f"{nonfinite_grads(ctx.model, self.params)}; rows{f' on process {rank}' if world > 1 else ''}: {row_summary(rows, step_items)}"
            self.optimizer.zero_grad(set_to_none=True)
            raise SureclError(
                f"non-finite gradient at task {ctx.stage_name(stage)} step {step} from a finite loss ({shown.item():.6g}) ({where}); "
                f"the weights were not updated. A numerical fault of the backward pass (bf16 kernels on an accelerator, say): "
                f"{nonfinite_rerun()}; model.attn_implementation=eager or model.dtype=fp32 in a fresh run tell the kernels from the precision"
            )
        if self.config.grad_clip:
            accelerator.clip_grad_norm_(self.params, self.config.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepRecord(
            stage=stage, step=step, global_step=ctx.state.global_step + 1, current=current, replayed=replayed,
            rows=list(range(len(items)))[rank::world] if local else [], nll=nll, tokens=count,
            loss=shown.item(), lr=self.optimizer.param_groups[0]["lr"],
        )


def nonfinite_rerun() -> str:
    """What a non-finite loss or gradient's error line says to do (a changed config cannot resume)."""
    return ("the last checkpoint is intact: rerun the same command to resume from it (an accelerator's kernels are not "
            f"bit-deterministic), or start over ({start_over('--fresh')}, or another --out) with a lower train.lr or the data fixed")


def nonfinite_where(params: list[torch.Tensor], nll: torch.Tensor, rows: list, items: list[tuple[int, int]]) -> str:
    """Where a non-finite loss came from, for its error line: whether the trained weights
    were already non-finite (an earlier update diverged) or the forward made it from finite
    weights, and which rows (task index, example index, prompt + answer tokens) gave a
    non-finite NLL."""
    weights = "finite" if all(bool(torch.isfinite(p).all()) for p in params) else "non-finite"
    bad = [k for k, v in enumerate(nll.detach().float().cpu().tolist()) if not math.isfinite(v)]
    shown = ", ".join(f"task {items[k][0]} row {items[k][1]} ({len(rows[k])} tokens)" for k in bad[:4])
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    lengths = sorted(len(r) for r in rows)
    return (f"trained weights {weights} before the step; {len(bad)} of {len(rows)} rows non-finite"
            f"{': ' + shown + more if bad else ' (the loss hooks or the weighting made it)'}; row lengths {lengths[0]}-{lengths[-1]} tokens")


def nonfinite_grads(model, params: list[torch.Tensor]) -> str:
    """Which trained tensors got a non-finite gradient (named as the model names them; up to
    four, then a count) and how many of them there are."""
    names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
    bad = [names.get(id(p), f"tensor {i} {tuple(p.shape)}") for i, p in enumerate(params)
           if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    return f"{len(bad)} of {len(params)} trained tensors: {', '.join(bad[:4])}{more}"


def row_summary(rows: list, items: list[tuple[int, int]]) -> str:
    """The step's rows on this process, per task index: how many and their token lengths."""
    per: dict[int, list[int]] = {}
    for (task, _), row in zip(items, rows):
        per.setdefault(task, []).append(len(row))
    return ", ".join(f"task {t}: {len(v)} of {min(v)}-{max(v)} tokens" for t, v in sorted(per.items()))


def pair_weights(n_new: int, tokens: list[int]) -> list[float]:
    """Per-row weights on the summed answer NLL of a step's rows (the ``n_new`` new examples,
    then the replayed ones, with ``tokens`` answer tokens each) for ``replay.loss=pair``, the
    paper's reference weighting: each row's loss is its token mean; replayed row j is paired
    with new row j mod n_new; a group (a new row and the replayed rows paired with it) has
    the mean of its rows' losses; the step's loss is the mean of the n_new groups' losses.
    With one replayed row per paired new row this is the reference's
    ``(outputs.loss + replay_outputs.loss) / 2`` per micro-batch of one, averaged over the
    step's accumulated micro-batches."""
    n_rep = len(tokens) - n_new
    group = [1] * n_new
    for j in range(n_rep):
        group[j % n_new] += 1
    sizes = group + [group[j % n_new] for j in range(n_rep)]
    return [1.0 / (n_new * g * max(1, t)) for g, t in zip(sizes, tokens)]
