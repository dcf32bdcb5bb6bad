"""Progressive Prompts (Razdaibiedina et al., ICLR 2023): a new soft prompt per task,
prepended together with the frozen prompts of the earlier tasks; the base model frozen.

Training task t the model reads ``[P_t; P_(t-1); ...; P_1; input]`` (the newest prompt first,
as the reference code concatenates them) and only ``P_t`` (``prompts.length`` vectors of the
embedding width) is trained; after the task it is frozen for good. At test time every prompt
learned so far is prepended (``prompts.eval=all``): no task id is needed. With
``prompts.eval=own`` task j reads ``[P_j; ...; P_1]`` instead, as right after it was learned
(the task id chooses). With ``prompts.mlp`` the model reads ``P_t + MLP_t(P_t)`` (residual
reparameterisation, a fresh MLP per task) and that value is what is frozen after the task.

How the prompts reach every forward of the engine unchanged: the method's ``input_prefix``
puts one *virtual token* per prompt vector (negative ids ``-1 - s`` for slot ``s`` of
``[P_t; ...; P_1]``) before the prompt of every example the run builds an input from
(``ctx.train_sets`` / ``ctx.test_sets``), and two hooks on the model's input embedding module
swap those ids for a valid one before the lookup and the looked-up rows for the slots'
vectors after it. Training, replay, surprise scoring, generation (left-padded causal or
seq2seq), ranking, perplexity and the shared-prefix KV cache (where the virtual tokens, shared
by every row, run once in the prefix pass) then all see the prompts; the scorers never
predict a virtual token (:mod:`surecl.nll`).

The learner's LoRA adapters exist in every run; here their B stays zero (the adapter is the
zero update: the model is the frozen base) and they neither train nor take gradients. The
optimizer trains the current prompt (and MLP) at ``prompts.lr`` with fresh AdamW state per
task, as the reference builds a new optimizer for each task. The dual learner (an EMA of the
LoRA adapters) has nothing to average and is refused; replay combines: a replayed example of
an earlier task is read with the current stage's prompts and trains the current prompt.

At the end of a run ``adapters/prompts/`` holds ``prompts.safetensors`` (tensor ``prefix``:
what is put before the input embeddings at test time, newest prompt first),
``prompts.json`` (which rows belong to which task, and how to use them), ``prompt.json`` (the
text each input is put in) and a model card ``README.md``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from surecl.adapters import task_seed
from surecl.errors import SureclError
from surecl.methods.base import Method, Stage
from surecl.methods.progressive_prompts.config import PromptsConfig


class ResMLP(nn.Module):
    """Residual reparameterisation of a prompt: ``P + up(relu(down(P)))`` (the reference's
    ``ResMLP`` of type ``MLP1`` with its skip connection)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.down = nn.Linear(dim, hidden)
        self.up = nn.Linear(hidden, dim)

    def forward(self, prompt: torch.Tensor) -> torch.Tensor:
        return prompt + self.up(torch.relu(self.down(prompt)))

    def reset(self) -> None:
        self.down.reset_parameters()
        self.up.reset_parameters()


class PromptModule(nn.Module):
    """The prompts, attached to the model so they move with it and DDP sees the trained ones:
    ``current`` (the prompt being trained, fp32) and its optional ``mlp`` are parameters;
    ``frozen`` holds the finished prompts, newest first ``[P_(t-1); ...; P_1]``, as a buffer."""

    def __init__(self, length: int, dim: int, mlp_hidden: int) -> None:
        super().__init__()
        self.current = nn.Parameter(torch.zeros(length, dim))
        self.mlp = ResMLP(dim, mlp_hidden) if mlp_hidden else None
        self.register_buffer("frozen", torch.zeros(0, dim), persistent=False)

    def reparameterised(self) -> torch.Tensor:
        """The current prompt as the model reads it (through the MLP, if any)."""
        return self.mlp(self.current) if self.mlp is not None else self.current

    def table(self, training: bool) -> torch.Tensor:
        """The vectors of the virtual slots: the prompt being trained (while ``training``),
        then the frozen ones, newest first."""
        if not training:
            return self.frozen
        return torch.cat([self.reparameterised(), self.frozen])


def token_vectors(embedding: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    """What ``embedding`` outputs for the (real, non-negative) token ``ids``: its forward, hooks
    and all (the method's own hooks pass real tokens through), as the model's input reads them."""
    with torch.no_grad():
        return embedding(ids).detach()


class ProgressivePrompts(Method):
    name = "progressive_prompts"
    trains = "own"
    state = ("the learned prompts", "the prompt being trained (mid-task)")
    fresh_optimizer = True  # a new prompt per task, fresh AdamW state with it
    exports = ("adapters/prompts",)
    Config = PromptsConfig

    @property
    def prefix_note(self) -> str:
        """What goes before every prompt, in words, for the exported ``prompt.json``: every
        prompt (``prompts.eval=all``) or each task's own and the earlier ones (``own``)."""
        if self.config.eval == "own":
            return ("Progressive Prompts: a task's soft prompt and the earlier tasks' (adapters/prompts, rows prefix_rows[task][0] "
                    "to the end) go before its prompts (see its prompts.json)")
        return "Progressive Prompts: the soft prompts of adapters/prompts go before every prompt (see its prompts.json)"

    def __init__(self, config: PromptsConfig | None = None) -> None:
        super().__init__(config)
        self.module: PromptModule | None = None
        self.learned: list[int] = []
        """Task index of each frozen prompt, in the order learned (P_1 first)."""
        self.training = False
        """Between ``before_task`` and ``after_task``: a prompt is being trained."""
        self.eval_task: int | None = None
        self._ids: torch.Tensor | None = None
        self._prefixes: dict[tuple[int, int], tuple[int, ...]] = {}

    # ------------------------------------------------------------------ setup

    @classmethod
    def validate_config(cls, cfg) -> None:
        if cfg.dual.enabled:
            raise SureclError(
                "dual.enabled: progressive_prompts trains soft prompts, not the LoRA adapters the dual learner averages; set dual.enabled=false"
            )

    def setup(self, ctx) -> None:
        embedding = ctx.model.get_input_embeddings()
        if not isinstance(embedding, nn.Embedding):
            raise SureclError(f"method progressive_prompts: the model's input embedding is a {type(embedding).__name__}, not an nn.Embedding")
        hidden = self.config.mlp_hidden if self.config.mlp else 0
        with torch.random.fork_rng(devices=[]):  # the MLP's placeholder init (redrawn per task) leaves the run's stream alone
            self.module = PromptModule(self.config.length, embedding.embedding_dim, hidden).to(embedding.weight.device)
        self.embedding = embedding
        ctx.model.add_module("progressive_prompts", self.module)
        # Every embedding module that looks up with these weights (T5's encoder and decoder hold
        # their own modules tied to ``shared``): whichever reads the input meets the prompts.
        seen: set[int] = set()
        for module in ctx.model.modules():
            if isinstance(module, nn.Embedding) and module.weight is embedding.weight and id(module) not in seen:
                seen.add(id(module))
                module.register_forward_pre_hook(self._swap_ids)
                module.register_forward_hook(self._swap_vectors)
        # The base and the learner's LoRA stay as they are (trains="own": the run froze the fast
        # adapter before setup): nothing but the prompt takes gradients.

    def parameters(self, ctx) -> list:
        return [{"params": list(self.module.parameters()), "lr": self.config.lr}]

    def learning_rate(self, cfg) -> str:
        return f"lr {self.config.lr:g} = prompts.lr, train.lr unused"

    # ------------------------------------------------------------------ the embedding hooks

    def _swap_ids(self, module: nn.Module, args: tuple):
        """Before the lookup: virtual tokens (negative ids) look up id 0 (replaced after)."""
        if not args:
            return None
        self._ids = args[0]
        return (args[0].clamp(min=0), *args[1:])

    def _swap_vectors(self, module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        """After the lookup: each virtual token's row becomes its slot's prompt vector."""
        ids, self._ids = self._ids, None
        table = self.module.table(self.training)
        if ids is None or table.shape[0] == 0:
            return out
        slots = (-1 - ids).clamp(0, table.shape[0] - 1)
        return torch.where((ids < 0).unsqueeze(-1), table.to(out.dtype)[slots], out)

    # ------------------------------------------------------------------ what the run reads

    def input_prefix(self, ctx, task: int) -> tuple[int, ...]:
        """One virtual token per active prompt vector: every prompt learned so far (and the one
        being trained); with ``prompts.eval=own``, while task ``task`` is evaluated, the
        prompts up to its own."""
        active = len(self.learned) + (1 if self.training else 0)
        first = 0
        if self.eval_task is not None and not self.training and self.config.eval == "own" and self.eval_task in self.learned:
            own = self.learned.index(self.eval_task) + 1
            first, active = active - own, own
        key = (first, active)
        if key not in self._prefixes:
            n = self.config.length
            self._prefixes[key] = tuple(-1 - s for s in range(first * n, (first + active) * n))
        return self._prefixes[key]

    @classmethod
    def longest_prefix(cls, config, n_tasks: int) -> int:
        """Every task's prompt before the last task's rows: ``n_tasks * prompts.length``."""
        return n_tasks * config.length

    @contextlib.contextmanager
    def eval_context(self, ctx, task: int) -> Iterator[None]:
        self.eval_task = task
        try:
            yield
        finally:
            self.eval_task = None

    # ------------------------------------------------------------------ a task

    @torch.no_grad()
    def before_task(self, ctx, stage: Stage) -> None:
        """A new prompt, initialised from the embeddings of random vocabulary tokens (as the
        reference does), a fresh MLP, fresh AdamW state for them. Drawn from the run's seed
        and the stage alone (a forked RNG): every process draws the same, a resumed run draws
        it again, and the run's own random stream is left as it was.

        The vectors are the embedding module's own output for those tokens, what a real token
        enters the model as: the prompt replaces that output (:meth:`_swap_vectors`), so a model
        that scales it (Gemma's ``embed_scale``, mBART's and Pegasus' ``scale_embedding``:
        sqrt(d) times the table's rows) starts its prompt at the scale of its tokens, not
        1/sqrt(d) of it. For a plain ``nn.Embedding`` the output is the table's rows, bit for bit."""
        module = self.module
        device = module.current.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(task_seed(ctx.streams_seed, stage.row, 1))
            ids = torch.randint(self.embedding.num_embeddings, (self.config.length,))
            module.current.copy_(token_vectors(self.embedding, ids.to(self.embedding.weight.device)).float())
            if module.mlp is not None:
                module.mlp.reset()
        ctx.reset_optimizer()
        self.training = True

    @torch.no_grad()
    def after_task(self, ctx, stage: Stage) -> None:
        """Freeze the prompt as the model read it (through the MLP, which is then dropped)."""
        module = self.module
        module.frozen = torch.cat([module.reparameterised().detach().clone(), module.frozen])
        self.learned.append(stage.row)
        self.training = False

    # ------------------------------------------------------------------ state and outputs

    def prompts(self) -> list[torch.Tensor]:
        """The frozen prompts in the order learned (P_1 first), each [length, dim]."""
        n = self.config.length
        frozen = self.module.frozen
        k = len(self.learned)
        return [frozen[(k - 1 - i) * n : (k - i) * n] for i in range(k)]

    def state_dict(self) -> tuple[dict, dict[str, torch.Tensor]]:
        tensors = {f"prompt.{i}": p.detach().cpu().clone() for i, p in enumerate(self.prompts())}
        if self.training:
            tensors.update({f"current.{k}": v.detach().cpu().clone() for k, v in self.module.named_parameters()})
        return {"learned": list(self.learned), "training": self.training, "length": self.config.length}, tensors

    @torch.no_grad()
    def load_state_dict(self, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
        if not meta:
            return
        module = self.module
        device = module.current.device
        self.learned = list(meta["learned"])
        self.training = bool(meta["training"])
        prompts = [tensors[f"prompt.{i}"] for i in range(len(self.learned))]
        module.frozen = torch.cat([p.to(device) for p in reversed(prompts)]) if prompts else module.frozen[:0]
        if self.training:
            for k, v in module.named_parameters():
                v.copy_(tensors[f"current.{k}"])

    def _usage(self) -> str:
        """How the exported prefix is read, as the run evaluated (``prompts.eval``)."""
        rest = ("(for an encoder-decoder: before the encoder input), with attention mask 1 and positions 0..rows-1; rows "
                "prefix_rows[task] are that task's prompt (the MLP, if any, is already applied)")
        if self.config.eval == "own":
            return ("prompts.eval=own: an example of a task reads rows prefix_rows[task][0] to the end of tensor 'prefix' "
                    "[tasks x length, embedding_dim] (its own prompt, then the earlier tasks', newest first) before its input "
                    f"embeddings {rest}; the run evaluated each task so")
        return ("tensor 'prefix' [tasks x length, embedding_dim] (newest task's prompt first) goes before the input embeddings "
                f"of every example {rest}")

    def export(self, ctx, results: dict) -> None:
        """``adapters/prompts/`` in the run folder: ``prompts.safetensors`` (``prefix``: the vectors put before the
        input embeddings at test time, newest prompt first, fp32), ``prompts.json``, ``prompt.json`` (the text template,
        :func:`surecl.card.prompt_spec`) and the model card ``README.md`` (:func:`surecl.card.prompts_card`), written as
        one folder (:func:`surecl.checkpoint.write_folder`)."""
        import surecl.checkpoint as checkpoint
        from surecl._version import version
        from surecl.card import prompt_spec, prompts_card, run_base

        __version__ = version()

        if not self.learned:
            return
        n = self.config.length
        k = len(self.learned)
        names = [ctx.tasks[t].name for t in self.learned]
        base_model, note = run_base(ctx)
        prefix = self.module.frozen.float()
        meta = {
            "method": "progressive_prompts",
            "base_model": base_model,
            "tasks": names,
            "length": n,
            "embedding_dim": int(self.module.frozen.shape[1]),
            "prefix_rows": {name: [(k - 1 - i) * n, (k - i) * n] for i, name in enumerate(names)},
            "reparameterised": bool(self.config.mlp),
            "eval": self.config.eval,
            "usage": self._usage(),
            "surecl_version": __version__,
        }

        def fill(out: Path) -> None:
            checkpoint.write_tensors(out / "prompts.safetensors", {"prefix": prefix})
            checkpoint.write_json(out / "prompts.json", meta)
            checkpoint.write_text(out / "prompt.json", prompt_spec(ctx, "prompts", base_model))  # the text template, labels, decoding
            checkpoint.write_text(out / "README.md", prompts_card(results, meta, base_model, note, __version__))

        # one folder swapped in whole, as the adapters are: a kill mid-export leaves no stray file inside it
        checkpoint.write_folder(ctx.out_dir / "adapters" / "prompts", fill)
