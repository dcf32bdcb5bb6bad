"""O-LoRA and N-LoRA in real tiny runs: the first task trains exactly as SeqLoRA, earlier
tasks' LoRAs do not move while a later task trains, every forward of the evaluation uses all
of them, the saved adapter reproduces the evaluation with plain PEFT, replay combines, and the
orthogonality penalty turns each new task's A away from the earlier tasks' as it trains."""

from __future__ import annotations

import json

import pytest
import torch
from plain_eval import greedy_row
from tiny_runs import LEARNED, orth_overlap  # LEARNED: enough epochs for a task learned (>= 90 %)

from surecl.config import build_config
from surecl.plugins.base import Plugin
from surecl.trainer import ContinualRun, run

TWO = "data.tasks=[colors,animals]"
THREE = "data.tasks=[colors,animals,numbers]"


def log_lines(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def test_first_task_trains_exactly_as_seq_lora(tmp_path, tiny_cache):
    """Before any task is stored the past adapter is zero and its init came from a forked RNG:
    O-LoRA's first task is SeqLoRA's, loss for loss (its penalty needs an earlier task)."""
    small = [TWO, "data.n_train=32", "data.n_test=8", "train.epochs=2"]
    seq = run(build_config("tiny,seq_lora", small), tmp_path / "seq", progress=False, cache_dir=tiny_cache)
    olora = run(build_config("tiny,olora", small), tmp_path / "olora", progress=False, cache_dir=tiny_cache)
    first = lambda out: [line for line in log_lines(out) if line["stage"] == 0]  # noqa: E731
    assert first(tmp_path / "olora") == first(tmp_path / "seq")
    assert olora["accuracy_matrix"][0] == seq["accuracy_matrix"][0]
    second = lambda out: [line["loss"] for line in log_lines(out) if line["stage"] == 1]  # noqa: E731
    assert second(tmp_path / "olora") != second(tmp_path / "seq")  # then a fresh LoRA starts


class PastWatch(Plugin):
    """Checks after every step that the past store is what it was when the task started, and
    keeps the fast LoRA at the end of each task."""

    name = "past_watch"

    def __init__(self):
        super().__init__()
        self.at_start, self.trained, self.steps_checked = None, [], 0

    def _past(self, ctx):
        return [(layer.past_a.detach().clone(), layer.past_b.detach().clone()) for layer in ctx.method.layers]

    def before_task(self, ctx, stage):  # runs after the method's: the store is filled by now
        self.at_start = self._past(ctx)

    def after_step(self, ctx, record):
        now = self._past(ctx)
        assert all(torch.equal(a, a0) and torch.equal(b, b0) for (a, b), (a0, b0) in zip(now, self.at_start)), record.step
        self.steps_checked += 1

    def after_task(self, ctx, stage):
        self.trained.append([(layer.fast_a.detach().clone(), layer.fast_b.detach().clone()) for layer in ctx.method.layers])


@pytest.mark.parametrize("preset", ["olora", "nlora"])
def test_earlier_loras_are_bit_identical_while_later_tasks_train(preset, tmp_path, tiny_cache):
    watch = PastWatch()
    cfg = build_config(f"tiny,{preset}", [THREE, "data.n_train=16", "data.n_test=4", "train.epochs=2"])
    r = ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache, plugins=[watch])
    r.run()
    assert watch.steps_checked == 12 and r.method.filled == 2
    rank = cfg.lora.r
    for k in range(2):  # block k of the store is task k's LoRA as it ended its task
        for layer, (a, b) in zip(r.method.layers, watch.trained[k]):
            assert torch.equal(layer.past_a[k * rank : (k + 1) * rank], a) and torch.equal(layer.past_b[:, k * rank : (k + 1) * rank], b)
    assert not torch.equal(watch.trained[2][0][1], watch.trained[1][0][1])  # the last task trained its own


def test_evaluation_uses_every_task_lora(tmp_path, tiny_cache):
    """After two tasks: the second task's LoRA was trained on top of the first's and only
    answers with it (zeroing the past store loses the second task too), and the store alone
    answers the first task exactly as right after it was learned."""
    cfg = build_config("tiny,olora", [TWO, "eval.before=true", LEARNED])
    r = ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    res = r.run()
    a, initial = res["accuracy_matrix"], res["initial"]
    assert a[1][1] >= 90.0 and a[0][0] >= 90.0 and initial[0] <= 60.0, (a, initial)
    fast = r.adapters.adapter_state("fast")
    past = [(layer.past_a.detach().clone(), layer.past_b.detach().clone()) for layer in r.method.layers]
    with torch.no_grad():
        for layer in r.method.layers:
            layer.past_a.zero_()
            layer.past_b.zero_()
    assert r.evaluate_task(1) <= a[1][1] - 40, "without the first task's LoRA the second should not be answered"
    with torch.no_grad():
        for layer, (pa, pb) in zip(r.method.layers, past):
            layer.past_a.copy_(pa)
            layer.past_b.copy_(pb)
        for p in r.adapters.fast_params:
            p.zero_()
    assert round(r.evaluate_task(0), 4) == a[0][0]  # the store alone: task 0's own LoRA, same forward
    r.adapters.load_adapter_state(fast)
    assert [round(r.evaluate_task(j), 4) for j in range(2)] == a[1]


def test_saved_adapter_is_every_task_lora_summed_and_reproduces_eval_with_plain_peft(tmp_path, tiny_cache):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from surecl.data.loading import load_stream

    cfg = build_config("tiny,olora", [TWO, "data.n_test=8"])
    r = ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    res = r.run()
    final = res["accuracy_matrix"][-1]
    folder = tmp_path / "run" / "adapters" / "fast"
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (2 * cfg.lora.r, 2 * cfg.lora.alpha)  # scaling alpha / r kept
    assert "rank 16, alpha 32" in (folder / "README.md").read_text()
    tok = AutoTokenizer.from_pretrained(res["model_path"])
    tasks = load_stream(cfg, cache_dir=tiny_cache)

    def row(model):
        return greedy_row(model, tok, tasks, cfg.model.max_length)

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(res["model_path"]), folder).eval()
    assert row(model) == final, final
    # the first task's LoRA is in it (stacked after the last task's), and it matters
    lora_a = {n: p for n, p in model.named_parameters() if "lora_A" in n}
    layer = r.method.layers[0]
    first = next(p for n, p in lora_a.items() if layer.name.removeprefix("base_model.model.") in n)
    assert torch.equal(first[cfg.lora.r :], layer.past_a.detach()) and torch.equal(first[: cfg.lora.r], layer.fast_a.detach())
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p[:, cfg.lora.r :] = 0  # keep only the last task's LoRA
    assert row(model) != final


def test_olora_combines_with_replay(tmp_path, tiny_cache):
    cfg = build_config("tiny,olora", [THREE, "replay.policy=surprise", "data.n_train=16", "data.n_test=4", "train.epochs=2"])
    r = ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    res = r.run()
    assert res["buffer"]["size"] > 0 and set(res["buffer"]["per_task"]) == {"colors", "animals", "numbers"}
    assert any(line["replayed"] > 0 for line in log_lines(tmp_path / "run") if line["stage"] == 2)
    assert r.method.filled == 2 and all(v is not None for v in res["accuracy_matrix"][-1])


PAPER_FORM = ["olora.orth_norm=fro2", "olora.l2_norm=fro2"]


def test_orthogonality_penalty_turns_each_new_lora_away_from_the_earlier_ones(tmp_path, tiny_cache):
    """What O-LoRA's training does with its penalty (the paper's squared form, in which these
    figures were measured; the default is now its code's L1 form): at the end of the stream the last task's A is
    nearly orthogonal to the earlier tasks' (sum_layers ||A_past A_t^T||^2 at 0.16-0.20 of the
    same run's with olora.lambda_orth=0, where it is 11.9-12.4; seeds 0-2 at these settings on an
    AMD EPYC with AVX512-BF16, ``bench/tiny_outcomes.py --only orth_overlap``). Whether that keeps
    more of the earlier tasks on the tiny stream depends on the processor: ranked retention over
    seeds 0-2 was 72.2 against SeqLoRA's 55.6 at 12 epochs on one AVX512-BF16 machine, 94.4
    against 44.4 at 16 epochs on an AVX2-only one and 54.9 against 63.2 at 16 epochs on the AMD
    EPYC with AVX512-BF16 (``--only rank_retention``): a tiny run is chaotic, so that is a
    measurement, not a property a test can hold."""
    overlap = {}
    for lam in ("0.5", "0"):
        for seed in (0, 1):
            overlap.setdefault(lam, []).append(orth_overlap(tmp_path / f"{lam}-{seed}", tiny_cache, [f"olora.lambda_orth={lam}", f"seed={seed}", *PAPER_FORM]))
    assert all(o > 5.0 for o in overlap["0"]), overlap
    assert all(p <= 0.35 * o for p, o in zip(overlap["0.5"], overlap["0"])), overlap
