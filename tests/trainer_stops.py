"""Stopping a Trainer job mid-task as a kill would, for the integration tests and
tests/sure_trainer_processes.py: :class:`StopAt` raises after a chosen optimizer step of a
chosen ``train()`` call."""

from __future__ import annotations

from transformers import TrainerCallback


class Interrupt(Exception):
    """What :class:`StopAt` raises (a test expects it where the job stops)."""


class StopAt(TrainerCallback):
    """Stops the job (as a kill would) after optimizer step ``step`` of the ``task``-th train() call."""

    def __init__(self, task: int, step: int, error: type[Exception] = Interrupt):
        self.task, self.step, self.calls, self.error = task, step, -1, error

    def on_train_begin(self, args, state, control, **kwargs):
        self.calls += 1

    def on_step_end(self, args, state, control, **kwargs):
        if self.calls == self.task and state.global_step == self.step:
            raise self.error
