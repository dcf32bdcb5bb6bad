"""Online boundary-free SuRe: the label-quota buffer fed by training-loss surprise."""

from __future__ import annotations

import random

import pytest

from surecl.config import build_config
from surecl.registry import policy_class
from surecl.replay.buffer import Entry, OnlineQuotaBuffer, quota


class NaiveOnlineBuffer:
    """The same rules written the slow, obvious way (lists, full sorts): the reference."""

    def __init__(self, capacity):
        self.capacity, self.keys, self.items = capacity, [], {}  # ref -> [key, score]

    def members(self, key):
        return [(s, r) for r, (k, s) in self.items.items() if k == key]

    def offer(self, key, task, index, score):
        ref = (task, index)
        if ref in self.items:
            self.items[ref][1] = score
            return
        if key not in self.keys:
            self.keys.append(key)
            m = quota(self.capacity, len(self.keys))
            for k in self.keys:
                ranked = sorted(self.members(k), key=lambda sr: (-sr[0], sr[1]))
                for _, r in ranked[m:]:
                    del self.items[r]
        m = quota(self.capacity, len(self.keys))
        if m == 0:
            return
        mine = self.members(key)
        if len(mine) < m:
            self.items[ref] = [key, score]
            return
        low_score, low_ref = min(mine, key=lambda sr: (sr[0], sr[1]))
        if score > low_score:
            del self.items[low_ref]
            self.items[ref] = [key, score]

    def rescore(self, ref, score):
        if ref in self.items:
            self.items[ref][1] = score


def snapshot(buf: OnlineQuotaBuffer):
    return {(e.task, e.index): (buf.key_of[(e.task, e.index)], e.score) for e in buf.entries}


def test_equal_quota_per_label_and_top_scores_inside():
    buf = OnlineQuotaBuffer(4)
    for i, s in enumerate([0.1, 0.9, 0.5, 0.7, 0.3]):
        buf.offer("warm", Entry(0, i, s))
    assert {e.index for e in buf.entries} == {1, 2, 3, 4}  # capacity 4, one label: the top four
    buf.offer("cool", Entry(0, 10, 0.05))
    assert buf.per_key() == {"warm": 2, "cool": 1}  # a second label halves the quota
    assert {e.index for e in buf.entries if buf.key_of[(e.task, e.index)] == "warm"} == {1, 3}
    buf.offer("cool", Entry(1, 0, 0.01))
    buf.offer("cool", Entry(1, 1, 0.02))  # replaces the 0.01 entry, quota 2 is full
    assert {(e.task, e.index) for e in buf.entries if buf.key_of[(e.task, e.index)] == "cool"} == {(0, 10), (1, 1)}
    buf.offer("cool", Entry(1, 2, 0.0))  # less surprising than every kept one: rejected
    assert (1, 2) not in buf.live


def test_an_example_offered_again_updates_its_score_instead_of_duplicating():
    buf = OnlineQuotaBuffer(2)
    buf.offer("a", Entry(0, 0, 0.9))
    buf.offer("a", Entry(0, 1, 0.5))
    buf.offer("a", Entry(0, 0, 0.1))  # a later epoch: it is learned now
    assert len(buf) == 2 and buf.live[(0, 0)].score == 0.1
    buf.offer("a", Entry(0, 2, 0.3))  # beats the re-scored entry, not the 0.5 one
    assert set(buf.live) == {(0, 1), (0, 2)}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("capacity", [0, 1, 5, 12])
def test_matches_the_naive_reference_on_random_streams(seed, capacity):
    rng = random.Random(seed)
    buf, ref = OnlineQuotaBuffer(capacity), NaiveOnlineBuffer(capacity)
    labels = ["a", "b", "c", "d", "e"]
    for step in range(1500):
        task = min(step // 300, 4)
        key = labels[task] if rng.random() < 0.8 else rng.choice(labels[: task + 1])
        index, score = rng.randrange(60), rng.random()
        if rng.random() < 0.1 and buf.entries:
            e = rng.choice(buf.entries)
            buf.rescore((e.task, e.index), score)
            ref.rescore((e.task, e.index), score)
            continue
        buf.offer(key, Entry(task, index, score))
        ref.offer(key, task, index, score)
        assert len(buf.entries) == len(buf.live) == len({(e.task, e.index) for e in buf.entries})
        assert all(len(h) <= 2 * max(buf.quota(), 1) + 17 for h in buf.heaps.values())
    assert snapshot(buf) == {r: (k, s) for r, (k, s) in ref.items.items()}
    m = buf.quota()
    assert all(n <= m for n in buf.per_key().values())
    assert len(buf) <= capacity


def test_state_dict_round_trip_continues_identically():
    rng = random.Random(3)
    stream = [(rng.choice("xyz"), Entry(rng.randrange(3), rng.randrange(40), rng.random())) for _ in range(400)]
    a = OnlineQuotaBuffer(9)
    for key, e in stream[:200]:
        a.offer(key, Entry(e.task, e.index, e.score))
    b = OnlineQuotaBuffer(0)
    b.load_state_dict(a.state_dict())
    assert snapshot(b) == snapshot(a) and b.n_seen == a.n_seen
    for key, e in stream[200:]:
        a.offer(key, Entry(e.task, e.index, e.score))
        b.offer(key, Entry(e.task, e.index, e.score))
    assert snapshot(b) == snapshot(a)


def test_policy_offers_with_scores_and_labels_and_ages():
    policy = policy_class("online_surprise")(build_config("online_surprise,tiny", ["replay.aging=true"]).replay, 4, seed=0)
    assert policy.config.scope == "label" and policy.needs_step_scores
    policy.observe(0, [0, 1, 2], [0.3, 0.8, 0.1], ["warm", "warm", "cool"])
    policy.observe(1, [0, 1], [0.9, 0.2], ["pet", "pet"])
    assert policy.buffer.per_key() == {"warm": 1, "cool": 1, "pet": 1}
    assert {(e.task, e.index) for e in policy.buffer.entries} == {(0, 1), (0, 2), (1, 0)}
    kept = policy.buffer.live[(1, 0)]
    policy.age([kept], [0.05])
    assert policy.buffer.live[(1, 0)].score == 0.05
    policy.observe(1, [2], [0.06], ["pet"])  # now beats the aged entry
    assert (1, 2) in policy.buffer.live and (1, 0) not in policy.buffer.live


def test_online_policy_trains_without_an_extra_scoring_pass(tmp_path, tiny_cache):
    from surecl.trainer import run

    kept = []
    for seed in (0, 1, 2):  # one tiny run is chaotic: retention is averaged over three seeds
        cfg = build_config("tiny,online_surprise", ["data.tasks=[colors,animals,numbers]", f"seed={seed}"])
        res = run(cfg, tmp_path / f"run{seed}", progress=False, cache_dir=tiny_cache)
        assert res["timing"]["score"] == 0.0  # no separate surprise pass
        per_task = res["buffer"]["per_task"]
        assert set(per_task) == {"colors", "animals", "numbers"} and res["buffer"]["size"] == res["buffer"]["capacity"] - res["buffer"]["capacity"] % 6
        a = res["accuracy_matrix"]
        assert a[0][0] >= 90.0
        kept.append(sum(a[-1][:-1]) / 2)
    assert sum(kept) / 3 >= 20.0, kept  # replay keeps earlier tasks (seq_lora keeps <= 10 here)
