"""``--log-with tensorboard``: event files with the loss per step and every accuracy-matrix
cell, read back from the files (TFRecord framing, tensorboardX's Event protobuf)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from surecl.cli import main
from surecl.config import build_config
from surecl.trainer import run

ARGS = ["data.tasks=[colors,animals]", "data.n_test=16", "eval.before=true"]


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under ``folder``: tag -> [(step, value)]."""
    from tensorboardX.proto.event_pb2 import Event

    out: dict[str, list[tuple[int, float]]] = {}
    files = sorted(folder.rglob("events.out.tfevents.*"))
    assert files, f"no event files under {folder}"
    for path in files:
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            for v in event.summary.value:
                if v.HasField("simple_value"):
                    out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


def logged_steps(folder: Path) -> list[tuple[int, str]]:
    """Every scalar's (step, tag) under ``folder`` in the order it was logged (one process)."""
    from tensorboardX.proto.event_pb2 import Event

    out = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            out += [(event.step, v.tag) for v in event.summary.value if v.HasField("simple_value")]
    return out


def test_tensorboard_gets_the_loss_per_step_and_every_matrix_cell(tmp_path, tiny_cache):
    cfg = build_config("tiny,slow_surprise", ARGS)
    res = run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache, log_with=["tensorboard"])
    got = scalars(tmp_path / "run" / "tensorboard")
    losses = [v for _, v in got["train/loss"]]
    assert len(losses) == res["steps"] and [s for s, _ in got["train/loss"]] == list(range(1, res["steps"] + 1))
    logged = [json.loads(line)["loss"] for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert losses == pytest.approx(logged, abs=1e-6)  # the same losses as log.jsonl (rounded to 6 places there)
    a, fast = res["accuracy_matrix"], res["fast"]["accuracy_matrix"]
    for i, row in enumerate(a):
        for j, name in enumerate(res["tasks"]):
            if row[j] is not None:
                assert [v for _, v in got[f"matrix/row{i}/{name}"]] == [pytest.approx(row[j])]
    # one curve per task: the before-training row at step 0, then each row after its stage
    colors = got["accuracy/colors"]
    assert colors[0] == (0, pytest.approx(res["initial"][0])) and [v for _, v in colors[1:]] == pytest.approx([a[0][0], a[1][0]])
    assert [v for _, v in got["accuracy_fast/animals"]] == pytest.approx([fast[1][1]])
    assert got["summary/fp"] == [(res["steps"], pytest.approx(res["fp"]))]
    assert max(losses) > min(losses)  # it trained


def test_cli_log_with_writes_events_and_rejects_an_unknown_tracker(tmp_path, tiny_cache, monkeypatch, capsys):
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    out = tmp_path / "cli"
    assert main(["run", "--quiet", "--config", "tiny,seq_lora", *ARGS, "--log-with", "tensorboard", "--out", str(out)]) == 0
    assert "train/loss" in scalars(out / "tensorboard")
    assert main(["run", "--quiet", "--config", "tiny,seq_lora", *ARGS, "--log-with", "nosuch", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "--log-with: unknown tracker 'nosuch'" in err and "Traceback" not in err
    assert not (tmp_path / "bad").exists()
    # --fresh removes the tracker's folder with the rest of the run
    assert main(["run", "--quiet", "--fresh", "--config", "tiny,seq_lora", *ARGS, "--out", str(out)]) == 0
    assert not (out / "tensorboard").exists()


def test_log_with_all_names_the_installed_trackers_so_the_folder_records_their_files(tmp_path, tiny_cache, monkeypatch):
    """``--log-with all`` is every installed tracker by name: TensorBoard's events are then the
    run's own (a later run, --fresh included, replaced them; they were refused as a user's)."""
    from surecl.plugins.tracking import check_trackers

    assert check_trackers(["all"])[0] == "tensorboard" and check_trackers(["tensorboard", "all"]).count("tensorboard") == 1
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    out = tmp_path / "all"
    assert main(["run", "--quiet", "--config", "tiny,seq_lora", *ARGS, "--log-with", "all", "--out", str(out)]) == 0
    assert "train/loss" in scalars(out / "tensorboard")
    first = set((out / "tensorboard").rglob("events.*"))
    assert main(["run", "--quiet", "--fresh", "--config", "tiny,seq_lora", *ARGS, "--log-with", "tensorboard", "--out", str(out)]) == 0
    assert first and not first & set((out / "tensorboard").rglob("events.*"))  # the earlier run's events went with --fresh


def test_generation_stream_logs_its_metric_and_the_general_probe(tmp_path, tiny_cache):
    """A generation stream's cells go under the tasks' own metric (``rouge_l/<task>``, not
    ``accuracy/``), and the general-ability probe is logged per part: before training at step 0
    (with ``eval.before`` off), after every stage, the fast adapter's, and its change."""
    from test_general import STREAM, write_probe

    probe = write_probe(tmp_path / "general")
    cfg = build_config("tiny,slow_surprise", [*STREAM, f"eval.general={probe}", "eval.before=false"])
    res = run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache, log_with=["tensorboard"])
    got = scalars(tmp_path / "run" / "tensorboard")
    assert res["metric"] == "rouge_l" and not any(tag.startswith("accuracy") for tag in got)
    a, fast, g = res["accuracy_matrix"], res["fast"]["accuracy_matrix"], res["general"]
    assert [v for _, v in got["rouge_l/colors"]] == pytest.approx([a[0][0], a[1][0]])
    assert [v for _, v in got["rouge_l_fast/animals"]] == pytest.approx([fast[1][1]])
    steps = [s for s, _ in got["rouge_l/colors"]]
    for part in ("text", "instruct"):
        assert got[f"general/{part}"] == [(0, pytest.approx(g["before"][part])),
                                          *[(s, pytest.approx(row[part])) for s, row in zip(steps, g["after"])]]
        assert [v for _, v in got[f"general_fast/{part}"]] == pytest.approx([row[part] for row in g["fast"]["after"]])
        assert got[f"summary/general_change/{part}"] == [(res["steps"], pytest.approx(g["change"][part]))]
    mark = json.loads((tmp_path / "run" / "tracking.json").read_text())
    assert mark["general_initial"] is True and mark["rows"] == [0, 1]
    # in the order logged, steps never go back: a tracker whose steps must rise (W&B) drops a
    # value logged at a step below one it holds, so the probe's step-0 values come first
    order = logged_steps(tmp_path / "run" / "tensorboard" / "surecl")
    assert [s for s, _ in order] == sorted(s for s, _ in order)
    assert order[0] == (0, "general/text") or order[0] == (0, "general/instruct")


@pytest.mark.parametrize("changed", [False, True])
def test_a_rerun_before_any_checkpoint_logs_its_own_steps_when_its_config_changed(tmp_path, tiny_cache, monkeypatch, changed):
    """A run stopped before its first checkpoint may be rerun into its folder, changed or not.
    Unchanged, the steps the stopped process logged are not sent again (the rerun trains them
    again to the same values). Changed (another lr), they are another run's: the rerun sends its
    own, so every step of the finished run has its value in the event files."""
    from surecl.errors import SureclError

    args = [*ARGS, "train.checkpoint_every=0", "eval.before=false"]
    out = tmp_path / "run"
    monkeypatch.setenv("SURECL_NAN_AT", "0:3")
    with pytest.raises(SureclError, match="non-finite loss"):
        run(build_config("tiny,seq_lora", args), out, progress=False, cache_dir=tiny_cache, log_with=["tensorboard"])
    monkeypatch.delenv("SURECL_NAN_AT")
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
    first = dict(scalars(out / "tensorboard")["train/loss"])
    assert sorted(first) == [1, 2, 3]
    again = build_config("tiny,seq_lora", [*args, "train.lr=0.0005"] if changed else args)
    run(again, out, progress=False, cache_dir=tiny_cache, log_with=["tensorboard"])
    losses = {r["global_step"]: r["loss"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "loss" in r}
    got = scalars(out / "tensorboard")["train/loss"]
    steps = [s for s, _ in got]
    if changed:
        assert sorted(steps) == sorted([1, 2, 3, *losses])  # the stopped run's three and all of this run's
        for s in (1, 2, 3):
            values = [v for t, v in got if t == s]
            assert losses[s] == pytest.approx(values[-1], rel=1e-6, abs=1e-6) and values[0] == pytest.approx(first[s], rel=1e-6)
            if s > 1:  # step 1's loss is computed before the first update, at either lr
                assert values[0] != pytest.approx(values[-1], rel=1e-6)
    else:
        assert sorted(steps) == sorted(losses)  # each step once
        assert all(v == pytest.approx(losses[s], rel=1e-6, abs=1e-6) for s, v in got)  # log.jsonl keeps 6 decimals


def test_a_rerun_on_other_data_logs_its_own_steps(tmp_path, tiny_cache, monkeypatch):
    """A run stopped before its first checkpoint and rerun with the same config on other data
    (tasks passed from Python) trained other values: the rerun sends its own steps, so the event
    files end with log.jsonl's losses, as a checkpoint's resume would refuse the change."""
    from surecl.data.tiny import tiny_stream
    from surecl.errors import SureclError

    def tasks(seed):
        return [t for t in tiny_stream(n_train=16, n_test=4, seed=seed) if t.name in ("colors", "animals")]

    cfg = build_config("tiny,seq_lora", ["data.benchmark=none", "train.checkpoint_every=0", "eval.before=false", "train.epochs=2"])
    out = tmp_path / "run"
    monkeypatch.setenv("SURECL_NAN_AT", "0:3")
    with pytest.raises(SureclError, match="non-finite loss"):
        run(cfg, out, progress=False, cache_dir=tiny_cache, log_with=["tensorboard"], tasks=tasks(1))
    monkeypatch.delenv("SURECL_NAN_AT")
    first = dict(scalars(out / "tensorboard")["train/loss"])
    run(cfg, out, progress=False, cache_dir=tiny_cache, log_with=["tensorboard"], tasks=tasks(99))
    losses = {r["global_step"]: r["loss"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "loss" in r}
    got = scalars(out / "tensorboard")["train/loss"]
    assert sorted(s for s, _ in got) == sorted([*first, *losses])  # the stopped run's steps and all of this run's
    for s in first:
        values = [v for t, v in got if t == s]
        assert values[-1] == pytest.approx(losses[s], rel=1e-6, abs=1e-6)
    assert any(first[s] != pytest.approx(losses[s], rel=1e-4) for s in first)  # the data changed what was trained


@pytest.mark.parametrize("given, names", [(None, []), ("tensorboard", ["tensorboard"]), ("tensorboard, wandb", ["tensorboard", "wandb"]),
                                          (("tensorboard",), ["tensorboard"])])
def test_log_with_from_python_takes_a_name_a_list_or_none(given, names):
    from surecl.plugins.tracking import tracker_names

    assert tracker_names(given) == names


def test_log_with_of_another_type_is_one_line(tmp_path, tiny_cache):
    from surecl.errors import SureclError

    with pytest.raises(SureclError, match="log_with: expected a list of tracker names"):
        run(build_config("tiny,seq_lora", ARGS), tmp_path / "run", progress=False, cache_dir=tiny_cache, log_with=3)


def test_every_tracker_accelerate_knows_is_a_name_log_with_takes():
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    from surecl.plugins.tracking import known_trackers

    assert set(known_trackers()) == set(LOGGER_TYPE_TO_CLASS) and known_trackers()[0] == "tensorboard"


def test_a_run_stopped_right_after_its_results_has_sent_its_summary(tmp_path, tiny_cache, monkeypatch):
    """The summary goes out before results.json is written (a run stopped between them is
    unfinished, and its rerun sends it); sent after it, a stop right there lost it for good: the
    rerun finds the run finished and sends nothing."""
    from surecl.plugins.tracking import Tracking

    real = Tracking.after_run

    def stop(self, ctx, results):
        raise KeyboardInterrupt

    cfg = build_config("tiny,seq_lora", ARGS)
    out = tmp_path / "run"
    monkeypatch.setattr(Tracking, "after_run", stop)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, out, progress=False, cache_dir=tiny_cache, log_with=["tensorboard"])
    monkeypatch.setattr(Tracking, "after_run", real)
    assert (out / "results.json").exists()
    res = run(cfg, out, progress=False, cache_dir=tiny_cache, log_with=["tensorboard"])
    assert scalars(out / "tensorboard")["summary/fp"] == [(res["steps"], pytest.approx(res["fp"]))]
    assert json.loads((out / "tracking.json").read_text())["summary"] is True


def test_two_runs_in_one_process_group_with_a_tracker(tmp_path, tiny_cache):
    """Closing the trackers leaves the process group alone (accelerate's end_training destroys
    it): a program running two runs in the same two processes finishes both."""
    import os
    import sys

    from test_two_process import launch_two

    script = tmp_path / "two_runs.py"
    script.write_text(
        "import sys\nfrom pathlib import Path\nimport surecl\n"
        "cfg = surecl.build_config('tiny,seq_lora', ['data.tasks=[colors]', 'data.n_train=8', 'data.n_test=4'])\n"
        "for k in range(2):\n"
        "    res = surecl.run(cfg, Path(sys.argv[1]) / f'run{k}', progress=False, cache_dir=Path(sys.argv[2]), log_with=['tensorboard'])\n"
        "    print('run', k, 'fp', res['fp'], flush=True)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    codes, log = launch_two([sys.executable, str(script), str(tmp_path / "out"), str(tiny_cache)], env, 300)
    assert codes == [0, 0], log
    assert all((tmp_path / "out" / f"run{k}" / "results.json").exists() for k in range(2))
    assert "train/loss" in scalars(tmp_path / "out" / "run1" / "tensorboard")
