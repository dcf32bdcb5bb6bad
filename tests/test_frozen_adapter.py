"""The learner's frozen always-on adapters (:meth:`surecl.adapters.DualLoRA.add_frozen_adapter`):
active beside the asked-for adapter in training and in every evaluation view, never trained,
drawn without touching the run's random stream, and saved summed with the view as one PEFT
adapter that plain PEFT loads to the same logits."""

from __future__ import annotations

import json

import torch

from surecl.adapters import FAST, DualLoRA
from surecl.config import DualConfig, LoraConfig

LORA = LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"])


def lora_layers(model):
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def test_frozen_adapter_answers_in_every_view_and_saves_summed(fresh_tiny, tiny_loaded, tmp_path):
    import copy

    from peft import PeftModel

    dl = DualLoRA(fresh_tiny, LORA, DualConfig(), is_seq2seq=False)
    rng = torch.get_rng_state()
    dl.add_frozen_adapter("extra", r=6, alpha=12)  # the fast adapter's scaling, 8 / 4 = 12 / 6
    assert torch.equal(torch.get_rng_state(), rng)
    g = torch.Generator().manual_seed(0)
    extra = [p for n, p in dl.model.named_parameters() if ".extra." in n]
    with torch.no_grad():
        for p in [*dl.fast_params, *extra]:
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    assert all(not p.requires_grad for p in extra) and all(p.requires_grad for p in dl.fast_params)
    ids = torch.tensor([[5, 9, 12, 7, 30, 4]])
    with torch.no_grad():
        both = dl.model(input_ids=ids).logits
    layers = lora_layers(dl.model)
    with dl.evaluating("fast"):
        assert all(set(m.active_adapters) == {FAST, "extra"} for m in layers)
        with torch.no_grad():
            assert torch.equal(dl.model(input_ids=ids).logits, both)
    assert all(set(m.active_adapters) == {FAST, "extra"} for m in layers) and all(not p.requires_grad for p in extra)
    # only the fast adapter gets a gradient (the frozen one's part is checked at the end)
    dl.model(input_ids=ids).logits.sum().backward()
    assert all(p.grad is None for p in extra) and any(p.grad is not None and p.grad.abs().sum() > 0 for p in dl.fast_params)
    dl.save_pretrained(tmp_path, FAST)
    config = json.loads((tmp_path / FAST / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["inference_mode"]) == (10, 20, True)
    loaded = PeftModel.from_pretrained(copy.deepcopy(tiny_loaded.model), tmp_path / FAST).eval()
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, both, atol=1e-5)
        for p in extra:
            p.zero_()
        assert not torch.allclose(dl.model(input_ids=ids).logits, both, atol=1e-3)


def test_a_different_scaling_is_folded_into_the_saved_b(fresh_tiny, tiny_loaded, tmp_path):
    import copy

    from peft import PeftModel

    dl = DualLoRA(fresh_tiny, LORA, DualConfig(), is_seq2seq=False)
    dl.add_frozen_adapter("extra", r=2, alpha=10)  # scaling 5, against fast's 2
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in dl.model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    ids = torch.tensor([[5, 9, 12, 7]])
    dl.model.eval()
    with torch.no_grad():
        expected = dl.model(input_ids=ids).logits
    dl.save_pretrained(tmp_path, FAST)
    loaded = PeftModel.from_pretrained(copy.deepcopy(tiny_loaded.model), tmp_path / FAST).eval()
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, expected, atol=1e-5)
