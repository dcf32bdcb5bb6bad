"""Tasks and streams: the unit a continual learner sees one after another."""

from __future__ import annotations

import os
import random
import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field

from surecl.errors import SureclError


def composed_keys(names):
    """A mapping keyed by task names (fingerprints, digests saved by an earlier run) with its
    names in Unicode's composed form (NFC), as task names are read now; anything else as it is."""
    if not isinstance(names, dict):
        return names
    return {unicodedata.normalize("NFC", str(k)): v for k, v in names.items()}


class _TaskName:
    """A task name: letters (with their combining marks) and digits of any script (``avis_été``,
    ``情感``, ``हिंदी``), ``_ . + -`` after a first letter or digit; no space, path separator or
    control character. Read NFC-composed (a name typed where files are NFD, macOS, matches)."""

    @staticmethod
    def match(name: str) -> bool:
        name = unicodedata.normalize("NFC", name)
        if not name or unicodedata.category(name[0])[0] not in "LN":
            return False
        return all(unicodedata.category(c)[0] in "LMN" or c in "._+-" for c in name)


_SAFE_NAME = _TaskName()


@dataclass(frozen=True)
class Example:
    """One labelled input; ``sentence`` is the task input, ``label`` one of the task's labels
    (a generation task's: the prompt and its target text). A chat example of a generation task
    carries its conversation in ``messages`` ((role, content) pairs, the last the assistant's,
    whose content is ``label``); it is rendered with the tokenizer's chat template."""

    sentence: str
    label: str
    messages: tuple[tuple[str, str], ...] = ()


KINDS = ("classify", "text", "generate")


def clean_label(text: str) -> str:
    """A label as every reader takes it: surrounding whitespace stripped and Unicode in its
    composed form (NFC), so that "café" typed as e + combining accent is the same class as "café".
    A line break inside stays: :meth:`Task.check` refuses it."""
    return unicodedata.normalize("NFC", text.strip())


def _breaks_line(label: str) -> bool:
    """Whether a label holds a line break (``\n``): an answer is scored on its first line
    (:func:`surecl.metrics.is_label`), so such a label could never be answered right, or would
    match another that shares its first line. Other control characters (a tab, ``\r``, U+2028)
    split no line there and are scored as written."""
    return "\n" in label


def warn_test_only_labels(task: str, train: list[Example], test: list[Example], fix: str) -> None:
    """Warn (on the ``surecl`` logger, from the first process only) where a task's label set is
    taken from its rows and some label occurs in its test split alone: a class the model never
    trains on, which a typo makes too. ``fix`` says how to give the labels (a given label set
    makes such a row an error)."""
    seen = {ex.label for ex in train}
    only = sorted({ex.label for ex in test} - seen)
    if not only:
        return
    shown = ", ".join(map(repr, only[:5])) + (f" and {len(only) - 5} more" if len(only) > 5 else "")
    data_warning(f"task {task}: label{'s' if len(only) > 1 else ''} {shown} occur{'' if len(only) > 1 else 's'} only in its test "
                 f"split, so {'they are classes' if len(only) > 1 else 'it is a class'} the model never trains on; if that is not "
                 f"meant (a typo?), {fix} (a row whose label is not among them is then an error)")


def data_warning(message: str) -> None:
    """A warning about the data read, on the ``surecl`` logger, from the first process only
    (every process reads the data: it is said once)."""
    if os.environ.get("RANK", "0") not in ("", "0"):
        return
    from surecl.logs import logger

    logger.warning(message)


def _found(value) -> str:
    """A wrong-typed value as a message names it: its type and a short one-line repr."""
    if value is None:
        return "None"
    shown = " ".join(repr(value).split())
    return f"{type(value).__name__} {shown if len(shown) <= 40 else shown[:37] + '...'}"


def user_instruction(text: str) -> str:
    """A user's task instruction as prompts use it: a non-empty one that does not end in
    whitespace gets a newline, so the input does not run on from its last word."""
    return text + "\n" if text and not text[-1].isspace() else text
METRICS = {"classify": ("accuracy",), "text": ("perplexity",), "generate": ("rouge_l", "exact_match")}
"""The metrics a task of each kind may be scored with; the first is its default."""


@dataclass
class Task:
    """A named task with two splits: ``classify`` (instruction, label options, labelled
    examples), ``text`` (raw documents in ``sentence``, no labels: continual pre-training) or
    ``generate`` (free-form answers: a prompt in ``sentence``, or a conversation in
    ``messages``, and the target text in ``label``; no label set). ``metric`` names what its
    score is (``METRICS``; empty: the kind's default, ``rouge_l`` for generation)."""

    name: str
    instruction: str
    labels: list[str]
    train: list[Example]
    test: list[Example]
    group: str = ""
    meta: dict = field(default_factory=dict)
    kind: str = "classify"
    metric: str = ""

    def __post_init__(self) -> None:
        self._check_types()
        # the name in Unicode's composed form, as every reader takes a file's name and as
        # per-task values and data.tasks are read: "été" typed decomposed is the same task
        self.name = unicodedata.normalize("NFC", self.name)

    def _check_types(self, where: str = "") -> None:
        """Refuse fields of the wrong type in one line naming the task, split and row (a task
        built in Python: a pandas missing value is a float ``nan``; the readers give text
        alone). On construction, as a copy is made too, so no later step fails on them with a
        traceback; again in :meth:`check`, after fields were assigned."""
        if not isinstance(self.name, str):
            raise SureclError(f"{where}task name must be a string, not {_found(self.name)}")
        at = f"{where}task {self.name}"
        for arg in ("instruction", "group"):
            if not isinstance(getattr(self, arg), str):
                raise SureclError(f"{at}: {arg} must be a string, not {_found(getattr(self, arg))}")
        if not isinstance(self.meta, dict):
            raise SureclError(f"{at}: meta must be a dict, not {_found(self.meta)}")
        if not isinstance(self.labels, (list, tuple)):
            raise SureclError(f"{at}: labels must be a list of strings, not {_found(self.labels)}")
        for i, label in enumerate(self.labels):
            if not isinstance(label, str):
                raise SureclError(f"{at}: labels must be a list of strings; item {i} is {_found(label)}")
        for split in ("train", "test"):
            rows = getattr(self, split)
            if not isinstance(rows, (list, tuple)):
                raise SureclError(f"{at}: {split} must be a list of Example, not {_found(rows)}")
            for i, ex in enumerate(rows):
                if not isinstance(ex, Example):
                    raise SureclError(f"{at} {split} row {i}: {_found(ex)} is not an Example (give Example(sentence, label))")
                for part in ("sentence", "label"):
                    if not isinstance(getattr(ex, part), str):
                        raise SureclError(f"{at} {split} row {i}: {part} is {_found(getattr(ex, part))}, not text")
                turns = ex.messages
                if not isinstance(turns, (list, tuple)) or not all(
                        isinstance(t, (list, tuple)) and len(t) == 2 and all(isinstance(c, str) for c in t) for t in turns):
                    raise SureclError(f"{at} {split} row {i}: messages must be (role, content) pairs of strings, not {_found(turns)}")

    @property
    def score_metric(self) -> str:
        """The metric its scores are in: ``metric``, else its kind's default."""
        return self.metric or METRICS.get(self.kind, ("accuracy",))[0]

    def fingerprint(self) -> str:
        """SHA-256 of what a run reads of the task: its kind, instruction, labels and every
        sampled train and test row, in order (a checkpoint records it; a resume on other rows
        stops). The prompts built from them a checkpoint records apart
        (:func:`surecl.run_results.encoding_digests`)."""
        import hashlib
        import json

        rows = {"kind": self.kind, "instruction": self.instruction, "labels": list(self.labels),
                "train": [[e.sentence, e.label] for e in self.train], "test": [[e.sentence, e.label] for e in self.test]}
        if self.kind == "generate":  # (only here, so the classification and text fingerprints stay as they were)
            rows["metric"] = self.score_metric
            for split in ("train", "test"):
                rows[split] = [[e.sentence, e.label, [list(m) for m in e.messages]] for e in getattr(self, split)]
        return hashlib.sha256(json.dumps(rows, ensure_ascii=False, separators=(",", ":")).encode("utf-8")).hexdigest()

    def check(self, source: str = "", invalid_labels: str = "error") -> None:
        """Reject tasks a run cannot use, naming the task (and file) in one line.

        ``invalid_labels="drop"`` removes rows whose label is not one of the task's labels
        instead (MNLI's test split marks 131 rows with no gold label as ``-``), counting them
        in ``meta["dropped"]``; the empty-split checks apply to what is left."""
        where = f"{source}: " if source else ""
        self._check_types(where)
        if not _SAFE_NAME.match(self.name) or ".." in self.name:
            raise SureclError(f"{where}task name {self.name!r} must be letters, digits, '.', '_', '+', '-', starting with a letter "
                              "or digit (no spaces or path separators)")
        if self.kind not in KINDS:
            raise SureclError(f"{where}task {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.metric and self.metric not in METRICS[self.kind]:
            raise SureclError(f"{where}task {self.name}: metric {self.metric!r} does not fit a {self.kind} task "
                              f"(choose from {', '.join(METRICS[self.kind])})")
        if self.kind == "generate":
            self._check_splits(where)
            for split in ("train", "test"):
                for i, ex in enumerate(getattr(self, split)):
                    if not ex.label.strip():
                        raise SureclError(f"{where}task {self.name} {split} row {i}: empty target")
                    if not ex.messages and not ex.sentence.strip():
                        raise SureclError(f"{where}task {self.name} {split} row {i}: empty prompt")
                    if ex.messages and (ex.messages[-1][0] != "assistant" or ex.messages[-1][1] != ex.label):
                        raise SureclError(f"{where}task {self.name} {split} row {i}: a conversation must end with the assistant turn that is its target")
            return
        if self.kind == "text":
            self._check_splits(where)
            row = self._first_row(lambda ex: not ex.sentence.strip())
            if row:
                raise SureclError(f"{where}task {self.name} {row[0]} row {row[1]}: empty text")
            return
        if not self.labels:
            raise SureclError(f"{where}task {self.name} has no labels")
        if any(not str(x).strip() for x in self.labels):
            row = self._first_row(lambda ex: not ex.label.strip())
            if row:
                raise SureclError(f"{where}task {self.name} {row[0]} row {row[1]}: empty label (a classification row needs one of the task's labels)")
            raise SureclError(f"{where}task {self.name}: its labels list an empty label")
        broken = {x for x in self.labels if _breaks_line(x)}
        if broken:
            mend = "write each label on one line (an answer is scored on its first line)"
            row = self._first_row(lambda ex: ex.label in broken)
            if row:
                raise SureclError(f"{where}task {self.name} {row[0]} row {row[1]}: label {row[2].label!r} holds a line break; {mend}")
            k = next(k for k, x in enumerate(self.labels) if x in broken)
            raise SureclError(f"{where}task {self.name}: label {k} of its labels, {self.labels[k]!r}, holds a line break; {mend}")
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

    def _first_row(self, holds) -> tuple[str, int, Example] | None:
        """The first row, train then test, that ``holds`` (a test of an :class:`Example`): its
        split, index and example, which a refusal names."""
        return next(((split, i, ex) for split in ("train", "test") for i, ex in enumerate(getattr(self, split)) if holds(ex)), None)

    def _check_splits(self, where: str) -> None:
        if not self.train:
            raise SureclError(f"{where}task {self.name} has an empty train split")
        if not self.test:
            raise SureclError(f"{where}task {self.name} has an empty test split")

    def as_text(self) -> Task:
        """The task's inputs as raw documents (labels and empty inputs dropped): a continual
        pre-training domain. Its fields are checked first: a row assigned after construction
        (``task.train.append(...)``) would else stop it with a traceback."""
        self._check_types()
        if self.kind == "text":
            return self
        if self.kind == "generate":  # a conversation's turns, or prompt and target, as one document
            doc = lambda ex: "\n".join(c for _, c in ex.messages) if ex.messages else f"{ex.sentence}\n{ex.label}".strip()  # noqa: E731
            strip = lambda rows: [Example(doc(ex), "") for ex in rows]  # noqa: E731
        else:
            strip = lambda rows: [Example(ex.sentence, "") for ex in rows if ex.sentence.strip()]  # noqa: E731
        task = Task(self.name, "", [], strip(self.train), strip(self.test), self.group, dict(self.meta), kind="text")
        task.check()
        return task


def subsample(rows: list[Example], n: int, rng: random.Random, balanced: bool) -> list[Example]:
    """Keep ``n`` rows (all if n <= 0 or n >= len); class-balanced by round-robin over labels:
    each round takes one more row of every label that has one left, so a sample of at least as
    many rows as labels holds every label (a last round that cannot take one of every label
    takes the labels first in sorted order: the counts differ by one at most while every label has
    rows left; a label with fewer is taken whole and the others fill its share). With fewer rows
    than labels, which labels the sample holds is a draw from ``rng`` (it differs by seed; it
    was the first labels in sorted order on every seed); only then is ``rng`` read for it, so
    every other sample is the one drawn before."""
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
        left = [pool for pool in pools if depth < len(pool)]
        if depth == 0 and len(left) > n:  # fewer rows than labels: a random choice of the labels
            chosen = {id(pool) for pool in rng.sample(left, n)}
            left = [pool for pool in left if id(pool) in chosen]
        out.extend(pool[depth] for pool in left[: n - len(out)])
        depth += 1
    rng.shuffle(out)
    return out


def prepare_stream(tasks: list[Task], n_train: int, n_test: int, balanced: bool, seed: int, test_balanced: bool | None = None,
                   draw_key: str = "", own_test: bool = False) -> list[Task]:
    """Subsample each task with a per-task seeded RNG, so a task's sample does not depend on order
    (unless ``draw_key``, e.g. the task order, is given: it joins the RNG's seed, so runs with
    different keys draw independent samples; ``data.draw=order``).
    ``balanced`` applies to the train split and, unless ``test_balanced`` is given, the test split.
    ``own_test`` (``data.test_draw=own``): the test sample from an RNG of its own, so it is the
    same whatever ``n_train`` (else the train sample's RNG goes on to draw it)."""
    test_balanced = balanced if test_balanced is None else test_balanced
    names = [t.name for t in tasks]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SureclError(f"task named twice in the stream: {', '.join(dupes)}")
    out = []
    for task in tasks:
        key = f"{seed}:{draw_key}:{task.name}" if draw_key else f"{seed}:{task.name}"
        rng = random.Random(key)
        test_rng = random.Random(f"test:{key}") if own_test else rng
        out.append(
            Task(
                name=task.name,
                instruction=task.instruction,
                labels=list(task.labels),
                # a generation task's targets are no classes: a uniform draw (round-robin over
                # distinct targets would take them in sorted order)
                train=subsample(task.train, n_train, rng, balanced and task.kind != "generate"),
                test=subsample(task.test, n_test, test_rng, test_balanced and task.kind != "generate"),
                group=task.group,
                meta=dict(task.meta),
                kind=task.kind,
                metric=task.metric,
            )
        )
    return out
