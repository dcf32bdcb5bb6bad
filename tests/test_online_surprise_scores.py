"""online_surprise takes each example's surprise from the training step's own forward: the mean
answer-token NLL under the fast adapter as it was *before* that step's update. Checked here
against an independent computation: the adapter's weights are captured right before every
optimizer step (a global optimizer pre-step hook), and each offered example's NLL is recomputed
from them with a plain forward of the whole row (no collation, shared prefix, micro-batch slices
or ``logits_to_keep``)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from surecl.config import build_config
from surecl.trainer import ContinualRun


def answer_nll(model, item) -> float:
    """Mean NLL of the answer tokens given the prompt, from one plain forward of prompt + answer."""
    ids = torch.tensor([item.prompt + item.answer])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    first = len(item.prompt)
    targets = ids[0, first:]
    return float(-logp[first - 1 : -1].gather(1, targets[:, None]).mean())


@pytest.mark.parametrize("aging", [False, True])
def test_online_scores_are_the_pre_update_answer_nll(aging, tmp_path, tiny_cache):
    """Offered examples carry their pre-update NLL; with ``replay.aging`` so do replayed entries
    (re-scored from the replay step's forward, where the replayed rows sit behind the current
    ones and run in other slices)."""
    cfg = build_config(
        "tiny,online_surprise",
        # small slices: every step runs several (the per-item results are put back in order),
        # and replayed rows of the other task share the steps of the second one
        ["data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=4", "train.epochs=2", "train.micro_batch_tokens=100",
         f"replay.aging={str(aging).lower()}"],
    )
    run = ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    model = run.adapters.model
    names = {id(p): n for n, p in model.named_parameters()}
    before: list[dict[str, torch.Tensor]] = []

    def capture(optimizer, args, kwargs):
        before.append({names[id(p)]: p.detach().clone() for g in optimizer.param_groups for p in g["params"]})

    # (step, what, task, index, score, key) in call order; step = the optimizer step whose
    # pre-update weights the score must come from
    events: list[tuple[int, str, int, int, float, str | None]] = []
    observe, age = run.policy.observe, run.policy.age

    def spy_observe(task, indices, scores=None, keys=None):
        events.extend((len(before) - 1, "offer", task, i, s, key) for i, s, key in zip(indices, scores, keys))
        return observe(task, indices, scores, keys)

    def spy_age(entries, scores):
        events.extend((len(before) - 1, "age", e.task, e.index, s, None) for e, s in zip(entries, scores))
        return age(entries, scores)

    run.policy.observe, run.policy.age = spy_observe, spy_age
    handle = register_optimizer_step_pre_hook(capture)
    try:
        results = run.run()
    finally:
        handle.remove()
    after_run = {n: p.detach().clone() for n, p in model.named_parameters() if n in before[0]}
    steps = results["steps"]
    assert steps == 2 * 4 and len(before) == steps
    offers = [e for e in events if e[1] == "offer"]
    ages = [e for e in events if e[1] == "age"]
    assert (len(ages) > 0) == aging

    # every trained example is offered once per epoch, with its own label as the key
    for task in (0, 1):
        assert sorted(i for _, _, t, i, _, _ in offers if t == task) == sorted(list(range(16)) * 2)
    assert all(key == run.train_sets[t][i].label for _, _, t, i, _, key in offers)

    def nll_under(state, t, i):
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in state:
                    p.copy_(state[n])
        return answer_nll(model, run.train_sets[t][i])

    model.eval()
    got = [s for _, _, _, _, s, _ in events]
    pre = [nll_under(before[k], t, i) for k, _, t, i, _, _ in events]
    post = [nll_under(before[k + 1] if k + 1 < steps else after_run, t, i) for k, _, t, i, _, _ in events]
    assert got == pytest.approx(pre, rel=1e-4, abs=1e-5)
    # the comparison can tell the pre-update model from the post-update one
    assert sum(abs(a - b) for a, b in zip(post, pre)) / len(pre) > 1e-2
    assert len({round(s, 4) for s in got}) > len(got) // 2

    # the buffer keeps each entry with the score it was given last (offer, or re-score on replay)
    latest, key_of = {}, {}
    for _, _, t, i, s, key in events:
        latest[(t, i)] = s
        if key is not None:
            key_of[(t, i)] = key
    saved = json.loads((tmp_path / "run" / "buffer.json").read_text())
    assert saved["entries"], "the buffer should hold entries"
    for e in saved["entries"]:
        assert (e["score"], e["key"]) == (latest[(e["task"], e["index"])], key_of[(e["task"], e["index"])])
    if aging:  # some kept entry carries a score from a replay step, not from its offer
        offered_last = {(t, i): s for _, _, t, i, s, _ in offers}
        assert any(e["score"] != offered_last[(e["task"], e["index"])] for e in saved["entries"])


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_online_aging_takes_the_replay_loss_whatever_the_reduction(reduction, tmp_path, tiny_cache, monkeypatch):
    """online_surprise's fresh entries are step losses; its aged ones come from the replay
    step's loss too, by a mean or a sum: no scoring pass (with a sum there was one, in eval mode
    after the update: another scale than the entries it is ranked against)."""
    import surecl.trainer as trainer_mod

    calls = []
    score = trainer_mod.score_examples
    monkeypatch.setattr(trainer_mod, "score_examples", lambda *a, **k: calls.append(1) or score(*a, **k))
    cfg = build_config("tiny,online_surprise", ["data.tasks=[colors,animals]", "data.n_train=8", "data.n_test=2", "train.epochs=1",
                                                "replay.aging=true", f"replay.reduction={reduction}"])
    run = ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    aged = []
    age = run.policy.age
    run.policy.age = lambda entries, scores: aged.extend(scores) or age(entries, scores)
    run.run()
    assert aged and not calls
