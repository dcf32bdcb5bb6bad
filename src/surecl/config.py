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
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from surecl.errors import SureclError


@dataclass
class ModelConfig:
    """Which model to adapt and how to hold its frozen weights."""

    name: str = "smollm2-135m"
    """``smollm2-135m`` (embedded), ``tiny`` (random, built in code), or a HF name / local path."""
    dtype: str = "auto"
    """Dtype of the frozen base: ``auto`` (bf16 where supported), ``bf16``, ``fp32``."""
    trust_remote_code: bool = False
    max_length: int = 128
    """Prompt tokens kept per example (the sentence is truncated, the answer never)."""
    encoder_eos: bool = False
    """Encoder-decoder models: end the encoder input (the prompt) with the end-of-sequence
    token, as the T5 tokenizer does by default and the reference code of the paper and of
    O-LoRA do (``tokenizer(source)``). The ``paper-t5`` preset sets it; off by default so
    earlier T5 runs keep their inputs. Not read for causal models."""
    share_prefix: bool = True
    """Run the prompt prefix that a batch's rows share (a task's instruction and options) once
    per batch and let the rows attend to its KV cache, in scoring, training and evaluation of
    causal models: the same results for fewer tokens. Training slices are cut by task where a
    task's rows save enough prefix tokens to pay for a slice of their own. With
    ``lora.dropout`` > 0 the shared tokens draw one dropout mask per slice, not one per row."""


@dataclass
class HFTaskConfig:
    """One ``data.hf`` task: a Hugging Face ``datasets`` source and how to read it. In YAML or
    an override a plain string is the ``path``, every other field at its default."""

    path: str = ""
    """A folder written by ``save_to_disk`` (a ``DatasetDict``, or one ``Dataset``: its rows are
    the ``train`` split), a data file (``.parquet``, ``.csv``, ``.json``, ``.jsonl``: one
    ``train`` split), a folder of such files (split names from the file names, e.g.
    ``train.csv`` and ``test.csv``), or a hub id (``owner/name``) where the hub is reachable."""
    name: str = ""
    """The dataset's configuration name (``load_dataset(path, name)``), for hub datasets that have several."""
    task: str = ""
    """The task's name in the stream; default: the file or folder name without its suffix (a
    hub id's last part, with ``-<name>`` when a configuration is named)."""
    text_column: str = "text"
    """The column holding the input text (strings)."""
    label_column: str = "label"
    """The column holding the answer: strings, or integers, which are the column's
    ``ClassLabel`` names where it has them, else the i-th of ``labels`` (from 0) where those are
    given, else the number as a string. Not read for ``data.kind=text``."""
    train_split: str = "train"
    test_split: str = "test"
    test_fraction: float = 0.0
    """Above 0 (and below 1): the test split is this fraction of the train split, held out by
    a fixed draw per task name (the same for every run seed and method), and ``test_split`` is
    not read. For sources with one split (a data file, one saved ``Dataset``)."""
    labels: list[str] = field(default_factory=list)
    """The task's label set, in order (the options of its prompt); default: the column's
    ``ClassLabel`` names, else the sorted distinct labels of both splits. A row whose label is
    not among them is an error (or dropped with ``data.invalid_labels=drop``)."""
    instruction: str = ""
    """The task's instruction; default: the generic one of ``data.jsonl`` tasks (none for a
    generation task)."""
    metric: str = ""
    """A generation task's metric (``data.kind=generate``: ``text_column`` is the prompt,
    ``label_column`` the target text): ``rouge_l`` (default) or ``exact_match``."""


@dataclass
class DataConfig:
    """The task stream."""

    benchmark: str = "embedded"
    """``embedded`` (offline default), ``tiny`` (fixture), ``none`` (only ``data.jsonl`` / ``data.hf`` tasks), or a path to a CL_Benchmark folder."""
    order: str = "default"
    """A task order: ``1``..``6`` for CL_Benchmark, ``default`` for the benchmark's own order."""
    tasks: list[str] = field(default_factory=list)
    """Explicit task names in training order; overrides ``order``."""
    jsonl: list[str] = field(default_factory=list)
    """User tasks, one JSONL file each (see README); appended after benchmark tasks."""
    hf: list[HFTaskConfig] = field(default_factory=list)
    """User tasks read with Hugging Face ``datasets`` (``pip install surecl[hf]``), one per
    entry: a path or hub id, or a mapping of :class:`HFTaskConfig` fields (column names,
    splits, labels); appended after the JSONL tasks."""
    kind: str = "classify"
    """``classify`` (instruction + options -> label), ``generate`` (free-form answers:
    ``data.jsonl`` files and ``data.hf`` entries are read as generation tasks, prompt -> target
    text, scored by ROUGE-L or exact match; the ``tiny`` benchmark becomes its generation
    twin; a CL_Benchmark's tasks stay classification) or ``text``: continual pre-training on raw
    documents (benchmark tasks keep their inputs only), next-token loss on every token,
    evaluated by perplexity (needs eval.mode=perplexity; preset ``cpt`` sets both)."""
    template: str = "auto"
    """How a generation task's prompt/response rows are put to the model: ``auto`` (through the
    tokenizer's chat template, as a user turn and the assistant's answer, where the tokenizer
    has one; else plain) or ``plain`` (``instruction + prompt + "\nAnswer:"``, the answer
    after a space, then EOS). Chat rows (``messages``) always use the chat template."""
    n_train: int = 240
    """Training examples kept per task (0 = all). The default sizes keep the embedded run
    within 10 minutes on a 2-core CPU while every task is learned well above its zero-shot
    accuracy (30 steps per task); the paper uses 1000 (LNT) or 5000 (Standard CL) / 500 test."""
    n_test: int = 100
    """Test examples kept per task (0 = all)."""
    train_sampling: str = "balanced"
    """How ``n_train`` rows are drawn: ``balanced`` (round-robin over labels; the default, so a
    small sample holds every class) or ``random`` (uniform, keeping the class priors: the
    paper's protocol, "randomly select")."""
    test_sampling: str = "balanced"
    """How ``n_test`` rows are drawn: ``balanced`` or ``random`` (the paper's; class priors
    differ on QQP, MNLI, BoolQ, so the two give different accuracies there)."""
    task_prefix: bool = False
    """Begin every prompt with ``Task:<group>\nDataset:<task>\n`` (the benchmark's task type,
    e.g. TC, SC, NLI, and the task's name), as O-LoRA's scripts do (``--add_task_name True
    --add_dataset_name True``, ``src/uie_collator.py``), which its baselines' numbers were made
    with. Off by default (the paper's text gives the prompt without it)."""
    draw: str = "shared"
    """Which examples a seed draws: ``shared`` (a task's sample depends on the seed and the
    task only, so the orders of one seed train and test on the same rows: across orders the
    independent unit of a comparison is the seed) or ``order`` (the sample also depends on
    the stream's task order, so every (order, seed) run is an independent draw; the packaged
    study plans set it). ``surecl report`` reads it to choose the unit of its intervals."""
    allow_missing: bool = False
    """Run the available tasks of an order when the folder lacks some, instead of failing."""
    invalid_labels: str = "error"
    """Rows whose label is not in the task's labels: ``error`` (default) or ``drop`` them (the
    run prints how many per task; CL_Benchmark's MNLI test split has 131 rows labelled ``-``)."""

    def __post_init__(self) -> None:
        # From Python, a data.hf entry may be a plain path, as in YAML.
        if isinstance(self.hf, list):
            self.hf = [HFTaskConfig(path=e) if isinstance(e, str) else e for e in self.hf]


@dataclass
class LoraConfig:
    """LoRA adapter shape (paper: rank 8, alpha 32, dropout 0.1 on Q and V)."""

    r: int = 8
    alpha: int = 32
    dropout: float = 0.1
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])


@dataclass
class ReplayConfig:
    """What the buffer keeps and how often it is replayed."""

    policy: str = "none"
    """``none``, ``reservoir`` (online, task-agnostic), ``random`` or ``surprise`` (per-task quota),
    ``online_surprise`` (boundary-free: training-loss surprise, equal quota per answer label), or
    a policy added with ``surecl.register_policy``. SuRe's options below are read by its plugin
    (``surecl.plugins.sure.SureConfig``)."""
    buffer_size: float = 0.02
    """S: below 1 a fraction of all training examples of the stream (0.02 = 2 %), else a whole
    count of examples (300). A number with a decimal point at or above 1 (``1.0``, ``2.5``)
    stops with an error: it could mean either; write a count without the point, or the
    fraction as ``replay.buffer_fraction``."""
    buffer_fraction: float = 0.0
    """S as a fraction of all training examples of the stream, in (0, 1] (1 = every example
    kept); replaces ``buffer_size`` when above 0."""
    score_time: str = "before"
    """When surprise is computed for a task: ``before`` or ``after`` training on it."""
    insert_time: str = "before"
    """When a task's selection enters the buffer: ``before`` or ``after`` training on it."""
    balance: str = "none"
    """``none`` (the paper's): a task's share is its m highest-priority examples whatever their
    labels; ``label``: the share is spread evenly over the task's answer labels, each label
    giving its highest-priority examples in turn (floor(m/K) or one more of each of K labels).
    Per-task quota policies only (``surprise``, ``random``; ``online_surprise`` partitions by
    label already)."""
    reduction: str = "mean"
    """Token reduction of the NLL: ``mean`` (paper) or ``sum``."""
    scope: str = "sequence"
    """Tokens scored: ``sequence`` (prompt + answer; the paper's full-sequence surprise) or
    ``label`` (answer only: -log p(y|x) with ``reduction=sum``, the paper's label surprise).
    A causal model scores every token of prompt + answer after the first. An encoder-decoder
    model predicts only its decoder side, so for ``sequence`` its decoder scores the whole
    sequence (prompt tokens then answer tokens) as its target from an empty encoder input
    (the end-of-sequence token alone): -1/T sum_t log p(z_t | z_<t), the model used as a
    language model over the example; ``label`` scores the answer given the prompt.
    ``input``: the paper's reference code's score (``get_ll`` in ``HHazard2002/continual-learning``
    ``methods/buffer.py``: ``model(input_ids=x, labels=x)``, first label masked, mean): on a
    causal model x is prompt + answer, so it equals ``sequence``; on an encoder-decoder x is
    the encoder input (the prompt), and the score is the decoder's NLL of reconstructing the
    prompt given the prompt. ``paper-t5`` keeps ``sequence`` (Eq. 1's surprise of the example;
    docs/faithfulness.md says why); ``replay.scope=input`` reproduces the reference's."""
    aging: bool = False
    """Re-score replayed items with the loss of the step that replays them."""
    every: int = 2
    """Replay every k-th optimizer step (not read when ``ratio`` is set)."""
    batch_size: int = 4
    """Replayed examples joined to the current batch on a replay step (not read when ``ratio`` is set)."""
    ratio: str = ""
    """The replay ratio ``a:b``: a replayed examples per b new ones, counted over the task's
    stream of new examples (after N new examples of a task, floor(N a / b) have been replayed),
    so every step of B new examples replays about B a / b of them: ``1:2`` is the paper's
    ratio (its reference replays one buffer example every second micro-batch of one example:
    ``replay_frequency`` 2, ``buffer_sample_size`` 1), ``1:4`` ... ``1:16`` its ablation's.
    Empty (default): ``batch_size`` examples every ``every``-th step."""
    loss: str = "joint"
    """How replayed examples enter the step's loss: ``joint`` (default): the token mean over the
    whole mixed batch, so an example weighs by its answer tokens; ``pair`` (the reference's):
    each example's own token-mean loss, each replayed example paired with a new one (in
    turn), a pair's loss the mean of its members', and the step's loss the mean over the new
    examples of their (pair) losses: ``(outputs.loss + replay_outputs.loss) / 2`` per
    micro-batch, averaged over the accumulated micro-batches, as the reference's
    ``training_step`` and the ``Trainer``'s accumulation do."""


@dataclass
class DualConfig:
    """Fast/slow dual learner: slow = EMA(beta) of fast after every optimizer step."""

    enabled: bool = False
    beta: float | str = "auto"
    """The EMA rate: ``auto`` (default), the rate whose window 1/(1-beta) is ``window_tasks``
    tasks of this stream, beta = 1 - 1/(window_tasks x S) with S the first task's optimizer
    steps; or a number in (0, 1) (the paper's 0.995, a 200-step window, which the ``paper-*``
    presets pin). Whether the slow adapter helps or lags depends on the window against the
    steps per task: half a task was the one rule measured at or above the fast adapter on
    every stream measured from 15 to 150 steps per task, where bias-corrected 0.995 fell below
    it at 15 to 50 steps per task, by up to 15 points (RESULTS.md §3, §4;
    ``bench/ema_window.py`` measures slow - fast per rule)."""
    bias_correction: bool = True
    """Divide out the weight still on the initial adapter (Adam-style). Once a run has many
    more than 1/(1-beta) steps this equals the paper's EMA; in short runs it stops the slow
    adapter from sitting near its random start. ``false`` gives the paper's exact recursion
    slow <- beta * slow + (1 - beta) * fast (the ``paper-*`` presets)."""
    window_tasks: float = 0.5
    """With ``beta: auto``: the EMA window in tasks (0.5: half a task). Not read when ``beta``
    is a number."""
    unit: str = "step"
    """What one EMA update (one factor ``beta``) stands for: ``step`` (one update per optimizer
    step: the paper's text, "after each step") or ``example`` (one update per new training
    example, as the paper's reference code does it: ``HHazard2002/continual-learning`` updates
    the slow model in ``training_step``, which the transformers ``Trainer`` calls once per
    micro-batch of one example, 64 times per optimizer step of ``scripts/train.sh``; all
    64 move toward the same fast weights, so surecl applies them as one exact update
    ``slow <- beta^n slow + (1 - beta^n) fast`` after a step of n new examples; replayed
    examples do not count, as they ride along inside a new example's micro-batch there). The
    per-step rate is then beta^batch (0.995^64 = 0.73, a window of about 4 optimizer steps).
    With ``beta: auto`` the window is counted in the same unit (``window_tasks`` tasks of the
    first task's examples). The ``paper-*`` presets set ``example``; docs/faithfulness.md."""


@dataclass
class TrainConfig:
    """Optimisation of the fast adapter."""

    epochs: int = 1
    batch_size: int = 8
    lr: float = 2e-3
    """AdamW learning rate of the fast adapter (the default suits the embedded run's 30 steps
    per task; the paper presets set 1e-3 for T5-large and 1e-4 for Llama-3.1-8B), or of what
    the method trains instead (``seq_ft``: every base weight; its preset sets 5e-5)."""
    weight_decay: float = 0.0
    warmup_steps: int = 0
    scheduler: str = "constant"
    """Learning-rate schedule over a task's steps, restarted per task, with the values of
    ``transformers.get_scheduler``: ``constant``, ``constant_with_warmup``, ``linear`` (decay to
    0 at the task's last step) or ``cosine`` (half a cosine to 0), each after ``warmup_steps``
    of linear warmup from 0 (``constant`` with ``warmup_steps`` > 0 warms up as
    ``constant_with_warmup``)."""
    fresh_optimizer: bool = False
    """Start every task with fresh AdamW state, as O-LoRA's protocol (one process per task)
    does (the ``paper-*`` presets). Default off: carried-over moment estimates keep a new
    task's first updates scaled by the gradient magnitudes seen so far, where fresh state
    makes them about ``lr`` per weight whatever the gradient (Adam's first step)."""
    batching: str = "uniform"
    """``uniform``: batches drawn uniformly from a shuffled epoch, as in the paper (default).
    ``bucketed``: shuffle, sort by length inside windows of 32 batches, shuffle the batches:
    less padding, but each batch holds examples of similar length, which in a stream of
    several tasks means mostly one task per batch: MTL lost 4 FP points to it against uniform
    batches (README, bench/mtl_check.py)."""
    epochs_per_task: list[str] = field(default_factory=list)
    """Per-task epochs, ``"<task>:<epochs>"`` each (e.g. ``MNLI:2``, as O-LoRA's ``long.sh``
    trains MNLI); a task not named trains ``epochs``."""
    grad_clip: float = 1.0
    max_steps_per_task: int = 0
    """Cap on optimizer steps per task (0 = no cap)."""
    ewc_lambda: float = 1000.0
    """EWC penalty strength (method ``ewc``)."""
    ewc_samples: int = 200
    """Training examples per task used to estimate the EWC Fisher."""
    checkpoint_every: int = 50
    """Also checkpoint every this many steps inside a task (0 = only between tasks)."""
    keep_checkpoints: int = 2
    """Complete checkpoints kept in ``checkpoints/`` (the newest; one more lies there while the
    next is written). 2 keeps a fallback should the newest be damaged; 1 halves the disk a run
    holds, which matters for full fine-tuning (``seq_ft``: weights and both AdamW moments, 1.6
    GB a checkpoint for SmolLM2-135M, against a few MB with LoRA)."""
    micro_batch_tokens: int = 1024
    """Run a step's mixed batch in slices of at most this many padded tokens, accumulating
    gradients (same loss and update; the saved activations of one slice at a time bound the
    memory). 0 = the whole batch in one forward."""


@dataclass
class EvalConfig:
    """How accuracy is measured."""

    mode: str = "generate"
    """``generate`` (greedy decoding, normalised exact match; paper), ``rank`` (label
    likelihood), or ``perplexity`` (the metric of ``data.kind=text`` streams; lower is better)."""
    before: bool = True
    """Also evaluate every task before any training (the "without fine-tuning" row), so a run
    shows what training added."""
    fast: bool = True
    """In a dual run, also evaluate the fast adapter after every task: ``results.json`` gets
    its matrix under ``fast`` beside the slow one's. The fast adapter is trained exactly as
    the same method without the dual learner, so one run gives both rows on one trajectory
    (paired comparison); costs a second evaluation."""
    matrix: str = "full"
    """Which cells of the accuracy matrix to fill: ``full`` (every task seen so far, after
    every task: N(N+1)/2 evaluations) or ``fp_ap`` (only what FP, AP, forgetting and BWT need:
    each task right after it is learned, and every task after the last: 2N-1 evaluations;
    for long streams, where the full matrix costs more than training)."""
    batch_size: int = 32
    max_new_tokens: int = 0
    """0 = longest label of the task plus one (a generation task: its longest target, in
    tokens, plus one, at most ``eval.max_new_cap``)."""
    max_new_cap: int = 256
    """The most new tokens a generation task's answers get when ``eval.max_new_tokens`` is 0."""
    ahead: bool = False
    """After each task also evaluate the next one, not yet trained (the matrix's cell above the
    diagonal): with the before-training row, what forward transfer (``fwt`` in results.json)
    is computed from. One more evaluation per task."""


@dataclass
class PromptsConfig:
    """Progressive Prompts (``method=progressive_prompts``; Razdaibiedina et al., ICLR 2023): a
    new soft prompt of ``length`` vectors per task, trained with the prompts of the earlier
    tasks (frozen) before it and the base model frozen. Defaults are those of the paper's
    public code (arazd/ProgressivePrompts, ``T5_codebase/train_t5_cl.py``): its T5 setting.
    The paper has no decoder-only model; the same values serve one here (README)."""

    length: int = 10
    """Soft-prompt vectors per task (reference ``--prefix_len 10``, T5 and BERT). After task
    t every input carries t x length virtual tokens, on top of ``model.max_length``."""
    lr: float = 0.3
    """Learning rate of the prompt (and its MLP): replaces ``train.lr`` for this method and
    follows ``train.scheduler`` as ``train.lr`` would (reference ``--lr 0.3``, T5, after
    Lester et al.'s prompt tuning; its BERT runs trained prompts at 3e-5 for 50 epochs)."""
    mlp: bool = False
    """Residual reparameterisation: the prompt the model reads is P + MLP(P), with MLP =
    Linear(d, mlp_hidden) -> ReLU -> Linear(mlp_hidden, d), a fresh one per task trained at
    ``lr`` with it (the reference's ``mlp_lr`` defaults to ``lr``); after the task P + MLP(P)
    is kept (frozen) and the MLP dropped. The reference's ``ResMLP`` of type ``MLP1`` with its
    skip connection, as its BERT codebase builds it (the T5 codebase's ``MLP1`` branch reads
    a ``layer_norm`` flag its constructor does not take; ``MLP2`` is not offered). Off by
    default there (``--prefix_MLP None``)."""
    mlp_hidden: int = 800
    """The MLP's bottleneck width (reference ``--bottleneck_size 800``)."""
    eval: str = "all"
    """Which prompts answer at test time: ``all`` (every prompt learned so far, for every
    task: no task id needed) or ``own`` (task j reads the prompts up to its own,
    [P_j; ...; P_1], as right after it was learned: the task id chooses them; the accuracy
    the paper reports per task, measured right after learning it)."""


@dataclass
class OLoRAConfig:
    """O-LoRA (method ``olora``; Wang et al., 2023, "Orthogonal Subspace Learning for Language
    Model Continual Learning", code ``cmnfriend/O-LoRA``): a new LoRA per task, earlier tasks'
    LoRAs frozen and summed into every forward, and the loss of task t gets
    ``lambda_orth * sum_layers sum_{i<t} orth(A_i, A_t) + lambda_l2 * l2(theta_t)``.

    The defaults are its code's, as its scripts pair them: ``scripts/order_1.sh`` ..
    ``order_3.sh`` of ``cmnfriend/O-LoRA`` pass ``--lamda_1 0.5 --lamda_2 0`` for every task,
    and ``src/uie_trainer_lora.py`` (``training_step``, lines 91-109) weighs with them the L1
    form ``torch.abs(torch.mm(A_i, A_t.T)).sum()`` and the unsquared ``torch.norm(param, p=2)``.
    The paper's formulas (squared Frobenius norms) are ``orth_norm=fro2`` and ``l2_norm=fro2``;
    with them lambda 0.5 weighs far less (the squares of the small entries of A_i A_t^T)."""

    lambda_orth: float = 0.5
    """lambda_1: weight of the orthogonality penalty between the current task's LoRA A and
    every earlier task's (0.5 in O-LoRA's scripts)."""
    lambda_l2: float = 0.0
    """lambda_2: weight of the L2 penalty on the current task's LoRA A and B (0 in O-LoRA's
    scripts, so the term is off by default)."""
    orth_norm: str = "l1"
    """``l1`` (default): the code's ``torch.abs(torch.mm(A_i, A_t.T)).sum()`` (the sum of the
    overlap's absolute entries); ``fro2``: the paper's ``||A_i^T A_t||_F^2`` (squared Frobenius norm of the overlap of
    the two subspaces)."""
    per_task: list[str] = field(default_factory=list)
    """Per-task strengths, ``"<task>:<lambda_orth>:<lambda_l2>"`` each (e.g. ``MNLI:0.5:0``);
    a task not named takes ``lambda_orth`` / ``lambda_l2``. O-LoRA's 15-task script
    (``scripts/long.sh``) sets them per task; the ``olora_long`` preset carries its values."""
    l2_norm: str = "fro"
    """``fro`` (default): the code's ``torch.norm(param, p=2)`` summed over the LoRA tensors
    (a norm per tensor, not squared); ``fro2``: the paper's ``||theta_t||_2^2`` (sum of
    squares of the current LoRA's entries)."""


@dataclass
class NLoRAConfig:
    """N-LoRA (method ``nlora``; Yang et al., COLING 2025, "Is Parameter Collision Hindering
    Continual Learning in LLMs?", code ``PKU-YuanGroup/N-LoRA``): O-LoRA's setting (a new
    LoRA per task, earlier ones frozen and summed into every forward) with an L1 (sparsity)
    penalty on the current task's update in place of the orthogonality term:
    ``lambda_l1 * sum_layers ||B_t A_t||_1`` (entrywise, the paper's ``||Delta W_t||_1``).

    Sources: the official repository's code and scripts were not available to this project;
    the values below are those of N-LoRA's code as carried by ``zuti666/Continual-Flat-LoRA``
    (its README: "Code follow N-Lora"): ``src/uie_trainer_lora.py`` adds
    ``lamda_1 * torch.norm(torch.mm(loranew_A, loranew_B), p=1)`` per layer and
    ``scripts_T5/order_1.sh`` passes ``--lamda_1 0.4``."""

    lambda_l1: float = 1.0e-4
    """Weight of the sparsity penalty. 0.4, the T5 script's above, belongs to the code's
    ``(r, r)`` form (``l1_of=ab``: give it with that form); the paper's form sums ``out x in``
    entries, and with it 0.4 keeps every task at 0 on SmolLM2-135M (studies/smollm2, order s1:
    dbpedia 0.0 after training on it). 1e-4 is the strongest of 1e-3, 1e-4, 1e-5 measured there
    whose tasks were still learned within 5 points of SeqLoRA's (RESULTS.md, "The rival
    baselines"); under AdamW an L1 gradient does not fade near zero, so measure on a new
    setting before a long run."""
    per_task: list[str] = field(default_factory=list)
    """Per-task strengths, ``"<task>:<lambda_l1>"`` each; a task not named takes ``lambda_l1``."""
    l1_of: str = "delta"
    """``delta``: the paper's ``||B_t A_t||_1``, the sum of the absolute entries of the task's
    ``(out, in)`` update (without the LoRA scaling); ``ab``: the code's ``||A_t B_t||_1`` with
    PEFT's shapes (A ``(r, in)``, B ``(out, r)``): an ``(r, r)`` product, defined only where a
    module's input and output widths are equal (a run with another module stops with an
    error)."""


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
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    olora: OLoRAConfig = field(default_factory=OLoRAConfig)
    nlora: NLoRAConfig = field(default_factory=NLoRAConfig)
    log_every: int = 1

    def __post_init__(self) -> None:
        # Built in Python, a config is checked at once: each leaf's type, then ranges and
        # choices (validate). build_config starts from the (valid) defaults and validates again
        # after its presets and overrides.
        _check_types(self, "")
        validate(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        """The whole tree as YAML that ``--config`` / :func:`build_config` reads back to an equal config."""
        head = "# surecl run config, resolved (presets and overrides applied); `surecl run --config <this file>` runs it again\n"
        return head + yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)


def _check_types(obj: Any, prefix: str) -> None:
    """Each leaf has its declared type (an int is a valid float); raise naming the first that has not."""
    for name, typ in _field_types(type(obj)).items():
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
        if typing.get_origin(typ) is list:
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        elif typing.get_origin(typ) in (typing.Union, types.UnionType):
            members = typing.get_args(typ)
            ok = isinstance(value, members) or (float in members and isinstance(value, int) and not isinstance(value, bool))
        elif typ is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif typ is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, typ)
        if not ok:
            if typing.get_origin(typ) is list:
                want = "a list of strings"
            elif typing.get_origin(typ) in (typing.Union, types.UnionType):
                want = _type_words(typing.get_args(typ))
            else:
                want = f"a {typ.__name__}"
            raise SureclError(f"{key}: expected {want}, got {value!r}")


CHOICES: dict[str, tuple[str, ...] | None] = {
    "model.dtype": ("auto", "bf16", "fp32"),
    "replay.policy": None,  # the registered replay policies (surecl.registry)
    "replay.score_time": ("before", "after"),
    "replay.insert_time": ("before", "after"),
    "replay.reduction": ("mean", "sum"),
    "replay.scope": ("sequence", "label", "input"),
    "replay.balance": ("none", "label"),
    "replay.loss": ("joint", "pair"),
    "dual.unit": ("step", "example"),
    "train.scheduler": ("constant", "constant_with_warmup", "linear", "cosine"),
    "eval.mode": ("generate", "rank", "perplexity"),
    "data.kind": ("classify", "text", "generate"),
    "data.template": ("auto", "plain"),
    "data.invalid_labels": ("error", "drop"),
    "data.train_sampling": ("balanced", "random"),
    "data.draw": ("shared", "order"),
    "data.test_sampling": ("balanced", "random"),
    "train.batching": ("bucketed", "uniform"),
    "eval.matrix": ("full", "fp_ap"),
    "prompts.eval": ("all", "own"),
    "olora.orth_norm": ("fro2", "l1"),
    "olora.l2_norm": ("fro2", "fro"),
    "nlora.l1_of": ("delta", "ab"),
}


def per_task_values(entries: list[str], key: str, n: int) -> dict[str, tuple[float, ...]]:
    """``"<task>:<v1>[:<v2>...]"`` entries (``n`` numbers each, finite, >= 0) as {task: values}."""
    out: dict[str, tuple[float, ...]] = {}
    for entry in entries:
        name, _, rest = str(entry).partition(":")
        parts = rest.split(":") if rest else []
        try:
            values = tuple(float(v) for v in parts)
        except ValueError:
            values = ()
        if not name.strip() or len(values) != n or not all(math.isfinite(v) and v >= 0 for v in values):
            shape = ":".join(["<task>"] + [f"<v{i + 1}>"[:4] if n > 1 else "<value>" for i in range(n)])
            raise SureclError(f"{key}: {str(entry)[:60]!r} must be {shape} with {n} number(s) >= 0")
        if name.strip() in out:
            raise SureclError(f"{key}: task {name.strip()!r} named twice")
        out[name.strip()] = values
    return out


RAW_STRING_KEYS = ("replay.ratio",)
"""Keys whose command-line value is taken as written, not parsed as YAML."""


def replay_ratio(text: str) -> tuple[int, int]:
    """``replay.ratio`` ``"a:b"`` as (a, b): a replayed examples per b new ones (integers, a >= 1, b >= 1)."""
    if isinstance(text, int) or (isinstance(text, str) and text.strip().isdigit()):
        raise SureclError(f"replay.ratio: got the number {str(text)[:20]}; an unquoted a:b in YAML is read as a base-60 number: quote it (ratio: \"1:2\")")
    parts = str(text).split(":")
    try:
        a, b = (int(p.strip()) for p in parts)
    except ValueError:
        a = b = 0
    if len(parts) != 2 or a < 1 or b < 1 or a > 1000 or b > 1000:
        raise SureclError(f"replay.ratio: {str(text)[:40]!r} must be 'a:b' with whole numbers 1..1000 (replayed:new, e.g. 1:2; empty = replay.batch_size every replay.every steps)")
    return a, b


MAX_INT = 10**9
"""The largest whole number any option takes (steps, sizes, counts, seeds)."""


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
    elif isinstance(tree, (int, float)) and abs(tree) > MAX_INT:
        raise SureclError(f"{key}: {tree:g} is out of range (at most {MAX_INT:g})")


def validate(cfg: RunConfig) -> RunConfig:
    """Check ranges and choices; raise a one-line SureclError naming the key. ``method`` and
    ``replay.policy`` are checked against the registries (:mod:`surecl.registry`)."""
    from surecl import registry  # local: the registered classes import config

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
        ("train.micro_batch_tokens", cfg.train.micro_batch_tokens >= 0, "must be >= 0 (0 = no slicing)"),
        ("train.max_steps_per_task", cfg.train.max_steps_per_task >= 0, "must be >= 0"),
        ("train.warmup_steps", cfg.train.warmup_steps >= 0, "must be >= 0"),
        ("train.checkpoint_every", cfg.train.checkpoint_every >= 0, "must be >= 0"),
        ("train.keep_checkpoints", cfg.train.keep_checkpoints >= 1, "must be >= 1"),
        ("train.ewc_lambda", cfg.train.ewc_lambda >= 0, "must be >= 0"),
        ("train.ewc_samples", cfg.train.ewc_samples >= 1, "must be >= 1"),
        ("olora.lambda_orth", cfg.olora.lambda_orth >= 0 and math.isfinite(cfg.olora.lambda_orth), "must be >= 0"),
        ("olora.lambda_l2", cfg.olora.lambda_l2 >= 0 and math.isfinite(cfg.olora.lambda_l2), "must be >= 0"),
        ("nlora.lambda_l1", cfg.nlora.lambda_l1 >= 0 and math.isfinite(cfg.nlora.lambda_l1), "must be >= 0"),
        ("data.n_train", cfg.data.n_train >= 0, "must be >= 0"),
        ("data.n_test", cfg.data.n_test >= 0, "must be >= 0"),
        ("lora.r", cfg.lora.r >= 1, "must be >= 1"),
        ("lora.alpha", cfg.lora.alpha > 0, "must be > 0"),
        ("lora.dropout", 0.0 <= cfg.lora.dropout < 1.0, "must be in [0, 1)"),
        ("lora.target_modules", len(cfg.lora.target_modules) > 0, "must name at least one module"),
        ("model.max_length", cfg.model.max_length >= 8, "must be >= 8"),
        ("eval.batch_size", cfg.eval.batch_size >= 1, "must be >= 1"),
        ("eval.max_new_tokens", cfg.eval.max_new_tokens >= 0, "must be >= 0"),
        ("eval.max_new_cap", cfg.eval.max_new_cap >= 1, "must be >= 1"),
        ("log_every", cfg.log_every >= 1, "must be >= 1"),
        ("prompts.length", cfg.prompts.length >= 1, "must be >= 1"),
        ("prompts.lr", cfg.prompts.lr > 0 and math.isfinite(cfg.prompts.lr), "must be > 0"),
        ("prompts.mlp_hidden", cfg.prompts.mlp_hidden >= 1, "must be >= 1"),
    ]
    for key, ok, why in checks:
        if not ok:
            raise SureclError(f"{key}: {get_key(cfg, key)!r} {why}")
    _check_finite(cfg.to_dict(), "")
    if cfg.replay.ratio:
        replay_ratio(cfg.replay.ratio)  # raises on a malformed ratio
    per_task_values(cfg.olora.per_task, "olora.per_task", 2)
    per_task_values(cfg.nlora.per_task, "nlora.per_task", 1)
    for name, (epochs,) in per_task_values(cfg.train.epochs_per_task, "train.epochs_per_task", 1).items():
        if epochs < 1 or epochs != int(epochs) or epochs > 1000:
            raise SureclError(f"train.epochs_per_task: {name}:{epochs:g} must be a whole number of epochs from 1 to 1000")
    if cfg.replay.buffer_size > 0 and cfg.replay.buffer_size >= 1 and cfg.replay.buffer_size != int(cfg.replay.buffer_size):
        raise SureclError(f"replay.buffer_size: {cfg.replay.buffer_size!r} must be a fraction below 1 or a whole count")
    for i, entry in enumerate(cfg.data.hf):
        key = f"data.hf[{i}]"
        if not entry.path.strip():
            raise SureclError(f"{key}.path: empty; give a dataset folder, a data file or a hub id")
        if not (0.0 <= entry.test_fraction < 1.0):
            raise SureclError(f"{key}.test_fraction: {entry.test_fraction!r} must be in [0, 1) (0 = read {key}.test_split)")
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
    registry.method_class(cfg.method).validate_config(cfg)  # combinations the method cannot run
    return cfg


# ----------------------------------------------------------------------------------------
# generic tree handling


def _type_words(types_: Any) -> str:
    """``(float, str)`` -> ``"a float or a str"`` (the members of a union, for an error)."""
    return " or ".join(f"a {t.__name__}" for t in types_)


def _beta_ok(beta: float | str) -> bool:
    if isinstance(beta, str):
        return beta == "auto"
    return 0.0 < beta < 1.0


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
        # the first member the value converts to (``float | str``: a number, else a word)
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
        if isinstance(value, (dict, list)):
            raise SureclError(f"{key}: expected a string, got {value!r}")
        return str(value)
    raise SureclError(f"{key}: unsupported type {typ}")


def _apply_mapping(obj: Any, mapping: dict[str, Any], prefix: str, source: str) -> None:
    types_ = _field_types(type(obj))
    for name, value in mapping.items():
        key = f"{prefix}{name}"
        if name not in types_:
            known = ", ".join(types_)
            raise SureclError(f"{source}: unknown config key {key!r} (known here: {known})")
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
            f"point (e.g. {int(number) if number.is_integer() else 300}) or a fraction as replay.buffer_fraction (e.g. 1.0 = every example)"
        )
    return int(number) if number >= 1 and number.is_integer() else number


def apply_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply ``key.sub=value`` strings (YAML-parsed values) to ``cfg`` in place."""
    for item in overrides:
        if "=" not in item:
            raise SureclError(f"override {item!r} must look like key.sub=value")
        dotted, raw = item.split("=", 1)
        dotted = dotted.strip()
        try:
            value = safe_yaml(raw, f"override {dotted}") if raw.strip() else ""
        except (yaml.YAMLError, RecursionError):
            value = raw
        if value is None:
            value = raw
        if dotted in RAW_STRING_KEYS:  # YAML 1.1 reads an unquoted 1:2 as the base-60 number 62
            value = raw.strip().strip("'\"")
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


def safe_yaml(text: str, source: str) -> Any:
    """``yaml.safe_load(text)``, refusing (one line naming ``source``) a document whose aliases
    expand beyond :data:`YAML_NODES` nodes, before anything is built from it."""
    loader = yaml.SafeLoader(text)
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
    else:
        if path_or_preset not in preset_names():
            raise SureclError(
                f"unknown preset {path_or_preset!r} (choose from {', '.join(preset_names())}, or give a .yaml path)"
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


def build_config(config: str | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Default tree <- presets/YAML files (comma-separated, applied in order) <- overrides.

    A preset is of ``kind: method`` (what to run: replay, dual, method) or ``kind: setting``
    (where: model, data, sizes). Without any method preset, ``slow_surprise`` comes first.
    """
    cfg = RunConfig()
    names = [c.strip() for c in (config or "").split(",") if c.strip()]
    loaded = [(name, *load_yaml(name)) for name in names]
    if not any(data.get("kind", "method") == "method" for _, data, _ in loaded):
        loaded.insert(0, (DEFAULT_PRESET, *load_yaml(DEFAULT_PRESET)))
    guarded: dict[str, tuple[str, Any]] = {}  # key -> (method preset, its value) that later presets may not change
    conflicts: dict[str, str] = {}
    for name, data, source in loaded:
        body = {k: v for k, v in data.items() if k not in META_KEYS}
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
    overridden = {item.split("=", 1)[0].strip() for item in overrides or []}
    for key, message in conflicts.items():
        if key not in overridden:  # an explicit override decides
            raise SureclError(message)
    apply_overrides(cfg, overrides or [])
    return validate(cfg)


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Rebuild a config saved in results/checkpoints."""
    cfg = RunConfig()
    _apply_mapping(cfg, data, "", "saved config")
    return validate(cfg)


def same_config(saved: dict[str, Any], cfg: RunConfig) -> bool:
    """Whether a config saved by an earlier run (results, checkpoints) is ``cfg``.

    The saved tree is rebuilt first, so keys added to the config since then take their
    defaults: a finished or checkpointed run stays resumable when a later version adds an
    option whose default keeps the old behaviour. A saved key that no longer exists, or a
    saved value that no longer validates, is a different config. A section only one method
    reads (:data:`METHOD_SECTIONS`) counts only for that method, and the dual learner's options
    only where they are read (:func:`_read_only`): a changed default of N-LoRA's strength or of
    the EMA rate does not make a finished SeqLoRA run a different run."""
    try:
        old, new = config_from_dict(saved).to_dict(), cfg.to_dict()
    except SureclError:
        return False
    for section, readers in METHOD_SECTIONS.items():
        if old.get("method") not in readers and new.get("method") not in readers:
            old.pop(section, None)
            new.pop(section, None)
    return _read_only(old) == _read_only(new)


RESULT_NEUTRAL = (("train", "keep_checkpoints"), ("log_every",))
"""Options that change no result (how many checkpoints stay on disk, how often log.jsonl gets a
line): a resumed or finished run may differ in them."""


def _read_only(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` without the dual learner's options a run does not read (all but ``enabled``
    when the slow adapter is off, ``window_tasks`` when ``beta`` is a number) and without the
    :data:`RESULT_NEUTRAL` options."""
    dual = dict(tree.get("dual", {}))
    if not dual.get("enabled"):
        dual = {"enabled": dual.get("enabled", False)}
    elif dual.get("beta") != "auto":
        dual.pop("window_tasks", None)
    tree = {**tree, "dual": dual}
    for path in RESULT_NEUTRAL:
        if len(path) == 1:
            tree.pop(path[0], None)
        elif isinstance(tree.get(path[0]), dict):
            tree[path[0]] = {k: v for k, v in tree[path[0]].items() if k != path[1]}
    return tree


METHOD_SECTIONS: dict[str, tuple[str, ...]] = {"olora": ("olora",), "nlora": ("nlora",), "prompts": ("progressive_prompts",)}
"""Config sections that one method alone reads (its own options), by the methods that read them."""
