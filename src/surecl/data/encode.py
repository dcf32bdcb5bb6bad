"""Prompting, tokenisation (once per dataset) and length-bucketed batches.

Prompt (O-LoRA): ``instruction + "Option: " + ", ".join(labels) + " \\n" + sentence + "\\nAnswer:"``.
For a causal model a training sequence is prompt + " " + label + EOS and the loss is on the
answer; for a seq2seq model the prompt is the encoder input and label + EOS the target.
With ``end_eos`` (``model.encoder_eos``) every prompt, of every task kind, ends with the EOS
token (inside ``max_length``: the prompt's text is cut, never that EOS).
A ``generate`` task's prompt is the same without options (``instruction + prompt +
"\nAnswer:"``, the target after a space, then EOS), or, through the tokenizer's chat template,
the conversation up to the assistant's answer (``data.template``; chat rows always), the
instruction at the start of its first user turn (O-LoRA's ``data.task_prefix`` goes before the
instruction in either); a chat row's training sequence is the whole conversation, its "answer"
everything from the first assistant turn on, with a ``mask`` that scores only the assistant
turns' tokens; its test prompt ends where the last assistant turn's content begins (text the
template writes ahead of the content, such as Qwen3's empty think block, belongs to the prompt)
and the answer is that turn's content and end of turn. A template that writes no end of turn
after an assistant's content (nothing, or whitespace alone: Falcon-instruct's) gets the EOS token
after each assistant turn, as a plain answer ends, so the model learns to stop and generation
stops there.
A ``text`` task (continual pre-training) has no prompt: a document is one start token (BOS,
or EOS for tokenizers without one) as the "prompt" and its tokens as the "answer", so the same
loss, scorer and buffer train on, and score, every token of the document.
Causal batches are left-padded so that every answer ends at the last position: the loss then
needs logits for the last few positions only (``logits_to_keep``), which saves the large
vocabulary projection over the prompt.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, replace

import torch

from surecl.data.task import Example, Task, data_warning
from surecl.errors import SureclError


def task_lead(task: Task, task_prefix: bool = False) -> str:
    """What goes before a task's input in every prompt: its instruction, after O-LoRA's
    ``Task:<group>\nDataset:<name>\n`` with ``task_prefix`` (its scripts' ``--add_task_name True
    --add_dataset_name True``, ``src/uie_collator.py``; the group is the benchmark's task type:
    TC, SC, NLI, ...)."""
    head = f"Task:{task.group or task.name}\nDataset:{task.name}\n" if task_prefix else ""
    return head + task.instruction


def prompt_parts(task: Task, sentence: str, task_prefix: bool = False) -> tuple[str, str, str]:
    """(head, body, tail) of the O-LoRA prompt, :func:`task_lead` first."""
    return task_lead(task, task_prefix) + "Option: " + ", ".join(task.labels) + " \n", sentence, "\nAnswer:"


def build_prompt(task: Task, sentence: str, task_prefix: bool = False) -> str:
    return "".join(prompt_parts(task, sentence, task_prefix))


def text_start_id(tok, spec: str = "auto") -> int:
    """The id of the token before every document of a text task (``data.text_start``): ``auto``
    the tokenizer's BOS, else its EOS; ``bos``; ``eos``; or a token of its vocabulary as written.
    One line where the tokenizer has no such token."""
    if spec in ("auto", "bos", "eos"):
        bos, eos = tok.bos_token_id, tok.eos_token_id
        found = (bos if bos is not None else eos) if spec == "auto" else (bos if spec == "bos" else eos)
        if found is None:
            raise SureclError(f"data.text_start={spec}: this tokenizer has no {'BOS or EOS' if spec == 'auto' else spec.upper()} token; "
                              "name one of its tokens as written (e.g. data.text_start='<|endoftext|>')")
        return found
    found = tok.get_vocab().get(spec)
    if found is None:
        raise SureclError(f"data.text_start: {spec!r} is not a token of this tokenizer's vocabulary (give auto, bos, eos, "
                          "or one token as the vocabulary writes it)")
    return found


def start_ids(tok) -> list[int]:
    """The special tokens the tokenizer itself puts before a text (Llama's, Mistral's, Gemma's
    BOS; none for GPT-2-style or T5 tokenizers), read from its own encoding of a word: its
    ``add_bos_token`` attribute says nothing under transformers 5 for a tokenizer with a
    ``tokenizer.json`` (whose post-processor adds the BOS), so a prompt built from it lost it."""
    cached = getattr(tok, "_surecl_start_ids", None)
    if cached is not None:
        return list(cached)
    whole = list(tok("a")["input_ids"])
    bare = list(tok("a", add_special_tokens=False)["input_ids"])
    at = next((k for k in range(len(whole) - len(bare) + 1) if whole[k : k + len(bare)] == bare), 0) if bare else 0
    lead = whole[:at]
    try:
        tok._surecl_start_ids = tuple(lead)
    except AttributeError:  # a tokenizer that takes no new attribute: read again next time
        pass
    return lead


def led_turns(turns, lead: str) -> tuple[tuple[str, str], ...]:
    """A conversation with ``lead`` (:func:`task_lead`) at the start of its first user turn, as
    a prompt / response row's one user turn begins with it; a conversation without a user turn
    gets one holding it before its first assistant turn."""
    turns = tuple(turns)
    if not lead:
        return turns
    at = next((k for k, (role, _) in enumerate(turns) if role == "user"), None)
    if at is None:
        at = next(k for k, (role, _) in enumerate(turns) if role == "assistant")
        return (*turns[:at], ("user", lead.rstrip() or lead), *turns[at:])
    return (*turns[:at], ("user", lead + turns[at][1]), *turns[at + 1 :])


@dataclass
class Encoded:
    """One tokenised example: ``prompt`` ids and ``answer`` ids (label + EOS); ``mask`` (a
    chat conversation's training row) marks which answer tokens are scored (1) and which are
    read only (0: a user turn between two assistant turns); None scores every answer token."""

    prompt: list[int]
    answer: list[int]
    label: str
    mask: list[int] | None = None

    def __len__(self) -> int:
        return len(self.prompt) + len(self.answer)

    @property
    def scored(self) -> int:
        """How many answer tokens the loss and the label-scope surprise score."""
        return len(self.answer) if self.mask is None else sum(self.mask)

    @property
    def longest_turn(self) -> int:
        """The tokens of the longest answer it holds, with what ends it: the whole answer, or a
        training conversation's longest assistant turn (a run of scored tokens in ``mask``): how
        long one generated answer of its task may need to be (``eval.answer_budget=train``)."""
        if self.mask is None:
            return len(self.answer)
        longest = run = 0
        for m in self.mask:
            run = run + 1 if m else 0
            longest = max(longest, run)
        return longest


class TaskEncoder:
    """Tokenises a task's examples once. A classification row's sentence is cut to fit
    ``max_length``, never its instruction, options or answer; a generation, chat or text row
    also has its target cut where prompt + target would exceed ``max_length`` (keeping at least
    ``max_length // 2`` of it, :meth:`_fit_answer`), the prompt then cut to the rest: a plain or
    prompt / response row's input at its end, a conversation in its middle (its opening, the
    template's start and the first user turn up to the end of the instruction, and its last
    tokens stay; where the opening would take over half the room, the conversation loses its
    start instead, counted in :attr:`start_cut`). A prompt / response row through a chat
    template keeps the template's start, the instruction and one input token whatever is cut
    (its target gives way below ``max_length // 2`` for them). A test row encoded with a
    ``reserve`` (``eval.answer_budget=train``) is cut by the same rules as if its target were
    ``reserve`` tokens long, so every test prompt of a task leaves the same room whatever its
    own reference, which is scored whole."""

    def __init__(self, tokenizer, max_length: int, end_eos: bool = False, task_prefix: bool = False, template: str = "auto",
                 text_start: str = "auto"):
        self.tok = tokenizer
        self.text_start = text_start
        """The token before every document (``data.text_start``, :func:`text_start_id`)."""
        self.template = template
        """``auto``: a generation task's prompt/response rows go through the tokenizer's chat
        template where it has one; ``plain``: never (chat rows always do)."""
        self.max_length = max_length
        self.task_prefix = task_prefix
        """Put O-LoRA's ``Task:...\nDataset:...\n`` before every prompt (``data.task_prefix``): a
        generation prompt's too, before its instruction (a chat row's: in its first user turn)."""
        self.end_eos = end_eos
        """End every prompt with the EOS token (an encoder-decoder's input, ``model.encoder_eos``):
        classification, plain generation and chat prompts alike, training and test rows, the
        EOS counted in ``max_length`` (the prompt's text is cut to make room for it)."""
        self._answers: dict[str, list[int]] = {}
        self.cut: dict[tuple[str, str], tuple[int, int]] = {}
        """(task, split) -> (rows whose target or text was cut to ``max_length``, rows): what the
        run warns about (the cut end is neither trained nor scored)."""
        self._cuts = 0
        self.sentence_cut: dict[tuple[str, str], tuple[int, int]] = {}
        """(task, split) -> (rows whose input, a classification sentence or a generation prompt,
        was cut to fit ``max_length``, rows): what the run says (the model reads the input's start;
        instruction, options and answer are kept; a conversation loses its middle)."""
        self._sentence_cuts = 0
        self.start_cut: dict[tuple[str, str], tuple[int, int]] = {}
        """(task, split) -> (conversations among :attr:`sentence_cut`'s that lost their opening,
        the template's start and the instruction, because it would take over half the room the
        answer leaves, rows): what the run says too."""
        self._start_cuts = 0
        self._dropped = 0
        self._turn_end: str | None = None
        """What the chat template writes after an assistant turn's content, read from the first
        conversation encoded through it (:meth:`_turn_end_text`); None until then."""
        self._chatted = False

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def answer_ids(self, label: str) -> list[int]:
        if label not in self._answers:
            self._answers[label] = self._ids(" " + label) + [self.tok.eos_token_id]
        return self._answers[label]

    def prompt_ids(self, task: Task, sentence: str) -> list[int]:
        head, body, tail = prompt_parts(task, sentence, self.task_prefix)
        head_ids, tail_ids = start_ids(self.tok) + self._ids(head), self._ids(tail) + self._eos()
        room = max(self.max_length - len(head_ids) - len(tail_ids), 1)
        body_ids = self._ids(body)
        self._sentence_cuts += len(body_ids) > room
        return head_ids + body_ids[:room] + tail_ids

    def document(self, text: str) -> Encoded:
        start = text_start_id(self.tok, self.text_start)
        ids = self._ids(text)
        self._cuts += len(ids) > self.max_length - 1
        return Encoded([start], ids[: self.max_length - 1], "")

    def check_labels(self, task: Task) -> list[str]:
        """Stop (one line naming them) when the tokenizer cannot tell a task's labels apart:
        a label whose answer tokens are none or all the unknown token, or two labels encoding
        to the same token ids (the model could only learn, and be scored on, one answer for
        both). Return warnings: labels whose tokens decode to another answer than the label
        under exact-match normalisation (generation can never be scored right on them)."""
        if task.kind in ("text", "generate"):  # no label set
            return []
        from surecl.metrics import normalise

        unk = getattr(self.tok, "unk_token_id", None)
        ids = {lab: self.answer_ids(lab)[:-1] for lab in task.labels}
        blank = [lab for lab, t in ids.items() if not t or (unk is not None and all(i == unk for i in t))]
        if blank:
            shown = ", ".join(repr(lab) for lab in blank[:8]) + (f" (and {len(blank) - 8} more)" if len(blank) > 8 else "")
            raise SureclError(f"task {task.name}: the tokenizer reads label(s) {shown} as unknown or no tokens, so the model "
                              "cannot produce or tell them apart; use labels in its vocabulary or another model")
        same: dict[tuple[int, ...], list[str]] = {}
        for lab, t in ids.items():
            same.setdefault(tuple(t), []).append(lab)
        clash = [group for group in same.values() if len(group) > 1]
        if clash:
            shown = "; ".join(" = ".join(repr(lab) for lab in group) for group in clash[:4])
            raise SureclError(f"task {task.name}: labels {shown} encode to the same token ids, so the model cannot tell them "
                              "apart; rename them")
        warnings = []
        alike: dict[str, list[str]] = {}
        for lab in task.labels:
            alike.setdefault(normalise(lab), []).append(lab)
        for key, group in alike.items():
            if len(group) > 1 or not key:
                shown = " and ".join(repr(lab) for lab in group)
                warnings.append(f"task {task.name}: label(s) {shown} " + ("normalise alike" if len(group) > 1 else "normalise to nothing")
                                + "; a generated answer counts for them only as their exact text")
        for lab, t in ids.items():
            text = self.tok.decode(t, skip_special_tokens=True)
            if normalise(text) != normalise(lab):
                warnings.append(f"task {task.name}: label {lab!r} decodes to {text.strip()!r}; greedy generation is scored by exact "
                                "match, so it can never be counted right (eval.mode=rank compares token ids)")
        return warnings

    def encode(self, task: Task, rows: list[Example], split: str = "train", reserve: int | None = None) -> list[Encoded]:
        """``split`` ``test``: a chat row is encoded as its last turn's generation prompt and answer.
        A generation target or a text longer than ``max_length`` allows is cut, and counted in
        :attr:`cut`; a cut test target's ``label`` becomes the text of its kept tokens, so that
        evaluation scores the answer against what the model can be asked to generate (the cut
        end is neither trained nor scored). ``reserve`` (a generation task's test rows,
        ``eval.answer_budget=train``): every prompt is cut to leave room for ``reserve`` answer
        tokens, the same for each row, instead of for its own target, and the target is scored
        whole (:meth:`generation`). The counts of a (task, split) are those of its last encoding."""
        self._cuts = self._sentence_cuts = self._start_cuts = 0
        for counts in (self.cut, self.sentence_cut, self.start_cut):
            counts.pop((task.name, split), None)
        if task.kind == "generate":
            out = []
            for i, ex in enumerate(rows):
                before = self._cuts  # a row whose target is cut adds one (a retried encoding counts its last try)
                enc = self.generation(task, ex, split, i, reserve if split == "test" else None)
                if self._cuts > before and split == "test":
                    enc = replace(enc, label=self.tok.decode(enc.answer, skip_special_tokens=True).strip())
                out.append(enc)
        elif task.kind == "text":
            out = [self.document(ex.sentence) for ex in rows]
            for i, e in enumerate(out):
                if not e.answer:
                    raise SureclError(f"task {task.name} row {i}: the text has no tokens")
        else:
            out = [Encoded(self.prompt_ids(task, ex.sentence), self.answer_ids(ex.label), ex.label) for ex in rows]
        if self._cuts:
            self.cut[(task.name, split)] = (self._cuts, len(rows))
        if self._sentence_cuts:
            self.sentence_cut[(task.name, split)] = (self._sentence_cuts, len(rows))
        if self._start_cuts:
            self.start_cut[(task.name, split)] = (self._start_cuts, len(rows))
        return out


    # ------------------------------------------------------------------ generation tasks

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tok, "chat_template", None))

    def generation(self, task: Task, ex: Example, split: str, row: int, reserve: int | None = None) -> Encoded:
        """One generation example (see the module docstring). ``reserve`` (a test row): its
        prompt is cut as a target of ``reserve`` tokens would cut it, whatever its own target's
        length (so how much input the model reads does not depend on the gold answer), its
        ``label`` is the whole target and its answer ids are the target as encoded without a
        reserve (what the answer budget of a task without training rows reads); the target is
        not counted in :attr:`cut`, since it is scored whole."""
        if reserve is None:
            return self._generation(task, ex, split, row, None)
        counts = self._cuts, self._sentence_cuts, self._start_cuts
        own = self._generation(task, ex, split, row, None)
        self._cuts, self._sentence_cuts, self._start_cuts = counts
        enc = self._generation(task, ex, split, row, max(reserve, 1))
        self._cuts = counts[0]
        return replace(enc, answer=own.answer, label=ex.label, mask=own.mask)

    def _generation(self, task: Task, ex: Example, split: str, row: int, reserve: int | None) -> Encoded:
        where = f"task {task.name} {split} row {row}"
        if ex.messages or (self.template == "auto" and self.has_chat_template):
            if not self.has_chat_template:
                raise SureclError(f"{where}: a chat row (messages) needs a tokenizer with a chat template; this one has none")
            test = split == "test"
            lead = task_lead(task, self.task_prefix)
            if ex.messages:  # a conversation too long loses its middle (its opening and last turns are kept)
                enc = self._chat(led_turns(ex.messages, lead), ex.label, test, where, lead=lead, reserve=reserve)
                self._sentence_cuts += self._dropped > 0
                return enc
            # a prompt / response row: where it does not fit, its input is cut at the end, as the
            # plain template cuts it, and the template's start (system header) and the instruction stay
            turns = lambda text: (("user", lead + text), ("assistant", ex.label))  # noqa: E731
            body = self._ids(ex.sentence)
            cuts = self._cuts  # a target cut is counted once, by the last try
            enc = self._chat(turns(ex.sentence), ex.label, test, where, keep_start=True, reserve=reserve)
            keep = len(body)
            if self._dropped:  # what stays whatever is cut: the prompt with the input's first character
                first, start = self._text_of(body, 1)
                least = len(self._chat_parts(turns(start), test, where)[0])
                for _ in range(4):  # a cut text may tokenise a little differently once decoded: a few tries
                    keep, text = self._text_of(body, max(keep - self._dropped - 1, first))
                    self._cuts = cuts
                    enc = self._chat(turns(text), ex.label, test, where, least=least, keep_start=True, reserve=reserve)
                    if not self._dropped or keep <= first:  # (still over: a start too long for max_length stays whole)
                        break
            self._sentence_cuts += keep < len(body)
            return enc
        head = start_ids(self.tok) + self._ids(task_lead(task, self.task_prefix))
        tail = self._ids("\nAnswer:") + self._eos()
        body = self._ids(ex.sentence)
        answer = self._ids(" " + ex.label) + [self.tok.eos_token_id]
        answer = self._fit_answer(answer, len(head) + len(body) + len(tail), count=not reserve)
        room = max(self.max_length - self._held(answer, reserve, len(head) + len(body) + len(tail)) - len(head) - len(tail), 1)
        self._sentence_cuts += len(body) > room
        return Encoded(head + body[:room] + tail, answer, ex.label)

    def _text_of(self, body: list[int], keep: int) -> tuple[int, str]:
        """(n, text): the text of ``body``'s first ``n`` tokens, ``n`` the nearest to ``keep`` whose
        text ends on a whole character. A byte-level BPE token can hold part of a multi-byte
        character (CJK, emoji), whose bytes decode to U+FFFD: a cut text re-tokenised would make
        the model read a character the data does not hold. So ``keep`` backs off (a character is
        at most 4 bytes), or where nothing before it is whole, moves on to the first character's end."""
        for n in [*range(keep, max(keep - 4, 0), -1), *range(keep + 1, min(keep + 4, len(body)) + 1)]:
            text = self.tok.decode(body[:n], skip_special_tokens=True)
            if not text.endswith("\ufffd"):
                return n, text
        return keep, self.tok.decode(body[:keep], skip_special_tokens=True)  # the data's own U+FFFD: as cut

    def _eos(self) -> list[int]:
        """What ends every prompt: the EOS token with ``end_eos``, else nothing."""
        return [self.tok.eos_token_id] if self.end_eos else []

    def _fit_answer(self, answer: list, prompt_len: int, least: int = 0, count: bool = True) -> list:
        """The target, cut where ``prompt_len`` + its length exceeds ``max_length``: it keeps what
        ``max_length`` leaves beside the prompt, but at least its first ``max_length // 2`` tokens
        (the prompt is then cut to the rest); ``least``: prompt tokens that must stay, for which it
        keeps fewer (one at least). ``count``: a cut counts in :attr:`cut` (not for a test row's
        reserve, nor its target scored whole)."""
        if prompt_len + len(answer) <= self.max_length:
            return answer
        keep = max(self.max_length - prompt_len, self.max_length // 2)
        if least:
            keep = min(keep, max(self.max_length - least, 1))
        self._cuts += count and keep < len(answer)
        return answer[:keep]

    def _held(self, answer: list, reserve: int | None, prompt_len: int, least: int = 0) -> int:
        """The answer tokens a prompt of ``prompt_len`` leaves room for: the kept ``answer``'s, or
        with a ``reserve`` (a test row under ``eval.answer_budget=train``) what :meth:`_fit_answer`
        would keep of a target that long, the same for every row of the task."""
        return len(self._fit_answer([0] * reserve, prompt_len, least, count=False)) if reserve else len(answer)

    def render(self, turns, generation_prompt: bool, where: str) -> str:
        try:
            return self.tok.apply_chat_template([{"role": r, "content": c} for r, c in turns], tokenize=False,
                                                add_generation_prompt=generation_prompt)
        except Exception as exc:  # jinja's TemplateError (e.g. roles that must alternate), a template that needs other keys
            text = str(exc).strip().splitlines()
            raise SureclError(f"{where}: the chat template refuses the conversation ({type(exc).__name__}: {text[0][:160] if text else ''})") from None

    def chat_segments(self, turns, where: str) -> list[tuple[str, bool]]:
        """The rendered conversation cut into (text, is an assistant turn) pieces: an assistant
        turn is what rendering it adds after the generation prompt of the turns before it (its
        content and the template's end of turn). Text the template puts before the content (a
        lead-in such as Qwen3's empty ``<think>\n\n</think>\n\n``) goes with the prompt side:
        neither trained nor generated, so a decoded answer is the content alone."""
        full = self.render(turns, False, where)
        out: list[tuple[str, bool]] = []
        pos = 0
        for i, (role, _) in enumerate(turns):
            if role != "assistant":
                continue
            asked = self.render(turns[:i], True, where) if i else ""
            said = self.render(turns[: i + 1], False, where)
            if len(asked) < pos or not said.startswith(asked) or not full.startswith(said):
                marked, lacking = self._segments_by_markers(turns, full, where)
                if marked is None:
                    raise SureclError(f"{where}: the chat template does not render the conversation turn by turn (each turn's "
                                      f"prefix unchanged), nor with {lacking}, so its assistant turns cannot be marked")
                return marked
            turn = full[len(asked) : len(said)]
            lead = self._lead_in(turns[:i], asked, where)
            if not (lead and turn.startswith(lead)):  # none, or this turn renders without it (not the last)
                lead = ""
            out += [(full[pos : len(asked)] + lead, False), (turn[len(lead) :], True)]
            pos = len(said)
        out.append((full[pos:], False))
        return [(text, a) for text, a in out if text]

    def _segments_by_markers(self, turns, full: str, where: str) -> tuple[list[tuple[str, bool]] | None, str]:
        """:meth:`chat_segments` for a template that renders an earlier turn otherwise once
        later turns follow (Qwen3 drops the think block of assistant turns before the last user
        turn): the conversation rendered with a marker in place of each assistant content shows
        where each content sits; a turn is its content and the end-of-turn text the template
        writes after the last assistant content of the conversation. Returns the segments and
        "", or None and why not: a content not verbatim in the rendering (trimmed, split, hidden
        or repeated), a turn not followed by that end of turn, or text before the last content
        that does not begin with the template's generation prompt (what evaluation would prompt
        with)."""
        verbatim = "each assistant content once, verbatim"
        contents = [content for role, content in turns if role == "assistant"]
        marks = [f"\u2063surecl{k}\u2063" for k in range(len(contents))]
        it = iter(marks)
        probe = self.render([(role, next(it) if role == "assistant" else content) for role, content in turns], False, where)
        pieces, pos = [], 0
        for mark in marks:
            at = probe.find(mark, pos)
            if at < 0 or probe.count(mark) != 1:
                return None, verbatim
            pieces.append(probe[pos:at])
            pos = at + len(mark)
        pieces.append(probe[pos:])
        before_last = pieces[0] + "".join(c + p for c, p in zip(contents[:-1], pieces[1:-1]))
        if before_last + contents[-1] + pieces[-1] != full:
            return None, verbatim
        last = max(i for i, (role, _) in enumerate(turns) if role == "assistant")
        tail = self._after_last_content(turns, where)
        if tail is None:
            return None, verbatim
        if not before_last.startswith(self.render(turns[:last], True, where)):
            return None, "the text before the last assistant content beginning with the template's generation prompt"
        out: list[tuple[str, bool]] = [(pieces[0], False)]
        for content, after in zip(contents, pieces[1:]):
            if not after.startswith(tail):
                return None, f"each assistant turn ending as the last one does ({tail!r})"
            out += [(content + tail, True), (after[len(tail):], False)]
        return [(text, a) for text, a in out if text], ""

    _MARKER = "\u2063surecl\u2063"
    """A string no conversation holds: an assistant turn rendered with it shows where the
    template puts the content."""

    def _lead_in(self, before, asked: str, where: str) -> str:
        """What the template writes after the generation prompt of ``before`` and ahead of the
        next assistant turn's content ("" when nothing but whitespace): found by rendering that
        turn with :attr:`_MARKER` as its content, so a content that also occurs in the lead-in
        cannot misplace the cut."""
        probe = self.render((*before, ("assistant", self._MARKER)), False, where)
        at = probe.find(self._MARKER)
        if at < len(asked) or not probe.startswith(asked):
            return ""
        lead = probe[len(asked) : at]
        return lead if lead.strip() else ""

    def _chat(self, turns, target: str, test: bool, where: str, least: int = 0, keep_start: bool = False,
              lead: str = "", reserve: int | None = None) -> Encoded:
        """The conversation's row: where prompt and answer exceed ``max_length``, its prompt keeps
        its opening (:meth:`_opening`: the template's start and the first user turn up to the end
        of ``lead``, the instruction) and its last tokens, the middle cut (:attr:`_dropped` counts
        the tokens cut); an opening over half the room is cut too, the prompt then its last
        tokens alone (counted in :attr:`_start_cuts`). With ``keep_start`` the prompt is never
        cut (:attr:`_dropped` says how many tokens too long it is: the caller cuts its input);
        ``least``: prompt tokens that must stay, for which the answer gives way (:meth:`_fit_answer`);
        ``reserve``: the prompt leaves room for that many answer tokens, not for its own answer
        (:meth:`generation`)."""
        prompt, answer, mask = self._chat_parts(turns, test, where)
        eos = self._eos()  # ends the prompt (end_eos), kept whatever is cut
        kept = least + len(eos) if least else 0
        answer = self._fit_answer(answer, len(prompt) + len(eos), kept, count=not reserve)
        mask = mask[: len(answer)]
        room = max(self.max_length - self._held(answer, reserve, len(prompt) + len(eos), kept) - len(eos), 1)
        self._dropped = max(len(prompt) - room, 0)
        if self._dropped and not keep_start:
            head = self._opening(turns, lead, prompt, where)
            if head is not None and head <= room // 2:
                prompt = prompt[:head] + prompt[len(prompt) - (room - head) :]
            else:
                prompt = prompt[-room:]
                self._start_cuts += 1
        return Encoded(prompt + eos, answer, target, None if all(mask) else mask)

    def _opening(self, turns, lead: str, prompt: list[int], where: str) -> int | None:
        """How many of ``prompt``'s first tokens are the conversation's opening: what the template
        writes before the first user turn's content (its start, a system turn) and that content
        up to the end of ``lead`` (the task's instruction, :func:`led_turns`), found by rendering
        the conversation with :attr:`_MARKER` after it. None where there is no user turn, the
        rendering does not show it (the template does not write the content verbatim) or ``prompt``
        does not begin with it (the opening lies past a training row's prompt: a conversation
        opening with the assistant)."""
        at = next((k for k, (role, _) in enumerate(turns) if role == "user"), None)
        if at is None:
            return None
        content = turns[at][1]
        cut = len(lead) if content.startswith(lead) else len(content)
        try:
            probe = self.render((*turns[:at], ("user", content[:cut] + self._MARKER + content[cut:]), *turns[at + 1 :]), False, where)
        except SureclError:
            return None
        if probe.count(self._MARKER) != 1:
            return None
        head = self._ids(probe[: probe.index(self._MARKER)])
        same = len(os.path.commonprefix([prompt, head]))
        # the opening's last token may merge with the text after it (a trailing space joins the next word)
        return same if same >= len(head) - 1 else None

    def _chat_parts(self, turns, test: bool, where: str) -> tuple[list[int], list[int], list[int]]:
        """(prompt ids, answer ids, answer mask) of a conversation, uncut; each assistant turn
        ends with the EOS token where the template writes no end of turn (:meth:`_end_ids`)."""
        pieces = [(self._ids(text), a) for text, a in self.chat_segments(turns, where)]
        self._chatted = True
        if self._turn_end is None:
            self._turn_end = self._turn_end_text(turns, where)
        end = self._turn_end
        if end is not None and not self._end_ids(end):  # no token ends a turn: EOS does, as after a plain answer
            pieces = [(ids + [self.tok.eos_token_id] if a else ids, a) for ids, a in pieces]
        turns_at = [k for k, (_, a) in enumerate(pieces) if a]
        if not turns_at:
            raise SureclError(f"{where}: the assistant turn renders to no text")
        # test: the last turn's generation prompt and the turn; train: every assistant turn scored,
        # or the last alone (the earlier ones as its prompt) where all of them would not fit: cut
        # from the end, the target turn would be the first to go
        at = turns_at[-1] if test else turns_at[0]
        if not test and len(turns_at) > 1 and sum(len(ids) for ids, _ in pieces) > self.max_length:
            at = turns_at[-1]
        prompt = [t for ids, _ in pieces[:at] for t in ids]
        rest = pieces[at : at + 1] if test else pieces[at:]
        answer = [t for ids, _ in rest for t in ids]
        mask = [int(a) for ids, a in rest for _ in ids]
        if not any(mask):
            raise SureclError(f"{where}: the assistant turn has no tokens")
        return prompt, answer, mask

    def _turn_end_text(self, turns, where: str) -> str | None:
        """What the template writes after an assistant turn's content: the conversation ``turns``
        rendered up to its last assistant turn, whose content is :attr:`_MARKER`, after the marker
        (the first conversation encoded that shows it is :attr:`_turn_end`). None where the
        template refuses it or the marker does not come out once (a template that rewrites contents)."""
        try:
            return self._after_last_content(turns, where)
        except SureclError:
            return None

    def _after_last_content(self, turns, where: str) -> str | None:
        """The text the template writes after the content of ``turns``' last assistant turn, the
        conversation rendered up to that turn with :attr:`_MARKER` as its content; None where
        there is no assistant turn or the marker does not come out once (the template's refusal
        of the conversation is raised)."""
        last = max((i for i, (role, _) in enumerate(turns) if role == "assistant"), default=None)
        if last is None:
            return None
        probe = self.render((*turns[:last], ("assistant", self._MARKER)), False, where)
        if probe.count(self._MARKER) != 1:
            return None
        return probe[probe.index(self._MARKER) + len(self._MARKER) :]

    def _end_ids(self, end: str) -> list[int]:
        """The end-of-turn token in ``end``, the text after an assistant turn's content: its first
        token, leading whitespace skipped (a template that writes ``' ' + eos`` there, Llama-2's,
        must not make the space token a stop, which would cut every answer at its first space);
        none where it is whitespace alone."""
        ids = self._ids(end.lstrip())[:1] if end.strip() else []
        return ids if ids and self.tok.decode(ids).strip() else []

    def stop_ids(self) -> list[int]:
        """The tokens that end a generated answer: EOS and, with a chat template, its end-of-turn
        token (:meth:`_end_ids`), read from the conversations encoded through the template (where
        it writes none, every assistant turn was trained to end with EOS). Asked before any was
        encoded, a one-turn conversation shows it; a template that shows it neither way stops at
        EOS alone, said in one line where rows went through it."""
        ids = [self.tok.eos_token_id]
        if not self.has_chat_template:
            return ids
        end = self._turn_end
        if end is None:
            end = self._turn_end_text((("user", "hi"), ("assistant", "hi")), "")
        if end is None:
            if self._chatted:
                data_warning("the chat template's end of turn could not be read (it rewrites an assistant's content, and "
                             "refuses a one-turn conversation): generation stops at the EOS token only")
            return ids
        return ids + [t for t in self._end_ids(end) if t not in ids]


def past_embeddings(name: str, said: str, size: int, instead: str = "give the tokenizer a token the model has") -> str:
    """The line for a token id past a model's ``size`` input embeddings (``said``: which token,
    and its id), the same for each token a run reads: a token added to the tokenizer without
    resizing the model, an IndexError at its first forward (a device-side assert on a GPU), or a
    stop token generation can never emit."""
    return (f"tokenizer of {name}: {said}, past the model's {size} token embeddings (a token added to the tokenizer without "
            "resizing the model); resize them (model.resize_token_embeddings(len(tokenizer))) and save the model with its "
            f"tokenizer, or {instead}")


def _token(tok, i: int) -> str:
    token = tok.convert_ids_to_tokens(i)
    return token if isinstance(token, str) else str(i)


def check_read_ids(encoder: TaskEncoder, tasks, size: int | None, name: str, stops: list[int] | None = None) -> None:
    """The tokens a run reads besides the pad, EOS and decoder start ids
    (:func:`surecl.model.check_special_ids`), refused in one line where the model's ``size``
    input embeddings do not hold them: ``data.text_start``'s token where one of ``tasks`` is a
    text task (a text stream, the general probe's text part), and each of the stop tokens
    ``stops`` (:meth:`TaskEncoder.stop_ids`: a chat template's end of turn, which generation
    could never emit, so every answer ran to its token budget). The run asks it once its rows
    are encoded, the dry run from the tokenizer alone, in the same words."""
    if size is None:
        return
    tok = encoder.tok
    if any(t.kind == "text" for t in tasks):
        i = text_start_id(tok, encoder.text_start)
        if not 0 <= i < size:
            raise SureclError(past_embeddings(
                name, f"its token {_token(tok, i)!r} before every document (data.text_start={encoder.text_start}) has id {i}", size,
                "give data.text_start a token the model has"))
    for i in stops or ():
        if i is not None and not 0 <= i < size:
            raise SureclError(past_embeddings(
                name, f"its chat template's end-of-turn token {_token(tok, i)!r} has id {i} (generation stops at it)", size,
                "give it a chat template whose turns end with a token the model has (prompt / response rows: data.template=plain)"))


def check_row_ids(sets, tok, size: int | None, name: str) -> None:
    """Every token of the encoded rows within the model's ``size`` input embeddings, refused in
    one line naming the rows where one is past them (a token added to the tokenizer without
    resizing the model, written by its chat template or found in the data: an IndexError at the
    first forward). ``sets``: (which rows, in words; their encoded rows)."""
    if size is None:
        return
    for where, rows in sets:
        top = max((max(max(e.prompt, default=-1), max(e.answer, default=-1)) for e in rows), default=-1)
        if top >= size:
            raise SureclError(past_embeddings(name, f"{where} hold its token {_token(tok, top)!r}, id {top}", size))


def bucketed_batches(lengths: list[int], batch_size: int, rng: random.Random, bucket: int = 32) -> list[list[int]]:
    """Shuffle, sort by length inside windows of ``bucket`` batches, then shuffle the batches.

    Keeps padding small while the order stays random across epochs and seeds.
    """
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = batch_size * bucket
    batches: list[list[int]] = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: lengths[i])
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


def uniform_batches(n: int, batch_size: int, rng: random.Random) -> list[list[int]]:
    """One epoch of batches drawn uniformly: shuffle all ``n`` indices, cut in order (the
    paper's batching; each batch is a uniform sample whatever the examples' lengths)."""
    order = list(range(n))
    rng.shuffle(order)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def micro_batches(items: list[Encoded], max_tokens: int) -> list[list[Encoded]]:
    """Consecutive slices of ``items`` whose padded size (rows x longest row) stays within
    ``max_tokens`` (one row at least); ``max_tokens`` 0 keeps the batch whole."""
    return [[items[i] for i in s] for s in _slices([len(e) for e in items], max_tokens)]


def _slices(lengths: list[int], max_tokens: int) -> list[list[int]]:
    if max_tokens <= 0:
        return [list(range(len(lengths)))] if lengths else []
    out: list[list[int]] = []
    width = 0
    for i, n in enumerate(lengths):
        w = max(width, n)
        if out and (len(out[-1]) + 1) * w <= max_tokens:
            out[-1].append(i)
            width = w
        else:
            out.append([i])
            width = n
    return out


def micro_batch_positions(items: list[Encoded], max_tokens: int, groups: list | None = None, min_saving: int | None = None) -> list[list[int]]:
    """The slices of :func:`micro_batches` as lists of positions in ``items``. With ``groups``
    (a task per item) no slice mixes two groups: the items are taken group by group, each in
    its own order, so a slice's prompts share their task's prefix. A group whose shared prefix
    saves fewer than ``min_saving`` tokens (default :data:`MIN_SHARED_SAVING`; an item alone
    saves none) is not worth a slice of its own: such items go together into one last group.
    Slices are sized on whole rows, as without a prefix, so a slice never holds more
    activations than ``max_tokens`` whole tokens would (a shared prefix computes fewer)."""
    if groups is None:
        return _slices([len(e) for e in items], max_tokens)
    floor = MIN_SHARED_SAVING if min_saving is None else min_saving
    members: dict = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    own, pool = [], []
    for idx in members.values():
        if len(idx) > 1 and (len(idx) - 1) * shared_prefix_len([items[i] for i in idx]) >= floor:
            own.append(idx)
        else:
            pool.extend(idx)
    out: list[list[int]] = []
    for pos in own + [sorted(pool)]:
        out.extend([pos[j] for j in s] for s in _slices([len(items[i]) for i in pos], max_tokens))
    return out


MIN_SHARED_PREFIX = 8
"""Fewest shared tokens worth a separate prefix pass (below it the extra call costs more)."""

MIN_SHARED_SAVING = 64
"""Fewest prefix tokens a task's rows must save, ``(rows - 1) x prefix``, to get training slices
of their own. A separate slice costs another forward and backward pass (two, with its prefix
pass) over a small batch; a replayed pair with a 20-30 token prefix saves less than that
costs (``bench/train_step.py``)."""


def shared_prefix_len(items: list[Encoded]) -> int:
    """Tokens that every item's prompt starts with, leaving at least one prompt token per row
    (so a row's first answer token is always predicted from its own part); 0 when fewer than
    :data:`MIN_SHARED_PREFIX` or fewer than two rows would share them."""
    if len(items) < 2:
        return 0
    common = len(os.path.commonprefix([e.prompt for e in items]))
    n = min(common, min(len(e.prompt) for e in items) - 1)
    return n if n >= MIN_SHARED_PREFIX else 0


def collate(items: list[Encoded], pad_id: int, is_seq2seq: bool, with_answer: bool = True, share_prefix: bool = False) -> dict[str, torch.Tensor]:
    """Tensors for a batch. Causal: left-padded ``prompt+answer`` (or prompt only), explicit
    position ids, ``n_answer`` per row. Seq2seq: padded encoder input and ``-100``-padded labels;
    where a row has a ``mask`` (a conversation's user turns between assistant turns: read, not
    scored), its unscored tokens are -100 in ``labels`` only, and ``decoder_targets`` holds every
    row's whole answer (-100-padded, as ``labels``), which the decoder reads shifted right
    (:func:`surecl.nll.seq2seq_inputs`; the model's own shift of ``labels`` would give it pads in
    place of those turns). A batch without such rows has no ``decoder_targets``.

    ``share_prefix`` (causal only): the :func:`shared_prefix_len` first tokens, which every row
    shares, go once into ``prefix_ids`` [1, prefix] (when there are enough); ``input_ids`` and
    ``attention_mask`` hold the rest of each row (left-padded, so the pads sit between the
    prefix and the row) and ``position_ids`` continue from the prefix. The model then runs the
    prefix once and the rows against its KV cache (``surecl.nll``)."""
    if is_seq2seq:
        width = max(len(e.prompt) for e in items)
        ids = torch.full((len(items), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for r, e in enumerate(items):
            ids[r, : len(e.prompt)] = torch.tensor(e.prompt)
            mask[r, : len(e.prompt)] = 1
        out = {"input_ids": ids, "attention_mask": mask}
        if with_answer:
            aw = max(len(e.answer) for e in items)
            labels = torch.full((len(items), aw), -100, dtype=torch.long)
            for r, e in enumerate(items):
                labels[r, : len(e.answer)] = torch.tensor(e.answer if e.mask is None else [t if m else -100 for t, m in zip(e.answer, e.mask)])
            out["labels"] = labels
            if any(e.mask is not None for e in items):
                targets = torch.full((len(items), aw), -100, dtype=torch.long)
                for r, e in enumerate(items):
                    targets[r, : len(e.answer)] = torch.tensor(e.answer)
                out["decoder_targets"] = targets
            out["n_answer"] = torch.tensor([len(e.answer) for e in items])
        return out
    prefix = shared_prefix_len(items) if share_prefix else 0
    seqs = [e.prompt + e.answer if with_answer else e.prompt for e in items]
    shared = seqs[0][:prefix]
    seqs = [s[prefix:] for s in seqs]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, width - len(s) :] = torch.tensor(s)
        mask[r, width - len(s) :] = 1
    out = {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0) + prefix}
    if prefix:
        out["prefix_ids"] = torch.tensor([shared])
    if with_answer:
        out["n_answer"] = torch.tensor([len(e.answer) for e in items])
        if any(e.mask is not None for e in items):  # [rows, longest answer], right-aligned as the answers are
            k = max(len(e.answer) for e in items)
            scored = torch.ones((len(items), k))
            for r, e in enumerate(items):
                if e.mask is not None:
                    scored[r, k - len(e.answer) :] = torch.tensor(e.mask, dtype=torch.float)
            out["answer_mask"] = scored
    return out


def new_token_budget(cfg, task: Task, items: list[Encoded], label_answers: dict | None, train: list[Encoded] = ()) -> int:
    """The tokens evaluation generates for each of ``task``'s test rows ``items``: for a
    generation task, the longest training target as encoded (``train``, the task's encoded
    training rows; a conversation's longest assistant turn) and one more, at most
    ``eval.max_new_cap`` (``eval.answer_budget=train``; a task without training rows, the
    general-ability probe's, its own test rows'), or the longest of ``items``' answers and one
    more (``references``: every run before the key; a row's answer then depends on which other
    rows the test sample drew); a labelled task's longest label answer and one more under
    ``eval.mode=generate``; ``eval.max_new_tokens`` when set; 0 where nothing is generated
    (perplexity, ranking)."""
    if task.kind == "text":
        return 0
    if task.kind == "generate":
        rows = train if cfg.eval.answer_budget == "train" and train else items
        return cfg.eval.max_new_tokens or min(max((e.longest_turn for e in rows), default=0) + 1, cfg.eval.max_new_cap)
    if cfg.eval.mode == "rank" or not label_answers:
        return 0
    return cfg.eval.max_new_tokens or max(len(a) for a in label_answers.values()) + 1
