"""The shared prefix on another architecture: a tiny GPT-2 (learned absolute positions, fused
attention projection) scores, ranks and generates the same with and without it."""

from __future__ import annotations

import pytest
import torch

from surecl.data.encode import TaskEncoder, shared_prefix_len
from surecl.evaluate import generate_answers, option_logprobs
from surecl.replay.surprise import score_examples


@pytest.fixture(scope="module")
def gpt2(tiny_loaded):
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = tiny_loaded.tokenizer
    config = GPT2Config(
        vocab_size=len(tok), n_positions=128, n_embd=64, n_layer=2, n_head=4,
        initializer_range=0.5,  # large random weights: rows get different, non-trivial answers
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config)
    return model.eval()


@pytest.fixture(scope="module")
def items(task_examples):
    out = task_examples(2, 10, seed=0)
    assert shared_prefix_len(out) > 0
    return out


@pytest.fixture
def prefix_batches(monkeypatch) -> list[bool]:
    """Whether each batch that ``token_nll`` or generation/ranking ran carried a shared prefix."""
    import surecl.evaluate
    import surecl.nll

    seen: list[bool] = []

    def spy(original):
        def prefixed(model, batch, *args, **kwargs):
            seen.append(batch.get("prefix_ids") is not None)
            return original(model, batch, *args, **kwargs)

        return prefixed

    monkeypatch.setattr(surecl.nll, "prefixed", spy(surecl.nll.prefixed))
    monkeypatch.setattr(surecl.evaluate, "prefixed", spy(surecl.evaluate.prefixed))
    return seen


def test_scores_equal_with_and_without_shared_prefix(gpt2, tiny_loaded, items, prefix_batches):
    pad = tiny_loaded.tokenizer.pad_token_id
    for scope in ("sequence", "label"):
        whole = score_examples(gpt2, items, pad_id=pad, is_seq2seq=False, scope=scope, batch_size=4, share_prefix=False)
        assert prefix_batches and not any(prefix_batches)
        prefix_batches.clear()
        shared = score_examples(gpt2, items, pad_id=pad, is_seq2seq=False, scope=scope, batch_size=4)
        assert prefix_batches == [True, True, True]  # 10 rows in batches of 4, each behind its prefix
        prefix_batches.clear()
        assert shared == pytest.approx(whole, abs=1e-4, rel=1e-5)
        # and whole rows equal each sequence alone (so neither path leans on the padding)
        alone = [score_examples(gpt2, [e], pad_id=pad, is_seq2seq=False, scope=scope)[0] for e in items]
        assert whole == pytest.approx(alone, abs=1e-4, rel=1e-5)
        assert len({round(v, 3) for v in shared}) > 1
        prefix_batches.clear()


def test_ranking_and_generation_equal_with_and_without_shared_prefix(gpt2, tiny_loaded, items, prefix_batches):
    tok = tiny_loaded.tokenizer
    enc = TaskEncoder(tok, 64)
    options = {lab: enc.answer_ids(lab) for lab in ("warm", "cool", "warm cool")}
    with torch.inference_mode():
        whole = option_logprobs(gpt2, items, options, pad_id=tok.pad_token_id, is_seq2seq=False, batch_size=9, device="cpu", share_prefix=False)
        assert prefix_batches and not any(prefix_batches)
        prefix_batches.clear()
        shared = option_logprobs(gpt2, items, options, pad_id=tok.pad_token_id, is_seq2seq=False, batch_size=9, device="cpu")
        assert prefix_batches == [True, True, True, False]  # 10 prompts, 3 per batch (9 // 3 options); one alone shares nothing
        prefix_batches.clear()
    torch.testing.assert_close(shared, whole, atol=1e-4, rtol=1e-5)
    kw = {"is_seq2seq": False, "max_new_tokens": 4, "batch_size": 5, "device": "cpu"}
    whole = generate_answers(gpt2, tok, items, share_prefix=False, **kw)
    assert prefix_batches and not any(prefix_batches)
    prefix_batches.clear()
    assert generate_answers(gpt2, tok, items, **kw) == whole
    assert prefix_batches == [True, True]  # 10 prompts in batches of 5
    assert len(set(whole)) > 1
