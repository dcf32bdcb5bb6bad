"""Atomic, pickle-free persistence: JSON for metadata, safetensors for tensors.

Every file is written to a temporary name in the same folder and renamed into place, so a
crash leaves either the old file or the new one. A checkpoint is a folder
``checkpoints/stage-NNNN`` holding ``tensors.safetensors`` and ``meta.json``; ``meta.json``
is written last and records the tensor file's SHA-256, so a partial or corrupt checkpoint is
detected and the previous good one is used instead.

This module knows no component: a checkpoint is assembled from the ``state_dict()`` of each
(the run's progress, the RNG states, the optimizer, the adapters, the method, the replay
policy, the step log, any extra plugin), each under its own key, and handed back the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from surecl.plugins.faults import fault_point

try:
    import fcntl
except ImportError:  # not POSIX: run folders are not locked
    fcntl = None

FORMAT = 2
"""2: each component's state under its own key (``components`` in meta.json, ``<key>/``
tensors). Format 1 checkpoints (one layout for the whole run) are still read."""


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json(path: Path, obj: Any) -> None:
    _atomic_write_bytes(Path(path), (json.dumps(obj, indent=2, allow_nan=False) + "\n").encode("utf-8"))


def write_text(path: Path, text: str) -> None:
    _atomic_write_bytes(Path(path), text.encode("utf-8"))


def write_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """One safetensors file, written atomically (tensors contiguous, on the CPU)."""
    from safetensors.torch import save

    data = save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, metadata=metadata)
    _atomic_write_bytes(Path(path), data)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_adapter(adapters, folder: Path, name: str, base_model: str | None = None, card: str | None = None) -> None:
    """PEFT-format adapter folder ``folder/name``, replaced atomically; ``base_model`` replaces
    the ``base_model_name_or_path`` PEFT records (the folder the base was loaded from) and
    ``card`` is written as the folder's ``README.md``."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=folder))
    try:
        adapters.save_pretrained(tmp, name)
        written = tmp / name if (tmp / name).is_dir() else tmp
        if base_model is not None:
            config_path = written / "adapter_config.json"
            config = json.loads(config_path.read_text(encoding="utf-8"))
            config["base_model_name_or_path"] = base_model
            config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if card is not None:
            (written / "README.md").write_text(card, encoding="utf-8")
        target = folder / name
        old = None
        if target.exists():
            old = folder / f".{name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
        os.replace(written, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def save_model(model, tokenizer, folder: Path, state_dict: dict[str, torch.Tensor], card: str) -> None:
    """A whole model as a transformers folder (``config.json``, ``model.safetensors``, the
    tokenizer, ``card`` as ``README.md``), loadable with ``AutoModel*.from_pretrained(folder)``,
    replaced atomically: built beside ``folder`` under a ``.``-prefixed temporary name and
    swapped in. ``model`` gives the config; ``state_dict`` the weights, under transformers'
    names (tied weights once: transformers ties them again on load)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    old = folder.parent / f".{folder.name}.old"
    try:
        model.save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        if folder.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(folder, old)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------- a run directory

RUN_FILES = ("config.yaml", "results.json", "buffer.json", "log.jsonl", "report.md", "heatmap.png")
"""The files ``surecl run`` writes at the top of its output directory."""
RUN_DIRS = {
    "checkpoints": ("stage-",),
    "adapters": ("fast", "slow", "prompts"),
    "tensorboard": ("surecl",),
    "model": ("config.json", "generation_config.json", "model", "tokenizer", "special_tokens_map.json", "chat_template", "README.md"),
}
"""The folders it writes there, and what it names inside them (atomic writes add ``.``-prefixed
temporaries of those names; ``model`` is a full fine-tuned model's transformers folder,
written whole, whose temporaries sit beside it as ``.model.*``)."""


LOCK = ".surecl-lock"
"""The lock file of a run folder (:func:`run_lock`): a running process holds an exclusive
``flock`` on it and writes its host and pid into it."""


def lock_holder(out: Path) -> str | None:
    """Who holds ``out``'s run lock now ("another surecl process (host H, pid P)"), or None:
    no lock file, or nobody holds it (a finished run, or a killed one: the kernel releases a
    dead process's ``flock``). Takes and drops the lock to find out; holds nothing after."""
    path = Path(out) / LOCK
    if fcntl is None or not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        return _try_lock(fd)
    finally:
        os.close(fd)  # closing the descriptor releases a lock taken here


def _try_lock(fd: int) -> str | None:
    """Take the exclusive ``flock`` on ``fd`` without waiting: None when taken, else who holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass
    else:
        return None
    try:
        holder = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        return f"another surecl process (host {holder['host']}, pid {holder['pid']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another surecl process"  # it holds the lock and has not written its name yet


@contextlib.contextmanager
def run_lock(out: Path, enabled: bool = True, agree: Callable[[str | None], str | None] | None = None) -> Iterator[None]:
    """Hold ``out/.surecl-lock`` while a run writes ``out``, so two processes never write one run
    folder: a second ``surecl run`` there stops with :class:`~surecl.errors.RunBusy` (one line
    naming the holder) and a sweep worker skips the run to the next. The lock is an exclusive
    ``flock`` (``fcntl``), which the kernel releases when its process ends however it ends
    (``kill -9`` included), so a killed run's folder is free again at once and two processes
    can never both take it; the file stays, unlocked, after the run (its content is the last
    holder). ``enabled`` False (the other ranks of a multi-process run) takes nothing;
    ``agree`` hands the main process's outcome (None, or the holder) to every rank, so all of
    them stop when the folder is busy. Without ``fcntl`` (not POSIX) no lock is taken."""
    from surecl.errors import RunBusy

    fd = None
    holder = None
    if enabled and fcntl is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        holder = _try_lock(fd)
        if holder is not None:
            os.close(fd)
            fd = None
        else:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode("utf-8"), 0)
    if agree is not None:
        holder = agree(holder)
    try:
        if holder is not None:
            raise RunBusy(f"{out}: {holder} is running there; wait for it to finish or choose another --out", holder)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the flock


def _ours(name: str, known: tuple[str, ...]) -> bool:
    return name.startswith(known) or name.startswith(tuple("." + k for k in known))


def run_outputs(out: Path) -> list[Path]:
    """What ``surecl run --fresh`` removes from ``out``: every file and folder surecl writes
    there, in the order to remove them (config and results first, so a removal cut short
    never looks like a finished run). Raise naming the first entry surecl did not write; the
    directory is then left as it is."""
    out = Path(out)
    if not out.is_dir():
        return []
    found = []
    for entry in sorted(out.iterdir()):
        name = entry.name
        if name == LOCK:
            continue  # the running process's lock (run_lock): neither refused nor removed
        if name in RUN_DIRS and entry.is_dir() and not entry.is_symlink():
            for inner in sorted(entry.iterdir()):
                if not _ours(inner.name, RUN_DIRS[name]):
                    from surecl.errors import SureclError

                    raise SureclError(f"--fresh: {inner} was not written by surecl; remove it or choose another --out (nothing was removed)")
            found.append(entry)
        elif (
            (name in RUN_FILES and entry.is_file())
            or name.startswith(".surecl-probe-")
            or (name.startswith(".") and any(name.startswith(f".{f}.") for f in RUN_FILES) and entry.is_file())
            or (name.startswith(".model.") and entry.is_dir() and not entry.is_symlink())
        ):
            found.append(entry)
        else:
            from surecl.errors import SureclError

            raise SureclError(f"--fresh: {entry} was not written by surecl; remove it or choose another --out (nothing was removed)")
    first = {"config.yaml": 0, "results.json": 1}
    return sorted(found, key=lambda p: first.get(p.name, 2))


def clear_run(out: Path) -> list[Path]:
    """Remove a run's outputs from ``out`` (see :func:`run_outputs`); return what was removed."""
    removed = run_outputs(out)
    for path in removed:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    return removed


def write_config(out: Path, cfg) -> None:
    """The resolved config as ``config.yaml``: ``surecl run --config <it>`` runs it again."""
    write_text(Path(out) / "config.yaml", cfg.to_yaml())


# --------------------------------------------------------------------------- run checkpoints

ComponentState = tuple[dict, dict[str, torch.Tensor]]
"""A component's ``state_dict()``: JSON-able meta and a flat ``{name: tensor}`` dict."""


def save(root: Path, name: str, components: dict[str, ComponentState], meta: dict[str, Any], keep: int = 2) -> Path:
    """Write checkpoint ``root/name`` from the components' state dicts (each under its key:
    meta in ``meta.json`` under ``components``, tensors in ``tensors.safetensors`` as
    ``<key>/<name>``) plus the run-level ``meta`` (config, task names); keep the newest ``keep``
    complete checkpoints (by default this one and the previous as fallback). Atomic: the folder
    is built under a temporary name, ``meta.json`` (holding the tensor file's SHA-256) is
    written last, then the folder is renamed into place and older ones are removed, so while
    it is written ``keep`` + 1 checkpoints lie on disk."""
    root.mkdir(parents=True, exist_ok=True)
    tensors = {f"{key}/{k}": v.detach().cpu().contiguous() for key, (_, part) in components.items() for k, v in part.items()}
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        save_file(tensors, str(tmp / "tensors.safetensors"))
        full = {
            "format": FORMAT,
            "sha256": _sha256(tmp / "tensors.safetensors"),
            **meta,
            "components": {key: part_meta for key, (part_meta, _) in components.items()},
        }
        fault_point(f"checkpoint:{name}")
        write_json(tmp / "meta.json", full)
        target = root / name
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    done = sorted(p for p in root.glob("stage-*") if p.is_dir())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return root / name


@dataclass
class Checkpoint:
    folder: Path
    meta: dict[str, Any]
    """The run-level meta (``config``, ``tasks``) as saved."""
    components: dict[str, ComponentState]
    """Each component's (meta, tensors), tensors on the CPU."""


def _valid(folder: Path) -> dict | None:
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        if meta.get("format") not in (1, FORMAT) or meta.get("sha256") != _sha256(folder / "tensors.safetensors"):
            return None
        return meta
    except (OSError, ValueError):
        return None


def _with_prefix(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def _components(meta: dict, tensors: dict[str, torch.Tensor]) -> dict[str, ComponentState]:
    """The components' states of a checkpoint; format 1 (before components owned their
    state) is read into the same keys."""
    if meta["format"] == FORMAT:
        return {key: (part, _with_prefix(tensors, f"{key}/")) for key, part in meta["components"].items()}
    st = meta["state"]
    run = {k: st.get(k) for k in ("next_stage", "accuracy", "global_step", "seconds", "batches", "step", "initial", "accuracy_fast")}
    return {
        "run": (run, {}),
        "rng": ({"batches": meta["rng"]["batches"]}, {"torch": tensors["rng/torch"]}),
        "optimizer": (meta["optimizer"], _with_prefix(tensors, "opt/")),
        "adapters": ({"ema_steps": st["ema_steps"]}, _with_prefix(tensors, "adapter/")),
        "method": (meta["method"], _with_prefix(tensors, "method/")),
        "replay": (meta["policy"], {}),
        "log": ({"log_bytes": st["log_bytes"]}, {}),
    }


def load_latest(root: Path, log: Callable[[str], None] = lambda message: None) -> Checkpoint | None:
    """The newest valid checkpoint under ``root`` (None if there is none); ``log`` is told
    about each newer one that is incomplete or corrupt."""
    if not root.is_dir():
        return None
    for folder in sorted((p for p in root.glob("stage-*") if p.is_dir()), reverse=True):
        meta = _valid(folder)
        if meta is None:
            log(f"checkpoint {folder.name} is incomplete or corrupt; trying the previous one")
            continue
        tensors = load_file(str(folder / "tensors.safetensors"))
        return Checkpoint(folder, {"config": meta["config"], "tasks": meta["tasks"]}, _components(meta, tensors))
    return None
