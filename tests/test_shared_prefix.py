"""A shared prompt prefix run once per batch computes the same training step as whole rows."""

from __future__ import annotations

import json

import pytest
import torch

from surecl.config import build_config
from surecl.data.encode import Encoded, collate, micro_batch_positions, shared_prefix_len
from surecl.nll import token_nll
from surecl.trainer import run


@pytest.fixture(scope="module")
def rows(task_examples) -> list[Encoded]:
    return task_examples(2, 6, seed=2)


def _grads(model, params, batch, scope):
    for p in params:
        p.grad = None
    nll, count = token_nll(model, batch, scope=scope)
    (nll.sum() / count.sum()).backward()
    return nll.detach(), [p.grad.clone() for p in params]


@pytest.mark.parametrize("scope", ["label", "sequence"])
def test_gradient_through_a_shared_prefix_equals_whole_rows(fresh_tiny, tiny_loaded, rows, scope, random_dual):
    dl = random_dual(fresh_tiny, 0.2, ("q_proj", "v_proj", "up_proj"))
    dl.model.train()
    pad = tiny_loaded.tokenizer.pad_token_id
    n = shared_prefix_len(rows)
    assert n > 0
    whole_nll, whole = _grads(dl.model, dl.fast_params, collate(rows, pad, False), scope)
    shared_nll, shared = _grads(dl.model, dl.fast_params, collate(rows, pad, False, share_prefix=True), scope)
    assert shared_nll.tolist() == pytest.approx(whole_nll.tolist(), abs=1e-4, rel=1e-5)
    assert any(float(gw.abs().max()) > 1e-3 for gw in whole)  # the step does move the adapter
    for gs, gw in zip(shared, whole, strict=True):
        torch.testing.assert_close(gs, gw, atol=1e-5, rtol=1e-4)


def test_positions_group_by_task_and_cover_every_item():
    items = [Encoded(list(range(n - 1)), [0], "x") for n in (10, 30, 20, 40, 5, 12)]
    groups = [0, 1, 0, 1, 2, 0]
    slices = micro_batch_positions(items, 64, groups, min_saving=1)
    assert sorted(i for s in slices for i in s) == list(range(len(items)))
    for s in slices:
        assert len({groups[i] for i in s}) == 1
        assert len(s) == 1 or len(s) * max(len(items[i]) for i in s) <= 64
    assert slices == [[0, 2, 5], [1], [3], [4]]
    assert micro_batch_positions(items, 0, groups, min_saving=1) == [[0, 2, 5], [1, 3], [4]]
    # a saving floor above both groups' (16 and 28 tokens) pools every row: the ungrouped slices
    assert micro_batch_positions(items, 64, groups, min_saving=29) == micro_batch_positions(items, 64) == [[0, 1], [2], [3], [4, 5]]
    # items alone in their task share nothing: they run together, after the groups
    assert micro_batch_positions(items, 64, [3, 0, 1, 0, 2, 0], min_saving=1) == [[1], [3], [5], [0, 2, 4]]
    assert micro_batch_positions(items, 0, [3, 0, 1, 0, 2, 0], min_saving=1) == [[1, 3, 5], [0, 2, 4]]


def test_groups_that_save_few_prefix_tokens_join_the_mixed_slices():
    task = [Encoded(list(range(40)) + [100 + n], [0], "x") for n in range(4)]  # a 40-token prefix
    pair = [Encoded([7] + list(range(40)) + [200 + n], [0], "x") for n in range(2)]  # 41 shared
    lone = Encoded([9, 9, 9], [0], "x")
    items = [task[0], pair[0], task[1], lone, pair[1], task[2], task[3]]
    groups = [0, 1, 0, 2, 1, 0, 0]
    # task 0's four rows save 3 x 40 = 120 tokens, the pair 41, the lone row none
    assert shared_prefix_len(task) == 40 and shared_prefix_len(pair) == 41
    assert micro_batch_positions(items, 0, groups, min_saving=41) == [[0, 2, 5, 6], [1, 4], [3]]
    assert micro_batch_positions(items, 0, groups, min_saving=42) == [[0, 2, 5, 6], [1, 3, 4]]
    assert micro_batch_positions(items, 0, groups, min_saving=120) == [[0, 2, 5, 6], [1, 3, 4]]
    assert micro_batch_positions(items, 0, groups, min_saving=121) == [[0, 1, 2, 3, 4, 5, 6]]
    # the default: a replayed pair with a 41-token prefix is not worth its own slice
    assert micro_batch_positions(items, 0, groups) == [[0, 2, 5, 6], [1, 3, 4]]


def _losses(out):
    return [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]


def counting_prefix_passes(monkeypatch) -> dict[str, list[int]]:
    """Count the batches that run a shared prefix (``prefix_ids``) and those that do not, in
    training (``token_nll`` with grad), scoring (``token_nll`` without) and evaluation
    (generation's prompt pass): ``{where: [with prefix, without]}``."""
    import surecl.evaluate
    import surecl.nll

    seen = {"train": [0, 0], "score": [0, 0], "eval": [0, 0]}

    def spy(original, where):
        def prefixed(model, batch, *args, **kwargs):
            kind = where or ("train" if torch.is_grad_enabled() else "score")
            seen[kind][0 if batch.get("prefix_ids") is not None else 1] += 1
            return original(model, batch, *args, **kwargs)

        return prefixed

    monkeypatch.setattr(surecl.nll, "prefixed", spy(surecl.nll.prefixed, None))
    monkeypatch.setattr(surecl.evaluate, "prefixed", spy(surecl.evaluate.prefixed, "eval"))
    return seen


@pytest.mark.parametrize("preset", ["slow_surprise", "online_surprise"])
def test_run_with_shared_prefix_equals_run_without(preset, tmp_path, tiny_cache):
    """Scoring, training (mixed current + replay batches, sliced) and evaluation through the
    shared prefix give the run the plain path gives."""
    base = ["data.tasks=[colors,animals]", "data.n_train=24", "data.n_test=8", "train.micro_batch_tokens=200"]
    res, passes = {}, {}
    for share in (True, False):
        cfg = build_config(f"tiny,{preset}", base + [f"model.share_prefix={str(share).lower()}"])
        with pytest.MonkeyPatch.context() as mp:
            passes[share] = counting_prefix_passes(mp)
            res[share] = run(cfg, tmp_path / str(share), progress=False, cache_dir=tiny_cache)
    # the prefix path really ran: at least one prefixed slice per training step, prefixed
    # scoring batches (slow_surprise scores each task) and prefixed evaluation batches
    assert passes[True]["train"][0] >= res[True]["steps"], passes
    assert passes[True]["eval"][0] > 0, passes
    assert (passes[True]["score"][0] > 0) == (preset == "slow_surprise"), passes
    assert all(with_prefix == 0 and without > 0 for with_prefix, without in [passes[False]["train"], passes[False]["eval"]]), passes
    assert passes[False]["score"][0] == 0, passes
    assert res[True]["accuracy_matrix"] == res[False]["accuracy_matrix"]
    shared, plain = _losses(tmp_path / "True"), _losses(tmp_path / "False")
    # equal to rounding at first; fp32 rounding differences (other matmul shapes) then grow
    # along the trajectory at this learning rate, to ~1e-3 relative by the last step
    assert shared[:12] == pytest.approx(plain[:12], rel=1e-5)
    assert shared == pytest.approx(plain, rel=2e-3)
    assert sum(shared[-4:]) < 0.5 * sum(shared[:4])  # the loss fell: something was learned
    b1, b0 = (json.loads((tmp_path / str(s) / "buffer.json").read_text()) for s in (True, False))
    assert [(e["task"], e["index"]) for e in b1["entries"]] == [(e["task"], e["index"]) for e in b0["entries"]]
    assert [e["score"] for e in b1["entries"]] == pytest.approx([e["score"] for e in b0["entries"]], rel=5e-3)


class _FaultyBackwardSDPA(torch.autograd.Function):
    """torch's SDPA forward, whose backward returns NaN in the query gradient of every fully
    masked query row: the fault a fused kernel showed on a GPU (RESULTS.md §9), on the CPU."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale):
        ctx.save_for_backward(q, k, v, mask)
        ctx.scale = scale
        return _REAL_SDPA(q, k, v, attn_mask=mask, scale=scale)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, mask = ctx.saved_tensors
        with torch.enable_grad():
            q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
            dq, dk, dv = torch.autograd.grad(_REAL_SDPA(q_, k_, v_, attn_mask=mask, scale=ctx.scale), (q_, k_, v_), grad)
        allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
        dead = ~allowed.any(-1, keepdim=True)  # [rows, 1, q, 1]: a query that attends to nothing
        return torch.where(dead, float("nan"), dq), dk, dv, None, None


_REAL_SDPA = torch.nn.functional.scaled_dot_product_attention


def _faulty_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, scale=None, is_causal=False, **kw):
    assert attn_mask is not None and not is_causal and dropout_p == 0.0
    return _FaultyBackwardSDPA.apply(q, k, v, attn_mask, scale)


@pytest.mark.parametrize("scope", ["label", "sequence"])
def test_pads_attending_to_themselves_keep_a_faulty_kernel_finite_and_change_nothing(fresh_tiny, tiny_loaded, task_examples, monkeypatch, scope,
                                                                                   random_dual):
    """A left-padded batch of several tasks (no shared prefix: a replay step's mixed slice) has
    pad positions whose attention row is fully masked. With ``pads_self`` they attend to
    themselves: the NLL and the gradient are the plain mask's, and a kernel whose backward
    gives NaN for a fully masked row (emulated) no longer reaches the weights."""
    mixed = task_examples(0, 3, seed=5) + task_examples(2, 3, seed=6)
    assert len({len(e) for e in mixed}) > 1  # padding there is
    dl = random_dual(fresh_tiny, 0.2)
    dl.model.train()
    batch = collate(mixed, tiny_loaded.tokenizer.pad_token_id, False)

    def grads(pads_self):
        for p in dl.fast_params:
            p.grad = None
        nll, count = token_nll(dl.model, batch, scope=scope, pads_self=pads_self)
        (nll.sum() / count.sum()).backward()
        return nll.detach(), [p.grad.clone() for p in dl.fast_params]

    plain_nll, plain = grads(False)
    self_nll, selfed = grads(True)
    assert self_nll.tolist() == pytest.approx(plain_nll.tolist(), abs=1e-5, rel=1e-5)
    for a, b in zip(selfed, plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)

    import transformers.integrations.sdpa_attention as sdpa_mod

    monkeypatch.setattr(sdpa_mod.torch.nn.functional, "scaled_dot_product_attention", _faulty_sdpa)
    faulty_nll, faulty = grads(False)
    assert bool(torch.isfinite(faulty_nll).all())  # the loss is finite ...
    assert not all(bool(torch.isfinite(gr).all()) for gr in faulty)  # ... its gradient is not
    fixed_nll, fixed = grads(True)
    assert fixed_nll.tolist() == pytest.approx(plain_nll.tolist(), abs=1e-5, rel=1e-5)
    for a, b in zip(fixed, plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_pads_self_is_on_off_the_cpu_only(tiny_loaded, monkeypatch):
    """The default: the plain 2D mask on the CPU (its runs keep their results); off it, the
    pad-self 4D mask while gradients are recorded (boolean for SDPA, additive in the
    embeddings' dtype for eager attention), the 2D one under no_grad and for a batch without
    padding; a sliding-window model keeps the 2D mask for rows longer than its window."""
    import types

    import surecl.nll as nll
    from surecl.nll import pad_self_mask, prefixed

    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    model = tiny_loaded.model
    assert prefixed(model, {"attention_mask": mask}, want_logits=False)[0]["attention_mask"] is mask
    monkeypatch.setattr(nll, "pads_self_here", lambda m: True)  # as on an accelerator
    m = prefixed(model, {"attention_mask": mask}, want_logits=False)[0]["attention_mask"]
    assert m.shape == (2, 1, 4, 4) and m.dtype == torch.bool
    allowed = m[:, 0].int().tolist()
    assert allowed[0] == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]  # pads: themselves alone
    assert allowed[1] == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]  # the causal mask
    with torch.no_grad():
        assert prefixed(model, {"attention_mask": mask}, want_logits=False)[0]["attention_mask"] is mask
    full = torch.ones(2, 4, dtype=torch.long)
    assert prefixed(model, {"attention_mask": full}, want_logits=False)[0]["attention_mask"] is full
    additive = pad_self_mask(mask, torch.bfloat16)
    assert additive.dtype == torch.bfloat16 and torch.equal(additive == 0, m)
    assert float(additive.min()) == torch.finfo(torch.bfloat16).min

    class Stub(torch.nn.Module):
        def __init__(self, impl, window):
            super().__init__()
            self.config = types.SimpleNamespace(_attn_implementation=impl, sliding_window=window)
            self.emb = torch.nn.Embedding(3, 2).to(torch.bfloat16)

        def get_input_embeddings(self):
            return self.emb

    class Wrapped(torch.nn.Module):  # as DDP wraps a model: no attribute forwarded but .module
        def __init__(self, inner):
            super().__init__()
            self.module = inner

    for stub in (Stub("eager", None), Wrapped(Stub("eager", None))):
        eager = prefixed(stub, {"attention_mask": mask}, want_logits=False)[0]["attention_mask"]
        assert eager.dtype == torch.bfloat16 and torch.equal(eager == 0, m)
    assert prefixed(Stub("sdpa", 3), {"attention_mask": mask}, want_logits=False)[0]["attention_mask"] is mask
    assert prefixed(Stub("sdpa", 4), {"attention_mask": mask}, want_logits=False)[0]["attention_mask"].shape == (2, 1, 4, 4)
    assert prefixed(Stub("flash_attention_2", None), {"attention_mask": mask}, want_logits=False)[0]["attention_mask"] is mask
    nested = Stub("sdpa", None)
    nested.config.text_config = types.SimpleNamespace(sliding_window=3)  # a composite config's text model
    assert prefixed(nested, {"attention_mask": mask}, want_logits=False)[0]["attention_mask"] is mask


@pytest.mark.parametrize("preset", ["slow_surprise", "ilora"])
def test_a_run_with_pads_attending_to_themselves_ends_as_the_plain_run(preset, tmp_path, tiny_cache, monkeypatch):
    """The accelerator's path, forced on the CPU: a replay run without shared prefixes (every
    training slice left-padded with no prefix; I-LoRA's consistency forwards too) trains,
    scores and evaluates as the plain-mask run does: for slow_surprise the same matrix and the
    same step losses to rounding. I-LoRA's consistency term averages over pad positions too,
    whose hidden states depend on what the pads attend to, so its losses part a little (a few
    % at most here) and an answer near its margin may flip: its cells agree to one test row of
    8 (the plain and pad-self runs of the preset's earlier replay timing happened to agree
    exactly); both of its forwards take the same mask."""
    import surecl.nll as nll

    args = ["data.tasks=[colors,animals]", "data.n_train=24", "data.n_test=8", "model.share_prefix=false", "eval.before=false"]
    cfg = build_config(f"tiny,{preset}", args)
    plain = run(cfg, tmp_path / "plain", progress=False, cache_dir=tiny_cache)
    monkeypatch.setattr(nll, "pads_self_here", lambda m: True)
    calls = []
    real = nll.pad_self_mask
    monkeypatch.setattr(nll, "pad_self_mask", lambda *a, **k: calls.append(1) or real(*a, **k))
    selfed = run(cfg, tmp_path / "selfed", progress=False, cache_dir=tiny_cache)
    assert calls, "the pad-self mask was never used"
    if preset == "slow_surprise":
        assert selfed["accuracy_matrix"] == plain["accuracy_matrix"]
    else:
        pairs = [(x, y) for rx, ry in zip(selfed["accuracy_matrix"], plain["accuracy_matrix"]) for x, y in zip(rx, ry)]
        assert all((x is None) == (y is None) and (x is None or abs(x - y) <= 100 / 8) for x, y in pairs), pairs
    a, b = _losses(tmp_path / "plain"), _losses(tmp_path / "selfed")
    assert len(a) == len(b) > 0 and b[0] == pytest.approx(a[0], rel=1e-5)
    assert b == pytest.approx(a, rel=1e-4 if preset == "slow_surprise" else 0.05, abs=1e-6)
