"""Registries of methods (``method=NAME``) and replay policies (``replay.policy=NAME``).

Built-ins are named here by import path and imported on first use, so listing names (config
validation, ``surecl list``, ``--help``) costs no torch import. Code outside the package adds
its own with :func:`register_method` / :func:`register_policy` (the pattern of PEFT's
``register_peft_method``); the registries are process-local::

    import surecl

    class Frozen(surecl.Method):
        ...

    surecl.register_method("frozen", Frozen)
    surecl.run(surecl.build_config("tiny,seq_lora", ["method=frozen"]), "runs/frozen")

A method class is built as ``cls(cls.config_from(run_config))`` and a policy class as
``cls(run_config.replay, capacity, seed)`` (see :mod:`surecl.plugins.base`,
:class:`surecl.methods.Method` and :class:`surecl.replay.policies.ReplayPolicy`).
"""

from __future__ import annotations

import importlib
import re

_METHODS: dict[str, type | str] = {
    "sequential": "surecl.methods.sequential:Sequential",
    "mtl": "surecl.methods.mtl:MultiTask",
    "per_task": "surecl.methods.per_task:PerTask",
    "ewc": "surecl.methods.ewc:EWC",
    "seq_ft": "surecl.methods.seq_ft:SeqFT",
    "olora": "surecl.methods.olora:OLoRA",
    "nlora": "surecl.methods.olora:NLoRA",
    "progressive_prompts": "surecl.methods.progressive_prompts:ProgressivePrompts",
}
_POLICIES: dict[str, type | str] = {
    "none": "surecl.replay.policies:NoReplay",
    "reservoir": "surecl.replay.policies:ReservoirPolicy",
    "random": "surecl.replay.policies:RandomPolicy",
    "surprise": "surecl.plugins.sure:SurprisePolicy",
    "online_surprise": "surecl.plugins.sure:OnlineSurprisePolicy",
}
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]*$")


def _resolve(table: dict[str, type | str], name: str) -> type:
    entry = table[name]
    if isinstance(entry, str):
        module, attr = entry.split(":")
        entry = table[name] = getattr(importlib.import_module(module), attr)
    return entry


def _register(table: dict, kind: str, base: type, name: str, cls: type, replace: bool) -> type:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{kind} name {name!r}: use letters, digits, '_' or '-', starting with a letter")
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{kind} {name!r}: {cls!r} is not a subclass of {base.__module__}.{base.__qualname__}")
    if name in table and not replace and _resolve(table, name) is not cls:
        raise ValueError(f"{kind} {name!r} is already registered (pass replace=True to replace it)")
    table[name] = cls
    return cls


def register_method(name: str, cls: type, *, replace: bool = False) -> type:
    """Make ``method=name`` run ``cls`` (a :class:`surecl.methods.Method` subclass)."""
    from surecl.methods.base import Method

    return _register(_METHODS, "method", Method, name, cls, replace)


def register_policy(name: str, cls: type, *, replace: bool = False) -> type:
    """Make ``replay.policy=name`` select with ``cls`` (a :class:`surecl.replay.policies.ReplayPolicy` subclass)."""
    from surecl.replay.policies import ReplayPolicy

    return _register(_POLICIES, "replay policy", ReplayPolicy, name, cls, replace)


def unregister_method(name: str) -> None:
    _METHODS.pop(name, None)


def unregister_policy(name: str) -> None:
    _POLICIES.pop(name, None)


def method_names() -> list[str]:
    """Registered method names, built-ins first, in registration order."""
    return list(_METHODS)


def policy_names() -> list[str]:
    """Registered replay policy names, built-ins first, in registration order."""
    return list(_POLICIES)


def method_class(name: str) -> type:
    return _resolve(_METHODS, name)


def policy_class(name: str) -> type:
    return _resolve(_POLICIES, name)
