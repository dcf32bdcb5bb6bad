"""The plugin protocol: the one interface through which everything that takes part in a run
meets the loop (:mod:`surecl.trainer`).

The method (sequential, MTL, per-task FT, EWC), the replay policy (SuRe and the baselines),
the dual learner (:class:`surecl.adapters.DualLoRA`), the training step's optimizer
(:class:`surecl.step.TrainStep`), the step log (``log.jsonl``) and fault injection are all
plugins. A plugin declares a ``name`` and its own ``Config`` dataclass, and implements any of
these hooks (all optional; the defaults do nothing):

* ``before_task(ctx, stage)``  - before training on a stage (fresh adapters, score and insert
  a task's selection into the buffer, reset the optimizer, ...).
* ``loss(ctx, loss) -> loss``  - once per optimizer step, on the first micro-batch slice's
  share of the loss, before backward: add a penalty (EWC), inject a fault. The step's examples
  are ``ctx.step_items`` (a consistency term on them: I-LoRA).
* ``sample_replay(ctx, stage, step, count) -> entries | None``  - the buffer entries replayed
  at ``step`` of ``stage`` beside its current batch (``count``: how many the schedule asks for,
  :func:`surecl.plan.replay_count`, 0 on a step without replay). The first plugin in list order
  that answers (not None) decides; the replay policy answers with ``count`` uniform draws
  from its buffer, so a method (before it in the list) may replay otherwise. Default: None.
* ``input_prefix(ctx, task) -> ids``  - token ids put before the prompt of every example of
  ``task`` wherever the run builds the model's input (training, scoring, evaluation), asked
  at each use; the run puts every plugin's before the prompt, in list order, leaving out those
  of the plugins an evaluation leaves out (``ctx.left_out``). Default: empty (``()``; never None).
* ``after_step(ctx, record)``   - after each optimizer step, with its :class:`StepRecord`
  (EMA of the slow adapter, buffer insertion and aging, the step log).
* ``after_task(ctx, stage)``   - after training on a stage, before it is evaluated (Fisher
  estimate, adapter snapshot, score and insert after the task).
* ``eval_context(ctx, task)``  - a context manager entered around the evaluation of one
  task: chooses the weights that answer (slow or fast adapter, a per-task snapshot). Also
  entered, in a dual run, for the fast adapter's row (``ctx.eval_view == "fast"``) and, except
  the method's, for the before-training row (``eval.before``; ``ctx.stage`` is None then).
  Entered too, except the method's, around the general-ability probe (``eval.general``), with
  ``task`` = ``GENERAL_PROBE`` (-1: no stream task).
* ``after_eval(ctx, stage)``   - after a stage's row of the accuracy matrix (and the fast
  adapter's, ``ctx.state.accuracy_fast``) is filled; ``stage`` is None for the before-training
  row (``ctx.state.initial``). Loggers and trackers read the matrix here.
* ``after_run(ctx, results)`` - once, when the run has finished and ``results`` (the dict
  written to ``results.json``) is final (after ``export``): close trackers.
* ``export(ctx, results)``  - once, at the end of a finished run (main process only), before
  ``results.json`` is written (the run's "finished" comes last: during ``export`` the file is
  absent, so read ``results``, the dict it will hold): write what the plugin leaves for use
  after the run into ``ctx.out_dir`` (the learner's PEFT adapters; full fine-tuning's whole
  model; Progressive Prompts' ``adapters/prompts``), atomically.
* ``outputs(ctx)`` - the paths ``export`` writes, relative to the run folder (recorded in its
  manifest, so ``--fresh`` removes them and nothing else).
* ``state_dict()`` / ``load_state_dict(meta, tensors)`` - the plugin's own state for
  checkpoints: JSON-able ``meta`` and a flat ``{name: tensor}`` dict (tensors are handed
  back on the CPU; a plugin moves them where it needs them). A checkpoint without the
  plugin's key (one written before it took part) hands back ``({}, {})``.

Order: a run's plugins form one list (optimizer, learner, method, replay policy, extra
plugins, step log, fault injection). ``before_task``, ``loss``, ``after_step`` and
``eval_context`` run in list order; ``after_task`` in reverse order, so the pair brackets a
stage as nested context managers would (the replay policy's after-task scoring runs before the
method's after-task hook, as the method's before-task hook runs before the policy's).

``ctx`` is the running :class:`surecl.trainer.ContinualRun`; :class:`RunContext` lists what a
plugin may use of it.

The dispatcher (:class:`Plugins`) checks what a hook hands back where the run would otherwise
fail far from the plugin: ``loss`` must give a one-element ``torch.Tensor`` (still in the autograd
graph when it was given one), ``sample_replay`` a list of
:class:`~surecl.replay.buffer.Entry` naming training examples that exist, ``input_prefix`` a
sequence of integer token ids, ``eval_context`` a context manager, ``state_dict`` a pair (a
dict that JSON writes and reads back the same: no tuples, string keys; a dict of tensors under
string keys). Anything else is a one-line
:class:`~surecl.errors.SureclError` naming the plugin, the hook and what was expected.

Nothing here imports torch at import time: ``surecl --help`` and the registry stay light.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from surecl.errors import SureclError, start_over
from surecl.logs import logger
from surecl.replay.buffer import Entry

if TYPE_CHECKING:
    import torch

    from surecl.config import RunConfig


GENERAL_PROBE = -1
"""The ``task`` that ``eval_context`` gets around the general-ability probe (``eval.general``):
no stream task, so a plugin that swaps in a task's own weights leaves them as they are."""


@dataclass(frozen=True)
class Stage:
    tasks: tuple[int, ...]
    """Task indices whose training data this stage trains on."""
    row: int
    """Accuracy-matrix row filled after the stage."""
    evaluate: tuple[int, ...]
    """Task indices evaluated after the stage."""


@dataclass
class StepRecord:
    """What one optimizer step did, handed to every plugin's ``after_step``.

    The step's batch is ``items``: the ``current`` examples drawn from the stage's data, then
    the ``replayed`` buffer entries (present on every ``replay.every``-th step when the buffer
    holds any). ``nll`` and ``tokens`` come from the step's own forward (before the update):
    the summed answer-token NLL and the number of answer tokens of each row this process
    computed, row ``k`` being ``items[rows[k]]`` (with one process: every item, in order; with
    W processes rank r computes items r, r+W, ...)."""

    stage: Stage
    step: int
    """0-based step inside the stage."""
    global_step: int
    """Optimizer steps taken in the run, this one included."""
    current: list[tuple[int, int]]
    """(task, index) of the current batch's examples, indices into the encoded training sets."""
    replayed: list[Entry]
    """The buffer entries replayed in this step (``.task``, ``.index``, ``.score``)."""
    rows: list[int]
    """Positions in :attr:`items` of the rows of :attr:`nll` and :attr:`tokens`."""
    nll: torch.Tensor
    """Summed answer-token NLL per computed row (fp32, detached)."""
    tokens: torch.Tensor
    """Answer tokens per computed row."""
    loss: float
    """The step's loss as shown and logged: token mean over the whole mixed batch, plus any
    plugin penalty."""
    lr: float
    """Learning rate the step was taken with."""

    @property
    def items(self) -> list[tuple[int, int]]:
        """(task, index) of every example of the step: the current batch, then the replayed entries."""
        return self.current + [(e.task, e.index) for e in self.replayed]


class RunContext(Protocol):
    """What a plugin may use of the run passed to its hooks as ``ctx`` (a
    :class:`surecl.trainer.ContinualRun`)."""

    cfg: RunConfig
    out_dir: Any
    """The run's output folder (a ``pathlib.Path``)."""
    tasks: list
    """The stream's :class:`~surecl.data.task.Task` list."""
    train_sets: list[list]
    """Per task, its training examples, tokenised (:class:`~surecl.data.encode.Encoded`), as
    the model reads them now: with the method's ``input_prefix`` before each prompt."""
    test_sets: list[list]
    adapters: Any
    """The :class:`~surecl.adapters.DualLoRA` learner (``fast_params``, ``adapter_state``, ...)."""
    model: Any
    tokenizer: Any
    model_path: str
    """The folder (or hub name) the base model was loaded from."""
    supplied_model: bool
    """The base model and tokenizer were built by the caller (``ContinualRun(model=, tokenizer=)``)."""
    supplied_tasks: bool
    """The tasks were built by the caller (``ContinualRun(tasks=)``)."""
    continuing: bool
    """This run may continue what an earlier process began in its folder (not ``--fresh`` nor
    ``resume=False``): what it sent to trackers stays sent."""
    trained_params: list
    """The parameters the optimizer trains (the method's ``parameters(ctx)``; by default the
    fast adapter's)."""
    optimizer: Any
    policy: Any
    """The replay policy (``len(policy)`` is the buffer size)."""
    method: Any
    plugins: Plugins
    accelerator: Any
    """The ``accelerate.Accelerator`` the run is written against."""
    device: Any
    world: int
    """Number of processes."""
    rank: int
    """This process's index."""
    is_seq2seq: bool
    share_prefix: bool
    stages: list[Stage]
    state: Any
    """The run's progress (:class:`surecl.trainer.RunState`): ``state.step`` is the step
    being taken (inside ``loss``) or the next one, ``state.global_step`` the steps taken."""
    stage: Stage | None
    """The stage being trained or evaluated (None before the first: the ``eval.before`` row)."""
    step_items: list[tuple[int, int]]
    """(task, index) of every example of the step being taken, the current batch then the
    replayed entries (as :attr:`StepRecord.items`), set before its ``loss`` hooks run: a method
    may build its own forward on them (``ctx.batch([ctx.train_sets[t][i] for t, i in ...])``)."""
    step_new: int
    """How many of :attr:`step_items` are the current batch's (the rest were replayed)."""
    eval_view: str | None
    """While evaluating: the adapter asked to answer (None: the run's own answer, slow if dual;
    ``"fast"``: the fast adapter's row of a dual run)."""
    left_out: tuple
    """While evaluating the learner's own weights (the before-training row, the general probe):
    the plugins whose ``eval_context`` and ``input_prefix`` are left out (the method); else ()."""

    def batch(self, items: list, shared: bool = False) -> dict: ...
    def score(self, items: list, scope: str | None = None, reduction: str | None = None) -> list[float]: ...
    def surprise_of_task(self, task: int, scope: str | None = None, reduction: str | None = None) -> list[float]: ...
    def reset_optimizer(self) -> None: ...
    def stage_name(self, stage: Stage) -> str: ...
    def log(self, message: str) -> None: ...


@dataclass
class NoConfig:
    """A plugin without options."""


class Plugin:
    """Base class of every plugin: the hooks do nothing until overridden."""

    name: ClassVar[str] = "plugin"
    Config: ClassVar[type] = NoConfig
    """The plugin's own options, a dataclass."""

    def __init__(self, config: Any = None) -> None:
        self.config = config if config is not None else self.Config()

    @classmethod
    def config_from(cls, cfg: RunConfig) -> Any:
        """The plugin's ``Config`` built from (a view of) the run's config tree; the default
        takes the dataclass's defaults. Built-ins read their section (EWC: ``train.ewc_*``,
        SuRe: ``replay.*``), so the user-facing keys stay where they are."""
        return cls.Config()

    def before_task(self, ctx: RunContext, stage: Stage) -> None:
        pass

    def loss(self, ctx: RunContext, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def sample_replay(self, ctx: RunContext, stage: Stage, step: int, count: int) -> list[Entry] | None:
        """The entries replayed at ``step`` (None: leave it to a later plugin)."""
        return None

    def input_prefix(self, ctx: RunContext, task: int) -> Sequence[int]:
        """Token ids before every prompt of ``task`` now (negative: virtual tokens). Empty by default (never None)."""
        return ()

    def after_step(self, ctx: RunContext, record: StepRecord) -> None:
        pass

    def after_task(self, ctx: RunContext, stage: Stage) -> None:
        pass

    @contextlib.contextmanager
    def eval_context(self, ctx: RunContext, task: int) -> Iterator[None]:
        yield

    def after_eval(self, ctx: RunContext, stage: Stage | None) -> None:
        pass

    def after_run(self, ctx: RunContext, results: dict) -> None:
        pass

    def export(self, ctx: RunContext, results: dict) -> None:
        """Write what the plugin leaves for use after the run (main process only), before
        ``results.json`` is written: the file is absent meanwhile; ``results`` is what it will hold."""

    def outputs(self, ctx: RunContext) -> list[str]:
        """The paths ``export`` writes, relative to ``ctx.out_dir`` (``adapters/fast``): the run
        records them in its manifest before ``export`` runs (``--fresh`` removes them) and
        refuses at its start when one is a symbolic link or a file surecl did not write."""
        return []

    def state_dict(self) -> tuple[dict, dict[str, torch.Tensor]]:
        return {}, {}

    def load_state_dict(self, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
        pass


class Plugins:
    """A run's plugins under their checkpoint keys, in hook order (see the module docstring)."""

    def __init__(self, plugins: dict[str, Plugin]) -> None:
        self.by_key = dict(plugins)
        self._tuples_said: set[int] = set()  # the plugins warned that their meta's tuples come back as lists
        self._list = list(self.by_key.values())
        self._keys = {id(p): key for key, p in self.by_key.items()}

    def __iter__(self) -> Iterator[Plugin]:
        return iter(self._list)

    def who(self, plugin: Plugin) -> str:
        """The plugin as an error line names it: its role (checkpoint key) and its ``name``."""
        role = self._keys.get(id(plugin), "plugin").split(":")[0]
        return f"{'plugin' if role == 'plugin' else role + ' plugin'} {getattr(plugin, 'name', type(plugin).__name__)!r}"

    def before_task(self, ctx: RunContext, stage: Stage) -> None:
        for p in self._list:
            p.before_task(ctx, stage)

    def loss(self, ctx: RunContext, loss: torch.Tensor) -> torch.Tensor:
        """Each plugin's ``loss`` hook in turn, each handed the previous one's loss."""
        import torch  # loaded already (the step made the loss); a lookup, not an import

        for p in self._list:
            given, loss = loss, p.loss(ctx, loss)
            if not (torch.is_tensor(loss) and loss.numel() == 1 and (loss.requires_grad or not given.requires_grad)):
                raise SureclError(f"{self.who(p)}: its loss hook returned {_kind(loss)}{_graph(loss, given)}; expected the loss tensor it was "
                                  "given (one element, in the autograd graph), with any penalty added (loss + penalty)")
        return loss

    def sample_replay(self, ctx: RunContext, stage: Stage, step: int, count: int) -> list[Entry]:
        """The first answer (not None) of the plugins' ``sample_replay`` in list order; none: no replay."""
        for p in self._list:
            entries = p.sample_replay(ctx, stage, step, count)
            if entries is not None:
                return self._entries(ctx, p, entries)
        return []

    def _entries(self, ctx: RunContext, p: Plugin, entries: Any) -> list[Entry]:
        """``entries`` as a list, each an :class:`Entry` of a training example that exists (else one line naming ``p``)."""
        expected = "expected None or a list of surecl.replay.buffer.Entry (task, index) of training examples"
        if not isinstance(entries, (list, tuple)):
            raise SureclError(f"{self.who(p)}: its sample_replay hook returned {_kind(entries)}; {expected}")
        sets = getattr(ctx, "train_sets", None)
        for k, e in enumerate(entries):
            if not isinstance(e, Entry):
                raise SureclError(f"{self.who(p)}: its sample_replay hook returned {_kind(e)} as entry {k}; {expected}")
            if sets is not None and not (_is_index(e.task) and 0 <= e.task < len(sets)
                                         and _is_index(e.index) and 0 <= e.index < len(sets[e.task])):
                raise SureclError(f"{self.who(p)}: its sample_replay hook returned entry {k} for task {e.task!r} example {e.index!r}, "
                                  f"which does not exist ({len(sets)} tasks); {expected}")
        return list(entries)

    def input_prefix(self, ctx: RunContext, task: int, skip: tuple[Plugin, ...] = ()) -> tuple[int, ...]:
        """Every plugin's ``input_prefix`` for ``task`` but those in ``skip``, in list order; each
        a sequence of integer token ids (else one line naming the plugin)."""
        prefix: tuple[int, ...] = ()
        for p in self._list:
            if p not in skip:
                given = p.input_prefix(ctx, task)
                ids = _token_ids(given)
                if ids is None:
                    raise SureclError(f"{self.who(p)}: its input_prefix hook returned {_kind(given)} for task {task}; expected a "
                                      "sequence of integer token ids (negative: virtual tokens), () for none")
                prefix += ids
        return prefix

    def after_step(self, ctx: RunContext, record: StepRecord) -> None:
        for p in self._list:
            p.after_step(ctx, record)

    def after_task(self, ctx: RunContext, stage: Stage) -> None:
        for p in reversed(self._list):
            p.after_task(ctx, stage)

    @contextlib.contextmanager
    def eval_context(self, ctx: RunContext, task: int, skip: tuple[Plugin, ...] = ()) -> Iterator[None]:
        """Every plugin's ``eval_context`` but those in ``skip``, entered in list order."""
        with contextlib.ExitStack() as stack:
            for p in self._list:
                if p not in skip:
                    manager = p.eval_context(ctx, task)
                    if not (hasattr(type(manager), "__enter__") and hasattr(type(manager), "__exit__")):
                        raise SureclError(f"{self.who(p)}: its eval_context hook returned {_kind(manager)}; expected a context "
                                          "manager (decorate the method with @contextlib.contextmanager and yield once)")
                    stack.enter_context(manager)
            yield

    def after_eval(self, ctx: RunContext, stage: Stage | None) -> None:
        for p in self._list:
            p.after_eval(ctx, stage)

    def after_run(self, ctx: RunContext, results: dict) -> None:
        for p in self._list:
            p.after_run(ctx, results)

    def export(self, ctx: RunContext, results: dict) -> None:
        for p in self._list:
            p.export(ctx, results)

    def outputs(self, ctx: RunContext) -> list[str]:
        return [rel for p in self._list for rel in p.outputs(ctx)]

    def state_dicts(self) -> dict[str, tuple[dict, dict[str, torch.Tensor]]]:
        """Every plugin's ``state_dict()`` under its key, each checked to be what a checkpoint can hold."""
        return {key: self._state(p, p.state_dict()) for key, p in self.by_key.items()}

    def _state(self, p: Plugin, state: Any) -> tuple[dict, dict[str, torch.Tensor]]:
        """``state`` as (meta, tensors): a JSON-serialisable dict and a dict of tensors under string
        keys (else one line naming ``p``, before anything of the checkpoint is written)."""
        import torch

        expected = "expected (meta, tensors): a JSON-serialisable dict and a dict of torch tensors under string keys"
        if not (isinstance(state, (tuple, list)) and len(state) == 2 and isinstance(state[0], dict) and isinstance(state[1], dict)):
            raise SureclError(f"{self.who(p)}: its state_dict returned {_kind(state)}; {expected}")
        meta, tensors = state
        for name, value in tensors.items():
            if not (isinstance(name, str) and torch.is_tensor(value)):
                raise SureclError(f"{self.who(p)}: its state_dict's tensors hold {_kind(value)} under {name!r}; {expected}")
        try:
            json.dumps(meta, allow_nan=False)
        except (TypeError, ValueError) as exc:  # what checkpoint.write_json would meet
            raise SureclError(f"{self.who(p)}: its state_dict's meta is not JSON-serialisable ({exc}); {expected} "
                              "(tensors go in the second dict; NaN and infinity are not JSON)") from None
        key = _non_string_key(meta)
        if key is not None:  # JSON writes it as a string: the resumed run would read "3" where 3 was
            raise SureclError(f"{self.who(p)}: its state_dict's meta holds the key {key!r}, not a string; JSON would give it back "
                              f"as {str(key)!r} on resume: use string keys (str({key!r}))")
        where = _tuple_at(meta)
        if where is not None and id(p) not in self._tuples_said:  # JSON writes it as a list: a resumed run reads [0, [0]] where (0, (0,)) was
            self._tuples_said.add(id(p))
            logger.warning(f"{self.who(p)}: its state_dict's meta holds a tuple at {where}; a resumed run's "
                           "load_state_dict gets it back as a list (JSON has no tuples): make it a tuple again there if it must be one")
        return meta, tensors

    def load_state_dicts(self, states: dict[str, tuple[dict, dict[str, torch.Tensor]]]) -> None:
        """Each plugin's state from a checkpoint; a plugin that cannot read its own (a checkpoint
        another version of it wrote, say) is one line naming it, not its traceback."""
        for key, p in self.by_key.items():
            meta, tensors = states.get(key, ({}, {}))
            try:
                p.load_state_dict(meta, tensors)
            except (SureclError, MemoryError, OSError):
                raise  # out of memory or a disk fault: the checkpoint is intact, the caller's handler says so
            except Exception as exc:
                if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError (a RuntimeError): as above
                    raise  # the plugin's own code: named, its error in one line (--debug shows the traceback)
                raise SureclError(f"{self.who(p)}: its load_state_dict could not read the checkpoint's state: {type(exc).__name__}: "
                                  f"{' '.join(str(exc).split())[:200]} (a checkpoint another version of the plugin wrote? start over: "
                                  f"{start_over('--fresh')}, or another --out)") from exc


def _is_index(value: Any) -> bool:
    """An integer a list can be indexed with (numpy's too), not a bool."""
    return hasattr(value, "__index__") and not isinstance(value, bool)


def _non_string_key(tree: Any) -> Any:
    """The first dict key in ``tree`` (dicts and lists, any depth) that is not a string, else None."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            if not isinstance(k, str):
                return k
            found = _non_string_key(v)
            if found is not None:
                return found
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            found = _non_string_key(v)
            if found is not None:
                return found
    return None


def _token_ids(value: Any) -> tuple | None:
    """``value`` as a tuple of token ids, or None when it is not a sequence of integers."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        return None
    ids = tuple(value)
    return ids if all(_is_index(i) for i in ids) else None


def _tuple_at(tree: Any, path: str = "meta") -> str | None:
    """Where the first tuple in ``tree`` (dicts and lists, any depth) is (``meta['last'][1]``), else None."""
    if isinstance(tree, tuple):
        return path
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for k, v in items:
        found = _tuple_at(v, f"{path}[{k!r}]")
        if found is not None:
            return found
    return None


def _kind(value: Any) -> str:
    """What a hook returned, in words: ``None``, ``a float (2.5)``, ``a Tensor of shape (2, 3)``."""
    if value is None:
        return "None"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"a {type(value).__name__} of shape {tuple(value.shape)}"
    text = repr(value)
    return f"a {type(value).__name__} ({text if len(text) <= 60 else text[:57] + '...'})"


def _graph(loss: Any, given: Any) -> str:
    """Why a tensor loss was refused when its shape was not the reason: it left the autograd graph."""
    if hasattr(loss, "numel") and loss.numel() == 1 and given.requires_grad and not getattr(loss, "requires_grad", True):
        return " cut from the autograd graph (no grad: detached, or computed under torch.no_grad)"
    return ""
