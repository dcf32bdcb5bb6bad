"""The run's own state and its views of the data, below the loop (:mod:`surecl.trainer`) and
its helpers: :class:`RunState` (progress, checkpointed), :class:`InputSets` (the encoded
examples as the model reads them, with the plugins' input prefix) and :func:`release_memory`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from surecl.data.encode import Encoded


@dataclass
class RunState:
    """The run's own progress, restored from a checkpoint with the components' states."""

    next_stage: int = 0
    accuracy: list[list[float | None]] = field(default_factory=list)
    global_step: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: {"train": 0.0, "score": 0.0, "eval": 0.0})
    batches: list[list[int]] | None = None
    """The running stage's batch plan (indices into its pool); None between stages."""
    step: int = 0
    """The running stage's next step (while a step runs: that step)."""
    initial: list[float] | None = None
    """Every task evaluated before any training (``eval.before``)."""
    accuracy_fast: list[list[float | None]] | None = None
    """A dual run's matrix under its fast adapter (``eval.fast``), beside the slow one's."""
    predictions: dict[str, list[str]] | None = None
    """The last stage's answers per task (its test rows, in order), under the evaluation
    adapter: ``predictions.jsonl`` (None before the last stage's evaluation)."""
    general_initial: dict[str, float] | None = None
    """The general-ability probe (``eval.general``) before any training, per part (``text``:
    perplexity, ``instruct``: its generation metric)."""
    general: list[dict[str, float] | None] | None = None
    """The probe after each stage, per row of the matrix (None where no stage ended there)."""
    general_fast: list[dict[str, float] | None] | None = None
    """The same under a dual run's fast adapter (``eval.fast``)."""
    hosts: list[dict] = field(default_factory=list)
    """Where the run ran (:func:`surecl.model.host_info`), in order: a resumed run adds the
    machine it resumes on where that differs from the last, so results name every one."""


class InputSets:
    """Per task, its encoded examples as the model reads them now: the plugins' input prefix
    (:meth:`surecl.plugins.base.Plugin.input_prefix`, the method's above all; asked at every
    access) before each prompt.

    Indexed and iterated as the list of per-task lists it stands for. Without a prefix a
    task's list is the encoded list itself; with one, a copy carrying it, built once per
    prefix (a method whose prefix grows with each task rebuilds a task's list once per stage)."""

    def __init__(self, encoded: list[list[Encoded]], prefix_of) -> None:
        self.encoded = encoded
        """The tokenised examples without any prefix."""
        self._prefix_of = prefix_of
        self._views: dict[int, tuple[tuple[int, ...], list[Encoded]]] = {}

    def __len__(self) -> int:
        return len(self.encoded)

    def __iter__(self):
        return (self[t] for t in range(len(self.encoded)))

    def __getitem__(self, task: int) -> list[Encoded]:
        prefix = self._prefix_of(task)
        if not prefix:
            return self.encoded[task]
        view = self._views.get(task)
        if view is None or view[0] != prefix:
            head = list(prefix)
            view = self._views[task] = (prefix, [dataclasses.replace(e, prompt=head + e.prompt) for e in self.encoded[task]])
        return view[1]


def release_memory() -> None:
    """Hand freed heap memory back to the OS between phases (glibc only; a no-op elsewhere).

    The allocator keeps the arenas that a training stage's activations used; without this the
    next phase's (scoring's) peak lands on top of them: the default run peaked at 3.53 GB RSS
    with ~1.9 GB of it free but held (bench/end_to_end.sh)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None
