"""Typed run configuration: the single source for CLI overrides, YAML presets and validation.

A run is described by one :class:`RunConfig` tree of dataclasses. Presets are YAML files in
``surecl/presets`` holding a partial tree; ``key.sub=value`` overrides on the command line set
single leaves. Unknown keys and wrongly typed values are rejected with a one-line
:class:`~surecl.errors.SureclError` naming the key.

Why hand-written and not OmegaConf structured configs or jsonargparse (judged for issue 14):
the parsing here is about 130 lines (``_check_types``, ``_coerce``, ``_apply_mapping``,
``apply_overrides``) over plain dataclasses. ``OmegaConf.structured`` + ``from_dotlist`` would
replace perhaps 90 of them, but adds two dependencies (omegaconf, antlr4-python3-runtime),
turns every leaf into a ``DictConfig``/``ListConfig`` node the rest of the code would have to
convert back (``to_dict``, ``same_config``, ``dataclasses.asdict`` in results), interprets
``${...}`` in string values (task instructions, paths), and reports errors over several lines
(``full_key`` / ``object_type``) that would still need rewrapping into the one-line messages
the CLI promises. jsonargparse brings the same trade with a larger dependency and its own
CLI, where ``surecl`` keeps argparse. Neither removes enough to pay for itself here.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
import unicodedata
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

import surecl.registry as registry
from surecl.errors import SureclError
from surecl.options import Options, per_task_values  # noqa: F401  (per_task_values: re-exported)
from surecl.sections import (  # noqa: F401  (the core sections, re-exported)
    ALL_LINEAR,
    DataConfig,
    DualConfig,
    EvalConfig,
    HFTaskConfig,
    LoraConfig,
    ModelConfig,
    ReplayConfig,
    TrainConfig,
)


@dataclass
class RunConfig:
    """A whole continual run."""

    method: str = "sequential"
    """Training regime: ``sequential`` (continual), ``mtl`` (joint upper bound), ``per_task``,
    ``ewc``, ``seq_ft`` (full fine-tuning of the base), ``olora``, ``nlora``,
    ``progressive_prompts``, or a method added with ``surecl.register_method``."""
    preset: str = ""
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    dual: DualConfig = field(default_factory=DualConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log_every: int = 1
    options: dict[str, Options] = field(default_factory=dict, repr=False)
    """The option sections of the registered methods and policies (:func:`surecl.registry.sections`),
    by section name: ``olora``, ``nlora``, ``prompts``, ``ewc``, an outside method's. Each reads as
    an attribute (``cfg.olora.lambda_orth``) and as a top-level key of the tree (YAML, overrides,
    :meth:`to_dict`); a section not given takes its class's defaults."""

    def __post_init__(self) -> None:
        # Built in Python, a config is checked at once: each leaf's type, then ranges and
        # choices (validate). build_config starts from the (valid) defaults and validates again
        # after its presets and overrides.
        _fill_sections(self)
        _check_types(self, "")
        validate(self)

    def __getattr__(self, name: str) -> Any:
        options = self.__dict__.get("options")
        if options is not None and name in options:
            return options[name]
        if options is not None and name in registry.sections():  # registered after this config was built
            return _fill_sections(self)[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def to_dict(self) -> dict[str, Any]:
        """The tree as plain data: the core fields, then every option section at the top level."""
        out = {f.name: dataclasses.asdict(v) if dataclasses.is_dataclass(v := getattr(self, f.name)) else v for f in dataclasses.fields(self) if f.name != "options"}
        for name, section in self.options.items():
            out[name] = dataclasses.asdict(section)
        return out

    def to_yaml(self) -> str:
        """The whole tree as YAML that ``--config`` / :func:`build_config` reads back to an equal config."""
        head = SAVED_HEAD + " (presets and overrides applied); `surecl run --config <this file>` runs it again\n"
        tree = self.to_dict()
        text = yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)
        if yaml.safe_load(text) != tree:  # a character YAML reads as a line break (U+0085, U+2028) written raw: escaped instead
            text = yaml.safe_dump(tree, sort_keys=False, allow_unicode=False)
        return head + text


SAVED_HEAD = "# surecl run config, resolved"
"""How a run's ``config.yaml`` starts (:meth:`RunConfig.to_yaml`): a file that does is read as a
saved run's (:func:`_saved_run_sections`)."""


CORE_SECTIONS = registry.CORE_KEYS
"""The keys of the tree that surecl itself owns (:class:`RunConfig`'s fields); a registered section
may not take one (registration refuses it)."""


def _fill_sections(cfg: RunConfig) -> dict[str, Options]:
    """Give ``cfg`` a default instance of every registered section it lacks; refuse a given
    section no registered method or policy declares, or one of the wrong class."""
    known = registry.sections()
    for name, section in cfg.options.items():
        if name not in known:
            raise SureclError(f"{name}: no registered method or policy has options named {name!r} (is its package installed, or its module given with --import?)")
        if not isinstance(section, known[name][0]):
            raise SureclError(f"{name}: expected a {known[name][0].__name__}, got {section!r}")
    for name, (cls, readers) in known.items():
        if name in CORE_SECTIONS:
            raise SureclError(f"{name}: {', '.join(readers)} registered options under a name surecl's own config uses; register them under another section")
        cfg.options.setdefault(name, cls())
    return cfg.options


def _check_types(obj: Any, prefix: str) -> None:
    """Each leaf has its declared type (an int is a valid float); raise naming the first that has not."""
    if isinstance(obj, RunConfig):
        for name, section in obj.options.items():
            _check_types(section, name + ".")
    for name, typ in _field_types(type(obj)).items():
        if isinstance(obj, RunConfig) and name == "options":
            continue
        key, value = f"{prefix}{name}", getattr(obj, name)
        if dataclasses.is_dataclass(typ):
            if not isinstance(value, typ):
                raise SureclError(f"{key}: expected a {typ.__name__}, got {value!r}")
            _check_types(value, key + ".")
            continue
        entry = _entry_type(typ)
        if entry is not None:
            if not isinstance(value, list):
                raise SureclError(f"{key}: expected a list, got {value!r}")
            for i, item in enumerate(value):
                if not isinstance(item, entry):
                    raise SureclError(f"{key}[{i}]: expected a {entry.__name__} or a path, got {item!r}")
                _check_types(item, f"{key}[{i}].")
            continue
        if not _leaf_ok(value, typ):
            if typing.get_origin(typ) is list:
                inner = (typing.get_args(typ) or (str,))[0]
                want = f"a list of {'strings' if inner is str else inner.__name__ + 's'}"
            elif typing.get_origin(typ) in (typing.Union, types.UnionType):
                want = _type_words(typing.get_args(typ))
            else:
                want = f"a {typ.__name__}"
            raise SureclError(f"{key}: expected {want}, got {value!r}")


CHOICES: dict[str, tuple[str, ...] | None] = {
    "model.dtype": ("auto", "bf16", "fp32"),
    "model.attn_implementation": ("auto", "sdpa", "eager"),
    "replay.policy": None,  # the registered replay policies (surecl.registry)
    "replay.score_time": ("before", "after"),
    "replay.insert_time": ("before", "after"),
    "replay.reduction": ("mean", "sum"),
    "replay.scope": ("sequence", "label", "input"),
    "replay.balance": ("none", "label"),
    "replay.loss": ("joint", "pair", "example"),
    "dual.unit": ("step", "example"),
    "train.scheduler": ("constant", "constant_with_warmup", "linear", "cosine"),
    "eval.mode": ("generate", "rank", "perplexity"),
    "data.kind": ("classify", "text", "generate"),
    "data.template": ("auto", "plain"),
    "data.invalid_labels": ("error", "drop"),
    "data.train_sampling": ("balanced", "random"),
    "data.draw": ("shared", "order", "run"),
    "data.test_draw": ("after_train", "own"),
    "data.test_sampling": ("balanced", "random"),
    "train.batching": ("bucketed", "uniform"),
    "eval.matrix": ("full", "fp_ap"),
    "eval.references": ("rows", "max"),
    "eval.answer_budget": ("train", "references"),
}
"""Allowed values of the core string options; a registered section lists its own
(:attr:`surecl.options.Options.choices`; :func:`choices` gives them all)."""


def choices() -> dict[str, tuple[str, ...]]:
    """Every string option's allowed values: the core's, the registered policies', and each
    registered section's (``olora.orth_norm``, ...)."""
    out = {key: allowed or tuple(registry.policy_names()) for key, allowed in CHOICES.items()}
    for name, (cls, _) in registry.sections().items():
        out.update({f"{name}.{key}": allowed for key, allowed in cls.choices.items()})
    return out



RAW_STRING_KEYS = ("replay.ratio", "preset", "data.text_start")
"""Keys whose command-line value is taken as written, not parsed as YAML (a sweep's row name,
``preset``, may hold a grid value with `` #`` that YAML would read as a comment; a token such as
``[SEP]`` or ``yes`` is a token, not a list or a boolean)."""


def replay_ratio(text: str) -> tuple[int, int]:
    """``replay.ratio`` ``"a:b"`` as (a, b): a replayed examples per b new ones (integers, a >= 1, b >= 1).
    A bare number is malformed like any other value (an unquoted a:b in a YAML file keeps its text)."""
    parts = str(text).split(":")
    try:
        a, b = (int(p.strip()) for p in parts)
    except ValueError:
        a = b = 0
    if len(parts) != 2 or a < 1 or b < 1 or a > 1000 or b > 1000:
        raise SureclError(f"replay.ratio: {str(text)[:40]!r} must be 'a:b' with whole numbers 1..1000 (replayed:new, e.g. 1:2; empty = replay.batch_size every replay.every steps)")
    return a, b


MAX_INT = 10**9
"""The largest whole number any option takes (steps, sizes, counts, seeds); a decimal number
(an EWC strength of 1e10) is bound only to be finite."""


def _check_finite(tree: Any, key: str) -> None:
    """Every number of the config is finite and every whole number at most :data:`MAX_INT`
    (``train.grad_clip=inf`` or ``data.n_train=1e30`` stop here, before any work)."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            _check_finite(v, f"{key}.{k}" if key else str(k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            _check_finite(v, f"{key}[{i}]")
    elif isinstance(tree, bool):
        return
    elif isinstance(tree, float) and not math.isfinite(tree):
        raise SureclError(f"{key}: {tree!r} must be a finite number")
    elif isinstance(tree, int) and abs(tree) > MAX_INT:
        raise SureclError(f"{key}: {tree:g} is out of range (at most {MAX_INT:g})")


def check_again(cfg: RunConfig) -> RunConfig:
    """The checks a config had when it was built, again: a config changed in Python after
    :func:`build_config` (``cfg.dual.beta = 1.5``) is refused in one line before a run starts,
    as it would be when its saved ``config.yaml`` is run again."""
    _check_types(cfg, "")
    return validate(cfg)


def validate(cfg: RunConfig) -> RunConfig:
    """Check ranges and choices; raise a one-line SureclError naming the key. ``method`` and
    ``replay.policy`` are checked against the registries (:mod:`surecl.registry`)."""
    if cfg.method not in registry.method_names():
        raise SureclError(f"method: unknown method {cfg.method!r} (choose from {', '.join(sorted(registry.method_names()))})")
    for key, allowed in CHOICES.items():
        allowed = allowed or tuple(registry.policy_names())
        value = get_key(cfg, key)
        if value not in allowed:
            raise SureclError(f"{key}: {value!r} is not one of {', '.join(allowed)}")
    checks = [
        ("replay.buffer_size", cfg.replay.buffer_size >= 0 and math.isfinite(cfg.replay.buffer_size), "must be >= 0"),
        ("replay.every", cfg.replay.every >= 1, "must be >= 1"),
        ("replay.buffer_fraction", 0 <= cfg.replay.buffer_fraction <= 1, "must be in [0, 1] (0 = use replay.buffer_size)"),
        ("replay.batch_size", cfg.replay.batch_size >= 1, "must be >= 1"),
        ("dual.beta", _beta_ok(cfg.dual.beta), "must be a number in (0, 1) or auto"),
        ("dual.window_tasks", cfg.dual.window_tasks >= 0 and math.isfinite(cfg.dual.window_tasks), "must be >= 0"),
        ("dual.window_tasks", cfg.dual.beta != "auto" or cfg.dual.window_tasks > 0, "must be > 0 with dual.beta=auto"),
        ("train.epochs", 1 <= cfg.train.epochs <= 1000, "must be a whole number of epochs from 1 to 1000"),
        ("train.batch_size", cfg.train.batch_size >= 1, "must be >= 1"),
        ("train.lr", cfg.train.lr > 0 and math.isfinite(cfg.train.lr), "must be > 0"),
        ("train.grad_clip", cfg.train.grad_clip >= 0, "must be >= 0"),
        ("train.weight_decay", cfg.train.weight_decay >= 0, "must be >= 0"),
        ("train.micro_batch_tokens", cfg.train.micro_batch_tokens >= 0, "must be >= 0 (0 = no slicing)"),
        ("train.max_steps_per_task", cfg.train.max_steps_per_task >= 0, "must be >= 0"),
        ("train.warmup_steps", cfg.train.warmup_steps >= 0, "must be >= 0"),
        ("train.checkpoint_every", cfg.train.checkpoint_every >= 0, "must be >= 0"),
        ("train.keep_checkpoints", cfg.train.keep_checkpoints >= 1, "must be >= 1"),
        ("data.n_train", cfg.data.n_train >= 0, "must be >= 0"),
        ("data.n_test", cfg.data.n_test >= 0, "must be >= 0"),
        ("lora.r", cfg.lora.r >= 1, "must be >= 1"),
        ("lora.alpha", cfg.lora.alpha > 0, "must be > 0"),
        ("lora.dropout", 0.0 <= cfg.lora.dropout < 1.0, "must be in [0, 1)"),
        ("lora.target_modules", len(cfg.lora.target_modules) > 0, "must name at least one module"),
        ("lora.target_modules", len(cfg.lora.target_modules) == 1 or ALL_LINEAR not in [str(t).lower() for t in cfg.lora.target_modules],
         f"mixes {ALL_LINEAR} (every linear layer but the output head) with names: give {ALL_LINEAR} alone or the names alone"),
        ("model.max_length", cfg.model.max_length >= 8, "must be >= 8"),
        ("eval.batch_size", cfg.eval.batch_size >= 1, "must be >= 1"),
        ("eval.max_new_tokens", cfg.eval.max_new_tokens >= 0, "must be >= 0"),
        ("eval.max_new_cap", cfg.eval.max_new_cap >= 1, "must be >= 1"),
        ("eval.general_n", cfg.eval.general_n >= 0, "must be >= 0 (0 = every row)"),
        ("eval.general", bool(cfg.eval.general.strip()), "must be none, default or a path"),
        ("model.name", bool(cfg.model.name.strip()), "is empty; give smollm2-135m, tiny, a model folder or a hub id (an unset shell "
         "variable gives an empty value)"),
        ("data.benchmark", bool(cfg.data.benchmark.strip()), "is empty; give embedded, instruct, tiny, none or a CL_Benchmark folder"),
        ("data.jsonl", all(isinstance(p, str) and p.strip() for p in cfg.data.jsonl), "holds an empty path; give each task file's path"),
        ("data.text_start", bool(cfg.data.text_start.strip()), "is empty; give auto, bos, eos or one token of the tokenizer's vocabulary"),
        ("log_every", cfg.log_every >= 1, "must be >= 1"),
    ]
    for key, ok, why in checks:
        if not ok:
            raise SureclError(f"{key}: {get_key(cfg, key)!r} {why}")
    _check_finite(cfg.to_dict(), "")
    for name, section in _fill_sections(cfg).items():
        section.check(name)  # each registered section's choices, ranges and combinations
    if cfg.replay.ratio:
        replay_ratio(cfg.replay.ratio)  # raises on a malformed ratio
    for name, (epochs,) in per_task_values(cfg.train.epochs_per_task, "train.epochs_per_task", 1).items():
        if epochs < 1 or epochs != int(epochs) or epochs > 1000:
            raise SureclError(f"train.epochs_per_task: {name}:{epochs:g} must be a whole number of epochs from 1 to 1000")
    if cfg.replay.buffer_size >= 1 and cfg.replay.buffer_size != int(cfg.replay.buffer_size):
        raise SureclError(f"replay.buffer_size: {cfg.replay.buffer_size!r} must be a fraction below 1 or a whole count")
    if isinstance(cfg.replay.buffer_size, float) and cfg.replay.buffer_size >= 1:  # set from Python: 1.0 meant one example
        raise SureclError(f"replay.buffer_size: {cfg.replay.buffer_size!r} is ambiguous (a count or a fraction?); give a count "
                          f"as an int ({int(cfg.replay.buffer_size)}) or a fraction as replay.buffer_fraction (1.0 = a capacity of every example, of which surprise or random keep floor(S/d) per task)")
    for i, entry in enumerate(cfg.data.hf):
        key = f"data.hf[{i}]"
        if not entry.path.strip():
            raise SureclError(f"{key}.path: empty; give a dataset folder, a data file or a hub id")
        if not (0.0 <= entry.test_fraction < 1.0):
            raise SureclError(f"{key}.test_fraction: {entry.test_fraction!r} must be in [0, 1) (0 = read {key}.test_split)")
    cfg.data.tasks = [unicodedata.normalize("NFC", n) if isinstance(n, str) else n for n in cfg.data.tasks]  # as task names are read
    for name in cfg.data.tasks:
        if "/" in name or "\\" in name or name.startswith(".") or not name:
            raise SureclError(f"data.tasks: task name {name!r} must not contain path separators or start with '.'")
    if cfg.replay.score_time == "after" and cfg.replay.insert_time == "before":
        raise SureclError("replay.insert_time: 'before' needs replay.score_time=before (scores do not exist yet)")
    policy = registry.policy_class(cfg.replay.policy)
    if policy.needs_step_scores and cfg.replay.scope != "label":
        raise SureclError(f"replay.scope: {cfg.replay.policy} scores from the training loss, which is on the answer tokens; set replay.scope=label")
    if (cfg.data.kind == "text") != (cfg.eval.mode == "perplexity"):
        raise SureclError(
            f"eval.mode: {cfg.eval.mode!r} does not fit data.kind={cfg.data.kind!r}; text streams are "
            "evaluated by perplexity and only they are (use --config cpt, or set both)"
        )
    if cfg.replay.balance != "none" and not policy.per_task_quota:
        raise SureclError(f"replay.balance: {cfg.replay.balance!r} needs a per-task quota policy (surprise, random), not {cfg.replay.policy}")
    if cfg.replay.balance == "label" and cfg.data.kind in ("text", "generate"):
        raise SureclError(f"replay.balance: 'label' needs labelled tasks; a {cfg.data.kind} stream (data.kind={cfg.data.kind}) has none")
    if cfg.replay.aging and cfg.replay.policy != "none" and not policy.uses_scores:
        raise SureclError(f"replay.aging: policy {cfg.replay.policy} keeps no scores to age; use policy=surprise")
    if cfg.replay.aging and cfg.replay.policy != "none" and not _ages(policy):
        raise SureclError(f"replay.aging: policy {cfg.replay.policy} ranks by scores but does not re-score replayed entries "
                          "(it overrides no age() and after_step(); surecl's surprise policies do)")
    method = registry.method_class(cfg.method)
    method.validate_config(cfg)  # combinations the method cannot run
    if cfg.dual.enabled and method.trains != "fast":  # the built-ins say why in their own words first
        raise SureclError(f"dual.enabled: method {cfg.method} trains {method.trains!r} (not the fast LoRA adapter), so the dual "
                          "learner's slow adapter would average an adapter nothing trains; set dual.enabled=false")
    return cfg


RANK_ON_GENERATION = ("eval.mode=rank on generation tasks: free-text answers have no options to rank, so they are generated "
                      "and scored in their metric whatever eval.mode says (rank applies to classification tasks only)")
"""The warning of a run whose stream holds generation tasks under ``eval.mode=rank`` (from its
config, :func:`config_warnings`, or from the tasks loaded: ``data.jsonl`` headers, tasks from Python)."""


_SHADOWABLE = tuple(ReplayConfig(buffer_fraction=0.5, ratio="1:2").unread())
"""The replay keys another key may leave unread (:meth:`ReplayConfig.unread`)."""

_QUIET_WHEN_PRESET = (*_SHADOWABLE, "replay.policy", "method")
"""The keys whose warning (:func:`config_warnings`) only a user's setting earns: a preset's or a
saved config.yaml's value says nothing (``_preset_keys``)."""


def config_warnings(cfg: RunConfig) -> list[str]:
    """What a valid config runs, but not as it may be meant: ``eval.ahead`` without
    ``eval.before`` evaluates the cells above the diagonal (results.json's matrix, report.md,
    the heatmap) while forward transfer, which needs the before-training row as well, stays
    null; a replay key set off its default that another replaces (``ReplayConfig.unread``),
    where the user set it: on the command line or in their own YAML file, not where only
    surecl's presets did (``tiny`` sets ``replay.every``, which ``tiny,paper-t5``'s ratio
    replaces by design) or a run's saved config.yaml restates them; a replay policy under a
    method that is not ``continual`` (MTL: the run replays nothing, yet config.yaml and
    results.json record the policy), unless presets alone set both the policy and the method.
    The run logs each as a warning before it starts, and the dry run prints it."""
    warnings = []
    defaults = type(cfg.replay)()
    quiet = cfg.__dict__.get("_preset_keys", frozenset())
    for key, instead in cfg.replay.unread().items():
        if key in quiet:
            continue
        value = getattr(cfg.replay, key.split(".", 1)[1])
        if value != getattr(defaults, key.split(".", 1)[1]):
            warnings.append(f"{key}={value} is not read: {instead} (set only one of the two)")
    if cfg.replay.policy != "none" and not {"replay.policy", "method"} <= quiet and not is_continual(cfg.method):
        warnings.append(f"replay.policy={cfg.replay.policy} is not read: method {cfg.method} is not continual (every task in one "
                        "stage) and replays nothing, though config.yaml and results.json record the policy; set replay.policy=none")
    if cfg.eval.mode == "rank" and (cfg.data.kind == "generate" or cfg.data.benchmark == "instruct"):
        warnings.append(RANK_ON_GENERATION)
    if cfg.eval.ahead and not cfg.eval.before:
        warnings.append("eval.ahead=true without eval.before: the cells above the diagonal are evaluated, but forward transfer "
                        "(fwt) also needs the before-training row and stays null; set eval.before=true for it")
    return warnings


def is_continual(method: str) -> bool:
    """Whether ``method`` trains a stream (its ``continual``): a method that is not (MTL) runs
    without replay whatever ``replay.*`` says (:func:`surecl.run_setup.build_run`); the sweep's
    grid check reads it too."""
    return bool(getattr(registry.method_class(method), "continual", True))


def stream_warnings(cfg: RunConfig, tasks) -> list[str]:
    """:func:`config_warnings`, and those the loaded ``tasks`` show: generation tasks the config
    does not declare (``data.jsonl`` headers, tasks from Python) under ``eval.mode=rank``. The run
    logs them and the dry run prints them."""
    warnings = config_warnings(cfg)
    if cfg.eval.mode == "rank" and any(t.kind == "generate" for t in tasks) and RANK_ON_GENERATION not in warnings:
        warnings.append(RANK_ON_GENERATION)
    return warnings


def _ages(policy: type) -> bool:
    """Whether a replay policy re-scores replayed entries: it overrides ``ReplayPolicy.age`` and
    its ``after_step`` (which calls it), as the built-in surprise policies do."""
    from surecl.replay.policies import ReplayPolicy

    return all(getattr(policy, name, None) is not getattr(ReplayPolicy, name) for name in ("age", "after_step"))


# ----------------------------------------------------------------------------------------
# generic tree handling


def _type_words(types_: Any) -> str:
    """``(float, str)`` -> ``"a float or a str"`` (the members of a union, for an error)."""
    return " or ".join("none (null)" if t is type(None) else f"a {t.__name__}" for t in types_)


def _beta_ok(beta: float | str) -> bool:
    if isinstance(beta, str):
        return beta == "auto"
    return 0.0 < beta < 1.0


def _leaf_ok(value: Any, typ: Any) -> bool:
    """Whether ``value`` has the declared leaf type ``typ`` (an int is a valid float, a bool no number)."""
    origin = typing.get_origin(typ)
    if origin is list:
        inner = (typing.get_args(typ) or (str,))[0]
        return isinstance(value, list) and all(_leaf_ok(v, inner) for v in value)
    if origin in (typing.Union, types.UnionType):
        return any(_leaf_ok(value, member) for member in typing.get_args(typ))
    if typ is type(None):
        return value is None
    if typ is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, typ)


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _entry_type(typ: Any) -> type | None:
    """The dataclass of a ``list[SomeConfig]`` field (``data.hf``), else None."""
    if typing.get_origin(typ) is list:
        (inner,) = typing.get_args(typ)[:1]
        if dataclasses.is_dataclass(inner):
            return inner
    return None


def _coerce_entries(value: Any, entry: type, key: str, source: str) -> list[Any]:
    """A list of ``entry`` dataclasses from YAML/CLI: each item a mapping of its fields or a
    string, which sets its first field (a path); a string alone is a comma-separated list."""
    if isinstance(value, str):
        value = [v for v in (s.strip() for s in value.split(",")) if v]
    if not isinstance(value, (list, tuple)):
        raise SureclError(f"{key}: expected a list, got {value!r}")
    first = dataclasses.fields(entry)[0].name
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            item = {first: item}
        if not isinstance(item, dict):
            raise SureclError(f"{source}: {key}[{i}] must be a {first} or a mapping of {', '.join(f.name for f in dataclasses.fields(entry))}")
        obj = entry()
        _apply_mapping(obj, item, f"{key}[{i}].", source)
        out.append(obj)
    return out


def get_key(cfg: Any, dotted: str) -> Any:
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _coerce(value: Any, typ: Any, key: str) -> Any:
    """Convert a YAML/CLI value to the declared type, or raise naming the key."""
    origin = typing.get_origin(typ)
    if origin in (list, tuple):
        (inner,) = typing.get_args(typ)[:1]
        if isinstance(value, str):
            value = [v for v in (s.strip() for s in value.split(",")) if v]
        if not isinstance(value, (list, tuple)):
            raise SureclError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, inner, key) for v in value]
    if origin in (typing.Union, types.UnionType):
        # the first member the value converts to (``float | str``: a number, else a word); None
        # (YAML's null, ~ or an empty value) where the union holds None
        if type(None) in typing.get_args(typ) and (value is None or (isinstance(value, str) and value.strip() in ("null", "~", ""))):
            return None
        members = [t for t in typing.get_args(typ) if t is not type(None)]
        if not (isinstance(value, bool) and bool not in members):
            for member in members:
                try:
                    return _coerce(value, member, key)
                except SureclError:
                    continue
        raise SureclError(f"{key}: expected {_type_words(members)}, got {value!r}")
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise SureclError(f"{key}: expected true or false, got {value!r}")
    if typ is int:
        if isinstance(value, bool):
            raise SureclError(f"{key}: expected an integer, got {value!r}")
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise SureclError(f"{key}: expected an integer, got {value!r}") from None
        if not f.is_integer():
            raise SureclError(f"{key}: expected an integer, got {value!r}")
        return int(f)
    if typ is float:
        if isinstance(value, bool):
            raise SureclError(f"{key}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise SureclError(f"{key}: expected a number, got {value!r}") from None
    if typ is str:
        if isinstance(value, (dict, list)):  # YAML reads [SEP] unquoted as a list
            raise SureclError(f"{key}: expected a string, got {value!r} (YAML reads [...] and {{...}} unquoted as a list or "
                              "a mapping): quote it, e.g. '[SEP]'")
        if isinstance(value, bool):  # YAML 1.1 reads yes/no/on/off/true/false unquoted as booleans: "no" would become "False"
            raise SureclError(f"{key}: expected a string, got the boolean {value!r} (YAML reads yes, no, on, off, true and false "
                              "as booleans): quote it, e.g. \"no\"")
        if value is None:  # YAML reads a key with nothing after it, null and ~ as no value: "None" would become the text
            raise SureclError(f"{key}: expected a string, got no value (YAML reads an empty value, null and ~ as none): give a "
                              "value, or remove the key for its default")
        return written(value)  # 010 is the label "010", not "8"
    raise SureclError(f"{key}: unsupported type {typ}")


RENAMED = {("train", "ewc_lambda"): ("ewc", "lam"), ("train", "ewc_samples"): ("ewc", "samples")}
"""Keys that moved to a method's own section, read under their old names (configs and results
written before the move, users' presets): ``train.ewc_lambda`` is ``ewc.lam``."""


def _renamed(mapping: dict[str, Any]) -> dict[str, Any]:
    """``mapping`` (a whole tree) with the :data:`RENAMED` keys moved to their new place."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in mapping.items()}
    for (old_section, old_key), (new_section, new_key) in RENAMED.items():
        if isinstance(out.get(old_section), dict) and old_key in out[old_section]:
            value = out[old_section].pop(old_key)
            target = out.setdefault(new_section, {})
            if isinstance(target, dict):
                target.setdefault(new_key, value)
    return out


def _apply_mapping(obj: Any, mapping: dict[str, Any], prefix: str, source: str) -> None:
    types_ = _field_types(type(obj))
    if isinstance(obj, RunConfig):
        mapping = _renamed(mapping)
        types_ = {k: v for k, v in types_.items() if k != "options"}
    for name, value in mapping.items():
        key = f"{prefix}{name}"
        if isinstance(obj, RunConfig) and name not in types_ and name in _fill_sections(obj):
            if not isinstance(value, dict):
                raise SureclError(f"{source}: {key} must be a mapping")
            _apply_mapping(obj.options[name], value, key + ".", source)
            continue
        if isinstance(obj, RunConfig) and name not in types_ and (name in registry.method_names() or name in registry.policy_names()):
            inner = next(iter(value), "") if isinstance(value, dict) and value else ""
            raise SureclError(f"{source}: {key}{'.' + str(inner) if inner else ''}: {name} takes no options of its own")
        if name not in types_:
            known = ", ".join(list(types_) + (list(obj.options) if isinstance(obj, RunConfig) else []))
            hint = " (an outside method's options need its package installed, or --import of its module)" if isinstance(obj, RunConfig) else ""
            raise SureclError(f"{source}: unknown config key {key!r} (known here: {known}){hint}")
        typ = types_[name]
        if dataclasses.is_dataclass(typ):
            if not isinstance(value, dict):
                raise SureclError(f"{source}: {key} must be a mapping")
            _apply_mapping(getattr(obj, name), value, key + ".", source)
        elif _entry_type(typ) is not None:
            setattr(obj, name, _coerce_entries(value, _entry_type(typ), key, source))
        elif key == "replay.buffer_size":
            setattr(obj, name, _buffer_size(value, source))
        else:
            setattr(obj, name, _coerce(value, typ, key))


def _buffer_size(value: Any, source: str) -> float | int:
    """``replay.buffer_size``: a whole count stays an int (so a saved config writes it without a
    decimal point); a number with a decimal point at or above 1 is refused where a user wrote
    it (``1.0`` once silently meant one example). Configs saved before this check wrote counts
    as ``300.0``, which a saved config still reads as the count."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    number = _coerce(value, float, "replay.buffer_size")
    written_float = isinstance(value, float) or (isinstance(value, str) and "." in value)
    if number >= 1 and written_float and source != "saved config":
        raise SureclError(
            f"replay.buffer_size: {str(value)[:20]} is ambiguous (a count or a fraction?); write a count without a decimal "
            f"point (e.g. {int(number) if number.is_integer() else 300}) or a fraction as replay.buffer_fraction (e.g. 1.0 = a capacity of every example, of which surprise or random keep floor(S/d) per task)"
        )
    return int(number) if number >= 1 and number.is_integer() else number


def apply_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply ``key.sub=value`` strings (YAML-parsed values) to ``cfg`` in place."""
    for item in overrides:
        if "=" not in item:
            raise SureclError(f"override {item!r} must look like key.sub=value")
        dotted, raw = item.split("=", 1)
        dotted = dotted.strip()
        if dotted == "preset":  # a row name as written (a grid value's quote or `` #`` included)
            value = raw.strip()
        elif dotted in RAW_STRING_KEYS:  # YAML 1.1 reads an unquoted 1:2 as the base-60 number 62
            value = raw.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":  # one pair of quotes around it, no more
                value = value[1:-1]
        else:
            try:
                value = safe_yaml(raw, f"override {dotted}") if raw.strip() else ""
            except (yaml.YAMLError, RecursionError):
                value = raw
            if value is None:
                value = raw
        nested: dict[str, Any] = {}
        cursor = nested
        parts = dotted.split(".")
        for part in parts[:-1]:
            cursor = cursor.setdefault(part, {})
        cursor[parts[-1]] = value
        _apply_mapping(cfg, nested, "", "override")
    return cfg


def preset_names() -> list[str]:
    folder = resources.files("surecl") / "presets"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


YAML_NODES = 100_000
"""The most nodes a YAML document may expand to, aliases counted as often as they are used: a
config or plan is a few hundred; an alias bomb (a few lines expanding to billions) stops at once."""


class _WrittenInt(int):
    """An unquoted YAML integer whose text is not its decimal form (``010`` is 8, ``0x1F`` 31,
    ``1_000`` 1000): where a string is declared, the text as written is meant (a label ``010``)."""

    text: str


class _WrittenFloat(float):
    """An unquoted YAML float whose text is not its Python form (``1.50`` is 1.5): as :class:`_WrittenInt`."""

    text: str


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` keeping the text of a number written in a form its value does not print
    back (:class:`_WrittenInt`, :class:`_WrittenFloat`); every other value is as safe_load builds it."""


def _written(kind: type, construct):
    def build(loader: yaml.SafeLoader, node: yaml.ScalarNode):
        value = construct(loader, node)
        if isinstance(value, bool) or str(value) == node.value or not math.isfinite(value):
            return value
        out = kind(value)
        out.text = node.value
        return out
    return build


_Loader.add_constructor("tag:yaml.org,2002:int", _written(_WrittenInt, yaml.SafeLoader.construct_yaml_int))
_Loader.add_constructor("tag:yaml.org,2002:float", _written(_WrittenFloat, yaml.SafeLoader.construct_yaml_float))
yaml.SafeDumper.add_representer(_WrittenInt, yaml.SafeDumper.represent_int)
yaml.SafeDumper.add_representer(_WrittenFloat, yaml.SafeDumper.represent_float)


def written(value: Any) -> str:
    """``str(value)``, or a YAML number's text as written where it differs (``010``, ``1:2``)."""
    return value.text if isinstance(value, (_WrittenInt, _WrittenFloat)) else str(value)


_MERGE = "tag:yaml.org,2002:merge"


def _check_repeated_keys(loader: _Loader, root: yaml.Node, source: str) -> None:
    """One line for a key given twice in one mapping, naming it, its path and both lines: YAML
    keeps the last silently (a second ``train:`` block drops the first's keys, a second
    ``seeds:`` the plan's first seeds). Keys are compared as YAML reads them (``1`` and ``01``
    are one key). A merge key (``<<: *anchor``) and a merged key the mapping sets again are
    YAML's own overriding, and stay. Walks each node once (an alias is its anchor's node)."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        children: list[tuple[yaml.Node, str]] = []
        if isinstance(node, yaml.SequenceNode):
            children = [(v, f"{path}[{i}]") for i, v in enumerate(node.value)]
        first: dict[Any, yaml.Node] = {}
        for k, v in node.value if isinstance(node, yaml.MappingNode) else []:
            if k.tag == _MERGE:  # folded in by the loader: its keys may be set again here
                children.append((v, path))
                continue
            name = k.value if isinstance(k, yaml.ScalarNode) else "?"
            children.append((v, f"{path}.{name}" if path else name))
            if not isinstance(k, yaml.ScalarNode):
                continue  # a list or mapping as a key: the loader refuses it
            try:
                earlier = first.setdefault(loader.construct_object(k), k)
            except TypeError:  # unhashable: the loader says so
                continue
            if earlier is not k:
                a, b = earlier.start_mark.line + 1, k.start_mark.line + 1
                where = f"in {path}" if path else "at the top level"
                raise SureclError(f"{source}: key {name!r} is given twice {where} ({f'lines {a} and {b}' if a != b else f'line {a}, twice'}); "
                                  "YAML would keep the second alone: write it once")
        stack.extend(reversed(children))  # in the document's order: an anchor is named where it is written


def safe_yaml(text: str, source: str) -> Any:
    """``yaml.safe_load(text)``, refusing (one line naming ``source``) a document whose aliases
    expand beyond :data:`YAML_NODES` nodes, before anything is built from it. A number written
    in a form its value does not print back (``010``, ``0x1F``, ``1.50``) keeps its text, which a
    key declared as a string reads (the number is the same for every other use). A key given
    twice in one mapping is refused (:func:`_check_repeated_keys`)."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        sizes: dict[int, int] = {}

        def size(n) -> int:  # expanded size; an alias is the same node object, counted where used
            key = id(n)
            if key in sizes:
                if sizes[key] < 0:
                    raise SureclError(f"{source}: a YAML alias refers to itself; write the value out")
                return sizes[key]
            sizes[key] = -1
            if isinstance(n, yaml.MappingNode):
                total = 1 + sum(size(k) + size(v) for k, v in n.value)
            elif isinstance(n, yaml.SequenceNode):
                total = 1 + sum(size(v) for v in n.value)
            else:
                total = 1
            sizes[key] = total = min(total, YAML_NODES + 1)
            return total

        if size(node) > YAML_NODES:
            raise SureclError(f"{source}: YAML aliases expand to more than {YAML_NODES} values; write the values out")
        _check_repeated_keys(loader, node, source)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_yaml(path_or_preset: str) -> tuple[dict[str, Any], str]:
    """Read a preset by name or a YAML file by path; return its mapping and a display name."""
    path = Path(path_or_preset)
    if path.suffix in (".yaml", ".yml") or path.is_file():  # a folder named like a preset is not a config file
        if not path.exists():
            raise SureclError(f"config file {path} does not exist")
        if not path.is_file():
            raise SureclError(f"config file {path} is not a regular file")
        text_source = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise SureclError(f"{path}: not UTF-8 text") from None
        except OSError as e:
            raise SureclError(f"config file {path} cannot be read: {e.strerror or e}") from None
    else:
        if path_or_preset not in preset_names() and path_or_preset in registry.method_names():
            # a registered method without a preset of its own (an outside one): run it as is
            return {"kind": "method", "description": f"method {path_or_preset} with its defaults", "method": path_or_preset}, f"method {path_or_preset}"
        if path_or_preset not in preset_names():
            raise SureclError(
                f"unknown preset {path_or_preset!r} (choose from {', '.join(preset_names())}, a registered method "
                f"({', '.join(sorted(registry.method_names()))}), or give a .yaml path)"
            )
        text_source = f"preset {path_or_preset}"
        text = (resources.files("surecl") / "presets" / f"{path_or_preset}.yaml").read_text(encoding="utf-8")
    try:
        data = safe_yaml(text, text_source) or {}
    except (yaml.YAMLError, RecursionError) as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" line {line + 1}" if line is not None else ""
        raise SureclError(f"{text_source}:{where} invalid YAML") from None
    if not isinstance(data, dict):
        raise SureclError(f"{text_source}: top level must be a mapping of config keys")
    return data, text_source


META_KEYS = ("description", "kind", "orders", "essential")
DEFAULT_PRESET = "slow_surprise"


def _check_meta(data: dict, source: str, cfg: RunConfig) -> None:
    """A preset's own keys (``kind``, ``essential``, ``orders``, ``description``), checked
    (``essential`` names against ``cfg``'s keys)."""
    kind = data.get("kind", "method")
    if kind not in ("method", "setting"):
        raise SureclError(f"{source}: kind: {kind!r} is not one of method, setting")
    essential = data.get("essential", []) or []
    if not isinstance(essential, list) or not all(isinstance(k, str) for k in essential):
        raise SureclError(f"{source}: essential: expected a list of key.sub names")
    for key in essential:
        try:
            get_key(cfg, key)
        except (AttributeError, KeyError, SureclError):
            raise SureclError(f"{source}: essential: {key!r} is not a config key") from None
    orders = data.get("orders")
    if orders is not None and (not isinstance(orders, list) or not all(isinstance(o, (str, int)) and not isinstance(o, bool) for o in orders)):
        raise SureclError(f"{source}: orders: expected a list of order names, e.g. [4, 5, 6]")
    if not isinstance(data.get("description", ""), str):
        raise SureclError(f"{source}: description: expected text")


def _config_arguments(config: Any, overrides: Any) -> tuple[list[str], list[str]]:
    """``build_config``'s arguments as its names and overrides, or one line for a wrong type
    from Python (a bare text of overrides would be read one character at a time)."""
    if isinstance(config, os.PathLike):
        config = os.fspath(config)
        if not isinstance(config, str):
            raise SureclError("config: a path given as bytes; give it as text or a pathlib.Path")
        names = [config]  # one file, whatever its name holds
    elif config is None or isinstance(config, str):
        names = [c.strip() for c in (config or "").split(",") if c.strip()]
    else:
        raise SureclError(f"config: expected text like 'tiny,seq_lora' or a path to a YAML file, not {type(config).__name__}")
    if overrides is None:
        return names, []
    if not isinstance(overrides, (list, tuple)):
        what = "one text" if isinstance(overrides, str) else type(overrides).__name__
        raise SureclError(f"overrides: pass a list of key.sub=value texts, e.g. [\"train.lr=0.1\"], not {what}")
    for i, item in enumerate(overrides):
        if not isinstance(item, str):
            raise SureclError(f"overrides[{i}]: expected a key.sub=value text like \"train.lr=0.1\", not {type(item).__name__}")
    return names, list(overrides)


def _overrides_set(overrides: list[str], key: str) -> bool:
    """Whether one of ``overrides`` sets the dotted ``key``: by its name, or inside a section's
    mapping (``replay={every: 3}`` sets ``replay.every``)."""
    for item in overrides:
        dotted, _, raw = item.partition("=")
        dotted = dotted.strip()
        if dotted == key:
            return True
        if key.startswith(dotted + "."):
            try:
                value = safe_yaml(raw, f"override {dotted}")
            except (SureclError, yaml.YAMLError, RecursionError):
                continue  # applying it says what is wrong
            for part in key[len(dotted) + 1:].split("."):
                value = value.get(part, _ABSENT) if isinstance(value, dict) else _ABSENT
            if value is not _ABSENT:
                return True
    return False


_ABSENT = object()


def build_config(config: str | os.PathLike | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Default tree <- presets/YAML files (comma-separated, applied in order) <- overrides.

    A preset is of ``kind: method`` (what to run: replay, dual, method) or ``kind: setting``
    (where: model, data, sizes). Without any method preset, ``slow_surprise`` comes first.
    ``config`` may be a path object (one file); ``overrides`` is a list of texts.
    """
    names, overrides = _config_arguments(config, overrides)
    cfg = RunConfig()
    loaded = [(name, *load_yaml(name)) for name in names]
    for _, data, source in loaded:
        _check_meta(data, source, cfg)
    if not any(data.get("kind", "method") == "method" for _, data, _ in loaded):
        loaded.insert(0, (DEFAULT_PRESET, *load_yaml(DEFAULT_PRESET)))
    guarded: dict[str, tuple[str, Any]] = {}  # key -> (method preset, its value) that later presets may not change
    set_by_preset: dict[str, bool] = {}
    conflicts: dict[str, str] = {}
    for name, data, source in loaded:
        body = {k: v for k, v in data.items() if k not in META_KEYS}
        if _written_by_a_run(name):
            body = _saved_run_sections(body, source)
            if set(SAVED_TREE) <= set(body):  # a run's whole config: it ran the earlier behaviour of a key it lacks
                body = earlier_behaviour(body)
        _apply_mapping(cfg, body, "", source)
        for key, (owner, value) in guarded.items():
            if get_key(cfg, key) != value and key not in conflicts:
                conflicts[key] = (
                    f"--config: {name} sets {key}={get_key(cfg, key)!r} over {owner}'s essential {key}={value!r}; "
                    f"put {owner} after {name}, or set {key} on the command line"
                )
        if data.get("kind", "method") == "method" and "preset" not in body:  # a saved config.yaml keeps its own
            cfg.preset = Path(name).stem
        for key in data.get("essential", []) or []:
            guarded[key] = (Path(name).stem, get_key(cfg, key))
            conflicts.pop(key, None)
        tree = _renamed(body)
        for key in _QUIET_WHEN_PRESET:  # who last set each key whose warning a user's setting alone earns
            section, _, leaf = key.partition(".")
            part = tree.get(section)
            if (isinstance(part, dict) and leaf in part) if leaf else section in tree:
                set_by_preset[key] = source.startswith("preset ") or _written_by_a_run(name)
    cfg.__dict__["_preset_keys"] = frozenset(k for k, preset in set_by_preset.items() if preset and not _overrides_set(overrides, k))
    for key, message in conflicts.items():
        if not _overrides_set(overrides, key):  # an explicit override decides (by name or in its section's mapping)
            raise SureclError(message)
    apply_overrides(cfg, overrides or [])
    return validate(cfg)


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Rebuild a config saved in results/checkpoints (a key it lacks that :data:`EARLIER_BEHAVIOUR`
    names is read as the behaviour before the key, any other as its default)."""
    cfg = RunConfig()
    _apply_mapping(cfg, earlier_behaviour(data), "", "saved config")
    return validate(cfg)


EARLIER_BEHAVIOUR: dict[tuple[str, str], Any] = {("eval", "answer_budget"): "references"}
"""Keys added with a default that changed what runs do: a saved config (results.json,
``config.yaml``, a checkpoint) written before the key existed ran the value here, not the
default, and is read so wherever it is compared with a new config (:func:`same_config`: a
finished run skipped, a checkpoint resumed) or run again from its ``config.yaml``. Any other
key a saved config lacks takes its default, which kept the earlier behaviour when it was added."""


def earlier_behaviour(saved: Any) -> Any:
    """``saved`` (a config tree as written by a run) with each :data:`EARLIER_BEHAVIOUR` key it
    lacks set to the value its run ran."""
    if not isinstance(saved, dict):
        return saved
    tree = dict(saved)
    for (section, key), value in EARLIER_BEHAVIOUR.items():
        part = tree.get(section, {})
        if isinstance(part, dict) and key not in part:
            tree[section] = {**part, key: value}
    return tree


def same_config(saved: dict[str, Any], cfg: RunConfig) -> bool:
    """Whether a config saved by an earlier run (results, checkpoints) is ``cfg``.

    The saved tree is rebuilt first, so keys added to the config since then take their
    defaults: a finished or checkpointed run stays resumable when a later version adds an
    option whose default keeps the old behaviour; a key whose default changed what runs do
    takes the value the saved run ran instead (:data:`EARLIER_BEHAVIOUR`: a generation run
    without ``eval.answer_budget`` ran ``references``), and counts only where a run reads it
    (:func:`_read_only`). A saved key that no longer exists, or a
    saved value that no longer validates, is a different config. A section only one method
    reads (a registered section, :func:`surecl.registry.sections`) counts only for that method, and the dual learner's options
    only where they are read (:func:`_read_only`): a changed default of N-LoRA's strength or of
    the EMA rate does not make a finished SeqLoRA run a different run. A saved section no
    registered plugin declares counts for nothing where the saved method and policy are
    registered (:func:`_unread_sections`): a run made while a plugin was loaded stays skipped or
    resumed once the plugin is gone, unless it ran that plugin."""
    try:
        old, new = config_from_dict(_unread_sections(saved)).to_dict(), cfg.to_dict()
    except SureclError:
        return False
    return read_view([old, new]) == read_view([new, old])


def _unread_sections(saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` without the sections (mappings at the top level) that are neither surecl's own
    keys nor registered, when its method and replay policy are registered, so neither reads
    one: every run's config.yaml holds every section registered when it ran, an unrelated
    plugin's too. A saved run whose method or policy is not registered is left whole, and
    rebuilding it fails (it cannot run without its plugin)."""
    if not isinstance(saved, dict):
        return saved
    replay = saved.get("replay")
    policy = replay.get("policy") if isinstance(replay, dict) else None
    if saved.get("method") not in (None, *registry.method_names()) or policy not in (None, *registry.policy_names()):
        return saved
    keep = set(CORE_SECTIONS) | set(registry.sections())
    return {k: v for k, v in saved.items() if k in keep or not isinstance(v, dict)}


SAVED_TREE = ("method", "model", "data", "lora", "replay", "dual", "train", "eval")
"""The sections every run's resolved ``config.yaml`` holds (:meth:`RunConfig.to_yaml`): a file
holding all of them is taken for a saved run's config."""


def _written_by_a_run(name: str) -> bool:
    """Whether ``--config`` entry ``name`` is a file a run wrote (it starts with :data:`SAVED_HEAD`)."""
    path = Path(name)
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        return False
    try:
        with path.open(encoding="utf-8") as f:
            return f.readline().startswith(SAVED_HEAD)
    except (OSError, UnicodeDecodeError):
        return False


def _saved_run_sections(body: dict[str, Any], source: str) -> dict[str, Any]:
    """A run's own ``config.yaml`` (it starts with :data:`SAVED_HEAD` and holds every
    :data:`SAVED_TREE` section) without the sections of a plugin that was loaded when it ran but
    is not now, where its own method and policy are registered so neither reads them
    (:func:`_unread_sections`), with a warning naming them: ``surecl run --config
    <run>/config.yaml`` runs it again. A section named like a registered one (a misspelling in an
    edited copy) is kept, so it is refused; so is every key of a file of the user's own."""
    if not set(SAVED_TREE) <= set(body):
        return body
    import difflib

    kept = _unread_sections(body)
    known = [*registry.sections(), *CORE_SECTIONS]
    dropped = [k for k in body if k not in kept and not difflib.get_close_matches(k, known, n=1, cutoff=0.8)]
    kept = {k: v for k, v in body.items() if k in kept or k not in dropped}
    if dropped:
        from surecl.logs import logger

        logger.warning(f"{source}: section{'s' if len(dropped) > 1 else ''} {', '.join(dropped)} left out: no registered method or "
                       f"policy declares {'them' if len(dropped) > 1 else 'it'} now, and this run's method "
                       f"{body.get('method')} and policy {(body.get('replay') or {}).get('policy')} do not read "
                       f"{'them' if len(dropped) > 1 else 'it'} (a plugin loaded when it ran)")
    return kept


def read_view(trees: list[dict[str, Any]]) -> dict[str, Any]:
    """The first of ``trees`` (config trees as saved) as far as a run of any of them reads it:
    without a registered method's or policy's own section when none of their methods and
    policies reads it, and without the options :func:`_read_only` drops. Two runs whose views
    are equal ran the same configuration."""
    tree = earlier_behaviour(dict(trees[0]))
    used = {t.get("method") for t in trees} | {(t.get("replay") or {}).get("policy") for t in trees}
    for section, (_, readers) in registry.sections().items():
        if not used & set(readers):
            tree.pop(section, None)
    return _read_only(tree)


def _may_generate(tree: dict[str, Any]) -> bool:
    """Whether a run of ``tree`` may evaluate a generation task, the only kind that reads
    ``eval.answer_budget``: a general-ability probe (its instruction part), a ``data.kind=generate``
    stream, or a classification stream of the ``instruct`` benchmark or of ``data.jsonl`` /
    ``data.hf`` tasks (a file may declare itself a generation task); a ``data.kind=text`` stream
    reads every task as documents. Where unsure, it may."""
    data = tree.get("data") if isinstance(tree.get("data"), dict) else {}
    evaluation = tree.get("eval") if isinstance(tree.get("eval"), dict) else {}
    if evaluation.get("general", EvalConfig.general) != "none":
        return True
    kind = data.get("kind", DataConfig.kind)
    if kind in ("classify", "text"):
        return kind == "classify" and (data.get("benchmark", DataConfig.benchmark) == "instruct" or bool(data.get("jsonl"))
                                       or bool(data.get("hf")))
    return True


RESULT_NEUTRAL = (("train", "keep_checkpoints"), ("train", "checkpoint_every"), ("log_every",))
"""Options that change no result (how many checkpoints stay on disk, how often one is taken
inside a task, how often log.jsonl gets a line): a resumed or finished run may differ in them
(``tests/test_run_folder.py`` checks that ``checkpoint_every`` changes no number)."""


def _read_only(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` without the dual learner's options a run does not read (all but ``enabled``
    when the slow adapter is off, ``window_tasks`` when ``beta`` is a number), without
    ``eval.answer_budget`` where no generation task is evaluated (:func:`_may_generate`) and
    without the :data:`RESULT_NEUTRAL` options."""
    dual = dict(tree.get("dual", {}))
    if not dual.get("enabled"):
        dual = {"enabled": dual.get("enabled", False)}
    elif dual.get("beta") != "auto":
        dual.pop("window_tasks", None)
    tree = {**tree, "dual": dual}
    if isinstance(tree.get("eval"), dict) and not _may_generate(tree):
        tree["eval"] = {k: v for k, v in tree["eval"].items() if k != "answer_budget"}
    for path in RESULT_NEUTRAL:
        if len(path) == 1:
            tree.pop(path[0], None)
        elif isinstance(tree.get(path[0]), dict):
            tree[path[0]] = {k: v for k, v in tree[path[0]].items() if k != path[1]}
    return tree

