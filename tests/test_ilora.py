"""I-LoRA (``methods/ilora``): its consistency term against an independent computation, its
gradients, its settings from EasyCL, and its outcome (the term holds the plastic adapter near
the stable one). Config round trip, dry run, option errors, kill -9 resume and exports: the
method contract battery (tests/test_method_contract.py)."""

from __future__ import annotations

import json

import pytest
import torch

from surecl.adapters import FAST, SLOW
from surecl.config import build_config
from surecl.errors import SureclError
from surecl.trainer import ContinualRun

SMALL = ["data.tasks=[colors,animals]", "data.n_train=24", "data.n_test=8", "train.epochs=3"]


def test_preset_carries_easycl_settings():
    cfg = build_config("tiny,ilora")
    assert (cfg.method, cfg.dual.enabled, cfg.dual.beta, cfg.dual.unit, cfg.dual.bias_correction) == ("ilora", True, 0.75, "step", False)
    assert (cfg.ilora.consistency_weight, cfg.ilora.indices(), cfg.replay.policy) == (1.0, [-1, -2, -3], "random")
    with pytest.raises(SureclError, match=r"^dual.enabled: method ilora needs the dual learner"):
        build_config("tiny,ilora", ["dual.enabled=false"])
    with pytest.raises(SureclError, match=r"^--config: paper-t5 sets dual.beta=0.995 over ilora's essential"):
        build_config("tiny,ilora,paper-t5")
    with pytest.raises(SureclError, match=r"^ilora.layers: 'x' must be comma-separated whole numbers"):
        build_config("tiny,ilora", ["ilora.layers=x"])


def test_the_easycl_preset_replays_earlier_tasks_only(tmp_path, tiny_cache):
    """EasyCL mixes the earlier tasks' data into the current task's: the first task trains
    without replay and no task replays its own rows (insert_time after). The preset's buffer
    took the task being trained before it (insert_time before), so every step of the first task
    replayed that task's own rows."""
    from surecl.plugins.base import Plugin

    class Replayed(Plugin):
        name = "replayed"

        def __init__(self):
            self.seen: list[tuple[int, int]] = []  # (stage, task of a replayed row)

        def after_step(self, ctx, record):
            self.seen += [(ctx.stage.row, t) for t, _ in ctx.step_items[ctx.step_new:]]

    spy = Replayed()
    cfg = build_config("tiny,ilora", [*SMALL, "replay.ratio=1:2", "replay.buffer_size=8"])
    assert cfg.replay.insert_time == "after"
    ContinualRun(cfg, tmp_path / "r", progress=False, cache_dir=tiny_cache, plugins=[spy]).run()
    assert spy.seen and {task for stage, task in spy.seen} == {0} and {stage for stage, _ in spy.seen} == {1}


def hidden(run: ContinualRun, adapter: str, items) -> tuple[torch.Tensor, ...]:
    """Hidden states of ``items`` under ``adapter``, by a plain forward of the PEFT model."""
    batch = run.batch([run.train_sets[t][i] for t, i in items])
    run.model.set_adapter(adapter)
    try:
        out = run.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"],
                        output_hidden_states=True)
    finally:
        run.adapters.activate(FAST)
    return out.hidden_states


def test_consistency_term_is_the_mean_layer_mse_with_gradients_on_the_fast_side_only(tmp_path, tiny_cache):
    run = ContinualRun(build_config("tiny,ilora", [*SMALL, "ilora.layers=-1,-3", "ilora.consistency_weight=2.5", "lora.dropout=0"]),
                       tmp_path / "r", progress=False, cache_dir=tiny_cache)
    run.step_items = [(0, 0), (0, 3), (1, 5)]
    zero = run.method.loss(run, torch.zeros(()))
    assert float(zero) == 0.0  # the slow adapter starts as the fast one
    with torch.no_grad():
        for p in run.adapters.fast_params:
            p.add_(torch.randn_like(p) * 0.05)
    term = run.method.loss(run, torch.zeros(()))
    with torch.no_grad():
        fast, slow = hidden(run, FAST, run.step_items), hidden(run, SLOW, run.step_items)
        expect = sum(((fast[k] - slow[k]) ** 2).mean() for k in (len(fast) - 1, len(fast) - 3)) / 2
    assert float(term) == pytest.approx(2.5 * float(expect), rel=1e-4) and float(term) > 0
    term.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in run.adapters.fast_params)
    assert all(p.grad is None for p in run.adapters.slow_params)


def gap(run: ContinualRun) -> float:
    """The fast and slow adapters' last hidden states apart on the first task's rows (MSE)."""
    items = [(0, i) for i in range(8)]
    with torch.no_grad():
        return float(((hidden(run, FAST, items)[-1] - hidden(run, SLOW, items)[-1]) ** 2).mean())


def test_the_term_holds_the_plastic_adapter_near_the_stable_one(tmp_path, tiny_cache):
    gaps = {}
    for weight in (0.0, 50.0):
        run = ContinualRun(build_config("tiny,ilora", [*SMALL, f"ilora.consistency_weight={weight}", "dual.beta=0.95"]),
                           tmp_path / f"w{weight}", progress=False, cache_dir=tiny_cache)
        run.run()
        gaps[weight] = gap(run)
        losses = [json.loads(line)["loss"] for line in (tmp_path / f"w{weight}" / "log.jsonl").read_text().splitlines()]
        assert losses[-1] < 0.5 * losses[0]  # the plastic adapter trained
    assert gaps[50.0] < 0.5 * gaps[0.0]


# --------------------------------------------------------------------------- the authors' reading (LLMCL)


def test_the_authors_preset_carries_their_code_settings():
    cfg = build_config("tiny,ilora_llmcl")
    assert (cfg.dual.beta, cfg.dual.unit, cfg.ilora.rows, cfg.ilora.target, cfg.ilora.indices()) == (0.25, "step", "replayed", "max", None)
    assert (cfg.replay.policy, cfg.replay.buffer_size, cfg.replay.ratio, cfg.replay.loss) == ("reservoir", 500, "1:1", "pair")
    with pytest.raises(SureclError, match=r"^ilora.rows"):
        build_config("tiny,ilora", ["ilora.rows=new"])
    with pytest.raises(SureclError, match=r"^ilora.target"):
        build_config("tiny,ilora", ["ilora.target=min"])


def test_the_max_target_pulls_only_features_below_the_stable_ones_on_replayed_rows(tmp_path, tiny_cache):
    """target=max: the term is the mean over every hidden state of min(plastic - stable, 0)^2 (the
    authors' MSE toward torch.where(plastic > stable, plastic, stable)); rows=replayed: only the
    step's replayed rows count, so a step without replay adds nothing."""
    run = ContinualRun(build_config("tiny,ilora_llmcl", [*SMALL, "lora.dropout=0"]), tmp_path / "r", progress=False, cache_dir=tiny_cache)
    with torch.no_grad():
        for p in run.adapters.fast_params:
            p.add_(torch.randn_like(p) * 0.05)
    run.step_items, run.step_new = [(1, 0), (1, 1), (0, 2), (0, 5)], 2
    term = run.method.loss(run, torch.zeros(()))
    replayed = run.step_items[2:]
    with torch.no_grad():
        fast, slow = hidden(run, FAST, replayed), hidden(run, SLOW, replayed)
        target = [torch.where(f > s, f, s) for f, s in zip(fast, slow)]
        expect = torch.stack([((f - t) ** 2).mean() for f, t in zip(fast, target)]).mean()
        everything = torch.stack([((f - s) ** 2).mean() for f, s in zip(fast, slow)]).mean()
    assert float(term) == pytest.approx(float(expect), rel=1e-4) and 0 < float(term) < float(everything)
    run.step_new = 4  # no replayed row on this step
    assert float(run.method.loss(run, torch.zeros(()))) == 0.0


def test_a_run_under_the_authors_settings_learns_and_keeps_its_stable_adapter_close(tmp_path, tiny_cache):
    run = ContinualRun(build_config("tiny,ilora_llmcl", SMALL), tmp_path / "r", progress=False, cache_dir=tiny_cache)
    res = run.run()
    losses = [json.loads(line)["loss"] for line in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
    assert losses[-1] < 0.5 * losses[0]  # it learned
    assert len(res["accuracy_matrix"]) == 2 and run.method.last > 0.0  # the last step replayed and compared
    easy = ContinualRun(build_config("tiny,ilora", [*SMALL, "dual.beta=0.95"]), tmp_path / "e", progress=False, cache_dir=tiny_cache)
    easy.run()
    assert gap(run) < gap(easy)  # a stable adapter 75 % plastic each step stays nearer it than one 5 % plastic
