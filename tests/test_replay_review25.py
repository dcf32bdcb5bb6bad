"""Review 25, replay: what a quota buffer keeps of S (``replay.buffer_fraction=1``), replay keys a
run does not read (config warnings, the sweep's refusal), the dry run's replay steps under
bucketed batching, and no scoring pass for a buffer of 0 entries."""

from __future__ import annotations

import itertools
import json
import logging
import random

import pytest

from surecl.config import build_config, config_warnings
from surecl.data.task import Task
from surecl.data.tiny import tiny_stream
from surecl.errors import SureclError
from surecl.registry import policy_class


def unequal_stream() -> list[Task]:
    """Four tiny tasks of 12, 3, 3 and 3 training examples (the reviewer's q_frac1)."""
    ts = tiny_stream(n_train=12, n_test=2)
    return [ts[0]] + [Task(name=t.name, instruction=t.instruction, labels=t.labels, train=t.train[:3], test=t.test, group=t.group)
                      for t in ts[1:]]


def table(text: str) -> list[list[str]]:
    """The dry run's per-stage rows, as their cells."""
    return [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()]


# ------------------------------------------------------------------ 1: what a quota buffer keeps of S


def test_a_quota_buffer_holding_fewer_than_s_says_how_many_and_why():
    """At fraction 1 (S = 21 over tasks of 12/3/3/3) a quota policy keeps floor(21/4) = 5 per task:
    14 entries, the first task cut to 5 of 12; the warning said nothing of it before."""
    from surecl.replay.policies import stream_quota_warning

    tasks = unequal_stream()
    for name in ("surprise", "random"):
        said = stream_quota_warning(policy_class(name), 21, tasks)
        assert said is not None and "ends holding 14 of its S=21" in said and "floor(21/4) = 5 per task" in said, said
        assert "the remainder 21 - 4 x 5 = 1 is never used" in said and "3 task(s) have fewer training examples than 5 (animals 3" in said
        assert "leave 6 of their shares empty" in said
    assert stream_quota_warning(policy_class("reservoir"), 21, tasks) is None  # it keeps all 21
    equal = tiny_stream(n_train=12, n_test=2)
    assert stream_quota_warning(policy_class("surprise"), 24, equal) is None  # 6 of each of 4 tasks of 12: all of S
    remainder = stream_quota_warning(policy_class("surprise"), 22, equal)
    assert remainder is not None and "ends holding 20 of its S=22" in remainder and "fewer training examples" not in remainder
    # the earlier, graver warnings stay as they were
    assert "nothing will be replayed" in stream_quota_warning(policy_class("surprise"), 0, tasks)
    assert "from task 4 on" in stream_quota_warning(policy_class("surprise"), 3, tasks)


def test_quota_held_is_what_the_buffer_holds():
    from surecl.replay.buffer import QuotaBuffer, quota_held

    rng = random.Random(0)
    for _ in range(200):
        capacity, sizes = rng.randint(0, 30), [rng.randint(0, 12) for _ in range(rng.randint(1, 6))]
        buffer = QuotaBuffer(capacity)
        for t, n in enumerate(sizes):
            buffer.add_task(t, [rng.random() for _ in range(n)])
        assert len(buffer) == quota_held(capacity, sizes), (capacity, sizes)


def test_the_dry_run_warns_once_where_the_buffer_ends_below_s(tiny_cache):
    from surecl.plan import describe

    text = describe(build_config("tiny,surprise", ["data.n_train=9", "replay.buffer_size=9"]), tiny_cache)
    assert [line for line in text.splitlines() if "ends holding" in line] == [
        "warning: the buffer ends holding 8 of its S=9 entries: surprise keeps floor(S/d) = floor(9/4) = 2 per task "
        "(the paper's rule, whatever the tasks' sizes), so the remainder 9 - 4 x 2 = 1 is never used"]


def test_the_run_at_fraction_one_warns_once_with_what_it_keeps(tiny_cache, tmp_path, caplog):
    from surecl.trainer import run

    caplog.set_level(logging.WARNING, logger="surecl")
    cfg = build_config("tiny,random", ["train.epochs=1", "train.batch_size=4", "replay.buffer_fraction=1", "eval.fast=false"])
    res = run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache, tasks=unequal_stream())
    said = [r.getMessage() for r in caplog.records if r.name == "surecl" and "ends holding" in r.getMessage()]
    assert len(said) == 1 and "ends holding 14 of its S=21" in said[0], said
    assert (res["buffer"]["capacity"], res["buffer"]["size"]) == (21, 14)  # what the warning said


def test_the_texts_say_fraction_one_is_a_capacity():
    with pytest.raises(SureclError, match=r"1.0 = a capacity of every example, of which surprise or random keep floor\(S/d\) per task"):
        build_config("tiny,surprise", ["replay.buffer_size=1.0"])


# ------------------------------------------------------------------ 3: replay keys a run does not read


def test_a_replaced_replay_key_set_off_its_default_warns():
    fraction = config_warnings(build_config("surprise", ["replay.buffer_size=300", "replay.buffer_fraction=0.25"]))
    assert fraction == ["replay.buffer_size=300 is not read: replay.buffer_fraction=0.25 sets S (set only one of the two)"]
    # the user's own value warns; surecl's presets' values (tiny sets buffer_size 0.25, every 1
    # and batch_size 8) are replaced by design and say nothing
    assert any(w.startswith("replay.buffer_size=0.3 is not read") for w in config_warnings(
        build_config("tiny,surprise", ["replay.buffer_size=0.3", "replay.buffer_fraction=1"])))
    assert config_warnings(build_config("tiny,surprise", ["replay.buffer_fraction=1"])) == []
    ratio = config_warnings(build_config("surprise", ["replay.ratio=1:2", "replay.every=3", "replay.batch_size=6"]))
    assert ratio == ["replay.every=3 is not read: replay.ratio=1:2 sets every step's replayed count (set only one of the two)",
                     "replay.batch_size=6 is not read: replay.ratio=1:2 sets every step's replayed count (set only one of the two)"]
    # at their defaults, or read: no word
    assert config_warnings(build_config("surprise", ["replay.buffer_fraction=0.5", "replay.ratio=1:2"])) == []
    assert config_warnings(build_config("surprise", ["replay.buffer_size=300", "replay.every=3", "replay.batch_size=6"])) == []
    assert config_warnings(build_config("paper-t5,surprise")) == []


def test_the_dry_run_prints_the_unread_key_once(tiny_cache):
    from surecl.plan import describe

    text = describe(build_config("tiny,surprise", ["replay.buffer_size=0.3", "replay.buffer_fraction=0.5"]), tiny_cache)
    assert text.count("warning: replay.buffer_size=0.3 is not read: replay.buffer_fraction=0.5 sets S") == 1


def test_only_the_users_unread_replay_keys_warn(tmp_path):
    # tiny sets replay.every and batch_size, paper-t5 a ratio: the combination is surecl's own
    assert config_warnings(build_config("tiny,paper-t5")) == []
    # the same keys set by the user, on the command line or in their own file, do warn
    assert [w.split(" is not")[0] for w in config_warnings(build_config("tiny,paper-t5", ["replay.every=3"]))] == ["replay.every=3"]
    # ... or inside a section's mapping; a mapping that sets another key leaves the preset's quiet
    assert [w.split(" is not")[0] for w in config_warnings(build_config("tiny,paper-t5", ["replay={every: 3}"]))] == ["replay.every=3"]
    assert config_warnings(build_config("tiny,paper-t5", ['replay={ratio: "1:2"}'])) == []
    own = tmp_path / "mine.yaml"
    own.write_text("kind: setting\nreplay: {batch_size: 6}\n")
    assert [w.split(" is not")[0] for w in config_warnings(build_config(f"tiny,{own},paper-t5"))] == ["replay.batch_size=6"]
    # a preset after the user's file that sets the key again takes it over: quiet again
    assert config_warnings(build_config(f"{own},tiny,paper-t5")) == []
    # a run's own saved config.yaml restates every key: resuming from it stays quiet
    saved = tmp_path / "config.yaml"
    saved.write_text(build_config("tiny,paper-t5").to_yaml())
    assert config_warnings(build_config(str(saved))) == []


def _planned(plan):
    from surecl.sweep import expand

    runs = expand(plan)
    return runs, [build_config(f"{plan.config},{r.method}" if plan.config else r.method, r.overrides) for r in runs]


def test_a_sweep_refuses_a_grid_axis_its_runs_do_not_read():
    """``--grid replay.buffer_size=2,8`` with ``replay.buffer_fraction=0.25``: two rows, one run."""
    from surecl.sweep import Plan, check_grid_read

    plan = Plan(config="tiny", methods=["surprise"], overrides=["replay.buffer_fraction=0.25"], grid={"replay.buffer_size": ["2", "8"]})
    runs, configs = _planned(plan)
    assert configs[0].to_dict()["replay"] != configs[1].to_dict()["replay"]  # why the sweep's same-run check missed it
    with pytest.raises(SureclError, match=r"^sweep: grid key replay.buffer_size is not read by run surprise/replay.buffer_size=2/orderdefault/seed0 "
                       r"\(replay.buffer_fraction=0.25 sets S\), so its rows would be one run under several names; drop the axis, or "
                       r"unset replay.buffer_fraction$"):
        check_grid_read(runs, configs)
    plan = Plan(config="tiny", methods=["surprise"], overrides=["replay.ratio=1:2"], grid={"replay.every": ["1", "4"]})
    with pytest.raises(SureclError, match="grid key replay.every is not read .*replay.ratio=1:2 sets every step's replayed count"):
        check_grid_read(*_planned(plan))
    # a fraction axis beside a size axis: the fraction's runs ignore the size
    plan = Plan(config="tiny", methods=["surprise"], grid={"replay.buffer_fraction": ["0", "0.5"], "replay.buffer_size": ["2", "8"]})
    with pytest.raises(SureclError, match="grid key replay.buffer_size is not read by run surprise/replay.buffer_fraction=0.5/"):
        check_grid_read(*_planned(plan))
    # axes the runs read pass
    for plan in (Plan(config="tiny", methods=["surprise"], grid={"replay.buffer_size": ["2", "8"]}),
                 Plan(config="tiny", methods=["surprise"], overrides=["replay.buffer_size=300"], grid={"replay.buffer_fraction": ["0.1", "1"]}),
                 Plan(config="tiny", methods=["surprise"], overrides=["replay.ratio=1:2"], grid={"replay.ratio": ["1:4", "1:8"]})):
        check_grid_read(*_planned(plan))


def test_surecl_sweep_stops_on_such_an_axis_before_it_writes_anything(tmp_path, capsys):
    """The command itself: one line, exit 2, no sweep.json and no run folder."""
    from surecl.cli import main

    out = tmp_path / "sw"
    code = main(["sweep", "--config", "tiny", "--methods", "surprise", "--grid", "replay.buffer_size=2,8", "--out", str(out),
                 "replay.buffer_fraction=0.25", "data.n_train=8", "data.n_test=2", "train.epochs=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "grid key replay.buffer_size is not read" in err[0]
    assert not out.exists() or not any(out.iterdir())


# ------------------------------------------------------------------ 4: the dry run's replay steps under bucketed batching


def test_replay_steps_range_is_every_place_of_the_short_batch():
    """The fewest and most replay steps over every place each epoch's short batch can take."""
    from surecl.plan import _epoch_sizes, replay_count, replay_steps_range

    rng = random.Random(1)
    for _ in range(150):
        size, a, b, epochs, n = rng.randint(1, 6), rng.randint(1, 3), rng.randint(1, 12), rng.randint(1, 3), rng.randint(1, 20)
        cap, first = rng.choice([0, 0, rng.randint(1, 10)]), rng.choice([0, 1])
        cfg = build_config("tiny,surprise", [f"train.batch_size={size}", f"replay.ratio={a}:{b}", f"train.epochs={epochs}",
                                             f"train.max_steps_per_task={cap}"])
        places = []
        for m in _epoch_sizes(n, cfg, None):
            full, short = divmod(m, size)
            places.append([[size] * p + [short] + [size] * (full - p) for p in range(full + 1)] if short else [[size] * full])
        counts = set()
        for combo in itertools.product(*places):
            sizes = [s for epoch in combo for s in epoch][: cap or None]
            counts.add(sum(1 for step in range(first, len(sizes)) if replay_count(step, sizes, cfg) > 0))
        assert replay_steps_range(n, cfg, None, first) == (min(counts), max(counts))
        uniform = build_config("tiny,surprise", [f"train.batch_size={size}", f"replay.ratio={a}:{b}", f"train.epochs={epochs}",
                                                 f"train.max_steps_per_task={cap}", "train.batching=uniform"])
        low, high = replay_steps_range(n, uniform, None, first)  # the short batch last: one number
        assert low == high


def test_the_dry_runs_replay_steps_hold_the_bucketed_runs(tiny_cache, tmp_path):
    """Tasks of 9 in batches of 4 at 1:3: the short batch replays where it falls last, not first;
    the dry run said 3 replay steps per task where the run took 2 on most."""
    from surecl.plan import describe

    cfg = build_config("tiny,surprise", ["replay.ratio=1:3", "data.n_train=9", "data.n_test=2", "train.epochs=1", "train.batch_size=4",
                                         "eval.fast=false", "eval.matrix=fp_ap"])
    text = describe(cfg, tiny_cache)
    planned = [tuple(int(v) for v in row[5].split("-")) * (1 if "-" in row[5] else 2) for row in table(text)]

    from test_policies import replayed_per_step

    ran = [sum(1 for n in v if n) for v in replayed_per_step(cfg, tmp_path / "run", tiny_cache)]
    assert all(low <= r <= high for (low, high), r in zip(planned, ran, strict=True)), (planned, ran)
    assert any(low < high for low, high in planned) and "replay steps a-b: the fewest and the most" in text


# ------------------------------------------------------------------ 5: a buffer of 0 entries is not scored


@pytest.mark.parametrize("name", ["surprise", "random"])
def test_a_buffer_of_no_entries_asks_for_no_priorities(name):
    cfg = build_config(f"tiny,{name}", ["replay.buffer_size=0"])
    policy = policy_class(name)(cfg.replay, 0, 0)
    state = policy.rng.getstate()

    def scorer(task):
        raise AssertionError("scored a task for a buffer that keeps nothing")

    policy.at_task_start(0, 5, scorer)
    policy.at_task_end(0, 5, scorer)
    assert len(policy) == 0 and list(policy.buffer.by_task) == [0] and policy.rng.getstate() == state


def test_a_run_without_the_scoring_pass_ends_the_same(tiny_cache, tmp_path, monkeypatch):
    """The run with a buffer of 0 no longer scores each task; a run that still scores (a plugin
    calling the same scorer where the policy did) gives the same steps and matrix: scoring drew
    no random numbers."""
    from surecl.plugins import Plugin
    from surecl.trainer import ContinualRun

    calls = []
    original = ContinualRun.surprise_of_task

    def counted(self, task, scope=None, reduction=None):
        calls.append(task)
        return original(self, task, scope, reduction)

    monkeypatch.setattr(ContinualRun, "surprise_of_task", counted)

    class Score(Plugin):
        def before_task(self, ctx, stage):
            ctx.surprise_of_task(stage.row, scope="sequence", reduction="mean")

    cfg = build_config("tiny,surprise", ["replay.buffer_size=0", "data.tasks=[colors,animals]", "data.n_train=6", "data.n_test=4",
                                         "train.epochs=1", "train.batch_size=4", "lora.dropout=0.1", "eval.fast=false"])
    results = []
    for name, plugins in (("unscored", []), ("scored", [Score()])):
        calls.clear()
        res = ContinualRun(cfg, tmp_path / name, progress=False, cache_dir=tiny_cache, plugins=plugins).run()
        losses = [json.loads(line)["loss"] for line in (tmp_path / name / "log.jsonl").read_text().splitlines()]
        results.append((res["accuracy_matrix"], losses, len(calls)))
    (matrix, losses, scored), (matrix_scored, losses_scored, scored_by_plugin) = results
    assert scored == 0 and scored_by_plugin == 2
    assert matrix == matrix_scored and losses == losses_scored
