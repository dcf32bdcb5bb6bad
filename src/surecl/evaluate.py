"""Accuracy of the current model on a task: greedy generation with normalised exact match
(the paper's protocol) or ranking the label options by likelihood; perplexity for text streams.

Generation is batched over length-sorted, left-padded prompts with the KV cache, for at most
(longest answer + 1) new tokens, stopping when every row emitted EOS.
"""

from __future__ import annotations

import math
import re
import string

import torch

from surecl.data.encode import Encoded, collate
from surecl.nll import token_nll

_PUNCT = re.compile(f"[{re.escape(string.punctuation)}]")


def normalise(text: str) -> str:
    """Lower-case, first line only, punctuation removed, whitespace collapsed."""
    text = text.strip().split("\n", 1)[0]
    return " ".join(_PUNCT.sub(" ", text.lower()).split())


@torch.inference_mode()
def generate_answers(model, tokenizer, items: list[Encoded], *, is_seq2seq: bool, max_new_tokens: int, batch_size: int, device) -> list[str]:
    order = sorted(range(len(items)), key=lambda i: len(items[i].prompt))
    answers = [""] * len(items)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        batch = collate([items[i] for i in idx], tokenizer.pad_token_id, is_seq2seq, with_answer=False)
        kwargs = {"input_ids": batch["input_ids"].to(device), "attention_mask": batch["attention_mask"].to(device)}
        out = model.generate(
            **kwargs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        new = out if is_seq2seq else out[:, kwargs["input_ids"].shape[1] :]
        for i, text in zip(idx, tokenizer.batch_decode(new, skip_special_tokens=True)):
            answers[i] = text
    return answers


def rank_answers(model, items: list[Encoded], options: dict[str, list[int]], *, pad_id: int, is_seq2seq: bool, batch_size: int, device) -> list[str]:
    """The label whose answer tokens are most likely given the prompt."""
    labels = list(options)
    scores = option_logprobs(model, items, options, pad_id=pad_id, is_seq2seq=is_seq2seq, batch_size=batch_size, device=device)
    return [labels[j] for j in scores.argmax(1).tolist()]


@torch.inference_mode()
def option_logprobs(model, items: list[Encoded], options: dict[str, list[int]], *, pad_id: int, is_seq2seq: bool, batch_size: int, device) -> torch.Tensor:
    """Summed log-likelihood of each option's answer tokens given each prompt: [items, options].

    Causal models run each prompt once: its KV cache is repeated for the L options, which then
    cost only their own few tokens. Seq2seq models score (prompt, option) pairs.
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
        batch = {k: v.to(device) for k, v in collate([items[i] for i in idx], pad_id, False, with_answer=False).items()}
        out = model(**batch, use_cache=True, logits_to_keep=1)
        first = torch.log_softmax(out.logits[:, -1].float(), -1)  # predicts each answer's first token
        cache = out.past_key_values
        cache.batch_repeat_interleave(n_opt)
        b = len(idx)
        ids = ans.repeat(b, 1)
        mask = torch.cat([batch["attention_mask"].repeat_interleave(n_opt, 0), ans_mask.repeat(b, 1)], 1)
        pos = batch["position_ids"][:, -1:].repeat_interleave(n_opt, 0) + 1 + torch.arange(width, device=device)
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=False).logits.float(), -1)
        # token t of an answer is predicted by the prompt's last position (t = 0) or answer token t-1
        score = first.repeat_interleave(n_opt, 0).gather(1, ids[:, :1]).squeeze(1)
        if width > 1:
            later = logp[:, :-1].gather(2, ids[:, 1:, None]).squeeze(2) * ans_mask.repeat(b, 1)[:, 1:]
            score = score + later.sum(1)
        result[idx] = score.view(b, n_opt).cpu()
    return result


def perplexity(nll_sums: list[float], n_tokens: list[int]) -> float:
    """Corpus perplexity: exp(total NLL / total tokens) over a task's test documents."""
    total = sum(n_tokens)
    return math.exp(sum(nll_sums) / total) if total else float("nan")


def accuracy(predictions: list[str], gold: list[str]) -> float:
    if not gold:
        return 0.0
    hits = sum(normalise(p) == normalise(g) for p, g in zip(predictions, gold))
    return 100.0 * hits / len(gold)
