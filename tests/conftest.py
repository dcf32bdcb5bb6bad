"""Shared fixtures: one tiny random Llama per session, built offline into a temporary cache."""

from __future__ import annotations

import copy
import os
import platform

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The same arithmetic on every machine the suite meets (set before torch is imported, and
# inherited by the processes tests start): the tiny model's training is chaotic, so a test's
# thresholds hold for the kernels and summation order they were measured with: AVX2 kernels
# (ATen and MKL, also on AVX-512 hosts; x86 only), two threads unless OMP_NUM_THREADS says
# otherwise, and always the CPU, even where a GPU is present or a scheduler assigned one.
if platform.machine().lower() in ("x86_64", "amd64"):
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
    os.environ.setdefault("MKL_CBWR", "AVX2")
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ["CUDA_VISIBLE_DEVICES"] = ""
# A launcher's variables would make the in-process runs believe they are one rank of many.
for _name in [n for n in os.environ if n in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
              or n.startswith("ACCELERATE_")]:
    del os.environ[_name]

import pytest  # noqa: E402
import torch  # noqa: E402

from surecl.config import ModelConfig  # noqa: E402
from surecl.model import LoadedModel, load_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    """A private cache folder, so tests never read or write the user's cache or ../shared."""
    return tmp_path_factory.mktemp("surecl_cache")


@pytest.fixture(scope="session")
def tiny_loaded(tiny_cache) -> LoadedModel:
    return load_model(ModelConfig(name="tiny"), torch.device("cpu"), tiny_cache)


@pytest.fixture
def fresh_tiny(tiny_loaded) -> torch.nn.Module:
    """An untouched copy of the tiny base (PEFT wraps its argument in place)."""
    return copy.deepcopy(tiny_loaded.model)


@pytest.fixture(scope="session")
def task_examples(tiny_loaded):
    """``task_examples(task, n_train, seed)``: the encoded training examples of one tiny task,
    shuffled by ``seed``; their prompts share the task's instruction and options."""
    import random

    from surecl.data.encode import TaskEncoder
    from surecl.data.tiny import tiny_stream

    def make(task: int, n_train: int, seed: int):
        t = tiny_stream(n_train=n_train, n_test=1)[task]
        out = TaskEncoder(tiny_loaded.tokenizer, max_length=64).encode(t, t.train)
        random.Random(seed).shuffle(out)
        return out

    return make


@pytest.fixture(scope="session")
def random_dual():
    """``random_dual(model, scale, targets)``: a ``DualLoRA`` (r 4, alpha 8, no dropout) on
    ``model`` whose fast adapter holds ``scale`` x standard-normal weights (generator seed 0),
    so a forward through it differs from the base's."""
    from surecl.adapters import DualLoRA
    from surecl.config import DualConfig, LoraConfig

    def make(model, scale: float, targets: tuple[str, ...] = ("q_proj", "v_proj")) -> DualLoRA:
        dl = DualLoRA(model, LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=list(targets)), DualConfig(), is_seq2seq=False)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in dl.fast_params:
                p.copy_(scale * torch.randn(p.shape, generator=g))
        return dl

    return make


@pytest.fixture
def registered():
    """``registered(name, cls, **kw)``: a method (or a ``surecl.ReplayPolicy`` subclass: a policy)
    registered for the test, unregistered after it."""
    import surecl
    from surecl import registry

    added = []

    def add(name, cls, **kw):
        policy = issubclass(cls, surecl.ReplayPolicy)
        (surecl.register_policy if policy else surecl.register_method)(name, cls, **kw)
        added.append((name, policy))

    yield add
    for name, policy in added:
        (registry.unregister_policy if policy else registry.unregister_method)(name)


@pytest.fixture
def fresh_registry(monkeypatch):
    """Both registries empty and not loaded: the next look-up loads built-ins and entry points anew."""
    from surecl import registry

    for table in (registry._METHODS, registry._POLICIES):
        monkeypatch.setattr(table, "specs", {})
        monkeypatch.setattr(table, "classes", {})
        monkeypatch.setattr(table, "loaded", False)
        monkeypatch.setattr(table, "pending", {})
        monkeypatch.setattr(table, "builtin", set())
