"""Replay policies: timing variants (SB-UB, SB-UA, SA-UA), random and reservoir selection,
aging, buffer capacity, and the trainer's scorer wiring."""

from __future__ import annotations

import json
import random

import pytest

from surecl.config import ReplayConfig, build_config
from surecl.plugins.sure import SurprisePolicy
from surecl.registry import policy_class
from surecl.replay.policies import RandomPolicy, ReservoirPolicy, buffer_capacity

N = 10  # training examples per task


class FakeScorer:
    """Surprise that depends on whether a task was "trained": before = [i], after = [-i].

    So the top-m before training are the highest indices, after training the lowest.
    """

    def __init__(self, n: int = N):
        self.n = n
        self.trained: set[int] = set()
        self.calls: list[tuple[int, bool]] = []

    def train(self, task: int) -> None:
        self.trained.add(task)

    def __call__(self, task: int) -> list[float]:
        after = task in self.trained
        self.calls.append((task, after))
        return [float(-i) if after else float(i) for i in range(self.n)]


def no_scorer(task: int) -> list[float]:
    raise AssertionError("this policy must not compute surprise")


def _indices(policy, task: int) -> set[int]:
    return {e.index for e in policy.buffer.entries if e.task == task}


def _surprise(score_time: str, insert_time: str, capacity: int = 6, aging: bool = False) -> SurprisePolicy:
    cfg = ReplayConfig(policy="surprise", score_time=score_time, insert_time=insert_time, aging=aging)
    return SurprisePolicy(cfg, capacity, seed=0)


TOP6_BEFORE = {9, 8, 7, 6, 5, 4}  # top-6 of [0..9]
TOP6_AFTER = {0, 1, 2, 3, 4, 5}  # top-6 of [0, -1, ..., -9]


def test_registry_names():
    assert policy_class("surprise") is SurprisePolicy
    assert policy_class("random") is RandomPolicy
    assert policy_class("reservoir") is ReservoirPolicy
    assert policy_class("none")(ReplayConfig(), 5, 0).sample(3) == []


# ---------------------------------------------------------------------------- surprise timing


def test_sb_ub_inserts_before_scores_at_before_task():
    policy, scorer = _surprise("before", "before"), FakeScorer()
    policy.at_task_start(0, N, scorer)
    assert scorer.calls == [(0, False)]
    assert _indices(policy, 0) == TOP6_BEFORE
    assert sorted(e.score for e in policy.buffer.entries) == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    scorer.train(0)
    policy.at_task_end(0, N, scorer)
    assert scorer.calls == [(0, False)]  # nothing scored after training
    assert _indices(policy, 0) == TOP6_BEFORE
    # second task: m = 3, each task keeps its top-3 before-scores
    policy.at_task_start(1, N, scorer)
    assert scorer.calls[-1] == (1, False)
    assert _indices(policy, 0) == {9, 8, 7} and _indices(policy, 1) == {9, 8, 7}


def test_sb_ua_scores_before_but_inserts_only_after():
    policy, scorer = _surprise("before", "after"), FakeScorer()
    policy.at_task_start(0, N, scorer)
    assert scorer.calls == [(0, False)]
    assert len(policy) == 0  # empty while training on the task
    scorer.train(0)
    policy.at_task_end(0, N, scorer)
    assert scorer.calls == [(0, False)]  # no new scoring: the before-scores are inserted
    assert _indices(policy, 0) == TOP6_BEFORE
    policy.at_task_start(1, N, scorer)
    assert _indices(policy, 0) == TOP6_BEFORE and _indices(policy, 1) == set()
    scorer.train(1)
    policy.at_task_end(1, N, scorer)
    assert _indices(policy, 0) == {9, 8, 7} and _indices(policy, 1) == {9, 8, 7}


def test_sb_ua_pending_scores_survive_a_checkpoint():
    policy, scorer = _surprise("before", "after"), FakeScorer()
    policy.at_task_start(0, N, scorer)
    restored = _surprise("before", "after")
    meta, tensors = policy.state_dict()
    restored.load_state_dict(json.loads(json.dumps(meta)), tensors)
    scorer.train(0)
    restored.at_task_end(0, N, scorer)
    assert _indices(restored, 0) == TOP6_BEFORE
    assert scorer.calls == [(0, False)]


def test_sa_ua_scores_and_inserts_after():
    policy, scorer = _surprise("after", "after"), FakeScorer()
    policy.at_task_start(0, N, scorer)
    assert scorer.calls == [] and len(policy) == 0
    scorer.train(0)
    policy.at_task_end(0, N, scorer)
    assert scorer.calls == [(0, True)]
    assert _indices(policy, 0) == TOP6_AFTER
    assert sorted(e.score for e in policy.buffer.entries) == [-5.0, -4.0, -3.0, -2.0, -1.0, 0.0]
    policy.at_task_start(1, N, scorer)
    scorer.train(1)
    policy.at_task_end(1, N, scorer)
    assert _indices(policy, 0) == {0, 1, 2} and _indices(policy, 1) == {0, 1, 2}


# ---------------------------------------------------------------------------- random


@pytest.mark.parametrize("insert_time", ["before", "after"])
def test_random_policy_m_per_task_and_insert_time(insert_time):
    cfg = ReplayConfig(policy="random", score_time="before", insert_time=insert_time)
    policy = RandomPolicy(cfg, 6, seed=0)
    policy.at_task_start(0, N, no_scorer)
    assert len(policy) == (6 if insert_time == "before" else 0)
    policy.at_task_end(0, N, no_scorer)
    first = _indices(policy, 0)
    assert len(first) == 6 and first <= set(range(N))
    policy.at_task_start(1, N, no_scorer)
    policy.at_task_end(1, N, no_scorer)
    # m = 3 each; task 0 keeps a subset of what it had (its highest random keys)
    assert len(_indices(policy, 0)) == 3 and _indices(policy, 0) <= first
    assert len(_indices(policy, 1)) == 3
    assert len(policy) == 6


def test_random_policy_is_seeded_and_uniform():
    cfg = ReplayConfig(policy="random")

    def pick(seed: int) -> set[int]:
        p = RandomPolicy(cfg, 3, seed=seed)
        p.at_task_start(0, N, no_scorer)
        return _indices(p, 0)

    assert pick(5) == pick(5)
    seeds = 1000
    counts = [0] * N
    for s in range(seeds):
        for i in pick(s):
            counts[i] += 1
    # each example selected with probability m / n = 0.3 (sd ~ 0.015)
    for c in counts:
        assert abs(c / seeds - 0.3) < 0.07


# ---------------------------------------------------------------------------- reservoir


def test_reservoir_policy_inserts_online_from_observe():
    policy = ReservoirPolicy(ReplayConfig(policy="reservoir"), 5, seed=0)
    policy.at_task_start(0, N, no_scorer)
    assert len(policy) == 0
    policy.observe(0, [3, 1, 4])
    assert [(e.task, e.index) for e in policy.buffer.entries] == [(0, 3), (0, 1), (0, 4)]
    policy.observe(0, [2, 0])
    policy.at_task_end(0, N, no_scorer)
    assert [(e.task, e.index) for e in policy.buffer.entries] == [(0, 3), (0, 1), (0, 4), (0, 2), (0, 0)]
    policy.at_task_start(1, N, no_scorer)
    for _ in range(20):  # 20 epochs: each example is offered once, on its first appearance
        policy.observe(1, list(range(N)))
    assert len(policy) == 5 and policy.buffer.n_seen == 5 + N
    assert all(e.task in (0, 1) for e in policy.buffer.entries)
    assert any(e.task == 1 for e in policy.buffer.entries)


def test_reservoir_never_holds_an_example_twice_over_epochs_and_a_resume():
    """Ten epochs of 100 examples into 20 slots: 20 distinct examples (a later epoch offering
    them again once filled the reservoir with repeats); a policy restored mid-task from its
    state goes on exactly as the uninterrupted one."""

    def fresh():
        p = ReservoirPolicy(ReplayConfig(policy="reservoir"), 20, seed=3)
        p.at_task_start(0, 100, no_scorer)
        return p

    whole, first = fresh(), fresh()
    for epoch in range(10):
        order = random.Random(epoch).sample(range(100), 100)
        for k in range(0, 100, 8):
            whole.observe(0, order[k:k + 8])
            if epoch < 3:
                first.observe(0, order[k:k + 8])
        if epoch == 2:
            meta, tensors = first.state_dict()
            resumed = ReservoirPolicy(ReplayConfig(policy="reservoir"), 20, seed=3)
            resumed.load_state_dict(json.loads(json.dumps(meta)), tensors)  # as a checkpoint's meta.json holds it
        elif epoch > 2:
            for k in range(0, 100, 8):
                resumed.observe(0, order[k:k + 8])
    held = [(e.task, e.index) for e in whole.buffer.entries]
    assert len(held) == len(set(held)) == 20 and whole.buffer.n_seen == 100
    assert [(e.task, e.index) for e in resumed.buffer.entries] == held
    # a checkpoint written before the offered set was kept goes on as that run did (every appearance)
    old = ReservoirPolicy(ReplayConfig(policy="reservoir"), 20, seed=3)
    old.load_state_dict({k: v for k, v in json.loads(json.dumps(meta)).items() if k != "offered"})
    old.observe(0, [0, 1, 2])
    assert old.offered is None and old.buffer.n_seen == 103
    old.at_task_start(1, 10, no_scorer)  # the next task keeps the set again
    old.observe(1, [4, 4])
    assert old.buffer.n_seen == 104
    whole.at_task_end(0, 100, no_scorer)
    assert whole.state_dict()[0]["offered"] == []  # a finished task's list is not carried in checkpoints


# ---------------------------------------------------------------------------- aging


@pytest.mark.parametrize("aging", [True, False])
def test_aging_rescores_and_later_rebalance_drops_aged_down(aging):
    policy, scorer = _surprise("before", "before", capacity=4, aging=aging), FakeScorer(n=4)
    policy.at_task_start(0, 4, scorer)  # scores [0, 1, 2, 3], all four kept (m = 4)
    assert _indices(policy, 0) == {0, 1, 2, 3}
    by_index = {e.index: e for e in policy.buffer.entries}
    policy.age([by_index[2], by_index[3]], [-5.0, -6.0])
    scores = {e.index: e.score for e in policy.buffer.entries}
    if aging:
        assert scores == {0: 0.0, 1: 1.0, 2: -5.0, 3: -6.0}
    else:
        assert scores == {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0}
    policy.at_task_start(1, 4, scorer)  # m = 2
    assert _indices(policy, 0) == ({0, 1} if aging else {2, 3})


def test_aging_with_sampled_entries_mutates_the_buffer():
    policy, scorer = _surprise("before", "before", capacity=4, aging=True), FakeScorer(n=4)
    policy.at_task_start(0, 4, scorer)
    replayed = policy.sample(2)
    policy.age(replayed, [100.0, 200.0])
    buffered = {(e.task, e.index): e.score for e in policy.buffer.entries}
    assert buffered[(0, replayed[0].index)] == 100.0
    assert buffered[(0, replayed[1].index)] == 200.0


# ---------------------------------------------------------------------------- capacity


def test_buffer_capacity_fraction_and_absolute():
    assert buffer_capacity(ReplayConfig(policy="surprise", buffer_size=0.02), 1000) == 20
    assert buffer_capacity(ReplayConfig(policy="surprise", buffer_size=0.1), 384) == 38  # floor(38.4)
    assert buffer_capacity(ReplayConfig(policy="random", buffer_size=300), 1000) == 300
    assert buffer_capacity(ReplayConfig(policy="reservoir", buffer_size=300.0), 50) == 300
    assert buffer_capacity(ReplayConfig(policy="none", buffer_size=300), 1000) == 0
    assert buffer_capacity(ReplayConfig(policy="surprise", buffer_size=0), 1000) == 0


def test_buffer_capacity_fraction_is_not_hit_by_float_rounding():
    # 29% of 100 training examples is exactly 29
    assert buffer_capacity(ReplayConfig(policy="surprise", buffer_size=0.29), 100) == 29


# ---------------------------------------------------------------------------- trainer wiring


def test_trainer_passes_scope_and_reduction_to_the_scorer(tiny_cache, tmp_path, monkeypatch):
    import surecl.trainer as trainer

    cfg = build_config("tiny,sum_surprise", ["replay.scope=label", "eval.batch_size=5"])
    assert (cfg.replay.reduction, cfg.replay.scope) == ("sum", "label")
    run = trainer.ContinualRun(cfg, tmp_path / "out", progress=False, cache_dir=tiny_cache)
    seen = {}

    def spy(model, items, **kwargs):
        seen.update(kwargs, items=items)
        return [float(i) for i in range(len(items))]

    monkeypatch.setattr(trainer, "score_examples", spy)
    scores = run.surprise_of_task(2)
    assert scores == [float(i) for i in range(len(run.train_sets[2]))]
    assert seen["scope"] == "label" and seen["reduction"] == "sum"
    assert seen["items"] is run.train_sets[2]
    assert seen["batch_size"] == 5
    assert seen["pad_id"] == run.tokenizer.pad_token_id and seen["is_seq2seq"] is False
    # and the policy built by the trainer inserts that task's top-m of those scores (SB-UB)
    assert isinstance(run.policy, SurprisePolicy)
    m = run.policy.capacity
    run.policy.at_task_start(2, len(run.train_sets[2]), run.surprise_of_task)
    n = len(run.train_sets[2])
    assert _indices(run.policy, 2) == set(range(n - m, n))


# ---------------------------------------------------------------------------- top-m of real scores


def _plain_nll(model, item, scope: str) -> tuple[float, int]:
    """Summed NLL and token count of one example from a plain forward of prompt + answer:
    the answer tokens (``label``) or every token after the first (``sequence``)."""
    import torch

    ids = torch.tensor([item.prompt + item.answer])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    start = len(item.prompt) if scope == "label" else 1
    targets = ids[0, start:]
    return float(-logp[start - 1 : -1].gather(1, targets[:, None]).sum()), len(targets)


def test_surprise_keeps_exactly_the_top_m_of_the_fast_adapters_scores(tiny_cache, tmp_path):
    """A buffer smaller than a task (m < n) keeps that task's m most surprising examples, by
    the fast adapter's NLL with the configured scope and reduction, and each keeps its score;
    the second task halves the quota and each task keeps its own top-m/2. Mean and sum rank
    the whole sequence differently (the rows differ in length); for the answer alone, whose
    token count is the same for every row of a tiny task, they keep the same examples."""
    import torch

    from surecl.trainer import ContinualRun

    n, capacity = 16, 10
    kept, values = {}, {}
    for scope in ("sequence", "label"):
        for reduction in ("mean", "sum"):
            cfg = build_config(
                "tiny,slow_surprise",
                ["data.tasks=[colors,animals]", f"data.n_train={n}", "data.n_test=4", f"replay.buffer_size={capacity}",
                 f"replay.scope={scope}", f"replay.reduction={reduction}"],
            )
            run = ContinualRun(cfg, tmp_path / f"{scope}-{reduction}", progress=False, cache_dir=tiny_cache)
            g = torch.Generator().manual_seed(0)
            with torch.no_grad():  # move the fast adapter off its init; the slow one stays there
                for p in run.adapters.fast_params:
                    p.add_(0.05 * torch.randn(p.shape, generator=g))
            run.adapters.model.eval()
            expected = {}
            for task in (0, 1):
                assert len(run.train_sets[task]) == n
                sums = [_plain_nll(run.adapters.model, e, scope) for e in run.train_sets[task]]
                expected[task] = [s / c if reduction == "mean" else s for s, c in sums]
                if scope == "label":
                    assert len({c for _, c in sums}) == 1  # every answer has the same token count
            run.adapters.model.train()
            values[(scope, reduction)] = expected
            for task, m in ((0, capacity), (1, capacity // 2)):
                run.policy.at_task_start(task, n, run.surprise_of_task)
                assert len(run.policy) == capacity
                for t in range(task + 1):
                    mine = {e.index: e.score for e in run.policy.buffer.entries if e.task == t}
                    assert len(mine) == m < n
                    for i, score in mine.items():
                        assert score == pytest.approx(expected[t][i], rel=1e-4)
                    worst_kept = min(expected[t][i] for i in mine)
                    best_dropped = max(expected[t][i] for i in range(n) if i not in mine)
                    assert worst_kept >= best_dropped - 1e-4 * abs(best_dropped), (t, sorted(mine))
            kept[(scope, reduction)] = {(e.task, e.index) for e in run.policy.buffer.entries}

    def top(key, task, m):
        v = values[key][task]
        return set(sorted(range(n), key=lambda i: -v[i])[:m])

    # the four variants are not the same selection in disguise: the data tells them apart
    assert top(("sequence", "mean"), 0, capacity) != top(("sequence", "sum"), 0, capacity)
    assert top(("sequence", "mean"), 0, capacity) != top(("label", "mean"), 0, capacity)
    assert kept[("sequence", "mean")] != kept[("sequence", "sum")]
    assert kept[("sequence", "mean")] != kept[("label", "mean")]
    assert kept[("label", "mean")] == kept[("label", "sum")]


# ---------------------------------------------------------------------------- balance by label


LABELS10 = ["x"] * 7 + ["y"] * 2 + ["z"]  # a task whose labels are far from even


@pytest.mark.parametrize("policy_name", ["surprise", "random"])
def test_balance_label_spreads_each_tasks_share_over_its_labels(policy_name):
    cfg = ReplayConfig(policy=policy_name, balance="label")
    policy = policy_class(policy_name)(cfg, 6, seed=0)
    scorer = FakeScorer()  # before training: score = index, so x's examples score lowest
    policy.at_task_start(0, N, scorer, LABELS10)
    held = sorted(LABELS10[e.index] for e in policy.buffer.entries)
    assert held == ["x", "x", "x", "y", "y", "z"]  # y and z give all they have, x the rest
    if policy_name == "surprise":  # inside a label, the most surprising first
        assert _indices(policy, 0) == {6, 5, 4, 8, 7, 9}
    policy.at_task_start(1, N, scorer, LABELS10)  # m = 3: one of each label per task
    for task in (0, 1):
        assert sorted(LABELS10[e.index] for e in policy.buffer.entries if e.task == task) == ["x", "y", "z"]
    unbalanced = policy_class(policy_name)(ReplayConfig(policy=policy_name), 6, seed=0)
    unbalanced.at_task_start(0, N, FakeScorer(), LABELS10)  # labels are ignored without balance
    if policy_name == "surprise":
        assert _indices(unbalanced, 0) == TOP6_BEFORE


def test_balance_label_in_a_run_keeps_every_label_evenly(tiny_cache, tmp_path):
    """The trainer hands each task's labels to the policy: the run's kept examples spread
    evenly over every task's labels (the tiny tasks have two labels, ~equally frequent)."""
    from surecl.trainer import run

    cfg = build_config("tiny,surprise", ["data.tasks=[colors,animals,numbers]", "data.n_train=24", "data.n_test=4",
                                         "replay.buffer_size=18", "replay.balance=label"])
    from surecl.plan import describe

    assert "each task's share spread evenly over its labels" in describe(cfg, tiny_cache)  # the dry run says so
    res = run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    labels = res["buffer"]["labels"]
    assert set(labels) == {"colors", "animals", "numbers"}
    for task, counts in labels.items():
        assert sum(counts.values()) == 6 and max(counts.values()) - min(counts.values()) <= 1, (task, counts)
    state = json.loads((tmp_path / "run" / "buffer.json").read_text())
    assert state["balanced"] is True


def test_balance_needs_a_per_task_quota_policy():
    from surecl.errors import SureclError

    for policy in ("reservoir", "online_surprise", "none"):
        with pytest.raises(SureclError, match=f"replay.balance: 'label' needs a per-task quota policy .* not {policy}"):
            build_config("tiny", [f"replay.policy={policy}", "replay.balance=label", "replay.scope=label"])
    with pytest.raises(SureclError, match="replay.balance"):
        build_config("tiny", ["replay.policy=surprise", "replay.balance=labels"])
    with pytest.raises(SureclError, match="replay.balance: 'label' needs labelled tasks"):
        build_config("tiny,cpt", ["replay.policy=surprise", "replay.balance=label"])


def test_a_subclass_with_the_old_hook_signature_still_runs_unbalanced(tiny_cache, tmp_path):
    """A policy written against ``at_task_start(task, n_items, scorer)`` is not handed labels
    unless the run asks for balance."""
    from surecl.registry import register_policy, unregister_policy
    from surecl.replay.policies import QuotaPolicy
    from surecl.trainer import run

    class LastK(QuotaPolicy):
        def at_task_start(self, task, n_items, scorer):
            super().at_task_start(task, n_items, lambda t: [float(i) for i in range(n_items)])

        def priorities(self, task, n_items, scorer):
            return scorer(task)

    register_policy("last_k", LastK)
    try:
        cfg = build_config("tiny,surprise", ["data.tasks=[colors,animals]", "data.n_train=8", "data.n_test=4",
                                             "train.epochs=1", "replay.policy=last_k", "replay.buffer_size=4"])
        res = run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    finally:
        unregister_policy("last_k")
    kept = json.loads((tmp_path / "run" / "buffer.json").read_text())["entries"]
    assert sorted((e["task"], e["index"]) for e in kept) == [(0, 6), (0, 7), (1, 6), (1, 7)], kept
    assert res["buffer"]["per_task"] == {"colors": 2, "animals": 2}


def test_the_dry_run_counts_no_replay_step_where_the_buffer_holds_nothing():
    """A buffer of 0 entries, or a quota floor(S/d) of 0 (S = 3 at the fourth task), replays
    nothing: the dry run's table counted replay steps there beside its own warning."""
    from surecl.plan import describe

    def replay_steps(*overrides: str) -> list[int]:
        text = describe(build_config("tiny,surprise", ["data.n_train=16", *overrides]))
        return [int(line.split("|")[6]) for line in text.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]

    assert replay_steps("replay.buffer_size=0") == [0, 0, 0, 0]
    assert replay_steps("replay.buffer_size=3") == [16, 16, 16, 0]
    assert replay_steps("replay.buffer_size=3", "replay.insert_time=after") == [0, 16, 16, 16]  # floor(3/3) = 1 while the fourth trains


@pytest.mark.parametrize("overrides", [
    ["tiny,reservoir", "train.batch_size=4", "data.n_train=8"],  # online: nothing to replay at the first step
    ["tiny,surprise", "data.n_train=17", "train.batch_size=16", "replay.ratio=1:16"],  # a short batch replays nothing
])
def test_the_dry_runs_replay_steps_are_the_runs(tmp_path, tiny_cache, overrides):
    """The dry run counted an online policy's first step and, with a ratio, every batch as a
    full one: its column now equals the steps that replayed in the run it describes."""
    from surecl.plan import describe

    preset, *rest = overrides
    cfg = build_config(preset, [*rest, "data.tasks=[colors,animals]", "train.epochs=1", "eval.matrix=fp_ap"])
    table = [line.split("|") for line in describe(cfg).splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    planned = [(int(row[5]), int(row[6])) for row in table]

    ran = [(len(v), sum(1 for n in v if n)) for v in replayed_per_step(cfg, tmp_path / "run", tiny_cache)]
    assert planned == ran and any(r < s for s, r in ran)


def replayed_per_step(cfg, out, cache) -> list[list[int]]:
    """Per stage of a run of ``cfg`` in ``out``, how many examples each optimizer step replayed."""
    from surecl.plugins import Plugin
    from surecl.trainer import ContinualRun

    class Count(Plugin):
        def __init__(self):
            self.steps: dict[int, list[int]] = {}

        def after_step(self, ctx, record):
            self.steps.setdefault(record.stage.row, []).append(len(record.replayed))

    count = Count()
    ContinualRun(cfg, out, progress=False, cache_dir=cache, plugins=[count]).run()
    return [v for _, v in sorted(count.steps.items())]
