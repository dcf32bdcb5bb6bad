"""Fault injection for the crash tests.

``SURECL_KILL_AT=<point>`` SIGKILLs the process at a named point:

* ``step:<stage>:<step>`` - as a step starts (in the ``loss`` hook, before its backward:
  nothing of the step has reached the disk);
* ``score:<task>`` - as the surprise of a task's training set is computed;
* ``stage_end:<s>`` - after stage ``s`` was trained and evaluated, before its checkpoint;
* ``checkpoint:<name>`` - while checkpoint ``name`` is written (tensors written, metadata not);
* ``finish:results`` - at the end, every final output written but ``results.json``.
* ``export:swap`` - while an exported folder (``adapters/fast``, ``model``) is replaced: the
  earlier one moved aside, the new one not yet in place.

``SURECL_NAN_AT=<stage>:<step>`` turns that step's loss into NaN (the run then stops with a
clear error and the last checkpoint intact). ``SURECL_NAN_GRAD_AT=<stage>:<step>`` leaves that
step's loss finite and makes its gradient NaN (a kernel's fault in the backward pass).
``SURECL_FAULT_RANK=<r>`` limits both to process ``r`` of several.

In ``step:`` and the NaN points ``<stage>`` is the stage's accuracy-matrix row, as ``log.jsonl``'s
``stage`` field: the stage's index where a stage trains one task, but the last row (N-1) for
MTL's one stage over N tasks. ``stage_end:<s>`` and checkpoint names count stages from 0.
"""

from __future__ import annotations

import os
import signal

from surecl.plugins.base import Plugin


def fault_point(name: str) -> None:
    """``SURECL_KILL_AT=name`` SIGKILLs the process here (``SURECL_KILL_SIGNAL=TERM`` or ``INT``:
    sends that signal instead, once)."""
    if os.environ.get("SURECL_KILL_AT") == name:
        sig = os.environ.get("SURECL_KILL_SIGNAL")
        if sig:
            os.environ.pop("SURECL_KILL_AT")
            os.kill(os.getpid(), getattr(signal, f"SIG{sig}"))
        else:
            os.kill(os.getpid(), signal.SIGKILL)


class FaultInjection(Plugin):
    """The step-level faults, through the ``loss`` hook (the other points call :func:`fault_point`)."""

    name = "faults"

    def loss(self, ctx, loss):
        where = f"{ctx.stage.row}:{ctx.state.step}"
        fault_point(f"step:{where}")
        if os.environ.get("SURECL_FAULT_RANK", str(ctx.rank)) != str(ctx.rank):
            return loss
        if os.environ.get("SURECL_NAN_AT") == where:
            loss = loss * float("nan")
        if os.environ.get("SURECL_NAN_GRAD_AT") == where and loss.requires_grad:
            loss.register_hook(lambda grad: grad * float("nan"))
        return loss
