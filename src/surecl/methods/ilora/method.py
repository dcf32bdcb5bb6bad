"""I-LoRA on surecl's dual learner: the fast adapter is I-LoRA's plastic LoRA, the slow (EMA)
adapter its stable LoRA, the replay policy its memory; this method adds the consistency loss.
Two readings: EasyCL's (the ``ilora`` preset, described here) and the authors' own code
(``which47/LLMCL`` ``method/ILORA.py``; the ``ilora_llmcl`` preset: the replayed rows only,
every hidden state, pulled toward the element-wise maximum of both sides, ``ilora.rows``,
``ilora.layers``, ``ilora.target``).

At each optimizer step (in the ``loss`` hook, once per step) the step's rows, new and replayed
(``ctx.step_items``), are run twice more: with the fast adapter (with gradients) and with the
slow one (without), both returning their hidden states; the mean squared error between the two
at each of ``ilora.layers``, averaged over the layers and weighted by
``ilora.consistency_weight``, joins the loss. As in EasyCL's ``ILORA.compute_consistency_loss``
(``src/easycl/cl/ilora/ilora.py``), every position counts, padding included, and the stable side
is the EMA adapter the dual learner updates after every optimizer step. The rows run in slices
of at most ``train.micro_batch_tokens`` padded tokens, as the step's own loss does
(:meth:`ILoRA.consistency`), so its forwards hold one slice's activations at a time, not the step's;
under several processes each runs its share of the rows, padded as all of them are in one process.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import surecl.nll as nll
from surecl.adapters import FAST, SLOW
from surecl.errors import SureclError
from surecl.methods.base import Method
from surecl.methods.ilora.config import ILoRAConfig


class ILoRA(Method):
    name = "ilora"
    Config = ILoRAConfig
    fast_is_solo = False  # the consistency term reads the slow adapter at every step
    fast_role = "the fast (plastic) adapter, trained with the slow one's consistency term (not the method without the slow learner)"

    @classmethod
    def validate_config(cls, cfg) -> None:
        if not cfg.dual.enabled:
            raise SureclError("dual.enabled: method ilora needs the dual learner (its stable LoRA is the slow EMA adapter); use --config ilora or set dual.enabled=true")
        if getattr(getattr(cfg, "ilora", None), "rows", None) == "replayed" and cfg.replay.policy == "none":
            # the term would never run: the run would be the plain dual learner under I-LoRA's name
            raise SureclError("ilora.rows: 'replayed' computes the consistency term on replayed rows only, and replay.policy=none "
                              "replays none, so the term would never run; set a replay policy (ilora_llmcl's: replay.policy=reservoir) "
                              "or ilora.rows=all (ilora.consistency_weight=0 turns the term off on purpose)")

    def __init__(self, config: ILoRAConfig | None = None) -> None:
        super().__init__(config)
        self.last = 0.0
        """The consistency term of the last step (unweighted), for logs and tests."""

    def setup(self, ctx) -> None:
        """Refuse ``ilora.layers`` naming a hidden state the model does not have before anything
        trains: the loss hook meets it only at the first step with rows for the term (after the
        tasks before it trained and were checkpointed, which a corrected config cannot resume),
        and under several processes on one of them while the others wait in the gradient
        all-reduce."""
        self.check_model(getattr(ctx.model, "config", None), ctx.is_seq2seq)

    def check_model(self, config, seq2seq: bool) -> None:
        """``ilora.layers`` against the hidden states the model's config counts (the dry run's
        check, and :meth:`setup`'s)."""
        n = hidden_states(config, seq2seq)
        if n is not None:
            self.picks(n, seq2seq)

    def picks(self, n: int, seq2seq: bool = False) -> list[int]:
        """The positions among a model's ``n`` hidden states that ``ilora.layers`` names (one
        line if one is not there)."""
        chosen = self.config.indices()
        if chosen is None:
            return list(range(n))
        bad = [k for k in chosen if not -n <= k < n]
        if bad:
            whose = "this model's decoder" if seq2seq else "this model"
            raise SureclError(f"ilora.layers: {self.config.layers} asks for hidden state {', '.join(map(str, bad))}, but {whose} has {n} "
                              f"(the embeddings', then {n - 1} layers' outputs): indices 0 to {n - 1}, or -{n} to -1")
        return [k % n for k in chosen]

    def hidden(self, ctx, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The model's hidden states on ``batch`` with the adapter active now."""
        if ctx.is_seq2seq:
            out = ctx.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"],
                            output_hidden_states=True, use_cache=False, **nll.seq2seq_inputs(ctx.model, batch))
            return out.decoder_hidden_states
        # both adapters' forwards under one mask (the stable one runs without gradients): off the
        # CPU the pads attend to themselves, as in the training step (surecl.nll.prefixed)
        kwargs, _ = nll.prefixed(ctx.model, batch, want_logits=False, pads_self=nll.pads_self_here(batch["attention_mask"]))
        out = ctx.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], output_hidden_states=True,
                        use_cache=False, logits_to_keep=1, **kwargs)
        return out.hidden_states

    def consistency(self, ctx, items: list[tuple[int, int]]) -> torch.Tensor:
        """Mean over ``ilora.layers`` of the MSE between the fast and the slow adapter's hidden
        states on ``items`` (gradients through the fast side only), every position of the rows
        padded as one batch counting; under several processes, on this process's share of them
        (every ``world``-th row from its ``rank``), padded as all of them are.

        Each process collates all of ``items`` and keeps its own rows of that batch: a row padded
        to the width it has in one process counts the positions it counts there, so the
        processes' terms, each weighted by its share of the rows, sum to the one-process term
        (padded with its own process's rows only it would count fewer, and the term differ).
        The rows run in slices of at most ``train.micro_batch_tokens`` padded tokens (one row at
        least; 0: one slice), as the step's loss does, so memory holds one slice's activations,
        not the whole step's. Each slice is cut, rows only, from that one padded batch: it pads
        as the whole batch does, so the slices' terms, each weighted by its share of the rows,
        sum to the whole batch's term (and gradient) to rounding. The gradient of every slice
        but the last is taken as the slice is computed, its activations freed, and kept (the
        size of the trained tensors: the fast LoRA) until it enters the step's backward through
        the returned term (:class:`TakenGradient`); the last slice's graph is the term's own, as
        a single slice's always is."""
        batch = ctx.batch([ctx.train_sets[t][i] for t, i in items])
        n = len(items)
        if ctx.world > 1:
            keep = torch.arange(n, device=batch["input_ids"].device)[ctx.rank :: ctx.world]
            batch, n = {k: v[keep] for k, v in batch.items()}, len(keep)
        width = batch["input_ids"].shape[1] + (batch["labels"].shape[1] if ctx.is_seq2seq else 0)
        limit = ctx.cfg.train.micro_batch_tokens
        per = n if limit <= 0 else max(1, limit // width)
        starts = range(0, n, per)
        params = [p for p in ctx.model.parameters() if p.requires_grad]
        taken, grads = None, [None] * len(params)
        for start in starts[:-1]:
            part = self.slice_term(ctx, {k: v[start : start + per] for k, v in batch.items()}) * (per / n)
            if part.requires_grad:
                for j, g in enumerate(torch.autograd.grad(part, params, allow_unused=True)):
                    if g is not None:
                        grads[j] = g if grads[j] is None else grads[j] + g
            taken = part.detach() if taken is None else taken + part.detach()
        last = starts[-1]
        term = self.slice_term(ctx, {k: v[last:] for k, v in batch.items()})
        if taken is None:
            return term
        return term * ((n - last) / n) + TakenGradient.apply(taken, grads, *params)

    def slice_term(self, ctx, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The term on one collated batch: the mean over ``ilora.layers`` of the fast and slow
        adapters' hidden states' MSE (or, with ``ilora.target=max``, of their shortfall's square)."""
        plastic = self.hidden(ctx, batch)
        ctx.adapters.activate(SLOW)
        try:
            with torch.no_grad():
                stable = self.hidden(ctx, batch)
        finally:
            ctx.adapters.activate(FAST)
        picks = self.picks(len(plastic), ctx.is_seq2seq)  # (setup checked them where the model's config counts its layers)
        if self.config.target == "max":  # pulled toward max(plastic, stable): only where the plastic side is below
            return torch.stack([(plastic[k].float() - stable[k].float()).clamp(max=0).pow(2).mean() for k in picks]).mean()
        return torch.stack([F.mse_loss(plastic[k].float(), stable[k].float()) for k in picks]).mean()

    def loss(self, ctx, loss: torch.Tensor) -> torch.Tensor:
        weight = self.config.consistency_weight
        rows = ctx.step_items[ctx.step_new:] if self.config.rows == "replayed" else ctx.step_items
        share = len(rows[ctx.rank :: ctx.world]) if ctx.world > 1 else len(rows)
        if not weight or not share:
            return loss
        term = self.consistency(ctx, rows)
        self.last = float(term.detach())
        if ctx.world > 1:
            # the processes' gradients are averaged: each one's mean over its own rows (padded to
            # the width of all of them) counts by its share of the rows, so every row weighs as it
            # does in one process
            term = term * (ctx.world * share / len(rows))
        return loss + weight * term


def hidden_states(config, seq2seq: bool) -> int | None:
    """How many hidden states the term reads from a model of ``config``: the embeddings' and each
    layer's output (an encoder-decoder's decoder's: T5's ``num_decoder_layers``, BART's
    ``decoder_layers``; a composite model's text model's), or None where the config does not say."""
    layers = getattr(config, "num_decoder_layers", None) if seq2seq else None
    if layers is None and config is not None:
        try:
            text = config.get_text_config(decoder=True)  # (an older encoder-decoder's: its decoder_* keys)
        except (AttributeError, ValueError):
            text = config
        layers = getattr(text, "num_hidden_layers", None)
    return layers + 1 if isinstance(layers, int) and not isinstance(layers, bool) else None


class TakenGradient(torch.autograd.Function):
    """A term whose gradient with respect to ``params`` was taken already (``grads``, None where
    a tensor got none): its value is ``value``, and the backward hands each tensor its gradient
    times the one arriving, so whatever weight the term gets reaches the taken gradient. The
    activations that gradient came from are gone; the one backward of the step's loss, not a
    backward of its own, delivers it (once per tensor, as data-parallel gradient hooks expect)."""

    @staticmethod
    def forward(fctx, value: torch.Tensor, grads: list, *params: torch.Tensor) -> torch.Tensor:
        fctx.grads = grads
        return value.clone()

    @staticmethod
    def backward(fctx, grad_out: torch.Tensor):
        return (None, None, *[None if g is None else g * grad_out for g in fctx.grads])
