"""Methods: the continual-learning regime of a run (``method=NAME``), a plugin with a say in
the stages.

A method is a :class:`~surecl.plugins.base.Plugin` (hooks ``before_task``, ``loss``,
``after_step``, ``after_task``, ``eval_context``, ``state_dict`` / ``load_state_dict``) that
also decides:

* ``stages(n)``  - which tasks each training stage covers (sequential: one each; MTL: all at
  once). Stage ``s`` fills row ``row`` of the accuracy matrix.
* ``continual``  - False for MTL: no intermediate rows, no forgetting to measure, no replay.
* ``fast_eval``  - whether a dual run may also evaluate its fast adapter (``eval.fast``):
  False where the method swaps the evaluation weights itself (per-task FT).
* ``setup(ctx)``  - once, after the model and the learner's adapters exist and before the
  optimizer is built and the model handed to ``accelerate``: a method may attach modules of
  its own to ``ctx.model`` (so they move to the device and take part in DDP's all-reduce),
  freeze or unfreeze weights, or refuse a combination (raise ``SureclError``).
* ``parameters(ctx)``  - the parameters the optimizer trains (and gradient clipping bounds):
  by default the learner's fast adapter (``ctx.adapters.fast_params``); full fine-tuning
  returns the base weights, prompt tuning its prompts. Called once, after ``setup``. A list
  of tensors, or of torch param groups (dicts with ``params`` and optionally ``lr``: the
  group's own base learning rate, which ``train.scheduler`` scales as it scales ``train.lr``).
* ``input_prefix(ctx, task)``  - token ids put before the prompt of every example of
  ``task`` wherever the run builds the model's input: training (current and replayed
  examples), surprise scoring, evaluation by generation, ranking or perplexity. Asked at each
  use, so the answer may change with the method's state (Progressive Prompts: one more
  prompt per task); ``ctx.train_sets`` / ``ctx.test_sets`` are the examples as they read
  with it. Negative ids are *virtual tokens*: ``-1 - s`` names slot ``s`` of vectors the
  method gives the model's input embedding itself (a hook on the input embedding module);
  no loss or surprise score ever predicts one (:mod:`surecl.nll`), and an encoder-decoder
  keeps them on its encoder side. Default: none.
* ``validate_config(cfg)``  - a class method run by config validation (``surecl.config.validate``,
  so before anything is loaded, and by ``--dry-run`` and sweeps): raise a one-line
  ``SureclError`` naming the key of a combination the method cannot run (full fine-tuning
  with the dual learner).

Examples: fresh adapters per task (per-task FT, ``before_task``), a penalty on the loss (EWC,
``loss``), a Fisher estimate or an adapter snapshot (``after_task``), the weights that answer
for task ``j`` (``eval_context``). Replay policies and the dual learner are plugins of their
own and combine with any method. Register your own with :func:`surecl.register_method`.
"""

from __future__ import annotations

from collections.abc import Sequence

from surecl.plugins.base import Plugin, Stage


class Method(Plugin):
    name = "base"
    continual = True
    """False for MTL: no intermediate rows, no forgetting to measure."""
    fast_eval = True
    """Whether a dual run may also evaluate its fast adapter (``eval.fast``): False where
    the method swaps the evaluation weights itself (per-task FT)."""
    prefix_note = ""
    """What ``input_prefix`` puts before every prompt, in words, for the exported ``prompt.json``
    (empty: nothing)."""

    @classmethod
    def validate_config(cls, cfg) -> None:
        """Refuse (``SureclError`` naming the key) a config this method cannot run."""

    def setup(self, ctx) -> None:
        """Attach, freeze or check before the optimizer and ``accelerate`` see the model."""

    def parameters(self, ctx) -> list:
        """The parameters the optimizer trains (tensors or param groups): the learner's fast
        adapter by default."""
        return list(ctx.adapters.fast_params)

    def input_prefix(self, ctx, task: int) -> Sequence[int]:
        """Token ids before every prompt of ``task``, as the method's state is now (negative:
        virtual tokens, see the module docstring). None by default."""
        return ()

    def stages(self, n_tasks: int) -> list[Stage]:
        return [Stage((t,), t, tuple(range(t + 1))) for t in range(n_tasks)]


__all__ = ["Method", "Stage"]
