"""Shared set-up for the benchmarks: the embedded model and real prompts, timing helpers, and
``script``, which ends a script on surecl's one-line errors as ``surecl`` does."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import torch

from surecl.config import ModelConfig
from surecl.data.cl_benchmark import load_benchmark
from surecl.data.embedded import ensure_embedded_benchmark
from surecl.data.encode import TaskEncoder
from surecl.data.task import prepare_stream
from surecl.errors import SureclError
from surecl.model import load_model


def script(main: Callable[[], int | None]) -> NoReturn:
    """Run a script's ``main`` and exit with its code; a SureclError (the embedded benchmark
    that cannot be built offline, a model that does not load) is one line, ``<script>: error:
    <message>``, and exit 2, as ``surecl`` says it, not a traceback."""
    try:
        code = main()
    except SureclError as exc:
        print(f"{Path(sys.argv[0]).name}: error: {' '.join(str(exc).splitlines())}", file=sys.stderr)
        code = 2
    sys.exit(code)


def load(dtype: str):
    return load_model(ModelConfig(dtype=dtype), torch.device("cpu"))


def real_items(tokenizer, n: int, max_length: int = 128):
    """``n`` encoded training examples from the embedded benchmark (mixed tasks and lengths)."""
    tasks = prepare_stream(load_benchmark(ensure_embedded_benchmark(quiet=True)), n // 4 + 1, 1, True, 0)
    enc = TaskEncoder(tokenizer, max_length)
    items = [e for t in tasks for e in enc.encode(t, t.train)]
    return items[:n]


def real_items_by_task(tokenizer, n: int, max_length: int = 128):
    """``n`` encoded training examples of each embedded task, one list per task."""
    tasks = prepare_stream(load_benchmark(ensure_embedded_benchmark(quiet=True)), n, 1, True, 0)
    enc = TaskEncoder(tokenizer, max_length)
    return [enc.encode(t, t.train) for t in tasks]


def median_time(fn, repeats: int = 3, warmup: int = 0) -> float:
    return interleaved_medians([fn], repeats, warmup)[0]


def interleaved_medians(fns: list, repeats: int = 3, warmup: int = 1) -> list[float]:
    """Median seconds of each of ``fns``, run in rounds (each once per round, in turn), so a
    drift of the machine's speed during the run reaches every one of them alike."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def matmul_rate(dtype: torch.dtype, n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of a square matmul in ``dtype`` on this machine, measured now."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    t = median_time(lambda: a @ b, repeats)
    return 2 * n**3 / t


def n_matmul_params(model) -> int:
    """Parameters taking part in per-token matmuls (embedding lookups excluded)."""
    emb = model.get_input_embeddings().weight
    return sum(p.numel() for p in model.parameters() if p.dim() == 2 and p is not emb)


def at_least(low: int, refusal: str):
    """An argparse type: a whole number of at least ``low``, else one line, ``refusal`` with the
    text given in place of ``{text}`` (a count past a script's meaning, such as 0 examples,
    which surecl reads as every row, fails only after the models load, or runs for hours)."""

    def whole(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(refusal.format(text=text))
        return n

    return whole
