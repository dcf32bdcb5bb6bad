"""Two processes stop together, each with one line.

A process that stops alone (a signal to it, an error only it met) leaves the other in its next
collective: that one stops with one line saying so rather than the backend's traceback
(gloo's ``Connection closed by peer`` out of the backward's all-reduce), and the rerun resumes.
The main process failing to write the final files stops the other with its line, rather than
letting it return results of a run that did not finish."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from test_two_process import TWO_PROCESS_TIMEOUT, launch_two

from surecl.errors import SureclError
from surecl.processes import PEER_STOPPED, peers_stop_in_one_line

ARGS = ["--config", "tiny,seq_lora", "--quiet", "data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=8", "train.epochs=1"]

# ``surecl`` on the command line, with ``$FAULT_ENV`` (``K=V;K=V``) set on process ``$FAULT_ON`` alone
ONE_RANK_CLI = """
import os, sys
if os.environ["RANK"] == os.environ.get("FAULT_ON"):
    os.environ.update(kv.split("=", 1) for kv in os.environ["FAULT_ENV"].split(";"))
from surecl.cli import main
sys.exit(main(sys.argv[1:]))
"""

# a Python program running one run whose main process meets a user's report.md, put in the run
# folder after the run started, when it writes the final files
USERS_REPORT = """
import os, sys
from pathlib import Path
from surecl.config import build_config
from surecl.errors import SureclError
from surecl.plugins.base import Plugin
from surecl.trainer import run


class UsersReport(Plugin):
    name = "users_report"

    def after_eval(self, ctx, stage):
        if ctx.accelerator.is_main_process and stage is ctx.stages[-1]:
            (ctx.out_dir / "report.md").write_text("mine")


cfg = build_config("tiny,seq_lora", sys.argv[2:])
try:
    run(cfg, Path(sys.argv[1]), progress=False, cache_dir=Path(os.environ["SURECL_CACHE"]), plugins=[UsersReport()])
except SureclError as exc:
    print(f"surecl: {exc}", file=sys.stderr)
    sys.exit(2)
print("run returned", file=sys.stderr)
"""


def _env(tmp_path: Path, **extra) -> dict:
    env = {**os.environ, "SURECL_CACHE": str(tmp_path / "cache"), "CUDA_VISIBLE_DEVICES": "", **extra}
    for name in ("SURECL_KILL_AT", "SURECL_KILL_SIGNAL", "SURECL_NAN_AT", "SURECL_FAULT_RANK"):
        env.pop(name, None)
    return env


def _ranks(out: str) -> tuple[str, str]:
    rank0, rank1 = out.split("--- rank 1\n")
    return rank0.removeprefix("--- rank 0\n"), rank1


@pytest.mark.slow
@pytest.mark.parametrize(("rank", "signal", "code"), [(1, "TERM", 143), (0, "KILL", -9)], ids=["other_terminated", "main_killed"])
def test_a_process_stopped_alone_stops_the_other_with_one_line_and_the_rerun_resumes(rank, signal, code, tmp_path):
    """SIGTERM to process 1 (or SIGKILL to the main process) as a step of the second task
    starts: the other process, in the step's gradient all-reduce, stops with one line (exit 2),
    no traceback; the rerun resumes from the first task's checkpoint and finishes on both."""
    cli = tmp_path / "one_rank_cli.py"
    cli.write_text(ONE_RANK_CLI)
    cmd = [sys.executable, str(cli), "run", "--out", str(tmp_path / "run"), *ARGS]
    fault = _env(tmp_path, FAULT_ON=str(rank), FAULT_ENV=f"SURECL_KILL_AT=step:1:1;SURECL_KILL_SIGNAL={signal}")
    codes, out = launch_two(cmd, fault, TWO_PROCESS_TIMEOUT)
    assert codes is not None, f"the processes did not finish in {TWO_PROCESS_TIMEOUT} s:\n{out}"
    survivor = 1 - rank
    assert codes[rank] == code and codes[survivor] == 2, out
    said = _ranks(out)[survivor]
    assert "Traceback" not in said, out
    assert said.strip().splitlines()[-1] == f"surecl: error: {PEER_STOPPED}", out
    assert not (tmp_path / "run" / "results.json").exists()
    codes, out = launch_two(cmd, _env(tmp_path), TWO_PROCESS_TIMEOUT)
    assert codes == [0, 0], out
    assert f"resumed from {tmp_path / 'run' / 'checkpoints' / 'stage-0001'} " in _ranks(out)[0], out
    assert (tmp_path / "run" / "results.json").is_file()


@pytest.mark.slow
def test_the_main_process_failing_to_write_the_final_files_stops_both_with_its_line(tmp_path):
    """A user's report.md where the run writes, put there after the run started: the main
    process refuses to overwrite it as it writes the final files, and the other process stops
    with the same line instead of returning the results of a run that did not finish."""
    script = tmp_path / "users_report.py"
    script.write_text(USERS_REPORT)
    out_dir = tmp_path / "run"
    codes, out = launch_two([sys.executable, str(script), str(out_dir), *ARGS[3:]], _env(tmp_path), TWO_PROCESS_TIMEOUT)
    assert codes == [2, 2], out
    line = f"surecl: {out_dir / 'report.md'} was not written by surecl and this run would overwrite it"
    for said in _ranks(out):
        assert line in said and "run returned" not in said and "Traceback" not in said, out
    assert (out_dir / "report.md").read_text() == "mine" and not (out_dir / "results.json").exists()


GLOO_GONE = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:11678. "
             "This is typically caused by a remote worker crashing.")


@pytest.mark.parametrize("world", [1, 2])
def test_only_the_backends_error_for_a_gone_process_in_a_group_becomes_the_line(world, monkeypatch):
    """The backend's peer-gone error in a group of several processes is the line; the same error
    without such a group, and any other error, pass unchanged."""
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: world)
    for error in (RuntimeError(GLOO_GONE), dist.DistNetworkError("failed to recv, got 0 bytes")):
        if world > 1:
            with pytest.raises(SureclError, match="^another process of the run stopped") as caught:
                with peers_stop_in_one_line():
                    raise error
            assert caught.value.__cause__ is error
        else:
            with pytest.raises(type(error)) as caught:
                with peers_stop_in_one_line():
                    raise error
            assert caught.value is error
    for other in (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), RuntimeError("gloo: invalid tensor size"),
                  ValueError("Connection closed by peer")):
        with pytest.raises(type(other)) as caught:
            with peers_stop_in_one_line():
                raise other
        assert caught.value is other and not isinstance(caught.value, SureclError)
