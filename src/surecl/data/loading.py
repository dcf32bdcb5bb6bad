"""From a :class:`~surecl.config.DataConfig` to a subsampled task stream: benchmark, then
``data.jsonl``, then ``data.hf`` tasks, or those ``data.tasks`` names, in its order."""

from __future__ import annotations

import dataclasses
import hashlib
import unicodedata
from pathlib import Path

from surecl.config import RunConfig
from surecl.data.cl_benchmark import ORDERS, index_tasks, load_benchmark, resolve_order
from surecl.data.jsonl import load_jsonl_task
from surecl.data.task import Task, prepare_stream
from surecl.data.tiny import tiny_generation_stream, tiny_stream
from surecl.errors import SureclError

ONE_ORDER = {"tiny": "the tiny benchmark", "none": "a stream of data.jsonl / data.hf tasks", "instruct": "the instruct stream",
             "embedded": "the embedded benchmark (newsgroups, tweets, reuters, movies)"}
"""Streams with one order, ``default``: another takes its task list (``data.tasks``)."""


def check_order(data, another: str = "give another with data.tasks", folder: bool = False) -> None:
    """The one rule for ``data.order``, before anything is loaded: the streams of
    :data:`ONE_ORDER` have ``default`` only, a CL_Benchmark folder 1-6 and ``default``, and a
    task list (``data.tasks``) makes any name an order. ``another`` says how to give an order
    its task list (a run: ``data.tasks``; a sweep: its plan's ``orders``). With ``folder`` (a
    sweep, before it writes its plan), an existing benchmark folder must hold the tasks the order
    names, and a one-order stream's task list must name its tasks (:func:`_check_stream_tasks`),
    as the run's loading checks (a missing folder is the run's to say; a ``data.jsonl`` /
    ``data.hf`` task is not the folder's)."""
    if not data.tasks and data.order != "default":
        if data.benchmark in ONE_ORDER:
            hint = "; the paper's orders 1-6 need data.benchmark=/path/to/CL_Benchmark" if data.benchmark == "embedded" else ""
            raise SureclError(f"data.order: {ONE_ORDER[data.benchmark]} has one order (default), not {data.order!r}; {another}{hint}")
        if data.order not in ORDERS:
            raise SureclError(f"data.order: unknown order {data.order!r} (choose from {', '.join(ORDERS)} or default, or {another})")
    root = Path(data.benchmark).expanduser()
    if folder and data.benchmark in ONE_ORDER and data.tasks:
        _check_stream_tasks(data)
    if folder and data.benchmark not in ONE_ORDER and root.is_dir():
        own = _own_task_names(data) if data.tasks else set()
        picked = [n for n in data.tasks if n not in own]
        if picked or not data.tasks:  # a task list of data.jsonl / data.hf tasks alone reads no folder
            resolve_order(root, data.order, picked, data.allow_missing)


def _check_stream_tasks(data) -> None:
    """``data.tasks`` of a :data:`ONE_ORDER` stream against the names it knows without reading
    a task (the tiny stream's, the embedded and instruct lists, the data.jsonl / data.hf tasks'):
    a name it lacks or a name given twice, in the words the run's loading uses, so a sweep
    stops before it plans a run that fails at every resume. Under ``data.allow_missing`` the
    embedded benchmark, a folder, leaves out the names it lacks, as the run does."""
    twice = sorted({n for n in data.tasks if data.tasks.count(n) > 1})
    if twice:
        raise SureclError(f"task named twice in the stream: {', '.join(twice)}")
    own = _own_task_names(data) if data.jsonl or data.hf else set()
    have = [n for n in _stream_order(data) if n not in own] + sorted(own)
    unknown = [n for n in data.tasks if n not in have]
    picked = [n for n in data.tasks if n not in own]  # the benchmark's share: one of them must be there
    if not unknown or (data.benchmark == "embedded" and data.allow_missing and len(unknown) < len(picked)):
        return
    what = {"tiny": "the tiny benchmark", "instruct": "the instruct stream", "embedded": "the embedded benchmark"}.get(data.benchmark, "")
    source = " or ".join([*([what] if what else []), *(["data.jsonl / data.hf"] if own or not what else [])])
    raise SureclError(f"data.tasks: {source} has no task {', '.join(unknown)} (it has {', '.join(have) or 'none'})")


def _stream_order(data) -> list[str]:
    """The task names of a :data:`ONE_ORDER` benchmark, in its order, without building or reading one."""
    if data.benchmark == "tiny":
        return [t.name for t in _tiny(data)]
    if data.benchmark == "instruct":
        from surecl.data.instruct import INSTRUCT_ORDER

        return list(INSTRUCT_ORDER)
    if data.benchmark == "embedded":
        from surecl.data.embedded import EMBEDDED_ORDER

        return list(EMBEDDED_ORDER)
    return []


def _own_task_names(data) -> set[str]:
    """The names of the ``data.jsonl`` and ``data.hf`` tasks, as their readers give them,
    without reading a ``data.hf`` source (``datasets`` is not imported)."""
    from surecl.data.hf import _default_name
    from surecl.data.jsonl import _task_name, read_jsonl
    from surecl.sections import HFTaskConfig

    names = {_task_name(read_jsonl(p)[0], Path(p).expanduser()) for p in data.jsonl}
    for spec in data.hf:
        spec = HFTaskConfig(path=spec) if isinstance(spec, str) else spec
        names.add(spec.task or _default_name(spec))
    return {unicodedata.normalize("NFC", n) for n in names}  # as Task names them


def load_stream(cfg: RunConfig, cache_dir: Path | None = None) -> list[Task]:
    """The config's stream, sampled: the benchmark's tasks, then the ``data.jsonl`` and
    ``data.hf`` tasks; ``data.tasks`` chooses and orders them all alike (the benchmark reads
    the names that are not the user's own tasks, and none where it names only those)."""
    data = cfg.data
    check_order(data)
    own = _own_tasks(data)
    owned = {t.name for t in own}
    picked = [n for n in data.tasks if n not in owned]  # the benchmark's share of data.tasks
    tasks = [] if data.tasks and not picked else _benchmark_tasks(data, picked, cache_dir)
    if data.kind == "text":
        tasks = [t.as_text() for t in tasks]
    tasks += own
    if not tasks:
        raise SureclError("data: the stream has no tasks (set data.benchmark, data.jsonl or data.hf)")
    if data.tasks:
        both = [n for n in data.tasks if n in owned and n in _benchmark_names(data)]
        if both:  # which of the two would run?
            raise SureclError(f"data.tasks: {', '.join(both)} names a task of the benchmark and a data.jsonl / data.hf task; "
                              "give the file's task another name")
        # what data.allow_missing left out is named by missing_tasks_warning; the stream is data.tasks' order
        left_out = next((t.meta["order_missing"] for t in tasks if t.meta.get("order_missing")), [])
        # a name in neither is refused here for the tiny and the none streams, by the other benchmarks' readers
        source = "data.jsonl / data.hf" if data.benchmark == "none" else "the tiny benchmark" + (" or data.jsonl / data.hf" if own else "")
        tasks = _chosen(tasks, [n for n in data.tasks if n not in left_out], source)
        if left_out:  # every task the stream runs is one of the order's: missing_tasks_warning counts them
            for t in tasks:
                t.meta["order_missing"] = left_out
        unnamed = [t.name for t in own if t.name not in data.tasks]
        for t in tasks if unnamed else []:  # a file the user gave that does not run: unnamed_tasks_warning says so
            t.meta["unnamed_own"] = unnamed
    return sampled(tasks, cfg)


def _own_tasks(data) -> list[Task]:
    """The ``data.jsonl`` tasks, then the ``data.hf`` ones."""
    tasks = [load_jsonl_task(p, data.kind, data.invalid_labels) for p in data.jsonl]
    if data.hf:
        from surecl.data.hf import load_hf_task  # only now: it imports `datasets`
        from surecl.sections import HFTaskConfig

        for i, spec in enumerate(data.hf):
            spec = HFTaskConfig(path=spec) if isinstance(spec, str) else spec
            tasks.append(load_hf_task(spec, f"data.hf[{i}]", data.kind, data.invalid_labels))
    return tasks


def _benchmark_tasks(data, names: list[str], cache_dir: Path | None) -> list[Task]:
    """The benchmark's tasks: those of ``names`` (its share of ``data.tasks``) or, without,
    its order's. A name it lacks is refused, or with ``data.allow_missing`` in a folder left out
    and named (``order_missing``); the tiny benchmark's are chosen with the whole stream."""
    if data.benchmark == "tiny":
        return _tiny(data)
    if data.benchmark == "none":
        return []
    if data.benchmark == "instruct":
        from surecl.data.instruct import ensure_instruct_benchmark, load_instruct_stream

        return load_instruct_stream(ensure_instruct_benchmark(cache_dir), names)
    if data.benchmark == "embedded":
        from surecl.data.embedded import ensure_embedded_benchmark

        root = ensure_embedded_benchmark(cache_dir)
    else:
        root = Path(data.benchmark).expanduser()
    tasks = load_benchmark(root, data.order, names, data.allow_missing, data.invalid_labels)
    for t in tasks:  # a benchmark's train rows before sampling, for short_tasks_warning
        t.meta["benchmark_train_rows"] = len(t.train)
    return tasks


def _tiny(data) -> list[Task]:
    """The tiny benchmark's stream of the config's kind (generation tasks, or classification)."""
    return tiny_generation_stream() if data.kind == "generate" else tiny_stream()


def _benchmark_names(data) -> set[str]:
    """The names of the benchmark's tasks, without building or reading one (a missing folder: none)."""
    if data.benchmark == "tiny":
        return {t.name for t in _tiny(data)}
    if data.benchmark == "none":
        return set()
    if data.benchmark == "instruct":
        from surecl.data.instruct import INSTRUCT_ORDER

        return set(INSTRUCT_ORDER)
    if data.benchmark == "embedded":
        from surecl.data.embedded import EMBEDDED_ORDER

        return set(EMBEDDED_ORDER)
    root = Path(data.benchmark).expanduser()
    return set(index_tasks(root)) if root.is_dir() else set()


def missing_tasks_warning(tasks: list[Task], order: str) -> str | None:
    """The tasks the order names that the benchmark folder lacks, which ``data.allow_missing``
    left out (the stream is not the order's: a report names it beside the order), or None."""
    missing = next((t.meta["order_missing"] for t in tasks if t.meta.get("order_missing")), None)
    if not missing:
        return None
    kept = sum(1 for t in tasks if "order_missing" in t.meta)
    return (f"order {order}: the benchmark folder lacks {', '.join(missing)}; the stream runs {kept} of its "
            f"{kept + len(missing)} tasks (data.allow_missing), which is not the order's stream")


def unnamed_tasks_warning(tasks: list[Task]) -> str | None:
    """The ``data.jsonl`` / ``data.hf`` tasks that ``data.tasks`` leaves out (it chooses the
    stream's tasks, the user's own among them), which therefore do not run, or None."""
    unnamed = next((t.meta["unnamed_own"] for t in tasks if t.meta.get("unnamed_own")), None)
    if not unnamed:
        return None
    return (f"data.tasks leaves out the data.jsonl / data.hf task(s) {', '.join(unnamed)}: they do not run "
            "(name them in data.tasks, in the place they train, to run them)")


def short_tasks_warning(tasks: list[Task], n_train: int) -> str | None:
    """A benchmark folder's tasks with fewer train rows than ``data.n_train`` asks, which are
    taken whole (O-LoRA's CL_Benchmark: CB 250, COPA 400 where ``lnt`` asks 1,000; agnews 4,000
    where ``standard-cl`` asks 5,000): the run's steps and a fractional buffer come out smaller
    than the protocol's sizes say. None when there is none."""
    short = [f"{t.name} {t.meta['benchmark_train_rows']}" for t in tasks if 0 < t.meta.get("benchmark_train_rows", n_train) < n_train]
    if not short:
        return None
    return (f"data.n_train={n_train}: {'these tasks hold' if len(short) > 1 else 'this task holds'} fewer train rows, taken whole: "
            f"{', '.join(short)} (the run's steps and a fractional buffer follow the rows taken)")


def _chosen(tasks: list[Task], names: list[str], source: str) -> list[Task]:
    """``names`` of ``tasks``, in that order (``data.tasks``); a name not among them, or held by
    two of them, is one line."""
    twice = sorted({t.name for t in tasks if t.name in names and sum(u.name == t.name for u in tasks) > 1})
    if twice:
        raise SureclError(f"task named twice in the stream: {', '.join(twice)}")
    by_name = {t.name: t for t in tasks}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SureclError(f"data.tasks: {source} has no task {', '.join(unknown)} (it has {', '.join(by_name)})")
    return [by_name[n] for n in names]


def caller_stream(tasks: list[Task], cfg: RunConfig) -> list[Task]:
    """Tasks the caller built (``ContinualRun(..., tasks=)``), chosen and ordered by
    ``data.tasks`` where it is set, checked like loaded ones and sampled by the config
    (``data.n_train`` / ``n_test``, 0 = all; ``data.*_sampling``). ``data.jsonl`` / ``data.hf``
    set too are refused: the run reads the tasks passed in, never those files."""
    files = [k for k, v in (("data.jsonl", cfg.data.jsonl), ("data.hf", cfg.data.hf)) if v]
    if files:
        raise SureclError(f"tasks: {' and '.join(files)} {'is' if len(files) == 1 else 'are'} set too, and a run given tasks= reads only "
                          "those: add their tasks to tasks= (surecl.data.jsonl.load_jsonl_task, Task.from_hf) or leave tasks= out")
    tasks = caller_tasks(tasks, cfg)
    if not tasks:
        raise SureclError("tasks: the stream has no tasks")
    names = [t.name for t in tasks]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SureclError(f"tasks: task named twice in the stream: {', '.join(twice)} (give each its own name, for a dataset with "
                          "Task.from_hf(dataset, name=...))")
    if cfg.data.tasks:
        tasks = _chosen(tasks, cfg.data.tasks, "tasks=")
    for t in tasks:  # fields assigned after construction (a Task is mutable), before the copy reads them
        t._check_types("tasks: ")
    # the caller's Task objects stay as given: checking with data.invalid_labels=drop removes
    # rows from (and marks) the copies the run reads
    tasks = [dataclasses.replace(t, labels=list(t.labels), train=list(t.train), test=list(t.test), meta=dict(t.meta)) for t in tasks]
    text = [t.name for t in tasks if t.kind == "text"]
    if text and cfg.data.kind != "text":  # scored by perplexity (lower is better) among scores where higher is better
        raise SureclError(f"tasks: {', '.join(text)} {'is a text task' if len(text) == 1 else 'are text tasks'} (scored by "
                          f"perplexity) in a data.kind={cfg.data.kind} stream; run text tasks as a data.kind=text stream "
                          "(--config cpt), where every task is scored by perplexity")
    tasks = [t.as_text() if cfg.data.kind == "text" and t.kind != "text" else t for t in tasks]
    for t in tasks:
        t.check("tasks", cfg.data.invalid_labels)
    return sampled(list(tasks), cfg)


def caller_tasks(tasks, cfg: RunConfig) -> list[Task]:
    """``tasks=`` as a list of :class:`Task`: each ``datasets.Dataset`` / ``DatasetDict`` in it
    read by :func:`in_memory_task`; anything else is one line."""
    if not isinstance(tasks, (list, tuple)):
        raise SureclError("tasks: expected a list of surecl.data.task.Task (or datasets.Dataset / DatasetDict)")
    tasks = [in_memory_task(t, i, cfg) if _is_dataset(t) else t for i, t in enumerate(tasks)]
    if not all(isinstance(t, Task) for t in tasks):
        raise SureclError("tasks: expected a list of surecl.data.task.Task (or datasets.Dataset / DatasetDict)")
    return tasks


def _is_dataset(obj) -> bool:
    """A ``datasets.Dataset`` or ``DatasetDict`` (without importing ``datasets`` when none is given)."""
    return type(obj).__module__.startswith("datasets.") and type(obj).__name__ in ("Dataset", "DatasetDict")


def in_memory_task(dataset, index: int, cfg: RunConfig) -> Task:
    """The ``index``-th entry of ``tasks=`` given as a ``datasets.Dataset`` / ``DatasetDict``:
    :meth:`Task.from_hf` with the default columns (``text``, ``label``) and splits (``train``,
    ``test``; a lone ``Dataset`` is refused there: hold out a test split with ``Task.from_hf``),
    named by its ``info.dataset_name`` (with ``-<config_name>`` for a subset, ``glue-sst2``, as
    ``data.hf`` names it) where that is a valid task name and not the name of a
    ``datasets`` file reader (``load_dataset("csv", ...)`` names every such dataset ``csv``),
    else ``task<index>``."""
    first = next(iter(dataset.values()), None) if type(dataset).__name__ == "DatasetDict" else dataset
    info = getattr(first, "info", None)
    name = str(getattr(info, "dataset_name", None) or "")
    config = str(getattr(info, "config_name", None) or "")
    if name and config and config != "default":  # a hub dataset's subset (glue's sst2, cola): named as data.hf names it
        name = f"{name}-{config}"
    from surecl.data.task import _SAFE_NAME

    if not _SAFE_NAME.match(name) or ".." in name or name in _readers():
        name = f"task{index}"
    return Task.from_hf(dataset, name, kind=cfg.data.kind, invalid_labels=cfg.data.invalid_labels)


def _readers() -> set[str]:
    """The names of ``datasets``' packaged file readers (``csv``, ``json``, ``parquet``, ...)."""
    names = {"arrow", "csv", "json", "pandas", "parquet", "text", "imagefolder", "audiofolder", "videofolder", "webdataset", "xml", "sql"}
    try:
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

        names |= set(_PACKAGED_DATASETS_MODULES)
    except ImportError:  # a private name: the fixed list stands in
        pass
    return names


def sampled(tasks: list[Task], cfg: RunConfig) -> list[Task]:
    """The stream subsampled as the config says (``data.n_train`` / ``n_test``, ``data.*_sampling``, seed)."""
    data = cfg.data
    key = ""
    if data.draw in ("order", "run"):  # an independent draw per (order, seed): the stream's task list is the order
        key = "order=" + ",".join(t.name for t in tasks)
    return prepare_stream(tasks, data.n_train, data.n_test, data.train_sampling == "balanced", cfg.seed,
                          test_balanced=data.test_sampling == "balanced", draw_key=key, own_test=data.test_draw == "own")


def streams_seed(cfg: RunConfig, task_names: list[str]) -> int:
    """The seed of a run's own random streams (the LoRA initialisation and dropout masks, the
    batch order, the replay draws): ``seed``, or with ``data.draw=run`` a number drawn from
    (seed, the stream's task order), so that the orders of one seed are independent runs."""
    if cfg.data.draw != "run":
        return cfg.seed
    digest = hashlib.sha256(f"{cfg.seed}:order={','.join(task_names)}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF
