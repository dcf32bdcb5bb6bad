"""The core sections of a run's configuration: model, data, LoRA, replay, dual learner,
training and evaluation, as plain dataclasses.

The bottom layer: it imports nothing of surecl, so every module may use these types
(:mod:`surecl.adapters`, :mod:`surecl.model`, the replay policies) without importing the
assembled :class:`surecl.config.RunConfig`, which knows the registered methods' sections
(:mod:`surecl.registry`). :mod:`surecl.config` re-exports every name here.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    """Which model to adapt and how to hold its frozen weights."""

    name: str = "smollm2-135m"
    """``smollm2-135m`` (embedded), ``tiny`` (random, built in code), or a HF name / local path."""
    dtype: str = "auto"
    """Dtype of the frozen base: ``auto`` (bf16 where supported), ``bf16``, ``fp32``."""
    trust_remote_code: bool = False
    attn_implementation: str = "auto"
    """The attention kernels: ``auto`` (transformers' choice: ``sdpa``, torch's fused kernels,
    for the models here), ``sdpa`` or ``eager`` (plain matrix products and softmax: slower and
    more memory, but none of the fused kernels' numerics; the check to make when a run on an
    accelerator stops on a non-finite gradient from a finite loss)."""
    max_length: int = 128
    """Tokens kept per example. Classification: the prompt's (its sentence is cut, at least one
    token kept; instruction, options and the answer never, the answer coming on top). Generation
    and chat: prompt + target; a target longer than the prompt leaves is cut to
    ``max(max_length - prompt tokens, max_length // 2)`` tokens and the prompt then cut to the
    rest (a prompt / response row's input at its end; a conversation in its middle: its opening,
    the template's start, any system turn and the first user turn up to the end of the
    instruction, and its last turns stay, and only where that opening would take over half the
    room is the conversation cut from its start). A generation task's test prompt leaves room
    for the task's answer budget instead of its own target (``eval.answer_budget``). Text: the
    start token and the document's first ``max_length - 1`` tokens. Cut targets and inputs are
    counted and logged per task; a cut end is neither trained nor scored."""
    encoder_eos: bool = False
    """Encoder-decoder models: end the encoder input (the prompt) with the end-of-sequence
    token, as the T5 tokenizer does by default and the reference code of the paper and of
    O-LoRA do (``tokenizer(source)``): every prompt, classification, generation and chat,
    training and test rows, the EOS counted in ``max_length`` (the prompt's text is cut to make
    room, never that EOS). The ``paper-t5`` preset sets it; off by default so earlier T5 runs
    keep their inputs. Not read for causal models."""
    share_prefix: bool = True
    """Run the prompt prefix that a batch's rows share (a task's instruction and options) once
    per batch and let the rows attend to its KV cache, in scoring, training and evaluation of
    causal models: the same results for fewer tokens. Training slices are cut by task where a
    task's rows save enough prefix tokens to pay for a slice of their own. With
    ``lora.dropout`` > 0 the shared tokens draw one dropout mask per slice, not one per row.
    Not for a model whose attention uses a sliding window shorter than its positions (Mistral,
    Gemma-2/3): transformers places that window by index in the padded batch, where a row's
    left padding sits after the shared prefix, so the run turns this off for such a model, with
    a note in the log, and runs every row whole."""


@dataclass
class HFTaskConfig:
    """One ``data.hf`` task: a Hugging Face ``datasets`` source and how to read it. In YAML or
    an override a plain string is the ``path``, every other field at its default."""

    path: str = ""
    """A folder written by ``save_to_disk`` (a ``DatasetDict``, or one ``Dataset``: its rows are
    the ``train`` split), a data file (``.parquet``, ``.csv``, ``.json``, ``.jsonl``: one
    ``train`` split), a folder of such files (each file is the split its name names:
    ``train.csv``, ``test.parquet``, the hub's shards ``train-00000-of-00002.parquet``; a file
    of a split the entry does not read, such as ``validation.csv`` or ``train_extra.csv``, is left
    out with a warning; one split in two formats is refused), or a hub id (``owner/name``) where the hub is reachable. A CSV
    field is its text (``01``, ``True``, ``42`` stay those words; only an empty field is missing).
    A ``split`` column marking rows ``test`` in a split read for training is refused (a surecl
    JSONL file goes in ``data.jsonl``, which honours it)."""
    name: str = ""
    """The dataset's configuration name (``load_dataset(path, name)``), for hub datasets that have several."""
    task: str = ""
    """The task's name in the stream; default: the file or folder name without its suffix (a
    hub id's last part, with ``-<name>`` when a configuration is named)."""
    text_column: str = "text"
    """The column holding the input text (strings)."""
    label_column: str = "label"
    """The column holding the answer: strings, or integers, which are the column's
    ``ClassLabel`` names where it has them (stripped and NFC-composed as every label), else the
    i-th of ``labels`` (from 0) where those are given as names, else the number as a string. In
    a CSV file a field that writes a whole number is such an integer only where it is a position
    (``labels`` given as names); else it is its text. Not read for ``data.kind=text``."""
    train_split: str = "train"
    test_split: str = "test"
    test_fraction: float = 0.0
    """Above 0 (and below 1): the test split is this fraction of the train split, held out by
    a fixed draw per task name (the same for every run seed and method), and ``test_split`` is
    not read. For sources with one split (a data file, one saved ``Dataset``)."""
    labels: list[str] = field(default_factory=list)
    """The task's label set, in order (the options of its prompt); default: the column's
    ``ClassLabel`` names, else the sorted distinct labels of both splits (a run warns of a label
    seen only in the test split). A row whose label is not among them is an error (or dropped
    with ``data.invalid_labels=drop``)."""
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
    """``embedded`` (offline default), ``instruct`` (four real instruction tasks with free-form
    answers, built once from the ``bigbench`` package: :mod:`surecl.data.instruct`), ``tiny``
    (fixture), ``none`` (only ``data.jsonl`` / ``data.hf`` tasks), or a path to a CL_Benchmark folder."""
    order: str = "default"
    """A task order: ``1``..``6`` for CL_Benchmark, ``default`` for the benchmark's own order
    (``tiny`` and ``none`` have only theirs: a sweep over several orders of them is refused
    unless each order gives its task list)."""
    tasks: list[str] = field(default_factory=list)
    """Explicit task names in training order; overrides ``order``. With a benchmark it chooses
    among the benchmark's tasks (``jsonl`` / ``hf`` tasks follow them); with ``none`` among the
    ``jsonl`` / ``hf`` tasks; from Python, among the tasks passed in (``tasks=``). A name not in
    the stream is refused."""
    jsonl: list[str] = field(default_factory=list)
    """User tasks, one JSONL file each (see README); appended after benchmark tasks. Refused
    beside tasks passed in from Python (``tasks=``), which the run reads instead."""
    hf: list[HFTaskConfig] = field(default_factory=list)
    """User tasks read with Hugging Face ``datasets`` (``pip install surecl[hf]``), one per
    entry: a path or hub id, or a mapping of :class:`HFTaskConfig` fields (column names,
    splits, labels); appended after the JSONL tasks. Refused beside ``tasks=`` as ``jsonl`` is."""
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
    text_start: str = "auto"
    """The one token before every document of a ``text`` task (continual pre-training), from
    which its first token is predicted, in training and in perplexity: ``auto`` (the
    tokenizer's BOS, else its EOS, as lm-evaluation-harness's HFLM prefixes), ``bos``, ``eos``,
    or a token of the tokenizer's vocabulary written as it is (``<|endoftext|>``: the document
    separator SmolLM2's base was pre-trained with, where the Instruct tokenizer's BOS is the
    chat-turn opener ``<|im_start|>``)."""
    n_train: int = 240
    """Training examples kept per task (0 = all). The default sizes keep the embedded run
    within 10 minutes on a 2-core CPU with AVX512-BF16 (18 on one with AVX2 only: RESULTS.md §1) while every task is learned well above its zero-shot
    accuracy (30 steps per task); the paper uses 1000 (LNT) or 5000 (Standard CL) / 500 test."""
    n_test: int = 100
    """Test examples kept per task (0 = all)."""
    train_sampling: str = "balanced"
    """How ``n_train`` rows are drawn: ``balanced`` (round-robin over labels; the default, so a
    sample of at least as many rows as classes holds every class, their counts within one of each
    other while every class has rows left, a class with fewer taken whole; with fewer rows than classes each seed holds its own draw of classes) or ``random`` (uniform, keeping the class priors: the
    paper's protocol, "randomly select"). A ``data.kind=text`` stream's documents have no labels
    (:meth:`Task.as_text` drops them before sampling), so both draw them at random there."""
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
    the stream's task order, so every (order, seed) run is an independent draw of data; its runs of one seed still share the
    seed's LoRA initialisation, batch order and replay draws) or ``run`` (as ``order``, and
    those random streams are seeded from (seed, order) too, so every (order, seed) run is
    independent in everything; the packaged study plans set it). ``surecl report`` reads it to
    choose the unit of its intervals."""
    test_draw: str = "after_train"
    """Where a task's test sample comes from: ``after_train`` (the random stream that drew its
    train sample goes on to draw the test sample, so the test rows depend on ``n_train``: runs
    that differ in ``n_train`` are tested on other rows) or ``own`` (a stream of its own, keyed
    by the seed, the draw key and the task, so every ``n_train`` is tested on the same rows:
    what a data-size ablation needs). ``after_train`` is the default because every run made
    before the key existed drew that way, and a finished run stays the run it was."""
    allow_missing: bool = False
    """Run the available tasks of an order when the folder lacks some, instead of failing."""
    invalid_labels: str = "error"
    """Rows whose label is not in the task's labels: ``error`` (default) or ``drop`` them (the
    run prints how many per task; CL_Benchmark's MNLI test split has 131 rows labelled ``-``)."""

    def __post_init__(self) -> None:
        # From Python, a data.hf entry may be a plain path, as in YAML.
        if isinstance(self.hf, list):
            self.hf = [HFTaskConfig(path=e) if isinstance(e, str) else e for e in self.hf]


ALL_LINEAR = "all-linear"
"""The ``lora.target_modules`` entry (alone) that names every linear layer but the output
head: PEFT's shorthand, which QLoRA-style recipes use (:func:`surecl.adapters.resolve_targets`)."""


@dataclass
class LoraConfig:
    """LoRA adapter shape (paper: rank 8, alpha 32, dropout 0.1 on Q and V). ``target_modules``
    names layers as PEFT matches them (a whole name or its end after a dot), or is
    ``[all-linear]``: every linear layer but the output head."""

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
    """S as a fraction of all training examples of the stream, in (0, 1]; replaces
    ``buffer_size`` when above 0 (a ``buffer_size`` set beside it is not read: the run warns).
    1 gives a capacity of every example: ``reservoir`` can keep them all, but a per-task quota
    policy (``surprise``, ``random``) keeps floor(S/d) per task after d tasks, the paper's rule,
    so the remainder S - d floor(S/d) stays unused and a task with fewer rows than its quota
    leaves the rest of its share empty (the run and the dry run warn how many of S it keeps)."""
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
    """Re-score replayed items with their surprise at the step that replays them. Only
    replayed items are re-scored: one never replayed keeps the score it was selected with
    (under the model of its task's selection), while a replayed one carries its surprise under
    a model that has since trained on it, usually lower; a later task's smaller quota ranks
    both together, so replayed items are dropped first (the paper's "replaying decreases
    surprise, making it more likely to be replaced"), not the buffer re-ranked by what is
    surprising now. With one process, ``scope=label`` and ``reduction=mean`` (or any reduction
    for ``online_surprise``, whose fresh entries are step losses too) the new score is the
    step's own forward (before its update, in train mode: with ``lora.dropout`` > 0 under its
    masks, while the buffer's first scores are taken without dropout); otherwise (another scope
    or reduction, or several processes) the replayed items are scored again right after the
    update, in eval mode, as a task's surprise is (the same scoring, under a later model)."""
    every: int = 2
    """Replay every k-th optimizer step (not read when ``ratio`` is set)."""
    batch_size: int = 4
    """Replayed examples joined to the current batch on a replay step (not read when ``ratio`` is set)."""
    ratio: str = ""
    """The replay ratio ``a:b``: a replayed examples per b new ones, counted over the task's
    stream of new examples (after N new examples of a task, floor(N a / b) have been replayed),
    so every step of B new examples replays about B a / b of them: ``1:2`` is the paper's
    ratio (its reference code's trainer pairs one buffer example with every second
    micro-batch of one example by its trainer's default ``replay_frequency`` 2, though its argparse default 1,
    which its scripts keep, gives 1:1; docs/faithfulness.md), ``1:4`` ... ``1:16`` its ablation's.
    Empty (default): ``batch_size`` examples every ``every``-th step."""
    replacement: bool = False
    """How a step's replayed examples are drawn from the buffer: ``false`` (default) one draw
    without replacement, so they are distinct while the buffer holds as many (with replacement
    only past that); ``true`` each on its own, uniformly with replacement, so a step may replay
    an example twice: the paper's reference code, which draws one buffer example per
    micro-batch of one (``get_data(1)``), and the ``paper-*`` presets. At the paper's scale
    (S = 300, 32 replayed a step) a step repeats an example with probability
    1 - prod_{k<32} (1 - k/S) = 0.82."""
    loss: str = "joint"
    """How the step's examples enter its loss: ``joint`` (default): the token mean over the
    whole mixed batch, so an example weighs by its answer tokens; ``example`` (the reference's,
    and the paper presets'): each example's own token-mean loss, each replayed example paired
    with a new one (in turn), a pair's loss the mean of its members', and the step's loss the
    mean over the new examples of their (pair) losses, on every step (a step without replay:
    the mean of its examples' token means): ``(outputs.loss + replay_outputs.loss) / 2`` per
    micro-batch of one example, or ``outputs.loss`` alone where it replays nothing, averaged
    over the accumulated micro-batches, as the reference's ``training_step`` and the
    ``Trainer``'s accumulation do; ``pair``: the same on steps that replay, the joint token mean
    on steps that do not (an empty buffer, ``replay.every`` > 1, a method without replay):
    what ``pair`` always meant, kept so that runs made with it stay the same runs."""

    def unread(self) -> dict[str, str]:
        """The keys of this section a run does not read, whatever their values, each with what
        sets its part instead: ``buffer_size`` under ``buffer_fraction`` > 0; ``every`` and
        ``batch_size`` under ``ratio``. The run warns where the user sets one off its default
        (:func:`surecl.config.config_warnings`; surecl's presets' values say nothing); a sweep refuses a grid axis over one
        (:func:`surecl.sweep.check_grid_read`)."""
        unread = {}
        if self.buffer_fraction > 0:
            unread["replay.buffer_size"] = f"replay.buffer_fraction={self.buffer_fraction:g} sets S"
        if self.ratio:
            for key in ("every", "batch_size"):
                unread[f"replay.{key}"] = f"replay.ratio={self.ratio} sets every step's replayed count"
        return unread


@dataclass
class DualConfig:
    """Fast/slow dual learner: slow = EMA(beta) of fast after every optimizer step (or every
    training example, ``unit``)."""

    enabled: bool = False
    beta: float | str = "auto"
    """The EMA rate: ``auto`` (default), the rate whose window 1/(1-beta) is ``window_tasks``
    tasks of this stream, beta = 1 - 1/(window_tasks x S) with S the first task's optimizer
    steps; or a number in (0, 1) (the paper's 0.995: a window of 200 updates, 200 optimizer steps
    with ``unit: step``; the ``paper-*`` presets pin it once per training example, 0.995^64 = 0.73
    per step of 64, a window of about 3.6 steps). Whether the slow adapter helps or lags depends on the window against the
    steps per task: half a task was the one rule measured at or above the fast adapter on
    every stream measured from 15 to 150 steps per task, where bias-corrected 0.995 fell below
    it at 15 to 50 steps per task, by up to 13 points (RESULTS.md §3, §4;
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
    several tasks means mostly one task per batch: MTL lost 4 to 10 FP points to it against
    uniform batches (RESULTS.md §2, ``python bench/mtl_check.py``)."""
    epochs_per_task: list[str] = field(default_factory=list)
    """Per-task epochs, ``"<task>:<epochs>"`` each (e.g. ``MNLI:2``, as O-LoRA's ``long.sh``
    trains MNLI); a task not named trains ``epochs``. In MTL's one stage too: its later epochs
    mix only the tasks with epochs left."""
    grad_clip: float = 1.0
    max_steps_per_task: int = 0
    """Cap on optimizer steps per task (0 = no cap); MTL's one stage of every task gets the cap
    times the number of tasks."""
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
    likelihood), or ``perplexity`` (the metric of ``data.kind=text`` streams; lower is better).
    Generation tasks (free text, no options) are generated and scored in their metric whatever
    it says (a run with ``rank`` on them warns)."""
    before: bool = True
    """Also evaluate every task before any training (the "without fine-tuning" row), so a run
    shows what training added."""
    fast: bool = True
    """In a dual run, also evaluate the fast adapter after every task: ``results.json`` gets
    its matrix under ``fast`` beside the slow one's. For most methods the fast adapter is
    trained exactly as the same method without the dual learner, so one run gives both rows
    on one trajectory (paired comparison); not for a method whose training reads the slow
    adapter (``Method.fast_is_solo`` False: I-LoRA's fast row is its plastic adapter, trained
    with the slow one's consistency term), as its report says. Costs a second evaluation."""
    matrix: str = "full"
    """Which cells of the accuracy matrix to fill: ``full`` (every task seen so far, after
    every task: N(N+1)/2 evaluations) or ``fp_ap`` (only what FP, AP, forgetting and BWT need:
    each task right after it is learned, and every task after the last: 2N-1 evaluations;
    for long streams, where the full matrix costs more than training)."""
    batch_size: int = 32
    max_new_tokens: int = 0
    """0 = the task's longest answer as encoded, what ends it included, plus one: a label's
    tokens + 2 (the label's, its EOS and one more); a generation task's answer budget
    (``eval.answer_budget``: its longest training target with what ends it, EOS or the chat
    template's end of turn, plus one), at most ``eval.max_new_cap``. Set, it is every task's
    budget, under either ``eval.answer_budget``."""
    max_new_cap: int = 256
    """The most new tokens a generation task's answers get when ``eval.max_new_tokens`` is 0."""
    answer_budget: str = "train"
    """How a generation task's answer budget (the tokens generated per test row, unless
    ``eval.max_new_tokens`` sets it) is set, and how much of each test prompt is kept:
    ``train`` (default) = the task's longest training target as encoded (a conversation's
    longest assistant turn, with what ends it) plus one, at most ``eval.max_new_cap`` (a task
    with no training rows, such as the general-ability probe's fixed draw: its own longest
    test target plus one); every test prompt of the task is cut to leave room for that same
    budget (at most ``model.max_length // 2`` of it), and each reference is scored whole. So a
    row's answer depends neither on which other rows the test sample drew nor on its own gold
    answer's length. ``references`` = the task's longest test reference plus one, each test
    prompt cut to leave room for its own reference (a reference cut to fit is scored as kept):
    every run before the key ran it, and a saved config without the key (results.json,
    config.yaml, a checkpoint) is read as it. Labelled tasks take their budget from the label
    set either way."""
    ahead: bool = False
    """After each task also evaluate the next one, not yet trained (the matrix's cell above the
    diagonal): with the before-training row (``eval.before``, which forward transfer needs:
    without it ``fwt`` in results.json is null and the run warns), what forward transfer is
    computed from. One more evaluation per task."""
    general: str = "none"
    """The general-ability probe, measured before the first task and after every task under the
    evaluation adapter (and the fast one with ``eval.fast``), on data the stream never trains
    on, so a run shows what the stream cost the model beyond its tasks (``general`` in
    results.json, a row per part in report.md): ``none`` (off), ``default`` (the packaged probe:
    the perplexity of general text, WikiHow articles, and ROUGE-L on a held-out instruction
    set of four tasks the ``instruct`` stream does not hold, built once into the cache from
    the ``bigbench`` package with that stream), or a path: a folder with ``text.jsonl``
    (``{"text": ...}`` rows) and/or ``instruct.jsonl`` (generation rows, as ``data.jsonl``
    reads them), or one such JSONL file (:mod:`surecl.data.general`)."""
    general_n: int = 100
    """Rows of each probe part kept (0 = all), by a fixed draw: every seed and method measures
    the same rows."""
    references: str = "rows"
    """How a generation task's test rows that share an input (a prompt with several references:
    the ``instruct`` stream's ``restaurant``) are scored: ``rows`` (each row alone, so a prompt
    counts once per reference and its score is the mean over them; every run before the key)
    or ``max`` (the rows are one instance, answered once, whose score is its best reference;
    the task's score is the mean over instances, as Super-NaturalInstructions' ``compute_metrics``
    scores ROUGE-L and exact match). Classification accuracy scores each row alone either way.
    ``predictions.jsonl`` keeps one line per test row, scored against its own target."""
