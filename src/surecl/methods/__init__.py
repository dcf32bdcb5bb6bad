"""Registry of continual-learning methods (one file each); see :mod:`surecl.methods.base`."""

from surecl.methods.base import Method, Stage
from surecl.methods.ewc import EWC
from surecl.methods.mtl import MultiTask
from surecl.methods.per_task import PerTask
from surecl.methods.sequential import Sequential

METHODS: dict[str, type[Method]] = {m.name: m for m in (Sequential, MultiTask, PerTask, EWC)}

__all__ = ["METHODS", "Method", "Stage"]
