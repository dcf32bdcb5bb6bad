"""Replay buffers of references ``(task, index, score)`` into the tokenised training sets.

Entries are small typed records, not copies of the data. Two kinds:

* :class:`QuotaBuffer` - task-aware, equal per-task quota ``m = floor(S / d)`` after ``d`` tasks
  entered; each task keeps its ``m`` highest-priority entries (surprise, or a random key), or,
  balanced, the highest-priority entries of each of its labels in turn.
* :class:`ReservoirBuffer` - online, task-agnostic reservoir sampling (Vitter's algorithm R):
  every example offered has the same chance ``S / n_seen`` of being in the buffer.
* :class:`OnlineQuotaBuffer` - online and boundary-free: equal quota per partition key (the
  answer label, known without task boundaries) and, inside a partition, the highest-priority
  entries; an offer costs O(log m) whatever the buffer size.

Sampling is O(batch) per replay step whatever the buffer size or number of tasks: the flat list
is rebuilt only when the buffer's membership changes at a task boundary.
"""

from __future__ import annotations

import heapq
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


def quota_held(capacity: int, sizes: list[int]) -> int:
    """Entries a :class:`QuotaBuffer` of ``capacity`` holds once tasks of ``sizes`` examples have
    entered: min(m, n) of each, m = floor(S / d). Below S where S is not a multiple of d (the
    remainder is never used) or a task has fewer examples than m (its share stays part empty)."""
    m = quota(capacity, len(sizes))
    return sum(min(m, n) for n in sizes)


class QuotaBuffer:
    """Equal per-task quota; a task's entries are ranked by score, highest kept.

    ``balanced=True`` spreads each task's share over its labels: entries are ranked in rounds,
    round r holding the r-th highest-scoring entry of every label that has one (a round in score
    order), so a task's m kept entries give each label floor(m/K) or one more (K labels; a
    label with fewer entries gives up its turns). A shrinking quota keeps a prefix of the same
    ranking, so the split stays even as tasks are added."""

    def __init__(self, capacity: int, balanced: bool = False):
        self.capacity = int(capacity)
        self.balanced = balanced
        self.by_task: dict[int, list[Entry]] = {}
        self.key_of: dict[tuple[int, int], str] = {}
        """(task, index) -> label of a kept entry (balanced buffers only)."""
        self._flat: list[Entry] = []

    def add_task(self, task: int, scores: list[float], keys: list[str] | None = None) -> None:
        """Enter a task with one priority per training example (and, for a balanced buffer, its
        label), then rebalance quotas."""
        m = quota(self.capacity, len(self.by_task) + (task not in self.by_task))
        entries = [Entry(task, i, float(scores[i])) for i in range(len(scores))]
        key_of: dict[tuple[int, int], str] = {}
        if self.balanced:
            if keys is None or len(keys) != len(scores):
                raise ValueError("a balanced buffer needs one label per scored example")
            key_of = {(task, i): keys[i] for i in range(len(keys))}
        self.by_task[task] = self._ranked(entries, key_of)[:m]
        self.key_of.update(key_of)  # rebalance keeps only the kept entries' labels
        self.rebalance()

    def _ranked(self, entries: list[Entry], key_of: dict[tuple[int, int], str]) -> list[Entry]:
        """``entries`` in keeping order: by score, or for a balanced buffer in rounds over labels."""
        if not self.balanced:
            return sorted(entries, key=lambda e: (-e.score, e.index))
        by_key: dict[str, list[Entry]] = {}
        for e in entries:
            by_key.setdefault(key_of[(e.task, e.index)], []).append(e)
        for group in by_key.values():
            group.sort(key=lambda e: (-e.score, e.index))
        ranked: list[Entry] = []
        for r in range(max((len(g) for g in by_key.values()), default=0)):
            ranked += sorted((g[r] for g in by_key.values() if len(g) > r), key=lambda e: (-e.score, e.index))
        return ranked

    def rebalance(self) -> None:
        m = quota(self.capacity, len(self.by_task))
        for entries in self.by_task.values():
            entries[:] = self._ranked(entries, self.key_of)[:m]
        if self.balanced:
            self.key_of = {(e.task, e.index): self.key_of[(e.task, e.index)] for es in self.by_task.values() for e in es}
        self._flatten()

    def _flatten(self) -> None:
        """The entries replay draws from, task by task in each task's kept order."""
        self._flat = [e for t in sorted(self.by_task) for e in self.by_task[t]]

    @property
    def entries(self) -> list[Entry]:
        return self._flat

    def __len__(self) -> int:
        return len(self._flat)

    def state_dict(self) -> dict:
        state = {"kind": "quota", "capacity": self.capacity, "entries": [asdict(e) for e in self._flat], "tasks": sorted(self.by_task)}
        if self.balanced:
            state["balanced"] = True
            for e in state["entries"]:
                e["key"] = self.key_of[(e["task"], e["index"])]
        return state

    def load_state_dict(self, state: dict) -> None:
        self.capacity = state["capacity"]
        self.balanced = bool(state.get("balanced", False))
        self.by_task = {t: [] for t in state["tasks"]}
        self.key_of = {}
        for e in state["entries"]:
            if self.balanced:
                self.key_of[(e["task"], e["index"])] = e["key"]
            self.by_task[e["task"]].append(Entry(e["task"], e["index"], e["score"]))
        # the saved order, not a re-ranking: with aging the scores change between re-rankings
        # (add_task), and replay draws index this order, so a resumed run draws what it would have
        self._flatten()


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


class OnlineQuotaBuffer:
    """Equal quota ``floor(S / k)`` over the ``k`` partition keys seen so far; each partition
    keeps its highest-scoring entries. Offered examples arrive one at a time (no task
    boundaries); an example offered again (a later epoch, or a re-score) updates its score.

    Each partition is a min-heap of ``(score, task, index)`` with lazy invalidation: a tuple is
    stale when its example left the buffer or has a newer score; stale tuples are dropped when
    they reach the top and the heap is compacted when it doubles. The flat list used for
    sampling is patched in place, so a step's work does not grow with the buffer.
    """

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.n_seen = 0
        self.keys: list[str] = []
        """Partition keys in order of first appearance."""
        self.live: dict[tuple[int, int], Entry] = {}
        self.key_of: dict[tuple[int, int], str] = {}
        self.heaps: dict[str, list[tuple[float, int, int]]] = {}
        self.members: dict[str, set[tuple[int, int]]] = {}
        self._flat: list[Entry] = []
        self._pos: dict[tuple[int, int], int] = {}

    def quota(self) -> int:
        return quota(self.capacity, len(self.keys))

    def offer(self, key: str, entry: Entry) -> None:
        self.n_seen += 1
        ref = (entry.task, entry.index)
        if ref in self.live:  # seen again: its fresh score replaces the old one
            self.rescore(ref, entry.score)
            return
        if key not in self.heaps:
            self.keys.append(key)
            self.heaps[key], self.members[key] = [], set()
            self._trim()
        m = self.quota()
        if m == 0:
            return
        if len(self.members[key]) < m:
            self._insert(key, entry)
            return
        heap = self.heaps[key]
        self._clean_top(heap)
        if heap and entry.score > heap[0][0]:
            _, t, i = heapq.heappop(heap)
            self._remove((t, i), replace_with=entry)
            self._insert(key, entry, placed=True)

    def rescore(self, ref: tuple[int, int], score: float) -> None:
        entry = self.live.get(ref)
        if entry is None:
            return
        entry.score = float(score)
        heap = self.heaps[self.key_of[ref]]
        heapq.heappush(heap, (entry.score, ref[0], ref[1]))
        if len(heap) > 2 * max(self.quota(), 1) + 16:
            self._compact(self.key_of[ref])

    def _stale(self, item: tuple[float, int, int]) -> bool:
        entry = self.live.get((item[1], item[2]))
        return entry is None or entry.score != item[0]

    def _clean_top(self, heap: list) -> None:
        while heap and self._stale(heap[0]):
            heapq.heappop(heap)

    def _compact(self, key: str) -> None:
        # Runs once the heap doubled, i.e. after >= m pushes: amortised O(1) per push.
        heap = [(self.live[ref].score, *ref) for ref in self.members[key]]
        heapq.heapify(heap)
        self.heaps[key] = heap

    def _insert(self, key: str, entry: Entry, placed: bool = False) -> None:
        ref = (entry.task, entry.index)
        entry.score = float(entry.score)
        self.live[ref], self.key_of[ref] = entry, key
        self.members[key].add(ref)
        heapq.heappush(self.heaps[key], (entry.score, entry.task, entry.index))
        if not placed:
            self._pos[ref] = len(self._flat)
            self._flat.append(entry)

    def _remove(self, ref: tuple[int, int], replace_with: Entry) -> None:
        """Drop ``ref``; ``replace_with`` takes its slot in the flat list."""
        key = self.key_of.pop(ref)
        del self.live[ref]
        self.members[key].discard(ref)
        pos = self._pos.pop(ref)
        self._flat[pos] = replace_with
        self._pos[(replace_with.task, replace_with.index)] = pos

    def _trim(self) -> None:
        """A new key lowered the quota: every partition drops its lowest entries (rare)."""
        m = self.quota()
        for key in self.keys:
            members = sorted((self.live[ref] for ref in self.members[key]), key=lambda e: (-e.score, e.task, e.index))
            for e in members[m:]:
                ref = (e.task, e.index)
                del self.live[ref], self.key_of[ref]
                self.members[key].discard(ref)
            heap = [(e.score, e.task, e.index) for e in members[:m]]
            heapq.heapify(heap)
            self.heaps[key] = heap
        self._flat = [e for e in self._flat if (e.task, e.index) in self.live]
        self._pos = {(e.task, e.index): p for p, e in enumerate(self._flat)}

    @property
    def entries(self) -> list[Entry]:
        return self._flat

    def per_key(self) -> dict[str, int]:
        return {k: len(self.members[k]) for k in self.keys}

    def __len__(self) -> int:
        return len(self._flat)

    def state_dict(self) -> dict:
        return {
            "kind": "online_quota", "capacity": self.capacity, "n_seen": self.n_seen, "keys": list(self.keys),
            "entries": [{**asdict(e), "key": self.key_of[(e.task, e.index)]} for e in self._flat],
        }

    def load_state_dict(self, state: dict) -> None:
        self.__init__(state["capacity"])
        self.n_seen = state["n_seen"]
        for key in state["keys"]:
            self.keys.append(key)
            self.heaps[key], self.members[key] = [], set()
        for e in state["entries"]:
            self._insert(e["key"], Entry(e["task"], e["index"], e["score"]))


def sample(entries: list[Entry], n: int, rng: random.Random, replacement: bool = False) -> list[Entry]:
    """Uniform draw of ``n`` entries without replacement (with replacement if fewer exist), or
    each drawn on its own with ``replacement`` (``replay.replacement``)."""
    if not entries or n <= 0:
        return []
    if n <= len(entries) and not replacement:
        return rng.sample(entries, n)
    return [entries[rng.randrange(len(entries))] for _ in range(n)]
