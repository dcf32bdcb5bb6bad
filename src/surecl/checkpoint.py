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
import contextvars
import hashlib
import json
import os
import re
import shutil
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from surecl.files import file_mode, follow_umask, temp_dir, temp_file
from surecl.plugins.faults import fault_point

try:
    import fcntl
except ImportError:  # not POSIX: run folders are not locked
    fcntl = None

TEMP_MARK = "surecl-"
"""Part of every temporary's name an atomic write puts beside a run's file (``.results.json.surecl-k2x9_q0a``)."""

FORMAT = 2
"""2: each component's state under its own key (``components`` in meta.json, ``<key>/``
tensors). Format 1 checkpoints (one layout for the whole run) are still read."""


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_file(f".{path.name}.{TEMP_MARK}", path.parent)  # the umask's mode, as open() would give
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


def _keep_others(old: Path, new: Path) -> None:
    """Copy into ``new`` (the folder about to replace ``old``) every entry of ``old`` that ``new``
    does not hold: a file a user keeps in an exported folder (notes, an evaluation) outlives
    the export written again (a finished run completing a missing output rewrites them all);
    the files the export writes are its own, replaced. Copied, not moved: until the swap the
    old folder stays whole, so a failure on the way loses nothing."""
    if not old.is_dir() or old.is_symlink():
        return
    for entry in old.iterdir():
        if os.path.lexists(new / entry.name) or TEMP_MARK in entry.name:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, new / entry.name, symlinks=True)
        else:
            shutil.copy2(entry, new / entry.name, follow_symlinks=False)


_FOLDER_WRITES: contextvars.ContextVar[dict[Path, list[str]] | None] = contextvars.ContextVar("surecl_folder_writes", default=None)
"""Where :func:`recording_folder_writes` collects what each folder write put in its folder."""


@contextlib.contextmanager
def recording_folder_writes() -> Iterator[dict[Path, list[str]]]:
    """Collect, for every folder :func:`_swap_in` writes inside the block, the names of the
    entries it wrote (not a user's entries it kept): a run's manifest records them, so
    ``--fresh`` removes those and leaves the user's files in the folder."""
    written: dict[Path, list[str]] = {}
    token = _FOLDER_WRITES.set(written)
    try:
        yield written
    finally:
        _FOLDER_WRITES.reset(token)


def _swap_in(written: Path, target: Path) -> None:
    """Put the finished folder ``written`` at ``target``, keeping the entries of an earlier
    ``target`` it does not hold (:func:`_keep_others`). The earlier folder goes aside as
    ``.<name>.surecl-old`` and is removed once the new one is in place; a failure between the
    two renames (a full disk, an interrupt) puts it back, and a kill there leaves it for
    :meth:`Manifest.remove_temporaries` to put back, so the earlier export and a user's files
    in it are never lost."""
    names = sorted(e.name for e in written.iterdir())
    _keep_others(target, written)
    old = target.parent / f".{target.name}.{TEMP_MARK}old"
    if os.path.lexists(target):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
        try:
            fault_point("export:swap")
            os.replace(written, target)
        except BaseException:
            if not os.path.lexists(target):
                os.replace(old, target)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(written, target)
    record = _FOLDER_WRITES.get()
    if record is not None:
        record[target] = names


def write_folder(target: Path, fill: Callable[[Path], None]) -> None:
    """Write the folder ``target`` atomically: ``fill`` writes its entries into a temporary
    folder beside it (``.<name>.surecl-XXXXXXXX``), which is then swapped in (:func:`_swap_in`:
    a user's other entries there are kept, and the earlier folder survives a failure)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir(f".{target.name}.{TEMP_MARK}", target.parent)
    try:
        fill(tmp)
        follow_umask(tmp)
        _swap_in(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def save_adapter(adapters, folder: Path, name: str, base_model: str | None = None, card: str | None = None,
                 files: dict[str, str] | None = None) -> None:
    """PEFT-format adapter folder ``folder/name``, replaced atomically; ``base_model`` replaces
    the ``base_model_name_or_path`` PEFT records (the folder the base was loaded from),
    ``card`` is written as the folder's ``README.md`` and ``files`` (name -> text, e.g.
    ``prompt.json``) beside it. Entries of an earlier ``folder/name`` that this export does
    not write are kept (:func:`_keep_others`); the folder is written by :func:`write_folder`."""

    def fill(tmp: Path) -> None:
        adapters.save_pretrained(tmp, name)
        nested = tmp / name  # PEFT writes a named adapter into a subfolder, and its own card beside it
        if nested.is_dir():
            for entry in list(tmp.iterdir()):
                if entry != nested:
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            for entry in list(nested.iterdir()):
                os.replace(entry, tmp / entry.name)
            nested.rmdir()
        if base_model is not None:
            config_path = tmp / "adapter_config.json"
            config = json.loads(config_path.read_text(encoding="utf-8"))
            config["base_model_name_or_path"] = base_model
            config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if card is not None:
            (tmp / "README.md").write_text(card, encoding="utf-8")
        for file, text in (files or {}).items():
            (tmp / file).write_text(text, encoding="utf-8")

    write_folder(Path(folder) / name, fill)


def save_model(model, tokenizer, folder: Path, state_dict: dict[str, torch.Tensor], card: str, files: dict[str, str] | None = None) -> None:
    """A whole model as a transformers folder (``config.json``, ``model.safetensors``, the
    tokenizer, ``card`` as ``README.md``), loadable with ``AutoModel*.from_pretrained(folder)``,
    replaced atomically: built beside ``folder`` under a ``.``-prefixed temporary name and
    swapped in. ``model`` gives the config; ``state_dict`` the weights, under transformers'
    names (tied weights once: transformers ties them again on load). Entries of an earlier
    ``folder`` that this export does not write are kept (:func:`_keep_others`)."""

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        for file, text in (files or {}).items():
            (tmp / file).write_text(text, encoding="utf-8")

    write_folder(Path(folder), fill)


# --------------------------------------------------------------------------- a run directory

RUN_FILES = ("config.yaml", "results.json", "buffer.json", "log.jsonl", "report.md", "heatmap.png", "predictions.jsonl")
"""The files ``surecl run`` writes at the top of its output directory."""
CONTAINERS = ("checkpoints", "adapters", "tensorboard")
"""The folders it writes its entries into (created when missing; shared with what the user
keeps there, so only the entries it wrote in them are its own)."""
MANIFEST = ".surecl-manifest.json"
"""The run folder's record of every path the run wrote (:class:`Manifest`)."""


LOCK = ".surecl-lock"
"""The lock file of a run folder (:func:`run_lock`): a running process holds an exclusive
``flock`` on it and writes its host and pid into it."""


def lock_holder(out: Path) -> str | None:
    """Who holds ``out``'s run lock now ("another surecl process (host H, pid P)"), or None:
    no lock file, or nobody holds it (a finished run, or a killed one: the kernel releases a
    dead process's ``flock``), or its file system takes no locks (the run itself then says so
    in one line). Takes and drops the lock to find out; holds nothing after. A lock file this
    process may only read (another user's) is locked for reading: ``flock`` takes either."""
    path = Path(out) / LOCK
    if fcntl is None or not path.is_file():
        return None
    fd = None
    for flags in (os.O_RDWR, os.O_RDONLY):
        try:
            fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0))
            break
        except OSError:
            continue
    if fd is None:
        return None
    try:
        return _try_lock(fd)
    except OSError:  # no flock on this file system: run_lock says so in one line
        return None
    finally:
        os.close(fd)  # closing the descriptor releases a lock taken here


def _try_lock(fd: int) -> str | None:
    """Take the exclusive ``flock`` on ``fd`` without waiting: None when taken, else who holds it.
    A file system without locks raises its ``OSError`` (``ENOSYS``, ``EOPNOTSUPP``, ``ENOLCK``)."""
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


def _open_lock(path: Path) -> tuple[int, bool]:
    """The lock file's descriptor, read-write, never through a symbolic link, and whether this
    call created it (``O_EXCL``: then only this call may remove it); mode 0666 less the umask,
    as every file surecl writes, so a group's members can lock one another's folders."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    while True:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | nofollow, file_mode()), True
        except FileExistsError:
            pass
        try:
            return os.open(path, os.O_RDWR | nofollow), False
        except FileNotFoundError:
            continue  # removed between the two (a refused run's lock file): create it again


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` is still the file ``fd`` has open (a refused run removes the lock file it
    made while holding its lock: a process that opened it before then locks a file nobody else sees)."""
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


@contextlib.contextmanager
def run_lock(out: Path, enabled: bool = True, agree: Callable[[str | None], str | None] | None = None) -> Iterator[None]:
    """Hold ``out/.surecl-lock`` while a run writes ``out``, so two processes never write one run
    folder: a second ``surecl run`` there stops with :class:`~surecl.errors.RunBusy` (one line
    naming the holder) and a sweep worker skips the run to the next. The lock is an exclusive
    ``flock`` (``fcntl``), which the kernel releases when its process ends however it ends
    (``kill -9`` included), so a killed run's folder is free again at once and two processes
    can never both take it; the file stays, unlocked, after the run (its content is the last
    holder). A lock file this call created is removed again when the run leaves no manifest
    (refused before writing anything, or a full disk at its first write): the folder is left
    as it was found. A file system without ``flock`` is one line. ``enabled`` False (the other
    ranks of a multi-process run) takes nothing; ``agree`` hands the main process's outcome
    (None, or the holder) to every rank, so all of them stop when the folder is busy. Without
    ``fcntl`` (not POSIX) no lock is taken."""
    from surecl.errors import RunBusy, SureclError

    fd = None
    created = False
    holder = None
    path = Path(out) / LOCK
    error: BaseException | None = None
    try:
        if enabled and fcntl is not None:
            out = Path(out)
            out.mkdir(parents=True, exist_ok=True)
            while True:
                try:  # never through a symbolic link: the lock's content would replace its target's
                    fd, created = _open_lock(path)
                except OSError:
                    if path.is_symlink():
                        raise SureclError(f"{path} is a symbolic link; surecl does not write through links in a run folder: remove it or choose another --out") from None
                    raise
                try:
                    holder = _try_lock(fd)
                except OSError as exc:  # Lustre without flock, some FUSE and network mounts
                    if created:
                        with contextlib.suppress(OSError):
                            path.unlink()
                    os.close(fd)
                    raise SureclError(f"{out}: its file system does not support file locks (flock on {LOCK}: {exc.strerror or exc}), "
                                      "which surecl takes so that two runs never write one folder; choose an --out on another file system") from None
                if holder is not None:
                    os.close(fd)
                    fd = None
                    break
                if _same_file(fd, path):
                    break
                os.close(fd)  # locked a lock file a refused run removed meanwhile: open the one there now
            if fd is not None:
                try:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode("utf-8"), 0)
                except BaseException:
                    _release_lock(fd, path, created)
                    raise
    except BaseException as exc:  # with other ranks waiting in agree: they stop with this line too
        if agree is None:
            raise
        error = exc
    if agree is not None:
        message = None if error is None else str(error) if isinstance(error, SureclError) else f"the main process stopped: {type(error).__name__}: {error}"
        shared = agree({"error": message} if error is not None else holder)
        if error is not None:
            raise error
        if isinstance(shared, dict):
            raise SureclError(shared["error"])
        holder = shared
    try:
        if holder is not None:
            raise RunBusy(f"{out}: {holder} is running there; wait for it to finish or choose another --out", holder)
        yield
    finally:
        if fd is not None:
            _release_lock(fd, path, created)


def _release_lock(fd: int, path: Path, created: bool) -> None:
    """Close the lock's descriptor (which releases the ``flock``), first removing the lock file
    when this call created it and the run left no manifest: nothing of the run is in the folder,
    and a lock file alone must not stay (before manifests, the lock file marked a run folder)."""
    try:
        if created and not os.path.lexists(path.parent / MANIFEST):
            with contextlib.suppress(OSError):
                path.unlink()
    finally:
        os.close(fd)


_LEGACY_TEMP_TAIL = re.compile(r"(?=[0-9_]*[a-z])(?=[a-z]*[0-9_])[a-z0-9_]{8}|old")
"""The tail an earlier version's temporaries had (no :data:`TEMP_MARK`): ``tempfile``'s eight
random characters, read as such only with a letter and a digit or ``_`` among them (a user's
``.results.json.original`` or ``.stage-0002.20240101`` stays; a random tail lacks one about one
time in seventeen, and that leftover then stays too), or ``old``. Read only in a
folder adopted from such a version (no manifest). A checkpoint's temporary had it too until
checkpoints took the mark (``checkpoints/.stage-0003.k2x9_q0a``): one a kill left in a folder
with a manifest stays, as a user's ``.stage-0002.20240101`` does (neither is ever read as a
checkpoint: :data:`CHECKPOINT_NAME` has no leading dot)."""
_LEGACY_CHECKPOINT = re.compile(r"stage-\d{4}(-step-\d{6})?|\.stage-\d{4}(-step-\d{6})?\.(" + _LEGACY_TEMP_TAIL.pattern + ")")
"""What an earlier version wrote in ``checkpoints/``: a checkpoint, or a dot-named temporary of
one (:data:`_LEGACY_TEMP_TAIL`); a user's ``stage-0003.bak`` or ``.stage-0001.backup`` is
neither, so never adopted or removed."""
CHECKPOINT_NAME = re.compile(r"stage-\d{4}(-step-\d{6})?")
"""A checkpoint folder's name (``run_folder.checkpoint``): what resume reads and pruning removes;
any other ``stage-*`` name there (a user's ``stage-0003.bak``) is neither."""
_TEMP_TAIL = re.compile(r"surecl-([a-z0-9_]{8}|old)")
"""The tail after a temporary's prefix ``.<name>.``: :data:`TEMP_MARK` and the random part
``tempfile.mkstemp`` / ``mkdtemp`` put there, or ``old`` (a folder an atomic replace swapped
out): what tells an atomic write's leftover from a user's ``.results.json.original``,
``.config.yaml.swp`` or ``checkpoints/.stage-0001.backup``, which stay."""
ADAPTER_CARD = "# surecl LoRA adapter"
"""The heading of the model card in every adapter folder surecl writes (``surecl.card``): an
earlier version's ``adapters/fast`` is adopted only with it (a user's adapter there has none)."""
MODEL_CARD = "# surecl fine-tuned model"
"""The heading of the card in the ``model/`` folder ``seq_ft`` writes."""


class Manifest:
    """What surecl wrote in a run folder: ``.surecl-manifest.json`` lists every path it wrote
    there (relative, ``/``-separated: ``results.json``, ``checkpoints/stage-0001``,
    ``adapters/fast``, ``model``), the folders it created to hold them (``dirs``) and, once the
    run finished, its final outputs (``final``). The manifest is written atomically before each
    new path is written (:meth:`claim`), so it always covers what may lie on disk.

    Only listed paths are surecl's: ``--fresh`` (:meth:`clear`) removes exactly those (of an
    exported folder, the entries surecl wrote in it: :attr:`contents`; and the
    ``.``-prefixed temporaries an atomic write of one leaves beside it when killed), never
    following a symbolic link; a path the run would write that is a symbolic link, or that
    exists without being listed (a file of the user's), stops the run with one line before
    anything is written. A folder written by a surecl version before manifests (it holds a
    checkpoint, or a ``.surecl-lock`` beside a file every run writes, but no manifest) is
    adopted once, by the exact names that version wrote, an adapter or model folder only with
    surecl's card in it (read before the run takes its lock)."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.path = self.out / MANIFEST
        self.paths: list[str] = []
        self.dirs: list[str] = []
        self.final: list[str] | None = None
        """The final outputs of a finished run (None: not finished, or adopted unfinished)."""
        self.contents: dict[str, list[str]] = {}
        """For an exported folder among :attr:`paths` (``adapters/fast``, ``model``): the names
        of the entries surecl wrote in it (a user's files it kept there are not among them);
        a listed folder without an entry here (an earlier version's) is surecl's whole."""
        self.exists = False
        from surecl.errors import SureclError

        if self.path.is_symlink():
            raise SureclError(f"{self.path} is a symbolic link; surecl does not write through links in a run folder: remove it or choose another --out")
        if self.path.is_file():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                paths, dirs, final = data["paths"], data.get("dirs", []), data.get("final")
                contents = data.get("contents", {})
                if not (isinstance(paths, list) and isinstance(dirs, list) and all(isinstance(x, str) for x in paths + dirs)):
                    raise ValueError
                if not (isinstance(contents, dict) and all(isinstance(v, list) and all(isinstance(n, str) for n in v) for v in contents.values())):
                    raise ValueError
                if final is not None and not (isinstance(final, list) and all(isinstance(x, str) for x in final)):
                    raise ValueError
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                raise SureclError(f"{self.path}: not a readable surecl manifest; remove the run folder's outputs by hand or choose another --out") from None
            self.paths = [p for p in paths if _safe_rel(p)]
            self.dirs = [d for d in dirs if _safe_rel(d)]
            self.final = final
            self.contents = {k: [n for n in v if _safe_rel(n) and "/" not in n] for k, v in contents.items() if _safe_rel(k)}
            self.exists = True
        elif self._legacy():
            self._adopt()

    # -------------------------------------------------------------- reading

    def owns(self, rel: str) -> bool:
        return rel in self.paths

    def _legacy(self) -> bool:
        """A run folder written before manifests: a checkpoint, or its lock file beside a file
        every run writes (read before this run takes the lock). An earlier version wrote
        config.yaml and log.jsonl as soon as it held the lock; a lock file alone is no run's
        (this version removes the one it made when it leaves no manifest, and a kill in between
        leaves nothing else of it), and the user's adapters beside it are never taken for one."""
        out = self.out
        if not out.is_dir():
            return False
        ck = out / "checkpoints"
        if ck.is_dir() and not ck.is_symlink() and any((p / "meta.json").is_file() for p in ck.glob("stage-*")):
            return True
        return ((out / LOCK).is_file() and not (out / LOCK).is_symlink()
                and any((out / n).is_file() and not (out / n).is_symlink() for n in RUN_FILES))

    def _adopt(self) -> None:
        """Take over the exact names an earlier version wrote (never a symbolic link)."""
        self.adopted = True
        out = self.out
        found = [n for n in RUN_FILES if (out / n).is_file() and not (out / n).is_symlink()]
        ck = out / "checkpoints"
        if ck.is_dir() and not ck.is_symlink():
            found += [f"checkpoints/{p.name}" for p in sorted(ck.iterdir()) if _LEGACY_CHECKPOINT.fullmatch(p.name) and not p.is_symlink()]
        ad = out / "adapters"
        if ad.is_dir() and not ad.is_symlink():  # each with what surecl writes in it: a user's adapter there has none
            found += [f"adapters/{n}" for n in ("fast", "slow") if not (ad / n).is_symlink() and _says(ad / n / "README.md", ADAPTER_CARD)]
            if not (ad / "prompts").is_symlink() and _says(ad / "prompts" / "prompts.json", '"surecl_version"'):
                found.append("adapters/prompts")
        tb = out / "tensorboard" / "surecl"
        if tb.is_dir() and not tb.is_symlink() and not tb.parent.is_symlink():
            found.append("tensorboard/surecl")
        if not (out / "model").is_symlink() and _says(out / "model" / "README.md", MODEL_CARD):
            found.append("model")
        self.paths = found
        self.dirs = [d for d in CONTAINERS if any(p.startswith(d + "/") for p in found)]
        if "results.json" in found:
            self.final = [p for p in found if p in ("results.json", "buffer.json", "report.md", "heatmap.png") or p.startswith("adapters/") or p == "model"]

    # -------------------------------------------------------------- writing

    def save(self) -> None:
        write_json(self.path, {"paths": self.paths, "dirs": self.dirs, "final": self.final, "contents": self.contents})
        self.exists = True

    def set_contents(self, written: dict[Path, list[str]]) -> None:
        """Record what each exported folder of the run holds of surecl's (``written``, from
        :func:`recording_folder_writes`: folder -> names written)."""
        for folder, names in written.items():
            try:
                rel = Path(folder).relative_to(self.out).as_posix()
            except ValueError:
                continue
            if rel in self.paths:
                self.contents[rel] = list(names)
        self.save()

    def check(self, rel: str) -> Path:
        """Refuse (one line) to write ``rel``: when it, or a folder on the way to it inside the
        run folder, is a symbolic link; when it exists and was not written by surecl. Return its path."""
        from surecl.errors import SureclError

        if not _safe_rel(rel):
            raise ValueError(f"not a path inside the run folder: {rel!r}")
        parts = rel.split("/")
        path = self.out
        for k, part in enumerate(parts):
            path = path / part
            if path.is_symlink():
                raise SureclError(f"{path} is a symbolic link; surecl does not write through links in a run folder: "
                                  "remove it or choose another --out")
            if k < len(parts) - 1 and path.exists() and not path.is_dir():
                raise SureclError(f"{path} is a file where surecl writes a folder; move it away or choose another --out")
        if rel in CONTAINERS and path.exists() and not path.is_dir():
            raise SureclError(f"{path} is a file where surecl writes a folder; move it away or choose another --out")
        if path.exists() and not self.owns(rel) and rel not in CONTAINERS:
            raise SureclError(f"{path} was not written by surecl and this run would overwrite it; move it away or choose another --out")
        return path

    def claim(self, rel: str) -> Path:
        """Record ``rel`` as surecl's before it is written (after :meth:`check`); return its path."""
        path = self.check(rel)
        changed = False
        parts = rel.split("/")
        for k in range(1, len(parts)):
            folder = "/".join(parts[:k])
            if folder not in self.dirs and not (self.out / folder).exists():
                self.dirs.append(folder)
                changed = True
        if rel not in self.paths:
            self.paths.append(rel)
            changed = True
        if changed or not self.exists:
            self.save()
        return path

    def forget_missing(self, under: str) -> None:
        """Drop listed paths under ``under`` that are no longer on disk (pruned checkpoints)."""
        keep = [p for p in self.paths if not p.startswith(under + "/") or os.path.lexists(self.out / p)]
        if keep != self.paths:
            self.paths = keep
            self.save()

    def set_final(self, final: list[str] | None) -> None:
        self.final = list(final) if final is not None else None
        self.save()

    def missing_final(self) -> list[str] | None:
        """The final outputs of a finished run no longer on disk ([] when all are), or None
        when the manifest records no finished run."""
        if self.final is None:
            return None
        return [p for p in self.final if not os.path.lexists(self.out / p)]

    # -------------------------------------------------------------- removing

    def temporaries(self) -> list[Path]:
        """The ``.``-prefixed temporaries an atomic write of a listed path leaves beside it
        when the process is killed (``.results.json.surecl-XXXXXXXX``,
        ``checkpoints/.stage-0003.surecl-XXXXXXXX``, ``.model.surecl-old``), and those of the
        manifest itself: the same tail rule everywhere, so a user's ``checkpoints/.stage-0002.notes``
        stays as their ``.results.json.original`` does."""
        found = []
        by_parent: dict[str, set[str]] = {}
        for rel in [*self.paths, MANIFEST]:
            parent, _, name = rel.rpartition("/")
            by_parent.setdefault(parent, set()).add(name)
        for parent, names in by_parent.items():
            folder = self.out / parent if parent else self.out
            if folder.is_symlink() or not folder.is_dir():
                continue
            for entry in folder.iterdir():
                n = entry.name
                # tempfile's random tail after the mark (an adopted earlier version's folder: its own tail)
                tail = _LEGACY_TEMP_TAIL if getattr(self, "adopted", False) else _TEMP_TAIL
                if n.startswith(".") and any(n.startswith(f".{name}.") and tail.fullmatch(n[len(name) + 2 :]) for name in names):
                    found.append(entry)
        return sorted(found)

    def remove_temporaries(self) -> list[Path]:
        """Remove :meth:`temporaries` (and those an earlier version's folder was adopted with).
        An exported folder a kill left moved aside (``adapters/.fast.surecl-old`` with no
        ``adapters/fast``: :func:`_swap_in`) is put back instead, with any user's files in it."""
        adopted = [p for p in self.paths if p.rpartition("/")[2].startswith(".")]
        self._put_back_aside()
        gone = self.temporaries() + [self.out / p for p in adopted if os.path.lexists(self.out / p)]
        for path in gone:
            _remove(path)
        if adopted:
            self.paths = [p for p in self.paths if p not in adopted]
            self.save()
        return gone

    def _put_back_aside(self) -> None:
        """Rename each exported folder a kill left moved aside (:func:`_swap_in`:
        ``adapters/.fast.surecl-old`` with no ``adapters/fast``) back to its name."""
        for path in self.temporaries():
            name = path.name[1:].rpartition(".")[0]  # .fast.surecl-old -> fast
            rel = (path.parent / name).relative_to(self.out).as_posix()
            aside = path.name.endswith(f".{TEMP_MARK}old") or (getattr(self, "adopted", False) and path.name.endswith(".old"))
            export = rel in self.paths and not rel.startswith("checkpoints/")  # a checkpoint is never swapped aside
            if aside and export and path.is_dir() and not path.is_symlink() and not os.path.lexists(path.parent / name):
                os.replace(path, path.parent / name)

    def outputs(self) -> list[Path]:
        """What :meth:`clear` removes: the listed paths on disk (config and results first, so a
        removal cut short never looks like a finished run), then their temporaries."""
        first = {"config.yaml": 0, "results.json": 1}
        listed = sorted(self.paths, key=lambda p: (first.get(p, 2), p))
        return [self.out / p for p in listed if os.path.lexists(self.out / p)] + self.temporaries()

    def clear(self) -> list[Path]:
        """Remove every listed path and its temporaries (a link is removed, never followed;
        of an exported folder with :attr:`contents`, the entries surecl wrote, the folder itself
        only once empty), then the folders surecl created that are left empty; the manifest then
        lists nothing but an exported folder left holding a user's files (none of them surecl's:
        the next export writes its files in beside them)."""
        for rel in self.paths:  # refuse before removing anything when a folder on the way is a link
            path = self.out
            for part in rel.split("/")[:-1]:
                path = path / part
                if path.is_symlink():
                    from surecl.errors import SureclError

                    raise SureclError(f"--fresh: {path} is a symbolic link; surecl does not remove through links "
                                      "(nothing was removed): remove it or choose another --out")
        self._put_back_aside()  # a user's files in it are kept as in the folder's own place
        removed = self.outputs()
        kept: list[str] = []
        for path in removed:
            rel = path.relative_to(self.out).as_posix()
            if rel in self.contents and path.is_dir() and not path.is_symlink():
                for name in self.contents[rel]:  # surecl's files; a user's kept there stay, with the folder
                    if os.path.lexists(path / name):
                        _remove(path / name)
                try:
                    path.rmdir()
                except OSError:
                    kept.append(rel)  # still surecl's folder, holding none of its files: the next export goes in beside them
            else:
                _remove(path)
        for rel in sorted(self.dirs, key=lambda d: -d.count("/")):
            with contextlib.suppress(OSError):
                (self.out / rel).rmdir()  # only when empty: what the user keeps there stays
        self.paths, self.final, self.contents = kept, None, {rel: [] for rel in kept}
        self.dirs = [d for d in self.dirs if (self.out / d).is_dir()]
        if self.out.is_dir():
            self.save()
        return [p for p in removed if p.relative_to(self.out).as_posix() not in kept]  # (a kept folder lost surecl's files only)


def _says(path: Path, mark: str) -> bool:
    """Whether file ``path`` (not a link) holds ``mark`` in its first 4096 characters."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        return mark in path.read_text(encoding="utf-8", errors="replace")[:4096]
    except OSError:
        return False


def _safe_rel(rel: str) -> bool:
    return bool(rel) and not rel.startswith("/") and all(part not in ("", ".", "..") for part in rel.split("/"))


def _remove(path: Path) -> None:
    """Remove ``path``: a link or file is unlinked, a real folder removed with what it holds
    (``shutil.rmtree`` unlinks the links inside, never following them)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


def check_outputs(out: Path, fresh: bool = False, extra: tuple[str, ...] = ()) -> None:
    """Refuse (one line, nothing written) a run folder where a path every run writes (the
    containers, :data:`RUN_FILES`, ``extra``) is a symbolic link or a file surecl did not write;
    with ``fresh``, paths the manifest lists pass (they are removed first)."""
    out = Path(out)
    if not out.is_dir():
        return
    manifest = Manifest(out)
    for rel in (*CONTAINERS, *RUN_FILES, *extra):
        if not (fresh and manifest.owns(rel)):
            manifest.check(rel)


def run_outputs(out: Path) -> list[Path]:
    """What ``surecl run --fresh`` removes from ``out``: the paths its manifest lists and their
    temporaries (:class:`Manifest`), config and results first; everything else stays."""
    out = Path(out)
    if not out.is_dir():
        return []
    return Manifest(out).outputs()


def clear_run(out: Path) -> list[Path]:
    """Remove a run's outputs from ``out`` (see :func:`run_outputs`); return what was removed."""
    out = Path(out)
    if not out.is_dir():
        return []
    return Manifest(out).clear()


def write_config(out: Path, cfg, header: str | None = None) -> None:
    """The resolved config as ``config.yaml``: ``surecl run --config <it>`` runs it again (unless
    the model or tasks came from Python: then ``header``, a comment saying so, replaces the first line)."""
    text = cfg.to_yaml()
    if header:
        text = header + text.split("\n", 1)[1]
    write_text(Path(out) / "config.yaml", text)


# --------------------------------------------------------------------------- run checkpoints

ComponentState = tuple[dict, dict[str, torch.Tensor]]
"""A component's ``state_dict()``: JSON-able meta and a flat ``{name: tensor}`` dict."""


def save(root: Path, name: str, components: dict[str, ComponentState], meta: dict[str, Any], keep: int = 2,
         owned: Callable[[str], bool] | None = None) -> Path:
    """Write checkpoint ``root/name`` from the components' state dicts (each under its key:
    meta in ``meta.json`` under ``components``, tensors in ``tensors.safetensors`` as
    ``<key>/<name>``) plus the run-level ``meta`` (config, task names); keep the newest ``keep``
    complete checkpoints (by default this one and the previous as fallback). Atomic: the folder
    is built under a temporary name, ``meta.json`` (holding the tensor file's SHA-256) is
    written last, then the folder is renamed into place and older ones are removed, so while
    it is written ``keep`` + 1 checkpoints lie on disk. ``owned(name)``: whether a checkpoint
    folder is this run folder's (its manifest lists it); only those are ever removed (None: all)."""
    root.mkdir(parents=True, exist_ok=True)
    tensors = _unshared({f"{key}/{k}": v.detach().cpu().contiguous() for key, (_, part) in components.items() for k, v in part.items()})
    tmp = temp_dir(f".{name}.{TEMP_MARK}", root)  # marked, as every atomic write's: what remove_temporaries takes
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
        follow_umask(tmp)
        target = root / name
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # a run writes its checkpoints in name order, so one named after this is another trajectory's
    # (a damaged one a resume passed over, or an earlier run's that this one started over from):
    # left there, it would be read on the next resume and the keep rule would prune this run's own
    ours = [p for p in _checkpoint_folders(root) if owned is None or p.name == name or owned(p.name)]
    for later in [p for p in ours if p.name > name]:
        shutil.rmtree(later, ignore_errors=True)
    for old in [p for p in ours if p.name <= name][:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return root / name


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` with every tensor whose memory another one already holds copied (a plugin's
    two names for one tensor, a view of another): safetensors refuses to write shared memory."""
    seen: set[int] = set()
    out = {}
    for name, t in tensors.items():
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if ptr is not None and ptr in seen:
            t = t.clone()
        elif ptr is not None:
            seen.add(ptr)
        out[name] = t
    return out


@dataclass
class Checkpoint:
    folder: Path
    meta: dict[str, Any]
    """The run-level meta (``config``, ``tasks``, ``data``: each task's fingerprint, None before
    fingerprints were recorded) as saved."""
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


def _checkpoint_folders(root: Path) -> list[Path]:
    """The checkpoint folders under ``root`` (named :data:`CHECKPOINT_NAME`, not links), oldest first."""
    return sorted(p for p in root.iterdir() if CHECKPOINT_NAME.fullmatch(p.name) and p.is_dir() and not p.is_symlink())


def load_latest(root: Path, log: Callable[[str], None] = lambda message: None,
                owned: Callable[[str], bool] | None = None) -> Checkpoint | None:
    """The newest valid checkpoint under ``root`` (None if there is none) among those
    ``owned(name)`` says the run folder wrote (None: all); ``log`` is told about each newer one
    that is incomplete or corrupt."""
    if not root.is_dir():
        return None
    folders = [p for p in _checkpoint_folders(root) if owned is None or owned(p.name)][::-1]  # newest first
    for folder in folders:
        meta = _valid(folder)
        found = None
        if meta is not None:
            try:  # a meta.json that parses but is not a checkpoint's (keys missing, wrong types) is corrupt too
                if not (isinstance(meta.get("config"), dict) and isinstance(meta.get("tasks"), list)):
                    raise ValueError("config or tasks")
                tensors = load_file(str(folder / "tensors.safetensors"))
                found = Checkpoint(folder, {"config": meta["config"], "tasks": meta["tasks"], "data": meta.get("data"), "encoding": meta.get("encoding"), "base": meta.get("base"), "general": meta.get("general")}, _components(meta, tensors))
            except Exception:  # noqa: BLE001 - whatever a damaged file raises, the previous checkpoint is tried
                found = None
        if found is None:
            log(f"warning: checkpoint {folder.name} is incomplete or corrupt; trying the previous one")
            continue
        return found
    if folders:
        log(f"warning: no checkpoint in {root} is complete and intact ({len(folders)} tried); starting over from the beginning")
    return None
