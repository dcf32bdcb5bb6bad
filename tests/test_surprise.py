"""Surprise scoring: the batched, length-sorted, left-padded scorer against a naive loop."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from surecl.config import ModelConfig
from surecl.data.encode import MIN_SHARED_PREFIX, Encoded, TaskEncoder, collate, shared_prefix_len
from surecl.data.tiny import tiny_stream
from surecl.model import base_dtype
from surecl.replay.surprise import score_examples


@pytest.fixture(scope="module")
def items(tiny_loaded) -> list[Encoded]:
    tasks = tiny_stream(n_train=8, n_test=1)
    encoder = TaskEncoder(tiny_loaded.tokenizer, max_length=64)
    out = encoder.encode(tasks[0], tasks[0].train) + encoder.encode(tasks[3], tasks[3].train[:5])
    random.Random(0).shuffle(out)
    return out


def naive_scores(model, items: list[Encoded], scope: str, reduction: str) -> list[float]:
    """Each example alone, unpadded, NLL computed by hand."""
    out = []
    with torch.no_grad():
        for e in items:
            seq = e.prompt + e.answer
            ids = torch.tensor([seq])
            logits = model(input_ids=ids).logits[0].float()
            if scope == "sequence":
                pred, target = logits[:-1], ids[0, 1:]  # every token after the first
            else:
                k = len(e.answer)
                pred, target = logits[len(seq) - k - 1 : len(seq) - 1], ids[0, len(seq) - k :]
                assert target.tolist() == e.answer
            nll = F.cross_entropy(pred, target, reduction="sum")
            out.append(float(nll / len(target)) if reduction == "mean" else float(nll))
    return out


def test_fixture_items_differ_in_length_and_are_unsorted(items, tiny_loaded):
    lengths = [len(e) for e in items]
    assert len(set(lengths)) >= 3
    assert lengths != sorted(lengths)
    eos = tiny_loaded.tokenizer.eos_token_id
    assert all(e.answer[-1] == eos and len(e.answer) >= 2 for e in items)


def test_tiny_model_is_fp32(tiny_loaded):
    assert all(p.dtype == torch.float32 for p in tiny_loaded.model.parameters())
    # the tiny base is held in fp32 whatever dtype is asked for
    for dtype in ("auto", "bf16", "fp32"):
        assert base_dtype(ModelConfig(name="tiny", dtype=dtype), torch.device("cpu")) == torch.float32


@pytest.mark.parametrize("scope", ["sequence", "label"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_batched_scores_match_naive_loop(tiny_loaded, items, scope, reduction):
    model = tiny_loaded.model
    got = score_examples(
        model, items, pad_id=tiny_loaded.tokenizer.pad_token_id, is_seq2seq=False, scope=scope, reduction=reduction, batch_size=4
    )
    expected = naive_scores(model, items, scope, reduction)
    assert len(got) == len(items)
    assert got == pytest.approx(expected, abs=1e-4, rel=1e-5)
    assert len(set(round(v, 4) for v in got)) > 1  # examples are told apart


def test_sum_is_mean_times_scored_tokens(tiny_loaded, items):
    pad = tiny_loaded.tokenizer.pad_token_id
    for scope, count in (("sequence", lambda e: len(e) - 1), ("label", lambda e: len(e.answer))):
        mean = score_examples(tiny_loaded.model, items, pad_id=pad, is_seq2seq=False, scope=scope, reduction="mean")
        total = score_examples(tiny_loaded.model, items, pad_id=pad, is_seq2seq=False, scope=scope, reduction="sum")
        for e, m, s in zip(items, mean, total, strict=True):
            assert s == pytest.approx(m * count(e), rel=1e-5)


def test_batch_size_does_not_change_scores(tiny_loaded, items):
    pad = tiny_loaded.tokenizer.pad_token_id
    for scope in ("sequence", "label"):
        one = score_examples(tiny_loaded.model, items, pad_id=pad, is_seq2seq=False, scope=scope, batch_size=1)
        seven = score_examples(tiny_loaded.model, items, pad_id=pad, is_seq2seq=False, scope=scope, batch_size=7)
        assert seven == pytest.approx(one, abs=1e-4)


def test_scores_follow_item_order(tiny_loaded, items):
    pad = tiny_loaded.tokenizer.pad_token_id
    forward = score_examples(tiny_loaded.model, items, pad_id=pad, is_seq2seq=False, batch_size=4)
    backward = score_examples(tiny_loaded.model, items[::-1], pad_id=pad, is_seq2seq=False, batch_size=4)
    assert backward[::-1] == pytest.approx(forward, abs=1e-4)


def test_scores_through_a_trained_lora_model_match_naive_loop(fresh_tiny, tiny_loaded, items, random_dual):
    """What the trainer scores: the PEFT-wrapped model with a non-zero fast adapter."""
    dl = random_dual(fresh_tiny, 0.3)
    dl.model.eval()
    pad = tiny_loaded.tokenizer.pad_token_id
    base = score_examples(tiny_loaded.model, items, pad_id=pad, is_seq2seq=False, scope="label")
    for scope in ("sequence", "label"):
        got = score_examples(dl.model, items, pad_id=pad, is_seq2seq=False, scope=scope, batch_size=5)
        assert got == pytest.approx(naive_scores(dl.model, items, scope, "mean"), abs=1e-4, rel=1e-5)
    assert got != pytest.approx(base, abs=1e-3)  # the adapter really changed the scores


def test_collate_left_pads_with_positions_from_zero(items, tiny_loaded):
    pad = tiny_loaded.tokenizer.pad_token_id
    batch = collate(items[:5], pad, is_seq2seq=False)
    width = max(len(e) for e in items[:5])
    assert batch["input_ids"].shape == (5, width)
    for r, e in enumerate(items[:5]):
        seq, n_pad = e.prompt + e.answer, width - len(e)
        assert batch["input_ids"][r].tolist() == [pad] * n_pad + seq
        assert batch["attention_mask"][r].tolist() == [0] * n_pad + [1] * len(seq)
        assert batch["position_ids"][r, n_pad:].tolist() == list(range(len(seq)))
        assert int(batch["n_answer"][r]) == len(e.answer)


class _WidthSpy(torch.nn.Module):
    """Forwards to the real model and records each batch's (rows, width)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.shapes: list[tuple[int, int]] = []

    def forward(self, **kwargs):
        self.shapes.append(tuple(kwargs["input_ids"].shape))
        return self.model(**kwargs)


def test_batches_are_length_sorted(tiny_loaded, items):
    spy = _WidthSpy(tiny_loaded.model)
    got = score_examples(spy, items, pad_id=tiny_loaded.tokenizer.pad_token_id, is_seq2seq=False, batch_size=4, share_prefix=False)
    lengths = sorted(len(e) for e in items)
    chunks = [lengths[i : i + 4] for i in range(0, len(lengths), 4)]
    # batch widths of the sorted order: the least padding possible for this batch size
    assert spy.shapes == [(len(c), max(c)) for c in chunks]
    assert got == pytest.approx(naive_scores(tiny_loaded.model, items, "sequence", "mean"), abs=1e-4, rel=1e-5)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_without_native_support_warns_and_is_recorded(tiny_cache, monkeypatch, native):
    """An explicit bf16 base on a CPU without native bf16 matmuls is honoured but warned
    about; the resolved dtype is reported either way."""
    import surecl.model as model_mod
    from surecl.model import load_model, tiny_folder

    monkeypatch.setattr(model_mod, "bf16_supported", lambda device: native)
    path = tiny_folder(tiny_cache)  # a real folder, loaded as "any HF model by path"
    loaded = load_model(ModelConfig(name=str(path), dtype="bf16"), torch.device("cpu"), tiny_cache)
    assert loaded.dtype == "bfloat16"
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    assert ("no AVX512-BF16" in loaded.note) == (not native)
    auto = load_model(ModelConfig(name=str(path), dtype="auto"), torch.device("cpu"), tiny_cache)
    assert auto.dtype == ("bfloat16" if native else "float32") and auto.note == ""


@pytest.fixture(scope="module")
def one_task(task_examples) -> list[Encoded]:
    """Examples of one task: their prompts share the instruction and options."""
    return task_examples(1, 12, seed=1)


def test_shared_prefix_len_keeps_a_prompt_token_per_row(one_task):
    n = shared_prefix_len(one_task)
    assert n >= MIN_SHARED_PREFIX
    assert all(e.prompt[:n] == one_task[0].prompt[:n] for e in one_task)
    assert n < min(len(e.prompt) for e in one_task)
    # a row that is the prefix plus one token caps it; mixed tasks or a single row share nothing
    cut = Encoded(one_task[0].prompt[:n], one_task[0].answer, one_task[0].label)
    assert shared_prefix_len(one_task + [cut]) == n - 1
    assert shared_prefix_len(one_task[:1]) == 0
    other = Encoded([one_task[0].prompt[0] + 1] + one_task[0].prompt[1:], one_task[0].answer, "x")
    assert shared_prefix_len(one_task + [other]) == 0


def test_collate_with_prefix_holds_the_rest_of_each_row(one_task, tiny_loaded):
    pad = tiny_loaded.tokenizer.pad_token_id
    rows = one_task[:5]
    n = shared_prefix_len(rows)
    batch = collate(rows, pad, is_seq2seq=False, share_prefix=True)
    assert batch["prefix_ids"].tolist() == [rows[0].prompt[:n]]
    width = max(len(e) for e in rows) - n
    assert batch["input_ids"].shape == (5, width)
    for r, e in enumerate(rows):
        rest = (e.prompt + e.answer)[n:]
        n_pad = width - len(rest)
        assert batch["input_ids"][r].tolist() == [pad] * n_pad + rest
        assert batch["position_ids"][r, n_pad:].tolist() == list(range(n, len(e)))


@pytest.mark.parametrize("scope", ["sequence", "label"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_shared_prefix_scores_match_naive_loop(tiny_loaded, one_task, scope, reduction):
    """The prefix runs once per batch (one [1, P] forward, then the rows' remainders) and
    every score equals the whole sequence scored alone."""
    spy = _WidthSpy(tiny_loaded.model)
    pad = tiny_loaded.tokenizer.pad_token_id
    got = score_examples(spy, one_task, pad_id=pad, is_seq2seq=False, scope=scope, reduction=reduction, batch_size=5)
    n_batches = -(-len(one_task) // 5)
    prefix_calls = [s for s in spy.shapes if s[0] == 1]
    assert len(prefix_calls) == n_batches and len(spy.shapes) == 2 * n_batches
    assert all(w >= MIN_SHARED_PREFIX for _, w in prefix_calls)
    assert sum(r * w for r, w in spy.shapes) < sum(len(e) for e in one_task)  # fewer tokens ran
    assert got == pytest.approx(naive_scores(tiny_loaded.model, one_task, scope, reduction), abs=1e-4, rel=1e-5)
    plain = score_examples(tiny_loaded.model, one_task, pad_id=pad, is_seq2seq=False, scope=scope, reduction=reduction, batch_size=5, share_prefix=False)
    assert got == pytest.approx(plain, abs=1e-4, rel=1e-5)


def test_attn_implementation_picks_the_kernels_and_scores_alike(tiny_cache, items):
    """``model.attn_implementation=eager`` loads the plain attention (the check for a fused
    kernel's numerical fault); on left-padded, shared-prefix batches it scores what the default
    kernels score. A name outside surecl's choices (auto, sdpa, eager) is refused in one line."""
    from surecl.config import build_config
    from surecl.errors import SureclError
    from surecl.model import load_model

    eager = load_model(ModelConfig(name="tiny", attn_implementation="eager"), torch.device("cpu"), tiny_cache)
    auto = load_model(ModelConfig(name="tiny"), torch.device("cpu"), tiny_cache)
    assert eager.model.config._attn_implementation == "eager"
    assert auto.model.config._attn_implementation == "sdpa"
    pad = auto.tokenizer.pad_token_id
    for share in (True, False):
        a, e = (score_examples(m.model, items, pad_id=pad, is_seq2seq=False, batch_size=4, share_prefix=share) for m in (auto, eager))
        assert e == pytest.approx(a, abs=1e-5, rel=1e-5)
    with pytest.raises(SureclError, match=r"^model.attn_implementation: .*flash"):
        build_config("tiny", ["model.attn_implementation=flash"])


def test_attn_implementation_is_refused_for_a_model_the_caller_built(tiny_loaded, tmp_path):
    """A model the caller built keeps its attention: a non-auto value would be ignored, so it
    stops in one line."""
    from surecl.config import build_config
    from surecl.errors import SureclError
    from surecl.trainer import ContinualRun

    cfg = build_config("tiny,seq_lora", ["data.tasks=[colors]", "data.n_train=4", "data.n_test=2", "model.attn_implementation=eager"])
    with pytest.raises(SureclError, match=r"^model.attn_implementation=eager: a model the caller built keeps"):
        ContinualRun(cfg, tmp_path / "run", model=tiny_loaded.model, tokenizer=tiny_loaded.tokenizer, progress=False)
    assert not (tmp_path / "run" / "results.json").exists()
