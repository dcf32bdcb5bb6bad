"""Evaluation's edges: a sliding-window model's scores do not depend on the batch, forward
transfer without the before-training row is said, and the generation budget is as documented."""

from __future__ import annotations

import ast
import inspect
import logging

import pytest
import torch

from surecl.config import build_config
from surecl.data.encode import TaskEncoder
from surecl.data.tiny import tiny_stream
from surecl.trainer import run

RUN = ["data.tasks=[colors,animals]", "train.epochs=1", "eval.mode=rank"]


@pytest.fixture(scope="module")
def sliding_model(tiny_loaded, tmp_path_factory):
    """A tiny random Mistral with the tiny tokenizer whose 24-token sliding window is shorter
    than a colors prompt (26-30 tokens, 21 of them the task's shared prefix), saved to a folder
    ``model.name`` reads; large weights, so a token moved out of the window changes the scores."""
    from transformers import MistralConfig, MistralForCausalLM

    tok = tiny_loaded.tokenizer
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=24, max_position_embeddings=256, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
    ))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.3)
    folder = tmp_path_factory.mktemp("mistral_sw")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_sliding_window_in_use_reads_each_kind_of_config(tiny_loaded):
    from transformers import Gemma2Config, Gemma3Config, GPT2Config, LlamaConfig, MistralConfig, Phi3Config, Qwen2Config

    from surecl.run_setup import sliding_window_in_use

    assert sliding_window_in_use(MistralConfig(sliding_window=24)) == 24
    assert sliding_window_in_use(MistralConfig(sliding_window=None)) is None  # Mistral v0.2 on: full attention
    assert sliding_window_in_use(Qwen2Config()) is None  # use_sliding_window false
    assert sliding_window_in_use(Qwen2Config(use_sliding_window=True, sliding_window=16, max_window_layers=0, num_hidden_layers=2)) == 16
    assert sliding_window_in_use(Gemma2Config(sliding_window=8)) == 8  # layer_types: sliding and full layers
    assert sliding_window_in_use(Gemma3Config(text_config={"sliding_window": 8})) == 8  # its text model's
    assert sliding_window_in_use(Phi3Config(sliding_window=2047, max_position_embeddings=4096)) == 2047
    # a window no shorter than the positions never cuts a row that fits them
    assert sliding_window_in_use(Phi3Config(sliding_window=262144, max_position_embeddings=131072)) is None
    for config in (LlamaConfig(), GPT2Config(), tiny_loaded.model.config):
        assert sliding_window_in_use(config) is None


def _matrices(res: dict) -> tuple:
    return res["accuracy_matrix"], res["initial"]


def test_a_sliding_window_model_scores_the_same_in_any_batch(sliding_model, tmp_path, tiny_cache, caplog):
    """With a shared prefix each row's left padding would sit between the prefix and the row,
    and transformers places the sliding window by index: a row's scores would depend on its
    batch (the matrices differed between eval.batch_size 1 and 64). The run runs rows whole."""
    caplog.set_level(logging.INFO, logger="surecl")
    res = {}
    for bs in (1, 64):
        cfg = build_config("tiny,seq_lora", RUN + [f"model.name={sliding_model}", "eval.before=true", f"eval.batch_size={bs}"])
        res[bs] = run(cfg, tmp_path / str(bs), progress=False, cache_dir=tiny_cache)
    assert _matrices(res[1]) == _matrices(res[64])
    notes = [r.getMessage() for r in caplog.records if r.name == "surecl" and r.getMessage().startswith("model.share_prefix: off")]
    assert len(notes) == 2 and "sliding window (24 tokens" in notes[0] and "\n" not in notes[0]
    # the same as model.share_prefix=false asks for
    cfg = build_config("tiny,seq_lora", RUN + [f"model.name={sliding_model}", "eval.before=true", "model.share_prefix=false"])
    assert _matrices(run(cfg, tmp_path / "plain", progress=False, cache_dir=tiny_cache)) == _matrices(res[64])
    assert all(v is not None for v in res[64]["initial"]) and res[64]["accuracy_matrix"][1][1] is not None


def test_direct_calls_on_a_sliding_window_model_score_the_same_in_any_batch(sliding_model, tiny_loaded):
    """score_examples and option_logprobs called directly default to share_prefix=True: on a
    sliding-window model they split off the prefix a run would not, and a row's scores moved
    with its batch. They now run such a model's rows whole, as a run does."""
    from transformers import AutoModelForCausalLM

    from surecl.evaluate import option_logprobs
    from surecl.nll import prefix_sharing
    from surecl.replay.surprise import score_examples

    model = AutoModelForCausalLM.from_pretrained(sliding_model).eval()
    tok = tiny_loaded.tokenizer
    assert not prefix_sharing(model) and prefix_sharing(tiny_loaded.model) and not prefix_sharing(tiny_loaded.model, False)
    task = tiny_stream(n_train=16, n_test=8)[0]
    enc = TaskEncoder(tok, 128)
    items = enc.encode(task, task.train)
    scores = {bs: score_examples(model, items, pad_id=tok.pad_token_id, is_seq2seq=False, scope="label", batch_size=bs)
              for bs in (1, 16)}
    assert scores[16] == pytest.approx(scores[1], rel=1e-5, abs=1e-6)
    options = {lab: enc.answer_ids(lab) for lab in task.labels}
    tests = enc.encode(task, task.test, "test")
    ranked = {bs: option_logprobs(model, tests, options, pad_id=tok.pad_token_id, is_seq2seq=False, batch_size=bs, device=None)
              for bs in (1, 8)}
    torch.testing.assert_close(ranked[8], ranked[1], rtol=1e-5, atol=1e-5)


def test_ahead_without_before_warns_that_fwt_stays_null(tmp_path, tiny_cache, caplog):
    """eval.ahead fills the cells above the diagonal on its own (the matrix, report.md), but
    forward transfer also needs the before-training row: the tiny preset has none, so the
    run says fwt stays null; with eval.before it is computed and nothing is said."""
    caplog.set_level(logging.WARNING, logger="surecl")
    res = {}
    for before in (False, True):
        caplog.clear()
        cfg = build_config("tiny,seq_lora", RUN + ["eval.ahead=true", f"eval.before={str(before).lower()}"])
        res[before] = run(cfg, tmp_path / str(before), progress=False, cache_dir=tiny_cache)
        said = [r.getMessage() for r in caplog.records if r.name == "surecl" and "eval.ahead" in r.getMessage()]
        if before:
            assert said == []
        else:
            assert len(said) == 1 and "fwt" in said[0] and "eval.before=true" in said[0] and "\n" not in said[0]
    assert res[False]["accuracy_matrix"][0][1] is not None  # the cell above the diagonal was evaluated
    assert res[False]["fwt"] is None
    assert res[True]["fwt"] is not None
    from surecl.plan import describe

    def dry(before: str) -> list[str]:
        text = describe(build_config("tiny,seq_lora", RUN + ["eval.ahead=true", f"eval.before={before}"]), cache_dir=tiny_cache)
        return [line for line in text.splitlines() if line.startswith("warning: eval.ahead")]

    assert len(dry("false")) == 1 and dry("true") == []  # the dry run says it too


def _field_doc(cls, name: str) -> str:
    """The docstring written under a dataclass field (what the key's help text is)."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    for field, doc in zip(body, body[1:]):
        if isinstance(field, ast.AnnAssign) and field.target.id == name and isinstance(doc, ast.Expr):
            return doc.value.value
    raise AssertionError(f"{cls.__name__}.{name} has no docstring")


def test_max_new_tokens_help_states_the_budget_evaluation_uses(tiny_loaded):
    """A label's answer ends with EOS: the default budget is the label's tokens + 2, as the
    help text says (it said "longest label plus one")."""
    from surecl.run_eval import new_token_budget
    from surecl.sections import EvalConfig

    cfg = build_config("tiny,seq_lora", ["eval.mode=generate"])
    task = tiny_stream()[1]
    encoder = TaskEncoder(tiny_loaded.tokenizer, 64)
    answers = {lab: encoder.answer_ids(lab) for lab in task.labels}
    longest = max(len(tiny_loaded.tokenizer(" " + lab, add_special_tokens=False)["input_ids"]) for lab in task.labels)
    assert new_token_budget(cfg, task, encoder.encode(task, task.test, split="test"), answers) == longest + 2
    doc = " ".join(_field_doc(EvalConfig, "max_new_tokens").split())
    assert "a label's tokens + 2" in doc and "plus one (" not in doc
