"""surecl used as a library, on a model and tokenizer the caller built: a model that already holds
LoRA layers is refused, a failed construction gives the caller's model and tokenizer back as they
came, a ContinualRun runs once, a run leaves the caller's torch generators as it found them, and
loading a model leaves transformers' progress-bar setting as it was."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_runs import caller_model_and_tasks as caller_model

import surecl
from surecl.errors import SureclError

FAST = ["data.n_train=0", "data.n_test=0", "train.epochs=1", "eval.mode=rank"]


def caller_model_and_tasks():
    """The caller-built tiny Llama, tokenizer and two tasks of tests/test_api.py, smaller, built
    without touching the caller's torch generator (a test here checks that a run gives it back)."""
    with torch.random.fork_rng():
        return caller_model(n_train=4, n_test=2)


def lora_layers(model) -> int:
    from peft.tuners.lora import LoraLayer

    return sum(isinstance(m, LoraLayer) for m in model.modules())


def as_given(model, tokenizer) -> dict:
    """Everything of a model and tokenizer a run's construction may change."""
    return {
        "tree": str(model), "attributes": sorted(vars(model)), "weights": {n: p.detach().clone() for n, p in model.state_dict().items()},
        "grads": {n: p.requires_grad for n, p in model.named_parameters()},
        "modes": {n: m.training for n, m in model.named_modules()},
        "hooks": {n: (len(m._forward_pre_hooks), len(m._forward_hooks)) for n, m in model.named_modules()},
        "device": {p.device for p in model.parameters()}, "pad_token_id": model.config.pad_token_id,
        "tokenizer": (tokenizer.pad_token, tokenizer.padding_side),
    }


def same(a: dict, b: dict) -> bool:
    weights = a["weights"].keys() == b["weights"].keys() and all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])
    return weights and {k: v for k, v in a.items() if k != "weights"} == {k: v for k, v in b.items() if k != "weights"}


# ------------------------------------------------------------------ a model that holds LoRA layers


@pytest.mark.parametrize("preset", ["seq_lora", "slow_surprise"])
def test_a_model_an_earlier_run_wrapped_is_refused(preset, tmp_path):
    """The run adds its LoRA layers in place. A second run on the same model object crashed
    (dual: PEFT's "Adapter with name 'slow' already exists") or silently drew the shared fast
    layers afresh under the first run's peft_model; it is one line, and the first run's model
    stays as it was."""
    model, tokenizer, tasks = caller_model_and_tasks()
    cfg = surecl.build_config(f"tiny,{preset}", FAST)
    first = surecl.ContinualRun(cfg, tmp_path / "a", progress=False, model=model, tokenizer=tokenizer, tasks=tasks)
    adapters = {n: p.detach().clone() for n, p in first.model.named_parameters() if "lora_" in n}
    with pytest.raises(SureclError, match=r"^model: already holds PEFT adapter layers \(a model an earlier run wrapped in place.*"
                                          r"load it again \(from_pretrained"):
        surecl.ContinualRun(cfg, tmp_path / "b", progress=False, model=model, tokenizer=tokenizer, tasks=tasks)
    assert all(torch.equal(p, adapters[n]) for n, p in first.model.named_parameters() if "lora_" in n)
    assert not (tmp_path / "b").exists()


def test_a_caller_s_own_peft_model_is_refused(tmp_path):
    """A PeftModel was taken and its own adapter silently switched off (the run's fast adapter
    answered alone)."""
    from peft import LoraConfig, get_peft_model

    model, tokenizer, tasks = caller_model_and_tasks()
    mine = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    cfg = surecl.build_config("tiny,seq_lora", FAST)
    with pytest.raises(SureclError, match=r"^model: already holds PEFT adapter layers .* or a PeftModel's base after "
                                          r"peft_model.unload\(\)$"):
        surecl.ContinualRun(cfg, tmp_path / "a", progress=False, model=mine, tokenizer=tokenizer, tasks=tasks)
    assert mine.active_adapters == ["default"] and lora_layers(model) == 4
    base = mine.unload()  # as the message says: the base runs
    assert surecl.ContinualRun(cfg, tmp_path / "b", progress=False, model=base, tokenizer=tokenizer, tasks=tasks).model is not None


# ------------------------------------------------------------------ a failed construction


def test_a_failed_construction_gives_the_model_and_tokenizer_back(tmp_path, monkeypatch):
    """Each failure after the run began changing the caller's model left it changed: frozen, in
    eval mode, a hook on its output layer, the tokenizer padding left (and given the EOS as pad
    token), and, once the learner was built, its LoRA layers in place, so the corrected retry
    failed ("Adapter with name 'slow' already exists"). Now the model and tokenizer come back as
    they were given, whatever stopped the construction, and the retry runs."""
    model, tokenizer, tasks = caller_model_and_tasks()
    model.train()
    tokenizer.pad_token = None  # the run pads with the EOS then
    given = as_given(model, tokenizer)
    unknown = surecl.Task("t", "Classify the word ", ["yes", "no"], [surecl.Example("hot", "yes"), surecl.Example("cold", "no")],
                          [surecl.Example("hot", "yes")])
    cfg = surecl.build_config("tiny,slow_surprise", FAST)
    with pytest.raises(SureclError, match="^task t: the tokenizer reads label"):  # after the model was readied
        surecl.ContinualRun(cfg, tmp_path / "a", progress=False, model=model, tokenizer=tokenizer, tasks=[unknown])
    assert same(as_given(model, tokenizer), given)

    import surecl.run_setup as run_setup

    def interrupted(run):  # the end of the build: the learner, the method's setup and accelerate's prepare done
        raise KeyboardInterrupt

    monkeypatch.setattr(run_setup, "warn_slow_window", interrupted)
    with pytest.raises(KeyboardInterrupt):
        surecl.ContinualRun(cfg, tmp_path / "b", progress=False, model=model, tokenizer=tokenizer, tasks=tasks)
    assert lora_layers(model) == 0 and same(as_given(model, tokenizer), given)
    monkeypatch.undo()

    class Broken(surecl.Method):
        def setup(self, ctx):
            raise SureclError("method broken: cannot set up")

    surecl.register_method("broken_setup", Broken)
    try:
        with pytest.raises(SureclError, match="^method broken: cannot set up$"):
            surecl.ContinualRun(surecl.build_config("tiny", [*FAST, "method=broken_setup"]), tmp_path / "c", progress=False,
                                model=model, tokenizer=tokenizer, tasks=tasks)
    finally:
        from surecl import registry

        registry.unregister_method("broken_setup")
    assert same(as_given(model, tokenizer), given)
    run = surecl.ContinualRun(cfg, tmp_path / "d", progress=False, model=model, tokenizer=tokenizer, tasks=tasks)
    assert run.run()["accuracy_matrix"][1][1] is not None  # the corrected retry runs


def test_two_plugins_of_one_name_are_one_line_before_anything_changes(tmp_path):
    """A ValueError once the learner had wrapped the model (its LoRA layers left in place)."""

    class P(surecl.Plugin):
        name = "p"

    model, tokenizer, tasks = caller_model_and_tasks()
    given = as_given(model, tokenizer)
    cfg = surecl.build_config("tiny,slow_surprise", FAST)
    with pytest.raises(SureclError, match=r"^plugins: two plugins share a name in \['p', 'p'\]"):
        surecl.ContinualRun(cfg, tmp_path / "a", progress=False, model=model, tokenizer=tokenizer, tasks=tasks, plugins=[P(), P()])
    assert same(as_given(model, tokenizer), given)
    surecl.ContinualRun(cfg, tmp_path / "b", progress=False, model=model, tokenizer=tokenizer, tasks=tasks, plugins=[P()])


# ------------------------------------------------------------------ one run per object


def test_a_continual_run_runs_once(tmp_path, monkeypatch):
    """run(fresh=True) on an object that had run cleared the folder, trained nothing (its state
    said every stage was done) and wrote results.json from the old state; now it is one line
    and the folder keeps the finished run. A second plain run() returns the finished run again,
    as before; a first call the folder refused leaves the object as built, and a run stopped
    part way cannot go on on the same object."""
    from tiny_runs import stopped_at

    model, tokenizer, tasks = caller_model_and_tasks()
    cfg = surecl.build_config("tiny,seq_lora", FAST)
    run = surecl.ContinualRun(cfg, tmp_path / "a", progress=False, model=model, tokenizer=tokenizer, tasks=tasks)
    first = run.run()
    written = (tmp_path / "a" / "results.json").read_text()
    assert run.run() == first  # the folder's finished run, returned again
    with pytest.raises(SureclError, match=r"^ContinualRun.run\(fresh=True\): this ContinualRun already ran into .* build a new "
                                          r"ContinualRun \(on a freshly loaded base model\) to start over$"):
        run.run(fresh=True)
    with pytest.raises(SureclError, match="already ran"):
        run.run(resume=False)
    assert (tmp_path / "a" / "results.json").read_text() == written and json.loads(written)["steps"] == first["steps"] > 0
    assert (tmp_path / "a" / "log.jsonl").read_text().count("\n") == first["steps"]

    model, tokenizer, tasks = caller_model_and_tasks()
    again = surecl.ContinualRun(cfg, tmp_path / "a", progress=False, model=model, tokenizer=tokenizer, tasks=tasks)
    with pytest.raises(SureclError, match="pass fresh=True"):  # refused by the folder: the object is untouched
        again.run(resume=False)
    assert again.run(fresh=True)["steps"] == first["steps"]

    model, tokenizer, tasks = caller_model_and_tasks()
    stopped = surecl.ContinualRun(cfg, tmp_path / "b", progress=False, model=model, tokenizer=tokenizer, tasks=tasks)
    stopped_at(monkeypatch, "step:1:0", stopped.run)
    with pytest.raises(SureclError, match=r"^ContinualRun.run: this ContinualRun already ran .* to run again$"):
        stopped.run()
    model, tokenizer, tasks = caller_model_and_tasks()  # a new object on a fresh base resumes it
    resumed = surecl.ContinualRun(cfg, tmp_path / "b", progress=False, model=model, tokenizer=tokenizer, tasks=tasks).run()
    assert resumed["accuracy_matrix"] == first["accuracy_matrix"]


# ------------------------------------------------------------------ the caller's random streams


def test_a_run_leaves_the_caller_s_torch_generator_as_it_found_it(tmp_path):
    """Each run reseeded torch's global generator and left it so: the caller's seeding had no
    effect on its later draws. Its draws now go on from the caller's state, whether the run was
    built, ran, or failed; the run's own numbers stay its seed's, whatever the caller draws
    between building the run and running it."""
    cfg = surecl.build_config("tiny,seq_lora", [*FAST, "lora.dropout=0.2", "train.epochs=2"])  # dropout: the run draws masks
    model, tokenizer, tasks = caller_model_and_tasks()
    torch.manual_seed(11)
    reference = surecl.ContinualRun(cfg, tmp_path / "a", progress=False, model=model, tokenizer=tokenizer, tasks=tasks).run()
    after_run = torch.rand(4)
    torch.manual_seed(11)
    assert torch.equal(after_run, torch.rand(4))

    model, tokenizer, tasks = caller_model_and_tasks()
    torch.manual_seed(12)
    run = surecl.ContinualRun(cfg, tmp_path / "b", progress=False, model=model, tokenizer=tokenizer, tasks=tasks)
    after_build = torch.rand(4)  # the caller draws between the build and the run
    torch.manual_seed(12)
    assert torch.equal(after_build, torch.rand(4))
    results = run.run()
    assert results["accuracy_matrix"] == reference["accuracy_matrix"]
    assert [json.loads(line)["loss"] for line in (tmp_path / "b" / "log.jsonl").read_text().splitlines()] == \
           [json.loads(line)["loss"] for line in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]

    model, tokenizer, _ = caller_model_and_tasks()
    torch.manual_seed(13)
    with pytest.raises(SureclError, match="^tasks: expected a list"):
        surecl.ContinualRun(cfg, tmp_path / "c", progress=False, model=model, tokenizer=tokenizer, tasks=["not a task"])
    after_failure = torch.rand(4)
    torch.manual_seed(13)
    assert torch.equal(after_failure, torch.rand(4))


# ------------------------------------------------------------------ transformers' progress bars


@pytest.mark.parametrize("shown", [True, False])
def test_loading_a_model_leaves_transformers_progress_bars_as_they_were(shown, tiny_cache):
    """load_model turned transformers' progress bars off for the rest of the caller's process."""
    from transformers.utils import logging as hf_logging

    from surecl.config import ModelConfig
    from surecl.model import load_model

    was = hf_logging.is_progress_bar_enabled()
    try:
        (hf_logging.enable_progress_bar if shown else hf_logging.disable_progress_bar)()
        load_model(ModelConfig(name="tiny"), torch.device("cpu"), tiny_cache)
        assert hf_logging.is_progress_bar_enabled() is shown
        with pytest.raises(SureclError, match="^model.dtype=bf16"):  # a load that fails leaves it too
            load_model(ModelConfig(name="tiny", dtype="bf16"), torch.device("cpu"), tiny_cache)
        assert hf_logging.is_progress_bar_enabled() is shown
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()
