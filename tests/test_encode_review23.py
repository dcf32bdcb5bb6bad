"""Chat-template rows of generation tasks: a template that writes no end of turn, an end of turn
read from the task's own conversations, a long conversation's opening kept, and a prompt cut
through a byte-level tokenizer on a whole character."""

from __future__ import annotations

import copy
import logging

import pytest
from test_generation import CONVERSATION, chatml_tokenizer, ids

from surecl.data.encode import TaskEncoder
from surecl.data.task import Example, Task

# ----------------------------------------------------------------------------- 1: no end of turn

# Falcon-instruct's shape: nothing after an assistant's content; and "role: content\n", whitespace alone
NOTHING_AFTER = ("{% for m in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}{{ m['role'] }} {{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '\\n' }}assistant{% endif %}")
NEWLINE_AFTER = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant{% endif %}"


@pytest.mark.parametrize("template", [NOTHING_AFTER, NEWLINE_AFTER], ids=["nothing", "newline"])
def test_a_template_without_an_end_of_turn_ends_each_assistant_turn_with_eos(template):
    """A template that writes nothing but whitespace after an assistant's content gets the EOS
    token after each assistant turn (scored, as a plain answer's EOS is), and generation stops
    at it; an answer without it never stopped (every answer ran to max_new_tokens)."""
    tok = chatml_tokenizer()
    tok.chat_template = template
    eos = tok.eos_token_id
    task = Task("chat", "", [], [Example("bye ?", "see you", CONVERSATION)], [Example("bye ?", "see you", CONVERSATION)], kind="generate")
    enc = TaskEncoder(tok, max_length=64)
    [train] = enc.encode(task, task.train)
    [test] = enc.encode(task, task.test, split="test")
    assert train.answer == ids(tok, "hello <eos> user bye ? assistant see you <eos>")
    assert train.mask == [1, 1, 0, 0, 0, 0, 1, 1, 1]
    assert test.answer == ids(tok, "see you <eos>") and test.prompt == train.prompt + train.answer[:6]
    assert enc.stop_ids() == [eos]
    # a prompt / response row through the template too
    qa = Task("qa", "", [], [Example("hi", "hello")], [Example("hi", "hello")], kind="generate")
    [row] = enc.encode(qa, qa.test, split="test")
    assert row.prompt == ids(tok, "user hi assistant") and row.answer == ids(tok, "hello <eos>")
    # a template with an end of turn is as it was: no EOS added, that token stops
    chatml = chatml_tokenizer()
    own = TaskEncoder(chatml, max_length=64)
    [test] = own.encode(task, task.test, split="test")
    assert test.answer == ids(chatml, "see you <|im_end|>")
    assert own.stop_ids() == [eos, chatml.convert_tokens_to_ids("<|im_end|>")]


def test_a_run_through_a_template_without_an_end_of_turn_stops_its_answers(tmp_path, tiny_cache, tiny_loaded):
    """End to end on the tiny model: answers through such a template are learned and stop after
    the target (they ran on to max_new_tokens, "cool cool" for "cool": exact match 0)."""
    import json

    from surecl.config import build_config
    from surecl.data.tiny import tiny_generation_stream
    from surecl.trainer import run

    tok = copy.deepcopy(tiny_loaded.tokenizer)
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'assistant' %} {{ m['content'] }}{% else %}{{ m['content'] }} "
                         "Answer :{% endif %}{% endfor %}")
    t = tiny_generation_stream(n_train=48, n_test=16)[0]
    task = Task(t.name, "", [], t.train, t.test, kind="generate", metric="exact_match")
    cfg = build_config("tiny,seq_lora", ["data.benchmark=none", "train.epochs=10"])
    results = run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache, model=copy.deepcopy(tiny_loaded.model), tokenizer=tok,
                  tasks=[task])
    rows = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert rows and all(len(r["prediction"].split()) == 1 for r in rows), [r["prediction"] for r in rows]
    assert results["accuracy_matrix"][0][0] >= 90


# ----------------------------------------------------------------------------- 2: the end of turn from the task's rows

SYSTEM_FIRST = ("{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system turn must come first') }}{% endif %}"
                "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")


def test_the_end_of_turn_is_read_from_the_tasks_own_conversations(caplog):
    """A template that refuses a conversation without a system turn still stops at its
    end-of-turn token, read from the rows it encoded (a fixed one-turn probe it refuses made
    generation stop at EOS alone, silently); one it can read neither way says so in one line."""
    tok = chatml_tokenizer()
    tok.chat_template = SYSTEM_FIRST
    task = Task("chat", "", [], [Example("bye ?", "see you", CONVERSATION)], [Example("bye ?", "see you", CONVERSATION)], kind="generate")
    enc = TaskEncoder(tok, max_length=64)
    [test] = enc.encode(task, task.test, split="test")
    assert test.answer == ids(tok, "see you <|im_end|>")
    assert enc.stop_ids() == [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]
    # a template that also rewrites the content (no marker comes out): EOS alone, said once
    hidden = copy.deepcopy(tok)
    hidden.chat_template = SYSTEM_FIRST.replace("{{ m['content'] }}", "{{ m['content'] | replace('\u2063', '') }}")
    enc = TaskEncoder(hidden, max_length=64)
    enc.encode(task, task.test, split="test")
    with caplog.at_level(logging.WARNING, logger="surecl"):
        assert enc.stop_ids() == [tok.eos_token_id]
    said = [r.getMessage() for r in caplog.records if "end of turn could not be read" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0]


# ----------------------------------------------------------------------------- 3: a long conversation keeps its opening

LONG_WORDS = ("Answer", ":", "say", "only", "red", "blue")


def test_a_long_conversation_keeps_its_opening_and_last_turns():
    """A conversation longer than max_length keeps the template's start (a system turn) and its
    first user turn up to the end of the task's instruction, and its last tokens; the middle is
    cut. It was cut from its start, losing the instruction, while the run said it was kept."""
    tok = chatml_tokenizer(LONG_WORDS)
    turns = [("system", "be short")]
    for _ in range(6):
        turns += [("user", "hi hi hi ?"), ("assistant", "hello")]
    turns += [("user", "bye ?"), ("assistant", "see you")]
    task = Task("chat", "say only red ", [], [Example("bye ?", "see you", tuple(turns))], [Example("bye ?", "see you", tuple(turns))],
                kind="generate")
    enc = TaskEncoder(tok, max_length=32)
    [test] = enc.encode(task, task.test, split="test")
    opening = ids(tok, "<|im_start|> system be short <|im_end|> <|im_start|> user say only red")
    assert test.prompt[: len(opening)] == opening
    assert test.prompt[-7:] == ids(tok, "<|im_start|> user bye ? <|im_end|> <|im_start|> assistant")
    assert test.answer == ids(tok, "see you <|im_end|>") and len(test) == 32
    assert enc.sentence_cut == {("chat", "test"): (1, 1)} and enc.start_cut == {}
    # an opening over half the room the answer leaves: the last tokens alone, counted apart
    small = TaskEncoder(tok, max_length=20)
    [test] = small.encode(task, task.test, split="test")
    assert test.prompt[-7:] == ids(tok, "<|im_start|> user bye ? <|im_end|> <|im_start|> assistant") and len(test) == 20
    assert small.sentence_cut == {("chat", "test"): (1, 1)} and small.start_cut == {("chat", "test"): (1, 1)}


def test_the_run_says_truly_what_a_cut_conversation_keeps(tmp_path, tiny_cache, tiny_loaded, caplog):
    """The run's line for cut inputs says a conversation keeps its opening and last turns (it
    said "a conversation's last turns; instruction ... kept", untrue); conversations that lose
    their opening are a warning of their own."""
    from surecl.config import build_config
    from surecl.trainer import ContinualRun

    tok = chatml_tokenizer(LONG_WORDS)
    turns = []
    for _ in range(6):
        turns += [("user", "hi hi hi ?"), ("assistant", "hello")]
    turns += [("user", "bye ?"), ("assistant", "see you")]
    rows = [Example("bye ?", "see you", tuple(turns))] * 2
    short = Task("short", "say ", [], rows, rows, kind="generate")
    long = Task("long", "say only red " * 3, [], rows, rows, kind="generate")
    cfg = build_config("tiny,seq_lora", ["data.benchmark=none", "model.max_length=24"])
    with caplog.at_level("INFO", logger="surecl"):
        ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache, model=copy.deepcopy(tiny_loaded.model), tokenizer=tok,
                     tasks=[short, long])
    said = [r.getMessage() for r in caplog.records if "max_length=24" in r.getMessage()]
    kept = [m for m in said if m.startswith("task short: 2 of 2 test inputs are cut")]
    assert kept and "a conversation's opening, the template's start and the instruction, and its last turns" in kept[0], said
    lost = [m for m in said if m.startswith("task long: 2 of 2 test conversations are cut to their last turns")]
    assert lost and not any(m.startswith("task long: ") and "instruction and answer are kept" in m for m in said), said
    assert [r.levelno for r in caplog.records if r.getMessage() in lost] == [logging.WARNING]


# ----------------------------------------------------------------------------- 4: a byte-level cut on a whole character


def byte_level_tokenizer():
    """A byte-level BPE (GPT-2's byte alphabet) trained in memory on a few merges: most CJK
    characters and emoji stay several byte tokens each."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<eos>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(["user assistant system", "天气 雨水 问题", "hello 🙂 world"] * 4, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                  additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tok


def test_a_byte_level_cut_ends_on_a_whole_character():
    """A prompt / response row cut through a byte-level tokenizer keeps a whole-character start
    of its input: the cut text is re-tokenised, and one cut inside a multi-byte character ended
    in U+FFFD, a character the data does not hold."""
    tok = byte_level_tokenizer()
    sentence = "这是一个很长的问题🙂，关于天气和🌧️雨水的变化。" * 6
    task = Task("zh", "请回答。\n", [], [Example(sentence, "好的🙂")], [Example(sentence, "好的🙂")], kind="generate")
    assert any(tok.decode(tok(sentence[:k], add_special_tokens=False)["input_ids"][:-1]).endswith("\ufffd") for k in range(1, 12))
    seen = 0
    for max_length in range(60, 110, 3):
        enc = TaskEncoder(tok, max_length=max_length)
        for split in ("train", "test"):
            [row] = enc.encode(task, getattr(task, split), split)
            text = tok.decode(row.prompt)
            assert "\ufffd" not in text, (max_length, split, text)
            kept = text.split("请回答。\n", 1)[1].split("<|im_end|>", 1)[0]
            assert kept and sentence.startswith(kept), (max_length, kept)
            seen += enc.sentence_cut.get(("zh", split), (0, 0))[0]
    assert seen > 10  # the inputs were cut
