"""Generation tasks (issue 28): readers, chat rendering with assistant-only loss, ROUGE-L and
exact match, FWT, surprise on generation targets, and a tiny generation stream that learns and
that SeqLoRA forgets."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from surecl.cli import main
from surecl.config import build_config
from surecl.data.encode import Encoded, TaskEncoder, collate
from surecl.data.jsonl import load_jsonl_task
from surecl.data.task import Example, Task
from surecl.data.tiny import tiny_generation_stream
from surecl.errors import SureclError
from surecl.evaluate import exact_match, normalise_answer, rouge_l
from surecl.metrics import forward_transfer, summarise
from surecl.nll import token_nll
from surecl.replay.surprise import score_examples


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


# ----------------------------------------------------------------------------- readers


def test_prompt_response_and_alpaca_rows(tmp_path):
    f = write_jsonl(tmp_path / "qa.jsonl", [
        {"task": "qa", "kind": "generate", "metric": "exact_match", "instruction": "Answer briefly.\n"},
        {"prompt": "Capital of France?", "response": "Paris"},
        {"instruction": "Rewrite politely.", "input": "give me that", "output": "Could you give me that, please?"},
        {"instruction": "Say hi.", "output": "hi", "split": "test"},
        {"prompt": "2+2?", "completion": "4", "split": "test"},
    ])
    task = load_jsonl_task(f)  # data.kind=classify: the header makes it a generation task
    assert task.kind == "generate" and task.labels == [] and task.score_metric == "exact_match"
    assert task.instruction == "Answer briefly.\n"
    assert task.train == [Example("Capital of France?", "Paris"), Example("Rewrite politely.\n\ngive me that", "Could you give me that, please?")]
    assert task.test == [Example("Say hi.", "hi"), Example("2+2?", "4")]
    # without a header, data.kind=generate reads the same rows; the metric defaults to ROUGE-L
    g = write_jsonl(tmp_path / "plain.jsonl", [{"prompt": "a", "response": "b"}, {"prompt": "c", "response": "d", "split": "test"}])
    plain = load_jsonl_task(g, kind="generate")
    assert plain.name == "plain" and plain.kind == "generate" and plain.score_metric == "rouge_l"


def test_chat_rows(tmp_path):
    turns = [{"role": "system", "content": "Be short."}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
             {"role": "user", "content": "bye?"}, {"role": "assistant", "content": "bye"}]
    f = write_jsonl(tmp_path / "chat.jsonl", [{"messages": turns}, {"messages": turns[1:3], "split": "test"}])
    task = load_jsonl_task(f, kind="generate")
    ex = task.train[0]
    assert ex.label == "bye" and ex.sentence == "bye?"
    assert ex.messages == tuple((t["role"], t["content"]) for t in turns)
    assert task.test[0].label == "hello"
    # a conversation's turns are part of the data's fingerprint
    other = copy.deepcopy(task)
    other.train = [Example(ex.sentence, ex.label, ex.messages[:1] + (("user", "hey"),) + ex.messages[2:])]
    assert other.fingerprint() != task.fingerprint()


def test_hf_columns_as_a_generation_task(tmp_path, monkeypatch):
    """data.hf with data.kind=generate: text_column is the prompt, label_column the target text."""
    datasets = pytest.importorskip("datasets")
    from surecl.config import HFTaskConfig
    from surecl.data.hf import load_hf_task

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    datasets.disable_progress_bars()
    rows = {"question": ["q1", "q2", "q3"], "answer": ["a one", "a two", "a three"]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict(rows)}).save_to_disk(tmp_path / "qa")
    spec = HFTaskConfig(path=str(tmp_path / "qa"), text_column="question", label_column="answer", metric="exact_match")
    task = load_hf_task(spec, "data.hf[0]", kind="generate")
    assert task.kind == "generate" and task.labels == [] and task.score_metric == "exact_match" and task.instruction == ""
    assert task.train[1] == Example("q2", "a two")
    numbers = {"question": ["q1"], "answer": [3]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(numbers), "test": datasets.Dataset.from_dict(numbers)}).save_to_disk(tmp_path / "n")
    with pytest.raises(SureclError, match=r"data.hf\[0\].label_column: .* a generation target must be text"):
        load_hf_task(HFTaskConfig(path=str(tmp_path / "n"), text_column="question", label_column="answer"), "data.hf[0]", kind="generate")


MALFORMED = {
    "missing target": ({"prompt": "q"}, ["missing target 'response'"]),
    "missing alpaca output": ({"instruction": "q", "input": "x"}, ["missing target 'output'"]),
    "empty target": ({"prompt": "q", "response": "  "}, ["empty target"]),
    "empty messages": ({"messages": []}, ["'messages' must be a non-empty list"]),
    "no assistant turn": ({"messages": [{"role": "user", "content": "hi"}]}, ["no assistant turn"]),
    "ends with the user": ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                          {"role": "user", "content": "c"}]}, ["last turn is 'user'"]),
    "turn without content": ({"messages": [{"role": "user"}, {"role": "assistant", "content": "b"}]}, ["message 0", "'content'"]),
    "neither form": ({"question": "q", "answer": "a"}, ["'prompt' and 'response'", "'messages'"]),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_row_is_one_line_naming_file_and_row(case, tmp_path, capsys, monkeypatch):
    row, words = MALFORMED[case]
    f = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "fine", "response": "ok"}, row, {"prompt": "t", "response": "u", "split": "test"}])
    with pytest.raises(SureclError) as err:
        load_jsonl_task(f, kind="generate")
    assert f"{f} line 2" in str(err.value) and "\n" not in str(err.value)
    for word in words:
        assert word in str(err.value)
    # through the CLI: one line, exit 2, no traceback
    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    code = main(["run", "--config", "tiny", "--out", str(tmp_path / "out"), "--quiet", "data.benchmark=none", "data.kind=generate",
                 f"data.jsonl=[{f}]"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("surecl: error: ") and f"{f} line 2" in lines[0]


def test_generation_config_refusals():
    with pytest.raises(SureclError, match="replay.balance"):
        build_config("tiny,surprise", ["data.kind=generate", "replay.balance=label"])
    with pytest.raises(SureclError, match="eval.max_new_cap"):
        build_config("tiny", ["data.kind=generate", "eval.max_new_cap=0"])
    with pytest.raises(SureclError, match="data.template"):
        build_config("tiny", ["data.kind=generate", "data.template=chatml"])
    bad = Task("t", "", [], [Example("p", "y")], [Example("p", "y")], kind="generate", metric="accuracy")
    with pytest.raises(SureclError, match="metric 'accuracy' does not fit a generate task"):
        bad.check()


def test_online_label_quota_refused_on_generation_tasks(tmp_path, tiny_cache):
    from surecl.trainer import ContinualRun

    cfg = build_config("tiny,online_surprise", ["data.kind=generate", "data.tasks=[colors]", "data.n_train=4", "data.n_test=2"])
    with pytest.raises(SureclError, match="online_surprise.*colors generate free text"):
        ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)


# ----------------------------------------------------------------------------- chat template, token by token

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


@pytest.fixture(scope="module")
def chat_tok():
    return chatml_tokenizer()


def chatml_tokenizer(extra: tuple[str, ...] = ()):
    """A word-level tokenizer with ChatML's turn markers as special tokens and a ChatML-like
    template; ``extra``: more words, after the fixed ones (whose ids stay)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<unk>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant",
             "be", "short", "hi", "hello", "bye", "?", "see", "you", *extra]
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                  additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = CHATML
    return tok


def ids(tok, words: str) -> list[int]:
    return [tok.convert_tokens_to_ids(w) for w in words.split()]


CONVERSATION = (("system", "be short"), ("user", "hi"), ("assistant", "hello"), ("user", "bye ?"), ("assistant", "see you"))


def test_chat_rows_render_with_the_template_and_score_only_assistant_tokens(chat_tok):
    task = Task("chat", "", [], [Example("bye ?", "see you", CONVERSATION)], [Example("bye ?", "see you", CONVERSATION)], kind="generate")
    task.check()
    enc = TaskEncoder(chat_tok, max_length=64)
    [train] = enc.encode(task, task.train)
    [test] = enc.encode(task, task.test, split="test")
    # training: the prompt is everything before the first assistant turn; the "answer" runs to the
    # end, scored only on the assistant turns (content + the template's end of turn)
    assert train.prompt == ids(chat_tok, "<|im_start|> system be short <|im_end|> <|im_start|> user hi <|im_end|> <|im_start|> assistant")
    assert train.answer == ids(chat_tok, "hello <|im_end|> <|im_start|> user bye ? <|im_end|> <|im_start|> assistant see you <|im_end|>")
    assert train.mask == [1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1]
    assert train.scored == 5 and train.label == "see you"
    # the same tokens as the template renders the whole conversation at once
    whole = chat_tok.apply_chat_template([{"role": r, "content": c} for r, c in CONVERSATION], tokenize=False)
    assert train.prompt + train.answer == chat_tok(whole, add_special_tokens=False)["input_ids"]
    # test: the last turn's generation prompt, the last turn as the answer
    assert test.prompt == train.prompt + train.answer[:9]
    assert test.answer == ids(chat_tok, "see you <|im_end|>") and test.mask is None
    # generation stops at EOS or the template's end of turn
    assert enc.stop_ids() == [chat_tok.eos_token_id, chat_tok.convert_tokens_to_ids("<|im_end|>")]
    # prompt/response rows go through the template too (data.template=auto) unless plain
    qa = Task("qa", "", [], [Example("hi", "hello")], [Example("hi", "hello")], kind="generate")
    [row] = enc.encode(qa, qa.train)
    assert row.prompt == ids(chat_tok, "<|im_start|> user hi <|im_end|> <|im_start|> assistant")
    assert row.answer == ids(chat_tok, "hello <|im_end|>") and row.mask is None
    [plain] = TaskEncoder(chat_tok, max_length=64, template="plain").encode(qa, qa.train)
    assert plain.answer[-1] == chat_tok.eos_token_id and "<|im_start|>" not in chat_tok.convert_ids_to_tokens(plain.prompt)


def test_a_long_chat_prompt_is_cut_in_its_input_and_counted(chat_tok):
    """A prompt / response row too long for max_length through the chat template keeps the
    template's start and the instruction, its input is cut at the end (as the plain template
    cuts it) and the row is counted; a conversation too long loses its first turns, counted too."""
    long = " ".join(["hi"] * 30)
    task = Task("qa", "be short ", [], [Example(long, "hello"), Example("hi", "hello")], [Example(long, "hello")], kind="generate")
    enc = TaskEncoder(chat_tok, max_length=16)
    cut, whole = enc.encode(task, task.train)
    assert cut.prompt == ids(chat_tok, "<|im_start|> user be short " + "hi " * 6 + "<|im_end|> <|im_start|> assistant")
    assert cut.answer == ids(chat_tok, "hello <|im_end|>") and len(cut.prompt) + len(cut.answer) <= 16
    assert whole.prompt == ids(chat_tok, "<|im_start|> user be short hi <|im_end|> <|im_start|> assistant")
    assert enc.sentence_cut == {("qa", "train"): (1, 2)} and enc.cut == {}
    chat = Task("chat", "", [], [Example("bye ?", "see you", CONVERSATION)], [Example("bye ?", "see you", CONVERSATION)], kind="generate")
    [test] = enc.encode(chat, chat.test, split="test")
    assert test.prompt[-3:] == ids(chat_tok, "<|im_end|> <|im_start|> assistant") and len(test.prompt) + len(test.answer) <= 16
    assert enc.sentence_cut[("chat", "test")] == (1, 1)


def test_a_templates_lead_in_before_the_answer_is_prompt_not_answer(chat_tok):
    """A template that writes text before an assistant turn's content (Qwen3 puts an empty
    think block there) keeps it on the prompt side: a model answering perfectly generates the
    content alone, which scores as the target (it once scored exact match 0)."""
    import copy

    tok = copy.deepcopy(chat_tok)
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {% if m['role'] == 'assistant' %}bye ? bye {% endif %}"
                         "{{ m['content'] }}<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")
    task = Task("chat", "", [], [Example("bye ?", "see you", CONVERSATION)], [Example("bye ?", "see you", CONVERSATION)], kind="generate")
    enc = TaskEncoder(tok, max_length=64)
    [test] = enc.encode(task, task.test, split="test")
    assert test.answer == ids(tok, "see you <|im_end|>")
    assert test.prompt[-4:] == ids(tok, "assistant bye ? bye")
    [train] = enc.encode(task, task.train)
    assert train.prompt[-4:] == ids(tok, "assistant bye ? bye") and train.answer[:2] == ids(tok, "hello <|im_end|>")
    scored = [t for t, m in zip(train.answer, train.mask) if m]
    assert scored == ids(tok, "hello <|im_end|> see you <|im_end|>")  # the second turn's lead-in is read, not trained
    whole = tok.apply_chat_template([{"role": r, "content": c} for r, c in CONVERSATION], tokenize=False)
    assert train.prompt + train.answer == tok(whole, add_special_tokens=False)["input_ids"]
    assert enc.stop_ids() == [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]
    # a content whose text also occurs in the lead-in ("bye") is still cut where the content begins
    said = (("user", "hi"), ("assistant", "bye"))
    [row] = enc.encode(Task("c", "", [], [Example("hi", "bye", said)], [Example("hi", "bye", said)], kind="generate"),
                       [Example("hi", "bye", said)], split="test")
    assert row.answer == ids(tok, "bye <|im_end|>") and row.prompt[-4:] == ids(tok, "assistant bye ? bye")


def test_masked_answer_nll_counts_assistant_tokens_only(chat_tok, tiny_loaded):
    """token_nll over a chat row's answer (with its mask) equals a plain loop over the
    assistant tokens; the collated mask is right-aligned with the answers."""
    task = Task("chat", "", [], [Example("bye ?", "see you", CONVERSATION), Example("hi", "hello", CONVERSATION[1:3])],
                [Example("hi", "hello", CONVERSATION[1:3])], kind="generate")
    rows = TaskEncoder(chat_tok, max_length=64).encode(task, task.train)
    model = tiny_loaded.model  # its vocabulary is larger than the chat tokenizer's: the ids are valid inputs
    batch = collate(rows, chat_tok.pad_token_id, False)
    assert batch["answer_mask"].shape == (2, 12) and batch["answer_mask"][1].tolist() == [1.0] * 12
    with torch.no_grad():
        nll, count = token_nll(model, batch, scope="label")
        for r, e in enumerate(rows):
            seq = torch.tensor([e.prompt + e.answer])
            logp = torch.log_softmax(model(input_ids=seq).logits[0].float(), -1)
            mask = e.mask or [1] * len(e.answer)
            want = -sum(logp[len(e.prompt) + t - 1, tok].item() for t, (tok, m) in enumerate(zip(e.answer, mask)) if m)
            assert count[r].item() == sum(mask)
            assert nll[r].item() == pytest.approx(want, rel=1e-4, abs=1e-4)


def test_chat_errors_are_one_line(chat_tok, tiny_loaded):
    task = Task("chat", "", [], [Example("hi", "hello", CONVERSATION[1:3])], [Example("hi", "hello", CONVERSATION[1:3])], kind="generate")
    with pytest.raises(SureclError, match="task chat train row 0: a chat row .* needs a tokenizer with a chat template"):
        TaskEncoder(tiny_loaded.tokenizer, max_length=64).encode(task, task.train)
    strict = copy.deepcopy(chat_tok)
    strict.chat_template = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system turn must come first') }}{% endif %}x"
    with pytest.raises(SureclError, match="chat template refuses the conversation .*a system turn must come first") as err:
        TaskEncoder(strict, max_length=64).encode(task, task.train)
    assert "\n" not in str(err.value)
    # a template that renders earlier turns differently once a later one exists, and writes an
    # assistant content twice: neither turn by turn nor each content once, verbatim
    odd = copy.deepcopy(chat_tok)
    odd.chat_template = "{% for m in messages %}{% if loop.last %}{{ m['content'] }} {{ m['content'] }}{% else %}user{% endif %} {% endfor %}"
    with pytest.raises(SureclError, match="does not render the conversation turn by turn"):
        TaskEncoder(odd, max_length=64).encode(task, task.train)


# ----------------------------------------------------------------------------- metrics

PREDICTIONS = ["The cat sat on the mat.", "paris", "Running quickly to the store", "", "a b c d"]
TARGETS = ["the cat is on the mat", "Paris", "ran quick to a store", "nothing", "a b c d"]


def test_rouge_l_is_rouge_scores_and_exact_match_normalises():
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    want = 100 * sum(scorer.score(t, p)["rougeL"].fmeasure for p, t in zip(PREDICTIONS, TARGETS)) / len(TARGETS)
    assert rouge_l(PREDICTIONS, TARGETS) == pytest.approx(want)
    # a hand check of the first pair: LCS "the cat on the mat" = 5 of 6 and 6 words -> F = 5/6
    assert rouge_l(PREDICTIONS[:1], TARGETS[:1]) == pytest.approx(100 * 5 / 6)
    assert normalise_answer("The  Cat, sat!") == "cat sat"
    # punctuation is deleted, as SQuAD's and Super-NaturalInstructions' evaluation scripts do
    assert exact_match(["US", "Washington DC", "email"], ["U.S.", "Washington, D.C.", "e-mail"]) == 100.0
    assert exact_match(PREDICTIONS, TARGETS) == pytest.approx(100 * 2 / 5)  # "paris" and "a b c d" (articles dropped)


def test_exact_match_of_a_target_that_normalises_to_nothing_needs_its_text():
    """A choice letter "A" (or "the", "?!") normalises to nothing, as would an empty answer or
    any punctuation: such a target is compared as written, up to case and whitespace."""
    assert exact_match(["", "The", "B", ": : :", "?"], ["A", "A", "A", "a", "?!"]) == 0.0
    assert exact_match([" a ", "THE", "?!", "A.", "(A)", "a"], ["A", "the", "?!", "A", "A", "A."]) == 100.0
    assert exact_match(["B.", "(B)"], ["B", "B"]) == 100.0  # "A" reads as every other letter does
    assert exact_match(["B", "a cat"], ["B", "cat"]) == 100.0  # targets with words normalise as before


def test_rouge_needs_no_nltk_data(tmp_path, monkeypatch):
    """rouge-score's default tokenizer and Porter stemmer run without any nltk data download."""
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "no-nltk-data")])
    monkeypatch.setenv("NLTK_DATA", str(tmp_path / "no-nltk-data"))
    assert rouge_l(["running dogs"], ["the dog runs"]) > 0


def test_rouge_leaves_the_root_logger_alone(monkeypatch):
    """Building rouge-score's scorer logs through absl, which would give the root logger a
    handler and print every ``surecl`` line twice."""
    import logging

    import surecl.evaluate as ev

    monkeypatch.setattr(ev, "_SCORER", None)
    root = logging.getLogger()
    before = list(root.handlers)
    monkeypatch.setattr(root, "handlers", [])
    rouge_l(["a"], ["a"])
    assert root.handlers == []
    monkeypatch.setattr(root, "handlers", before)


# A hand-worked 3-task matrix: zero-shot row z, the cells above the diagonal from eval.ahead.
Z = [10.0, 20.0, 30.0]
A = [[80.0, 25.0, None], [60.0, 90.0, 45.0], [50.0, 70.0, 85.0]]


def test_fwt_on_a_hand_worked_matrix():
    # FWT = mean(a[0][1] - z[1], a[1][2] - z[2]) = mean(25 - 20, 45 - 30) = 10
    assert forward_transfer(A, Z) == pytest.approx(10.0)
    s = summarise(A, initial=Z)
    assert s["fwt"] == pytest.approx(10.0)
    assert s["fp"] == pytest.approx((50 + 70 + 85) / 3) and s["ap"] == pytest.approx((80 + 90 + 85) / 3)
    assert s["bwt"] == pytest.approx(((50 - 80) + (70 - 90)) / 2)
    # lower is better (perplexity): positive still means the earlier tasks helped
    assert forward_transfer(A, Z, higher_is_better=False) == pytest.approx(-10.0)
    # no zero-shot row, or no cell above the diagonal: not measured
    assert forward_transfer(A, None) is None
    assert forward_transfer([[80.0, None], [60.0, 90.0]], [10.0, 20.0]) is None


def test_the_run_report_words_fwt_as_its_sign_is_taken():
    """report.md says what FWT subtracts from what: for perplexity (sign flipped) the zero-shot
    value minus the value before training, so the sentence and the number agree."""
    from surecl.report import _fwt_lines

    [acc, _] = _fwt_lines({"fwt": 10.0, "metric": "accuracy"}, 2)
    assert acc == "FWT (score on each next task before training it, minus its score before any training): 10.00"
    [ppl, _] = _fwt_lines({"fwt": forward_transfer(A, Z, higher_is_better=False), "metric": "perplexity"}, 2)
    # z[j] - a[j-1][j] = mean(20 - 25, 30 - 45) = -10: the wording names that order
    assert "perplexity before any training, minus its perplexity right before training it" in ppl and ppl.endswith(": -10.00")


# ----------------------------------------------------------------------------- SuRe on generation targets


def loop_nll(model, e: Encoded, scope: str) -> tuple[float, int]:
    """Summed NLL and token count of one example, row by row, no padding, no batching."""
    seq = e.prompt + e.answer
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([seq])).logits[0].float(), -1)
    first = len(e.prompt) if scope == "label" else 1
    mask = (e.mask or [1] * len(e.answer)) if scope == "label" else [1] * (len(seq) - 1)
    terms = [-logp[p - 1, seq[p]].item() for p, m in zip(range(first, len(seq)), mask) if m]
    return sum(terms), len(terms)


@pytest.mark.parametrize("scope", ["label", "sequence"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_surprise_on_generation_targets_equals_a_plain_nll_loop(scope, reduction, tiny_loaded):
    task = tiny_generation_stream(n_train=12, n_test=1, cues=2)[0]
    items = TaskEncoder(tiny_loaded.tokenizer, max_length=64).encode(task, task.train)
    assert all(e.answer[-1] == tiny_loaded.tokenizer.eos_token_id and len(e.answer) == 3 for e in items)  # two words + EOS
    got = score_examples(tiny_loaded.model, items, pad_id=tiny_loaded.tokenizer.pad_token_id, is_seq2seq=False, scope=scope,
                         reduction=reduction, batch_size=5, share_prefix=True)
    for e, g in zip(items, got):
        total, n = loop_nll(tiny_loaded.model, e, scope)
        assert g == pytest.approx(total / n if reduction == "mean" else total, rel=1e-4, abs=1e-4)


def test_long_targets_keep_their_room(tiny_loaded):
    """A target longer than model.max_length leaves keeps at least half of it; the prompt is cut,
    and the encoder counts the cut rows per task and split (what the run warns about)."""
    long = " ".join(["warm"] * 80)
    task = Task("t", "", [], [Example(" ".join(["the"] * 80), long), Example("the", "warm")], [Example("the", "warm")], kind="generate")
    enc = TaskEncoder(tiny_loaded.tokenizer, max_length=64)
    [e, short] = enc.encode(task, task.train)
    assert len(e) <= 64 and len(e.answer) == 32 and e.label == long
    enc.encode(task, task.test, split="test")
    assert enc.cut == {("t", "train"): (1, 2)}


def test_a_cut_test_target_is_scored_against_its_kept_part(tiny_loaded, chat_tok):
    """A generation test row whose target is cut to model.max_length keeps the full target for
    training's train rows but is scored against the kept part (the text of its kept tokens):
    generation stops at that length, so the full target could never be matched. Rows not cut keep
    their label; with a chat template too."""
    for tok, (a, b) in ((tiny_loaded.tokenizer, ("blue", "cat")), (chat_tok, ("see", "you"))):
        long = " ".join([a, b] * 40)
        task = Task("t", "", [], [Example(b, a)], [Example(b, long), Example(b, a)], kind="generate")
        enc = TaskEncoder(tok, max_length=48)
        cut, short = enc.encode(task, task.test, split="test")
        assert enc.cut == {("t", "test"): (1, 2)} and short.label == a
        assert cut.label != long and long.startswith(cut.label) and len(cut.label.split()) >= 5, cut.label
        assert cut.label == tok.decode(cut.answer, skip_special_tokens=True).strip()
        from surecl.evaluate import task_score
        assert task_score("exact_match", [cut.label], [cut.label]) == 100.0  # a model that generates every kept token is right


def test_a_long_conversation_trains_on_its_last_turn_when_all_would_not_fit(chat_tok):
    """Training scores every assistant turn from the first on; when they do not all fit in
    max_length, the last turn (the row's target) is scored with the earlier ones as its prompt,
    rather than cut off the end."""
    first = " ".join(["hello"] * 40)
    turns = (("user", "hi"), ("assistant", first), ("user", "bye ?"), ("assistant", "see you"))
    task = Task("chat", "", [], [Example("bye ?", "see you", turns)], [Example("bye ?", "see you", turns)], kind="generate")
    [row] = TaskEncoder(chat_tok, max_length=32).encode(task, task.train)
    assert row.answer == ids(chat_tok, "see you <|im_end|>") and row.mask is None and len(row) <= 32
    [whole] = TaskEncoder(chat_tok, max_length=128).encode(task, task.train)  # room for every turn: all scored
    assert whole.scored == 40 + 1 + 3


def test_continual_pretraining_texts_cut_to_max_length_are_counted(tiny_loaded):
    task = Task("docs", "", [], [Example(" ".join(["warm"] * 200), ""), Example("short text", "")], [], kind="text")
    enc = TaskEncoder(tiny_loaded.tokenizer, max_length=64)
    long, short = enc.encode(task, task.train)
    assert len(long.answer) == 63 and enc.cut == {("docs", "train"): (1, 2)}


# ----------------------------------------------------------------------------- a tiny generation stream


@pytest.fixture(scope="module")
def learn_forget(tmp_path_factory, tiny_cache):
    from surecl.trainer import run

    out = tmp_path_factory.mktemp("gen") / "run"
    cfg = build_config("tiny,seq_lora", ["data.kind=generate", "data.tasks=[colors,animals]", "data.n_train=64", "data.n_test=16",
                                         "train.epochs=8", "eval.before=true", "eval.ahead=true"])
    return out, run(cfg, out, progress=False, cache_dir=tiny_cache)


def test_tiny_generation_stream_learns_and_seq_lora_forgets(learn_forget):
    """The colors task is learned from ~0 (free generation: no options in the prompt) and,
    trained next on animals without replay, SeqLoRA forgets it. Seeds 0-1 on an AMD EPYC (one
    thread) gave [[100, 0], [0, 87.5-100]] from zero-shot [0, 0]."""
    out, results = learn_forget
    a, z = results["accuracy_matrix"], results["initial"]
    assert results["metric"] == "rouge_l" and results["metrics"] == {"colors": "rouge_l", "animals": "rouge_l"}
    assert z[0] <= 20 and a[0][0] >= 70  # learned: score rises after training its task
    assert a[1][1] >= 60  # the second task too
    assert a[1][0] <= a[0][0] - 50  # forgotten after the next task
    assert results["forgetting"] == pytest.approx(results["ap"] - results["fp"])
    # FWT from the zero-shot row and the cell above the diagonal (eval.ahead)
    assert a[0][1] is not None and results["fwt"] == pytest.approx(a[0][1] - z[1])
    assert results["majority"] == {"colors": None, "animals": None}
    report = (out / "report.md").read_text()
    assert "## Score matrix (ROUGE-L (F, x100))" in report and "FWT" in report
    assert (out / "heatmap.png").stat().st_size > 0
    assert "FP, final performance (ROUGE-L (F, x100)" in (out / "adapters" / "fast" / "README.md").read_text()  # the model card
    saved = json.loads((out / "results.json").read_text())
    assert saved["metrics"] == results["metrics"] and saved["fwt"] == results["fwt"]
    # prompt.json says how a generation task was prompted, cut and scored (not classification's format)
    [entry, _] = json.loads((out / "adapters" / "fast" / "prompt.json").read_text())["tasks"]
    assert entry["chat_template"] is False and "'\\nAnswer:'" in entry["prompt"] and "max_length - len(answer ids)" in entry["truncation"]
    assert entry["answer"] == "' ' + target, then the EOS token" and entry["scoring"].startswith("rouge-score's ROUGE-L")


def test_a_chat_stream_trains_through_the_template(tmp_path, tiny_cache, tiny_loaded):
    """Chat rows end to end on the tiny model, whose tokenizer gets a template made of its own
    words: training (assistant-only loss), the buffer, and evaluation by generation."""
    from surecl.trainer import run

    tok = copy.deepcopy(tiny_loaded.tokenizer)
    tok.chat_template = "{% for m in messages %}{% if m['role'] == 'assistant' %} {{ m['content'] }} <eos>{% else %}{{ m['content'] }} Answer :{% endif %}{% endfor %}"
    rows = tiny_generation_stream(n_train=32, n_test=8)[:2]
    tasks = [Task(t.name, "", [], [Example(e.sentence, e.label, (("user", e.sentence), ("assistant", e.label))) for e in t.train],
                  [Example(e.sentence, e.label, (("user", e.sentence), ("assistant", e.label))) for e in t.test], kind="generate",
                  metric="exact_match") for t in rows]
    cfg = build_config("tiny,surprise", ["data.benchmark=none", "train.epochs=2", "eval.before=true"])
    results = run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache, model=copy.deepcopy(tiny_loaded.model), tokenizer=tok, tasks=tasks)
    assert results["metric"] == "exact_match" and results["buffer"]["size"] > 0
    assert all(v is not None for v in results["accuracy_matrix"][1])


def test_classification_and_generation_in_one_stream_under_rank(tmp_path, tiny_cache, tiny_loaded):
    """A stream that mixes a classification task (answered by ranking its label options,
    eval.mode=rank) with a generation task (free text, generated whatever eval.mode says):
    each column is scored in its own metric, both tasks are learned, the run's metric is
    "mixed" and its report names each task's metric."""
    from surecl.data.tiny import tiny_stream
    from surecl.trainer import run

    classify = tiny_stream(n_train=48, n_test=16)[0]
    generate = tiny_generation_stream(n_train=48, n_test=16)[1]
    assert classify.kind == "classify" and generate.kind == "generate"
    cfg = build_config("tiny,surprise", ["data.benchmark=none", "train.epochs=8", "eval.before=true", "eval.mode=rank"])
    results = run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache, model=copy.deepcopy(tiny_loaded.model),
                  tokenizer=tiny_loaded.tokenizer, tasks=[classify, generate])
    a, z = results["accuracy_matrix"], results["initial"]
    assert results["metric"] == "mixed" and results["metrics"] == {classify.name: "accuracy", generate.name: "rouge_l"}
    assert a[0][0] >= 90 and a[0][0] > z[0] + 20  # ranked over its options: learned
    assert z[1] <= 20 and a[1][1] >= 60  # generated: learned from ~0
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"{classify.name} accuracy (%)" in report and f"{generate.name} ROUGE-L (F, x100)" in report


def test_jsonl_lines_end_at_newlines_only(tmp_path):
    """A string holding U+2028 or U+0085 (json.dumps(ensure_ascii=False) writes them raw) is one
    row, not a broken line; header labels are stripped as row labels are."""
    f = tmp_path / "t.jsonl"
    rows = [{"task": "t", "labels": ["yes ", "no"]}, {"sentence": "first\u2028second\u0085third", "label": "yes"},
            {"sentence": "b", "label": "no", "split": "test"}]
    f.write_text("\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    task = load_jsonl_task(f)
    assert task.labels == ["yes", "no"] and task.train[0].sentence == "first\u2028second\u0085third" and len(task.test) == 1


def test_seq2seq_answers_skip_the_decoder_start_token(tiny_loaded):
    """An encoder-decoder's ``generate`` returns the decoder start token first: pad on T5, but
    EOS on BART and mBART, where cutting at the first stop token would leave every answer empty."""
    from surecl.data.encode import Encoded
    from surecl.evaluate import generate_answers

    tok = tiny_loaded.tokenizer
    word = tok.encode("warm", add_special_tokens=False)

    class StartsWithEos:  # BART's decoder_start_token_id is its EOS
        def generate(self, **kwargs):
            return torch.tensor([[tok.eos_token_id, *word, tok.eos_token_id]])

    item = Encoded(prompt=tok.encode("Warm or cool?", add_special_tokens=False), answer=[*word, tok.eos_token_id], label="warm")
    got = generate_answers(StartsWithEos(), tok, [item], is_seq2seq=True, max_new_tokens=4, batch_size=1, device="cpu",
                           stop_ids=[tok.eos_token_id])
    assert got == [tok.decode(word, skip_special_tokens=True).strip()] and got[0]


def test_classification_sentences_cut_to_max_length_are_counted(tiny_loaded, tmp_path, tiny_cache, caplog):
    """A classification row whose sentence does not fit keeps its instruction, options and
    answer and loses the sentence's end: the encoder counts such rows per task and split, and
    the run says so (once a silent cut)."""
    from surecl.config import build_config
    from surecl.trainer import ContinualRun

    task = Task("t", "Warm or cool? ", ["warm", "cool"], [Example(" ".join(["sun"] * 90), "warm"), Example("ice", "cool")],
                [Example("ice", "cool")])
    enc = TaskEncoder(tiny_loaded.tokenizer, max_length=64)
    long, short = enc.encode(task, task.train)
    assert len(long.prompt) <= 64 and long.answer == enc.answer_ids("warm") and long.prompt[-2:] == short.prompt[-2:]  # "\nAnswer:" kept
    enc.encode(task, task.test, split="test")
    assert enc.sentence_cut == {("t", "train"): (1, 2)} and enc.cut == {}
    cfg = build_config("tiny,seq_lora", ["data.tasks=[colors]", "data.n_train=8", "data.n_test=4", "model.max_length=12"])
    with caplog.at_level("INFO", logger="surecl"):
        ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    said = [r.getMessage() for r in caplog.records if "inputs are cut to fit model.max_length=12" in r.getMessage()]
    assert said and said[0].startswith("task colors: ") and " of 8 train inputs" in said[0], said
    # a plain generation prompt cut to leave its target room is counted the same way
    gen = Task("g", "", [], [Example(" ".join(["the"] * 80), "warm"), Example("the", "warm")], [], kind="generate")
    plain = TaskEncoder(tiny_loaded.tokenizer, max_length=32, template="plain")
    plain.encode(gen, gen.train)
    assert plain.sentence_cut == {("g", "train"): (1, 2)} and plain.cut == {}


QWEN3_LIKE = (
    "{%- set ns = namespace(last=0) %}{%- for m in messages %}{%- if m['role'] == 'user' %}{%- set ns.last = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }} {% if m['role'] == 'assistant' and loop.index0 > ns.last %}be short "
    "{% endif %}{{ m['content'] }}<|im_end|> {% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)
"""Qwen3's way, in ChatML words: an assistant turn after the last user turn gets a lead-in
("be short" for the empty think block), earlier ones lose it once a user turn follows, so a
conversation's rendering does not grow turn by turn."""


def test_a_template_that_rerenders_earlier_turns_marks_them_by_their_content(chat_tok):
    """Multi-turn rows through a Qwen3-like template (earlier assistant turns render without
    the lead-in the last one has): each turn is found where its content stands in the whole
    rendering, trained on its content and end of turn; the rest, the last turn's lead-in
    included, is read only. A template that hides an earlier turn's content is refused in one
    line."""
    import copy

    tok = copy.deepcopy(chat_tok)
    tok.chat_template = QWEN3_LIKE
    task = Task("chat", "", [], [Example("bye ?", "see you", CONVERSATION)], [Example("bye ?", "see you", CONVERSATION)], kind="generate")
    enc = TaskEncoder(tok, max_length=64)
    [train] = enc.encode(task, task.train)
    [test] = enc.encode(task, task.test, split="test")
    whole = tok.apply_chat_template([{"role": r, "content": c} for r, c in CONVERSATION], tokenize=False)
    assert train.prompt + train.answer == tok(whole, add_special_tokens=False)["input_ids"]
    assert train.prompt == ids(tok, "<|im_start|> system be short <|im_end|> <|im_start|> user hi <|im_end|> <|im_start|> assistant")
    assert train.answer == ids(tok, "hello <|im_end|> <|im_start|> user bye ? <|im_end|> <|im_start|> assistant be short see you <|im_end|>")
    assert train.mask == [1, 1] + [0] * 9 + [1, 1, 1]
    assert test.prompt == train.prompt + train.answer[:11] and test.answer == ids(tok, "see you <|im_end|>")
    # one turn renders turn by turn: the lead-in goes with the prompt as before
    qa = Task("qa", "", [], [Example("hi", "hello")], [Example("hi", "hello")], kind="generate")
    [row] = enc.encode(qa, qa.test, split="test")
    assert row.prompt[-3:] == ids(tok, "assistant be short") and row.answer == ids(tok, "hello <|im_end|>")
    hiding = copy.deepcopy(chat_tok)
    hiding.chat_template = QWEN3_LIKE.replace("{{ m['content'] }}", "{% if m['role'] != 'assistant' or loop.index0 > ns.last %}{{ m['content'] }}{% endif %}")
    with pytest.raises(SureclError, match=r"does not render the conversation turn by turn .*nor with each assistant content once, verbatim"):
        TaskEncoder(hiding, max_length=64).encode(task, task.train)
    # a content the template splits (Qwen3 moves text before a think end into its think block)
    splitting = copy.deepcopy(chat_tok)
    splitting.chat_template = QWEN3_LIKE.replace("{{ m['content'] }}", "{{ m['content'].split('?')[-1] }}")
    asked = (("user", "hi"), ("assistant", "bye ? hello"), ("user", "bye ?"), ("assistant", "see you"))
    with pytest.raises(SureclError, match=r"nor with each assistant content once, verbatim"):
        TaskEncoder(splitting, max_length=64).encode(task, [Example("bye ?", "see you", asked)])
    # an end of turn that depends on the turn's place (EOS after a last assistant message only)
    ending = copy.deepcopy(chat_tok)
    ending.chat_template = QWEN3_LIKE.replace(
        "<|im_end|> {% endfor %}", "<|im_end|> {% if loop.last and m['role'] == 'assistant' %}<eos> {% endif %}{% endfor %}")
    with pytest.raises(SureclError, match=r"nor with each assistant turn ending as the last one does"):
        TaskEncoder(ending, max_length=64).encode(task, task.train)


def _trl_template(name: str) -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def test_qwen3s_own_template_marks_its_turns_and_r1s_is_refused(chat_tok):
    """Qwen3's own chat template (as trl ships it): a multi-turn conversation's assistant turns
    are their contents and end of turn, the last turn's empty think block is prompt; a content
    with a think block of its own is not rendered verbatim and is refused. DeepSeek-R1-distill's
    template, whose generation prompt (an open think block) is not what a rendered turn starts
    with, is refused rather than evaluated behind another prompt."""
    import copy

    tok = copy.deepcopy(chat_tok)
    tok.chat_template = _trl_template("qwen3")
    enc = TaskEncoder(tok, max_length=64)
    turns = [("system", "be short"), ("user", "hi"), ("assistant", "hello"), ("user", "bye?"), ("assistant", "see you")]
    pieces = enc.chat_segments(turns, "row")
    assert [t for t, a in pieces if a] == ["hello<|im_end|>\n", "see you<|im_end|>\n"]
    assert "".join(t for t, _ in pieces) == enc.render(turns, False, "row")
    before_last = "".join(t for t, _ in pieces[: [a for _, a in pieces].index(True, 2)])
    assert before_last.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert before_last.startswith(enc.render(turns[:4], True, "row"))
    with pytest.raises(SureclError, match=r"nor with each assistant content once, verbatim"):
        enc.chat_segments([*turns[:4], ("assistant", "<think>\nwhy\n</think>\n\nsee you")], "row")
    r1 = copy.deepcopy(chat_tok)
    r1.chat_template = _trl_template("deepseek_r1_distill")
    with pytest.raises(SureclError, match=r"generation prompt"):
        TaskEncoder(r1, max_length=64).chat_segments(turns[1:], "row")


def test_a_space_before_the_end_of_turn_never_becomes_a_stop_token():
    """A template that writes ' ' + eos after the assistant's content (Llama-2's): the stop ids
    are EOS and the end-of-turn token, never the space token, which would cut every answer at
    its first space."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<unk>", "[INST]", "[/INST]", " ", "hi", "it", "is", "42"]
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s"), behavior="isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                  additional_special_tokens=["[INST]", "[/INST]"])
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
                         "{% else %} {{ m['content'] }} {{ eos_token }}{% endif %}{% endfor %}")
    assert tok.convert_ids_to_tokens(tok(" ", add_special_tokens=False)["input_ids"]) == [" "]
    stops = TaskEncoder(tok, max_length=64).stop_ids()
    assert stops == [tok.eos_token_id], tok.convert_ids_to_tokens(stops)
