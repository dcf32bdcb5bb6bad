"""Two CPU processes (gloo) give the run of one process.

The test starts both ranks itself, with the environment torch's elastic launcher gives its
workers (what ``accelerate launch --multi_gpu --num_processes 2`` runs; on a machine without
GPUs they train on the CPU), so it can kill both if they hang. ``accelerate launch
--num_processes 2 --cpu`` would start a single process: its simple launcher ignores the
count. A spy in each process records what it handed to the training forward, the scorer and
generation, so the test sees that each process did its half.

Each rank trains on every second item of the mixed batch with the loss scaled so DDP's
gradient average equals the one-process gradient; surprise scoring and evaluation are sharded
and gathered, so every rank takes the same buffer decisions. What may differ is float
summation order (the gradient all-reduce, batch composition in scoring), which grows along the
trajectory: losses and scores are compared to a relative 1e-3 (measured: 1e-4 and 7e-6 at
most), buffer membership and the accuracy matrix exactly.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TWO_PROCESS_TIMEOUT = 300  # seconds; the two processes finish in about 10 s on 2 cores (a loaded CI machine is slower)
ARGS = ["--config", "tiny,slow_surprise", "--quiet", "data.tasks=[colors,animals]", "data.n_train=48", "data.n_test=16", "train.epochs=4"]


def outcome(out: Path):
    res = json.loads((out / "results.json").read_text())
    buf = json.loads((out / "buffer.json").read_text())["entries"]
    losses = [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]
    return res["accuracy_matrix"], [(e["task"], e["index"]) for e in buf], [e["score"] for e in buf], losses


# ``surecl run`` with spies on what each process hands to the training forward, the surprise
# scorer and generation; each process writes its record to $SPY_DIR/rank<process index>.json at exit.
SPIED_CLI = """
import atexit, json, os, sys
import surecl.run_eval as run_eval
import surecl.step as step
import surecl.trainer as trainer
from surecl.cli import main

record = {"train": [], "score": [], "eval": []}


def spy(name, key, size, module=trainer):
    original = getattr(module, name)

    def wrapped(*args, **kwargs):
        record[key].append(size(args))
        return original(*args, **kwargs)

    setattr(module, name, wrapped)


spy("micro_batch_positions", "train", lambda a: len(a[0]), step)  # the rows this process trains on, per step (the training step's)
spy("score_examples", "score", lambda a: len(a[1]))
spy("generate_answers", "eval", lambda a: len(a[2]), run_eval)  # evaluation's generation (surecl.run_eval)


def dump():  # registered before the run starts, so it runs after surecl's exit handlers
    import torch.distributed as dist
    from accelerate import PartialState

    record["group_up_at_exit"] = dist.is_initialized()
    with open(os.path.join(os.environ["SPY_DIR"], f"rank{PartialState().process_index}.json"), "w") as f:
        json.dump(record, f)


atexit.register(dump)
sys.exit(main(sys.argv[1:]))
"""


LOOPBACK = "lo0" if sys.platform == "darwin" else "lo"
"""The loopback interface's name, for gloo (``GLOO_SOCKET_IFNAME``)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_two(cmd: list[str], env: dict, timeout: float) -> tuple[list[int] | None, str]:
    """Start ``cmd`` as ranks 0 and 1 of a two-process group (the environment torch's elastic
    launcher gives its workers); their exit codes and output, or None for the codes when they
    did not both finish within ``timeout`` seconds (both are then killed). Gloo talks over the
    loopback interface (no host-name lookup); a port taken by another process between
    :func:`free_port` and rank 0's bind is retried once on a new port."""
    codes, out = _launch_two(cmd, env, timeout)
    if codes != [0, 0] and "Address already in use" in out:
        codes, out = _launch_two(cmd, env, timeout)
    return codes, out


def run_script_as_two(text: str, tmp_path, tiny_cache, timeout: float) -> tuple[list[int] | None, str]:
    """``text`` written to ``tmp_path/two.py`` and run as two processes (:func:`launch_two`) with
    this checkout's ``src`` first on the path and no GPU, given ``tmp_path`` and ``tiny_cache``."""
    script = tmp_path / "two.py"
    script.write_text(text)
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]), "CUDA_VISIBLE_DEVICES": ""}
    return launch_two([sys.executable, str(script), str(tmp_path), str(tiny_cache)], env, timeout=timeout)


def _launch_two(cmd: list[str], env: dict, timeout: float) -> tuple[list[int] | None, str]:
    port = free_port()
    procs, logs = [], []
    for rank in (0, 1):
        log = tempfile.TemporaryFile("w+")
        rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": env.get("GLOO_SOCKET_IFNAME", LOOPBACK)}
        procs.append(subprocess.Popen(cmd, env=rank_env, stdout=log, stderr=subprocess.STDOUT, text=True))
        logs.append(log)
    deadline = time.monotonic() + timeout
    try:
        codes = [p.wait(timeout=max(0.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    out = ""
    for rank, log in enumerate(logs):
        log.seek(0)
        out += f"--- rank {rank}\n" + log.read()[-1500:]
        log.close()
    return codes, out


@pytest.mark.parametrize("share_prefix", [False, True], ids=["whole_rows", "shared_prefix"])
def test_two_processes_match_one(share_prefix, tmp_path):
    args = [*ARGS, f"model.share_prefix={str(share_prefix).lower()}"]
    env = {**os.environ, "SURECL_CACHE": str(tmp_path / "cache")}
    cli = tmp_path / "spied_cli.py"
    cli.write_text(SPIED_CLI)
    for name in ("one", "two"):
        (tmp_path / f"spy-{name}").mkdir()
    one = subprocess.run(
        [sys.executable, str(cli), "run", "--out", str(tmp_path / "one"), *args],
        env={**env, "SPY_DIR": str(tmp_path / "spy-one")}, capture_output=True, text=True,
    )
    assert one.returncode == 0, one.stderr
    codes, out = launch_two(
        [sys.executable, str(cli), "run", "--out", str(tmp_path / "two"), *args],
        {**env, "SPY_DIR": str(tmp_path / "spy-two"), "CUDA_VISIBLE_DEVICES": ""}, timeout=TWO_PROCESS_TIMEOUT,
    )
    assert codes is not None, f"the two processes did not finish in {TWO_PROCESS_TIMEOUT} s (stuck in a collective?):\n{out}"
    assert codes == [0, 0], out
    m1, members1, scores1, loss1 = outcome(tmp_path / "one")
    m2, members2, scores2, loss2 = outcome(tmp_path / "two")
    assert m1 == m2
    assert members1 == members2 and len(members1) > 0
    assert scores2 == pytest.approx(scores1, rel=1e-3)
    assert len(loss1) == len(loss2) and loss2 == pytest.approx(loss1, rel=1e-3)
    assert m1[0][0] > 0, "the run should learn something for the comparison to mean anything"
    # each of the two processes did its half of every step, scoring pass and evaluation: rank r
    # takes items r, r + 2, ..., so rank 0 holds ceil(n / 2) of n and rank 1 the rest
    alone = json.loads((tmp_path / "spy-one" / "rank0.json").read_text())
    ranks = [json.loads((tmp_path / "spy-two" / f"rank{r}.json").read_text()) for r in (0, 1)]
    for key in ("train", "score", "eval"):
        assert alone[key] and len(ranks[0][key]) == len(ranks[1][key]) == len(alone[key]), key
        assert ranks[0][key] == [(n + 1) // 2 for n in alone[key]], key
        assert ranks[1][key] == [n // 2 for n in alone[key]], key
    # the process group is torn down before interpreter finalisation (surecl.processes): a group
    # left up can abort a finished process (SIGABRT) as gloo's threads release their work
    assert [r["group_up_at_exit"] for r in ranks] == [False, False]


def test_two_processes_killed_and_resumed_end_as_uninterrupted_ones(tmp_path):
    """With LoRA dropout each process draws masks for its own rows, so their generators part.
    Killed in the second task and rerun, each process restores its own generator from the
    checkpoint (not the main process's), and the run ends bit for bit as an uninterrupted
    two-process run: the same step losses, matrix and buffer."""
    args = [*ARGS, "lora.dropout=0.1"]
    env = {**os.environ, "SURECL_CACHE": str(tmp_path / "cache"), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("SURECL_KILL_AT", None)

    def cmd(out: Path) -> list[str]:
        return [sys.executable, "-m", "surecl.cli", "run", "--out", str(out), *args]

    codes, out = launch_two(cmd(tmp_path / "whole"), env, TWO_PROCESS_TIMEOUT)
    assert codes == [0, 0], out
    codes, out = launch_two(cmd(tmp_path / "cut"), {**env, "SURECL_KILL_AT": "step:1:2"}, TWO_PROCESS_TIMEOUT)
    assert codes is not None and codes != [0, 0], out  # both killed themselves as the step began
    assert not (tmp_path / "cut" / "results.json").exists() and (tmp_path / "cut" / "checkpoints").is_dir()
    codes, out = launch_two(cmd(tmp_path / "cut"), env, TWO_PROCESS_TIMEOUT)
    assert codes == [0, 0], out
    whole, cut = outcome(tmp_path / "whole"), outcome(tmp_path / "cut")
    assert cut[3] == whole[3]  # every step's loss, bit for bit
    assert (cut[0], cut[1], cut[2]) == (whole[0], whole[1], whole[2])


def test_a_non_finite_loss_on_one_process_stops_both_with_one_line(tmp_path):
    """A NaN loss on process 1 alone: both processes finish the step's backward (DDP's
    collective) and then stop together, each with the one-line error (process 1's names its
    rows), instead of process 1 leaving process 0 waiting in the gradient's all-reduce."""
    env = {**os.environ, "SURECL_CACHE": str(tmp_path / "cache"), "CUDA_VISIBLE_DEVICES": "",
           "SURECL_NAN_AT": "1:1", "SURECL_FAULT_RANK": "1"}
    env.pop("SURECL_KILL_AT", None)
    codes, out = launch_two([sys.executable, "-m", "surecl.cli", "run", "--out", str(tmp_path / "run"), *ARGS], env, TWO_PROCESS_TIMEOUT)
    assert codes == [2, 2], out
    rank0, rank1 = out.split("--- rank 1\n")
    assert "non-finite loss at task" in rank0 and "on another process" in rank0 and "Traceback" not in rank0, out
    assert "non-finite loss (nan)" in rank1 and "on process 1" in rank1 and "Traceback" not in rank1, out
    assert (tmp_path / "run" / "checkpoints").is_dir() and not (tmp_path / "run" / "results.json").exists()
