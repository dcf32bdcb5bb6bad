"""The general-ability probe (``eval.general``): what the stream cost the model beyond its tasks.

A probe is held-out data the stream never trains on, measured before the first task and after
every task under the evaluation adapter: the perplexity of general text (``text``) and the
score on a general instruction set (``instruct``, ROUGE-L unless its file names another
metric). Either part may be left out. Sources:

* ``default``: the packaged probe, built once into the cache with the instruct stream from the
  ``bigbench`` package (:mod:`surecl.data.instruct`): WikiHow articles as general text, and
  four instruction tasks the stream does not contain (CosmosQA answers, CommonGen, MC-TACO event
  durations, auto-categorisation);
* a folder holding ``text.jsonl`` (rows ``{"text": ...}``) and/or ``instruct.jsonl`` (the
  generation rows of ``data.jsonl``: prompt/response, Alpaca, or chat ``messages``; an optional
  header names the metric and an instruction put before every prompt, a conversation's at the
  start of its first user turn);
* one JSONL file: a text probe when its rows hold ``text``, else an instruction probe.

Every row of a probe file is a probe row (a ``split`` key is not read). ``eval.general_n``
rows of each part are kept by a fixed draw that depends on neither the run's seed nor its
method, so every run measures the same rows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from surecl.data.jsonl import _text_rows, generation_example, read_jsonl
from surecl.data.task import METRICS, Task, user_instruction
from surecl.errors import SureclError

PARTS = ("text", "instruct")
"""The probe's parts, in the order results list them: general text (perplexity) and a general
instruction set (a generation metric)."""


@dataclass
class GeneralProbe:
    """The probe a run measures: ``source`` as ``eval.general`` gave it, and one task per part
    (its rows in ``test``; ``kind`` ``text`` for perplexity, ``generate`` for the instruction set)."""

    source: str
    tasks: list[Task]

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tasks]


def load_general_probe(spec: str, n: int, cache_dir: Path | None = None) -> GeneralProbe | None:
    """The probe ``eval.general`` names (None for ``none``), ``n`` rows per part (0 = all)."""
    if spec == "none":
        return None
    if spec == "default":
        from surecl.data.instruct import ensure_instruct_benchmark

        root = ensure_instruct_benchmark(cache_dir) / "general"
    else:
        root = Path(spec).expanduser()
    if root.is_dir():
        files = {part: root / f"{part}.jsonl" for part in PARTS if (root / f"{part}.jsonl").exists()}
        if not files:
            raise SureclError(f"eval.general: the folder {root} holds neither text.jsonl nor instruct.jsonl")
        tasks = [_read_part(part, path) for part, path in files.items()]
    elif root.exists():
        tasks = [_read_part(None, root)]
    else:
        raise SureclError(f"eval.general: {spec} does not exist (give none, default, a folder with text.jsonl and/or "
                          "instruct.jsonl, or a JSONL file)")
    return GeneralProbe(spec, [_sample(t, n) for t in tasks])


def _read_part(part: str | None, path: Path) -> Task:
    """One part from its file; ``part`` None: decided by the file's rows (``text`` or not)."""
    header, rows = read_jsonl(path, "eval.general")
    if not rows:
        raise SureclError(f"eval.general: {path} has no rows")
    if part is None:
        part = "text" if "text" in rows[0][1] else "instruct"
    if part == "text":
        return Task("text", "", [], [], _text_rows(rows, path), group="general", kind="text")
    metric = header.get("metric", "")
    if not isinstance(metric, str) or (metric and metric not in METRICS["generate"]):
        raise SureclError(f"eval.general: {path}: header 'metric' must be one of {', '.join(METRICS['generate'])}")
    instruction = header.get("instruction", "")
    if not isinstance(instruction, str):
        raise SureclError(f"eval.general: {path}: header 'instruction' must be a string")
    test = [generation_example(obj, f"{path} line {lineno}") for lineno, obj in rows]
    # as every reader does: an instruction ending in a word gets a newline before the input
    return Task("instruct", user_instruction(instruction), [], [], test, group="general", kind="generate", metric=metric)


def _sample(task: Task, n: int) -> Task:
    """``n`` of the part's rows (all when ``n`` is 0 or at least their number), a draw fixed by
    the part's name alone."""
    rows = list(task.test)
    if 0 < n < len(rows):
        rows = random.Random(f"general:{task.name}").sample(rows, n)
    return Task(task.name, task.instruction, [], [], rows, group=task.group, kind=task.kind, metric=task.metric)
