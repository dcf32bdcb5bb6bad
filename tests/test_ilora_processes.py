"""I-LoRA under two processes and before training: the consistency term of two CPU processes
(gloo) is the one-process term, and ``ilora.layers`` past the model's hidden states stops the
run in one line before any step (methods/ilora/method.py, ``ILoRA.consistency``, ``ILoRA.setup``)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from surecl.cli import main
from surecl.config import build_config
from surecl.methods.ilora.method import hidden_states

ARGS = ["--config", "tiny,ilora", "--quiet", "data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=2", "train.epochs=2",
        "train.batching=uniform", "train.micro_batch_tokens=128", "ilora.consistency_weight=5000"]
"""Rows of 28 to 32 tokens mixed in each step (uniform batches), the term in slices of four rows,
and at a weight that makes it a part of the loss the tiny model's answer NLL (about 60 a step
here) does not drown."""


def losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_processes_give_the_one_process_term(tmp_path):
    """Each process pads its share of a step's rows (and each slice of it) to the width of all
    of them, as the one process does: the step losses agree to float rounding (measured 1.3e-7 at
    most). Each padded its own rows to their own width before: they parted by up to 2e-4."""
    from test_two_process import launch_two

    env = {**os.environ, "SURECL_CACHE": str(tmp_path / "cache")}
    cli = [sys.executable, "-m", "surecl.cli", "run", *ARGS]
    one = subprocess.run([*cli, "--out", str(tmp_path / "one")], env=env, capture_output=True, text=True)
    assert one.returncode == 0, one.stderr[-2000:]
    codes, out = launch_two([*cli, "--out", str(tmp_path / "two")], {**env, "CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    assert codes == [0, 0], out
    alone, shared = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(alone) == len(shared) == 8
    worst = max(abs(a - b) / abs(a) for a, b in zip(alone, shared))
    assert worst < 1e-5, (worst, alone, shared)


def test_layers_the_model_does_not_have_stop_the_run_before_any_step(tmp_path, tiny_cache, capsys, monkeypatch):
    """With ``ilora.rows=replayed`` the first task has no rows for the term (nothing is in the
    buffer yet), so the loss hook met -5 only in the second task, after the first one trained and
    was checkpointed, and the corrected command was then refused as another config. The run
    stops in one line before anything trains, and the corrected command runs in that folder."""
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    out = tmp_path / "run"
    argv = ["run", "--config", "tiny,ilora", "--out", str(out), "--quiet", "data.tasks=[colors,animals]", "data.n_train=8",
            "data.n_test=2", "train.epochs=1", "ilora.rows=replayed"]
    assert main([*argv, "ilora.layers=-1,-5,3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["surecl: error: ilora.layers: -1,-5,3 asks for hidden state -5, 3, but this model has 3 (the embeddings', then 2 "
                   "layers' outputs): indices 0 to 2, or -3 to -1"], err
    assert not (out / "checkpoints").exists() and not (out / "log.jsonl").exists()
    assert main([*argv, "ilora.layers=-1,-3"]) == 0, capsys.readouterr().err
    assert len(losses(out)) == 2


def test_the_layers_counted_are_the_hidden_states_the_term_reads(tiny_loaded, tmp_path, tiny_cache):
    """The check counts the decoder's hidden states of an encoder-decoder (the term's), which
    T5 and BART give under their own keys; a decoder deeper than the encoder tells them apart.
    Through a run: a T5 whose decoder has four hidden states and its encoder three takes -4 and
    stops at 4, naming the decoder, before anything trains."""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration, T5Config, T5ForConditionalGeneration

    from surecl.errors import SureclError
    from surecl.trainer import ContinualRun

    tok = tiny_loaded.tokenizer
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert hidden_states(tiny_loaded.model.config, False) == len(tiny_loaded.model(input_ids=ids, output_hidden_states=True).hidden_states)
    special = {"pad_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id, "decoder_start_token_id": tok.pad_token_id}
    t5 = T5Config(vocab_size=len(tok), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3, num_heads=4, **special)
    bart = BartConfig(vocab_size=len(tok), d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, bos_token_id=tok.bos_token_id, **special)
    models = {}
    for config, cls in ((t5, T5ForConditionalGeneration), (bart, BartForConditionalGeneration)):
        torch.manual_seed(0)
        models[cls] = model = cls(config).eval()
        with torch.no_grad():
            n = len(model(input_ids=ids, labels=ids, output_hidden_states=True).decoder_hidden_states)
        assert hidden_states(config, True) == n == 4, cls.__name__

    def start(layers: str) -> ContinualRun:
        cfg = build_config("tiny,ilora", ["data.tasks=[colors]", "data.n_train=8", "data.n_test=2", "lora.target_modules=[q,v]",
                                          f"ilora.layers={layers}"])
        return ContinualRun(cfg, tmp_path / layers, progress=False, model=copy.deepcopy(models[T5ForConditionalGeneration]),
                            tokenizer=tok, cache_dir=tiny_cache)  # (PEFT wraps its model in place)

    assert start("-4").is_seq2seq
    with pytest.raises(SureclError, match=r"^ilora.layers: 4 asks for hidden state 4, but this model's decoder has 4 \(the embeddings', "
                                          r"then 3 layers' outputs\): indices 0 to 3, or -4 to -1$"):
        start("4")
    assert not (tmp_path / "4").exists()


def test_the_dry_run_says_the_run_stops_on_layers_the_model_lacks(tiny_cache, tiny_loaded, capsys, monkeypatch):
    """The dry run reads the model's config (the built-in tiny model's, from the cache that
    ``tiny_loaded`` filled) and says what the run's setup will refuse; in range, nothing."""
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    argv = ["run", "--dry-run", "--config", "tiny,ilora", "data.tasks=[colors,animals]"]
    assert main([*argv, "ilora.layers=-1,5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == ("  error: the run stops: ilora.layers: -1,5 asks for hidden state 5, but this model has 3 (the embeddings', "
                        "then 2 layers' outputs): indices 0 to 2, or -3 to -1"), lines[:4]
    assert main([*argv, "ilora.layers=-1,-3"]) == 0
    assert "the run stops" not in capsys.readouterr().out
