"""The general-ability probe (issue 28, item 4): held-out text and instructions measured before
the stream and after every task, reported as its own rows, and kept through a resume."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from surecl.config import build_config
from surecl.data.general import load_general_probe
from surecl.data.tiny import FILLER, TINY_TASKS
from surecl.errors import SureclError

STREAM = ["data.kind=generate", "data.tasks=[colors,animals]", "data.n_train=32", "data.n_test=8", "train.epochs=4"]
WEATHER_INSTRUCTION = "Which class fits the cue word in the text?\n"


def write_probe(folder: Path, n_text: int = 30, n_instruct: int = 24) -> Path:
    """A probe in the tiny vocabulary: filler text with number words (no stream task's cues),
    and the weather cue task (not in the stream) as the held-out instruction set."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = FILLER + sorted(TINY_TASKS["numbers"])
    (folder / "text.jsonl").write_text("".join(json.dumps({"text": " ".join(rng.choice(words) for _ in range(12))}) + "\n"
                                               for _ in range(n_text)))
    rows = [{"task": "weather", "instruction": WEATHER_INSTRUCTION}]
    for _ in range(n_instruct):
        cue = rng.choice(sorted(TINY_TASKS["weather"]))
        rows.append({"prompt": " ".join(rng.choice(FILLER) for _ in range(3)) + " " + cue, "response": TINY_TASKS["weather"][cue]})
    (folder / "instruct.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    return write_probe(tmp_path_factory.mktemp("probe") / "general")


# ----------------------------------------------------------------------------- reading a probe


def test_probe_folder_file_and_fixed_draw(probe, tmp_path):
    p = load_general_probe(str(probe), 10)
    assert p.names == ["text", "instruct"]
    text, instruct = p.tasks
    assert text.kind == "text" and len(text.test) == 10 and not text.train
    assert instruct.kind == "generate" and instruct.score_metric == "rouge_l" and instruct.instruction == WEATHER_INSTRUCTION
    # the same rows whatever the run: the draw depends on the part alone
    assert load_general_probe(str(probe), 10).tasks[1].test == instruct.test
    assert load_general_probe(str(probe), 0).tasks[0].test == load_general_probe(str(probe), 100).tasks[0].test
    assert len(load_general_probe(str(probe), 0).tasks[0].test) == 30
    # one file: its rows say which part it is
    [only] = load_general_probe(str(probe / "instruct.jsonl"), 0).tasks
    assert only.name == "instruct" and len(only.test) == 24
    [only] = load_general_probe(str(probe / "text.jsonl"), 0).tasks
    assert only.name == "text"
    assert load_general_probe("none", 10) is None


BAD = {
    "missing path": (lambda d: str(d / "nowhere"), "does not exist"),
    "empty folder": (lambda d: (d / "empty").mkdir() or str(d / "empty"), "neither text.jsonl nor instruct.jsonl"),
    "row without target": (lambda d: (d / "p.jsonl").write_text('{"prompt": "q"}\n') and str(d / "p.jsonl"), "line 1: missing target"),
    "empty file": (lambda d: (d / "e.jsonl").write_text("\n") and str(d / "e.jsonl"), "has no rows"),
    "bad metric": (lambda d: (d / "m.jsonl").write_text('{"task": "x", "metric": "bleu"}\n{"prompt": "q", "response": "a"}\n')
                   and str(d / "m.jsonl"), "'metric' must be one of rouge_l, exact_match"),
    "empty text": (lambda d: (d / "t.jsonl").write_text('{"text": "  "}\n') and str(d / "t.jsonl"), "line 1: empty text"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_probe_is_one_line(case, tmp_path, tiny_cache, capsys):
    """A bad probe stops the run before anything is trained, in one line naming it."""
    from surecl.cli import main

    make, words = BAD[case]
    spec = make(tmp_path)
    with pytest.raises(SureclError) as err:
        load_general_probe(spec, 10)
    assert words in str(err.value) and "\n" not in str(err.value)
    code = main(["run", "--config", "tiny", "--out", str(tmp_path / "out"), "--quiet", "data.tasks=[colors]", f"eval.general={spec}"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and words in lines[0]
    assert not (tmp_path / "out" / "results.json").exists()


def test_a_probe_instruction_ending_in_a_word_gets_its_newline(tmp_path):
    """As every reader of instruction files does (data.jsonl): the input does not run on from the
    instruction's last word, so a file prompts the same as a probe as it does as a task."""
    from surecl.data.jsonl import load_jsonl_task

    f = tmp_path / "qa.jsonl"
    f.write_text(json.dumps({"task": "qa", "kind": "generate", "instruction": "Answer in one word."}) + "\n"
                 + "".join(json.dumps({"prompt": "Capital of France?", "response": "Paris", "split": split}) + "\n" for split in ("train", "test")))
    [part] = load_general_probe(str(f), 0).tasks
    assert part.instruction == "Answer in one word.\n" == load_jsonl_task(f).instruction


def test_bad_probe_options_are_refused():
    with pytest.raises(SureclError, match="eval.general_n"):
        build_config("tiny", ["eval.general_n=-1"])
    with pytest.raises(SureclError, match="eval.general"):
        build_config("tiny", ["eval.general= "])


# ----------------------------------------------------------------------------- in a run


@pytest.fixture(scope="module")
def probed(tmp_path_factory, tiny_cache, probe):
    from surecl.trainer import run

    out = tmp_path_factory.mktemp("probed") / "run"
    cfg = build_config("tiny,slow_surprise", [*STREAM, f"eval.general={probe}"])
    return out, run(cfg, out, progress=False, cache_dir=tiny_cache)


def test_probe_is_measured_before_and_after_every_task(probed, probe):
    out, results = probed
    g = results["general"]
    assert g["source"] == str(probe) and g["parts"] == ["text", "instruct"]
    assert g["metrics"] == {"text": "perplexity", "instruct": "rouge_l"} and g["rows"] == {"text": 30, "instruct": 24}
    assert set(g["before"]) == {"text", "instruct"} and all(v is not None for v in g["before"].values())
    assert len(g["after"]) == 2 and all(set(row) == {"text", "instruct"} for row in g["after"])
    assert g["final"] == g["after"][-1]
    assert g["change"] == {k: pytest.approx(g["final"][k] - g["before"][k]) for k in g["before"]}
    # the training changed what the probe sees, row by row (the tiny base starts far from its text)
    assert g["after"][0]["text"] != g["before"]["text"] and g["after"][1]["text"] != g["after"][0]["text"]
    # a dual run also probes its fast adapter (eval.fast), row by row
    assert len(g["fast"]["after"]) == 2 and g["fast"]["after"][0]["text"] != g["after"][0]["text"]
    # the probe is not a task of the stream: the score matrix and its summary are unchanged in shape
    assert results["tasks"] == ["colors", "animals"] and len(results["accuracy_matrix"][0]) == 2
    assert results["timing"]["general"] > 0
    saved = json.loads((out / "results.json").read_text())
    assert saved["general"] == json.loads(json.dumps(g))
    report = (out / "report.md").read_text()
    assert "## General ability (held-out probe, never trained on)" in report
    assert "| general | before training | after colors | after animals | change |" in report
    assert "| instruct |" in report and "| text (fast adapter) |" in report
    # the values live in the run state that checkpoints carry
    from surecl.checkpoint import load_latest

    found = load_latest(out / "checkpoints", lambda m: None)
    state = found.components["run"][0]
    assert state["general_initial"] == g["before"] and state["general"] == g["after"]


def test_model_cards_carry_the_probe(probed, probe):
    """Each saved adapter's card shows the probe before the stream and after its last task
    under that adapter's own weights (the fast card: the fast adapter's probe)."""
    out, results = probed
    g = results["general"]
    for adapter, final in (("slow", g["final"]), ("fast", g["fast"]["final"])):
        card = (out / "adapters" / adapter / "README.md").read_text()
        row = next(line for line in card.splitlines() if line.startswith("| general ability"))
        assert f"`{probe}`" in row
        for part in ("text", "instruct"):
            assert f"{final[part]:.2f} ({final[part] - g['before'][part]:+.2f})" in row
        assert f"text perplexity {g['before']['text']:.2f} -> {final['text']:.2f}" in row
    assert g["fast"]["final"]["text"] != g["final"]["text"]  # the two cards show different weights


def test_without_the_option_nothing_changes(tmp_path, tiny_cache):
    from surecl.trainer import run

    results = run(build_config("tiny,seq_lora", [*STREAM[:4], "train.epochs=1"]), tmp_path / "run", progress=False, cache_dir=tiny_cache)
    assert "general" not in results and "general" not in results["timing"]
    assert "General ability" not in (tmp_path / "run" / "report.md").read_text()


def pretrained(tiny_loaded, probe: Path):
    """The tiny base trained on the probe's own text and instructions (whole sequences), so it
    starts the stream with general ability to lose: low perplexity, the weather answers right."""
    from surecl.data.encode import TaskEncoder

    torch.manual_seed(0)
    model = copy.deepcopy(tiny_loaded.model).float().train().requires_grad_(True)
    encoder = TaskEncoder(tiny_loaded.tokenizer, max_length=64)
    items = [e for t in load_general_probe(str(probe), 0).tasks for e in encoder.encode(t, t.test, split="test")]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    pad = tiny_loaded.tokenizer.pad_token_id
    for step in range(120):
        batch = random.Random(step).sample(items, 16)
        width = max(len(e.prompt) + len(e.answer) for e in batch)
        ids = torch.full((len(batch), width), pad)
        for r, e in enumerate(batch):
            seq = e.prompt + e.answer
            ids[r, : len(seq)] = torch.tensor(seq)
        labels = ids.masked_fill(ids == pad, -100)
        loss = model(input_ids=ids, attention_mask=(ids != pad).long(), labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


def test_probe_shows_what_a_damaging_stream_costs(tmp_path, tiny_cache, tiny_loaded, probe):
    """A base that knows the probe loses it to a stream trained at a learning rate far too high:
    its text perplexity rises and its instruction score falls; at the usual rate it loses less."""
    from surecl.trainer import run

    base = pretrained(tiny_loaded, probe)
    out = {}
    for lr in ("0.003", "0.05"):
        cfg = build_config("tiny,seq_lora", [*STREAM, f"train.lr={lr}", f"eval.general={probe}"])
        out[lr] = run(cfg, tmp_path / lr, progress=False, cache_dir=tiny_cache, model=copy.deepcopy(base),
                      tokenizer=tiny_loaded.tokenizer)["general"]
    gentle, harsh = out["0.003"], out["0.05"]
    assert gentle["before"] == harsh["before"]  # the same base, the same rows
    assert harsh["before"]["text"] < 40 and harsh["before"]["instruct"] >= 80  # the base knows the probe (random text of 28 words)
    assert harsh["change"]["text"] > 1.0 and harsh["final"]["text"] > 2 * harsh["before"]["text"]
    assert harsh["change"]["instruct"] < 0
    assert harsh["change"]["text"] > gentle["change"]["text"]


# ----------------------------------------------------------------------------- resume


def surecl(out: Path, cache: Path, probe: Path, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "SURECL_CACHE": str(cache)}
    env.pop("SURECL_KILL_AT", None)
    if kill_at:
        env["SURECL_KILL_AT"] = kill_at
    args = ["--config", "tiny,slow_surprise", "--quiet", *STREAM, "train.epochs=2", "train.checkpoint_every=2", f"eval.general={probe}"]
    return subprocess.run([sys.executable, "-m", "surecl.cli", "run", "--out", str(out), *args], env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, probe) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("probe-resume")
    full = surecl(root / "full", root / "cache", probe)
    assert full.returncode == 0, full.stderr
    return root, json.loads((root / "full" / "results.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("point", ["stage_end:0", "step:1:2"])
def test_killed_run_resumes_to_the_same_probe(point, uninterrupted, probe):
    """Killed after the first task was evaluated and probed but before its checkpoint, or in
    the middle of the second task: the rerun's probe rows equal an uninterrupted run's."""
    root, want = uninterrupted
    out = root / point.replace(":", "_")
    killed = surecl(out, root / "cache", probe, kill_at=point)
    assert killed.returncode == -9, killed.stderr[-500:]
    resumed = surecl(out, root / "cache", probe)
    assert resumed.returncode == 0 and "resumed from" in resumed.stderr, resumed.stderr
    got = json.loads((out / "results.json").read_text())
    assert got["general"] == want["general"] and got["accuracy_matrix"] == want["accuracy_matrix"]


def test_dry_run_names_the_probe(probe, tiny_cache):
    from surecl.plan import describe

    text = describe(build_config("tiny,seq_lora", [*STREAM, f"eval.general={probe}", "eval.general_n=10"]), tiny_cache)
    assert f"general-ability probe ({probe}): text (perplexity) 10 rows, instruct (rouge_l) 10 rows" in text


def test_cli_summary_line_shows_the_change(probe, tmp_path, tiny_cache, capsys, monkeypatch):
    from surecl.cli import main

    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    code = main(["run", "--config", "tiny,seq_lora", "--out", str(tmp_path / "out"), "--quiet", *STREAM[:4], "train.epochs=1",
                 f"eval.general={probe}"])
    out = capsys.readouterr().out
    change = json.loads((tmp_path / "out" / "results.json").read_text())["general"]["change"]
    assert code == 0 and f"general text {change['text']:+.2f}, instruct {change['instruct']:+.2f}  -> " in out


@pytest.mark.parametrize("method", ["mtl", "per_task", "progressive_prompts", "olora", "seq_ft"])
def test_every_kind_of_method_is_probed(method, probe, tmp_path, tiny_cache):
    """Methods with one stage (MTL), per-task weights or prompts that belong to a stream task,
    frozen past adapters, or no adapters at all: the probe is measured before and after every stage."""
    from surecl.trainer import run

    results = run(build_config(f"tiny,{method}", [*STREAM[:4], "train.epochs=1", f"eval.general={probe}", "eval.general_n=4"]),
                  tmp_path / "run", progress=False, cache_dir=tiny_cache)
    g = results["general"]
    rows = [r for r in g["after"] if r is not None]
    assert g["before"] is not None and len(rows) == (1 if method == "mtl" else 2) and g["final"] == rows[-1]
    assert g["change"] == {k: pytest.approx(g["final"][k] - g["before"][k]) for k in g["before"]}
    # the run's report names what each row is after: MTL's one stage is every task, not the last one
    report = (tmp_path / "run" / "report.md").read_text()
    if method == "mtl":
        assert "| general | before training | after all tasks (trained jointly) | change |" in report
        assert "\n| all tasks (trained jointly) | " in report and "\n| colors | - | - |" not in report
    else:
        assert "| general | before training | after colors | after animals | change |" in report


@pytest.mark.slow
def test_a_resume_on_changed_probe_rows_is_refused(uninterrupted, tmp_path):
    """Killed mid-run, its probe file edited: the rerun would compare 'after' scores on the new
    rows with 'before' scores taken on the old ones. One line instead; restored, it resumes."""
    root, want = uninterrupted
    probe = write_probe(tmp_path / "probe")
    out = tmp_path / "run"
    assert surecl(out, root / "cache", probe, kill_at="step:1:2").returncode == -9
    original = (probe / "text.jsonl").read_text()
    (probe / "text.jsonl").write_text(original.replace("one", "two"))
    refused = surecl(out, root / "cache", probe)
    assert refused.returncode == 2 and "general-ability probe's part text changed" in refused.stderr, refused.stderr[-500:]
    (probe / "text.jsonl").write_text(original)
    again = surecl(out, root / "cache", probe)
    assert again.returncode == 0, again.stderr[-500:]
    got = json.loads((out / "results.json").read_text())["general"]
    assert {k: v for k, v in got.items() if k != "source"} == {k: v for k, v in want["general"].items() if k != "source"}
