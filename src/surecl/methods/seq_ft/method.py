"""Sequential full fine-tuning (SeqFT): every weight of the base model trained on each task
in turn by the run's AdamW, no adapter; the forgetting baseline at the bottom of the paper's
main table. With a replay policy it becomes full-FT replay (``replay.policy=surprise``: SuRe
on the whole model).

* ``trains = "base"``: before ``setup`` the run takes the learner's LoRA adapters out
  (:meth:`surecl.adapters.DualLoRA.bypass`: every LoRA layer calls its base layer alone,
  nothing of the adapters is trained or exported); ``setup`` makes the base weights trainable
  and refuses a bf16 base (below).
* ``parameters`` (the default for ``trains = "base"``): the base weights, each once: tied weights (SmolLM2's input and output
  embeddings) are one parameter, so AdamW keeps one pair of moments for them and clipping
  counts them once.
* state: none of its own: the run checkpoints the trained base weights with their AdamW
  moments (:attr:`surecl.step.TrainStep.keep_weights`, as for every method that trains more than
  the fast adapter). For SmolLM2-135M (134.5 M parameters) that is 3 x 538 MB = 1.61 GB a
  checkpoint (README).
* ``export`` (``exports = ("model",)``): the fine-tuned model as a transformers folder ``model/`` (safetensors,
  tokenizer, model card) in place of the adapters.

bf16 weights: AdamW moves a weight by about ``lr`` per step (5e-5 here), but a bf16 weight of
magnitude at least 2^-6 is at least 1.2e-4 from its neighbours, so such an update rounds away
and the weight never moves; 92 % of SmolLM2-135M's weights are that large (adding 5e-5 in
bf16 leaves 93 % of layer 10's ``down_proj`` unchanged). A run would end looking like a method
that does not learn, so a bf16 base is an error, not a warning:
``model.dtype=bf16`` at config validation, ``model.dtype=auto`` where it resolves to bf16 (a
GPU) when the run starts. The preset pins ``model.dtype: fp32``.
"""

from __future__ import annotations

import torch

from surecl.errors import SureclError
from surecl.methods.base import Method

BF16 = (
    "model.dtype: seq_ft trains the base weights with AdamW, whose updates (about train.lr) round away in bf16 weights; "
    "set model.dtype=fp32 (the seq_ft preset does)"
)


class SeqFT(Method):
    name = "seq_ft"
    trains = "base"  # the run bypasses the learner's adapters before setup; parameters(): the base weights
    state = ()  # the trained base weights are checkpointed by the run (TrainStep.keep_weights)
    exports = ("model",)

    @classmethod
    def validate_config(cls, cfg) -> None:
        if cfg.dual.enabled:
            raise SureclError(
                "dual.enabled: seq_ft trains the base weights, not the fast LoRA adapter whose EMA the dual learner keeps; "
                "set dual.enabled=false"
            )
        if cfg.model.dtype == "bf16":
            raise SureclError(BF16)

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self.weights: dict[str, torch.nn.Parameter] = {}
        """The base weights it trains, by transformers name (set in ``setup``)."""

    def setup(self, ctx) -> None:
        self.weights = ctx.adapters.base_parameters()
        if any(p.dtype == torch.bfloat16 for p in self.weights.values()):
            raise SureclError(f"{BF16} (model.dtype={ctx.cfg.model.dtype} loaded the base in bf16 on this machine)")
        for p in self.weights.values():
            p.requires_grad_(True)

    @torch.no_grad()
    def load_state_dict(self, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
        """A checkpoint written before the run kept trained weights itself holds them here."""
        if not tensors:
            return
        missing = sorted(set(self.weights) - set(tensors))
        if missing:
            raise SureclError(f"checkpoint: the seq_ft state lacks {len(missing)} base weights ({missing[0]}, ...); use another --out")
        for n, p in self.weights.items():
            p.copy_(tensors[n])

    def export(self, ctx, results: dict) -> None:
        """The fine-tuned model, ``model/`` in the run folder (the adapters are bypassed)."""
        from surecl._version import version
        from surecl.card import full_model_card, prompt_spec, run_base
        from surecl.checkpoint import save_model

        __version__ = version()

        base_model, note = run_base(ctx, whole=True)
        card = full_model_card(results, base_model, note, __version__)
        weights = {n: p.detach() for n, p in self.weights.items()}
        save_model(ctx.adapters.model.get_base_model(), ctx.tokenizer, ctx.out_dir / "model", weights, card,
                   files={"prompt.json": prompt_spec(ctx, "model", base_model)})
