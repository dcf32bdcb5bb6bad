"""Registries of methods (``method=NAME``) and replay policies (``replay.policy=NAME``), each
entry carrying its class and its options (the pattern of PEFT's ``register_peft_method(name=,
config_cls=, model_cls=)``).

Where entries come from, in this order:

* **Built-ins**: each package under :mod:`surecl.methods` declares ``METHODS``, a tuple of
  :class:`MethodSpec`; :mod:`surecl.replay.builtin` lists ``POLICIES``. A spec names its class by
  import path, so listing names and building a config (which needs the options classes,
  torch-free) imports no torch.
* **Installed packages**: entry points in the groups ``surecl.methods`` and
  ``surecl.policies`` (``[project.entry-points."surecl.methods"] l2_prev =
  "mypkg.l2prev:SPEC"``), each pointing at a spec or at the class itself (its ``Config``, when
  that is an :class:`~surecl.options.Options` dataclass, becomes the section named like the
  entry). The CLI finds them with no flag.
* **Code**: :func:`register_method` / :func:`register_policy` (process-local), e.g. in a module
  the CLI loads with ``surecl --import mymodule run ...``.

Both registries load together, once per process (:func:`_load_all`): every built-in first, then
every entry point, and a ``register_*`` call made meanwhile (a package's module registering its
own plugins as an entry point imports it) adds its entry without loading anything again, so no
entry point is read from a half-imported module. An entry point that fails to load is warned
about and left out (other runs go on), unless its name got registered anyway (by its own
module's import, say); one whose module was still being imported (``--import`` of a module that
is also installed) is settled at the next look-up, when the module is complete. A
``"module:Class"`` string is checked when registered and imported on first use; an import that
fails or a class of the wrong kind is a one-line :class:`~surecl.errors.SureclError` naming the
entry, the string and the cause.

Registration refuses, in one line (``TypeError`` / ``ValueError``; an entry point's is a warning,
and the entry is left out), what would otherwise fail every run later: a method named like a
packaged preset (``--config NAME`` would run the preset), a section named like a core key of the
config, options that are not an ``@dataclass`` of their own or whose defaults do not build or
pass their own ``check``, a method's declarations out of range (``trains``, ``answers``,
``state``, ``exports``) and a policy whose ``Config`` is not its view of ``replay.*``.

A method's options live in the config section its spec names (default: the method's name), so
``l2_prev.lam=0.1`` works on the command line, in presets and in sweeps for an outside method
as for ``olora.lambda_orth``. A method class is built as ``cls(method_config(cfg, name))`` and a
policy class as ``cls(run_config.replay, capacity, seed)``, its own section (if any) set as
``policy.options`` before its ``__init__`` runs.

The bottom layer: imports nothing of surecl but its error and options types; it finds the
built-ins by scanning the :mod:`surecl.methods` package, never by naming a module.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import pkgutil
import re
import sys
import typing
from dataclasses import dataclass
from typing import Any

from surecl.errors import SureclError
from surecl.options import Options

log = logging.getLogger("surecl")


@dataclass(frozen=True)
class MethodSpec:
    """A method as registered: its name, its class (or ``"module:Class"``, imported on first
    use), its options dataclass (an :class:`~surecl.options.Options` subclass; None: no
    options) and the config section they live in (default: the name)."""

    name: str
    cls: type | str
    config: type | None = None
    section: str = ""

    @property
    def key(self) -> str:
        return self.section or self.name


@dataclass(frozen=True)
class PolicySpec(MethodSpec):
    """A replay policy as registered (same fields as :class:`MethodSpec`)."""


_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]*$")
_DOTTED = r"(?!\d)\w+(?:\.(?!\d)\w+)*"
_IMPORT_PATH = re.compile(rf"^{_DOTTED}:{_DOTTED}$")
"""A lazy class reference: ``package.module:Class`` (the attribute may be dotted: ``Outer.Inner``)."""
_SECTION = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_BASES = {"method": ("surecl.methods.base", "Method"), "replay policy": ("surecl.replay.policies", "ReplayPolicy")}
_GROUPS = {"method": "surecl.methods", "replay policy": "surecl.policies"}
CORE_KEYS = ("method", "preset", "seed", "model", "data", "lora", "replay", "dual", "train", "eval", "log_every", "options")
"""The top-level keys of the run config that surecl itself owns (:class:`surecl.config.RunConfig`'s
fields): no registered section may take one."""


class _Table:
    def __init__(self, kind: str, spec_type: type) -> None:
        self.kind, self.spec_type = kind, spec_type
        self.specs: dict[str, MethodSpec] = {}
        self.classes: dict[str, type] = {}
        self.loaded = False
        self.builtin: set[str] = set()
        """The names the package itself registers (a built-in method may share its name with
        its own preset)."""
        self.pending: dict[str, tuple[Any, Exception, bool]] = {}
        """Entry points that failed to load, by name: (entry point, its error, whether its
        module was being imported then), settled by :meth:`settle`."""

    def load(self) -> None:
        """Built-ins, then installed entry points (once per process, both registries together:
        :func:`_load_all`); then settle the entry points left pending."""
        if not (_METHODS.loaded and _POLICIES.loaded):
            _load_all()
        if self.pending and not _LOADING:
            self.settle()

    def load_entry_point(self, ep: Any) -> None:
        if ep.name in self.specs:
            return  # a built-in or an earlier registration wins
        try:
            self.load_entry_point_now(ep)
        except Exception as exc:  # a broken plugin package must not stop runs that do not use it
            self.pending[ep.name] = (ep, exc, _initializing(_ep_module(ep)))

    def settle(self) -> None:
        """Each entry point that failed to load: dropped in silence when its name got registered
        anyway (its module's own ``register_*`` call); kept for the next look-up while its module
        is still being imported; else tried again if it failed on a half-imported module, and
        warned about when it still fails."""
        for name in list(self.pending):
            if name not in self.pending:
                continue  # settled meanwhile (a module imported below looked a name up)
            ep, exc, partial = self.pending[name]
            if name in self.specs:
                del self.pending[name]
                continue
            if _initializing(_ep_module(ep)):
                continue
            del self.pending[name]
            if partial:  # it read a module that was half imported then: the module is complete now
                try:
                    self.load_entry_point_now(ep)
                    continue
                except Exception as again:  # noqa: BLE001 - as in load_entry_point
                    exc = again
            log.warning("surecl: %s %r from entry point %s could not be loaded: %s", self.kind, ep.name, ep.value, _one_line(exc))

    def load_entry_point_now(self, ep: Any) -> None:
        """``ep`` loaded and added, its failure raised."""
        obj = ep.load()
        spec = obj if isinstance(obj, MethodSpec) else _spec_from_class(self.spec_type, ep.name, obj)
        self.add(dataclasses.replace(spec, name=ep.name) if spec.name != ep.name else spec, replace=False)

    def add(self, spec: MethodSpec, replace: bool, builtin: bool = False) -> type | str:
        name = spec.name
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"{self.kind} name {name!r}: use letters, digits, '_' or '-', starting with a letter")
        if self.kind == "method" and not builtin and name not in self.builtin and name in _preset_names():
            raise ValueError(f"method {name!r}: --config {name} and sweep --methods {name} run the packaged preset {name} "
                             f"(surecl/presets/{name}.yaml), not this method; register it under another name")
        if isinstance(spec.cls, str):
            if not _IMPORT_PATH.match(spec.cls):
                raise ValueError(f"{self.kind} {name!r}: class {spec.cls!r} is not a \"module:Class\" import path "
                                 f"(a module's dotted name, ':', then the class's name, e.g. \"my_cl.policies:Extreme\")")
        elif isinstance(spec.cls, type):
            _check_base(self.kind, name, spec.cls)
            _check_class(self.kind, name, spec.cls)
        else:
            raise TypeError(f"{self.kind} {name!r}: {spec.cls!r} is neither a class nor a \"module:Class\" import path")
        if spec.config is not None:
            if not (isinstance(spec.config, type) and issubclass(spec.config, Options) and _own_dataclass(spec.config)):
                raise TypeError(f"{self.kind} {name!r}: config {spec.config!r} is not an @dataclass subclass of surecl.options.Options")
            bad = spec.config.unsupported_fields()
            if bad:
                field, typ = bad[0]
                raise TypeError(f"{self.kind} {name!r}: option {spec.key}.{field} is a {typ}, which config files and overrides "
                                "cannot give: use bool, int, float or str, a list of one of them, or a union of those with None")
            if not _SECTION.match(spec.key):
                raise ValueError(f"{self.kind} {name!r}: section {spec.key!r}: use letters, digits or '_', starting with a letter")
            if spec.key in CORE_KEYS:
                raise ValueError(f"{self.kind} {name!r}: section {spec.key!r} is a key of surecl's own config; register the "
                                 "options under another section (section=...)")
            _check_defaults(self.kind, name, spec.config, spec.key)
            for other in _all_specs():
                if other.name != name and other.config is not None and other.key == spec.key and other.config is not spec.config:
                    raise ValueError(f"{self.kind} {name!r}: section {spec.key!r} already holds the options of {other.name!r}")
        if name in self.specs and not replace:
            old = self.specs[name]
            if _same_class(old.cls, spec.cls) and old.config is spec.config and old.key == spec.key:
                return spec.cls
            raise ValueError(f"{self.kind} {name!r} is already registered (pass replace=True to replace it)")
        if builtin:
            self.builtin.add(name)
        self.specs[name] = spec
        self.classes.pop(name, None)
        return spec.cls

    def resolve(self, name: str) -> type:
        self.load()
        if name not in self.specs:
            raise SureclError(f"unknown {self.kind} {name!r} (choose from {', '.join(sorted(self.specs))})")
        if name not in self.classes:
            target = self.specs[name].cls
            if isinstance(target, str):
                target = self.import_class(name, target)
            self.classes[name] = target
        return self.classes[name]

    def import_class(self, name: str, path: str) -> type:
        """The class a ``"module:Class"`` string names, checked as for a class registered directly;
        a failure is one line naming the entry, the string and the cause."""
        module, _, attr = path.partition(":")
        try:
            target: Any = importlib.import_module(module)
            for part in attr.split("."):
                target = getattr(target, part)
        except Exception as exc:  # the plugin's package: whatever its import raises is one line naming it
            raise SureclError(f"{self.kind} {name!r}: cannot import {path!r}: {type(exc).__name__}: {_one_line(exc)}") from exc
        try:
            _check_base(self.kind, name, target)
            _check_class(self.kind, name, target)
        except TypeError as exc:
            raise SureclError(f"{exc} (imported from {path!r})") from None
        return target


def _same_class(a: type | str, b: type | str) -> bool:
    return a is b or (isinstance(a, str) and isinstance(b, str) and a == b)


def _check_base(kind: str, name: str, cls: Any) -> None:
    """``cls`` derives the kind's base class, checked by name along its MRO (importing the base
    here would make this bottom layer depend on the plugin layer)."""
    module, qualname = _BASES[kind]
    if not (isinstance(cls, type) and any(c.__module__ == module and c.__qualname__ == qualname for c in cls.__mro__)):
        raise TypeError(f"{kind} {name!r}: {cls!r} is not a subclass of {module}.{qualname}")


def _check_class(kind: str, name: str, cls: type) -> None:
    """A method's declarations are among the known values (:func:`surecl.methods.base.check_declarations`);
    a policy's ``Config`` is its view of ``replay.*`` (built with ``from_replay``), not its options."""
    if kind == "method":
        module = sys.modules[_BASES[kind][0]]  # loaded: ``cls`` derives its Method
        try:
            module.check_declarations(cls, name)
        except SureclError as exc:
            raise TypeError(str(exc)) from None
        return
    config = getattr(cls, "Config", None)
    if not callable(getattr(config, "from_replay", None)):
        what = getattr(config, "__name__", repr(config))
        give = what if isinstance(config, type) and issubclass(config, Options) else "MyOptions"
        raise TypeError(f"replay policy {name!r}: its Config {what} is not a view of the replay section (a policy's Config is "
                        f"what it reads of replay.*, built with from_replay, as surecl.replay.policies.BufferConfig is); leave "
                        f"Config as inherited and give the policy's options with register_policy({name!r}, {cls.__name__}, "
                        f"config={give})")


def _own_dataclass(cls: type) -> bool:
    """Whether every class from ``cls`` up to :class:`~surecl.options.Options` that annotates
    fields is an ``@dataclass`` itself (a subclass without the decorator inherits the dataclass
    machinery, but its annotated options are no fields: no config could set them)."""
    for c in cls.__mro__:
        if c is Options:
            return True
        if "__dataclass_fields__" not in vars(c) and any(not _class_var(t) for t in inspect.get_annotations(c).values()):
            return False
    return True


def _class_var(annotation: Any) -> bool:
    """Whether an annotation (an object, or its text under ``from __future__ import annotations``) is a ``ClassVar``."""
    if isinstance(annotation, str):
        return annotation.replace("typing.", "").startswith("ClassVar")
    return annotation is typing.ClassVar or typing.get_origin(annotation) is typing.ClassVar


def _check_defaults(kind: str, name: str, config: type, section: str) -> None:
    """The options build from their defaults and pass their own ``check``: every config holds
    every registered section, so otherwise every run would fail, not only this plugin's."""
    try:
        defaults = config()
    except Exception as exc:  # the plugin's class: whatever building it raises is one line naming it
        raise TypeError(f"{kind} {name!r}: its options {config.__name__}() cannot be built from their defaults "
                        f"({type(exc).__name__}: {_one_line(exc)}); give every option a default") from None
    try:
        defaults.check(section)
    except Exception as exc:  # the plugin's check
        raise ValueError(f"{kind} {name!r}: the defaults of its options {config.__name__} fail their own check: "
                         f"{type(exc).__name__}: {_one_line(exc)}") from None


def _preset_names() -> set[str]:
    """The packaged presets' names (``surecl/presets/*.yaml``), which ``--config NAME`` reads first."""
    from importlib import resources

    return {p.name[: -len(".yaml")] for p in (resources.files("surecl") / "presets").iterdir() if p.name.endswith(".yaml")}


def _spec_from_class(spec_type: type, name: str, cls: type) -> MethodSpec:
    """The spec of a class alone: a method's options are its ``Config`` when that is an
    :class:`~surecl.options.Options`; a policy's ``Config`` is its view of ``replay.*``, so a
    policy takes options only as ``config=`` (or a :class:`PolicySpec`)."""
    config = getattr(cls, "Config", None)
    if spec_type is PolicySpec or not (isinstance(config, type) and issubclass(config, Options)):
        config = None
    return spec_type(name=name, cls=cls, config=config, section=getattr(cls, "section", "") or "")


def _builtin_specs(kind: str) -> list[MethodSpec]:
    if kind == "replay policy":
        return [PolicySpec(name, cls) for name, cls in importlib.import_module("surecl.replay.builtin").POLICIES]
    package = importlib.import_module("surecl.methods")
    specs: list[MethodSpec] = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.ispkg:
            specs.extend(getattr(importlib.import_module(f"{package.__name__}.{info.name}"), "METHODS", ()))
    return specs


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def _ep_module(ep: Any) -> str:
    return getattr(ep, "module", None) or str(ep.value).partition(":")[0].strip()


def _initializing(module: str) -> bool:
    """Whether ``module`` (or a package above it) is being imported right now: its top level
    has not finished, so a name it defines further down is not there yet."""
    parts = module.split(".")
    for k in range(1, len(parts) + 1):
        spec = getattr(sys.modules.get(".".join(parts[:k])), "__spec__", None)
        if getattr(spec, "_initializing", False):
            return True
    return False


def _load_all() -> None:
    """Both registries' built-ins, then both's entry points, then the failed ones settled. The
    tables count as loaded from the start, so a ``register_*`` call or a look-up made while an
    entry point's module is imported finds every built-in and starts no second load: nothing
    reads an entry point from a half-imported module that this load is importing."""
    global _LOADING
    tables = [t for t in (_METHODS, _POLICIES) if not t.loaded]
    for table in tables:
        table.loaded = True
    _LOADING = True
    try:
        for table in tables:
            for spec in _builtin_specs(table.kind):
                table.add(spec, replace=False, builtin=True)
        for table in tables:
            for ep in _entry_points(_GROUPS[table.kind]):
                table.load_entry_point(ep)
    finally:
        _LOADING = False
    for table in tables:
        table.settle()


def _entry_points(group: str) -> list:
    from importlib.metadata import entry_points

    try:
        return list(entry_points(group=group))
    except Exception:  # a damaged distribution's metadata
        return []


_LOADING = False
"""True while :func:`_load_all` runs: failed entry points are settled at its end, once every
entry point has had its chance to register the name."""
_METHODS = _Table("method", MethodSpec)
_POLICIES = _Table("replay policy", PolicySpec)


def _all_specs() -> list[MethodSpec]:
    return list(_METHODS.specs.values()) + list(_POLICIES.specs.values())


def _register(table: _Table, spec_type: type, name: str, cls: type, config: type | None, section: str | None, replace: bool) -> type:
    table.load()
    if not isinstance(cls, type):
        raise TypeError(f"{table.kind} {name!r}: {cls!r} is not a class")
    spec = _spec_from_class(spec_type, name, cls)
    if config is not None or section is not None:
        spec = spec_type(name=name, cls=cls, config=config if config is not None else spec.config, section=section or spec.section)
    table.add(spec, replace)
    return cls


def register_method(name: str, cls: type, *, config: type | None = None, section: str | None = None, replace: bool = False) -> type:
    """Make ``method=name`` run ``cls`` (a :class:`surecl.methods.Method` subclass). Its options
    are ``config`` (default: ``cls.Config`` when that is an :class:`~surecl.options.Options`
    dataclass), set as ``<section>.<key>=value`` (default section: ``name``)."""
    return _register(_METHODS, MethodSpec, name, cls, config, section, replace)


def register_policy(name: str, cls: type, *, config: type | None = None, section: str | None = None, replace: bool = False) -> type:
    """Make ``replay.policy=name`` select with ``cls`` (a :class:`surecl.replay.policies.ReplayPolicy`
    subclass). Its options are ``config`` alone (``cls.Config`` is the policy's view of ``replay.*``),
    set as ``<section>.<key>=value`` (default section: ``name``) and handed to the policy as
    ``self.options``, already set when its ``__init__`` runs."""
    return _register(_POLICIES, PolicySpec, name, cls, config, section, replace)


def unregister_method(name: str) -> None:
    _METHODS.specs.pop(name, None)
    _METHODS.classes.pop(name, None)


def unregister_policy(name: str) -> None:
    _POLICIES.specs.pop(name, None)
    _POLICIES.classes.pop(name, None)


def method_names() -> list[str]:
    """Registered method names: built-ins, installed entry points, then registrations."""
    _METHODS.load()
    return list(_METHODS.specs)


def policy_names() -> list[str]:
    _POLICIES.load()
    return list(_POLICIES.specs)


def method_spec(name: str) -> MethodSpec:
    _METHODS.load()
    if name not in _METHODS.specs:
        raise SureclError(f"method: unknown method {name!r} (choose from {', '.join(sorted(_METHODS.specs))})")
    return _METHODS.specs[name]


def policy_spec(name: str) -> MethodSpec:
    _POLICIES.load()
    if name not in _POLICIES.specs:
        raise SureclError(f"replay.policy: unknown replay policy {name!r} (choose from {', '.join(sorted(_POLICIES.specs))})")
    return _POLICIES.specs[name]


def method_class(name: str) -> type:
    return _METHODS.resolve(name)


def policy_class(name: str) -> type:
    return _POLICIES.resolve(name)


def sections() -> dict[str, tuple[type, tuple[str, ...]]]:
    """Every registered option section: ``{section: (options class, names of the methods and
    policies that read it)}``, in registration order."""
    _METHODS.load()
    _POLICIES.load()
    out: dict[str, tuple[type, tuple[str, ...]]] = {}
    for spec in _all_specs():
        if spec.config is not None:
            cls, readers = out.get(spec.key, (spec.config, ()))
            out[spec.key] = (cls, readers + (spec.name,))
    return out


def method_config(cfg: Any, name: str | None = None) -> Any:
    """The options a method is built with: its section of ``cfg`` (a copy), or, for a method
    without a registered section, ``cls.config_from(cfg)`` (built-ins that view core keys)."""
    name = name or cfg.method
    spec = method_spec(name)
    if spec.config is not None:
        return dataclasses.replace(cfg.options[spec.key])
    return method_class(name).config_from(cfg)


def policy_options(cfg: Any, name: str | None = None) -> Any:
    """A policy's own section of ``cfg`` (a copy), or None when it has none."""
    spec = policy_spec(name or cfg.replay.policy)
    return dataclasses.replace(cfg.options[spec.key]) if spec.config is not None else None


def lazy_attributes(package: str, module: str):
    """A PEP 562 ``__getattr__`` for a method package: the names of ``module`` (its ``method.py``,
    which needs torch) imported on first use, so the package itself stays light."""

    def __getattr__(name: str) -> Any:
        try:
            return getattr(importlib.import_module(module), name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__


def import_modules(modules: list[str]) -> None:
    """Import each module (``--import``), whose top level registers methods or policies; an
    unimportable one is a one-line error, its cause chained (``--debug`` shows the module's traceback)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # the user's module: any failure is one line naming it
            raise SureclError(f"--import {module}: {type(exc).__name__}: {str(exc)[:200]}") from exc  # --debug: its traceback
