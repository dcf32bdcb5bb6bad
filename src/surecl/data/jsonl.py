"""User tasks from JSONL files.

One file per task. The first line may be a header ``{"task": name, "instruction": str,
"labels": [..]}``; every other line is ``{"sentence": str, "label": str, "split": "train"|"test"}``.
Without a header the task is named after the file, the labels are those seen, and the
instruction is a generic one.

For continual pre-training (``data.kind=text``) a line is ``{"text": str, "split": ...}``
(``sentence`` is accepted too) and there are no labels.
"""

from __future__ import annotations

import json
from pathlib import Path

from surecl.data.cl_benchmark import parse_rows
from surecl.data.task import Example, Task
from surecl.errors import SureclError

GENERIC_INSTRUCTION = "Classify the following text. Choose one from the option.\n"


def _text_rows(items: list[tuple[int, dict]], path: Path) -> list[Example]:
    out = []
    for lineno, obj in items:
        text = obj.get("text", obj.get("sentence"))
        if text is None:
            raise SureclError(f"{path} line {lineno}: missing 'text'")
        if not isinstance(text, str):
            raise SureclError(f"{path} line {lineno}: 'text' must be a string")
        if not text.strip():
            raise SureclError(f"{path} line {lineno}: empty text")
        out.append(Example(sentence=text, label=""))
    return out


def load_jsonl_task(path: str | Path, kind: str = "classify", invalid_labels: str = "error") -> Task:
    path = Path(path)
    if not path.exists():
        raise SureclError(f"data.jsonl: file {path} does not exist")
    if path.is_dir():
        raise SureclError(f"data.jsonl: {path} is a directory, not a JSONL file")
    if not path.is_file():  # reading a FIFO would block: say what it is instead
        raise SureclError(f"data.jsonl: {path} is not a regular file (a FIFO, socket or device); give a JSONL file")
    try:
        # utf-8-sig: a byte-order mark (as some Windows editors write) is dropped; splitlines()
        # below takes CRLF line ends as well as LF.
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SureclError(f"{path}: not UTF-8 (byte {exc.start})") from None
    except OSError as exc:
        raise SureclError(f"{path}: cannot read ({exc.strerror})") from None
    header: dict = {}
    rows: dict[str, list] = {"train": [], "test": []}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SureclError(f"{path} line {lineno}: malformed JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise SureclError(f"{path} line {lineno}: expected a JSON object")
        if "task" in obj and "sentence" not in obj and "text" not in obj:
            if header:
                raise SureclError(f"{path} line {lineno}: a second header line")
            header = obj
            continue
        split = obj.get("split", "train")
        if split not in rows:
            raise SureclError(f"{path} line {lineno}: split must be 'train' or 'test', got {split!r}")
        rows[split].append((lineno, obj))
    if kind == "text":
        task = Task(
            name=str(header.get("task", path.stem)), instruction="", labels=[],
            train=_text_rows(rows["train"], path), test=_text_rows(rows["test"], path), group="jsonl", kind="text",
        )
        task.check(str(path))
        return task
    splits = {}
    for split, items in rows.items():
        examples = parse_rows([o for _, o in items], f"{path} {split}")
        splits[split] = examples
    labels = header.get("labels")
    if labels is None:
        labels = sorted({ex.label for ex in splits["train"] + splits["test"]})
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise SureclError(f"{path}: header 'labels' must be a list of strings")
    instruction = header.get("instruction", GENERIC_INSTRUCTION)
    if not isinstance(instruction, str):
        raise SureclError(f"{path}: header 'instruction' must be a string")
    task = Task(
        name=str(header.get("task", path.stem)),
        instruction=instruction,
        labels=labels,
        train=splits["train"],
        test=splits["test"],
        group="jsonl",
    )
    task.check(str(path), invalid_labels)
    return task
