"""Accuracy of the current model on a task: greedy generation with normalised exact match
(the paper's protocol) or ranking the label options by likelihood; perplexity for text streams;
a generation task's free-form answers scored by ROUGE-L (``rouge-score``'s, F-measure, Porter
stemming, Super-NaturalInstructions' metric) or exact match after SQuAD's normalisation. Test
rows that share an input are scored each alone (``eval.references=rows``: a prompt's score is
averaged over its references) or as one instance whose score is its best reference
(``eval.references=max``, as Super-NaturalInstructions' ``compute_metrics`` scores).

Generation is greedy, batched over length-sorted, left-padded prompts with the KV cache, for at
most (longest answer + 1) new tokens, stopping when every row emitted EOS; for causal models
the prompt prefix a batch shares (the task's instruction and options) runs once per batch. An
encoder-decoder's ``generate`` runs plain greedy search too (:func:`plain_greedy`): nothing of
its checkpoint's ``generation_config.json`` applies.
"""

from __future__ import annotations

import math
import re
from contextlib import contextmanager

import torch

from surecl.data.encode import Encoded, collate
from surecl.errors import SureclError
from surecl.metrics import _PUNCT, METRIC_NAMES, is_label, normalise  # noqa: F401  (re-exported: how reports name each metric; exact match)
from surecl.nll import prefix_sharing, prefixed, token_nll


@torch.inference_mode()
def generate_answers(
    model, tokenizer, items: list[Encoded], *, is_seq2seq: bool, max_new_tokens: int, batch_size: int, device, share_prefix: bool = True,
    stop_ids: list[int] | None = None,
) -> list[str]:
    """Greedy answers, decoded without special tokens. ``stop_ids`` (a generation task: EOS and
    a chat template's end-of-turn token): a row stops at the first of them and its answer is
    what came before it, stripped."""
    stop = stop_ids if stop_ids else tokenizer.eos_token_id
    order = sorted(range(len(items)), key=lambda i: len(items[i].prompt))
    answers = [""] * len(items)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        rows = [items[i] for i in idx]
        if is_seq2seq:
            batch = collate(rows, tokenizer.pad_token_id, True, with_answer=False)
            with plain_greedy(model, max_new_tokens=max_new_tokens, eos_id=stop, pad_id=tokenizer.pad_token_id) as config:
                new = model.generate(
                    input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device), generation_config=config,
                )[:, 1:]  # the decoder's start token first (BART's is its EOS, which would end every answer at once)
        else:
            batch = {k: v.to(device) for k, v in collate(rows, tokenizer.pad_token_id, False, with_answer=False, share_prefix=prefix_sharing(model, share_prefix)).items()}
            new = greedy(model, batch, max_new_tokens=max_new_tokens, eos_id=stop, pad_id=tokenizer.pad_token_id)
        if stop_ids:
            rows_ids = [_until(row, set(stop_ids)) for row in new.tolist()]
            for i, text in zip(idx, tokenizer.batch_decode(rows_ids, skip_special_tokens=True)):
                answers[i] = text.strip()
            continue
        for i, text in zip(idx, tokenizer.batch_decode(new, skip_special_tokens=True)):
            answers[i] = text
    return answers


@contextmanager
def plain_greedy(model, *, max_new_tokens: int, eos_id: int | list[int], pad_id: int):
    """A ``GenerationConfig`` for an encoder-decoder's ``generate`` that is greedy search and
    nothing else: one beam, no sampling, the decoder start the model trains with, ``eos_id``
    and ``pad_id``, ``max_new_tokens``. Meanwhile the model's own ``generation_config`` (the
    checkpoint's ``generation_config.json``) is a blank one: ``generate`` fills every field a
    given config leaves unset from it, so BART-CNN's forced BOS, ``min_length`` and
    ``no_repeat_ngram_size`` (or mBART's language BOS) would still apply, at decoder positions
    training never saw and unlike the causal models' :func:`greedy`. It is back when the
    block ends."""
    from transformers import GenerationConfig

    from surecl.model import decoder_start

    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model  # a PeftModel's transformers model
    own = getattr(base, "generation_config", None)
    start = decoder_start(base) if hasattr(base, "config") else None
    config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, decoder_start_token_id=start,
                              eos_token_id=eos_id, pad_token_id=pad_id)
    if own is None:  # no transformers model: nothing to fill the config from
        yield config
        return
    base.generation_config = GenerationConfig()
    try:
        yield config
    finally:
        base.generation_config = own


def _until(row: list[int], stop: set[int]) -> list[int]:
    """A generated row up to (not including) its first stop token."""
    for k, t in enumerate(row):
        if t in stop:
            return row[:k]
    return row


def greedy(model, batch: dict[str, torch.Tensor], *, max_new_tokens: int, eos_id: int | list[int], pad_id: int) -> torch.Tensor:
    """Greedy decoding of a causal batch (left-padded prompts, optionally behind a shared
    prefix) with the KV cache: [rows, <= max_new_tokens] new tokens, ``pad_id`` after a row's
    EOS, stopping as soon as every row has emitted EOS (``generate``'s greedy search).
    ``eos_id`` may list several tokens, any of which ends a row."""
    out, mask = _prompt_pass(model, batch)
    stops = torch.tensor(eos_id, device=mask.device) if isinstance(eos_id, (list, tuple)) else None
    pos = batch["position_ids"][:, -1:]
    done = torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
    new = []
    for step in range(max_new_tokens):
        token = out.logits[:, -1].argmax(-1).masked_fill(done, pad_id)
        new.append(token)
        done |= (token == eos_id) if stops is None else torch.isin(token, stops)
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
        pos = pos + 1
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=pos, past_key_values=out.past_key_values, use_cache=True)
    return torch.stack(new, 1) if new else batch["input_ids"].new_zeros(mask.shape[0], 0)


def _prompt_pass(model, batch: dict[str, torch.Tensor]):
    """One forward over a batch of prompts (behind their shared prefix, if any) with the KV
    cache, logits for the last position only; returns the output and the rows' full attention
    mask (prefix included), which continues into the tokens that follow."""
    kwargs, _ = prefixed(model, batch, want_logits=False, pads_self=False)  # the mask grows with each new token: 2D
    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=True, logits_to_keep=1, **kwargs)
    return out, kwargs["attention_mask"]


def rank_answers(
    model, items: list[Encoded], options: dict[str, list[int]], *, pad_id: int, is_seq2seq: bool, batch_size: int, device, share_prefix: bool = True
) -> list[str]:
    """The label whose answer tokens are most likely given the prompt."""
    labels = list(options)
    scores = option_logprobs(
        model, items, options, pad_id=pad_id, is_seq2seq=is_seq2seq, batch_size=batch_size, device=device, share_prefix=share_prefix
    )
    return [labels[j] for j in scores.argmax(1).tolist()]


@torch.inference_mode()
def option_logprobs(
    model, items: list[Encoded], options: dict[str, list[int]], *, pad_id: int, is_seq2seq: bool, batch_size: int, device, share_prefix: bool = True
) -> torch.Tensor:
    """Summed log-likelihood of each option's answer tokens given each prompt: [items, options].

    Causal models run each prompt once (and the prefix the batch's prompts share once per
    batch): its KV cache is repeated for the L options, which then cost only their own few
    tokens. Seq2seq models score (prompt, option) pairs.
    """
    labels = list(options)
    if is_seq2seq:
        pairs = [Encoded(e.prompt, options[lab], lab) for e in items for lab in labels]
        nll = torch.zeros(len(pairs))
        for start in range(0, len(pairs), batch_size):
            batch = {k: v.to(device) for k, v in collate(pairs[start : start + batch_size], pad_id, True).items()}
            total, _ = token_nll(model, batch, scope="label", is_seq2seq=True)
            nll[start : start + len(total)] = total.cpu()
        return -nll.view(len(items), len(labels))
    n_opt = len(labels)
    width = max(len(options[lab]) for lab in labels)
    ans = torch.full((n_opt, width), pad_id, dtype=torch.long)
    ans_mask = torch.zeros((n_opt, width), dtype=torch.long)
    for j, lab in enumerate(labels):
        ans[j, : len(options[lab])] = torch.tensor(options[lab])
        ans_mask[j, : len(options[lab])] = 1
    ans, ans_mask = ans.to(device), ans_mask.to(device)
    order = sorted(range(len(items)), key=lambda i: len(items[i].prompt))
    result = torch.zeros(len(items), n_opt)
    rows = max(1, batch_size // n_opt)
    for start in range(0, len(order), rows):
        idx = order[start : start + rows]
        batch = {k: v.to(device) for k, v in collate([items[i] for i in idx], pad_id, False, with_answer=False, share_prefix=prefix_sharing(model, share_prefix)).items()}
        out, prompt_mask = _prompt_pass(model, batch)
        first = torch.log_softmax(out.logits[:, -1].float(), -1)  # predicts each answer's first token
        cache = out.past_key_values
        cache.batch_repeat_interleave(n_opt)
        b = len(idx)
        ids = ans.repeat(b, 1)
        mask = torch.cat([prompt_mask.repeat_interleave(n_opt, 0), ans_mask.repeat(b, 1)], 1)
        pos = batch["position_ids"][:, -1:].repeat_interleave(n_opt, 0) + 1 + torch.arange(width, device=device)
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=False).logits.float(), -1)
        # token t of an answer is predicted by the prompt's last position (t = 0) or answer token t-1
        score = first.repeat_interleave(n_opt, 0).gather(1, ids[:, :1]).squeeze(1)
        if width > 1:
            later = logp[:, :-1].gather(2, ids[:, 1:, None]).squeeze(2) * ans_mask.repeat(b, 1)[:, 1:]
            score = score + later.sum(1)
        result[idx] = score.view(b, n_opt).cpu()
    return result


MAX_LOG_PERPLEXITY = math.log(1e300)
"""The mean NLL (nats per token) above which a perplexity is no number results.json can hold
(exp overflows a float near 709.8): a model whose predictions are broken."""


def perplexity(nll_sums: list[float], n_tokens: list[int]) -> float:
    """Corpus perplexity: exp(total NLL / total tokens) over a task's test documents. A mean NLL
    past :data:`MAX_LOG_PERPLEXITY` (or not finite) stops the run in one line: no float holds it."""
    total = sum(n_tokens)
    if not total:
        return float("nan")
    mean = sum(nll_sums) / total
    if not mean <= MAX_LOG_PERPLEXITY:
        what = "not a number" if math.isnan(mean) else f"{mean:.4g} nats per token, a perplexity past 1e300"
        raise SureclError(f"perplexity: the mean NLL over a task's test documents is {what} (the model's predictions are "
                          "broken: a too high train.lr, or a damaged base?); the checkpoints written before this evaluation are intact")
    return math.exp(mean)


def accuracy(predictions: list[str], gold: list[str], labels=()) -> float:
    """Percent of answers that are their gold label (:func:`surecl.metrics.is_label`; ``labels``,
    the task's label set, decides where normalised text is enough)."""
    if not gold:
        return 0.0
    hits = sum(is_label(p, g, labels) for p, g in zip(predictions, gold))
    return 100.0 * hits / len(gold)


_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalise_answer(text: str) -> str:
    """SQuAD v1.1's answer normalisation: lower case, punctuation deleted ("U.S." is "us",
    "e-mail" "email"), the articles a / an / the removed, whitespace collapsed. (Super-
    NaturalInstructions' exact match is the same without removing the articles, so "a cat"
    and "the cat" match here and not there.)"""
    text = _PUNCT.sub("", text.lower())
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(predictions: list[str], gold: list[str]) -> float:
    """Percent of answers equal to their target after :func:`normalise_answer`. A target that
    normalises to nothing (the choice letter "A", "the", "?!"), which an empty answer or any
    punctuation would equal, keeps its articles ("A." is "a" as "B." is "b"), and one that is
    still nothing (punctuation alone) is compared as written, up to case and whitespace."""
    if not gold:
        return 0.0
    return 100.0 * sum(_same_answer(p, g) for p, g in zip(predictions, gold)) / len(gold)


def _same_answer(prediction: str, gold: str) -> bool:
    key = normalise_answer(gold)
    if key:
        return normalise_answer(prediction) == key
    key = _with_articles(gold)
    if key:
        return _with_articles(prediction) == key
    return " ".join(prediction.lower().split()) == " ".join(gold.lower().split())


def _with_articles(text: str) -> str:
    """:func:`normalise_answer` keeping a / an / the."""
    return " ".join(_PUNCT.sub("", text.lower()).split())


def rouge_l(predictions: list[str], gold: list[str]) -> float:
    """Mean ROUGE-L F-measure (x100) of each answer against its target, by ``rouge-score``
    (its default tokenizer: lower-cased ASCII letters and digits, so text in other scripts
    scores 0; Porter stemming)."""
    if not gold:
        return 0.0
    score = row_scorer("rouge_l")
    return 100.0 * sum(score(p, g) for p, g in zip(predictions, gold)) / len(gold)


_SCORER = None


def _rouge_scorer():
    """rouge-score's ROUGE-L scorer, built once. Building it logs through absl, which gives
    Python's root logger a handler when it has none (every ``surecl`` line would then be
    printed twice): the root logger is left as it was."""
    global _SCORER
    if _SCORER is None:
        import logging

        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level
        try:
            from rouge_score import rouge_scorer

            _SCORER = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
        except ImportError:
            from surecl.errors import SureclError

            raise SureclError("ROUGE-L needs the rouge-score package: pip install rouge-score") from None
        finally:
            for h in root.handlers[:]:
                if h not in handlers:
                    root.removeHandler(h)
            root.setLevel(level)
    return _SCORER


def instances(examples) -> list[int]:
    """Per test row, the instance it belongs to, named by the index of the instance's first row:
    rows with the same input (the same sentence and conversation before the answer; a task's
    rows share its instruction) are one instance, each row's target one of its references
    (``eval.references=max``)."""
    first: dict = {}
    return [first.setdefault((e.sentence, tuple(tuple(turn) for turn in e.messages[:-1])), k) for k, e in enumerate(examples)]


def instance_rows(keys: list[int], prompts: list[list[int]]) -> dict[int, int]:
    """Per instance (``keys``, :func:`instances`), the row whose prompt answers it: the longest of
    its rows' ``prompts`` (the first of those as long). Under ``eval.answer_budget=references`` a
    long input is cut to leave its own target room (:class:`~surecl.data.encode.TaskEncoder`),
    so an instance's rows may hold it cut at different lengths: the one answer reads the most of
    it (under ``train`` every row of a task leaves the same room, and its rows' prompts agree)."""
    best: dict[int, int] = {}
    for k, (key, prompt) in enumerate(zip(keys, prompts)):
        if key not in best or len(prompt) > len(prompts[best[key]]):
            best[key] = k
    return best


def task_score(metric: str, predictions: list[str], gold: list[str], labels=(), instances: list[int] | None = None) -> float:
    """A task's score in its metric (``accuracy``, ``exact_match``, ``rouge_l``), in percent
    (``labels``: a classification task's label set, for accuracy). ``instances`` (per row, its
    instance, :func:`instances`): an instance scores the best of its rows, and the task the mean
    over instances, as Super-NaturalInstructions' ``compute_metrics`` takes the max over an
    instance's references; None: each row scores alone, its references weighing by their count."""
    if instances is not None:
        return _best_per_instance(metric, predictions, gold, labels, instances)
    if metric == "rouge_l":
        return rouge_l(predictions, gold)
    if metric == "exact_match":
        return exact_match(predictions, gold)
    return accuracy(predictions, gold, labels)


def row_scorer(metric: str, labels=()):
    """One answer's score in ``metric`` against its target, in [0, 1]: ``score(prediction,
    gold)``; :func:`rouge_l` averages it over rows and :func:`task_score` under
    ``eval.references=max`` takes its best per instance."""
    if metric == "rouge_l":
        scorer = _rouge_scorer()
        return lambda p, g: scorer.score(g, p)["rougeL"].fmeasure
    if metric == "exact_match":
        return lambda p, g: float(_same_answer(p, g))
    return lambda p, g: float(is_label(p, g, labels))


def _best_per_instance(metric: str, predictions: list[str], gold: list[str], labels, instances: list[int]) -> float:
    """:func:`task_score` over instances: the mean of each instance's best row score."""
    if not gold:
        return 0.0
    score = row_scorer(metric, labels)
    best: dict[int, float] = {}
    for key, p, g in zip(instances, predictions, gold, strict=True):
        best[key] = max(best.get(key, 0.0), score(p, g))
    return 100.0 * sum(best.values()) / len(best)
