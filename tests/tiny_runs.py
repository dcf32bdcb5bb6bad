"""Settings shared by the tests that need the tiny model to learn a task.

At the tiny preset's 8 epochs a seed's first task lands at 75-100 % depending on the CPU's
kernels. 12 epochs learned every seed 0-4 on two AVX512-BF16 machines but not on an AMD EPYC
with AVX2 only: 3 of 30 (task, seed) runs below 90 % there (seed 0 on colors: 25 %). At 16
epochs all 30 cleared 90 % on it (lowest 95.8 %), and the tests' multi-task assertions held;
20 epochs overtrains the second task of some runs. With seeds 3-5 in place of the tests'
0-2 (a stand-in for another CPU's rounding) every multi-task assertion held at 16 too.
On an AMD EPYC with AVX512-BF16 (no AMX) at 16 epochs every first task was learned, but four
outcome assertions that held on the other two machines did not (a seed's SeqLoRA kept one
earlier task at chance; O-LoRA kept no more than SeqLoRA by rank; a seed's second task at 68.75;
MTL missed a task at one thread). The outcome tests now bound what held over seeds 0-5 on that
machine and over the tests' seeds on the other two, with room for a chaotic seed. Rerun:
bench/tiny_learning.py (one task) and bench/tiny_outcomes.py (the multi-task quantities the
tests assert)."""

from __future__ import annotations

from pathlib import Path

LEARNED = "train.epochs=16"

OLORA_SMALL = ["data.tasks=[colors,animals,numbers]", "data.n_train=32", "data.n_test=8", "train.epochs=4"]


def orth_overlap(out: Path, cache: Path, overrides: list[str]) -> float:
    """An O-LoRA run on three tiny tasks (small, 16 steps per task); at its end, the last task's A
    against the earlier tasks' summed over the LoRA layers: sum ||A_past A_t^T||_F^2."""
    import torch

    from surecl.config import build_config
    from surecl.methods.olora import orth_penalty
    from surecl.trainer import ContinualRun

    r = ContinualRun(build_config("tiny,olora", [*OLORA_SMALL, *overrides]), out, progress=False, cache_dir=cache)
    r.run()
    n = r.method.filled * r.method.rank
    assert n == 2 * r.cfg.lora.r
    with torch.no_grad():
        return float(sum(orth_penalty(layer.past_a[:n], layer.fast_a) for layer in r.method.layers))


def stopped_at(monkeypatch, point: str, call) -> None:
    """``call()`` stopped by a Ctrl-C at the step fault point ``point`` (``step:<row>:<step>``,
    :mod:`surecl.plugins.faults`), in this process: the run's KeyboardInterrupt is expected."""
    import pytest

    import surecl.plugins.faults as faults

    real = faults.fault_point

    def stop(name):
        if name == point:
            raise KeyboardInterrupt
        real(name)

    monkeypatch.setattr(faults, "fault_point", stop)
    with pytest.raises(KeyboardInterrupt):
        call()
    monkeypatch.setattr(faults, "fault_point", real)


def caller_model_and_tasks(n_train: int = 16, n_test: int = 4):
    """A tiny Llama, its word-level tokenizer and two tasks ("temperature", "heading"), all built
    here as a user would (not through model.name or data.*): ``n_train`` / ``n_test`` copies of
    each task's two rows per split. Seeds torch's generator with 0 for the model's weights."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    import surecl

    words = ["<pad>", "<eos>", "<unk>", "Classify", "the", "word", "Option:", "Answer:", "hot", "warm", "cold", "icy",
             "up,", "up", "down", "north", "south"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                         pad_token_id=0, eos_token_id=1, bos_token_id=1))
    rows = lambda pairs, n: [surecl.Example(s, lab) for s, lab in pairs * n]  # noqa: E731
    temp = surecl.Task("temperature", "Classify the word ", ["up", "down"], rows([("hot", "up"), ("cold", "down")], n_train),
                       rows([("hot", "up"), ("cold", "down")], n_test))
    heading = surecl.Task("heading", "Classify the word ", ["up", "down"], rows([("north", "up"), ("south", "down")], n_train),
                          rows([("north", "up"), ("south", "down")], n_test))
    return model, tokenizer, [temp, heading]
