"""User tasks from JSONL files.

One file per task. The first line may be a header ``{"task": name, "instruction": str,
"labels": [..]}``; every other line is ``{"sentence": str, "label": str, "split": "train"|"test"}``.
Without a header the task is named after the file, the labels are those seen, and the
instruction is a generic one.

For continual pre-training (``data.kind=text``) a line is ``{"text": str, "split": ...}``
(``sentence`` is accepted too, so a classification file's sentences are its documents) and
there are no labels; a file whose header declares ``"kind": "generate"`` is read as that
kind, then as documents (:meth:`~surecl.data.task.Task.as_text`: a row's prompt and target,
or a conversation's turns), as the instruct benchmark's tasks are.

For generation tasks (``data.kind=generate``, or ``"kind": "generate"`` in the header) a line
is one of ``{"prompt": str, "response": str}`` (``completion`` for ``response`` too),
Alpaca's ``{"instruction": str, "input": str, "output": str}`` (``input`` optional) or a chat
``{"messages": [{"role": ..., "content": ...}, ...]}`` whose last turn is the assistant's
(rendered with the tokenizer's chat template, loss on every assistant turn); each with an
optional ``split``. The header may name the task's ``metric`` (``rouge_l``, the default, or
``exact_match``) and an ``instruction``, which goes before every prompt (a conversation's: at
the start of its first user turn).
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

from surecl.data.cl_benchmark import parse_rows, read_bytes
from surecl.data.task import Example, Task, clean_label, user_instruction, warn_test_only_labels
from surecl.errors import SureclError

GENERIC_INSTRUCTION = "Classify the following text. Choose one from the option.\n"


def _text_rows(items: list[tuple[int, dict]], path: Path | str, hint: bool = False) -> list[Example]:
    """The documents of a text file's rows; ``hint``: a generation row found there says how a
    ``data.jsonl`` file of them becomes documents (a header naming its kind)."""
    out = []
    for lineno, obj in items:
        text = obj.get("text", obj.get("sentence"))
        if text is None:
            why = ""
            if hint and any(k in obj for k in GENERATION_KEYS):
                why = (" (a generation row: a header line {\"kind\": \"generate\"} has data.kind=text read each row's prompt and "
                       "target, or a conversation's turns, as one document)")
            raise SureclError(f"{path} line {lineno}: missing 'text'{why}")
        if not isinstance(text, str):
            raise SureclError(f"{path} line {lineno}: 'text' must be a string")
        if not text.strip():
            raise SureclError(f"{path} line {lineno}: empty text")
        out.append(Example(sentence=text, label=""))
    return out


GENERATION_KEYS = ("prompt", "response", "completion", "output", "messages")
"""The keys of a generation row (prompt / response, Alpaca, chat)."""
ROW_KEYS = ("sentence", "text", *GENERATION_KEYS)
"""A line holding any of these is a row, never the header."""


def generation_example(obj: dict, where: str) -> Example:
    """A generation row (prompt/response, Alpaca instruction/input/output, or chat messages)
    as an :class:`Example`; anything malformed is a one-line error naming ``where``."""
    if "messages" in obj:
        return chat_example(obj["messages"], where)
    if "prompt" in obj:
        prompt, target_key = obj["prompt"], "completion" if "completion" in obj and "response" not in obj else "response"
        if not isinstance(prompt, str):
            raise SureclError(f"{where}: 'prompt' must be a string")
    elif "instruction" in obj:
        prompt, target_key = obj["instruction"], "output"
        extra = obj.get("input", "")
        if not isinstance(prompt, str) or not isinstance(extra, str):
            raise SureclError(f"{where}: 'instruction' and 'input' must be strings")
        if extra.strip():
            prompt = f"{prompt}\n\n{extra}"
    else:
        raise SureclError(f"{where}: a generation row needs 'prompt' and 'response', 'instruction' and 'output', or 'messages'")
    if not prompt.strip():
        raise SureclError(f"{where}: empty prompt")
    if target_key not in obj:
        raise SureclError(f"{where}: missing target {target_key!r}")
    target = obj[target_key]
    if not isinstance(target, str):
        raise SureclError(f"{where}: {target_key!r} must be a string")
    if not target.strip():
        raise SureclError(f"{where}: empty target {target_key!r}")
    return Example(sentence=prompt, label=target)


def chat_example(messages, where: str) -> Example:
    """A conversation (a list of ``{"role", "content"}`` turns ending with the assistant's) as
    an :class:`Example` whose target is the last assistant turn."""
    if not isinstance(messages, list) or not messages:
        raise SureclError(f"{where}: 'messages' must be a non-empty list of turns")
    turns = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise SureclError(f"{where}: message {k} must be an object with string 'role' and 'content'")
        turns.append((m["role"], m["content"]))
    if not any(role == "assistant" for role, _ in turns):
        raise SureclError(f"{where}: the conversation has no assistant turn (nothing to learn)")
    if turns[-1][0] != "assistant":
        raise SureclError(f"{where}: the last turn is {turns[-1][0]!r}; it must be the assistant's (the target)")
    if not turns[-1][1].strip():
        raise SureclError(f"{where}: the last assistant turn is empty")
    asked = next((c for role, c in reversed(turns[:-1]) if role != "assistant"), "")
    return Example(sentence=asked, label=turns[-1][1], messages=tuple(turns))


def read_jsonl(path: str | Path, what: str = "data.jsonl") -> tuple[dict, list[tuple[int, dict]]]:
    """The header (``{}`` without one) and every other line, as (line number, object), of a
    task file; a missing, unreadable or malformed file is one line naming it (``what``: the
    option that names the file)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise SureclError(f"{what}: file {path} does not exist")
    if path.is_dir():
        raise SureclError(f"{what}: {path} is a directory, not a JSONL file")
    if not path.is_file():  # reading a FIFO would block: say what it is instead
        raise SureclError(f"{what}: {path} is not a regular file (a FIFO, socket or device); give a JSONL file")
    data = read_bytes(path)
    try:
        # utf-8-sig: a byte-order mark (as some Windows editors write) is dropped. Lines end at
        # "\n" only (a CRLF's "\r" is whitespace JSON skips): str.splitlines() would also split at
        # U+2028, U+0085, \x0c ..., which json.dumps(ensure_ascii=False) writes raw inside strings.
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SureclError(f"{path}: not UTF-8 (byte {exc.start})") from None
    header: dict = {}
    rows: list[tuple[int, dict]] = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SureclError(f"{path} line {lineno}: malformed JSON ({exc.msg})") from None
        except RecursionError:  # nesting deeper than Python's parser follows
            raise SureclError(f"{path} line {lineno}: malformed JSON (nested too deeply)") from None
        except ValueError as exc:  # what json's own checks refuse, e.g. an integer of more than 4300 digits
            raise SureclError(f"{path} line {lineno}: malformed JSON ({str(exc).splitlines()[0]})") from None
        if "\\u" in line.lower():  # an escaped lone surrogate (text cut inside a UTF-16 pair) no tokenizer takes
            try:
                json.dumps(obj, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                raise SureclError(f"{path} line {lineno}: invalid Unicode (a lone surrogate escape such as \\ud800)") from None
        if not isinstance(obj, dict):
            raise SureclError(f"{path} line {lineno}: expected a JSON object")
        # a header names its task, or (without one: the file's name is the task's) its labels, kind or metric
        if not any(k in obj for k in ROW_KEYS) and ("task" in obj or any(k in obj for k in ("labels", "kind", "metric"))):
            if header:
                raise SureclError(f"{path} line {lineno}: a second header line")
            header = obj
            continue
        rows.append((lineno, obj))
    return header, rows


def _task_name(header: dict, path: Path) -> str:
    """The header's ``task`` (a string), else the file's name."""
    name = header.get("task", unicodedata.normalize("NFC", path.stem))  # a macOS file name arrives decomposed (NFD)
    if not isinstance(name, str):
        raise SureclError(f"{path}: header 'task' must be a string (the task's name), got {name!r}; give a name or remove the key "
                          "(the task is then named after the file)")
    from surecl.data.task import _SAFE_NAME

    if "task" not in header and (not _SAFE_NAME.match(name) or ".." in name):
        raise SureclError(f"{path}: the task is named after the file, {name!r}, which is no task name (letters, digits, "
                          "'.', '_', '+', '-', no spaces): give one in a first line {\"task\": \"name\"} or rename the file")
    return name


def load_jsonl_task(path: str | Path, kind: str = "classify", invalid_labels: str = "error") -> Task:
    path = Path(path).expanduser()
    header, lines = read_jsonl(path)
    if not lines:  # an empty file or a header alone: said as such, not as a task without labels
        raise SureclError(f"{path}: holds no rows")
    name = _task_name(header, path)
    rows: dict[str, list] = {"train": [], "test": []}
    for lineno, obj in lines:
        split = obj.get("split", "train")
        if not isinstance(split, str) or split not in rows:
            raise SureclError(f"{path} line {lineno}: split must be 'train' or 'test', got {split!r}")
        rows[split].append((lineno, obj))
    declared = header.get("kind")
    # a generation file in a continual pre-training stream: read as one, then each row's prompt and
    # target as one document (a classification file's sentences are its documents as they are)
    documents = kind == "text" and declared == "generate"
    if declared is not None:
        if declared not in ("classify", "generate"):
            raise SureclError(f"{path}: header 'kind' must be 'classify' or 'generate', got {declared!r}")
        if kind != "text" or documents:
            kind = declared
    metric = header.get("metric", "")
    if not isinstance(metric, str):
        raise SureclError(f"{path}: header 'metric' must be a string")
    if kind == "generate":
        instruction = header.get("instruction", "")
        if not isinstance(instruction, str):
            raise SureclError(f"{path}: header 'instruction' must be a string")
        task = Task(
            name=name, instruction=user_instruction(instruction), labels=[], group="jsonl", kind="generate", metric=metric,
            train=[generation_example(o, f"{path} line {n}") for n, o in rows["train"]],
            test=[generation_example(o, f"{path} line {n}") for n, o in rows["test"]],
        )
        task.check(str(path))
        return task.as_text() if documents else task
    if kind == "text":
        task = Task(
            name=name, instruction="", labels=[],
            train=_text_rows(rows["train"], path, True), test=_text_rows(rows["test"], path, True), group="jsonl", kind="text",
        )
        task.check(str(path))
        return task
    for lineno, obj in lines:  # a generation file read as a classification one: say how it is read as what it is
        if "sentence" not in obj and any(k in obj for k in GENERATION_KEYS):
            raise SureclError(f"{path} line {lineno}: missing 'sentence' (a generation row: read the file with data.kind=generate, "
                              "or give it a header line {\"kind\": \"generate\"})")
    splits = {}
    for split, items in rows.items():
        examples = parse_rows([o for _, o in items], str(path), [n for n, _ in items])
        splits[split] = examples
    labels = header.get("labels")
    seen = labels is None
    if seen:
        labels = sorted({ex.label for ex in splits["train"] + splits["test"]})
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise SureclError(f"{path}: header 'labels' must be a list of strings")
    labels = [clean_label(x) for x in labels]  # as each row's label is read
    instruction = header.get("instruction", GENERIC_INSTRUCTION)
    if not isinstance(instruction, str):
        raise SureclError(f"{path}: header 'instruction' must be a string")
    task = Task(
        name=name,
        instruction=user_instruction(instruction),
        labels=labels,
        train=splits["train"],
        test=splits["test"],
        group="jsonl",
        metric=metric,
    )
    task.check(str(path), invalid_labels)
    if seen:
        warn_test_only_labels(name, task.train, task.test, "give the task's labels in a header line ({\"labels\": [...]})")
    return task
