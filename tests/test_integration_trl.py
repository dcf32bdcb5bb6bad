"""SureSFTTrainer: SuRe inside a TRL SFTTrainer script (surecl.integrations.trl)."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

datasets = pytest.importorskip("datasets")
pytest.importorskip("trl")

from trl import SFTConfig  # noqa: E402

from surecl.adapters import FAST, SLOW  # noqa: E402
from surecl.data.tiny import tiny_stream  # noqa: E402
from surecl.errors import SureclError  # noqa: E402
from surecl.integrations.trl import SureArguments, SureSFTTrainer  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }} <eos>{% endgeneration %} "
    "{% else %}{{ m['content'] }} Answer : {% endif %}{% endfor %}"
)


def chat_tokenizer(loaded):
    tok = copy.deepcopy(loaded.tokenizer)  # the session's tokenizer stays as it is
    tok.chat_template = TEMPLATE
    return tok


def chat_sets(n_train: int, tasks: int = 2):
    stream = tiny_stream(n_train=n_train, n_test=1)[:tasks]
    rows = [t.train for t in stream]
    sets = [
        datasets.Dataset.from_dict({"messages": [[{"role": "user", "content": e.sentence}, {"role": "assistant", "content": e.label}] for e in r]})
        for r in rows
    ]
    return rows, sets


def make(loaded, out, sure: SureArguments, tok=None, **kw) -> SureSFTTrainer:
    settings = dict(
        per_device_train_batch_size=4, per_device_eval_batch_size=5, learning_rate=5e-3, num_train_epochs=2, report_to=[],
        use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True, logging_strategy="no", assistant_only_loss=True,
    )
    settings.update(kw)
    return SureSFTTrainer(
        model=copy.deepcopy(loaded.model), args=SFTConfig(str(out), **settings), processing_class=tok or chat_tokenizer(loaded), sure=sure,
    )


def encode(tok, prompt: str, completion: str) -> tuple[list[int], int]:
    """Ids of ``prompt completion <eos>`` by the tokenizer alone (no template), and the number
    of completion tokens (the completion and its EOS)."""
    head = tok(prompt, add_special_tokens=False)["input_ids"]
    tail = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return head + tail, len(tail)


@torch.no_grad()
def completion_nll(trainer, adapter: str, examples: list[tuple[list[int], int]]) -> tuple[list[float], float]:
    """Per example: the mean NLL of its completion tokens, one example at a time; and the
    token mean over all examples."""
    means, total, count = [], 0.0, 0
    with trainer.dual.evaluating(adapter) as model:
        for ids, k in examples:
            x = torch.tensor([ids])
            logp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1)
            nll = -logp[torch.arange(len(ids) - 1), x[0, 1:]][-k:]
            means.append(nll.mean().item())
            total, count = total + nll.sum().item(), count + k
    return means, total / count


# ---------------------------------------------------------------------- a two-task chat stream


@pytest.fixture(scope="module")
def chat_run(tiny_loaded, tmp_path_factory):
    """Two chat tasks through next_task; the expected surprise of each task is computed
    independently (fast adapter, assistant tokens) just before its next_task call."""
    rows, sets = chat_sets(n_train=20)
    trainer = make(tiny_loaded, tmp_path_factory.mktemp("sft"), SureArguments(buffer_size=8, ratio="1:2", beta=0.5))
    tok = trainer.processing_class
    examples = [[encode(tok, f"{e.sentence} Answer :", e.label) for e in r] for r in rows]
    expected = []
    for t, ds in enumerate(sets):
        expected.append(completion_nll(trainer, FAST, examples[t])[0])
        trainer.next_task(ds)
    return trainer, sets, examples, expected


def test_tasks_are_prepared_by_sft_with_assistant_only_labels(chat_run):
    trainer, _, examples, _ = chat_run
    assert trainer.task == 2
    for t in range(2):
        prepared = trainer.sets[t]
        assert prepared.column_names == ["input_ids", "labels"]
        for row, (ids, k) in zip(prepared, examples[t]):
            assert row["input_ids"] == ids
            assert row["labels"] == [-100] * (len(ids) - k) + ids[-k:]


def test_surprise_is_the_nll_of_the_assistant_tokens(chat_run):
    trainer, _, _, expected = chat_run
    for t in range(2):
        assert trainer.scores[t] == pytest.approx(expected[t], abs=1e-4)


def test_buffer_keeps_task_0_at_its_quota(chat_run):
    trainer, _, _, _ = chat_run
    buffer = trainer.policy.buffer
    assert len(buffer) == 8 and {t: len(v) for t, v in buffer.by_task.items()} == {0: 4, 1: 4}
    for t in range(2):  # each task's share: its 4 most surprising examples
        top = sorted(range(20), key=lambda i: -trainer.scores[t][i])[:4]
        assert sorted(e.index for e in buffer.by_task[t]) == sorted(top)


def test_replayed_examples_counted_at_the_ratio(chat_run):
    trainer, _, _, _ = chat_run
    assert trainer.replay_counts == {0: [40, 20], 1: [40, 20]}  # 20 new x 2 epochs, 1 replayed per 2 new


def test_slow_adapter_differs_and_evaluate_uses_it(chat_run):
    trainer, sets, examples, _ = chat_run
    fast = torch.cat([p.detach().flatten() for p in trainer.dual.fast_params])
    slow = torch.cat([p.detach().flatten() for p in trainer.dual.slow_params])
    assert not torch.allclose(fast, slow)
    one_batch = dict(per_device_eval_batch_size=len(sets[0]))
    trainer.args.per_device_eval_batch_size = one_batch["per_device_eval_batch_size"]
    try:
        loss = trainer.evaluate(sets[0])["eval_loss"]
        loss_fast = trainer.evaluate(sets[0], adapter="fast")["eval_loss"]
    finally:
        trainer.args.per_device_eval_batch_size = 5
    _, slow_nll = completion_nll(trainer, SLOW, examples[0])
    _, fast_nll = completion_nll(trainer, FAST, examples[0])
    assert loss == pytest.approx(slow_nll, rel=1e-4)
    assert loss_fast == pytest.approx(fast_nll, rel=1e-4)
    assert loss != pytest.approx(loss_fast, rel=1e-3)
    assert trainer.dual.model.active_adapter == "slow"


# ---------------------------------------------------------------------- prompt/completion data


def test_prompt_completion_rows_score_the_completion(tiny_loaded, tmp_path):
    """Plain prompt/completion rows: SFTTrainer's completion_only_loss (its default for this
    format) marks the completion and the EOS it appends; the surprise is their mean NLL."""
    rows = tiny_stream(n_train=12, n_test=1)[0].train
    ds = datasets.Dataset.from_dict({"prompt": [f"{e.sentence} Answer :" for e in rows], "completion": [f" {e.label}" for e in rows]})
    trainer = make(tiny_loaded, tmp_path, SureArguments(buffer_size=4), tok=tiny_loaded.tokenizer, assistant_only_loss=False, num_train_epochs=1)
    examples = [encode(trainer.processing_class, f"{e.sentence} Answer :", e.label) for e in rows]
    expected, _ = completion_nll(trainer, FAST, examples)
    trainer.next_task(ds)
    assert trainer.completion_only_loss is True
    assert [r["labels"] for r in trainer.sets[0]] == [[-100] * (len(ids) - k) + ids[-k:] for ids, k in examples]
    assert trainer.scores[0] == pytest.approx(expected, abs=1e-4)
    assert len(trainer.policy.buffer) == 4


# ---------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("settings", "kw", "match"),
    [
        ({"packing": True, "max_length": 64}, {}, "packing=True is not supported: .*whole examples"),
        ({"padding_free": True, "max_length": None}, {}, "padding_free=True is not supported"),
        ({}, {"peft_config": "lora"}, "no peft_config"),
        ({}, {"train_dataset": "x"}, "next_task"),
    ],
)
def test_what_it_cannot_run_is_a_one_line_error(tiny_loaded, tmp_path, settings, kw, match):
    args = SFTConfig(str(tmp_path), report_to=[], use_cpu=True, bf16=False, **settings)
    with pytest.raises(SureclError, match=match) as err:
        SureSFTTrainer(model=copy.deepcopy(tiny_loaded.model), args=args, processing_class=chat_tokenizer(tiny_loaded), **kw)
    assert "\n" not in str(err.value)


def test_pair_loss_refuses_another_trl_loss_type(tiny_loaded, tmp_path):
    """The pair loss computes the token NLL itself: a TRL loss_type it would silently replace
    ('dft') is refused in one line; the default 'nll' is the pair loss's own."""
    args = SFTConfig(str(tmp_path), report_to=[], use_cpu=True, bf16=False, loss_type="dft")
    with pytest.raises(SureclError, match="loss_type other than 'nll'") as err:
        SureSFTTrainer(model=copy.deepcopy(tiny_loaded.model), args=args, processing_class=chat_tokenizer(tiny_loaded), sure=SureArguments(replay_loss="pair"))
    assert "\n" not in str(err.value)
    args = SFTConfig(str(tmp_path), report_to=[], use_cpu=True, bf16=False)
    SureSFTTrainer(model=copy.deepcopy(tiny_loaded.model), args=args, processing_class=chat_tokenizer(tiny_loaded), sure=SureArguments(replay_loss="pair"))


def test_without_trl_the_error_names_the_extra():
    code = (
        "import sys\n"
        "sys.modules['trl'] = None\n"
        "from surecl.errors import SureclError\n"
        "import surecl.integrations.trl as m\n"
        "try:\n"
        "    from surecl.integrations.trl import SureSFTTrainer\n"
        "except SureclError as e:\n"
        "    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERR ") and 'pip install "surecl[trl]"' in lines[0]


# ---------------------------------------------------------------------- README


def readme_examples() -> tuple[str, str]:
    section = README.read_text(encoding="utf-8").split("## Use it in your own Trainer script", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    return blocks[0], blocks[1]


def test_readme_sft_example_runs(tmp_path, tiny_cache, monkeypatch):
    trainer_code, sft_code = readme_examples()
    assert "SureSFTTrainer" in sft_code and len(sft_code.strip().splitlines()) <= 12
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    monkeypatch.chdir(tmp_path)
    # the SFT example continues the Trainer example: its imports and tokenizer, not its training
    setup = trainer_code.split("args = TrainingArguments", 1)[0]
    scope: dict = {}
    exec(compile(setup + sft_code, "README.md", "exec"), scope)
    sft = scope["sft"]
    assert sft.task == 4 and len(sft.policy.buffer) == 16 and sorted(sft.policy.buffer.by_task) == [0, 1, 2, 3]
    assert (tmp_path / "runs" / "sure-sft" / "task-3" / "sure-end" / "sure_state.json").is_file()
    assert all(any(x == -100 for x in r["labels"]) for r in sft.sets[0])  # assistant tokens only
