"""Encoder-decoder models run through the same loop (the paper's T5 setting), on a tiny T5."""

from __future__ import annotations

import pytest
import torch

from surecl.config import build_config
from surecl.errors import SureclError
from surecl.model import tiny_folder
from surecl.trainer import run


def tiny_t5(folder, cache_dir):
    from transformers import AutoTokenizer, T5Config, T5ForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(tiny_folder(cache_dir))
    config = T5Config(
        vocab_size=len(tok), d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, decoder_start_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    T5ForConditionalGeneration(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_tiny_t5_learns_a_task_through_lora(tmp_path):
    path = tiny_t5(tmp_path / "t5", tmp_path / "cache")
    cfg = build_config(
        "tiny,surprise",
        [f"model.name={path}", "lora.target_modules=[q,k,v,o,wi,wo]", "data.tasks=[colors,animals]", "train.lr=0.003"],
    )
    res = run(cfg, tmp_path / "run", progress=False, cache_dir=tmp_path / "cache")
    a = res["accuracy_matrix"]
    assert a[0][0] >= 90.0, a
    assert res["buffer"]["size"] > 0
    assert (tmp_path / "run" / "adapters" / "fast" / "adapter_config.json").is_file()


def test_text_stream_needs_a_causal_model(tmp_path):
    path = tiny_t5(tmp_path / "t5", tmp_path / "cache")
    cfg = build_config("tiny,cpt,seq_lora", [f"model.name={path}", "lora.target_modules=[q,v]", "data.tasks=[colors]"])
    with pytest.raises(SureclError, match="needs a causal LM"):
        run(cfg, tmp_path / "run", progress=False, cache_dir=tmp_path / "cache")


def test_a_probe_with_a_text_part_needs_a_causal_model(tmp_path, capsys):
    """Perplexity of the probe's text part is a causal LM's: on an encoder-decoder the run stops
    in one line before training (it failed in the first evaluation with a traceback)."""
    from surecl.cli import main

    path = tiny_t5(tmp_path / "t5", tmp_path / "cache")
    capsys.readouterr()  # the model's own save output
    probe = tmp_path / "probe.jsonl"
    probe.write_text("".join('{"text": "some words of a document"}\n' for _ in range(4)))
    code = main(["run", "--config", "tiny", "--out", str(tmp_path / "run"), "--quiet", f"model.name={path}", "lora.target_modules=[q,v]",
                 "data.tasks=[colors]", "data.n_train=8", "data.n_test=4", f"eval.general={probe}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "its text part is scored by perplexity, which needs a causal LM" in err[0], err
    assert not (tmp_path / "run" / "results.json").exists()


def test_tiny_t5_learns_a_generation_task(tmp_path):
    """Generation tasks (free-form targets, ROUGE-L) on an encoder-decoder: the target is the
    decoder's, surprise scores it, and the first task's score rises far above the untrained
    model's; replay keeps entries of it."""
    path = tiny_t5(tmp_path / "t5", tmp_path / "cache")
    cfg = build_config(
        "tiny,surprise",
        [f"model.name={path}", "lora.target_modules=[q,k,v,o,wi,wo]", "data.kind=generate", "data.tasks=[colors,animals]",
         "train.lr=0.003", "eval.before=true"],
    )
    res = run(cfg, tmp_path / "run", progress=False, cache_dir=tmp_path / "cache")
    a = res["accuracy_matrix"]
    assert res["metric"] == "rouge_l" and res["metrics"] == {"colors": "rouge_l", "animals": "rouge_l"}
    assert res["initial"][0] < 20.0 and a[0][0] >= 80.0, (res["initial"], a)
    assert res["buffer"]["per_task"] == {"colors": res["buffer"]["capacity"] // 2, "animals": res["buffer"]["capacity"] // 2}
