"""Sequential full fine-tuning (``seq_ft``): what it trains, what it leaves alone, what it
checkpoints and exports, what it refuses, and what it does to the first task of the tiny stream."""

from __future__ import annotations

import json

import pytest
import torch
from plain_eval import greedy_row
from safetensors.torch import load_file

from surecl import checkpoint
from surecl.config import build_config
from surecl.errors import SureclError
from surecl.trainer import ContinualRun, run

# The preset's lr (5e-5, for a pretrained model) leaves the tiny random model at chance; 1e-3
# learns each tiny task to 90-100 % in its 96 steps (measured over seeds 0-2).
LR = "train.lr=1e-3"
LEARN = ["data.tasks=[colors,animals]", "data.n_test=8", LR]
SMALL = ["data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=8", LR]
TASKS = "data.tasks=[colors,animals,numbers]"


def llama_parameters(c) -> int:
    """A Llama's parameter count from its config, the tied embedding counted once."""
    kv = c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    layer = 2 * c.hidden_size**2 + 2 * c.hidden_size * kv + 3 * c.hidden_size * c.intermediate_size + 2 * c.hidden_size
    head = 0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size
    return c.vocab_size * c.hidden_size + c.num_hidden_layers * layer + c.hidden_size + head


def test_the_optimizer_trains_exactly_the_base_weights_each_once(tmp_path, tiny_cache):
    r = ContinualRun(build_config("tiny,seq_ft", SMALL), tmp_path / "run", progress=False, cache_dir=tiny_cache)
    held = [p for g in r.optimizer.param_groups for p in g["params"]]
    assert len(held) == len({id(p) for p in held}), "a parameter is in the optimizer twice"
    bare = r.adapters.model.get_base_model()
    lora = {id(p) for n, p in r.model.named_parameters() if "lora_" in n}
    assert lora and not lora & {id(p) for p in held}
    assert {id(p) for p in held} == {id(p) for p in bare.parameters()} - lora  # parameters() lists a tied weight once
    assert bare.lm_head.weight is bare.model.embed_tokens.weight and id(bare.lm_head.weight) in {id(p) for p in held}
    assert sum(p.numel() for p in held) == llama_parameters(bare.config) == 337_536
    assert all(p.requires_grad and p.dtype == torch.float32 for p in held)
    assert not any(p.requires_grad for n, p in r.model.named_parameters() if "lora_" in n)
    assert [id(p) for p in r.trained_params] == [id(p) for p in held]  # clipping bounds the same list


def test_base_weights_change_and_the_adapters_take_no_part(tmp_path, tiny_cache):
    r = ContinualRun(build_config("tiny,seq_ft", LEARN), tmp_path / "run", progress=False, cache_dir=tiny_cache)
    before = {n: p.detach().clone() for n, p in r.adapters.base_parameters().items()}
    lora = {n: p.detach().clone() for n, p in r.model.named_parameters() if "lora_" in n}
    assert all(torch.count_nonzero(v) == 0 for n, v in lora.items() if "lora_B" in n)
    res = r.run()
    after = r.adapters.base_parameters()
    unchanged = [n for n, v in before.items() if torch.equal(v, after[n].detach())]
    assert not unchanged, unchanged  # every matrix, norm and the (tied) embedding moved
    now = dict(r.model.named_parameters())
    assert all(torch.equal(now[n].detach(), v) and not now[n].requires_grad for n, v in lora.items())  # LoRA untouched, B still zero
    assert res["accuracy_matrix"][0][0] >= 75.0 and res["accuracy_matrix"][1][1] >= 75.0, res["accuracy_matrix"]
    # the adapters are bypassed, not merely zero: non-zero B matrices change nothing ...
    model = r.adapters.model.eval()
    batch = r.batch(r.test_sets[0][:4])
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        reference = model(**inputs).logits
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_()
        assert torch.equal(model(**inputs).logits, reference)
        # ... where enabled adapters would
        for m in r.adapters._adapter_modules():
            m.enable_adapters(True)
        assert not torch.allclose(model(**inputs).logits, reference)


def test_a_checkpoint_holds_the_weights_and_two_adam_moments(tmp_path, tiny_cache):
    """Disk per checkpoint = fp32 weights + AdamW's two fp32 moments = 12 bytes per parameter,
    plus the small rest (the bypassed LoRA, step counts, RNG, buffer) and the header."""
    out = tmp_path / "run"
    r = ContinualRun(build_config("tiny,seq_ft", [*SMALL, "train.keep_checkpoints=1"]), out, progress=False, cache_dir=tiny_cache)
    r.run()
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert kept == ["stage-0002"], kept  # train.keep_checkpoints=1
    n = sum(p.numel() for p in r.trained_params)
    path = out / "checkpoints" / "stage-0002" / "tensors.safetensors"
    tensors = load_file(str(path))
    nbytes = lambda keys: sum(tensors[k].numel() * tensors[k].element_size() for k in keys)  # noqa: E731
    weights = [k for k in tensors if k.startswith("optimizer/weights/")]  # the run keeps what a base-training method trains
    moments = [k for k in tensors if k.startswith("optimizer/") and k.endswith(("/exp_avg", "/exp_avg_sq"))]
    rest = [k for k in tensors if k not in weights and k not in moments]
    assert not any(k.startswith("method/") for k in tensors)  # once: not also in the method's own state
    assert nbytes(weights) == 4 * n and nbytes(moments) == 8 * n
    size = path.stat().st_size
    assert 12 * n + nbytes(rest) < size < 12 * n + nbytes(rest) + 16 * 1024, (size, 12 * n, nbytes(rest))
    for i, p in enumerate(r.train_step.params):  # the final weights, in the order the optimizer holds them
        assert torch.equal(tensors[f"optimizer/weights/{i}"], p.detach())


def test_the_saved_model_loads_with_transformers_and_reproduces_the_final_row(tmp_path, tiny_cache):
    """``model/`` loads with plain transformers (no surecl, no PEFT) and, decoded greedily by
    ``generate`` one prompt at a time, gives the run's last row; the untouched base does not."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from surecl.data.loading import load_stream

    cfg = build_config("tiny,seq_ft", LEARN)
    res = run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    folder = tmp_path / "run" / "model"
    card = (folder / "README.md").read_text()
    assert "library_name: transformers" in card and "seq_ft" in card and "AutoModelForCausalLM.from_pretrained" in card
    assert "adapter" not in card.replace("no adapter", "")  # a whole model, not an adapter card
    assert not (tmp_path / "run" / "adapters").exists()
    tok = AutoTokenizer.from_pretrained(folder)
    tasks = load_stream(cfg, cache_dir=tiny_cache)

    def last_row(model) -> list[float]:
        return greedy_row(model, tok, tasks, cfg.model.max_length)

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied again on load
    assert last_row(model) == res["accuracy_matrix"][-1]
    base = AutoModelForCausalLM.from_pretrained(res["model_path"]).eval()
    assert last_row(base) != res["accuracy_matrix"][-1]


@pytest.mark.slow
def test_seq_ft_learns_each_task_and_forgets_the_earlier_ones(tmp_path, tiny_cache):
    """Like seq_lora on the class-incremental tiny stream: each task is learned, and after the
    last one the earlier tasks are gone (averaged over three seeds; measured: first task
    100, 100, 100 right after it, every earlier task 0 at the end)."""
    learned, kept = [], []
    for seed in (0, 1, 2):
        res = run(build_config("tiny,seq_ft", [TASKS, LR, f"seed={seed}"]), tmp_path / f"s{seed}", progress=False, cache_dir=tiny_cache)
        a = res["accuracy_matrix"]
        learned.append(a[0][0])
        kept.append(sum(a[-1][:-1]) / 2)
        assert a[-1][-1] >= 75.0, a  # the last task is learned too
    assert sum(learned) / 3 >= 90.0, learned
    assert sum(kept) / 3 <= 10.0, kept


def test_seq_ft_with_surprise_replay_keeps_earlier_tasks(tmp_path, tiny_cache):
    """Full-FT SuRe: the surprise buffer (scored under the fine-tuned base) replayed while the
    whole model trains keeps the earlier tasks seq_ft forgets (measured over seeds 0-2: 100,
    100, 95.8 against 0)."""
    out = tmp_path / "run"
    res = run(build_config("tiny,seq_ft", [TASKS, LR, "replay.policy=surprise"]), out, progress=False, cache_dir=tiny_cache)
    a = res["accuracy_matrix"]
    assert res["buffer"]["per_task"].keys() == {"colors", "animals", "numbers"}, res["buffer"]
    assert sum(a[-1][:-1]) / 2 >= 50.0, a
    assert (out / "model" / "model.safetensors").is_file()
    replayed = [json.loads(line)["replayed"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert sum(replayed) > 0


def test_seq_ft_refuses_the_dual_learner_and_bf16(tmp_path, tiny_cache, monkeypatch):
    with pytest.raises(SureclError, match=r"^dual\.enabled: seq_ft"):
        build_config("tiny,seq_ft", ["dual.enabled=true"])
    with pytest.raises(SureclError, match=r"^model\.dtype: seq_ft .*set model\.dtype=fp32"):
        build_config("tiny,seq_ft", ["model.dtype=bf16"])
    with pytest.raises(SureclError, match=r"^train\.keep_checkpoints"):
        build_config("tiny,seq_ft", ["train.keep_checkpoints=0"])
    # model.dtype=auto where it resolves to bf16 (a GPU): refused when the run starts
    import surecl.model

    monkeypatch.setattr(surecl.model, "base_dtype", lambda cfg, device: torch.bfloat16)
    cfg = build_config("tiny,seq_ft", [*SMALL, "model.dtype=auto"])
    with pytest.raises(SureclError, match=r"^model\.dtype: .*model\.dtype=auto loaded the base in bf16"):
        ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)


def test_fresh_removes_the_saved_model_and_only_that(tmp_path, tiny_cache):
    out = tmp_path / "run"
    run(build_config("tiny,seq_ft", [*SMALL, "train.epochs=1"]), out, progress=False, cache_dir=tiny_cache)
    (out / ".model.surecl-abc12345").mkdir()  # the temporary of an export cut short
    listed = {str(p.relative_to(out)) for p in checkpoint.run_outputs(out)}
    assert {"model", ".model.surecl-abc12345", "checkpoints/stage-0002", "results.json"} <= listed
    (out / "notes.txt").write_text("mine")
    checkpoint.clear_run(out)
    assert (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()
    assert sorted(p.name for p in out.iterdir()) == sorted([checkpoint.MANIFEST, checkpoint.LOCK])  # the lock's file stays (unlocked)
