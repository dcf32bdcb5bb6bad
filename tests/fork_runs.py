"""A fork server for tests that run ``surecl run`` many times as separate processes (kill -9 at a
fault point, then resume): one process imports surecl once and forks a child per run, so each
run starts from a freshly imported state without paying the imports every time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from safetensors.torch import load_file

# A process that imports surecl once and forks one child per run: each run (and each kill) is
# a separate process started from the same freshly imported state, as ``python -m surecl.cli``
# would be, without paying the ~3 s of imports (torch, transformers, peft) every time.
FORK_SERVER = r"""
import json, os, sys, traceback
import surecl.cli, surecl.trainer  # noqa: F401
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.environ.clear()
        os.environ.update(job["env"])
        code = 1
        try:
            code = surecl.cli.main(job["argv"]) or 0
        except BaseException:
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.stdout.write(json.dumps(pid) + "\n")
    sys.stdout.flush()
    _, status = os.waitpid(pid, 0)
    sys.stdout.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\n")
    sys.stdout.flush()
"""


RUN_TIMEOUT = 300  # seconds for one run (each takes a few)


class Runs:
    def __init__(self, root: Path, path: list[str] | None = None):
        """``path``: folders put on the server's ``sys.path`` (modules a run loads with ``--import``)."""
        self.root = root
        env = dict(os.environ)
        if path:
            env["PYTHONPATH"] = os.pathsep.join([*path, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
        self.server = subprocess.Popen([sys.executable, "-c", FORK_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.n = 0
        self.prefix: list[str] = []
        """Arguments before ``run`` in every command (``["--import", "my_cl"]``)."""

    def __call__(self, out: Path, args: list[str], kill_at: str | None = None) -> tuple[int, str]:
        """``surecl run --out out *args`` in a new process; its exit code (-9: SIGKILLed) and stderr."""
        env = {**os.environ, "SURECL_CACHE": str(self.root / "cache")}
        env.pop("SURECL_KILL_AT", None)
        env.pop("SURECL_NAN_AT", None)
        if kill_at:
            env["SURECL_KILL_AT"] = kill_at
        self.n += 1
        log = self.root / f"run{self.n}.log"
        self.server.stdin.write(json.dumps({"argv": [*self.prefix, "run", "--out", str(out), *args], "env": env, "log": str(log)}) + "\n")
        self.server.stdin.flush()
        pid = json.loads(self.server.stdout.readline())
        done: list[str] = []
        reader = threading.Thread(target=lambda: done.append(self.server.stdout.readline()), daemon=True)
        reader.start()
        reader.join(RUN_TIMEOUT)
        if reader.is_alive():  # hung: kill it, so the server goes on, and fail
            os.kill(pid, signal.SIGKILL)
            reader.join()
            pytest.fail(f"surecl run {' '.join(args)} did not finish in {RUN_TIMEOUT} s:\n{log.read_text()[-1500:]}")
        return json.loads(done[0]), log.read_text()

    def close(self) -> None:
        self.server.stdin.close()
        self.server.wait(timeout=60)


def started_from(stderr: str, out: Path, checkpoint: str | None) -> None:
    """The run resumed from ``checkpoint`` (None: there was none yet, it started over)."""
    if checkpoint is None:
        assert "resumed from" not in stderr, stderr[-800:]
    else:
        assert f"resumed from {out / 'checkpoints' / checkpoint} " in stderr, stderr[-800:]


def outcome(out: Path) -> dict:
    res = json.loads((out / "results.json").read_text())
    adapters = {}
    for name, file in (("fast", "adapter_model"), ("slow", "adapter_model"), ("prompts", "prompts")):
        f = out / "adapters" / name / f"{file}.safetensors"
        if f.is_file():
            adapters[name] = {k: v.tolist() for k, v in load_file(str(f)).items()}
    model = out / "model" / "model.safetensors"  # a full fine-tuned model (seq_ft)
    if model.is_file():
        adapters["model"] = {k: v.tolist() for k, v in load_file(str(model)).items()}
    return {
        "results": {k: res.get(k) for k in ("accuracy_matrix", "fast", "initial", "fp", "ap", "forgetting", "bwt", "steps", "buffer")},
        "log": [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()],
        "buffer": json.loads((out / "buffer.json").read_text()),
        "adapters": adapters,
    }
