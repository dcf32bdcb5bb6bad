"""The extension example of docs/extending.md, as a module the tests import (and hand to
``surecl --import``): the page's first Python block written to a folder on ``sys.path``."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
MODULE = "my_cl"


def example_code() -> str:
    """The first ```python block of docs/extending.md, as written there."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert blocks, "docs/extending.md lost its example"
    return blocks[0]


def write_example(folder: Path) -> Path:
    """``folder/my_cl.py`` holding the example; returns the folder (put it on ``sys.path``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{MODULE}.py").write_text(example_code(), encoding="utf-8")
    return folder
