"""Replay buffers of references ``(task, index, score)`` into the tokenised training sets.

Entries are small typed records, not copies of the data. Two kinds:

* :class:`QuotaBuffer` - task-aware, equal per-task quota ``m = floor(S / d)`` after ``d`` tasks
  entered; each task keeps its ``m`` highest-priority entries (surprise, or a random key).
* :class:`ReservoirBuffer` - online, task-agnostic reservoir sampling (Vitter's algorithm R):
  every example offered has the same chance ``S / n_seen`` of being in the buffer.

Sampling is O(batch) per replay step whatever the buffer size or number of tasks: the flat list
is rebuilt only when the buffer's membership changes at a task boundary.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass


@dataclass
class Entry:
    task: int
    index: int
    score: float = 0.0


def quota(capacity: int, n_tasks: int) -> int:
    """Per-task share m = floor(S / d); 0 before any task has entered."""
    return capacity // n_tasks if n_tasks > 0 else 0


class QuotaBuffer:
    """Equal per-task quota; a task's entries are ranked by score, highest kept."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.by_task: dict[int, list[Entry]] = {}
        self._flat: list[Entry] = []

    def add_task(self, task: int, scores: list[float]) -> None:
        """Enter a task with one priority per training example, then rebalance quotas."""
        m = quota(self.capacity, len(self.by_task) + (task not in self.by_task))
        ranked = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:m]
        self.by_task[task] = [Entry(task, i, float(scores[i])) for i in ranked]
        self.rebalance()

    def rebalance(self) -> None:
        m = quota(self.capacity, len(self.by_task))
        for entries in self.by_task.values():
            entries.sort(key=lambda e: (-e.score, e.index))
            del entries[m:]
        self._flat = [e for t in sorted(self.by_task) for e in self.by_task[t]]

    @property
    def entries(self) -> list[Entry]:
        return self._flat

    def __len__(self) -> int:
        return len(self._flat)

    def state_dict(self) -> dict:
        return {"kind": "quota", "capacity": self.capacity, "entries": [asdict(e) for e in self._flat], "tasks": sorted(self.by_task)}

    def load_state_dict(self, state: dict) -> None:
        self.capacity = state["capacity"]
        self.by_task = {t: [] for t in state["tasks"]}
        for e in state["entries"]:
            self.by_task[e["task"]].append(Entry(**e))
        self.rebalance()


class ReservoirBuffer:
    """Task-agnostic reservoir of fixed capacity over the stream of offered examples."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.n_seen = 0
        self._flat: list[Entry] = []

    def offer(self, entry: Entry, rng: random.Random) -> None:
        self.n_seen += 1
        if len(self._flat) < self.capacity:
            self._flat.append(entry)
            return
        j = rng.randrange(self.n_seen)
        if j < self.capacity:
            self._flat[j] = entry

    @property
    def entries(self) -> list[Entry]:
        return self._flat

    def __len__(self) -> int:
        return len(self._flat)

    def state_dict(self) -> dict:
        return {"kind": "reservoir", "capacity": self.capacity, "n_seen": self.n_seen, "entries": [asdict(e) for e in self._flat]}

    def load_state_dict(self, state: dict) -> None:
        self.capacity = state["capacity"]
        self.n_seen = state["n_seen"]
        self._flat = [Entry(**e) for e in state["entries"]]


def sample(entries: list[Entry], n: int, rng: random.Random) -> list[Entry]:
    """Uniform draw of ``n`` entries without replacement (with replacement if fewer exist)."""
    if not entries or n <= 0:
        return []
    if n <= len(entries):
        return rng.sample(entries, n)
    return [entries[rng.randrange(len(entries))] for _ in range(n)]
