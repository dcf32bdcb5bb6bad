"""Replay buffers: quota arithmetic, per-task top-m, rebalancing, reservoir sampling, sampling."""

from __future__ import annotations

import json
import random

import pytest

from surecl.replay.buffer import Entry, QuotaBuffer, ReservoirBuffer, quota, sample


def _by_task(buf: QuotaBuffer) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for e in buf.entries:
        out.setdefault(e.task, set()).add(e.index)
    return out


# ---------------------------------------------------------------------------- quota


@pytest.mark.parametrize("capacity", [0, 1, 2, 7, 10, 20, 99, 100])
@pytest.mark.parametrize("n_tasks", [1, 2, 3, 4, 7, 15])
def test_quota_is_floor_division(capacity, n_tasks):
    m = quota(capacity, n_tasks)
    assert m == capacity // n_tasks
    # floor: m tasks' worth fits, one more per task would not
    assert m * n_tasks <= capacity < (m + 1) * n_tasks


def test_quota_hand_values_and_no_tasks():
    assert quota(10, 3) == 3
    assert quota(2, 3) == 0
    assert quota(20, 4) == 5
    assert quota(10, 0) == 0


# ---------------------------------------------------------------------------- QuotaBuffer

# index:         0    1    2    3    4    5    6    7
TASK0_SCORES = [0.5, 0.9, 0.1, 0.7, 0.3, 0.8, 0.2, 0.6]
# ranked by score, highest first: 1 (0.9), 5 (0.8), 3 (0.7), 7 (0.6), 0 (0.5), 4 (0.3), 6 (0.2), 2 (0.1)
TASK0_RANKED = [1, 5, 3, 7, 0, 4, 6, 2]


def test_quota_buffer_keeps_top_scored_and_rebalances():
    buf = QuotaBuffer(10)
    buf.add_task(0, TASK0_SCORES)
    # d=1: m=10 > 8 examples -> every example is kept
    assert _by_task(buf) == {0: set(range(8))}
    # task 1: the reverse order of scores, so its top entries are the low indices
    buf.add_task(1, [float(-i) for i in range(8)])
    # d=2: m=5
    assert _by_task(buf) == {0: set(TASK0_RANKED[:5]), 1: {0, 1, 2, 3, 4}}
    buf.add_task(2, [float(i) for i in range(8)])
    # d=3: m=3; the lowest-scored entries of earlier tasks are dropped
    assert _by_task(buf) == {0: set(TASK0_RANKED[:3]), 1: {0, 1, 2}, 2: {7, 6, 5}}
    buf.add_task(3, [1.0] * 8)
    # d=4: m=2; equal scores are broken by the lower index
    assert _by_task(buf) == {0: {1, 5}, 1: {0, 1}, 2: {7, 6}, 3: {0, 1}}
    assert len(buf) == 8 <= buf.capacity


@pytest.mark.parametrize("capacity", [1, 5, 9, 13])
def test_quota_buffer_never_holds_more_than_floor_share(capacity):
    rng = random.Random(capacity)
    buf = QuotaBuffer(capacity)
    all_scores = {}
    for d in range(1, 7):
        task = d - 1
        all_scores[task] = [rng.random() for _ in range(rng.randint(0, 9))]
        buf.add_task(task, all_scores[task])
        m = capacity // d
        assert len(buf) <= capacity
        for t, scores in all_scores.items():
            kept = [e for e in buf.entries if e.task == t]
            expected = sorted(range(len(scores)), key=lambda i: -scores[i])[:m]
            assert len(kept) == min(m, len(scores))
            assert {e.index for e in kept} == set(expected)
            assert all(e.score == scores[e.index] for e in kept)


def test_quota_buffer_entries_are_grouped_by_task_and_ranked():
    buf = QuotaBuffer(8)
    buf.add_task(1, [0.1, 0.4, 0.3])
    buf.add_task(0, TASK0_SCORES)
    # tasks in ascending order, each ranked highest score first (m = 4)
    assert [(e.task, e.index) for e in buf.entries] == [(0, 1), (0, 5), (0, 3), (0, 7), (1, 1), (1, 2), (1, 0)]


def test_quota_buffer_reranks_after_scores_change():
    buf = QuotaBuffer(6)
    buf.add_task(0, [6.0, 5.0, 4.0, 3.0, 2.0, 1.0])
    assert _by_task(buf) == {0: set(range(6))}
    by_index = {e.index: e for e in buf.entries}
    by_index[0].score = -1.0  # was the best, now the worst
    by_index[5].score = 10.0  # was the worst, now the best
    buf.add_task(1, [0.0] * 6)
    # m = 3: task 0 keeps the three best under the *new* scores: 5 (10), 1 (5), 2 (4)
    assert _by_task(buf)[0] == {5, 1, 2}


def test_quota_buffer_readding_a_task_replaces_it():
    buf = QuotaBuffer(4)
    buf.add_task(0, [1.0, 2.0, 3.0])
    buf.add_task(1, [1.0, 2.0, 3.0])
    buf.add_task(0, [3.0, 2.0, 1.0])
    # still two tasks (m = 2); task 0 re-selected from its new scores
    assert _by_task(buf) == {0: {0, 1}, 1: {2, 1}}


def test_quota_buffer_state_dict_round_trip():
    buf = QuotaBuffer(9)
    buf.add_task(0, TASK0_SCORES)
    buf.add_task(1, [float(-i) for i in range(5)])
    state = json.loads(json.dumps(buf.state_dict()))  # checkpoints store it as JSON
    other = QuotaBuffer(0)
    other.load_state_dict(state)
    assert other.capacity == 9
    assert other.entries == buf.entries
    assert sorted(other.by_task) == [0, 1]
    # both continue identically
    buf.add_task(2, [0.5, 0.25, 0.75])
    other.add_task(2, [0.5, 0.25, 0.75])
    assert other.entries == buf.entries
    assert _by_task(other) == {0: set(TASK0_RANKED[:3]), 1: {0, 1, 2}, 2: {2, 0, 1}}


@pytest.mark.parametrize("balanced", [False, True])
def test_quota_buffer_round_trip_keeps_the_order_after_aging(balanced):
    """Aging rewrites replayed entries' scores in place between re-rankings; a restored buffer
    must keep the order replay draws index, or a resumed run replays other examples."""
    keys = ["a", "b"] * 5 if balanced else None
    buf = QuotaBuffer(8, balanced=balanced)
    buf.add_task(0, [float(i) for i in range(10)], keys)
    buf.add_task(1, [float(10 - i) for i in range(10)], keys)
    for e in buf.entries[:3]:  # replayed and re-scored lower: no longer the order a ranking gives
        e.score = -100.0 - e.index
    other = QuotaBuffer(0)
    other.load_state_dict(json.loads(json.dumps(buf.state_dict())))
    assert other.entries == buf.entries
    assert sample(other.entries, 3, random.Random(7)) == sample(buf.entries, 3, random.Random(7))
    # the next task re-ranks both the same way (aged entries go first)
    buf.add_task(2, [1.0] * 10, keys)
    other.add_task(2, [1.0] * 10, keys)
    assert other.entries == buf.entries


def test_quota_buffer_round_trip_keeps_tasks_without_entries():
    buf = QuotaBuffer(4)
    buf.add_task(0, [])  # a task that contributed nothing still counts for the quota
    buf.add_task(1, [0.1, 0.2, 0.3, 0.4, 0.5])
    assert _by_task(buf) == {1: {4, 3}}  # m = 4 // 2
    other = QuotaBuffer(0)
    other.load_state_dict(json.loads(json.dumps(buf.state_dict())))
    for b in (buf, other):
        b.add_task(2, [0.9, 0.8])
    # three tasks -> m = 4 // 3 = 1 on both
    assert _by_task(other) == _by_task(buf) == {1: {4}, 2: {0}}


# ---------------------------------------------------------------------------- ReservoirBuffer


def test_reservoir_fills_then_never_exceeds_capacity():
    buf = ReservoirBuffer(7)
    rng = random.Random(0)
    for k in range(1, 101):
        buf.offer(Entry(0, k - 1), rng)
        assert buf.n_seen == k
        assert len(buf) == min(k, 7)
        if k <= 7:  # the first S items are all kept, in order
            assert [e.index for e in buf.entries] == list(range(k))
    assert len({e.index for e in buf.entries}) == 7


def test_reservoir_zero_capacity_keeps_nothing():
    buf = ReservoirBuffer(0)
    rng = random.Random(0)
    for i in range(10):
        buf.offer(Entry(0, i), rng)
    assert len(buf) == 0 and buf.n_seen == 10


def test_reservoir_keeps_each_item_with_probability_s_over_n():
    capacity, n, trials = 5, 20, 4000
    counts = [0] * n
    for trial in range(trials):
        rng = random.Random(trial)
        buf = ReservoirBuffer(capacity)
        for i in range(n):
            buf.offer(Entry(i // 10, i), rng)
        assert len(buf) == capacity
        for e in buf.entries:
            counts[e.index] += 1
    p = capacity / n  # 0.25; sd of the frequency = sqrt(p(1-p)/trials) ~ 0.0068
    for i, c in enumerate(counts):
        assert abs(c / trials - p) < 0.035, (i, c)
    # early and late halves of the stream (= two tasks) equally represented
    first, second = sum(counts[:10]), sum(counts[10:])
    assert abs(first - second) / (capacity * trials) < 0.03


def test_reservoir_state_dict_round_trip_continues_identically():
    rng = random.Random(3)
    buf = ReservoirBuffer(4)
    for i in range(9):
        buf.offer(Entry(0, i), rng)
    other = ReservoirBuffer(0)
    other.load_state_dict(json.loads(json.dumps(buf.state_dict())))
    assert other.capacity == 4 and other.n_seen == 9 and other.entries == buf.entries
    r1, r2 = random.Random(11), random.Random(11)
    for i in range(30):
        buf.offer(Entry(1, i), r1)
        other.offer(Entry(1, i), r2)
    assert other.entries == buf.entries and other.n_seen == buf.n_seen == 39


# ---------------------------------------------------------------------------- sample


def test_sample_without_replacement_when_enough_entries():
    entries = [Entry(0, i) for i in range(10)]
    rng = random.Random(0)
    for n in (1, 5, 10):
        for _ in range(50):
            drawn = sample(entries, n, rng)
            assert len(drawn) == n
            assert len({id(e) for e in drawn}) == n  # no entry twice
            assert all(any(e is x for x in entries) for e in drawn)


def test_sample_with_replacement_when_too_few_entries():
    entries = [Entry(0, i) for i in range(3)]
    drawn = sample(entries, 8, random.Random(0))
    assert len(drawn) == 8
    assert all(any(e is x for x in entries) for e in drawn)


def test_sample_edge_cases():
    rng = random.Random(0)
    assert sample([], 4, rng) == []
    assert sample([Entry(0, 0)], 0, rng) == []


def test_sample_is_uniform():
    entries = [Entry(0, i) for i in range(6)]
    rng = random.Random(1)
    counts = [0] * 6
    draws = 3000
    for _ in range(draws):
        for e in sample(entries, 2, rng):
            counts[e.index] += 1
    for c in counts:
        assert abs(c / draws - 2 / 6) < 0.05


# ---------------------------------------------------------------------------- balanced QuotaBuffer

# index:  0    1    2    3    4    5    6    7    8    9
LABELS = ["a", "a", "a", "a", "a", "a", "b", "b", "c", "c"]
SCORES = [9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 1.0, 0.5, 3.0, 2.0]
# by label: a = 0, 1, 2, 3, 4, 5; b = 6, 7; c = 8, 9. Rounds: {0, 8, 6}, {1, 9, 7}, {2}, {3}, ...
# in score order inside a round: 0 (9), 8 (3), 6 (1) | 1 (8), 9 (2), 7 (0.5) | 2 | 3 | 4 | 5
BALANCED_RANKED = [0, 8, 6, 1, 9, 7, 2, 3, 4, 5]


def _labels_of(buf: QuotaBuffer, task: int) -> list[str]:
    return [LABELS[e.index] for e in buf.entries if e.task == task]


def test_balanced_buffer_takes_each_labels_top_in_turn():
    plain, balanced = QuotaBuffer(4), QuotaBuffer(4, balanced=True)
    plain.add_task(0, SCORES)
    balanced.add_task(0, SCORES, LABELS)
    # the four highest scores are all label a; balanced takes a, c, b, then a's second best
    assert _by_task(plain) == {0: {0, 1, 2, 3}}
    assert _by_task(balanced) == {0: set(BALANCED_RANKED[:4])}
    assert sorted(_labels_of(balanced, 0)) == ["a", "a", "b", "c"]


@pytest.mark.parametrize("capacity", [3, 5, 6, 7, 10, 20])
def test_balanced_buffer_splits_every_quota_evenly_and_shrinks_by_prefix(capacity):
    buf = QuotaBuffer(capacity, balanced=True)
    buf.add_task(0, SCORES, LABELS)
    for d, task in enumerate((0, 1, 2), start=1):
        if task:
            buf.add_task(task, [float(i) for i in range(10)], LABELS)
        m = min(capacity // d, 10)
        assert [e.index for e in buf.entries if e.task == 0] == BALANCED_RANKED[:m]
        counts = {k: _labels_of(buf, 0).count(k) for k in "abc"}
        # no label holds more than one above a label that still has examples to give
        have = {"a": 6, "b": 2, "c": 2}
        for k in (k for k in have if counts[k] < have[k]):
            assert all(counts[j] <= counts[k] + 1 for j in have), (m, counts)
        assert sum(counts.values()) == m


def test_balanced_buffer_reranks_by_new_scores_inside_a_label():
    buf = QuotaBuffer(3, balanced=True)
    buf.add_task(0, SCORES, LABELS)
    assert _by_task(buf) == {0: {0, 8, 6}}
    for e in buf.entries:  # aging lowered the scores of a and c below b's
        e.score = {"a": 0.0, "b": 1.0, "c": 0.1}[LABELS[e.index]]
    buf.add_task(1, [1.0] * 10, LABELS)  # m = 1: the round-0 entry with the highest score now
    assert _by_task(buf)[0] == {6}


def test_balanced_buffer_state_round_trip_and_needs_labels():
    buf = QuotaBuffer(8, balanced=True)
    buf.add_task(0, SCORES, LABELS)
    buf.add_task(1, [float(i) for i in range(10)], LABELS)
    state = json.loads(json.dumps(buf.state_dict()))
    assert state["balanced"] is True and {e["key"] for e in state["entries"]} == {"a", "b", "c"}
    again = QuotaBuffer(0)
    again.load_state_dict(state)
    assert again.balanced and [(e.task, e.index) for e in again.entries] == [(e.task, e.index) for e in buf.entries]
    # the restored buffer keeps splitting by label when a task is added
    for b in (buf, again):
        b.add_task(2, [float(-i) for i in range(10)], LABELS)
    assert [(e.task, e.index, e.score) for e in again.entries] == [(e.task, e.index, e.score) for e in buf.entries]
    assert "balanced" not in QuotaBuffer(4).state_dict()  # the plain buffer's format is unchanged
    with pytest.raises(ValueError, match="one label per scored example"):
        QuotaBuffer(4, balanced=True).add_task(0, SCORES)


def test_sample_with_replacement_draws_each_entry_on_its_own():
    """``replay.replacement``: the reference's one buffer example per micro-batch, so a step's
    draws repeat entries even when the buffer holds more than the step replays: 8 of 10 repeat
    with probability 1 - 10!/2!/10^8 = 0.98."""
    entries = [Entry(0, i) for i in range(10)]
    rng = random.Random(0)
    draws = [sample(entries, 8, rng, replacement=True) for _ in range(200)]
    assert all(len(d) == 8 and all(any(e is x for x in entries) for e in d) for d in draws)
    repeated = sum(len({e.index for e in d}) < 8 for d in draws)
    assert repeated > 180
    counts = [0] * 10
    for d in draws:
        for e in d:
            counts[e.index] += 1
    assert all(abs(c / 1600 - 0.1) < 0.03 for c in counts)


@pytest.mark.parametrize("replacement", [False, True])
def test_a_policy_draws_as_replay_replacement_says(replacement):
    from surecl.config import build_config
    from surecl.registry import policy_class

    cfg = build_config("surprise,tiny", [f"replay.replacement={str(replacement).lower()}"])
    policy = policy_class("surprise")(cfg.replay, 10, seed=0)
    policy.buffer.add_task(0, [float(i) for i in range(10)])
    repeated = sum(len({(e.task, e.index) for e in policy.sample(8)}) < 8 for _ in range(50))
    assert (repeated > 40) if replacement else (repeated == 0)


def test_the_paper_presets_draw_as_the_reference_code():
    from surecl.config import build_config

    assert build_config("paper-t5,slow_surprise").replay.replacement is True
    assert build_config("paper-llama,slow_surprise").replay.replacement is True
    assert build_config("slow_surprise").replay.replacement is False
