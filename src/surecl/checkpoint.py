"""Atomic, pickle-free persistence: JSON for metadata, safetensors for tensors.

Every file is written to a temporary name in the same folder and renamed into place, so a
crash leaves either the old file or the new one. A checkpoint is a folder
``checkpoints/stage-NNNN`` holding ``tensors.safetensors`` and ``meta.json``; ``meta.json``
is written last and records the tensor file's SHA-256, so a partial or corrupt checkpoint is
detected and the previous good one is used instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

if TYPE_CHECKING:
    from surecl.trainer import ContinualRun

FORMAT = 1


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


# --------------------------------------------------------------------------- a run directory

RUN_FILES = ("config.yaml", "results.json", "buffer.json", "log.jsonl", "report.md", "heatmap.png")
"""The files ``surecl run`` writes at the top of its output directory."""
RUN_DIRS = {"checkpoints": ("stage-",), "adapters": ("fast", "slow")}
"""The folders it writes there, and what it names inside them (atomic writes add ``.``-prefixed
temporaries of those names)."""


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
        if name in RUN_DIRS and entry.is_dir() and not entry.is_symlink():
            for inner in sorted(entry.iterdir()):
                if not _ours(inner.name, RUN_DIRS[name]):
                    from surecl.errors import SureclError

                    raise SureclError(f"--fresh: {inner} was not written by surecl; remove it or choose another --out (nothing was removed)")
            found.append(entry)
        elif (name in RUN_FILES and entry.is_file()) or name.startswith(".surecl-probe-") or (
            name.startswith(".") and any(name.startswith(f".{f}.") for f in RUN_FILES) and entry.is_file()
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


def _optimizer_tensors(optimizer) -> tuple[dict, dict[str, torch.Tensor]]:
    sd = optimizer.state_dict()
    tensors = {}
    for idx, slots in sd["state"].items():
        for key, value in slots.items():
            tensors[f"opt/{idx}/{key}"] = value if torch.is_tensor(value) else torch.tensor(value)
    return {"param_groups": sd["param_groups"]}, tensors


def _restore_optimizer(optimizer, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        idx, slot = key.split("/", 1)
        state.setdefault(int(idx), {})[slot] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save(run: ContinualRun) -> Path | None:
    """Write the checkpoint after the last finished stage; keep the previous one as fallback."""
    if not run.accelerator.is_main_process:
        return None
    root = run.out_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    st = run.state
    name = f"stage-{st.next_stage:04d}" + (f"-step-{st.step:06d}" if st.batches is not None else "")
    tensors: dict[str, torch.Tensor] = {}
    tensors.update({f"adapter/{k}": v.cpu() for k, v in run.adapters.adapter_state("fast").items()})
    if run.cfg.dual.enabled:
        tensors.update({f"adapter/{k}": v.cpu() for k, v in run.adapters.adapter_state("slow").items()})
    tensors.update({f"adapter/{k}": v.cpu() for k, v in run.adapters.extra_state().items()})
    opt_meta, opt_tensors = _optimizer_tensors(run.optimizer)
    tensors.update({k: v.cpu() for k, v in opt_tensors.items()})
    method_meta, method_tensors = run.method.state_dict()
    tensors.update({f"method/{k}": v.cpu() for k, v in method_tensors.items()})
    tensors["rng/torch"] = torch.get_rng_state()
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    version, internal, gauss = run.rng.getstate()
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        save_file(tensors, str(tmp / "tensors.safetensors"))
        meta = {
            "format": FORMAT,
            "sha256": _sha256(tmp / "tensors.safetensors"),
            "state": {
                "next_stage": st.next_stage, "accuracy": st.accuracy, "global_step": st.global_step, "seconds": st.seconds,
                "batches": st.batches, "step": st.step, "log_bytes": st.log_bytes, "initial": st.initial, "accuracy_fast": st.accuracy_fast, "ema_steps": run.adapters.steps,
            },
            "policy": run.policy.state_dict(),
            "method": method_meta,
            "optimizer": opt_meta,
            "rng": {"batches": [version, list(internal), gauss]},
            "config": run.cfg.to_dict(),
            "tasks": [t.name for t in run.tasks],
        }
        from surecl.trainer import fault_point

        fault_point(f"checkpoint:{name}")
        write_json(tmp / "meta.json", meta)
        target = root / name
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # Keep the newest two complete checkpoints.
    done = sorted(p for p in root.glob("stage-*") if p.is_dir())
    for old in done[:-2]:
        shutil.rmtree(old, ignore_errors=True)
    return root / name


def _valid(folder: Path) -> dict | None:
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT or meta.get("sha256") != _sha256(folder / "tensors.safetensors"):
            return None
        return meta
    except (OSError, ValueError):
        return None


def _with_prefix(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def load_latest(run: ContinualRun) -> Path | None:
    """Restore the newest valid checkpoint into ``run``; say so when a newer one was damaged."""
    root = run.out_dir / "checkpoints"
    if not root.is_dir():
        return None
    for folder in sorted((p for p in root.glob("stage-*") if p.is_dir()), reverse=True):
        meta = _valid(folder)
        if meta is None:
            run.log(f"checkpoint {folder.name} is incomplete or corrupt; trying the previous one")
            continue
        from surecl.config import same_config

        if meta["tasks"] != [t.name for t in run.tasks] or not same_config(meta["config"], run.cfg):
            from surecl.errors import SureclError

            raise SureclError(f"{run.out_dir}: holds a run with a different config or task stream; use another --out")
        tensors = load_file(str(folder / "tensors.safetensors"))
        group = partial(_with_prefix, tensors)
        run.adapters.load_adapter_state({k: v.to(run.device) for k, v in group("adapter/").items()})
        _restore_optimizer(run.optimizer, meta["optimizer"], group("opt/"))
        run.method.load_state_dict(meta["method"], group("method/"))
        run.policy.load_state_dict(meta["policy"])
        torch.set_rng_state(tensors["rng/torch"])
        version, internal, gauss = meta["rng"]["batches"]
        run.rng.setstate((version, tuple(internal), gauss))
        st = meta["state"]
        for key in ("next_stage", "accuracy", "global_step", "seconds", "batches", "step", "log_bytes"):
            setattr(run.state, key, st[key])
        run.state.initial = st.get("initial")
        run.state.accuracy_fast = st.get("accuracy_fast")
        run.adapters.steps = st["ema_steps"]
        return folder
    return None
