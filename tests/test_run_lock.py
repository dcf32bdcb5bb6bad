"""One process per run folder: the run lock (``checkpoint.run_lock``), a second ``surecl run``
refused in one line with the first run's files untouched, a stale lock taken over, and
several sweep workers sharing one study (each skips the run another one holds)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from surecl.checkpoint import LOCK, run_lock, run_outputs
from surecl.cli import main
from surecl.errors import RunBusy

SMALL = ["data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=8", "train.epochs=1"]


def held_by(folder, pid, host=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK).write_text(json.dumps({"host": host or socket.gethostname(), "pid": pid}))


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_lock_is_held_for_the_run_and_released_however_it_ends(tmp_path):
    out = tmp_path / "run"
    with run_lock(out):
        holder = json.loads((out / LOCK).read_text())
        assert holder == {"host": socket.gethostname(), "pid": os.getpid()}
        with pytest.raises(RunBusy, match=rf"another surecl process \(host {socket.gethostname()}, pid {os.getpid()}\) is running there"):
            with run_lock(out):
                pass
        assert (out / LOCK).is_file()  # the refused one did not remove it
    assert not (out / LOCK).exists()
    with pytest.raises(ValueError):
        with run_lock(out):
            raise ValueError("the run failed")
    assert not (out / LOCK).exists()
    with run_lock(out, enabled=False):  # another rank of a multi-process run
        assert not (out / LOCK).exists()


def test_a_stale_lock_is_taken_over_and_a_live_or_remote_one_is_not(tmp_path):
    held_by(tmp_path / "stale", dead_pid())
    with run_lock(tmp_path / "stale"):
        assert json.loads((tmp_path / "stale" / LOCK).read_text())["pid"] == os.getpid()
    held_by(tmp_path / "live", os.getppid())
    with pytest.raises(RunBusy, match=f"pid {os.getppid()}"):
        with run_lock(tmp_path / "live"):
            pass
    held_by(tmp_path / "remote", dead_pid(), host="another-machine")  # its pid means nothing here
    with pytest.raises(RunBusy, match="host another-machine"):
        with run_lock(tmp_path / "remote"):
            pass
    assert run_outputs(tmp_path / "live") == []  # --fresh neither refuses nor removes a lock


def test_a_second_run_in_a_busy_folder_stops_in_one_line_and_changes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    assert main(["run", "--config", "tiny,seq_lora", *SMALL, "--out", str(out), "--quiet"]) == 0
    (out / "results.json").unlink()  # as a run still under way looks: its log and checkpoints, no results
    before = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    held_by(out, os.getppid())
    capsys.readouterr()
    for extra in ([], ["--fresh"]):  # not even --fresh clears a folder another process runs in
        assert main(["run", "--config", "tiny,seq_lora", *SMALL, "--out", str(out), "--quiet", *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is running there" in err[0] and "Traceback" not in err[0], err
        after = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != LOCK}
        assert after == before


def test_sweep_workers_share_a_study_each_skipping_the_run_another_holds(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "sw"
    argv = ["sweep", "--config", "tiny", "--methods", "seq_lora,surprise", "--seeds", "0", "--out", str(root), "--quiet", *SMALL]
    held_by(root / "seq_lora" / "orderdefault" / "seed0", os.getppid())  # a worker is on it
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"seed0: another surecl process (host {socket.gethostname()}, pid {os.getppid()}) is running there, skipped" in err
    assert not (root / "seq_lora" / "orderdefault" / "seed0" / "results.json").exists()
    assert (root / "surprise" / "orderdefault" / "seed0" / "results.json").is_file()
    (root / "seq_lora" / "orderdefault" / "seed0" / LOCK).unlink()  # that worker is gone
    assert main(argv) == 0
    assert (root / "seq_lora" / "orderdefault" / "seed0" / "results.json").is_file()
    assert "finished, skipped" in capsys.readouterr().err
