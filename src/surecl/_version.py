"""surecl's version, for the package face and the files a run writes (model cards, prompt
files); a module of its own so that nothing imports the package root for it."""

from __future__ import annotations


def version() -> str:
    """The installed distribution's version, else the one pyproject.toml declares (a source tree
    on ``sys.path`` without ``pip install``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("surecl")
    except PackageNotFoundError:
        import re
        from pathlib import Path

        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            text = pyproject.read_text(encoding="utf-8")
        except OSError:
            return "0+unknown"
        project = text.split("[project]", 1)[-1].split("\n[", 1)[0]
        found = re.search(r'^version\s*=\s*"([^"]+)"', project, re.M)
        return found.group(1) if found else "0+unknown"
