"""One process per run folder: the run lock (``checkpoint.run_lock``, an ``flock`` the kernel
releases when its process dies), a second ``surecl run`` refused in one line with the first
run's files untouched, a killed holder's folder free again at once, every rank of a
multi-process run stopping together, and several sweep workers sharing one study (each skips
the run another one holds, without building it)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from surecl.checkpoint import LOCK, lock_holder, run_lock, run_outputs
from surecl.cli import main
from surecl.errors import RunBusy

SMALL = ["data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=8", "train.epochs=1"]
HOLD = "import sys, time; from surecl.checkpoint import run_lock\nwith run_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)"


@contextlib.contextmanager
def held_elsewhere(folder):
    """Another process holding ``folder``'s run lock until the block ends (it is then killed)."""
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        yield child.pid
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def test_the_lock_is_held_for_the_run_and_released_however_it_ends(tmp_path):
    out = tmp_path / "run"
    me = f"another surecl process (host {socket.gethostname()}, pid {os.getpid()})"
    with run_lock(out):
        assert lock_holder(out) == me
        with pytest.raises(RunBusy, match=r"is running there; wait for it") as busy:
            with run_lock(out):
                pass
        assert busy.value.holder == me
        assert lock_holder(out) == me  # the refused one did not release it
    assert lock_holder(out) is None
    with pytest.raises(ValueError):
        with run_lock(out):
            raise ValueError("the run failed")
    assert lock_holder(out) is None
    with run_lock(out, enabled=False):  # another rank of a multi-process run takes nothing
        with run_lock(out):
            pass


def test_every_rank_stops_when_the_main_process_finds_the_folder_busy(tmp_path):
    told = "another surecl process (host h, pid 1)"
    with pytest.raises(RunBusy) as busy:
        with run_lock(tmp_path / "run", enabled=False, agree=lambda mine: told if mine is None else "?"):
            pytest.fail("a rank went on into a busy folder")
    assert busy.value.holder == told
    with run_lock(tmp_path / "run", agree=lambda mine: mine):  # main free: every rank goes on
        assert lock_holder(tmp_path / "run") is not None


def test_a_killed_holder_frees_the_folder_at_once(tmp_path):
    out = tmp_path / "run"
    with held_elsewhere(out) as pid:
        assert lock_holder(out) == f"another surecl process (host {socket.gethostname()}, pid {pid})"
        with pytest.raises(RunBusy, match=f"pid {pid}"):
            with run_lock(out):
                pass
    assert (out / LOCK).is_file()  # the file stays; nobody holds it
    assert lock_holder(out) is None
    with run_lock(out):
        assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()
    assert run_outputs(out) == []  # --fresh neither refuses nor removes the lock file


def test_a_second_run_in_a_busy_folder_stops_in_one_line_and_changes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    assert main(["run", "--config", "tiny,seq_lora", *SMALL, "--out", str(out), "--quiet"]) == 0
    assert lock_holder(out) is None  # released when the run ended
    (out / "results.json").unlink()  # as a run still under way looks: its log and checkpoints, no results
    before = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != LOCK}
    capsys.readouterr()
    with held_elsewhere(out):
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
    busy = root / "seq_lora" / "orderdefault" / "seed0"
    with held_elsewhere(busy) as pid:  # a worker is on it
        started = time.perf_counter()
        assert main(argv) == 0
        assert time.perf_counter() - started < 120
    err = capsys.readouterr().err
    assert f"seed0: another surecl process (host {socket.gethostname()}, pid {pid}) is running there, skipped" in err
    assert not (busy / "results.json").exists() and not (busy / "config.yaml").exists()  # not even built
    assert (root / "surprise" / "orderdefault" / "seed0" / "results.json").is_file()
    assert main(argv) == 0  # that worker is gone: the next sweep runs it
    assert (busy / "results.json").is_file()
    assert "finished, skipped" in capsys.readouterr().err
