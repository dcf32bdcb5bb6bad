"""Instruction data read and prompted as documented: a generation file in a continual
pre-training stream, ``data.task_prefix`` and a header's instruction on generation prompts
(plain and chat), the cut of a long prompt / response row through a chat template, and the
rows a held-out ``data.hf`` source's errors name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict
from test_generation import CHATML, chatml_tokenizer

from surecl.config import build_config
from surecl.data.encode import TaskEncoder
from surecl.data.general import load_general_probe
from surecl.data.jsonl import load_jsonl_task
from surecl.data.loading import load_stream
from surecl.data.task import Example, Task
from surecl.errors import SureclError

SYSTEM_HEADER = (  # SmolLM2's way: a system turn of the template's own where the conversation has none
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system be short<|im_end|> {% endif %}" + CHATML
)


@pytest.fixture(scope="module")
def chat_tok():
    return chatml_tokenizer(("Answer", ":", "say", "Task", "Dataset", "grp", "qa", "Option", ",", "red", "blue"))


def ids(tok, words: str) -> list[int]:
    return [tok.convert_tokens_to_ids(w) for w in words.split()]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


CONVERSATION = [{"role": "system", "content": "be short"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "bye ?"}, {"role": "assistant", "content": "see you"}]


# ----------------------------------------------------------------------------- 1: data.kind=text


def test_a_generation_file_in_a_text_stream_becomes_documents(tmp_path, tiny_cache):
    """``--config cpt`` turns a generation JSONL file into documents (prompt and target, or a
    conversation's turns), as it does the instruct benchmark's tasks; it was refused as rows
    without 'text'."""
    from surecl.plan import describe

    gen = write_jsonl(tmp_path / "gen.jsonl", [
        {"task": "gen", "kind": "generate", "metric": "exact_match", "instruction": "Answer."},
        {"prompt": "red is", "response": "warm"},
        {"instruction": "Name it.", "input": "blue", "output": "cool"},
        {"messages": CONVERSATION, "split": "test"},
    ])
    task = load_jsonl_task(gen, "text")
    assert task.kind == "text" and task.labels == [] and task.instruction == "" and task.score_metric == "perplexity"
    assert [e.sentence for e in task.train] == ["red is\nwarm", "Name it.\n\nblue\ncool"]
    assert [e.sentence for e in task.test] == ["be short\nhi\nhello\nbye ?\nsee you"]
    assert task.fingerprint() == load_jsonl_task(gen, "generate").as_text().fingerprint()
    # the stream as the CLI loads it, and the dry run of the reviewer's command
    [loaded] = load_stream(build_config("tiny,cpt,seq_lora", ["data.benchmark=none", f"data.jsonl=[{gen}]"]))
    assert loaded.kind == "text" and len(loaded.train) == 2 and len(loaded.test) == 1
    plan = describe(build_config("tiny,cpt,seq_lora", ["data.benchmark=none", f"data.jsonl=[{gen}]"]), tiny_cache)
    assert "gen" in plan
    # a generation file that does not declare its kind: one line saying how
    bare = write_jsonl(tmp_path / "bare.jsonl", [{"prompt": "red is", "response": "warm"}, {"prompt": "x", "response": "y", "split": "test"}])
    with pytest.raises(SureclError) as err:
        load_jsonl_task(bare, "text")
    assert "line 1: missing 'text'" in str(err.value) and '{"kind": "generate"}' in str(err.value) and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- 2: data.task_prefix


def test_the_task_prefix_begins_generation_prompts_too(chat_tok):
    """``data.task_prefix`` puts ``Task:<group>\\nDataset:<task>\\n`` before a generation
    prompt as before a classification prompt: ahead of the instruction (plain), or at the start
    of the first user turn (chat template); it was left out of every generation prompt."""
    gen = Task("qa", "say ", [], [Example("hi", "hello")], [Example("hi", "hello")], group="grp", kind="generate")
    cls = Task("qa", "say ", ["red", "blue"], [Example("hi", "red")], [Example("hi", "red")], group="grp")
    prefix = "Task : grp Dataset : qa "
    plain = TaskEncoder(chat_tok, 64, task_prefix=True, template="plain")
    [row] = plain.encode(gen, gen.test, "test")
    assert row.prompt == ids(chat_tok, prefix + "say hi Answer :")
    [labelled] = plain.encode(cls, cls.test, "test")
    assert labelled.prompt[: len(ids(chat_tok, prefix + "say"))] == ids(chat_tok, prefix + "say")
    chat = TaskEncoder(chat_tok, 64, task_prefix=True)
    [row] = chat.encode(gen, gen.test, "test")
    assert row.prompt == ids(chat_tok, f"<|im_start|> user {prefix}say hi <|im_end|> <|im_start|> assistant")
    turns = tuple((m["role"], m["content"]) for m in CONVERSATION)
    conv = Task("qa", "", [], [Example("bye ?", "see you", turns)], [Example("bye ?", "see you", turns)], group="grp", kind="generate")
    [train] = chat.encode(conv, conv.train)
    assert train.prompt == ids(chat_tok, f"<|im_start|> system be short <|im_end|> <|im_start|> user {prefix}hi <|im_end|> "
                                         "<|im_start|> assistant")
    # off (the default): the prompts as they were
    [row] = TaskEncoder(chat_tok, 64).encode(gen, gen.test, "test")
    assert row.prompt == ids(chat_tok, "<|im_start|> user say hi <|im_end|> <|im_start|> assistant")


# ----------------------------------------------------------------------------- 3: a header's instruction on chat rows


def test_a_header_instruction_goes_before_a_conversations_first_user_turn(chat_tok, tmp_path):
    """A header's ``instruction`` is put before every prompt: a chat row's at the start of its
    first user turn (a conversation without one gets a user turn holding it before its first
    assistant turn), as a prompt / response row's single user turn gets it; chat rows dropped it."""
    path = write_jsonl(tmp_path / "chat.jsonl", [
        {"task": "chat", "kind": "generate", "instruction": "say"},
        {"messages": CONVERSATION},
        {"messages": [{"role": "system", "content": "be short"}, {"role": "assistant", "content": "hello"}]},
        {"messages": CONVERSATION, "split": "test"},
    ])
    task = load_jsonl_task(path)
    enc = TaskEncoder(chat_tok, 64)
    first, alone = enc.encode(task, task.train)
    assert first.prompt == ids(chat_tok, "<|im_start|> system be short <|im_end|> <|im_start|> user say hi <|im_end|> <|im_start|> assistant")
    assert alone.prompt == ids(chat_tok, "<|im_start|> system be short <|im_end|> <|im_start|> user say <|im_end|> <|im_start|> assistant")
    [test] = enc.encode(task, task.test, "test")
    assert test.prompt == ids(chat_tok, "<|im_start|> system be short <|im_end|> <|im_start|> user say hi <|im_end|> <|im_start|> "
                                        "assistant hello <|im_end|> <|im_start|> user bye ? <|im_end|> <|im_start|> assistant")
    # the general-ability probe's instruct file: both kinds of row get it
    probe = write_jsonl(tmp_path / "probe.jsonl", [
        {"task": "instruct", "kind": "generate", "instruction": "say"},
        {"prompt": "hi", "response": "hello"},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
    ])
    part = load_general_probe(str(probe), 0).tasks[0]
    want = ids(chat_tok, "<|im_start|> user say hi <|im_end|> <|im_start|> assistant")
    assert [e.prompt for e in enc.encode(part, part.test, "test")] == [want, want]


# ----------------------------------------------------------------------------- 4: a long prompt / response row


def test_a_long_prompt_response_row_keeps_the_template_start_and_an_input_token(chat_tok):
    """A prompt / response row that does not fit ``max_length`` through a chat template keeps
    the template's start (its system header) and the instruction whole and at least one input
    token; the target gives way (below ``max_length // 2`` where it must). It lost its whole
    input and then the template's start."""
    import copy

    tok = copy.deepcopy(chat_tok)
    tok.chat_template = SYSTEM_HEADER
    long = " ".join(["see you"] * 20)
    task = Task("qa", "say ", [], [Example("hi", long), Example(" ".join(["hi"] * 30), long)], [Example("hi", long)], kind="generate")
    enc = TaskEncoder(tok, 16)
    short_in, long_in = enc.encode(task, task.train)
    head = "<|im_start|> system be short <|im_end|> <|im_start|> user say"
    tail = "<|im_end|> <|im_start|> assistant"
    for row in (short_in, long_in):
        assert row.prompt == ids(tok, f"{head} hi {tail}")  # 12 tokens: the start, the instruction and one input token
        assert row.answer == ids(tok, long)[:4] and len(row) == 16
    assert enc.cut == {("qa", "train"): (2, 2)} and enc.sentence_cut == {("qa", "train"): (1, 2)}
    [test] = enc.encode(task, task.test, "test")
    assert test.prompt == ids(tok, f"{head} hi {tail}") and test.label == "see you see you"
    # a start and instruction longer than max_length: kept whole, one answer token (the row runs over)
    [over] = TaskEncoder(tok, 8).encode(task, task.test, "test")
    assert over.prompt == ids(tok, f"{head} hi {tail}") and over.answer == ids(tok, "see")
    # a row that fits is as it was
    [fits] = TaskEncoder(tok, 64).encode(task, [Example("hi", "hello")])
    assert fits.prompt == ids(tok, f"{head} hi {tail}") and fits.answer == ids(tok, "hello <|im_end|>")


# ----------------------------------------------------------------------------- 5: held-out data.hf rows


@pytest.mark.parametrize("kind,column,bad,words", [
    ("generate", "label", " ", "empty target"),
    ("classify", "label", "zzz", "label 'zzz' is not in its labels"),
    ("text", "text", " ", "empty text"),
])
def test_a_held_out_sources_errors_name_its_own_row(kind, column, bad, words):
    """With ``test_fraction`` a bad row is named by its place in the source, as without one;
    it was named by its place among the shuffled rows left for training."""
    data = {"text": [f"q{i}" for i in range(10)], "label": ["a"] * 10}
    data[column][9] = bad
    labels = ["a", "b"] if kind == "classify" else None
    for source, fraction in ((Dataset.from_dict(data), 0.3), (DatasetDict(train=Dataset.from_dict(data), test=Dataset.from_dict(data)), 0)):
        with pytest.raises(SureclError) as err:
            Task.from_hf(source, "g", kind=kind, labels=labels, test_fraction=fraction)
        assert f"task g train row 9: {words}" in str(err.value) and "\n" not in str(err.value), fraction


def test_a_held_out_sources_rows_are_still_dropped_on_request():
    """``invalid_labels=drop`` with ``test_fraction``: the check before the hold-out refuses
    nothing, and the row is dropped and counted after it, as before."""
    data = {"text": [f"q{i}" for i in range(10)], "label": ["a", "b"] * 4 + ["a", "zzz"]}
    got = Task.from_hf(Dataset.from_dict(data), "g", labels=["a", "b"], test_fraction=0.3, invalid_labels="drop")
    assert sum(got.meta["dropped"].values()) == 1
    assert sorted(e.sentence for e in got.train + got.test) == [f"q{i}" for i in range(9)]
