"""Continual-learning methods (one file each), found by name through :mod:`surecl.registry`;
see :mod:`surecl.methods.base`."""

from surecl.methods.base import Method, Stage

__all__ = ["Method", "Stage"]
