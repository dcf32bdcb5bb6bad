"""EWC by hand on small tensors: the penalty 0.5 * lambda * sum F (theta - theta*)^2 added to
the step loss, the per-example (empirical) Fisher of a task, and the merge of a second task's
Fisher and anchor into one running quadratic (F = F1 + F2, anchor = (F1 a1 + F2 a2) / F),
which has the gradient of the two quadratics summed. The trainer is replaced by a stand-in
holding only what :class:`surecl.methods.ewc.EWC` reads (the ``ctx`` of its hooks)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import surecl.methods.ewc.method as ewc_module
from surecl.methods.base import Stage
from surecl.methods.ewc import EWC, EWCConfig


def stand_in(params: list[torch.Tensor], lam: float, train_sets=None, samples: int = 100) -> SimpleNamespace:
    model = torch.nn.Linear(1, 1)  # only its train/eval mode is used
    return SimpleNamespace(
        adapters=SimpleNamespace(fast_params=params),
        cfg=SimpleNamespace(ewc=EWCConfig(lam=lam, samples=samples)),
        model=model, train_sets=train_sets or [], batch=lambda items: items[0], is_seq2seq=False, device=torch.device("cpu"),
    )


def ewc_of(run: SimpleNamespace) -> EWC:
    """EWC configured from the stand-in run's config section (``ewc.lam``, ``ewc.samples``)."""
    return EWC(run.cfg.ewc)


def leaf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def test_penalty_is_half_lambda_times_the_fisher_weighted_squared_distance():
    p1, p2 = leaf([[1.0, 2.0]]), leaf([3.0])
    ctx = stand_in([p1, p2], lam=3.0)
    ewc = ewc_of(ctx)
    base = torch.tensor(1.5)
    assert ewc.loss(ctx, base) is base  # before any task: no penalty
    ewc.fisher = [torch.tensor([[1.0, 0.5]]), torch.tensor([0.25])]
    ewc.anchor = [torch.tensor([[0.0, 0.0]]), torch.tensor([1.0])]
    # sum F (p - a)^2 = 1 * 1 + 0.5 * 4 + 0.25 * 4 = 4; 0.5 * 3 * 4 = 6
    total = ewc.loss(ctx, base)
    assert total.item() == pytest.approx(1.5 + 6.0)
    total.backward()
    # d/dp = lambda * F * (p - a)
    assert p1.grad.flatten().tolist() == pytest.approx([3.0, 3.0]) and p2.grad.tolist() == pytest.approx([1.5])
    ctx0 = stand_in([p1, p2], lam=0.0)
    zero = ewc_of(ctx0)
    zero.fisher, zero.anchor = ewc.fisher, ewc.anchor
    assert zero.loss(ctx0, base).item() == pytest.approx(1.5)


def linear_nll(model, batch, scope="label", is_seq2seq=False):
    """A stand-in ``token_nll``: the item is a list of coefficient tensors ``c`` and its NLL is
    ``sum(c * theta)``, so its gradient is exactly ``c``."""
    params = model._ewc_params
    nll = sum((c * p).sum() for c, p in zip(batch, params))
    return nll.reshape(1), torch.ones(1)


def test_fisher_is_the_per_example_mean_and_a_second_task_merges_into_one_anchor(monkeypatch):
    theta = leaf([1.0, 1.0])
    task0 = [[torch.tensor([1.0, 2.0])], [torch.tensor([3.0, 0.0])], [torch.tensor([100.0, 100.0])]]
    task1 = [[torch.tensor([1.0, 1.0])]]
    run = stand_in([theta], lam=2.0, train_sets=[task0, task1], samples=2)  # the third task-0 item is beyond ewc.samples
    run.model._ewc_params = [theta]
    run.model.train()
    monkeypatch.setattr(ewc_module, "token_nll", linear_nll)
    ewc = ewc_of(run)

    ewc.after_task(run, Stage((0,), 0, (0,)))
    # mean of per-example squared gradients: ((1, 4) + (9, 0)) / 2 = (5, 2); the square of the
    # mean gradient would be (4, 1)
    assert ewc.fisher[0].tolist() == pytest.approx([5.0, 2.0])
    assert ewc.anchor[0].tolist() == pytest.approx([1.0, 1.0])
    assert run.model.training  # train mode restored after the Fisher pass

    with torch.no_grad():
        theta.copy_(torch.tensor([4.0, -2.0]))
    ewc.after_task(run, Stage((1,), 1, (0, 1)))
    # F2 = (1, 1); F = (6, 3); anchor = (F1 a1 + F2 a2) / F = ((5 + 4) / 6, (2 - 2) / 3)
    assert ewc.fisher[0].tolist() == pytest.approx([6.0, 3.0])
    assert ewc.anchor[0].tolist() == pytest.approx([1.5, 0.0])

    # the merged quadratic pulls like both tasks' quadratics together
    with torch.no_grad():
        theta.copy_(torch.tensor([0.3, 0.7]))
    theta.grad = None
    ewc.loss(run, torch.tensor(0.0)).backward()
    f1, a1, f2, a2 = torch.tensor([5.0, 2.0]), torch.tensor([1.0, 1.0]), torch.tensor([1.0, 1.0]), torch.tensor([4.0, -2.0])
    expected = 2.0 * (f1 * (theta.detach() - a1) + f2 * (theta.detach() - a2))
    assert theta.grad.tolist() == pytest.approx(expected.tolist())

    # and the running Fisher and anchor survive a checkpoint
    meta, tensors = ewc.state_dict()
    restored = ewc_of(run)
    restored.load_state_dict(meta, tensors)
    assert [f.tolist() for f in restored.fisher] == [f.tolist() for f in ewc.fisher]
    assert [a.tolist() for a in restored.anchor] == [a.tolist() for a in ewc.anchor]
