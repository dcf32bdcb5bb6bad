"""Edges of encoding and collation: a seq2seq chat row's read-only turns reach the decoder, and
``end_eos`` (``model.encoder_eos``) ends every kind of prompt, inside ``max_length``."""

from __future__ import annotations

import pytest
import torch

from surecl.data.encode import Encoded, TaskEncoder, collate
from surecl.data.task import Example, Task
from surecl.nll import token_nll
from surecl.replay.surprise import as_full_sequence, as_input_reconstruction

# ------------------------------------------------------------------ seq2seq rows with a mask


def _t5(start: int = 0):
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                      pad_token_id=0, eos_token_id=1, decoder_start_token_id=start)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return T5ForConditionalGeneration(config).eval()


CHAT_ROW = Encoded([5, 6, 7, 1], [10, 11, 4, 20, 21, 22, 4, 12, 13, 4], "x", mask=[1, 1, 1, 0, 0, 0, 0, 1, 1, 1])
PLAIN_ROW = Encoded([8, 9, 1], [14, 15, 1], "y")


def _reference_nll(model, e: Encoded) -> tuple[float, int]:
    """The row alone: the decoder reads its whole answer (shifted right, start token first) and
    the NLL is summed over the tokens its mask scores."""
    start = model.config.decoder_start_token_id
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([e.prompt]), decoder_input_ids=torch.tensor([[start] + e.answer[:-1]])).logits[0].float()
    nll = torch.logsumexp(logits, -1) - logits.gather(1, torch.tensor(e.answer)[:, None]).squeeze(1)
    keep = torch.tensor(e.mask if e.mask is not None else [1] * len(e.answer), dtype=torch.float)
    return float((nll * keep).sum()), int(keep.sum())


@pytest.mark.parametrize("start", [0, 3])
def test_a_seq2seq_chat_rows_unscored_turns_are_read_by_the_decoder(start):
    """The user turn between two assistant turns is -100 in labels (not scored) but the decoder
    reads its tokens, not pads (the model's own shift of labels turned them into pads); the
    start token is the model's decoder_start_token_id."""
    model = _t5(start)
    batch = collate([CHAT_ROW], 0, True)
    assert batch["labels"].tolist() == [[10, 11, 4, -100, -100, -100, -100, 12, 13, 4]]
    with torch.no_grad():
        nll, count = token_nll(model, batch, is_seq2seq=True)
    want, n = _reference_nll(model, CHAT_ROW)
    assert count.tolist() == [n] == [6]
    assert nll.item() == pytest.approx(want, rel=1e-5, abs=1e-5)
    from surecl.nll import seq2seq_inputs

    assert seq2seq_inputs(model, batch)["decoder_input_ids"].tolist() == [[start, 10, 11, 4, 20, 21, 22, 4, 12, 13]]
    # what the decoder read before: pads in place of the user turn, another NLL for the same scored tokens
    with torch.no_grad():
        shifted = model(input_ids=batch["input_ids"], labels=batch["labels"]).logits[0].float()
    hidden_turn = (torch.logsumexp(shifted, -1) - shifted.gather(1, batch["labels"][0].clamp(min=0)[:, None]).squeeze(1))
    assert float((hidden_turn * (batch["labels"][0] != -100)).sum()) != pytest.approx(want, rel=1e-4)


def test_a_mixed_seq2seq_batch_scores_each_row_as_alone_and_plain_batches_keep_their_keys():
    """A batch of a chat row and a plain row: each row's NLL is its NLL alone; the plain row's
    decoder input is what the model's own shift of its labels gives. A batch of plain rows has
    the keys it always had (no decoder_targets) and the model shifts its labels itself."""
    model = _t5()
    batch = collate([PLAIN_ROW, CHAT_ROW], 0, True)
    with torch.no_grad():
        nll, count = token_nll(model, batch, is_seq2seq=True)
    for r, e in enumerate([PLAIN_ROW, CHAT_ROW]):
        want, n = _reference_nll(model, e)
        assert int(count[r]) == n and nll[r].item() == pytest.approx(want, rel=1e-5, abs=1e-5), r
    from surecl.nll import seq2seq_inputs

    dec = seq2seq_inputs(model, batch)["decoder_input_ids"]
    assert dec[0].tolist() == model._shift_right(batch["labels"])[0].tolist() == [0, 14, 15, 1, 0, 0, 0, 0, 0, 0]
    plain = collate([PLAIN_ROW, Encoded([8, 1], [14, 1], "z")], 0, True)
    assert list(plain) == ["input_ids", "attention_mask", "labels", "n_answer"] and seq2seq_inputs(model, plain) == {}
    assert list(collate([CHAT_ROW], 0, True, with_answer=False)) == ["input_ids", "attention_mask"]


def test_the_decoder_input_reaches_a_peft_wrapped_model_and_one_without_the_models_shift():
    """Through PEFT's wrapper (what the training step and the scorer call) the model's own shift
    is found; a model without ``prepare_decoder_input_ids_from_labels`` gets the same shift from
    its config."""
    from peft import LoraConfig, get_peft_model

    from surecl.nll import seq2seq_inputs

    model = _t5(3)
    want = seq2seq_inputs(model, collate([PLAIN_ROW, CHAT_ROW], 0, True))["decoder_input_ids"]
    wrapped = get_peft_model(_t5(3), LoraConfig(r=2, target_modules=["q", "v"], task_type="SEQ_2_SEQ_LM"))
    batch = collate([PLAIN_ROW, CHAT_ROW], 0, True)
    assert torch.equal(seq2seq_inputs(wrapped, batch)["decoder_input_ids"], want)

    class Bare:
        config = model.config

    assert torch.equal(seq2seq_inputs(Bare(), batch)["decoder_input_ids"], want)
    with torch.no_grad():
        nll, _ = token_nll(wrapped, batch, is_seq2seq=True)
    assert nll[1].item() == pytest.approx(_reference_nll(model, CHAT_ROW)[0], rel=1e-5, abs=1e-5)  # LoRA's B starts at zero


# ------------------------------------------------------------------ end_eos on every prompt


def test_ilora_reads_a_seq2seq_chat_rows_hidden_states_from_its_whole_answer():
    """I-LoRA's consistency term compares decoder hidden states: they come from the decoder
    reading the row's user turns, as the loss's forward does, not pads."""
    from types import SimpleNamespace

    from surecl.methods.ilora.method import ILoRA

    model = _t5(3)
    batch = collate([CHAT_ROW], 0, True)
    ctx = SimpleNamespace(is_seq2seq=True, model=model)
    with torch.no_grad():
        got = ILoRA.hidden(ILoRA.__new__(ILoRA), ctx, batch)[-1]
        want = model(input_ids=batch["input_ids"], decoder_input_ids=torch.tensor([[3] + CHAT_ROW.answer[:-1]]),
                     output_hidden_states=True).decoder_hidden_states[-1]
    torch.testing.assert_close(got, want)


@pytest.fixture(scope="module")
def chat_tok():
    """A word-level tokenizer with turn markers and a ChatML-like template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<unk>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant", "be", "short", "hi",
             "hello", "bye", "?", "see", "you", "Answer", ":", "say", "red", "blue"]
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                  additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")
    return tok


CONVERSATION = (("system", "be short"), ("user", "hi"), ("assistant", "hello"), ("user", "bye ?"), ("assistant", "see you"))


def test_end_eos_ends_a_plain_generation_prompt_inside_max_length(chat_tok):
    eos = chat_tok.eos_token_id
    task = Task("g", "say ", [], [Example("red blue red", "hello"), Example(" ".join(["red"] * 30), "hello")],
                [Example("red", "hello")], kind="generate")
    without = TaskEncoder(chat_tok, 16, template="plain").encode(task, task.train)
    enc = TaskEncoder(chat_tok, 16, end_eos=True, template="plain")
    fits, long = enc.encode(task, task.train)
    [test] = enc.encode(task, task.test, split="test")
    assert fits.prompt == without[0].prompt + [eos] and fits.answer == without[0].answer
    assert test.prompt[-1] == eos and test.prompt[-2] != eos
    # the long input is cut to make room for the EOS: the EOS stays, the row fits, the cut is counted
    tail = len(chat_tok("\nAnswer:", add_special_tokens=False)["input_ids"])
    assert long.prompt == without[1].prompt[: -tail - 1] + without[1].prompt[-tail:] + [eos]
    assert len(long) == len(without[1]) == 16 and long.answer == without[1].answer
    assert enc.sentence_cut[("g", "train")] == (1, 2)


def test_end_eos_ends_chat_prompts_train_and_test_inside_max_length(chat_tok):
    eos = chat_tok.eos_token_id
    chat = Task("chat", "", [], [Example("bye ?", "see you", CONVERSATION)], [Example("bye ?", "see you", CONVERSATION)], kind="generate")
    plain, on = TaskEncoder(chat_tok, 64), TaskEncoder(chat_tok, 64, end_eos=True)
    for split in ("train", "test"):
        [a] = plain.encode(chat, chat.train if split == "train" else chat.test, split=split)
        [b] = on.encode(chat, chat.train if split == "train" else chat.test, split=split)
        assert b.prompt == a.prompt + [eos] and b.answer == a.answer and b.mask == a.mask, split
    # a prompt / response row through the template
    qa = Task("qa", "", [], [Example("hi", "hello")], [Example("hi", "hello")], kind="generate")
    [a], [b] = plain.encode(qa, qa.train), on.encode(qa, qa.train)
    assert b.prompt == a.prompt + [eos] and b.answer == a.answer
    # too long: a conversation loses its middle (its start where its opening fills the room), a prompt / response row its input's end
    small = TaskEncoder(chat_tok, 16, end_eos=True)
    [test] = small.encode(chat, chat.test, split="test")
    assert test.prompt[-1] == eos and len(test) <= 16 and test.answer == a_answer(chat_tok, "see you <|im_end|>")
    long = Task("qa", "be short ", [], [Example(" ".join(["hi"] * 30), "hello")], [], kind="generate")
    [cut] = small.encode(long, long.train)
    assert cut.prompt[-1] == eos and len(cut) <= 16 and small.sentence_cut[("qa", "train")] == (1, 1)
    assert chat_tok.convert_ids_to_tokens(cut.prompt[-4:]) == ["<|im_end|>", "<|im_start|>", "assistant", "<eos>"]


def a_answer(tok, words: str) -> list[int]:
    return [tok.convert_tokens_to_ids(w) for w in words.split()]


def test_end_eos_leaves_classification_prompts_and_the_full_sequence_as_they_were(chat_tok):
    """Classification prompts already ended with EOS (prompt_ids); the whole-sequence target of
    an encoder-decoder drops that EOS (one sequence, one end), so a generation row's is the same
    with and without end_eos; the reconstruction target (replay.scope=input) ends with it, as a
    classification row's does."""
    eos = chat_tok.eos_token_id
    cls = Task("c", "say ", ["red", "blue"], [Example("hi " * 20, "red")], [], kind="classify")
    [a] = TaskEncoder(chat_tok, 16).encode(cls, cls.train)
    [b] = TaskEncoder(chat_tok, 16, end_eos=True).encode(cls, cls.train)
    tail = len(chat_tok("\nAnswer:", add_special_tokens=False)["input_ids"])
    assert b.prompt == a.prompt[: -tail - 1] + a.prompt[-tail:] + [eos] and len(b.prompt) == len(a.prompt)
    task = Task("g", "say ", [], [Example("red blue", "hello")], [], kind="generate")
    [g0] = TaskEncoder(chat_tok, 32, template="plain").encode(task, task.train)
    [g1] = TaskEncoder(chat_tok, 32, end_eos=True, template="plain").encode(task, task.train)
    assert as_full_sequence(g1, eos) == as_full_sequence(g0, eos)
    assert as_input_reconstruction(g1).answer == [-100] + g1.prompt[1:] and as_input_reconstruction(g1).answer[-1] == eos


def test_a_prompt_begins_with_the_bos_its_tokenizer_adds_itself():
    """A Llama / Mistral / Gemma tokenizer adds its BOS through its post-processor; under
    transformers 5 its ``add_bos_token`` reads False, so prompts were built without the BOS the
    model was trained with. The start is read from the tokenizer's own encoding."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from surecl.data.encode import TaskEncoder, start_ids

    words = ["<pad>", "<s>", "</s>", "<unk>", "a", "b", "red", "blue", "Answer", ":", "Option", ","]
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    assert not getattr(tok, "add_bos_token", False) and tok("a")["input_ids"] == [1, 4]
    assert start_ids(tok) == [1]
    task = Task("t", "", ["red", "blue"], [Example("a b", "red")], [Example("b a", "blue")])
    enc = TaskEncoder(tok, 64).encode(task, task.train)
    assert enc[0].prompt[0] == 1 and enc[0].prompt.count(1) == 1
    core.post_processor = None  # GPT-2's way: nothing before a text
    plain = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    assert start_ids(plain) == [] and TaskEncoder(plain, 64).encode(task, task.train)[0].prompt[0] != 1
