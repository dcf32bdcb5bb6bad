"""Accuracy of the current model on a task: greedy generation with normalised exact match
(the paper's protocol) or ranking the label options by likelihood.

Generation is batched over length-sorted, left-padded prompts with the KV cache, for at most
(longest answer + 1) new tokens, stopping when every row emitted EOS.
"""

from __future__ import annotations

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


@torch.inference_mode()
def rank_answers(model, items: list[Encoded], options: dict[str, list[int]], *, pad_id: int, is_seq2seq: bool, batch_size: int, device) -> list[str]:
    """The label whose answer tokens have the lowest summed NLL given the prompt."""
    labels = list(options)
    pairs = [Encoded(e.prompt, options[lab], lab) for e in items for lab in labels]
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i]))
    nll = [0.0] * len(pairs)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        batch = {k: v.to(device) for k, v in collate([pairs[i] for i in idx], pad_id, is_seq2seq).items()}
        total, _ = token_nll(model, batch, scope="label", is_seq2seq=is_seq2seq)
        for i, v in zip(idx, total.tolist()):
            nll[i] = v
    k = len(labels)
    return [labels[min(range(k), key=lambda j: nll[r * k + j])] for r in range(len(items))]


def accuracy(predictions: list[str], gold: list[str]) -> float:
    if not gold:
        return 0.0
    hits = sum(normalise(p) == normalise(g) for p, g in zip(predictions, gold))
    return 100.0 * hits / len(gold)
