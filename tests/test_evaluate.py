"""Evaluation: normalisation, and label ranking with one shared prompt pass equals scoring
every (prompt, label) pair separately."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from surecl.config import ModelConfig
from surecl.data.encode import TaskEncoder
from surecl.data.tiny import tiny_stream
from surecl.evaluate import accuracy, normalise, option_logprobs, rank_answers
from surecl.model import load_model


def test_normalise_and_accuracy():
    assert normalise("  Very Positive.\nmore") == "very positive"
    assert normalise("Science or Technology!") == "science or technology"
    assert accuracy([" warm", "COOL.", "hot"], ["warm", "cool", "cold"]) == 100 * 2 / 3


def naive_logprobs(model, prompt, options):
    out = []
    for ans in options.values():
        ids = torch.tensor([prompt + ans])
        logits = model(input_ids=ids).logits[0].float()
        out.append(-F.cross_entropy(logits[len(prompt) - 1 : -1], ids[0, len(prompt) :], reduction="sum").item())
    return out


def test_shared_prompt_ranking_matches_pairwise(tmp_path):
    loaded = load_model(ModelConfig(name="tiny"), torch.device("cpu"), tmp_path)
    tok = loaded.tokenizer
    task = tiny_stream()[0]
    enc = TaskEncoder(tok, 64)
    items = enc.encode(task, task.test[:12])
    # multi-token options of different lengths exercise the masking of the shared pass
    options = {"warm": enc.answer_ids("warm"), "cool": enc.answer_ids("cool"), "warm cool": enc.answer_ids("warm cool")}
    with torch.inference_mode():
        expected = torch.tensor([naive_logprobs(loaded.model, e.prompt, options) for e in items])
        got = option_logprobs(loaded.model, items, options, pad_id=tok.pad_token_id, is_seq2seq=False, batch_size=7, device="cpu")
    assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()
    labels = list(options)
    assert rank_answers(loaded.model, items, options, pad_id=tok.pad_token_id, is_seq2seq=False, batch_size=7, device="cpu") == [
        labels[j] for j in expected.argmax(1).tolist()
    ]
