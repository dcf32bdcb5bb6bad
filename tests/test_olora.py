"""O-LoRA and N-LoRA on small tensors and on the tiny model's PEFT layers, without training:
the penalties (value, zero set, growth, gradient), the past store of earlier tasks' LoRAs
(its scaling, what moves into it when a task starts, its checkpoint), and what the methods
refuse. The run stand-in holds only what :class:`surecl.methods.olora.TaskLoRAs` reads."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from surecl.adapters import FAST, DualLoRA, task_seed
from surecl.config import DualConfig, LoraConfig, build_config
from surecl.errors import SureclError
from surecl.methods.base import Stage
from surecl.methods.olora import PAST, NLoRA, NLoRAConfig, OLoRA, OLoRAConfig, l1_of_delta, l2_penalty, orth_penalty

LORA = LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])


def rows(*vectors) -> torch.Tensor:
    return torch.tensor(vectors, dtype=torch.float64)


# ------------------------------------------------------------------ the penalties


def test_orthogonality_penalty_is_zero_for_orthogonal_a_and_grows_with_their_overlap():
    basis = torch.linalg.qr(torch.randn(16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))[0].T
    past, new = basis[:6], basis[6:10]  # orthonormal rows: two earlier tasks of rank 3, one new of rank 4
    assert orth_penalty(past, new).item() == pytest.approx(0.0, abs=1e-24)
    assert orth_penalty(past, new, "l1").item() == pytest.approx(0.0, abs=1e-12)
    values = {"fro2": [], "l1": []}
    for theta in (0.0, 0.1, 0.3, 0.6, math.pi / 2):  # rotate the new A's first row toward a past row
        tilted = new.clone()
        tilted[0] = math.cos(theta) * new[0] + math.sin(theta) * past[2]
        for norm in values:
            values[norm].append(orth_penalty(past, tilted, norm).item())
    for norm, v in values.items():
        assert v == sorted(v) and v[0] == pytest.approx(0.0, abs=1e-12) and v[-1] > 0.99, (norm, v)
    assert values["fro2"][2] == pytest.approx(math.sin(0.3) ** 2)  # the one overlap entry, squared
    assert values["l1"][2] == pytest.approx(math.sin(0.3))  # ... or its absolute value (O-LoRA's code)


def test_orthogonality_penalty_is_the_paper_sum_over_earlier_tasks():
    g = torch.Generator().manual_seed(1)
    a1, a2, new = (torch.randn(3, 10, dtype=torch.float64, generator=g) for _ in range(3))
    # the paper's A_i is (in, r): sum_i ||A_i^T A_t||_F^2; the code's: |A_prev A_new^T| summed
    paper = sum(((a.T).T @ new.T).pow(2).sum() for a in (a1, a2))
    assert orth_penalty(torch.cat([a1, a2]), new).item() == pytest.approx(paper.item())
    code = sum(torch.abs(torch.mm(a, new.T)).sum() for a in (a1, a2))
    assert orth_penalty(torch.cat([a1, a2]), new, "l1").item() == pytest.approx(code.item())


def test_l2_penalty_squared_or_per_tensor_norm():
    a, b = rows([3.0, 4.0]), rows([1.0], [2.0], [2.0])
    assert l2_penalty([a, b]).item() == pytest.approx(25.0 + 9.0)  # the paper's ||theta||_2^2
    assert l2_penalty([a, b], "fro").item() == pytest.approx(5.0 + 3.0)  # the code's torch.norm(p, p=2), summed


def test_l1_penalty_value_and_gradient_match_the_plain_formula():
    g = torch.Generator().manual_seed(2)
    b = torch.randn(7, 3, dtype=torch.float64, generator=g, requires_grad=True)
    a = torch.randn(3, 5, dtype=torch.float64, generator=g, requires_grad=True)
    value = l1_of_delta(b, a)
    assert value.item() == pytest.approx((b @ a).abs().sum().item())
    torch.autograd.gradcheck(l1_of_delta, (b, a))  # the hand-written backward (recomputes B A)
    grad_b, grad_a = torch.autograd.grad(2.5 * value, (b, a))
    sign = torch.sign(b @ a)
    assert torch.allclose(grad_b, 2.5 * sign @ a.T) and torch.allclose(grad_a, 2.5 * b.T @ sign)


@pytest.mark.parametrize("form", ["delta", "ab"])
def test_l1_penalty_gradient_pushes_the_lora_toward_zero(form):
    """||B A||_1 (and the code's ||A B||_1) is 1-homogeneous in each factor, so <grad_B, B> =
    <grad_A, A> = the penalty > 0: minus the gradient points toward zero for both, and descent
    on the penalty alone shrinks the update to (near) zero."""
    g = torch.Generator().manual_seed(3)
    b = torch.randn(6, 2, dtype=torch.float64, generator=g, requires_grad=True)
    a = torch.randn(2, 6, dtype=torch.float64, generator=g, requires_grad=True)
    penalty = (lambda: l1_of_delta(b, a)) if form == "delta" else (lambda: (a @ b).abs().sum())
    value = penalty()
    grad_b, grad_a = torch.autograd.grad(value, (b, a))
    assert (grad_b * b).sum().item() == pytest.approx(value.item())
    assert (grad_a * a).sum().item() == pytest.approx(value.item())
    history, start = [value.item()], (a.detach().norm().item(), b.detach().norm().item())
    opt = torch.optim.SGD([a, b], lr=0.01)
    for _ in range(300):
        opt.zero_grad()
        penalty().backward()
        opt.step()
        history.append(penalty().item())
    assert history[-1] < 0.05 * history[0], history[::50]
    # d||A||^2/dt = d||B||^2/dt = -2 * penalty under gradient flow: both factors shrink
    assert a.detach().norm().item() < start[0] and b.detach().norm().item() < start[1]


# ------------------------------------------------------------------ the past store on PEFT layers


def stand_in(model, n_tasks: int = 3, method: str = "olora", overrides=()) -> SimpleNamespace:
    cfg = build_config(
        f"tiny,{method}", [f"lora.r={LORA.r}", f"lora.alpha={LORA.alpha}", "lora.target_modules=[q_proj,v_proj]", *overrides]
    )
    adapters = DualLoRA(model, LORA, cfg.dual, is_seq2seq=False)
    resets = []
    return SimpleNamespace(
        cfg=cfg, tasks=[None] * n_tasks, adapters=adapters, model=adapters.model, resets=resets, reset_optimizer=lambda: resets.append(True),
        streams_seed=0,
    )


def layers_of(model):
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def test_setup_adds_a_zero_past_adapter_of_rank_r_times_earlier_tasks_with_the_fast_scaling(fresh_tiny):
    ctx = stand_in(fresh_tiny, n_tasks=4)
    rng = torch.get_rng_state()
    method = OLoRA(OLoRAConfig())
    method.setup(ctx)
    assert torch.equal(torch.get_rng_state(), rng)  # its random init came from a forked stream
    assert ctx.adapters.always_on == [PAST]
    for layer in layers_of(ctx.model):
        assert layer.lora_A[PAST].weight.shape == (3 * LORA.r, layer.in_features)
        assert layer.lora_B[PAST].weight.shape == (layer.out_features, 3 * LORA.r)
        assert layer.scaling[PAST] == layer.scaling[FAST] == LORA.alpha / LORA.r
        assert not layer.lora_A[PAST].weight.any() and not layer.lora_B[PAST].weight.requires_grad
        assert set(layer.active_adapters) == {FAST, PAST}
    assert len(method.layers) == 4  # q and v of the two layers
    with ctx.adapters.evaluating("fast"):  # every view keeps past active
        assert all(set(layer.active_adapters) == {FAST, PAST} for layer in layers_of(ctx.model))


def test_a_one_task_stream_needs_no_past_adapter(fresh_tiny):
    ctx = stand_in(fresh_tiny, n_tasks=1)
    method = OLoRA(OLoRAConfig(lambda_l2=0.1))
    method.setup(ctx)
    assert ctx.adapters.always_on == [] and all(layer.past_a is None for layer in method.layers)
    assert method.loss(ctx, torch.tensor(1.0)).item() > 1.0  # the L2 term still applies


@torch.no_grad()
def test_each_task_start_moves_the_trained_lora_into_its_block_and_redraws_fast(fresh_tiny):
    ctx = stand_in(fresh_tiny, n_tasks=3)
    method = OLoRA(OLoRAConfig())
    method.setup(ctx)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(4))
    trained = []
    method.before_task(ctx, Stage((0,), 0, (0,)))
    assert method.filled == 0 and ctx.resets == []  # the first task trains the initial fast LoRA
    for row in (1, 2):
        for p in ctx.adapters.fast_params:  # "train" the fast LoRA
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * row + p.numel() % 7)))
        trained.append({id(layer): (layer.fast_a.clone(), layer.fast_b.clone()) for layer in method.layers})
        rng = torch.get_rng_state()
        method.before_task(ctx, Stage((row,), row, tuple(range(row + 1))))
        assert method.filled == row and len(ctx.resets) == row
        # the fresh A comes from the run's seed and the task alone: the run's own stream (each
        # process's dropout masks) is left as it was, and the same draw comes again
        assert torch.equal(torch.get_rng_state(), rng)
        drawn = [layer.fast_a.clone() for layer in method.layers]
        ctx.adapters.reset_fast(task_seed(ctx.streams_seed, row, 2))
        assert all(torch.equal(layer.fast_a, a) for layer, a in zip(method.layers, drawn))
        for layer in method.layers:
            assert not layer.fast_b.any()  # fresh: B zero, A redrawn
            assert not torch.equal(layer.fast_a, trained[-1][id(layer)][0])
            for k, snapshot in enumerate(trained):  # every earlier task in its block, unchanged
                a, b = snapshot[id(layer)]
                assert torch.equal(layer.past_a[k * LORA.r : (k + 1) * LORA.r], a)
                assert torch.equal(layer.past_b[:, k * LORA.r : (k + 1) * LORA.r], b)
    # past's update is exactly sum_i s * B_i A_i, in every forward
    module = layers_of(ctx.model)[0]
    layer = method.layers[0]
    expected = sum(s[id(layer)][1] @ s[id(layer)][0] for s in trained)
    got = module.lora_B[PAST](module.lora_A[PAST](x))
    assert torch.allclose(got, x @ expected.T, atol=1e-4)
    base = module.base_layer(x)
    fast = module.lora_B[FAST](module.lora_A[FAST](x)) * module.scaling[FAST]
    assert torch.allclose(module(x), base + fast + got * module.scaling[PAST], atol=1e-5)


def test_orthogonality_penalty_uses_only_the_filled_blocks_and_trains_only_fast(fresh_tiny):
    ctx = stand_in(fresh_tiny, n_tasks=3, overrides=["olora.lambda_orth=2.0"])
    method = OLoRA(ctx.cfg.olora)
    method.setup(ctx)
    loss = torch.tensor(1.0)
    assert method.loss(ctx, loss) is loss  # first task: nothing to be orthogonal to, no L2
    with torch.no_grad():
        for p in ctx.adapters.fast_params:
            p.normal_(generator=torch.Generator().manual_seed(p.numel()))
    method.before_task(ctx, Stage((1,), 1, (0, 1)))
    with torch.no_grad():  # the new A = the old one: maximal overlap
        for layer in method.layers:
            layer.fast_a.copy_(layer.past_a[: LORA.r])
    total = method.loss(ctx, loss)
    # the default is the reference's code (cmnfriend/O-LoRA src/uie_trainer_lora.py L96):
    # orthogonal_loss += torch.abs(torch.mm(lora_A, loranew_A.T)).sum()
    expected = 2.0 * sum(torch.abs(torch.mm(layer.past_a[: LORA.r], layer.fast_a.T)).sum() for layer in method.layers)
    assert total.item() == pytest.approx(1.0 + expected.item(), rel=1e-5)
    total.backward()
    assert all(layer.fast_a.grad is not None and layer.fast_a.grad.abs().sum() > 0 for layer in method.layers)
    assert all(layer.past_a.grad is None for layer in method.layers)


def test_past_store_state_round_trips_into_a_fresh_run(fresh_tiny, tiny_loaded):
    import copy

    ctx = stand_in(fresh_tiny, n_tasks=3)
    method = OLoRA(OLoRAConfig())
    method.setup(ctx)
    with torch.no_grad():
        for p in ctx.adapters.fast_params:
            p.uniform_(-1, 1, generator=torch.Generator().manual_seed(p.numel()))
    method.before_task(ctx, Stage((1,), 1, (0, 1)))
    meta, tensors = method.state_dict()
    assert meta == {"filled": 1} and all(t.shape[0 if k.endswith("/A") else 1] == LORA.r for k, t in tensors.items())
    other = stand_in(copy.deepcopy(tiny_loaded.model), n_tasks=3)
    restored = OLoRA(OLoRAConfig())
    restored.setup(other)
    restored.load_state_dict(meta, tensors)
    assert restored.filled == 1
    for mine, theirs in zip(method.layers, restored.layers):
        assert torch.equal(mine.past_a, theirs.past_a) and torch.equal(mine.past_b, theirs.past_b)


def test_nlora_penalty_is_lambda_times_l1_of_each_update(fresh_tiny):
    ctx = stand_in(fresh_tiny, n_tasks=2, method="nlora")
    method = NLoRA(ctx.cfg.nlora)
    assert method.config == NLoRAConfig()
    method.setup(ctx)
    with torch.no_grad():
        for p in ctx.adapters.fast_params:
            p.uniform_(-0.1, 0.1, generator=torch.Generator().manual_seed(p.numel()))
    total = method.loss(ctx, torch.tensor(0.5))
    lam = method.config.lambda_l1
    assert lam > 0
    expected = lam * sum((layer.fast_b @ layer.fast_a).abs().sum() for layer in method.layers)
    assert total.item() == pytest.approx(0.5 + expected.item(), rel=1e-5)
    method.config.l1_of = "ab"  # q_proj and v_proj of the tiny model are square
    expected = lam * sum((layer.fast_a @ layer.fast_b).abs().sum() for layer in method.layers)
    assert method.loss(ctx, torch.tensor(0.5)).item() == pytest.approx(0.5 + expected.item(), rel=1e-5)


def test_refused_combinations_name_the_key(fresh_tiny, tiny_loaded):
    import copy

    with pytest.raises(SureclError, match=r"^dual.enabled: method olora .*set dual.enabled=false"):
        OLoRA(OLoRAConfig()).setup(stand_in(fresh_tiny, overrides=["dual.enabled=true"]))
    ctx = stand_in(copy.deepcopy(tiny_loaded.model), method="nlora")
    ctx.adapters = DualLoRA(
        copy.deepcopy(tiny_loaded.model), LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=["up_proj"]), DualConfig(), False
    )
    with pytest.raises(SureclError, match=r"^nlora.l1_of: 'ab' .*up_proj maps 128 to 256"):
        NLoRA(NLoRAConfig(l1_of="ab")).setup(ctx)


@pytest.mark.parametrize(
    "override, words",
    [
        ("olora.orth_norm=l2", ["olora.orth_norm", "'l2'"]),
        ("olora.l2_norm=l1", ["olora.l2_norm", "'l1'"]),
        ("olora.lambda_orth=-1", ["olora.lambda_orth", "-1"]),
        ("olora.lambda_l2=nan", ["olora.lambda_l2"]),
        ("nlora.lambda_l1=-0.1", ["nlora.lambda_l1"]),
        ("nlora.l1_of=ba", ["nlora.l1_of", "'ba'"]),
    ],
)
def test_invalid_options_are_one_line_errors_naming_the_key(override, words):
    with pytest.raises(SureclError) as err:
        build_config("tiny,olora", [override])
    assert all(w in str(err.value) for w in words) and "\n" not in str(err.value)


def test_default_penalty_is_the_reference_code_on_fixed_tensors(fresh_tiny):
    """O-LoRA's default penalty equals its reference's formula (``src/uie_trainer_lora.py``
    L91-109): lamda_1 * sum |A_prev A_new^T| + lamda_2 * sum_params torch.norm(param, p=2)."""
    ctx = stand_in(fresh_tiny, n_tasks=2, overrides=["olora.lambda_orth=0.5", "olora.lambda_l2=0.1"])
    method = OLoRA(ctx.cfg.olora)
    method.setup(ctx)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in ctx.adapters.fast_params:
            p.copy_(torch.randn(p.shape, generator=g))
    method.before_task(ctx, Stage((1,), 1, (0, 1)))
    with torch.no_grad():
        for p in ctx.adapters.fast_params:
            p.copy_(torch.randn(p.shape, generator=g))
    orth = sum(torch.abs(torch.mm(layer.past_a[: LORA.r], layer.fast_a.T)).sum() for layer in method.layers)
    l2 = sum(torch.norm(p, p=2) for layer in method.layers for p in (layer.fast_a, layer.fast_b))
    total = method.loss(ctx, torch.tensor(0.0))
    assert total.item() == pytest.approx((0.5 * orth + 0.1 * l2).item(), rel=1e-5)
    squared = sum((layer.past_a[: LORA.r] @ layer.fast_a.T).pow(2).sum() for layer in method.layers)
    assert abs(total.item() - (0.5 * squared + 0.1 * l2).item()) > 1e-3  # not the paper's squared form


def test_per_task_strengths_follow_the_stage_task(fresh_tiny):
    """``olora.per_task`` gives the task being trained its own lambdas (long.sh sets them per task)."""
    import types

    ctx = stand_in(fresh_tiny, n_tasks=2, overrides=["olora.lambda_orth=0.5", "olora.per_task=[t1:3:0.2]"])
    method = OLoRA(ctx.cfg.olora)
    ctx.tasks = [types.SimpleNamespace(name="t0"), types.SimpleNamespace(name="t1")]
    ctx.stage = Stage((1,), 1, (0, 1))
    assert method.strengths(ctx) == (3.0, 0.2)
    ctx.stage = Stage((0,), 0, (0,))
    assert method.strengths(ctx) == (0.5, 0.0)
