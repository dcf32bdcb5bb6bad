"""Task streams: the task type (``task.py``), the readers (O-LoRA's CL_Benchmark, JSONL, Hugging
Face ``datasets``, the embedded and tiny streams), encoding and loading.

``Task.from_hf`` (a task from an in-memory ``datasets`` object, read as a ``data.hf`` entry is) is
the reader :func:`surecl.data.hf.task_from_hf`, attached here: ``task.py`` stays below the
readers, which build on it."""

from surecl.data.hf import task_from_hf
from surecl.data.task import Task

Task.from_hf = classmethod(task_from_hf)
