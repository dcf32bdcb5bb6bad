"""Gradient accumulation over micro-batches computes the same step as the whole batch."""

from __future__ import annotations

import json

import pytest

from surecl.config import build_config
from surecl.data.encode import Encoded, micro_batches
from surecl.trainer import run


def enc(n: int) -> Encoded:
    return Encoded(list(range(n - 1)), [0], "x")


def test_slices_respect_the_token_budget_and_keep_order():
    items = [enc(n) for n in (10, 30, 20, 40, 5, 50, 60)]
    slices = micro_batches(items, 64)
    assert [e for s in slices for e in s] == items
    for s in slices:
        assert len(s) == 1 or len(s) * max(len(e) for e in s) <= 64
    assert [[len(e) for e in s] for s in slices] == [[10, 30], [20], [40], [5], [50], [60]]
    assert micro_batches(items, 0) == [items]
    assert all(len(s) == 1 for s in micro_batches(items, 1))  # a row longer than the budget still runs


def losses(out):
    return [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]


def spied_run(cfg, out, cache):
    """``run`` recording, per training step, the rows' lengths, the slices cut from them and
    the rows of each training forward (``surecl.step.token_nll``: the training step's)."""
    import surecl.step as step

    steps = []
    slicer, forward = step.micro_batch_positions, step.token_nll

    def slices(items, max_tokens, *args, **kwargs):
        cut = slicer(items, max_tokens, *args, **kwargs)
        steps.append({"lengths": [len(e) for e in items], "slices": cut, "forwards": []})
        return cut

    def counted(model, batch, *args, **kwargs):
        steps[-1]["forwards"].append(int(batch["input_ids"].shape[0]))
        return forward(model, batch, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(step, "micro_batch_positions", slices)
        mp.setattr(step, "token_nll", counted)
        results = run(cfg, out, progress=False, cache_dir=cache)
    return results, steps


@pytest.mark.parametrize("preset", ["slow_surprise", "online_surprise", "surprise_aging", "ewc"])
def test_micro_batched_run_equals_whole_batch_run(preset, tmp_path, tiny_cache):
    base = ["data.tasks=[colors,animals]", "data.n_train=24", "data.n_test=8", "train.epochs=2"]
    res, steps = {}, {}
    for budget in (0, 40):
        cfg = build_config(f"tiny,{preset}", base + [f"train.micro_batch_tokens={budget}"])
        res[budget], steps[budget] = spied_run(cfg, tmp_path / str(budget), tiny_cache)
    # the budget really sliced every step: several forwards, each within the budget, that
    # together cover the step's rows once
    assert len(steps[40]) == len(steps[0]) == res[0]["steps"]
    for step in steps[40]:
        assert len(step["slices"]) > 1 and step["forwards"] == [len(s) for s in step["slices"]]
        assert sorted(i for s in step["slices"] for i in s) == list(range(len(step["lengths"])))
        for s in step["slices"]:
            assert len(s) == 1 or len(s) * max(step["lengths"][i] for i in s) <= 40
    for step in steps[0]:  # whole: one forward per task's group of rows at most
        assert step["forwards"] == [len(s) for s in step["slices"]] and sum(step["forwards"]) == len(step["lengths"])
    assert sum(len(s["forwards"]) for s in steps[40]) > 2 * sum(len(s["forwards"]) for s in steps[0])
    assert res[40]["accuracy_matrix"] == res[0]["accuracy_matrix"]
    assert losses(tmp_path / "40") == pytest.approx(losses(tmp_path / "0"), abs=1e-4)
    b0, b40 = (json.loads((tmp_path / str(b) / "buffer.json").read_text()) for b in (0, 40))
    assert [(e["task"], e["index"]) for e in b40["entries"]] == [(e["task"], e["index"]) for e in b0["entries"]]
    assert [e["score"] for e in b40["entries"]] == pytest.approx([e["score"] for e in b0["entries"]], abs=1e-4)
