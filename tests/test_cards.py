"""What the exported model cards (``README.md``) and ``prompt.json`` say, checked against the
config and the run they describe: the slow adapter's EMA rate in its unit (``dual.unit``), the
order a ``data.tasks`` stream ran in, the fast adapter's role by method (MTL's joint stage,
per-task FT's last task), Progressive Prompts' card, a perplexity run's ``prompt.json`` (which
plain transformers + peft reproduce), and when ``export`` runs against ``results.json``."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

import surecl.plugins.base
from surecl.adapters import resolve_beta
from surecl.card import model_card
from surecl.config import DualConfig, build_config
from surecl.plugins.base import Plugin
from surecl.trainer import ContinualRun

SMALL = ["data.tasks=[colors,animals]", "data.n_train=8", "data.n_test=4", "train.epochs=1"]


def _run(preset: str, extra: list[str], out, cache, plugins=()):
    run = ContinualRun(build_config(preset, SMALL + extra), out, progress=False, cache_dir=cache, plugins=list(plugins))
    return run, run.run()


@pytest.fixture(scope="module")
def example_run(tiny_cache, tmp_path_factory):
    """A dual run whose EMA counts new examples (``dual.unit=example``), beta 0.995 as the
    ``paper-*`` presets set it, batch 4."""
    out = tmp_path_factory.mktemp("cards") / "example"
    _, results = _run("tiny,slow_surprise", ["dual.unit=example", "dual.beta=0.995", "train.batch_size=4"], out, tiny_cache)
    return out, results


# ----------------------------------------------------------------------------- 1. the EMA rate and its unit

def test_slow_card_gives_beta_per_new_example_and_per_step(example_run):
    out, results = example_run
    card = (out / "adapters" / "slow" / "README.md").read_text()
    assert results["config"]["dual"]["unit"] == "example" and results["config"]["train"]["batch_size"] == 4
    assert ("beta 0.995 per new training example (0.995^n per optimizer step of n new examples; "
            f"0.995^4 = {0.995 ** 4:.4g} at this run's batch size of 4)") in card, card
    assert "(beta 0.995) of the fast one after every step" not in card


def _card(results: dict, **dual) -> str:
    res = copy.deepcopy(results)
    res["config"]["dual"].update(dual)
    return model_card(res, "slow", "base", "a note", "0")


def test_slow_card_wording_per_unit_and_with_beta_auto(example_run):
    """unit=step keeps "after every step"; beta=auto reads the rate the run resolved, per example
    (a window of window_tasks tasks of new examples) or per step, as each unit resolves it."""
    _, results = example_run
    step = _card(results, unit="step")
    assert "an exponential moving average (beta 0.995) of the fast one after every step" in step
    assert "per new training example" not in step
    # auto, unit=example: 1 - 1/(0.5 x 8 examples of the first task) = 0.75 per example
    beta = resolve_beta(DualConfig(enabled=True, beta="auto", unit="example"), 8)
    assert beta == pytest.approx(0.75)
    auto = _card({**results, "dual_beta": beta}, beta="auto", unit="example")
    assert (f"beta 0.75, from dual.beta=auto, per new training example (0.75^n per optimizer step of n new examples; "
            f"0.75^4 = {0.75 ** 4:.4g} at this run's batch size of 4)") in auto, auto
    # auto, unit=step: 1 - 1/(0.5 x 2 steps) = 0 (at least one update): the slow adapter follows the fast one
    beta = resolve_beta(DualConfig(enabled=True, beta="auto", unit="step"), 2)
    auto_step = _card({**results, "dual_beta": beta}, beta="auto", unit="step")
    assert "an exponential moving average (beta 0, from dual.beta=auto) of the fast one after every step" in auto_step


# ----------------------------------------------------------------------------- 4. card text against the config

def test_card_names_the_custom_order_of_data_tasks(example_run):
    out, results = example_run
    card = (out / "adapters" / "slow" / "README.md").read_text()
    assert "| benchmark / order | `tiny` / `custom`" in card, card
    assert "`tiny` / `default`" not in card
    default = copy.deepcopy(results)
    default["config"]["data"]["tasks"] = []
    assert "| benchmark / order | `tiny` / `default` |" in model_card(default, "slow", "base", "a note", "0")


class Export(Plugin):
    """Records what ``export`` finds: whether results.json exists, and the results it is handed."""

    name = "export_probe"

    def export(self, ctx, results):
        self.results_json = (ctx.out_dir / "results.json").exists()
        self.results = results


@pytest.fixture(scope="module")
def per_task_run(tiny_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("cards") / "per_task"
    probe = Export()
    _, results = _run("tiny,per_task", [], out, tiny_cache, plugins=[probe])
    return out, results, probe


def test_mtl_card_says_the_tasks_were_trained_jointly(tiny_cache, tmp_path):
    _run("tiny,mtl", [], tmp_path / "mtl", tiny_cache)
    card = (tmp_path / "mtl" / "adapters" / "fast" / "README.md").read_text()
    assert "each task in turn" not in card, card
    assert "the **fast** adapter: trained by AdamW on all 2 tasks together, in one stage" in card


def test_per_task_card_says_the_fast_adapter_is_the_last_tasks(per_task_run):
    out, results, _ = per_task_run
    card = (out / "adapters" / "fast" / "README.md").read_text()
    assert "each task in turn" not in card, card
    assert "the **fast** adapter as the last stage (`animals`) left it" in card
    assert "method `per_task` answered each task with weights of its own (each task's adapter snapshot)" in card


# ----------------------------------------------------------------------------- 5. export runs before results.json

def test_export_runs_before_results_json_and_gets_the_results(per_task_run):
    out, results, probe = per_task_run
    assert probe.results_json is False and probe.results is results and (out / "results.json").is_file()
    doc = " ".join(surecl.plugins.base.__doc__.split())
    assert "after ``results.json``" not in doc
    assert "before ``results.json`` is written" in doc
    assert "results.json" in " ".join((Plugin.export.__doc__ or "").split())


# ----------------------------------------------------------------------------- 2. Progressive Prompts' card

def test_progressive_prompts_folder_has_a_model_card(tiny_cache, tmp_path):
    out = tmp_path / "pp"
    _, results = _run("tiny,progressive_prompts", [], out, tiny_cache)
    folder = out / "adapters" / "prompts"
    card = (folder / "README.md").read_text()
    meta = json.loads((folder / "prompts.json").read_text())
    assert meta["base_model"] in card and "tiny random Llama" in card  # the base and its note
    for words in ("prompts.safetensors", "prompts.json", "prompt.json", meta["usage"], "| tasks, in training order | colors, animals |",
                  "| method / preset | `progressive_prompts`", f"{meta['length']} vectors", "inputs_embeds"):
        assert words in card, (words, card)
    assert "# surecl LoRA adapter" not in card and "PeftModel" not in card


def test_readme_says_progressive_prompts_exports_prompts_instead(request):
    readme = " ".join((request.config.rootpath / "README.md").read_text().split())
    assert "for Progressive Prompts also `adapters/prompts`" not in readme
    assert "for Progressive Prompts: `adapters/prompts`" in readme


# ----------------------------------------------------------------------------- 3. a perplexity run's prompt.json

@pytest.mark.parametrize("start", ["auto", "<eos>"])
def test_perplexity_prompt_json_describes_perplexity_which_plain_peft_reproduces(tiny_cache, tmp_path, start):
    """Also under ``data.text_start``: the start token prompt.json names is the one the run
    trained and scored from."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "cpt"
    run, results = _run("tiny,cpt,slow_surprise", [f"data.text_start={start}"], out, tiny_cache)
    folder = out / "adapters" / "slow"
    spec = json.loads((folder / "prompt.json").read_text())
    for key in ("template", "decoding", "predictions", "normalisation"):
        assert key not in spec, key
    assert "predictions.jsonl" not in json.dumps(spec) and not (out / "predictions.jsonl").exists()
    ppl = spec["perplexity"]
    assert ppl["max_length"] == run.cfg.model.max_length and ppl["measured_with"] == "slow" and ppl["this_adapter_measured"] is True
    # the spec alone: start token + the document's ids cut to max_length - 1, every token after the start scored, exp(total / count)
    tok = AutoTokenizer.from_pretrained(spec["base_model"])
    assert ppl["start_token_id"] == (tok.bos_token_id if start == "auto" else tok.eos_token_id)
    assert {e.prompt[0] for t in run.train_sets for e in t} == {ppl["start_token_id"]}
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(spec["base_model"]), str(folder)).eval()
    for j, entry in enumerate(spec["tasks"]):
        assert entry["kind"] == "text" and entry["metric"] == "perplexity"
        nll, count = 0.0, 0
        docs = [e.sentence for e in run.tasks[j].test]
        assert len(docs) == len(run.test_sets[j])
        for text in docs:
            ids = [ppl["start_token_id"]] + tok(text, add_special_tokens=False)["input_ids"][: ppl["max_length"] - 1]
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids])).logits[0].float()
            nll += torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="sum").item()
            count += len(ids) - 1
        assert math.exp(nll / count) == pytest.approx(results["accuracy_matrix"][-1][j], rel=1e-3)


def test_a_generation_tasks_prompt_json_says_its_prompt_ends_with_eos_under_encoder_eos():
    """model.encoder_eos ends generation and chat prompts with EOS (tests/test_encode_edges.py):
    prompt.json's entry for such a task says so, and without it says nothing of it."""
    from surecl.card import _generation_spec

    for chat in (False, True):
        with_eos, without = _generation_spec(chat, "exact_match", eos=True), _generation_spec(chat, "exact_match")
        assert with_eos["prompt"].endswith("then the EOS token (encoder_eos), counted in max_length and never cut")
        assert "EOS" not in without["prompt"] and with_eos["answer"] == without["answer"]


def test_a_generation_tasks_prompt_json_says_how_references_are_scored():
    """Under eval.references=max the task's score is a mean over instances of their best row,
    not the mean of predictions.jsonl's row scores: prompt.json says so; under rows, nothing."""
    from surecl.card import _generation_spec

    for metric in ("rouge_l", "exact_match"):
        best = _generation_spec(True, metric, references="max")
        assert "one instance" in best["references"] and "mean over instances" in best["references"]
        assert "references" not in _generation_spec(True, metric)


def test_a_generation_tasks_prompt_json_gives_the_prompt_head_its_rows_were_encoded_with(tiny_cache, tmp_path):
    """A generation task's prompt.json entry names its ``prompt_head`` (O-LoRA's task prefix
    with ``data.task_prefix=true``, then the instruction), and [bos] + head + input + the tail,
    each tokenised alone as the entry says, is the prompt the run encoded for a test row."""
    out = tmp_path / "gen"
    run, _ = _run("tiny,seq_lora", ["data.kind=generate", "data.task_prefix=true", "model.max_length=256"], out, tiny_cache)
    [entry, _] = json.loads((out / "adapters" / "fast" / "prompt.json").read_text())["tasks"]
    task = run.tasks[0]
    assert entry["prompt_head"] == f"Task:{task.group}\nDataset:{task.name}\n{task.instruction}" and "prompt_head" in entry["prompt"]
    tok = run.tokenizer

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    start = json.loads((out / "adapters" / "fast" / "prompt.json").read_text())["template"]["start_ids"]
    row = task.test[0]
    assert run.test_sets.encoded[0][0].prompt == start + ids(entry["prompt_head"]) + ids(row.sentence) + ids("\nAnswer:")
