"""What a run folder holds and who owns it: the manifest of every path a run wrote, ``--fresh``
removing exactly those, links and users' files where a run writes refused in one line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from surecl.checkpoint import MANIFEST
from surecl.cli import main

TINY = ["--config", "tiny,slow_surprise", "--quiet"]
SMALL = ["data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=8", "train.epochs=1"]


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SURECL_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def finished(tmp_path_factory, cache) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(["run", *TINY, "--out", str(out), *SMALL]) == 0
    return out


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("surecl: error: "), err
    return err[0]


def test_manifest_lists_every_path_the_run_wrote(finished):
    listed = json.loads((finished / MANIFEST).read_text())
    on_disk = {str(p.relative_to(finished)) for p in finished.iterdir()} | {
        f"{d}/{p.name}" for d in ("checkpoints", "adapters") for p in (finished / d).iterdir()}
    mine = {p for p in on_disk if p not in (MANIFEST, ".surecl-lock", "checkpoints", "adapters")}
    assert set(listed["paths"]) == mine
    assert set(listed["dirs"]) == {"checkpoints", "adapters"}


def test_fresh_removes_exactly_the_manifest(finished, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "adapters" / "fast-run1").mkdir()
    (out / "adapters" / "fast-run1" / "adapter_model.safetensors").write_bytes(b"kept")
    (out / "checkpoints" / "stage-notes.txt").write_text("mine")
    (out / "model").mkdir()
    (out / "model" / "config.json").write_text("{}")
    # a temporary an atomic write left when killed goes too
    (out / "checkpoints" / ".stage-0002.surecl-abcd1234").mkdir()
    assert main(["run", *TINY, "--out", str(out), *SMALL, "train.epochs=2", "--fresh"]) == 0
    assert (out / "adapters" / "fast-run1" / "adapter_model.safetensors").read_bytes() == b"kept"
    assert (out / "checkpoints" / "stage-notes.txt").read_text() == "mine"
    assert (out / "model" / "config.json").read_text() == "{}"
    assert not (out / "checkpoints" / ".stage-0002.surecl-abcd1234").exists()
    assert json.loads((out / "results.json").read_text())["config"]["train"]["epochs"] == 2


def test_fresh_never_follows_a_link_out_of_the_folder(finished, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(out / "checkpoints", elsewhere)  # checkpoints/ now a link to a folder outside
    os.symlink(elsewhere, out / "checkpoints")
    before, outside = digest(out), digest(elsewhere)
    assert main(["run", *TINY, "--out", str(out), *SMALL, "--fresh"]) == 2
    line = one_error_line(capsys)
    assert "symbolic link" in line and "checkpoints" in line
    assert digest(out) == before and digest(elsewhere) == outside


@pytest.mark.parametrize("fresh", [False, True])
def test_a_symlinked_log_leaves_its_target_untouched(tmp_path, cache, capsys, fresh):
    out = tmp_path / "run"
    out.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("do not truncate me\n")
    os.symlink(target, out / "log.jsonl")
    assert main(["run", *TINY, "--out", str(out), *SMALL, *(["--fresh"] if fresh else [])]) == 2
    assert "log.jsonl is a symbolic link" in one_error_line(capsys)
    assert target.read_text() == "do not truncate me\n"
    assert sorted(p.name for p in out.iterdir()) == ["log.jsonl"]


def test_a_users_file_where_the_run_writes_is_refused(tmp_path, cache, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "report.md").write_text("my notes")
    assert main(["run", *TINY, "--out", str(out), *SMALL]) == 2  # a run would overwrite it at its end
    line = one_error_line(capsys)
    assert "report.md was not written by surecl" in line
    assert (out / "report.md").read_text() == "my notes" and sorted(p.name for p in out.iterdir()) == ["report.md"]


def test_a_users_model_folder_stops_a_full_fine_tuning_run_before_training(tmp_path, cache, capsys):
    out = tmp_path / "run"
    (out / "model").mkdir(parents=True)
    (out / "model" / "config.json").write_text("{}")
    assert main(["run", "--config", "tiny,seq_ft", "--quiet", "--out", str(out), *SMALL]) == 2
    line = one_error_line(capsys)
    assert "model was not written by surecl" in line
    assert (out / "model" / "config.json").read_text() == "{}"
    assert not (out / "checkpoints").exists() and not (out / "log.jsonl").exists()


# --------------------------------------------------------------------------- finishing is a transaction


def final_outputs(out: Path) -> dict:
    """What must come out the same however the run was interrupted: the results (less the
    clock), the buffer, every exported tensor and card."""
    res = json.loads((out / "results.json").read_text())
    for key in ("timing", "host", "hosts"):
        res.pop(key, None)
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted((out / "adapters").rglob("*")) if p.is_file()}
    for name in [k for k in files if k.endswith("adapter_config.json")]:  # PEFT writes target_modules in set order
        config = json.loads(files[name])
        files[name] = {**config, "target_modules": sorted(config["target_modules"])}
    return {"results": res, "buffer": (out / "buffer.json").read_text(), "adapters": files,
            "predictions": (out / "predictions.jsonl").read_text(),
            "report": (out / "report.md").is_file(), "heatmap": (out / "heatmap.png").is_file()}


def test_an_interrupted_finish_is_completed_by_the_rerun(finished, tmp_path, capsys, monkeypatch):
    import surecl.report

    out = tmp_path / "run"
    real = surecl.report.write_run_report

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C after the buffer and the adapters, before the report and results.json

    monkeypatch.setattr(surecl.report, "write_run_report", interrupted)
    assert main(["run", *TINY, "--out", str(out), *SMALL]) == 130
    assert not (out / "results.json").exists() and (out / "adapters" / "slow").is_dir()
    assert "rerun the same command to resume" in capsys.readouterr().err
    monkeypatch.setattr(surecl.report, "write_run_report", real)
    (out / "checkpoints" / ".stage-0002.surecl-k1ll3d00").mkdir()  # and a temporary a kill left
    assert main(["run", *TINY, "--out", str(out), *SMALL]) == 0
    assert "already finished" not in capsys.readouterr().err
    assert final_outputs(out) == final_outputs(finished)
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]


def test_a_finished_run_missing_an_output_writes_it_again(finished, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    shutil.rmtree(out / "adapters")
    assert main(["run", *TINY, "--out", str(out), *SMALL]) == 0
    err = capsys.readouterr().err
    assert "adapters/fast, adapters/slow missing" in err and "nothing to do" not in err
    assert final_outputs(out) == final_outputs(finished)
    assert main(["run", *TINY, "--out", str(out), *SMALL]) == 0
    assert "already finished" in capsys.readouterr().err


def test_completing_a_finished_run_keeps_the_users_files_in_its_adapter_folders(finished, tmp_path, capsys):
    """A missing heatmap.png has the rerun export every output again: a note the user kept in
    adapters/slow (and a folder of their own there) went with the folder it replaced."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "heatmap.png").unlink()
    (out / "adapters" / "slow" / "NOTES.md").write_text("mine\n")
    (out / "adapters" / "fast" / "evals").mkdir()
    (out / "adapters" / "fast" / "evals" / "mmlu.json").write_text("{}\n")
    assert main(["run", *TINY, "--out", str(out), *SMALL]) == 0
    assert "heatmap.png missing" in capsys.readouterr().err
    assert (out / "adapters" / "slow" / "NOTES.md").read_text() == "mine\n"
    assert (out / "adapters" / "fast" / "evals" / "mmlu.json").read_text() == "{}\n"
    mine = {"adapters/slow/NOTES.md", "adapters/fast/evals/mmlu.json"}
    outputs = final_outputs(out)
    outputs["adapters"] = {k: v for k, v in outputs["adapters"].items() if k not in mine}
    assert outputs == final_outputs(finished)


def test_a_finished_run_missing_an_output_and_its_checkpoints_says_so(finished, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    shutil.rmtree(out / "adapters" / "slow")
    shutil.rmtree(out / "checkpoints")
    before = digest(out)
    assert main(["run", *TINY, "--out", str(out), *SMALL]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("surecl: error: ") and "adapters/slow is missing" in err[-1] and "--fresh" in err[-1], err
    assert digest(out) == before


@pytest.mark.slow
def test_sigterm_is_a_clean_resumable_stop(finished, tmp_path, cache):
    """SIGTERM (a scheduler's preemption) while a checkpoint is written: one line, exit 143, no
    temporary folder left; the rerun resumes and ends as an uninterrupted run."""
    import subprocess
    import sys

    out = tmp_path / "run"
    env = {**os.environ, "SURECL_CACHE": str(cache), "SURECL_KILL_AT": "checkpoint:stage-0002", "SURECL_KILL_SIGNAL": "TERM"}
    cmd = [sys.executable, "-m", "surecl.cli", "run", *TINY, "--out", str(out), *SMALL]
    stopped = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert stopped.returncode == 143, stopped.stderr[-800:]
    lines = stopped.stderr.strip().splitlines()
    assert lines[-1] == "surecl: terminated (SIGTERM); rerun the same command to resume" and "Traceback" not in stopped.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["stage-0001"]
    env.pop("SURECL_KILL_AT")
    resumed = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-800:]
    assert "resumed from" in resumed.stderr
    assert final_outputs(out) == final_outputs(finished)


# --------------------------------------------------------------------------- never another's files


def test_a_refused_run_leaves_the_users_files_the_users(tmp_path, cache):
    """A run refused for a user's file in its folder (through the Python API, whose refusal comes
    after the lock is taken) leaves the folder as it found it, no lock file or manifest, so the
    rerun refuses again and ``--fresh`` removes nothing of the user's: the folder never reads as
    an earlier version's."""
    from surecl.config import build_config
    from surecl.errors import SureclError
    from surecl.trainer import run

    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("mine: true\n")
    cfg = build_config("tiny,slow_surprise", SMALL)
    for _ in range(2):
        with pytest.raises(SureclError, match="config.yaml was not written by surecl"):
            run(cfg, out, progress=False, cache_dir=cache)
    assert not (out / MANIFEST).exists() and not (out / ".surecl-lock").exists()  # the folder as it was found
    assert main(["run", *TINY, "--out", str(out), "--fresh", *SMALL]) == 2
    assert (out / "config.yaml").read_text() == "mine: true\n"


def test_checkpoint_folders_of_other_names_are_neither_resumed_nor_pruned(tmp_path):
    """Only ``stage-NNNN[-step-NNNNNN]`` folders are checkpoints: a user's ``stage-0000-baseline``
    survives pruning and a backup ``stage-0002.bak`` (newest by name) is not resumed from."""
    import torch

    from surecl.checkpoint import load_latest, save

    root = tmp_path / "checkpoints"
    (root / "stage-0000-baseline").mkdir(parents=True)
    (root / "stage-0000-baseline" / "notes.txt").write_text("mine")
    meta = {"config": {}, "tasks": ["a"]}
    for k in range(3):
        save(root, f"stage-{k:04d}", {"run": ({"k": k}, {"w": torch.full((2,), float(k))})}, meta, keep=2)
        if k == 1:
            shutil.copytree(root / "stage-0001", root / "stage-0002.bak")
    assert sorted(p.name for p in root.iterdir()) == ["stage-0000-baseline", "stage-0001", "stage-0002", "stage-0002.bak"]
    assert (root / "stage-0000-baseline" / "notes.txt").read_text() == "mine"
    assert load_latest(root).folder.name == "stage-0002"
    shutil.rmtree(root / "stage-0002")
    assert load_latest(root).folder.name == "stage-0001"


def test_checkpoint_named_folders_the_run_did_not_write_are_neither_pruned_nor_resumed(tmp_path, cache):
    """A user's own ``checkpoints/stage-0000`` and ``stage-0009`` (checkpoint names, not the run's:
    its manifest does not list them) survive a run's pruning, and a copy of a real checkpoint
    put there by hand is not resumed from."""
    out = tmp_path / "run"
    for name in ("stage-0000", "stage-0009"):
        (out / "checkpoints" / name).mkdir(parents=True)
        (out / "checkpoints" / name / "notes.txt").write_text("mine")
    assert main(["run", *TINY, "--out", str(out), *SMALL]) == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["stage-0000", "stage-0001", "stage-0002", "stage-0009"]
    assert all((out / "checkpoints" / n / "notes.txt").read_text() == "mine" for n in ("stage-0000", "stage-0009"))
    from surecl.checkpoint import Manifest, load_latest

    manifest = Manifest(out)
    shutil.rmtree(out / "checkpoints" / "stage-0009")
    shutil.copytree(out / "checkpoints" / "stage-0002", out / "checkpoints" / "stage-0009")  # by hand: not the run's
    assert load_latest(out / "checkpoints", owned=lambda n: manifest.owns(f"checkpoints/{n}")).folder.name == "stage-0002"


def test_a_run_that_starts_over_never_prunes_its_own_checkpoints(tmp_path):
    """Checkpoints are written in name order, so one named after the one just written belongs to
    another trajectory: an earlier run's that this one started over from (``resume=False``), or
    a damaged one a resume passed over. It goes, instead of the keep rule pruning every new
    checkpoint at once and the next resume reading the old run's state."""
    import torch

    from surecl.checkpoint import load_latest, save

    root = tmp_path / "checkpoints"
    meta = {"config": {}, "tasks": ["a"]}

    def put(name: str, who: str) -> None:
        save(root, name, {"run": ({"who": who}, {"w": torch.zeros(2)})}, meta, keep=2)

    for name in ("stage-0001", "stage-0002", "stage-0003"):
        put(name, "old")
    for name in ("stage-0000", "stage-0001-step-000050"):
        put(name, "new")
        assert (root / name).is_dir()
    assert sorted(p.name for p in root.iterdir()) == ["stage-0000", "stage-0001-step-000050"]
    assert load_latest(root).components["run"][0] == {"who": "new"}
    # a damaged newest checkpoint that a resume passed over (keep=1)
    (root / "stage-0001-step-000050" / "meta.json").write_text("{")
    assert load_latest(root).folder.name == "stage-0000"
    save(root, "stage-0001", {"run": ({"who": "resumed"}, {"w": torch.zeros(2)})}, meta, keep=1)
    assert sorted(p.name for p in root.iterdir()) == ["stage-0001"]
    assert load_latest(root).components["run"][0] == {"who": "resumed"}


def test_only_an_atomic_writes_leftovers_are_temporaries(finished, tmp_path):
    """A killed write leaves ``.<name>.surecl-<8 random characters>``; a user's
    ``.config.yaml.swp``, ``.log.jsonl.bak`` or hidden backups whose tail is 8 characters
    (``.config.yaml.original``, ``.results.json.20240101``) beside a run's file are not one and stay."""
    from surecl.checkpoint import Manifest

    out = tmp_path / "run"
    shutil.copytree(finished, out)
    mine = (".config.yaml.swp", ".log.jsonl.bak", ".config.yaml.original", ".results.json.20240101", ".results.json.previous")
    for name in (*mine, ".results.json.surecl-k2x9_q0a", ".adapters.surecl-old"):
        (out / name).write_text("x")
    removed = Manifest(out).remove_temporaries()
    assert [p.name for p in removed] == [".results.json.surecl-k2x9_q0a"]
    assert all((out / name).exists() for name in mine)


def test_the_lock_file_is_never_written_through_a_link(tmp_path):
    from surecl.checkpoint import LOCK, run_lock
    from surecl.errors import SureclError

    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK).symlink_to(precious)
    with pytest.raises(SureclError, match="is a symbolic link"):
        with run_lock(out, True):
            pass
    assert precious.read_text() == "keep me"


# --------------------------------------------------------------------------- the clock


@pytest.fixture
def ctrl_c():
    """SIGINT raises KeyboardInterrupt here, as in a terminal: a suite started in the background
    (``cmd &`` in a script) inherits SIGINT ignored, and Python then leaves it ignored, so the
    fault point's SIGINT would stop nothing."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_cpu_time_is_counted_across_a_resume_and_left_out_after_a_checkpoint_without_it(finished, tmp_path, monkeypatch, ctrl_c):
    """results.json ``timing.cpu``: the process CPU seconds of every part of the run (a resumed
    run adds its own to what the checkpoint kept); a run resumed from a checkpoint written before
    CPU time was counted leaves the key out rather than report only its own part."""
    done = json.loads((finished / "results.json").read_text())["timing"]
    assert done["cpu"] > 0 and done["cpu"] >= done["train"] * 0.5, done  # one thread at least half busy while training
    for name, strip in (("kept", False), ("old", True)):
        out = tmp_path / name
        monkeypatch.setenv("SURECL_KILL_AT", "stage_end:1")
        monkeypatch.setenv("SURECL_KILL_SIGNAL", "INT")
        assert main(["run", *TINY, "--out", str(out), *SMALL]) == 130
        meta_path = out / "checkpoints" / "stage-0001" / "meta.json"
        meta = json.loads(meta_path.read_text())
        kept = meta["components"]["run"]["seconds"]
        assert kept["cpu"] > 0
        if strip:
            del kept["cpu"]
            meta_path.write_text(json.dumps(meta))
        monkeypatch.delenv("SURECL_KILL_AT", raising=False)  # a signal fault clears it itself
        assert main(["run", *TINY, "--out", str(out), *SMALL]) == 0
        timing = json.loads((out / "results.json").read_text())["timing"]
        if strip:
            assert "cpu" not in timing and timing["total"] > 0, timing
        else:
            assert timing["cpu"] > kept["cpu"], (timing, kept)


def test_a_dangling_link_on_the_way_to_out_is_one_line(tmp_path, capsys):
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert main(["run", *TINY, "--out", str(tmp_path / "dangling" / "x"), *SMALL]) != 0
    assert "is a symbolic link to" in one_error_line(capsys) and not (tmp_path / "nowhere").exists()


def test_the_default_out_folder_stays_under_runs(tmp_path):
    """Without --out a run goes to runs/<preset>-<benchmark>-o<order>-s<seed>: a preset given as a
    YAML path is named by its file's stem, and no part of the name leaves runs/."""
    from surecl.cli import _out_dir
    from surecl.config import build_config

    cfg = build_config("tiny,seq_lora", [])
    cfg.preset = str(tmp_path / "mine.yaml")
    assert _out_dir(None, cfg) == Path("runs") / f"mine-{Path(cfg.data.benchmark).name or 'bench'}-o{cfg.data.order}-s0"
    cfg.preset = "../../etc/x"
    out = _out_dir(None, cfg)
    assert out.parent == Path("runs") and "/" not in out.name and not out.name.startswith(".")


def test_checkpoint_every_changes_no_number_and_a_resume_may_change_it(finished, tmp_path, capsys, monkeypatch, ctrl_c):
    """train.checkpoint_every is result-neutral: a run checkpointing every step ends as one that
    checkpoints only between tasks, and a run interrupted under one value resumes under another."""
    out = tmp_path / "run"
    monkeypatch.setenv("SURECL_KILL_AT", "stage_end:1")
    monkeypatch.setenv("SURECL_KILL_SIGNAL", "INT")
    assert main(["run", *TINY, "--out", str(out), *SMALL, "train.checkpoint_every=1"]) == 130
    monkeypatch.delenv("SURECL_KILL_AT", raising=False)
    assert main(["run", *TINY, "--out", str(out), *SMALL, "train.checkpoint_every=0"]) == 0
    assert "resumed from" in capsys.readouterr().err
    got, want = final_outputs(out), final_outputs(finished)
    for f in (got, want):  # the config records the value given; every number is the same
        f["results"]["config"]["train"].pop("checkpoint_every")
    assert got == want


def test_starting_over_without_fresh_beside_an_earlier_run_is_refused(finished, tmp_path, cache):
    """``run(..., resume=False)`` into a finished run's folder: it used to truncate the log and
    replace checkpoints while the old results.json still marked the folder finished. Refused
    before anything changes; ``fresh=True`` starts over."""
    from surecl.config import build_config
    from surecl.errors import SureclError
    from surecl.trainer import run

    out = tmp_path / "copy"
    shutil.copytree(finished, out)
    before = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".surecl-lock"}
    cfg = build_config(TINY[1], SMALL)
    with pytest.raises(SureclError, match="holds an earlier run's outputs .*fresh=True"):
        run(cfg, out, resume=False, progress=False, cache_dir=cache)
    after = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".surecl-lock"}
    assert after == before
    res = run(cfg, out, resume=False, fresh=True, progress=False, cache_dir=cache)
    assert res["accuracy_matrix"] == json.loads((finished / "results.json").read_text())["accuracy_matrix"]


@pytest.mark.parametrize("provenance", [[1], {"data": [1]}, "x"])
def test_a_finished_run_whose_provenance_is_not_surecls_shape_is_still_finished(finished, tmp_path, capsys, provenance):
    out = tmp_path / "copy"
    shutil.copytree(finished, out)
    res = json.loads((out / "results.json").read_text())
    res["provenance"] = provenance
    (out / "results.json").write_text(json.dumps(res))
    assert main(["run", *TINY, "--out", str(out), *SMALL]) == 0
    assert "already finished" in capsys.readouterr().err


def test_a_resume_on_another_base_model_is_refused(finished, tmp_path, cache, capsys):
    """The same config over a model folder whose weights changed (same shapes): resuming would
    put adapters trained on one base onto another without a word. One line; restored, it
    resumes and ends as the run did."""
    from safetensors.torch import load_file, save_file

    from surecl.model import tiny_folder

    model = tmp_path / "model"
    shutil.copytree(tiny_folder(cache), model)
    args = [*TINY, *SMALL, f"model.name={model}"]
    out = tmp_path / "run"
    assert main(["run", *args, "--out", str(out)]) == 0
    done = json.loads((out / "results.json").read_text())
    (out / "results.json").unlink()  # a finished run that must write it again from its last checkpoint
    weights = next(model.glob("*.safetensors"))
    original = weights.read_bytes()
    save_file({k: v + 0.01 if v.is_floating_point() else v for k, v in load_file(str(weights)).items()}, str(weights))
    capsys.readouterr()
    assert main(["run", *args, "--out", str(out)]) == 2
    assert "the base model" in one_error_line(capsys) and not (out / "results.json").exists()
    weights.write_bytes(original)
    assert main(["run", *args, "--out", str(out)]) == 0
    assert json.loads((out / "results.json").read_text())["accuracy_matrix"] == done["accuracy_matrix"]


@pytest.mark.parametrize("name", ["stage-0002", "stage-0001-step-000002"])
def test_a_users_folder_named_as_a_checkpoint_the_run_will_write_stops_it_before_training(tmp_path, capsys, name):
    """Refused at the start, before any training (it was refused only when that checkpoint came,
    after the training before it, and again on every rerun); the folder is left as it was."""
    out = tmp_path / "run"
    (out / "checkpoints" / name).mkdir(parents=True)
    (out / "checkpoints" / name / "notes.txt").write_text("mine")
    assert main(["run", *TINY, "--out", str(out), *SMALL, "data.n_train=32", "train.checkpoint_every=2"]) == 2
    assert f"checkpoints/{name} was not written by surecl" in one_error_line(capsys)
    assert not (out / "log.jsonl").exists() and sorted(p.name for p in (out / "checkpoints").iterdir()) == [name]
    assert (out / "checkpoints" / name / "notes.txt").read_text() == "mine"


# --------------------------------------------------------------------------- exported folders


def test_fresh_keeps_a_users_files_in_the_exported_folders(finished, tmp_path, capsys):
    """The manifest records the entries each export wrote in its folder; --fresh removes those
    and keeps a user's file kept there (a re-export keeps it too), the folder with it."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    contents = json.loads((out / MANIFEST).read_text())["contents"]
    assert set(contents) == {"adapters/fast", "adapters/slow"}
    assert set(contents["adapters/slow"]) == {p.name for p in (finished / "adapters" / "slow").iterdir()}
    (out / "adapters" / "slow" / "my_eval.txt").write_text("mine\n")
    capsys.readouterr()
    assert main(["run", *TINY, "--out", str(out), *SMALL, "train.epochs=2", "--fresh"]) == 0
    said = next(x for x in capsys.readouterr().err.splitlines() if "--fresh: removed" in x)
    assert "adapters/fast," in said and "adapters/slow" not in said  # kept: it holds the user's file
    assert (out / "adapters" / "slow" / "my_eval.txt").read_text() == "mine\n"
    assert json.loads((out / "results.json").read_text())["config"]["train"]["epochs"] == 2
    from surecl.checkpoint import Manifest

    Manifest(out).clear()
    assert [p.name for p in (out / "adapters" / "slow").iterdir()] == ["my_eval.txt"]
    assert not (out / "adapters" / "fast").exists()


def test_a_failed_swap_puts_the_earlier_export_back(tmp_path, monkeypatch):
    """The export's second rename fails (a full disk, Ctrl-C): the earlier folder, a user's
    file in it included, is back in its place and no temporary is left."""
    import surecl.checkpoint as checkpoint

    class Adapters:
        def __init__(self, text):
            self.text = text

        def save_pretrained(self, folder, name):
            (Path(folder) / name).mkdir(parents=True)
            (Path(folder) / name / "adapter_model.safetensors").write_text(self.text)

    root = tmp_path / "adapters"
    checkpoint.save_adapter(Adapters("first"), root, "fast")
    (root / "fast" / "NOTES.txt").write_text("mine")
    real = os.replace
    for error in (OSError(28, "No space left on device"), KeyboardInterrupt()):
        def failing(src, dst, error=error):
            if Path(dst) == root / "fast" and ".fast.surecl-" in str(src) and not str(src).endswith("old"):
                raise error
            return real(src, dst)

        monkeypatch.setattr(checkpoint.os, "replace", failing)
        with pytest.raises(type(error)):
            checkpoint.save_adapter(Adapters("second"), root, "fast")
        assert (root / "fast" / "adapter_model.safetensors").read_text() == "first"
        assert (root / "fast" / "NOTES.txt").read_text() == "mine"
        assert sorted(p.name for p in root.iterdir()) == ["fast"]
    monkeypatch.setattr(checkpoint.os, "replace", real)
    checkpoint.save_adapter(Adapters("second"), root, "fast")
    assert (root / "fast" / "adapter_model.safetensors").read_text() == "second"
    assert (root / "fast" / "NOTES.txt").read_text() == "mine"


@pytest.mark.slow
def test_a_kill_between_an_exports_two_renames_is_put_back_by_the_rerun(finished, tmp_path, cache):
    """SIGKILL with the earlier adapters/fast moved aside and the new one not yet in place:
    the rerun puts the earlier folder back (a user's file in it too) and completes the run."""
    import subprocess
    import sys

    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "heatmap.png").unlink()  # the rerun completes the finish: every output exported again
    (out / "adapters" / "fast" / "NOTES.txt").write_text("mine\n")
    env = {**os.environ, "SURECL_CACHE": str(cache), "SURECL_KILL_AT": "export:swap"}
    cmd = [sys.executable, "-m", "surecl.cli", "run", *TINY, "--out", str(out), *SMALL]
    killed = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-800:]
    assert not (out / "adapters" / "fast").exists() and (out / "adapters" / ".fast.surecl-old" / "NOTES.txt").is_file()
    env.pop("SURECL_KILL_AT")
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-800:]
    assert (out / "adapters" / "fast" / "NOTES.txt").read_text() == "mine\n"
    assert not [p for p in (out / "adapters").iterdir() if p.name.startswith(".")]
    outputs = final_outputs(out)
    outputs["adapters"].pop("adapters/fast/NOTES.txt")
    assert outputs == final_outputs(finished)


def test_the_default_out_folder_is_named_by_the_overrides_too(tmp_path):
    """Two runs of one preset with other overrides get two default folders (the second used to
    land in the first's folder and stop), the same overrides give the same folder (a rerun
    resumes), and the keys the name holds already add nothing; a long tail is cut and hashed."""
    from surecl.cli import _out_dir
    from surecl.config import build_config

    cfg = build_config("tiny,seq_lora", [])
    plain = _out_dir(None, cfg, [])
    beta = _out_dir(None, cfg, ["dual.beta=0.995"])
    assert beta != plain and beta.name == f"{plain.name}-dual.beta=0.995"
    assert _out_dir(None, cfg, ["dual.beta=0.995"]) == beta
    assert _out_dir(None, cfg, ["seed=0", "data.order=1", "data.benchmark=x/y"]) == plain
    assert _out_dir(None, cfg, ["data.jsonl=[my/a.jsonl]"]).name == f"{plain.name}-data.jsonl=_my_a.jsonl_"
    long_a = _out_dir(None, cfg, ["train.lr=0.001", "lora.target_modules=[q_proj,k_proj,v_proj,o_proj,up_proj]", "x.y=1"])
    long_b = _out_dir(None, cfg, ["train.lr=0.001", "lora.target_modules=[q_proj,k_proj,v_proj,o_proj,up_proj]", "x.y=2"])
    assert long_a != long_b and long_a.parent == Path("runs") and len(long_a.name) < len(plain.name) + 80
    assert _out_dir(str(tmp_path / "mine"), cfg, ["dual.beta=0.995"]) == tmp_path / "mine"
    # the overrides by key: their order, a key given twice, and the result-neutral options name nothing
    both = _out_dir(None, cfg, ["train.lr=0.001", "dual.beta=0.995"])
    assert _out_dir(None, cfg, ["dual.beta=0.995", "train.lr=0.001"]) == both
    assert _out_dir(None, cfg, ["dual.beta=0.9", "train.lr=0.001", "dual.beta=0.995"]) == both
    assert _out_dir(None, cfg, ["dual.beta=0.995", "train.checkpoint_every=5", "log_every=3", "train.keep_checkpoints=1"]) == beta


def test_a_run_started_in_the_plain_default_folder_goes_on_there(tmp_path, monkeypatch, capsys):
    """Before overrides named the default folder, ``surecl run dual.beta=0.995`` wrote
    runs/<preset>-...-s0; the same command now finds that run there (its config.yaml) and says
    so, where a plain folder holding another run is left alone."""
    from surecl.cli import _out_dir
    from surecl.config import build_config

    monkeypatch.chdir(tmp_path)
    cfg = build_config("tiny,seq_lora", ["dual.beta=0.995"])
    plain = _out_dir(None, cfg, [])
    named = _out_dir(None, cfg, ["dual.beta=0.995"])
    plain.mkdir(parents=True)
    (plain / "config.yaml").write_text(build_config("tiny,seq_lora", ["train.lr=0.5"]).to_yaml())
    assert _out_dir(None, cfg, ["dual.beta=0.995"]) == named  # another run's folder: not taken
    (plain / "config.yaml").write_text(cfg.to_yaml())
    capsys.readouterr()
    assert _out_dir(None, cfg, ["dual.beta=0.995"]) == plain
    assert "holds this run" in capsys.readouterr().err
    named.mkdir(parents=True)  # once the named folder exists, it is the run's
    assert _out_dir(None, cfg, ["dual.beta=0.995"]) == named
