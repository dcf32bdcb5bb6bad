"""The dual learner: slow LoRA = EMA of fast LoRA, never trained, optionally bias-corrected."""

from __future__ import annotations

import pytest
import torch

from surecl.adapters import FAST, SLOW, DualLoRA
from surecl.config import DualConfig, LoraConfig

LORA = LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])


def _dual(model, beta: float = 0.9, bias_correction: bool = False) -> DualLoRA:
    return DualLoRA(model, LORA, DualConfig(enabled=True, beta=beta, bias_correction=bias_correction), is_seq2seq=False)


def _set_fast(dl: DualLoRA, seed: int) -> list[torch.Tensor]:
    """Give the fast adapter known random values; return copies of them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in dl.fast_params:
            p.copy_(torch.randn(p.shape, generator=g))
    return [p.detach().clone() for p in dl.fast_params]


def _slow(dl: DualLoRA) -> list[torch.Tensor]:
    return [p.detach().clone() for p in dl.slow_params]


def _assert_close(actual, expected, tol=1e-6):
    assert len(actual) == len(expected) > 0
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a.double(), e.double(), atol=tol, rtol=tol)


def _inputs(vocab: int) -> torch.Tensor:
    return torch.randint(4, vocab, (2, 9), generator=torch.Generator().manual_seed(0))


def test_slow_pairs_with_fast_and_starts_equal(fresh_tiny):
    dl = _dual(fresh_tiny)
    named = {id(p): n for n, p in dl.model.named_parameters()}
    fast_names = [named[id(p)] for p in dl.fast_params]
    slow_names = [named[id(p)] for p in dl.slow_params]
    # q_proj and v_proj in each of the 2 layers, lora_A and lora_B each
    assert len(fast_names) == 2 * 2 * 2
    assert slow_names == [n.replace(f".{FAST}.", f".{SLOW}.") for n in fast_names]
    for f, s in zip(dl.fast_params, dl.slow_params, strict=True):
        assert f is not s and f.data_ptr() != s.data_ptr()
        assert torch.equal(f, s)
        assert f.dtype == s.dtype == torch.float32


def test_only_fast_requires_grad_in_every_adapter_state(fresh_tiny):
    dl = _dual(fresh_tiny)

    def check():
        assert all(p.requires_grad for p in dl.fast_params)
        assert not any(p.requires_grad for p in dl.slow_params)

    check()
    dl.model.train()
    with dl.evaluating() as m:
        assert m.active_adapter == SLOW
        assert not m.training
        check()
    assert dl.model.active_adapter == FAST and dl.model.training
    check()
    dl.activate(SLOW)
    check()
    dl.activate(FAST)
    check()
    trainable = {id(p) for p in dl.model.parameters() if p.requires_grad}
    assert trainable == {id(p) for p in dl.fast_params}  # the base stays frozen too


def test_evaluating_uses_the_slow_weights(fresh_tiny):
    dl = _dual(fresh_tiny)
    ids = _inputs(dl.model.config.vocab_size)
    _set_fast(dl, 1)  # fast moves away, slow still holds the initial adapter
    with torch.no_grad():
        dl.model.eval()
        fast_out = dl.model(input_ids=ids).logits
        with dl.evaluating():
            slow_out = dl.model(input_ids=ids).logits
        assert not torch.allclose(fast_out, slow_out)
        dl.sync_slow_to_fast()
        with dl.evaluating():
            synced = dl.model(input_ids=ids).logits
    torch.testing.assert_close(synced, fast_out)


@pytest.mark.parametrize("beta", [0.9, 0.995])
def test_one_ema_step(fresh_tiny, beta):
    dl = _dual(fresh_tiny, beta=beta)
    old = _slow(dl)
    fast = _set_fast(dl, 2)
    dl.ema_step()
    _assert_close(_slow(dl), [beta * s + (1 - beta) * f for s, f in zip(old, fast, strict=True)])
    _assert_close([p.detach() for p in dl.fast_params], fast, tol=0)  # fast untouched


def test_ema_converges_to_fast_at_rate_beta_power_n(fresh_tiny):
    beta, n = 0.8, 30
    dl = _dual(fresh_tiny, beta=beta)
    start = _slow(dl)
    fast = _set_fast(dl, 3)
    gap0 = sum(float((s - f).double().norm() ** 2) for s, f in zip(start, fast, strict=True)) ** 0.5
    for k in range(1, n + 1):
        dl.ema_step()
        # slow_k - fast = beta^k (slow_0 - fast)
        expected = [f.double() + beta**k * (s.double() - f.double()) for s, f in zip(start, fast, strict=True)]
        _assert_close(_slow(dl), expected)
    gap = sum(float((s - f).double().norm() ** 2) for s, f in zip(_slow(dl), fast, strict=True)) ** 0.5
    assert gap == pytest.approx(beta**n * gap0, rel=1e-3, abs=1e-6)
    assert dl.steps == n


def test_bias_corrected_first_step_copies_fast(fresh_tiny):
    dl = _dual(fresh_tiny, beta=0.99, bias_correction=True)
    fast = _set_fast(dl, 4)
    dl.ema_step()
    _assert_close(_slow(dl), fast)


def test_bias_corrected_ema_is_normalised_weighted_average(fresh_tiny):
    beta = 0.7
    dl = _dual(fresh_tiny, beta=beta, bias_correction=True)
    history = []
    for t in range(1, 7):
        history.append([f.double() for f in _set_fast(dl, 10 + t)])
        dl.ema_step()
        # slow_t = (1 - beta) * sum_k beta^(t-k) fast_k / (1 - beta^t)
        expected = [
            sum((1 - beta) * beta ** (t - k) * history[k - 1][i] for k in range(1, t + 1)) / (1 - beta**t)
            for i in range(len(dl.slow_params))
        ]
        _assert_close(_slow(dl), expected)


def test_bias_correction_restarts_after_sync(fresh_tiny):
    dl = _dual(fresh_tiny, beta=0.9, bias_correction=True)
    _set_fast(dl, 20)
    dl.ema_step()
    dl.ema_step()
    dl.sync_slow_to_fast()
    assert dl.steps == 0
    fast = _set_fast(dl, 21)
    dl.ema_step()
    _assert_close(_slow(dl), fast)  # a fresh first step again: slow == fast


def test_disabled_dual_has_no_slow_adapter(fresh_tiny):
    dl = DualLoRA(fresh_tiny, LORA, DualConfig(enabled=False), is_seq2seq=False)
    assert dl.slow_params == [] and len(dl.fast_params) == 8
    assert dl.eval_adapter == FAST
    before = [p.detach().clone() for p in dl.fast_params]
    dl.ema_step()
    _assert_close([p.detach() for p in dl.fast_params], before, tol=0)


def test_optimizer_over_fast_params_leaves_slow_alone(fresh_tiny):
    beta = 0.9
    dl = _dual(fresh_tiny, beta=beta)
    opt = torch.optim.AdamW(dl.fast_params, lr=0.05)
    slow_ids = {id(p) for p in dl.slow_params}
    assert not any(id(p) in slow_ids for g in opt.param_groups for p in g["params"])
    slow0, fast0 = _slow(dl), [p.detach().clone() for p in dl.fast_params]
    ids = _inputs(dl.model.config.vocab_size)
    dl.model.train()
    for _ in range(3):
        out = dl.model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in dl.slow_params)
    _assert_close(_slow(dl), slow0, tol=0)  # no optimizer step reached the slow adapter
    assert any(not torch.equal(p, f) for p, f in zip(dl.fast_params, fast0, strict=True))  # but fast did learn
    fast = [p.detach().clone() for p in dl.fast_params]
    dl.ema_step()
    _assert_close(_slow(dl), [beta * s + (1 - beta) * f for s, f in zip(slow0, fast, strict=True)])
