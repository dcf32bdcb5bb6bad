"""Model families beside the tiny Llama, each built in code at a tiny size: BLOOM and Falcon's
ALiBi take the 2D mask where pads would attend to themselves; GPT-Neo's local layers and MPT's
ALiBi (both placed by key index) run rows whole, so a shared prefix cannot move a score; a
target module that matches nothing is one line naming the model's linear layers (GPT-2's
Conv1D among them, in the dry run too); BART's learned positions are checked on each side; a
``~`` model folder is found; a ``model.dtype`` the model is not held in is refused; an
encoder-decoder without a pad token in its config runs."""

from __future__ import annotations

import copy
import json
import logging

import pytest
import torch
import transformers

from surecl.config import ModelConfig, build_config
from surecl.data.encode import TaskEncoder, collate
from surecl.data.tiny import tiny_stream
from surecl.errors import SureclError
from surecl.model import load_model, prepare_model
from surecl.trainer import ContinualRun

SMALL = ["data.tasks=[colors]", "data.n_train=8", "data.n_test=4", "train.epochs=1"]


def build(family: str, tok, **extra) -> torch.nn.Module:
    """A tiny random model of ``family`` over the tiny tokenizer's vocabulary (embeddings at the
    tiny model's scale, so its outputs differ from row to row)."""
    T = transformers
    ids = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    V = len(tok)
    configs = {
        "bloom": (T.BloomConfig, T.BloomForCausalLM, dict(vocab_size=V, hidden_size=64, n_layer=2, n_head=4, **ids)),
        "falcon_alibi": (T.FalconConfig, T.FalconForCausalLM,
                         dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, alibi=True, **ids)),
        "mpt": (T.MptConfig, T.MptForCausalLM, dict(vocab_size=V, d_model=64, n_layers=2, n_heads=4, max_seq_len=256, **ids)),
        "gpt_neo": (T.GPTNeoConfig, T.GPTNeoForCausalLM,
                    dict(vocab_size=V, hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
                         window_size=8, max_position_embeddings=256, **ids)),
        "gpt2": (T.GPT2Config, T.GPT2LMHeadModel, dict(vocab_size=V, n_positions=256, n_embd=64, n_layer=2, n_head=4, **ids)),
        "t5": (T.T5Config, T.T5ForConditionalGeneration,
               dict(vocab_size=V, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                    pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, decoder_start_token_id=tok.pad_token_id)),
        "bart": (T.BartConfig, T.BartForConditionalGeneration,
                 dict(vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                      encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=256, decoder_start_token_id=tok.eos_token_id,
                      forced_eos_token_id=None, **ids)),
    }
    config_class, model_class, kwargs = configs[family]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = model_class(config_class(**{**kwargs, **extra}))
        with torch.no_grad():
            model.get_input_embeddings().weight.normal_(0.0, 0.5)
    return model.eval()


def mixed_batch(tok) -> dict[str, torch.Tensor]:
    """Rows of two tasks, so the batch is left-padded."""
    tasks = tiny_stream(n_train=12, n_test=1)
    enc = TaskEncoder(tok, 64)
    return collate(enc.encode(tasks[0], tasks[0].train)[:2] + enc.encode(tasks[2], tasks[2].train)[:2], tok.pad_token_id, False)


@pytest.mark.parametrize("family", ["bloom", "falcon_alibi", "mpt"])
def test_alibi_models_train_where_pads_would_attend_to_themselves(family, tiny_loaded, monkeypatch):
    """Off the CPU a training step gives pads a self-attending 4D mask (``pads_self_default``);
    BLOOM and Falcon(alibi) build their bias from the 2D mask and stopped with "too many values
    to unpack". Forced here as on an accelerator: they keep the 2D mask, and every family gives
    what the plain mask gives."""
    from surecl import nll

    tok = tiny_loaded.tokenizer
    model = prepare_model(build(family, tok), tok, torch.device("cpu")).model
    batch = mixed_batch(tok)
    assert not bool(batch["attention_mask"].all())
    for scope in ("label", "sequence"):
        plain, _ = nll.token_nll(model, batch, scope=scope, pads_self=False)
        with monkeypatch.context() as m, torch.enable_grad():
            m.setattr(nll, "pads_self_here", lambda mask: True)  # as on an accelerator, in training
            assert nll.pads_self_default(batch["attention_mask"])
            forced, _ = nll.token_nll(model, batch, scope=scope)
        assert torch.allclose(forced, plain, atol=1e-5), (family, scope)
    width = batch["attention_mask"].shape[1]
    assert nll.takes_pad_self_mask(model.config, width) == (family == "mpt")  # MPT's bias is by index: a 4D mask serves
    assert nll.takes_pad_self_mask(tiny_loaded.model.config, width)


@pytest.mark.parametrize("family", ["gpt_neo", "mpt", "bloom", "falcon_alibi"])
def test_scores_with_a_shared_prefix_equal_whole_rows(family, tiny_loaded):
    """GPT-Neo's local window and MPT's ALiBi are placed by the keys' index in the batch, where
    a shared prefix puts each row's pads after the prefix: their scores moved by 0.006-0.04 with
    the batch. They now run rows whole; BLOOM's and Falcon's ALiBi count real keys and keep it."""
    from surecl.evaluate import option_logprobs
    from surecl.nll import prefix_sharing, shared_prefix_obstacle
    from surecl.replay.surprise import score_examples

    tok = tiny_loaded.tokenizer
    model = prepare_model(build(family, tok), tok, torch.device("cpu")).model
    task = tiny_stream(n_train=12, n_test=1)[2]
    enc = TaskEncoder(tok, 64)
    items = enc.encode(task, task.train)[:8]
    assert len({len(e.prompt) for e in items}) > 1  # the rows are padded
    for scope in ("sequence", "label"):
        shared, whole = (score_examples(model, items, pad_id=tok.pad_token_id, is_seq2seq=False, scope=scope, batch_size=8, share_prefix=s)
                         for s in (True, False))
        assert shared == pytest.approx(whole, abs=1e-5), (family, scope)
    options = {lab: enc.answer_ids(lab) for lab in task.labels}
    shared, whole = (option_logprobs(model, items, options, pad_id=tok.pad_token_id, is_seq2seq=False, batch_size=64, device="cpu",
                                     share_prefix=s) for s in (True, False))
    assert torch.allclose(shared, whole, atol=1e-5)
    by_index = family in ("gpt_neo", "mpt")
    assert prefix_sharing(model) is not by_index and (shared_prefix_obstacle(model.config) is not None) is by_index


def test_the_run_says_why_prefix_sharing_is_off(tiny_loaded, tmp_path, tiny_cache, caplog):
    """build_run's note names the cause: GPT-Neo's window, MPT's ALiBi."""
    from transformers import GPTNeoConfig

    from surecl.nll import sliding_window_in_use

    assert sliding_window_in_use(GPTNeoConfig(window_size=8, max_position_embeddings=256)) == 8  # a local layer by default
    assert sliding_window_in_use(GPTNeoConfig(window_size=8, num_layers=2, attention_types=[[["global"], 2]])) is None
    assert sliding_window_in_use(GPTNeoConfig(window_size=256, max_position_embeddings=256)) is None
    caplog.set_level(logging.INFO, logger="surecl")
    tok = copy.deepcopy(tiny_loaded.tokenizer)
    words = {"gpt_neo": ("[q_proj,v_proj]", "sliding window (8 tokens"), "mpt": ("[Wqkv]", "its ALiBi bias is placed by the keys' index")}
    for family, (targets, why) in words.items():
        caplog.clear()
        cfg = build_config("tiny,seq_lora", [*SMALL, f"lora.target_modules={targets}"])
        run = ContinualRun(cfg, tmp_path / family, progress=False, model=build(family, tok), tokenizer=tok, cache_dir=tiny_cache)
        notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model.share_prefix: off")]
        assert not run.share_prefix and len(notes) == 1 and why in notes[0] and "scores would depend on the batch" in notes[0]


def test_a_target_module_that_matches_nothing_is_one_line(tiny_loaded):
    """PEFT adapts the names that match and drops a typo without a word (v_prj: q_proj alone
    trained); every name must now match, and the refusal names the model's linear layers (for
    no match at all too). The model comes back as it went in."""
    from peft.tuners.lora import LoraLayer

    from surecl.adapters import DualLoRA
    from surecl.config import DualConfig, LoraConfig

    def refusal(model, targets, seq2seq=False) -> str:
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(SureclError) as err:
            DualLoRA(model, LoraConfig(target_modules=targets), DualConfig(), is_seq2seq=seq2seq)
        assert not any(isinstance(m, LoraLayer) for m in model.modules())
        after = model.state_dict()
        assert after.keys() == before.keys() and all(torch.equal(after[k], v) for k, v in before.items())
        assert "\n" not in str(err.value)
        return str(err.value)

    tok = tiny_loaded.tokenizer
    llama = copy.deepcopy(tiny_loaded.model)
    assert refusal(llama, ["q_proj", "v_prj"]) == (
        "lora.target_modules: ['q_proj', 'v_prj']: v_prj names no layer of this model; its linear layers: "
        "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head")
    assert refusal(llama, ["q_proj", "k_prj", "v_prj"]).startswith(
        "lora.target_modules: ['q_proj', 'k_prj', 'v_prj']: k_prj, v_prj name no layer")
    assert refusal(build("gpt2", tok), ["q_proj", "v_proj"]) == (
        "lora.target_modules: ['q_proj', 'v_proj'] names no layer of this model; its linear layers: c_attn, c_proj, c_fc, lm_head")
    assert refusal(build("t5", tok), ["q_proj", "v_proj"], True).endswith("its linear layers: q, k, v, o, wi, wo, lm_head")
    dl = DualLoRA(llama, LoraConfig(target_modules=["q_proj", "self_attn.v_proj"]), DualConfig(), is_seq2seq=False)  # a dotted end matches
    assert sum(isinstance(m, LoraLayer) for m in dl.model.modules()) == 4


def test_the_cli_refuses_a_typo_in_target_modules(tmp_path, tiny_cache, monkeypatch, capsys):
    """The reviewer's command: it trained q_proj alone; now exit 2 and one line."""
    from surecl.cli import main

    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    code = main(["run", "--config", "tiny,seq_lora", "lora.target_modules=[q_proj,v_prj]", "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("surecl: error: lora.target_modules: ['q_proj', 'v_prj']: v_prj names no layer of this model; its "
                             "linear layers: q_proj, k_proj, v_proj")


def test_sure_trainer_names_its_own_field_for_an_unmatched_target(tiny_loaded, tmp_path):
    """SureTrainer rewrites the core's key to its own field in the new message, and hands the
    model back as given."""
    from peft.tuners.lora import LoraLayer
    from transformers import DataCollatorForLanguageModeling, TrainingArguments

    from surecl.integrations.transformers import SureArguments, SureTrainer

    model = copy.deepcopy(tiny_loaded.model)
    grads = [p.requires_grad for p in model.parameters()]
    collator = DataCollatorForLanguageModeling(tiny_loaded.tokenizer, mlm=False)
    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to=[], save_strategy="no")
    with pytest.raises(SureclError, match=r"^SureArguments.target_modules: \['q_proj', 'v_prj'\]: v_prj names no layer of this model; "
                                          r"its linear layers: q_proj, k_proj"):
        SureTrainer(model=model, args=args, data_collator=collator, sure=SureArguments(target_modules=["q_proj", "v_prj"]))
    assert not any(isinstance(m, LoraLayer) for m in model.modules())
    assert [p.requires_grad for p in model.parameters()] == grads


def test_the_dry_run_counts_gpt2s_conv1d_layers(tiny_loaded, tmp_path):
    """GPT-2's c_attn / c_fc are transformers' Conv1D, which PEFT adapts; the dry run counted
    nn.Linear only and warned they were not there."""
    from surecl.plan import _model_line

    folder = tmp_path / "gpt2"
    build("gpt2", tiny_loaded.tokenizer).save_pretrained(folder)
    cfg = build_config("tiny,seq_lora", [f"model.name={folder}", "lora.target_modules=[c_attn,c_fc,q_proj]"])
    line = _model_line(cfg)
    assert "LoRA on c_attn x2, c_fc x2, q_proj x0" in line
    assert line.endswith("error: the run stops: lora.target_modules names no layer named q_proj in this model (its linear layers: "
                         "c_attn, c_proj, c_fc, lm_head)")


@pytest.fixture
def small_bart(tiny_loaded):
    """``small_bart(positions)``: a tiny BART with that many learned positions on each side."""
    return lambda positions: build("bart", tiny_loaded.tokenizer, max_position_embeddings=positions)


def bart_run(model, tok, out, cache, overrides, preset="slow_surprise") -> ContinualRun:
    cfg = build_config(f"tiny,{preset}", [*SMALL, "lora.target_modules=[q_proj,v_proj]", *overrides])
    return ContinualRun(cfg, out, progress=False, model=model, tokenizer=tok, cache_dir=cache)


def test_bart_rows_past_its_positions_are_one_line(small_bart, tiny_loaded, tmp_path, tiny_cache):
    """BART's learned positions end in an IndexError past them; the context check returned for
    every encoder-decoder. The colors rows: prompts up to 30 tokens (encoder), answers of 2;
    replay.scope=sequence has the decoder read prompt + answer (32), evaluation generates
    eval.max_new_tokens. Each side is checked to the token: 32 positions run the sequence scope."""
    tok = copy.deepcopy(tiny_loaded.tokenizer)
    with pytest.raises(SureclError, match=r"^task colors: encoder inputs of up to 30 tokens \(the prompt\) do not fit the model's 29 "
                                          r"positions; lower model.max_length \(now 64\) by at least 1$"):
        bart_run(small_bart(29), tok, tmp_path / "a", tiny_cache, ["replay.scope=label"])
    with pytest.raises(SureclError, match=r"^task colors: the decoder reads up to 32 tokens \(the answer, or the prompt \+ answer "
                                          r"replay.scope=sequence scores\), more than the model's 31 positions; "
                                          r".* or use replay.scope=label$"):
        bart_run(small_bart(31), tok, tmp_path / "b", tiny_cache, [])
    with pytest.raises(SureclError, match=r"^task colors: the decoder reads up to 33 tokens \(the answer, or the 33 tokens evaluation "
                                          r"generates\), more than the model's 32 positions; .* or eval.max_new_tokens$"):
        bart_run(small_bart(32), tok, tmp_path / "c", tiny_cache, ["eval.max_new_tokens=33"], preset="seq_lora")
    bart_run(small_bart(30), tok, tmp_path / "d", tiny_cache, ["replay.scope=label"])  # fits: no refusal
    bart_run(small_bart(30), tok, tmp_path / "e", tiny_cache, ["replay.scope=sequence"], preset="seq_lora")  # nothing scores
    res = bart_run(small_bart(32), tok, tmp_path / "f", tiny_cache, []).run()  # the decoder reads 32: it runs
    assert res["accuracy_matrix"][0][0] is not None
    # T5's relative positions: nothing to check, though an older T5 config carries n_positions (512)
    t5 = build("t5", tiny_loaded.tokenizer, n_positions=16)
    assert getattr(t5.config, "max_position_embeddings", None) is None and t5.config.n_positions == 16
    ContinualRun(build_config("tiny,slow_surprise", [*SMALL, "lora.target_modules=[q,v]"]), tmp_path / "t5",
                 progress=False, model=t5, tokenizer=tok, cache_dir=tiny_cache)


def test_a_model_folder_under_home_is_found(tiny_loaded, tmp_path, tiny_cache, monkeypatch):
    """model.name=~/... was refused ("path does not exist") though the folder was there, and
    the dry run called it not a local folder."""
    from surecl.plan import _model_line

    monkeypatch.setenv("HOME", str(tmp_path))
    folder = tmp_path / "models" / "mine"
    tiny_loaded.model.save_pretrained(folder)
    tiny_loaded.tokenizer.save_pretrained(folder)
    loaded = load_model(ModelConfig(name="~/models/mine"), torch.device("cpu"), tiny_cache)
    assert loaded.path == str(folder) and type(loaded.model).__name__ == "LlamaForCausalLM"
    line = _model_line(build_config("tiny,seq_lora", ["model.name=~/models/mine"]))
    assert line.startswith("model: ~/models/mine (LlamaForCausalLM, causal LM") and "q_proj x2" in line


def test_a_dtype_the_model_is_not_held_in_is_refused(tiny_loaded, tmp_path, tiny_cache):
    """model.dtype=bf16 with the tiny model or a model passed from Python ran in fp32 and
    results.json said float32; it is now one line, as model.attn_implementation is. The dtype
    the model has, or auto, goes through."""
    with pytest.raises(SureclError, match=r"^model.dtype=bf16: the tiny model is held in fp32 whatever model.dtype asks"):
        load_model(ModelConfig(name="tiny", dtype="bf16"), torch.device("cpu"), tiny_cache)
    assert load_model(ModelConfig(name="tiny", dtype="fp32"), torch.device("cpu"), tiny_cache).dtype == "float32"
    model, tok = copy.deepcopy(tiny_loaded.model), copy.deepcopy(tiny_loaded.tokenizer)
    with pytest.raises(SureclError, match=r"^model.dtype=bf16: a model the caller built keeps the dtype it was built in \(float32\); "
                                          r"convert it first \(model.to\(torch.bfloat16\)\), or leave this at auto$"):
        ContinualRun(build_config("tiny,seq_lora", [*SMALL, "model.dtype=bf16"]), tmp_path / "a", progress=False, model=model,
                     tokenizer=tok, cache_dir=tiny_cache)
    for dtype in ("fp32", "auto"):
        run = ContinualRun(build_config("tiny,seq_lora", [*SMALL, f"model.dtype={dtype}"]), tmp_path / dtype, progress=False,
                           model=copy.deepcopy(tiny_loaded.model), tokenizer=tok, cache_dir=tiny_cache)
        assert run.base_dtype == "float32"


def test_an_encoder_decoder_without_a_pad_token_runs(tiny_loaded):
    """A T5 whose config has no pad_token_id, with a tokenizer without a pad token: every forward
    with labels stopped ("pad_token_id has to be defined"). The config takes the tokenizer's pad
    (its EOS, as prepare_model sets it)."""
    from transformers import PreTrainedTokenizerFast

    from surecl.nll import token_nll

    base = tiny_loaded.tokenizer
    tok = PreTrainedTokenizerFast(tokenizer_object=base.backend_tokenizer, eos_token="<eos>", unk_token="<unk>", bos_token="<bos>")
    assert tok.pad_token_id is None
    model = build("t5", base)
    model.config.pad_token_id = None
    loaded = prepare_model(model, tok, torch.device("cpu"))
    task = tiny_stream(n_train=4, n_test=1)[0]
    items = TaskEncoder(tok, 64, end_eos=True).encode(task, task.train)
    nll, count = token_nll(loaded.model, collate(items, tok.pad_token_id, True), is_seq2seq=True)
    assert bool(torch.isfinite(nll).all()) and bool((count > 0).all())
    assert model.config.pad_token_id == tok.pad_token_id == tok.eos_token_id


def test_all_linear_adapts_every_linear_layer_but_the_head(tiny_loaded, tmp_path):
    """``lora.target_modules=[all-linear]`` (PEFT's shorthand) adapts every linear layer (GPT-2's
    Conv1D too) but the output head, on causal and encoder-decoder models; the saved adapter
    config names the layers it adapted; mixed with names it is refused in one line."""
    from peft.tuners.lora import LoraLayer

    from surecl.adapters import FAST, DualLoRA, adaptable_layers, names_layer
    from surecl.config import DualConfig, LoraConfig

    tok = tiny_loaded.tokenizer
    for family, seq2seq in (("llama", False), ("gpt2", False), ("t5", True)):
        model = copy.deepcopy(tiny_loaded.model) if family == "llama" else build(family, tok)
        head = model.get_output_embeddings()
        names = [n for n, _ in adaptable_layers(model)]
        expected = {n for n, m in adaptable_layers(model) if m is not head}
        assert len(expected) >= 4 and len(expected) == len(adaptable_layers(model)) - 1, family
        dl = DualLoRA(model, LoraConfig(target_modules=["all-linear"]), DualConfig(), is_seq2seq=seq2seq)
        adapted = {n.removeprefix("base_model.model.") for n, m in dl.model.named_modules() if isinstance(m, LoraLayer)}
        assert adapted == expected, family
        dl.model.save_pretrained(tmp_path / family, selected_adapters=[FAST])
        saved = json.loads(next((tmp_path / family).rglob("adapter_config.json")).read_text())
        # PEFT may save the shortest names that pick the same layers (T5's q, k, v, o, wi, wo)
        assert {n for n in names if any(names_layer(n, t) for t in saved["target_modules"])} == expected, family
    with pytest.raises(SureclError, match=r"^lora.target_modules: \['all-linear', 'q_proj'\] mixes all-linear"):
        build_config("tiny,seq_lora", ["lora.target_modules=[all-linear,q_proj]"])


def test_all_linear_trains_from_the_cli_and_dry_run(tmp_path, tiny_cache, tiny_loaded, monkeypatch, capsys):
    """A run with ``lora.target_modules=all-linear`` trains the MLP's adapters too (their LoRA B
    leaves zero), and a dry run on a model folder counts the layers it will adapt."""
    from safetensors.torch import load_file

    from surecl.cli import main

    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    out = tmp_path / "out"
    code = main(["run", "--config", "tiny,seq_lora", *SMALL, "lora.target_modules=all-linear", "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    weights = load_file(out / "adapters" / "fast" / "adapter_model.safetensors")
    down = [v for k, v in weights.items() if "down_proj.lora_B" in k]
    assert down and all(v.abs().sum() > 0 for v in down)
    assert not any("lm_head" in k for k in weights)
    folder = tmp_path / "gpt2"
    build("gpt2", tiny_loaded.tokenizer).save_pretrained(folder)
    tiny_loaded.tokenizer.save_pretrained(folder)
    capsys.readouterr()
    assert main(["run", "--config", "tiny,seq_lora", f"model.name={folder}", "lora.target_modules=all-linear", "--dry-run"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("model: "))
    assert line.endswith("LoRA on all-linear x8"), line  # c_attn, c_proj, c_fc, mlp c_proj in each of 2 layers


def test_ranking_a_label_longer_than_every_row_s_answer_is_checked_against_the_positions(tiny_loaded, tmp_path, tiny_cache):
    """Under eval.mode=rank each test prompt is read with every label's answer: a label no test
    row carries, longer than their answers, ran past GPT-2's learned positions with an
    IndexError at the first evaluation (after the run folder was written). The check now counts
    the longest label; a model with exactly those positions runs."""
    import dataclasses

    tok = copy.deepcopy(tiny_loaded.tokenizer)
    colors = tiny_stream(n_train=8, n_test=4)[0]
    long_label = "warm cool warm cool warm cool warm"
    task = dataclasses.replace(colors, labels=[*colors.labels, long_label])
    cfg = build_config("tiny,seq_lora", ["train.epochs=1", "eval.before=false", "eval.mode=rank", "lora.target_modules=[c_attn]"])
    enc = TaskEncoder(tok, cfg.model.max_length)
    option = max(len(enc.answer_ids(lab)) for lab in task.labels)
    rows = enc.encode(task, task.test)
    own = max(len(e.prompt) + len(e.answer) + 1 for e in [*rows, *enc.encode(task, task.train)])
    ranked = max(len(e.prompt) + option for e in rows)
    assert ranked > own  # the case: only ranking reads that far

    def build_run(positions, out):
        return ContinualRun(cfg, tmp_path / out, progress=False, model=build("gpt2", tok, n_positions=positions),
                            tokenizer=tok, tasks=[task], cache_dir=tiny_cache)

    with pytest.raises(SureclError, match=rf"^task colors: rows of up to {ranked} tokens \(prompt, then the answer and one generated "
                                          rf"token, or the longest label's {option} answer tokens ranking reads\) do not fit the "
                                          rf"model's {ranked - 1} positions; lower model.max_length"):
        build_run(ranked - 1, "short")
    assert not (tmp_path / "short").exists()
    res = build_run(ranked, "fits").run()
    assert res["accuracy_matrix"][0][0] is not None
