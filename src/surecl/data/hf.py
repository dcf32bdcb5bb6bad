"""User tasks read with Hugging Face ``datasets`` (``data.hf``; ``pip install surecl[hf]``).

Each ``data.hf`` entry (:class:`~surecl.config.HFTaskConfig`) is one task: a folder written by
``save_to_disk``, a Parquet / CSV / JSON(L) file, a folder of such files (each file the split
its name names: :func:`_folder_splits`), or a hub id where the hub is reachable. The text and
label columns, the split names (or a held-out fraction of the train split) and the label set
are options. The task is built as a
``data.jsonl`` task would be from the same rows: the generic instruction unless one is given,
the labels in the given order, else the column's ``ClassLabel`` names, else sorted.

``datasets`` is imported only when such a task is configured. Every problem with a source (a
missing path, an unreadable file, a missing column or split, labels that are neither strings
nor integers, a hub id while the hub is unreachable) is a one-line
:class:`~surecl.errors.SureclError` naming the entry's key.
"""

from __future__ import annotations

import contextlib
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from surecl.data.jsonl import GENERIC_INSTRUCTION
from surecl.data.task import _SAFE_NAME, Example, Task, clean_label, data_warning, user_instruction, warn_test_only_labels
from surecl.errors import SureclError
from surecl.sections import HFTaskConfig

DATA_FILES = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json"}
"""Data-file suffix -> the ``datasets`` builder that reads it."""
_CSV_TEXT = {"keep_default_na": False, "na_values": [""]}
"""A CSV field is its text: "NA" (North America), "None", "null" stay words (pandas reads them
as missing by default); only an empty field is missing. Every column is read as text
(:func:`_load_files`): "01" stays "01", "True" a word, a column of numbers text."""
HUB_TIMEOUT_S = 5.0
"""How long the hub may take to say whether a dataset id exists before it counts as unreachable."""
_STRINGS = ("string", "large_string")
_INT_TEXT = re.compile(r"[+-]?\d+")
_INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_SHARD = re.compile(r"(.+)-\d+-of-\d+(?:-[0-9a-fA-F]+)?")
"""A hub shard's file name without its suffix: ``train-00000-of-00002`` (or, as older hub files
are named, ``train-00000-of-00002-<hash>``) is part of ``train``."""


def _import_datasets(key: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise SureclError(f"{key}: reading Hugging Face datasets needs the `datasets` package: pip install 'surecl[hf]'") from None
    return datasets


@contextlib.contextmanager
def _quiet(datasets: Any) -> Iterator[None]:
    """No ``datasets`` progress bars or warnings while a task is read: the CLI's one-line
    errors stay one line, and a run's console shows surecl's own lines."""
    bars = not datasets.utils.are_progress_bars_disabled()
    level = datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its loaders log a failure, then raise it
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)
        if bars:
            datasets.enable_progress_bars()


def _why(exc: BaseException, root: bool = True) -> str:
    """An exception as one short line; with ``root``, its root cause (``datasets`` wraps a
    parser's error in "An error occurred while generating the dataset")."""
    seen = {id(exc)}
    while root and (exc.__cause__ or exc.__context__) is not None and id(exc.__cause__ or exc.__context__) not in seen:
        exc = exc.__cause__ or exc.__context__
        seen.add(id(exc))
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 200:
        first = first[:200] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _looks_local(path: str) -> bool:
    """A path that cannot be a hub id (``name`` or ``owner/name``): it is a missing local path."""
    p = Path(path)
    return p.is_absolute() or path.startswith((".", "~")) or "\\" in path or path.count("/") > 1 or p.suffix.lower() in DATA_FILES


def _hub(datasets: Any, spec: HFTaskConfig, key: str) -> Any:
    """``load_dataset(hub id)``, after asking the hub (with a short timeout) whether it is
    there, so that an unreachable hub is one line at once rather than minutes of retries."""
    from huggingface_hub import constants

    offline = bool(constants.HF_HUB_OFFLINE)
    where = f"{key}.path: {spec.path!r} is not a local file or folder"
    if not offline:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

        try:
            HfApi().dataset_info(spec.path, timeout=HUB_TIMEOUT_S)
        except GatedRepoError:
            raise SureclError(f"{where}, and the hub dataset is gated: accept its terms and log in (hf auth login)") from None
        except RepositoryNotFoundError:
            raise SureclError(f"{where}, and the Hugging Face hub has no dataset of that id") from None
        except Exception as exc:  # DNS, refused connection, timeout, proxy, HTTP errors
            raise SureclError(f"{where}, and the Hugging Face hub is not reachable to fetch it ({_why(exc)})") from None
    try:
        return datasets.load_dataset(spec.path, spec.name or None)
    except Exception as exc:
        mode = ": HF_HUB_OFFLINE is set and it is not in the local datasets cache" if offline else ""
        raise SureclError(f"{where}, and it cannot be loaded from the Hugging Face hub{mode} ({_why(exc, root=False)})") from None


def _read_error(exc: BaseException, path: Path, what: str, key: str, split: str = "") -> SureclError:
    """A failed read as one line: an empty split (which ``datasets`` refuses) by its name."""
    empty = re.search(r'Instruction "([^"]+)" corresponds to no data', str(exc))
    if empty:
        return SureclError(f"{key}.path: {path} has an empty {split or empty.group(1)} split")
    return SureclError(f"{key}.path: cannot read {path} as {what} ({_why(exc)})")


def _load_files(datasets: Any, builder: str, files: list[Path]) -> Any:
    """``files`` (one split) read by ``builder``; a CSV with every column as its text."""
    extra: dict[str, Any] = {}
    if builder == "csv":
        import pandas as pd

        header = pd.read_csv(files[0], nrows=0, **_CSV_TEXT).columns  # pandas would guess a type per column
        extra = {**_CSV_TEXT, "features": datasets.Features({str(c): datasets.Value("string") for c in header})}
    return datasets.load_dataset(builder, data_files={"train": [str(f) for f in files]}, **extra)["train"]


def _folder_splits(path: Path, spec: HFTaskConfig, key: str) -> dict[str, list[Path]]:
    """The data files of a folder by split: a file's split is its name without the suffix
    (``test.csv``: ``test``), a hub shard's without its shard number
    (``train-00000-of-00002.parquet``: ``train``), or for a file named by a number alone
    (``train/0000.parquet``) its folder's name. Every file is its split: one of a split the entry
    does not read is left out with a warning; a split whose files are in two folders or of two
    formats, or a split named both plainly and as shards is refused (``datasets`` groups files
    by keywords instead: ``eval.csv`` and ``test_old.csv`` into the test split, and skips the
    fewer of two formats)."""
    files = sorted(f for f in path.rglob("*") if f.is_file() and f.suffix.lower() in DATA_FILES
                   and not any(part.startswith(".") for part in f.relative_to(path).parts))
    if not files:
        raise SureclError(f"{key}.path: cannot read {path} as a folder of data files (it holds no {', '.join(DATA_FILES)} file)")
    splits: dict[str, list[Path]] = {}
    for f in files:
        stem = f.stem
        shard = _SHARD.fullmatch(stem)
        split = shard.group(1) if shard else f.parent.name if stem.isdigit() and f.parent != path else stem
        splits.setdefault(split, []).append(f)
    read = [spec.train_split] if spec.test_fraction > 0 else [spec.train_split, spec.test_split]
    rel = lambda f: str(f.relative_to(path))  # noqa: E731
    if len(splits) == 1 and not set(splits) & set(read) and spec.train_split == "train":
        # one split, named after no split the entry reads (reviews.csv): the train split, as datasets reads such a folder
        splits = {"train": next(iter(splits.values()))}
    unread = [(split, f) for split, fs in splits.items() if split not in read for f in fs]
    if unread:  # a hub snapshot's validation split is usual; a train_extra.csv may be a mistake: said, not skipped silently
        split, f = unread[0]
        more = f" and {len(unread) - 1} more" if len(unread) > 1 else ""
        reads = f"splits {read[0]!r} and {read[1]!r}" if len(read) > 1 else f"split {read[0]!r}"
        data_warning(f"{key}.path: {path} holds {rel(f)}{more}, which {'are' if more else 'is'} not read: a file's split is its name "
                     f"({rel(f)}: split {split!r}), and this entry reads {reads}; name its split with {key}.train_split / test_split "
                     "to read it")
        splits = {split: fs for split, fs in splits.items() if split in read}
    for split, fs in splits.items():
        kinds = {DATA_FILES[f.suffix.lower()] for f in fs}
        shown = ", ".join(rel(f) for f in fs[:3]) + (" ..." if len(fs) > 3 else "")
        if len({f.parent for f in fs}) > 1:
            raise SureclError(f"{key}.path: the {split!r} files of {path} are in more than one folder ({shown}); point {key}.path at one")
        if len(kinds) > 1:
            raise SureclError(f"{key}.path: the {split!r} files of {path} are of more than one format ({shown}); keep one")
        if len(fs) > 1 and any(f.stem == split for f in fs):
            raise SureclError(f"{key}.path: {path} holds {split!r} both as one file and as others ({shown}); keep the one or the shards")
    return splits


def _open(datasets: Any, spec: HFTaskConfig, key: str) -> tuple[dict[str, Any], set[str]]:
    """The source's splits, name -> ``datasets.Dataset``, and the names of those read from CSV
    files (whose fields are text)."""
    path = Path(spec.path).expanduser()
    if path.exists():
        if path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file()):
            try:
                loaded = datasets.load_from_disk(str(path))
            except Exception as exc:
                raise _read_error(exc, path, "a saved dataset", key) from None
        elif path.is_dir():
            splits, csv = {}, set()
            for split, files in _folder_splits(path, spec, key).items():
                builder = DATA_FILES[files[0].suffix.lower()]
                try:
                    splits[split] = _load_files(datasets, builder, files)
                except Exception as exc:
                    raise _read_error(exc, path, "a folder of data files", key, split) from None
                if builder == "csv":
                    csv.add(split)
            return splits, csv
        elif path.is_file():
            builder = DATA_FILES.get(path.suffix.lower())
            if builder is None:
                raise SureclError(
                    f"{key}.path: {path} is not a data file datasets reads here (suffix {', '.join(DATA_FILES)}), nor a dataset folder"
                )
            try:
                return {"train": _load_files(datasets, builder, [path])}, {"train"} if builder == "csv" else set()
            except Exception as exc:
                raise _read_error(exc, path, builder.upper(), key) from None
        else:  # reading a FIFO would block: say what it is instead
            raise SureclError(f"{key}.path: {path} is not a regular file or folder (a FIFO, socket or device)")
    elif _looks_local(spec.path):
        raise SureclError(f"{key}.path: {path} does not exist")
    else:
        loaded = _hub(datasets, spec, key)
    if isinstance(loaded, datasets.Dataset):
        return {"train": loaded}, set()
    if isinstance(loaded, datasets.DatasetDict):
        return dict(loaded), set()
    raise SureclError(f"{key}.path: {spec.path} holds a {type(loaded).__name__}, not a dataset with splits")


def _default_name(spec: HFTaskConfig) -> str:
    path = Path(spec.path).expanduser()
    if path.exists():
        return path.stem if path.is_file() else path.resolve().name
    name = spec.path.rstrip("/").rsplit("/", 1)[-1]
    return f"{name}-{spec.name}" if spec.name else name


def _split(splits: dict[str, Any], name: str, key: str, src: str, hint: str = "") -> Any:
    if name not in splits:
        raise SureclError(f"{key}: {src} has no split {name!r} (its splits: {', '.join(splits) or 'none'}){hint}")
    return splits[name]


def _column(ds: Any, column: str, key: str, src: str, split: str) -> list:
    if column not in ds.column_names:
        raise SureclError(f"{key}: {src} split {split!r} has no column {column!r} (its columns: {', '.join(ds.column_names)})")
    return ds.with_format("arrow")[column].to_pylist()  # a Column iterated row by row is 10x slower


def _texts(ds: Any, spec: HFTaskConfig, key: str, src: str, split: str) -> list[str]:
    col = spec.text_column
    values = _column(ds, col, f"{key}.text_column", src, split)
    feature = ds.features[col]
    if getattr(feature, "dtype", None) not in _STRINGS:
        raise SureclError(f"{key}.text_column: column {col!r} of {src} holds {_describe(feature)}, not text")
    for i, v in enumerate(values):
        if v is None:
            raise SureclError(f"{key}.text_column: {src} {split} row {i}: no text (null)")
    return values


def _targets(ds: Any, spec: HFTaskConfig, key: str, src: str, split: str) -> list[str]:
    """A generation task's target texts (``label_column``): strings, none null."""
    col = spec.label_column
    values = _column(ds, col, f"{key}.label_column", src, split)
    if getattr(ds.features[col], "dtype", None) not in _STRINGS:
        raise SureclError(f"{key}.label_column: column {col!r} of {src} holds {_describe(ds.features[col])}; a generation target must be text")
    for i, v in enumerate(values):
        if v is None:
            raise SureclError(f"{key}.label_column: {src} {split} row {i}: no target (null)")
    return values


def _describe(feature: Any) -> str:
    dtype = getattr(feature, "dtype", None)
    return f"{dtype} values" if isinstance(dtype, str) and dtype != "list" else f"{type(feature).__name__} values"


def _held_out(train: list[Example], n_test: int, rng: random.Random) -> set[int]:
    """The rows ``test_fraction`` holds out: ``n_test`` drawn at random, or where some text
    occurs more than once, whole groups of identical rows (their input and conversation) drawn
    until ``n_test`` are held, so no test row has a copy among the training rows."""
    keys = [(ex.sentence, ex.messages) for ex in train]
    if len(set(keys)) == len(keys):
        return set(rng.sample(range(len(train)), n_test))
    groups: dict = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    order = list(groups.values())
    held: set[int] = set()
    for g in rng.sample(order, len(order)):
        if len(held) >= n_test:
            break
        held.update(g)
    return held


def _given_labels(spec: HFTaskConfig) -> list[str]:
    """The labels the task spec names, stripped as the rows' labels are."""
    return [clean_label(x) for x in spec.labels]


def _class_names(feature: Any, key: str, col: str, src: str) -> list[str] | None:
    """A ``ClassLabel`` column's names as every reader takes a label (stripped, NFC); None
    without. Two names that clean to one are refused: their rows would be one class."""
    if type(feature).__name__ != "ClassLabel":
        return None
    names = [clean_label(str(n)) for n in feature.names]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SureclError(f"{key}.label_column: the ClassLabel names of column {col!r} of {src} name {', '.join(map(repr, twice))} "
                          "twice when taken as every label is (stripped, in Unicode's composed form NFC)")
    return names


def _labels(ds: Any, spec: HFTaskConfig, key: str, src: str, split: str, csv: bool = False) -> tuple[list[str], list[str] | None]:
    """The split's labels as strings, and the column's ``ClassLabel`` names (None without).
    ``csv``: the column was read from a CSV file, whose fields are text: a field that writes a
    whole number is read as that integer where an integer means a position (given labels that
    are names), else it is its text."""
    col = spec.label_column
    values = _column(ds, col, f"{key}.label_column", src, split)
    feature = ds.features[col]
    names = _class_names(feature, key, col, src)
    dtype = getattr(feature, "dtype", None)
    if names is None and dtype not in _STRINGS + _INTS:
        if isinstance(dtype, str) and dtype.startswith("float"):  # a column of integers with an empty field reads as floats
            missing = next((i for i, v in enumerate(values) if v is None or v != v), None)
            if missing is not None:
                raise SureclError(f"{key}.label_column: {src} {split} row {missing}: no label (an empty field)")
        raise SureclError(f"{key}.label_column: column {col!r} of {src} holds {_describe(feature)}; labels must be strings or integers")
    given = _given_labels(spec)
    numbers = [bool(_INT_TEXT.fullmatch(x)) for x in given]
    integers = dtype in _INTS or (csv and any(isinstance(v, str) and _INT_TEXT.fullmatch(v.strip()) for v in values))
    if names is None and integers and any(numbers) and not all(numbers):
        raise SureclError(f"{key}.labels: column {col!r} of {src} holds integers and the given labels mix numbers with names "
                          f"({', '.join(given)}), so an integer could be a position among them or the label itself; give "
                          "every label as a name (the integers are positions) or every label as a number (the integers are the labels)")
    # given labels that are all numbers name the integers themselves ("1", "2", "3" for a 1-3
    # rating), never positions among them: 1 would read as "2" and 3, past the end, as "3"
    index = names if names is not None else (given if given and not all(numbers) else None)
    out = []
    for i, v in enumerate(values):
        if v is None:
            raise SureclError(f"{key}.label_column: {src} {split} row {i}: no label ({'an empty field' if csv else 'null'})")
        if isinstance(v, str) and csv and index is not None and _INT_TEXT.fullmatch(v.strip()):
            out.append(index[int(v)] if 0 <= int(v) < len(index) else clean_label(v))
        elif isinstance(v, str):
            out.append(clean_label(v))
        elif index is not None and 0 <= v < len(index):
            out.append(index[v])
        else:  # no names, or outside them (-1 marks an unlabelled row in many hub datasets): Task.check names it
            out.append(str(v))
    return out, names


def _marked_test(ds: Any, spec: HFTaskConfig, key: str, src: str, split: str) -> None:
    """A ``split`` column (a surecl JSONL file's) that marks rows of a split read for training
    ``test`` is refused: this reader does not honour it, so those rows would be trained on."""
    if "split" not in ds.column_names or "split" in (spec.text_column, spec.label_column):
        return
    marked = [i for i, v in enumerate(ds.with_format("arrow")["split"].to_pylist()) if isinstance(v, str) and v.strip() == "test"]
    if marked:
        raise SureclError(f"{key}: {src} split {split!r} has a 'split' column marking {len(marked)} rows 'test' (row {marked[0]} first), "
                          f"which this reader does not honour: they would be trained on{' or held out at random' if spec.test_fraction > 0 else ''}; "
                          "give a surecl JSONL file as data.jsonl, which reads the column, or drop those rows or the column")


def load_hf_task(spec: HFTaskConfig, key: str = "data.hf[0]", kind: str = "classify", invalid_labels: str = "error") -> Task:
    """One ``data.hf`` entry as a :class:`Task` (``key`` names the entry in messages)."""
    datasets = _import_datasets(key)
    name = spec.task or _default_name(spec)
    if not _SAFE_NAME.match(name) or ".." in name:
        raise SureclError(f"{key}.task: task name {name!r} must be letters, digits, '.', '_', '+', '-' (set {key}.task)")
    with _quiet(datasets):
        splits, csv = _open(datasets, spec, key)
    return splits_task(datasets, splits, spec, name, key, spec.path, kind, invalid_labels, csv)


def dataset_task(dataset: Any, spec: HFTaskConfig, key: str = "dataset", kind: str = "classify", invalid_labels: str = "error") -> Task:
    """A :class:`Task` from a ``datasets.Dataset`` (its rows are the ``train`` split) or
    ``DatasetDict`` in memory, read as a ``data.hf`` entry's source is (``spec.path`` unused;
    ``spec.task`` names it): :meth:`surecl.data.task.Task.from_hf`."""
    datasets = _import_datasets(key)
    if isinstance(dataset, datasets.DatasetDict):
        splits = dict(dataset)
    elif isinstance(dataset, datasets.Dataset):
        splits = {"train": dataset}
    else:
        raise SureclError(f"{key}: expected a datasets.Dataset or DatasetDict, got {type(dataset).__name__}")
    name = spec.task
    if not name or not _SAFE_NAME.match(name) or ".." in name:
        raise SureclError(f"{key}: task name {name!r} must be letters, digits, '.', '_', '+', '-' (give name=)")
    src = f"the in-memory {type(dataset).__name__}"
    return splits_task(datasets, splits, spec, name, key, src, kind, invalid_labels)


def splits_task(datasets: Any, splits: dict[str, Any], spec: HFTaskConfig, name: str, key: str, src: str, kind: str = "classify",
                invalid_labels: str = "error", csv: set[str] | frozenset[str] = frozenset()) -> Task:
    """The task of a source's opened splits (name -> ``datasets.Dataset``): columns, split or
    held-out fraction, labels, as :class:`~surecl.config.HFTaskConfig` says; ``src`` names the
    source in messages, ``csv`` the splits read from CSV files (their fields are text)."""
    with _quiet(datasets):
        hold_out = spec.test_fraction > 0
        train_ds = _split(splits, spec.train_split, f"{key}.train_split", src)
        test_ds = None
        if not hold_out:
            if spec.test_split == spec.train_split:
                raise SureclError(f"{key}: test_split and train_split are both {spec.train_split!r}, so the task would be tested on "
                                  f"its training examples; name another split, or hold out part of it with {key}.test_fraction")
            hint = f"; name the test split with {key}.test_split, or hold out part of the train split with {key}.test_fraction"
            test_ds = _split(splits, spec.test_split, f"{key}.test_split", src, hint)
        parts = {"train": train_ds} if hold_out else {"train": train_ds, "test": test_ds}
        rows: dict[str, list[Example]] = {}
        class_names = None
        for split, ds in parts.items():
            label_of = getattr(spec, f"{split}_split")
            if split == "train":
                _marked_test(ds, spec, key, src, label_of)
            texts = _texts(ds, spec, key, src, label_of)
            if kind == "text":
                rows[split] = [Example(sentence=t, label="") for t in texts]
                continue
            if kind == "generate":
                rows[split] = [Example(sentence=t, label=y) for t, y in zip(texts, _targets(ds, spec, key, src, label_of))]
                continue
            labels, names = _labels(ds, spec, key, src, label_of, label_of in csv)
            class_names = class_names or names
            rows[split] = [Example(sentence=t, label=lab) for t, lab in zip(texts, labels)]
    where = f"{key} ({src})"
    if kind == "text":
        make = lambda train, test: Task(name=name, instruction="", labels=[], train=train, test=test, group="hf", kind="text")  # noqa: E731
    elif kind == "generate":
        make = lambda train, test: Task(name=name, instruction=user_instruction(spec.instruction), labels=[], train=train,  # noqa: E731
                                        test=test, group="hf", kind="generate", metric=spec.metric)
    else:
        labels = _given_labels(spec) or class_names or sorted({ex.label for split in rows.values() for ex in split})
        make = lambda train, test: Task(  # noqa: E731
            name=name, instruction=user_instruction(spec.instruction) or GENERIC_INSTRUCTION, labels=labels, train=train, test=test,
            group="hf", metric=spec.metric,  # a generation metric on a classification task: Task.check refuses it
        )
    if hold_out:
        train = rows["train"]
        n_test = round(len(train) * spec.test_fraction)
        if not 1 <= n_test < len(train):
            left = "no test rows" if n_test < 1 else "no train rows"
            raise SureclError(f"{key}.test_fraction: {spec.test_fraction:g} of {src}'s {len(train)} train rows leaves {left}")
        # the rows' checks before the hold-out shuffles them, so an error names the source's row
        # (its rows stand in for the test split too: whatever data.invalid_labels=drop removes
        # from one, it removes from the other)
        make(train, train).check(where, invalid_labels)
        held = _held_out(train, n_test, random.Random(f"hf-test:{name}"))
        rows = {"train": [ex for i, ex in enumerate(train) if i not in held], "test": [ex for i, ex in enumerate(train) if i in held]}
    task = make(rows["train"], rows["test"])
    task.check(where, invalid_labels)
    if kind != "classify":
        return task
    if not (_given_labels(spec) or class_names):
        warn_test_only_labels(name, task.train, task.test, f"give {'labels=' if key == 'Task.from_hf' else key + '.labels'}")
    return task


def task_from_hf(cls, dataset, name: str, *, text_column: str = "text", label_column: str = "label", train_split: str = "train",
                 test_split: str = "test", test_fraction: float = 0.0, labels: list[str] | None = None, instruction: str = "",
                 kind: str = "classify", invalid_labels: str = "error", metric: str = "") -> Task:
    """A task from a Hugging Face ``datasets.Dataset`` (its rows are the train split: give
    ``test_fraction``) or ``DatasetDict`` in memory, read as a ``data.hf`` entry is
    (:class:`~surecl.config.HFTaskConfig`: the text and label columns, split names or a
    held-out fraction, the label set given, else the column's ``ClassLabel`` names, else
    sorted; the generic instruction unless one is given). ``kind``: ``classify``, ``text``
    (continual pre-training: the text column alone) or ``generate`` (the label column holds each
    row's target text; ``metric`` ``rouge_l``, the default, or ``exact_match``). Every problem is
    one :class:`~surecl.errors.SureclError` line."""
    key = "Task.from_hf"
    if kind not in ("classify", "text", "generate"):
        raise SureclError(f"{key}: kind must be 'classify', 'text' or 'generate', not {kind!r}")
    if invalid_labels not in ("error", "drop"):
        raise SureclError(f"{key}: invalid_labels must be 'error' or 'drop', not {invalid_labels!r}")
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or not 0 <= test_fraction < 1:
        raise SureclError(f"{key}: test_fraction must be a number in [0, 1), not {test_fraction!r}")
    if labels is not None and (isinstance(labels, str) or not all(isinstance(lab, str) for lab in labels)):
        raise SureclError(f"{key}: labels must be a list of strings")
    for arg, value in (("name", name), ("text_column", text_column), ("label_column", label_column), ("train_split", train_split),
                       ("test_split", test_split), ("instruction", instruction), ("metric", metric)):
        if not isinstance(value, str):
            raise SureclError(f"{key}: {arg} must be a string, not {type(value).__name__}")
    spec = HFTaskConfig(task=name, text_column=text_column, label_column=label_column, train_split=train_split,
                        test_split=test_split, test_fraction=float(test_fraction), labels=list(labels or []), instruction=instruction,
                        metric=metric)
    return dataset_task(dataset, spec, key, kind, invalid_labels)
