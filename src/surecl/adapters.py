"""The dual learner: ``fast`` LoRA adapters trained by SGD, ``slow`` LoRA adapters = EMA of fast.

Both adapters live on one PEFT model. The slow adapter is never trainable; after every
optimizer step it moves toward the fast one with one fused ``torch._foreach_lerp_`` over the
adapter tensors only (no copy of the base model). Evaluation activates ``slow``.
:class:`DualLoRA` is the run's learner plugin (:mod:`surecl.plugins.base`): ``after_step``
takes the EMA step, ``eval_context`` chooses the adapter that answers, its state is both
adapters and the EMA clock, ``export`` writes the adapters in PEFT format. A method that
trains other weights (full fine-tuning) takes the adapters out of the run with
:meth:`DualLoRA.bypass` and trains :meth:`DualLoRA.base_parameters`.
On the CPU, LoRA dropout draws its mask from 16-bit slices of 64-bit random words
(:class:`LoraDropout`): forward and backward in 54-61 % of ``nn.Dropout``'s time, which
draws once per element (``bench/dropout_mask.py``).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import TaskType, get_peft_model

from surecl.errors import SureclError, start_over
from surecl.plugins.base import Plugin
from surecl.sections import ALL_LINEAR, DualConfig, LoraConfig

FAST, SLOW = "fast", "slow"


class LoraDropout(torch.nn.Dropout):
    """``nn.Dropout`` whose CPU mask costs a quarter of the random draws.

    CPU ``nn.Dropout`` draws one Bernoulli per element, and in a LoRA training step those
    draws (``bernoulli_``, two masks per layer) are the largest kernel after the matmuls.
    Here each 64-bit random word gives four 16-bit uniforms: an element is kept when its
    uniform is at or above ``round(p * 65536)``, so the drop rate is ``p`` to within 1/65536,
    and kept elements are scaled by the exact inverse keep rate (the expectation is ``x``).
    Same distribution, another random stream: masks differ from ``nn.Dropout``'s under the
    same seed. Other devices (fused dropout kernels) keep ``nn.Dropout``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0 or x.device.type != "cpu":
            return super().forward(x)
        dropped = round(self.p * 65536)
        if dropped >= 65536:
            return torch.zeros_like(x)
        return torch.where(keep_mask(x.shape, dropped), x * (65536 / (65536 - dropped)), 0.0)


def keep_mask(shape: torch.Size, dropped: int) -> torch.Tensor:
    """A CPU bool mask of ``shape``, each element False with probability ``dropped / 65536``."""
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # full 64-bit range
    return words.view(torch.int16)[:n].view(shape) >= dropped - 32768


def task_seed(streams_seed: int, row: int, salt: int) -> int:
    """The seed of a draw a method makes at the start of task ``row`` (a fresh adapter, a new
    prompt): the run's streams seed and the task alone, so every process draws the same."""
    return 1_000_003 * streams_seed + 7919 * row + salt


def _restore_base_layers(model: torch.nn.Module) -> None:
    """Put back every layer a failed ``get_peft_model`` already wrapped in a LoRA layer, so a
    caller's model (SureTrainer's) comes out as it went in."""
    from peft.tuners.lora import LoraLayer

    wrapped = [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)]
    for name, module in wrapped:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, module.get_base_layer())


def adaptable_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The layers a LoRA adapter can wrap here, as ``named_modules`` gives them: ``nn.Linear``
    and transformers' ``Conv1D`` (GPT-2's ``c_attn``, ``c_fc``: a linear layer stored
    transposed, which PEFT adapts as one)."""
    from transformers.pytorch_utils import Conv1D

    return [(n, m) for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D))]


def layer_widths(module: torch.nn.Module) -> tuple[int, int]:
    """An adaptable layer's (input, output) widths: ``nn.Linear``'s, or transformers' ``Conv1D``
    (GPT-2), whose weight is stored ``(in, out)``."""
    if isinstance(module, torch.nn.Linear):
        return module.in_features, module.out_features
    return tuple(module.weight.shape)


def meta_model(config, seq2seq: bool, trust_remote_code: bool = False) -> torch.nn.Module:
    """The model of transformers ``config`` on the meta device (no weights, no memory), whose
    layers the dry run reads; transformers' ``OSError`` / ``ValueError`` where it cannot be
    built from the config alone."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    auto = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(config, trust_remote_code=trust_remote_code)


def layer_names(layers: list[tuple[str, torch.nn.Module]], shown: int = 12) -> str:
    """The layers' short names (the last part of each name), each once in model order, the
    first ``shown`` of them: what a message suggests for ``lora.target_modules``."""
    names = list(dict.fromkeys(n.rsplit(".", 1)[-1] for n, _ in layers))
    return ", ".join(names[:shown]) + (f" (and {len(names) - shown} more)" if len(names) > shown else "")


def resolve_targets(model: torch.nn.Module, targets: list[str]) -> list[str]:
    """``targets`` as the adapters are built on them. ``[all-linear]`` becomes the full name of
    every adaptable layer (:func:`adaptable_layers`) but the model's output head
    (``get_output_embeddings``), the layers PEFT's shorthand picks, so the saved adapter config
    names its layers; any other list is returned as given."""
    if [t.lower() for t in targets] != [ALL_LINEAR]:
        return list(targets)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [n for n, m in adaptable_layers(model) if m is not head]


def names_layer(name: str, target: str) -> bool:
    """Whether ``target`` (an entry of ``lora.target_modules``) names the module ``name``, as
    PEFT matches a list of names: the whole name, or its end after a dot."""
    return name == target or name.endswith(f".{target}")


class DualLoRA(Plugin):
    """Owns the PEFT model, its fast (and optionally slow) adapter and the EMA between them.

    The learner plugin of every run (``dual.enabled=false``: the fast adapter alone, which
    then also answers)."""

    name = "dual"
    Config = DualConfig

    def __init__(self, base: torch.nn.Module, lora: LoraConfig, dual: DualConfig, is_seq2seq: bool):
        self.config = self.dual = dual
        self.beta = resolve_beta(dual, 1)
        """The EMA rate in use (the run sets it with :func:`resolve_beta` once it knows the
        steps per task, which ``dual.beta=auto`` needs)."""
        given = list(lora.target_modules)
        targets = resolve_targets(base, given)
        if not targets:  # all-linear on a model whose only linear layer is its head
            raise SureclError(f"lora.target_modules: {given} names no layer of this model but its output head; its linear "
                              f"layers: {layer_names(adaptable_layers(base))}")
        self.peft_config = PeftLoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=targets,
            task_type=TaskType.SEQ_2_SEQ_LM if is_seq2seq else TaskType.CAUSAL_LM,
        )
        try:
            self.model = get_peft_model(base, self.peft_config, adapter_name=FAST)
        except ValueError as exc:
            _restore_base_layers(base)  # peft adapted the matching modules before the one it refused
            if "is not supported" in str(exc):  # peft prints the whole module (a block of layers) before these words
                raise SureclError(f"lora.target_modules: {given} names a module that is not a linear layer; "
                                  "surecl adapts linear layers only (e.g. q_proj, v_proj, or a T5's q, v)") from None
            if "not found in the base model" in str(exc):  # peft's words where no name matches
                raise SureclError(f"lora.target_modules: {given} names no layer of this model; its linear layers: "
                                  f"{layer_names(adaptable_layers(base))}") from None
            raise SureclError(f"lora.target_modules: {' '.join(str(exc).split())[:300]}") from None
        from peft.tuners.lora import Linear as LoraLinear
        from peft.tuners.lora import LoraLayer

        adapted = [(n, m) for n, m in self.model.named_modules() if isinstance(m, LoraLayer)]
        other = [n.rsplit(".", 1)[-1] for n, m in adapted if not isinstance(m, LoraLinear)]
        # PEFT adapts what matches and drops a name that matches nothing (a typo: v_prj) without a word
        unmatched = [t for t in targets if not any(names_layer(n, t) for n, _ in adapted)]
        if not adapted or other or unmatched:
            self.model.unload()  # the base as it came (a caller's model, SureTrainer's, is used again)
            if other:
                raise SureclError(f"lora.target_modules: {given} names {other[0]}, not a linear layer; surecl adapts linear "
                                  "layers only (e.g. q_proj, v_proj, or a T5's q, v)")
            what = f"{', '.join(unmatched)} name" + ("s" if len(unmatched) == 1 else "")
            raise SureclError(f"lora.target_modules: {given}: {what} no layer of this model; its linear layers: "
                              f"{layer_names(adaptable_layers(base))}")
        self._lora_dtype_fp32()
        self.steps = 0
        self.updates = 0
        """EMA updates applied so far (= optimizer steps with ``dual.unit=step``)."""
        self.fast_trainable = True
        """Whether the fast adapter requires grad; a method that trains something else (its
        ``parameters``) sets it False in ``setup``, so the frozen adapter costs no gradients."""
        self.bypassed = False
        """True once :meth:`bypass` took the adapters out of the run."""
        self.always_on: list[str] = []
        """Frozen adapters active in every view beside the one asked for (:meth:`add_frozen_adapter`)."""
        self._frozen: list[torch.nn.Parameter] = []
        self.active = FAST
        """The adapter that answers now (the last :meth:`activate`)."""
        if dual.enabled:
            # The slow adapter's random init is overwritten by a copy of fast below; drawing it
            # from a forked RNG leaves the global stream (dropout masks, later draws) exactly as
            # in a run without the dual learner, so a dual run's fast adapter follows the same
            # trajectory as the non-dual method (paired evaluation, ``eval.fast``).
            devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
            with torch.random.fork_rng(devices=devices):
                self.model.add_adapter(SLOW, self.peft_config)
            self._lora_dtype_fp32()
            self.fast_params, self.slow_params = self._pairs()
            with torch.no_grad():
                torch._foreach_copy_(self.slow_params, self.fast_params)
            # Bias-corrected EMA keeps a raw average that starts at zero (Adam-style); plain
            # tensors, which a later model.to(...) does not move: ema_step moves them (_raw_at_fast)
            self._raw = [torch.zeros_like(p) for p in self.slow_params] if dual.bias_correction else None
        else:
            self.fast_params = [p for n, p in self.model.named_parameters() if f".{FAST}." in n]
            self.slow_params = []
            self._raw = None
        self._fast_dropout()
        self.activate(FAST)

    def _fast_dropout(self) -> None:
        """Swap PEFT's ``nn.Dropout`` modules for :class:`LoraDropout` (same rate)."""
        for module in self.model.modules():
            drops = getattr(module, "lora_dropout", None)
            if isinstance(drops, torch.nn.ModuleDict):
                for name, d in drops.items():
                    if type(d) is torch.nn.Dropout:
                        drops[name] = LoraDropout(d.p)

    def _lora_dtype_fp32(self) -> None:
        """LoRA weights (and so optimizer state) stay fp32 even when the base is bf16."""
        for n, p in self.model.named_parameters():
            if "lora_" in n and p.dtype != torch.float32:
                p.data = p.data.float()

    def _pairs(self) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
        # the module order, as without the dual learner: the gradient-norm clip sums over this
        # list, so another order would round a dual run's fast trajectory differently
        named = dict(self.model.named_parameters())
        fast = [n for n in named if f".{FAST}." in n]
        return [named[n] for n in fast], [named[n.replace(f".{FAST}.", f".{SLOW}.")] for n in fast]

    @property
    def eval_adapter(self) -> str:
        return SLOW if self.dual.enabled else FAST

    def activate(self, name: str) -> None:
        """Make ``name`` the active adapter (with the :attr:`always_on` ones); only fast
        parameters ever require grad (none once bypassed, or with :attr:`fast_trainable` off)."""
        self.model.set_adapter(name)
        self.active = name
        if self.always_on:
            self.model.base_model.set_adapter([name, *self.always_on])
        for p in self.fast_params:
            p.requires_grad_(self.fast_trainable and not self.bypassed)
        for p in self.slow_params:
            p.requires_grad_(False)
        for p in self._frozen:
            p.requires_grad_(False)

    def add_frozen_adapter(self, name: str, r: int, alpha: float) -> None:
        """Add a LoRA adapter ``name`` (rank ``r``, scaling ``alpha / r``, no dropout, the fast
        adapter's target modules), all zeros, that takes part in every forward from now on
        (training, scoring, evaluation, generation, in every view) and is never trained: its
        owner writes its weights. Its random init is drawn from a forked RNG, so the run's
        random stream is the one it would be without it."""
        config = PeftLoraConfig(
            r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(self.peft_config.target_modules), task_type=self.peft_config.task_type,
        )
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            self.model.add_adapter(name, config)
        self._lora_dtype_fp32()
        params = [p for n, p in self.model.named_parameters() if f".{name}." in n]
        with torch.no_grad():
            for p in params:
                p.zero_()
        self.always_on.append(name)
        self._frozen.extend(params)
        self.activate(FAST)

    @contextlib.contextmanager
    def evaluating(self, name: str | None = None) -> Iterator[torch.nn.Module]:
        """Eval mode with the given (default: evaluation) adapter; restores the adapter and the
        train/eval mode in place on entry (fast and train mode during training), so one nested
        in another (an evaluation, or surprise scoring on the fast adapter, inside a ``with``
        that put the slow adapter in place) leaves the outer one's adapter answering."""
        was_training, was_active = self.model.training, self.active
        self.activate(name or self.eval_adapter)
        self.model.eval()
        try:
            yield self.model
        finally:
            self.activate(was_active)
            self.model.train(was_training)

    @torch.no_grad()
    def ema_step(self, n: int = 1) -> None:
        """After an optimizer step: ``n`` EMA updates toward the fast weights, as one exact update
        slow <- beta^n * slow + (1 - beta^n) * fast (optionally bias-corrected). ``n`` is 1 with
        ``dual.unit=step`` and the step's new examples with ``dual.unit=example``."""
        self.steps += 1
        self.updates += n
        if not self.dual.enabled or n <= 0:
            return
        beta = self.beta if n == 1 else self.beta**n
        if self._raw is None:
            torch._foreach_lerp_(self.slow_params, self.fast_params, 1.0 - beta)
        else:
            torch._foreach_lerp_(self._raw_at_fast(), self.fast_params, 1.0 - beta)
            torch._foreach_copy_(self.slow_params, self._raw)
            torch._foreach_div_(self.slow_params, 1.0 - self.beta**self.updates)

    def _raw_at_fast(self) -> list[torch.Tensor]:
        """The raw average, each tensor on its fast parameter's device and dtype: it is built
        with the adapters, and a model moved after that (``transformers.Trainer`` puts a model
        loaded on the CPU on its GPU) moves the parameters, not these tensors."""
        raw = self._raw
        for i, (r, p) in enumerate(zip(raw, self.fast_params)):
            if r.device != p.device or r.dtype != p.dtype:
                raw[i] = r.to(device=p.device, dtype=p.dtype)
        return raw

    def _adapter_modules(self) -> Iterator[torch.nn.Module]:
        """The PEFT layers (each wraps one base module and holds its adapters' weights)."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        return (m for m in self.model.modules() if isinstance(m, BaseTunerLayer))

    def bypass(self) -> None:
        """Take the adapters out of the run, for a method that trains other weights: every
        LoRA layer calls its base layer alone (the adapters add nothing, draw no dropout mask
        and cost no compute), no adapter weight requires grad, and :meth:`export` writes none.
        Their (untouched) weights stay in the checkpoints."""
        for module in self._adapter_modules():
            module.enable_adapters(False)
        self.bypassed = True
        self.activate(FAST)

    def learn(self, trains: str) -> None:
        """Ready the learner for what a method declares it trains (:attr:`surecl.methods.Method.trains`),
        before the method's ``setup``: ``"fast"``: as built; ``"base"``: :meth:`bypass` and the
        base weights made trainable; ``"own"``: the fast adapter frozen (:attr:`fast_trainable` off)."""
        if trains == "base":
            self.bypass()
            for p in self.base_parameters().values():
                p.requires_grad_(True)
        elif trains == "own":
            self.fast_trainable = False
            self.activate(FAST)

    def exported(self) -> list[str]:
        """The adapters :meth:`export` writes: fast (and slow if dual), none when bypassed or
        never trained (``fast_trainable`` off: a method that trains something else, such as
        prompts, would leave only the zero update)."""
        if self.bypassed or not self.fast_trainable:
            return []
        return [FAST, SLOW] if self.dual.enabled else [FAST]

    def base_parameters(self) -> dict[str, torch.nn.Parameter]:
        """The base model's own weights, no adapter's, each once (weights tied together, as
        SmolLM2's input and output embeddings, are one parameter, under its first name),
        keyed by the name transformers gives it in the bare model (PEFT's ``.base_layer``
        removed): the keys of a ``save_pretrained`` state dict."""
        adapter = {id(p) for m in self._adapter_modules() for layer in m.adapter_layer_names for p in getattr(m, layer).parameters()}
        base = self.model.get_base_model()
        return {n.replace(".base_layer.", "."): p for n, p in base.named_parameters() if id(p) not in adapter}

    # ------------------------------------------------------------------ plugin hooks

    def after_step(self, ctx, record) -> None:
        self.ema_step(len(record.current) if self.dual.unit == "example" else 1)

    def eval_context(self, ctx, task: int) -> contextlib.AbstractContextManager:
        """The adapter the run asks for (``ctx.eval_view``), by default the evaluation adapter."""
        return self.evaluating(ctx.eval_view)

    def outputs(self, ctx) -> list[str]:
        return [f"adapters/{name}" for name in self.exported()]

    def export(self, ctx, results: dict) -> None:
        """The adapters in PEFT format, ``adapters/fast`` (and ``adapters/slow`` if dual), each
        naming its base portably, with its model card and ``prompt.json`` (how to ask it): those of
        :meth:`exported`, as the method's ``trains`` left the learner."""
        if not self.exported():
            return
        from surecl._version import version
        from surecl.card import model_card, prompt_spec, run_base
        from surecl.checkpoint import save_adapter

        __version__ = version()

        base_model, note = run_base(ctx)
        for name in self.exported():
            summed = (*self.merged_shape(name), self.always_on) if self.always_on else None
            card = model_card(results, name, base_model, note, __version__, summed)
            save_adapter(self, ctx.out_dir / "adapters", name, base_model=base_model, card=card,
                         files={"prompt.json": prompt_spec(ctx, name, base_model)})

    def state_dict(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """Both adapters' tensors (by parameter name), the bias-corrected EMA's raw average
        (``ema_raw.<i>``) and the EMA clock."""
        tensors = dict(self.adapter_state(FAST))
        if self.dual.enabled:
            tensors.update(self.adapter_state(SLOW))
        tensors.update(self.extra_state())
        return {"ema_steps": self.steps, "ema_updates": self.updates}, {k: v.cpu() for k, v in tensors.items()}

    def load_state_dict(self, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
        self.load_adapter_state(tensors)
        self.steps = meta["ema_steps"]
        self.updates = meta.get("ema_updates", self.steps)  # checkpoints before dual.unit: one update per step

    # ------------------------------------------------------------------ adapters

    def reset_fast(self, seed: int) -> None:
        """Fresh fast adapter (random A, zero B) for per-task fine-tuning, drawn from ``seed``
        alone (a forked generator, :func:`task_seed`): every process draws the same adapter
        (their own streams part as each draws dropout masks for its own rows), a resumed run
        draws it again, and the run's own random stream is left as it was."""
        from peft.tuners.lora import LoraLayer

        device = next(self.model.parameters()).device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            for module in self.model.modules():
                if isinstance(module, LoraLayer) and FAST in module.lora_A:
                    module.reset_lora_parameters(FAST, True)
        self._lora_dtype_fp32()

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        """A detached copy of one adapter's tensors, keyed by parameter name."""
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if f".{name}." in n}

    def extra_state(self) -> dict[str, torch.Tensor]:
        return {f"ema_raw.{i}": t.detach().clone() for i, t in enumerate(self._raw or [])}

    @torch.no_grad()
    def load_adapter_state(self, state: dict[str, torch.Tensor]) -> None:
        named = dict(self.model.named_parameters())
        for n, t in state.items():
            if n.startswith("ema_raw."):
                self._raw[int(n.split(".")[1])].copy_(t)
                continue
            if n not in named or named[n].shape != t.shape:
                now = "no such tensor" if n not in named else f"shape {tuple(named[n].shape)}"
                raise SureclError(f"checkpoint tensor {n} (shape {tuple(t.shape)}) does not fit this model ({now}): the base "
                                  f"model or model.* / lora.* settings differ from the run's; restore them, or {start_over()}")
            named[n].copy_(t)

    def save_pretrained(self, folder, name: str) -> None:
        """Write one adapter in PEFT format, loadable with ``PeftModel.from_pretrained``: the
        weights that answer in the view ``name``. With :attr:`always_on` adapters that is
        ``name`` and those summed, written as one LoRA adapter whose rank is the sum of theirs
        (A matrices stacked, B matrices side by side), under ``folder/name``."""
        if not self.always_on:
            self.model.save_pretrained(str(folder), selected_adapters=[name], safe_serialization=True)
            return
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        names = [name, *self.always_on]
        configs = [self.model.peft_config[n] for n in names]
        scales = [c.lora_alpha / c.r for c in configs]
        states = [get_peft_model_state_dict(self.model, adapter_name=n) for n in names]
        tensors = {}
        for key in states[0]:
            parts = [state[key].detach() for state in states]
            if ".lora_A." in key:
                tensors[key] = torch.cat(parts, 0)
            elif ".lora_B." in key:  # each part's own scaling, folded into its B relative to the first's
                tensors[key] = torch.cat([p if s == scales[0] else p * (s / scales[0]) for p, s in zip(parts, scales)], 1)
            else:
                raise ValueError(f"cannot sum adapter tensor {key}")
        config = copy.deepcopy(configs[0])
        config.r, config.lora_alpha = self.merged_shape(name)
        config.inference_mode = True
        out = Path(folder) / name
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.cpu().contiguous() for k, v in tensors.items()}, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
        config.save_pretrained(str(out))

    def merged_shape(self, name: str) -> tuple[int, float]:
        """``(r, lora_alpha)`` of the adapter :meth:`save_pretrained` writes for the view ``name``."""
        first = self.model.peft_config[name]
        rank = first.r + sum(self.model.peft_config[n].r for n in self.always_on)
        alpha = first.lora_alpha * rank / first.r  # the first adapter's scaling alpha / r
        return rank, int(alpha) if float(alpha).is_integer() else alpha

    @torch.no_grad()
    def sync_slow_to_fast(self) -> None:
        """Restart the slow adapter (and EMA clock) from the current fast one."""
        self.steps = self.updates = 0
        if self.dual.enabled:
            torch._foreach_copy_(self.slow_params, self.fast_params)
            if self._raw is not None:
                torch._foreach_zero_(self._raw)


def resolve_beta(dual: DualConfig, units_first_task: int) -> float:
    """The EMA rate a run uses (per update): ``dual.beta``, or with ``dual.beta=auto`` the rate
    whose window 1/(1-beta) is ``dual.window_tasks`` tasks of ``units_first_task`` updates
    (the first task's optimizer steps, or its new examples with ``dual.unit=example``; at
    least one update: beta 0, the slow adapter then follows the fast one)."""
    if dual.beta != "auto":
        return float(dual.beta)
    beta = 1.0 - 1.0 / max(1.0, dual.window_tasks * units_first_task)
    if beta >= 1.0:  # the window past float precision: the bias-corrected EMA would divide by 0
        raise SureclError(f"dual.window_tasks: {dual.window_tasks:g} tasks of {units_first_task} updates is a window past float "
                          "precision (beta rounds to 1, and the slow adapter would never move); give a smaller window")
    return beta


def beta_per_step(beta: float, dual: DualConfig, batch_size: int) -> float:
    """The slow adapter's effective rate per optimizer step of ``batch_size`` new examples:
    beta itself with ``dual.unit=step``, beta^batch with ``dual.unit=example``."""
    return beta**batch_size if dual.unit == "example" else beta
