"""The step schedule of a stage, checked from what the optimizer and the forward passes saw,
not only from what log.jsonl says: ``replay.every`` (a replay batch joins only every k-th
step), ``train.warmup_steps`` with ``train.scheduler=linear`` (the lr ramps up, then decays
linearly toward 0 at the end of each task, restarted per task) and ``train.max_steps_per_task``
(steps per task capped)."""

from __future__ import annotations

import json
import math

import pytest
from torch.optim.optimizer import register_optimizer_step_pre_hook

import surecl.step as step
import surecl.trainer as trainer
from surecl.config import build_config

LR, WARM, EVERY, CAP, N, BATCH, EPOCHS = 0.002, 2, 3, 5, 24, 8, 2


@pytest.fixture(scope="module")
def scheduled(tmp_path_factory, tiny_cache):
    """A two-task run with every knob set; per optimizer step: the lr it applied and the rows
    its forward passes trained on."""
    out = tmp_path_factory.mktemp("schedule") / "run"
    cfg = build_config(
        "tiny,surprise",
        ["data.tasks=[colors,animals]", f"data.n_train={N}", "data.n_test=4", f"train.batch_size={BATCH}", f"train.epochs={EPOCHS}",
         f"train.lr={LR}", f"train.warmup_steps={WARM}", "train.scheduler=linear", f"train.max_steps_per_task={CAP}",
         f"replay.every={EVERY}", "replay.batch_size=4"],
    )
    applied: list[float] = []
    rows: list[int] = [0]  # rows of the training forwards before each optimizer step

    def before_step(optimizer, args, kwargs):
        applied.append(optimizer.param_groups[0]["lr"])
        rows.append(0)

    token_nll = step.token_nll  # the training step's forward

    def counting(model, batch, *args, **kwargs):
        rows[-1] += int(batch["input_ids"].shape[0])
        return token_nll(model, batch, *args, **kwargs)

    handle = register_optimizer_step_pre_hook(before_step)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(step, "token_nll", counting)
        try:
            results = trainer.run(cfg, out, progress=False, cache_dir=tiny_cache)
        finally:
            handle.remove()
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return results, log, applied, rows[:-1]


def test_steps_per_task_are_capped(scheduled):
    results, log, applied, _ = scheduled
    uncapped = math.ceil(N / BATCH) * EPOCHS
    assert uncapped > CAP  # the cap is what binds here
    assert [(r["stage"], r["step"]) for r in log] == [(s, k) for s in (0, 1) for k in range(CAP)]
    assert results["steps"] == len(applied) == 2 * CAP


def test_replay_joins_only_every_kth_step(scheduled):
    _, log, _, rows = scheduled
    assert [r["replayed"] for r in log] == [4 if r["step"] % EVERY == 0 else 0 for r in log]
    assert all(r["buffer"] > 0 for r in log)  # the buffer was never empty: skipping is the schedule
    # the replayed rows really were trained on, and only on those steps
    assert rows == [BATCH + r["replayed"] for r in log]


def test_lr_warms_up_then_decays_linearly_to_zero_per_task(scheduled):
    _, log, applied, _ = scheduled
    assert applied == pytest.approx([r["lr"] for r in log], rel=1e-12)  # the logged lr is the one applied
    per_task = [applied[:CAP], applied[CAP:]]
    assert per_task[0] == pytest.approx(per_task[1], rel=1e-12)  # restarted for the second task
    lrs = per_task[0]
    warm, decay = lrs[:WARM], lrs[WARM:]
    assert all(a < b for a, b in zip(warm, warm[1:])) and warm[-1] <= LR  # ramps up
    assert decay[0] == pytest.approx(LR)  # the peak once warmed up
    steps = [b - a for a, b in zip(decay, decay[1:])]
    assert all(d < 0 for d in steps) and steps == pytest.approx([steps[0]] * len(steps), rel=1e-9)  # linear
    assert decay[-1] + steps[0] == pytest.approx(0.0, abs=1e-12)  # ...reaching 0 right after the last step


def test_mtl_trains_each_task_its_own_epochs_and_its_share_of_the_cap(tmp_path, tiny_cache):
    """MTL's one stage holds every task: train.epochs_per_task gives the named task its own
    epochs (the later epochs mix only tasks with epochs left), not every task the largest; the
    per-task step cap is the cap times the tasks (it used to cap the whole stream)."""
    from surecl.plan import planned_steps

    tasks = ["data.tasks=[colors,animals,numbers]", "data.n_train=16", "data.n_test=4", "train.batch_size=4", "train.epochs=1"]
    cfg = build_config("tiny,mtl", [*tasks, "train.epochs_per_task=[colors:3]"])
    run = trainer.ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    (stage,) = run.stages
    pool = run._pool(stage)
    batches = run.plan_batches(stage)
    names = [[run.tasks[pool[k][0]].name for k in batch] for batch in batches]
    assert len(batches) == run.steps_in_stage(stage) == 12 + 4 + 4  # 48 examples, then colors' 16 twice
    assert sorted(k for batch in batches[:12] for k in batch) == list(range(48))  # the first epoch: every example once
    assert all(n == "colors" for batch in names[12:] for n in batch)
    assert sorted(k for batch in batches[12:] for k in batch) == sorted([k for k, (t, _) in enumerate(pool) if run.tasks[t].name == "colors"] * 2)
    # a sequential run of the same tasks trains as many steps
    assert planned_steps([16, 16, 16], cfg, ["colors", "animals", "numbers"]) == sum(planned_steps(16, cfg, [n]) for n in ("colors", "animals", "numbers"))
    capped = build_config("tiny,mtl", [*tasks, "train.max_steps_per_task=2"])
    assert planned_steps([16, 16, 16], capped, ["colors", "animals", "numbers"]) == 6 == 3 * planned_steps(16, capped, ["colors"])
