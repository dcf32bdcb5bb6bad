"""Tasks and streams: the unit a continual learner sees one after another."""

from __future__ import annotations

import random
import re
from collections import defaultdict
from dataclasses import dataclass, field

from surecl.errors import SureclError

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


@dataclass(frozen=True)
class Example:
    """One labelled input; ``sentence`` is the task input, ``label`` one of the task's labels."""

    sentence: str
    label: str


@dataclass
class Task:
    """A named task with two splits: ``classify`` (instruction, label options, labelled
    examples) or ``text`` (raw documents in ``sentence``, no labels: continual pre-training)."""

    name: str
    instruction: str
    labels: list[str]
    train: list[Example]
    test: list[Example]
    group: str = ""
    meta: dict = field(default_factory=dict)
    kind: str = "classify"

    @classmethod
    def from_hf(cls, dataset, name: str, *, text_column: str = "text", label_column: str = "label", train_split: str = "train",
                test_split: str = "test", test_fraction: float = 0.0, labels: list[str] | None = None, instruction: str = "",
                kind: str = "classify", invalid_labels: str = "error") -> Task:
        """A task from a Hugging Face ``datasets.Dataset`` (its rows are the train split: give
        ``test_fraction``) or ``DatasetDict`` in memory, read as a ``data.hf`` entry is
        (:class:`~surecl.config.HFTaskConfig`: the text and label columns, split names or a
        held-out fraction, the label set given, else the column's ``ClassLabel`` names, else
        sorted; the generic instruction unless one is given). Every problem is one
        :class:`~surecl.errors.SureclError` line."""
        from surecl.config import HFTaskConfig
        from surecl.data.hf import dataset_task

        key = "Task.from_hf"
        if kind not in ("classify", "text"):
            raise SureclError(f"{key}: kind must be 'classify' or 'text', not {kind!r}")
        if invalid_labels not in ("error", "drop"):
            raise SureclError(f"{key}: invalid_labels must be 'error' or 'drop', not {invalid_labels!r}")
        if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or not 0 <= test_fraction < 1:
            raise SureclError(f"{key}: test_fraction must be a number in [0, 1), not {test_fraction!r}")
        if labels is not None and (isinstance(labels, str) or not all(isinstance(lab, str) for lab in labels)):
            raise SureclError(f"{key}: labels must be a list of strings")
        for arg, value in (("name", name), ("text_column", text_column), ("label_column", label_column), ("train_split", train_split),
                           ("test_split", test_split), ("instruction", instruction)):
            if not isinstance(value, str):
                raise SureclError(f"{key}: {arg} must be a string, not {type(value).__name__}")
        spec = HFTaskConfig(task=name, text_column=text_column, label_column=label_column, train_split=train_split,
                            test_split=test_split, test_fraction=float(test_fraction), labels=list(labels or []), instruction=instruction)
        return dataset_task(dataset, spec, key, kind, invalid_labels)

    def fingerprint(self) -> str:
        """SHA-256 of what a run reads of the task: its kind, instruction, labels and every
        sampled train and test row, in order (a checkpoint records it; a resume on other rows stops)."""
        import hashlib
        import json

        rows = {"kind": self.kind, "instruction": self.instruction, "labels": list(self.labels),
                "train": [[e.sentence, e.label] for e in self.train], "test": [[e.sentence, e.label] for e in self.test]}
        return hashlib.sha256(json.dumps(rows, ensure_ascii=False, separators=(",", ":")).encode("utf-8")).hexdigest()

    def check(self, source: str = "", invalid_labels: str = "error") -> None:
        """Reject tasks a run cannot use, naming the task (and file) in one line.

        ``invalid_labels="drop"`` removes rows whose label is not one of the task's labels
        instead (MNLI's test split marks 131 rows with no gold label as ``-``), counting them
        in ``meta["dropped"]``; the empty-split checks apply to what is left."""
        where = f"{source}: " if source else ""
        if not _SAFE_NAME.match(self.name) or ".." in self.name:
            raise SureclError(f"{where}task name {self.name!r} must be letters, digits, '.', '_', '+', '-' (no path separators)")
        if self.kind == "text":
            self._check_splits(where)
            for split, rows in (("train", self.train), ("test", self.test)):
                for i, ex in enumerate(rows):
                    if not ex.sentence.strip():
                        raise SureclError(f"{where}task {self.name} {split} row {i}: empty text")
            return
        if not self.labels:
            raise SureclError(f"{where}task {self.name} has no labels")
        if len(set(self.labels)) != len(self.labels):
            raise SureclError(f"{where}task {self.name} lists a label twice")
        known = set(self.labels)
        bad = {split: [i for i, ex in enumerate(getattr(self, split)) if ex.label not in known] for split in ("train", "test")}
        if invalid_labels == "drop":
            for split, idx in bad.items():
                if idx:
                    self.meta.setdefault("dropped", {})[split] = len(idx)
                    setattr(self, split, [ex for ex in getattr(self, split) if ex.label in known])
            bad = {}
        self._check_splits(where)
        for split, idx in bad.items():
            if idx:
                ex = getattr(self, split)[idx[0]]
                more = f" ({len(idx)} such rows in {split}; data.invalid_labels=drop skips them)" if len(idx) > 1 else " (data.invalid_labels=drop skips such rows)"
                raise SureclError(f"{where}task {self.name} {split} row {idx[0]}: label {ex.label!r} is not in its labels {self.labels}{more}")

    def _check_splits(self, where: str) -> None:
        if not self.train:
            raise SureclError(f"{where}task {self.name} has an empty train split")
        if not self.test:
            raise SureclError(f"{where}task {self.name} has an empty test split")

    def as_text(self) -> Task:
        """The task's inputs as raw documents (labels and empty inputs dropped): a continual
        pre-training domain."""
        if self.kind == "text":
            return self
        strip = lambda rows: [Example(ex.sentence, "") for ex in rows if ex.sentence.strip()]  # noqa: E731
        task = Task(self.name, "", [], strip(self.train), strip(self.test), self.group, dict(self.meta), kind="text")
        task.check()
        return task


def subsample(rows: list[Example], n: int, rng: random.Random, balanced: bool) -> list[Example]:
    """Keep ``n`` rows (all if n <= 0 or n >= len); class-balanced by round-robin over labels."""
    if n <= 0 or n >= len(rows):
        out = list(rows)
        rng.shuffle(out)
        return out
    if not balanced:
        return rng.sample(rows, n)
    by_label: dict[str, list[Example]] = defaultdict(list)
    for ex in rows:
        by_label[ex.label].append(ex)
    pools = [by_label[k] for k in sorted(by_label)]
    for pool in pools:
        rng.shuffle(pool)
    out: list[Example] = []
    depth = 0
    while len(out) < n:
        for pool in pools:
            if depth < len(pool) and len(out) < n:
                out.append(pool[depth])
        depth += 1
    rng.shuffle(out)
    return out


def prepare_stream(tasks: list[Task], n_train: int, n_test: int, balanced: bool, seed: int, test_balanced: bool | None = None,
                   draw_key: str = "") -> list[Task]:
    """Subsample each task with a per-task seeded RNG, so a task's sample does not depend on order
    (unless ``draw_key``, e.g. the task order, is given: it joins the RNG's seed, so runs with
    different keys draw independent samples; ``data.draw=order``).
    ``balanced`` applies to the train split and, unless ``test_balanced`` is given, the test split."""
    test_balanced = balanced if test_balanced is None else test_balanced
    names = [t.name for t in tasks]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SureclError(f"task named twice in the stream: {', '.join(dupes)}")
    out = []
    for task in tasks:
        rng = random.Random(f"{seed}:{draw_key}:{task.name}" if draw_key else f"{seed}:{task.name}")
        out.append(
            Task(
                name=task.name,
                instruction=task.instruction,
                labels=list(task.labels),
                train=subsample(task.train, n_train, rng, balanced),
                test=subsample(task.test, n_test, rng, test_balanced),
                group=task.group,
                meta=dict(task.meta),
                kind=task.kind,
            )
        )
    return out
