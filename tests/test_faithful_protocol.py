"""The paper's protocol as its reference code runs it (docs/faithfulness.md): the EMA once per
training example, replay at a ratio with each pair's losses averaged, the reference's T5
surprise and encoder input, a method's essential settings that a later preset may not
override, independent draws per order, and per-task schedules of the baselines' scripts."""

from __future__ import annotations

import random

import pytest
import torch
from test_paper_protocol import t5_dir as _t5_dir_fixture  # noqa: F401  (a fixture: the tiny T5 folder)

from surecl.adapters import DualLoRA, beta_per_step
from surecl.cli import main
from surecl.config import DualConfig, LoraConfig, build_config
from surecl.data.loading import load_stream
from surecl.errors import SureclError
from surecl.plan import planned_steps, replay_count
from surecl.plugins.base import Plugin
from surecl.replay.surprise import score_examples
from surecl.step import pair_weights
from surecl.trainer import run

LORA = LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])


def _dual(model, beta, unit="example", bias_correction=False) -> DualLoRA:
    return DualLoRA(model, LORA, DualConfig(enabled=True, beta=beta, unit=unit, bias_correction=bias_correction), is_seq2seq=False)


def _randomise(params, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.copy_(torch.randn(p.shape, generator=g))


# ------------------------------------------------------------------ the EMA's unit


@pytest.mark.parametrize("bias_correction", [False, True])
def test_per_example_ema_equals_n_micro_updates_by_hand(fresh_tiny, bias_correction):
    """After a step of n new examples the slow adapter is where n micro-batch updates toward
    the same fast weights (the reference's training_step, once per micro-batch) put it."""
    beta = 0.97
    dl = _dual(fresh_tiny, beta, bias_correction=bias_correction)
    slow = [p.detach().double().clone() for p in dl.slow_params]
    raw = [torch.zeros_like(s) for s in slow]
    done = 0
    for k, n in enumerate([5, 3, 7]):
        _randomise(dl.fast_params, seed=k)
        fast = [p.detach().double() for p in dl.fast_params]
        for _ in range(n):  # by hand, one micro-batch at a time
            if bias_correction:
                raw = [beta * r + (1 - beta) * f for r, f in zip(raw, fast, strict=True)]
            else:
                slow = [beta * s + (1 - beta) * f for s, f in zip(slow, fast, strict=True)]
        done += n
        if bias_correction:
            slow = [r / (1 - beta**done) for r in raw]
        record = type("R", (), {"current": [(0, i) for i in range(n)]})()
        dl.after_step(None, record)
        for got, want in zip(dl.slow_params, slow, strict=True):
            torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-6)
    assert (dl.steps, dl.updates) == (3, 15)


def test_step_unit_takes_one_update_per_step(fresh_tiny):
    dl = _dual(fresh_tiny, 0.9, unit="step")
    before = [p.detach().clone() for p in dl.slow_params]
    _randomise(dl.fast_params, seed=1)
    dl.after_step(None, type("R", (), {"current": [(0, i) for i in range(64)]})())
    for got, s, f in zip(dl.slow_params, before, dl.fast_params, strict=True):
        torch.testing.assert_close(got, 0.9 * s + 0.1 * f.detach())
    assert beta_per_step(0.995, DualConfig(unit="example"), 64) == pytest.approx(0.995**64)
    assert beta_per_step(0.995, DualConfig(unit="step"), 64) == 0.995


def test_per_example_ema_state_round_trips(fresh_tiny, tiny_loaded):
    import copy

    dl = _dual(fresh_tiny, 0.9, bias_correction=True)
    _randomise(dl.fast_params, seed=2)
    dl.after_step(None, type("R", (), {"current": [(0, 0)] * 6})())
    meta, tensors = dl.state_dict()
    assert meta == {"ema_steps": 1, "ema_updates": 6}
    other = _dual(copy.deepcopy(tiny_loaded.model), 0.9, bias_correction=True)
    other.load_state_dict(meta, tensors)
    assert other.updates == 6
    for a, b in zip(other.slow_params, dl.slow_params, strict=True):
        assert torch.equal(a, b)


def test_dry_run_prints_the_per_step_beta_and_warns_when_the_window_outlasts_the_stream(capsys):
    code = main(["run", "--dry-run", "--config", "tiny,slow_surprise", "data.tasks=[colors]", "dual.beta=0.9999",
                 "dual.unit=step", "dual.bias_correction=false"])
    out = capsys.readouterr().out
    assert code == 0
    assert "applied once per optimizer step (dual.unit=step)" in out
    assert "warning: the EMA window (10000 steps) is longer than the whole stream" in out


# ------------------------------------------------------------------ replay ratio and weighting


def test_replay_count_spreads_a_ratio_over_the_stage():
    cfg = build_config("tiny,surprise", ["replay.ratio=1:2"])
    sizes = [5, 5, 5, 3]
    counts = [replay_count(k, sizes, cfg) for k in range(len(sizes))]
    assert counts == [2, 3, 2, 2] and sum(counts) == 18 // 2
    cfg = build_config("tiny,surprise", ["replay.ratio=1:16"])
    assert sum(replay_count(k, [64] * 4, cfg) for k in range(4)) == 16
    cfg = build_config("tiny,surprise", ["replay.every=3", "replay.batch_size=4"])
    assert [replay_count(k, [8] * 6, cfg) for k in range(6)] == [4, 0, 0, 4, 0, 0]


class Spy(Plugin):
    name = "spy"

    def __init__(self):
        super().__init__(None)
        self.steps = []

    def after_step(self, ctx, record):
        self.steps.append((record.stage.row, len(record.current), len(record.replayed), record.loss,
                           record.nll.tolist(), record.tokens.tolist()))


def test_ratio_one_to_two_replays_one_example_per_two_new_in_a_run(tmp_path, tiny_cache):
    cfg = build_config("tiny,surprise", ["data.tasks=[colors,animals]", "data.n_train=24", "data.n_test=4", "train.epochs=1",
                                          "train.batch_size=5", "replay.ratio=1:2", "replay.buffer_size=8"])
    spy = Spy()
    run(cfg, tmp_path / "r", progress=False, cache_dir=tiny_cache, plugins=[spy])
    for row in (0, 1):  # SB-UB: the task's own share is in the buffer before it trains
        steps = [s for s in spy.steps if s[0] == row]
        assert sum(s[1] for s in steps) == 24
        assert sum(s[2] for s in steps) == 12  # exactly one replayed per two new
        seen = [sum(s[1] for s in steps[: k + 1]) for k in range(len(steps))]  # new examples after each step
        assert [s[2] for s in steps] == [n // 2 - (seen[k - 1] if k else 0) // 2 for k, n in enumerate(seen)]


def _reference_pair_loss(per_example: list[float], n_new: int) -> float:
    """The reference's loss: micro-batch i holds new example i and, if it replays, one buffer
    example; its loss is outputs.loss or (outputs.loss + replay_outputs.loss) / 2; the step
    averages its micro-batches' losses (the Trainer's accumulation)."""
    new, replayed = per_example[:n_new], per_example[n_new:]
    total = 0.0
    for i, loss in enumerate(new):
        total += (loss + replayed[i]) / 2 if i < len(replayed) else loss
    return total / n_new


def test_pair_weights_are_the_reference_loss_by_hand():
    rng = random.Random(0)
    for n_new, n_rep in [(4, 2), (6, 3), (5, 5), (3, 0)]:
        tokens = [rng.randint(1, 6) for _ in range(n_new + n_rep)]
        nll_sum = [rng.uniform(0.1, 9.0) for _ in tokens]  # per-row summed answer NLL
        w = pair_weights(n_new, tokens)
        got = sum(wi * s for wi, s in zip(w, nll_sum, strict=True))
        want = _reference_pair_loss([s / t for s, t in zip(nll_sum, tokens, strict=True)], n_new)
        assert got == pytest.approx(want, rel=1e-12)


def test_pair_loss_reaches_the_step(tmp_path, tiny_cache):
    """A run's logged step loss is the reference's pair average of the step's own per-row NLL."""
    cfg = build_config("tiny,surprise", ["data.tasks=[colors]", "data.n_train=16", "data.n_test=4", "train.epochs=1",
                                          "train.batch_size=8", "replay.ratio=1:2", "replay.loss=pair", "replay.buffer_size=6"])
    spy = Spy()
    run(cfg, tmp_path / "r", progress=False, cache_dir=tiny_cache, plugins=[spy])
    assert spy.steps and all(s[2] == 4 for s in spy.steps)
    for _, n_new, _, loss, nll, tokens in spy.steps:
        want = _reference_pair_loss([a / b for a, b in zip(nll, tokens, strict=True)], n_new)
        assert loss == pytest.approx(want, rel=1e-4)
        joint = sum(nll) / sum(tokens)
        assert abs(loss - joint) > 1e-6  # not the joint token mean


@pytest.mark.parametrize("loss", ["example", "pair", "joint"])
def test_example_loss_weighs_every_step_by_example_and_pair_only_steps_that_replay(tmp_path, tiny_cache, loss):
    """SeqLoRA replays nothing. The reference's loss (micro-batches of one example, averaged by
    the Trainer) is then the mean of the examples' token means: ``example`` trains on it;
    ``pair`` (which weights only steps that replay) and ``joint`` keep the token mean, which
    weighs a two-word label ("cool warm") more than a one-word one."""
    import json
    from statistics import fmean

    from surecl.data.tiny import FILLER

    rng = random.Random(0)
    rows = [{"task": "mixed", "instruction": "Which? ", "labels": ["warm", "cool warm"]}]
    rows += [{"sentence": " ".join(rng.choice(FILLER) for _ in range(3)), "label": ["warm", "cool warm"][i % 2],
              "split": "test" if i >= 16 else "train"} for i in range(20)]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = build_config("tiny,seq_lora", ["data.benchmark=none", f"data.jsonl=[{path}]", "train.epochs=1", "train.batch_size=4",
                                          "train.batching=uniform", f"replay.loss={loss}"])
    spy = Spy()
    run(cfg, tmp_path / "r", progress=False, cache_dir=tiny_cache, plugins=[spy])
    assert len(spy.steps) == 4 and all(s[2] == 0 for s in spy.steps)
    assert any(len(set(s[5])) > 1 for s in spy.steps)
    for _, _, _, got, nll, tokens in spy.steps:
        per_example, joint = fmean(a / b for a, b in zip(nll, tokens, strict=True)), sum(nll) / sum(tokens)
        if len(set(tokens)) > 1:  # a batch mixing one- and two-word labels: the two weightings differ
            assert abs(per_example - joint) > 1e-4
        assert got == pytest.approx(per_example if loss == "example" else joint, rel=1e-5)


# ------------------------------------------------------------------ presets


def test_a_later_preset_cannot_silently_override_a_methods_essential_setting(capsys):
    with pytest.raises(SureclError, match="paper-t5 sets train.lr=0.001 over seq_ft's essential train.lr=5e-05"):
        build_config("seq_ft,paper-t5")
    assert build_config("paper-t5,seq_ft").train.lr == 5e-5
    assert build_config("seq_ft,paper-t5", ["train.lr=1e-5"]).train.lr == 1e-5  # an explicit override decides
    with pytest.raises(SureclError, match="progressive_prompts's essential train.epochs"):
        build_config("progressive_prompts,paper-t5")
    code = main(["run", "--dry-run", "--config", "seq_ft,paper-t5", "data.benchmark=tiny"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "seq_ft" in err[0] and "paper-t5" in err[0]


# key -> value, per baseline preset, with the reference file it comes from (docs/faithfulness.md)
BASELINES = {
    "olora": {"olora.lambda_orth": 0.5, "olora.lambda_l2": 0.0, "olora.orth_norm": "l1", "olora.l2_norm": "fro"},  # O-LoRA scripts/order_1.sh, src/uie_trainer_lora.py
    "olora_long": {"olora.per_task": ["yelp:0:0", "amazon:0.5:0", "MNLI:0.5:0", "CB:0.5:0", "COPA:0.5:0.1", "QQP:0.5:0.1", "RTE:0.5:0.3",
                                      "IMDB:0.5:0", "SST-2:0.5:0.1", "dbpedia:5:0", "agnews:5:0", "yahoo:5:0.1", "MultiRC:5:0",
                                      "BoolQA:5:0.1", "WiC:5:0.3"], "train.epochs_per_task": ["MNLI:2"]},  # O-LoRA scripts/long.sh
    "nlora_official": {"nlora.l1_of": "ab", "nlora.lambda_l1": 0.4, "train.epochs": 10, "train.batch_size": 32, "train.lr": 1e-3},  # N-LoRA order_1-3.sh
    "nlora_order4": {"nlora.lambda_l1": 0.4, "train.lr": 5e-4, "train.epochs": 10},  # N-LoRA order_4.sh
    "nlora_order5": {"nlora.lambda_l1": 0.55, "train.lr": 8e-4, "train.batch_size": 32},  # N-LoRA order_5.sh
    "nlora_order6": {"nlora.lambda_l1": 1.8, "train.lr": 1e-3, "train.epochs": 10},  # N-LoRA order_6.sh
    "progressive_prompts": {"train.epochs": 10, "train.batch_size": 8, "train.weight_decay": 1e-5, "prompts.lr": 0.3, "prompts.length": 10},
    "seq_ft": {"train.lr": 5e-5},
}


@pytest.mark.parametrize("preset", sorted(BASELINES))
def test_baseline_presets_resolve_to_their_references_after_a_paper_preset(preset):
    from surecl.config import get_key

    cfg = build_config(f"paper-t5,lnt,{preset}")
    for key, value in BASELINES[preset].items():
        assert get_key(cfg, key) == value, key


def test_per_task_epochs_plan_more_steps_for_the_named_task():
    cfg = build_config("tiny,olora_long", ["train.batch_size=8", "train.epochs=1"])
    assert planned_steps(96, cfg, ["MNLI"]) == 24 and planned_steps(96, cfg, ["CB"]) == 12


# ------------------------------------------------------------------ T5: the reference's surprise and input


def test_reference_t5_surprise_is_the_prompt_reconstruction_and_ranks_differently(_t5_dir_fixture):  # noqa: F811 (the fixture)
    from transformers import AutoTokenizer, T5ForConditionalGeneration

    from surecl.data.encode import TaskEncoder
    from surecl.data.tiny import tiny_stream

    path, _ = _t5_dir_fixture
    tok = AutoTokenizer.from_pretrained(path)
    model = T5ForConditionalGeneration.from_pretrained(path).eval()
    task = tiny_stream(n_train=24, n_test=1)[1]
    items = TaskEncoder(tok, 64, end_eos=True).encode(task, task.train)
    assert all(e.prompt[-1] == tok.eos_token_id for e in items)  # the encoder input ends in </s>
    ref = score_examples(model, items, pad_id=tok.pad_token_id, is_seq2seq=True, scope="input", batch_size=5)
    seq = score_examples(model, items, pad_id=tok.pad_token_id, is_seq2seq=True, scope="sequence", batch_size=5)
    for e, s in zip(items, ref, strict=True):
        x = torch.tensor([e.prompt])
        labels = x.clone()
        labels[:, 0] = -100  # get_ll: sequence_labels[:, 0] = -100; model(input_ids=x, labels=sequence_labels).loss
        with torch.no_grad():
            want = model(input_ids=x, labels=labels).loss.item()
        assert s == pytest.approx(want, rel=1e-4, abs=1e-5)
    rank = lambda v: sorted(range(len(v)), key=lambda i: -v[i])  # noqa: E731
    assert rank(ref)[:6] != rank(seq)[:6]


def test_input_scope_on_a_causal_model_is_the_whole_sequence(tiny_loaded, task_examples):
    items = task_examples(0, 12, 0)
    model = tiny_loaded.model
    a = score_examples(model, items, pad_id=tiny_loaded.tokenizer.pad_token_id, is_seq2seq=False, scope="input")
    b = score_examples(model, items, pad_id=tiny_loaded.tokenizer.pad_token_id, is_seq2seq=False, scope="sequence")
    assert a == b


# ------------------------------------------------------------------ independent draws


def test_order_draws_are_independent_across_orders_and_shared_draws_are_not(tiny_cache):
    def sample(draw, tasks):
        cfg = build_config("tiny,seq_lora", [f"data.draw={draw}", f"data.tasks=[{tasks}]", "data.n_train=10", "data.n_test=5"])
        return {t.name: [e.sentence for e in t.train] for t in load_stream(cfg, cache_dir=tiny_cache)}

    shared1, shared2 = sample("shared", "colors,animals"), sample("shared", "animals,colors")
    assert shared1 == shared2
    own1, own2 = sample("order", "colors,animals"), sample("order", "animals,colors")
    assert own1["colors"] != own2["colors"] and own1["animals"] != own2["animals"]
    assert own1 == sample("order", "colors,animals")  # reproducible per (order, seed)


def test_run_draws_make_the_orders_of_a_seed_independent_runs(tiny_cache, tmp_path):
    """``data.draw=run``: the data as ``order`` draws it, and the run's own random streams (LoRA
    initialisation, batch order, replay draws) seeded from (seed, order): two orders of one seed
    start from different adapters, one order at two seeds too, the same (order, seed) twice the same."""
    from surecl.data.loading import streams_seed
    from surecl.trainer import ContinualRun

    def cfg(draw, tasks, seed=0):
        return build_config("tiny,slow_surprise", [f"data.draw={draw}", f"data.tasks=[{tasks}]", "data.n_train=10",
                                                   "data.n_test=5", f"seed={seed}"])

    def start(c, name):
        r = ContinualRun(c, tmp_path / name, progress=False, cache_dir=tiny_cache)
        lora_a = {k: v.detach().clone() for k, v in r.model.named_parameters() if "lora_A" in k}
        return r, lora_a, r.rng.random(), r.policy.rng.random()

    run_cfg = cfg("run", "colors,animals")
    assert [e.sentence for t in load_stream(run_cfg, cache_dir=tiny_cache) for e in t.train] == \
        [e.sentence for t in load_stream(cfg("order", "colors,animals"), cache_dir=tiny_cache) for e in t.train]
    assert streams_seed(cfg("order", "colors,animals", 3), ["colors", "animals"]) == 3  # order / shared: the seed itself
    assert streams_seed(run_cfg, ["colors", "animals"]) != streams_seed(run_cfg, ["animals", "colors"])

    r1, a1, batches1, replay1 = start(run_cfg, "a")
    _, a2, batches2, replay2 = start(cfg("run", "animals,colors"), "b")
    _, a3, batches3, _ = start(cfg("run", "colors,animals", seed=1), "c")
    _, again, batches_again, replay_again = start(run_cfg, "d")
    assert a1 and all(not a1[k].equal(a2[k]) for k in a1) and all(not a1[k].equal(a3[k]) for k in a1)
    assert batches1 != batches2 and replay1 != replay2 and batches1 != batches3
    assert all(a1[k].equal(again[k]) for k in a1) and (batches1, replay1) == (batches_again, replay_again)
    # with data.draw=order the two orders of a seed share the initialisation (as the faithful study's runs did)
    _, o1, _, _ = start(cfg("order", "colors,animals"), "e")
    _, o2, _, _ = start(cfg("order", "animals,colors"), "f")
    assert all(o1[k].equal(o2[k]) for k in o1)
