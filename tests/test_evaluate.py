"""Evaluation: normalisation, and label ranking with one shared prompt pass equals scoring
every (prompt, label) pair separately."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from surecl.config import ModelConfig
from surecl.data.encode import TaskEncoder, shared_prefix_len
from surecl.data.tiny import tiny_stream
from surecl.evaluate import accuracy, normalise, option_logprobs, rank_answers
from surecl.model import load_model


def test_normalise_and_accuracy():
    assert normalise("  Very Positive.\nmore") == "very positive"
    assert normalise("Science or Technology!") == "science or technology"
    assert accuracy([" warm", "COOL.", "hot"], ["warm", "cool", "cold"]) == 100 * 2 / 3


def test_labels_that_normalise_alike_count_only_as_their_exact_text():
    """"-1" and "1" (or "C++" and "C#", "Spam" and "spam") are one string after normalisation:
    an answer "1" is not the gold "-1", and an empty answer is not the label "+"."""
    labels = ["-1", "0", "1"]
    assert accuracy(["1", "-1", " -1\n", "0."], ["-1", "-1", "-1", "0"], labels) == 75.0
    assert accuracy(["", "+", "-"], ["+", "+", "-"], ["+", "-"]) == 100 * 2 / 3
    assert accuracy(["c", "C++", "c#"], ["C++", "C++", "C#"], ["C++", "C#", "Java"]) == 100 * 1 / 3
    assert accuracy(["spam", "SPAM"], ["Spam", "spam"], ["Spam", "spam"]) == 0.0
    # where the labels stay apart, normalised text is still enough
    assert accuracy(["sci/tech.", "WORLD"], ["Sci/Tech", "World"], ["Sci/Tech", "World", "Sports"]) == 100.0
    # the encoder says so when it checks the labels
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from surecl.data.task import Example, Task

    vocab = ["<pad>", "<eos>", "<unk>", "-", "+", "1", "0", "x"]
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    task = Task("stance", "", ["- 1", "0", "1", "+"], [Example("x", "0")], [Example("x", "1")])
    said = " | ".join(TaskEncoder(tok, max_length=16).check_labels(task))
    assert "'- 1' and '1' normalise alike" in said and "'+' normalise to nothing" in said and "'0'" not in said


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
    assert shared_prefix_len(items) > 0  # the batches run the task's prompt prefix once
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


def _hf_generate(model, tok, items, max_new_tokens):
    """Reference: ``generate``'s greedy search, one batch, no shared prefix."""
    from surecl.data.encode import collate

    batch = collate(items, tok.pad_token_id, False, with_answer=False)
    out = model.generate(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=max_new_tokens,
        do_sample=False, num_beams=1, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    return tok.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)


def test_greedy_with_and_without_shared_prefix_equals_generate(tiny_loaded, fresh_tiny):
    from surecl.adapters import DualLoRA
    from surecl.config import DualConfig, LoraConfig
    from surecl.data.encode import shared_prefix_len
    from surecl.evaluate import generate_answers

    tok = tiny_loaded.tokenizer
    lora = LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"])
    dl = DualLoRA(fresh_tiny, lora, DualConfig(), is_seq2seq=False)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a random adapter large enough that the rows' answers differ
        for p in dl.fast_params:
            p.copy_(torch.randn(p.shape, generator=g))
    dl.model.eval()
    task = tiny_stream()[1]
    items = TaskEncoder(tok, 64).encode(task, task.test[:10])
    assert shared_prefix_len(items) > 0
    with torch.inference_mode():
        expected = _hf_generate(dl.model, tok, sorted(items, key=lambda e: len(e.prompt)), 5)
    order = sorted(range(len(items)), key=lambda i: len(items[i].prompt))
    for share in (True, False):
        got = generate_answers(dl.model, tok, items, is_seq2seq=False, max_new_tokens=5, batch_size=10, device="cpu", share_prefix=share)
        assert [got[i] for i in order] == expected
    assert len(set(expected)) > 1 and all(expected)  # rows differ and produced text


class _EosAfter(torch.nn.Module):
    """The real model, except that from its ``n``-th call on EOS wins every argmax."""

    def __init__(self, model, n, eos):
        super().__init__()
        self.model, self.n, self.eos, self.calls = model, n, eos, 0

    def forward(self, **kwargs):
        out = self.model(**kwargs)
        self.calls += 1
        if self.calls >= self.n:
            out.logits[..., self.eos] = 1e4
        return out


def test_greedy_stops_once_every_row_emitted_eos(tiny_loaded):
    from surecl.data.encode import collate, shared_prefix_len
    from surecl.evaluate import greedy

    tok = tiny_loaded.tokenizer
    task = tiny_stream()[0]
    items = TaskEncoder(tok, 64).encode(task, task.test[:6])
    assert shared_prefix_len(items) > 0  # the call count below includes the prefix pass
    batch = collate(items, tok.pad_token_id, False, with_answer=False, share_prefix=True)
    # calls: 1 prefix pass, 1 prompt pass, then one per new token; EOS from the 4th call on
    spy = _EosAfter(tiny_loaded.model, 4, tok.eos_token_id)
    with torch.inference_mode():
        new = greedy(spy, batch, max_new_tokens=10, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    assert new.shape == (6, 3) and spy.calls == 4
    assert (new[:, -1] == tok.eos_token_id).all() and (new[:, :-1] != tok.eos_token_id).all()


def test_a_perplexity_no_number_holds_is_one_line(tiny_loaded, tmp_path, tiny_cache, monkeypatch, capsys):
    """exp of a mean NLL past ~709.8 nats overflows a float: a traceback after the training had
    run (and at every resume). Now one line; a finite one is still exp(mean NLL)."""
    import copy
    import math

    import pytest

    from surecl.cli import main
    from surecl.errors import SureclError
    from surecl.evaluate import perplexity

    assert perplexity([10.0, 5.0], [3, 2]) == pytest.approx(math.e**3)
    for sums, words in (([800.0 * 5], "is 800 nats per token, a perplexity past 1e300"), ([float("nan")], "is not a number"),
                        ([float("inf")], "is inf nats per token")):
        with pytest.raises(SureclError, match=f"^perplexity: the mean NLL over a task's test documents {words}"):
            perplexity(sums, [5])
    model = copy.deepcopy(tiny_loaded.model)
    with torch.no_grad():
        model.lm_head.weight.mul_(15.0)  # a model whose predictions are far too sure of the wrong tokens
    folder = tmp_path / "broken"
    model.save_pretrained(folder)
    tiny_loaded.tokenizer.save_pretrained(folder)
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    code = main(["run", "--config", "tiny,cpt,seq_lora", f"model.name={folder}", "data.tasks=[colors]", "data.n_train=8",
                 "data.n_test=4", "train.epochs=1", "eval.before=true", "--out", str(tmp_path / "out"), "--quiet"])
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert code == 2 and err[-1].startswith("surecl: error: perplexity: the mean NLL") and "Traceback" not in "\n".join(err), err
