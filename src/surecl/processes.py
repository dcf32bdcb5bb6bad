"""Several processes: one outcome for all of them, and leaving cleanly.

:func:`agreed` runs a step on the main process alone (a file written or read, a choice made)
and hands its result, or its error, to every process at the same point: a process that stopped
alone would leave the others in the next collective, hung or failing with a traceback. Where a
process stops alone all the same (a signal to it, an error only it met), the others' next
collective fails as the backend finds it gone: :func:`peers_stop_in_one_line` turns that failure
into one line saying so (the run's training loop runs inside it).

A process that exits with its ``torch.distributed`` process group still up can abort
(``terminate called without an active exception``, SIGABRT, exit code -6) after its work is done:
gloo's worker threads may still hold finished work objects whose tensors are released during
interpreter finalisation, when the interpreter can no longer take the GIL. The group is therefore
torn down while the interpreter is still whole: :func:`release_at_exit` registers, once per
process, an ``atexit`` handler that destroys the default group if one is still up. It first
collects unreachable reference cycles: a finished (or refused) run sits in one, with its
``DistributedDataParallel`` model, whose reducer holds the group and its pending work; left to
the collection during finalisation, the reducer and the group's last reference went down after
the group was destroyed, when the interpreter was half gone (an abort seen on a refused
two-process run). A model the script still holds at exit (a global) is not garbage and is not
freed here. A script that
destroys the group itself (``accelerator.end_training()``, ``dist.destroy_process_group()``) is
unaffected: the handler then finds none. ``surecl run`` and the Trainer integrations call it when
they run in several processes.
"""

from __future__ import annotations

import atexit
import contextlib

from surecl.errors import SureclError

_registered = False

PEER_STOPPED = ("another process of the run stopped (its output says why); the checkpoints written so far are intact: "
                "rerun the same command to resume")
"""The line of a process whose collective failed because another process of the run had gone."""

PEER_GONE = ("closed by peer", "closed by remote peer", "reset by peer", "Broken pipe", "remote process exited",
             "failed to recv, got 0 bytes")
"""What the collective backends' errors say when the other end of a connection has gone (gloo's
``Connection closed by peer``, NCCL's ``remote process exited``, the rendezvous store's)."""


def agreed(run, action):
    """``action()`` on the main process only (``run.accelerator.is_main_process``); with
    several processes (``run.world``) every process then returns its result, or stops with the
    main process's error (the main process raises its own; the others a ``SureclError`` of its
    line), at the same point."""
    if getattr(run, "world", 1) == 1:
        return action()
    box, error = [None, None], None
    if run.accelerator.is_main_process:
        try:
            box[0] = action()
        except Exception as exc:
            error = exc
            box[1] = str(exc) if isinstance(exc, SureclError) else f"the main process stopped: {type(exc).__name__}: {exc}"
    box = from_main(box)
    if error is not None:
        raise error
    if box[1] is not None:
        raise SureclError(box[1])
    return box[0]


@contextlib.contextmanager
def peers_stop_in_one_line(message: str = PEER_STOPPED):
    """A collective that fails because another process stopped alone (an error only it met, a
    signal to it alone) stops this one with ``message`` (:data:`PEER_STOPPED`: how a command
    resumes), a :class:`SureclError`, instead of the backend's traceback (gloo's ``Connection
    closed by peer`` out of the backward's all-reduce). Only in a group of several processes,
    and only the backend's errors for a peer that has gone: any other error passes unchanged."""
    try:
        yield
    except RuntimeError as exc:
        if not peer_gone(exc):
            raise
        raise SureclError(message) from exc


def peer_gone(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective backend's error for a process of the group that has gone
    (a ``torch.distributed`` error, or gloo's ``RuntimeError``, saying a connection closed)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return False
    text = str(exc)
    backend = isinstance(exc, getattr(dist, "DistError", ())) or "gloo" in text or "NCCL" in text
    return backend and any(words in text for words in PEER_GONE)


def from_main(value):
    """The main process's ``value``, on every process."""
    from accelerate.utils import broadcast_object_list

    box = [value]
    broadcast_object_list(box, from_process=0)
    return box[0]


def release_at_exit() -> None:
    """Destroy the default ``torch.distributed`` process group at interpreter exit, if one is
    still up then (idempotent: registers the handler once)."""
    global _registered
    if not _registered:
        atexit.register(_destroy_group)
        _registered = True


def _destroy_group() -> None:
    import gc

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gc.collect()  # a run left in a reference cycle (its DDP reducer holds the group) goes now, not in finalisation
        dist.destroy_process_group()
