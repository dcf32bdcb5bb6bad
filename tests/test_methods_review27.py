"""The methods review (session 27): what a dual run's fast row is where the method's training
reads the slow adapter (I-LoRA), combinations that would run as another method (a replay policy
under MTL, I-LoRA's replayed-rows term without replay), Progressive Prompts' initial prompt at
the scale of the model's own token inputs, and N-LoRA's ``l1_of=ab`` refusal from the model's
config alone."""

from __future__ import annotations

import json
import types

import pytest
import torch

from surecl.config import build_config, config_warnings
from surecl.errors import SureclError
from surecl.trainer import run

SMALL = ["data.tasks=[colors,animals]", "data.n_train=8", "data.n_test=4", "train.epochs=1"]
SOLO = "the same run without the slow learner"
COUPLED = "the fast (plastic) adapter, trained with the slow one's consistency term (not the method without the slow learner)"


# ------------------------------------------------------------------ 1: I-LoRA's fast row is not I-LoRA alone


def _results(method: str, preset: str, order: str = "1", seed: int = 0, fp: float = 60.0, fast_fp: float = 55.0) -> dict:
    return {
        "tasks": ["a", "b"], "metric": "accuracy", "accuracy_matrix": [[90.0, None], [fp, 90.0]],
        "fp": fp, "ap": 90.0, "forgetting": 90.0 - fp, "bwt": fp - 90.0, "avg_incremental": (fp + 90.0) / 2,
        "config": {"preset": preset, "method": method, "seed": seed, "data": {"order": order}, "dual": {"enabled": True},
                   "replay": {"policy": "random"}},
        "fast": {"accuracy_matrix": [[85.0, None], [fast_fp, 85.0]], "fp": fast_fp, "ap": 85.0, "forgetting": 85.0 - fast_fp,
                 "bwt": fast_fp - 85.0, "avg_incremental": (fast_fp + 85.0) / 2},
    }


def test_the_declaration_says_which_methods_fast_adapter_is_the_method_alone():
    from surecl.methods.base import Method, fast_words
    from surecl.registry import method_class, method_names

    assert Method.fast_is_solo is True
    coupled = [name for name in method_names() if not method_class(name).fast_is_solo]
    assert coupled == ["ilora"]  # its consistency term reads the slow adapter at every step
    assert fast_words(method_class("ilora")) == COUPLED
    assert fast_words(method_class("sequential")) == SOLO
    assert fast_words(None) == "the fast adapter of the same run"  # a method not registered here: neither claim


def test_a_method_declaring_fast_is_solo_other_than_a_bool_is_refused(registered):
    from surecl.methods.base import Method

    class Odd(Method):
        name = "odd_solo"
        fast_is_solo = "no"

    with pytest.raises((TypeError, ValueError, SureclError), match="fast_is_solo must be True or False"):
        registered("odd_solo", Odd)


def test_report_md_names_ilora_s_fast_row_as_the_coupled_plastic_adapter():
    from surecl.report import _fast_section

    ilora = "\n".join(_fast_section(_results("ilora", "ilora"), 1))
    assert f"## Fast adapter ({COUPLED})" in ilora and SOLO not in ilora
    surprise = "\n".join(_fast_section(_results("sequential", "slow_surprise"), 1))
    assert f"## Fast adapter ({SOLO})" in surprise
    # a results.json of a method not registered here claims neither
    other = "\n".join(_fast_section(_results("not_here", "not_here"), 1))
    assert "## Fast adapter (the fast adapter of the same run)" in other


def test_the_paper_layout_says_what_ilora_s_fast_row_is(tmp_path):
    from surecl.report import paper_report

    for row, method in (("ilora", "ilora"), ("slow_surprise", "sequential")):
        for seed in (0, 1):
            d = tmp_path / row / f"seed{seed}"
            d.mkdir(parents=True)
            (d / "results.json").write_text(json.dumps(_results(method, row, seed=seed, fp=60.0 + seed)))
    rep = paper_report([tmp_path])
    main = next(t for t in rep.tables if t.name == "main")
    assert f" ilora (fast): {COUPLED}." in main.markdown
    assert "slow_surprise (fast):" not in main.markdown  # SuRe's fast adapter is the method alone: nothing to say
    forgetting = next(t for t in rep.tables if t.name == "forgetting")
    assert f" ilora (fast): {COUPLED}." in forgetting.markdown
    head = rep.markdown().split("## ", 1)[0]
    assert "Fast rows that are not their method without the slow learner" in head and COUPLED in head
    # only SuRe's runs: no such sentence anywhere
    for p in (tmp_path / "ilora").rglob("results.json"):
        p.unlink()
    assert "consistency term" not in paper_report([tmp_path]).markdown()


# ------------------------------------------------------------------ 2a: a replay policy under MTL


REPLAY_UNDER_MTL = ("replay.policy=surprise is not read: method mtl is not continual (every task in one stage) and replays "
                    "nothing, though config.yaml and results.json record the policy; set replay.policy=none")


def test_a_replay_policy_the_user_gives_mtl_is_warned_about(tmp_path):
    assert REPLAY_UNDER_MTL in config_warnings(build_config("tiny,mtl", ["replay.policy=surprise"]))
    assert REPLAY_UNDER_MTL in config_warnings(build_config("tiny,mtl", ["replay={policy: surprise}"]))  # inside a mapping
    # the user's method over a preset's policy (slow_surprise, the default preset): the run replays nothing either
    assert REPLAY_UNDER_MTL in config_warnings(build_config("tiny", ["method=mtl"]))
    own = tmp_path / "mine.yaml"
    own.write_text("kind: method\nmethod: mtl\nreplay: {policy: surprise}\n")
    assert REPLAY_UNDER_MTL in config_warnings(build_config(f"tiny,{own}"))
    # surecl's own presets: mtl sets none; presets alone that set both say nothing
    assert config_warnings(build_config("tiny,mtl")) == []
    assert config_warnings(build_config("tiny,mtl,surprise")) == []
    # a continual method reads its policy
    assert config_warnings(build_config("tiny,seq_lora", ["replay.policy=surprise"])) == []
    # a run's own saved config.yaml restates the keys: rerunning it stays quiet
    saved = tmp_path / "config.yaml"
    saved.write_text(build_config("tiny,mtl", ["replay.policy=surprise"]).to_yaml())
    assert not any("is not continual" in w for w in config_warnings(build_config(str(saved))))


def test_the_dry_run_prints_it(tiny_cache):
    from surecl.plan import describe

    text = describe(build_config("tiny,mtl", [*SMALL, "replay.policy=surprise"]), tiny_cache)
    assert text.count(f"warning: {REPLAY_UNDER_MTL}") == 1


def _planned(plan):
    from surecl.sweep import expand

    runs = expand(plan)
    return runs, [build_config(f"{plan.config},{r.method}", r.overrides) for r in runs]


def test_a_sweep_refuses_a_replay_axis_over_mtl():
    """Its rows would be one run under several names (the run ignores the replay section)."""
    from surecl.sweep import Plan, check_grid_read

    for grid in ({"replay.buffer_size": ["2", "8"]}, {"replay.policy": ["surprise", "reservoir"]}):
        key = next(iter(grid))
        with pytest.raises(SureclError, match=rf"^sweep: grid key {key} is not read by run mtl/{key}=\S+/orderdefault/seed0 \(method mtl "
                           r"is not continual and replays nothing\), so its rows would be one run under several names; give mtl a "
                           r"group without the replay axis$"):
            check_grid_read(*_planned(Plan(config="tiny", methods=["surprise", "mtl"], grid=grid)))
    # the same axis over continual methods, and another axis over mtl, pass
    check_grid_read(*_planned(Plan(config="tiny", methods=["surprise", "reservoir"], grid={"replay.buffer_size": ["2", "8"]})))
    check_grid_read(*_planned(Plan(config="tiny", methods=["mtl"], grid={"train.epochs": ["1", "2"]})))


def test_surecl_sweep_stops_on_it_before_it_writes_anything(tmp_path, capsys):
    from surecl.cli import main

    out = tmp_path / "sw"
    code = main(["sweep", "--config", "tiny", "--methods", "mtl", "--grid", "replay.buffer_size=2,8", "--out", str(out), *SMALL])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "grid key replay.buffer_size is not read by run mtl/" in err[0]
    assert not out.exists() or not any(out.iterdir())


# ------------------------------------------------------------------ 2b: I-LoRA's replayed-rows term without replay


ILORA_NO_REPLAY = ("ilora.rows: 'replayed' computes the consistency term on replayed rows only, and replay.policy=none replays "
                   "none, so the term would never run; set a replay policy (ilora_llmcl's: replay.policy=reservoir) or ilora.rows=all "
                   "(ilora.consistency_weight=0 turns the term off on purpose)")


def test_ilora_s_replayed_rows_without_replay_are_refused_in_one_line():
    with pytest.raises(SureclError) as err:
        build_config("tiny,ilora_llmcl", ["replay.policy=none"])
    assert str(err.value) == ILORA_NO_REPLAY
    with pytest.raises(SureclError, match="^ilora.rows: 'replayed'"):
        build_config("tiny,ilora", ["ilora.rows=replayed", "replay={policy: none}"])
    # what runs the term passes: replayed rows with replay, every row without it
    build_config("tiny,ilora_llmcl")
    build_config("tiny,ilora_llmcl", ["replay.policy=random"])
    build_config("tiny,ilora", ["replay.policy=none"])


@pytest.mark.parametrize("dry", [True, False])
def test_the_run_and_its_dry_run_stop_before_anything(dry, tmp_path, capsys, tiny_cache, monkeypatch):
    from surecl.cli import main

    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    out = tmp_path / "run"
    code = main(["run", "--quiet", "--config", "tiny,ilora_llmcl", "--out", str(out), *SMALL, "replay.policy=none",
                 *(["--dry-run"] if dry else [])])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"surecl: error: {ILORA_NO_REPLAY}"]
    assert not out.exists()


# ------------------------------------------------------------------ 3: Progressive Prompts' initial prompt


def _initial_prompt(model, length: int = 6, row: int = 0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt ``before_task`` gives task ``row``, and the ids it drew (the method's own rule)."""
    from surecl.adapters import task_seed
    from surecl.methods.progressive_prompts.config import PromptsConfig
    from surecl.methods.progressive_prompts.method import ProgressivePrompts
    from surecl.plugins.base import Stage

    pp = ProgressivePrompts(PromptsConfig(length=length))
    ctx = types.SimpleNamespace(model=model, streams_seed=seed, reset_optimizer=lambda: None)
    pp.setup(ctx)
    pp.before_task(ctx, Stage((row,), row, tuple(range(row + 1))))
    g = torch.random.fork_rng()
    with g:
        torch.manual_seed(task_seed(seed, row, 1))
        ids = torch.randint(model.get_input_embeddings().num_embeddings, (length,))
    return pp.module.current.detach().clone(), ids


def _small(kind: str):
    from transformers import (
        GemmaConfig,
        GemmaForCausalLM,
        GPT2Config,
        GPT2LMHeadModel,
        MBartConfig,
        MBartForConditionalGeneration,
        T5Config,
        T5ForConditionalGeneration,
    )

    torch.manual_seed(0)
    if kind == "gemma":
        return GemmaForCausalLM(GemmaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                            num_attention_heads=4, num_key_value_heads=4, head_dim=16))
    if kind == "mbart":
        return MBartForConditionalGeneration(MBartConfig(vocab_size=100, d_model=64, encoder_layers=1, decoder_layers=1,
                                                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                                         decoder_ffn_dim=64, scale_embedding=True))
    if kind == "t5":
        return T5ForConditionalGeneration(T5Config(vocab_size=100, d_model=64, d_kv=16, d_ff=64, num_layers=1, num_heads=4))
    return GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=64, n_layer=1, n_head=4, n_positions=64))


@pytest.mark.parametrize("kind", ["gemma", "mbart"])
def test_a_scaled_embeddings_prompt_starts_at_its_tokens_scale(kind):
    """The prompt replaces the embedding module's output, which such a model scales by sqrt(d):
    the prompt starts as that output for its random tokens, not as the table's raw rows."""
    model = _small(kind)
    prompt, ids = _initial_prompt(model)
    embedding = model.get_input_embeddings()
    with torch.no_grad():
        real = embedding(ids)  # what those tokens enter the model as
    assert torch.equal(prompt, real.float())
    assert not torch.allclose(prompt, embedding.weight[ids].float())  # the raw rows: 1/sqrt(d) of it


def test_an_unscaled_models_prompt_is_its_rows_bit_for_bit(fresh_tiny):
    """The committed studies' Progressive Prompts runs (SmolLM2, T5, the tiny Llama) start from
    exactly the prompts they started from: the table's rows."""
    for model in (fresh_tiny, _small("t5"), _small("gpt2")):
        embedding = model.get_input_embeddings()
        for row in (0, 2):
            prompt, ids = _initial_prompt(model, row=row, seed=3)
            assert torch.equal(prompt, embedding.weight[ids].float())


def test_a_progressive_prompts_run_on_the_tiny_model_is_unchanged(tmp_path, tiny_cache):
    """The prompts a whole run starts each task from, read before training moves them."""
    from surecl.plugins.base import Plugin

    class First(Plugin):
        name = "first"

        def __init__(self):
            super().__init__()
            self.start = []

        def before_task(self, ctx, stage):
            emb = ctx.model.get_input_embeddings()
            self.start.append((ctx.method.module.current.detach().clone(), emb.weight.detach().clone()))

    probe = First()
    run(build_config("tiny,progressive_prompts", [*SMALL, "train.epochs=1"]), tmp_path / "pp", progress=False,
        cache_dir=tiny_cache, plugins=[probe])
    from surecl.adapters import task_seed

    for row, (prompt, table) in enumerate(probe.start):
        with torch.random.fork_rng():
            torch.manual_seed(task_seed(0, row, 1))
            ids = torch.randint(table.shape[0], (prompt.shape[0],))
        assert torch.equal(prompt, table[ids].float())


# ------------------------------------------------------------------ 4: N-LoRA's l1_of=ab from the model's config


def test_nlora_s_code_form_is_refused_from_the_model_config_in_the_runs_words(tmp_path, tiny_cache, tiny_loaded):
    from surecl.methods.olora import NLoRA
    from surecl.registry import method_config

    cfg = build_config("tiny,nlora_official", SMALL)
    with pytest.raises(SureclError) as ran:
        run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    with pytest.raises(SureclError) as checked:
        NLoRA(method_config(cfg)).check_run_model(cfg, tiny_loaded.model.config, False)
    assert str(checked.value) == str(ran.value)
    assert str(ran.value).startswith("nlora.l1_of: 'ab' multiplies A (r x in) by B (out x r), which needs in == out, but "
                                     "model.layers.0.mlp.gate_proj maps 128 to 256;")
    # square targets, or the paper's form, pass
    square = build_config("tiny,nlora_official", [*SMALL, "lora.target_modules=[q_proj,v_proj]"])
    NLoRA(method_config(square)).check_run_model(square, tiny_loaded.model.config, False)
    delta = build_config("tiny,nlora", SMALL)
    NLoRA(method_config(delta)).check_run_model(delta, tiny_loaded.model.config, False)


def test_gpt2s_conv1d_layers_are_judged_by_their_stored_widths():
    from surecl.methods.olora import NLoRA
    from surecl.registry import method_config

    gpt2 = _small("gpt2").config
    cfg = build_config("tiny,nlora_official", ["lora.target_modules=[c_attn]"])
    with pytest.raises(SureclError, match=r"but transformer.h.0.attn.c_attn maps 64 to 192;"):
        NLoRA(method_config(cfg)).check_run_model(cfg, gpt2, False)
    proj = build_config("tiny,nlora_official", ["lora.target_modules=[c_proj]"])
    with pytest.raises(SureclError, match=r"but transformer.h.0.mlp.c_proj maps 256 to 64;"):  # attn.c_proj is square, mlp's is not
        NLoRA(method_config(proj)).check_run_model(proj, gpt2, False)


def test_check_run_model_is_check_model_for_every_other_method(tiny_loaded):
    """The default: the method's own model check (I-LoRA's hidden-state indices)."""
    from surecl.methods.ilora import ILoRA
    from surecl.registry import method_config

    cfg = build_config("tiny,ilora", ["ilora.layers=7"])
    with pytest.raises(SureclError, match=r"^ilora.layers: 7 asks for hidden state 7, but this model has 3"):
        ILoRA(method_config(cfg)).check_run_model(cfg, tiny_loaded.model.config, False)


def test_the_dry_run_says_nloras_code_form_line(tmp_path, tiny_cache, tiny_loaded, monkeypatch, capsys):
    """``surecl run --config tiny,nlora_official --dry-run`` planned the run without a word
    (the check lived in ``NLoRA.setup``, after the model loaded); the dry run now prints the
    run's own line under its model line (``plan.describe`` calls ``check_run_model``)."""
    from test_model_checks_review25 import dry_errors

    folder = tmp_path / "model"  # a model folder, whose config the dry run reads
    tiny_loaded.model.save_pretrained(folder)
    tiny_loaded.tokenizer.save_pretrained(folder)
    given = [*SMALL, f"model.name={folder}"]
    lines = dry_errors(["--config", "tiny,nlora_official", *given, "--out", str(tmp_path / "r")], tiny_cache, monkeypatch, capsys)
    assert len(lines) == 1 and lines[0].startswith("nlora.l1_of: 'ab' multiplies A (r x in) by B (out x r), which needs in == out"), lines
    assert "maps 128 to 256" in lines[0], lines
    assert dry_errors(["--config", "tiny,nlora", *given, "--out", str(tmp_path / "s")], tiny_cache, monkeypatch, capsys) == []
