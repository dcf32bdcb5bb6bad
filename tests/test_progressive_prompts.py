"""Progressive Prompts (``method=progressive_prompts``): one soft prompt per task, the earlier
ones frozen, the base and the learner's LoRA untouched; the prompts reach every forward of the
engine (training, scoring, generation, ranking, the shared-prefix KV cache, seq2seq), checked
against an independent computation that feeds ``[prompts; token embeddings]`` as
``inputs_embeds``; what it keeps of earlier tasks; the prompts a run leaves for reuse."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from surecl import checkpoint
from surecl.config import build_config
from surecl.data.encode import Encoded
from surecl.errors import SureclError
from surecl.evaluate import accuracy, generate_answers, option_logprobs
from surecl.nll import token_nll
from surecl.plugins.base import Plugin
from surecl.trainer import ContinualRun, run

TASKS = "data.tasks=[colors,animals,numbers]"
SMALL = [TASKS, "data.n_train=16", "data.n_test=8", "train.epochs=2"]
L = 10  # prompts.length default


def virtual(first: int, count: int) -> list[int]:
    """The virtual-token ids of slots first .. first+count-1."""
    return [-1 - s for s in range(first, first + count)]


class Snapshots(Plugin):
    """What the method held at the start of each stage (its before_task runs before this one's)
    and, at the end of each stage, the prompt as the model read it (this after_task runs
    before the method's)."""

    name = "snapshots"

    def __init__(self):
        super().__init__()
        self.start: list[dict] = []
        self.read: list[torch.Tensor] = []
        self.replayed_prefixes: list[tuple[int, int, list[int]]] = []

    def before_task(self, ctx, stage):
        m = ctx.method
        self.start.append({
            "learned": list(m.learned), "prompts": [p.clone() for p in m.prompts()], "current": m.module.current.detach().clone(),
            "mlp": [p.detach().clone() for p in m.module.mlp.parameters()] if m.module.mlp is not None else [],
            "train_prefix": ctx.train_sets[stage.row][0].prompt[: L * (stage.row + 2)],
        })

    def after_step(self, ctx, record):
        for e in record.replayed:
            self.replayed_prefixes.append((record.stage.row, e.task, ctx.train_sets[e.task][e.index].prompt))

    def after_task(self, ctx, stage):
        self.read.append(ctx.method.module.reparameterised().detach().clone())


def weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "progressive_prompts" not in n}


@pytest.mark.parametrize("mlp", [False, True])
def test_one_prompt_per_task_earlier_ones_bit_identical_nothing_else_moves(mlp, tmp_path, tiny_cache):
    extra = ["prompts.mlp=true", "prompts.mlp_hidden=32"] if mlp else []
    snap = Snapshots()
    r = ContinualRun(build_config("tiny,progressive_prompts", SMALL + extra), tmp_path / "run", progress=False, cache_dir=tiny_cache, plugins=[snap])
    m = r.method
    before = weights(r.model)
    assert [n for n, p in r.model.named_parameters() if p.requires_grad] == [n for n, _ in r.model.named_parameters() if n.startswith("progressive_prompts.")]
    assert {id(p) for p in r.trained_params} == {id(p) for p in m.module.parameters()}
    r.run()
    final = m.prompts()
    assert m.learned == [0, 1, 2] and len(final) == 3 and all(p.shape == (L, 128) for p in final)
    for s, start in enumerate(snap.start):
        assert start["learned"] == list(range(s))  # one more prompt per task
        assert start["train_prefix"][: L * (s + 1)] == virtual(0, L * (s + 1)) and start["train_prefix"][L * (s + 1)] >= 0
        for i, earlier in enumerate(start["prompts"]):
            assert torch.equal(earlier, final[i]), (s, i)  # bit-identical while later tasks train
        assert torch.equal(snap.read[s], final[s])  # what is frozen is what the model read
        assert not torch.equal(start["current"], final[s])  # the prompt trained
    assert not torch.equal(snap.start[2]["current"], m.module.current)
    if mlp:  # a fresh MLP per task
        assert not any(torch.equal(a, b) for a, b in zip(snap.start[1]["mlp"], snap.start[0]["mlp"]))
    after = weights(r.model)
    assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)  # base and LoRA untouched
    assert all(float(p.abs().max()) == 0.0 for n, p in r.model.named_parameters() if "lora_B" in n)
    assert all(n.startswith("progressive_prompts.") for n, p in r.model.named_parameters() if p.requires_grad)  # after evaluations too
    assert [e.prompt[: 3 * L] for e in r.test_sets[0][:1]] == [virtual(0, 3 * L)]  # every prompt at test time
    lines = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert {x["lr"] for x in lines} == {0.3}  # prompts.lr, not train.lr


# ------------------------------------------------------------------ every path, against a reference


def two_prompts(r: ContinualRun) -> torch.Tensor:
    """Put the run in stage 1 with P_1 frozen and P_2 being trained (both moved off their
    vocabulary-row start); the vectors the model reads, in order."""
    m = r.method
    torch.manual_seed(5)
    for s in (0, 1):
        r.stage = r.stages[s]
        m.before_task(r, r.stages[s])
        with torch.no_grad():
            m.module.current.add_(torch.randn_like(m.module.current))
        if s == 0:
            m.after_task(r, r.stages[0])
    return m.module.table(True).detach().clone()


def causal_logits(model, vectors: torch.Tensor, ids: list[int]) -> torch.Tensor:
    emb = model.get_input_embeddings().weight
    x = torch.cat([vectors, emb[torch.tensor(ids, dtype=torch.long)]]).unsqueeze(0)
    return model(inputs_embeds=x, use_cache=False).logits[0].float()


def causal_nll(model, vectors, e: Encoded, scope: str) -> tuple[float, int]:
    """NLL of the answer (label) or of every token after the first (sequence), reading the
    vectors first: the token at k is predicted at position len(vectors) + k - 1."""
    seq = e.prompt + e.answer
    logits = causal_logits(model, vectors, seq)
    start = len(e.prompt) if scope == "label" else 1
    v = len(vectors)
    total = sum(float(torch.logsumexp(logits[v + k - 1], 0) - logits[v + k - 1, seq[k]]) for k in range(start, len(seq)))
    return total, len(seq) - start


def causal_greedy(model, tok, vectors, e: Encoded, new_tokens: int) -> str:
    seq, out = list(e.prompt), []
    for _ in range(new_tokens):
        t = int(causal_logits(model, vectors, seq)[-1].argmax())
        out.append(t)
        if t == tok.eos_token_id:
            break
        seq.append(t)
    return tok.decode(out, skip_special_tokens=True)


def tunable_tiny(folder, cache_dir):
    """The tiny Llama with attention and MLP weights at 0.1 (initializer_range) instead of 0.02:
    the frozen random base of ``model.name=tiny`` (0.02, embeddings 0.5) barely responds to
    what it attends to, so no soft prompt moves its answers (measured on colors: 0 % at
    prompt lengths 10 and 40, lr 0.003 to 1, 8 to 24 epochs, with and without the MLP), where
    this one learns a task through a prompt alone (colors, seeds 0-2: 92-100 % at length 40)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from surecl.model import tiny_folder

    if (folder / "config.json").is_file():
        return folder
    tok = AutoTokenizer.from_pretrained(tiny_folder(cache_dir))
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=256, pad_token_id=0, eos_token_id=1, bos_token_id=3, tie_word_embeddings=True, initializer_range=0.1,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            model.get_input_embeddings().weight.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_the_prompts_enter_every_forward_of_a_causal_model(tmp_path, tiny_cache):
    path = tunable_tiny(tmp_path / "tunable", tiny_cache)
    cfg = build_config("tiny,progressive_prompts", SMALL + ["eval.batch_size=4", f"model.name={path}", "model.dtype=fp32"])
    r = ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    vectors = two_prompts(r)
    assert vectors.shape == (2 * L, 128)
    model, tok = r.accelerator.unwrap_model(r.model), r.tokenizer
    model.eval()
    train, test = r.train_sets.encoded[1][:6], r.test_sets.encoded[0]
    assert [e.prompt for e in r.train_sets[1][:6]] == [virtual(0, 2 * L) + e.prompt for e in train]
    none = torch.zeros(0, 128)
    with torch.no_grad():
        ref = {scope: [causal_nll(model, vectors, e, scope) for e in train] for scope in ("label", "sequence")}
        bare = [causal_nll(model, none, e, "label")[0] for e in train]
    # the prompts matter: without them every answer's NLL is another
    assert all(abs(a - b) > 1e-2 for (a, _), b in zip(ref["label"], bare)), (ref["label"], bare)
    for share in (True, False):
        r.share_prefix = share
        # training: the step's own forward (its record's per-row NLL, before the update)
        model.train()
        rec = r.train_step(r, r.stages[1], 0, 1, [(1, i) for i in range(6)], [])
        model.eval()
        torch.testing.assert_close(rec.nll, torch.tensor([n for n, _ in ref["label"]]), rtol=1e-4, atol=1e-3)
        assert not torch.equal(r.method.module.current.detach(), vectors[:L]) and torch.equal(r.method.module.frozen, vectors[L:])
        with torch.no_grad():
            r.method.module.current.copy_(vectors[:L])  # undo the step's update
            # surprise scoring: answer only, and every real token after the first (same count as without prompts)
            for scope in ("label", "sequence"):
                got = r.score(r.train_sets[1][:6], scope=scope, reduction="sum")
                torch.testing.assert_close(torch.tensor(got), torch.tensor([n for n, _ in ref[scope]]), rtol=1e-4, atol=1e-3)
                batch = r.batch(r.train_sets[1][:6], shared=True)
                assert token_nll(model, batch, scope=scope)[1].tolist() == [c for _, c in ref[scope]]
            # ranking: each option's log-likelihood
            options = r.label_answers[0]
            got = option_logprobs(model, r.test_sets[0], options, pad_id=tok.pad_token_id, is_seq2seq=False, batch_size=4, device=r.device, share_prefix=share)
            want = [[-causal_nll(model, vectors, Encoded(e.prompt, options[lab], lab), "label")[0] for lab in options] for e in test]
            torch.testing.assert_close(got, torch.tensor(want), rtol=1e-4, atol=1e-3)
            # generation: greedy answers, and the run's evaluation built on them
            answers = generate_answers(model, tok, r.test_sets[0], is_seq2seq=False, max_new_tokens=3, batch_size=4, device=r.device, share_prefix=share)
            want_answers = [causal_greedy(model, tok, vectors, e, 3) for e in test]
            assert answers == want_answers
        assert r.evaluate_task(0) == accuracy(want_answers, [e.label for e in test])
    with torch.no_grad():
        assert want_answers != [causal_greedy(model, tok, none, e, 3) for e in test]  # the prompts change the answers
        # the learner's own weights (evaluate_task(method_weights=False)) read no prompt
        bare_accuracy = accuracy([causal_greedy(model, tok, none, e, 3) for e in test], [e.label for e in test])
    assert r.evaluate_task(0, method_weights=False) == bare_accuracy


def test_the_prompts_go_before_the_encoder_input_of_a_seq2seq_model(tmp_path):
    from transformers import AutoTokenizer, T5Config, T5ForConditionalGeneration

    from surecl.model import tiny_folder

    # the tiny T5 of test_seq2seq, without dropout (a training forward would draw masks) and in fp32
    path = tmp_path / "t5"
    tok = AutoTokenizer.from_pretrained(tiny_folder(tmp_path / "cache"))
    config = T5Config(
        vocab_size=len(tok), d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4, dropout_rate=0.0,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, decoder_start_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    T5ForConditionalGeneration(config).save_pretrained(path)
    tok.save_pretrained(path)
    cfg = build_config("tiny,progressive_prompts", SMALL + [f"model.name={path}", "model.dtype=fp32", "lora.target_modules=[q,v]"])
    r = ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tmp_path / "cache")
    vectors = two_prompts(r)
    model, tok = r.accelerator.unwrap_model(r.model), r.tokenizer
    model.eval()
    emb = model.get_input_embeddings().weight

    def nll(source: list[int], target: list[int], vec=vectors) -> float:
        x = torch.cat([vec, emb[torch.tensor(source)]]).unsqueeze(0)
        logits = model(inputs_embeds=x, attention_mask=torch.ones(x.shape[:2], dtype=torch.long), labels=torch.tensor([target])).logits[0]
        return float((torch.logsumexp(logits.float(), -1) - logits.float().gather(1, torch.tensor(target)[:, None]).squeeze(1)).sum())

    def generated(source: list[int], vec=vectors) -> str:
        x = torch.cat([vec, emb[torch.tensor(source)]]).unsqueeze(0)
        out = model.generate(
            inputs_embeds=x, attention_mask=torch.ones(x.shape[:2], dtype=torch.long), max_new_tokens=3, do_sample=False, num_beams=1,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        )
        return tok.decode(out[0], skip_special_tokens=True)

    train, test = r.train_sets.encoded[1][:6], r.test_sets.encoded[0]
    with torch.no_grad():
        want = [nll(e.prompt, e.answer) for e in train]
        bare = [nll(e.prompt, e.answer, vectors[:0]) for e in train]
        assert all(abs(a - b) > 1e-4 for a, b in zip(want, bare)), (want, bare)  # the prompts matter (fp32 rounding: ~1e-6)
    model.train()
    rec = r.train_step(r, r.stages[1], 0, 1, [(1, i) for i in range(6)], [])
    model.eval()
    torch.testing.assert_close(rec.nll, torch.tensor(want), rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        r.method.module.current.copy_(vectors[:L])
        # full-sequence surprise: the decoder scores prompt + answer from [prompts; EOS]
        got = r.score(r.train_sets[1][:6], scope="sequence", reduction="sum")
        want_seq = [nll([e.answer[-1]], e.prompt + e.answer) for e in train]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want_seq), rtol=1e-4, atol=1e-4)
        answers = generate_answers(model, tok, r.test_sets[0], is_seq2seq=True, max_new_tokens=3, batch_size=4, device=r.device)
        assert answers == [generated(e.prompt) for e in test]
        assert answers != [generated(e.prompt, vectors[:0]) for e in test]  # the prompts change the answers
        options = r.label_answers[0]
        ranked = option_logprobs(model, r.test_sets[0], options, pad_id=tok.pad_token_id, is_seq2seq=True, batch_size=4, device=r.device)
        torch.testing.assert_close(ranked, torch.tensor([[-nll(e.prompt, options[lab]) for lab in options] for e in test]), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ test time, replay, outputs


class OwnPrefixes(Plugin):
    """The virtual tokens of each task's test inputs while it is evaluated."""

    name = "own_prefixes"

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[int, int, list[int]]] = []

    @contextlib.contextmanager
    def eval_context(self, ctx, task):
        prompt = ctx.test_sets[task][0].prompt
        self.seen.append((ctx.stage.row, task, [t for t in prompt if t < 0]))
        yield


def test_eval_own_reads_each_task_with_the_prompts_up_to_its_own(tmp_path, tiny_cache):
    seen = OwnPrefixes()
    r = ContinualRun(build_config("tiny,progressive_prompts", SMALL + ["prompts.eval=own"]), tmp_path / "run", progress=False, cache_dir=tiny_cache, plugins=[seen])
    res = r.run()
    a = res["accuracy_matrix"]
    for i in range(3):
        for j in range(i + 1):
            assert a[i][j] == a[j][j], a  # task j reads exactly what it read right after it was learned
    # after stage i the frozen prompts are [P_i; ...; P_1]: task j reads its tail [P_j; ...; P_1]
    assert seen.seen == [(i, j, virtual((i - j) * L, (j + 1) * L)) for i in range(3) for j in range(i + 1)]
    assert res["forgetting"] == 0.0


def test_replayed_examples_read_the_current_stage_prompts(tmp_path, tiny_cache):
    snap = Snapshots()
    cfg = build_config("tiny,progressive_prompts", SMALL + ["replay.policy=surprise", "replay.buffer_size=0.5", "replay.every=1"])
    r = ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache, plugins=[snap])
    res = r.run()
    assert res["buffer"]["size"] > 0
    assert {(stage, task) for stage, task, _ in snap.replayed_prefixes if task < stage} == {(1, 0), (2, 0), (2, 1)}
    for stage, _, prompt in snap.replayed_prefixes:  # a replayed example of any task, with every prompt of this stage
        assert prompt[: L * (stage + 1)] == virtual(0, L * (stage + 1)) and prompt[L * (stage + 1)] >= 0


def test_the_run_leaves_its_prompts_for_reuse(tmp_path, tiny_cache):
    out = tmp_path / "run"
    r = ContinualRun(build_config("tiny,progressive_prompts", SMALL + ["train.epochs=1"]), out, progress=False, cache_dir=tiny_cache)
    res = r.run()
    folder = out / "adapters" / "prompts"
    meta = json.loads((folder / "prompts.json").read_text())
    prefix = load_file(str(folder / "prompts.safetensors"))["prefix"]
    assert meta["tasks"] == ["colors", "animals", "numbers"] and meta["length"] == L and prefix.shape == (3 * L, meta["embedding_dim"])
    assert meta["eval"] == "all" and "goes before the input embeddings of every example" in meta["usage"]
    assert prefix.dtype == torch.float32 and torch.equal(prefix, r.method.module.frozen)
    for i, name in enumerate(meta["tasks"]):
        lo, hi = meta["prefix_rows"][name]
        assert torch.equal(prefix[lo:hi], r.method.prompts()[i])
    # the file alone reproduces the final evaluation: [prefix; token embeddings] into the base
    model, tok = r.accelerator.unwrap_model(r.model), r.tokenizer
    model.eval()
    with torch.no_grad():
        for j, e_task in enumerate(r.test_sets.encoded):
            answers = [causal_greedy(model, tok, prefix, e, 2) for e in e_task]
            assert accuracy(answers, [e.label for e in e_task]) == res["accuracy_matrix"][2][j]
    assert (out / "adapters" / "prompts") in checkpoint.run_outputs(out)  # --fresh knows the folder as surecl's own
    manifest = checkpoint.Manifest(out)
    assert sorted(manifest.contents["adapters/prompts"]) == ["README.md", "prompt.json", "prompts.json", "prompts.safetensors"]
    # written as one folder: an export that fails half-way leaves the earlier one whole, nothing stray in it
    (folder / "NOTES.md").write_text("mine")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    real = checkpoint.write_text

    def full_disk(path, text):
        if Path(path).name == "README.md":
            raise OSError(28, "No space left on device")
        real(path, text)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint, "write_text", full_disk)
        with pytest.raises(OSError):
            r.method.export(r, res)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]


def test_prompts_eval_own_exports_the_prefix_each_task_was_evaluated_with(tmp_path, tiny_cache):
    """With prompts.eval=own task j was evaluated with [P_j; ...; P_1] alone: prompts.json and
    prompt.json say so, and rows prefix_rows[task][0] to the end reproduce the final row (the
    files used to describe every prompt before every example)."""
    out = tmp_path / "run"
    r = ContinualRun(build_config("tiny,progressive_prompts", SMALL + ["train.epochs=1", "prompts.eval=own"]), out, progress=False,
                     cache_dir=tiny_cache)
    res = r.run()
    folder = out / "adapters" / "prompts"
    meta = json.loads((folder / "prompts.json").read_text())
    assert meta["eval"] == "own" and "prefix_rows[task][0] to the end" in meta["usage"]
    assert "prefix_rows[task][0] to the end" in json.loads((folder / "prompt.json").read_text())["input_prefix"]
    prefix = load_file(str(folder / "prompts.safetensors"))["prefix"]
    model, tok = r.accelerator.unwrap_model(r.model), r.tokenizer
    model.eval()
    with torch.no_grad():
        for j, (name, e_task) in enumerate(zip(meta["tasks"], r.test_sets.encoded)):
            own = prefix[meta["prefix_rows"][name][0]:]
            assert own.shape[0] == (j + 1) * L
            answers = [causal_greedy(model, tok, own, e, 2) for e in e_task]
            assert accuracy(answers, [e.label for e in e_task]) == res["accuracy_matrix"][2][j]


def test_rows_with_every_tasks_prompt_must_fit_the_models_positions():
    """The soft prompts of every task go before the last task's rows: with them a row can pass
    the model's positions though it fits without (a GPT-2-style model stopped mid-run with an
    index error). Checked before training; the probe's rows get no prompts."""
    from types import SimpleNamespace

    from surecl.run_setup import check_context
    from surecl.run_state import InputSets

    rows = [Encoded(list(range(20)), [7, 8, 1], "x")]  # 20 + 3 + 1 = 24 tokens

    def run_of(config: str, *overrides: str):
        tasks = [SimpleNamespace(name=n, kind="classify") for n in ("a", "b", "c")]
        return SimpleNamespace(is_seq2seq=False, tasks=tasks, cfg=build_config(config, list(overrides)),
                               train_sets=InputSets([rows] * 3, lambda t: ()), test_sets=InputSets([rows] * 3, lambda t: ()),
                               label_answers=[{"x": [7, 8, 1]}] * 3, general=None, general_sets=[])

    positions = SimpleNamespace(n_positions=48)
    check_context(run_of("tiny,seq_lora"), positions)
    check_context(run_of("tiny,progressive_prompts", "prompts.length=8"), positions)  # 3 x 8 + 24 = 48
    with pytest.raises(SureclError, match=r"task a: rows of up to 54 tokens \(method progressive_prompts's 30 prefix tokens, prompt.* "
                                          r"do not fit the model's 48 positions; lower model.max_length \(now \d+\) by at least 6 or the "
                                          r"method's prefix \(prompts.length\)"):
        check_context(run_of("tiny,progressive_prompts"), positions)  # 3 x 10 + 24


def test_the_dual_learner_is_refused(tmp_path, tiny_cache):
    with pytest.raises(SureclError, match="dual.enabled: progressive_prompts trains soft prompts"):
        ContinualRun(build_config("tiny,progressive_prompts", SMALL + ["dual.enabled=true"]), tmp_path / "run", progress=False, cache_dir=tiny_cache)


def test_prompts_options_are_validated():
    for override, words in (("prompts.length=0", "prompts.length"), ("prompts.lr=0", "prompts.lr"), ("prompts.mlp_hidden=0", "prompts.mlp_hidden"), ("prompts.eval=task", "prompts.eval")):
        with pytest.raises(SureclError, match=words):
            build_config("tiny,progressive_prompts", [override])


@pytest.mark.slow
def test_keeps_more_of_the_first_task_than_seq_lora(tmp_path, tiny_cache):
    """Three class-incremental tasks on the prompt-tunable tiny base, three seeds: seq_lora
    forgets the first task; Progressive Prompts with each task's own prompts (prompts.eval=own)
    keeps it exactly. Measured a[0][0] / a[2][0]: seq_lora 100/0, 100/0, 100/0; Progressive
    Prompts (length 40) 100/100, 100/100, 91.7/91.7. With every prompt at test time (the
    default, no task id) this random base keeps none of it either: the later prompts, trained
    with the earlier ones before them, take over (0/0/0; with replay.policy=reservoir 100, 95.8,
    50, measured before the reservoir offered each example once rather than once per epoch)."""
    path = tunable_tiny(tmp_path / "tunable", tiny_cache)
    base = ["data.tasks=[colors,animals,numbers]", f"model.name={path}", "model.dtype=fp32"]
    first, kept = {}, {}
    for name, preset, extra in (("seq_lora", "seq_lora", []), ("prompts", "progressive_prompts", ["prompts.length=40", "prompts.eval=own"])):
        for seed in (0, 1, 2):
            res = run(build_config(f"tiny,{preset}", base + extra + [f"seed={seed}"]), tmp_path / f"{name}{seed}", progress=False, cache_dir=tiny_cache)
            a = res["accuracy_matrix"]
            first.setdefault(name, []).append(a[0][0])
            kept.setdefault(name, []).append(a[2][0])
            if name == "prompts":
                assert [a[1][0], a[1][1]] == [a[0][0], a[2][1]] and a[2][0] == a[0][0], a  # nothing it learned changes
    mean = {k: sum(v) / 3 for k, v in kept.items()}
    assert sum(first["prompts"]) / 3 >= 80.0, first  # it learns the first task through a prompt alone (97.2)
    assert max(kept["seq_lora"]) <= 10.0, kept
    assert mean["prompts"] >= mean["seq_lora"] + 60.0, kept


@pytest.mark.slow
def test_two_processes_train_the_prompts_as_one(tmp_path):
    """DDP over the prompt (and MLP) alone: the ranks draw the same new prompt, the gradient
    all-reduce reaches it through the embedding hooks, and the frozen prompts (a buffer, never
    broadcast) stay the same on both."""
    import os
    import subprocess
    import sys

    from test_two_process import launch_two

    args = [
        "run", "--quiet", "--config", "tiny,progressive_prompts", "data.tasks=[colors,animals]", "data.n_train=32", "data.n_test=16",
        "train.epochs=2", "prompts.mlp=true", "prompts.mlp_hidden=16", "replay.policy=reservoir",
    ]
    env = {**os.environ, "SURECL_CACHE": str(tmp_path / "cache")}
    one = subprocess.run([sys.executable, "-m", "surecl.cli", *args, "--out", str(tmp_path / "one")], env=env, capture_output=True, text=True)
    assert one.returncode == 0, one.stderr[-2000:]
    codes, out = launch_two([sys.executable, "-m", "surecl.cli", *args, "--out", str(tmp_path / "two")], {**env, "CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    assert codes == [0, 0], out

    def outcome(folder):
        res = json.loads((folder / "results.json").read_text())
        losses = [json.loads(x)["loss"] for x in (folder / "log.jsonl").read_text().splitlines()]
        return res["accuracy_matrix"], losses, load_file(str(folder / "adapters" / "prompts" / "prompts.safetensors"))["prefix"]

    m1, loss1, prefix1 = outcome(tmp_path / "one")
    m2, loss2, prefix2 = outcome(tmp_path / "two")
    assert m1 == m2
    assert loss2 == pytest.approx(loss1, rel=1e-3) and loss1[-1] < loss1[0]
    # float summation order (the all-reduce) differs and Adam at lr 0.3 carries it into the
    # prompts, whose scale the model's RMSNorm ignores (they grow to hundreds): measured 2e-5
    # of the largest value at most
    assert float((prefix2 - prefix1).abs().max()) <= 1e-4 * float(prefix1.abs().max())
