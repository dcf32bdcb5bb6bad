"""Failures of files a command reads or writes are one line, never a traceback: a results
file without its config given to ``surecl report``, a disk filling up during a save."""

from __future__ import annotations

import errno
import json

import pytest

from surecl.cli import main


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
