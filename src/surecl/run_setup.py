"""The factory of a run: everything :class:`surecl.trainer.ContinualRun` holds, built from a
config (and whatever the caller passed in its place), before the loop starts.

:func:`build_run` fills the run in this order, each step depending on the ones before: the
``accelerate.Accelerator``, the task stream, the base model and tokenizer, the encoded sets
(read through :class:`~surecl.run_state.InputSets`, which asks the plugins' input prefix), the
general-ability probe, the learner (:class:`~surecl.adapters.DualLoRA`, drawn right after
seeding), the method and the replay policy, the method's ``setup`` and the optimizer over what
it trains, the plugins in hook order, the run's state and its matrices, the stages and the
EMA's rate. Nothing here trains or writes a file."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from types import SimpleNamespace

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration

from surecl.adapters import DualLoRA, beta_per_step, resolve_beta, task_seed
from surecl.config import RunConfig, check_again, stream_warnings
from surecl.data.encode import TaskEncoder, check_read_ids, check_row_ids, new_token_budget
from surecl.data.general import load_general_probe
from surecl.data.loading import (
    caller_stream,
    caller_tasks,
    load_stream,
    missing_tasks_warning,
    short_tasks_warning,
    streams_seed,
    unnamed_tasks_warning,
)
from surecl.data.task import Task
from surecl.errors import SureclError
from surecl.methods.base import check_declarations
from surecl.model import (
    GivenModel,
    check_given_model,
    default_cache_dir,
    embedding_rows,
    load_model,
    prepare_model,
    weights_dtype,
)
from surecl.nll import model_positions, shared_prefix_obstacle, sliding_window_in_use  # noqa: F401  (re-exported)
from surecl.plan import check_task_names, ema_units
from surecl.plugins.base import Plugin, Plugins
from surecl.plugins.faults import FaultInjection
from surecl.plugins.steplog import StepLog
from surecl.plugins.tracking import Tracking, check_trackers, tracker_names
from surecl.processes import release_at_exit
from surecl.registry import method_class, method_config, policy_class, policy_options
from surecl.replay.buffer import OnlineQuotaBuffer
from surecl.replay.policies import buffer_capacity, stream_quota_warning
from surecl.run_eval import encode_test
from surecl.run_folder import generators, set_generators
from surecl.run_results import base_fingerprint
from surecl.run_state import InputSets, RunState
from surecl.step import TrainStep


def accelerate_mixed_precision() -> str:
    """The mixed precision accelerate would apply (``accelerate launch --mixed_precision``, its
    config file, ``ACCELERATE_MIXED_PRECISION``): a run sets ``mixed_precision="no"``, as its
    precision is ``model.dtype`` and results.json records that, never an autocast beside it.
    One line where this process's accelerate state already holds another setting (an
    ``Accelerator(mixed_precision=...)`` made before the run), which cannot change."""
    from accelerate.state import AcceleratorState

    held = AcceleratorState._shared_state.get("_mixed_precision")
    if held not in (None, "no"):
        raise SureclError(f"accelerate: this process already set mixed_precision={held}, which cannot change; surecl runs "
                          "with mixed_precision='no' (model.dtype sets the precision): run it in a process of its own")
    return (os.environ.get("ACCELERATE_MIXED_PRECISION") or "no").lower()


def build_run(
    run, cfg: RunConfig, out_dir: Path, *, progress: bool = True, cache_dir: Path | None = None, plugins: list[Plugin] = (),
    log_with: list[str] = (), model=None, tokenizer=None, tasks: list[Task] | None = None,
) -> None:
    """Fill ``run`` (a :class:`~surecl.trainer.ContinualRun`) from ``cfg``; see the module docstring
    and :class:`~surecl.trainer.ContinualRun` for the arguments.

    The caller's own inputs are checked before anything changes them (the plugins' names, a model
    and tokenizer the caller built: :func:`~surecl.model.check_given_model`, its attention and
    dtype); a later failure gives that model and tokenizer back as they came
    (:class:`~surecl.model.GivenModel`), so a corrected retry starts from the same model. torch's
    generators: the build seeds them for the learner's draw; ``run.torch_streams`` keeps them as
    the build leaves them (:meth:`~surecl.trainer.ContinualRun.run` takes them up) and the
    caller's are back when the build ends, however it ends."""
    check_again(cfg)  # a config changed in Python since it was built
    run.cfg = cfg
    run.out_dir = Path(out_dir)
    run.progress = progress
    extra = {f"plugin:{p.name}": p for p in plugins}
    if len(extra) != len(plugins):
        raise SureclError(f"plugins: two plugins share a name in {[p.name for p in plugins]} (each is checkpointed under "
                          "plugin:<name>); give each its own name")
    if (model is None) != (tokenizer is None):
        raise SureclError("model and tokenizer: pass both (a model the caller built) or neither (model.name)")
    if model is not None:
        check_given_model(model, tokenizer)
        if cfg.model.attn_implementation != "auto":
            raise SureclError(f"model.attn_implementation={cfg.model.attn_implementation}: a model the caller built keeps the "
                              "attention it was built with; build it with attn_implementation=... instead, or leave this at auto")
        asked, given = DTYPES.get(cfg.model.dtype), weights_dtype(model)
        if asked is not None and given is not None and given != asked:
            raise SureclError(f"model.dtype={cfg.model.dtype}: a model the caller built keeps the dtype it was built in ({given}); "
                              f"convert it first (model.to(torch.{asked})), or leave this at auto")
    run.ran = False
    """Whether :meth:`~surecl.trainer.ContinualRun.run` took the run past its build (a checkpoint
    restored into it, or its loop started): a run object runs once."""
    _accelerator(run, cfg, log_with)
    caller = generators(run.device)
    given = GivenModel(model, tokenizer) if model is not None else None
    try:
        _build(run, cfg, cache_dir, plugins=extra, model=model, tokenizer=tokenizer, tasks=tasks)
        run.torch_streams = generators(run.device)
    except BaseException:
        if given is not None:
            given.restore()
        raise
    finally:
        set_generators(caller, run.device)


def _accelerator(run, cfg: RunConfig, log_with: list[str]) -> None:
    """The run's ``Accelerator``, its device, process count and rank, and its trackers."""
    # No buffer broadcast in DDP's forward: the base's buffers (rotary frequencies) never
    # change (full fine-tuning trains weights, not buffers), and a collective per forward
    # would deadlock the ranks, whose steps may run different numbers of forwards
    # (micro-batch slices and shared prefix passes are cut from each rank's own rows). The one collective of a step is
    # the gradient all-reduce of its last slice's backward.
    ddp = DistributedDataParallelKwargs(broadcast_buffers=False)
    trackers = run.trackers = check_trackers(tracker_names(log_with))
    asked = accelerate_mixed_precision()
    run.accelerator = Accelerator(
        cpu=not torch.cuda.is_available(), kwargs_handlers=[ddp], log_with=trackers or None, mixed_precision="no",
        project_config=ProjectConfiguration(project_dir=str(run.out_dir), logging_dir=str(run.out_dir / "tensorboard")),
    )
    run.device = run.accelerator.device
    if asked != "no":
        run.log(f"note: accelerate's mixed_precision={asked} is not used: model.dtype sets the precision (here "
                f"{cfg.model.dtype}; model.dtype=bf16 runs the base in bf16), and results.json records it")
    run.world, run.rank = run.accelerator.num_processes, run.accelerator.process_index
    if run.world > 1:
        release_at_exit()


def _build(run, cfg: RunConfig, cache_dir, *, plugins: dict[str, Plugin], model, tokenizer, tasks) -> None:
    """:func:`build_run` from the stream on (``plugins`` by their checkpoint keys)."""
    cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else None  # a str as out_dir may be
    if tasks is not None:
        tasks = caller_tasks(tasks, cfg)  # in-memory datasets read into tasks
    run.given_fingerprints = {t.name: t.fingerprint() for t in tasks} if tasks is not None else None
    """Each task passed from Python as it was passed (before checks and sampling)."""
    # the local main process first: it builds what a cold cache lacks (the embedded benchmark,
    # the tiny model, SmolLM2's dequantised weights) and the others then read it; transformers'
    # save_pretrained writes nothing on a process other than rank 0, so a folder another process
    # built would hold the tokenizer alone
    with run.accelerator.local_main_process_first():
        run.tasks = load_stream(cfg, cache_dir=cache_dir) if tasks is None else caller_stream(tasks, cfg)
    for warning in check_task_names(cfg, [t.name for t in run.tasks]):
        run.log(f"warning: {warning}")
    run.streams_seed = streams_seed(cfg, [t.name for t in run.tasks])
    run.rng = random.Random(f"batches:{run.streams_seed}")
    for t in run.tasks:
        for split, n in t.meta.get("dropped", {}).items():
            run.log(f"{t.name}: dropped {n} {split} rows whose label is not one of {t.labels} (data.invalid_labels=drop)")
    run.supplied_model, run.supplied_tasks = model is not None, tasks is not None
    if model is None:
        with run.accelerator.local_main_process_first():
            loaded = load_model(cfg.model, run.device, cache_dir or default_cache_dir())
    else:
        loaded = prepare_model(model, tokenizer, run.device)
    run.model_name_or_path = str(getattr(loaded.model.config, "_name_or_path", "") or "") if model is not None else cfg.model.name
    run.model_class = type(loaded.model).__name__
    run.base_fingerprint = base_fingerprint(loaded.model)  # checkpoints record it: a resume on another base is refused
    run.tokenizer, run.is_seq2seq, run.model_path = loaded.tokenizer, loaded.is_seq2seq, loaded.path
    run.base_dtype = loaded.dtype
    run.share_prefix = cfg.model.share_prefix and not run.is_seq2seq
    obstacle = shared_prefix_obstacle(loaded.model.config) if run.share_prefix else None
    if obstacle is not None:  # training, scoring and evaluation all read run.share_prefix
        run.share_prefix = False
        run.log(f"model.share_prefix: off for this model: {obstacle}, where a shared prefix puts each row's left padding "
                "between the prefix and the row, so scores would depend on the batch; each row runs whole")
    for warning in stream_warnings(cfg, run.tasks):
        run.log(f"warning: {warning}")
    if loaded.note:
        run.log(f"warning: {loaded.note}")
    if cfg.data.kind == "text" and run.is_seq2seq:
        raise SureclError(f"data.kind=text (continual pre-training) needs a causal LM; {cfg.model.name} is encoder-decoder")
    encoder = TaskEncoder(run.tokenizer, cfg.model.max_length, end_eos=run.is_seq2seq and cfg.model.encoder_eos, task_prefix=cfg.data.task_prefix,
                          template=cfg.data.template, text_start=cfg.data.text_start)
    for t in run.tasks:  # labels the tokenizer cannot tell apart stop here, before any training
        for warning in encoder.check_labels(t):
            if cfg.eval.mode == "generate":
                run.log(f"warning: {warning}")
    # Tokenised once per dataset; the hot loop only indexes these lists. The run reads them
    # through InputSets, which puts the plugins' input prefix (if any) before each prompt.
    run.plugins, run.left_out = None, ()
    run.train_sets = InputSets([encoder.encode(t, t.train) for t in run.tasks], run.input_prefix)
    run.test_sets = InputSets([encode_test(cfg, encoder, t, rows) for t, rows in zip(run.tasks, run.train_sets.encoded)], run.input_prefix)
    run.label_answers = [{lab: encoder.answer_ids(lab) for lab in t.labels} for t in run.tasks]
    run.general = load_general_probe(cfg.eval.general, cfg.eval.general_n, cache_dir)
    if run.general and run.is_seq2seq and any(t.kind == "text" for t in run.general.tasks):
        raise SureclError(f"eval.general={cfg.eval.general}: its text part is scored by perplexity, which needs a causal LM; "
                          f"{cfg.model.name} is encoder-decoder: give eval.general a probe without text.jsonl (its instruct.jsonl alone) "
                          "or none")
    run.general_sets = [encode_test(cfg, encoder, t, []) for t in run.general.tasks] if run.general else []
    check_context(run, loaded.model.config)
    for (name, split), (n_cut, n) in encoder.cut.items():  # the stream's tasks and the probe's
        run.log(f"task {name}: {n_cut} of {n} {split} rows have a target or text longer than model.max_length={cfg.model.max_length} "
                "tokens allow; their ends are cut (neither trained nor scored): raise model.max_length to keep them")
    for (name, split), (n_cut, n) in encoder.sentence_cut.items():
        alone = encoder.start_cut.get((name, split), (0, n))[0]  # conversations cut to their last turns: said next
        if n_cut > alone:
            run.log(f"task {name}: {n_cut - alone} of {n} {split} inputs are cut to fit model.max_length={cfg.model.max_length} "
                    "tokens (the model reads their start, or a conversation's opening, the template's start and the instruction, "
                    "and its last turns; instruction and answer are kept): raise model.max_length to keep them whole")
        if alone:
            run.log(f"warning: task {name}: {alone} of {n} {split} conversations are cut to their last turns to fit "
                    f"model.max_length={cfg.model.max_length} tokens: their opening (the template's start and the instruction) "
                    "would take over half the room, so the model reads them without it: raise model.max_length")
    for t, test, train in zip(run.tasks, run.test_sets.encoded, run.train_sets.encoded):
        _say_long_references(run, t, test, train)
    generation = [t.name for t in run.tasks if t.kind == "generate"]
    probing = any(t.kind == "generate" for t in run.general.tasks) if run.general else False
    run.stop_ids = encoder.stop_ids() if generation or probing else None
    # every token the rows and the stops hold within the model's embeddings (a token added to the
    # tokenizer alone): one line now, before the run folder is written, not an IndexError mid-run
    size = embedding_rows(loaded.model)
    check_read_ids(encoder, run.tasks + (run.general.tasks if run.general else []), size, loaded.path, run.stop_ids)
    check_row_ids([(f"the {split} rows of task {t.name}", rows) for split, sets in (("train", run.train_sets), ("test", run.test_sets))
                   for t, rows in zip(run.tasks, sets.encoded)]
                  + [(f"the rows of the general-ability probe's {t.name} part", rows)
                     for t, rows in zip(run.general.tasks if run.general else [], run.general_sets)], run.tokenizer, size, loaded.path)
    # Seeded right before the adapters are drawn, so a cold cache (which builds or converts
    # the base model first) gives the same LoRA init as a warm one.
    torch.manual_seed(run.streams_seed)
    run.adapters = DualLoRA(loaded.model, cfg.lora, cfg.dual, run.is_seq2seq)
    if run.rank > 0:
        # every process drew the same adapters; from here each draws dropout masks for its own
        # rows, from a stream of its own (the main process goes on as one process would)
        torch.manual_seed(task_seed(run.streams_seed, run.rank, 3))
    run.model = run.adapters.model
    run.method = method_class(cfg.method)(method_config(cfg))
    _registered_name(run.method, cfg.method)
    check_declarations(type(run.method), cfg.method)
    total = sum(len(s) for s in run.train_sets)
    policy_name = cfg.replay.policy if run.method.continual else "none"
    run.policy = build_policy(policy_class(policy_name), policy_options(cfg, policy_name), cfg.replay,
                              buffer_capacity(cfg.replay, total), run.streams_seed)
    _registered_name(run.policy, policy_name)
    if generation and (cfg.replay.balance == "label" or isinstance(run.policy.buffer, OnlineQuotaBuffer)):
        what = "replay.balance=label" if cfg.replay.balance == "label" else f"replay.policy={policy_name} (a quota per answer label)"
        raise SureclError(f"{what} needs labelled tasks; {', '.join(generation)} generate free text (no label set)")
    run.adapters.learn(run.method.trains)  # the learner as the method's declaration says, before its setup
    run.method.setup(run)
    run.train_step = TrainStep(TrainStep.config_from(cfg), trained_parameters(run.method, run.method.parameters(run), cfg.method))
    run.train_step.keep_weights = run.method.trains != "fast"  # the learner checkpoints the fast adapter itself
    run.trained_params = run.train_step.params
    run.model, run.train_step.optimizer = run.accelerator.prepare(run.model, run.train_step.optimizer)
    run.steplog = StepLog(StepLog.config_from(cfg))
    run.plugins = Plugins({
        "optimizer": run.train_step, "adapters": run.adapters, "method": run.method, "replay": run.policy,
        **plugins, "log": run.steplog, **({"tracking": Tracking()} if run.trackers else {}), "faults": FaultInjection(),
    })
    run.state = RunState(accuracy=[[None] * len(run.tasks) for _ in run.tasks])
    run.wall = None  # wall clock of the running part (ContinualRun.clock)
    run.cpu = None  # this process's CPU clock at the last ContinualRun.clock
    run.stage = None
    run.step_items = []
    run.step_new = 0
    run.eval_view = None
    run.predictions = {}
    run.eval_fast = cfg.dual.enabled and cfg.eval.fast and run.method.fast_eval
    if run.eval_fast:
        run.state.accuracy_fast = [[None] * len(run.tasks) for _ in run.tasks]
    if run.general is not None:
        run.state.general = [None] * len(run.tasks)
        if run.eval_fast:
            run.state.general_fast = [None] * len(run.tasks)
    run.stages = run.method.stages(len(run.tasks))
    first = run.stages[0].tasks
    run.adapters.beta = resolve_beta(cfg.dual, ema_units([len(run.train_sets[t]) for t in first], cfg, [run.tasks[t].name for t in first]))
    warn_slow_window(run)
    for warning in (stream_quota_warning(type(run.policy), run.policy.capacity, run.tasks), short_tasks_warning(run.tasks, cfg.data.n_train),
                    missing_tasks_warning(run.tasks, cfg.data.order), unnamed_tasks_warning(run.tasks)):
        if warning:
            run.log(f"warning: {warning}")


DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
"""``model.dtype``'s values, as torch names the dtypes (``auto`` aside)."""


def warn_slow_window(run) -> None:
    """Warn when the slow adapter's EMA window outlasts the first task (no bias correction)."""
    cfg = run.cfg
    if not cfg.dual.enabled or cfg.dual.bias_correction:
        return
    step_beta = beta_per_step(run.adapters.beta, cfg.dual, cfg.train.batch_size)
    window = 1.0 / (1.0 - step_beta) if step_beta < 1 else math.inf
    first = run.steps_in_stage(run.stages[0])
    if window > first:
        run.log(
            f"warning: the slow adapter averages over ~{window:.0f} steps but the first task has {first}; "
            "it will lag far behind the fast one early on (set dual.bias_correction=true or a smaller dual.beta)"
        )



def build_policy(cls: type, options, *args):
    """``cls(*args)`` (the replay section, the capacity, the seed) with ``options`` (the policy's
    own section, or None) set as ``self.options`` before its ``__init__`` runs, so ``__init__``
    may choose its buffer by an option; what ``type.__call__`` does otherwise."""
    policy = cls.__new__(cls, *args)
    if isinstance(policy, cls):
        policy.options = options
        policy.__init__(*args)
    return policy


def trained_parameters(method, params, name: str) -> list:
    """What the method's ``parameters(ctx)`` returned, as a list the optimizer takes (a param
    group's ``params`` listed too), refused in one line naming the method when the optimizer
    would train nothing: no tensors, something other than a tensor, or only tensors that do not
    require grad (backward would fail far from the method). A frozen tensor beside trained ones
    is ordinary (a method that freezes the embeddings in ``setup`` and keeps the default
    ``parameters``): it gets no gradient, and the optimizer leaves it as it is."""
    who = f"method plugin {name!r}: its parameters(ctx)"
    want = f"expected the tensors it trains (trains={method.trains!r}), at least one with requires_grad=True"
    if isinstance(params, (torch.Tensor, dict)) or not hasattr(params, "__iter__"):
        raise SureclError(f"{who} returned {type(params).__name__}; {want}, as a list (or a list of param groups)")
    params, tensors = list(params), []
    for k, item in enumerate(params):
        if isinstance(item, dict):
            group = item.get("params", ())
            group = [group] if isinstance(group, torch.Tensor) else list(group)
            params[k] = {**item, "params": group}
            tensors += group
        else:
            tensors.append(item)
    if not tensors:
        raise SureclError(f"{who} returned no parameters; {want}")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise SureclError(f"{who} returned a {type(t).__name__} as parameter {i}; {want}")
    if not any(t.requires_grad for t in tensors):
        raise SureclError(f"{who} returned {len(tensors)} parameter(s), all frozen (requires_grad=False), so nothing would "
                          f"train; {want} (unfreeze what it trains in setup)")
    return params


def _registered_name(plugin, name: str) -> None:
    """A registered class that names itself nowhere (it inherits ``Method``'s ``"base"`` or
    ``ReplayPolicy``'s ``"none"``) is named as it was registered, in its errors and warnings."""
    from surecl.methods.base import Method
    from surecl.replay.policies import ReplayPolicy

    for base in (Method, ReplayPolicy):
        if isinstance(plugin, base) and not any("name" in vars(c) for c in type(plugin).__mro__[: type(plugin).__mro__.index(base)]):
            plugin.name = name


def check_context(run, config) -> None:
    """A model's rows fit the positions it has (``n_positions`` / ``max_position_embeddings``; an
    encoder-decoder's ``max_position_embeddings`` alone: T5's positions are relative, and an
    older T5 config's ``n_positions`` bounds nothing; none known: nothing to check). A causal model: prompt + answer
    and one generated token past the answer, and prompt + the tokens evaluation generates
    (:func:`~surecl.data.encode.new_token_budget`), for the stream's train and test rows and the
    general probe's (a generation task's test reference is never read: :func:`_as_read`); under
    ``eval.mode=rank`` a classification task's test prompt and its longest label's answer, which
    ranking reads after every prompt. GPT-2's learned positions stop with an index error past
    1,024, a rotary model's answers past its trained length mean little. An encoder-decoder (BART: learned
    positions on each side): the prompt on the encoder side, and on the decoder side the answer,
    or the tokens evaluation generates, or what the surprise a replay policy scores has the
    decoder read (:func:`_decoder_read`: ``replay.scope=sequence`` prompt + answer,
    ``input`` the prompt).
    The method's longest input prefix (:meth:`~surecl.methods.Method.longest_prefix`: Progressive
    Prompts' soft prompts) goes before the stream's rows (an encoder-decoder's encoder input).
    ``model.max_length`` bounds the prompt, not the answer after it."""
    # an encoder-decoder's absolute positions are its max_position_embeddings (BART, Pegasus,
    # Marian); T5's are relative, though older T5 configs still carry n_positions=512
    context = model_positions(SimpleNamespace(max_position_embeddings=getattr(config, "max_position_embeddings", None))
                              if run.is_seq2seq else config)
    if context is None:
        return
    # The method's input prefix (Progressive Prompts: every task's soft prompt) goes before the
    # stream's rows, not the probe's: the rows as encoded do not hold it yet.
    method = method_class(run.cfg.method)
    prefix = method.longest_prefix(method_config(run.cfg), len(run.tasks))
    checked = [(f"task {t.name}", rows, 0, prefix, True) for t, rows in zip(run.tasks, run.train_sets.encoded)]
    checked += [(f"task {t.name}", _as_read(t, rows), new_token_budget(run.cfg, t, rows, answers, train), prefix, False)
                for t, rows, answers, train in zip(run.tasks, run.test_sets.encoded, run.label_answers, run.train_sets.encoded)]
    checked += [(f"the general-ability probe's {t.name} part", _as_read(t, rows), new_token_budget(run.cfg, t, rows, None), 0, False)
                for t, rows in zip(run.general.tasks, run.general_sets)] if run.general else []
    if run.is_seq2seq:
        _check_seq2seq_context(run, context, checked, method)
        return
    # ranking reads every label's answer after each test prompt (evaluate.option_logprobs): the
    # longest of them, which may be longer than the row's own answer, must fit too
    ranked = {f"task {t.name}": max((len(a) for a in answers.values()), default=0)
              for t, answers in zip(run.tasks, run.label_answers) if run.cfg.eval.mode == "rank" and t.kind == "classify" and answers}
    for where, rows, budget, before, train in checked:
        option = 0 if train else ranked.get(where, 0)
        longest = max((before + len(e.prompt) + max(len(e.answer) + 1, budget, option) for e in rows), default=0)
        if longest > context:
            raise SureclError(f"{where}: rows of up to {longest} tokens ("
                              + (f"method {method.name}'s {before} prefix tokens, " if before else "")
                              + "prompt, then the answer and one generated token, or the "
                              + (f"longest label's {option} answer tokens ranking reads" if option else f"{budget} tokens evaluation generates")
                              + f") do not fit the model's {context} positions; lower "
                              f"model.max_length (now {run.cfg.model.max_length}) by at least {longest - context}"
                              + (" or eval.max_new_tokens" if budget else "")
                              + (" or the method's prefix" + (" (prompts.length)" if method.name == "progressive_prompts" else "") if before else ""))


def _say_long_references(run, task, test: list, train: list) -> None:
    """Under ``eval.answer_budget=train`` a generation task's answers stop at its longest
    training target (plus one token), whatever the references: say how many test references
    are longer, which no answer can then match whole (``eval.max_new_tokens`` sets the budget)."""
    if task.kind != "generate" or run.cfg.eval.answer_budget != "train" or not train:
        return
    budget = new_token_budget(run.cfg, task, test, None, train)
    long = sum(len(e.answer) > budget for e in test)
    if long:
        run.log(f"task {task.name}: {long} of {len(test)} test references are longer than its answer budget of {budget} tokens "
                f"({'eval.max_new_tokens' if run.cfg.eval.max_new_tokens else 'its longest training target and one more'}"
                f"{'' if run.cfg.eval.max_new_tokens else f', at most eval.max_new_cap={run.cfg.eval.max_new_cap}'}), so no answer "
                "can match them whole: raise eval.max_new_tokens to generate more")


def _as_read(task, rows: list) -> list:
    """A task's test rows as evaluation reads them: a generation task's prompt alone (its
    reference is never read: the answer budget is generated after the prompt, and under
    ``eval.answer_budget=train`` the prompt is cut for that budget, not for the reference)."""
    import dataclasses

    return [dataclasses.replace(e, answer=[]) for e in rows] if task.kind == "generate" else rows


def _check_seq2seq_context(run, context: int, checked: list, method) -> None:
    """:func:`check_context` for an encoder-decoder whose positions are counted on each side
    (BART's learned positions: an index error past them). ``checked``: (where, rows, budget,
    prefix tokens, whether the rows are the stream's training rows, which a replay policy scores)."""
    cfg = run.cfg
    scoring = method.continual and cfg.replay.policy != "none" and policy_class(cfg.replay.policy).uses_scores
    scope = cfg.replay.scope if scoring else "label"
    eos = getattr(getattr(run, "tokenizer", None), "eos_token_id", None)
    for where, rows, budget, before, scored in checked:
        encoder = max((before + len(e.prompt) for e in rows), default=0)
        if encoder > context:
            raise SureclError(f"{where}: encoder inputs of up to {encoder} tokens ("
                              + (f"method {method.name}'s {before} prefix tokens, then the prompt" if before else "the prompt")
                              + f") do not fit the model's {context} positions; lower model.max_length (now {cfg.model.max_length}) "
                              f"by at least {encoder - context}" + (" or the method's prefix" if before else "")
                              + (" (prompts.length)" if before and method.name == "progressive_prompts" else ""))
        read = _decoder_read(scope, eos) if scored else (lambda e: 0)
        decoder = max((max(len(e.answer), budget, read(e)) for e in rows), default=0)
        if decoder > context:
            by_scope = scored and scope != "label"
            what = "the answer" + (f", or the {budget} tokens evaluation generates" if budget else "")
            if by_scope:
                what += f", or the {'prompt + answer' if scope == 'sequence' else 'prompt'} replay.scope={scope} scores"
            raise SureclError(f"{where}: the decoder reads up to {decoder} tokens ({what}), more than the model's {context} "
                              f"positions; lower model.max_length (now {cfg.model.max_length}) by at least {decoder - context}"
                              + (" or eval.max_new_tokens" if budget else "") + (" or use replay.scope=label" if by_scope else ""))


def _decoder_read(scope: str, eos: int | None):
    """The tokens an encoder-decoder's decoder reads when the surprise of a training row is
    scored at ``scope`` (:func:`~surecl.replay.surprise.score_examples`): the answer at
    ``label``; prompt + answer at ``sequence``; the prompt at ``input``."""
    from surecl.replay.surprise import as_full_sequence, as_input_reconstruction

    if scope == "sequence":
        return lambda e: len(as_full_sequence(e, eos).answer)
    if scope == "input":
        return lambda e: len(as_input_reconstruction(e).answer)
    return lambda e: len(e.answer)
