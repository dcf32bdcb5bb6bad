"""What surecl writes and removes in a folder it shares with the user: a full disk at a run's
first write leaves nothing of it, a lock file alone is no earlier version's run folder (so a
user's adapter beside it is never taken over), only marked temporaries are removed (under
``checkpoints/`` too), a file system without ``flock`` and a lock file of another user are one
line, a refused ``surecl run`` stops before the model is built with the folder as it found it,
SureTrainer's ``save_total_limit`` over a whole run, and a finished run without checkpoints
through the Python API."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
from pathlib import Path

import pytest
import test_run_folder as shared
import torch

import surecl.checkpoint as checkpoint
from surecl.checkpoint import LOCK, MANIFEST, Manifest, lock_holder, run_lock
from surecl.cli import main
from surecl.errors import SureclError

# the CLI's tiny dual run, its cache and one finished run of it, as tests/test_run_folder.py has them
SMALL, TINY, one_error_line = shared.SMALL, shared.TINY, shared.one_error_line
cache, finished = shared.cache, shared.finished  # fixtures


def listing(folder: Path) -> dict[str, bytes | None]:
    """Every entry under ``folder`` (a file with its bytes, a folder as None)."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def users_adapter(out: Path, name: str = "fast") -> Path:
    folder = out / "adapters" / name
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"the user's own adapter")
    (folder / "adapter_config.json").write_text('{"r": 4}')
    return folder


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


# --------------------------------------------------------------------------- 1: a full disk, a lock file alone


@pytest.mark.parametrize("where", ["manifest", "lock"])
def test_a_full_disk_at_the_runs_first_write_leaves_nothing_of_it(tmp_path, cache, capsys, monkeypatch, where):
    """The disk full when the manifest is written (or the lock's holder): one line, and no lock
    file stays (before, a lock file without a manifest read as an earlier version's folder)."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    if where == "manifest":
        monkeypatch.setattr(Manifest, "save", lambda self: no_space())
    else:
        monkeypatch.setattr(os, "pwrite", no_space)
    assert main(["run", *TINY, "--out", str(out), *SMALL]) == 2
    assert "no space left on the device" in one_error_line(capsys)
    assert listing(out) == {"notes.txt": b"mine"}


def test_a_lock_file_alone_never_adopts_a_users_adapter(tmp_path, cache, capsys):
    """A folder holding a lock file (empty: what a full disk left) and the user's adapters/fast is
    no earlier version's run folder: the user's adapter is refused, never replaced."""
    from surecl.config import build_config
    from surecl.trainer import run

    out = tmp_path / "run"
    users_adapter(out)
    (out / LOCK).write_bytes(b"")
    before = listing(out)
    assert Manifest(out).paths == [] and checkpoint.run_outputs(out) == []
    assert main(["run", "--config", "tiny,seq_lora", "--quiet", "--out", str(out), *SMALL]) == 2
    assert "adapters/fast was not written by surecl" in one_error_line(capsys)
    with pytest.raises(SureclError, match="adapters/fast was not written by surecl"):  # the Python API: no pre-flight
        run(build_config("tiny,seq_lora", SMALL), out, progress=False, cache_dir=cache)
    after = listing(out)
    after[LOCK] = b""  # the lock file's content is its last holder's
    assert after == before


def test_an_earlier_versions_adapters_are_adopted_only_with_surecls_card(tmp_path):
    """An earlier version's folder (its lock file beside config.yaml) is adopted by exact names,
    but an adapters/ folder only where surecl's model card (or prompts.json) says it wrote it."""
    out = tmp_path / "run"
    users_adapter(out, "slow")
    ours = out / "adapters" / "fast"
    ours.mkdir(parents=True)
    (ours / "README.md").write_text("---\ntags:\n- surecl\n---\n\n# surecl LoRA adapter: seq_lora (fast)\n")
    (out / "adapters" / "prompts").mkdir()
    (out / "adapters" / "prompts" / "prompts.json").write_text(json.dumps({"method": "progressive_prompts", "surecl_version": "0.1"}))
    (out / LOCK).write_text('{"host": "h", "pid": 1}')
    (out / "config.yaml").write_text("seed: 0\n")
    assert sorted(Manifest(out).paths) == ["adapters/fast", "adapters/prompts", "config.yaml"]


# --------------------------------------------------------------------------- 2: temporaries under checkpoints/


def hand_made_run(out: Path) -> Path:
    """A run folder whose manifest lists two checkpoints (each a valid checkpoint)."""
    root = out / "checkpoints"
    meta = {"config": {}, "tasks": ["a"]}
    for k in (1, 2):
        checkpoint.save(root, f"stage-{k:04d}", {"run": ({"k": k}, {"w": torch.full((2,), float(k))})}, meta, keep=2)
    (out / MANIFEST).write_text(json.dumps({"paths": ["checkpoints/stage-0001", "checkpoints/stage-0002"], "dirs": ["checkpoints"], "final": None}))
    return root


def test_a_checkpoints_temporary_carries_the_mark(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    seen: list[str] = []
    monkeypatch.setattr(checkpoint, "fault_point", lambda name: seen.extend(p.name for p in root.iterdir()))
    checkpoint.save(root, "stage-0001", {"run": ({"k": 1}, {"w": torch.zeros(2)})}, {"config": {}, "tasks": ["a"]})
    assert len(seen) == 1 and re.fullmatch(r"\.stage-0001\.surecl-[a-z0-9_]{8}", seen[0]), seen
    assert sorted(p.name for p in root.iterdir()) == ["stage-0001"]


def test_a_users_hidden_entries_under_checkpoints_are_no_temporaries(tmp_path):
    """A rerun (``remove_temporaries``) and ``--fresh`` (``clear``) remove a checkpoint's marked
    temporary and keep the user's ``.stage-*`` entries; an unmarked one (an earlier version's
    temporary, or the user's) stays and is never read as a checkpoint."""
    out = tmp_path / "run"
    root = hand_made_run(out)
    (root / ".stage-0002.20240101").mkdir()
    (root / ".stage-0002.20240101" / "notes.txt").write_text("mine")
    (root / ".stage-0001.backup").mkdir()
    (root / ".stage-0001.backup" / "meta.json").write_text("{}")
    (root / ".stage-0002.notes").write_text("mine")
    shutil.copytree(root / "stage-0002", root / ".stage-0003.k2x9_q0a")  # unmarked, and newer: never resumed from
    mine = {n: listing(root / n) if (root / n).is_dir() else (root / n).read_bytes()
            for n in (".stage-0002.20240101", ".stage-0001.backup", ".stage-0002.notes", ".stage-0003.k2x9_q0a")}
    (root / ".stage-0002.surecl-k2x9_q0a").mkdir()
    removed = Manifest(out).remove_temporaries()
    assert [p.name for p in removed] == [".stage-0002.surecl-k2x9_q0a"]
    owned = Manifest(out).owns
    assert checkpoint.load_latest(root, owned=lambda n: owned(f"checkpoints/{n}")).folder.name == "stage-0002"
    (root / ".stage-0001.surecl-old").mkdir()
    cleared = Manifest(out).clear()
    assert sorted(p.name for p in cleared) == [".stage-0001.surecl-old", "stage-0001", "stage-0002"]
    assert {n: listing(root / n) if (root / n).is_dir() else (root / n).read_bytes() for n in mine} == mine
    assert sorted(p.name for p in root.iterdir()) == sorted(mine)


def test_an_earlier_versions_folder_keeps_the_users_dot_named_backups(tmp_path):
    """A folder written before manifests is adopted with its leftovers (``tempfile``'s random
    tails), but a user's ``checkpoints/.stage-0001.backup``, ``.stage-0002.20240101`` and
    ``.results.json.original`` are neither adopted nor taken for temporaries."""
    out = tmp_path / "run"
    root = hand_made_run(out)
    (out / MANIFEST).unlink()  # as an earlier version left it
    (out / "results.json").write_text("{}")
    (out / ".results.json.original").write_text("mine")
    (out / ".results.json.k2x9_q0a").write_text("left by a kill")
    (root / ".stage-0001.backup").mkdir()
    (root / ".stage-0002.20240101").mkdir()
    (root / ".stage-0003.ab12cd_e").mkdir()  # an earlier version's checkpoint temporary
    manifest = Manifest(out)
    assert sorted(manifest.paths) == ["checkpoints/.stage-0003.ab12cd_e", "checkpoints/stage-0001", "checkpoints/stage-0002",
                                      "results.json"]
    assert [p.name for p in manifest.temporaries()] == [".results.json.k2x9_q0a"]
    gone = manifest.remove_temporaries()
    assert sorted(p.name for p in gone) == [".results.json.k2x9_q0a", ".stage-0003.ab12cd_e"]
    assert (out / ".results.json.original").read_text() == "mine"
    assert (root / ".stage-0001.backup").is_dir() and (root / ".stage-0002.20240101").is_dir()


# --------------------------------------------------------------------------- 3 and 5: the lock file


def test_a_file_system_without_flock_is_one_line_and_leaves_no_lock_file(tmp_path, cache, capsys, monkeypatch):
    def no_locks(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")  # Lustre's noflock, some FUSE mounts

    out = tmp_path / "run"
    out.mkdir()
    monkeypatch.setattr(checkpoint.fcntl, "flock", no_locks)
    with pytest.raises(SureclError, match="does not support file locks"):
        with run_lock(out):
            pass
    assert list(out.iterdir()) == []
    assert main(["run", *TINY, "--out", str(out), *SMALL]) == 2
    line = one_error_line(capsys)
    assert str(out) in line and "does not support file locks" in line and "Function not implemented" in line
    assert list(out.iterdir()) == []
    (out / LOCK).write_text('{"host": "h", "pid": 1}')  # an earlier run's, on that file system
    assert lock_holder(out) is None


def test_the_main_processs_lock_failure_stops_every_process_with_its_line(tmp_path, monkeypatch):
    """With several processes the others wait in the lock's agreement for the main process's
    outcome: a failure taking the lock is handed to them as its one line (they waited for a
    main process that had already exited: a distributed traceback or a hang)."""
    def no_locks(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(checkpoint.fcntl, "flock", no_locks)
    sent = []

    def agree(value):  # the main process's side of from_main: what it hands the others
        sent.append(value)
        return value

    with pytest.raises(SureclError, match="does not support file locks"):
        with run_lock(tmp_path / "run", True, agree):
            pass
    assert len(sent) == 1 and "does not support file locks" in sent[0]["error"]
    with pytest.raises(SureclError, match="does not support file locks"):  # another rank, given that outcome
        with run_lock(tmp_path / "run", False, lambda value: sent[0]):
            pass


def test_the_lock_file_follows_the_umask(tmp_path):
    out = tmp_path / "run"
    old = os.umask(0o002)
    try:
        with run_lock(out):
            mode = (out / LOCK).stat().st_mode & 0o777
    finally:
        os.umask(old)
    assert mode == 0o664


def test_lock_holder_reads_a_lock_file_it_may_not_write(tmp_path, monkeypatch):
    """Another user's lock file (open for reading only): its holder is still named."""
    out = tmp_path / "run"
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if str(path).endswith(LOCK) and flags & os.O_ACCMODE != os.O_RDONLY:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    with run_lock(out):
        monkeypatch.setattr(os, "open", read_only)
        assert lock_holder(out) == f"another surecl process (host {socket.gethostname()}, pid {os.getpid()})"
        monkeypatch.undo()
    assert lock_holder(out) is None


def test_a_lock_file_a_refused_run_removed_is_never_locked_by_two(tmp_path):
    """A run refused before its manifest removes the lock file it created; a run that opened that
    file just before locks the one on disk, so a third process sees it busy."""
    out = tmp_path / "run"
    with pytest.raises(SureclError, match="refused"):
        with run_lock(out):
            assert (out / LOCK).is_file()
            raise SureclError("refused")
    assert not (out / LOCK).exists()
    with run_lock(out):
        (out / MANIFEST).write_text('{"paths": [], "dirs": []}')  # the run wrote its manifest: the lock file stays
        assert lock_holder(out) is not None
    assert (out / LOCK).is_file() and lock_holder(out) is None


# --------------------------------------------------------------------------- 4: refused before the model is built


@pytest.mark.parametrize(("config", "users", "refused"), [
    ("tiny,seq_lora", "adapters/fast", True),
    ("tiny,slow_surprise", "adapters/slow", True),
    ("tiny,seq_ft", "model", True),
    ("tiny,progressive_prompts", "adapters/prompts", True),
    ("tiny,seq_lora", "checkpoints/stage-0002", True),
    ("tiny,seq_ft", "adapters/fast", False),  # full fine-tuning exports no adapter
    ("tiny,seq_lora", "adapters/slow", False),  # not dual
    ("tiny,seq_lora", "checkpoints/stage-0009", False),  # two tasks: no such checkpoint
])
def test_surecl_run_refuses_a_users_export_before_building_anything(tmp_path, cache, capsys, monkeypatch, config, users, refused):
    import surecl.trainer

    def reached(*args, **kwargs):
        raise SureclError("reached the run")

    monkeypatch.setattr(surecl.trainer, "run", reached)
    out = tmp_path / "run"
    (out / users).mkdir(parents=True)
    (out / users / "notes.txt").write_text("mine")
    before = listing(out)
    assert main(["run", "--config", config, "--quiet", "--out", str(out), *SMALL]) == 2
    line = one_error_line(capsys)
    assert (f"{users} was not written by surecl" in line) == refused and ("reached the run" in line) == (not refused), line
    assert listing(out) == before


def test_a_run_refused_through_the_python_api_leaves_the_folder_as_it_found_it(tmp_path, cache):
    from surecl.config import build_config
    from surecl.trainer import run

    out = tmp_path / "run"
    users_adapter(out)
    before = listing(out)
    with pytest.raises(SureclError, match="adapters/fast was not written by surecl"):
        run(build_config("tiny,seq_lora", SMALL), out, progress=False, cache_dir=cache)
    assert listing(out) == before


# --------------------------------------------------------------------------- 6: SureTrainer's save_total_limit


def test_save_total_limit_holds_over_a_whole_suretrainer_run(tmp_path, tiny_loaded):
    """With ``save_total_limit`` a finished task's checkpoints go once its sure-end is written
    (nothing resumes from them after); without it the Trainer keeps them, and a resume still
    skips every finished task."""
    import copy

    datasets = pytest.importorskip("datasets")
    from transformers import DataCollatorForLanguageModeling, TrainingArguments

    from surecl.data.tiny import tiny_stream
    from surecl.integrations.transformers import SureArguments, SureTrainer

    tok = tiny_loaded.tokenizer
    sets = [datasets.Dataset.from_dict({"text": [f"{e.sentence} Answer: {e.label}" for e in t.train]}).map(
        lambda b: tok(b["text"]), batched=True, remove_columns=["text"]) for t in tiny_stream(n_train=16, n_test=4)[:3]]

    def trainer(out: Path, **kw) -> SureTrainer:
        args = TrainingArguments(str(out), per_device_train_batch_size=8, learning_rate=5e-3, num_train_epochs=1, report_to=[],
                                 use_cpu=True, save_strategy="steps", save_steps=1, seed=0, disable_tqdm=True, logging_strategy="no", **kw)
        return SureTrainer(model=copy.deepcopy(tiny_loaded.model), args=args,
                           data_collator=DataCollatorForLanguageModeling(tok, mlm=False), sure=SureArguments(buffer_size=8))

    limited, kept = tmp_path / "limited", tmp_path / "kept"
    for out, kw in ((limited, {"save_total_limit": 1}), (kept, {})):
        tr = trainer(out, **kw)
        for ds in sets:
            tr.next_task(ds)
    assert {p.name: sorted(q.name for q in p.iterdir()) for p in limited.iterdir()} == {f"task-{t}": ["sure-end"] for t in range(3)}
    assert {p.name: sorted(q.name for q in p.iterdir()) for p in kept.iterdir()} == {
        f"task-{t}": ["checkpoint-1", "checkpoint-2", "sure-end"] for t in range(3)}
    again = trainer(limited, save_total_limit=1)
    assert [again.next_task(ds, resume_from_checkpoint=True) for ds in sets] == [None, None, None]


def test_only_a_tasks_complete_checkpoints_are_removed(tmp_path):
    from surecl.integrations.transformers import STATE_JSON, _drop_task_checkpoints

    folder = tmp_path / "task-1"

    def put(name: str, task: int, done: bool = False, complete: bool = True) -> Path:
        ck = folder / name
        ck.mkdir(parents=True)
        (ck / STATE_JSON).write_text(json.dumps({"task": task, "done": done, "processes": 1}))
        if complete:
            (ck / "trainer_state.json").write_text("{}")
        return ck

    put("checkpoint-3", 1)
    put("checkpoint-4", 1, complete=False)  # half-written by a kill
    put("checkpoint-5", 2)  # another task's state
    (folder / "checkpoint-6").mkdir()
    (folder / "checkpoint-6" / "notes.txt").write_text("mine")
    (folder / "checkpoint-notes").mkdir()
    elsewhere = put("../elsewhere/checkpoint-9", 1)
    (folder / "checkpoint-9").symlink_to(elsewhere.resolve())
    _drop_task_checkpoints(folder, 1)
    assert (folder / "checkpoint-3").is_dir()  # no sure-end yet: nothing goes
    put("sure-end", 1, done=True)
    _drop_task_checkpoints(folder, 1)
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint-4", "checkpoint-5", "checkpoint-6", "checkpoint-9", "checkpoint-notes", "sure-end"]
    assert (elsewhere / STATE_JSON).is_file()


# --------------------------------------------------------------------------- 7: a finished run without checkpoints


def test_a_finished_run_without_checkpoints_through_the_python_api(finished, tmp_path, cache):
    """Every final output in place: one line saying it is finished, the folder untouched (it said
    "an output" was missing); one missing: named, in a sentence that reads; another config: one
    line. No checkpoint restores the trained learner or checks the data, so no results are
    returned beside an untrained peft_model."""
    from surecl.config import build_config
    from surecl.trainer import run

    cfg = build_config("tiny,slow_surprise", SMALL)
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    shutil.rmtree(out / "checkpoints")
    before = listing(out)
    with pytest.raises(SureclError, match=r"already holds this finished run, its final outputs in place .* load its adapters/") as err:
        run(cfg, out, progress=False, cache_dir=cache)
    assert "missing" not in str(err.value) and "an output" not in str(err.value)
    assert listing(out) == before
    with pytest.raises(SureclError, match=r"already holds a finished run with a different config"):
        run(build_config("tiny,slow_surprise", [*SMALL, "train.lr=0.001"]), out, progress=False, cache_dir=cache)
    assert listing(out) == before
    shutil.rmtree(out / "adapters" / "slow")
    with pytest.raises(SureclError, match=r"whose final output adapters/slow is missing and no checkpoint remains to write it again"):
        run(cfg, out, progress=False, cache_dir=cache)
    shutil.rmtree(out / "adapters" / "fast")
    with pytest.raises(SureclError, match=r"final outputs adapters/fast, adapters/slow are missing .* write them again"):
        run(cfg, out, progress=False, cache_dir=cache)


def test_a_run_that_finished_while_another_waited_for_its_lock_is_not_finished_again(finished, tmp_path, cache):
    """`surecl run` twice on one folder: the second checks for a finished run before it loads
    (none yet), waits for the lock, then found the first run's last checkpoint and finished the
    run again (results.json rewritten with its own host and time). Inside the lock, a folder
    whose results.json and final outputs are in place is finished: its results are returned."""
    from safetensors.torch import load_file

    from surecl.config import build_config
    from surecl.trainer import ContinualRun

    out = tmp_path / "run"
    shutil.copytree(finished, out)
    assert any((out / "checkpoints").iterdir())
    before = listing(out)
    r = ContinualRun(build_config("tiny,slow_surprise", SMALL), out, progress=False, cache_dir=cache)
    res = r.run()
    assert res == json.loads((out / "results.json").read_text()) and listing(out) == before
    # the last checkpoint restored the trained learner: peft_model is the run's, not a fresh LoRA
    saved = load_file(str(out / "adapters" / "slow" / "adapter_model.safetensors"))
    slow_b = {k: v for k, v in r.adapters.state_dict()[1].items() if "slow" in k and "lora_B" in k}
    assert slow_b and all(v.abs().max() > 0 for v in slow_b.values())  # a fresh LoRA's B is zero
    total = sum(float(v.abs().sum()) for k, v in saved.items() if "lora_B" in k)
    assert abs(sum(float(v.abs().sum()) for v in slow_b.values()) - total) <= 1e-4 * total  # the saved slow adapter
