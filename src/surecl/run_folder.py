"""A run's folder (:class:`surecl.trainer.ContinualRun`, ``run`` below): opening it (refusing
what the run must not overwrite, ``--fresh``, resuming from the newest valid checkpoint,
``config.yaml``), and the checkpoints every component's state goes into and comes back from,
with the run's own progress (:class:`~surecl.run_state.RunState`) and random streams."""

from __future__ import annotations

import dataclasses
import json
import os
import unicodedata
from pathlib import Path

import torch

import surecl.checkpoint as checkpoint
from surecl.data.task import composed_keys
from surecl.errors import SureclError, start_over
from surecl.model import host_info
from surecl.plugins.tracking import MARK
from surecl.processes import agreed, from_main
from surecl.run_results import config_header, encoding_digests, fingerprints, probe_fingerprints
from surecl.run_state import RunState


def planned_outputs(run) -> list[str]:
    """Every path the run writes in its folder, relative to it (the containers first)."""
    extra = (["tensorboard/surecl"] if "tensorboard" in run.trackers else []) + ([MARK] if run.trackers else [])
    return [*checkpoint.CONTAINERS, *checkpoint.RUN_FILES, *run.plugins.outputs(run), *extra]


def open_folder(run, resume: bool, fresh: bool) -> dict | None:
    """Ready ``run.out_dir`` for the run (inside its lock): refuse a link or a user's file where
    it writes, remove a killed run's temporaries, clear it with ``fresh``, restore the newest
    valid checkpoint with ``resume``, write ``config.yaml``, add this machine to ``state.hosts``.
    Returns the saved results where the restored checkpoint is the run's last and its
    results.json and final outputs are in place (it finished while this run waited for the
    lock: nothing to do; the checkpoint restored the trained learner and checked the data),
    else None."""
    main = run.accelerator.is_main_process
    agreed(run, lambda: _refusals(run, resume, fresh))
    if fresh:
        if main:
            removed = run.outputs.clear()
            if removed:
                run.log(f"--fresh: removed {', '.join(str(p.relative_to(run.out_dir)) for p in removed)} from {run.out_dir}")
        run.accelerator.wait_for_everyone()
    run.out_dir.mkdir(parents=True, exist_ok=True)
    run.continuing = resume and not fresh
    if resume and not fresh:
        restored = restore(run)
        if restored and run.state.next_stage >= len(run.stages):
            # the last checkpoint: a run that finished while this one waited for the lock (its
            # results.json and every final output in place) is not finished again
            done = agreed(run, lambda: _complete_results(run))
            if done is not None:
                run.log(f"{run.out_dir}: already holds this finished run: its results.json is returned")
                return done
        if restored:
            run.log(f"resumed from {restored} at stage {run.state.next_stage}/{len(run.stages)}")
        else:
            agreed(run, lambda: _finished_without_checkpoint(run))
    if main:  # after the checkpoint check: another run's config stays
        run.outputs.claim("config.yaml")
        checkpoint.write_config(run.out_dir, run.cfg, header=config_header(run))
        run.outputs.claim("log.jsonl")
        if "tensorboard" in run.trackers:
            run.outputs.claim("tensorboard/surecl")
        if run.trackers:
            run.outputs.claim(MARK)
    here = host_info(run.device)
    if not run.state.hosts or run.state.hosts[-1] != here:
        run.state.hosts.append(here)


def planned_checkpoints(run) -> list[str]:
    """The checkpoint folders the run will write (``save``'s names): ``stage-0000`` when it
    measures anything before training, ``stage-NNNN`` after each stage, and with
    ``train.checkpoint_every`` the ``stage-NNNN-step-NNNNNN`` ones inside each stage."""
    names = ["stage-0000"] if run.cfg.eval.before or getattr(run, "general", None) is not None else []
    every = run.cfg.train.checkpoint_every
    for s, stage in enumerate(getattr(run, "stages", None) or []):
        if every:
            total = run.steps_in_stage(stage)
            names += [f"stage-{s:04d}-step-{k:06d}" for k in range(every, total, every)]
        names.append(f"stage-{s + 1:04d}")
    return names


def config_outputs(cfg, out: Path, log_with: list[str] = ()) -> list[str]:
    """What a run of ``cfg`` would write in ``out`` beyond every run's files, known before the
    model or the data are loaded (``surecl run``'s pre-flight, :func:`checkpoint.check_outputs`):
    the learner's adapters (``adapters/fast``, ``adapters/slow`` if dual; none for a method that
    trains the base or its own modules), the method class's ``exports``, the trackers' files and,
    only where ``out/checkpoints`` holds a checkpoint-named entry the manifest does not list (the
    stream is loaded for it then), the planned checkpoint names among those."""
    from surecl.registry import method_class

    cls = method_class(cfg.method)
    rels = ([f"adapters/{name}" for name in ("fast", "slow")[: 2 if cfg.dual.enabled else 1]] if cls.trains == "fast" else [])
    rels += [*cls.exports, *(["tensorboard/surecl"] if "tensorboard" in log_with else []), *([MARK] if log_with else [])]
    root = Path(out) / "checkpoints"
    if not root.is_dir() or root.is_symlink():
        return rels
    manifest = checkpoint.Manifest(out)
    theirs = sorted(f"checkpoints/{p.name}" for p in root.iterdir()
                    if checkpoint.CHECKPOINT_NAME.fullmatch(p.name) and not manifest.owns(f"checkpoints/{p.name}"))
    if theirs:
        from types import SimpleNamespace

        from surecl.data.loading import load_stream
        from surecl.plan import planned_steps
        from surecl.registry import method_config

        tasks = load_stream(cfg)
        stages = cls(method_config(cfg)).stages(len(tasks))
        steps = lambda stage: planned_steps([len(tasks[t].train) for t in stage.tasks], cfg, [tasks[t].name for t in stage.tasks])  # noqa: E731
        plan = SimpleNamespace(cfg=cfg, general=True if cfg.eval.general != "none" else None, stages=stages, steps_in_stage=steps)
        planned = {f"checkpoints/{n}" for n in planned_checkpoints(plan)}
        rels += [rel for rel in theirs if rel in planned]
    return rels


def _refusals(run, resume: bool, fresh: bool) -> None:
    """The main process's part of opening the folder: refuse what the run must not overwrite
    (before the manifest is written: a refused run leaves the folder as it found it, its lock
    file removed by :func:`checkpoint.run_lock`), remove what a killed run's writes left."""
    if not resume and not fresh:
        # starting over beside an earlier run's outputs would mix them: its results.json stays
        # "finished" over this run's log and checkpoints, which replace its own as they come
        earlier = [p for p in run.outputs.paths if os.path.lexists(run.out_dir / p) and p != MARK]
        if earlier:
            raise SureclError(f"{run.out_dir}: holds an earlier run's outputs ({', '.join(earlier[:3])}{' ...' if len(earlier) > 3 else ''}); "
                              "resume=False would start over beside them: pass fresh=True to remove them first, or resume=True to continue")
    for rel in [*planned_outputs(run), *(f"checkpoints/{n}" for n in planned_checkpoints(run))]:
        # a link or a user's file where the run writes: refused before anything changes (a
        # checkpoint's name too, which was found only when that checkpoint came, after the training before it)
        if not (fresh and run.outputs.owns(rel)):
            run.outputs.check(rel)
    if not run.outputs.exists:
        # once nothing is refused, before anything else is written: a full disk here stops the run with
        # nothing of it in the folder (run_lock removes the lock file it made when no manifest follows)
        run.outputs.save()
    if not fresh:
        left = run.outputs.remove_temporaries()  # what a killed write left (checkpoints/.stage-*, .results.json.*)
        if left:
            run.log(f"removed {len(left)} temporary file(s) a killed run left: {', '.join(str(p.relative_to(run.out_dir)) for p in left[:4])}"
                    + (" ..." if len(left) > 4 else ""))


def _complete_results(run) -> dict | None:
    """The folder's results, where its results.json and every final output are in place (a
    finished run, its finish complete), else None."""
    if not (run.out_dir / "results.json").is_file() or run.outputs.missing_final():
        return None
    try:
        results = json.loads((run.out_dir / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return results if isinstance(results, dict) else None


def _finished_without_checkpoint(run) -> None:
    """A finished run (results.json) that no checkpoint can resume: one line, whether its final
    outputs are in place (nothing to do: no checkpoint restores the learner, so the run's
    ``peft_model`` would be untrained beside its results, and its data cannot be checked
    against this run's), another config's, or missing where none can write them again."""
    if (run.out_dir / "results.json").is_file():
        missing = run.outputs.missing_final()
        if not missing:
            from surecl.config import same_config

            try:
                saved = json.loads((run.out_dir / "results.json").read_text(encoding="utf-8"))["config"]
            except (OSError, ValueError, KeyError, TypeError):
                saved = None
            if not isinstance(saved, dict) or not same_config(saved, run.cfg):
                raise SureclError(f"{run.out_dir}: already holds a finished run with a different config (results.json); choose another --out")
            raise SureclError(f"{run.out_dir}: already holds this finished run, its final outputs in place and its checkpoints "
                              "removed: read its results.json and load its adapters/ (no checkpoint remains to restore the "
                              f"trained model here), or {start_over('pass fresh=True (--fresh)')} to train it again")
        raise SureclError(f"{run.out_dir}: a finished run whose final output{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                          f"{'are' if len(missing) > 1 else 'is'} missing and no checkpoint remains to write "
                          f"{'them' if len(missing) > 1 else 'it'} again; {start_over()} to train it again, or choose another --out")


def save(run) -> None:
    """Checkpoint every component's state (main process) after the last finished step."""
    st = run.state
    name = f"stage-{st.next_stage:04d}" + (f"-step-{st.step:06d}" if st.batches is not None else "")
    components = {"run": (dataclasses.asdict(st), {}), "rng": rng_state(run), **run.plugins.state_dicts()}
    _check_declared_state(run, components.get("method"))
    if getattr(run, "outputs", None) is None:  # a checkpoint taken outside run() (tests, tools)
        run.outputs = checkpoint.Manifest(run.out_dir)
    run.outputs.claim(f"checkpoints/{name}")
    checkpoint.save(
        run.out_dir / "checkpoints", name, components,
        {"config": run.cfg.to_dict(), "tasks": [t.name for t in run.tasks], "data": fingerprints(run),
         "encoding": encoding_digests(run), "base": getattr(run, "base_fingerprint", None), "general": probe_fingerprints(run)},
        keep=run.cfg.train.keep_checkpoints, owned=_owned_checkpoints(run),
    )
    run.outputs.forget_missing("checkpoints")


def _check_declared_state(run, state) -> None:
    """Warn once when the method checkpoints state of its own but its ``state`` declaration says
    it keeps none: results.json's ``learner`` and the adapters' model cards are written from it."""
    method = getattr(run, "method", None)
    if method is None or method.state or not state or not (state[0] or state[1]) or getattr(run, "_undeclared_warned", False):
        return
    run._undeclared_warned = True
    if callable(getattr(run, "log", None)):
        run.log(f"warning: method {method.name} checkpoints state of its own ({', '.join(sorted([*state[0], *state[1]])[:3])}) "
                "but declares none: results.json's learner and the model cards will say it keeps nothing; name it in its "
                "class, e.g. state = (\"the anchor weights\",)")


def _owned_checkpoints(run):
    """Whether a checkpoint folder's name is one the run folder's manifest lists (None where this
    process keeps no manifest: a rank other than the main one reads every checkpoint)."""
    outputs = getattr(run, "outputs", None)
    return (lambda name: outputs.owns(f"checkpoints/{name}")) if outputs is not None else None


def restore(run) -> Path | None:
    """Restore the newest valid checkpoint into the run and its components; say so when a
    newer one was damaged."""
    root = run.out_dir / "checkpoints"
    if getattr(run, "world", 1) > 1:
        # the main process chooses (only its manifest knows which folders the run wrote); the
        # others load that one: ranks that resumed from different stages would pair up their collectives wrongly
        found = checkpoint.load_latest(root, run.log, _owned_checkpoints(run)) if run.accelerator.is_main_process else None
        chosen = from_main(found.folder.name if found is not None else None)
        if not run.accelerator.is_main_process:
            found = checkpoint.load_latest(root, owned=lambda name: name == chosen) if chosen is not None else None
            if found is None and chosen is not None:
                raise SureclError(f"{root / chosen}: the main process resumes from it but this process cannot read it")
    else:
        found = checkpoint.load_latest(root, run.log, _owned_checkpoints(run))
    if found is None:
        return None
    from surecl.config import same_config

    if [unicodedata.normalize("NFC", str(t)) for t in found.meta["tasks"]] != [t.name for t in run.tasks] or not same_config(found.meta["config"], run.cfg):
        raise SureclError(f"{run.out_dir}: holds a run with a different config or task stream; use another --out")
    # task names as read now (a checkpoint of a decomposed, macOS, name); checkpoints written before fingerprints have none
    saved = composed_keys(found.meta.get("data") or {})
    for name, digest in fingerprints(run).items():
        if name in saved and saved[name] != digest:
            raise SureclError(f"{run.out_dir}: the data of task {name} changed since {found.folder.name} was written (other "
                              f"sampled rows at the same config); restore that data, or {start_over()} to start over on this data")
    saved = composed_keys(found.meta.get("encoding") or {})  # checkpoints written before these were recorded have none
    for name, digest in encoding_digests(run).items():
        if name in saved and saved[name] != digest:
            raise SureclError(f"{run.out_dir}: the prompts of task {name} are built otherwise than when {found.folder.name} was "
                              "written (the tokenizer's start tokens, the task's group under data.task_prefix, or surecl's prompt "
                              f"format changed): the rest of the run would train on other inputs; {start_over()}, or use another --out")
    base, saved_base = getattr(run, "base_fingerprint", None), found.meta.get("base")
    if base is not None and saved_base is not None and base != saved_base:
        raise SureclError(f"{run.out_dir}: the base model ({run.cfg.model.name}) is not the one {found.folder.name} was trained on "
                          f"(its weights changed since); restore that model, or {start_over()} to start over on this one")
    saved = composed_keys(found.meta.get("general") or {})
    for name, digest in probe_fingerprints(run).items():
        if name in saved and saved[name] != digest:
            raise SureclError(f"{run.out_dir}: the general-ability probe's part {name} changed since {found.folder.name} was written "
                              "(its rows, or its prompts: a header instruction now ends in a newline as in every reader; the "
                              f"before-training scores were taken on the old ones); restore it, or {start_over()}")
    run.ran = True  # its components hold the checkpoint's state from here (ContinualRun.run: one run per object)
    run.plugins.load_state_dicts(found.components)
    load_rng_state(run, *found.components["rng"])
    saved = found.components["run"][0]
    for f in dataclasses.fields(RunState):
        if f.name in saved:
            setattr(run.state, f.name, saved[f.name])
    return found.folder


def generators(device) -> dict[str, torch.Tensor]:
    """This process's torch generator states: the CPU's and, on a GPU, the device's."""
    out = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def set_generators(states: dict[str, torch.Tensor], device) -> None:
    """Put back the generator states :func:`generators` took."""
    torch.set_rng_state(states["torch"])
    if "cuda" in states and device.type == "cuda":
        torch.cuda.set_rng_state(states["cuda"], device)


def gather_rng(run) -> list[dict[str, torch.Tensor]]:
    """Every process's :func:`generators`, in process order (a collective: every process calls it)."""
    from accelerate.utils import gather_object

    return gather_object([generators(run.device)])


def rng_state(run) -> tuple[dict, dict[str, torch.Tensor]]:
    """The random streams: the batch plan's, torch's CPU generator and, on a GPU, the
    device's generator (dropout masks there), so a resumed run draws what it would have; with
    several processes each one's own generators too (``torch/rank<r>``, gathered by
    :func:`gather_rng`), since each draws dropout masks for its own rows."""
    version, internal, gauss = run.rng.getstate()
    tensors = generators(run.device)
    for r, states in enumerate(getattr(run, "rank_rng", None) or []):
        tensors.update({f"{k}/rank{r}": v for k, v in states.items()})
    return {"batches": [version, list(internal), gauss]}, tensors


def load_rng_state(run, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
    """The streams :func:`rng_state` saved, each process taking its own where they were saved per
    process (a checkpoint from before that, or from one process: the main process's)."""
    own = lambda k: tensors.get(f"{k}/rank{getattr(run, 'rank', 0)}", tensors.get(k))  # noqa: E731
    set_generators({k: own(k) for k in ("torch", "cuda") if own(k) is not None}, run.device)
    version, internal, gauss = meta["batches"]
    run.rng.setstate((version, tuple(internal), gauss))
