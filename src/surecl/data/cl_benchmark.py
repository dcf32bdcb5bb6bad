"""Reader for the O-LoRA ``CL_Benchmark`` folder layout and its task orders 1-6.

Layout: ``<root>/<group>/<Task>/{train,test,labels}.json`` with rows ``{"label", "sentence"}``
and ``<root>/instruction_config.json`` mapping each group to its instruction. The same reader
loads the embedded default benchmark, which is written in this layout.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

from surecl.data.task import Example, Task, clean_label, user_instruction
from surecl.errors import SureclError

# O-LoRA scripts (orders 1-3) and the N-LoRA fork (orders 4-6).
ORDERS: dict[str, list[str]] = {
    "1": ["dbpedia", "amazon", "yahoo", "agnews"],
    "2": ["dbpedia", "amazon", "agnews", "yahoo"],
    "3": ["yahoo", "amazon", "agnews", "dbpedia"],
    "4": ["MNLI", "CB", "WiC", "COPA", "QQP", "BoolQA", "RTE", "IMDB", "yelp", "amazon", "SST-2", "dbpedia", "agnews", "MultiRC", "yahoo"],
    "5": ["MultiRC", "BoolQA", "WiC", "MNLI", "CB", "COPA", "QQP", "RTE", "IMDB", "SST-2", "dbpedia", "agnews", "yelp", "amazon", "yahoo"],
    "6": ["yelp", "amazon", "MNLI", "CB", "COPA", "QQP", "RTE", "IMDB", "SST-2", "dbpedia", "agnews", "yahoo", "MultiRC", "BoolQA", "WiC"],
}
BENCHMARK_OF_ORDER = {"1": "Standard CL", "2": "Standard CL", "3": "Standard CL", "4": "LNT", "5": "LNT", "6": "LNT"}


def wide_encoding(data: bytes) -> str:
    """``"UTF-16"`` or ``"UTF-32"`` where the file starts with that encoding's byte-order mark,
    or its first bytes hold NULs as that encoding writes ASCII (JSON's ``{"`` ...: one in every
    two bytes, or three in four; Windows tools save "Unicode" text as UTF-16), else ``""``:
    said as such, not as a bad byte or malformed JSON."""
    if data.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "UTF-32"
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "UTF-16"
    head = data[:64]
    if len(head) < 4 or b"\x00" not in head:
        return ""
    if head[1:4] == b"\x00" * 3 or head[:3] == b"\x00" * 3:
        return "UTF-32"
    odd, even = head[1::2].count(0), head[0::2].count(0)
    return "UTF-16" if min(odd, even) == 0 and max(odd, even) * 2 >= len(head) // 2 else ""


def read_bytes(path: Path) -> bytes:
    """A data file's bytes; one line where it cannot be read or is UTF-16/32 text
    (:func:`wide_encoding`), which the readers would call a bad byte or malformed JSON."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SureclError(f"{path}: cannot read ({exc.strerror})") from None
    wide = wide_encoding(raw)
    if wide:
        raise SureclError(f"{path}: looks like {wide}, not UTF-8: save it as UTF-8")
    return raw


def read_json(path: Path) -> Any:
    if path.exists() and not path.is_file():  # a directory or FIFO: reading one fails or blocks
        raise SureclError(f"{path}: is not a regular file")
    raw = read_bytes(path)
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark is dropped
    except UnicodeDecodeError as exc:
        raise SureclError(f"{path}: not UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SureclError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:  # nesting deeper than Python's parser follows
        raise SureclError(f"{path}: malformed JSON (nested too deeply)") from None
    except ValueError as exc:  # what json's own checks refuse, e.g. an integer of more than 4300 digits
        raise SureclError(f"{path}: malformed JSON ({str(exc).splitlines()[0]})") from None


def _text(value: str, where: str) -> str:
    """``value`` if it is text UTF-8 can write, else one line naming ``where`` (JSON's ``\\ud800``
    escapes give a lone surrogate, which no tokenizer or fingerprint can read)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise SureclError(f"{where}: invalid Unicode (a lone surrogate escape such as \\ud800)") from None
    return value


def parse_rows(rows: Any, source: str, lines: list[int] | None = None) -> list[Example]:
    """Rows of ``{"label": str, "sentence": str}``; anything else is named by row number (or,
    with ``lines``, by each row's line in its file)."""
    if not isinstance(rows, list):
        raise SureclError(f"{source}: expected a JSON list of rows")
    out = []
    for i, row in enumerate(rows):
        at = f"line {lines[i]}" if lines is not None else f"row {i}"
        if not isinstance(row, dict):
            raise SureclError(f"{source} {at}: expected an object with 'sentence' and 'label'")
        for key in ("sentence", "label"):
            if key not in row:
                raise SureclError(f"{source} {at}: missing '{key}'")
            if not isinstance(row[key], str):
                raise SureclError(f"{source} {at}: '{key}' must be a string")
            _text(row[key], f"{source} {at}: '{key}'")
        out.append(Example(sentence=row["sentence"], label=clean_label(row["label"])))
    return out


def _instructions(root: Path) -> dict[str, str]:
    """Group -> its instruction, keyed NFC as group folders are read (a file written on macOS
    may hold decomposed names)."""
    path = root / "instruction_config.json"
    if not path.is_file():
        raise SureclError(f"{root}: not a CL_Benchmark folder (no instruction_config.json)")
    data = read_json(path)
    if not isinstance(data, dict):
        raise SureclError(f"{path}: expected an object mapping groups to instructions")
    out = {}
    for group, value in data.items():
        entry = value[0] if isinstance(value, list) and value else value
        if isinstance(entry, dict):
            entry = entry.get("instruction")
        if not isinstance(entry, str):
            raise SureclError(f"{path}: group {group!r} has no instruction string")
        out[unicodedata.normalize("NFC", group)] = _text(entry, f"{path}: group {group!r}'s instruction")
    return out


def index_tasks(root: Path) -> dict[str, Path]:
    """Task name -> its folder, for every ``<group>/<Task>`` holding a labels.json."""
    found: dict[str, Path] = {}
    for labels in sorted(root.glob("*/*/labels.json")):
        name = unicodedata.normalize("NFC", labels.parent.name)  # a folder made on macOS is named NFD; names are read NFC
        if name in found:  # data.tasks names a task by its name alone: which one would be read?
            raise SureclError(f"{root}: two tasks named {name!r} ({found[name].relative_to(root)} and "
                              f"{labels.parent.relative_to(root)}); rename one of the folders")
        found[name] = labels.parent
    return found


def available_tasks(root: Path) -> list[str]:
    return sorted(index_tasks(root))


def load_task(folder: Path, instructions: dict[str, str], invalid_labels: str = "error") -> Task:
    group = unicodedata.normalize("NFC", folder.parent.name)  # a folder made on macOS is named NFD, as index_tasks reads it
    name = unicodedata.normalize("NFC", folder.name)
    labels = read_json(folder / "labels.json")
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise SureclError(f"{folder / 'labels.json'}: expected a JSON list of label strings")
    for i, x in enumerate(labels):
        _text(x, f"{folder / 'labels.json'} label {i}")
    # COPA has no instruction upstream; the options line still tells the model what to answer.
    # One ending in a word gets a newline, as in every reader (O-LoRA's end in "\n", the
    # embedded benchmark's in a space: both stay as written).
    instruction = user_instruction(instructions.get(group, instructions.get(name, "")))
    if not instruction and group not in ("COPA",) and name != "COPA":
        raise SureclError(f"{folder.parent.parent / 'instruction_config.json'}: no instruction for group {group!r}")
    splits = {}
    for split in ("train", "test"):
        path = folder / f"{split}.json"
        if not path.is_file():
            raise SureclError(f"{path}: missing {split} split")
        splits[split] = parse_rows(read_json(path), str(path))
    task = Task(
        name=name,
        instruction=instruction,
        labels=[clean_label(x) for x in labels],
        train=splits["train"],
        test=splits["test"],
        group=group,
    )
    task.check(str(folder), invalid_labels)
    return task


def _wanted(root: Path, order: str, tasks: list[str]) -> list[str]:
    """The task names ``tasks``, or ``order`` (1-6, or ``default``: the folder's
    ``MANIFEST.json`` order, else every task it holds), asks for, in order."""
    if tasks:
        return [unicodedata.normalize("NFC", t) for t in tasks]
    if order in ORDERS:
        return list(ORDERS[order])
    if order == "default":
        manifest = root / "MANIFEST.json"
        if manifest.is_file():
            data = read_json(manifest)
            if isinstance(data, dict) and "order" not in data:  # a manifest naming no order: every task the folder holds
                return available_tasks(root)
            order_list = data.get("order") if isinstance(data, dict) else None
            if not isinstance(order_list, list) or not all(isinstance(t, str) for t in order_list) or not order_list:
                raise SureclError(f"{manifest}: expected an object whose 'order' is a non-empty list of task names")
            return [unicodedata.normalize("NFC", t) for t in order_list]
        return available_tasks(root)
    raise SureclError(f"data.order: unknown order {order!r} (choose from {', '.join(ORDERS)} or default)")


def resolve_order(root: Path, order: str, tasks: list[str], allow_missing: bool) -> list[str]:
    """Task names to train on, in order; missing ones are one clear error unless allowed
    (``data.allow_missing``: the present ones, which :func:`order_missing` names)."""
    wanted = _wanted(root, order, tasks)
    dupes = sorted({t for t in wanted if wanted.count(t) > 1})
    if dupes:
        raise SureclError(f"task named twice in the order: {', '.join(dupes)}")
    have = index_tasks(root)
    missing = [t for t in wanted if t not in have]
    kept = [t for t in wanted if t in have]
    if not kept:  # data.allow_missing would fail too: not the folder the order is for
        if not tasks and order in ORDERS:
            raise SureclError(f"{root}: holds none of the tasks order {order} names ({', '.join(wanted)}); the order needs "
                              "data.benchmark=/path/to/CL_Benchmark (O-LoRA's benchmark folder)")
        if not have:  # the folder above CL_Benchmark, or another folder
            raise SureclError(f"{root}: holds no <group>/<task>/labels.json (point data.benchmark at the folder holding "
                              "instruction_config.json)")
        raise SureclError(f"{root}: holds none of the tasks {', '.join(wanted)} (its tasks: {', '.join(sorted(have))})")
    if missing and not allow_missing:
        raise SureclError(
            f"{root}: lacks task(s) {', '.join(missing)} named by the order "
            "(set data.allow_missing=true to run the available ones)"
        )
    return kept


def order_missing(root: Path, order: str, tasks: list[str]) -> list[str]:
    """The tasks ``order`` (or ``tasks``, or the folder's manifest) names that the folder
    ``root`` lacks, in order: what ``data.allow_missing`` leaves out of the stream."""
    have = index_tasks(root)
    return [t for t in _wanted(root, order, tasks) if t not in have]


def load_benchmark(
    root: Path, order: str = "default", tasks: list[str] | None = None, allow_missing: bool = False, invalid_labels: str = "error"
) -> list[Task]:
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise SureclError(f"data.benchmark: {root} is a file, not a CL_Benchmark folder (a JSONL task goes in data.jsonl)")
    if not root.is_dir():
        raise SureclError(f"data.benchmark: folder {root} does not exist")
    names = resolve_order(root, order, tasks or [], allow_missing)
    instructions = _instructions(root)
    folders = index_tasks(root)
    out = [load_task(folders[name], instructions, invalid_labels) for name in names]
    missing = order_missing(root, order, tasks or [])
    for t in out:  # what data.allow_missing left out, for missing_tasks_warning
        t.meta["order_missing"] = missing
    return out
