"""Failures of files a command reads or writes are one line, never a traceback: a results
file without its config given to ``surecl report``, a disk filling up during a save."""

from __future__ import annotations

import errno
import json

import pytest

from surecl.cli import main
from surecl.errors import SureclError


@pytest.mark.parametrize("layout", ["orders", "paper"])
def test_report_on_a_results_file_without_config_is_one_line(tmp_path, capsys, layout):
    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"tasks": ["x"], "accuracy_matrix": [[50.0]], "fp": 50.0}))
    assert main(["report", str(tmp_path / "runs"), "--layout", layout]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("surecl: error: ") and "results.json" in err[0] and "config" in err[0], err


@pytest.mark.parametrize("raised", ["os", "safetensors"])
def test_a_disk_filling_during_a_save_is_one_line_and_leaves_no_temporary(tmp_path, capsys, monkeypatch, raised):
    """A full disk while a checkpoint is written: as the OS's error, or as safetensors reports it
    (its own error class, naming the OS error in its text)."""
    from safetensors import SafetensorError

    import surecl.checkpoint

    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    calls = []
    real = surecl.checkpoint.save_file

    def full(tensors, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:  # the second checkpoint: the disk is full
            if raised == "safetensors":
                raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })')
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real(tensors, path, *args, **kwargs)

    monkeypatch.setattr(surecl.checkpoint, "save_file", full)
    argv = ["run", "--config", "tiny,seq_lora", "--quiet", "--out", str(out), "data.tasks=[colors,animals]",
            "data.n_train=8", "data.n_test=4", "train.epochs=1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("surecl: error: no space left on the device") and "rerun the same command" in err[-1], err
    assert "Traceback" not in "\n".join(err)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["stage-0001"]  # no temporary left, the first intact
    monkeypatch.setattr(surecl.checkpoint, "save_file", real)
    assert main(argv) == 0
    assert "resumed from" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["run", "--config"], ["--config", "expected one argument"]),
        (["run", "--config", "tiny", "--config", "seq_lora", "--dry-run"], ["--config given twice"]),
        (["sweep", "--layout", "bogus"], ["--layout", "invalid choice"]),
        (["report"], ["dirs"]),
        (["report", "RUNS", "--out-dir", "OUT"], ["--out-dir: only with --layout paper"]),
        (["report", "RUNS", "--unit", "seed", "--claim", "a>b"], ["--claim", "--unit", "only with --layout paper"]),
        (["report", "RUNS", "--csv", "TMP"], ["--csv:", "is a folder"]),
        (["run", "--dry-run", "--config", "TMP/config.yaml"], ["config.yaml", "not a regular file"]),
    ],
)
def test_command_line_mistakes_are_one_line(tmp_path, capsys, argv, words):
    """argparse's own errors too (they printed the usage first), and options the default report
    layout has no use for (they were ignored without a word)."""
    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    (tmp_path / "config.yaml").mkdir()
    argv = [a.replace("RUNS", str(tmp_path / "runs")).replace("OUT", str(tmp_path / "out")).replace("TMP", str(tmp_path)) for a in argv]
    assert code_of(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("surecl: error: ") and all(w in err[0] for w in words), err
    assert not (tmp_path / "out").exists()


def code_of(argv: list[str]) -> int:
    """The exit code of ``surecl <argv>``: what main returns, or what argparse exits with."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def test_overrides_on_both_sides_of_an_option_and_debug_after_the_command(tmp_path, capsys, tiny_cache, monkeypatch):
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    assert main(["run", "--config", "tiny,seq_lora", "data.tasks=[colors]", "--dry-run", "seed=3", "train.lr=0.5"]) == 0
    out = capsys.readouterr().out
    assert "\nseed: 3\n" in out and "lr: 0.5" in out and "- colors" in out
    with pytest.raises(SureclError):  # --debug after the command shows the error as raised
        main(["run", "--dry-run", "--config", "tiny,seq_lora", "dual.beta=2", "--debug"])
    with pytest.raises(SystemExit):
        main(["run", "--dry-run", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_a_reader_that_goes_away_is_not_an_error(monkeypatch, capsys):
    """``surecl list | head -1``: the pipe closes under the command, which stops quietly."""
    import os
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    monkeypatch.setattr(sys, "stdout", os.fdopen(write, "w", buffering=1))
    assert main(["list"]) == 0
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("text", ["{", '{"model_type": "nosuchmodel"}'])
def test_a_dry_run_on_a_broken_model_folder_is_one_line(tmp_path, capsys, text):
    """As the run itself says it (model.name: cannot load ...), not transformers' traceback."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(text)
    assert main(["run", "--dry-run", "--config", "tiny,seq_lora", f"model.name={tmp_path / 'm'}", "data.tasks=[colors]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.name: cannot load" in err[0], err
