"""The paper's protocol: presets that resolve to the appendix's values, and the switches that
make a row faithful (full-sequence surprise on encoder-decoders, label surprise as a sum,
fresh optimizer per task, random sampling, uniform batches, the quota warning, non-finite
surprise), plus the dry run that shows the protocol without training."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import torch
from test_seq2seq import tiny_t5

from surecl import trainer as trainer_mod
from surecl.cli import main
from surecl.config import build_config, load_yaml
from surecl.data.encode import TaskEncoder, bucketed_batches, uniform_batches
from surecl.data.loading import load_stream
from surecl.data.task import Example, Task, prepare_stream
from surecl.errors import SureclError
from surecl.plan import describe
from surecl.registry import policy_class
from surecl.replay.policies import quota_warning
from surecl.replay.surprise import score_examples
from surecl.trainer import run

# key -> (paper-t5, paper-llama): the appendix ("Hyperparameters follow O-LoRA unless noted"),
# O-LoRA's scripts (input 512 tokens, generation up to 50, constant lr, one process per task)
# and the paper's reference code, HHazard2002/continual-learning (docs/faithfulness.md):
# scripts/train.sh trains google-t5/t5-large at batch 1 x 64 accumulation steps;
# methods/dual_learner.py updates the slow model in training_step (once per micro-batch of
# one example) and replays every second micro-batch with (outputs.loss + replay_outputs.loss) / 2,
# outputs.loss alone on the others (the Trainer averages the 64);
# the T5 tokenizer ends the source with </s>.
APPENDIX = {
    "train.lr": (1e-3, 1e-4),
    "train.batch_size": (64, 64),
    "replay.ratio": ("1:2", "1:2"),
    "replay.loss": ("example", "example"),  # the reference's weighting on every step, with replay or without
    "dual.unit": ("example", "example"),
    "model.encoder_eos": (True, False),
    "train.epochs": (1, 1),
    "lora.r": (8, 8),
    "lora.alpha": (32, 32),
    "lora.dropout": (0.1, 0.1),
    "lora.target_modules": (["q", "v"], ["q_proj", "v_proj"]),
    "dual.beta": (0.995, 0.995),
    "dual.bias_correction": (False, False),
    "replay.buffer_size": (0.02, 0.02),
    "model.max_length": (512, 512),
    "model.name": ("google-t5/t5-large", "meta-llama/Llama-3.1-8B"),
    "train.scheduler": ("constant", "constant"),
    "train.warmup_steps": (0, 0),
    "train.fresh_optimizer": (True, True),
    "train.batching": ("uniform", "uniform"),
    "eval.mode": ("generate", "generate"),
    "eval.max_new_tokens": (50, 50),
}
PROTOCOL = {  # preset -> (n_train, n_test, orders)
    "standard-cl": (5000, 500, ["1", "2", "3"]),
    "lnt": (1000, 500, ["4", "5", "6"]),
}


def _get(cfg, dotted):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("key", sorted(APPENDIX))
@pytest.mark.parametrize("method", ["slow_surprise", "seq_lora", "surprise", "slow_reservoir", "mtl"])
def test_paper_presets_resolve_to_the_appendix(key, method):
    for k, preset in enumerate(["paper-t5", "paper-llama"]):
        cfg = build_config(f"{preset},lnt,{method}")
        assert _get(cfg, key) == APPENDIX[key][k], (preset, method, key)
        assert cfg.preset == method


@pytest.mark.parametrize("method", ["olora", "olora_long", "nlora", "nlora_official", "progressive_prompts", "ewc", "seq_ft", "ilora"])
def test_rivals_keep_their_own_codes_token_mean_under_a_paper_preset(method):
    """SuRe's per-example weighting (paper-*'s replay.loss=example) is SuRe's reference code's;
    the rivals' own code takes a token mean over the batch (docs/faithfulness.md), which their
    presets set whatever preset comes before; I-LoRA as its authors' code keeps its pair average."""
    for preset in ("paper-t5", "paper-llama"):
        assert build_config(f"{preset},lnt,{method}").replay.loss == "joint"
    assert build_config("paper-t5,lnt,ilora_llmcl").replay.loss == "pair"


@pytest.mark.parametrize("name", sorted(PROTOCOL))
def test_protocol_presets(name):
    n_train, n_test, orders = PROTOCOL[name]
    data, _ = load_yaml(name)
    assert data["orders"] == orders
    cfg = build_config(f"paper-t5,{name},slow_surprise")
    assert (cfg.data.n_train, cfg.data.n_test) == (n_train, n_test)
    assert cfg.data.order == orders[0]
    assert cfg.data.train_sampling == cfg.data.test_sampling == "random"


def test_label_surprise_preset_is_the_summed_label_nll():
    cfg = build_config("label_surprise")
    assert (cfg.replay.scope, cfg.replay.reduction) == ("label", "sum")


# ------------------------------------------------------------------ full-sequence surprise


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("t5")
    return tiny_t5(root / "t5", root / "cache"), root / "cache"


def test_seq2seq_sequence_surprise_is_the_decoder_nll_of_the_whole_example(t5_dir):
    from transformers import AutoTokenizer, T5ForConditionalGeneration

    from surecl.data.tiny import tiny_stream

    path, _ = t5_dir
    model = T5ForConditionalGeneration.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    task = tiny_stream(n_train=6, n_test=1)[0]
    items = TaskEncoder(tok, 64).encode(task, task.train)
    seq = score_examples(model, items, pad_id=tok.pad_token_id, is_seq2seq=True, scope="sequence", batch_size=4)
    lab = score_examples(model, items, pad_id=tok.pad_token_id, is_seq2seq=True, scope="label", batch_size=4)
    for e, s, s_label in zip(items, seq, lab):
        with torch.no_grad():
            target = torch.tensor([e.prompt + e.answer])
            whole = model(input_ids=torch.tensor([[tok.eos_token_id]]), labels=target).loss.item()  # mean over targets
            answer = model(input_ids=torch.tensor([e.prompt]), labels=torch.tensor([e.answer])).loss.item()
        assert s == pytest.approx(whole, rel=1e-4, abs=1e-5)
        assert s_label == pytest.approx(answer, rel=1e-4, abs=1e-5)
    assert seq != lab


def test_seq2seq_sequence_and_label_surprise_choose_different_buffers(t5_dir, tmp_path):
    path, cache = t5_dir
    chosen = {}
    for scope in ("sequence", "label"):
        cfg = build_config(
            "tiny,surprise",
            [f"model.name={path}", "lora.target_modules=[q,v]", "data.tasks=[colors,animals]", "train.epochs=1",
             "data.n_train=40", "replay.buffer_size=8", f"replay.scope={scope}"],
        )
        run(cfg, tmp_path / scope, progress=False, cache_dir=cache)
        entries = json.loads((tmp_path / scope / "buffer.json").read_text())["entries"]
        chosen[scope] = {(e[0], e[1]) if isinstance(e, list) else (e["task"], e["index"]) for e in entries}
        assert len(chosen[scope]) == 8
    assert chosen["sequence"] != chosen["label"]


# ------------------------------------------------------------------ optimizer, sampling, batching


def _stage_starts(monkeypatch):
    """Record the optimizer's state size whenever a task's training starts."""
    seen = []
    original = trainer_mod.ContinualRun.train_stage

    def spy(self, stage):
        if self.state.step == 0:
            seen.append(len(self.optimizer.state))
        return original(self, stage)

    monkeypatch.setattr(trainer_mod.ContinualRun, "train_stage", spy)
    return seen


@pytest.mark.parametrize("fresh", [True, False])
def test_fresh_optimizer_has_empty_state_at_every_task_start(fresh, tmp_path, monkeypatch, tiny_cache):
    seen = _stage_starts(monkeypatch)
    cfg = build_config("tiny,reservoir", ["train.epochs=1", "data.n_train=16", "data.n_test=4", "data.tasks=[colors,animals,numbers]",
                                           f"train.fresh_optimizer={fresh}"])
    run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    assert len(seen) == 3
    if fresh:
        assert seen == [0, 0, 0]
    else:
        assert seen[0] == 0 and seen[1] > 0 and seen[2] > 0


def _task(n_per_label: dict[str, int], name="t") -> Task:
    rows = [Example(f"{lab} {i}", lab) for lab, n in n_per_label.items() for i in range(n)]
    return Task(name, "", sorted(n_per_label), list(rows), list(rows))


def test_random_sampling_keeps_class_priors_and_balanced_evens_them():
    task = _task({"a": 900, "b": 100})
    (bal,) = prepare_stream([task], 200, 200, True, 0)
    (rnd,) = prepare_stream([task], 200, 200, False, 0, test_balanced=False)
    (mixed,) = prepare_stream([task], 200, 200, True, 0, test_balanced=False)
    assert Counter(e.label for e in bal.test) == {"a": 100, "b": 100}
    assert Counter(e.label for e in rnd.test)["b"] < 45  # ~20 expected at a 10 % prior
    assert Counter(e.label for e in mixed.train) == {"a": 100, "b": 100}
    assert Counter(e.label for e in mixed.test)["b"] < 45


def test_sampling_options_reach_the_stream(tmp_path):
    from surecl.data.loading import load_stream

    lines = [json.dumps({"task": "skew", "labels": ["a", "b"]})]
    lines += [json.dumps({"sentence": f"x{i}", "label": "a" if i % 10 else "b", "split": s}) for s in ("train", "test") for i in range(300)]
    f = tmp_path / "skew.jsonl"
    f.write_text("\n".join(lines) + "\n")
    base = ["data.benchmark=none", f"data.jsonl=[{f}]", "data.n_train=60", "data.n_test=60"]
    bal = load_stream(build_config("seq_lora", base))[0]
    rnd = load_stream(build_config("seq_lora", base + ["data.train_sampling=random", "data.test_sampling=random"]))[0]
    assert Counter(e.label for e in bal.test)["b"] == 30
    assert Counter(e.label for e in rnd.test)["b"] < 20 and Counter(e.label for e in rnd.train)["b"] < 20


def test_uniform_batches_are_a_permutation_cut_in_order_without_length_sorting():
    gen = random.Random(1)
    lengths = [gen.randint(5, 500) for _ in range(640)]
    uni = uniform_batches(len(lengths), 8, random.Random(0))
    assert sorted(i for b in uni for i in b) == list(range(640))
    assert all(len(b) == 8 for b in uni)
    spread = lambda batches: sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / len(batches)  # noqa: E731
    buck = bucketed_batches(lengths, 8, random.Random(0))
    assert spread(uni) > 5 * spread(buck)  # bucketing groups similar lengths; uniform does not


def test_trainer_plans_uniform_batches_when_asked(tmp_path, monkeypatch, tiny_cache):
    calls = Counter()
    import surecl.trainer as t

    for name in ("uniform_batches", "bucketed_batches"):
        original = getattr(t, name)
        monkeypatch.setattr(t, name, lambda *a, _o=original, _n=name, **k: (calls.update([_n]), _o(*a, **k))[1])
    cfg = build_config("tiny,seq_lora", ["train.epochs=2", "data.n_train=16", "data.n_test=4", "data.tasks=[colors]", "train.batching=uniform"])
    run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    assert calls == {"uniform_batches": 2}


# ------------------------------------------------------------------ warnings and errors


def test_quota_warning_fires_when_the_buffer_is_smaller_than_the_stream():
    assert quota_warning(policy_class("surprise"), 3, 4) is not None and "from task 4" in quota_warning(policy_class("surprise"), 3, 4)
    assert quota_warning(policy_class("random"), 0, 2) is not None
    assert quota_warning(policy_class("surprise"), 4, 4) is None
    assert quota_warning(policy_class("none"), 0, 4) is None
    assert quota_warning(policy_class("reservoir"), 3, 4) is None  # online: no per-task quota


def test_quota_warning_is_printed_by_a_run(tmp_path, caplog, tiny_cache):
    """Logged as a warning on the ``surecl`` logger (the CLI prints it as ``surecl: warning: ...``)."""
    cfg = build_config("tiny,surprise", ["train.epochs=1", "data.n_train=8", "data.n_test=4", "replay.buffer_size=2",
                                         "data.tasks=[colors,animals,numbers]"])
    res = run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    warned = [r.getMessage() for r in caplog.records if r.name == "surecl" and r.levelname == "WARNING"]
    assert any("per-task quota floor(S/d) is 0 from task 3 on" in m for m in warned), caplog.text
    assert res["buffer"]["size"] == 0  # what the warning announced


def test_per_label_quota_warning_for_online_surprise(tmp_path, caplog, tiny_cache):
    """online_surprise keeps floor(S/k) per answer label: with S below the stream's labels the
    buffer empties, and the run (and its dry run) say so."""
    assert quota_warning(policy_class("online_surprise"), 3, 1, n_labels=4) is not None
    assert quota_warning(policy_class("online_surprise"), 4, 1, n_labels=4) is None
    assert quota_warning(policy_class("surprise"), 3, 1, n_labels=4) is None  # a per-task quota: labels do not count
    cfg = build_config("tiny,online_surprise", ["train.epochs=1", "data.n_train=8", "data.n_test=2", "replay.buffer_size=3",
                                                "data.tasks=[colors,animals]"])
    labels = {ex.label for t in load_stream(cfg, cache_dir=tiny_cache) for ex in t.train}
    assert len(labels) > 3
    res = run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    warned = [r.getMessage() for r in caplog.records if r.name == "surecl" and r.levelname == "WARNING"]
    assert any(f"S=3 entries for the stream's {len(labels)} answer labels" in m for m in warned), caplog.text
    assert res["buffer"]["size"] == 0  # what the warning announced
    assert "answer labels" in describe(cfg, cache_dir=tiny_cache)


def test_non_finite_surprise_is_a_clear_error(tmp_path, monkeypatch, tiny_cache):
    def nan_scores(model, items, **kwargs):
        return [float("nan") if i == 3 else 1.0 for i in range(len(items))]

    monkeypatch.setattr(trainer_mod, "score_examples", nan_scores)
    cfg = build_config("tiny,surprise", ["train.epochs=1", "data.n_train=8", "data.n_test=4", "data.tasks=[colors]"])
    with pytest.raises(SureclError, match=r"surprise of task colors training example 3 \(scored\) is nan"):
        run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)


# ------------------------------------------------------------------ dry run


def test_dry_run_prints_the_protocol_of_a_paper_preset(t5_dir, tmp_path, capsys):
    path, _ = t5_dir
    code = main(["run", "--dry-run", "--out", str(tmp_path / "never"), "--config", "paper-t5,lnt,slow_surprise",
                 f"model.name={path}", "data.benchmark=tiny", "data.order=default"])
    out = capsys.readouterr().out
    assert code == 0
    assert not (tmp_path / "never").exists()  # nothing written, nothing trained
    assert "T5ForConditionalGeneration, encoder-decoder" in out
    assert "LoRA on q x6, v x6" in out  # 2 encoder self-attention + 2 decoder self- and 2 cross-attention
    # the reference's unit: 64 updates per step of 64, 0.995^64 = 0.726 per step, a window of 3.7 steps
    assert "applied once per new example (dual.unit=example, the reference code's)" in out
    assert "effective beta per optimizer step 0.995^64 = 0.7256" in out
    assert "window 1/(1-beta per step) = 3.6 steps = 1.82 tasks of 2 steps" in out
    assert "plain recursion" in out
    assert "replay ratio 1:2 (replayed:new, about 32 per step of 64), each drawn on its own (with replacement); loss: each example's token mean, a replayed one averaged with its new one (the reference's, every step)" in out
    # the tiny stream at the LNT sizes: 96 examples per task (fewer than 1000) -> 2 steps of 64
    assert "| 1 | colors | 96 | 24 | 2 | 2 | floor(7/1) = 7 |" in out  # 1:2 replays at every step of 64
    assert "S = 7 (0.02 of 384)" in out
    assert "fresh optimizer state per task" in out and "batch 64 (uniform)" in out
    assert "train_sampling: random" in out


def test_dry_run_names_missing_lora_targets(t5_dir, capsys):
    path, _ = t5_dir
    assert main(["run", "--dry-run", "--config", "paper-llama,slow_surprise", f"model.name={path}", "data.benchmark=tiny"]) == 0
    out = capsys.readouterr().out
    assert "error: the run stops: lora.target_modules names no layer named q_proj, v_proj in this model" in out


def test_fp_ap_matrix_evaluates_the_diagonal_and_last_row_only(tmp_path, tiny_cache):
    base = ["train.epochs=2", "data.n_train=24", "data.n_test=8", "data.tasks=[colors,animals,numbers]"]
    full = run(build_config("tiny,slow_surprise", base), tmp_path / "full", progress=False, cache_dir=tiny_cache)
    sparse = run(build_config("tiny,slow_surprise", base + ["eval.matrix=fp_ap"]), tmp_path / "sparse", progress=False, cache_dir=tiny_cache)
    a, b = full["accuracy_matrix"], sparse["accuracy_matrix"]
    assert b[1] == [None, a[1][1], None] and b[0] == a[0] and b[2] == a[2]
    assert sparse["fast"]["accuracy_matrix"][1][0] is None and sparse["fast"]["accuracy_matrix"][2] == full["fast"]["accuracy_matrix"][2]
    for key in ("fp", "ap", "forgetting", "bwt"):
        assert sparse[key] == full[key]
    assert full["avg_incremental"] is not None and sparse["avg_incremental"] is None


def test_per_task_values_of_tasks_absent_from_the_stream_are_named(tiny_cache):
    """A preset's per-task table for a longer stream applies by name to the tasks present; the
    others are named in a warning (dry run and run), not left unused without a word."""
    cfg = build_config("tiny,seq_lora", ["data.tasks=[colors,animals]", "train.epochs_per_task=[colors:3,birds:2]"])
    assert "warning: train.epochs_per_task: birds not in this stream: its value is unused" in describe(cfg, cache_dir=tiny_cache)
    cfg = build_config("tiny,seq_lora", ["data.tasks=[colors,animals]", "train.epochs_per_task=[colours:3]"])
    assert "train.epochs_per_task: names no task of this stream (colours; its tasks: colors, animals): every value is unused" \
        in describe(cfg, cache_dir=tiny_cache)
