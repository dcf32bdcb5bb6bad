"""The model checks' review: the dry run says, in the run's words, what the run refuses of a model
folder's tokenizer (no EOS; a pad, EOS or decoder start id past the embeddings; an
encoder-decoder without a decoder start); the chat template's end-of-turn token, ``data.text_start``'s
token and every token of the encoded rows are checked against the model's embeddings before the
run folder is written (an added token, the model not resized, stopped mid-run in an IndexError
traceback, or silently never stopped generation); a config.json its weights do not match is
surecl's one line on stderr, without transformers' load report above it."""

from __future__ import annotations

import copy
import json
import logging

import pytest
import torch
from test_model_families import build
from test_models_review24 import tiny_bert2bert

from surecl.config import ModelConfig, build_config
from surecl.errors import SureclError
from surecl.model import load_model
from surecl.trainer import ContinualRun

CPU = torch.device("cpu")
ROWS = ["data.tasks=[colors]", "data.n_train=8", "data.n_test=4", "train.epochs=1"]


def save(folder, model, tok):
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def with_added(tiny_loaded, *tokens, template: str | None = None):
    """The tiny tokenizer with ``tokens`` added (ids 72, 73, ...: past the model's 72 embeddings)."""
    tok = copy.deepcopy(tiny_loaded.tokenizer)
    tok.add_special_tokens({"additional_special_tokens": list(tokens)})
    if template is not None:
        tok.chat_template = template
    return tok


def run_cli(argv, tiny_cache, monkeypatch, capsys):
    """``surecl run`` (exit code, stdout, stderr)."""
    from surecl.cli import main

    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    code = main(["run", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def refusal(argv, out, tiny_cache, monkeypatch, capsys) -> str:
    """``surecl run`` refuses: exit 2, one line on stderr (no traceback), nothing in ``out``; the line."""
    code, _, err = run_cli([*argv, "--out", str(out), "--quiet"], tiny_cache, monkeypatch, capsys)
    lines = [line for line in err.splitlines() if line.startswith("surecl") or "Traceback" in line]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("surecl: error: "), err[-3000:]
    assert not out.exists() or not any(out.iterdir())
    return lines[0].removeprefix("surecl: error: ")


def dry_errors(argv, tiny_cache, monkeypatch, capsys) -> list[str]:
    """The ``error: the run stops:`` lines ``surecl run --dry-run`` prints under its model line."""
    code, out, err = run_cli([*argv, "--dry-run"], tiny_cache, monkeypatch, capsys)
    assert code == 0, err
    return [line.removeprefix("  error: the run stops: ") for line in out.splitlines() if line.startswith("  error: the run stops: ")]


def test_the_dry_run_says_the_special_tokens_the_run_refuses(tiny_loaded, tiny_cache, tmp_path, monkeypatch, capsys):
    """The dry run read a model folder's config and no tokenizer: a pad token added without
    resizing, a tokenizer without EOS, a bert2bert without a decoder start and a BART whose
    decoder start is past its embeddings all planned without a word, and the run then stopped.
    Now the dry run says the run's own line under the model line; a folder the run takes, a BART
    whose decoder start is in its generation config alone among them, gets no error line."""
    from transformers import PreTrainedTokenizerFast

    base = tiny_loaded.tokenizer
    size = tiny_loaded.model.get_input_embeddings().num_embeddings
    pad = PreTrainedTokenizerFast(tokenizer_object=copy.deepcopy(base.backend_tokenizer), eos_token="<eos>", unk_token="<unk>")
    pad.add_special_tokens({"pad_token": "[PAD]"})
    no_eos = PreTrainedTokenizerFast(tokenizer_object=copy.deepcopy(base.backend_tokenizer), pad_token="<pad>", unk_token="<unk>")
    bert2bert = tiny_bert2bert(base)
    late_start = build("bart", base, decoder_start_token_id=size + 5)
    late_start.generation_config.decoder_start_token_id = size + 5
    refused = {
        "padoov": (save(tmp_path / "padoov", tiny_loaded.model, pad), "[q_proj,v_proj]", "its pad token '[PAD]' has id 72, past"),
        "noeos": (save(tmp_path / "noeos", tiny_loaded.model, no_eos), "[q_proj,v_proj]", "has no EOS token"),
        "bert2bert": (save(tmp_path / "bert2bert", bert2bert, base), "[query,value]", "an encoder-decoder without a decoder_start_token_id"),
        "bartoov": (save(tmp_path / "bartoov", late_start, base), "[q_proj,v_proj]", f"its decoder_start_token_id {size + 5} is past"),
    }
    for name, (folder, targets, words) in refused.items():
        argv = ["--config", "tiny,seq_lora", *ROWS, f"model.name={folder}", f"lora.target_modules={targets}"]
        line = refusal(argv, tmp_path / f"out-{name}", tiny_cache, monkeypatch, capsys)
        assert words in line, (name, line)
        assert dry_errors(argv, tiny_cache, monkeypatch, capsys) == [line], name
    # what the run takes: no error line (the BART's start from its generation_config.json, as from_pretrained reads it)
    gen_start = build("bart", base)
    gen_start.config.decoder_start_token_id = None
    gen_start.generation_config.decoder_start_token_id = base.eos_token_id
    taken = {"tiny": (save(tmp_path / "tiny", tiny_loaded.model, base), "[q_proj,v_proj]"),
             "bart": (save(tmp_path / "bart", gen_start, base), "[q_proj,v_proj]")}
    assert json.loads((taken["bart"][0] / "config.json").read_text()).get("decoder_start_token_id") is None
    for name, (folder, targets) in taken.items():
        argv = ["--config", "tiny,seq_lora", *ROWS, f"model.name={folder}", f"lora.target_modules={targets}"]
        assert dry_errors(argv, tiny_cache, monkeypatch, capsys) == [], name


CHAT_END = "{% for m in messages %}{{ m['content'] }}<|im_end|> {% endfor %}"
"""A template whose every turn ends with the added ``<|im_end|>``: the rows hold it too."""
ASSISTANT_END = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] }}<|im_end|> {% else %}{{ m['content'] }} "
                 "{% endif %}{% endfor %}")
"""The added ``<|im_end|>`` after an assistant's turn alone: a test prompt never holds it."""
CHAT_START = "{% for m in messages %}<|im_start|> {{ m['content'] }} <eos> {% endfor %}"
"""Turns that start with the added ``<|im_start|>`` and end with EOS (a stop the model has)."""


def write_probe(folder):
    """A general-ability probe of instruction rows alone (no text part)."""
    folder.mkdir()
    rows = [{"task": "weather", "instruction": "Which class fits?\n"}] + [{"prompt": "red blue", "response": "warm"}] * 4
    (folder / "instruct.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_tokens_added_without_resizing_stop_the_run_before_its_folder(tiny_loaded, tiny_cache, tmp_path, monkeypatch, capsys):
    """A chat template's end-of-turn token, a ``data.text_start`` token or a token the rows hold,
    added to the tokenizer without resizing the model (id 72 of 72 embeddings): the run stopped at
    its first forward in an IndexError traceback with config.yaml and log.jsonl written, or, where
    only the end of turn (a stop token) was past them, ran to its end with generation that could
    never stop there. Now one line naming the token before the run folder is written, the end of
    turn and document start said by the dry run too; a model passed from Python alike."""
    model = tiny_loaded.model
    chat = save(tmp_path / "chat", model, with_added(tiny_loaded, "<|im_end|>", template=CHAT_END))
    assistant = save(tmp_path / "assistant", model, with_added(tiny_loaded, "<|im_end|>", template=ASSISTANT_END))
    start = save(tmp_path / "start", model, with_added(tiny_loaded, "<|im_start|>", template=CHAT_START))
    doc_tok = with_added(tiny_loaded, "<doc>")
    doc = save(tmp_path / "doc", model, doc_tok)
    probe = write_probe(tmp_path / "probe")
    past = "past the model's 72 token embeddings (a token added to the tokenizer without resizing the model); resize them"
    cases = {
        "end of turn": (["--config", "tiny,seq_lora", "data.kind=generate", f"model.name={chat}"],
                        f"tokenizer of {chat}: its chat template's end-of-turn token '<|im_end|>' has id 72 (generation stops at it), past",
                        True),
        "probe's stop": (["--config", "tiny,seq_lora", f"model.name={assistant}", f"eval.general={probe}"],
                         f"tokenizer of {assistant}: its chat template's end-of-turn token '<|im_end|>' has id 72", True),
        "document start": (["--config", "tiny,seq_lora,cpt", f"model.name={doc}", "data.text_start=<doc>"],
                           f"tokenizer of {doc}: its token '<doc>' before every document (data.text_start=<doc>) has id 72", True),
        "rows": (["--config", "tiny,seq_lora", "data.kind=generate", f"model.name={start}"],
                 f"tokenizer of {start}: the train rows of task colors hold its token '<|im_start|>', id 72", False),
    }
    for name, (argv, words, planned) in cases.items():
        argv = [*argv, *ROWS, "lora.target_modules=[q_proj,v_proj]"]
        line = refusal(argv, tmp_path / f"out-{name}", tiny_cache, monkeypatch, capsys)
        assert line.startswith(words) and past in line, (name, line)
        # the dry run reads the tokenizer, not the rows: the rows' tokens are the run's to check
        assert dry_errors(argv, tiny_cache, monkeypatch, capsys) == ([line] if planned else []), name
    # the same document start passed as a text_start the model has: the run takes it
    code, _, err = run_cli(["--config", "tiny,seq_lora,cpt", f"model.name={doc}", "data.text_start=<eos>", *ROWS,
                            "lora.target_modules=[q_proj,v_proj]", "--out", str(tmp_path / "fine"), "--quiet"],
                           tiny_cache, monkeypatch, capsys)
    assert code == 0, err
    cfg = build_config("tiny,seq_lora,cpt", [*ROWS, "data.text_start=<doc>", "lora.target_modules=[q_proj,v_proj]"])
    with pytest.raises(SureclError, match=r"^tokenizer of .*: its token '<doc>' before every document") as caught:
        ContinualRun(cfg, tmp_path / "py", progress=False, model=copy.deepcopy(model), tokenizer=doc_tok, cache_dir=tiny_cache)
    assert "\n" not in str(caught.value) and not (tmp_path / "py").exists()


def test_a_config_its_weights_do_not_match_is_one_line_on_stderr(tiny_loaded, tiny_cache, tmp_path):
    """transformers printed its load report (a table of every mismatched weight, and its notes)
    on stderr above surecl's line, which pointed at it ("look at the above report"). Now stderr
    holds surecl's line alone, naming a weight that differs (the CLI in a process of its own, so
    its stderr is the terminal's); transformers' logger is as it was after a failed load and after
    a good one, whose report (an unexpected weight) is still said."""
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file, save_file
    from transformers.utils import logging as hf_logging

    shape = save(tmp_path / "shape", tiny_loaded.model, tiny_loaded.tokenizer)
    config = json.loads((shape / "config.json").read_text())
    config["hidden_size"] //= 2
    (shape / "config.json").write_text(json.dumps(config))
    done = subprocess.run([sys.executable, "-m", "surecl.cli", "run", "--config", "tiny,seq_lora", *ROWS, f"model.name={shape}",
                           "--out", str(tmp_path / "out"), "--quiet"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SURECL_CACHE": str(tiny_cache)})
    err = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(err) == 1, done.stderr[-3000:]
    assert err[0].startswith(f"surecl: error: model.name: cannot load '{shape}': ") and "above report" not in err[0]
    assert ("its weights do not have the shapes its config.json gives (model.embed_tokens.weight: [72, 128] in the weights, "
            "[72, 64] by config.json; 10 more); give the folder the config.json its weights were saved with") in err[0]
    assert not (tmp_path / "out").exists()
    hf_logging.get_verbosity()  # the library's logger set up
    root = logging.getLogger("transformers")
    seen = []
    catch = logging.Handler()
    catch.emit = seen.append
    root.addHandler(catch)
    try:
        state = (list(root.handlers), root.propagate, hf_logging.get_verbosity())
        with pytest.raises(SureclError, match=r"^model.name: cannot load .*: its weights do not have the shapes"):
            load_model(ModelConfig(name=str(shape)), CPU, tiny_cache)
        assert seen == [] and (list(root.handlers), root.propagate, hf_logging.get_verbosity()) == state
        # a load that succeeds: its report said as before, the logger as it was
        extra = save(tmp_path / "extra", tiny_loaded.model, tiny_loaded.tokenizer)
        weights = load_file(extra / "model.safetensors")
        weights["model.extra.weight"] = torch.zeros(3)
        save_file(weights, extra / "model.safetensors", metadata={"format": "pt"})
        load_model(ModelConfig(name=str(extra)), CPU, tiny_cache)
        assert any("LOAD REPORT" in r.getMessage() and "model.extra.weight" in r.getMessage() for r in seen)
        assert (list(root.handlers), root.propagate, hf_logging.get_verbosity()) == state
    finally:
        root.removeHandler(catch)
