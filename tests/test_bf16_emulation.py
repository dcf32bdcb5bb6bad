"""bench/bf16_emulation.py computes what torch's own bf16 matmuls compute, forward and backward.

The bf16 vs fp32 parity figure of bench/RESULTS.md on CPUs without native bf16 matmuls rests on
this: the emulation widens bf16 operands to fp32, multiplies there and rounds the result to
bf16, which must agree with torch's bf16 kernels up to the order of the fp32 summation.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bf16_emulation import EmulatedBF16Matmuls, main  # noqa: E402

from surecl.data.encode import collate  # noqa: E402
from surecl.nll import token_nll  # noqa: E402

BF = torch.bfloat16


def _ulps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many bf16 steps separate two bf16 tensors of the same sign (element-wise)."""
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


def _operands(g):
    def r(*shape):
        return torch.randn(*shape, generator=g).to(BF)

    x, w, b, m = r(48, 96), r(80, 96), r(80), r(96, 64)
    bx, by = r(3, 48, 96), r(3, 96, 32)
    return {
        "linear": lambda: torch.nn.functional.linear(x, w, b),
        "linear, no bias, 3-d": lambda: torch.nn.functional.linear(bx, w),
        "mm": lambda: x @ m,
        "addmm": lambda: torch.addmm(b[:64], x, m),
        "bmm": lambda: torch.bmm(bx, by),
        "matmul broadcast": lambda: torch.matmul(bx, m),
        "mv": lambda: torch.mv(x, m[:, 0]),
    }


@pytest.mark.parametrize("name", list(_operands(torch.Generator())))
def test_products_agree_with_torch_bf16_kernels(name):
    fn = _operands(torch.Generator().manual_seed(0))[name]
    native = fn()
    mode = EmulatedBF16Matmuls()
    with mode:
        emulated = fn()
    assert mode.calls >= 1  # the product was taken over ...
    assert emulated.dtype == BF and emulated.shape == native.shape
    same_sign = torch.sign(native) == torch.sign(emulated)
    # ... and rounds to the same bf16 value, or its neighbour where the fp32 sums' order differs
    assert bool(same_sign.all()) or float(native[~same_sign].float().abs().max()) < 1e-2
    assert int(_ulps_apart(native[same_sign], emulated[same_sign]).max()) <= 1
    assert float((native == emulated).float().mean()) > 0.98


def test_product_is_the_fp32_product_of_the_widened_operands_rounded_once():
    """Where torch's bf16 kernel rounds differently (its own summation order), the emulation
    still gives exactly the fp32 product of the widened operands, rounded to bf16 once."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(117, 1536, generator=g).to(BF)
    w = (torch.randn(576, 1536, generator=g) / 1536**0.5).to(BF)
    with EmulatedBF16Matmuls():
        emulated = torch.nn.functional.linear(x, w)
    assert torch.equal(emulated, torch.nn.functional.linear(x.float(), w.float()).to(BF))
    assert not torch.equal(emulated, torch.nn.functional.linear(x, w))  # so the mode did take over


def test_mixed_dtypes_raise_as_natively():
    x, w = torch.randn(4, 8).to(BF), torch.randn(8, 3)
    with pytest.raises(RuntimeError) as native:
        torch.mm(x, w)
    mode = EmulatedBF16Matmuls()
    with mode, pytest.raises(RuntimeError) as emulated:
        torch.mm(x, w)
    assert mode.calls == 0
    assert str(emulated.value) == str(native.value)


def test_fp32_products_are_left_alone():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(16, 32, generator=g), torch.randn(8, 32, generator=g)
    mode = EmulatedBF16Matmuls()
    with mode:
        out = torch.nn.functional.linear(x, w)
    assert mode.calls == 0
    assert torch.equal(out, torch.nn.functional.linear(x, w))


def _loss_and_grads(base, rows, pad, emulate: bool, random_dual):
    dl = random_dual(copy.deepcopy(base), 0.2, ("q_proj", "v_proj", "up_proj"))
    dl.model.train()
    mode = EmulatedBF16Matmuls()
    batch = collate(rows, pad, False, share_prefix=True)
    with mode if emulate else contextlib.nullcontext():
        nll, count = token_nll(dl.model, batch, scope="sequence")
        forward_calls = mode.calls
        loss = nll.sum() / count.sum()
        loss.backward()
    return loss.item(), [p.grad.clone() for p in dl.fast_params], [p.dtype for p in dl.fast_params], forward_calls, mode.calls


def test_bf16_model_step_matches_torch_bf16(tiny_loaded, task_examples, random_dual):
    """A training step of a bf16 base with fp32 LoRA: the emulated step takes over the matmuls of
    the forward and of the backward, and lands on torch's bf16 loss and LoRA gradients far closer
    than the same step in fp32 does (it keeps bf16's rounding, not only fp32's products)."""
    rows = task_examples(1, 6, seed=3)
    pad = tiny_loaded.tokenizer.pad_token_id
    bf16_base = copy.deepcopy(tiny_loaded.model).to(BF)
    loss_native, grads_native, dtypes, _, _ = _loss_and_grads(bf16_base, rows, pad, emulate=False, random_dual=random_dual)
    loss_emul, grads_emul, _, forward_calls, all_calls = _loss_and_grads(bf16_base, rows, pad, emulate=True, random_dual=random_dual)
    loss_fp32, grads_fp32, _, _, _ = _loss_and_grads(tiny_loaded.model, rows, pad, emulate=False, random_dual=random_dual)
    assert set(dtypes) == {torch.float32}  # LoRA stays fp32 on the bf16 base
    assert forward_calls >= 2 * 7  # two layers' q, k, v, o, gate, up, down at least (+ the output layer)
    assert all_calls > forward_calls  # the backward's products were taken over too
    assert abs(loss_emul - loss_native) < 0.5 * abs(loss_fp32 - loss_native)

    def flat(grads):
        return torch.cat([g.flatten() for g in grads])

    native = flat(grads_native)
    assert float(native.abs().max()) > 1e-3  # the step moves the adapter
    error_emul = float((flat(grads_emul) - native).norm() / native.norm())
    error_fp32 = float((flat(grads_fp32) - native).norm() / native.norm())
    assert error_emul < 0.5 * error_fp32


def test_cli_entry_runs_a_bf16_base_under_the_emulation(tmp_path, tiny_loaded, tiny_cache, monkeypatch, capsys):
    """A whole run (scoring, training, replay, evaluation) of the tiny model held in bf16: the
    emulation takes products over, and every product of the run has bf16 operands only (a mixed
    one would raise, as it would natively)."""
    import json

    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    out = tmp_path / "run"
    argv = ["run", "--config", "tiny,surprise", "--quiet", f"model.name={tiny_loaded.path}", "model.dtype=bf16"]
    assert main([*argv, "data.n_train=8", "data.n_test=4", "train.epochs=1", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "bf16 matmuls emulated: bf16 operands" in err
    calls = int(err.split("bf16 matmuls emulated: ")[-1].split()[0])
    assert calls > 100
    results = json.loads((out / "results.json").read_text())
    assert results["base_dtype"] == "bfloat16"
    assert main(["run", "--config", "tiny", "no_such_key=1", "--out", str(tmp_path / "bad")]) == 2
