"""The model-family review's findings: an encoder-decoder answers by plain greedy search whatever
its checkpoint's ``generation_config.json`` asks (a forced BOS, ``min_length``,
``no_repeat_ngram_size``); a tokenizer without an EOS token, a pad or EOS id past the model's
embeddings and an encoder-decoder without a decoder start token are one line before the run
folder is started; damaged weights and a config.json its weights do not match are the loader's
one line, exit 2 from the CLI."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from test_model_families import SMALL, build

from surecl.config import ModelConfig, build_config
from surecl.data.encode import TaskEncoder, collate
from surecl.data.tiny import tiny_stream
from surecl.errors import SureclError
from surecl.evaluate import generate_answers
from surecl.model import load_model, prepare_model
from surecl.trainer import ContinualRun

CPU = torch.device("cpu")
STEPS = 6
"""New tokens each answer may take: room for ``min_length`` and repeated n-grams to matter."""


@torch.inference_mode()
def hand_greedy(model, tok, items, start: int) -> list[str]:
    """Greedy answers by hand, one row at a time: the decoder starts at ``start``, takes the
    argmax of each full forward and stops at EOS or after :data:`STEPS` tokens."""
    answers = []
    for e in items:
        decoded = [start]
        for _ in range(STEPS):
            token = model(input_ids=torch.tensor([e.prompt]), decoder_input_ids=torch.tensor([decoded])).logits[0, -1].argmax().item()
            decoded.append(token)
            if token == tok.eos_token_id:
                break
        answers.append(tok.decode(decoded[1:], skip_special_tokens=True))
    return answers


def checkpoint_call(model, tok, items) -> list[str]:
    """The answers of the call surecl made before: ``generate`` overriding only sampling, beams,
    length, EOS and pad, so the rest of the model's generation config applied."""
    batch = collate(items, tok.pad_token_id, True, with_answer=False)
    new = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=STEPS, do_sample=False,
                         num_beams=1, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)[:, 1:]
    return tok.batch_decode(new, skip_special_tokens=True)


@pytest.mark.parametrize("family,targets,extra", [
    ("bart", ["q_proj", "v_proj"], {"tie_word_embeddings": False}),  # tied, the tiny BART echoes its start token: EOS, every answer empty
    ("t5", ["q", "v"], {}),
])
def test_seq2seq_answers_are_plain_greedy_whatever_the_generation_config(family, targets, extra, tiny_loaded, tiny_cache, tmp_path):
    """A BART / T5 folder whose generation_config.json forces a BOS, a min_length, no repeated
    bigrams, a repetition penalty, four beams and a forced EOS (as bart-large-cnn stores most of
    them) answers as plain greedy search by hand does, base alone and through the LoRA learner;
    the call surecl made before followed those settings. The model's own generation config is
    back as loaded afterwards."""
    from surecl.adapters import DualLoRA
    from surecl.config import DualConfig, LoraConfig

    tok = copy.deepcopy(tiny_loaded.tokenizer)
    task = tiny_stream(n_train=4, n_test=6)[0]
    model = build(family, tok, **extra)
    items = TaskEncoder(tok, 64, end_eos=True).encode(task, task.test, "test")
    start = model.config.decoder_start_token_id
    firsts = {tok.convert_tokens_to_ids(a.split()[0]) for a in hand_greedy(model, tok, items, start) if a}
    forced = next(i for i in tok.convert_tokens_to_ids(task.labels) if i not in firsts)  # a word greedy never starts with
    settings = dict(forced_bos_token_id=forced, min_length=5, no_repeat_ngram_size=2, repetition_penalty=1.5, num_beams=4,
                    early_stopping=True, forced_eos_token_id=tok.eos_token_id)
    for key, value in settings.items():
        setattr(model.generation_config, key, value)
    folder = tmp_path / family
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    assert {k: v for k, v in json.loads((folder / "generation_config.json").read_text()).items() if k in settings} == settings
    loaded = load_model(ModelConfig(name=str(folder)), CPU, tiny_cache)
    base = loaded.model
    dual = DualLoRA(copy.deepcopy(base), LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=targets), DualConfig(), is_seq2seq=True)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in dual.fast_params:
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    for m in (base, dual.model.eval()):
        greedy = hand_greedy(m, tok, items, start)
        assert any(len(a.split()) > 1 for a in greedy)  # answers of several words: min_length and the n-grams can act
        assert checkpoint_call(m, tok, items) != greedy  # the checkpoint's settings change the answers
        got = generate_answers(m, tok, items, is_seq2seq=True, max_new_tokens=STEPS, batch_size=4, device=CPU)
        assert got == greedy, family
    assert {k: getattr(base.generation_config, k) for k in settings} == settings


def gpt2_without_eos(tiny_loaded, folder):
    """A GPT-2 whose tokenizer has a pad token and no EOS (a GPT-2 shipped with a BERT tokenizer),
    saved to ``folder``; returns the model and tokenizer."""
    from transformers import PreTrainedTokenizerFast

    base = tiny_loaded.tokenizer
    tok = PreTrainedTokenizerFast(tokenizer_object=copy.deepcopy(base.backend_tokenizer), pad_token="<pad>", unk_token="<unk>")
    assert tok.eos_token_id is None and tok.pad_token_id == 0
    model = build("gpt2", base)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model, tok


def cli_refusal(folder, out, targets, tiny_cache, monkeypatch, capsys) -> str:
    """``surecl run`` on the model folder: exit 2, one line on stderr, nothing in ``out``; the line."""
    from surecl.cli import main

    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    code = main(["run", "--config", "tiny,slow_surprise", *SMALL, f"model.name={folder}", f"lora.target_modules={targets}",
                 "--out", str(out), "--quiet"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("surecl") or "Traceback" in line]
    assert code == 2 and len(err) == 1, err
    assert not out.exists() or not any(out.iterdir())
    return err[0]


def test_a_tokenizer_with_a_pad_token_and_no_eos_is_one_line(tiny_loaded, tiny_cache, tmp_path, monkeypatch, capsys):
    """Only a tokenizer without pad and EOS was refused: one with a pad token and no EOS stopped
    at the first scoring (``Could not infer dtype of NoneType``) with config.yaml and log.jsonl
    written. Now one line naming the model, from the CLI and for a model passed from Python."""
    model, tok = gpt2_without_eos(tiny_loaded, tmp_path / "noeos")
    line = cli_refusal(tmp_path / "noeos", tmp_path / "out", "[c_attn]", tiny_cache, monkeypatch, capsys)
    assert line.startswith(f"surecl: error: tokenizer of {tmp_path / 'noeos'}: has no EOS token") and "eos_token" in line
    with pytest.raises(SureclError, match=r"^tokenizer of .*: has no EOS token .* tokenizer.eos_token = \.\.\.") as err:
        ContinualRun(build_config("tiny,slow_surprise", [*SMALL, "lora.target_modules=[c_attn]"]), tmp_path / "py", progress=False,
                     model=model, tokenizer=tok, cache_dir=tiny_cache)
    assert "\n" not in str(err.value) and not (tmp_path / "py").exists()
    assert tok.pad_token == "<pad>" and tok.padding_side == "right"  # the caller's tokenizer as it came


def test_token_ids_past_the_embeddings_are_one_line(tiny_loaded, tiny_cache, tmp_path, monkeypatch, capsys):
    """A pad token added to a tokenizer without resizing the model (id 73 of 73 embeddings)
    ended in an IndexError at the first scoring (a device-side assert on a GPU); an EOS or
    decoder start past them too. Each is one line naming the model and the fix."""
    from transformers import PreTrainedTokenizerFast

    base = tiny_loaded.tokenizer
    tok = PreTrainedTokenizerFast(tokenizer_object=copy.deepcopy(base.backend_tokenizer), eos_token="<eos>", unk_token="<unk>")
    tok.add_special_tokens({"pad_token": "[PAD]"})
    size = tiny_loaded.model.get_input_embeddings().num_embeddings
    assert tok.pad_token_id == size
    folder = tmp_path / "padoov"
    tiny_loaded.model.save_pretrained(folder)
    tok.save_pretrained(folder)
    line = cli_refusal(folder, tmp_path / "out", "[q_proj,v_proj]", tiny_cache, monkeypatch, capsys)
    assert line == (f"surecl: error: tokenizer of {folder}: its pad token '[PAD]' has id {size}, past the model's {size} token "
                    "embeddings (a token added to the tokenizer without resizing the model); resize them "
                    "(model.resize_token_embeddings(len(tokenizer))) and save the model with its tokenizer, or give the tokenizer a "
                    "token the model has")
    eos = PreTrainedTokenizerFast(tokenizer_object=copy.deepcopy(base.backend_tokenizer), pad_token="<pad>", unk_token="<unk>")
    eos.add_special_tokens({"eos_token": "[END]"})
    with pytest.raises(SureclError, match=rf"^tokenizer of {tiny_loaded.path}: its EOS token '\[END\]' has id {size}, past the model's "):
        prepare_model(copy.deepcopy(tiny_loaded.model), eos, CPU)
    bart = build("bart", base, decoder_start_token_id=size + 5)
    with pytest.raises(SureclError, match=rf"^model BartForConditionalGeneration: its decoder_start_token_id {size + 5} is past its "
                                          rf"{size} token embeddings; set decoder_start_token_id in its config.json"):
        prepare_model(bart, copy.deepcopy(base), CPU)


def test_an_encoder_decoder_without_a_decoder_start_is_one_line(tiny_loaded, tiny_cache, tmp_path, monkeypatch, capsys):
    """A bert2bert EncoderDecoderModel (no decoder_start_token_id by default) stopped at the
    first scoring ("Make sure to set the decoder_start_token_id"), a BART with it null in a
    TypeError, the run folder started. Now one line naming the model and the fix; a model whose
    generation config alone has one takes it into its config, which the shift reads (given back
    as it came when the build fails)."""

    from surecl.nll import token_nll

    tok = copy.deepcopy(tiny_loaded.tokenizer)
    bert2bert = tiny_bert2bert(tok)
    assert bert2bert.config.decoder_start_token_id is None and bert2bert.generation_config.decoder_start_token_id is None
    folder = tmp_path / "bert2bert"
    bert2bert.save_pretrained(folder)
    tok.save_pretrained(folder)
    line = cli_refusal(folder, tmp_path / "out", "[query,value]", tiny_cache, monkeypatch, capsys)
    assert line.startswith(f"surecl: error: model {folder}: an encoder-decoder without a decoder_start_token_id (in neither its "
                           "config nor its generation config)") and "set decoder_start_token_id in its config.json" in line
    bart = build("bart", tok)
    bart.config.decoder_start_token_id = bart.generation_config.decoder_start_token_id = None
    with pytest.raises(SureclError, match=r"^model BartForConditionalGeneration: an encoder-decoder without a decoder_start_token_id"):
        ContinualRun(build_config("tiny,slow_surprise", [*SMALL, "lora.target_modules=[q_proj,v_proj]"]), tmp_path / "py",
                     progress=False, model=bart, tokenizer=tok, cache_dir=tiny_cache)
    assert not (tmp_path / "py").exists()
    bart.generation_config.decoder_start_token_id = tok.eos_token_id  # the generation config alone has one
    loaded = prepare_model(bart, tok, CPU)
    assert bart.config.decoder_start_token_id == tok.eos_token_id
    task = tiny_stream(n_train=4, n_test=1)[0]
    items = TaskEncoder(tok, 64, end_eos=True).encode(task, task.train)
    nll, count = token_nll(loaded.model, collate(items, tok.pad_token_id, True), is_seq2seq=True)
    assert bool(torch.isfinite(nll).all()) and bool((count > 0).all())
    from surecl.model import GivenModel

    other = build("bart", tok)
    other.config.decoder_start_token_id = None
    other.generation_config.decoder_start_token_id = tok.eos_token_id
    given = GivenModel(other, tok)
    prepare_model(other, tok, CPU)
    given.restore()
    assert other.config.decoder_start_token_id is None


def test_damaged_weights_and_mismatched_shapes_are_the_loaders_line(tiny_loaded, tiny_cache, tmp_path, monkeypatch, capsys):
    """A cut model.safetensors (safetensors' SafetensorError) and a config.json whose sizes its
    weights do not have (transformers' RuntimeError) gave tracebacks, exit 1; now the loader's
    line, "model.name: cannot load ...", exit 2."""
    trunc, shape = tmp_path / "trunc", tmp_path / "shape"
    for folder in (trunc, shape):
        tiny_loaded.model.save_pretrained(folder)
        tiny_loaded.tokenizer.save_pretrained(folder)
    weights = trunc / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    config = json.loads((shape / "config.json").read_text())
    config["hidden_size"] //= 2
    (shape / "config.json").write_text(json.dumps(config))
    with pytest.raises(SureclError, match=rf"^model.name: cannot load '{trunc}': Error while deserializing header") as err:
        load_model(ModelConfig(name=str(trunc)), CPU, tiny_cache)
    assert "\n" not in str(err.value)
    with pytest.raises(SureclError, match=rf"^model.name: cannot load '{shape}': You set `ignore_mismatched_sizes` to `False`") as err:
        load_model(ModelConfig(name=str(shape)), CPU, tiny_cache)
    assert "\n" not in str(err.value)
    line = cli_refusal(trunc, tmp_path / "out", "[q_proj,v_proj]", tiny_cache, monkeypatch, capsys)
    assert line.startswith(f"surecl: error: model.name: cannot load '{trunc}': ")


def tiny_bert2bert(tok):
    """A tiny bert2bert (``EncoderDecoderModel`` of two BERTs) over ``tok``'s vocabulary: no
    decoder start by default."""
    from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel

    bert = dict(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                pad_token_id=tok.pad_token_id)
    config = EncoderDecoderConfig.from_encoder_decoder_configs(BertConfig(**bert), BertConfig(**bert))
    config.pad_token_id = tok.pad_token_id
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return EncoderDecoderModel(config=config)
