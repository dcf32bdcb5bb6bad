"""The instruct stream and the default general-ability probe (issue 28, item 5), built from a
small fixture archive laid out as the ``bigbench`` source archive is; no network, no ../shared."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from surecl.config import build_config
from surecl.data import embedded, instruct
from surecl.data.general import load_general_probe
from surecl.data.instruct import INSTRUCT_ORDER, INSTRUCT_VERSION, PROBE_TASKS, ensure_instruct_benchmark, load_instruct_stream
from surecl.data.loading import check_order
from surecl.errors import SureclError

WORDS = "the a of to and in is it on for with as was at by this that from or one all there".split()


def _sentence(i: int, n: int = 8) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n)) + f" item{i}"


def _fixture_tasks() -> dict[str, dict]:
    """Each member's task.json, shaped as BIG-bench's: ``examples`` of ``input`` and ``target``
    (a string or a list of references), enough rows for the stream's minimum split sizes."""
    qasc = [{"input": f"Fact: fact {i // 2} {_sentence(i // 2)}. \nQuestion: question {i}?", "target": [f"answer {i}.", "other"]}
            for i in range(340)]
    qasc.append({"input": "Fact: long. \nQuestion: long?", "target": [" ".join(["word"] * 60)]})  # too long a target: left out
    columns = " | ".join(["*", "singer.name", "singer.age", "concert.year"])
    spider = [{"input": f"How many rows {i} {'please' if i % 2 else 'now'}? | {columns}", "target": [f"select count ( * ) where id = {i // 2}"]}
              for i in range(340)]
    e2e = [{"input": f"name: Place {i // 5}, eatType: pub, area: riverside", "target": f"Place {i // 5} is a pub by the river, review {i}."}
           for i in range(360)]
    article = "This is the first sentence of a long news article. " * 30
    xsum = [{"input": f"Story {i}. {article}", "target": [f"Story {i} in one sentence."]} for i in range(330)]
    wikihow = [{"input": f"How to do thing {i}. " + _sentence(i, 30), "target": [f"summary {i}"]} for i in range(80)]
    probe = {m: {"examples": [{"input": f"{m.rsplit('/', 1)[-1]} input {i} {_sentence(i, 4)}", "target": [f"target {i}"]}
                              for i in range(40)]} for m, _, _ in PROBE_TASKS}
    return {
        "natural_instructions/subtask041_qasc_answer_generation": {"examples": qasc},
        "semantic_parsing_spider": {"examples": spider},
        "gem/e2e_nlg": {"examples": e2e},
        "gem/xsum": {"examples": xsum},
        "gem/wikilingua_en": {"examples": wikihow},
        **probe,
    }


def write_archive(path: Path, tasks: dict[str, dict]) -> Path:
    """A source archive in the bigbench layout: ``bigbench-1.0.0/bigbench/benchmark_tasks/<task>/task.json``."""
    with tarfile.open(path, "w:gz") as tar:
        for rel, data in [("bigbench-1.0.0/setup.py", b""), *((f"bigbench-1.0.0/bigbench/benchmark_tasks/{m}/task.json",
                                                               json.dumps(t).encode()) for m, t in tasks.items())]:
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    return write_archive(tmp_path_factory.mktemp("bigbench") / "bigbench-1.0.0.tar.gz", _fixture_tasks())


@pytest.fixture
def downloads(monkeypatch, archive) -> list[str]:
    """The network download replaced by the fixture archive; the list records each package asked for."""
    asked: list[str] = []

    def fake(spec: str, dest: Path) -> Path:
        asked.append(spec)
        return archive

    monkeypatch.setattr(instruct, "_download", fake)
    return asked


@pytest.fixture(scope="module")
def built(tmp_path_factory, archive) -> Path:
    """The stream built from the fixture archive into a cache folder (as a first run does)."""
    cache = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setattr(instruct, "_download", lambda spec, dest: archive)
    try:
        ensure_instruct_benchmark(cache, quiet=True)
    finally:
        mp.undo()
    return cache


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_builds_the_stream_and_probe_layout(built):
    root = built / f"instruct-{INSTRUCT_VERSION}"
    manifest = json.loads((root / "MANIFEST.json").read_text())
    assert manifest["order"] == INSTRUCT_ORDER == ["qa", "sql", "restaurant", "summary"]
    for task in manifest["tasks"]:
        assert task["n_train"] >= 200 and task["n_test"] >= 100, task
    assert {t["kind"] for t in manifest["tasks"]} == {"question answering", "code (text to SQL)", "data to text", "summarisation"}
    for name in INSTRUCT_ORDER:  # sources and licences are recorded with the data
        assert "bigbench==1.0.0 (Apache-2.0)" in manifest["sources"][name]
    assert "CC BY-SA 4.0" in manifest["sources"]["sql"] and "WikiHow" in manifest["sources"]["general/text"]
    header, *body = rows(root / "qa.jsonl")
    assert header["kind"] == "generate" and header["metric"] == "rouge_l" and header["instruction"].endswith("\n")
    assert {r["split"] for r in body} == {"train", "test"} and all(set(r) == {"prompt", "response", "split"} for r in body)
    assert all(len(r["response"].split()) <= 40 for r in body)  # the 60-word target was left out
    assert body[0]["response"].startswith("answer ")  # the first of a row's references
    summary = rows(root / "summary.jsonl")[1:]
    assert all(len(r["prompt"]) <= instruct._MAX_ARTICLE for r in summary) and summary[0]["prompt"].startswith("Story ")
    sql = rows(root / "sql.jsonl")[1:]
    assert sql[0]["prompt"].startswith("Question: How many rows") and "\nColumns: singer.name, singer.age, concert.year" in sql[0]["prompt"]


def test_splits_keep_each_group_on_one_side(built):
    """A QASC fact, a Spider query on its schema (its paraphrased questions) and an E2E attribute
    set (all its references) never straddle train and test."""
    root = built / f"instruct-{INSTRUCT_VERSION}"

    def sides(name: str, key) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for r in rows(root / f"{name}.jsonl")[1:]:
            out.setdefault(key(r), set()).add(r["split"])
        return out

    for name, key in (("qa", lambda r: r["prompt"].split("\n")[0]), ("sql", lambda r: r["response"]), ("restaurant", lambda r: r["prompt"])):
        groups = sides(name, key)
        assert all(len(s) == 1 for s in groups.values()), name
        assert any(s == {"test"} for s in groups.values()) and any(s == {"train"} for s in groups.values())


def test_probe_holds_text_and_held_out_instructions(built):
    root = built / f"instruct-{INSTRUCT_VERSION}" / "general"
    text = rows(root / "text.jsonl")
    assert len(text) == 80 and all(set(r) == {"text"} and len(r["text"]) <= instruct._MAX_ARTICLE for r in text)
    header, *body = rows(root / "instruct.jsonl")
    assert header["metric"] == "rouge_l" and len(body) == 4 * 25
    assert {r["instruction"] for r in body} == {instruction for _, instruction, _ in PROBE_TASKS}
    # eval.general=default reads it from the cache
    probe = load_general_probe("default", 0, built)
    assert probe.names == ["text", "instruct"] and len(probe.tasks[1].test) == 100
    assert probe.tasks[1].test[0].sentence.startswith(body[0]["instruction"] + "\n\n")


def test_loads_as_generation_tasks(built):
    root = built / f"instruct-{INSTRUCT_VERSION}"
    tasks = load_instruct_stream(root, [])
    assert [t.name for t in tasks] == INSTRUCT_ORDER
    assert all(t.kind == "generate" and t.score_metric == "rouge_l" and t.instruction for t in tasks)
    assert [t.name for t in load_instruct_stream(root, ["summary", "qa"])] == ["summary", "qa"]
    with pytest.raises(SureclError, match="the instruct stream has no task news"):
        load_instruct_stream(root, ["news"])
    # its one order (default) is the loading's rule; with a task list any name is an order
    instruct = build_config("tiny", ["data.benchmark=instruct", "data.order=2"]).data
    with pytest.raises(SureclError, match="data.order: the instruct stream has one order"):
        check_order(instruct)
    check_order(dataclasses.replace(instruct, tasks=["qa"]))


def test_second_call_reuses_the_cache_without_downloading(built, monkeypatch):
    def offline(spec: str, dest: Path) -> Path:
        raise AssertionError("downloaded again")

    monkeypatch.setattr(instruct, "_download", offline)
    assert ensure_instruct_benchmark(built, quiet=True) == built / f"instruct-{INSTRUCT_VERSION}"


def test_builds_are_deterministic(tmp_path, downloads):
    first = ensure_instruct_benchmark(tmp_path / "a", quiet=True)
    second = ensure_instruct_benchmark(tmp_path / "b", quiet=True)
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file())
    assert all((first / f).read_bytes() == (second / f).read_bytes() for f in files)
    assert downloads == ["bigbench==1.0.0", "bigbench==1.0.0"]


def test_offline_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    """Without the package registry the builder stops in one line naming the package, and so
    does ``surecl run --config instruct`` (exit 2)."""
    def no_network(command: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "", "WARNING: Retrying...\nERROR: Could not find a version that satisfies the requirement bigbench==1.0.0\n")

    monkeypatch.setattr(embedded.subprocess, "run", no_network)
    with pytest.raises(SureclError) as failure:
        ensure_instruct_benchmark(tmp_path / "cache", quiet=True)
    message = str(failure.value)
    assert "bigbench==1.0.0" in message and "package registry" in message and "instruct stream" in message and "\n" not in message
    assert list((tmp_path / "cache").iterdir()) == []
    from surecl.cli import main

    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    code = main(["run", "--config", "instruct,seq_lora", "model.name=tiny", "--out", str(tmp_path / "out"), "--quiet"])
    lines = capsys.readouterr().err.strip().splitlines()
    # the progress lines ("building ...", "[1/1] bigbench==1.0.0") then the error, in one line
    assert code == 2 and lines[-1].startswith("surecl: error: could not get bigbench==1.0.0") and "package registry" in lines[-1]
    assert [line for line in lines if "error" in line] == lines[-1:]


def test_archive_without_a_task_is_one_line(tmp_path, monkeypatch):
    tasks = _fixture_tasks()
    del tasks["gem/xsum"]
    broken = write_archive(tmp_path / "bigbench-1.0.0.tar.gz", tasks)
    monkeypatch.setattr(instruct, "_download", lambda spec, dest: broken)
    with pytest.raises(SureclError, match=r"bigbench==1\.0\.0: its archive .* has no bigbench/benchmark_tasks/gem/xsum/task.json"):
        ensure_instruct_benchmark(tmp_path / "cache", quiet=True)
    assert list((tmp_path / "cache").iterdir()) == []


def test_too_few_rows_is_one_line(tmp_path, monkeypatch):
    tasks = _fixture_tasks()
    tasks["gem/e2e_nlg"]["examples"] = tasks["gem/e2e_nlg"]["examples"][:100]
    small = write_archive(tmp_path / "bigbench-1.0.0.tar.gz", tasks)
    monkeypatch.setattr(instruct, "_download", lambda spec, dest: small)
    with pytest.raises(SureclError, match=r"task restaurant \(gem/e2e_nlg\) has too few usable rows"):
        ensure_instruct_benchmark(tmp_path / "cache", quiet=True)


def test_download_asks_pip_for_the_source_archive(tmp_path, monkeypatch):
    """bigbench ships no wheel: the builder asks pip for its sdist, without installing it."""
    seen: list[list[str]] = []

    def pip(command: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
        seen.append(command)
        dest = Path(command[command.index("-d") + 1])
        (dest / "bigbench-1.0.0.tar.gz").write_bytes(b"")
        (dest / "other-1.0.0.tar.gz").write_bytes(b"")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(embedded.subprocess, "run", pip)
    assert instruct._download("bigbench==1.0.0", tmp_path / "dl") == tmp_path / "dl" / "bigbench-1.0.0.tar.gz"
    [command] = seen
    assert command[1:4] == ["-m", "pip", "download"] and {"--no-deps", "--no-binary"} <= set(command) and command[-1] == "bigbench==1.0.0"


# ----------------------------------------------------------------------------- the preset


def test_instruct_preset_values():
    cfg = build_config("instruct")
    assert cfg.data.benchmark == "instruct" and cfg.model.name == "smollm2-135m" and cfg.eval.general == "default"
    assert cfg.preset == "slow_surprise"  # a setting: the default method applies


def test_instruct_preset_runs_with_a_tiny_model(built, tmp_path):
    """The preset end to end on the tiny model over the fixture-built stream: four generation
    tasks scored by ROUGE-L, and the general probe before and after every task in results.json
    and report.md."""
    from surecl.trainer import run

    cfg = build_config("instruct,surprise", ["model.name=tiny", "model.max_length=64", "data.n_train=8", "data.n_test=4",
                                             "eval.general_n=4", "eval.max_new_cap=4", "train.epochs=1", "replay.buffer_size=4"])
    results = run(cfg, tmp_path / "run", progress=False, cache_dir=built)  # the tiny model is built there too
    assert results["tasks"] == INSTRUCT_ORDER and results["metric"] == "rouge_l"
    assert all(results["accuracy_matrix"][3][j] is not None for j in range(4))
    g = results["general"]
    assert g["source"] == "default" and g["rows"] == {"text": 4, "instruct": 4}
    assert g["before"] is not None and all(row is not None for row in g["after"])
    assert "## General ability" in (tmp_path / "run" / "report.md").read_text()
