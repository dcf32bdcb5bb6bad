"""LoRA dropout on the CPU: ``LoraDropout`` draws 16-bit uniforms from 64-bit words, and must
behave as ``nn.Dropout`` does: the rate, the scaling, the gradient, eval mode, the seed."""

from __future__ import annotations

import pytest
import torch

from surecl.adapters import FAST, SLOW, DualLoRA, LoraDropout
from surecl.config import DualConfig, LoraConfig


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_drop_rate_and_expectation_match_nn_dropout(p):
    torch.manual_seed(0)
    x = torch.ones(1000, 1000)
    y = LoraDropout(p).train()(x)
    dropped = (y == 0).float().mean().item()
    # 1e6 Bernoulli draws: the standard error of the rate is below 5e-4
    assert abs(dropped - p) < 0.003
    kept = y[y != 0]
    assert torch.allclose(kept, torch.full_like(kept, 1 / (1 - p)), rtol=1e-4)
    assert abs(y.mean().item() - 1.0) < 0.01


def test_masks_are_independent_across_positions_and_calls():
    torch.manual_seed(1)
    drop = LoraDropout(0.5).train()
    a = drop(torch.ones(4000, 64)) == 0
    b = drop(torch.ones(4000, 64)) == 0
    # neighbours share one 64-bit word: they must still be uncorrelated
    both = (a[:, :-1] & a[:, 1:]).float().mean().item()
    assert abs(both - 0.25) < 0.01
    assert abs((a & b).float().mean().item() - 0.25) < 0.01
    assert not torch.equal(a, b)


def test_same_seed_same_mask_and_odd_sizes():
    x = torch.randn(3, 5, 7)  # 105 elements: not a multiple of four
    drop = LoraDropout(0.3).train()
    torch.manual_seed(7)
    a = drop(x)
    torch.manual_seed(7)
    b = drop(x)
    assert a.shape == x.shape and torch.equal(a, b)
    assert (a == 0).any() and (a != 0).any()


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(2)
    x = torch.randn(64, 48, requires_grad=True)
    y = LoraDropout(0.25).train()(x)
    y.backward(torch.ones_like(y))
    kept = y.detach() != 0
    assert torch.equal(x.grad, kept.float() / 0.75)
    assert torch.allclose(y.detach()[kept], x.detach()[kept] / 0.75)


def test_eval_mode_and_zero_rate_are_the_identity():
    x = torch.randn(10, 10)
    assert torch.equal(LoraDropout(0.4).eval()(x), x)
    assert torch.equal(LoraDropout(0.0).train()(x), x)


def test_dual_lora_uses_it_for_both_adapters_and_it_is_active_in_training(fresh_tiny):
    dl = DualLoRA(fresh_tiny, LoraConfig(r=4, alpha=8, dropout=0.2, target_modules=["q_proj", "v_proj"]), DualConfig(enabled=True), False)
    drops = [m.lora_dropout for m in dl.model.modules() if isinstance(getattr(m, "lora_dropout", None), torch.nn.ModuleDict)]
    assert len(drops) == 4  # q and v in each of the two layers
    for d in drops:
        assert isinstance(d[FAST], LoraDropout) and isinstance(d[SLOW], LoraDropout)
        assert d[FAST].p == d[SLOW].p == 0.2
    with torch.no_grad():
        for p in dl.fast_params:  # non-zero B so the adapter (and its dropout) changes the output
            p.normal_()
    ids = torch.randint(4, fresh_tiny.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    dl.model.train()
    torch.manual_seed(0)
    a = dl.model(input_ids=ids).logits
    torch.manual_seed(1)
    b = dl.model(input_ids=ids).logits
    assert not torch.allclose(a, b)  # dropout draws a new mask
    dl.model.eval()
    assert torch.equal(dl.model(input_ids=ids).logits, dl.model(input_ids=ids).logits)
