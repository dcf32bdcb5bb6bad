"""Options of a method or replay policy: the base class of a section of the config tree that
a registered plugin owns (``olora.lambda_orth``, ``prompts.length``, ``ewc.lam``, or an outside
method's ``l2_prev.lam``).

A method package declares its options as a dataclass deriving :class:`Options` (defaults and
checks in one place, as PEFT's per-method config classes do) and registers it with the method
(:class:`surecl.registry.MethodSpec`, or ``surecl.register_method(name, cls, config=...)``).
:class:`surecl.config.RunConfig` then carries one instance per registered section: YAML
presets, ``key.sub=value`` overrides and saved configs reach it like any core key; its
``choices`` and ``check`` run in config validation, so a bad value stops with one line naming
the key before anything loads.

The bottom layer: imports nothing of surecl but its error type, and no torch.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
import unicodedata
from dataclasses import dataclass
from typing import Any, ClassVar

from surecl.errors import SureclError


@dataclass
class Options:
    """Base of a plugin's option section. Subclass it as a ``@dataclass`` with defaults."""

    choices: ClassVar[dict[str, tuple[str, ...]]] = {}
    """Allowed values of string options: ``{"orth_norm": ("fro2", "l1")}``."""

    def check(self, section: str) -> None:
        """Raise a one-line :class:`SureclError` naming ``<section>.<key>`` for a bad value.
        The default checks ``choices`` (config validation has already checked that every number
        of the tree, the sections' included, is finite); override (and call
        ``super().check(section)``) for ranges and combinations."""
        for key, allowed in self.choices.items():
            value = getattr(self, key)
            if value not in allowed:
                raise SureclError(f"{section}.{key}: {value!r} is not one of {', '.join(allowed)}")

    @classmethod
    def unsupported_fields(cls) -> list[tuple[str, Any]]:
        """The fields whose type config files and ``key=value`` overrides cannot give (``(name,
        type)``): an option is a bool, int, float or str, a list of one of them, or a union of
        those with None (``int | None``). Registration refuses a class with any."""
        hints = typing.get_type_hints(cls)
        return [(f.name, hints[f.name]) for f in dataclasses.fields(cls) if not option_type(hints[f.name])]

    @staticmethod
    def require(ok: bool, key: str, value: Any, why: str) -> None:
        """``raise SureclError("<key>: <value> <why>")`` unless ``ok``."""
        if not ok:
            raise SureclError(f"{key}: {value!r} {why}")


SCALARS = (bool, int, float, str)


def option_type(typ: Any) -> bool:
    """Whether config files and overrides can give a value of ``typ`` (:meth:`Options.unsupported_fields`)."""
    origin = typing.get_origin(typ)
    if origin is list:
        args = typing.get_args(typ)
        return len(args) == 1 and args[0] in SCALARS
    if origin in (typing.Union, types.UnionType):
        return all(t in SCALARS or t is type(None) for t in typing.get_args(typ))
    return typ in SCALARS


def per_task_values(entries: list[str], key: str, n: int) -> dict[str, tuple[float, ...]]:
    """``"<task>:<v1>[:<v2>...]"`` entries (``n`` numbers each, finite, >= 0) as {task: values}."""
    out: dict[str, tuple[float, ...]] = {}
    for entry in entries:
        name, _, rest = str(entry).partition(":")
        name = unicodedata.normalize("NFC", name)  # as task names are read (surecl.data.task.Task)
        parts = rest.split(":") if rest else []
        try:
            values = tuple(float(v) for v in parts)
        except ValueError:
            values = ()
        if not name.strip() or len(values) != n or not all(math.isfinite(v) and v >= 0 for v in values):
            shape = ":".join(["<task>"] + [f"<v{i + 1}>"[:4] if n > 1 else "<value>" for i in range(n)])
            raise SureclError(f"{key}: {str(entry)[:60]!r} must be {shape} with {n} number(s) >= 0")
        if name.strip() in out:
            raise SureclError(f"{key}: task {name.strip()!r} named twice")
        out[name.strip()] = values
    return out
