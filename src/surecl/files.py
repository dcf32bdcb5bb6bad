"""Permissions of what surecl writes: files and folders follow the process's umask.

Atomic writes go through a temporary name (``tempfile.mkstemp`` / ``mkdtemp``), which creates
private entries (0600 / 0700) whatever the umask; renamed into place they would stay private,
unlike any file ``open()`` creates. :func:`temp_file` and :func:`temp_dir` make such
temporaries with the modes an ordinary ``open()`` / ``mkdir()`` gives: 0666 / 0777 less the
umask. :func:`check_out_dir`: the output folders the CLI and the library refuse before they
compute. Imports nothing heavy (the data modules and the CLI use it too)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from surecl.errors import SureclError


def umask() -> int:
    """The process's umask, read without changing it where Linux says it (``/proc/self/status``),
    else by setting and restoring it."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: 0666 less the umask."""
    return 0o666 & ~umask()


def dir_mode() -> int:
    """The mode ``mkdir`` gives a new folder: 0777 less the umask."""
    return 0o777 & ~umask()


def temp_file(prefix: str, folder: Path) -> tuple[int, str]:
    """``tempfile.mkstemp`` in ``folder``, its mode that of an ordinary new file: (fd, path)."""
    fd, path = tempfile.mkstemp(prefix=prefix, dir=folder)
    try:
        os.fchmod(fd, file_mode())
    except OSError:
        pass  # a file system without modes: what it gives stands
    return fd, path


def temp_dir(prefix: str, folder: Path) -> Path:
    """``tempfile.mkdtemp`` in ``folder``, its mode that of an ordinary new folder."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=folder))
    try:
        path.chmod(dir_mode())
    except OSError:
        pass
    return path


def follow_umask(folder: Path) -> None:
    """Give every file and folder under ``folder`` (itself included) the umask's mode: a
    folder surecl built under a temporary name, where a writer such as safetensors created its
    files private (0600)."""
    folder = Path(folder)
    fmode, dmode = file_mode(), dir_mode()
    for path in [folder, *folder.rglob("*")]:
        if path.is_symlink():
            continue
        try:
            path.chmod(dmode if path.is_dir() else fmode)
        except OSError:
            pass


def check_out_dir(out: Path | str, flag: str = "--out") -> None:
    """Refuse output paths we cannot or must not write, before any compute is spent: an empty
    one too (an unset shell variable), which is the current folder or the default."""
    if not str(out).strip():
        raise SureclError(f"{flag}: empty; give a folder (an unset shell variable gives an empty value)")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise SureclError(f"{flag}: {out} is a file, not a directory")
    probe = out
    while not probe.exists():
        if probe.is_symlink():  # a link whose target is missing: mkdir would fail on it after the model loads
            raise SureclError(f"{flag}: {probe} is a symbolic link to {os.readlink(probe)}, which does not exist; create its target or choose another {flag}")
        probe = probe.parent
    if not probe.is_dir():
        raise SureclError(f"{flag}: {probe} is a file, not a directory")
    try:  # os.access says yes to root even on read-only file systems: try for real
        fd, tmp = tempfile.mkstemp(prefix=".surecl-probe-", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError:
        raise SureclError(f"{flag}: {probe} is not writable") from None
