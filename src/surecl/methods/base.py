"""Methods: the continual-learning regime of a run (``method=NAME``), a plugin with a say in
the stages.

A method is a :class:`~surecl.plugins.base.Plugin` (hooks ``before_task``, ``loss``,
``after_step``, ``after_task``, ``eval_context``, ``state_dict`` / ``load_state_dict``) that
also decides:

What a method *is*, as the learner sees it, it states in four declarations (class
attributes), from which the run, its checkpoints, its exports and the model cards are derived
(no table anywhere names methods):

* ``trains``  - what the optimizer trains: ``"fast"`` (the learner's fast LoRA adapter, the
  default), ``"base"`` (the base model's own weights: the run takes the learner's adapters out
  with :meth:`surecl.adapters.DualLoRA.bypass` before ``setup``, and exports no adapter) or
  ``"own"`` (modules the method attaches in ``setup``, its ``parameters``: the run freezes the
  fast adapter before ``setup``, and exports no adapter).
* ``answers``  - which weights answer at evaluation: ``"learner"`` (the learner's evaluation
  adapter, slow if dual, else fast, with any always-on frozen adapter beside it) or ``"own"``
  (the method swaps in weights of its own in ``eval_context``, per-task FT's snapshots: a dual
  run then has no fast row, ``eval.fast``, and an exported adapter's card says it did not
  answer).
* ``state``  - the named parts of the method's own checkpointed state (``state_dict``), in
  words (``("per-task snapshots",)``); empty: the method checkpoints nothing of its own.
* ``exports``  - the paths, under the run folder, its ``export`` writes (``("model",)``); the
  default ``outputs(ctx)`` lists them for the run's manifest.

:func:`learner_of` reads the four into the dict results.json records as ``learner``.

The hooks it may implement beyond a plugin's:

* ``stages(n)``  - which tasks each training stage covers (sequential: one each; MTL: all at
  once). Stage ``s`` fills row ``row`` of the accuracy matrix.
* ``continual``  - False for MTL: no intermediate rows, no forgetting to measure, no replay.
* ``fast_eval``  - whether a dual run may also evaluate its fast adapter (``eval.fast``):
  by default where the learner answers (``answers == "learner"``).
* ``fast_is_solo``  - whether that fast adapter is trained exactly as the method without the
  dual learner, so a dual run's fast row is the non-dual method's, paired (default True).
  False where the method's training reads the slow adapter (I-LoRA's consistency term pulls
  the fast adapter toward the slow one at every step, and the method refuses
  ``dual.enabled=false``); ``fast_role`` then says what the fast row is, and the reports
  (report.md's fast section, the paper layout's captions) say it in those words
  (:func:`fast_words`).
* ``setup(ctx)``  - once, after the model and the learner's adapters exist and before the
  optimizer is built and the model handed to ``accelerate``: a method may attach modules of
  its own to ``ctx.model`` (so they move to the device and take part in DDP's all-reduce),
  freeze or unfreeze weights, or refuse a combination (raise ``SureclError``).
* ``check_model(config, seq2seq)``  - refuse (one-line ``SureclError``) options the model cannot
  run, judged from its transformers config alone: the dry run calls it wherever it can read
  the model's config without loading weights, and a method calls it from its ``setup``, so a
  run stops on it before anything trains. Default: nothing to check.
* ``check_run_model(cfg, config, seq2seq)``  - ``check_model`` with the run's whole config
  beside the model's, for a refusal that also reads core keys (N-LoRA's ``nlora.l1_of=ab``
  against the layers ``lora.target_modules`` names, on a meta-device copy of the model).
  Default: ``check_model(config, seq2seq)``; the dry run is to call this one.
* ``parameters(ctx)``  - the parameters the optimizer trains (and gradient clipping bounds),
  as ``trains`` says: by default the learner's fast adapter (``ctx.adapters.fast_params``) or
  the base weights (``ctx.adapters.base_parameters()``); a method that trains its own modules
  returns them (prompt tuning: its prompts). Called once, after ``setup``. A list
  of tensors, or of torch param groups (dicts with ``params`` and optionally ``lr``: the
  group's own base learning rate, which ``train.scheduler`` scales as it scales ``train.lr``).
* ``input_prefix(ctx, task)``  - (a hook every plugin has; a method's is the usual one) token ids put before the prompt of every example of
  ``task`` wherever the run builds the model's input: training (current and replayed
  examples), surprise scoring, evaluation by generation, ranking or perplexity. Asked at each
  use, so the answer may change with the method's state (Progressive Prompts: one more
  prompt per task); ``ctx.train_sets`` / ``ctx.test_sets`` are the examples as they read
  with it. Negative ids are *virtual tokens*: ``-1 - s`` names slot ``s`` of vectors the
  method gives the model's input embedding itself (a hook on the input embedding module);
  no loss or surprise score ever predicts one (:mod:`surecl.nll`), and an encoder-decoder
  keeps them on its encoder side. Default: empty (a hook returns ``()`` for none, not None).
* ``longest_prefix(config, n_tasks)``  - (a class method) the most tokens ``input_prefix`` will
  put before a prompt in a stream of ``n_tasks`` tasks, so the run can check before training
  that its rows fit the model's positions. Default: 0.
* ``sample_replay(ctx, stage, step, count)``  - (a plugin hook) the buffer entries replayed at
  a step: a method answers it before the replay policy, whose answer is ``count`` uniform draws
  from its buffer. Default: None (the policy decides).
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
from typing import ClassVar

from surecl.errors import SureclError
from surecl.plugins.base import Plugin, Stage

TRAINS = ("fast", "base", "own")
"""What a method's optimizer may train (:attr:`Method.trains`)."""
ANSWERS = ("learner", "own")
"""Which weights may answer at evaluation (:attr:`Method.answers`)."""


class Method(Plugin):
    name = "base"
    continual = True
    """False for MTL: no intermediate rows, no forgetting to measure."""
    trains: ClassVar[str] = "fast"
    """What the optimizer trains: ``"fast"`` (the learner's fast adapter), ``"base"`` (the base
    weights; the adapters bypassed) or ``"own"`` (the method's own modules; the adapters frozen)."""
    answers: ClassVar[str] = "learner"
    """Which weights answer at evaluation: ``"learner"`` (the learner's evaluation adapter) or
    ``"own"`` (the method's, swapped in by its ``eval_context``)."""
    state: ClassVar[tuple[str, ...]] = ()
    """The named parts of the method's own checkpointed state, in words (empty: none)."""
    exports: ClassVar[tuple[str, ...]] = ()
    """The paths under the run folder that its ``export`` writes."""
    fresh_optimizer: ClassVar[bool] = False
    """Whether it starts the optimizer afresh at each task after the first (its ``before_task``
    calls ``ctx.reset_optimizer()``), whatever ``train.fresh_optimizer`` says: the dry run says so."""
    fast_is_solo: ClassVar[bool] = True
    """Whether a dual run's fast adapter trains exactly as this method without the dual learner
    (the fast row is the non-dual method's, on the same trajectory): False where the training
    reads the slow adapter, so the fast row is not the method without the slow learner."""
    fast_role: ClassVar[str] = ""
    """Where :attr:`fast_is_solo` is False: what the fast adapter is, in words, for the reports
    (empty: a generic sentence)."""
    prefix_note = ""
    """What ``input_prefix`` puts before every prompt, in words, for the exported ``prompt.json``
    (empty: nothing)."""

    @property
    def fast_eval(self) -> bool:
        """Whether a dual run may also evaluate its fast adapter (``eval.fast``): only where the
        learner answers (a method that swaps in its own weights would be measured twice)."""
        return self.answers == "learner"

    @classmethod
    def validate_config(cls, cfg) -> None:
        """Refuse (``SureclError`` naming the key) a config this method cannot run."""

    def setup(self, ctx) -> None:
        """Attach, freeze or check before the optimizer and ``accelerate`` see the model."""

    def check_model(self, config, seq2seq: bool) -> None:
        """Refuse (``SureclError`` naming the key) options this model cannot run, from its
        transformers ``config`` (``seq2seq``: an encoder-decoder)."""

    def check_run_model(self, cfg, config, seq2seq: bool) -> None:
        """:meth:`check_model`, with the run's config ``cfg`` beside the model's transformers
        ``config``, for a refusal that also depends on core keys (``lora.target_modules``):
        the dry run's check, where it reads the model's config without weights."""
        self.check_model(config, seq2seq)

    def parameters(self, ctx) -> list:
        """The parameters the optimizer trains (tensors or param groups), as :attr:`trains`
        declares: the learner's fast adapter, or the base weights."""
        if self.trains == "fast":
            return list(ctx.adapters.fast_params)
        if self.trains == "base":
            return list(ctx.adapters.base_parameters().values())
        raise SureclError(f"method {self.name}: trains='own' needs a parameters(ctx) returning the modules it trains")

    def outputs(self, ctx) -> list[str]:
        """The paths its ``export`` writes: :attr:`exports`."""
        return list(self.exports)

    def learning_rate(self, cfg) -> str:
        """The learning rate its optimizer trains at, in words, for the dry run: ``train.lr``
        unless the method's parameter groups set their own."""
        return f"lr {cfg.train.lr:g}"

    def input_prefix(self, ctx, task: int) -> Sequence[int]:
        """Token ids before every prompt of ``task``, as the method's state is now (negative:
        virtual tokens, see the module docstring). Empty by default (never None)."""
        return ()

    def stages(self, n_tasks: int) -> list[Stage]:
        return [Stage((t,), t, tuple(range(t + 1))) for t in range(n_tasks)]

    @classmethod
    def longest_prefix(cls, config, n_tasks: int) -> int:
        """The most tokens ``input_prefix`` will put before a prompt in a stream of ``n_tasks``
        tasks, for the method built with ``config`` (its options): the run checks before
        training that rows with this prefix fit the model's positions. 0 by default."""
        return 0


def check_declarations(cls: type, name: str | None = None) -> None:
    """Refuse a method class whose declarations are not among the known values (one line naming
    it as ``name``, default its own ``name``). Registration calls it, so a dry run never plans
    what the run would refuse after loading its model; the run calls it again."""
    name = name or cls.name
    if cls.trains not in TRAINS:
        raise SureclError(f"method {name}: trains={cls.trains!r} is not one of {', '.join(TRAINS)}")
    if cls.answers not in ANSWERS:
        raise SureclError(f"method {name}: answers={cls.answers!r} is not one of {', '.join(ANSWERS)}")
    if not isinstance(cls.fast_is_solo, bool):
        raise SureclError(f"method {name}: fast_is_solo must be True or False, not {cls.fast_is_solo!r}")
    if not isinstance(cls.fast_role, str):
        raise SureclError(f"method {name}: fast_role must be a text, not {cls.fast_role!r}")
    for what in ("state", "exports"):
        value = getattr(cls, what)
        if not isinstance(value, tuple) or not all(isinstance(v, str) and v for v in value):
            raise SureclError(f"method {name}: {what} must be a tuple of non-empty strings, not {value!r}")


SOLO_FAST = "the same run without the slow learner"
"""What a dual run's fast row is where the method's :attr:`Method.fast_is_solo` holds."""


def fast_words(method) -> str:
    """What a dual run's fast row is, in words, for a method class or instance (None: a method
    not registered here, said without claiming either): the same run without the slow learner,
    or, where :attr:`Method.fast_is_solo` is False, its :attr:`Method.fast_role`."""
    if method is None:
        return "the fast adapter of the same run"
    if getattr(method, "fast_is_solo", True):
        return SOLO_FAST
    return getattr(method, "fast_role", "") or "the fast adapter, trained with the slow one (not the method without the slow learner)"


def learner_of(method) -> dict:
    """A method's declarations as results.json records them (``learner``): ``trains``,
    ``answers``, ``state``, ``exports``."""
    return {"trains": method.trains, "answers": method.answers, "state": list(method.state), "exports": list(method.exports)}


__all__ = ["ANSWERS", "SOLO_FAST", "TRAINS", "Method", "Stage", "check_declarations", "fast_words", "learner_of"]
