"""``log.jsonl``: one line per logged optimizer step, written by a plugin from its StepRecord.

Only the main process writes (the others write to the null device). The plugin's state is the
log's length at the last checkpoint: a resumed run truncates the file to it, dropping the lines
of steps taken after the checkpoint, which it then takes again.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from surecl.plugins.base import Plugin, StepRecord


@dataclass
class StepLogConfig:
    every: int = 1
    """Write every k-th step of a stage (the config's ``log_every``)."""


class StepLog(Plugin):
    name = "log"
    Config = StepLogConfig

    @classmethod
    def config_from(cls, cfg) -> StepLogConfig:
        return StepLogConfig(every=cfg.log_every)

    def __init__(self, config: StepLogConfig | None = None) -> None:
        super().__init__(config)
        self.file: IO[str] | None = None
        self.log_bytes = 0
        """Length of log.jsonl at the last checkpoint (restored ones truncate to it)."""

    @contextlib.contextmanager
    def opened(self, path: Path, main_process: bool = True) -> Iterator[StepLog]:
        """Open the log for appending while the block runs, cut back to the checkpointed length."""
        if main_process and path.exists() and self.log_bytes < path.stat().st_size:
            with open(path, "r+b") as f:  # drop lines of steps after the checkpoint
                f.truncate(self.log_bytes)
        try:
            with open(path if main_process else os.devnull, "a", encoding="utf-8") as self.file:
                yield self
        finally:
            self.file = None

    def after_step(self, ctx, record: StepRecord) -> None:
        if self.file is not None and record.step % self.config.every == 0:
            self.file.write(json.dumps({
                "stage": record.stage.row, "step": record.step, "global_step": record.global_step, "loss": round(record.loss, 6),
                "replayed": len(record.replayed), "buffer": len(ctx.policy), "lr": record.lr,
            }) + "\n")

    def state_dict(self) -> tuple[dict, dict]:
        if self.file is not None:
            self.file.flush()
            self.log_bytes = self.file.tell()
        return {"log_bytes": self.log_bytes}, {}

    def load_state_dict(self, meta: dict, tensors: dict) -> None:
        self.log_bytes = meta.get("log_bytes", 0)
