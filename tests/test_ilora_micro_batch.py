"""I-LoRA's consistency term under ``train.micro_batch_tokens``: its forwards stay within the
bound the step's own slices keep, and the sliced term gives the loss and the gradient of the
term computed on the whole batch at once (methods/ilora/method.py, ``ILoRA.consistency``)."""

from __future__ import annotations

import pytest
import torch

from surecl.config import build_config
from surecl.methods.ilora.method import ILoRA
from surecl.trainer import ContinualRun

BOUND = 64


def _spy(monkeypatch) -> list[tuple[int, int, bool]]:
    """Every consistency forward's (rows, padded width, with gradients)."""
    seen: list[tuple[int, int, bool]] = []
    real = ILoRA.hidden

    def hidden(self, ctx, batch):
        seen.append((*batch["input_ids"].shape, torch.is_grad_enabled()))
        return real(self, ctx, batch)

    monkeypatch.setattr(ILoRA, "hidden", hidden)
    return seen


def test_no_consistency_forward_outgrows_the_micro_batch(tmp_path, tiny_cache, monkeypatch):
    """Eight new rows a step of about 30 tokens, and eight replayed ones on the second task, at a bound
    of 64: the step trains in slices of two rows, and so does the term, in both its passes (the
    step's rows all ran in one before: 16 x 32 tokens). The run trains the plastic adapter the
    run without slices (bound 0) trains, the term weighing fifty times the loss."""
    args = ["data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=2", "train.epochs=1", "replay.buffer_size=8",
            "ilora.consistency_weight=50"]
    trained = {}
    for bound in (0, BOUND):
        seen = _spy(monkeypatch)
        run = ContinualRun(build_config("tiny,ilora", [*args, f"train.micro_batch_tokens={bound}"]), tmp_path / str(bound),
                           progress=False, cache_dir=tiny_cache)
        run.run()
        trained[bound] = [p.detach().clone() for p in run.adapters.fast_params]
    assert any(grad for _, _, grad in seen) and any(not grad for _, _, grad in seen)
    assert all(rows * width <= BOUND or rows == 1 for rows, width, _ in seen), sorted(set(seen))
    assert sum(rows for rows, _, grad in seen if grad) == 16 + 2 * (8 + 8)  # every row of the four steps, each once
    worst = max(float((a - b).norm() / b.norm()) for a, b in zip(trained[BOUND], trained[0]) if b.norm() > 0)
    assert worst < 1e-5, worst


def _perturbed(tmp_path, cache, preset: str) -> ContinualRun:
    run = ContinualRun(build_config(f"tiny,{preset}", ["data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=2",
                                                       "lora.dropout=0", "ilora.consistency_weight=2.5"]),
                       tmp_path / preset, progress=False, cache_dir=cache)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in run.adapters.fast_params:
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return run


def _term_and_grads(run: ContinualRun, limit: int) -> tuple[float, list[torch.Tensor]]:
    run.cfg.train.micro_batch_tokens = limit
    for p in run.adapters.fast_params:
        p.grad = None
    loss = run.method.loss(run, torch.zeros((), requires_grad=True) * 1.0)
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in run.adapters.fast_params]


@pytest.mark.parametrize("preset", ["ilora", "ilora_llmcl"])
def test_the_sliced_term_has_the_whole_batchs_loss_and_gradient(preset, tmp_path, tiny_cache, monkeypatch):
    """Rows of both tasks, of several lengths (so the pads differ from row to row), through the
    loss hook at a bound that cuts them into five slices or more and at 0 (one forward): the same term
    and the same gradient on every fast tensor, for EasyCL's reading (MSE toward the stable
    side, three layers, every row) and the authors' (toward the maximum, every hidden state,
    the replayed rows only), the consistency weight reaching the slices whose gradient was
    taken before the backward."""
    run = _perturbed(tmp_path, tiny_cache, preset)
    run.step_items = [(1, i) for i in range(4)] + [(0, i) for i in range(10)]
    run.step_new = 4
    lengths = {len(run.train_sets[t][i]) for t, i in run.step_items[run.step_new :]}
    assert len(lengths) > 1
    seen = _spy(monkeypatch)
    sliced, sliced_grads = _term_and_grads(run, BOUND)
    grad_rows = [rows for rows, _, grad in seen if grad]
    assert len(grad_rows) >= 5 and all(rows * width <= BOUND for rows, width, _ in seen)
    whole, whole_grads = _term_and_grads(run, 0)
    assert [rows for rows, _, grad in seen if grad][len(grad_rows):] == [sum(grad_rows)]  # one forward, every row
    assert sliced > 0 and sliced == pytest.approx(whole, rel=1e-5)
    assert any(bool(g.abs().sum() > 0) for g in whole_grads)
    worst = max(float((a - b).norm() / b.norm()) for a, b in zip(sliced_grads, whole_grads) if b.norm() > 0)
    assert worst < 1e-5, worst
