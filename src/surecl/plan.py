"""What a run will do, without training: ``surecl run --dry-run``.

Resolves the config, reads the task stream (data only; no model weights are loaded) and
prints the protocol a run would follow: tasks with their sample sizes, optimizer steps and
replay steps per task, the buffer size S and its per-task quota floor(S/d) after each task,
and the EMA window against the steps per task. For a model in a local folder the
architecture is read from its config and the LoRA target modules are checked against a
weightless (meta-device) copy of it, so a typo is found before GPU hours are spent, and its
tokenizer is read for the special tokens the run refuses (:func:`_token_refusal`).
"""

from __future__ import annotations

import math
import unicodedata
from pathlib import Path

import yaml

from surecl.config import RunConfig, per_task_values, replay_ratio, stream_warnings
from surecl.errors import SureclError


def check_task_names(cfg: RunConfig, names: list[str]) -> list[str]:
    """Per-task values (``train.epochs_per_task``, the method's ``<section>.per_task``) against
    the stream's task names: a name that matches a task only up to case is refused (it would be
    left unused without a word); the warnings name tasks the stream does not have (a preset's
    table for another stream, e.g. ``olora_long``'s for LNT, applies by name to the tasks present)."""
    from surecl.registry import method_config, method_spec

    entries = [("train.epochs_per_task", cfg.train.epochs_per_task)]
    own = method_config(cfg)
    if isinstance(getattr(own, "per_task", None), list):
        entries.append((f"{method_spec(cfg.method).key}.per_task", own.per_task))
    folded = {n.casefold(): n for n in names}
    warnings = []
    for key, values in entries:
        absent = []
        for entry in values:
            task = unicodedata.normalize("NFC", str(entry).partition(":")[0].strip())
            if task in names:
                continue
            if task.casefold() in folded:
                raise SureclError(f"{key}: task {task!r} is not in the stream; did you mean {folded[task.casefold()]!r}? (names are case-sensitive)")
            absent.append(task)
        if absent and len(absent) == len(values):
            warnings.append(f"{key}: names no task of this stream ({', '.join(absent[:4])}{' ...' if len(absent) > 4 else ''}; "
                            f"its tasks: {', '.join(names)}): every value is unused")
        elif absent:
            warnings.append(f"{key}: {', '.join(absent[:4])}{' ...' if len(absent) > 4 else ''} not in this stream: "
                            f"{'its value is' if len(absent) == 1 else 'their values are'} unused")
    return warnings


def task_epochs(cfg: RunConfig, names: list[str]) -> list[int]:
    """Epochs of each task ``names`` trains: its ``train.epochs_per_task`` value, else ``train.epochs``."""
    table = per_task_values(cfg.train.epochs_per_task, "train.epochs_per_task", 1)
    return [int(table[n][0]) if n in table else cfg.train.epochs for n in names]


def epoch_members(cfg: RunConfig, names: list[str]) -> list[list[int]]:
    """Which of a stage's tasks ``names`` (their positions) each epoch of the stage holds: a
    task trains its own number of epochs (:func:`task_epochs`), so in a stage of several tasks
    (MTL) a later epoch holds only the tasks with epochs left. One epoch, every task: ``[[0, ...]]``."""
    epochs = task_epochs(cfg, names) if names else [cfg.train.epochs]
    return [[k for k, e in enumerate(epochs) if e > epoch] for epoch in range(max(epochs))]


def stage_cap(cfg: RunConfig, names: list[str] | None = None) -> int:
    """``train.max_steps_per_task`` for a stage of the tasks ``names``: the cap times its number
    of tasks (MTL's one stage gets every task's share); 0 = no cap."""
    return cfg.train.max_steps_per_task * max(1, len(names or []))


def _epoch_sizes(sizes: int | list[int], cfg: RunConfig, names: list[str] | None) -> list[int]:
    """New examples in each epoch of a stage whose tasks ``names`` hold ``sizes`` examples (a
    list, one per task; an int for a stage of one task)."""
    names = names or []
    sizes = [sizes] if isinstance(sizes, int) else sizes
    if names and len(names) != len(sizes):
        raise ValueError("a stage of several tasks needs their sizes one by one")
    return [sum(sizes[k] for k in members) for members in epoch_members(cfg, names)]


def planned_steps(sizes: int | list[int], cfg: RunConfig, names: list[str] | None = None) -> int:
    """Optimizer steps a stage takes over tasks ``names`` of ``sizes`` examples (each epoch's
    batches, capped by :func:`stage_cap`)."""
    steps = sum(math.ceil(n / cfg.train.batch_size) for n in _epoch_sizes(sizes, cfg, names))
    cap = stage_cap(cfg, names)
    return min(steps, cap) if cap else steps


def planned_batch_sizes(sizes: int | list[int], cfg: RunConfig, names: list[str] | None = None) -> list[int]:
    """New examples of each step of a stage over tasks ``names`` of ``sizes`` examples: each
    epoch's full batches, then its short last one, capped by :func:`stage_cap`."""
    b = cfg.train.batch_size
    batches = [size for n in _epoch_sizes(sizes, cfg, names) for size in [b] * (n // b) + ([n % b] if n % b else [])]
    cap = stage_cap(cfg, names)
    return batches[:cap] if cap else batches


def replay_steps_range(sizes: int | list[int], cfg: RunConfig, names: list[str] | None = None, first: int = 0) -> tuple[int, int]:
    """The fewest and most steps of a stage over tasks ``names`` of ``sizes`` examples that
    replay (:func:`replay_count` > 0), its first ``first`` steps left out (an online buffer is
    empty at the stage's first step). One number, twice, but under ``train.batching=bucketed``
    with ``replay.ratio``: :func:`surecl.data.encode.bucketed_batches` shuffles an epoch's
    batches, so its short batch comes at any step, not last (:func:`planned_batch_sizes`), and
    the ratio's count per step moves with it. An epoch's new examples are the same whatever its
    order, so each epoch's place of its short batch counts on its own."""
    if not (cfg.train.batching == "bucketed" and cfg.replay.ratio):
        planned = planned_batch_sizes(sizes, cfg, names)
        n = sum(1 for step in range(first, len(planned)) if replay_count(step, planned, cfg) > 0)
        return n, n
    a, b = replay_ratio(cfg.replay.ratio)
    size, cap = cfg.train.batch_size, stage_cap(cfg, names)

    def replays(before: int, new: int) -> int:
        return int(ratio_count(before, new, a, b) > 0)

    low = high = done = step = 0
    for epoch, n in enumerate(_epoch_sizes(sizes, cfg, names)):
        full, short = divmod(n, size)
        k = full + (1 if short else 0)
        kept = k if not cap else max(0, min(k, cap - step))  # the epoch's batches within the stage's cap
        skip = first if epoch == 0 else 0
        if not short:
            counts = [sum(replays(done + i * size, size) for i in range(skip, kept))]
        else:
            # the short batch at place p: full batches before it, then after it shifted by its size
            before = [0]
            for i in range(k):
                before.append(before[-1] + (replays(done + i * size, size) if skip <= i < kept else 0))
            after = [0] * (k + 1)
            for j in range(k - 1, 0, -1):
                after[j] = after[j + 1] + (replays(done + short + (j - 1) * size, size) if skip <= j < kept else 0)
            counts = [before[min(p, kept)] + (replays(done + p * size, short) if skip <= p < kept else 0) + (after[p + 1] if p < kept else 0)
                      for p in range(k)]
        low, high = low + min(counts), high + max(counts)
        done, step = done + n, step + k
    return low, high


def planned_examples(sizes: int | list[int], cfg: RunConfig, names: list[str] | None = None) -> int:
    """New examples a stage over tasks ``names`` of ``sizes`` examples trains on (every epoch's
    batches, capped by :func:`stage_cap`)."""
    return sum(planned_batch_sizes(sizes, cfg, names))


def ema_units(sizes: int | list[int], cfg: RunConfig, names: list[str] | None = None) -> int:
    """EMA updates a stage over tasks ``names`` of ``sizes`` examples makes: its optimizer
    steps, or its new examples with ``dual.unit=example``."""
    return planned_examples(sizes, cfg, names) if cfg.dual.unit == "example" else planned_steps(sizes, cfg, names)


def replay_count(step: int, batch_sizes: list[int], cfg: RunConfig) -> int:
    """Examples replayed at ``step`` of a stage whose steps take ``batch_sizes`` new examples
    each: with ``replay.ratio`` a:b, floor(N' a / b) - floor(N a / b) for the new examples N
    before the step and N' after it (so a stage replays floor(total a / b) in all, spread
    evenly); else ``replay.batch_size`` every ``replay.every``-th step."""
    if not cfg.replay.ratio:
        return cfg.replay.batch_size if step % cfg.replay.every == 0 else 0
    before = sum(batch_sizes[:step])
    return ratio_count(before, batch_sizes[step], *replay_ratio(cfg.replay.ratio))


def ratio_count(before: int, new: int, a: int, b: int) -> int:
    """Examples replayed under ratio a:b by a step of ``new`` new examples after ``before`` of
    them: floor((before + new) a / b) - floor(before a / b)."""
    return (before + new) * a // b - before * a // b


def replayed_in(batch_size: int, cfg: RunConfig) -> float:
    """Replayed examples per step of ``batch_size`` new examples, on average."""
    if not cfg.replay.ratio:
        return cfg.replay.batch_size / cfg.replay.every
    a, b = replay_ratio(cfg.replay.ratio)
    return batch_size * a / b


def _model_line(cfg: RunConfig, config=None, tasks=()) -> str:
    """The dry run's model line; ``config``: the model folder's transformers config where it
    was read already (:func:`_model_config`); ``tasks``: the stream's and the general probe's,
    whose kinds say which of the tokens a run reads :func:`_token_refusal` checks."""
    name = cfg.model.name
    if name in ("smollm2-135m", "tiny"):
        return f"model: {name} (built in; causal LM)"
    folder = Path(name).expanduser()  # as the loader reads it (surecl.model.load_model)
    if not (folder / "config.json").is_file():
        return f"model: {name} (not a local folder: loaded by name at run time; LoRA targets not checked)"
    from surecl.adapters import adaptable_layers, layer_names, meta_model, names_layer, resolve_targets

    config = config if config is not None else _read_config(folder, cfg)
    seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    try:
        model = meta_model(config, seq2seq, cfg.model.trust_remote_code)
    except (OSError, ValueError) as exc:
        from surecl.model import cannot_load  # (surecl.model imports torch: not at plan's import)

        raise SureclError(cannot_load(cfg.model.name, exc)) from None

    layers = adaptable_layers(model)  # linear layers and GPT-2's Conv1D, as PEFT adapts them
    targets = resolve_targets(model, cfg.lora.target_modules)
    if targets != list(cfg.lora.target_modules):  # all-linear: every adaptable layer but the head
        found = {cfg.lora.target_modules[0]: len(targets)}
    else:
        found = {t: sum(1 for n, _ in layers if names_layer(n, t)) for t in cfg.lora.target_modules}
    missing = [t for t, k in found.items() if k == 0]
    kind = "encoder-decoder" if seq2seq else "causal LM"
    arch = ",".join(getattr(config, "architectures", None) or [config.model_type])
    params = sum(p.numel() for p in model.parameters())
    line = f"model: {name} ({arch}, {kind}, {params / 1e6:.1f}M parameters); LoRA on " + ", ".join(f"{t} x{k}" for t, k in found.items())
    if missing:
        # the run refuses a target_modules name that matches nothing (surecl.adapters.DualLoRA)
        line += (f"\n  error: the run stops: lora.target_modules names no layer named {', '.join(missing)} in this model (its "
                 f"linear layers: {layer_names(layers)})")
    refusal = _token_refusal(cfg, folder, model, seq2seq, tasks)
    if refusal:
        line += f"\n  error: the run stops: {refusal}"
    return line


def _token_refusal(cfg: RunConfig, folder: Path, model, seq2seq: bool, tasks) -> str | None:
    """What the run refuses of the folder's tokenizer against its model (``model``: built on the
    meta device from its config, no weights), in the run's words, or None: the special tokens
    (:func:`surecl.model.check_special_ids`: no EOS; a pad, EOS or decoder start id past the input
    embeddings; an encoder-decoder without a decoder start) and, by the kinds of ``tasks``, the
    document start token and the chat template's end of turn (:func:`surecl.data.encode.check_read_ids`).
    Reads the tokenizer files alone; the rows themselves are checked when the run encodes them."""
    from transformers import AutoTokenizer, GenerationConfig

    from surecl.data.encode import TaskEncoder, check_read_ids
    from surecl.model import cannot_load, check_special_ids, decoder_start, embedding_rows

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=cfg.model.trust_remote_code)
    except (OSError, ValueError) as exc:
        return cannot_load(cfg.model.name, exc)
    size = embedding_rows(model)
    if seq2seq and getattr(model.config, "decoder_start_token_id", None) is None:
        try:  # from_pretrained gives the model the folder's generation config, where it has one
            model.generation_config = GenerationConfig.from_pretrained(folder)
        except (OSError, ValueError):
            pass
    encoder = TaskEncoder(tokenizer, cfg.model.max_length, template=cfg.data.template, text_start=cfg.data.text_start)
    try:
        check_special_ids(tokenizer, str(folder), size, decoder_start(model) if seq2seq else None, seq2seq)
        stops = encoder.stop_ids() if any(t.kind == "generate" for t in tasks) else None
        check_read_ids(encoder, tasks, size, str(folder), stops)
    except SureclError as exc:
        return str(exc)
    return None


def _model_config(cfg: RunConfig, cache_dir: Path | None):
    """The model's transformers config and whether it is an encoder-decoder, read without
    loading weights: a folder's, or a built-in model's where its folder is in the cache
    already (None where it cannot be read so: a hub name, a built-in not yet built)."""
    from surecl.data.embedded import default_cache_dir
    from surecl.model import SMOLLM2, SMOLLM2_FOLDER, TINY, TINY_VERSION

    name = cfg.model.name
    models = (cache_dir or default_cache_dir()) / "models"
    folder = {SMOLLM2: models / SMOLLM2_FOLDER, TINY: models / TINY_VERSION}.get(name, Path(name).expanduser())
    if not (folder / "config.json").is_file():
        return None
    try:
        config = _read_config(folder, cfg)
    except SureclError:  # _model_line says what the run will
        return None
    return config, bool(getattr(config, "is_encoder_decoder", False))


def _read_config(folder: Path, cfg: RunConfig):
    """The transformers config of the model folder ``folder``; one line where it cannot be read,
    as the run's loader says it (:func:`surecl.model.load_model`)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=cfg.model.trust_remote_code)
    except (OSError, ValueError) as exc:
        from surecl.model import cannot_load  # (surecl.model imports torch: not at plan's import)

        raise SureclError(cannot_load(cfg.model.name, exc)) from None



def describe(cfg: RunConfig, cache_dir: Path | None = None) -> str:
    """The dry-run report for ``cfg``: protocol, per-task plan and the resolved config."""
    from surecl.data.general import load_general_probe
    from surecl.data.loading import load_stream
    from surecl.plugins.sure import SurprisePolicy
    from surecl.registry import method_class, method_config, policy_class
    from surecl.replay.policies import buffer_capacity, stream_quota_warning

    tasks = load_stream(cfg, cache_dir=cache_dir)
    name_warnings = check_task_names(cfg, [t.name for t in tasks])
    n_train = [len(t.train) for t in tasks]
    method = method_class(cfg.method)(method_config(cfg))
    read = _model_config(cfg, cache_dir)
    probe = load_general_probe(cfg.eval.general, cfg.eval.general_n, cache_dir)  # None for eval.general=none
    model_line = _model_line(cfg, read[0] if read is not None else None, tasks + (probe.tasks if probe is not None else []))
    if read is not None:
        try:  # what the method's setup refuses before anything trains
            method.check_run_model(cfg, *read)
        except SureclError as exc:
            model_line += f"\n  error: the run stops: {exc}"
    stages = method.stages(len(tasks))
    policy = cfg.replay.policy if method.continual else "none"
    policy_cls = policy_class(policy)
    total = sum(n_train)
    capacity = buffer_capacity(type(cfg.replay)(**{**cfg.replay.__dict__, "policy": policy}), total)
    quota = policy_cls.per_task_quota
    lines = [
        f"surecl dry run: {cfg.preset or cfg.method} (nothing is trained)",
        model_line,
        f"stream: benchmark {cfg.data.benchmark}, order {cfg.data.order if not cfg.data.tasks else 'custom'}: {len(tasks)} tasks, "
        f"{total} train / {sum(len(t.test) for t in tasks)} test examples ("
        + ("documents drawn at random: a text stream has no labels to balance" if cfg.data.kind == "text"
           else f"train sampled {cfg.data.train_sampling}, test {cfg.data.test_sampling}")
        + ("; generation tasks: uniform, their targets are no classes" if any(t.kind == "generate" for t in tasks) else "") + ")",
        f"method {cfg.method}, replay {policy}" + (f" (score {cfg.replay.score_time}, insert {cfg.replay.insert_time}, {cfg.replay.reduction} over {cfg.replay.scope})" if issubclass(policy_cls, SurprisePolicy) else "")
        + (", each task's share spread evenly over its labels" if quota and cfg.replay.balance == "label" else ""),
        f"optimizer: AdamW {method.learning_rate(cfg)} ({cfg.train.scheduler}, warmup {cfg.train.warmup_steps}), batch {cfg.train.batch_size} ({cfg.train.batching}), "
        f"{cfg.train.epochs} epoch(s){' (per task: ' + ', '.join(cfg.train.epochs_per_task) + ')' if cfg.train.epochs_per_task else ''}, "
        + ("fresh optimizer state per task" + ("" if cfg.train.fresh_optimizer else f" ({cfg.method} resets it)")
           if cfg.train.fresh_optimizer or method.fresh_optimizer else "carried-over optimizer state per task"),
    ]
    if policy != "none":
        fraction = cfg.replay.buffer_fraction or (cfg.replay.buffer_size if cfg.replay.buffer_size < 1 else 0)  # buffer_capacity's rule
        size = f"{fraction:g} of {total}" if fraction else "absolute"
        if cfg.replay.ratio:
            how = f"replay ratio {cfg.replay.ratio} (replayed:new, about {replayed_in(cfg.train.batch_size, cfg):g} per step of {cfg.train.batch_size})"
        else:
            how = f"{cfg.replay.batch_size} replayed examples every {cfg.replay.every} step(s)"
        how += ", each drawn on its own (with replacement)" if cfg.replay.replacement else ", a step's distinct while the buffer holds as many"
        weighting = {"example": "each example's token mean, a replayed one averaged with its new one (the reference's, every step)",
                     "pair": "each pair's mean on steps that replay (the reference's), the joint token mean on steps that do not"
                     }.get(cfg.replay.loss, "token mean over the joint batch")
        lines.append(f"buffer: S = {capacity} ({size}); {how}; loss: {weighting}")
    lines += ["", "| stage | tasks | train | test | steps | replay steps | buffer quota per task after it |", "|---|---|---|---|---|---|---|"]
    steps_all, ranged = [], False
    for k, stage in enumerate(stages):
        n = sum(n_train[t] for t in stage.tasks)
        steps = planned_steps([n_train[t] for t in stage.tasks], cfg, [tasks[t].name for t in stage.tasks])
        steps_all.append(steps)
        held = k + 1 if cfg.replay.insert_time == "before" else k  # the tasks whose share the buffer holds during this stage
        has_buffer = policy != "none" and capacity > 0 and (policy_cls.online or (held > 0 and (not quota or capacity // held > 0)))
        # an online policy's buffer is offered its first entries after the first step
        first = 1 if policy_cls.online and k == 0 else 0
        # a policy of neither kind (an outside one's own rule): its buffer is not planned here
        own = policy != "none" and not quota and not policy_cls.online
        if own:
            replay_steps = "?"
        elif not has_buffer:
            replay_steps = 0
        else:
            low, high = replay_steps_range([n_train[t] for t in stage.tasks], cfg, [tasks[t].name for t in stage.tasks], first)
            replay_steps = low if low == high else f"{low}-{high}"
            ranged = ranged or low != high
        d = k + 1
        if own:
            q = f"its own ({policy}: neither a per-task quota nor online; not planned)"
        else:
            q = f"floor({capacity}/{d}) = {capacity // d}" if quota else ("-" if policy == "none" else "online" + (", floor(S/k) per answer label" if policy_cls.per_label_quota else ""))
        names = "+".join(tasks[t].name for t in stage.tasks)
        lines.append(f"| {k + 1} | {names} | {n} | {sum(len(tasks[t].test) for t in stage.tasks)} | {steps} | {replay_steps} | {q} |")
    lines.append(f"\ntotal optimizer steps: {sum(steps_all)}")
    if ranged:
        lines.append("replay steps a-b: the fewest and the most: under train.batching=bucketed each epoch's batches are shuffled, so "
                     "its short batch comes at a drawn step, not last, and replay.ratio's count per step moves with it")
    if probe is not None:
        parts = ", ".join(f"{t.name} ({'perplexity' if t.kind == 'text' else t.score_metric}) {len(t.test)} rows" for t in probe.tasks)
        lines.append(f"general-ability probe ({cfg.eval.general}): {parts}; before the first task and after each of the {len(stages)} stages")
    from surecl.data.loading import missing_tasks_warning, short_tasks_warning, unnamed_tasks_warning

    for warning in (stream_quota_warning(policy_cls, capacity, tasks), short_tasks_warning(tasks, cfg.data.n_train),
                    missing_tasks_warning(tasks, cfg.data.order), unnamed_tasks_warning(tasks)):
        if warning:
            lines.append(f"warning: {warning}")
    lines += [f"warning: {w}" for w in name_warnings + stream_warnings(cfg, tasks)]
    if cfg.dual.enabled:
        from surecl.adapters import beta_per_step, resolve_beta

        beta = resolve_beta(cfg.dual, ema_units([n_train[t] for t in stages[0].tasks], cfg, [tasks[t].name for t in stages[0].tasks]))
        step_beta = beta_per_step(beta, cfg.dual, cfg.train.batch_size)
        window = 1.0 / (1.0 - step_beta) if step_beta < 1 else math.inf
        per_task = sum(steps_all) / len(steps_all)
        form = "bias-corrected" if cfg.dual.bias_correction else "plain recursion (the paper's)"
        unit = (f"once per new example (dual.unit=example, the reference code's): {cfg.train.batch_size} updates per step of "
                f"{cfg.train.batch_size}, effective beta per optimizer step {beta:.4g}^{cfg.train.batch_size} = {step_beta:.4g}"
                if cfg.dual.unit == "example" else "once per optimizer step (dual.unit=step)")
        lines.append(
            f"dual learner: slow = EMA of fast, beta {beta:.4g}{f' (auto: a window of {cfg.dual.window_tasks:g} tasks)' if cfg.dual.beta == 'auto' else ''} "
            f"applied {unit}, {form}; window 1/(1-beta per step) = {window:.1f} steps = {window / per_task:.2f} tasks "
            f"of {per_task:.0f} steps ({per_task / window:.2f} windows per task)"
        )
        if window > sum(steps_all):
            lines.append(
                f"  warning: the EMA window ({window:.0f} steps) is longer than the whole stream ({sum(steps_all)} steps): "
                "the slow adapter cannot catch up with the fast one within this run"
            )
        if not cfg.dual.bias_correction and window > steps_all[0]:
            lines.append(
                f"  note: after the first task the slow adapter still holds {step_beta ** steps_all[0]:.0%} of its initial weights "
                f"(beta per step ^ {steps_all[0]})"
            )
    lines += ["", "resolved config:", yaml.safe_dump(cfg.to_dict(), sort_keys=False).rstrip()]
    return "\n".join(lines)
